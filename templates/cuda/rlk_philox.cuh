/* rlk_philox.cuh - the Philox4x32-10 counter-based generator (Salmon et al., "Parallel random
 * numbers: as easy as 1, 2, 3", SC 2011), the generator of cuRAND and PyTorch's CUDA RNG.
 *
 * A draw is a pure function of a 64-bit key (the seed) and a 128-bit counter: nothing is stored
 * between calls, so a kernel that takes its seed and offset from device memory can be captured in
 * a CUDA graph and replayed with new values, and any thread can compute any draw. The host
 * templates carry the same function (templates/host/rlk_host_philox.h); both are checked against
 * the published known-answer vectors. */
#ifndef RLK_PHILOX_CUH
#define RLK_PHILOX_CUH

#include "rlk_prelude.cuh"

namespace rlk {

struct u32x4_ctr {
  u32 v[4];
};

/* Ten rounds of Philox4x32 on `ctr` under the key (k0, k1). */
RLK_DEVICE u32x4_ctr philox4x32_10(u32x4_ctr ctr, u32 k0, u32 k1) {
  const u32 M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const u32 hi0 = __umulhi(M0, ctr.v[0]), lo0 = M0 * ctr.v[0];
    const u32 hi1 = __umulhi(M1, ctr.v[2]), lo1 = M1 * ctr.v[2];
    u32x4_ctr n;
    n.v[0] = hi1 ^ ctr.v[1] ^ k0;
    n.v[1] = lo1;
    n.v[2] = hi0 ^ ctr.v[3] ^ k1;
    n.v[3] = lo0;
    ctr = n;
    k0 += W0;
    k1 += W1;
  }
  return ctr;
}

} /* namespace rlk */

#endif /* RLK_PHILOX_CUH */

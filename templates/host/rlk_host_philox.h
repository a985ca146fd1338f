/* rlk_host_philox.h - Philox4x32-10, the host form of templates/cuda/rlk_philox.cuh (the same
 * function, bit for bit). */
#ifndef RLK_HOST_PHILOX_H
#define RLK_HOST_PHILOX_H

#include <stdint.h>

typedef struct rlk_philox_ctr {
  uint32_t v[4];
} rlk_philox_ctr;

/* Ten rounds of Philox4x32 on `ctr` under the key (k0, k1). */
static inline rlk_philox_ctr rlk_philox4x32_10(rlk_philox_ctr ctr, uint32_t k0, uint32_t k1) {
  const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = (uint64_t)M0 * ctr.v[0], p1 = (uint64_t)M1 * ctr.v[2];
    rlk_philox_ctr n;
    n.v[0] = (uint32_t)(p1 >> 32) ^ ctr.v[1] ^ k0;
    n.v[1] = (uint32_t)p1;
    n.v[2] = (uint32_t)(p0 >> 32) ^ ctr.v[3] ^ k1;
    n.v[3] = (uint32_t)p0;
    ctr = n;
    k0 += W0;
    k1 += W1;
  }
  return ctr;
}

#endif

/* logprob_shard.cuh - vocab-parallel log-probs: a vocabulary shard's per-row records and their
 * combine (the record format is documented once, in include/rlk.h).
 *
 * Entries (launched by src/ops/logprob_shard.c):
 *   logprob_fwd_shard  logprob_fwd's row pass (same layout, same thread_row_state and merges) over
 *                      the shard's columns; lane 0 writes the row's record {m, s, u, t}
 *   logprob_combine    a thread per row merges the P gathered records in rank order
 *
 * The kernel state holds the raw maximum and log2-scaled sums (logprob_common.cuh); the record
 * is in natural-log units of z = x / T: m = max / T, s as is, u = ln2 q, t = x_y / T. */
#ifndef RLK_LOGPROB_SHARD_CUH
#define RLK_LOGPROB_SHARD_CUH

#include "logprob_common.cuh"
#include "logprob_shard_params.h"

namespace rlk {
namespace lp {

RLK_PARAMS_DECLARE(ShardParams, RLK_LS_FWD_PARAMS, RLK_LS_FWD_PARAMS_SIZE);
RLK_PARAMS_DECLARE(CombineParams, RLK_LS_COMBINE_PARAMS, RLK_LS_COMBINE_PARAMS_SIZE);


/* One row's record. */
struct alignas(16) record {
  float m, s, u, t;
};

} /* namespace lp */

/* The shard forward: labels are global, the shard's column j is vocabulary index vocab_start + j.
 * Ignored rows and labels outside the shard get t = +inf (absent). */
template <int DT, typename L, int BLOCK, int SEG, int UNROLL, bool ENTROPY>
__global__ void __launch_bounds__(BLOCK)
    logprob_fwd_shard(RLK_PARAMS_ARG lp::ShardParams p_) {
  const void *__restrict__ logits = p_.logits;
  const L *__restrict__ labels = (const L *)p_.labels;
  const i64 row_stride = p_.row_stride, label_stride = p_.label_stride, N = p_.N, V = p_.V,
            ignore_index = p_.ignore_index, vocab_start = p_.vocab_start;
  const float temperature = p_.temperature;
  lp::record *__restrict__ partials = (lp::record *)p_.partials;
  using namespace lp;
  static_assert(SEG == BLOCK || (SEG >= 1 && SEG <= RLK_WARP_SIZE && (SEG & (SEG - 1)) == 0),
                "SEG: a power of two up to a warp, or the whole block");
  static_assert(BLOCK % RLK_WARP_SIZE == 0 && BLOCK <= RLK_MAX_BLOCK, "BLOCK");
  constexpr int B = logit_traits<DT>::bytes;
  constexpr int RPB = BLOCK / SEG;
  constexpr int NWARPS = BLOCK / RLK_WARP_SIZE;
  __shared__ state scratch[NWARPS];
  const float c = RLK_LP_LOG2E / temperature;
  const int lane = (int)(threadIdx.x % SEG);
  const int sub = (int)(threadIdx.x / SEG);

  for (i64 base = (i64)blockIdx.x * RPB; base < N; base += (i64)gridDim.x * RPB) {
    const i64 row = base + sub;
    state st = empty_state();
    bool owned = false;
    float xy = 0.0f;
    if (row < N) {
      const u8 *r = (const u8 *)logits + row * row_stride * B;
      if (lane == 0) {
        const i64 y = load_label(labels, row, label_stride);
        const i64 yl = y - vocab_start;
        owned = y != ignore_index && yl >= 0 && yl < V;
        if (owned) xy = load_logit<DT>(r, yl);
      }
      st = thread_row_state<DT, SEG, UNROLL, ENTROPY>(r, V, c, lane);
    }
    if constexpr (SEG > RLK_WARP_SIZE)
      st = block_merge<BLOCK, ENTROPY>(st, c, scratch);
    else
      st = segment_merge<SEG, ENTROPY>(st, c);
    if (row < N && lane == 0) {
      record o;
      o.m = st.m / temperature;
      o.s = st.s;
      o.u = ENTROPY ? st.q * RLK_LP_LN2 : 0.0f;
      const float inf = limits<float>::infinity();
      const float t = xy / temperature;
      o.t = owned ? (t == inf ? limits<float>::quiet_nan() : t) : inf;
      partials[row] = o;
    }
  }
}

/* The combine: row i's records are partials[r * N + i], r = 0 .. P-1, merged in that order. */
template <typename L, bool ENTROPY>
__global__ void __launch_bounds__(256)
    logprob_combine(RLK_PARAMS_ARG lp::CombineParams p_) {
  const lp::record *__restrict__ partials = (const lp::record *)p_.partials;
  const L *__restrict__ labels = (const L *)p_.labels;
  const i64 P = p_.P, N = p_.N, label_stride = p_.label_stride, ignore_index = p_.ignore_index;
  float *__restrict__ logp = p_.logp, *__restrict__ lse = p_.lse;
  float *__restrict__ entropy = p_.entropy;
  i32 *__restrict__ status = p_.status;
  using namespace lp;
  const float inf = limits<float>::infinity();
  for (i64 row = (i64)blockIdx.x * blockDim.x + threadIdx.x; row < N;
       row += (i64)gridDim.x * blockDim.x) {
    float M = -inf;
    for (i64 r = 0; r < P; ++r) M = fmaxf(M, ld_ro(&partials[r * N + row].m));
    float S = 0.0f, U = 0.0f, t = 0.0f;
    int owners = 0;
    for (i64 r = 0; r < P; ++r) {
      const record p = ld_ro(partials + r * N + row);
      if (p.s != 0.0f) { /* an empty shard adds nothing (and no -inf - -inf) */
        const float d = p.m - M;
        const float f = expf(d);
        S = fmaf(p.s, f, S);
        /* a record rescaled to 0 adds no U: d s may overflow (a shard at -FLT_MAX), 0 * -inf */
        if (ENTROPY && f != 0.0f) U = fmaf(f, fmaf(d, p.s, p.u), U);
      }
      if (p.t != inf) {
        ++owners;
        t = p.t;
      }
    }
    const i64 y = load_label(labels, row, label_stride);
    float lp, l, h;
    if (y != ignore_index && owners != 1) {
      lp = l = h = limits<float>::quiet_nan();
      if (status) atomicOr((int *)status, owners ? (int)LP_STATUS_LABEL_OWNERS : (int)LP_STATUS_BAD_LABEL);
    } else {
      const float ln_s = logf(S);
      l = M + ln_s;
      h = ENTROPY ? ln_s - U / S : 0.0f;
      lp = y == ignore_index ? 0.0f : (t - M) - ln_s;
    }
    logp[row] = lp;
    if (lse) lse[row] = l;
    if (ENTROPY && entropy) entropy[row] = h;
  }
}

} /* namespace rlk */

#endif /* RLK_LOGPROB_SHARD_CUH */

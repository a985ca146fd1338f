/* group_advantage.cuh - GRPO-family group advantages (grpo, mean-only, rloo, batch-std).
 *
 * Three entries, launched in this order by src/ops/group_advantage.c:
 *   group_advantage_rowsum     [B, T] token rewards -> per-row sums under the mask, in the
 *                              rewards' type (into the f32 advantages output, or the f64
 *                              workspace)
 *   group_advantage_group      per-group statistics and the advantages
 *   group_advantage_broadcast  token_advantages[b, t] = advantages[b] * mask[b, t]
 *
 * Group statistics are two-pass (sum, then the sum of squared deviations) in the precision of
 * the scores they read (f32 or f64); every reduction has a fixed order, so a result depends only
 * on the inputs and the launch shape the host picks for them. Bad group offsets are clamped into
 * [0, B]: they never cause an access out of bounds (members that no group covers are not written).
 * The enum values below are the indices of the choice names in the op's parameter schema. */
#ifndef RLK_GROUP_ADVANTAGE_CUH
#define RLK_GROUP_ADVANTAGE_CUH

#include "rlk_prelude.cuh"
#include "seq_mask.cuh"
#include "group_advantage_params.h"

namespace rlk {
namespace ga {

/* [start, end) of group g, clamped into [0, B] and non-decreasing. */
template <int G, int OFFSETS>
RLK_DEVICE void group_range(i64 g, i64 B, i64 group_size, const void *offsets, i64 *start,
                            i64 *end) {
  if (OFFSETS == GA_OFFSETS_FIXED) {
    const i64 size = G > 0 ? (i64)G : group_size;
    *start = g * size;
    *end = *start + size;
    return;
  }
  clamped_offsets<OFFSETS == GA_OFFSETS_I32>(offsets, g, B, start, end);
}

/* Sum over the SEG threads that share a group: a lane segment of a warp, or the whole block. */
template <int SEG, typename T> RLK_DEVICE T group_sum(T v, T *scratch) {
  if constexpr (SEG <= RLK_WARP_SIZE) {
    (void)scratch;
    return segment_sum<SEG>(v);
  } else {
    return block_sum(v, scratch);
  }
}

struct MaxOp {
  template <typename T> RLK_DEVICE T operator()(T a, T b) const { return b > a ? b : a; }
};
struct MinOp {
  template <typename T> RLK_DEVICE T operator()(T a, T b) const { return b < a ? b : a; }
};

/* A max or min over the SEG threads that share a group, like group_sum (every lane of the
 * segment, or every thread of the block, must call it; the block form synchronizes). */
template <int SEG, typename T, typename Op> RLK_DEVICE T group_reduce(T v, T *scratch, Op op) {
  constexpr int W = SEG <= RLK_WARP_SIZE ? SEG : RLK_WARP_SIZE;
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
  if constexpr (SEG <= RLK_WARP_SIZE) {
    (void)scratch;
    return v;
  } else {
    const int warp = (int)(threadIdx.x / RLK_WARP_SIZE);
    const int nwarps = (int)(blockDim.x / RLK_WARP_SIZE);
    if (threadIdx.x % RLK_WARP_SIZE == 0) scratch[warp] = v;
    __syncthreads();
    T r = scratch[0];
    for (int w = 1; w < nwarps; ++w) r = op(r, scratch[w]);
    __syncthreads();
    return r;
  }
}

/* Is score s part of the statistics? With unscorable NaNs (RLK_NAN_SCORES_UNSCORABLE) a NaN
 * is not. */
template <typename TS> RLK_DEVICE bool scorable(TS s, bool nan_skip) { return !nan_skip || s == s; }

/* Four consecutive rewards from a 16-byte aligned address. */
/* (Token rewards: read-only for the kernel that sums them.) */
RLK_DEVICE void load4(const float *p, float v[4]) {
  const f32x4 q = ld_ro((const f32x4 *)p);
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}
RLK_DEVICE void load4(const double *p, double v[4]) {
  const f64x2 a = ld_ro((const f64x2 *)p), b = ld_ro((const f64x2 *)p + 1);
  v[0] = a.x;
  v[1] = a.y;
  v[2] = b.x;
  v[3] = b.y;
}

/* Can the four mask values at element i be read with one aligned load? */
template <int MASK> RLK_DEVICE bool mask_vec_ok(const void *mask, i64 i) {
  if (MASK == RLK_SEQ_MASK_NONE) return true;
  constexpr int nb = seq_mask_bytes<MASK>::value;
  return is_aligned<4 * nb>((const u8 *)mask + i * nb);
}

} /* namespace ga */

/* Chunks a thread has in flight at once in the row kernels. */
#define RLK_GA_UNROLL 4

/* Row sums of token rewards under the mask: out[b] = sum_t r[b, t] * m[b, t], where a zero
 * mask value excludes the element (even a NaN reward). One block per row (rows grid-strided).
 * Thread k owns the 4-element chunks k, k + blockDim.x, ... and adds their elements in that
 * order (RLK_GA_UNROLL chunks are loaded before they are added); the threads' sums are combined
 * by block_sum. Aligned rows load a chunk with vector loads, others element by element, in the
 * same order: the result depends only on the values and blockDim.x. Accumulates in TS. */
template <typename TS, int MASK>
__global__ void group_advantage_rowsum(RLK_PARAMS_ARG ga_rowsum_args p_) {
  const TS *__restrict__ rewards = (const TS *)p_.rewards;
  const void *__restrict__ mask = p_.mask;
  TS *__restrict__ out = (TS *)p_.out;
  const i64 reward_stride = p_.reward_stride, mask_stride = p_.mask_stride, B = p_.B, T = p_.T;
  __shared__ TS scratch[RLK_MAX_WARPS];
  const i64 chunks = (T + 3) / 4;
  const i64 bd = blockDim.x;
  for (i64 row = blockIdx.x; row < B; row += gridDim.x) {
    const TS *r = rewards + row * reward_stride;
    const i64 m0 = row * mask_stride;
    const bool vec = is_aligned<16>(r) && ga::mask_vec_ok<MASK>(mask, m0);
    TS acc = TS(0);
    for (i64 c0 = threadIdx.x; c0 < chunks; c0 += RLK_GA_UNROLL * bd) {
      TS v[RLK_GA_UNROLL][4];
      float w[RLK_GA_UNROLL][4];
#pragma unroll
      for (int u = 0; u < RLK_GA_UNROLL; ++u) {
        const i64 t = 4 * (c0 + u * bd);
        if (vec && t + 4 <= T) {
          ga::load4(r + t, v[u]);
          seq_mask_weight4<MASK, true>(mask, m0 + t, w[u]);
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            v[u][j] = t + j < T ? ld_ro(r + t + j) : TS(0);
            w[u][j] = t + j < T ? seq_mask_weight<MASK, true>(mask, m0 + t + j) : 0.0f;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < RLK_GA_UNROLL; ++u) {
        const i64 t = 4 * (c0 + u * bd);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (MASK == RLK_SEQ_MASK_NONE) {
            if (t + j < T) acc += v[u][j];
          } else if (w[u][j] != 0.0f) {
            acc += v[u][j] * (TS)w[u][j];
          }
        }
      }
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[row] = acc;
  }
}

/* Group advantages. `unbiased` (0/1), `singleton` (SINGLETON_*) and nan_unscorable are
 * run-time values: they only change a divisor, a count and the one-member branch, so baking
 * them would multiply compiles for nothing. SEG threads share a group: a power of two; up to a
 * warp they are an aligned lane segment (several groups per block), beyond that the whole
 * block (blockDim.x == SEG). G > 0 bakes a fixed group size in; G == 0 reads group_size
 * (GA_OFFSETS_FIXED) or the offsets. Groups are grid-strided with a block-uniform loop, so every
 * lane reaches every shuffle and barrier. scores may be the advantages buffer itself (in
 * place): each element is read and written by one thread only, and a group's (and the batch's)
 * statistics are complete (shuffle or barrier) before any of its members is written.
 * Batch-std: every block computes the batch mean and std itself (same order, same value).
 * With nan_unscorable a NaN score is left out of every sum and count and its advantage is 0;
 * n is then the group's scorable members. */
template <typename TS, int MODE, int G, int SEG, int OFFSETS>
__global__ void group_advantage_group(RLK_PARAMS_ARG ga_group_args p_) {
  const TS *scores = (const TS *)p_.scores;
  const TS *weights = (const TS *)p_.weights;
  float *adv = p_.adv;
  const i64 score_stride = p_.score_stride, weight_stride = p_.weight_stride, B = p_.B,
            group_size = p_.group_size, num_groups = p_.num_groups;
  const void *offsets = p_.offsets;
  const float eps = p_.eps;
  const int unbiased = p_.unbiased, singleton = p_.singleton;
  const bool nan_skip = p_.nan_unscorable != 0;
  static_assert(SEG >= 1 && SEG <= RLK_MAX_BLOCK && (SEG & (SEG - 1)) == 0, "SEG");
  constexpr bool kWholeBlock = SEG > RLK_WARP_SIZE;
  constexpr bool kPassk = MODE == GA_MODE_PASSK || MODE == GA_MODE_PASSK_UNSCALED;
  __shared__ TS scratch[RLK_MAX_WARPS];
  __shared__ i64 iscratch[kPassk ? RLK_MAX_WARPS : 1];
  const TS e = (TS)eps;

  TS batch_scale = TS(1);
  if (MODE == GA_MODE_BATCH_STD) {
    /* unrolled so that several loads are in flight; the additions stay in index order */
    TS s = TS(0), cnt = TS(0);
#pragma unroll 8
    for (i64 i = threadIdx.x; i < B; i += blockDim.x) {
      const TS x = scores[i * score_stride];
      if (ga::scorable(x, nan_skip)) {
        s += x;
        cnt += TS(1);
      }
    }
    const TS nb = nan_skip ? block_sum(cnt, scratch) : (TS)B;
    const TS mean = block_sum(s, scratch) / nb;
    TS q = TS(0);
#pragma unroll 8
    for (i64 i = threadIdx.x; i < B; i += blockDim.x) {
      const TS x = scores[i * score_stride];
      const TS d = x - mean;
      if (ga::scorable(x, nan_skip)) q += d * d;
    }
    q = block_sum(q, scratch);
    batch_scale = sqrt_(q / (unbiased ? nb - TS(1) : nb)) + e;
  }

  const i64 segs = kWholeBlock ? 1 : (i64)(blockDim.x / SEG);
  const i64 seg = kWholeBlock ? 0 : (i64)(threadIdx.x / SEG);
  const i64 lane = kWholeBlock ? (i64)threadIdx.x : (i64)(threadIdx.x % SEG);

  for (i64 base = (i64)blockIdx.x * segs; base < num_groups; base += (i64)gridDim.x * segs) {
    const i64 g = base + seg;
    i64 start = 0, end = 0;
    if (g < num_groups) ga::group_range<G, OFFSETS>(g, B, group_size, offsets, &start, &end);

    TS sum = TS(0), cnt = TS(0);
    for (i64 i = start + lane; i < end; i += SEG) {
      const TS x = scores[i * score_stride];
      if (ga::scorable(x, nan_skip)) {
        sum += x;
        cnt += TS(1);
      }
    }
    sum = ga::group_sum<SEG>(sum, scratch);
    const i64 n = nan_skip ? (i64)ga::group_sum<SEG>(cnt, scratch) : end - start;
    const TS mean = sum / (TS)n;

    TS scale = TS(1);
    if (MODE == GA_MODE_GRPO || MODE == GA_MODE_PASSK) {
      TS q = TS(0);
      for (i64 i = start + lane; i < end; i += SEG) {
        const TS x = scores[i * score_stride];
        const TS d = x - mean;
        if (ga::scorable(x, nan_skip)) q += d * d;
      }
      q = ga::group_sum<SEG>(q, scratch);
      scale = sqrt_(q / (TS)(unbiased ? n - 1 : n)) + e;
    } else if (MODE == GA_MODE_BATCH_STD) {
      scale = batch_scale;
    }

    /* opo: the weighted mean */
    TS wmean = TS(0);
    if (MODE == GA_MODE_OPO) {
      TS ws = TS(0), w = TS(0);
      for (i64 i = start + lane; i < end; i += SEG) {
        const TS x = scores[i * score_stride], wi = weights[i * weight_stride];
        if (ga::scorable(x, nan_skip)) {
          ws += wi * x;
          w += wi;
        }
      }
      ws = ga::group_sum<SEG>(ws, scratch);
      w = ga::group_sum<SEG>(w, scratch);
      wmean = w != TS(0) ? ws / w : limits<TS>::quiet_nan(); /* weights summing to 0: NaN, not +-inf */
    }

    /* passk: the best member (the first of equal maxima) and the second best score; where NaN
     * scores are arithmetic, a NaN ranks above every score (torch.topk's order): the first NaN
     * member is the best and the gap is NaN */
    i64 best = -1;
    TS gap = TS(0);
    const i64 none = (i64)0x7fffffffffffffffll;
    i64 first_nan = none;
    if (kPassk && !nan_skip) { /* every lane of the warp takes the reductions: groups may share one */
      for (i64 i = start + lane; i < end; i += SEG) {
        const TS x = scores[i * score_stride];
        if (x != x && i < first_nan) first_nan = i;
      }
      first_nan = ga::group_reduce<SEG>(first_nan, iscratch, ga::MinOp());
    }
    if (kPassk) {
      const TS lowest = -limits<TS>::infinity();
      TS m1 = lowest;
      for (i64 i = start + lane; i < end; i += SEG) {
        const TS x = scores[i * score_stride];
        if (ga::scorable(x, nan_skip) && x > m1) m1 = x;
      }
      m1 = ga::group_reduce<SEG>(m1, scratch, ga::MaxOp());
      i64 first = (i64)0x7fffffffffffffffll;
      for (i64 i = start + lane; i < end; i += SEG) {
        const TS x = scores[i * score_stride];
        if (ga::scorable(x, nan_skip) && x == m1 && i < first) first = i;
      }
      best = ga::group_reduce<SEG>(first, iscratch, ga::MinOp());
      TS m2 = lowest;
      for (i64 i = start + lane; i < end; i += SEG) {
        const TS x = scores[i * score_stride];
        if (ga::scorable(x, nan_skip) && i != best && x > m2) m2 = x;
      }
      m2 = ga::group_reduce<SEG>(m2, scratch, ga::MaxOp());
      gap = MODE == GA_MODE_PASSK ? (m1 - m2) / scale : m1 - m2;
      if (first_nan != none) {
        best = first_nan;
        gap = limits<TS>::quiet_nan();
      }
    }

    for (i64 i = start + lane; i < end; i += SEG) {
      const TS s = scores[i * score_stride];
      TS a;
      if (!ga::scorable(s, nan_skip)) {
        a = TS(0);
      } else if (kPassk) {
        a = n >= 2 && i == best ? gap : TS(0);
      } else if (n == 1) {
        if (singleton == GA_SINGLETON_ZERO)
          a = TS(0);
        else if (MODE == GA_MODE_GRPO || MODE == GA_MODE_BATCH_STD)
          a = s / (TS(1) + e);
        else
          a = s;
      } else if (MODE == GA_MODE_RLOO) {
        a = s - (sum - s) / (TS)(n - 1);
      } else if (MODE == GA_MODE_MEAN_ONLY) {
        a = s - mean;
      } else if (MODE == GA_MODE_OPO) {
        a = s - wmean;
      } else {
        a = (s - mean) / scale;
      }
      if (nan_skip && a != a) a = TS(0);
      adv[i] = (float)a;
    }
  }
}

/* token_advantages[b, t] = advantages[b] * mask[b, t]; exactly 0 where the mask is 0 (even for
 * a non-finite advantage), advantages[b] where there is no mask. A thread writes RLK_GA_UNROLL
 * 4-element chunks a blockDim.x apart (16-byte stores where the row is aligned), loading their
 * mask values first; tiles of chunks over grid.x, rows over grid.y, both strided. */
template <int MASK>
__global__ void group_advantage_broadcast(RLK_PARAMS_ARG ga_broadcast_args p_) {
  const float *__restrict__ adv = p_.adv;
  const void *__restrict__ mask = p_.mask;
  float *__restrict__ out = p_.out;
  const i64 mask_stride = p_.mask_stride, out_stride = p_.out_stride, B = p_.B, T = p_.T;
  const i64 chunks = (T + 3) / 4;
  const i64 bd = blockDim.x;
  const i64 tile = RLK_GA_UNROLL * bd;
  for (i64 row = blockIdx.y; row < B; row += gridDim.y) {
    const float a = ld_ro(adv + row);
    float *o = out + row * out_stride;
    const i64 m0 = row * mask_stride;
    const bool vec = is_aligned<16>(o) && ga::mask_vec_ok<MASK>(mask, m0);
    for (i64 c0 = (i64)blockIdx.x * tile + threadIdx.x; c0 < chunks; c0 += (i64)gridDim.x * tile) {
      float w[RLK_GA_UNROLL][4];
#pragma unroll
      for (int u = 0; u < RLK_GA_UNROLL; ++u) {
        const i64 t = 4 * (c0 + u * bd);
        if (vec && t + 4 <= T) {
          seq_mask_weight4<MASK, true>(mask, m0 + t, w[u]);
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) w[u][j] = t + j < T ? seq_mask_weight<MASK, true>(mask, m0 + t + j) : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < RLK_GA_UNROLL; ++u) {
        const i64 t = 4 * (c0 + u * bd);
        float q[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          q[j] = MASK == RLK_SEQ_MASK_NONE ? a : (w[u][j] != 0.0f ? a * w[u][j] : 0.0f);
        if (vec && t + 4 <= T) {
          store4(o + t, q[0], q[1], q[2], q[3]);
        } else {
          for (int j = 0; j < 4 && t + j < T; ++j) o[t + j] = q[j];
        }
      }
    }
  }
}

} /* namespace rlk */

#endif /* RLK_GROUP_ADVANTAGE_CUH */

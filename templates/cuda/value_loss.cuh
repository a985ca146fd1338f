/* value_loss.cuh - the clipped value loss, forward and backward in one pass over the tokens
 * (token_loss.cuh), then a one-block reduction.
 *
 * Entries, launched in this order by src/ops/value_loss.c:
 *   value_loss_count   (token-mean by this call's mask count only) the count's partials
 *   value_loss_main    grad_values per token, per-block partial sums
 *   value_loss_reduce  the partials combined in a fixed order -> loss [1] and metrics
 *
 * Per token: v_clip = clamp(v, v_old - c, v_old + c) (= v_old + clamp(v - v_old, -c, c), and
 * exactly v where it is not clipped),
 * l = 0.5 max((v - R)^2, (v_clip - R)^2); the gradient follows torch's conventions (the clamp
 * passes it on its closed range, max splits it on a tie). */
#ifndef RLK_VALUE_LOSS_CUH
#define RLK_VALUE_LOSS_CUH

#include "token_loss.cuh"
#include "value_loss_params.h"

namespace rlk {
namespace vl {

template <typename T, bool SEQMEAN, bool HAS_MASK> struct Op {
  static constexpr int NIN = VL_NIN, NOUT = VL_NOUT, NACC = VL_NACC;
  static constexpr unsigned IN_BITS = 7u, OUT_BITS = 1u;
  static constexpr bool ROWSTAT = SEQMEAN && HAS_MASK;
  static constexpr unsigned PRE_BITS = 0u;
  static constexpr int NPRE = 1;
  static constexpr int reduce_kind(int) { return tl::RED_SUM; }

  T clip, cg, bg, rowfac;

  /* c: the gradient constant (tl::grad_scale) */
  RLK_DEVICE Op(const vl_args &a, double c) {
    clip = (T)a.clip;
    cg = (T)c;
    bg = (T)a.bound_g;
    rowfac = T(1);
  }

  RLK_DEVICE void acc_init(T *acc) const {
#pragma unroll
    for (int k = 0; k < NACC; ++k) acc[k] = T(0);
  }

  RLK_DEVICE void row_begin(i64, i64 len) {
    if (SEQMEAN && !HAS_MASK) rowfac = len > 0 ? T(1) / (T)len : T(0);
  }

  RLK_DEVICE void pre(const T *, float m, T *pre) const {
    if (m != 0.0f) pre[0] += (T)m;
  }

  RLK_DEVICE void row_stats(const T *pre) {
    if (SEQMEAN && HAS_MASK) rowfac = pre[0] > T(0) ? T(1) / pre[0] : T(0);
  }

  RLK_DEVICE void row_done(T *) const {}

  RLK_DEVICE void token(const T *x, float mf, T *acc, T *y) const {
    y[VL_OUT_GV] = T(0);
    if (mf == 0.0f) return;
    const T m = (T)mf;
    const T v = x[VL_IN_V], vo = x[VL_IN_OLD], R = x[VL_IN_RET];
    /* clamp(v, vo - c, vo + c): exactly v where it is inside, so an unclipped token never
     * counts as clipped through rounding */
    const T lo = vo - clip, hi = vo + clip;
    const T pass = tl::gate(v, lo, hi, bg);
    const T vc = tl::clampv(v, lo, hi);
    const T e1 = v - R, e2 = vc - R;
    const T a = e1 * e1, b = e2 * e2;
    T l, g;
    bool clipf = false;
    if (a > b) {
      l = T(0.5) * a;
      g = e1;
    } else if (b > a) {
      l = T(0.5) * b;
      g = pass * e2;
      clipf = true;
    } else {
      l = T(0.5) * a;
      g = T(0.5) * (e1 + pass * e2);
    }
    const T w = SEQMEAN ? m * rowfac : m;
    acc[VL_A_LOSS] += w * l;
    acc[VL_A_MASK] += m;
    if (clipf) acc[VL_A_CLIP] += m;
    acc[VL_A_V] += m * v;
    acc[VL_A_ERR] += m * a;
    y[VL_OUT_GV] = w * (cg * g);
  }
};

struct ReduceKinds {
  static constexpr int reduce_kind(int) { return tl::RED_SUM; }
};

} /* namespace vl */

template <typename T, bool SEQMEAN, int LAYOUT, int MASK>
__global__ void __launch_bounds__(RLK_TL_BLOCK, RLK_TL_BLOCKS_PER_SM) value_loss_main(RLK_PARAMS_ARG vl_args a) {
  __shared__ T sh_acc[VL_NACC * RLK_MAX_WARPS];
  __shared__ T sh2[2 * RLK_MAX_WARPS];
  __shared__ double sh_c[RLK_MAX_WARPS];
  vl::Op<T, SEQMEAN, MASK != RLK_SEQ_MASK_NONE> op(a, tl::grad_scale(a.norm, a.c_grad, sh_c));
  tl::token_pass<T, LAYOUT, MASK>(op, a.s, a.partials, sh_acc, sh2);
}

/* The mask count pass (token-mean without a normalizer): per-block counts. */
template <int LAYOUT, int MASK>
__global__ void __launch_bounds__(RLK_TL_BLOCK) value_loss_count(RLK_PARAMS_ARG vl_args a) {
  __shared__ double sh[RLK_MAX_WARPS];
  tl::count_pass<LAYOUT, MASK>(a.s, a.norm.counts, sh);
}

template <typename T> __global__ void value_loss_reduce(RLK_PARAMS_ARG vl_args a) {
  __shared__ double sh[VL_NACC * RLK_MAX_WARPS];
  double s[VL_NACC];
  const double c = tl::grad_scale(a.norm, a.c_grad, sh);
  tl::reduce_partials<vl::ReduceKinds>(a.partials, a.num_partials, sh, s);
  if (threadIdx.x != 0) return;
  ((T *)a.loss)[0] = (T)(c * s[VL_A_LOSS]);
  if (a.metrics) {
    T *m = (T *)a.metrics;
    const double n = s[VL_A_MASK];
    const double inv = n != 0.0 ? 1.0 / n : 0.0;
    m[0] = (T)(s[VL_A_CLIP] * inv);
    m[1] = (T)(s[VL_A_V] * inv);
    m[2] = (T)(s[VL_A_ERR] * inv);
    m[3] = (T)n;
  }
}

} /* namespace rlk */

#endif /* RLK_VALUE_LOSS_CUH */

/* value_loss.c - host form of the clipped value loss (templates/cuda/value_loss.cuh): the whole
 * call in one function, sequences and tokens in order, each token's terms in RLK_P_DTYPE exactly
 * as the CUDA Op::token writes them, sums in f64. Parameter: RLK_P_DTYPE (float or double); the
 * layout, mask kind and aggregation are run-time fields of vl_args. */
#include <math.h>

#include "token_loss_host.h"
#include "value_loss_params.h"

typedef RLK_P_DTYPE T;

static inline T clampv(T x, T lo, T hi) { return x < lo ? lo : (x > hi ? hi : x); }

RLK_HOST_KERNEL rlk_value_loss_host(void **args) {
  const vl_args a = RLK_ARG(vl_args, 0);
  const tl_count_view cv = {a.layout, a.mask_kind, a.s.rows, a.s.cols, a.s.mask_stride, a.s.mask,
                            a.s.offsets};
  const double k = tl_grad_scale(&a.norm, a.c_grad, &cv);
  const T clip = (T)a.clip, cg = (T)k, bg = (T)a.bound_g;
  const int has_mask = a.mask_kind != RLK_SEQ_MASK_NONE;
  double acc[VL_NACC] = {0, 0, 0, 0, 0};

  for (rlk_i64 row = 0; row < a.s.rows; row++) {
    rlk_i64 first, len;
    tl_row(a.layout, a.s.offsets, row, a.s.cols, &first, &len);
    const T *v = (const T *)a.s.in[VL_IN_V] + tl_base(a.layout, row, a.s.in_stride[VL_IN_V], first);
    const T *vo = (const T *)a.s.in[VL_IN_OLD] + tl_base(a.layout, row, a.s.in_stride[VL_IN_OLD], first);
    const T *R = (const T *)a.s.in[VL_IN_RET] + tl_base(a.layout, row, a.s.in_stride[VL_IN_RET], first);
    T *gv = (T *)a.s.out[VL_OUT_GV] + tl_base(a.layout, row, a.s.out_stride[VL_OUT_GV], first);
    const rlk_i64 m0 = has_mask ? tl_base(a.layout, row, a.s.mask_stride, first) : 0;

    T rowfac = 1;
    if (a.seqmean) {
      if (has_mask) {
        double n = 0.0;
        for (rlk_i64 j = 0; j < len; j++) {
          const float m = rlk_mask_weight(a.mask_kind, a.s.mask, m0 + j);
          if (m != 0.0f) n += (double)m;
        }
        rowfac = n > 0.0 ? (T)1 / (T)n : (T)0;
      } else {
        rowfac = len > 0 ? (T)1 / (T)len : (T)0;
      }
    }

    for (rlk_i64 j = 0; j < len; j++) {
      const float mf = rlk_mask_weight(a.mask_kind, a.s.mask, m0 + j);
      if (mf == 0.0f) {
        gv[j] = 0;
        continue;
      }
      const T m = (T)mf;
      const T lo = vo[j] - clip, hi = vo[j] + clip;
      const T pass = (T)tl_gate((double)v[j], (double)lo, (double)hi, (double)bg);
      const T vc = clampv(v[j], lo, hi);
      const T e1 = v[j] - R[j], e2 = vc - R[j];
      const T qa = e1 * e1, qb = e2 * e2;
      T l, g;
      int clipf = 0;
      if (qa > qb) {
        l = (T)0.5 * qa;
        g = e1;
      } else if (qb > qa) {
        l = (T)0.5 * qb;
        g = pass * e2;
        clipf = 1;
      } else {
        l = (T)0.5 * qa;
        g = (T)0.5 * (e1 + pass * e2);
      }
      const T w = a.seqmean ? m * rowfac : m;
      acc[VL_A_LOSS] += (double)(w * l);
      acc[VL_A_MASK] += (double)m;
      if (clipf) acc[VL_A_CLIP] += (double)m;
      acc[VL_A_V] += (double)(m * v[j]);
      acc[VL_A_ERR] += (double)(m * qa);
      gv[j] = w * (cg * g);
    }
  }

  ((T *)a.loss)[0] = (T)(k * acc[VL_A_LOSS]);
  if (a.metrics) {
    T *mt = (T *)a.metrics;
    const double n = acc[VL_A_MASK];
    const double inv = n != 0.0 ? 1.0 / n : 0.0;
    mt[0] = (T)(acc[VL_A_CLIP] * inv);
    mt[1] = (T)(acc[VL_A_V] * inv);
    mt[2] = (T)(acc[VL_A_ERR] * inv);
    mt[3] = (T)n;
  }
}

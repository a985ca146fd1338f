/* token_loss_host.h - what the host token-loss kernels (policy_loss.c, value_loss.c) share:
 * the mask (rlk_host_seq_mask.h), the sequence geometry and the divisor (their arguments are declared in
 * templates/common/policy_loss_params.h and value_loss_params.h). The host kernels do a whole
 * call in one function: sequences in order, tokens in order, sums in f64. The choices the CUDA
 * kernels bake in (mode, KL estimator, layout, mask kind, ...) are run-time fields here, so one
 * host kernel per dtype serves every configuration. */
#ifndef RLK_TOKEN_LOSS_HOST_H
#define RLK_TOKEN_LOSS_HOST_H

#include "rlk_host_offsets.h"
#include "rlk_host_prelude.h"
#include "rlk_host_seq_mask.h"
#include "token_loss_params.h"

/* A clamp's gradient factor: 1 strictly inside [lo, hi], bg on a bound, 0 outside or NaN. */
static inline double tl_gate(double x, double lo, double hi, double bg) {
  return (x > lo && x < hi) ? 1.0 : ((x == lo || x == hi) ? bg : 0.0);
}

/* Row `row`: the element offset of its token 0 in stream `stride`'s layout (padded: row *
 * stride; packed: the sequence's first token) and its token count. Packed offsets are clamped
 * into [0, N] and made non-decreasing (the op validated them; nothing outside is touched). */
static inline void tl_row(rlk_i64 layout, const void *offsets, rlk_i64 row, rlk_i64 cols,
                          rlk_i64 *first, rlk_i64 *len) {
  if (layout == TL_LAYOUT_PADDED) {
    *first = 0;
    *len = cols;
    return;
  }
  rlk_i64 a, b;
  rlk_offsets_range(offsets, layout == TL_LAYOUT_PACKED_I32, row, cols, &a, &b);
  *first = a;
  *len = b - a;
}

/* Element offset of (row, token 0) for a stream with row stride `stride`. */
static inline rlk_i64 tl_base(rlk_i64 layout, rlk_i64 row, rlk_i64 stride, rlk_i64 first) {
  return layout == TL_LAYOUT_PADDED ? row * stride : first;
}

/* Where the streams of a call live, for tl_grad_scale's count. */
typedef struct tl_count_view {
  rlk_i64 layout, mask_kind, rows, cols, mask_stride;
  const void *mask, *offsets;
} tl_count_view;

/* The gradient constant: c_grad, or c_grad divided by the scalar or by the mask count (the
 * weight of the tokens with m != 0, sequences and tokens in order, in f64; 0 when nothing
 * counts), as tl::grad_scale. */
static inline double tl_grad_scale(const tl_norm *n, double c, const tl_count_view *v) {
  if (n->kind == TL_NORM_F32) return c / (double)*(const float *)n->value;
  if (n->kind == TL_NORM_F64) return c / *(const double *)n->value;
  if (n->kind != TL_NORM_COUNT) return c;
  double total = 0.0;
  for (rlk_i64 row = 0; row < v->rows; row++) {
    rlk_i64 first, len;
    tl_row(v->layout, v->offsets, row, v->cols, &first, &len);
    const rlk_i64 m0 = tl_base(v->layout, row, v->mask_stride, first);
    for (rlk_i64 j = 0; j < len; j++) {
      const float m = rlk_mask_weight(v->mask_kind, v->mask, m0 + j);
      if (m != 0.0f) total += (double)m;
    }
  }
  return total > 0.0 ? c / total : 0.0;
}

#endif

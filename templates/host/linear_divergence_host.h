/* linear_divergence_host.h - what the host forms of rlk_linear_divergence share (fp64
 * throughout): a head's logit as an fp64 dot product, and the top-k order. RLK_P_SDT and
 * RLK_P_TDT are the heads' dtype codes (RLK_DT_F16, RLK_DT_BF16); RLK_P_LABELS the labels' (LD_LAB_*). */
#ifndef RLK_LINEAR_DIVERGENCE_HOST_H
#define RLK_LINEAR_DIVERGENCE_HOST_H

#include <math.h>

#include "rlk_float_dtype.h"
#include "rlk_host_prelude.h"
#include "linear_divergence_params.h"

static inline double ld_val(const uint16_t *p, rlk_i64 j, int dt) {
  return dt == RLK_DT_F16 ? (double)rlk_f16_to_float(p[j]) : (double)rlk_bf16_to_float(p[j]);
}

/* h . w in fp64, k in order. */
static inline double ld_dot(const uint16_t *h, const uint16_t *w, rlk_i64 H, int dt) {
  double s = 0.0;
  for (rlk_i64 k = 0; k < H; k++) s += ld_val(h, k, dt) * ld_val(w, k, dt);
  return s;
}

/* Whether row i's label is ignore_index (never without labels). */
static inline int ld_ignored(const void *labels, rlk_i64 stride, rlk_i64 i, rlk_i64 ignore_index) {
  if (RLK_P_LABELS == LD_LAB_NONE || !labels) return 0;
  const rlk_i64 y = RLK_P_LABELS == LD_LAB_I32 ? (rlk_i64)((const int32_t *)labels)[i * stride]
                                      : (rlk_i64)((const int64_t *)labels)[i * stride];
  return y == ignore_index;
}

/* The top-k order: a before b when its teacher logit is larger, or equal at a lower column. */
static inline int ld_before(double za, rlk_i64 va, double zb, rlk_i64 vb) { return za > zb || (za == zb && va < vb); }

#endif

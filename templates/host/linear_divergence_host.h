/* linear_divergence_host.h - what the host forms of rlk_linear_divergence share (fp64
 * throughout): whether a row is ignored, and the top-k order (a head's logit is an fp64 dot
 * product, rlk_host_half.h). RLK_P_SDT and
 * RLK_P_TDT are the heads' dtype codes (RLK_DT_F16, RLK_DT_BF16); RLK_P_LABELS the labels' (LD_LAB_*). */
#ifndef RLK_LINEAR_DIVERGENCE_HOST_H
#define RLK_LINEAR_DIVERGENCE_HOST_H

#include <math.h>

#include "rlk_host_half.h"
#include "linear_divergence_params.h"

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

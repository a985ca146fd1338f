/* rlk_host_half.h - 16-bit float rows (a dtype code of rlk_float_dtype.h: RLK_DT_F16 or
 * RLK_DT_BF16) as the fp64 host kernels read them: an element widened, and a dot product. */
#ifndef RLK_HOST_HALF_H
#define RLK_HOST_HALF_H

#include "rlk_float_dtype.h"
#include "rlk_host_prelude.h"

/* Element j of p as a double. */
static inline double rlk_half_at(const uint16_t *p, rlk_i64 j, int dt) {
  return dt == RLK_DT_F16 ? (double)rlk_f16_to_float(p[j]) : (double)rlk_bf16_to_float(p[j]);
}

/* a . b over n elements in fp64, in order. */
static inline double rlk_half_dot(const uint16_t *a, const uint16_t *b, rlk_i64 n, int dt) {
  double s = 0.0;
  for (rlk_i64 k = 0; k < n; k++) s += rlk_half_at(a, k, dt) * rlk_half_at(b, k, dt);
  return s;
}

#endif

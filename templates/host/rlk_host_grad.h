/* rlk_host_grad.h - an element of a gradient the host kernels write in the fused heads' dtype
 * codes (0 f32, 1 f16, 2 bf16): read as a double, written rounded to nearest (even). */
#ifndef RLK_HOST_GRAD_H
#define RLK_HOST_GRAD_H

#include "rlk_host_prelude.h"

static inline double rlk_grad_get(const void *p, int dt, rlk_i64 j) {
  if (dt == 0) return ((const float *)p)[j];
  return dt == 1 ? rlk_f16_to_float(((const uint16_t *)p)[j]) : rlk_bf16_to_float(((const uint16_t *)p)[j]);
}

static inline void rlk_grad_put(void *p, int dt, rlk_i64 j, double v) {
  if (dt == 0)
    ((float *)p)[j] = (float)v;
  else if (dt == 1)
    ((uint16_t *)p)[j] = rlk_float_to_f16((float)v);
  else
    ((uint16_t *)p)[j] = rlk_float_to_bf16((float)v);
}

#endif

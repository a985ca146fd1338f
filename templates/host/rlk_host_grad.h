/* rlk_host_grad.h - an element of a gradient the host kernels write, of a dtype code
 * (RLK_DT_*): read as a double, written rounded to nearest (even). */
#ifndef RLK_HOST_GRAD_H
#define RLK_HOST_GRAD_H

#include "rlk_float_dtype.h"
#include "rlk_host_prelude.h"

static inline double rlk_grad_get(const void *p, int dt, rlk_i64 j) {
  if (dt == RLK_DT_F32) return ((const float *)p)[j];
  return dt == RLK_DT_F16 ? rlk_f16_to_float(((const uint16_t *)p)[j]) : rlk_bf16_to_float(((const uint16_t *)p)[j]);
}

static inline void rlk_grad_put(void *p, int dt, rlk_i64 j, double v) {
  if (dt == RLK_DT_F32)
    ((float *)p)[j] = (float)v;
  else if (dt == RLK_DT_F16)
    ((uint16_t *)p)[j] = rlk_float_to_f16((float)v);
  else
    ((uint16_t *)p)[j] = rlk_float_to_bf16((float)v);
}

#endif

/* token_baseline_common.h - what the host token_baseline kernels share (their template values:
 * templates/common/token_baseline_params.h). */
#ifndef RLK_TOKEN_BASELINE_COMMON_H
#define RLK_TOKEN_BASELINE_COMMON_H

#include <math.h>

#include "rlk_host_prelude.h"
#include "token_baseline_params.h"

typedef RLK_P_DTYPE tb_t;

/* The mask value at element i as a float weight (1 without a mask; a bool is 0 or 1). */
static inline float tb_mask_at(const void *mask, rlk_i64 i) {
  switch (RLK_P_MASK) {
  case RLK_SEQ_MASK_BOOL:
    return ((const uint8_t *)mask)[i] != 0 ? 1.0f : 0.0f;
  case RLK_SEQ_MASK_I32:
    return (float)((const int32_t *)mask)[i];
  case RLK_SEQ_MASK_F32:
    return ((const float *)mask)[i];
  default:
    return 1.0f;
  }
}

#endif

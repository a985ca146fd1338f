/* group_advantage_common.h - pieces the host group_advantage kernels share (their template
 * values: templates/common/group_advantage_params.h). */
#ifndef RLK_GROUP_ADVANTAGE_COMMON_H
#define RLK_GROUP_ADVANTAGE_COMMON_H

#include "rlk_host_prelude.h"
#include "group_advantage_params.h"

/* The mask value at element i as a float weight (1 without a mask; a bool is 0 or 1). */
static inline float ga_mask_at(int kind, const void *mask, rlk_i64 i) {
  switch (kind) {
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

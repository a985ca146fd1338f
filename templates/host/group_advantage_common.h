/* group_advantage_common.h - pieces the host group_advantage kernels share. The enum values
 * are the indices of the choice names in the op's parameter schema (src/ops/group_advantage.c)
 * and match templates/cuda/group_advantage.cuh. */
#ifndef RLK_GROUP_ADVANTAGE_COMMON_H
#define RLK_GROUP_ADVANTAGE_COMMON_H

#include "rlk_host_prelude.h"
#include "group_advantage_params.h"

enum { GA_MODE_GRPO = 0, GA_MODE_MEAN_ONLY = 1, GA_MODE_RLOO = 2, GA_MODE_BATCH_STD = 3, GA_MODE_OPO = 4,
       GA_MODE_PASSK = 5, GA_MODE_PASSK_UNSCALED = 6 };
enum { GA_SINGLETON_MEAN0_STD1 = 0, GA_SINGLETON_ZERO = 1 };
enum { GA_OFFSETS_FIXED = 0, GA_OFFSETS_I32 = 1, GA_OFFSETS_I64 = 2 };

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

/* rlk_host_seq_mask.h - a per-token mask (a kind of rlk_seq_mask.h) as the host kernels read it:
 * as a weight (advantage_scan_common.h reads it as valid/invalid flags). */
#ifndef RLK_HOST_SEQ_MASK_H
#define RLK_HOST_SEQ_MASK_H

#include "rlk_host_prelude.h"
#include "rlk_seq_mask.h"

/* The mask value at element i as a float weight (1 without a mask; a bool is 0 or 1). */
static inline float rlk_mask_weight(int kind, const void *mask, rlk_i64 i) {
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

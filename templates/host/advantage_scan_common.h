/* advantage_scan_common.h - what the host forms of the per-token sequence kernels
 * (advantage_scan.c, masked_whiten.c) share: the mask (a kind of rlk_seq_mask.h) read as
 * valid/invalid flags. A position is valid where the mask value is non-zero (an f32 other than
 * +-0; NaN counts as valid). */
#ifndef RLK_ADVANTAGE_SCAN_COMMON_H
#define RLK_ADVANTAGE_SCAN_COMMON_H

#include "rlk_host_prelude.h"
#include "rlk_seq_mask.h"

static inline int seq_valid_at(const void *mask, int kind, rlk_i64 i) {
  switch (kind) {
  case RLK_SEQ_MASK_BOOL:
    return ((const uint8_t *)mask)[i] != 0;
  case RLK_SEQ_MASK_I32:
    return ((const int32_t *)mask)[i] != 0;
  case RLK_SEQ_MASK_F32: {
    uint32_t u;
    memcpy(&u, (const uint32_t *)mask + i, sizeof u);
    return (u << 1) != 0u;
  }
  default:
    return 1;
  }
}

#endif

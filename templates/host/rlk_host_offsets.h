/* rlk_host_offsets.h - a range of an offsets array (group_offsets, seq_offsets: int32_t or
 * int64_t) as the host kernels read it: clamped, so that offsets the op validated (or a device
 * array it could not read) never send a kernel outside its rows. */
#ifndef RLK_HOST_OFFSETS_H
#define RLK_HOST_OFFSETS_H

#include "rlk_host_prelude.h"

/* [*start, *end) clamped into [0, n] and made non-decreasing. */
static inline void rlk_clamp_range(rlk_i64 n, rlk_i64 *start, rlk_i64 *end) {
  *start = *start < 0 ? 0 : (*start > n ? n : *start);
  *end = *end < *start ? *start : (*end > n ? n : *end);
}

/* Entries i and i + 1 of offsets (int32_t ones when is_i32, else int64_t) as the range
 * [*start, *end), clamped into [0, n]. */
static inline void rlk_offsets_range(const void *offsets, int is_i32, rlk_i64 i, rlk_i64 n, rlk_i64 *start,
                                     rlk_i64 *end) {
  if (is_i32) {
    *start = ((const int32_t *)offsets)[i];
    *end = ((const int32_t *)offsets)[i + 1];
  } else {
    *start = ((const int64_t *)offsets)[i];
    *end = ((const int64_t *)offsets)[i + 1];
  }
  rlk_clamp_range(n, start, end);
}

#endif

/* seq_mask.cuh - reads of a per-token mask (its kinds: rlk_seq_mask.h) and of the offsets arrays
 * that delimit packed sequences and groups, for the templates that walk tokens of rows. */
#ifndef RLK_SEQ_MASK_CUH
#define RLK_SEQ_MASK_CUH

#include "rlk_prelude.cuh"
#include "rlk_seq_mask.h"

namespace rlk {

/* A load through the read-only path (RO: ld_ro, for a kernel that never writes the memory), or a
 * plain one. */
template <bool RO, typename T> RLK_DEVICE T mask_load(const T *p) {
  if constexpr (RO)
    return ld_ro(p);
  else
    return *p;
}

/* The mask value at element i as a float weight (1 when there is no mask; a bool is 0 or 1). */
template <int MASK, bool RO> RLK_DEVICE float seq_mask_weight(const void *mask, i64 i) {
  if (MASK == RLK_SEQ_MASK_BOOL) return mask_load<RO>((const u8 *)mask + i) != 0 ? 1.0f : 0.0f;
  if (MASK == RLK_SEQ_MASK_I32) return (float)mask_load<RO>((const i32 *)mask + i);
  if (MASK == RLK_SEQ_MASK_F32) return mask_load<RO>((const float *)mask + i);
  return 1.0f;
}

/* Four mask weights from element i, with one load (the caller checked its alignment). */
template <int MASK, bool RO> RLK_DEVICE void seq_mask_weight4(const void *mask, i64 i, float w[4]) {
  if (MASK == RLK_SEQ_MASK_BOOL) {
    const u32 q = mask_load<RO>((const u32 *)((const u8 *)mask + i));
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = ((q >> (8 * j)) & 0xffu) != 0 ? 1.0f : 0.0f;
  } else if (MASK == RLK_SEQ_MASK_I32) {
    const i32x4 q = mask_load<RO>((const i32x4 *)((const i32 *)mask + i));
    w[0] = (float)q.x;
    w[1] = (float)q.y;
    w[2] = (float)q.z;
    w[3] = (float)q.w;
  } else if (MASK == RLK_SEQ_MASK_F32) {
    const f32x4 q = mask_load<RO>((const f32x4 *)((const float *)mask + i));
    w[0] = q.x;
    w[1] = q.y;
    w[2] = q.z;
    w[3] = q.w;
  } else {
    w[0] = w[1] = w[2] = w[3] = 1.0f;
  }
}

/* Bytes per mask element (0: no mask). */
template <int MASK> struct seq_mask_bytes {
  static constexpr int value = MASK == RLK_SEQ_MASK_NONE ? 0 : (MASK == RLK_SEQ_MASK_BOOL ? 1 : 4);
};

/* Entries i and i + 1 of an offsets array (i32 or i64) as the span [*a, *b), clamped into [0, n]
 * and non-decreasing: bad offsets never cause an access out of bounds. */
template <bool I32>
RLK_DEVICE void clamped_offsets(const void *offsets, i64 i, i64 n, i64 *a, i64 *b) {
  i64 x, y;
  if (I32) {
    x = ((const i32 *)offsets)[i];
    y = ((const i32 *)offsets)[i + 1];
  } else {
    x = ((const i64 *)offsets)[i];
    y = ((const i64 *)offsets)[i + 1];
  }
  x = min_(max_(x, (i64)0), n);
  y = min_(max_(y, x), n);
  *a = x;
  *b = y;
}

} /* namespace rlk */

#endif

/* advantage_scan_common.cuh - what the per-token sequence templates (advantage_scan.cuh,
 * masked_whiten.cuh) share: reading the mask as valid/invalid flags, 32-byte groups of values
 * per thread (16-byte vector accesses where aligned), and the shuffles their scans use.
 *
 * A mask kind is a run-time value (RLK_SEQ_MASK_*: rlk_seq_mask.h): it only picks
 * how a flag is read, and baking it in would multiply the kernels for nothing. A position is valid
 * where the mask value is non-zero: a bool byte != 0, an i32 != 0, an f32 other than +-0 (NaN
 * counts as valid). */
#ifndef RLK_ADVANTAGE_SCAN_COMMON_CUH
#define RLK_ADVANTAGE_SCAN_COMMON_CUH

#include "rlk_prelude.cuh"
#include "rlk_seq_mask.h"

namespace rlk {
namespace seq {

/* Elements of one dtype per thread group: 32 bytes (8 f32, 4 f64), two 16-byte accesses. */
template <typename TS> struct group {
  static constexpr int size = 32 / (int)sizeof(TS);
};

/* *p, through the read-only path when RO (memory no thread of the kernel writes: ld_ro). */
template <bool RO, typename T> RLK_DEVICE T rd(const T *p) {
  if constexpr (RO)
    return ld_ro(p);
  else
    return *p;
}

/* Is the mask element i a valid position? (A mask is never written: read-only loads.) */
RLK_DEVICE bool valid_at(const void *mask, int kind, i64 i) {
  if (kind == RLK_SEQ_MASK_BOOL) return ld_ro((const u8 *)mask + i) != 0;
  if (kind == RLK_SEQ_MASK_I32) return ld_ro((const i32 *)mask + i) != 0;
  if (kind == RLK_SEQ_MASK_F32) return (ld_ro((const u32 *)mask + i) << 1) != 0u;
  return true;
}

/* Bytes per mask element (0: no mask). */
RLK_DEVICE int mask_bytes(int kind) { return kind == RLK_SEQ_MASK_NONE ? 0 : (kind == RLK_SEQ_MASK_BOOL ? 1 : 4); }

/* Can K flags from mask element i be read with vector loads (K bool bytes: one K-byte load;
 * K 4-byte values: 16-byte loads)? */
template <int K> RLK_DEVICE bool mask_vec_ok(const void *mask, int kind, i64 i) {
  if (kind == RLK_SEQ_MASK_NONE) return true;
  if (kind == RLK_SEQ_MASK_BOOL) return is_aligned<K>((const u8 *)mask + i);
  return is_aligned<16>((const u8 *)mask + 4 * i);
}

/* The K flags from mask element i: the first n are real (n <= K), the rest false. `vec` says the
 * row was found aligned for vector loads (mask_vec_ok at a multiple of K). */
template <int K>
RLK_DEVICE void load_valid(const void *mask, int kind, i64 i, int n, bool vec, bool m[K]) {
  static_assert(K == 4 || K == 8, "K");
  if (kind == RLK_SEQ_MASK_NONE) {
#pragma unroll
    for (int j = 0; j < K; ++j) m[j] = j < n;
    return;
  }
  if (vec && n == K) {
    if (kind == RLK_SEQ_MASK_BOOL) {
      u64 q;
      if (K == 8)
        q = ld_ro((const u64 *)((const u8 *)mask + i));
      else
        q = ld_ro((const u32 *)((const u8 *)mask + i));
#pragma unroll
      for (int j = 0; j < K; ++j) m[j] = ((q >> (8 * j)) & 0xffu) != 0;
    } else {
      const u32 shift = kind == RLK_SEQ_MASK_F32 ? 1u : 0u;
#pragma unroll
      for (int c = 0; c < K / 4; ++c) {
        const i32x4 q = ld_ro((const i32x4 *)((const i32 *)mask + i + 4 * c));
        m[4 * c + 0] = ((u32)q.x << shift) != 0u;
        m[4 * c + 1] = ((u32)q.y << shift) != 0u;
        m[4 * c + 2] = ((u32)q.z << shift) != 0u;
        m[4 * c + 3] = ((u32)q.w << shift) != 0u;
      }
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < K; ++j) m[j] = j < n ? valid_at(mask, kind, i + j) : false;
}

template <bool RO> RLK_DEVICE void load16(const float *p, float *v) {
  const f32x4 q = rd<RO>((const f32x4 *)p);
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}
template <bool RO> RLK_DEVICE void load16(const double *p, double *v) {
  const f64x2 q = rd<RO>((const f64x2 *)p);
  v[0] = q.x;
  v[1] = q.y;
}
RLK_DEVICE void store16(float *p, const float *v) { store4(p, v[0], v[1], v[2], v[3]); }
RLK_DEVICE void store16(double *p, const double *v) {
  f64x2 q;
  q.x = v[0];
  q.y = v[1];
  *(f64x2 *)p = q;
}

/* K values from p: the first n real (vector loads when `vec` and the group is whole), the rest 0.
 * RO: p is read-only for the kernel (read-only loads; not where an output may alias it). */
template <typename TS, int K, bool RO> RLK_DEVICE void load_vals(const TS *p, int n, bool vec, TS v[K]) {
  constexpr int per = 16 / (int)sizeof(TS);
  if (vec && n == K) {
#pragma unroll
    for (int c = 0; c < K / per; ++c) load16<RO>(p + c * per, v + c * per);
  } else {
#pragma unroll
    for (int j = 0; j < K; ++j) v[j] = j < n ? rd<RO>(p + j) : TS(0);
  }
}

/* Writes the first n of K values to p (vector stores when `vec` and the group is whole). */
template <typename TS, int K> RLK_DEVICE void store_vals(TS *p, int n, bool vec, const TS v[K]) {
  constexpr int per = 16 / (int)sizeof(TS);
  if (vec && n == K) {
#pragma unroll
    for (int c = 0; c < K / per; ++c) store16(p + c * per, v + c * per);
  } else {
#pragma unroll
    for (int j = 0; j < K; ++j)
      if (j < n) p[j] = v[j];
  }
}

} /* namespace seq */
} /* namespace rlk */

#endif /* RLK_ADVANTAGE_SCAN_COMMON_CUH */

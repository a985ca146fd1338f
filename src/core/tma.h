/* tma.h - a 2-D tiled tensor map as the ops ask for one, and the limits the tensor memory
 * accelerator (cp.async.bulk.tensor, sm_90 and later) puts on it. The limits are the hardware's,
 * checked on the host without a driver, so an op can take its non-TMA path before choosing a
 * kernel; a backend that has tensor maps encodes a request that passed (backend.h). Internal. */
#ifndef RLK_TMA_H
#define RLK_TMA_H

#include <stdint.h>

#include "rlk.h"

/* A 2-D tiled tensor map request. */
typedef struct rlk_tma_desc_request {
  const void *base;     /* global address */
  rlk_dtype dtype;
  uint64_t rows, cols;  /* global extent */
  uint64_t row_stride;  /* elements */
  uint32_t box_rows, box_cols;
  /* 0: boxes land row after row; 128: the 128-byte swizzle that wgmma's descriptors read (the
   * inner box at most 128 bytes, the shared destination 1024-byte aligned) */
  uint32_t swizzle;
} rlk_tma_desc_request;

/* Checks a request against the tensor-map limits (16-byte aligned base and stride, box
 * dimensions 1..256, inner box bytes a multiple of 16 and at most 128 with the swizzle, extents
 * within 2^32, a dtype tensor maps carry: f32, f16, bf16, f64, i32, i64). RLK_OK or
 * RLK_ERR_UNSUPPORTED with the reason: the caller then takes a non-TMA path instead of faulting
 * on the device. Whether the target has tensor maps at all is its RLK_TARGET_TMA feature. */
rlk_status rlk_tma_check(const rlk_tma_desc_request *req);

#endif

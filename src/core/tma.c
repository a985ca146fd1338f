/* tma.c - the tensor-map limits (tma.h).
 *
 * The driver's encoder rejects a bad request with a bare CUDA_ERROR_INVALID_VALUE, and a
 * kernel built around a box the hardware cannot copy (say 512 columns, over the 256 limit)
 * never runs at all. rlk_tma_check applies the same limits on the host first and says which
 * one a request breaks, so a caller can take its non-TMA path instead. */
#include "core/tma.h"

#include "core/core.h"

#define TMA_MAX_BOX 256u                   /* elements per box dimension */
#define TMA_MAX_DIM (UINT64_C(1) << 32)    /* elements per global dimension */
#define TMA_MAX_STRIDE (UINT64_C(1) << 40) /* bytes, exclusive */
#define TMA_ALIGN 16u                      /* bytes: base address, strides, inner box */

/* The dtypes a tensor map has an element type for. */
static int tma_carries(rlk_dtype dtype) {
  switch (dtype) {
  case RLK_F32:
  case RLK_F16:
  case RLK_BF16:
  case RLK_F64:
  case RLK_I32:
  case RLK_I64: return 1;
  default: return 0;
  }
}

rlk_status rlk_tma_check(const rlk_tma_desc_request *req) {
  if (!req) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "tma: request is NULL");
  if (!tma_carries(req->dtype))
    return rlk_error(RLK_ERR_UNSUPPORTED, "tma: dtype %d has no tensor-map element type",
                     (int)req->dtype);
  const uint64_t esize = rlk_dtype_size(req->dtype);
  const uintptr_t base = (uintptr_t)req->base;
  if (base == 0) return rlk_error(RLK_ERR_UNSUPPORTED, "tma: base address is NULL");
  if (base % TMA_ALIGN)
    return rlk_error(RLK_ERR_UNSUPPORTED, "tma: base address %p is not 16-byte aligned",
                     req->base);
  if (req->rows == 0 || req->cols == 0)
    return rlk_error(RLK_ERR_UNSUPPORTED,
                     "tma: global extent %llu x %llu has a zero dimension",
                     (unsigned long long)req->rows, (unsigned long long)req->cols);
  if (req->rows > TMA_MAX_DIM || req->cols > TMA_MAX_DIM)
    return rlk_error(RLK_ERR_UNSUPPORTED,
                     "tma: global extent %llu x %llu exceeds 2^32 elements per dimension",
                     (unsigned long long)req->rows, (unsigned long long)req->cols);
  if (req->row_stride < req->cols)
    return rlk_error(RLK_ERR_UNSUPPORTED, "tma: row stride %llu is smaller than cols %llu",
                     (unsigned long long)req->row_stride, (unsigned long long)req->cols);
  /* Compare in elements first so the byte count cannot overflow. */
  if (req->row_stride >= TMA_MAX_STRIDE / esize)
    return rlk_error(RLK_ERR_UNSUPPORTED,
                     "tma: row stride %llu elements is 2^40 bytes or more",
                     (unsigned long long)req->row_stride);
  const uint64_t stride_bytes = req->row_stride * esize;
  if (stride_bytes % TMA_ALIGN)
    return rlk_error(RLK_ERR_UNSUPPORTED,
                     "tma: row stride of %llu bytes is not a multiple of 16 bytes",
                     (unsigned long long)stride_bytes);
  if (req->box_rows == 0 || req->box_cols == 0)
    return rlk_error(RLK_ERR_UNSUPPORTED, "tma: box %u x %u has a zero dimension",
                     req->box_rows, req->box_cols);
  if (req->box_rows > TMA_MAX_BOX)
    return rlk_error(RLK_ERR_UNSUPPORTED, "tma: box_rows %u exceeds the limit of 256",
                     req->box_rows);
  if (req->box_cols > TMA_MAX_BOX)
    return rlk_error(RLK_ERR_UNSUPPORTED, "tma: box_cols %u exceeds the limit of 256",
                     req->box_cols);
  const uint64_t inner_bytes = (uint64_t)req->box_cols * esize;
  if (inner_bytes % TMA_ALIGN)
    return rlk_error(RLK_ERR_UNSUPPORTED,
                     "tma: inner box of %u elements is %llu bytes, not a multiple of 16",
                     req->box_cols, (unsigned long long)inner_bytes);
  if (req->swizzle != 0 && req->swizzle != 128)
    return rlk_error(RLK_ERR_UNSUPPORTED, "tma: swizzle %u is not 0 or 128", req->swizzle);
  if (req->swizzle == 128 && inner_bytes > 128)
    return rlk_error(RLK_ERR_UNSUPPORTED,
                     "tma: inner box of %llu bytes exceeds the 128-byte swizzle span",
                     (unsigned long long)inner_bytes);
  return RLK_OK;
}

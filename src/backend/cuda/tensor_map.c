/* tensor_map.c - the CUDA backend's tensor_map_encode: a request that passed rlk_tma_check
 * (core/tma.h) encoded into a CUtensorMap by the driver, for the TMA paths of sm_90+. */
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_driver.h"
#include "core/core.h"
#include "core/tma.h"

/* The driver's element type for an rlk dtype, or -1 when tensor maps cannot carry it. */
static int tma_dtype(rlk_dtype dtype) {
  switch (dtype) {
  case RLK_F32: return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  case RLK_F16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  case RLK_BF16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  case RLK_F64: return CU_TENSOR_MAP_DATA_TYPE_FLOAT64;
  case RLK_I32: return CU_TENSOR_MAP_DATA_TYPE_INT32;
  case RLK_I64: return CU_TENSOR_MAP_DATA_TYPE_INT64;
  default: return -1;
  }
}

rlk_status rlk_cuda_tma_encode(rlk_backend_impl *cuda, const rlk_tma_desc_request *req,
                               void *out128) {
  if (!cuda || cuda->kind != RLK_BACKEND_CUDA)
    return rlk_error(RLK_ERR_UNSUPPORTED, "tma: tensor maps need a CUDA backend");
  if (!out128) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "tma: output is NULL");
  rlk_status st = rlk_tma_check(req);
  if (st != RLK_OK) return st;
  const rlk_cuda_driver *d = NULL;
  st = rlk_cuda_driver_load(&d);
  if (st != RLK_OK) return st;
  if (!d->cuTensorMapEncodeTiled)
    return rlk_error(RLK_ERR_UNSUPPORTED,
                     "tma: the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12+)");
  const uint64_t esize = rlk_dtype_size(req->dtype);
  /* Dimension 0 is the contiguous one (columns); strides list dimensions 1.. in bytes. */
  const uint64_t dims[2] = {req->cols, req->rows};
  const uint64_t strides[1] = {req->row_stride * esize};
  const uint32_t box[2] = {req->box_cols, req->box_rows};
  const uint32_t element_strides[2] = {1, 1};
  /* Encoded into an aligned local and copied out, so `out128` itself needs no alignment. */
  CUtensorMap map;
  memset(&map, 0, sizeof map);
  /* The driver wants a current context even for this host-side encoding. */
  rlk_cuda_scope scope;
  st = rlk_cuda_enter(cuda, &scope);
  if (st != RLK_OK) return st;
  CUresult r = d->cuTensorMapEncodeTiled(
      &map, tma_dtype(req->dtype), 2, (void *)(uintptr_t)req->base, dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      req->swizzle == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      req->swizzle == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return rlk_cuda_leave(cuda, &scope, rlk_cuda_fail(RLK_ERR_BACKEND, "cuTensorMapEncodeTiled", r));
  memcpy(out128, &map, sizeof map);
  return rlk_cuda_leave(cuda, &scope, RLK_OK);
}

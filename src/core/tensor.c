/* tensor.c - tensor descriptors and dtypes. */
#include "core/core.h"

rlk_tensor rlk_tensor_1d(void *data, rlk_dtype dtype, int64_t n) {
  return (rlk_tensor){.data = data, .dtype = dtype, .ndim = 1, .shape = {n}, .strides = {1}};
}

rlk_tensor rlk_tensor_2d(void *data, rlk_dtype dtype, int64_t rows, int64_t cols, int64_t row_stride) {
  return (rlk_tensor){.data = data, .dtype = dtype, .ndim = 2, .shape = {rows, cols}, .strides = {row_stride, 1}};
}

size_t rlk_dtype_size(rlk_dtype dtype) {
  switch (dtype) {
    case RLK_F32: return 4;
    case RLK_F16: return 2;
    case RLK_BF16: return 2;
    case RLK_F64: return 8;
    case RLK_I32: return 4;
    case RLK_I64: return 8;
    case RLK_BOOL: return 1;
    default: return 0;
  }
}

const char *rlk_dtype_name(rlk_dtype dtype) {
  switch (dtype) {
    case RLK_F32: return "f32";
    case RLK_F16: return "f16";
    case RLK_BF16: return "bf16";
    case RLK_F64: return "f64";
    case RLK_I32: return "i32";
    case RLK_I64: return "i64";
    case RLK_BOOL: return "bool";
    default: return "invalid";
  }
}

#define RLK_STR_(x) #x
#define RLK_STR(x) RLK_STR_(x)

const char *rlk_version_string(void) {
  return RLK_STR(RLK_VERSION_MAJOR) "." RLK_STR(RLK_VERSION_MINOR) "." RLK_STR(RLK_VERSION_PATCH);
}

int rlk_version(void) {
  return RLK_VERSION_MAJOR * 10000 + RLK_VERSION_MINOR * 100 + RLK_VERSION_PATCH;
}

rlk_status rlk_check_tensor(const rlk_tensor *t, const char *what, int required) {
  if (!t->data) {
    if (!required) return RLK_OK;
    /* an empty array's pointer is often NULL (torch's is): name the empty dimension */
    for (int i = 0; t->ndim >= 1 && t->ndim <= RLK_MAX_DIMS && i < t->ndim; i++)
      if (t->shape[i] == 0)
        return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape[%d] = 0 is not positive (no elements)", what, i);
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: data is NULL", what);
  }
  if (t->ndim < 1 || t->ndim > RLK_MAX_DIMS)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: ndim %d is outside [1, %d]", what, (int)t->ndim, RLK_MAX_DIMS);
  if (rlk_dtype_size(t->dtype) == 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: dtype %d is not an rlk_dtype", what, (int)t->dtype);
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] <= 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape[%d] = %lld is not positive", what, i,
                       (long long)t->shape[i]);
    if (t->shape[i] > ((int64_t)1 << 40))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape[%d] = %lld is too large", what, i,
                       (long long)t->shape[i]);
    /* A stride of 0 repeats an element (a broadcast view): fine for what a call reads;
     * rlk_check_no_overlap refuses it for what a call writes. */
    if (t->strides[i] < 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: stride[%d] = %lld is negative", what, i,
                       (long long)t->strides[i]);
  }
  if ((uintptr_t)t->data % rlk_dtype_size(t->dtype) != 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: data is not aligned to its %zu-byte dtype", what,
                     rlk_dtype_size(t->dtype));
  /* The bytes the descriptor reaches must be addressable: kernels form element offsets as
   * signed 64-bit products (row * stride) and byte offsets from them, so an overflow there
   * would read or write far outside the tensor while the call reports success. */
  uint64_t bytes;
  if (rlk_tensor_span_bytes(t, &bytes) != 0 || bytes > RLK_TENSOR_MAX_BYTES ||
      (uintptr_t)t->data > UINTPTR_MAX - (uintptr_t)bytes)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "%s: its shape and strides reach past what can be addressed (more than 2^%d "
                     "bytes from its data pointer)",
                     what, RLK_TENSOR_MAX_BYTES_LOG2);
  return RLK_OK;
}

int rlk_tensor_span_bytes(const rlk_tensor *t, uint64_t *bytes) {
  uint64_t last = 0; /* offset of the last element, in elements */
  for (int i = 0; i < t->ndim; i++) {
    uint64_t step;
    if (t->shape[i] <= 0 || t->strides[i] < 0) return -1;
    if (__builtin_mul_overflow((uint64_t)(t->shape[i] - 1), (uint64_t)t->strides[i], &step) ||
        __builtin_add_overflow(last, step, &last))
      return -1;
  }
  uint64_t elems;
  if (__builtin_add_overflow(last, 1, &elems) ||
      __builtin_mul_overflow(elems, (uint64_t)rlk_dtype_size(t->dtype), bytes))
    return -1;
  return 0;
}

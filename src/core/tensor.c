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

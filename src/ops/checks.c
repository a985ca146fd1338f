/* checks.c - argument validation helpers shared by the ops. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "ops/ops.h"

rlk_status rlk_check_dtype(const rlk_tensor *t, const char *what, uint32_t allowed) {
  if ((int)t->dtype > 0 && (int)t->dtype < 32 && (allowed & RLK_DTYPE_BIT(t->dtype))) return RLK_OK;
  char names[128] = "";
  size_t len = 0;
  for (int d = 1; d < 8; d++)
    if (allowed & RLK_DTYPE_BIT(d)) {
      int w = rlk_format(names + len, sizeof names - len, "%s%s", len ? ", " : "", rlk_dtype_name((rlk_dtype)d));
      if (w > 0) len += (size_t)w;
    }
  return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: dtype %s is not supported (expected %s)", what,
                   rlk_dtype_name(t->dtype), names);
}

rlk_status rlk_check_ndim(const rlk_tensor *t, const char *what, int lo, int hi) {
  if (t->ndim < lo || t->ndim > hi) {
    if (lo == hi) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: expected %d dimensions, got %d", what, lo, (int)t->ndim);
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: expected %d to %d dimensions, got %d", what, lo, hi, (int)t->ndim);
  }
  return RLK_OK;
}

rlk_status rlk_check_tensor_of(const rlk_tensor *t, const char *what, uint32_t dtypes, int ndim_min, int ndim_max) {
  rlk_status st;
  if ((st = rlk_check_tensor(t, what, 1))) return st;
  if ((st = rlk_check_dtype(t, what, dtypes))) return st;
  return rlk_check_ndim(t, what, ndim_min, ndim_max);
}

rlk_status rlk_check_vector_of(const rlk_tensor *t, const char *what, uint32_t dtypes, int64_t n,
                               const char *n_name, int contiguous, int64_t *stride) {
  rlk_status st;
  if ((st = rlk_check_tensor_of(t, what, dtypes, 1, 1))) return st;
  if (t->shape[0] != n)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape [%lld], expected [%lld] (%s)", what,
                     (long long)t->shape[0], (long long)n, n_name);
  if (contiguous && (st = rlk_check_contiguous(t, what))) return st;
  if (stride) *stride = n > 1 ? t->strides[0] : 1;
  return RLK_OK;
}

rlk_status rlk_check_vector(const rlk_tensor *t, const char *what, uint32_t dtypes, int64_t N,
                            int contiguous, int64_t *stride) {
  return rlk_check_vector_of(t, what, dtypes, N, "N", contiguous, stride);
}

rlk_status rlk_check_flag(int value, const char *what) {
  if (value != 0 && value != 1) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %d is not 0 or 1", what, value);
  return RLK_OK;
}

rlk_status rlk_check_enum(int value, const char *what, int lo, int hi, const char *type) {
  if (value < lo || value > hi) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %d is not an %s", what, value, type);
  return RLK_OK;
}

rlk_status rlk_check_finite(double value, const char *what) {
  if (!isfinite(value)) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %g is not finite", what, value);
  return RLK_OK;
}

rlk_status rlk_check_positive(double value, const char *what) {
  if (!(value > 0.0) || isinf(value))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %g must be finite and > 0", what, value);
  return RLK_OK;
}

rlk_status rlk_check_temperature(double value, const char *what, int greedy_ok) {
  if ((greedy_ok && value == 0.0) || (value >= RLK_TEMPERATURE_MIN && isfinite(value))) return RLK_OK;
  return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %g must be finite and at least 2^-60%s", what, value,
                   greedy_ok ? " (0: greedy)" : "");
}

rlk_status rlk_check_nonnegative(double value, const char *what) {
  if (!(value >= 0.0) || isinf(value))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %g must be finite and >= 0", what, value);
  return RLK_OK;
}

rlk_status rlk_check_unit_interval(double value, const char *what) {
  if (!(value >= 0.0 && value <= 1.0))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %g is not in [0, 1]", what, value);
  return RLK_OK;
}

rlk_status rlk_check_vocab_start(int64_t vocab_start) {
  if (vocab_start < 0 || vocab_start > ((int64_t)1 << 40))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "vocab_start: %lld is outside [0, 2^40]", (long long)vocab_start);
  return RLK_OK;
}

rlk_status rlk_check_status(const rlk_tensor *t) {
  if (!t->data) return RLK_OK;
  rlk_status st = rlk_check_tensor_of(t, "status", RLK_DTYPE_BIT(RLK_I32), 1, 1);
  if (st) return st;
  /* the kernels OR into element 0: an empty word would be written past its end, and a longer
   * one would hold bits the caller may read in the wrong element */
  if (t->shape[0] != 1)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "status: shape [%lld], expected [1] (one i32 word)",
                     (long long)t->shape[0]);
  return RLK_OK;
}

rlk_status rlk_check_rows(const rlk_tensor *t, const char *what, int64_t B, int64_t T) {
  rlk_status st = rlk_check_ndim(t, what, 2, 2);
  if (st) return st;
  if (t->shape[0] != B || t->shape[1] != T)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape [%lld, %lld], expected [%lld, %lld]", what,
                     (long long)t->shape[0], (long long)t->shape[1], (long long)B, (long long)T);
  return rlk_check_contiguous_rows(t, what, NULL);
}

rlk_status rlk_check_contiguous_rows(const rlk_tensor *t, const char *what, int64_t *stride) {
  const int64_t rows = t->shape[0], len = t->shape[1];
  if (len > 1 && t->strides[1] != 1)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: stride[1] = %lld, rows must be contiguous", what,
                     (long long)t->strides[1]);
  rlk_status st = rlk_check_row_stride(what, rows, t->strides[0], len);
  if (st) return st;
  if (stride) *stride = rows > 1 ? t->strides[0] : len;
  return RLK_OK;
}

rlk_status rlk_check_offset_values(const rlk_tensor *o, const char *what, int64_t count, int64_t total,
                                  const char *total_name, int nonempty) {
  int64_t prev = 0;
  for (int64_t i = 0; i <= count; i++) {
    const int64_t v = o->dtype == RLK_I32 ? ((const int32_t *)o->data)[i * o->strides[0]]
                                          : ((const int64_t *)o->data)[i * o->strides[0]];
    if (i == 0 && v != 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: first offset is %lld, not 0", what, (long long)v);
    if (i > 0 && (nonempty ? v <= prev : v < prev))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: offset[%lld] = %lld after %lld (%s)", what, (long long)i,
                       (long long)v, (long long)prev,
                       nonempty ? "groups must be non-empty and offsets increasing" : "offsets must not decrease");
    prev = v;
  }
  if (prev != total)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: last offset is %lld, not %s = %lld", what, (long long)prev,
                     total_name, (long long)total);
  return RLK_OK;
}

rlk_status rlk_check_groups(int64_t group_size, const rlk_tensor *o, int64_t B, int host_values,
                            int64_t *num_groups, rlk_dtype *offsets) {
  rlk_status st;
  *num_groups = 0;
  *offsets = RLK_DTYPE_INVALID;
  if (group_size < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "group_size: %lld is negative", (long long)group_size);
  if ((group_size > 0) == (o->data != NULL))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "group_size and group_offsets: give exactly one (group_size is %lld and "
                     "group_offsets is %s)",
                     (long long)group_size, o->data ? "present" : "absent");
  if (group_size > 0) {
    if (B % group_size != 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "group_size: %lld does not divide B = %lld",
                       (long long)group_size, (long long)B);
    *num_groups = B / group_size;
    return RLK_OK;
  }
  if ((st = rlk_check_tensor_of(o, "group_offsets", RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64), 1, 1)))
    return st;
  if ((st = rlk_check_contiguous(o, "group_offsets"))) return st;
  if (o->shape[0] < 2)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "group_offsets: %lld entries, need num_groups + 1 >= 2",
                     (long long)o->shape[0]);
  const int64_t n = o->shape[0] - 1;
  if (n > B)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "group_offsets: %lld groups for B = %lld sequences (groups must be non-empty)",
                     (long long)n, (long long)B);
  if (o->dtype == RLK_I32 && B > INT32_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "group_offsets: i32 cannot index B = %lld", (long long)B);
  if (host_values && (st = rlk_check_offset_values(o, "group_offsets", n, B, "B", 1))) return st;
  *num_groups = n;
  *offsets = o->dtype;
  return RLK_OK;
}

rlk_status rlk_check_row_stride(const char *what, int64_t rows, int64_t stride, int64_t len) {
  if (rows > 1 && stride != 0 && stride < len)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "%s: row stride %lld is less than the row length %lld (and not 0, one row broadcast)", what,
                     (long long)stride, (long long)len);
  return RLK_OK;
}

rlk_status rlk_check_contiguous(const rlk_tensor *t, const char *what) {
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] > 1 && t->strides[i] != expect)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: must be contiguous (stride[%d] = %lld, expected %lld)", what,
                       i, (long long)t->strides[i], (long long)expect);
    expect *= t->shape[i];
  }
  return RLK_OK;
}

const char *const rlk_seq_mask_names[] = RLK_PARAMS_ENUM_NAMES(RLK_SEQ_MASK_KINDS);
const rlk_value_decl rlk_seq_mask_decl = RLK_DECL_CHOICES("mask", rlk_seq_mask_names);

int rlk_seq_mask_kind(const rlk_tensor *mask) {
  if (!mask || !mask->data) return RLK_SEQ_MASK_NONE;
  switch (mask->dtype) {
  case RLK_BOOL:
    return RLK_SEQ_MASK_BOOL;
  case RLK_I32:
    return RLK_SEQ_MASK_I32;
  case RLK_F32:
    return RLK_SEQ_MASK_F32;
  default:
    return RLK_SEQ_MASK_NONE;
  }
}

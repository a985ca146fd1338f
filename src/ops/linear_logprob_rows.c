/* linear_logprob_rows.c - rlk_linear_logprob's row selection: the check, the gathered rows'
 * layout and the gather and scatter launches (linear_logprob_rows.h). */
#include "ops/linear_logprob_rows.h"

#include <string.h>

#include "ops/ops.h"
#include "common/linear_logprob_params.h"

RLK_PARAMS_DECLARE(ll_gather_args, RLK_LL_GATHER_PARAMS, RLK_LL_GATHER_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ll_scatter_args, RLK_LL_SCATTER_PARAMS, RLK_LL_SCATTER_PARAMS_SIZE);

#define LLR_INDEX_DTYPES (RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64))

static const char *const llr_dt_names[] = RLK_PARAMS_ENUM_NAMES(RLK_FLOAT_DTS);
static const rlk_value_decl *const llr_gather_params[] = {
    RLK_PARAM_CHOICE("dt", llr_dt_names, 0, 2),
    RLK_PARAM_DTYPE("rows", LLR_INDEX_DTYPES),
};
static const rlk_value_decl *const llr_scatter_params[] = {
    RLK_PARAM_CHOICE("gh", llr_dt_names, 0, 2),
    RLK_PARAM_DTYPE("rows", LLR_INDEX_DTYPES),
};
#define LLR_CUDA "cuda/linear_logprob_rows.cuh"
static const rlk_template llr_gather_tmpl = {"linear_logprob", "linear_logprob_gather", LLR_CUDA,
                                             "host/linear_logprob_gather.c", 2, llr_gather_params};
static const rlk_template llr_scatter_tmpl = {"linear_logprob", "linear_logprob_scatter", LLR_CUDA,
                                              "host/linear_logprob_scatter.c", 2, llr_scatter_params};

#define LLR_GATHER_BYTES ((int64_t)64 << 20)
static int64_t llr_budget = LLR_GATHER_BYTES; /* rlk_ll_rows_set_budget */

int64_t rlk_ll_rows_budget(void) { return llr_budget; }
void rlk_ll_rows_set_budget(int64_t bytes) { llr_budget = bytes > 0 ? bytes : LLR_GATHER_BYTES; }

rlk_status rlk_ll_rows_check(const rlk_tensor *rows, const rlk_tensor *labels, rlk_ll_head *h, rlk_ll_rows *r) {
  memset(r, 0, sizeof *r);
  if (!rows->data) return RLK_OK;
  rlk_status st;
  if ((st = rlk_check_tensor_of(rows, "rows", LLR_INDEX_DTYPES, 1, 1))) return st;
  const int64_t n = rows->shape[0];
  if (n < 1)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rows: shape [%lld] selects no row (a call takes at least one, as "
                     "hidden does)", (long long)n);
  if (n > h->N)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rows: %lld indices, hidden has %lld rows (indices increase "
                     "strictly)", (long long)n, (long long)h->N);
  if (n > 1 && rows->strides[0] < 1)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rows: stride %lld, expected > 0 (indices increase strictly)",
                     (long long)rows->strides[0]);
  r->data = rows->data;
  r->dtype = rows->dtype;
  r->stride = n > 1 ? rows->strides[0] : 1;
  r->n = n;
  r->all = h->N;
  r->pitch = (h->H + RLK_LL_ROWS_PITCH - 1) / RLK_LL_ROWS_PITCH * RLK_LL_ROWS_PITCH;
  h->N = n;
  h->ls = 1;
  if (labels && (st = rlk_check_vector_of(labels, "labels", LLR_INDEX_DTYPES, n, "rows' n", 0, &h->ls))) return st;
  return RLK_OK;
}

rlk_tensor rlk_ll_rows_planned(const rlk_tensor *hidden, const rlk_ll_rows *r) {
  /* any 256-byte-aligned address: only its alignment is read */
  static const _Alignas(256) unsigned char stand_in[256];
  return rlk_tensor_2d((void *)stand_in, hidden->dtype, r->n, hidden->shape[1], r->pitch);
}

size_t rlk_ll_rows_bytes(int64_t n, int64_t pitch, size_t elem) {
  return ((size_t)(n * pitch) * elem + 255u) & ~(size_t)255u;
}

rlk_kernel_spec rlk_ll_gather_spec(int dt, rlk_dtype rows) {
  return (rlk_kernel_spec){&llr_gather_tmpl, {dt, rows}};
}

rlk_kernel_spec rlk_ll_scatter_spec(int gh, rlk_dtype rows) {
  return (rlk_kernel_spec){&llr_scatter_tmpl, {gh, rows}};
}

rlk_status rlk_ll_gather(rlk_context *ctx, const rlk_ll_rows *r, int dt, const void *src, int64_t src_stride,
                         int64_t H, int64_t first, int64_t n, void *out, int64_t pitch, int *status, void *stream) {
  const rlk_kernel_spec spec = rlk_ll_gather_spec(dt, r->dtype);
  rlk_status st;
  if ((st = rlk_spec_validate(&spec))) return st;
  const ll_gather_args g = {.src = src, .src_stride = src_stride, .src_rows = r->all, .H = H, .rows = r->data,
                            .rows_stride = r->stride, .first = first, .n = n, .out = out, .pitch = pitch,
                            .status = status};
  const rlk_launch_dims d = ctx->kind == RLK_BACKEND_HOST ? rlk_op_grid(1, 1, 1, 1, 0)
                                                          : rlk_op_grid((uint64_t)n, 1, 1, LL_THREADS, 0);
  return rlk_context_launch_params(ctx, &spec, &d, stream, &g);
}

rlk_status rlk_ll_scatter(rlk_context *ctx, const rlk_ll_rows *r, int gh, const void *dh, int64_t dh_pitch, int64_t H,
                          void *grad_hidden, int64_t ghs, int add, int zero, void *stream) {
  const rlk_kernel_spec spec = rlk_ll_scatter_spec(gh, r->dtype);
  rlk_status st;
  if ((st = rlk_spec_validate(&spec))) return st;
  const ll_scatter_args s = {.dh = dh, .dh_pitch = dh_pitch, .rows = r->data, .rows_stride = r->stride, .n = r->n,
                             .N = r->all, .H = H, .grad_hidden = grad_hidden, .gh_stride = ghs, .add = add,
                             .zero = zero};
  /* a GPU's blocks: one per row of grad_hidden when the rows not selected get 0, else one per
   * selected row (a call's blocks of rows each launch over their own) */
  const rlk_launch_dims d = ctx->kind == RLK_BACKEND_HOST ? rlk_op_grid(1, 1, 1, 1, 0)
                                                          : rlk_op_grid((uint64_t)(zero ? r->all : r->n), 1, 1,
                                                                        LL_THREADS, 0);
  return rlk_context_launch_params(ctx, &spec, &d, stream, &s);
}

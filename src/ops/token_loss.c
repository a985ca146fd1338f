/* token_loss.c - layout checks, aggregation constant and launch geometry shared by the fused
 * token-loss ops (policy loss, value loss). */
#include "ops/token_loss.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"

const char *const tl_layout_names[] = RLK_PARAMS_ENUM_NAMES(RLK_TL_LAYOUTS);
const char *const tl_packed_names[] = {"padded", "packed", NULL};
const char *const tl_normalizer_names[] = {"value", "tensor", "count", NULL};

const rlk_value_decl *const tl_count_params[2] = {
    RLK_PARAM_CHOICE("layout", tl_layout_names, 0, 2),
    RLK_PARAM_CHOICE("mask", rlk_seq_mask_names, 1, 3),
};

const rlk_value_decl tl_dtype = RLK_DECL_DTYPE("dtype", TL_DTYPES);
const rlk_value_decl *const tl_dtype_params[1] = {&tl_dtype};
const char *const tl_agg_names[] = {"token-mean",          "token-sum",
                                    "seq-mean-token-sum",  "seq-mean-token-mean",
                                    "seq-mean-token-sum-norm", NULL};

/* [B, T] with contiguous rows (row stride >= T), or [N] contiguous. */
static rlk_status tl_check_shape(const tl_layout *L, const rlk_tensor *t, const char *what,
                                 int64_t *stride) {
  rlk_status st;
  if (L->layout == TL_LAYOUT_PADDED) {
    if ((st = rlk_check_rows(t, what, L->rows, L->cols))) return st;
    *stride = L->rows > 1 ? t->strides[0] : L->cols;
    return RLK_OK;
  }
  if ((st = rlk_check_ndim(t, what, 1, 1))) return st;
  if (t->shape[0] != L->cols)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape [%lld], expected [%lld] (N)", what,
                     (long long)t->shape[0], (long long)L->cols);
  if ((st = rlk_check_contiguous(t, what))) return st;
  *stride = 0;
  return RLK_OK;
}

rlk_status tl_layout_check(const rlk_context *ctx, const rlk_tensor *primary, const char *pname,
                           const rlk_tensor *offsets, const rlk_tensor *mask, tl_layout *L,
                           int64_t *primary_stride) {
  memset(L, 0, sizeof *L);
  rlk_status st;
  if ((st = rlk_check_tensor_of(primary, pname, TL_DTYPES, 1, 2))) return st;
  L->dtype = primary->dtype;
  if (primary->ndim == 2) {
    L->layout = TL_LAYOUT_PADDED;
    L->rows = primary->shape[0];
    L->cols = primary->shape[1];
    if (offsets->data)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "seq_offsets: given with a 2-D %s (offsets belong to the packed [N] layout)",
                       pname);
  } else {
    L->cols = primary->shape[0];
    if (!offsets->data)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "seq_offsets: required with a 1-D %s (the packed layout)", pname);
    if ((st = rlk_check_tensor_of(offsets, "seq_offsets", RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64), 1, 1)))
      return st;
    if ((st = rlk_check_contiguous(offsets, "seq_offsets"))) return st;
    if (offsets->shape[0] < 2)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "seq_offsets: %lld entries, need S + 1 >= 2 (at least one sequence)",
                       (long long)offsets->shape[0]);
    if (offsets->dtype == RLK_I32 && L->cols > INT32_MAX)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "seq_offsets: i32 cannot index N = %lld",
                       (long long)L->cols);
    L->rows = offsets->shape[0] - 1;
    L->layout = offsets->dtype == RLK_I32 ? TL_LAYOUT_PACKED_I32 : TL_LAYOUT_PACKED_I64;
    if (ctx->kind == RLK_BACKEND_HOST && (st = rlk_check_offset_values(offsets, "seq_offsets", L->rows, L->cols, "N", 0)))
      return st;
  }
  if ((st = tl_check_shape(L, primary, pname, primary_stride))) return st;
  L->mask = RLK_SEQ_MASK_NONE;
  if (mask->data) {
    if ((st = rlk_check_tensor(mask, "mask", 1))) return st;
    if ((st = rlk_check_dtype(mask, "mask",
                              RLK_DTYPE_BIT(RLK_BOOL) | RLK_DTYPE_BIT(RLK_I32) |
                                  RLK_DTYPE_BIT(RLK_F32))))
      return st;
    if ((st = tl_check_shape(L, mask, "mask", &L->mask_stride))) return st;
    L->mask = rlk_seq_mask_kind(mask);
  }
  return RLK_OK;
}

rlk_status tl_stream_check(const tl_layout *L, const rlk_tensor *t, const char *what, int required,
                           int64_t *stride) {
  *stride = 0;
  rlk_status st;
  if ((st = rlk_check_tensor(t, what, required))) return st;
  if (!t->data) return RLK_OK;
  if (t->dtype != L->dtype)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: dtype %s, expected %s like the other inputs",
                     what, rlk_dtype_name(t->dtype), rlk_dtype_name(L->dtype));
  return tl_check_shape(L, t, what, stride);
}

rlk_status tl_stream_in(const tl_layout *L, const rlk_tensor *t, const char *what, int required, const void **data,
                        long long *stride) {
  int64_t s;
  rlk_status st = tl_stream_check(L, t, what, required, &s);
  if (st) return st;
  *data = t->data;
  *stride = s;
  return RLK_OK;
}

rlk_status tl_stream_out(const tl_layout *L, const rlk_tensor *t, const char *what, int required, void **data,
                         long long *stride) {
  const void *in;
  rlk_status st = tl_stream_in(L, t, what, required, &in, stride);
  if (st == RLK_OK) *data = t->data; /* the same pointer, writable */
  return st;
}

rlk_status tl_seq_check(const tl_layout *L, const rlk_tensor *t, const char *what) {
  rlk_status st;
  if ((st = rlk_check_tensor(t, what, 1))) return st;
  if (t->dtype != L->dtype)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: dtype %s, expected %s like the other inputs",
                     what, rlk_dtype_name(t->dtype), rlk_dtype_name(L->dtype));
  if ((st = rlk_check_ndim(t, what, 1, 1))) return st;
  if (t->shape[0] != L->rows)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "%s: shape [%lld], expected one value per sequence [%lld]", what,
                     (long long)t->shape[0], (long long)L->rows);
  return rlk_check_contiguous(t, what);
}

rlk_status tl_vector_check(const rlk_tensor *t, const char *what, rlk_dtype dtype, int64_t n,
                           int required) {
  rlk_status st;
  if ((st = rlk_check_tensor(t, what, required))) return st;
  if (!t->data) return RLK_OK;
  if (t->dtype != dtype)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: dtype %s, expected %s (the inputs' dtype)", what,
                     rlk_dtype_name(t->dtype), rlk_dtype_name(dtype));
  if ((st = rlk_check_ndim(t, what, 1, 1))) return st;
  if (t->shape[0] < n)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %lld elements, needs at least %lld", what,
                     (long long)t->shape[0], (long long)n);
  return rlk_check_contiguous(t, what);
}

static int tl_positive(double x) { return x > 0.0 && isfinite(x); }

/* A normalizer given as a tensor: a scalar ([1] or 0-d), f32 or f64. */
static rlk_status tl_norm_tensor(const rlk_tensor *t, const char *what, double number, int *kind) {
  if (t->ndim < 0 || t->ndim > 1 || (t->ndim == 1 && t->shape[0] != 1))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "%s: a scalar ([1] or 0-d) is needed, got %d dimensions%s", what, (int)t->ndim,
                     t->ndim == 1 ? " of more than one element" : "");
  if (t->dtype != RLK_F32 && t->dtype != RLK_F64)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: dtype %s, expected f32 or f64", what,
                     rlk_dtype_name(t->dtype));
  /* a 0-d one as the element it is (its address aligned to its dtype, as a [1] one's is) */
  const rlk_tensor one = rlk_tensor_1d(t->data, t->dtype, 1);
  rlk_status st = rlk_check_tensor(&one, what, 1);
  if (st) return st;
  if (number != 0.0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "%s: given as a tensor and as the number %g (give one: the number 0 with a tensor)",
                     what, number);
  *kind = t->dtype == RLK_F32 ? TL_NORM_F32 : TL_NORM_F64;
  return RLK_OK;
}

rlk_status tl_norm_resolve(const tl_layout *L, const tl_norm_args *n, double *c, int *kind,
                           const void **value) {
  *c = 0.0;
  *kind = TL_NORM_VALUE;
  *value = NULL;
  rlk_status st;
  const double ls = n->loss_scale;
  if ((st = rlk_check_finite(ls, "loss_scale"))) return st;
  switch (n->agg) {
  case RLK_AGG_TOKEN_MEAN:
    if (n->token_tensor && n->token_tensor->data) {
      if ((st = tl_norm_tensor(n->token_tensor, "token_normalizer_tensor", n->token_normalizer, kind)))
        return st;
      *value = n->token_tensor->data;
      *c = ls;
      return RLK_OK;
    }
    if (n->token_normalizer == 0.0) {
      /* this call's count of the tokens that count */
      if (L->mask != RLK_SEQ_MASK_NONE) {
        *kind = TL_NORM_COUNT;
        *c = ls;
        return RLK_OK;
      }
      const double count = L->layout == TL_LAYOUT_PADDED ? (double)L->rows * (double)L->cols
                                                         : (double)L->cols;
      *c = count > 0.0 ? ls / count : 0.0;
      return RLK_OK;
    }
    if (!tl_positive(n->token_normalizer))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "token_normalizer: %g; token-mean needs the global count of tokens that "
                       "count (> 0, finite; 0: this call's mask count)",
                       n->token_normalizer);
    *c = ls / n->token_normalizer;
    return RLK_OK;
  case RLK_AGG_TOKEN_SUM:
    *c = ls;
    return RLK_OK;
  case RLK_AGG_SEQ_MEAN_TOKEN_SUM:
  case RLK_AGG_SEQ_MEAN_TOKEN_MEAN:
  case RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM: {
    double num = ls;
    if (n->agg == RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM) {
      if (!tl_positive(n->norm_scale))
        return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                         "norm_scale: %g; seq-mean-token-sum-norm needs its scale (> 0, finite)",
                         n->norm_scale);
      num = ls / n->norm_scale;
    }
    if (n->seq_tensor && n->seq_tensor->data) {
      if ((st = tl_norm_tensor(n->seq_tensor, "seq_normalizer_tensor", n->seq_normalizer, kind)))
        return st;
      *value = n->seq_tensor->data;
      *c = num;
      return RLK_OK;
    }
    if (n->seq_normalizer == 0.0) { /* this call's sequence count */
      *c = L->rows > 0 ? num / (double)L->rows : 0.0;
      return RLK_OK;
    }
    if (!tl_positive(n->seq_normalizer))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "seq_normalizer: %g; %s needs the global sequence count (> 0, finite; 0: "
                       "this call's)",
                       n->seq_normalizer, tl_agg_names[n->agg]);
    *c = n->agg == RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM
             ? ls / (n->seq_normalizer * n->norm_scale)
             : ls / n->seq_normalizer;
    return RLK_OK;
  }
  default:
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "agg: %d is not an rlk_loss_agg", n->agg);
  }
}

void tl_geometry_for(rlk_backend kind, int multiprocessors, const tl_layout *L, int whole_rows,
                     tl_geometry *g) {
  memset(g, 0, sizeof *g);
  if (kind == RLK_BACKEND_HOST) {
    g->tiles_per_row = 1;
    g->tile = L->cols;
    g->items = L->rows;
    g->grid = 1;
    return;
  }
  if (L->layout == TL_LAYOUT_PADDED) {
    /* one step of the chunk loop per item; whole rows when per-row sums come first */
    g->tile = whole_rows ? L->cols : (int64_t)RLK_TL_BLOCK * 4 * RLK_TL_UNROLL;
    g->tiles_per_row = (L->cols + g->tile - 1) / g->tile;
  } else {
    g->tile = 0;
    g->tiles_per_row = 1;
  }
  g->items = L->rows * g->tiles_per_row;
  const int64_t cap = (int64_t)(multiprocessors > 0 ? multiprocessors : 1) * RLK_TL_BLOCKS_PER_SM;
  g->grid = (unsigned)(g->items < cap ? g->items : cap);
  if (g->grid == 0) g->grid = 1;
}

size_t tl_counts_offset(const tl_geometry *g, int nacc) {
  const size_t partials = (size_t)g->grid * (size_t)nacc * sizeof(double);
  return (partials + 15) & ~(size_t)15;
}

double *tl_counts(const tl_call *c, void *workspace, int nacc) {
  if (!c->count || !workspace) return NULL;
  return (double *)(void *)((char *)workspace + tl_counts_offset(&c->g, nacc));
}

size_t tl_workspace_bytes(rlk_backend kind, const tl_geometry *g, int nacc, int count) {
  if (kind == RLK_BACKEND_HOST) return 0;
  if (!count) return (size_t)g->grid * (size_t)nacc * sizeof(double);
  return tl_counts_offset(g, nacc) + (size_t)g->grid * sizeof(double);
}

rlk_status tl_line_layout(const rlk_op_values *s, const tl_line *line, int *layout) {
  const int packed = s->v[line->layout] == 1;
  if (RLK_OP_GIVEN(s, line->offsets) && !packed)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "offsets: only with layout=packed");
  *layout = !packed ? TL_LAYOUT_PADDED : s->v[line->offsets] == RLK_I32 ? TL_LAYOUT_PACKED_I32 : TL_LAYOUT_PACKED_I64;
  return RLK_OK;
}

rlk_status tl_plan(const rlk_context *ctx, const tl_templates *t, const tl_line *line, const rlk_op_values *s,
                   const rlk_kernel_spec *main_pass, rlk_kernel_spec *specs, size_t *nspecs) {
  const int64_t dtype = s->v[line->dtype], mask = s->v[line->mask];
  int layout = TL_LAYOUT_PADDED;
  rlk_status st = tl_line_layout(s, line, &layout);
  if (st) return st;
  size_t n = 0;
  if (ctx->kind == RLK_BACKEND_HOST) {
    specs[n++] = (rlk_kernel_spec){t->host, {dtype}};
  } else {
    if (s->v[line->normalizer] == TL_LINE_NORM_COUNT && mask != RLK_SEQ_MASK_NONE)
      specs[n++] = (rlk_kernel_spec){t->count, {layout, mask}};
    specs[n++] = *main_pass;
    specs[n++] = (rlk_kernel_spec){t->reduce, {dtype}};
  }
  return rlk_op_planned(specs, n, nspecs);
}

rlk_status tl_call_finish(const rlk_context *ctx, tl_call *c, const tl_line *line, const tl_norm_args *n,
                          int whole_rows, int nacc, double *c_grad, tl_norm *norm) {
  rlk_status st = rlk_check_enum(n->agg, "agg", RLK_AGG_TOKEN_MEAN, RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM, "rlk_loss_agg");
  if (st) return st;
  int kind;
  if ((st = tl_norm_resolve(&c->L, n, c_grad, &kind, &norm->value))) return st;
  norm->kind = kind;
  c->count = kind == TL_NORM_COUNT;
  rlk_op_values *v = &c->op.vals;
  rlk_op_values_set(v, line->dtype, c->L.dtype);
  rlk_op_values_set(v, line->agg, n->agg);
  rlk_op_values_set(v, line->layout, c->L.layout != TL_LAYOUT_PADDED);
  if (c->L.layout != TL_LAYOUT_PADDED)
    rlk_op_values_set(v, line->offsets, c->L.layout == TL_LAYOUT_PACKED_I32 ? RLK_I32 : RLK_I64);
  rlk_op_values_set(v, line->mask, c->L.mask);
  rlk_op_values_set(v, line->normalizer, c->count ? TL_LINE_NORM_COUNT : TL_LINE_NORM_VALUE);
  tl_geometry_for(ctx->kind, ctx->target.multiprocessors, &c->L, whole_rows, &c->g);
  norm->num_counts = c->count ? c->g.grid : 0;
  c->op.workspace = tl_workspace_bytes(ctx->kind, &c->g, nacc, c->count);
  return RLK_OK;
}

void tl_dims(const rlk_context *ctx, const rlk_op_call *call, size_t i, rlk_launch_dims *d) {
  if (ctx->kind == RLK_BACKEND_HOST) return; /* one kernel does the whole problem */
  const tl_call *c = (const tl_call *)call;
  const size_t n = call->nspecs;
  d->grid[0] = i + 1 == n ? 1 : c->g.grid ? c->g.grid : 1;
  d->block[0] = RLK_TL_BLOCK; /* every kernel: see token_loss_params.h */
}

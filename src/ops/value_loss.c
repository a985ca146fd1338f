/* value_loss.c - the fused clipped value loss: validation, variant selection, launches.
 *
 * Same passes as the policy loss (token_loss.h): on a GPU (after value_loss_count when
 * token-mean divides by this call's mask count) value_loss_main writes grad_values and
 * per-block partials ([grid][5] f64 in the workspace), value_loss_reduce combines them in a fixed
 * order into the loss and the metrics; on the host one kernel per dtype does the whole call.
 * Template parameters of the main kernel: dtype, seq-mean-token-mean, layout, mask kind. */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "ops/ops.h"
#include "runtime/record.h"
#include "ops/token_loss.h"

#define VL_NACC 5
#define VL_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F64))

static const rlk_param_decl vl_main_params[] = {
    {"dtype", RLK_PARAM_DTYPE, 0, 0, 0, VL_DTYPES, NULL},
    {"seqmean", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
    {"layout", RLK_PARAM_ENUM, 0, 2, 0, 0, tl_layout_names},
    {"mask", RLK_PARAM_ENUM, 0, 3, 0, 0, tl_mask_names},
};

static const rlk_param_decl vl_count_params[] = {
    {"layout", RLK_PARAM_ENUM, 0, 2, 0, 0, tl_layout_names},
    {"mask", RLK_PARAM_ENUM, 1, 3, 0, 0, tl_mask_names},
};

static const rlk_param_decl vl_dtype_params[] = {
    {"dtype", RLK_PARAM_DTYPE, 0, 0, 0, VL_DTYPES, NULL},
};

static const rlk_template vl_main_tmpl = {
    "value_loss", "value_loss_main", "cuda/value_loss.cuh", NULL,
    sizeof vl_main_params / sizeof vl_main_params[0], vl_main_params};

static const rlk_template vl_count_tmpl = {"value_loss", "value_loss_count",
                                           "cuda/value_loss.cuh", NULL, 2, vl_count_params};

static const rlk_template vl_reduce_tmpl = {"value_loss", "value_loss_reduce",
                                            "cuda/value_loss.cuh", NULL, 1, vl_dtype_params};

static const rlk_template vl_host_tmpl = {"value_loss", "value_loss_host", NULL,
                                          "host/value_loss.c", 1, vl_dtype_params};

/* Mirrors rlk::vl::Params (value_loss.cuh) and vl_params (templates/host/token_loss_host.h). */
typedef struct vl_params {
  TL_STREAMS(3, 1) s;
  void *loss;
  void *metrics;
  void *partials;
  int64_t num_partials;
  int64_t seqmean, layout, mask_kind;
  double clip, c_grad, bound_g;
  TL_NORM norm;
} vl_params;

_Static_assert(sizeof(vl_params) == 232, "vl_params mirrors rlk::vl::Params: 29 8-byte fields");

enum { VL_IN_V = 0, VL_IN_OLD = 1, VL_IN_RET = 2 };

typedef struct vl_config {
  rlk_dtype dtype;
  int agg;
  int layout;
  int mask;
  int count; /* token-mean by this call's mask count: the count pass runs first */
} vl_config;

typedef struct vl_plan {
  rlk_kernel_spec count, main, reduce;
  int has_count, has_reduce;
  int whole_rows;
} vl_plan;

static int vl_whole_rows(const vl_config *c) {
  return c->agg == RLK_AGG_SEQ_MEAN_TOKEN_MEAN && c->mask != TL_MASK_NONE;
}

static rlk_status vl_select(rlk_backend kind, const vl_config *c, vl_plan *p) {
  memset(p, 0, sizeof *p);
  p->whole_rows = vl_whole_rows(c);
  if (kind == RLK_BACKEND_HOST) {
    p->main.tmpl = &vl_host_tmpl;
    p->main.values[0] = c->dtype;
    return rlk_spec_validate(&p->main);
  }
  p->main.tmpl = &vl_main_tmpl;
  p->main.values[0] = c->dtype;
  p->main.values[1] = c->agg == RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
  p->main.values[2] = c->layout;
  p->main.values[3] = c->mask;
  p->has_reduce = 1;
  p->reduce.tmpl = &vl_reduce_tmpl;
  p->reduce.values[0] = c->dtype;
  rlk_status st = rlk_spec_validate(&p->main);
  if (!st) st = rlk_spec_validate(&p->reduce);
  if (!st && c->count && c->mask != TL_MASK_NONE) {
    p->has_count = 1;
    p->count.tmpl = &vl_count_tmpl;
    p->count.values[0] = c->layout;
    p->count.values[1] = c->mask;
    st = rlk_spec_validate(&p->count);
  }
  return st;
}

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

enum { VL_S_DTYPE, VL_S_AGG, VL_S_LAYOUT, VL_S_OFFSETS, VL_S_MASK, VL_S_NORMALIZER, VL_NSETTINGS };

static const rlk_op_setting vl_settings[VL_NSETTINGS] = {
    [VL_S_DTYPE] = RLK_SET_DTYPE("dtype", VL_DTYPES, RLK_F32, "value_loss_main.dtype",
                                 "the dtype of the values, old values and returns"),
    [VL_S_AGG] = RLK_SET_CHOICE("agg", tl_agg_names, RLK_AGG_TOKEN_MEAN, "value_loss_main.seqmean",
                                "the loss aggregation"),
    [VL_S_LAYOUT] = RLK_SET_CHOICE("layout", tl_packed_names, 0, "value_loss_main.layout",
                                   "[B, T] + mask or [N] + seq_offsets"),
    [VL_S_OFFSETS] = RLK_SET_DTYPE("offsets", RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64), RLK_I64,
                                   "value_loss_main.layout", "the seq_offsets dtype; with layout=packed"),
    [VL_S_MASK] = RLK_SET_CHOICE("mask", tl_mask_names, TL_MASK_BOOL, "value_loss_main.mask", "the mask's dtype"),
    [VL_S_NORMALIZER] = RLK_SET_CHOICE("normalizer", tl_normalizer_names, TL_LINE_NORM_VALUE, "value_loss_count",
                                       "the token-mean divisor: a number or a device scalar (the same "
                                       "kernels), or this call's mask count (a count pass first)"),
};

static rlk_status vl_plan_config(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs,
                                 size_t *nspecs) {
  vl_config c = {(rlk_dtype)s->v[VL_S_DTYPE], (int)s->v[VL_S_AGG], TL_LAYOUT_PADDED, (int)s->v[VL_S_MASK],
                 s->v[VL_S_NORMALIZER] == TL_LINE_NORM_COUNT};
  const int packed = s->v[VL_S_LAYOUT] == 1;
  if (RLK_OP_GIVEN(s, VL_S_OFFSETS) && !packed)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "offsets: only with layout=packed");
  if (packed) c.layout = s->v[VL_S_OFFSETS] == RLK_I32 ? TL_LAYOUT_PACKED_I32 : TL_LAYOUT_PACKED_I64;
  vl_plan p;
  rlk_status st = vl_select(ctx->kind, &c, &p);
  if (st) return st;
  size_t n = 0;
  if (p.has_count) specs[n++] = p.count;
  specs[n++] = p.main;
  if (p.has_reduce) specs[n++] = p.reduce;
  *nspecs = n;
  return RLK_OK;
}

static const char *const vl_samples[] = {
    /* verl's critic: token-mean, padded with a bool mask, by the call's mask count */
    "value_loss agg=token-mean mask=bool normalizer=count",
    /* f64, per-sequence means under an f32 mask (a first pass per sequence), packed */
    "value_loss dtype=f64 agg=seq-mean-token-mean layout=packed offsets=i32 mask=f32",
    /* the count pass on the packed layout */
    "value_loss agg=token-mean layout=packed offsets=i64 mask=f32 normalizer=count",
    /* packed rows without a mask, i64 offsets, Dr. GRPO's normalization */
    "value_loss agg=seq-mean-token-sum-norm layout=packed mask=none",
    /* an i32 mask, token sums */
    "value_loss agg=token-sum mask=i32",
    NULL};

const rlk_op_desc rlk_op_value_loss = {
    .name = "value_loss",
    .settings = vl_settings,
    .nsettings = VL_NSETTINGS,
    .note = "the clip range and the normalizers are run-time values: the same kernels",
    .plan = vl_plan_config,
    .samples = vl_samples,
};

/* ---------------------------------------------------------------------------------- */
/* The call                                                                            */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_value_loss_args_init(rlk_value_loss_args *args) {
  if (!args) return;
  memset(args, 0, sizeof *args);
  args->clip = 0.5;
  args->clamp_bound_grad = 0.5;
  args->agg = RLK_AGG_TOKEN_MEAN;
  args->loss_scale = 1.0;
}

typedef struct vl_call {
  vl_config c;
  tl_layout L;
  tl_geometry g;
  vl_params k;
  size_t workspace;
} vl_call;

static rlk_status vl_validate(const rlk_context *ctx, const rlk_value_loss_args *a, vl_call *k) {
  memset(k, 0, sizeof *k);
  vl_config *c = &k->c;
  tl_layout *L = &k->L;
  vl_params *p = &k->k;
  rlk_status st;
  int64_t stride;
  if ((st = tl_layout_check(ctx, &a->values, "values", &a->seq_offsets, &a->mask, L, &stride)))
    return st;
  c->dtype = L->dtype;
  c->layout = L->layout;
  c->mask = L->mask;
  p->s.in[VL_IN_V] = a->values.data;
  p->s.in_stride[VL_IN_V] = stride;
  p->s.mask = a->mask.data;
  p->s.mask_stride = L->mask_stride;
  p->s.offsets = a->seq_offsets.data;
  p->s.rows = L->rows;
  p->s.cols = L->cols;
  if ((st = tl_stream_check(L, &a->old_values, "old_values", 1, &stride))) return st;
  p->s.in[VL_IN_OLD] = a->old_values.data;
  p->s.in_stride[VL_IN_OLD] = stride;
  if ((st = tl_stream_check(L, &a->returns, "returns", 1, &stride))) return st;
  p->s.in[VL_IN_RET] = a->returns.data;
  p->s.in_stride[VL_IN_RET] = stride;

  if (!(a->clamp_bound_grad >= 0.0 && a->clamp_bound_grad <= 1.0))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "clamp_bound_grad: %g is not in [0, 1]",
                     a->clamp_bound_grad);
  if (!(a->clip > 0.0))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "clip: %g must be > 0 (INFINITY: no clipping)",
                     a->clip);
  if ((int)a->agg < RLK_AGG_TOKEN_MEAN || (int)a->agg > RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "agg: %d is not an rlk_loss_agg", (int)a->agg);
  c->agg = (int)a->agg;
  const tl_norm_args na = {c->agg, a->token_normalizer, a->seq_normalizer, a->norm_scale,
                           a->loss_scale, &a->token_normalizer_tensor, &a->seq_normalizer_tensor};
  int nkind;
  if ((st = tl_norm_resolve(L, &na, &p->c_grad, &nkind, &p->norm.value))) return st;
  p->norm.kind = nkind;
  c->count = nkind == TL_NORM_COUNT;

  if ((st = tl_vector_check(&a->loss, "loss", L->dtype, 1, 1))) return st;
  if ((st = tl_stream_check(L, &a->grad_values, "grad_values", 1, &stride))) return st;
  p->s.out[0] = a->grad_values.data;
  p->s.out_stride[0] = stride;
  if ((st = tl_vector_check(&a->metrics, "metrics", L->dtype, RLK_VALUE_LOSS_METRICS, 0))) return st;
  p->loss = a->loss.data;
  p->metrics = a->metrics.data;
  p->seqmean = c->agg == RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
  p->layout = c->layout;
  p->mask_kind = c->mask;
  p->clip = a->clip;
  p->bound_g = a->clamp_bound_grad;

  tl_geometry_for(ctx->kind, ctx->target.multiprocessors, L, vl_whole_rows(c), &k->g);
  p->s.tiles_per_row = k->g.tiles_per_row;
  p->s.tile = k->g.tile;
  p->num_partials = k->g.grid;
  p->norm.num_counts = c->count ? k->g.grid : 0;
  k->workspace = tl_workspace_bytes(ctx->kind, &k->g, VL_NACC, c->count);
  return RLK_OK;
}

RLK_API rlk_status rlk_value_loss_workspace_size(rlk_context *ctx, const rlk_value_loss_args *args,
                                                 size_t *bytes) {
  if (bytes) *bytes = 0;
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_value_loss_workspace_size: ctx is NULL");
  if (!args) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_value_loss_workspace_size: args is NULL");
  if (!bytes) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_value_loss_workspace_size: bytes is NULL");
  vl_call k;
  rlk_status st = vl_validate(ctx, args, &k);
  if (!st) *bytes = k.workspace;
  return st;
}

RLK_API rlk_status rlk_value_loss(rlk_context *ctx, const rlk_value_loss_args *args, void *stream) {
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_value_loss: ctx is NULL");
  if (!args) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_value_loss: args is NULL");
  vl_call k;
  rlk_status st = vl_validate(ctx, args, &k);
  if (st) return st;
  if ((st = tl_workspace_check(args->workspace, args->workspace_bytes, k.workspace, "value_loss")))
    return st;
  static const rlk_arg_field fields[] = {
      RLK_ARG_IN(rlk_value_loss_args, values),
      RLK_ARG_IN(rlk_value_loss_args, old_values),
      RLK_ARG_IN(rlk_value_loss_args, returns),
      RLK_ARG_IN(rlk_value_loss_args, mask),
      RLK_ARG_IN(rlk_value_loss_args, seq_offsets),
      RLK_ARG_IN(rlk_value_loss_args, token_normalizer_tensor),
      RLK_ARG_IN(rlk_value_loss_args, seq_normalizer_tensor),
      RLK_ARG_OUT(rlk_value_loss_args, loss),
      RLK_ARG_OUT(rlk_value_loss_args, grad_values),
      RLK_ARG_OUT(rlk_value_loss_args, metrics)};
  if ((st = rlk_check_arg_fields(fields, sizeof fields / sizeof fields[0], args, args->workspace, k.workspace ? args->workspace_bytes : 0)))
    return st;
  if ((st = rlk_context_require_device(ctx, "rlk_value_loss"))) return st;
  vl_plan p;
  if ((st = vl_select(ctx->kind, &k.c, &p))) return st;
  if (rlk_record_enabled()) {
    rlk_op_values s;
    rlk_op_values_init(&rlk_op_value_loss, &s);
    rlk_op_values_set(&s, VL_S_DTYPE, k.c.dtype);
    rlk_op_values_set(&s, VL_S_AGG, k.c.agg);
    rlk_op_values_set(&s, VL_S_LAYOUT, k.c.layout != TL_LAYOUT_PADDED);
    if (k.c.layout != TL_LAYOUT_PADDED)
      rlk_op_values_set(&s, VL_S_OFFSETS, k.c.layout == TL_LAYOUT_PACKED_I32 ? RLK_I32 : RLK_I64);
    rlk_op_values_set(&s, VL_S_MASK, k.c.mask);
    rlk_op_values_set(&s, VL_S_NORMALIZER, k.c.count ? TL_LINE_NORM_COUNT : TL_LINE_NORM_VALUE);
    rlk_record_op(&rlk_op_value_loss, &s);
  }
  k.k.partials = args->workspace;
  if (k.c.count && args->workspace)
    k.k.norm.counts = (char *)args->workspace + tl_counts_offset(&k.g, VL_NACC);
  void *kargs[] = {&k.k};
  return tl_launch(ctx, p.has_count ? &p.count : NULL, &p.main, &p.reduce, &k.g, stream, kargs);
}

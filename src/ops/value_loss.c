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
#include "ops/token_loss.h"
#include "common/value_loss_params.h"

static const rlk_value_decl *const vl_main_params[] = {
    &tl_dtype,
    RLK_PARAM_FLAG("seqmean"),
    RLK_PARAM_CHOICE("layout", tl_layout_names, 0, 2),
    &rlk_seq_mask_decl,
};

static const rlk_template vl_main_tmpl = {
    "value_loss", "value_loss_main", "cuda/value_loss.cuh", NULL,
    sizeof vl_main_params / sizeof vl_main_params[0], vl_main_params};

static const rlk_template vl_count_tmpl = {"value_loss", "value_loss_count",
                                           "cuda/value_loss.cuh", NULL, 2, tl_count_params};

static const rlk_template vl_reduce_tmpl = {"value_loss", "value_loss_reduce",
                                            "cuda/value_loss.cuh", NULL, 1, tl_dtype_params};

static const rlk_template vl_host_tmpl = {"value_loss", "value_loss_host", NULL,
                                          "host/value_loss.c", 1, tl_dtype_params};

/* ---------------------------------------------------------------------------------- */
/* The settings and the plan (shared by calls and precompiling)                        */
/* ---------------------------------------------------------------------------------- */

enum { VL_S_DTYPE, VL_S_AGG, VL_S_LAYOUT, VL_S_OFFSETS, VL_S_MASK, VL_S_NORMALIZER, VL_NSETTINGS };

static const tl_line vl_line = {VL_S_DTYPE, VL_S_AGG, VL_S_LAYOUT, VL_S_OFFSETS, VL_S_MASK, VL_S_NORMALIZER};
static const tl_templates vl_templates = {&vl_count_tmpl, &vl_main_tmpl, &vl_reduce_tmpl, &vl_host_tmpl};

static const rlk_op_setting vl_settings[VL_NSETTINGS] = {
    [VL_S_DTYPE] = RLK_SET(tl_dtype, RLK_F32, "value_loss_*.dtype", "the dtype of the values, old values and returns"),
    [VL_S_AGG] = RLK_SET_CHOICE("agg", tl_agg_names, RLK_AGG_TOKEN_MEAN, "value_loss_main.seqmean",
                                "the loss aggregation"),
    [VL_S_LAYOUT] = RLK_SET_CHOICE("layout", tl_packed_names, 0, "value_loss_main.layout",
                                   "[B, T] + mask or [N] + seq_offsets"),
    [VL_S_OFFSETS] = RLK_SET_DTYPE("offsets", RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64), RLK_I64,
                                   "value_loss_main.layout", "the seq_offsets dtype; with layout=packed"),
    [VL_S_MASK] = RLK_SET(rlk_seq_mask_decl, RLK_SEQ_MASK_BOOL, "value_loss_main.mask", "the mask's dtype"),
    [VL_S_NORMALIZER] = RLK_SET_CHOICE("normalizer", tl_normalizer_names, TL_LINE_NORM_VALUE, "value_loss_count",
                                       "the token-mean divisor: a number or a device scalar (the same "
                                       "kernels), or this call's mask count (a count pass first)"),
};

/* The kernels: the token-loss passes (tl_plan); the main pass is specialized on the dtype,
 * seq-mean-token-mean, the layout and the mask kind. */
static rlk_status vl_plan(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs, size_t *nspecs) {
  const int64_t *v = s->v;
  int layout = TL_LAYOUT_PADDED;
  rlk_status st = tl_line_layout(s, &vl_line, &layout);
  if (st) return st;
  const rlk_kernel_spec main_pass = {
      &vl_main_tmpl, {v[VL_S_DTYPE], v[VL_S_AGG] == RLK_AGG_SEQ_MEAN_TOKEN_MEAN, layout, v[VL_S_MASK]}};
  return tl_plan(ctx, &vl_templates, &vl_line, s, &main_pass, specs, nspecs);
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
    .name = "value_loss", .settings = vl_settings, .nsettings = VL_NSETTINGS,
    .note = "the clip range and the normalizers are run-time values: the same kernels", .plan = vl_plan,
    .samples = vl_samples};

/* ---------------------------------------------------------------------------------- */
/* The call                                                                            */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_value_loss_args_init(rlk_value_loss_args *args) {
  static const rlk_value_loss_args defaults = {
      .clip = 0.5, .clamp_bound_grad = 0.5, .agg = RLK_AGG_TOKEN_MEAN, .loss_scale = 1.0};
  if (args) *args = defaults;
}

/* A call: the token-loss state, then the kernels' argument. */
typedef struct vl_call {
  tl_call tl;
  vl_args k;
} vl_call;

static rlk_status vl_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_value_loss_args *a = args;
  vl_call *k = (vl_call *)call;
  tl_layout *L = &k->tl.L;
  vl_args *p = &k->k;
  rlk_status st;
  int64_t stride;
  if ((st = tl_layout_check(ctx, &a->values, "values", &a->seq_offsets, &a->mask, L, &stride)))
    return st;
  p->s.in[VL_IN_V] = a->values.data;
  p->s.in_stride[VL_IN_V] = stride;
  p->s.mask = a->mask.data;
  p->s.mask_stride = L->mask_stride;
  p->s.offsets = a->seq_offsets.data;
  p->s.rows = L->rows;
  p->s.cols = L->cols;
  if ((st = tl_stream_in(L, &a->old_values, "old_values", 1, &p->s.in[VL_IN_OLD],
                         &p->s.in_stride[VL_IN_OLD])))
    return st;
  if ((st = tl_stream_in(L, &a->returns, "returns", 1, &p->s.in[VL_IN_RET], &p->s.in_stride[VL_IN_RET]))) return st;

  if ((st = rlk_check_unit_interval(a->clamp_bound_grad, "clamp_bound_grad"))) return st;
  if (!(a->clip > 0.0))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "clip: %g must be > 0 (INFINITY: no clipping)",
                     a->clip);
  const tl_norm_args na = {(int)a->agg, a->token_normalizer, a->seq_normalizer, a->norm_scale,
                           a->loss_scale, &a->token_normalizer_tensor, &a->seq_normalizer_tensor};
  const int whole_rows = a->agg == RLK_AGG_SEQ_MEAN_TOKEN_MEAN && L->mask != RLK_SEQ_MASK_NONE;
  if ((st = tl_call_finish(ctx, &k->tl, &vl_line, &na, whole_rows, VL_NACC, &p->c_grad, &p->norm))) return st;

  if ((st = tl_vector_check(&a->loss, "loss", L->dtype, 1, 1))) return st;
  if ((st = tl_stream_out(L, &a->grad_values, "grad_values", 1, &p->s.out[VL_OUT_GV],
                          &p->s.out_stride[VL_OUT_GV])))
    return st;
  if ((st = tl_vector_check(&a->metrics, "metrics", L->dtype, RLK_VALUE_LOSS_METRICS, 0))) return st;
  p->loss = a->loss.data;
  p->metrics = a->metrics.data;
  p->seqmean = a->agg == RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
  p->layout = L->layout;
  p->mask_kind = L->mask;
  p->clip = a->clip;
  p->bound_g = a->clamp_bound_grad;
  p->s.tiles_per_row = k->tl.g.tiles_per_row;
  p->s.tile = k->tl.g.tile;
  p->num_partials = k->tl.g.grid;
  return RLK_OK;
}

/* Every kernel takes the one argument; the partials and the count pass's counts are in the
 * workspace. */
static const void *vl_launch_params(const rlk_context *ctx, const void *args, rlk_op_call *call, size_t i) {
  (void)ctx, (void)i;
  const rlk_value_loss_args *a = args;
  vl_call *k = (vl_call *)call;
  k->k.partials = a->workspace;
  k->k.norm.counts = tl_counts(&k->tl, a->workspace, VL_NACC);
  return &k->k;
}

static const rlk_arg_field vl_fields[] = {
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

static const rlk_op_entry vl_entry = {
    .name = "rlk_value_loss", .op = &rlk_op_value_loss, .call_size = sizeof(vl_call), RLK_OP_FIELDS(vl_fields),
    .workspace = RLK_OP_WORKSPACE(rlk_value_loss_args, 16), .validate = vl_validate, .params = vl_launch_params, .dims = tl_dims};

RLK_OP_DEFINE_CALL_AND_SIZE(rlk_value_loss, rlk_value_loss_args, vl_entry)

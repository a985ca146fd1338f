/* token_kl.c - per-token KL estimates against a reference policy and their gradient
 * (rlk_token_kl): validation, the kernel's selection and its one launch.
 *
 * One elementwise kernel (templates/cuda/token_kl.cuh, templates/host/token_kl.c) whose
 * estimator, mask kind, gradient form, optional inputs and outputs are template values; the
 * clamps are run-time numbers. A 1-D [N] call runs as one row of N. tk_plan is the single
 * function both a call (over the call's settings) and rlk_precompile go through. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "ops/advantage_scan.h"
#include "ops/ops.h"
#include "common/token_kl_params.h"

/* ---------------------------------------------------------------------------------- */
/* The template                                                                        */
/* ---------------------------------------------------------------------------------- */

static const char *const tk_estimator_names[] = RLK_PARAMS_ENUM_NAMES(RLK_KL_ESTIMATORS);
static const char *const tk_output_names[] = RLK_PARAMS_ENUM_NAMES(RLK_TK_OUTPUTS);

/* The kernels' estimators are the API's. */
_Static_assert(RLK_KL_EST_K1 == (int)RLK_KL_K1 && RLK_KL_EST_ABS == (int)RLK_KL_ABS && RLK_KL_EST_K2 == (int)RLK_KL_K2 &&
                   RLK_KL_EST_K3 == (int)RLK_KL_K3,
               "KL estimators: rlk_kl_estimator order");

#define TK_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F64))
#define TK_MASK_DTYPES (RLK_DTYPE_BIT(RLK_BOOL) | RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_F32))
#define TK_BLOCK 256

static const rlk_value_decl tk_dtype = RLK_DECL_DTYPE("dtype", TK_DTYPES); /* the setting's too */

/* In the CUDA template's parameter order. */
static const rlk_value_decl *const tk_params[] = {
    &tk_dtype,
    RLK_PARAM_CHOICE("est", tk_estimator_names, 0, 3),
    &rlk_seq_mask_decl,
    RLK_PARAM_FLAG("st"),
    RLK_PARAM_FLAG("old"),
    RLK_PARAM_FLAG("gin"),
    RLK_PARAM_CHOICE("out", tk_output_names, 0, 2),
};

static const rlk_template tk_tmpl = {"token_kl", "token_kl", "cuda/token_kl.cuh", "host/token_kl.c",
                                     sizeof tk_params / sizeof tk_params[0], tk_params};

/* ---------------------------------------------------------------------------------- */
/* The settings and the plan (shared by calls and precompiling)                        */
/* ---------------------------------------------------------------------------------- */

enum { TK_S_DTYPE, TK_S_ESTIMATOR, TK_S_MASK, TK_S_ST, TK_S_OLD, TK_S_GIN, TK_S_OUT, TK_NSETTINGS };

static const rlk_op_setting tk_settings[TK_NSETTINGS] = {
    [TK_S_DTYPE] = RLK_SET(tk_dtype, RLK_F32, "token_kl.dtype", "the dtype of the log-probs and the outputs"),
    [TK_S_ESTIMATOR] = RLK_SET_CHOICE("estimator", tk_estimator_names, RLK_KL_K3, "token_kl.est",
                                      "the KL estimator (rlk_kl_estimator)"),
    [TK_S_MASK] = RLK_SET(rlk_seq_mask_decl, RLK_SEQ_MASK_NONE, "token_kl.mask",
                          "the mask's dtype (none: no mask)"),
    [TK_S_ST] = RLK_SET_FLAG("straight_through", 0, "token_kl.st",
                             "the gradient is k2's of the unclamped log-ratio"),
    [TK_S_OLD] = RLK_SET_FLAG("old_logp", 0, "token_kl.old",
                              "old_logp weights the straight-through gradient"),
    [TK_S_GIN] = RLK_SET_FLAG("grad_kl", 0, "token_kl.gin", "an upstream gradient is given"),
    [TK_S_OUT] = RLK_SET_CHOICE("outputs", tk_output_names, TK_OUT_KL, "token_kl.out",
                                "what the call writes: kl, grad_logp or both"),
};

/* The kernel of a configuration, for calls and precompile lines alike. Refused: an input the
 * kernel would ignore, or an output-less setting. */
static rlk_status tk_plan(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs, size_t *nspecs) {
  (void)ctx;
  const int64_t *v = s->v;
  if (v[TK_S_OLD] && !v[TK_S_ST])
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "old_logp: it weights only the straight-through gradient");
  if (v[TK_S_GIN] && v[TK_S_OUT] == TK_OUT_KL)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "grad_kl: given, but grad_logp is not written");
  if (v[TK_S_ST] && v[TK_S_OUT] == TK_OUT_KL)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "straight_through: only the gradient has it, and it is not written");
  memset(&specs[0], 0, sizeof specs[0]);
  specs[0].tmpl = &tk_tmpl;
  memcpy(specs[0].values, v, TK_NSETTINGS * sizeof *v); /* the settings are the parameters, in order */
  return rlk_op_planned(specs, 1, nspecs);
}

static const char *const tk_samples[] = {
    /* verl's kl_penalty in the reward (low_var_kl, no gradient) */
    "token_kl dtype=f32 estimator=k3 mask=none outputs=kl",
    /* a KL loss term: value and gradient, masked */
    "token_kl dtype=f32 estimator=k1 mask=bool outputs=both",
    /* its backward under autograd */
    "token_kl dtype=f64 estimator=abs mask=i32 outputs=grad grad_kl=1",
    /* verl "k3+" / OpenRLHF unbiased_gradient, importance-weighted */
    "token_kl dtype=f64 estimator=k2 mask=f32 outputs=both straight_through=1 old_logp=1 grad_kl=1",
    "token_kl dtype=f32 estimator=k3 mask=bool outputs=grad straight_through=1",
    NULL};

const rlk_op_desc rlk_op_token_kl = {
    .name = "token_kl", .settings = tk_settings, .nsettings = TK_NSETTINGS, .plan = tk_plan, .samples = tk_samples};

/* ---------------------------------------------------------------------------------- */
/* The call                                                                            */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_token_kl_args_init(rlk_token_kl_args *args) {
  static const rlk_token_kl_args defaults = {
      .estimator = RLK_KL_K3, .input_min = -20.0, .input_max = 20.0, .output_min = -10.0, .output_max = 10.0,
      .is_weight_max = INFINITY, .clamp_bound_grad = 1.0};
  if (args) *args = defaults;
}

/* A per-token tensor of the call as a [B, T] view: 1-D [N] ones (contiguous) become one row. */
static rlk_status tk_view(const rlk_tensor *t, const char *what, int required, uint32_t dtypes, int ndim,
                          int64_t B, int64_t T, rlk_tensor *view) {
  *view = *t;
  if (!t->data && !required) return rlk_check_tensor(t, what, 0);
  if (ndim == 1) {
    rlk_status st = rlk_check_vector(t, what, dtypes, T, 1, NULL);
    if (st) return st;
    *view = rlk_tensor_2d(t->data, t->dtype, 1, T, T);
    return RLK_OK;
  }
  return rlk_seq_check_rows(t, what, required, dtypes, B, T);
}

static rlk_status tk_bound_pair(double lo, double hi, const char *what) {
  if (isnan(lo) || isnan(hi) || lo > hi)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: [%g, %g] is not a range (min <= max, no NaN)", what, lo, hi);
  return RLK_OK;
}

/* A call: the kernel's argument. */
typedef struct tk_call {
  rlk_op_call op;
  tk_args k;
} tk_call;

static rlk_status tk_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  (void)ctx;
  const rlk_token_kl_args *a = args;
  tk_args *k = &((tk_call *)call)->k;
  rlk_status st;
  if ((st = rlk_check_tensor_of(&a->logp, "logp", TK_DTYPES, 1, 2))) return st;
  const int nd = a->logp.ndim;
  const int64_t B = nd == 2 ? a->logp.shape[0] : 1, T = a->logp.shape[nd - 1];
  const uint32_t same = RLK_DTYPE_BIT(a->logp.dtype);
  rlk_tensor logp, ref, old, gin, mask, kl, grad;
  if ((st = tk_view(&a->logp, "logp", 1, same, nd, B, T, &logp))) return st;
  if ((st = tk_view(&a->ref_logp, "ref_logp", 1, same, nd, B, T, &ref))) return st;
  if ((st = tk_view(&a->old_logp, "old_logp", 0, same, nd, B, T, &old))) return st;
  if ((st = tk_view(&a->grad_kl, "grad_kl", 0, same, nd, B, T, &gin))) return st;
  if ((st = tk_view(&a->mask, "mask", 0, TK_MASK_DTYPES, nd, B, T, &mask))) return st;
  if ((st = tk_view(&a->kl, "kl", 0, same, nd, B, T, &kl))) return st;
  if ((st = tk_view(&a->grad_logp, "grad_logp", 0, same, nd, B, T, &grad))) return st;
  if (!a->kl.data && !a->grad_logp.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kl and grad_logp: both absent, the call would write nothing");
  if ((st = rlk_check_enum((int)a->estimator, "estimator", RLK_KL_K1, RLK_KL_K3, "rlk_kl_estimator"))) return st;
  if ((st = tk_bound_pair(a->input_min, a->input_max, "input_min, input_max"))) return st;
  if ((st = tk_bound_pair(a->output_min, a->output_max, "output_min, output_max"))) return st;
  if ((st = rlk_check_flag(a->straight_through, "straight_through"))) return st;
  if (!(a->is_weight_max > 0.0))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "is_weight_max: %g is not > 0", a->is_weight_max);
  if ((st = rlk_check_unit_interval(a->clamp_bound_grad, "clamp_bound_grad"))) return st;
  rlk_op_values *v = &call->vals;
  rlk_op_values_set(v, TK_S_DTYPE, a->logp.dtype);
  rlk_op_values_set(v, TK_S_ESTIMATOR, a->estimator);
  rlk_op_values_set(v, TK_S_MASK, rlk_seq_mask_kind(&a->mask));
  rlk_op_values_set(v, TK_S_ST, a->straight_through);
  rlk_op_values_set(v, TK_S_OLD, a->old_logp.data != NULL);
  rlk_op_values_set(v, TK_S_GIN, a->grad_kl.data != NULL);
  rlk_op_values_set(v, TK_S_OUT, a->kl.data && a->grad_logp.data ? TK_OUT_BOTH : a->kl.data ? TK_OUT_KL : TK_OUT_GRAD);
  k->logp = rlk_seq_stream(&logp, B, T, &k->logp_stride);
  k->ref = rlk_seq_stream(&ref, B, T, &k->ref_stride);
  k->old = rlk_seq_stream(&old, B, T, &k->old_stride);
  k->grad_kl = rlk_seq_stream(&gin, B, T, &k->grad_kl_stride);
  k->mask = rlk_seq_stream(&mask, B, T, &k->mask_stride);
  k->kl = rlk_seq_stream(&kl, B, T, &k->kl_stride);
  k->grad = rlk_seq_stream(&grad, B, T, &k->grad_stride);
  k->B = B;
  k->T = T;
  k->in_lo = a->input_min;
  k->in_hi = a->input_max;
  k->out_lo = a->output_min;
  k->out_hi = a->output_max;
  k->w_max = a->is_weight_max;
  k->bound_g = a->clamp_bound_grad;
  return tk_plan(ctx, v, call->specs, &call->nspecs); /* what it refuses, refused before the call goes on */
}

/* Rows shorter than the block share it: bx threads along a row (a power of two, at least a
 * warp), TK_BLOCK / bx rows per block. */
static void tk_dims(const rlk_context *ctx, const rlk_op_call *call, size_t i, rlk_launch_dims *d) {
  (void)i;
  if (ctx->kind == RLK_BACKEND_HOST) return;
  const tk_args *k = &((const tk_call *)call)->k;
  int64_t bx = 32;
  while (bx < TK_BLOCK && bx < k->T) bx *= 2;
  const int64_t by = TK_BLOCK / bx, gx = (k->T + bx - 1) / bx, gy = (k->B + by - 1) / by;
  d->grid[0] = (unsigned)(gx < (1 << 16) ? gx : (1 << 16));
  d->grid[1] = (unsigned)(gy < 65535 ? gy : 65535);
  d->block[0] = (unsigned)bx;
  d->block[1] = (unsigned)by;
}

static const rlk_arg_field tk_fields[] = {
    RLK_ARG_IN(rlk_token_kl_args, logp),     RLK_ARG_IN(rlk_token_kl_args, ref_logp),
    RLK_ARG_IN(rlk_token_kl_args, old_logp), RLK_ARG_IN(rlk_token_kl_args, grad_kl),
    RLK_ARG_IN(rlk_token_kl_args, mask),     RLK_ARG_OUT(rlk_token_kl_args, kl),
    RLK_ARG_OUT(rlk_token_kl_args, grad_logp)};

static const rlk_op_entry tk_entry = {
    .name = "rlk_token_kl", .op = &rlk_op_token_kl, .call_size = sizeof(tk_call), RLK_OP_FIELDS(tk_fields),
    .validate = tk_validate, .params_at = offsetof(tk_call, k), .dims = tk_dims};

RLK_OP_DEFINE_CALL(rlk_token_kl, rlk_token_kl_args, tk_entry)

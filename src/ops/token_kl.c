/* token_kl.c - per-token KL estimates against a reference policy and their gradient
 * (rlk_token_kl): validation, the kernel's selection and its one launch.
 *
 * One elementwise kernel (templates/cuda/token_kl.cuh, templates/host/token_kl.c) whose
 * estimator, mask kind, gradient form, optional inputs and outputs are template values; the
 * clamps are run-time numbers. A 1-D [N] call runs as one row of N. tk_select is the single
 * function both a call and rlk_precompile (the op's `plan`) go through. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "ops/advantage_scan.h"
#include "ops/ops.h"
#include "runtime/record.h"
#include "common/token_kl_params.h"

/* The kernel's argument (templates/common/token_kl_params.h). */
RLK_PARAMS_DECLARE(tk_args, RLK_TK_PARAMS, RLK_TK_PARAMS_SIZE);

/* ---------------------------------------------------------------------------------- */
/* The template                                                                        */
/* ---------------------------------------------------------------------------------- */

static const char *const tk_estimator_names[] = {"k1", "abs", "k2", "k3", NULL};
static const char *const tk_output_names[] = {"kl", "grad", "both", NULL};

enum { TK_OUT_KL = 0, TK_OUT_GRAD = 1, TK_OUT_BOTH = 2 };

#define TK_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F64))
#define TK_MASK_DTYPES (RLK_DTYPE_BIT(RLK_BOOL) | RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_F32))
#define TK_BLOCK 256

/* In the CUDA template's parameter order. */
static const rlk_param_decl tk_params[] = {
    {"dtype", RLK_PARAM_DTYPE, 0, 0, 0, TK_DTYPES, NULL},
    {"est", RLK_PARAM_ENUM, 0, 3, 0, 0, tk_estimator_names},
    {"mask", RLK_PARAM_ENUM, 0, 3, 0, 0, rlk_seq_mask_names},
    {"st", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
    {"old", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
    {"gin", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
    {"out", RLK_PARAM_ENUM, 0, 2, 0, 0, tk_output_names},
};

static const rlk_template tk_tmpl = {"token_kl", "token_kl", "cuda/token_kl.cuh", "host/token_kl.c",
                                     sizeof tk_params / sizeof tk_params[0], tk_params};

/* ---------------------------------------------------------------------------------- */
/* Selection (shared by calls and precompiling)                                        */
/* ---------------------------------------------------------------------------------- */

/* What selects the kernel: everything about a call except sizes, pointers and numbers. */
typedef struct tk_config {
  rlk_dtype dtype;
  int estimator, mask, st, old, gin, out;
} tk_config;

static rlk_status tk_select(const tk_config *c, rlk_kernel_spec *spec) {
  memset(spec, 0, sizeof *spec);
  spec->tmpl = &tk_tmpl;
  const int64_t v[] = {c->dtype, c->estimator, c->mask, c->st, c->old, c->gin, c->out};
  memcpy(spec->values, v, sizeof v);
  return rlk_spec_validate(spec);
}

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

enum { TK_S_DTYPE, TK_S_ESTIMATOR, TK_S_MASK, TK_S_ST, TK_S_OLD, TK_S_GIN, TK_S_OUT, TK_NSETTINGS };

static const rlk_op_setting tk_settings[TK_NSETTINGS] = {
    [TK_S_DTYPE] = RLK_SET_DTYPE("dtype", TK_DTYPES, RLK_F32, "token_kl.dtype",
                                 "the dtype of the log-probs and the outputs"),
    [TK_S_ESTIMATOR] = RLK_SET_CHOICE("estimator", tk_estimator_names, RLK_KL_K3, "token_kl.est",
                                      "the KL estimator (rlk_kl_estimator)"),
    [TK_S_MASK] = RLK_SET_CHOICE("mask", rlk_seq_mask_names, RLK_SEQ_MASK_NONE, "token_kl.mask",
                                 "the mask's dtype (none: no mask)"),
    [TK_S_ST] = RLK_SET_FLAG("straight_through", 0, "token_kl.st",
                             "the gradient is k2's of the unclamped log-ratio"),
    [TK_S_OLD] = RLK_SET_FLAG("old_logp", 0, "token_kl.old",
                              "old_logp weights the straight-through gradient"),
    [TK_S_GIN] = RLK_SET_FLAG("grad_kl", 0, "token_kl.gin", "an upstream gradient is given"),
    [TK_S_OUT] = RLK_SET_CHOICE("outputs", tk_output_names, TK_OUT_KL, "token_kl.out",
                                "what the call writes: kl, grad_logp or both"),
};

/* Combinations refused by a call and by a precompile line alike: an input the kernel would
 * ignore, or an output-less setting. */
static rlk_status tk_check_config(const tk_config *c) {
  if (c->old && !c->st)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "old_logp: it weights only the straight-through gradient");
  if (c->gin && c->out == TK_OUT_KL)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "grad_kl: given, but grad_logp is not written");
  if (c->st && c->out == TK_OUT_KL)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "straight_through: only the gradient has it, and it is not written");
  return RLK_OK;
}

static rlk_status tk_plan_config(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs,
                                 size_t *nspecs) {
  (void)ctx;
  const tk_config c = {(rlk_dtype)s->v[TK_S_DTYPE], (int)s->v[TK_S_ESTIMATOR], (int)s->v[TK_S_MASK],
                       (int)s->v[TK_S_ST], (int)s->v[TK_S_OLD], (int)s->v[TK_S_GIN], (int)s->v[TK_S_OUT]};
  rlk_status st = tk_check_config(&c);
  if (!st) st = tk_select(&c, &specs[0]);
  if (!st) *nspecs = 1;
  return st;
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
    .name = "token_kl",
    .settings = tk_settings,
    .nsettings = TK_NSETTINGS,
    .plan = tk_plan_config,
    .samples = tk_samples,
};

/* ---------------------------------------------------------------------------------- */
/* The call                                                                            */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_token_kl_args_init(rlk_token_kl_args *args) {
  if (!args) return;
  memset(args, 0, sizeof *args);
  args->estimator = RLK_KL_K3;
  args->input_min = -20.0;
  args->input_max = 20.0;
  args->output_min = -10.0;
  args->output_max = 10.0;
  args->is_weight_max = INFINITY;
  args->clamp_bound_grad = 1.0;
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

/* Validated views of a call's tensors. */
typedef struct tk_call {
  rlk_tensor logp, ref, old, gin, mask, kl, grad;
  int64_t B, T;
} tk_call;

static rlk_status tk_validate(const rlk_token_kl_args *a, tk_config *c, tk_call *k) {
  memset(c, 0, sizeof *c);
  memset(k, 0, sizeof *k);
  rlk_status st;
  if ((st = rlk_check_tensor(&a->logp, "logp", 1))) return st;
  if ((st = rlk_check_dtype(&a->logp, "logp", TK_DTYPES))) return st;
  if ((st = rlk_check_ndim(&a->logp, "logp", 1, 2))) return st;
  const int nd = a->logp.ndim;
  const int64_t B = nd == 2 ? a->logp.shape[0] : 1, T = a->logp.shape[nd - 1];
  const uint32_t same = RLK_DTYPE_BIT(a->logp.dtype);
  c->dtype = a->logp.dtype;
  if ((st = tk_view(&a->logp, "logp", 1, same, nd, B, T, &k->logp))) return st;
  if ((st = tk_view(&a->ref_logp, "ref_logp", 1, same, nd, B, T, &k->ref))) return st;
  if ((st = tk_view(&a->old_logp, "old_logp", 0, same, nd, B, T, &k->old))) return st;
  if ((st = tk_view(&a->grad_kl, "grad_kl", 0, same, nd, B, T, &k->gin))) return st;
  if ((st = tk_view(&a->mask, "mask", 0, TK_MASK_DTYPES, nd, B, T, &k->mask))) return st;
  if ((st = tk_view(&a->kl, "kl", 0, same, nd, B, T, &k->kl))) return st;
  if ((st = tk_view(&a->grad_logp, "grad_logp", 0, same, nd, B, T, &k->grad))) return st;
  if (!a->kl.data && !a->grad_logp.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kl and grad_logp: both absent, the call would write nothing");
  if ((int)a->estimator < RLK_KL_K1 || (int)a->estimator > RLK_KL_K3)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "estimator: %d is not an rlk_kl_estimator", (int)a->estimator);
  if ((st = tk_bound_pair(a->input_min, a->input_max, "input_min, input_max"))) return st;
  if ((st = tk_bound_pair(a->output_min, a->output_max, "output_min, output_max"))) return st;
  if (a->straight_through != 0 && a->straight_through != 1)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "straight_through: %d is not 0 or 1", a->straight_through);
  if (!(a->is_weight_max > 0.0))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "is_weight_max: %g is not > 0", a->is_weight_max);
  if (!(a->clamp_bound_grad >= 0.0 && a->clamp_bound_grad <= 1.0))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "clamp_bound_grad: %g is not in [0, 1]", a->clamp_bound_grad);
  c->estimator = (int)a->estimator;
  c->mask = rlk_seq_mask_kind(&a->mask);
  c->st = a->straight_through;
  c->old = a->old_logp.data != NULL;
  c->gin = a->grad_kl.data != NULL;
  c->out = a->kl.data && a->grad_logp.data ? TK_OUT_BOTH : a->kl.data ? TK_OUT_KL : TK_OUT_GRAD;
  if ((st = tk_check_config(c))) return st;
  static const rlk_arg_field fields[] = {
      RLK_ARG_IN(rlk_token_kl_args, logp),     RLK_ARG_IN(rlk_token_kl_args, ref_logp),
      RLK_ARG_IN(rlk_token_kl_args, old_logp), RLK_ARG_IN(rlk_token_kl_args, grad_kl),
      RLK_ARG_IN(rlk_token_kl_args, mask),     RLK_ARG_OUT(rlk_token_kl_args, kl),
      RLK_ARG_OUT(rlk_token_kl_args, grad_logp)};
  if ((st = rlk_check_arg_fields(fields, sizeof fields / sizeof fields[0], a, NULL, 0))) return st;
  k->B = B;
  k->T = T;
  return RLK_OK;
}

/* RLK_JIT_RECORD: the line of a call's configuration. */
static void tk_record(const tk_config *c) {
  rlk_op_values s;
  rlk_op_values_init(&rlk_op_token_kl, &s);
  rlk_op_values_set(&s, TK_S_DTYPE, c->dtype);
  rlk_op_values_set(&s, TK_S_ESTIMATOR, c->estimator);
  rlk_op_values_set(&s, TK_S_MASK, c->mask);
  rlk_op_values_set(&s, TK_S_ST, c->st);
  rlk_op_values_set(&s, TK_S_OLD, c->old);
  rlk_op_values_set(&s, TK_S_GIN, c->gin);
  rlk_op_values_set(&s, TK_S_OUT, c->out);
  rlk_record_op(&rlk_op_token_kl, &s);
}

RLK_API rlk_status rlk_token_kl(rlk_context *ctx, const rlk_token_kl_args *args, void *stream) {
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_token_kl: ctx is NULL");
  if (!args) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_token_kl: args is NULL");
  tk_config c;
  tk_call k;
  rlk_status st = tk_validate(args, &c, &k);
  if (st) return st;
  if ((st = rlk_context_require_device(ctx, "rlk_token_kl"))) return st;
  rlk_kernel_spec spec;
  if ((st = tk_select(&c, &spec))) return st;
  if (rlk_record_enabled()) tk_record(&c);

  const int64_t B = k.B, T = k.T;
  tk_args a;
  memset(&a, 0, sizeof a);
  a.logp = k.logp.data;
  a.logp_stride = rlk_seq_row_stride(&k.logp, B, T);
  a.ref = k.ref.data;
  a.ref_stride = rlk_seq_row_stride(&k.ref, B, T);
  a.old = k.old.data;
  a.old_stride = rlk_seq_row_stride(&k.old, B, T);
  a.grad_kl = k.gin.data;
  a.grad_kl_stride = rlk_seq_row_stride(&k.gin, B, T);
  a.mask = k.mask.data;
  a.mask_stride = rlk_seq_row_stride(&k.mask, B, T);
  a.kl = k.kl.data;
  a.kl_stride = rlk_seq_row_stride(&k.kl, B, T);
  a.grad = k.grad.data;
  a.grad_stride = rlk_seq_row_stride(&k.grad, B, T);
  a.B = B;
  a.T = T;
  a.in_lo = args->input_min;
  a.in_hi = args->input_max;
  a.out_lo = args->output_min;
  a.out_hi = args->output_max;
  a.w_max = args->is_weight_max;
  a.bound_g = args->clamp_bound_grad;
  void *kargs[] = {&a};
  rlk_launch_dims d;
  memset(&d, 0, sizeof d);
  d.grid[0] = d.grid[1] = d.grid[2] = d.block[0] = d.block[1] = d.block[2] = 1;
  if (ctx->kind != RLK_BACKEND_HOST) {
    /* rows shorter than the block share it: bx threads along a row (a power of two, at least a
     * warp), TK_BLOCK / bx rows per block */
    int64_t bx = 32;
    while (bx < TK_BLOCK && bx < T) bx *= 2;
    const int64_t by = TK_BLOCK / bx, gx = (T + bx - 1) / bx, gy = (B + by - 1) / by;
    d.grid[0] = (unsigned)(gx < (1 << 16) ? gx : (1 << 16));
    d.grid[1] = (unsigned)(gy < 65535 ? gy : 65535);
    d.block[0] = (unsigned)bx;
    d.block[1] = (unsigned)by;
  }
  return rlk_context_launch(ctx, &spec, &d, stream, kargs);
}

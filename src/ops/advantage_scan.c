/* advantage_scan.c - GAE, discounted returns and reverse cumulative sums: validation, the
 * variant selection shared by calls and precompiling, and the launch.
 *
 * All three are reverse first-order linear recurrences per row, run by one template
 * (templates/cuda/advantage_scan.cuh, templates/host/advantage_scan.c) in one launch:
 *   family gae      state (A, V_next): advantages and returns, masked steps skipped or zeroed
 *   family returns  state R: discounted returns (reset or zero at masked steps); a reverse
 *                   cumulative sum is the zero form with gamma 1 (1 * x + r is exactly x + r),
 *                   and its ReMax advantages (R - baseline where valid) are the second output.
 * The mask kind and the masked-position semantics are run-time values (they only change a
 * branch), so one kernel per dtype x family x algorithm serves every call.
 *
 * Algorithms (as_algo_for, the one place that decides, for calls and rlk_precompile alike):
 *   warp   a warp per row, tiles of warp x K steps carried left; best for short rows, many rows
 *   block  a block per row, tiles of up to 1024 x K steps, block-wide scans; long rows, few rows
 * K = 32 bytes of each input per thread (8 f32, 4 f64). Auto picks block when a row is longer
 * than two warp tiles. The host runs a plain loop (warp) or the same chunked scan (block). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ops/advantage_scan.h"
#include "common/advantage_scan_params.h"

/* ---------------------------------------------------------------------------------- */
/* Shared checks (advantage_scan.h)                                                    */
/* ---------------------------------------------------------------------------------- */

rlk_status rlk_seq_check_rows(const rlk_tensor *t, const char *what, int required, uint32_t dtypes,
                              int64_t B, int64_t T) {
  rlk_status st;
  if ((st = rlk_check_tensor(t, what, required))) return st;
  if (!t->data) return RLK_OK;
  if ((st = rlk_check_dtype(t, what, dtypes))) return st;
  return rlk_check_rows(t, what, B, T);
}

int64_t rlk_seq_row_stride(const rlk_tensor *t, int64_t B, int64_t T) {
  return t->data && B > 1 ? t->strides[0] : T;
}

void *rlk_seq_stream(const rlk_tensor *t, int64_t B, int64_t T, long long *stride) {
  *stride = rlk_seq_row_stride(t, B, T);
  return t->data;
}

/* ---------------------------------------------------------------------------------- */
/* The template                                                                        */
/* ---------------------------------------------------------------------------------- */

static const char *const as_family_names[] = RLK_PARAMS_ENUM_NAMES(RLK_AS_FAMILIES);
static const char *const as_algo_names[] = RLK_PARAMS_ENUM_NAMES(RLK_AS_ALGOS);

/* The kernel's masked-position semantics are the API's. */
_Static_assert(AS_GAE_SKIP == (int)RLK_GAE_MASKED_SKIP && AS_GAE_ZERO == (int)RLK_GAE_MASKED_ZERO,
               "advantage_scan gae masked: rlk_gae_masked order");
_Static_assert(AS_RETURNS_RESET == (int)RLK_RETURNS_MASKED_RESET && AS_RETURNS_ZERO == (int)RLK_RETURNS_MASKED_ZERO &&
                   AS_RETURNS_CARRY == (int)RLK_RETURNS_MASKED_CARRY,
               "advantage_scan returns masked: rlk_returns_masked order");

#define AS_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F64))
#define AS_MASK_DTYPES (RLK_DTYPE_BIT(RLK_BOOL) | RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_F32))
/* Threads of a row-per-block launch. The scan kernels hold 70-80 registers a thread in f32
 * (more in f64), so 1024-thread blocks would ask for more than an SM's 64K registers and fail
 * to launch; 512 leaves room for both. */
#define AS_MAX_BLOCK 512
#define AS_MAX_GRID (1u << 20)
#define AS_WARP_ROWS 4 /* rows (warps) per block in the warp algorithm */

static const rlk_value_decl as_dtype = RLK_DECL_DTYPE("dtype", AS_DTYPES); /* the setting's too */

static const rlk_value_decl *const as_params[] = {
    &as_dtype,
    RLK_PARAM_CHOICE("family", as_family_names, 0, 1),
    RLK_PARAM_CHOICE("algo", as_algo_names, 0, 1),
};

static const rlk_template as_tmpl = {"advantage_scan", "advantage_scan", "cuda/advantage_scan.cuh",
                                     "host/advantage_scan.c",
                                     sizeof as_params / sizeof as_params[0], as_params};

/* ---------------------------------------------------------------------------------- */
/* The algorithm and the launch (shared by calls and precompiling)                     */
/* ---------------------------------------------------------------------------------- */

/* The algorithm a configuration runs: forced, or by shape (T; 0 where unknown). The host's auto
 * is the plain loop. */
static int as_algo_for(const rlk_target *t, rlk_dtype dtype, rlk_scan_algo algo, int64_t T) {
  if (algo == RLK_SCAN_ROW_WARP) return AS_ALGO_WARP;
  if (algo == RLK_SCAN_ROW_BLOCK) return AS_ALGO_BLOCK;
  if (t->kind == RLK_BACKEND_HOST) return AS_ALGO_WARP;
  const int64_t K = 32 / (int64_t)rlk_dtype_size(dtype);
  return T > 2 * t->warp_size * K ? AS_ALGO_BLOCK : AS_ALGO_WARP;
}

/* The launch of an algorithm over [B, T] on a GPU:
 *   warp   AS_WARP_ROWS warps per block, a row each;
 *   block  a row per block; the fewest tiles of at most 1024 x K steps that cover T, and the
 *          fewest whole warps that cover one tile (T = 4096 f32: 512 threads, one tile;
 *          T = 20480: 512 threads, five tiles). */
static void as_dims(const rlk_target *t, rlk_dtype dtype, int algo, int64_t B, int64_t T, rlk_launch_dims *d) {
  if (t->kind == RLK_BACKEND_HOST || B <= 0 || T <= 0) return;
  const int64_t W = t->warp_size, K = 32 / (int64_t)rlk_dtype_size(dtype);
  int64_t block, grid;
  if (algo == AS_ALGO_WARP) {
    block = AS_WARP_ROWS * W;
    grid = (B + AS_WARP_ROWS - 1) / AS_WARP_ROWS;
  } else {
    const int64_t tiles = (T + AS_MAX_BLOCK * K - 1) / (AS_MAX_BLOCK * K);
    const int64_t per_tile = (T + tiles * K - 1) / (tiles * K); /* threads */
    block = (per_tile + W - 1) / W * W;
    if (block > AS_MAX_BLOCK) block = AS_MAX_BLOCK;
    grid = B;
  }
  d->block[0] = (unsigned)block;
  d->grid[0] = (unsigned)(grid < (int64_t)AS_MAX_GRID ? grid : (int64_t)AS_MAX_GRID);
}

/* ---------------------------------------------------------------------------------- */
/* Precompile plans: gae, discounted_returns, reverse_cumsum                           */
/* ---------------------------------------------------------------------------------- */

static const char *const as_algo_setting_names[] = {"auto", "warp", "block", NULL}; /* rlk_scan_algo order */
static const char *const as_gae_masked_names[] = RLK_PARAMS_ENUM_NAMES(RLK_AS_GAE_MASKED);
static const char *const as_returns_masked_names[] = RLK_PARAMS_ENUM_NAMES(RLK_AS_RETURNS_MASKED);

/* The settings every scan op takes, then the one run-time choice of each. */
enum { AS_S_DTYPE, AS_S_ALGO, AS_S_B, AS_S_T, AS_S_MASK, AS_S_EXTRA, AS_NSETTINGS };

#define AS_COMMON_SETTINGS                                                                                  \
  [AS_S_DTYPE] = RLK_SET(as_dtype, RLK_F32, "advantage_scan.dtype", "of the values and outputs"),                \
  [AS_S_ALGO] = RLK_SET_CHOICE("algo", as_algo_setting_names, RLK_SCAN_AUTO, "advantage_scan.algo",                \
                               "auto with B and T picks what a call of that shape runs, without them it builds "  \
                               "every algorithm auto can pick"),                                                  \
  [AS_S_B] = RLK_SET_INT("B", 0, 1, (int64_t)1 << 40, "advantage_scan.algo", "rows, a shape hint for algo=auto"), \
  [AS_S_T] = RLK_SET_INT("T", 0, 1, (int64_t)1 << 40, "advantage_scan.algo", "steps per row, a shape hint for algo=auto"), \
  [AS_S_MASK] = RLK_SET(rlk_seq_mask_decl, 1, "", "the mask's dtype")

static const rlk_op_setting as_gae_settings[AS_NSETTINGS] = {
    AS_COMMON_SETTINGS,
    [AS_S_EXTRA] = RLK_SET_CHOICE("masked", as_gae_masked_names, 0, "", "verl | OpenRLHF, TRL"),
};
static const rlk_op_setting as_returns_settings[AS_NSETTINGS] = {
    AS_COMMON_SETTINGS,
    [AS_S_EXTRA] = RLK_SET_CHOICE("masked", as_returns_masked_names, 0, "", "verl REINFORCE++ | OpenRLHF"),
};
static const rlk_op_setting as_cumsum_settings[AS_NSETTINGS] = {
    AS_COMMON_SETTINGS,
    [AS_S_EXTRA] = RLK_SET_FLAG("baseline", 0, "", "ReMax advantages as a second output"),
};

/* The kernel of a configuration: auto with a whole shape (a call's, or B= and T=) picks one;
 * without one, every algorithm auto may pick on this backend. */
static rlk_status as_plan_family(int family, const rlk_context *ctx, const rlk_op_values *s,
                                 rlk_kernel_spec *specs, size_t *nspecs) {
  const rlk_dtype dtype = (rlk_dtype)s->v[AS_S_DTYPE];
  const rlk_scan_algo algo = (rlk_scan_algo)s->v[AS_S_ALGO];
  const int both =
      algo == RLK_SCAN_AUTO && (s->v[AS_S_B] <= 0 || s->v[AS_S_T] <= 0) && ctx->kind != RLK_BACKEND_HOST;
  const size_t n = both ? 2 : 1;
  for (size_t i = 0; i < n; i++) {
    const int a = both ? (int)i : as_algo_for(&ctx->target, dtype, algo, s->v[AS_S_T]);
    specs[i] = (rlk_kernel_spec){&as_tmpl, {dtype, family, a}};
  }
  return rlk_op_planned(specs, n, nspecs);
}

static rlk_status as_plan_gae(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs,
                              size_t *nspecs) {
  return as_plan_family(AS_FAMILY_GAE, ctx, s, specs, nspecs);
}

static rlk_status as_plan_returns(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs,
                                  size_t *nspecs) {
  return as_plan_family(AS_FAMILY_RETURNS, ctx, s, specs, nspecs);
}

/* Together they reach every pair of dtype, family and algorithm of the template in four kernels
 * (f32 gae warp, f64 gae block, f32 returns block, f64 returns warp); reverse_cumsum's samples
 * reach the returns kernels again through its own plan, and two lines pick the algorithm by
 * shape. */
/* (a sample with B= and T= each: what auto picks by the shape) */
static const char *const as_gae_samples[] = {"gae dtype=f32 algo=warp", "gae dtype=f64 algo=block masked=zero",
                                             "gae dtype=f64 B=64 T=4096 masked=zero", NULL};
static const char *const as_returns_samples[] = {
    "discounted_returns dtype=f32 B=256 T=4096", "discounted_returns dtype=f64 B=256 T=64", NULL};
static const char *const as_cumsum_samples[] = {"reverse_cumsum dtype=f32 algo=block baseline=1",
                                                "reverse_cumsum dtype=f64 algo=warp",
                                                "reverse_cumsum dtype=f32 B=8 T=4096 baseline=1", NULL};

const rlk_op_desc rlk_op_gae = {
    .name = "gae", .settings = as_gae_settings, .nsettings = AS_NSETTINGS, .plan = as_plan_gae,
    .samples = as_gae_samples};
const rlk_op_desc rlk_op_discounted_returns = {
    .name = "discounted_returns", .settings = as_returns_settings, .nsettings = AS_NSETTINGS,
    .plan = as_plan_returns, .samples = as_returns_samples};
const rlk_op_desc rlk_op_reverse_cumsum = {
    .name = "reverse_cumsum", .settings = as_cumsum_settings, .nsettings = AS_NSETTINGS,
    .plan = as_plan_returns, .samples = as_cumsum_samples};

/* ---------------------------------------------------------------------------------- */
/* The calls                                                                           */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_gae_args_init(rlk_gae_args *args) {
  static const rlk_gae_args defaults = {
      .gamma = 1.0, .lambda = 1.0, .masked = RLK_GAE_MASKED_SKIP, .algo = RLK_SCAN_AUTO};
  if (args) *args = defaults;
}

RLK_API void rlk_discounted_returns_args_init(rlk_discounted_returns_args *args) {
  static const rlk_discounted_returns_args defaults = {
      .gamma = 1.0, .masked = RLK_RETURNS_MASKED_RESET, .algo = RLK_SCAN_AUTO};
  if (args) *args = defaults;
}

RLK_API void rlk_reverse_cumsum_args_init(rlk_reverse_cumsum_args *args) {
  static const rlk_reverse_cumsum_args defaults = {.algo = RLK_SCAN_AUTO};
  if (args) *args = defaults;
}

/* A call: the kernel's argument. */
typedef struct as_call {
  rlk_op_call op;
  as_args k;
} as_call;

/* The first input and the optional mask, which every call takes: the shape [B, T] from the first
 * input, whose dtype (*dt, a dtype bit) is everything else's. */
static rlk_status as_check_input(const rlk_tensor *x, const char *what, const rlk_tensor *mask, int64_t *B,
                                 int64_t *T, uint32_t *dt) {
  rlk_status st;
  if ((st = rlk_check_tensor_of(x, what, AS_DTYPES, 2, 2))) return st;
  *B = x->shape[0];
  *T = x->shape[1];
  *dt = RLK_DTYPE_BIT(x->dtype);
  if ((st = rlk_seq_check_rows(x, what, 1, AS_DTYPES, *B, *T))) return st;
  return rlk_seq_check_rows(mask, "mask", 0, AS_MASK_DTYPES, *B, *T);
}

/* What the three calls share once checked: the algorithm, the configuration (its shape makes
 * algo=auto plan the one kernel it runs) and the kernel's tensors (x1, o1 may be absent). */
static rlk_status as_finish(rlk_op_call *call, rlk_scan_algo algo, const rlk_tensor *x0, const rlk_tensor *x1,
                            const rlk_tensor *mask, const rlk_tensor *o0, const rlk_tensor *o1) {
  rlk_status st = rlk_check_enum((int)algo, "algo", RLK_SCAN_AUTO, RLK_SCAN_ROW_BLOCK, "rlk_scan_algo");
  if (st) return st;
  as_args *k = &((as_call *)call)->k;
  const int64_t B = x0->shape[0], T = x0->shape[1];
  rlk_op_values_set(&call->vals, AS_S_DTYPE, x0->dtype);
  rlk_op_values_set(&call->vals, AS_S_ALGO, algo);
  rlk_op_values_set(&call->vals, AS_S_B, B);
  rlk_op_values_set(&call->vals, AS_S_T, T);
  k->x0 = rlk_seq_stream(x0, B, T, &k->s0);
  k->x1 = x1 ? x1->data : NULL;
  k->s1 = k->x1 ? rlk_seq_row_stride(x1, B, T) : 0;
  k->mask = rlk_seq_stream(mask, B, T, &k->ms);
  k->mask_kind = rlk_seq_mask_kind(mask);
  k->o0 = rlk_seq_stream(o0, B, T, &k->os0);
  k->o1 = o1 ? o1->data : NULL;
  k->os1 = k->o1 ? rlk_seq_row_stride(o1, B, T) : 0;
  k->B = B;
  k->T = T;
  return RLK_OK;
}

/* A discount factor (gamma, or gamma lambda): finite, and in f32 data one f32 holds (the kernels
 * scale in the data's precision). */
static rlk_status as_check_factor(double x, const char *what, uint32_t dt) {
  rlk_status st = rlk_check_finite(x, what);
  if (st) return st;
  if (dt != RLK_DTYPE_BIT(RLK_F64) && fabs(x) > (double)FLT_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %g is beyond f32's range, the data's", what, x);
  return RLK_OK;
}

static rlk_status as_gae_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  (void)ctx;
  const rlk_gae_args *a = args;
  rlk_status st;
  int64_t B, T;
  uint32_t dt;
  if ((st = as_check_input(&a->rewards, "rewards", &a->mask, &B, &T, &dt))) return st;
  if ((st = rlk_seq_check_rows(&a->values, "values", 1, dt, B, T))) return st;
  if ((st = rlk_seq_check_rows(&a->advantages, "advantages", 1, dt, B, T))) return st;
  if ((st = rlk_seq_check_rows(&a->returns, "returns", 0, dt, B, T))) return st;
  if ((st = as_check_factor(a->gamma, "gamma", dt)) || (st = as_check_factor(a->lambda, "lambda", dt)) ||
      (st = as_check_factor(a->gamma * a->lambda, "gamma * lambda", dt)))
    return st;
  if ((st = rlk_check_enum((int)a->masked, "masked", RLK_GAE_MASKED_SKIP, RLK_GAE_MASKED_ZERO, "rlk_gae_masked")))
    return st;
  as_args *k = &((as_call *)call)->k;
  k->gamma = a->gamma;
  k->gamma_lambda = a->gamma * a->lambda;
  k->masked = (int)a->masked;
  return as_finish(call, a->algo, &a->rewards, &a->values, &a->mask, &a->advantages, &a->returns);
}

static rlk_status as_returns_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  (void)ctx;
  const rlk_discounted_returns_args *a = args;
  rlk_status st;
  int64_t B, T;
  uint32_t dt;
  if ((st = as_check_input(&a->rewards, "rewards", &a->mask, &B, &T, &dt))) return st;
  if ((st = rlk_seq_check_rows(&a->returns, "returns", 1, dt, B, T))) return st;
  if ((st = as_check_factor(a->gamma, "gamma", dt))) return st;
  if ((st = rlk_check_enum((int)a->masked, "masked", RLK_RETURNS_MASKED_RESET,
                           RLK_RETURNS_MASKED_CARRY, "rlk_returns_masked")))
    return st;
  as_args *k = &((as_call *)call)->k;
  k->gamma = a->gamma;
  k->masked = (int)a->masked;
  return as_finish(call, a->algo, &a->rewards, NULL, &a->mask, &a->returns, NULL);
}

static rlk_status as_cumsum_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  (void)ctx;
  const rlk_reverse_cumsum_args *a = args;
  rlk_status st;
  int64_t B, T;
  uint32_t dt;
  if ((st = as_check_input(&a->values, "values", &a->mask, &B, &T, &dt))) return st;
  if ((st = rlk_seq_check_rows(&a->out, "out", 1, dt, B, T))) return st;
  if (!a->baseline.data != !a->advantages.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "baseline and advantages: give both or neither (baseline is %s, advantages %s)",
                     a->baseline.data ? "present" : "absent", a->advantages.data ? "present" : "absent");
  if (a->baseline.data) {
    if ((st = rlk_check_vector_of(&a->baseline, "baseline", dt, B, "B", 1, NULL))) return st;
    if ((st = rlk_seq_check_rows(&a->advantages, "advantages", 1, dt, B, T))) return st;
  }
  as_args *k = &((as_call *)call)->k;
  k->baseline = a->baseline.data;
  k->gamma = 1.0;
  k->masked = 1; /* zero: values * mask */
  return as_finish(call, a->algo, &a->values, NULL, &a->mask, &a->out, a->advantages.data ? &a->advantages : NULL);
}

static void as_launch_dims(const rlk_context *ctx, const rlk_op_call *call, size_t i, rlk_launch_dims *d) {
  const as_args *k = &((const as_call *)call)->k;
  as_dims(&ctx->target, (rlk_dtype)call->specs[i].values[0], (int)call->specs[i].values[2], k->B, k->T, d);
}

static const rlk_arg_field as_gae_fields[] = {
    RLK_ARG_IN(rlk_gae_args, rewards), RLK_ARG_IN(rlk_gae_args, values), RLK_ARG_IN(rlk_gae_args, mask),
    RLK_ARG_OUT(rlk_gae_args, advantages), RLK_ARG_OUT(rlk_gae_args, returns)};
static const rlk_arg_field as_returns_fields[] = {RLK_ARG_IN(rlk_discounted_returns_args, rewards),
                                                  RLK_ARG_IN(rlk_discounted_returns_args, mask),
                                                  RLK_ARG_OUT(rlk_discounted_returns_args, returns)};
static const rlk_arg_field as_cumsum_fields[] = {
    RLK_ARG_IN(rlk_reverse_cumsum_args, values), RLK_ARG_IN(rlk_reverse_cumsum_args, mask),
    RLK_ARG_IN(rlk_reverse_cumsum_args, baseline), RLK_ARG_OUT(rlk_reverse_cumsum_args, out),
    RLK_ARG_OUT(rlk_reverse_cumsum_args, advantages)};

static const rlk_op_entry as_gae_entry = {
    .name = "rlk_gae", .op = &rlk_op_gae, .call_size = sizeof(as_call), RLK_OP_FIELDS(as_gae_fields),
    .validate = as_gae_validate, .params_at = offsetof(as_call, k), .dims = as_launch_dims};

static const rlk_op_entry as_returns_entry = {
    .name = "rlk_discounted_returns", .op = &rlk_op_discounted_returns, .call_size = sizeof(as_call),
    RLK_OP_FIELDS(as_returns_fields), .validate = as_returns_validate, .params_at = offsetof(as_call, k), .dims = as_launch_dims};

static const rlk_op_entry as_cumsum_entry = {
    .name = "rlk_reverse_cumsum", .op = &rlk_op_reverse_cumsum, .call_size = sizeof(as_call),
    RLK_OP_FIELDS(as_cumsum_fields), .validate = as_cumsum_validate, .params_at = offsetof(as_call, k), .dims = as_launch_dims};

RLK_OP_DEFINE_CALL(rlk_gae, rlk_gae_args, as_gae_entry)

RLK_OP_DEFINE_CALL(rlk_discounted_returns, rlk_discounted_returns_args, as_returns_entry)

RLK_OP_DEFINE_CALL(rlk_reverse_cumsum, rlk_reverse_cumsum_args, as_cumsum_entry)

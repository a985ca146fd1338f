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
 * Algorithms (as_select, the one place that decides, for calls and rlk_precompile alike):
 *   warp   a warp per row, tiles of warp x K steps carried left; best for short rows, many rows
 *   block  a block per row, tiles of up to 1024 x K steps, block-wide scans; long rows, few rows
 * K = 32 bytes of each input per thread (8 f32, 4 f64). Auto picks block when a row is longer
 * than two warp tiles. The host runs a plain loop (warp) or the same chunked scan (block). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ops/advantage_scan.h"
#include "runtime/record.h"
#include "common/advantage_scan_params.h"

/* The kernel's argument (templates/common/advantage_scan_params.h). */
RLK_PARAMS_DECLARE(as_kernel_args, RLK_ADVANTAGE_SCAN_PARAMS, RLK_ADVANTAGE_SCAN_PARAMS_SIZE);

/* ---------------------------------------------------------------------------------- */
/* Shared checks (advantage_scan.h)                                                    */
/* ---------------------------------------------------------------------------------- */

const char *const rlk_seq_mask_names[] = {"none", "bool", "i32", "f32", NULL};

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

rlk_status rlk_seq_check_rows(const rlk_tensor *t, const char *what, int required, uint32_t dtypes,
                              int64_t B, int64_t T) {
  rlk_status st;
  if ((st = rlk_check_tensor(t, what, required))) return st;
  if (!t->data) return RLK_OK;
  if ((st = rlk_check_dtype(t, what, dtypes))) return st;
  if ((st = rlk_check_ndim(t, what, 2, 2))) return st;
  if (t->shape[0] != B || t->shape[1] != T)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape [%lld, %lld], expected [%lld, %lld]",
                     what, (long long)t->shape[0], (long long)t->shape[1], (long long)B,
                     (long long)T);
  if (T > 1 && t->strides[1] != 1)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: stride[1] = %lld, rows must be contiguous", what,
                     (long long)t->strides[1]);
  if ((st = rlk_check_row_stride(what, B, t->strides[0], T))) return st;
  return RLK_OK;
}

int64_t rlk_seq_row_stride(const rlk_tensor *t, int64_t B, int64_t T) {
  return B > 1 ? t->strides[0] : T;
}

/* ---------------------------------------------------------------------------------- */
/* The template                                                                        */
/* ---------------------------------------------------------------------------------- */

static const char *const as_family_names[] = {"gae", "returns", NULL};
static const char *const as_algo_names[] = {"warp", "block", NULL};

enum { AS_FAMILY_GAE = 0, AS_FAMILY_RETURNS = 1 };
enum { AS_ALGO_WARP = 0, AS_ALGO_BLOCK = 1 };

#define AS_N(a) (sizeof(a) / sizeof((a)[0]))
#define AS_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F64))
#define AS_MASK_DTYPES (RLK_DTYPE_BIT(RLK_BOOL) | RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_F32))
/* Threads of a row-per-block launch. The scan kernels hold 70-80 registers a thread in f32
 * (more in f64), so 1024-thread blocks would ask for more than an SM's 64K registers and fail
 * to launch; 512 leaves room for both. */
#define AS_MAX_BLOCK 512
#define AS_MAX_GRID (1u << 20)
#define AS_WARP_ROWS 4 /* rows (warps) per block in the warp algorithm */

static const rlk_param_decl as_params[] = {
    {"dtype", RLK_PARAM_DTYPE, 0, 0, 0, AS_DTYPES, NULL},
    {"family", RLK_PARAM_ENUM, 0, 1, 0, 0, as_family_names},
    {"algo", RLK_PARAM_ENUM, 0, 1, 0, 0, as_algo_names},
};

static const rlk_template as_tmpl = {"advantage_scan", "advantage_scan", "cuda/advantage_scan.cuh",
                                     "host/advantage_scan.c",
                                     sizeof as_params / sizeof as_params[0], as_params};

/* ---------------------------------------------------------------------------------- */
/* Variant selection (shared by calls and precompiling)                                */
/* ---------------------------------------------------------------------------------- */

typedef struct as_config {
  rlk_dtype dtype;    /* RLK_F32 / RLK_F64 */
  int family;         /* AS_FAMILY_* */
  rlk_scan_algo algo; /* what the caller asked for */
  int64_t B, T;       /* the shape; 0 where unknown (precompiling) */
} as_config;

typedef struct as_plan {
  rlk_kernel_spec spec;
  rlk_launch_dims dims; /* valid when the shape is known */
} as_plan;


/* The algorithm a configuration runs: forced, or by shape. The host's auto is the plain loop. */
static int as_algo_for(const rlk_target *t, const as_config *c) {
  const rlk_backend kind = t->kind;
  if (c->algo == RLK_SCAN_ROW_WARP) return AS_ALGO_WARP;
  if (c->algo == RLK_SCAN_ROW_BLOCK) return AS_ALGO_BLOCK;
  if (kind == RLK_BACKEND_HOST) return AS_ALGO_WARP;
  const int64_t K = 32 / (int64_t)rlk_dtype_size(c->dtype);
  return c->T > 2 * t->warp_size * K ? AS_ALGO_BLOCK : AS_ALGO_WARP;
}

/* The one place that turns a configuration into the kernel spec and, with a shape, its launch:
 *   warp   AS_WARP_ROWS warps per block, a row each;
 *   block  a row per block; the fewest tiles of at most 1024 x K steps that cover T, and the
 *          fewest whole warps that cover one tile (T = 4096 f32: 512 threads, one tile;
 *          T = 20480: 512 threads, five tiles). */
static rlk_status as_select(const rlk_target *t, const as_config *c, as_plan *p) {
  const rlk_backend kind = t->kind;
  memset(p, 0, sizeof *p);
  const int algo = as_algo_for(t, c);
  p->spec.tmpl = &as_tmpl;
  p->spec.values[0] = c->dtype;
  p->spec.values[1] = c->family;
  p->spec.values[2] = algo;
  rlk_launch_dims *d = &p->dims;
  d->grid[0] = d->grid[1] = d->grid[2] = 1;
  d->block[0] = d->block[1] = d->block[2] = 1;
  if (kind != RLK_BACKEND_HOST && c->B > 0 && c->T > 0) {
    const int64_t W = t->warp_size, K = 32 / (int64_t)rlk_dtype_size(c->dtype);
    int64_t block, grid;
    if (algo == AS_ALGO_WARP) {
      block = AS_WARP_ROWS * W;
      grid = (c->B + AS_WARP_ROWS - 1) / AS_WARP_ROWS;
    } else {
      const int64_t tiles = (c->T + AS_MAX_BLOCK * K - 1) / (AS_MAX_BLOCK * K);
      const int64_t per_tile = (c->T + tiles * K - 1) / (tiles * K); /* threads */
      block = (per_tile + W - 1) / W * W;
      if (block > AS_MAX_BLOCK) block = AS_MAX_BLOCK;
      grid = c->B;
    }
    d->block[0] = (unsigned)block;
    d->grid[0] = (unsigned)(grid < (int64_t)AS_MAX_GRID ? grid : (int64_t)AS_MAX_GRID);
  }
  return rlk_spec_validate(&p->spec);
}

/* ---------------------------------------------------------------------------------- */
/* Precompile plans: gae, discounted_returns, reverse_cumsum                           */
/* ---------------------------------------------------------------------------------- */

static const char *const as_algo_setting_names[] = {"auto", "warp", "block", NULL}; /* rlk_scan_algo order */
static const char *const as_gae_masked_names[] = {"skip", "zero", NULL};
static const char *const as_returns_masked_names[] = {"reset", "zero", "carry", NULL};

/* The settings every scan op takes, then the one run-time choice of each. */
enum { AS_S_DTYPE, AS_S_ALGO, AS_S_B, AS_S_T, AS_S_MASK, AS_S_EXTRA, AS_NSETTINGS };

#define AS_COMMON_SETTINGS                                                                                  \
  [AS_S_DTYPE] = RLK_SET_DTYPE("dtype", AS_DTYPES, RLK_F32, "advantage_scan.dtype", "of the values and outputs"), \
  [AS_S_ALGO] = RLK_SET_CHOICE("algo", as_algo_setting_names, RLK_SCAN_AUTO, "advantage_scan.algo",                \
                               "auto with B and T picks what a call of that shape runs, without them it builds "  \
                               "every algorithm auto can pick"),                                                  \
  [AS_S_B] = RLK_SET_INT("B", 0, 1, (int64_t)1 << 40, "advantage_scan.algo", "rows, a shape hint for algo=auto"), \
  [AS_S_T] = RLK_SET_INT("T", 0, 1, (int64_t)1 << 40, "advantage_scan.algo", "steps per row, a shape hint for algo=auto"), \
  [AS_S_MASK] = RLK_SET_CHOICE("mask", rlk_seq_mask_names, 1, "", "the mask's dtype")

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

static rlk_status as_plan_family(int family, const rlk_context *ctx, const rlk_op_values *s,
                                 rlk_kernel_spec *specs, size_t *nspecs) {
  as_config c = {(rlk_dtype)s->v[AS_S_DTYPE], family, (rlk_scan_algo)s->v[AS_S_ALGO], s->v[AS_S_B], s->v[AS_S_T]};
  /* auto without a whole shape: every algorithm auto may pick on this backend */
  const int both = c.algo == RLK_SCAN_AUTO && (c.B == 0 || c.T == 0) && ctx->kind != RLK_BACKEND_HOST;
  as_plan p;
  rlk_status st;
  if (both) {
    c.algo = RLK_SCAN_ROW_WARP;
    if ((st = as_select(&ctx->target, &c, &p))) return st;
    specs[0] = p.spec;
    c.algo = RLK_SCAN_ROW_BLOCK;
    if ((st = as_select(&ctx->target, &c, &p))) return st;
    specs[1] = p.spec;
    *nspecs = 2;
    return RLK_OK;
  }
  if ((st = as_select(&ctx->target, &c, &p))) return st;
  specs[0] = p.spec;
  *nspecs = 1;
  return RLK_OK;
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
static const char *const as_gae_samples[] = {"gae dtype=f32 algo=warp",
                                             "gae dtype=f64 algo=block masked=zero", NULL};
static const char *const as_returns_samples[] = {
    "discounted_returns dtype=f32 B=256 T=4096", "discounted_returns dtype=f64 B=256 T=64", NULL};
static const char *const as_cumsum_samples[] = {"reverse_cumsum dtype=f32 algo=block baseline=1",
                                                "reverse_cumsum dtype=f64 algo=warp", NULL};

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
  if (!args) return;
  memset(args, 0, sizeof *args);
  args->gamma = 1.0;
  args->lambda = 1.0;
  args->masked = RLK_GAE_MASKED_SKIP;
  args->algo = RLK_SCAN_AUTO;
}

RLK_API void rlk_discounted_returns_args_init(rlk_discounted_returns_args *args) {
  if (!args) return;
  memset(args, 0, sizeof *args);
  args->gamma = 1.0;
  args->masked = RLK_RETURNS_MASKED_RESET;
  args->algo = RLK_SCAN_AUTO;
}

RLK_API void rlk_reverse_cumsum_args_init(rlk_reverse_cumsum_args *args) {
  if (!args) return;
  memset(args, 0, sizeof *args);
  args->algo = RLK_SCAN_AUTO;
}

/* One validated scan call. */
typedef struct as_call {
  int family;
  const rlk_tensor *x0, *x1, *mask, *o0, *o1, *baseline; /* x1, o1, baseline may be absent */
  double gamma, gamma_lambda;
  int masked;
  rlk_scan_algo algo;
  int64_t B, T;
} as_call;

static rlk_status as_check_scalar(const char *what, double v) {
  if (!isfinite(v)) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %g is not finite", what, v);
  return RLK_OK;
}

static rlk_status as_check_algo(rlk_scan_algo algo) {
  if ((int)algo < RLK_SCAN_AUTO || (int)algo > RLK_SCAN_ROW_BLOCK)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "algo: %d is not an rlk_scan_algo", (int)algo);
  return RLK_OK;
}

/* The shape from the first input, the first input's dtype for everything else, the mask. */
static rlk_status as_check_input(const rlk_tensor *x, const char *what, int64_t *B, int64_t *T) {
  rlk_status st;
  if ((st = rlk_check_tensor(x, what, 1))) return st;
  if ((st = rlk_check_dtype(x, what, AS_DTYPES))) return st;
  if ((st = rlk_check_ndim(x, what, 2, 2))) return st;
  *B = x->shape[0];
  *T = x->shape[1];
  return rlk_seq_check_rows(x, what, 1, AS_DTYPES, *B, *T);
}

/* RLK_JIT_RECORD: the line of a call (its shape makes algo=auto plan the one kernel it ran). */
static void as_record(const char *op, const as_call *k) {
  const rlk_op_desc *d = !strcmp(op, "rlk_gae")                  ? &rlk_op_gae
                         : !strcmp(op, "rlk_discounted_returns") ? &rlk_op_discounted_returns
                                                                 : &rlk_op_reverse_cumsum;
  rlk_op_values s;
  rlk_op_values_init(d, &s);
  rlk_op_values_set(&s, AS_S_DTYPE, k->x0->dtype);
  rlk_op_values_set(&s, AS_S_ALGO, k->algo);
  rlk_op_values_set(&s, AS_S_B, k->B);
  rlk_op_values_set(&s, AS_S_T, k->T);
  rlk_record_op(d, &s);
}

static rlk_status as_launch(rlk_context *ctx, const as_call *k, void *stream, const char *op) {
  rlk_status st = rlk_context_require_device(ctx, op);
  if (st) return st;
  as_config c = {k->x0->dtype, k->family, k->algo, k->B, k->T};
  as_plan p;
  if ((st = as_select(&ctx->target, &c, &p))) return st;
  if (rlk_record_enabled()) as_record(op, k);
  const int64_t B = k->B, T = k->T;
  as_kernel_args a;
  memset(&a, 0, sizeof a);
  a.x0 = k->x0->data;
  a.s0 = rlk_seq_row_stride(k->x0, B, T);
  a.x1 = k->x1 && k->x1->data ? k->x1->data : NULL;
  a.s1 = a.x1 ? rlk_seq_row_stride(k->x1, B, T) : 0;
  a.mask = k->mask->data;
  a.ms = a.mask ? rlk_seq_row_stride(k->mask, B, T) : T;
  a.mask_kind = rlk_seq_mask_kind(k->mask);
  a.o0 = k->o0->data;
  a.os0 = rlk_seq_row_stride(k->o0, B, T);
  a.o1 = k->o1 && k->o1->data ? k->o1->data : NULL;
  a.os1 = a.o1 ? rlk_seq_row_stride(k->o1, B, T) : 0;
  a.baseline = k->baseline && k->baseline->data ? k->baseline->data : NULL;
  a.B = B;
  a.T = T;
  a.gamma = k->gamma;
  a.gamma_lambda = k->gamma_lambda;
  a.masked = k->masked;
  void *kargs[] = {&a};
  return rlk_context_launch(ctx, &p.spec, &p.dims, stream, kargs);
}

RLK_API rlk_status rlk_gae(rlk_context *ctx, const rlk_gae_args *a, void *stream) {
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_gae: ctx is NULL");
  if (!a) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_gae: args is NULL");
  as_call k;
  memset(&k, 0, sizeof k);
  rlk_status st;
  int64_t B, T;
  if ((st = as_check_input(&a->rewards, "rewards", &B, &T))) return st;
  const uint32_t dt = RLK_DTYPE_BIT(a->rewards.dtype);
  if ((st = rlk_seq_check_rows(&a->values, "values", 1, dt, B, T))) return st;
  if ((st = rlk_seq_check_rows(&a->mask, "mask", 0, AS_MASK_DTYPES, B, T))) return st;
  if ((st = rlk_seq_check_rows(&a->advantages, "advantages", 1, dt, B, T))) return st;
  if ((st = rlk_seq_check_rows(&a->returns, "returns", 0, dt, B, T))) return st;
  if ((st = as_check_scalar("gamma", a->gamma)) || (st = as_check_scalar("lambda", a->lambda)))
    return st;
  if ((int)a->masked < RLK_GAE_MASKED_SKIP || (int)a->masked > RLK_GAE_MASKED_ZERO)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "masked: %d is not an rlk_gae_masked", (int)a->masked);
  if ((st = as_check_algo(a->algo))) return st;
  static const rlk_arg_field fields[] = {
      RLK_ARG_IN(rlk_gae_args, rewards), RLK_ARG_IN(rlk_gae_args, values), RLK_ARG_IN(rlk_gae_args, mask),
      RLK_ARG_OUT(rlk_gae_args, advantages), RLK_ARG_OUT(rlk_gae_args, returns)};
  if ((st = rlk_check_arg_fields(fields, AS_N(fields), a, NULL, 0))) return st;
  k.family = AS_FAMILY_GAE;
  k.x0 = &a->rewards;
  k.x1 = &a->values;
  k.mask = &a->mask;
  k.o0 = &a->advantages;
  k.o1 = &a->returns;
  k.gamma = a->gamma;
  k.gamma_lambda = a->gamma * a->lambda;
  k.masked = (int)a->masked;
  k.algo = a->algo;
  k.B = B;
  k.T = T;
  return as_launch(ctx, &k, stream, "rlk_gae");
}

RLK_API rlk_status rlk_discounted_returns(rlk_context *ctx, const rlk_discounted_returns_args *a,
                                          void *stream) {
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_discounted_returns: ctx is NULL");
  if (!a) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_discounted_returns: args is NULL");
  as_call k;
  memset(&k, 0, sizeof k);
  rlk_status st;
  int64_t B, T;
  if ((st = as_check_input(&a->rewards, "rewards", &B, &T))) return st;
  const uint32_t dt = RLK_DTYPE_BIT(a->rewards.dtype);
  if ((st = rlk_seq_check_rows(&a->mask, "mask", 0, AS_MASK_DTYPES, B, T))) return st;
  if ((st = rlk_seq_check_rows(&a->returns, "returns", 1, dt, B, T))) return st;
  if ((st = as_check_scalar("gamma", a->gamma))) return st;
  if ((int)a->masked < RLK_RETURNS_MASKED_RESET || (int)a->masked > RLK_RETURNS_MASKED_CARRY)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "masked: %d is not an rlk_returns_masked",
                     (int)a->masked);
  if ((st = as_check_algo(a->algo))) return st;
  static const rlk_arg_field fields[] = {RLK_ARG_IN(rlk_discounted_returns_args, rewards),
                                         RLK_ARG_IN(rlk_discounted_returns_args, mask),
                                         RLK_ARG_OUT(rlk_discounted_returns_args, returns)};
  if ((st = rlk_check_arg_fields(fields, AS_N(fields), a, NULL, 0))) return st;
  static const rlk_tensor absent;
  k.family = AS_FAMILY_RETURNS;
  k.x0 = &a->rewards;
  k.x1 = &absent;
  k.mask = &a->mask;
  k.o0 = &a->returns;
  k.o1 = &absent;
  k.baseline = &absent;
  k.gamma = a->gamma;
  k.masked = (int)a->masked;
  k.algo = a->algo;
  k.B = B;
  k.T = T;
  return as_launch(ctx, &k, stream, "rlk_discounted_returns");
}

RLK_API rlk_status rlk_reverse_cumsum(rlk_context *ctx, const rlk_reverse_cumsum_args *a,
                                      void *stream) {
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_reverse_cumsum: ctx is NULL");
  if (!a) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_reverse_cumsum: args is NULL");
  as_call k;
  memset(&k, 0, sizeof k);
  rlk_status st;
  int64_t B, T;
  if ((st = as_check_input(&a->values, "values", &B, &T))) return st;
  const rlk_dtype dtype = a->values.dtype;
  const uint32_t dt = RLK_DTYPE_BIT(dtype);
  if ((st = rlk_seq_check_rows(&a->mask, "mask", 0, AS_MASK_DTYPES, B, T))) return st;
  if ((st = rlk_seq_check_rows(&a->out, "out", 1, dt, B, T))) return st;
  if (!a->baseline.data != !a->advantages.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "baseline and advantages: give both or neither (baseline is %s, advantages %s)",
                     a->baseline.data ? "present" : "absent", a->advantages.data ? "present" : "absent");
  if (a->baseline.data) {
    const rlk_tensor *bl = &a->baseline;
    if ((st = rlk_check_tensor(bl, "baseline", 1)) || (st = rlk_check_dtype(bl, "baseline", dt)) ||
        (st = rlk_check_ndim(bl, "baseline", 1, 1)) || (st = rlk_check_contiguous(bl, "baseline")))
      return st;
    if (bl->shape[0] != B)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "baseline: shape [%lld], expected [%lld] (B)",
                       (long long)bl->shape[0], (long long)B);
    if ((st = rlk_seq_check_rows(&a->advantages, "advantages", 1, dt, B, T))) return st;
  }
  if ((st = as_check_algo(a->algo))) return st;
  static const rlk_arg_field fields[] = {
      RLK_ARG_IN(rlk_reverse_cumsum_args, values), RLK_ARG_IN(rlk_reverse_cumsum_args, mask),
      RLK_ARG_IN(rlk_reverse_cumsum_args, baseline), RLK_ARG_OUT(rlk_reverse_cumsum_args, out),
      RLK_ARG_OUT(rlk_reverse_cumsum_args, advantages)};
  if ((st = rlk_check_arg_fields(fields, AS_N(fields), a, NULL, 0))) return st;
  static const rlk_tensor absent;
  k.family = AS_FAMILY_RETURNS;
  k.x0 = &a->values;
  k.x1 = &absent;
  k.mask = &a->mask;
  k.o0 = &a->out;
  k.o1 = &a->advantages;
  k.baseline = &a->baseline;
  k.gamma = 1.0;
  k.masked = 1; /* zero: values * mask */
  k.algo = a->algo;
  k.B = B;
  k.T = T;
  return as_launch(ctx, &k, stream, "rlk_reverse_cumsum");
}

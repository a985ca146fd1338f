/* group_advantage.c - GRPO-family group advantages: validation, variant selection, launches.
 *
 * A call launches up to three kernels (templates/cuda/group_advantage.cuh, templates/host/):
 *   1. rowsum     only for [B, T] scores: per-row sums under the mask in the scores' type,
 *                 written into the advantages output (f32) or the caller's workspace (f64),
 *                 which the next kernel then reads;
 *   2. group      per-group statistics and the advantages: always;
 *   3. broadcast  only when token_advantages is given.
 * Per-sequence scores with no broadcast are one launch.
 *
 * Numerics: group statistics are two-pass (mean, then the mean squared deviation) in the
 * precision of the scores: f64 scores (1-D, or [B, T] rewards whose row sums stay f64) give
 * f64 statistics, f32 scores f32 ones. Reductions have a fixed
 * order: results are bitwise reproducible on one device for one shape.
 *
 * Group offsets: on the host backend they are checked in full before the launch. On a GPU they
 * are device memory, and reading them would synchronize the stream, so only their shape is
 * checked; the kernel clamps every offset into [0, B], so bad offsets cannot make it access
 * memory out of bounds (members no group covers are then left unwritten).
 *
 * The variant selection (ga_select) is the single function both a real call and rlk_precompile
 * (the op's `plan`) go through, so precompiling a configuration builds exactly what the call
 * will look up. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ops/ops.h"
#include "runtime/record.h"
#include "common/group_advantage_params.h"

/* The kernels' arguments (templates/common/group_advantage_params.h). */
RLK_PARAMS_DECLARE(ga_rowsum_args, RLK_GA_ROWSUM_PARAMS, RLK_GA_ROWSUM_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ga_group_args, RLK_GA_GROUP_PARAMS, RLK_GA_GROUP_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ga_broadcast_args, RLK_GA_BROADCAST_PARAMS, RLK_GA_BROADCAST_PARAMS_SIZE);

/* ---------------------------------------------------------------------------------- */
/* Templates                                                                           */
/* ---------------------------------------------------------------------------------- */

/* Choice names: the index of each is the enum value the templates see. */
static const char *const ga_mode_names[] = {"grpo", "mean-only", "rloo", "batch-std", "opo", "passk", "passk-unscaled", NULL};
static const char *const ga_singleton_names[] = {"mean0-std1", "zero", NULL};
static const char *const ga_mask_names[] = {"none", "bool", "i32", "f32", NULL};
static const char *const ga_offsets_names[] = {"fixed", "i32", "i64", NULL};

enum { GA_MASK_NONE = 0, GA_MASK_BOOL = 1, GA_MASK_I32 = 2, GA_MASK_F32 = 3 };
enum { GA_OFFSETS_FIXED = 0, GA_OFFSETS_I32 = 1, GA_OFFSETS_I64 = 2 };

/* Fixed group sizes up to this are baked into the kernel (unrolled, constant bounds); larger
 * ones are passed at run time so one kernel serves them all. */
#define GA_MAX_BAKED_GROUP 1024
/* Threads that share one large group (a block). */
#define GA_MAX_SEG 256

#define GA_SCORE_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F64))

static const rlk_param_decl ga_rowsum_params[] = {
    {"scores", RLK_PARAM_DTYPE, 0, 0, 0, GA_SCORE_DTYPES, NULL},
    {"mask", RLK_PARAM_ENUM, 0, 3, 0, 0, ga_mask_names},
};

static const rlk_param_decl ga_group_params[] = {
    {"scores", RLK_PARAM_DTYPE, 0, 0, 0, GA_SCORE_DTYPES, NULL},
    {"mode", RLK_PARAM_ENUM, 0, 6, 0, 0, ga_mode_names},
    {"group", RLK_PARAM_INT, 0, GA_MAX_BAKED_GROUP, 0, 0, NULL}, /* 0: at run time */
    {"seg", RLK_PARAM_INT, 1, 1024, 1, 0, NULL},                  /* threads per group */
    {"offsets", RLK_PARAM_ENUM, 0, 2, 0, 0, ga_offsets_names},
};

static const rlk_param_decl ga_broadcast_params[] = {
    {"mask", RLK_PARAM_ENUM, 0, 3, 0, 0, ga_mask_names},
};

static const rlk_template ga_rowsum_tmpl = {
    "group_advantage", "group_advantage_rowsum", "cuda/group_advantage.cuh",
    "host/group_advantage_rowsum.c", sizeof ga_rowsum_params / sizeof ga_rowsum_params[0],
    ga_rowsum_params};

static const rlk_template ga_group_tmpl = {
    "group_advantage", "group_advantage_group", "cuda/group_advantage.cuh",
    "host/group_advantage_group.c", sizeof ga_group_params / sizeof ga_group_params[0],
    ga_group_params};

static const rlk_template ga_broadcast_tmpl = {
    "group_advantage", "group_advantage_broadcast", "cuda/group_advantage.cuh",
    "host/group_advantage_broadcast.c", sizeof ga_broadcast_params / sizeof ga_broadcast_params[0],
    ga_broadcast_params};

/* ---------------------------------------------------------------------------------- */
/* Variant selection (shared by calls and precompiling)                                */
/* ---------------------------------------------------------------------------------- */

/* What selects the kernels: everything about a call except sizes and pointers. */
typedef struct ga_config {
  int mode;           /* rlk_advantage_mode */
  int64_t group_size; /* > 0 fixed, 0 with offsets */
  rlk_dtype offsets;  /* RLK_I32 / RLK_I64 when group_size == 0 */
  rlk_dtype scores;   /* RLK_F32 / RLK_F64 */
  int scores_2d;
  int mask; /* GA_MASK_* */
  int unbiased;
  int singleton; /* rlk_singleton_policy */
  int broadcast;
} ga_config;

/* The kernels of one call, in launch order. */
typedef struct ga_plan {
  rlk_kernel_spec rowsum, group, broadcast;
  int has_rowsum, has_broadcast;
  int seg; /* threads per group in the group kernel */
} ga_plan;


static int64_t ga_next_pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

static int ga_mask_kind(rlk_dtype d) {
  switch (d) {
  case RLK_BOOL:
    return GA_MASK_BOOL;
  case RLK_I32:
    return GA_MASK_I32;
  case RLK_F32:
    return GA_MASK_F32;
  default:
    return GA_MASK_NONE;
  }
}

/* The one place that turns a configuration into kernel specs for a backend.
 *   fixed G <= 1024 is baked in (host and GPU alike); larger G and offsets are run-time values;
 *   GPU threads per group: the next power of two of G up to a warp (several groups per warp),
 *   else up to 256 threads of a block; uneven groups take a warp each; the host uses 1. */
static rlk_status ga_select(const rlk_target *t, const ga_config *c, ga_plan *p) {
  const rlk_backend kind = t->kind;
  memset(p, 0, sizeof *p);
  const int host = kind == RLK_BACKEND_HOST;
  const int warp = t->warp_size;
  int64_t baked = 0, seg;
  if (c->group_size > 0) {
    baked = c->group_size <= GA_MAX_BAKED_GROUP ? c->group_size : 0;
    if (host)
      seg = 1;
    else if (c->group_size <= warp)
      seg = ga_next_pow2(c->group_size);
    else
      seg = c->group_size >= GA_MAX_SEG ? GA_MAX_SEG : ga_next_pow2(c->group_size);
  } else {
    seg = host ? 1 : warp;
  }
  int offsets = GA_OFFSETS_FIXED;
  if (c->group_size == 0) offsets = c->offsets == RLK_I32 ? GA_OFFSETS_I32 : GA_OFFSETS_I64;

  if (c->scores_2d) {
    p->has_rowsum = 1;
    p->rowsum.tmpl = &ga_rowsum_tmpl;
    p->rowsum.values[0] = c->scores;
    p->rowsum.values[1] = c->mask;
  }
  p->group.tmpl = &ga_group_tmpl;
  p->group.values[0] = c->scores; /* the row sums keep the scores' type */
  p->group.values[1] = c->mode;
  p->group.values[2] = baked;
  p->group.values[3] = seg;
  p->group.values[4] = offsets;
  p->seg = (int)seg;
  if (c->broadcast) {
    p->has_broadcast = 1;
    p->broadcast.tmpl = &ga_broadcast_tmpl;
    p->broadcast.values[0] = c->mask;
  }
  rlk_status st = p->has_rowsum ? rlk_spec_validate(&p->rowsum) : RLK_OK;
  if (!st) st = rlk_spec_validate(&p->group);
  if (!st && p->has_broadcast) st = rlk_spec_validate(&p->broadcast);
  return st;
}

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

enum {
  GA_S_MODE, GA_S_GROUP_SIZE, GA_S_OFFSETS, GA_S_SCORES, GA_S_SCORES_2D, GA_S_MASK, GA_S_UNBIASED, GA_S_SINGLETON,
  GA_S_BROADCAST, GA_NSETTINGS
};

static const rlk_op_setting ga_settings[GA_NSETTINGS] = {
    [GA_S_MODE] = RLK_SET_CHOICE("mode", ga_mode_names, RLK_ADV_GRPO, "group_advantage_group.mode", "the advantage"),
    [GA_S_GROUP_SIZE] = RLK_SET_INT("group_size", 16, 0, (int64_t)1 << 40, "group_advantage_group.group",
                                    "fixed group size, or 0 for uneven groups given by group_offsets"),
    [GA_S_OFFSETS] = RLK_SET_DTYPE("offsets", RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64), RLK_I64,
                                   "group_advantage_group.offsets",
                                   "the group_offsets dtype; implies group_size=0"),
    [GA_S_SCORES] = RLK_SET_DTYPE("scores", GA_SCORE_DTYPES, RLK_F32, "group_advantage_rowsum.scores",
                                  "the scores' dtype"),
    [GA_S_SCORES_2D] = RLK_SET_FLAG("scores_2d", 0, "group_advantage_rowsum",
                                    "scores are [B, T] token rewards summed per row under the mask"),
    [GA_S_MASK] = RLK_SET_CHOICE("mask", ga_mask_names, GA_MASK_NONE, "group_advantage_rowsum.mask",
                                 "the [B, T] mask's dtype; needs scores_2d=1 or broadcast=1"),
    [GA_S_UNBIASED] = RLK_SET_FLAG("unbiased", 1, "", "std with N - 1"),
    [GA_S_SINGLETON] = RLK_SET_CHOICE("singleton", ga_singleton_names, RLK_SINGLETON_MEAN0_STD1, "",
                                      "what a one-member group gets"),
    [GA_S_BROADCAST] = RLK_SET_FLAG("broadcast", 0, "group_advantage_broadcast",
                                    "also write token_advantages [B, T]"),
};

static rlk_status ga_plan_config(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs,
                                 size_t *nspecs) {
  ga_config c = {(int)s->v[GA_S_MODE],     s->v[GA_S_GROUP_SIZE],      (rlk_dtype)s->v[GA_S_OFFSETS],
                 (rlk_dtype)s->v[GA_S_SCORES], (int)s->v[GA_S_SCORES_2D], (int)s->v[GA_S_MASK],
                 (int)s->v[GA_S_UNBIASED], (int)s->v[GA_S_SINGLETON], (int)s->v[GA_S_BROADCAST]};
  const int have_offsets = RLK_OP_GIVEN(s, GA_S_OFFSETS);
  if (have_offsets && !RLK_OP_GIVEN(s, GA_S_GROUP_SIZE)) c.group_size = 0;
  if (have_offsets && c.group_size > 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "offsets: only with group_size=0 (groups are either fixed or by offsets)");
  if (c.mask != GA_MASK_NONE && !c.scores_2d && !c.broadcast)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "mask: needs scores_2d=1 or broadcast=1");

  ga_plan p;
  rlk_status st = ga_select(&ctx->target, &c, &p);
  if (st) return st;
  size_t n = 0;
  if (p.has_rowsum) specs[n++] = p.rowsum;
  specs[n++] = p.group;
  if (p.has_broadcast) specs[n++] = p.broadcast;
  *nspecs = n;
  return RLK_OK;
}

static const char *const ga_samples[] = {
    /* the common shape: a lane segment per group, G baked; row sums and a broadcast, no mask */
    "group_advantage mode=grpo group_size=16 scores_2d=1 broadcast=1",
    /* per-sequence f64 scores; G beyond a CUDA warp (a block per group there) */
    "group_advantage mode=mean-only group_size=64 scores=f64",
    /* uneven groups (both offset dtypes), f32 and f64, 1-D and 2-D */
    "group_advantage mode=rloo offsets=i32 scores_2d=1 mask=f32 broadcast=1",
    "group_advantage mode=batch-std offsets=i64 scores=f64",
    /* f64 token rewards under a bool mask */
    "group_advantage mode=grpo group_size=16 scores=f64 scores_2d=1 mask=bool broadcast=1",
    /* a run-time G (> 1024): a block per group, batch statistics */
    "group_advantage mode=batch-std group_size=2048 scores_2d=1 mask=i32 broadcast=1",
    /* length-weighted baselines; pass@k (its max reductions in a lane segment and in a block) */
    "group_advantage mode=opo group_size=8 scores_2d=1 mask=bool broadcast=1",
    "group_advantage mode=passk group_size=64 scores=f64",
    "group_advantage mode=passk-unscaled offsets=i64",
    NULL};

const rlk_op_desc rlk_op_group_advantage = {
    .name = "group_advantage",
    .settings = ga_settings,
    .nsettings = GA_NSETTINGS,
    .plan = ga_plan_config,
    .samples = ga_samples,
};

/* ---------------------------------------------------------------------------------- */
/* The call                                                                            */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_group_advantage_args_init(rlk_group_advantage_args *args) {
  if (!args) return;
  memset(args, 0, sizeof *args);
  args->group_size = 0;
  args->mode = RLK_ADV_GRPO;
  args->eps = 1e-6f;
  args->unbiased = 1;
  args->singleton = RLK_SINGLETON_MEAN0_STD1;
}

/* Sizes and pointers of a validated call. */
typedef struct ga_call {
  int64_t B, T, num_groups;
} ga_call;

static rlk_status ga_validate(const rlk_context *ctx, const rlk_group_advantage_args *a,
                              ga_config *c, ga_call *k) {
  memset(c, 0, sizeof *c);
  memset(k, 0, sizeof *k);
  rlk_status st;
  /* scores */
  if ((st = rlk_check_tensor(&a->scores, "scores", 1))) return st;
  if ((st = rlk_check_dtype(&a->scores, "scores", GA_SCORE_DTYPES))) return st;
  if ((st = rlk_check_ndim(&a->scores, "scores", 1, 2))) return st;
  const int64_t B = a->scores.shape[0];
  int64_t T = 0;
  c->scores = a->scores.dtype;
  c->scores_2d = a->scores.ndim == 2;
  if (c->scores_2d) {
    T = a->scores.shape[1];
    if ((st = rlk_check_rows(&a->scores, "scores", B, T))) return st;
  }

  /* mode, eps, policies */
  if ((int)a->mode < RLK_ADV_GRPO || (int)a->mode > RLK_ADV_PASSK_UNSCALED)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "mode: %d is not an rlk_advantage_mode",
                     (int)a->mode);
  if ((int)a->nan_scores < RLK_NAN_SCORES_PROPAGATE || (int)a->nan_scores > RLK_NAN_SCORES_UNSCORABLE)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "nan_scores: %d is not an rlk_nan_scores",
                     (int)a->nan_scores);
  if (a->mode == RLK_ADV_OPO) {
    if (!a->weights.data)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "weights: required by mode opo (each member's weight)");
    if ((st = rlk_check_vector(&a->weights, "weights", RLK_DTYPE_BIT(a->scores.dtype), B, 0, NULL)))
      return st;
  } else if (a->weights.data) {
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "weights: given, but only mode opo reads them");
  }
  if ((int)a->singleton < RLK_SINGLETON_MEAN0_STD1 || (int)a->singleton > RLK_SINGLETON_ZERO)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "singleton: %d is not an rlk_singleton_policy",
                     (int)a->singleton);
  if (!(a->eps >= 0.0f) || isinf(a->eps))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "eps: %g must be finite and >= 0", (double)a->eps);
  c->mode = (int)a->mode;
  c->singleton = (int)a->singleton;
  c->unbiased = a->unbiased != 0;

  /* groups */
  c->group_size = a->group_size;
  rlk_dtype offsets;
  if ((st = rlk_check_groups(a->group_size, &a->group_offsets, B, ctx->kind == RLK_BACKEND_HOST,
                             &k->num_groups, &offsets)))
    return st;
  if (offsets != RLK_DTYPE_INVALID) c->offsets = offsets;

  /* advantages */
  if ((st = rlk_check_tensor(&a->advantages, "advantages", 1))) return st;
  if ((st = rlk_check_dtype(&a->advantages, "advantages", RLK_DTYPE_BIT(RLK_F32)))) return st;
  if ((st = rlk_check_ndim(&a->advantages, "advantages", 1, 1))) return st;
  if (a->advantages.shape[0] != B)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "advantages: shape [%lld], expected [%lld] (B)",
                     (long long)a->advantages.shape[0], (long long)B);
  if ((st = rlk_check_contiguous(&a->advantages, "advantages"))) return st;

  /* token_advantages and mask */
  const int has_mask = a->mask.data != NULL, has_tok = a->token_advantages.data != NULL;
  if (has_tok) {
    const rlk_tensor *t = &a->token_advantages;
    if ((st = rlk_check_tensor(t, "token_advantages", 1))) return st;
    if ((st = rlk_check_dtype(t, "token_advantages", RLK_DTYPE_BIT(RLK_F32)))) return st;
    if ((st = rlk_check_ndim(t, "token_advantages", 2, 2))) return st;
    if (c->scores_2d && t->shape[1] != T)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "token_advantages: %lld columns, but scores has T = %lld",
                       (long long)t->shape[1], (long long)T);
    if (!c->scores_2d) T = t->shape[1];
    if ((st = rlk_check_rows(t, "token_advantages", B, T))) return st;
    c->broadcast = 1;
  }
  if (has_mask) {
    if (!c->scores_2d && !has_tok)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "mask: given, but scores are 1-D and token_advantages is absent");
    if ((st = rlk_check_tensor(&a->mask, "mask", 1))) return st;
    if ((st = rlk_check_dtype(&a->mask, "mask",
                              RLK_DTYPE_BIT(RLK_BOOL) | RLK_DTYPE_BIT(RLK_I32) |
                                  RLK_DTYPE_BIT(RLK_F32))))
      return st;
    if ((st = rlk_check_rows(&a->mask, "mask", B, T))) return st;
    c->mask = ga_mask_kind(a->mask.dtype);
  }
  k->B = B;
  k->T = T;
  return RLK_OK;
}

static unsigned ga_min_u(int64_t a, int64_t b) { return (unsigned)(a < b ? a : b); }

static rlk_launch_dims ga_dims(unsigned gx, unsigned gy, unsigned block) {
  rlk_launch_dims d;
  memset(&d, 0, sizeof d);
  d.grid[0] = gx ? gx : 1;
  d.grid[1] = gy ? gy : 1;
  d.grid[2] = 1;
  d.block[0] = block;
  d.block[1] = 1;
  d.block[2] = 1;
  return d;
}

/* f64 [B, T] scores keep their row sums in f64: B doubles of scratch. */
static size_t ga_workspace_bytes(const ga_config *c, const ga_call *k) {
  return c->scores_2d && c->scores == RLK_F64 ? (size_t)k->B * sizeof(double) : 0;
}

RLK_API rlk_status rlk_group_advantage_workspace_size(rlk_context *ctx,
                                                      const rlk_group_advantage_args *args,
                                                      size_t *bytes) {
  if (bytes) *bytes = 0;
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_group_advantage_workspace_size: ctx is NULL");
  if (!args)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_group_advantage_workspace_size: args is NULL");
  if (!bytes)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_group_advantage_workspace_size: bytes is NULL");
  ga_config c;
  ga_call k;
  rlk_status st = ga_validate(ctx, args, &c, &k);
  if (!st) *bytes = ga_workspace_bytes(&c, &k);
  return st;
}

/* RLK_JIT_RECORD: the line of a call's configuration. */
static void ga_record(const ga_config *c) {
  rlk_op_values s;
  rlk_op_values_init(&rlk_op_group_advantage, &s);
  rlk_op_values_set(&s, GA_S_MODE, c->mode);
  rlk_op_values_set(&s, GA_S_GROUP_SIZE, c->group_size);
  if (c->group_size == 0) rlk_op_values_set(&s, GA_S_OFFSETS, c->offsets);
  rlk_op_values_set(&s, GA_S_SCORES, c->scores);
  rlk_op_values_set(&s, GA_S_SCORES_2D, c->scores_2d);
  rlk_op_values_set(&s, GA_S_MASK, c->mask);
  rlk_op_values_set(&s, GA_S_UNBIASED, c->unbiased);
  rlk_op_values_set(&s, GA_S_SINGLETON, c->singleton);
  rlk_op_values_set(&s, GA_S_BROADCAST, c->broadcast);
  rlk_record_op(&rlk_op_group_advantage, &s);
}

RLK_API rlk_status rlk_group_advantage(rlk_context *ctx, const rlk_group_advantage_args *args,
                                       void *stream) {
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_group_advantage: ctx is NULL");
  if (!args) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_group_advantage: args is NULL");
  ga_config c;
  ga_call k;
  rlk_status st = ga_validate(ctx, args, &c, &k);
  if (st) return st;
  const size_t ws_need = ga_workspace_bytes(&c, &k);
  if (ws_need) {
    if (!args->workspace)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "workspace: NULL, f64 [B, T] scores need %zu bytes "
                       "(rlk_group_advantage_workspace_size)", ws_need);
    if (args->workspace_bytes < ws_need)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "workspace: %zu bytes, f64 [B, T] scores need %zu "
                       "(rlk_group_advantage_workspace_size)", args->workspace_bytes, ws_need);
    if ((uintptr_t)args->workspace % 8 != 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "workspace: not 8-byte aligned");
  }
  static const rlk_arg_field fields[] = {
      RLK_ARG_IN(rlk_group_advantage_args, scores),           RLK_ARG_IN(rlk_group_advantage_args, group_offsets),
      RLK_ARG_IN(rlk_group_advantage_args, mask),             RLK_ARG_IN(rlk_group_advantage_args, weights),
      RLK_ARG_INPLACE(rlk_group_advantage_args, advantages, "scores"),
      RLK_ARG_OUT(rlk_group_advantage_args, token_advantages)};
  if ((st = rlk_check_arg_fields(fields, sizeof fields / sizeof fields[0], args, args->workspace, ws_need ? args->workspace_bytes : 0)))
    return st;
  if ((st = rlk_context_require_device(ctx, "rlk_group_advantage"))) return st;
  ga_plan p;
  if ((st = ga_select(&ctx->target, &c, &p))) return st;
  if (rlk_record_enabled()) ga_record(&c);

  const int host = ctx->kind == RLK_BACKEND_HOST;
  const int warp = ctx->target.warp_size;
  const int64_t B = k.B, T = k.T;
  float *adv = (float *)args->advantages.data;
  /* where the row sums go: f32 into the advantages (read in place), f64 into the workspace */
  void *sums = c.scores == RLK_F64 ? args->workspace : (void *)adv;

  /* 1. row sums: a block per row, wider for long rows */
  if (p.has_rowsum) {
    ga_rowsum_args a = {0};
    a.rewards = args->scores.data;
    a.mask = args->mask.data;
    a.reward_stride = B > 1 ? args->scores.strides[0] : T;
    a.mask_stride = a.mask && B > 1 ? args->mask.strides[0] : T;
    a.out = sums;
    a.B = B;
    a.T = T;
    void *kargs[] = {&a};
    unsigned block = T >= 8192 ? 256 : (T >= 2048 ? 128 : 64);
    if (block < (unsigned)warp) block = (unsigned)warp;
    rlk_launch_dims d = host ? ga_dims(1, 1, 1) : ga_dims(ga_min_u(B, 1 << 20), 1, block);
    if ((st = rlk_context_launch(ctx, &p.rowsum, &d, stream, kargs))) return st;
  }

  /* 2. group statistics and advantages */
  {
    const void *scores = c.scores_2d ? (const void *)sums : args->scores.data;
    const int64_t ngroups = k.num_groups;
    ga_group_args a = {0};
    a.scores = scores;
    a.score_stride = c.scores_2d || B == 1 ? 1 : args->scores.strides[0];
    a.adv = adv;
    a.B = B;
    a.group_size = c.group_size;
    a.num_groups = ngroups;
    a.offsets = args->group_offsets.data;
    a.eps = args->eps;
    a.unbiased = c.unbiased;
    a.singleton = c.singleton;
    a.weights = args->weights.data;
    a.weight_stride = B > 1 && args->weights.data ? args->weights.strides[0] : 1;
    a.nan_unscorable = args->nan_scores == RLK_NAN_SCORES_UNSCORABLE;
    void *kargs[] = {&a};
    /* Batch-std blocks each compute the batch statistics from `scores` before writing their
     * groups; when scores are the advantages buffer (row sums, or an in-place call) a second
     * block would read what the first already overwrote, so those calls get one block. */
    const int aliased = scores == (const void *)adv;
    const int64_t batch_cap = aliased ? 1 : 64;
    rlk_launch_dims d;
    if (host) {
      d = ga_dims(1, 1, 1);
    } else if (p.seg > warp) {
      /* a block per group; batch-std blocks each recompute the batch statistics, so few */
      const int64_t cap = c.mode == RLK_ADV_BATCH_STD ? batch_cap : 65535;
      d = ga_dims(ga_min_u(ngroups, cap), 1, (unsigned)p.seg);
    } else {
      /* several groups per block: 4 warps (128 threads, 256 on HIP), or 1024 threads for
       * batch-std (fewer blocks redo the batch statistics) */
      unsigned block = c.mode == RLK_ADV_BATCH_STD ? 1024 : (unsigned)(4 * warp);
      const int64_t per_block = block / p.seg;
      const int64_t cap = c.mode == RLK_ADV_BATCH_STD ? batch_cap : 65535;
      int64_t blocks = (ngroups + per_block - 1) / per_block;
      if (c.mode != RLK_ADV_BATCH_STD) {
        /* shrink a lone block to what it needs (whole warps) */
        const int64_t need = ngroups * p.seg;
        if (blocks == 1 && need < block) block = (unsigned)(((need + warp - 1) / warp) * warp);
      }
      d = ga_dims(ga_min_u(blocks, cap), 1, block);
    }
    if ((st = rlk_context_launch(ctx, &p.group, &d, stream, kargs))) return st;
  }

  /* 3. broadcast over tokens */
  if (p.has_broadcast) {
    ga_broadcast_args a = {0};
    a.adv = adv;
    a.mask = args->mask.data;
    a.mask_stride = a.mask && B > 1 ? args->mask.strides[0] : T;
    a.out = (float *)args->token_advantages.data;
    a.out_stride = B > 1 ? args->token_advantages.strides[0] : T;
    a.B = B;
    a.T = T;
    void *kargs[] = {&a};
    /* tiles of 4 x 256 four-element chunks across a row (up to 1024), a row per grid.y */
    const unsigned block = 256;
    const int64_t tile = 4 * 4 * (int64_t)block;
    rlk_launch_dims d = host ? ga_dims(1, 1, 1)
                             : ga_dims(ga_min_u((T + tile - 1) / tile, 1024),
                                       ga_min_u(B, 65535), block);
    if ((st = rlk_context_launch(ctx, &p.broadcast, &d, stream, kargs))) return st;
  }
  return RLK_OK;
}

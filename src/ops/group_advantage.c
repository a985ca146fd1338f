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
 * The plan (ga_plan) is the single function both a real call (over the call's settings) and
 * rlk_precompile go through, so precompiling a configuration builds exactly what the call will
 * look up. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ops/advantage_scan.h"
#include "ops/ops.h"
#include "common/group_advantage_params.h"

/* ---------------------------------------------------------------------------------- */
/* Templates                                                                           */
/* ---------------------------------------------------------------------------------- */

/* Choice names: the index of each is the enum value the templates see. */
static const char *const ga_mode_names[] = RLK_PARAMS_ENUM_NAMES(RLK_GA_MODES);
static const char *const ga_singleton_names[] = RLK_PARAMS_ENUM_NAMES(RLK_GA_SINGLETONS);
static const char *const ga_offsets_names[] = RLK_PARAMS_ENUM_NAMES(RLK_GA_OFFSETS);

/* The kernels' modes and singleton policies are the API's. */
_Static_assert(GA_MODE_GRPO == (int)RLK_ADV_GRPO && GA_MODE_MEAN_ONLY == (int)RLK_ADV_MEAN_ONLY &&
                   GA_MODE_RLOO == (int)RLK_ADV_RLOO && GA_MODE_BATCH_STD == (int)RLK_ADV_BATCH_STD &&
                   GA_MODE_OPO == (int)RLK_ADV_OPO && GA_MODE_PASSK == (int)RLK_ADV_PASSK &&
                   GA_MODE_PASSK_UNSCALED == (int)RLK_ADV_PASSK_UNSCALED,
               "group_advantage modes: rlk_advantage_mode order");
_Static_assert(GA_SINGLETON_MEAN0_STD1 == (int)RLK_SINGLETON_MEAN0_STD1 && GA_SINGLETON_ZERO == (int)RLK_SINGLETON_ZERO,
               "group_advantage singletons: rlk_singleton_policy order");

/* Fixed group sizes up to this are baked into the kernel (unrolled, constant bounds); larger
 * ones are passed at run time so one kernel serves them all. */
#define GA_MAX_BAKED_GROUP 1024
/* Threads that share one large group (a block). */
#define GA_MAX_SEG 256

#define GA_SCORE_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F64))

/* Parameters that the settings of their names feed unchanged. */
static const rlk_value_decl ga_scores = RLK_DECL_DTYPE("scores", GA_SCORE_DTYPES);
static const rlk_value_decl ga_mode = RLK_DECL_CHOICES("mode", ga_mode_names);

static const rlk_value_decl *const ga_rowsum_params[] = {
    &ga_scores,
    &rlk_seq_mask_decl,
};

static const rlk_value_decl *const ga_group_params[] = {
    &ga_scores,
    &ga_mode,
    RLK_PARAM_INT("group", 0, GA_MAX_BAKED_GROUP), /* 0: at run time */
    RLK_PARAM_POW2("seg", 1, 1024),                  /* threads per group */
    RLK_PARAM_CHOICE("offsets", ga_offsets_names, 0, 2),
};

static const rlk_value_decl *const ga_broadcast_params[] = {
    &rlk_seq_mask_decl,
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
/* The settings and the plan (shared by calls and precompiling)                        */
/* ---------------------------------------------------------------------------------- */

enum {
  GA_S_MODE, GA_S_GROUP_SIZE, GA_S_OFFSETS, GA_S_SCORES, GA_S_SCORES_2D, GA_S_MASK, GA_S_UNBIASED, GA_S_SINGLETON,
  GA_S_BROADCAST, GA_NSETTINGS
};

static const rlk_op_setting ga_settings[GA_NSETTINGS] = {
    [GA_S_MODE] = RLK_SET(ga_mode, RLK_ADV_GRPO, "group_advantage_group.mode", "the advantage"),
    [GA_S_GROUP_SIZE] = RLK_SET_INT("group_size", 16, 0, (int64_t)1 << 40, "group_advantage_group.group",
                                    "fixed group size, or 0 for uneven groups given by group_offsets"),
    [GA_S_OFFSETS] = RLK_SET_DTYPE("offsets", RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64), RLK_I64,
                                   "group_advantage_group.offsets",
                                   "the group_offsets dtype; implies group_size=0"),
    [GA_S_SCORES] = RLK_SET(ga_scores, RLK_F32, "group_advantage_rowsum.scores group_advantage_group.scores",
                            "the scores' dtype"),
    [GA_S_SCORES_2D] = RLK_SET_FLAG("scores_2d", 0, "group_advantage_rowsum",
                                    "scores are [B, T] token rewards summed per row under the mask"),
    [GA_S_MASK] = RLK_SET(rlk_seq_mask_decl, RLK_SEQ_MASK_NONE, "group_advantage_rowsum.mask group_advantage_broadcast.mask",
                          "the [B, T] mask's dtype; needs scores_2d=1 or broadcast=1"),
    [GA_S_UNBIASED] = RLK_SET_FLAG("unbiased", 1, "", "std with N - 1"),
    [GA_S_SINGLETON] = RLK_SET_CHOICE("singleton", ga_singleton_names, RLK_SINGLETON_MEAN0_STD1, "",
                                      "what a one-member group gets"),
    [GA_S_BROADCAST] = RLK_SET_FLAG("broadcast", 0, "group_advantage_broadcast",
                                    "also write token_advantages [B, T]"),
};

static int64_t ga_next_pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

/* The kernels of a configuration on ctx's target, in launch order: the row sums for [B, T]
 * scores, the group kernel, the broadcast when token advantages are written.
 *   fixed G <= 1024 is baked in (host and GPU alike); larger G and offsets are run-time values;
 *   GPU threads per group: the next power of two of G up to a warp (several groups per warp),
 *   else up to 256 threads of a block; uneven groups take a warp each; the host uses 1. */
static rlk_status ga_plan(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs, size_t *nspecs) {
  const int64_t *v = s->v;
  const int have_offsets = RLK_OP_GIVEN(s, GA_S_OFFSETS);
  const int64_t G = have_offsets && !RLK_OP_GIVEN(s, GA_S_GROUP_SIZE) ? 0 : v[GA_S_GROUP_SIZE];
  if (have_offsets && G > 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "offsets: only with group_size=0 (groups are either fixed or by offsets)");
  if (v[GA_S_MASK] != RLK_SEQ_MASK_NONE && !v[GA_S_SCORES_2D] && !v[GA_S_BROADCAST])
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "mask: needs scores_2d=1 or broadcast=1");
  const int host = ctx->kind == RLK_BACKEND_HOST, warp = ctx->target.warp_size;
  int64_t seg = host ? 1 : warp;
  if (G > 0 && !host) seg = G >= GA_MAX_SEG ? GA_MAX_SEG : ga_next_pow2(G);
  size_t n = 0;
  memset(specs, 0, 3 * sizeof *specs);
  if (v[GA_S_SCORES_2D]) specs[n++] = (rlk_kernel_spec){&ga_rowsum_tmpl, {v[GA_S_SCORES], v[GA_S_MASK]}};
  /* the row sums keep the scores' type */
  specs[n++] = (rlk_kernel_spec){&ga_group_tmpl,
                                 {v[GA_S_SCORES], v[GA_S_MODE], G <= GA_MAX_BAKED_GROUP ? G : 0, seg,
                                  G > 0 ? GA_OFFSETS_FIXED : v[GA_S_OFFSETS] == RLK_I32 ? GA_OFFSETS_I32 : GA_OFFSETS_I64}};
  if (v[GA_S_BROADCAST]) specs[n++] = (rlk_kernel_spec){&ga_broadcast_tmpl, {v[GA_S_MASK]}};
  return rlk_op_planned(specs, n, nspecs);
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
    .name = "group_advantage", .settings = ga_settings, .nsettings = GA_NSETTINGS, .plan = ga_plan,
    .samples = ga_samples};

/* ---------------------------------------------------------------------------------- */
/* The call                                                                            */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_group_advantage_args_init(rlk_group_advantage_args *args) {
  static const rlk_group_advantage_args defaults = {
      .group_size = 0, .mode = RLK_ADV_GRPO, .eps = 1e-6f, .unbiased = 1, .singleton = RLK_SINGLETON_MEAN0_STD1};
  if (args) *args = defaults;
}

/* A call: its sizes and the kernels' arguments. */
typedef struct ga_call {
  rlk_op_call op;
  int64_t B, T, num_groups;
  ga_rowsum_args rowsum;
  ga_group_args group;
  ga_broadcast_args broadcast;
} ga_call;

static rlk_status ga_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_group_advantage_args *a = args;
  ga_call *k = (ga_call *)call;
  rlk_op_values *v = &call->vals;
  rlk_status st;
  if ((st = rlk_check_flag(a->unbiased, "unbiased"))) return st;
  /* scores */
  if ((st = rlk_check_tensor_of(&a->scores, "scores", GA_SCORE_DTYPES, 1, 2))) return st;
  const int64_t B = a->scores.shape[0];
  int64_t T = 0;
  const int scores_2d = a->scores.ndim == 2;
  if (scores_2d) {
    T = a->scores.shape[1];
    if ((st = rlk_check_rows(&a->scores, "scores", B, T))) return st;
  }

  /* mode, eps, policies */
  if ((st = rlk_check_enum((int)a->mode, "mode", RLK_ADV_GRPO, RLK_ADV_PASSK_UNSCALED, "rlk_advantage_mode")))
    return st;
  if ((st = rlk_check_enum((int)a->nan_scores, "nan_scores", RLK_NAN_SCORES_PROPAGATE,
                           RLK_NAN_SCORES_UNSCORABLE, "rlk_nan_scores")))
    return st;
  if (a->mode == RLK_ADV_OPO) {
    if (!a->weights.data)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "weights: required by mode opo (each member's weight)");
    if ((st = rlk_check_vector(&a->weights, "weights", RLK_DTYPE_BIT(a->scores.dtype), B, 0, NULL)))
      return st;
  } else if (a->weights.data) {
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "weights: given, but only mode opo reads them");
  }
  if ((st = rlk_check_enum((int)a->singleton, "singleton", RLK_SINGLETON_MEAN0_STD1,
                           RLK_SINGLETON_ZERO, "rlk_singleton_policy")))
    return st;
  if ((st = rlk_check_nonnegative(a->eps, "eps"))) return st;

  /* groups */
  rlk_dtype offsets;
  if ((st = rlk_check_groups(a->group_size, &a->group_offsets, B, ctx->kind == RLK_BACKEND_HOST,
                             &k->num_groups, &offsets)))
    return st;

  /* advantages */
  if ((st = rlk_check_vector_of(&a->advantages, "advantages", RLK_DTYPE_BIT(RLK_F32), B, "B", 1, NULL))) return st;

  /* token_advantages and mask */
  const int has_mask = a->mask.data != NULL, has_tok = a->token_advantages.data != NULL;
  if (has_tok) {
    const rlk_tensor *t = &a->token_advantages;
    if ((st = rlk_check_tensor_of(t, "token_advantages", RLK_DTYPE_BIT(RLK_F32), 2, 2))) return st;
    if (scores_2d && t->shape[1] != T)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "token_advantages: %lld columns, but scores has T = %lld",
                       (long long)t->shape[1], (long long)T);
    if (!scores_2d) T = t->shape[1];
    if ((st = rlk_check_rows(t, "token_advantages", B, T))) return st;
  }
  if (has_mask) {
    if (!scores_2d && !has_tok)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "mask: given, but scores are 1-D and token_advantages is absent");
    const uint32_t mask_dtypes = RLK_DTYPE_BIT(RLK_BOOL) | RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_F32);
    if ((st = rlk_seq_check_rows(&a->mask, "mask", 1, mask_dtypes, B, T))) return st;
  }
  rlk_op_values_set(v, GA_S_MODE, a->mode);
  rlk_op_values_set(v, GA_S_GROUP_SIZE, a->group_size);
  if (a->group_size == 0) rlk_op_values_set(v, GA_S_OFFSETS, offsets);
  rlk_op_values_set(v, GA_S_SCORES, a->scores.dtype);
  rlk_op_values_set(v, GA_S_SCORES_2D, scores_2d);
  rlk_op_values_set(v, GA_S_MASK, rlk_seq_mask_kind(&a->mask));
  rlk_op_values_set(v, GA_S_UNBIASED, a->unbiased != 0);
  rlk_op_values_set(v, GA_S_SINGLETON, a->singleton);
  rlk_op_values_set(v, GA_S_BROADCAST, has_tok);
  k->B = B;
  k->T = T;
  /* f64 [B, T] scores keep their row sums in f64: B doubles of scratch */
  call->workspace = scores_2d && a->scores.dtype == RLK_F64 ? (size_t)B * sizeof(double) : 0;
  return RLK_OK;
}

static unsigned ga_min_u(int64_t a, int64_t b) { return (unsigned)(a < b ? a : b); }

static const void *ga_launch_params(const rlk_context *ctx, const void *args, rlk_op_call *call, size_t i) {
  (void)ctx;
  const rlk_group_advantage_args *a = args;
  ga_call *k = (ga_call *)call;
  const int64_t B = k->B, T = k->T;
  const int scores_2d = (int)call->vals.v[GA_S_SCORES_2D];
  float *adv = (float *)a->advantages.data;
  /* where the row sums go: f32 into the advantages (read in place), f64 into the workspace */
  void *sums = call->vals.v[GA_S_SCORES] == RLK_F64 ? a->workspace : (void *)adv;
  const rlk_template *t = call->specs[i].tmpl;
  if (t == &ga_rowsum_tmpl) {
    ga_rowsum_args *r = &k->rowsum;
    r->rewards = a->scores.data;
    r->mask = a->mask.data;
    r->reward_stride = B > 1 ? a->scores.strides[0] : T;
    r->mask_stride = r->mask && B > 1 ? a->mask.strides[0] : T;
    r->out = sums;
    r->B = B;
    r->T = T;
    return r;
  } else if (t == &ga_group_tmpl) {
    ga_group_args *g = &k->group;
    g->scores = scores_2d ? (const void *)sums : a->scores.data;
    g->score_stride = scores_2d || B == 1 ? 1 : a->scores.strides[0];
    g->adv = adv;
    g->B = B;
    g->group_size = a->group_size;
    g->num_groups = k->num_groups;
    g->offsets = a->group_offsets.data;
    g->eps = a->eps;
    g->unbiased = a->unbiased != 0;
    g->singleton = a->singleton;
    g->weights = a->weights.data;
    g->weight_stride = B > 1 && a->weights.data ? a->weights.strides[0] : 1;
    g->nan_unscorable = a->nan_scores == RLK_NAN_SCORES_UNSCORABLE;
    return g;
  } else {
    ga_broadcast_args *b = &k->broadcast;
    b->adv = adv;
    b->mask = a->mask.data;
    b->mask_stride = b->mask && B > 1 ? a->mask.strides[0] : T;
    b->out = (float *)a->token_advantages.data;
    b->out_stride = B > 1 ? a->token_advantages.strides[0] : T;
    b->B = B;
    b->T = T;
    return b;
  }
}

static void ga_dims(const rlk_context *ctx, const rlk_op_call *call, size_t i, rlk_launch_dims *d) {
  if (ctx->kind == RLK_BACKEND_HOST) return;
  const ga_call *k = (const ga_call *)call;
  const int warp = ctx->target.warp_size;
  const rlk_template *t = call->specs[i].tmpl;
  if (t == &ga_rowsum_tmpl) {
    /* a block per row, wider for long rows */
    unsigned block = k->T >= 8192 ? 256 : (k->T >= 2048 ? 128 : 64);
    d->grid[0] = ga_min_u(k->B, 1 << 20);
    d->block[0] = block < (unsigned)warp ? (unsigned)warp : block;
  } else if (t == &ga_group_tmpl) {
    const int batch_std = call->vals.v[GA_S_MODE] == RLK_ADV_BATCH_STD;
    const int64_t seg = call->specs[i].values[3], ngroups = k->num_groups;
    /* Batch-std blocks each compute the batch statistics from `scores` before writing their
     * groups; when scores are the advantages buffer (row sums, or an in-place call) a second
     * block would read what the first already overwrote, so those calls get one block. */
    const int64_t cap = !batch_std ? 65535 : k->group.scores == (const void *)k->group.adv ? 1 : 64;
    if (seg > warp) {
      /* a block per group; batch-std blocks each recompute the batch statistics, so few */
      d->grid[0] = ga_min_u(ngroups, cap);
      d->block[0] = (unsigned)seg;
    } else {
      /* several groups per block: 4 warps (128 threads, 256 on HIP), or 1024 threads for
       * batch-std (fewer blocks redo the batch statistics) */
      unsigned block = batch_std ? 1024 : (unsigned)(4 * warp);
      const int64_t per_block = block / seg, blocks = (ngroups + per_block - 1) / per_block;
      /* shrink a lone block to what it needs (whole warps) */
      if (!batch_std && blocks == 1 && ngroups * seg < block)
        block = (unsigned)(((ngroups * seg + warp - 1) / warp) * warp);
      d->grid[0] = ga_min_u(blocks, cap);
      d->block[0] = block;
    }
  } else {
    /* tiles of 4 x 256 four-element chunks across a row (up to 1024), a row per grid.y */
    const int64_t tile = 4 * 4 * 256;
    d->grid[0] = ga_min_u((k->T + tile - 1) / tile, 1024);
    d->grid[1] = ga_min_u(k->B, 65535);
    d->block[0] = 256;
  }
  if (!d->grid[0]) d->grid[0] = 1;
  if (!d->grid[1]) d->grid[1] = 1;
}

static const rlk_arg_field ga_fields[] = {
    RLK_ARG_IN(rlk_group_advantage_args, scores),           RLK_ARG_IN(rlk_group_advantage_args, group_offsets),
    RLK_ARG_IN(rlk_group_advantage_args, mask),             RLK_ARG_IN(rlk_group_advantage_args, weights),
    RLK_ARG_INPLACE(rlk_group_advantage_args, advantages, "scores"),
    RLK_ARG_OUT(rlk_group_advantage_args, token_advantages)};

static const rlk_op_entry ga_entry = {
    .name = "rlk_group_advantage", .op = &rlk_op_group_advantage, .call_size = sizeof(ga_call),
    RLK_OP_FIELDS(ga_fields), .workspace = RLK_OP_WORKSPACE(rlk_group_advantage_args, 8), .validate = ga_validate,
    .params = ga_launch_params, .dims = ga_dims};

RLK_OP_DEFINE_CALL_AND_SIZE(rlk_group_advantage, rlk_group_advantage_args, ga_entry)

/* token_baseline.c - optimal token baseline advantages: validation, variant selection, launches.
 *
 * A call launches two kernels (templates/cuda/token_baseline.cuh, templates/host/):
 *   1. scan      per row: returns into the output, the cumulative path weights W and the
 *                valid-token count into the workspace (compact mode: each valid token's
 *                column, W and return packed at its index);
 *   2. baseline  per group and column (compact: valid-token index): the baseline over the
 *                group's members and the advantages.
 * Both run in the inputs' dtype (f32 or f64), every sum in a fixed order: results are bitwise
 * reproducible on one device.
 *
 * Workspace (caller memory, rlk_token_baseline_workspace_size): W [B, T] in the inputs' dtype;
 * compact mode adds the packed returns [B, T] (same dtype) and the columns [B, T] (i32); then
 * the counts [B] (i32).
 *
 * Group offsets: checked in full on the host backend; on a GPU only their shape (reading them
 * would synchronize), and the kernel clamps every offset into [0, B].
 *
 * tb_select is the single function both a call and rlk_precompile (the op's `plan`) go through. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ops/advantage_scan.h"
#include "ops/ops.h"
#include "common/token_baseline_params.h"

/* ---------------------------------------------------------------------------------- */
/* Templates                                                                           */
/* ---------------------------------------------------------------------------------- */

static const char *const tb_offsets_names[] = RLK_PARAMS_ENUM_NAMES(RLK_TB_OFFSETS);

#define TB_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F64))
#define TB_MASK_DTYPES (RLK_DTYPE_BIT(RLK_BOOL) | RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_F32))
/* Threads per block of both GPU kernels: 4 row teams of 32 lanes in the scan. */
#define TB_BLOCK 128

/* Each parameter is also the setting of its name. */
static const rlk_value_decl tb_dtype = RLK_DECL_DTYPE("dtype", TB_DTYPES);
static const rlk_value_decl tb_compact = RLK_DECL_FLAG("compact");
static const rlk_value_decl tb_isw = RLK_DECL_FLAG("isw");
static const rlk_value_decl tb_offsets = RLK_DECL_CHOICES("offsets", tb_offsets_names);

static const rlk_value_decl *const tb_scan_params[] = {&tb_dtype, &rlk_seq_mask_decl, &tb_compact, &tb_isw};
static const rlk_value_decl *const tb_baseline_params[] = {&tb_dtype, &rlk_seq_mask_decl, &tb_compact, &tb_offsets};

static const rlk_template tb_scan_tmpl = {
    "token_baseline", "token_baseline_scan", "cuda/token_baseline.cuh", "host/token_baseline_scan.c",
    sizeof tb_scan_params / sizeof tb_scan_params[0], tb_scan_params};

static const rlk_template tb_baseline_tmpl = {
    "token_baseline", "token_baseline_baseline", "cuda/token_baseline.cuh",
    "host/token_baseline_baseline.c", sizeof tb_baseline_params / sizeof tb_baseline_params[0],
    tb_baseline_params};

/* ---------------------------------------------------------------------------------- */
/* The settings and the plan (shared by calls and precompiling)                        */
/* ---------------------------------------------------------------------------------- */

enum { TB_S_DTYPE, TB_S_MASK, TB_S_OFFSETS, TB_S_COMPACT, TB_S_ISW, TB_NSETTINGS };

static const rlk_op_setting tb_settings[TB_NSETTINGS] = {
    [TB_S_DTYPE] = RLK_SET(tb_dtype, RLK_F32, "token_baseline_*.dtype",
                           "the dtype of rewards, old_logp, sum_pi_squared and the outputs"),
    [TB_S_MASK] = RLK_SET(rlk_seq_mask_decl, RLK_SEQ_MASK_BOOL, "token_baseline_*.mask",
                          "the [B, T] mask's dtype (none: every token valid)"),
    [TB_S_OFFSETS] = RLK_SET(tb_offsets, TB_OFFSETS_FIXED, "token_baseline_baseline.offsets",
                             "groups of a fixed group_size, or group_offsets of this dtype"),
    [TB_S_COMPACT] = RLK_SET(tb_compact, 0, "token_baseline_*.compact",
                             "timesteps are each row's k-th valid token (tir_optimal_token_baseline)"),
    [TB_S_ISW] = RLK_SET(tb_isw, 0, "token_baseline_scan.isw", "rollout_is_weights are given"),
};

/* The two kernels: the per-row scan, then the per-group baseline. */
static rlk_status tb_plan(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs, size_t *nspecs) {
  (void)ctx;
  const int64_t *v = s->v;
  specs[0] = (rlk_kernel_spec){&tb_scan_tmpl, {v[TB_S_DTYPE], v[TB_S_MASK], v[TB_S_COMPACT], v[TB_S_ISW]}};
  specs[1] = (rlk_kernel_spec){&tb_baseline_tmpl, {v[TB_S_DTYPE], v[TB_S_MASK], v[TB_S_COMPACT], v[TB_S_OFFSETS]}};
  return rlk_op_planned(specs, 2, nspecs);
}

static const char *const tb_samples[] = {
    /* verl's optimal_token_baseline: fixed groups, a bool response mask */
    "token_baseline dtype=f32 mask=bool offsets=fixed",
    /* with rollout importance weights, f64, uneven groups */
    "token_baseline dtype=f64 mask=i32 offsets=i64 isw=1",
    /* tir_optimal_token_baseline (compact timesteps), with and without weights and a mask */
    "token_baseline dtype=f32 mask=f32 offsets=i32 compact=1 isw=1",
    "token_baseline dtype=f64 mask=none offsets=fixed compact=1",
    NULL};

const rlk_op_desc rlk_op_token_baseline = {
    .name = "token_baseline", .settings = tb_settings, .nsettings = TB_NSETTINGS, .plan = tb_plan,
    .samples = tb_samples};

/* ---------------------------------------------------------------------------------- */
/* The call                                                                            */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_token_baseline_args_init(rlk_token_baseline_args *args) {
  static const rlk_token_baseline_args defaults = {.epsilon = 1e-8, .handle_zero_tail = 1};
  if (args) *args = defaults;
}

/* Workspace layout: byte offsets of W, the packed returns, the columns and the counts. */
typedef struct tb_layout {
  size_t w, g, pos, len, total;
} tb_layout;

static tb_layout tb_workspace_layout(rlk_dtype dtype, int compact, int64_t B, int64_t T) {
  tb_layout l;
  const size_t n = (size_t)B * (size_t)T, es = rlk_dtype_size(dtype);
  l.w = 0;
  l.g = n * es;
  l.pos = compact ? l.g + n * es : l.g;
  l.len = compact ? l.pos + n * sizeof(int32_t) : l.pos;
  l.total = l.len + (size_t)B * sizeof(int32_t);
  return l;
}

/* A call: its sizes and the kernels' arguments. */
typedef struct tb_call {
  rlk_op_call op;
  int64_t B, T, num_groups;
  tb_scan_args scan;
  tb_baseline_args baseline;
} tb_call;

static rlk_status tb_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_token_baseline_args *a = args;
  tb_call *k = (tb_call *)call;
  rlk_status st;
  if ((st = rlk_check_flag(a->handle_zero_tail, "handle_zero_tail"))) return st;
  if ((st = rlk_check_tensor_of(&a->rewards, "rewards", TB_DTYPES, 2, 2))) return st;
  const int64_t B = a->rewards.shape[0], T = a->rewards.shape[1];
  const uint32_t same = RLK_DTYPE_BIT(a->rewards.dtype);
  if ((st = rlk_seq_check_rows(&a->rewards, "rewards", 1, same, B, T))) return st;
  if (T > INT32_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rewards: T = %lld is beyond the i32 token index",
                     (long long)T);
  if ((st = rlk_seq_check_rows(&a->old_logp, "old_logp", 1, same, B, T))) return st;
  if ((st = rlk_seq_check_rows(&a->sum_pi_squared, "sum_pi_squared", 1, same, B, T))) return st;
  if ((st = rlk_seq_check_rows(&a->rollout_is_weights, "rollout_is_weights", 0, same, B, T))) return st;
  if ((st = rlk_seq_check_rows(&a->mask, "mask", 0, TB_MASK_DTYPES, B, T))) return st;
  if ((st = rlk_check_nonnegative(a->epsilon, "epsilon"))) return st;
  if ((st = rlk_check_flag(a->compact, "compact"))) return st;

  /* groups */
  rlk_dtype offsets;
  if ((st = rlk_check_groups(a->group_size, &a->group_offsets, B, ctx->kind == RLK_BACKEND_HOST,
                             &k->num_groups, &offsets)))
    return st;

  /* outputs */
  if ((st = rlk_seq_check_rows(&a->advantages, "advantages", 1, same, B, T))) return st;
  if ((st = rlk_seq_check_rows(&a->returns, "returns", 1, same, B, T))) return st;
  rlk_op_values *v = &call->vals;
  rlk_op_values_set(v, TB_S_DTYPE, a->rewards.dtype);
  rlk_op_values_set(v, TB_S_MASK, rlk_seq_mask_kind(&a->mask));
  rlk_op_values_set(v, TB_S_OFFSETS,
                    offsets == RLK_I32 ? TB_OFFSETS_I32 : offsets == RLK_I64 ? TB_OFFSETS_I64 : TB_OFFSETS_FIXED);
  rlk_op_values_set(v, TB_S_COMPACT, a->compact);
  rlk_op_values_set(v, TB_S_ISW, a->rollout_is_weights.data != NULL);
  k->B = B;
  k->T = T;
  call->workspace = tb_workspace_layout(a->rewards.dtype, a->compact, B, T).total;
  return RLK_OK;
}

static const void *tb_launch_params(const rlk_context *ctx, const void *args, rlk_op_call *call, size_t i) {
  (void)ctx;
  const rlk_token_baseline_args *a = args;
  tb_call *k = (tb_call *)call;
  const int64_t B = k->B, T = k->T;
  const tb_layout l = tb_workspace_layout(a->rewards.dtype, a->compact, B, T);
  char *ws = (char *)a->workspace;
  void *w_buf = ws + l.w, *g_buf = a->compact ? (void *)(ws + l.g) : NULL;
  int32_t *pos = a->compact ? (int32_t *)(ws + l.pos) : NULL, *len = (int32_t *)(ws + l.len);
  if (i == 0) {
    /* 1. a 32-lane team per row */
    tb_scan_args *s = &k->scan;
    s->rewards = rlk_seq_stream(&a->rewards, B, T, &s->reward_stride);
    s->mask = rlk_seq_stream(&a->mask, B, T, &s->mask_stride);
    s->old_logp = rlk_seq_stream(&a->old_logp, B, T, &s->logp_stride);
    s->sum_pi_sq = rlk_seq_stream(&a->sum_pi_squared, B, T, &s->sps_stride);
    s->isw = rlk_seq_stream(&a->rollout_is_weights, B, T, &s->isw_stride);
    s->returns = rlk_seq_stream(&a->returns, B, T, &s->returns_stride);
    s->adv = rlk_seq_stream(&a->advantages, B, T, &s->adv_stride);
    s->w_buf = w_buf;
    s->g_buf = g_buf;
    s->pos = pos;
    s->len = len;
    s->B = B;
    s->T = T;
    return s;
  } else {
    /* 2. column tiles x groups */
    tb_baseline_args *b = &k->baseline;
    b->returns = rlk_seq_stream(&a->returns, B, T, &b->returns_stride);
    b->mask = rlk_seq_stream(&a->mask, B, T, &b->mask_stride);
    b->w_buf = w_buf;
    b->g_buf = g_buf;
    b->pos = pos;
    b->len = len;
    b->adv = rlk_seq_stream(&a->advantages, B, T, &b->adv_stride);
    b->B = B;
    b->T = T;
    b->group_size = a->group_size;
    b->num_groups = k->num_groups;
    b->offsets = a->group_offsets.data;
    b->eps = a->epsilon;
    b->zero_tail = a->handle_zero_tail != 0;
    return b;
  }
}

/* n blocks of a grid dimension, at least one and at most `most`. */
static unsigned tb_grid(int64_t n, int64_t most) { return (unsigned)(n > 1 ? (n < most ? n : most) : 1); }

static void tb_dims(const rlk_context *ctx, const rlk_op_call *call, size_t i, rlk_launch_dims *d) {
  if (ctx->kind == RLK_BACKEND_HOST) return;
  const tb_call *k = (const tb_call *)call;
  const int64_t teams = TB_BLOCK / TB_TEAM;
  d->block[0] = TB_BLOCK;
  if (i == 0) {
    d->grid[0] = tb_grid((k->B + teams - 1) / teams, 1 << 20);
  } else {
    d->grid[0] = tb_grid((k->T + TB_BLOCK - 1) / TB_BLOCK, 1 << 16);
    d->grid[1] = tb_grid(k->num_groups, 65535);
  }
}

static const rlk_arg_field tb_fields[] = {
    RLK_ARG_IN(rlk_token_baseline_args, rewards),        RLK_ARG_IN(rlk_token_baseline_args, old_logp),
    RLK_ARG_IN(rlk_token_baseline_args, sum_pi_squared), RLK_ARG_IN(rlk_token_baseline_args, rollout_is_weights),
    RLK_ARG_IN(rlk_token_baseline_args, mask),           RLK_ARG_IN(rlk_token_baseline_args, group_offsets),
    RLK_ARG_OUT(rlk_token_baseline_args, advantages),    RLK_ARG_OUT(rlk_token_baseline_args, returns)};

static const rlk_op_entry tb_entry = {
    .name = "rlk_token_baseline", .op = &rlk_op_token_baseline, .call_size = sizeof(tb_call),
    RLK_OP_FIELDS(tb_fields), .workspace = RLK_OP_WORKSPACE(rlk_token_baseline_args, 8), .validate = tb_validate,
    .params = tb_launch_params, .dims = tb_dims};

RLK_OP_DEFINE_CALL_AND_SIZE(rlk_token_baseline, rlk_token_baseline_args, tb_entry)

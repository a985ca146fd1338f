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
#include "ops/ops.h"
#include "runtime/record.h"
#include "common/token_baseline_params.h"

/* The kernels' arguments (templates/common/token_baseline_params.h). */
RLK_PARAMS_DECLARE(tb_scan_args, RLK_TB_SCAN_PARAMS, RLK_TB_SCAN_PARAMS_SIZE);
RLK_PARAMS_DECLARE(tb_baseline_args, RLK_TB_BASELINE_PARAMS, RLK_TB_BASELINE_PARAMS_SIZE);

/* ---------------------------------------------------------------------------------- */
/* Templates                                                                           */
/* ---------------------------------------------------------------------------------- */

static const char *const tb_mask_names[] = {"none", "bool", "i32", "f32", NULL};
static const char *const tb_offsets_names[] = {"fixed", "i32", "i64", NULL};

enum { TB_MASK_NONE = 0, TB_MASK_BOOL = 1, TB_MASK_I32 = 2, TB_MASK_F32 = 3 };
enum { TB_OFFSETS_FIXED = 0, TB_OFFSETS_I32 = 1, TB_OFFSETS_I64 = 2 };

#define TB_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F64))
#define TB_MASK_DTYPES (RLK_DTYPE_BIT(RLK_BOOL) | RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_F32))
/* Threads per block of both GPU kernels: 4 row teams of 32 lanes in the scan. */
#define TB_BLOCK 128
#define TB_TEAM 32

static const rlk_param_decl tb_scan_params[] = {
    {"dtype", RLK_PARAM_DTYPE, 0, 0, 0, TB_DTYPES, NULL},
    {"mask", RLK_PARAM_ENUM, 0, 3, 0, 0, tb_mask_names},
    {"compact", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
    {"isw", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
};

static const rlk_param_decl tb_baseline_params[] = {
    {"dtype", RLK_PARAM_DTYPE, 0, 0, 0, TB_DTYPES, NULL},
    {"mask", RLK_PARAM_ENUM, 0, 3, 0, 0, tb_mask_names},
    {"compact", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
    {"offsets", RLK_PARAM_ENUM, 0, 2, 0, 0, tb_offsets_names},
};

static const rlk_template tb_scan_tmpl = {
    "token_baseline", "token_baseline_scan", "cuda/token_baseline.cuh", "host/token_baseline_scan.c",
    sizeof tb_scan_params / sizeof tb_scan_params[0], tb_scan_params};

static const rlk_template tb_baseline_tmpl = {
    "token_baseline", "token_baseline_baseline", "cuda/token_baseline.cuh",
    "host/token_baseline_baseline.c", sizeof tb_baseline_params / sizeof tb_baseline_params[0],
    tb_baseline_params};

/* ---------------------------------------------------------------------------------- */
/* Variant selection (shared by calls and precompiling)                                */
/* ---------------------------------------------------------------------------------- */

/* What selects the kernels: everything about a call except sizes, pointers and numbers. */
typedef struct tb_config {
  rlk_dtype dtype; /* RLK_F32 / RLK_F64 */
  int mask;        /* TB_MASK_* */
  int offsets;     /* TB_OFFSETS_* */
  int compact;
  int isw;
} tb_config;

typedef struct tb_plan {
  rlk_kernel_spec scan, baseline;
} tb_plan;

static rlk_status tb_select(const tb_config *c, tb_plan *p) {
  memset(p, 0, sizeof *p);
  p->scan.tmpl = &tb_scan_tmpl;
  p->scan.values[0] = c->dtype;
  p->scan.values[1] = c->mask;
  p->scan.values[2] = c->compact;
  p->scan.values[3] = c->isw;
  p->baseline.tmpl = &tb_baseline_tmpl;
  p->baseline.values[0] = c->dtype;
  p->baseline.values[1] = c->mask;
  p->baseline.values[2] = c->compact;
  p->baseline.values[3] = c->offsets;
  rlk_status st = rlk_spec_validate(&p->scan);
  if (!st) st = rlk_spec_validate(&p->baseline);
  return st;
}

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

enum { TB_S_DTYPE, TB_S_MASK, TB_S_OFFSETS, TB_S_COMPACT, TB_S_ISW, TB_NSETTINGS };

static const rlk_op_setting tb_settings[TB_NSETTINGS] = {
    [TB_S_DTYPE] = RLK_SET_DTYPE("dtype", TB_DTYPES, RLK_F32, "token_baseline_scan.dtype",
                                 "the dtype of rewards, old_logp, sum_pi_squared and the outputs"),
    [TB_S_MASK] = RLK_SET_CHOICE("mask", tb_mask_names, TB_MASK_BOOL, "token_baseline_scan.mask",
                                 "the [B, T] mask's dtype (none: every token valid)"),
    [TB_S_OFFSETS] = RLK_SET_CHOICE("offsets", tb_offsets_names, TB_OFFSETS_FIXED,
                                    "token_baseline_baseline.offsets",
                                    "groups of a fixed group_size, or group_offsets of this dtype"),
    [TB_S_COMPACT] = RLK_SET_FLAG("compact", 0, "token_baseline_scan.compact",
                                  "timesteps are each row's k-th valid token (tir_optimal_token_baseline)"),
    [TB_S_ISW] = RLK_SET_FLAG("isw", 0, "token_baseline_scan.isw", "rollout_is_weights are given"),
};

static rlk_status tb_plan_config(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs,
                                 size_t *nspecs) {
  (void)ctx;
  const tb_config c = {(rlk_dtype)s->v[TB_S_DTYPE], (int)s->v[TB_S_MASK], (int)s->v[TB_S_OFFSETS],
                       (int)s->v[TB_S_COMPACT], (int)s->v[TB_S_ISW]};
  tb_plan p;
  rlk_status st = tb_select(&c, &p);
  if (st) return st;
  specs[0] = p.scan;
  specs[1] = p.baseline;
  *nspecs = 2;
  return RLK_OK;
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
    .name = "token_baseline",
    .settings = tb_settings,
    .nsettings = TB_NSETTINGS,
    .plan = tb_plan_config,
    .samples = tb_samples,
};

/* ---------------------------------------------------------------------------------- */
/* The call                                                                            */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_token_baseline_args_init(rlk_token_baseline_args *args) {
  if (!args) return;
  memset(args, 0, sizeof *args);
  args->epsilon = 1e-8;
  args->handle_zero_tail = 1;
}

/* A [B, T] tensor of an allowed dtype whose rows are contiguous. */
static rlk_status tb_check_rows(const rlk_tensor *t, const char *what, uint32_t dtypes, int64_t B,
                                int64_t T) {
  rlk_status st;
  if ((st = rlk_check_tensor(t, what, 1))) return st;
  if ((st = rlk_check_dtype(t, what, dtypes))) return st;
  return rlk_check_rows(t, what, B, T);
}

static int64_t tb_row_stride(const rlk_tensor *t, int64_t B, int64_t T) {
  return t->data && B > 1 ? t->strides[0] : T;
}

/* Sizes of a validated call. */
typedef struct tb_call {
  int64_t B, T, num_groups;
} tb_call;

static int tb_mask_kind(rlk_dtype d) {
  return d == RLK_BOOL ? TB_MASK_BOOL : d == RLK_I32 ? TB_MASK_I32 : TB_MASK_F32;
}

static rlk_status tb_validate(const rlk_context *ctx, const rlk_token_baseline_args *a, tb_config *c,
                              tb_call *k) {
  memset(c, 0, sizeof *c);
  memset(k, 0, sizeof *k);
  rlk_status st;
  if ((st = rlk_check_tensor(&a->rewards, "rewards", 1))) return st;
  if ((st = rlk_check_dtype(&a->rewards, "rewards", TB_DTYPES))) return st;
  if ((st = rlk_check_ndim(&a->rewards, "rewards", 2, 2))) return st;
  const int64_t B = a->rewards.shape[0], T = a->rewards.shape[1];
  const uint32_t same = RLK_DTYPE_BIT(a->rewards.dtype);
  if ((st = tb_check_rows(&a->rewards, "rewards", same, B, T))) return st;
  if (T > INT32_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rewards: T = %lld is beyond the i32 token index",
                     (long long)T);
  c->dtype = a->rewards.dtype;
  if ((st = tb_check_rows(&a->old_logp, "old_logp", same, B, T))) return st;
  if ((st = tb_check_rows(&a->sum_pi_squared, "sum_pi_squared", same, B, T))) return st;
  if (a->rollout_is_weights.data) {
    if ((st = tb_check_rows(&a->rollout_is_weights, "rollout_is_weights", same, B, T))) return st;
    c->isw = 1;
  }
  if (a->mask.data) {
    if ((st = tb_check_rows(&a->mask, "mask", TB_MASK_DTYPES, B, T))) return st;
    c->mask = tb_mask_kind(a->mask.dtype);
  }
  if (!(a->epsilon >= 0.0) || isinf(a->epsilon))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "epsilon: %g must be finite and >= 0", a->epsilon);
  if (a->compact != 0 && a->compact != 1)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "compact: %d is not 0 or 1", a->compact);
  c->compact = a->compact;

  /* groups */
  rlk_dtype offsets;
  if ((st = rlk_check_groups(a->group_size, &a->group_offsets, B, ctx->kind == RLK_BACKEND_HOST,
                             &k->num_groups, &offsets)))
    return st;
  c->offsets = offsets == RLK_I32 ? TB_OFFSETS_I32 : offsets == RLK_I64 ? TB_OFFSETS_I64 : TB_OFFSETS_FIXED;

  /* outputs */
  if ((st = tb_check_rows(&a->advantages, "advantages", same, B, T))) return st;
  if ((st = tb_check_rows(&a->returns, "returns", same, B, T))) return st;
  k->B = B;
  k->T = T;
  return RLK_OK;
}

/* Workspace layout: byte offsets of W, the packed returns, the columns and the counts. */
typedef struct tb_layout {
  size_t w, g, pos, len, total;
} tb_layout;

static tb_layout tb_workspace_layout(const tb_config *c, const tb_call *k) {
  tb_layout l;
  const size_t n = (size_t)k->B * (size_t)k->T, es = rlk_dtype_size(c->dtype);
  l.w = 0;
  l.g = n * es;
  l.pos = c->compact ? l.g + n * es : l.g;
  l.len = c->compact ? l.pos + n * sizeof(int32_t) : l.pos;
  l.total = l.len + (size_t)k->B * sizeof(int32_t);
  return l;
}

RLK_API rlk_status rlk_token_baseline_workspace_size(rlk_context *ctx, const rlk_token_baseline_args *args,
                                                     size_t *bytes) {
  if (bytes) *bytes = 0;
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_token_baseline_workspace_size: ctx is NULL");
  if (!args) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_token_baseline_workspace_size: args is NULL");
  if (!bytes) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_token_baseline_workspace_size: bytes is NULL");
  tb_config c;
  tb_call k;
  rlk_status st = tb_validate(ctx, args, &c, &k);
  if (!st) *bytes = tb_workspace_layout(&c, &k).total;
  return st;
}

/* RLK_JIT_RECORD: the line of a call's configuration. */
static void tb_record(const tb_config *c) {
  rlk_op_values s;
  rlk_op_values_init(&rlk_op_token_baseline, &s);
  rlk_op_values_set(&s, TB_S_DTYPE, c->dtype);
  rlk_op_values_set(&s, TB_S_MASK, c->mask);
  rlk_op_values_set(&s, TB_S_OFFSETS, c->offsets);
  rlk_op_values_set(&s, TB_S_COMPACT, c->compact);
  rlk_op_values_set(&s, TB_S_ISW, c->isw);
  rlk_record_op(&rlk_op_token_baseline, &s);
}

static unsigned tb_min_u(int64_t a, int64_t b) { return (unsigned)(a < b ? a : b); }

static rlk_launch_dims tb_dims(unsigned gx, unsigned gy, unsigned block) {
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

RLK_API rlk_status rlk_token_baseline(rlk_context *ctx, const rlk_token_baseline_args *args, void *stream) {
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_token_baseline: ctx is NULL");
  if (!args) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_token_baseline: args is NULL");
  tb_config c;
  tb_call k;
  rlk_status st = tb_validate(ctx, args, &c, &k);
  if (st) return st;
  const tb_layout l = tb_workspace_layout(&c, &k);
  if (!args->workspace)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "workspace: NULL, the call needs %zu bytes (rlk_token_baseline_workspace_size)",
                     l.total);
  if (args->workspace_bytes < l.total)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "workspace: %zu bytes, the call needs %zu (rlk_token_baseline_workspace_size)",
                     args->workspace_bytes, l.total);
  if ((uintptr_t)args->workspace % 8 != 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "workspace: not 8-byte aligned");
  static const rlk_arg_field fields[] = {
      RLK_ARG_IN(rlk_token_baseline_args, rewards),        RLK_ARG_IN(rlk_token_baseline_args, old_logp),
      RLK_ARG_IN(rlk_token_baseline_args, sum_pi_squared), RLK_ARG_IN(rlk_token_baseline_args, rollout_is_weights),
      RLK_ARG_IN(rlk_token_baseline_args, mask),           RLK_ARG_IN(rlk_token_baseline_args, group_offsets),
      RLK_ARG_OUT(rlk_token_baseline_args, advantages),    RLK_ARG_OUT(rlk_token_baseline_args, returns)};
  if ((st = rlk_check_arg_fields(fields, sizeof fields / sizeof fields[0], args, args->workspace, args->workspace_bytes)))
    return st;
  if ((st = rlk_context_require_device(ctx, "rlk_token_baseline"))) return st;
  tb_plan p;
  if ((st = tb_select(&c, &p))) return st;
  if (rlk_record_enabled()) tb_record(&c);

  const int host = ctx->kind == RLK_BACKEND_HOST;
  const int64_t B = k.B, T = k.T;
  char *ws = (char *)args->workspace;
  void *w_buf = ws + l.w, *g_buf = c.compact ? (void *)(ws + l.g) : NULL;
  int32_t *pos = c.compact ? (int32_t *)(ws + l.pos) : NULL, *len = (int32_t *)(ws + l.len);
  const int64_t returns_stride = tb_row_stride(&args->returns, B, T);
  const int64_t adv_stride = tb_row_stride(&args->advantages, B, T);
  const int64_t mask_stride = tb_row_stride(&args->mask, B, T);

  /* 1. a 32-lane team per row */
  {
    tb_scan_args a = {0};
    a.rewards = args->rewards.data;
    a.reward_stride = tb_row_stride(&args->rewards, B, T);
    a.mask = args->mask.data;
    a.mask_stride = mask_stride;
    a.old_logp = args->old_logp.data;
    a.logp_stride = tb_row_stride(&args->old_logp, B, T);
    a.sum_pi_sq = args->sum_pi_squared.data;
    a.sps_stride = tb_row_stride(&args->sum_pi_squared, B, T);
    a.isw = args->rollout_is_weights.data;
    a.isw_stride = tb_row_stride(&args->rollout_is_weights, B, T);
    a.returns = args->returns.data;
    a.returns_stride = returns_stride;
    a.adv = args->advantages.data;
    a.adv_stride = adv_stride;
    a.w_buf = w_buf;
    a.g_buf = g_buf;
    a.pos = pos;
    a.len = len;
    a.B = B;
    a.T = T;
    void *kargs[] = {&a};
    const int64_t teams = TB_BLOCK / TB_TEAM;
    rlk_launch_dims d = host ? tb_dims(1, 1, 1) : tb_dims(tb_min_u((B + teams - 1) / teams, 1 << 20), 1, TB_BLOCK);
    if ((st = rlk_context_launch(ctx, &p.scan, &d, stream, kargs))) return st;
  }

  /* 2. column tiles x groups */
  {
    tb_baseline_args a = {0};
    a.returns = args->returns.data;
    a.returns_stride = returns_stride;
    a.mask = args->mask.data;
    a.mask_stride = mask_stride;
    a.w_buf = w_buf;
    a.g_buf = g_buf;
    a.pos = pos;
    a.len = len;
    a.adv = args->advantages.data;
    a.adv_stride = adv_stride;
    a.B = B;
    a.T = T;
    a.group_size = args->group_size;
    a.num_groups = k.num_groups;
    a.offsets = args->group_offsets.data;
    a.eps = args->epsilon;
    a.zero_tail = args->handle_zero_tail != 0;
    void *kargs[] = {&a};
    rlk_launch_dims d = host ? tb_dims(1, 1, 1)
                             : tb_dims(tb_min_u((T + TB_BLOCK - 1) / TB_BLOCK, 1 << 16),
                                       tb_min_u(k.num_groups, 65535), TB_BLOCK);
    if ((st = rlk_context_launch(ctx, &p.baseline, &d, stream, kargs))) return st;
  }
  return RLK_OK;
}

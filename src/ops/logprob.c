/* logprob.c - token log-probs and entropy from logits: validation, variant selection, launches.
 *
 * Kernels (templates/cuda/logprob*.cuh, templates/host/logprob_*.c):
 *   logprob_fwd       16-byte vector loads; every backend (the host runs the same f32 algorithm)
 *   logprob_fwd_bulk  sm_90+: 1-D bulk copies into a shared-memory ring (cp.async.bulk, mbarriers)
 *   logprob_fwd_tma   sm_90+: tensor-map copies (cp.async.bulk.tensor)
 *   logprob_bwd       16-byte vectors; in place allowed
 * A forward is one launch, a backward one launch. Extra device memory: none (the outputs are O(N)).
 *
 * Variants and defaults. The default on every arch is the vector kernel: it needs nothing beyond
 * plain loads and has been the reference everywhere. The bulk and tensor-map variants are tuning
 * candidates on sm_90+: both agree with it on an H200 (the GPU tests' gpu_variants case), neither
 * was faster there (rlk-bench-logprob --sweep --tma, rlk-tune), so neither is a default. A variant
 * a target cannot run (bulk or tma off sm_90, tma on a tensor whose row stride or base the copy
 * engine cannot describe) falls back to the arch's default, with that default's tuning.
 *
 * Selection (lp_select_fwd / lp_select_bwd) is the one function both a real call and the op's
 * `plan` (rlk_precompile) go through, so precompiling a configuration builds exactly what the call
 * looks up. Tuning candidates for a sweep are lp_candidates (valid on every target).
 *
 * The tuning database: a call that asks for no tuning of its own (every tuning field 0 or AUTO,
 * RLK_LOGPROB_VARIANT unset) runs with the winner recorded for its pass, dtypes, entropy flag,
 * gradient dtype, V and the bucket of its N rows on this context's target and device (the
 * record's shape is lp_tune_shape); without a record, or with settings that cannot run here
 * (one warning), it runs the default. A plan line's tokens= stands for N. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ops/invariant.h"
#include "ops/logprob_shard.h"
#include "ops/ops.h"
#include "tune/tune_db.h"
#include "tune/tune_table.h"
#include "common/logprob_params.h"

/* The backward kernel's arguments (templates/common/logprob_params.h, which declares the
 * forward's). */
RLK_PARAMS_DECLARE(lp_bwd_kernel_args, RLK_LP_BWD_PARAMS, RLK_LP_BWD_PARAMS_SIZE);
RLK_PARAMS_DECLARE(lp_rows_args, RLK_LP_ROWS, 56); /* the front of every one */

/* ---------------------------------------------------------------------------------- */
/* Templates                                                                           */
/* ---------------------------------------------------------------------------------- */

/* Choice names: the index of each is the code the templates see (dtypes: RLK_DT_*). */
enum { LP_PASS_FWD = 0, LP_PASS_BWD = 1, LP_PASS_BOTH = 2 };

static const char *const lp_dt_names[] = RLK_PARAMS_ENUM_NAMES(RLK_FLOAT_DTS);
static const char *const lp_grad_names[] = RLK_PARAMS_ENUM_NAMES(RLK_LP_GRADS);

/* The kernels' status bits are the API's. */
_Static_assert(LP_STATUS_BAD_LABEL == RLK_LOGPROB_STATUS_BAD_LABEL &&
                   LP_STATUS_LABEL_OWNERS == RLK_LOGPROB_STATUS_LABEL_OWNERS &&
                   LP_STATUS_BAD_ROW == RLK_LOGPROB_STATUS_BAD_ROW,
               "logprob status bits: RLK_LOGPROB_STATUS_*");
static const char *const lp_variant_names[] = {"auto", "vec", "bulk", "tma", NULL};
static const char *const lp_pass_names[] = {"fwd", "bwd", "both", NULL};

#define LP_LABEL_DTYPES (RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64))
#define LP_LOGIT_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F16) | RLK_DTYPE_BIT(RLK_BF16))

/* Parameters that the settings of their names feed unchanged. */
static const rlk_value_decl lp_logits = RLK_DECL_CHOICES("logits", lp_dt_names);
static const rlk_value_decl lp_labels = RLK_DECL_DTYPE("labels", LP_LABEL_DTYPES);
static const rlk_value_decl lp_grad = RLK_DECL_CHOICES("grad", lp_grad_names);
static const rlk_value_decl lp_entropy = RLK_DECL_FLAG("entropy");
static const rlk_value_decl lp_kept = RLK_DECL_FLAG("kept"); /* kept-set replay: a threshold per row */

static const rlk_value_decl *const lp_fwd_params[] = {
    &lp_logits,
    &lp_labels,
    RLK_PARAM_POW2("block", 1, 1024),
    RLK_PARAM_POW2("seg", 1, 1024), /* threads per row */
    RLK_PARAM_POW2("unroll", 1, 8),
    &lp_entropy,
    &lp_kept,
};

static const rlk_value_decl *const lp_bwd_params[] = {
    &lp_logits,
    &lp_grad,
    &lp_labels,
    RLK_PARAM_POW2("block", 1, 1024),
    RLK_PARAM_POW2("seg", 1, 1024),
    RLK_PARAM_POW2("unroll", 1, 8),
    &lp_entropy, /* g_H given */
    &lp_kept,
};

static const rlk_value_decl *const lp_bulk_params[] = {
    &lp_logits,
    &lp_labels,
    RLK_PARAM_INT("cwarps", 1, 31), /* consumer warps */
    RLK_PARAM_POW2("unroll", 1, 8),
    RLK_PARAM_INT("stages", 2, 8),
    &lp_entropy,
};

static const rlk_value_decl *const lp_tma_params[] = {
    &lp_logits,
    &lp_labels,
    RLK_PARAM_INT("rows", 1, 31), /* box rows = consumer warps */
    RLK_PARAM_INT("nbox", 1, 8),  /* boxes per stage */
    RLK_PARAM_INT("stages", 2, 8),
    &lp_entropy,
};

#define LP_N(a) (sizeof(a) / sizeof((a)[0]))

static const rlk_template lp_fwd_tmpl = {"logprob", "logprob_fwd", "cuda/logprob.cuh",
                                         "host/logprob_fwd.c", LP_N(lp_fwd_params), lp_fwd_params};
static const rlk_template lp_bwd_tmpl = {"logprob", "logprob_bwd", "cuda/logprob.cuh",
                                         "host/logprob_bwd.c", LP_N(lp_bwd_params), lp_bwd_params};
static const rlk_template lp_bulk_tmpl = {"logprob", "logprob_fwd_bulk", "cuda/logprob_sm90.cuh",
                                          NULL, LP_N(lp_bulk_params), lp_bulk_params, RLK_TARGET_TMA};
static const rlk_template lp_tma_tmpl = {"logprob", "logprob_fwd_tma", "cuda/logprob_sm90.cuh",
                                         NULL, LP_N(lp_tma_params), lp_tma_params, RLK_TARGET_TMA};

/* ---------------------------------------------------------------------------------- */
/* Defaults and tuning candidates                                                      */
/* ---------------------------------------------------------------------------------- */

/* The guaranteed default of an arch: what runs when nothing is asked for. */
typedef struct lp_arch_default {
  int min_sm;    /* CUDA compute capability x 10 from which the row applies (0: any) */
  int variant;   /* rlk_logprob_variant */
  int block;     /* threads of a block for rows of at least LP_WIDE_ROW bytes */
  int unroll;    /* vectors in flight per thread */
  int stages;    /* ring depth (bulk / tma) */
} lp_arch_default;

/* CUDA, first match by compute capability. sm_90+ keeps the vector kernel as its default until
 * the bulk variant is measured faster there (both are in lp_candidates). */
static const lp_arch_default lp_cuda_defaults[] = {
    {90, RLK_LOGPROB_VARIANT_VEC, 512, 4, 4},
    {80, RLK_LOGPROB_VARIANT_VEC, 512, 4, 4},
    {0, RLK_LOGPROB_VARIANT_VEC, 256, 4, 4},
};
static const lp_arch_default lp_hip_default = {0, RLK_LOGPROB_VARIANT_VEC, 256, 4, 4};

/* Defaults of the shared-memory variants (consumer threads, unroll, stages). */
#define LP_BULK_BLOCK 256 /* 8 consumer warps: 16 KB tiles with unroll 4 */
#define LP_TMA_BLOCK 256  /* 8 rows per box */

/* Rows of at least this many bytes get a whole block each at the default block size; rows of at
 * least LP_BLOCK_ROW bytes a block of 256; shorter rows share a block (a lane segment each). */
#define LP_WIDE_ROW (64 * 1024)
#define LP_BLOCK_ROW (16 * 1024)


/* What a sweep tool times against the default, appended to a configuration line. Valid on every
 * target: a setting a target cannot honour falls back (identical specs then time alike). */
static const char *const lp_candidates[] = {
    "variant=vec block=256 unroll=4",  "variant=vec block=512 unroll=2",
    "variant=vec block=512 unroll=4",  "variant=vec block=512 unroll=8",
    "variant=vec block=1024 unroll=4", "variant=vec block=1024 unroll=2",
    "variant=bulk block=256 unroll=4 stages=3", "variant=bulk block=256 unroll=4 stages=4",
    "variant=bulk block=256 unroll=8 stages=3", "variant=bulk block=512 unroll=2 stages=4",
    "variant=bulk block=512 unroll=4 stages=3", "variant=bulk block=128 unroll=8 stages=4",
    "variant=tma block=256 unroll=4 stages=4",  "variant=tma block=128 unroll=8 stages=4",
    NULL};

/* ---------------------------------------------------------------------------------- */
/* Variant selection (shared by calls and precompiling)                                */
/* ---------------------------------------------------------------------------------- */

/* The settings of a configuration line: what every selection below reads. */

enum {
  LP_S_PASS, LP_S_LOGITS, LP_S_LABELS, LP_S_ENTROPY, LP_S_GRAD, LP_S_VOCAB, LP_S_VARIANT, LP_S_BLOCK, LP_S_SEG,
  LP_S_UNROLL, LP_S_STAGES, LP_S_TOKENS, LP_S_KEPT, LP_NSETTINGS
};

static const rlk_op_setting lp_settings[LP_NSETTINGS] = {
    [LP_S_PASS] = RLK_SET_CHOICE("pass", lp_pass_names, LP_PASS_BOTH, "logprob_fwd logprob_bwd", "the kernels to build"),
    [LP_S_LOGITS] = RLK_SET(lp_logits, RLK_DT_BF16, "logprob_*.logits", "the logits' dtype"),
    [LP_S_LABELS] = RLK_SET(lp_labels, RLK_I64, "logprob_*.labels", "the labels' dtype"),
    [LP_S_ENTROPY] = RLK_SET(lp_entropy, 0, "logprob_*.entropy", "fwd: also the entropy; bwd: an entropy gradient"),
    [LP_S_GRAD] = RLK_SET(lp_grad, LP_GRAD_SAME, "logprob_bwd.grad", "the backward's dlogits dtype"),
    [LP_S_VOCAB] = RLK_SET_INT("vocab", 151936, 1, (int64_t)1 << 40, "logprob_fwd.seg",
                               "V, picks the row layout: a block per row, or rows sharing a block"),
    [LP_S_VARIANT] = RLK_SET_CHOICE("variant", lp_variant_names, RLK_LOGPROB_VARIANT_AUTO, "logprob_fwd",
                                    "bulk and tma are sm_90+ forwards; elsewhere the default runs"),
    [LP_S_BLOCK] = RLK_SET_INT("block", 0, 0, 1024, "logprob_fwd.block",
                               "threads per block, 0 for the default; bulk/tma: consumer threads"),
    [LP_S_SEG] = RLK_SET_INT("seg", 0, 0, 1024, "logprob_fwd.seg",
                             "threads per row of the vector kernel, 0 for the default"),
    [LP_S_UNROLL] = RLK_SET_INT("unroll", 0, 0, 8, "logprob_fwd.unroll",
                                "16-byte vectors in flight per thread (tma: boxes per stage), 0 for the default"),
    [LP_S_STAGES] = RLK_SET_INT("stages", 0, 0, 8, "logprob_fwd_bulk.stages logprob_fwd_tma.stages",
                                "shared-memory ring depth of bulk/tma, 0 for the default"),
    [LP_S_TOKENS] = RLK_SET_BUCKETED("tokens", 0, 0, (int64_t)1 << 40,
                                "N, the rows of the calls; with no tuning settings, the tuning database's winner "
                                "for N's bucket on this context, 0 for none"),
    [LP_S_KEPT] = RLK_SET(lp_kept, 0, "logprob_fwd.kept logprob_bwd.kept",
                          "kept-set replay: a threshold per row (the vector kernel; no tuning database)"),
};

/* One kernel of a call and its launch shape. */
typedef struct lp_choice {
  rlk_kernel_spec spec;
  int variant;      /* the variant that runs */
  int threads;      /* of a block */
  int rows_per_block;
  size_t smem;      /* dynamic shared memory */
} lp_choice;

static int lp_dt_bytes(int dt) { return dt == RLK_DT_F32 ? 4 : 2; }


static const lp_arch_default *lp_default(const rlk_context *ctx) {
  if (ctx->kind == RLK_BACKEND_HIP) return &lp_hip_default;
  const int sm = rlk_target_cuda_sm(&ctx->target);
  for (size_t i = 0; i < LP_N(lp_cuda_defaults); i++)
    if (sm >= lp_cuda_defaults[i].min_sm) return &lp_cuda_defaults[i];
  return &lp_cuda_defaults[LP_N(lp_cuda_defaults) - 1];
}

static int lp_is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

static int64_t lp_next_pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

/* RLK_LOGPROB_VARIANT, read once per process: -1 unread, else an rlk_logprob_variant. */
static atomic_int lp_env_variant = -1;

static int lp_env_override(void) {
  return rlk_env_choice(&lp_env_variant, "RLK_LOGPROB_VARIANT", lp_variant_names, RLK_LOGPROB_VARIANT_AUTO);
}

/* Checks the tuning requests (settings) that make sense for `variant` on this backend. */
static rlk_status lp_check_tuning(const rlk_target *tg, int variant, const int64_t *v) {
  const int warp = tg->warp_size;
  const int block = (int)v[LP_S_BLOCK], seg = (int)v[LP_S_SEG], unroll = (int)v[LP_S_UNROLL];
  if (unroll && !(unroll == 1 || unroll == 2 || unroll == 4 || unroll == 8))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "unroll: %d is not 0, 1, 2, 4 or 8", unroll);
  if (v[LP_S_STAGES] && (v[LP_S_STAGES] < 2 || v[LP_S_STAGES] > 8))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "stages: %d is not 0 or 2..8", (int)v[LP_S_STAGES]);
  if (block < 0 || block > 1024)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "block: %d is outside [0, 1024]", block);
  if (variant == RLK_LOGPROB_VARIANT_VEC) {
    if (block && (!lp_is_pow2(block) || block < warp))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "block: %d is not a power of two from %d to 1024 (the vector variant)", block, warp);
    if (seg && !lp_is_pow2(seg))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "seg: %d is not a power of two (up to %d, or the whole block)", seg, warp);
  } else {
    if (block && (block % 32 || block > 992))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "block: %d consumer threads is not a multiple of 32 up to 992 (%s)", block,
                       lp_variant_names[variant]);
    if (seg) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "seg: only the vector variant has row segments");
  }
  return RLK_OK;
}

/* The vector kernel's row layout for rows of V elements: threads per block and per row. */
static void lp_vec_shape(const rlk_target *tg, const lp_arch_default *d, const int64_t *v, int *block, int *seg) {
  const int warp = tg->warp_size;
  const int64_t V = v[LP_S_VOCAB], row_bytes = V * lp_dt_bytes((int)v[LP_S_LOGITS]);
  const int epv = 16 / lp_dt_bytes((int)v[LP_S_LOGITS]);
  int b = (int)v[LP_S_BLOCK], s = (int)v[LP_S_SEG];
  if (row_bytes >= LP_BLOCK_ROW) {
    if (!b) b = row_bytes >= LP_WIDE_ROW ? d->block : (d->block < 256 ? d->block : 256);
    if (!s) s = b;
  } else {
    if (!s) {
      int64_t want = lp_next_pow2((V + 2 * epv - 1) / (2 * epv));
      s = (int)(want > warp ? warp : want);
    }
    if (!b) b = 4 * warp;
    if (s > b) s = b;
  }
  if (s > warp && s != b) s = b;
  *block = b;
  *seg = s;
}

/* The tuning requests cleared: a fallback takes its own defaults. */
static void lp_untuned(int64_t *v) { v[LP_S_BLOCK] = v[LP_S_SEG] = v[LP_S_UNROLL] = v[LP_S_STAGES] = 0; }

/* The forward kernel of a configuration as it asks (no tuning database); tma_ok: a tensor map
 * can describe the logits. */
static rlk_status lp_select_fwd_as(const rlk_context *ctx, const rlk_op_values *s, int tma_ok, lp_choice *ch) {
  memset(ch, 0, sizeof *ch);
  const rlk_backend kind = ctx->kind;
  const lp_arch_default *d = lp_default(ctx);
  int variant = s->v[LP_S_VARIANT] ? (int)s->v[LP_S_VARIANT] : lp_env_override();
  if (!variant) variant = d->variant;
  int64_t t[LP_NSETTINGS];
  memcpy(t, s->v, sizeof t);
  const int sm90 = (ctx->target.features & RLK_TARGET_TMA) != 0; /* the bulk and tma variants */
  if ((variant == RLK_LOGPROB_VARIANT_BULK || variant == RLK_LOGPROB_VARIANT_TMA) && rlk_invariant())
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "variant: %s folds a row in another order than the vector kernel, and falls back to it by "
                     "the rows' alignment; RLK_INVARIANT=1 refuses it",
                     lp_variant_names[variant]);
  if ((variant == RLK_LOGPROB_VARIANT_BULK || variant == RLK_LOGPROB_VARIANT_TMA) &&
      (!sm90 || (variant == RLK_LOGPROB_VARIANT_TMA && !tma_ok) || s->v[LP_S_KEPT])) {
    rlk_debug("logprob: variant %s is not available here (%s); using %s", lp_variant_names[variant],
              s->v[LP_S_KEPT] ? "kept-set replay is the vector kernel's"
              : !sm90         ? "needs sm_90+"
                              : "the logits cannot be described by a tensor map",
              lp_variant_names[d->variant]);
    variant = d->variant;
    lp_untuned(t);
  }
  if (kind == RLK_BACKEND_HOST) variant = RLK_LOGPROB_VARIANT_VEC;
  rlk_status st = lp_check_tuning(&ctx->target, variant, t);
  if (st) return st;
  ch->variant = variant;
  const int64_t logits = t[LP_S_LOGITS], labels = t[LP_S_LABELS], entropy = t[LP_S_ENTROPY];
  const int unroll = t[LP_S_UNROLL] ? (int)t[LP_S_UNROLL] : d->unroll;
  const int stages = t[LP_S_STAGES] ? (int)t[LP_S_STAGES] : d->stages;
  const int block = (int)t[LP_S_BLOCK];
  if (variant == RLK_LOGPROB_VARIANT_BULK) {
    const int cwarps = (block ? block : LP_BULK_BLOCK) / 32;
    ch->spec = (rlk_kernel_spec){&lp_bulk_tmpl, {logits, labels, cwarps, unroll, stages, entropy}};
    ch->threads = (cwarps + 1) * 32;
    ch->rows_per_block = 1;
    ch->smem = (size_t)cwarps * 32u * 16u * (size_t)unroll * (size_t)stages;
  } else if (variant == RLK_LOGPROB_VARIANT_TMA) {
    const int rows = (block ? block : LP_TMA_BLOCK) / 32;
    ch->spec = (rlk_kernel_spec){&lp_tma_tmpl, {logits, labels, rows, unroll, stages, entropy}};
    ch->threads = (rows + 1) * 32;
    ch->rows_per_block = rows;
    ch->smem = (size_t)rows * 512u * (size_t)unroll * (size_t)stages;
  } else {
    int b = 1, seg = 1;
    if (kind != RLK_BACKEND_HOST) lp_vec_shape(&ctx->target, d, t, &b, &seg);
    ch->spec = (rlk_kernel_spec){
        &lp_fwd_tmpl, {logits, labels, b, seg, kind == RLK_BACKEND_HOST ? 1 : unroll, entropy, t[LP_S_KEPT]}};
    ch->threads = b;
    ch->rows_per_block = b / seg;
  }
  if (ch->smem > ctx->target.smem_per_block)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "block x unroll x stages: a %zu-byte shared-memory ring exceeds %zu bytes",
                     ch->smem, ctx->target.smem_per_block);
  return rlk_spec_validate(&ch->spec);
}

/* The backward kernel of a configuration as it asks (the vector kernel on every target). */
static rlk_status lp_select_bwd_as(const rlk_context *ctx, const rlk_op_values *s, int tma_ok, lp_choice *ch) {
  (void)tma_ok;
  memset(ch, 0, sizeof *ch);
  const rlk_backend kind = ctx->kind;
  const lp_arch_default *d = lp_default(ctx);
  int64_t t[LP_NSETTINGS];
  memcpy(t, s->v, sizeof t);
  const int variant = s->v[LP_S_VARIANT] ? (int)s->v[LP_S_VARIANT] : lp_env_override();
  if (variant != RLK_LOGPROB_VARIANT_VEC && variant != RLK_LOGPROB_VARIANT_AUTO)
    lp_untuned(t); /* falls back with the vector kernel's defaults */
  t[LP_S_STAGES] = 0;
  rlk_status st = lp_check_tuning(&ctx->target, RLK_LOGPROB_VARIANT_VEC, t);
  if (st) return st;
  int block = 1, seg = 1;
  if (kind != RLK_BACKEND_HOST) lp_vec_shape(&ctx->target, d, t, &block, &seg);
  ch->variant = RLK_LOGPROB_VARIANT_VEC;
  ch->spec = (rlk_kernel_spec){&lp_bwd_tmpl,
                               {t[LP_S_LOGITS], t[LP_S_GRAD], t[LP_S_LABELS], block, seg,
                                kind == RLK_BACKEND_HOST ? 1 : (t[LP_S_UNROLL] ? t[LP_S_UNROLL] : d->unroll),
                                t[LP_S_ENTROPY], t[LP_S_KEPT]}};
  ch->threads = block;
  ch->rows_per_block = block / seg;
  return rlk_spec_validate(&ch->spec);
}

/* ---------------------------------------------------------------------------------- */
/* The tuning database                                                                 */
/* ---------------------------------------------------------------------------------- */

/* A configuration's shape in the tuning database for one pass: the settings its kernels depend
 * on, every default spelled out, in plan syntax (what rlk_tune_record.shape holds). */
static int lp_tune_shape(const int64_t *v, int pass, char *buf, size_t size) {
  const char *logits = lp_dt_names[v[LP_S_LOGITS]], *labels = rlk_dtype_name((rlk_dtype)v[LP_S_LABELS]);
  if (pass == LP_PASS_FWD)
    return rlk_format(buf, size, "pass=fwd logits=%s labels=%s entropy=%d vocab=%lld", logits, labels,
                      (int)v[LP_S_ENTROPY], (long long)v[LP_S_VOCAB]);
  return rlk_format(buf, size, "pass=bwd logits=%s labels=%s entropy=%d grad=%s vocab=%lld", logits, labels,
                    (int)v[LP_S_ENTROPY], lp_grad_names[v[LP_S_GRAD]], (long long)v[LP_S_VOCAB]);
}

/* Whether a configuration asks for tuning of its own. */
static int lp_tuning_asked(const int64_t *v) {
  return v[LP_S_VARIANT] || v[LP_S_BLOCK] || v[LP_S_SEG] || v[LP_S_UNROLL] || v[LP_S_STAGES];
}

/* The tuning settings, in the order of a winner's values (rlk_tune_entry_values). */
enum { LP_TUNE_VARIANT, LP_TUNE_BLOCK, LP_TUNE_SEG, LP_TUNE_UNROLL, LP_TUNE_STAGES, LP_NTUNE };
static const int lp_tuning[LP_NTUNE] = {LP_S_VARIANT, LP_S_BLOCK, LP_S_SEG, LP_S_UNROLL, LP_S_STAGES};

/* A winner's settings ("variant=bulk block=256 unroll=4 stages=3", "" for the default) as tuning
 * values; -1 for anything but tuning settings. */
static int lp_parse_tuning(const char *settings, int64_t values[RLK_TUNE_VALUES]) {
  return rlk_op_tuning_values(&rlk_op_logprob, lp_tuning, LP_NTUNE, settings, values);
}

/* The environment lets calls read the database: no forced variant, and not RLK_INVARIANT=1 (a
 * winner per token bucket would give a row other bits in a batch of another size). */
static int lp_reads_tuning(void) { return lp_env_override() == RLK_LOGPROB_VARIANT_AUTO && !rlk_invariant(); }

/* *t = *s with the tuning database's winner for `pass` applied; the entry, or NULL (then *t is
 * *s) when the configuration asks for tuning of its own, N is unknown, or there is no usable
 * record. */
static const rlk_tune_entry *lp_tuned(const rlk_context *ctx, int pass, const rlk_op_values *s, rlk_op_values *t) {
  *t = *s;
  if (s->v[LP_S_TOKENS] <= 0 || lp_tuning_asked(s->v) || s->v[LP_S_KEPT] || !lp_reads_tuning()) return NULL;
  char shape[192];
  int64_t w[RLK_TUNE_VALUES];
  const rlk_tune_entry *e;
  if (lp_tune_shape(s->v, pass, shape, sizeof shape) < 0 ||
      !(e = rlk_op_tuned(ctx, &rlk_op_logprob, shape, s->v[LP_S_TOKENS], lp_parse_tuning, w)))
    return NULL;
  for (int i = 0; i < LP_NTUNE; i++) t->v[lp_tuning[i]] = w[i];
  return e;
}

/* A winner the selection refused on this context: one warning per record, then the default. */
static void lp_tuning_refused(const rlk_tune_entry *e, int pass, const rlk_op_values *s) {
  if (rlk_tune_entry_first_warning(e)) {
    char shape[192];
    lp_tune_shape(s->v, pass, shape, sizeof shape);
    rlk_warn("logprob: the tuning database's winner '%s' for %s cannot run here (%s); running the default",
             rlk_tune_entry_settings(e), shape, rlk_last_error());
  }
  rlk_error_clear();
}

typedef rlk_status (*lp_select_fn)(const rlk_context *ctx, const rlk_op_values *s, int tma_ok, lp_choice *ch);

/* A pass's kernel: the tuning database's winner, else the configuration as it asks. */
static rlk_status lp_select(const rlk_context *ctx, int pass, const rlk_op_values *s, int tma_ok, lp_choice *ch) {
  const lp_select_fn as = pass == LP_PASS_FWD ? lp_select_fwd_as : lp_select_bwd_as;
  rlk_op_values t;
  const rlk_tune_entry *e = lp_tuned(ctx, pass, s, &t);
  if (e) {
    if (as(ctx, &t, tma_ok, ch) == RLK_OK) return RLK_OK;
    lp_tuning_refused(e, pass, s);
  }
  return as(ctx, s, tma_ok, ch);
}

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

static rlk_status lp_plan(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs, size_t *nspecs) {
  const int pass = (int)s->v[LP_S_PASS];
  rlk_status st;
  size_t n = 0;
  lp_choice ch;
  if (pass != LP_PASS_BWD) {
    if ((st = lp_select(ctx, LP_PASS_FWD, s, 1, &ch))) return st;
    specs[n++] = ch.spec;
    if (ch.variant == RLK_LOGPROB_VARIANT_TMA) {
      /* a call whose logits the tensor map cannot describe runs the default instead */
      if ((st = lp_select(ctx, LP_PASS_FWD, s, 0, &ch))) return st;
      specs[n++] = ch.spec;
    }
  }
  if (pass != LP_PASS_FWD) {
    if ((st = lp_select(ctx, LP_PASS_BWD, s, 1, &ch))) return st;
    specs[n++] = ch.spec;
  }
  *nspecs = n;
  return RLK_OK;
}

/* The tuning database key of plan settings: one pass, tokens=, no tuning settings. */
static rlk_status lp_tune_key(const rlk_op_values *s, char *shape, size_t size, int64_t *tokens) {
  const int pass = (int)s->v[LP_S_PASS];
  if (pass == LP_PASS_BOTH)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "pass: a tuning key names one pass, fwd or bwd");
  if (s->v[LP_S_TOKENS] <= 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "tokens: a tuning key needs the token count N > 0");
  if (lp_tuning_asked(s->v))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "variant, block, seg, unroll, stages: a tuning key holds no tuning settings");
  if (s->v[LP_S_KEPT])
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kept: kept-set replay runs the vector kernel and reads no tuning");
  if (lp_tune_shape(s->v, pass, shape, size) < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "logprob: the shape does not fit %zu bytes", size);
  *tokens = rlk_tune_bucket(s->v[LP_S_TOKENS]);
  return RLK_OK;
}

static const char *const lp_samples[] = {
    /* the common trainer shape: bf16 logits, i64 labels, entropy and its gradient */
    "logprob pass=both logits=bf16 labels=i64 entropy=1",
    /* fp16 logits, i32 labels, an f32 gradient; f32 logits */
    "logprob pass=both logits=f16 labels=i32 grad=f32",
    "logprob pass=both logits=f32 labels=i64 entropy=1",
    /* a tiny vocabulary: rows share a block (a lane segment each) */
    "logprob pass=both logits=bf16 labels=i32 vocab=7 entropy=1",
    /* the sm_90 forwards; elsewhere they are the default kernels above */
    "logprob pass=fwd logits=bf16 labels=i64 variant=bulk entropy=1",
    "logprob pass=fwd logits=f16 labels=i32 variant=bulk",
    "logprob pass=fwd logits=f32 labels=i64 variant=tma entropy=1",
    "logprob pass=fwd logits=bf16 labels=i64 variant=tma entropy=1",
    /* kept-set replay */
    "logprob pass=both logits=bf16 labels=i64 entropy=1 kept=1",
    "logprob pass=both logits=f32 labels=i32 vocab=7 kept=1",
    NULL};

/* A call's recorded line: the variant RLK_LOGPROB_VARIANT forced where it asked for auto. */
static void lp_recorded(rlk_op_values *s) {
  if (!s->v[LP_S_VARIANT]) s->v[LP_S_VARIANT] = lp_env_override();
}

const rlk_op_desc rlk_op_logprob = {
    .name = "logprob", .settings = lp_settings, .nsettings = LP_NSETTINGS, .plan = lp_plan, .samples = lp_samples,
    .candidates = lp_candidates, .tune_key = lp_tune_key, .recorded = lp_recorded,
    .reads_tuning = lp_reads_tuning};

/* ---------------------------------------------------------------------------------- */
/* Validation                                                                          */
/* ---------------------------------------------------------------------------------- */

/* logits [N, V] with contiguous rows; writes N, V and the row stride. */
static rlk_status lp_check_matrix(const rlk_tensor *t, const char *what, uint32_t dtypes,
                                  int64_t *N, int64_t *V, int64_t *stride) {
  rlk_status st;
  if ((st = rlk_check_tensor_of(t, what, dtypes, 2, 2))) return st;
  const int64_t n = t->shape[0], v = t->shape[1];
  int64_t s = 0;
  if ((st = rlk_check_contiguous_rows(t, what, &s))) return st;
  /* the last element's byte offset must fit comfortably in 63 bits */
  if (s > ((int64_t)1 << 56) / n)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %lld rows of stride %lld are too large", what,
                     (long long)n, (long long)s);
  *N = n;
  *V = v;
  *stride = s;
  return RLK_OK;
}

static rlk_status lp_check_common(const rlk_tensor *labels, float temperature, int variant,
                                  int64_t N, int64_t *label_stride) {
  rlk_status st;
  if ((st = rlk_check_vector(labels, "labels", LP_LABEL_DTYPES, N, 0, label_stride))) return st;
  if ((st = rlk_check_temperature(temperature, "temperature", 0))) return st;
  return rlk_check_enum(variant, "variant", RLK_LOGPROB_VARIANT_AUTO, RLK_LOGPROB_VARIANT_TMA, "rlk_logprob_variant");
}

/* ---------------------------------------------------------------------------------- */
/* The calls                                                                           */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_logprob_args_init(rlk_logprob_args *args) {
  static const rlk_logprob_args defaults = {
      .temperature = 1.0f, .ignore_index = -100, .variant = RLK_LOGPROB_VARIANT_AUTO};
  if (args) *args = defaults;
}

RLK_API void rlk_logprob_backward_args_init(rlk_logprob_backward_args *args) {
  static const rlk_logprob_backward_args defaults = {
      .temperature = 1.0f, .ignore_index = -100, .variant = RLK_LOGPROB_VARIANT_AUTO};
  if (args) *args = defaults;
}

/* The inputs both passes and the shard form share: logits [N, V], labels [N], temperature and
 * variant (logprob_shard.h). */
rlk_status rlk_logprob_check_inputs(const rlk_tensor *logits, const rlk_tensor *labels, float temperature,
                                    int variant, int64_t ignore_index, void *rows) {
  rlk_status st;
  int64_t N, V, row_stride, label_stride;
  if ((st = lp_check_matrix(logits, "logits", LP_LOGIT_DTYPES, &N, &V, &row_stride)) ||
      (st = lp_check_common(labels, temperature, variant, N, &label_stride)))
    return st;
  const lp_rows_args r = {.logits = logits->data, .row_stride = row_stride, .labels = labels->data,
                          .label_stride = label_stride, .N = N, .V = V, .ignore_index = ignore_index};
  memcpy(rows, &r, sizeof r); /* each kernel struct's declaration asserts these offsets */
  return RLK_OK;
}

/* The common settings of a call's pass. */
static void lp_set_values(rlk_op_values *v, int pass, const rlk_tensor *logits, const rlk_tensor *labels, int entropy,
                          int64_t N, int64_t V, int variant, int block, int unroll, int stages) {
  rlk_op_values_set(v, LP_S_PASS, pass);
  rlk_op_values_set(v, LP_S_LOGITS, rlk_op_float_dt(logits->dtype));
  rlk_op_values_set(v, LP_S_LABELS, labels->dtype);
  rlk_op_values_set(v, LP_S_ENTROPY, entropy);
  rlk_op_values_set(v, LP_S_VOCAB, V);
  rlk_op_values_set(v, LP_S_VARIANT, variant);
  rlk_op_values_set(v, LP_S_BLOCK, block);
  rlk_op_values_set(v, LP_S_SEG, 0);
  rlk_op_values_set(v, LP_S_UNROLL, unroll);
  rlk_op_values_set(v, LP_S_STAGES, stages);
  rlk_op_values_set(v, LP_S_TOKENS, N);
}

/* A forward call: the kernel's argument (the forward's struct, k.rows, behind the tensor map the
 * tensor-map variant reads), the kernel that runs and the request of the logits' map. */
typedef struct lp_fwd_call {
  rlk_op_call op;
  lp_fwd_tma_args k;
  lp_choice ch;
  rlk_tma_desc_request req;
} lp_fwd_call;
_Static_assert(_Alignof(lp_fwd_call) <= RLK_OP_CALL_ALIGN, "the call driver holds a call's state aligned for it");

static rlk_status lp_fwd_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  (void)ctx;
  const rlk_logprob_args *a = args;
  lp_fwd_call *c = (lp_fwd_call *)call;
  rlk_status st;
  lp_fwd_args *k = &c->k.rows;
  if ((st = rlk_logprob_check_inputs(&a->logits, &a->labels, a->temperature, (int)a->variant, a->ignore_index, k)))
    return st;
  const int64_t N = k->N, V = k->V;
  if ((st = rlk_check_vector(&a->logp, "logp", RLK_DTYPE_BIT(RLK_F32), N, 1, NULL))) return st;
  if (a->lse.data && (st = rlk_check_vector(&a->lse, "lse", RLK_DTYPE_BIT(RLK_F32), N, 1, NULL))) return st;
  if (a->entropy.data && (st = rlk_check_vector(&a->entropy, "entropy", RLK_DTYPE_BIT(RLK_F32), N, 1, NULL)))
    return st;
  if ((st = rlk_check_status(&a->status))) return st;
  if (a->threshold.data && (st = rlk_check_vector(&a->threshold, "threshold", RLK_DTYPE_BIT(RLK_F32), N, 1, NULL)))
    return st;
  lp_set_values(&call->vals, LP_PASS_FWD, &a->logits, &a->labels, a->entropy.data != NULL, N, V, (int)a->variant,
                a->block, a->unroll, a->stages);
  rlk_op_values_set(&call->vals, LP_S_KEPT, a->threshold.data != NULL);
  k->logp = (float *)a->logp.data;
  k->lse = (float *)a->lse.data;
  k->entropy = (float *)a->entropy.data;
  k->status = (int32_t *)a->status.data;
  k->threshold = (const float *)a->threshold.data;
  k->temperature = a->temperature;
  rlk_tma_desc_request *r = &c->req;
  r->base = a->logits.data;
  r->dtype = a->logits.dtype;
  r->rows = (uint64_t)N;
  r->cols = (uint64_t)V;
  r->row_stride = (uint64_t)k->row_stride;
  r->box_cols = (uint32_t)(512 / lp_dt_bytes(rlk_op_float_dt(a->logits.dtype)));
  return RLK_OK;
}

/* Selects as if a tensor map could describe the logits; only when the tensor-map variant is what
 * runs is that checked, and a refusal selects again without it. */
static rlk_status lp_fwd_select(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  (void)args;
  lp_fwd_call *c = (lp_fwd_call *)call;
  rlk_status st = lp_select(ctx, LP_PASS_FWD, &call->vals, (ctx->target.features & RLK_TARGET_TMA) != 0, &c->ch);
  if (st) return st;
  if (c->ch.variant == RLK_LOGPROB_VARIANT_TMA) {
    c->req.box_rows = (uint32_t)c->ch.rows_per_block;
    if (c->k.rows.N > INT32_MAX || c->k.rows.V > INT32_MAX || rlk_tma_check(&c->req) != RLK_OK) {
      rlk_debug("logprob: tensor map refused (%s): falling back", rlk_last_error());
      if ((st = lp_select(ctx, LP_PASS_FWD, &call->vals, 0, &c->ch))) return st;
    }
  }
  call->specs[0] = c->ch.spec;
  call->nspecs = 1;
  return RLK_OK;
}

static uint64_t lp_min_u(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Blocks of a shared-memory variant resident per SM, for a persistent grid. */
static uint64_t lp_sm90_blocks_per_sm(const rlk_target *t, const lp_choice *ch) {
  const size_t per_block = ch->smem + 2048; /* barriers, scratch and the runtime's reserve */
  uint64_t by_smem = t->smem_per_sm / per_block;
  uint64_t by_threads = 2048u / (uint64_t)ch->threads;
  uint64_t b = by_smem < by_threads ? by_smem : by_threads;
  if (b > 32) b = 32;
  return b ? b : 1;
}

/* The vector kernel: a block per group of rows; the shared-memory variants: persistent blocks.
 * The tensor-map variant's struct holds the map, encoded here; a map the driver refuses (what the
 * check accepted) runs the default rather than fail. */
static rlk_status lp_fwd_launch(rlk_context *ctx, const void *args, rlk_op_call *call, void *stream) {
  (void)args;
  lp_fwd_call *c = (lp_fwd_call *)call;
  const uint64_t sms = ctx->target.multiprocessors > 0 ? (uint64_t)ctx->target.multiprocessors : 1;
  const uint64_t groups = (uint64_t)((c->k.rows.N + c->ch.rows_per_block - 1) / c->ch.rows_per_block);
  rlk_launch_dims d;
  if (ctx->kind == RLK_BACKEND_HOST)
    d = rlk_op_grid(1, 1, 1, 1, 0);
  else if (c->ch.variant == RLK_LOGPROB_VARIANT_VEC)
    d = rlk_op_grid(lp_min_u(groups, 1u << 20), 1, 1, (unsigned)c->ch.threads, 0);
  else
    d = rlk_op_grid(lp_min_u(groups, sms * lp_sm90_blocks_per_sm(&ctx->target, &c->ch)), 1, 1,
                    (unsigned)c->ch.threads, c->ch.smem);
  if (c->ch.variant != RLK_LOGPROB_VARIANT_TMA)
    return rlk_context_launch_params(ctx, &c->ch.spec, &d, stream, &c->k.rows);
  rlk_status st = rlk_context_tensor_map(ctx, &c->req, &c->k.map);
  if (!st) return rlk_context_launch_params(ctx, &c->ch.spec, &d, stream, &c->k);
  rlk_warn("logprob: tensor map not encoded (%s); running the default variant", rlk_last_error());
  if ((st = lp_select(ctx, LP_PASS_FWD, &call->vals, 0, &c->ch))) return st;
  const uint64_t g2 = (uint64_t)((c->k.rows.N + c->ch.rows_per_block - 1) / c->ch.rows_per_block);
  d = rlk_op_grid(lp_min_u(g2, 1u << 20), 1, 1, (unsigned)c->ch.threads, 0);
  return rlk_context_launch_params(ctx, &c->ch.spec, &d, stream, &c->k.rows);
}

static const rlk_arg_field lp_fwd_fields[] = {
    RLK_ARG_IN(rlk_logprob_args, logits), RLK_ARG_IN(rlk_logprob_args, labels),
    RLK_ARG_OUT(rlk_logprob_args, logp),  RLK_ARG_OUT(rlk_logprob_args, lse),
    RLK_ARG_OUT(rlk_logprob_args, entropy), RLK_ARG_OUT(rlk_logprob_args, status),
    RLK_ARG_IN(rlk_logprob_args, threshold)};

static const rlk_op_entry lp_fwd_entry = {
    .name = "rlk_logprob", .op = &rlk_op_logprob, .call_size = sizeof(lp_fwd_call), RLK_OP_FIELDS(lp_fwd_fields),
    .validate = lp_fwd_validate, .select = lp_fwd_select, .launch = lp_fwd_launch};

RLK_API rlk_status rlk_logprob(rlk_context *ctx, const rlk_logprob_args *a, void *stream) {
  if (a && a->partials.data) return rlk_logprob_shard_forward(ctx, a, stream);
  return rlk_op_run(&lp_fwd_entry, ctx, a, stream);
}

/* A backward call: the kernel's argument. */
typedef struct lp_bwd_call {
  rlk_op_call op;
  lp_bwd_kernel_args k;
} lp_bwd_call;

static rlk_status lp_bwd_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  (void)ctx;
  const rlk_logprob_backward_args *a = args;
  rlk_status st;
  lp_bwd_kernel_args *k = &((lp_bwd_call *)call)->k;
  if ((st = rlk_logprob_check_inputs(&a->logits, &a->labels, a->temperature, (int)a->variant, a->ignore_index, k)))
    return st;
  const int64_t N = k->N, V = k->V;
  const uint32_t f32 = RLK_DTYPE_BIT(RLK_F32);
  int64_t lse_s = 1, glp_s = 1, ent_s = 1, gent_s = 1;
  if ((st = rlk_check_vector(&a->lse, "lse", f32, N, 0, &lse_s))) return st;
  if (a->grad_logp.data && (st = rlk_check_vector(&a->grad_logp, "grad_logp", f32, N, 0, &glp_s)))
    return st;
  if (a->grad_entropy.data) {
    if ((st = rlk_check_vector(&a->grad_entropy, "grad_entropy", f32, N, 0, &gent_s))) return st;
    if (!a->entropy.data)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "entropy: required with grad_entropy (E_p[z] = lse - entropy)");
    if ((st = rlk_check_vector(&a->entropy, "entropy", f32, N, 0, &ent_s))) return st;
  }
  if (!a->grad_logp.data && !a->grad_entropy.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "grad_logp and grad_entropy: give at least one");
  const uint32_t out_dtypes = RLK_DTYPE_BIT(a->logits.dtype) | f32;
  int64_t gN, gV, grad_stride;
  if ((st = lp_check_matrix(&a->grad_logits, "grad_logits", out_dtypes, &gN, &gV, &grad_stride)))
    return st;
  if (gN != N || gV != V)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "grad_logits: shape [%lld, %lld], expected [%lld, %lld]",
                     (long long)gN, (long long)gV, (long long)N, (long long)V);
  if (a->grad_logits.data == a->logits.data &&
      (a->grad_logits.dtype != a->logits.dtype || (N > 1 && grad_stride != k->row_stride)))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "grad_logits: in place over the logits needs the same dtype and row stride");
  if ((st = rlk_check_status(&a->status))) return st;
  if ((st = rlk_check_flag(a->shard, "shard"))) return st;
  /* the shard form's checks are its forward's: its vocabulary offset, and no kept set */
  if (a->shard && (st = rlk_check_vocab_start(a->vocab_start))) return st;
  if (a->shard && a->threshold.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "threshold: kept-set replay has no shard form");
  if (a->threshold.data && (st = rlk_check_vector(&a->threshold, "threshold", f32, N, 1, NULL))) return st;
  lp_set_values(&call->vals, LP_PASS_BWD, &a->logits, &a->labels, a->grad_entropy.data != NULL, N, V,
                (int)a->variant, a->block, a->unroll, 0);
  rlk_op_values_set(&call->vals, LP_S_KEPT, a->threshold.data != NULL);
  rlk_op_values_set(&call->vals, LP_S_GRAD, a->grad_logits.dtype == a->logits.dtype ? LP_GRAD_SAME : LP_GRAD_F32);
  k->lse = (const float *)a->lse.data;
  k->lse_stride = lse_s;
  k->grad_logp = (const float *)a->grad_logp.data;
  k->grad_logp_stride = glp_s;
  k->entropy = a->grad_entropy.data ? (const float *)a->entropy.data : NULL;
  k->entropy_stride = ent_s;
  k->grad_entropy = (const float *)a->grad_entropy.data;
  k->grad_entropy_stride = gent_s;
  k->grad = a->grad_logits.data;
  k->grad_stride = grad_stride;
  k->status = (int32_t *)a->status.data;
  k->vocab_start = a->shard ? a->vocab_start : 0;
  k->temperature = a->temperature;
  k->shard = a->shard != 0;
  k->threshold = (const float *)a->threshold.data;
  return RLK_OK;
}

/* A block per group of rows (the forward's layout); few rows: each row's vectors split over
 * grid.y so that every SM has blocks. */
static void lp_bwd_dims(const rlk_context *ctx, const rlk_op_call *call, size_t i, rlk_launch_dims *d) {
  if (ctx->kind == RLK_BACKEND_HOST) return;
  const lp_bwd_kernel_args *k = &((const lp_bwd_call *)call)->k;
  const int64_t threads = call->specs[i].values[3], rows_per_block = threads / call->specs[i].values[4];
  const uint64_t groups = (uint64_t)((k->N + rows_per_block - 1) / rows_per_block);
  const uint64_t sms = ctx->target.multiprocessors > 0 ? (uint64_t)ctx->target.multiprocessors : 1;
  uint64_t splits = 1;
  const uint64_t want = sms * 4;
  if (rows_per_block == 1 && groups < want) {
    const uint64_t per_block = (uint64_t)threads * 4u * 16u; /* bytes worth one block */
    const uint64_t most = (uint64_t)(k->V * lp_dt_bytes((int)call->vals.v[LP_S_LOGITS])) / per_block;
    splits = (want + groups - 1) / groups;
    if (splits > most) splits = most ? most : 1;
    if (splits > 65535) splits = 65535;
  }
  *d = rlk_op_grid(lp_min_u(groups, 1u << 20), splits, 1, (unsigned)threads, 0);
}

static const rlk_arg_field lp_bwd_fields[] = {
    RLK_ARG_IN(rlk_logprob_backward_args, logits),       RLK_ARG_IN(rlk_logprob_backward_args, labels),
    RLK_ARG_IN(rlk_logprob_backward_args, lse),          RLK_ARG_IN(rlk_logprob_backward_args, grad_logp),
    RLK_ARG_IN(rlk_logprob_backward_args, grad_entropy), RLK_ARG_IN(rlk_logprob_backward_args, entropy),
    RLK_ARG_INPLACE(rlk_logprob_backward_args, grad_logits, "logits"),
    RLK_ARG_OUT(rlk_logprob_backward_args, status), RLK_ARG_IN(rlk_logprob_backward_args, threshold)};

static const rlk_op_entry lp_bwd_entry = {
    .name = "rlk_logprob_backward", .op = &rlk_op_logprob, .call_size = sizeof(lp_bwd_call),
    RLK_OP_FIELDS(lp_bwd_fields), .validate = lp_bwd_validate, .params_at = offsetof(lp_bwd_call, k), .dims = lp_bwd_dims};

RLK_OP_DEFINE_CALL(rlk_logprob_backward, rlk_logprob_backward_args, lp_bwd_entry)

/* ---------------------------------------------------------------------------------- */
/* The forward's row layout, for kernels that must agree with it bitwise               */
/* ---------------------------------------------------------------------------------- */

/* The vector forward's configuration for logits of that dtype, rows of V and the tuning requests. */
static void lp_vec_values(rlk_dtype logits, int64_t V, int block, int unroll, rlk_op_values *s) {
  rlk_op_values_init(&rlk_op_logprob, s);
  s->v[LP_S_LOGITS] = rlk_op_float_dt(logits);
  s->v[LP_S_VOCAB] = V;
  s->v[LP_S_VARIANT] = RLK_LOGPROB_VARIANT_VEC;
  s->v[LP_S_BLOCK] = block;
  s->v[LP_S_UNROLL] = unroll;
}

rlk_status rlk_logprob_vec_layout(const rlk_context *ctx, rlk_dtype logits, int64_t V, int block,
                                  int unroll, int *seg, int *unroll_out) {
  rlk_op_values s;
  lp_vec_values(logits, V, block, unroll, &s);
  lp_choice ch;
  rlk_status st = lp_select(ctx, LP_PASS_FWD, &s, 1, &ch);
  if (st) return st;
  *seg = (int)ch.spec.values[3];
  *unroll_out = (int)ch.spec.values[4];
  return RLK_OK;
}

rlk_status rlk_logprob_vec_shape(const rlk_context *ctx, rlk_dtype logits, int64_t V, int block,
                                 int unroll, int *block_out, int *seg, int *unroll_out) {
  rlk_op_values s;
  lp_vec_values(logits, V, block, unroll, &s);
  lp_choice ch;
  rlk_status st = lp_select_fwd_as(ctx, &s, 1, &ch);
  if (st) return st;
  *block_out = (int)ch.spec.values[2];
  *seg = (int)ch.spec.values[3];
  *unroll_out = (int)ch.spec.values[4];
  return RLK_OK;
}

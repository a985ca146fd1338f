/* linear_logprob.c - the fused LM head + token log-probs (rlk_linear_logprob) and its backward:
 * validation, kernel choice, the vocabulary split and chunks, launches.
 *
 * Forward kernels (templates/cuda/linear_logprob*.cuh, templates/host/linear_logprob_fwd.c):
 *   linear_logprob_fwd_sm90   sm_90a: TMA + wgmma, 128 rows x 256 columns a tile
 *   linear_logprob_fwd_tiled  every GPU target: f32 tiles of 64 x 64 from shared memory
 *   linear_logprob_combine    merges each row's split records in split order
 *   linear_logprob_fwd_host   the host backend: fp64 throughout
 * A GPU forward is a GEMM launch over (row blocks, splits) writing [splits][N] records into the
 * caller's workspace, then the combine launch. Selection (ll_select) serves calls and the
 * precompile plan alike.
 *
 * Backward kernels (templates/cuda/linear_logprob_bwd.cuh, templates/host/linear_logprob_bwd.c):
 * per vocabulary chunk, in order, linear_logprob_bwd_dz (recomputed logits -> dz in the
 * workspace), _dh (the f32 grad_hidden sum: grad_hidden itself when that is f32, else in the
 * workspace) and _dw (grad_weight rows of the chunk); then, for a 16-bit grad_hidden, _dh_out
 * writes it from the sum. On sm_90a, when tensor maps can describe hidden and
 * weight, linear_logprob_bwd_sm90 (templates/cuda/linear_logprob_bwd_sm90.cuh) runs the same
 * three products per chunk by TMA + wgmma, dz in the inputs' 16-bit dtype. The host runs
 * linear_logprob_bwd_host (fp64).
 *
 * Tuning: the forward's ring depth (stages) and split, the backward's chunk and tile order
 * (group); a call that asks for none takes the tuning database's winner for its key (ll_tuned). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "ops/invariant.h"
#include "ops/linear_logprob_fwd.h"
#include "ops/linear_logprob_plan.h"
#include "ops/linear_logprob_rows.h"
#include "ops/linear_logprob_stored.h"
#include "ops/ops.h"
#include "runtime/record.h"
#include "tune/tune_db.h"
#include "tune/tune_table.h"
#include "common/linear_logprob_params.h"

/* The kernels' arguments (templates/common/linear_logprob_params.h). */
RLK_PARAMS_DECLARE(ll_fwd_host_args, RLK_LL_FWD_HOST_PARAMS, RLK_LL_FWD_HOST_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ll_combine_args, RLK_LL_COMBINE_PARAMS, RLK_LL_COMBINE_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ll_bwd_host_args, RLK_LL_BWD_HOST_PARAMS, RLK_LL_BWD_HOST_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ll_bwd_dz_args, RLK_LL_BWD_DZ_PARAMS, RLK_LL_BWD_DZ_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ll_bwd_dh_args, RLK_LL_BWD_DH_PARAMS, RLK_LL_BWD_DH_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ll_bwd_dw_args, RLK_LL_BWD_DW_PARAMS, RLK_LL_BWD_DW_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ll_bwd_dh_out_args, RLK_LL_BWD_DH_OUT_PARAMS, RLK_LL_BWD_DH_OUT_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ll_stored_dz_args, RLK_LL_STORED_DZ_PARAMS, RLK_LL_STORED_DZ_PARAMS_SIZE);

static const char *const ll_dt_names[] = RLK_PARAMS_ENUM_NAMES(RLK_FLOAT_DTS); /* f32: not a choice */
static const char *const ll_variant_names[] = {"auto", "wgmma", "tiled", NULL};

#define LL_LABEL_DTYPES (RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64))
#define LL_HIDDEN_DTYPES (RLK_DTYPE_BIT(RLK_F16) | RLK_DTYPE_BIT(RLK_BF16))
#define LL_N(a) (sizeof(a) / sizeof((a)[0]))

/* The tiles and blocks the kernels are written for: LL_SM90_*, LL_TILE, LL_THREADS
 * (linear_logprob_params.h). The combine's block: eight rows, a warp a row. */
#define LL_RECORD_BYTES 16
/* The forward's records at most (ceil(V / 256) a row, 16 bytes each; launches of fewer rows past
 * it): at V 151936, 14080 rows a launch. */
#define LL_FWD_WORKSPACE_BYTES ((int64_t)128 << 20)

static const rlk_param_decl ll_sm90_params[] = {
    {"hidden", RLK_PARAM_ENUM, 1, 2, 0, 0, ll_dt_names},
    {"labels", RLK_PARAM_DTYPE, 0, 0, 0, LL_LABEL_DTYPES, NULL},
    {"stages", RLK_PARAM_INT, 2, 4, 0, 0, NULL},
    {"entropy", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
};
static const rlk_param_decl ll_tiled_params[] = {
    {"hidden", RLK_PARAM_ENUM, 1, 2, 0, 0, ll_dt_names},
    {"labels", RLK_PARAM_DTYPE, 0, 0, 0, LL_LABEL_DTYPES, NULL},
    {"entropy", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
};
static const rlk_param_decl ll_combine_params[] = {
    {"labels", RLK_PARAM_DTYPE, 0, 0, 0, LL_LABEL_DTYPES, NULL},
    {"entropy", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
};

static const rlk_template ll_sm90_tmpl = {"linear_logprob", "linear_logprob_fwd_sm90",
                                          "cuda/linear_logprob_sm90.cuh", NULL,
                                          LL_N(ll_sm90_params), ll_sm90_params, RLK_TARGET_WGMMA | RLK_TARGET_TMA};
static const rlk_template ll_tiled_tmpl = {"linear_logprob", "linear_logprob_fwd_tiled",
                                           "cuda/linear_logprob.cuh", NULL, LL_N(ll_tiled_params),
                                           ll_tiled_params};
static const rlk_template ll_combine_tmpl = {"linear_logprob", "linear_logprob_combine",
                                             "cuda/linear_logprob.cuh", NULL,
                                             LL_N(ll_combine_params), ll_combine_params};
static const rlk_template ll_host_tmpl = {"linear_logprob", "linear_logprob_fwd_host", NULL,
                                          "host/linear_logprob_fwd.c", LL_N(ll_tiled_params),
                                          ll_tiled_params};

/* The settings of a configuration line (the table is with the plan, below). */
enum {
  LL_S_PASS, LL_S_HIDDEN, LL_S_LABELS, LL_S_ENTROPY, LL_S_GRAD, LL_S_ROWS, LL_S_VARIANT, LL_S_STAGES, LL_S_SPLITS,
  LL_S_CHUNK, LL_S_GROUP, LL_S_HIDDEN_SIZE, LL_S_VOCAB, LL_S_TOKENS, LL_NSETTINGS
};

/* The rows setting's values: no selection, or its indices' dtype. */
static const char *const ll_rows_names[] = {"none", "i32", "i64", NULL};
static int ll_rows_line(const rlk_ll_rows *r) { return !r->data ? 0 : r->dtype == RLK_I32 ? 1 : 2; }
static rlk_dtype ll_rows_dtype(int64_t line) { return line == 1 ? RLK_I32 : RLK_I64; }

/* The tuning database's winner for a call's key (ll_tuned_fwd / ll_tuned_bwd below): its
 * settings into *stages and *splits, or *chunk and *group; untouched without a usable record. */
static void ll_tuned_fwd(const rlk_context *ctx, rlk_dtype hidden, rlk_dtype labels, int entropy, int64_t H, int64_t V,
                         int64_t N, int *stages, int *splits);
static void ll_tuned_bwd(const rlk_context *ctx, rlk_dtype hidden, rlk_dtype labels, int entropy, int grad, int64_t H,
                         int64_t V, int64_t N, int *chunk, int *group);

/* A call's configuration line (pass 0 fwd, 1 bwd, 3 chunks; grad 0 f32, 1 the hidden dtype): the
 * settings its kernels depend on, the sm_90a forward's stages when not the default. */
static void ll_line(rlk_op_values *v, int pass, rlk_dtype hidden, rlk_dtype labels, int entropy, int grad,
                    int variant, int stages);

typedef struct ll_choice {
  int variant; /* what runs: WGMMA or TILED on a GPU; AUTO on the host */
  rlk_kernel_spec gemm, combine;
} ll_choice;

/* sm_90a exactly: wgmma needs the arch-specific target. */
static int ll_wgmma_target(const rlk_context *ctx) {
  return ctx->kind == RLK_BACKEND_CUDA && (ctx->target.features & RLK_TARGET_WGMMA) != 0;
}

static int ll_dt_code(int64_t dtype) { return dtype == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16; }

static size_t ll_align256(size_t x) { return (x + 255u) & ~(size_t)255u; }

/* The forward's kernels of a configuration (hidden, labels, entropy, variant, stages); tma_ok:
 * hidden and weight can be described by 128-byte-swizzled tensor maps. */
static rlk_status ll_select(const rlk_context *ctx, const rlk_op_values *s, int tma_ok, ll_choice *ch) {
  memset(ch, 0, sizeof *ch);
  const int64_t hidden = ll_dt_code(s->v[LL_S_HIDDEN]), labels = s->v[LL_S_LABELS], entropy = s->v[LL_S_ENTROPY];
  const int variant = (int)s->v[LL_S_VARIANT];
  if (ctx->kind == RLK_BACKEND_HOST) {
    ch->variant = RLK_LINEAR_LOGPROB_AUTO;
    ch->gemm = (rlk_kernel_spec){&ll_host_tmpl, {hidden, labels, entropy}};
    return rlk_spec_validate(&ch->gemm);
  }
  int v = variant;
  if (v != RLK_LINEAR_LOGPROB_TILED)
    v = ll_wgmma_target(ctx) && tma_ok ? RLK_LINEAR_LOGPROB_WGMMA : RLK_LINEAR_LOGPROB_TILED;
  if (variant == RLK_LINEAR_LOGPROB_WGMMA && v != RLK_LINEAR_LOGPROB_WGMMA)
    rlk_debug("linear_logprob: wgmma is not available here (%s); using the tiled kernel",
              ll_wgmma_target(ctx) ? "no tensor map" : "needs sm_90a");
  ch->variant = v;
  if (v == RLK_LINEAR_LOGPROB_WGMMA)
    ch->gemm = (rlk_kernel_spec){
        &ll_sm90_tmpl, {hidden, labels, s->v[LL_S_STAGES] ? s->v[LL_S_STAGES] : LL_SM90_STAGES, entropy}};
  else
    ch->gemm = (rlk_kernel_spec){&ll_tiled_tmpl, {hidden, labels, entropy}};
  ch->combine = (rlk_kernel_spec){&ll_combine_tmpl, {labels, entropy}};
  rlk_status st = rlk_spec_validate(&ch->gemm);
  return st ? st : rlk_spec_validate(&ch->combine);
}

/* A [rows, cols] matrix of one of `dtypes` with contiguous rows (its alignment and span checked
 * for its own dtype); writes the row stride. */
static rlk_status ll_check_matrix_of(const rlk_tensor *t, const char *what, uint32_t dtypes, int64_t *rows,
                                     int64_t *cols, int64_t *stride) {
  rlk_status st;
  if ((st = rlk_check_tensor_of(t, what, dtypes, 2, 2))) return st;
  const int64_t n = t->shape[0], h = t->shape[1];
  if (n < 1 || h < 1)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape [%lld, %lld] has an empty dimension", what,
                     (long long)n, (long long)h);
  int64_t s = 0;
  if ((st = rlk_check_contiguous_rows(t, what, &s))) return st;
  if (n > INT32_MAX || h > INT32_MAX || s > ((int64_t)1 << 56) / n)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %lld rows of stride %lld are too large", what,
                     (long long)n, (long long)s);
  *rows = n;
  *cols = h;
  *stride = s;
  return RLK_OK;
}

static rlk_status ll_check_matrix(const rlk_tensor *t, const char *what, int64_t *rows, int64_t *cols,
                                  int64_t *stride) {
  return ll_check_matrix_of(t, what, LL_HIDDEN_DTYPES, rows, cols, stride);
}

/* A gradient output, given (ll_check_matrix_of's checks) and [rows, cols]: its row stride, and
 * its float code in *dt. */
static rlk_status ll_check_grad(const rlk_tensor *t, const char *what, uint32_t dtypes, int64_t rows, int64_t cols,
                                int64_t *stride, int *dt) {
  rlk_status st;
  int64_t r, c;
  if ((st = ll_check_matrix_of(t, what, dtypes, &r, &c, stride))) return st;
  if (r != rows || c != cols)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape [%lld, %lld], expected [%lld, %lld]", what, (long long)r,
                     (long long)c, (long long)rows, (long long)cols);
  *dt = rlk_op_float_dt(t->dtype);
  return RLK_OK;
}

typedef rlk_ll_head ll_head;

rlk_status rlk_ll_check_variant(int variant) {
  return rlk_check_enum(variant, "variant", RLK_LINEAR_LOGPROB_AUTO, RLK_LINEAR_LOGPROB_TILED,
                        "rlk_linear_logprob_variant");
}

rlk_status rlk_ll_check_head(const rlk_tensor *hidden, const rlk_tensor *weight, const rlk_tensor *labels,
                             float temperature, rlk_ll_head *h) {
  rlk_status st;
  int64_t wH;
  if ((st = ll_check_matrix(hidden, "hidden", &h->N, &h->H, &h->hs))) return st;
  if ((st = ll_check_matrix(weight, "weight", &h->V, &wH, &h->ws))) return st;
  if (wH != h->H)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "weight: %lld columns, hidden has H = %lld", (long long)wH,
                     (long long)h->H);
  if (weight->dtype != hidden->dtype)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "weight: dtype %s differs from hidden's %s",
                     rlk_dtype_name(weight->dtype), rlk_dtype_name(hidden->dtype));
  h->ls = 1;
  if (labels && (st = rlk_check_vector(labels, "labels", LL_LABEL_DTYPES, h->N, 0, &h->ls))) return st;
  return rlk_check_positive(temperature, "temperature");
}

/* A forward call: its forward (the head, the kernels, the records, the splits asked for, the
 * tensor maps' requests), a launch's rows at most, the shard form; a row selection, the caller's
 * hidden row stride and where the gathered rows lie in the workspace. */
typedef struct ll_call {
  rlk_op_call op;
  rlk_ll_fwd f;
  int64_t rows;
  int shard; /* records instead of logp, lse and entropy */
  rlk_ll_rows r;
  int64_t hidden_stride;
  size_t gathered_at;
} ll_call;

static rlk_status ll_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_linear_logprob_args *a = args;
  ll_call *k = (ll_call *)call;
  rlk_status st;
  if ((st = rlk_ll_check_head(&a->hidden, &a->weight, a->rows.data ? NULL : &a->labels, a->temperature, &k->f.h)))
    return st;
  k->hidden_stride = k->f.h.hs;
  if ((st = rlk_ll_rows_check(&a->rows, &a->labels, &k->f.h, &k->r))) return st;
  const int64_t N = k->f.h.N;
  const uint32_t f32 = RLK_DTYPE_BIT(RLK_F32);
  k->shard = a->partials.data != NULL;
  if (k->shard) {
    /* the shard form: records instead of the outputs */
    if (a->logp.data || a->lse.data || a->entropy.data)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "logp, lse, entropy: absent in the shard form (partials is given)");
    const rlk_tensor *p = &a->partials;
    if ((st = rlk_check_tensor_of(p, "partials", f32, 2, 2))) return st;
    if (p->shape[0] != N || p->shape[1] != RLK_LOGPROB_PARTIAL_FIELDS)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "partials: shape [%lld, %lld], expected [%lld, %d]",
                       (long long)p->shape[0], (long long)p->shape[1], (long long)N,
                       RLK_LOGPROB_PARTIAL_FIELDS);
    if ((st = rlk_check_contiguous(p, "partials"))) return st;
    if ((uintptr_t)p->data % 16)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "partials: not 16-byte aligned");
    if ((st = rlk_check_vocab_start(a->vocab_start))) return st;
  } else {
    if (a->vocab_start != 0 || a->partial_entropy)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "vocab_start, partial_entropy: only in the shard form (with partials)");
    if ((st = rlk_check_vector(&a->logp, "logp", f32, N, 1, NULL))) return st;
  }
  if (a->lse.data && (st = rlk_check_vector(&a->lse, "lse", f32, N, 1, NULL))) return st;
  if (a->entropy.data && (st = rlk_check_vector(&a->entropy, "entropy", f32, N, 1, NULL))) return st;
  if (a->status.data) {
    if ((st = rlk_check_tensor(&a->status, "status", 1))) return st;
    if ((st = rlk_check_dtype(&a->status, "status", RLK_DTYPE_BIT(RLK_I32)))) return st;
  }
  if (!k->shard && (a->logp.data == a->lse.data || a->logp.data == a->entropy.data ||
                    (a->lse.data && a->lse.data == a->entropy.data)))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "logp, lse, entropy: outputs must be distinct");
  if (a->threshold.data) {
    if (k->shard) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "threshold: kept-set replay has no shard form");
    if ((st = rlk_check_vector(&a->threshold, "threshold", f32, N, 1, NULL))) return st;
  }
  if (a->splits < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "splits: %d is negative", a->splits);
  if (a->stages != 0 && (a->stages < 2 || a->stages > LL_SM90_STAGES))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "stages: %d is not 0 (the default) or 2 to %d", a->stages,
                     LL_SM90_STAGES);
  if ((st = rlk_ll_check_variant((int)a->variant))) return st;

  const int entropy = k->shard ? a->partial_entropy != 0 : a->entropy.data != NULL;
  int stages = a->stages, splits = a->splits;
  if (!a->stages && !splits)
    ll_tuned_fwd(ctx, a->hidden.dtype, a->labels.dtype, entropy, k->f.h.H, k->f.h.V, N, &stages, &splits);
  /* a row selection: the kernels run on the gathered rows, which a tensor map always describes */
  const rlk_tensor planned = k->r.data ? rlk_ll_rows_planned(&a->hidden, &k->r) : a->hidden;
  if (k->r.data) k->f.h.hs = k->r.pitch;
  if ((st = rlk_ll_fwd_plan(ctx, &planned, &a->weight, &k->f.h, a->labels.dtype, entropy, (int)a->variant, stages,
                            splits, &call->vals, &k->f)))
    return st;
  if (k->r.data) {
    rlk_op_values_set(&call->vals, LL_S_ROWS, ll_rows_line(&k->r));
    call->specs[call->nspecs++] = rlk_ll_gather_spec(ll_dt_code(a->hidden.dtype), k->r.dtype);
  }
  call->specs[call->nspecs++] = k->f.gemm;
  /* gathered rows in launches within their budget */
  const int64_t gathered_row = k->r.pitch * 2;
  k->rows = k->r.data ? rlk_ll_rows_within(N, gathered_row, rlk_ll_rows_budget()) : N;
  if (ctx->kind != RLK_BACKEND_HOST) {
    call->specs[call->nspecs++] = k->f.combine;
    /* records of 256 columns from V alone; rows in launches within the budget; the split a
     * launch's schedule (linear_logprob_plan.h) */
    const int64_t rows = rlk_ll_fwd_rows(N, k->f.h.V, LL_FWD_WORKSPACE_BYTES);
    if (rows < k->rows) k->rows = rows;
    call->workspace = (size_t)k->f.records * (size_t)k->rows * LL_RECORD_BYTES;
  }
  if (k->r.data) {
    k->gathered_at = ll_align256(call->workspace);
    call->workspace = k->gathered_at + rlk_ll_rows_bytes(k->rows, k->r.pitch, 2);
  }
  return RLK_OK;
}

/* A forward of hidden and weight for labels of a dtype (the GEMM's and the combine's), the
 * entropy, the variant, the sm_90a ring depth and the splits asked for: the call's line on vals,
 * its kernels, its records and tensor maps (linear_logprob_fwd.h). */
rlk_status rlk_ll_fwd_plan(const rlk_context *ctx, const rlk_tensor *hidden, const rlk_tensor *weight,
                           const rlk_ll_head *h, rlk_dtype labels, int entropy, int variant, int stages, int splits,
                           rlk_op_values *vals, rlk_ll_fwd *f) {
  rlk_status st;
  f->h = *h;
  f->hidden = hidden->data;
  f->hidden_row0 = 0;
  f->weight = weight->data;
  f->splits = splits;
  ll_line(vals, 0, hidden->dtype, labels, entropy, 0, variant, stages);
  /* tensor maps: h boxes of 64 x 128, W boxes of 64 x 256, both with the 128-byte swizzle */
  rlk_tma_desc_request *r[2] = {&f->req_h, &f->req_w};
  const rlk_tensor *t[2] = {hidden, weight};
  const int64_t rows[2] = {h->N, h->V}, strides[2] = {h->hs, h->ws};
  const uint32_t box_rows[2] = {LL_SM90_BM, LL_SM90_BN};
  int tma_ok = 1;
  for (int i = 0; i < 2; i++) {
    memset(r[i], 0, sizeof *r[i]);
    r[i]->base = t[i]->data;
    r[i]->dtype = t[i]->dtype;
    r[i]->rows = (uint64_t)rows[i];
    r[i]->cols = (uint64_t)h->H;
    r[i]->row_stride = (uint64_t)strides[i];
    r[i]->box_rows = box_rows[i];
    r[i]->box_cols = LL_SM90_BK;
    r[i]->swizzle = 128;
    if (rlk_tma_check(r[i]) != RLK_OK) {
      rlk_debug("linear_logprob: no tensor map for %s (%s)", i ? "weight" : "hidden", rlk_last_error());
      rlk_error_clear();
      tma_ok = 0;
    }
  }
  if (!tma_ok && ll_wgmma_target(ctx) && variant != RLK_LINEAR_LOGPROB_TILED && rlk_invariant())
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "hidden, weight: no tensor map describes them (%s), and the tiled kernel they would fall back "
                     "to sums the logits in another order than the wgmma kernel's; RLK_INVARIANT=1 refuses the "
                     "fallback (variant tiled asks for it)",
                     "16-byte aligned, row strides a multiple of 8 elements");
  ll_choice ch;
  if ((st = ll_select(ctx, vals, tma_ok, &ch))) return st;
  f->variant = ch.variant;
  f->gemm = ch.gemm;
  f->combine = ch.combine;
  f->records = rlk_ll_fwd_records(h->V);
  if (f->records > 65535)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "weight: V = %lld needs more than 65535 splits of 256 columns",
                     (long long)h->V);
  return RLK_OK;
}

RLK_API void rlk_linear_logprob_args_init(rlk_linear_logprob_args *args) {
  static const rlk_linear_logprob_args defaults = {
      .temperature = 1.0f, .ignore_index = -100, .variant = RLK_LINEAR_LOGPROB_AUTO};
  if (args) *args = defaults;
}

/* The combine of a launch's `n` rows (records [S][n] at partials) into their outputs from row r0
 * (logits: the sampling head's raw logits of those rows, else NULL; threshold: kept-set replay's,
 * from the launch's first row, else NULL). */
static rlk_status ll_combine(rlk_context *ctx, const rlk_kernel_spec *spec, const void *partials, int64_t S,
                             int64_t n, int64_t V, const void *labels, int64_t label_stride, int64_t ignore_index,
                             float *logp, float *lse, float *entropy, int *status, float *records,
                             int64_t vocab_start, float temperature, const float *logits, int64_t logits_pitch,
                             const float *threshold, void *stream) {
  ll_combine_args c = {0};
  c.partials = partials;
  c.S = S;
  c.N = n;
  c.V = V;
  c.record_cols = RLK_LL_RECORD_COLS;
  c.labels = labels;
  c.label_stride = label_stride;
  c.ignore_index = ignore_index;
  c.logp = logp;
  c.lse = lse;
  c.entropy = entropy;
  c.status = status;
  c.records = records;
  c.vocab_start = vocab_start;
  c.logits = logits;
  c.logits_pitch = logits_pitch;
  c.temperature = temperature;
  c.threshold = threshold;
  const int64_t rows_a_block = LL_THREADS / 32;
  rlk_launch_dims d = rlk_op_grid((uint64_t)((n + rows_a_block - 1) / rows_a_block), 1, 1, LL_THREADS, 0);
  return rlk_context_launch_params(ctx, spec, &d, stream, &c);
}

/* The host's fp64 kernel over rows [r0, r0 + n): the raw logits into `logits` where given, the
 * outputs of `o` where given. */
static rlk_status ll_host_rows(rlk_context *ctx, const rlk_ll_fwd *f, int64_t r0, int64_t n, const rlk_ll_fwd_out *o,
                               float temperature, float *logits, int64_t pitch, void *stream) {
  const int64_t at = r0;
  ll_fwd_host_args h = {0};
  h.hidden = (const char *)f->hidden + (size_t)((at - f->hidden_row0) * f->h.hs) * 2u;
  h.h_stride = f->h.hs;
  h.weight = f->weight;
  h.w_stride = f->h.ws;
  h.labels = o && o->labels ? (const char *)o->labels + (size_t)(at * f->h.ls) * rlk_dtype_size(o->label_dtype) : NULL;
  h.label_stride = f->h.ls;
  h.N = n;
  h.V = f->h.V;
  h.H = f->h.H;
  h.ignore_index = o ? o->ignore_index : 0;
  if (o) {
    h.logp = o->logp ? o->logp + at : NULL;
    h.lse = o->lse ? o->lse + at : NULL;
    h.entropy = o->entropy ? o->entropy + at : NULL;
    h.status = o->status;
    h.records = o->records ? o->records + 4 * at : NULL;
    h.vocab_start = o->vocab_start;
    h.threshold = o->threshold ? o->threshold + at : NULL;
  }
  h.temperature = temperature;
  h.logits = logits;
  h.logits_pitch = pitch;
  rlk_launch_dims d = rlk_op_grid(1, 1, 1, 1, 0);
  return rlk_context_launch_params(ctx, &f->gemm, &d, stream, &h);
}

rlk_status rlk_ll_fwd_gemm(rlk_context *ctx, const rlk_ll_fwd *f, const void *labels, rlk_dtype label_dtype,
                           int64_t r0, int64_t n, void *partials, int64_t vocab_start, float temperature,
                           const float *threshold, float *logits, int64_t pitch, void *stream) {
  if (ctx->kind == RLK_BACKEND_HOST) return logits ? ll_host_rows(ctx, f, r0, n, NULL, temperature, logits, pitch, stream)
                                                   : RLK_OK;
  rlk_status st;
  const int wg = f->variant == RLK_LINEAR_LOGPROB_WGMMA;
  const int64_t sms = ctx->target.multiprocessors > 0 ? ctx->target.multiprocessors : 1;
  const int64_t bm = wg ? LL_SM90_BM : LL_TILE, slots = wg ? sms : 4 * sms, row_blocks = (n + bm - 1) / bm;
  const void *lab = labels ? (const char *)labels + (size_t)(r0 * f->h.ls) * rlk_dtype_size(label_dtype) : NULL;
  const float *thr = threshold ? threshold + r0 : NULL;
  const void *hidden = (const char *)f->hidden + (size_t)((r0 - f->hidden_row0) * f->h.hs) * 2u;
  int64_t S, cps;
  rlk_ll_fwd_splits(f->h.V, row_blocks, slots, f->splits, &S, &cps);
  if (S > 65535 || row_blocks > INT32_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "linear_logprob: %lld row blocks x %lld splits are too many",
                     (long long)row_blocks, (long long)S);
  ll_fwd_tiled_args g = {0};
  g.hidden = hidden;
  g.h_stride = f->h.hs;
  g.weight = f->weight;
  g.w_stride = f->h.ws;
  g.labels = lab;
  g.label_stride = f->h.ls;
  g.N = n;
  g.V = f->h.V;
  g.H = f->h.H;
  g.cols_per_split = cps;
  g.partials = partials;
  g.vocab_start = vocab_start;
  g.temperature = temperature;
  g.threshold = thr;
  g.logits = logits;
  g.logits_pitch = pitch;
  if (wg) {
    /* the same struct behind the tensor maps of hidden's rows and the weight, which TMA reads in
     * parameter space (templates/cuda/linear_logprob_sm90.cuh) */
    ll_fwd_sm90_args w = {0};
    w.pass = g;
    rlk_tma_desc_request rh = f->req_h;
    rh.base = hidden;
    rh.rows = (uint64_t)n;
    if ((st = rlk_context_tensor_map(ctx, &rh, &w.map_h)) || (st = rlk_context_tensor_map(ctx, &f->req_w, &w.map_w)))
      return st;
    const size_t smem = (size_t)f->gemm.values[2] * LL_SM90_STAGE_BYTES + LL_SM90_ALIGN;
    const rlk_launch_dims d = rlk_op_grid((uint64_t)row_blocks, (uint64_t)S, 1, LL_SM90_THREADS, smem);
    return rlk_context_launch_params(ctx, &f->gemm, &d, stream, &w);
  }
  const rlk_launch_dims d = rlk_op_grid((uint64_t)row_blocks, (uint64_t)S, 1, LL_THREADS, 0);
  return rlk_context_launch_params(ctx, &f->gemm, &d, stream, &g);
}

rlk_status rlk_ll_fwd_combine(rlk_context *ctx, const rlk_ll_fwd *f, const void *partials, int64_t r0, int64_t n,
                              const rlk_ll_fwd_out *o, float temperature, const float *logits, int64_t pitch,
                              void *stream) {
  if (ctx->kind == RLK_BACKEND_HOST) return ll_host_rows(ctx, f, r0, n, o, temperature, NULL, 0, stream);
  const void *lab = (const char *)o->labels + (size_t)(r0 * f->h.ls) * rlk_dtype_size(o->label_dtype);
  return ll_combine(ctx, &f->combine, partials, f->records, n, f->h.V, lab, f->h.ls, o->ignore_index,
                    o->logp ? o->logp + r0 : NULL, o->lse ? o->lse + r0 : NULL, o->entropy ? o->entropy + r0 : NULL,
                    o->status, o->records ? o->records + 4 * r0 : NULL, o->vocab_start, temperature, logits, pitch,
                    o->threshold ? o->threshold + r0 : NULL, stream);
}

/* Per launch of at most k->rows rows: the GEMM over (row blocks, splits) writing [records][n]
 * records into the workspace, then their combine; the host's one fp64 kernel. */
static rlk_status ll_launch(rlk_context *ctx, const void *args, rlk_op_call *call, void *stream) {
  const rlk_linear_logprob_args *a = args;
  const ll_call *k = (const ll_call *)call;
  rlk_status st;
  const rlk_ll_fwd_out o = {a->labels.data,
                            a->labels.dtype,
                            a->ignore_index,
                            a->vocab_start,
                            (const float *)a->threshold.data,
                            (float *)a->logp.data,
                            (float *)a->lse.data,
                            (float *)a->entropy.data,
                            (float *)a->partials.data,
                            k->shard ? NULL : (int *)a->status.data}; /* the shard form leaves status alone */
  rlk_ll_fwd f = k->f;
  for (int64_t r0 = 0; r0 < k->f.h.N; r0 += k->rows) {
    const int64_t n = k->f.h.N - r0 < k->rows ? k->f.h.N - r0 : k->rows;
    if (k->r.data) {
      /* this launch's selected rows into the workspace, the kernels pointed at them (a bad index
       * reaches status in every form: it is no label's matter) */
      void *gathered = (char *)a->workspace + k->gathered_at;
      if ((st = rlk_ll_gather(ctx, &k->r, ll_dt_code(a->hidden.dtype), a->hidden.data, k->hidden_stride, k->f.h.H,
                              r0, n, gathered, k->r.pitch, (int *)a->status.data, stream)))
        return st;
      f.hidden = gathered;
      f.hidden_row0 = r0;
    }
    if ((st = rlk_ll_fwd_gemm(ctx, &f, a->labels.data, a->labels.dtype, r0, n, a->workspace, a->vocab_start,
                              a->temperature, o.threshold, NULL, 0, stream)) ||
        (st = rlk_ll_fwd_combine(ctx, &f, a->workspace, r0, n, &o, a->temperature, NULL, 0, stream)))
      return st;
  }
  return RLK_OK;
}

static const rlk_arg_field ll_fields[] = {
    RLK_ARG_IN(rlk_linear_logprob_args, hidden),   RLK_ARG_IN(rlk_linear_logprob_args, weight),
    RLK_ARG_IN(rlk_linear_logprob_args, labels),   RLK_ARG_OUT(rlk_linear_logprob_args, logp),
    RLK_ARG_OUT(rlk_linear_logprob_args, lse),     RLK_ARG_OUT(rlk_linear_logprob_args, entropy),
    RLK_ARG_OUT(rlk_linear_logprob_args, status),  RLK_ARG_OUT(rlk_linear_logprob_args, partials),
    RLK_ARG_IN(rlk_linear_logprob_args, rows)};

static const rlk_op_entry ll_entry = {
    .name = "rlk_linear_logprob", .op = &rlk_op_linear_logprob, .call_size = sizeof(ll_call), RLK_OP_FIELDS(ll_fields),
    .workspace = RLK_OP_WORKSPACE(rlk_linear_logprob_args, 16), .validate = ll_validate, .launch = ll_launch};

RLK_API rlk_status rlk_linear_logprob_workspace_size(rlk_context *ctx, const rlk_linear_logprob_args *args,
                                                     size_t *bytes) {
  return rlk_op_workspace_size(&ll_entry, ctx, args, bytes);
}

RLK_API rlk_status rlk_linear_logprob(rlk_context *ctx, const rlk_linear_logprob_args *a, void *stream) {
  return rlk_op_run(&ll_entry, ctx, a, stream);
}

/* ---------------------------------------------------------------------------------- */
/* The backward                                                                        */
/* ---------------------------------------------------------------------------------- */

static const char *const ll_grad_names[] = RLK_PARAMS_ENUM_NAMES(RLK_FLOAT_DTS);

static const rlk_param_decl ll_dz_params[] = {
    {"hidden", RLK_PARAM_ENUM, 1, 2, 0, 0, ll_dt_names},
    {"labels", RLK_PARAM_DTYPE, 0, 0, 0, LL_LABEL_DTYPES, NULL},
    {"entropy", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
};
static const rlk_param_decl ll_dh_params[] = {
    {"hidden", RLK_PARAM_ENUM, 1, 2, 0, 0, ll_dt_names},
};
static const rlk_param_decl ll_dw_params[] = {
    {"hidden", RLK_PARAM_ENUM, 1, 2, 0, 0, ll_dt_names},
    {"gw", RLK_PARAM_ENUM, 0, 2, 0, 0, ll_grad_names},
};
static const rlk_param_decl ll_dh_out_params[] = {
    {"gh", RLK_PARAM_ENUM, 0, 2, 0, 0, ll_grad_names},
};
static const rlk_param_decl ll_bwd_host_params[] = {
    {"hidden", RLK_PARAM_ENUM, 1, 2, 0, 0, ll_dt_names},
    {"labels", RLK_PARAM_DTYPE, 0, 0, 0, LL_LABEL_DTYPES, NULL},
    {"gh", RLK_PARAM_ENUM, 0, 2, 0, 0, ll_grad_names},
    {"gw", RLK_PARAM_ENUM, 0, 2, 0, 0, ll_grad_names},
    {"entropy", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
};

#define LL_BWD_CUDA "cuda/linear_logprob_bwd.cuh"
static const rlk_template ll_dz_tmpl = {"linear_logprob", "linear_logprob_bwd_dz", LL_BWD_CUDA, NULL,
                                        LL_N(ll_dz_params), ll_dz_params};
static const rlk_template ll_dh_tmpl = {"linear_logprob", "linear_logprob_bwd_dh", LL_BWD_CUDA, NULL,
                                        LL_N(ll_dh_params), ll_dh_params};
static const rlk_template ll_dw_tmpl = {"linear_logprob", "linear_logprob_bwd_dw", LL_BWD_CUDA, NULL,
                                        LL_N(ll_dw_params), ll_dw_params};
static const rlk_template ll_dh_out_tmpl = {"linear_logprob", "linear_logprob_bwd_dh_out", LL_BWD_CUDA,
                                            NULL, LL_N(ll_dh_out_params), ll_dh_out_params};
static const rlk_template ll_bwd_host_tmpl = {"linear_logprob", "linear_logprob_bwd_host", NULL,
                                              "host/linear_logprob_bwd.c", LL_N(ll_bwd_host_params),
                                              ll_bwd_host_params};

/* sm_90a: one kernel, the product chosen by kind (LL_BWD_DZ / DH / DW, and LL_BWD_LOGITS /
 * LOGITS_T / DH_T for the token chunks); the settings a kind does not read are given as
 * labels=i32, entropy=0, gw=f32, so that each kind has one spelling (gw: the output's dtype, dh's
 * too in the token chunks). */
enum { LL_BWD_DZ = 0, LL_BWD_DH = 1, LL_BWD_DW = 2, LL_BWD_LOGITS = 3, LL_BWD_LOGITS_T = 4, LL_BWD_DH_T = 5 };
static const rlk_param_decl ll_bwd_sm90_params[] = {
    {"kind", RLK_PARAM_INT, 0, 5, 0, 0, NULL},
    {"hidden", RLK_PARAM_ENUM, 1, 2, 0, 0, ll_dt_names},
    {"labels", RLK_PARAM_DTYPE, 0, 0, 0, LL_LABEL_DTYPES, NULL},
    {"entropy", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
    {"gw", RLK_PARAM_ENUM, 0, 2, 0, 0, ll_grad_names},
};
static const rlk_template ll_bwd_sm90_tmpl = {"linear_logprob", "linear_logprob_bwd_sm90",
                                              "cuda/linear_logprob_bwd_sm90.cuh", NULL,
                                              LL_N(ll_bwd_sm90_params), ll_bwd_sm90_params,
                                              RLK_TARGET_WGMMA | RLK_TARGET_TMA};
/* the token chunks' u -> dz (templates/cuda/linear_logprob_stored.cuh) */
static const rlk_param_decl ll_stored_dz_params[] = {
    {"hidden", RLK_PARAM_ENUM, 1, 2, 0, 0, ll_dt_names},
    {"labels", RLK_PARAM_DTYPE, 0, 0, 0, LL_LABEL_DTYPES, NULL},
    {"entropy", RLK_PARAM_BOOL, 0, 1, 0, 0, NULL},
};
static const rlk_template ll_stored_dz_tmpl = {"linear_logprob", "linear_logprob_stored_dz",
                                               "cuda/linear_logprob_stored.cuh", NULL, LL_N(ll_stored_dz_params),
                                               ll_stored_dz_params};
/* ... and over u^T (the stored logits over grad_weight) */
static const rlk_template ll_stored_dz_t_tmpl = {"linear_logprob", "linear_logprob_stored_dz_t",
                                                 "cuda/linear_logprob_stored.cuh", NULL, LL_N(ll_stored_dz_params),
                                                 ll_stored_dz_params};
#define LL_STORED_PITCH 64 /* u's row pitch: V rounded up to this (128-byte rows for TMA) */

/* The sm_90a backward's shared memory: LL_BWD_SM90_SMEM, with the staging (..._STAGED) for the
 * kernels whose outputs leave by TMA (dz always, dh and dw where a map describes theirs). */

#define LL_BWD_GROUP 8      /* the sm_90a tile order's default rows of tiles */
#define LL_BWD_GROUP_MAX 64
/* The backward's workspace at most when the call chooses the chunk: dz of a chunk, and the f32
 * grad_hidden sum for a 16-bit grad_hidden (0.28 GiB, under the 0.3 GiB a trainer budgets beside
 * its activations). */
#define LL_BWD_WORKSPACE_BYTES ((int64_t)288 << 20)
/* The narrowest dz chunk a block of rows is sized for: 1024 columns keep the grad_weight product
 * of a chunk (1024 x H tiles of 128 x 256) near a wave of an H200's multiprocessors at H 4096. */
#define LL_BWD_BLOCK_COLS 1024
static int64_t ll_bwd_budget = LL_BWD_WORKSPACE_BYTES; /* rlk_ll_bwd_set_budget */
void rlk_ll_bwd_set_budget(int64_t bytes) { ll_bwd_budget = bytes > 0 ? bytes : LL_BWD_WORKSPACE_BYTES; }

/* What selects the backward's kernels: gh / gw are -1 for an absent gradient; sm90: the wgmma
 * kernels (an sm_90a target, tensor maps for hidden and weight). */
typedef struct ll_bwd_config {
  int hidden;
  rlk_dtype labels;
  int entropy;
  int gh, gw;
  int sm90;
} ll_bwd_config;

/* The backward's specs: [dz, dh, dh_out, dw] on a GPU (absent gradients' kernels left out, and
 * dh_out for an f32 grad_hidden, which dh sums into; sm90: dz, dh, dw are linear_logprob_bwd_sm90
 * kinds), the one host kernel on the host. */
static rlk_status ll_bwd_specs(const rlk_context *ctx, const ll_bwd_config *c, rlk_kernel_spec *specs,
                               size_t *n) {
  *n = 0;
  rlk_status st;
  if (ctx->kind != RLK_BACKEND_HOST && c->sm90) {
    rlk_kernel_spec dz = {&ll_bwd_sm90_tmpl, {LL_BWD_DZ, c->hidden, c->labels, c->entropy, 0}};
    specs[(*n)++] = dz;
    if (c->gh >= 0) {
      rlk_kernel_spec dh = {&ll_bwd_sm90_tmpl, {LL_BWD_DH, c->hidden, RLK_I32, 0, 0}},
                      out = {&ll_dh_out_tmpl, {c->gh}};
      specs[(*n)++] = dh;
      if (c->gh > 0) specs[(*n)++] = out;
    }
    if (c->gw >= 0) {
      rlk_kernel_spec dw = {&ll_bwd_sm90_tmpl, {LL_BWD_DW, c->hidden, RLK_I32, 0, c->gw}};
      specs[(*n)++] = dw;
    }
  } else if (ctx->kind == RLK_BACKEND_HOST) {
    rlk_kernel_spec s = {&ll_bwd_host_tmpl, {c->hidden, c->labels, c->gh < 0 ? 0 : c->gh, c->gw < 0 ? 0 : c->gw, c->entropy}};
    specs[(*n)++] = s;
  } else {
    rlk_kernel_spec dz = {&ll_dz_tmpl, {c->hidden, c->labels, c->entropy}};
    specs[(*n)++] = dz;
    if (c->gh >= 0) {
      rlk_kernel_spec dh = {&ll_dh_tmpl, {c->hidden}}, out = {&ll_dh_out_tmpl, {c->gh}};
      specs[(*n)++] = dh;
      if (c->gh > 0) specs[(*n)++] = out;
    }
    if (c->gw >= 0) {
      rlk_kernel_spec dw = {&ll_dw_tmpl, {c->hidden, c->gw}};
      specs[(*n)++] = dw;
    }
  }
  for (size_t i = 0; i < *n; i++)
    if ((st = rlk_spec_validate(&specs[i]))) return st;
  return RLK_OK;
}

/* A backward call: the head, the gradients' strides, the kernels' configuration, the chunk; a row
 * selection, the caller's hidden row stride and where the gathered rows (and on the host the
 * gradient rows of the selection) lie in the workspace. */
typedef struct ll_bwd_call {
  rlk_op_call op;
  ll_head h;
  int64_t lse_s, glp_s, ent_s, gent_s, ghs, gws, chunk;
  int group; /* the sm_90a tile order's rows of tiles */
  ll_bwd_config c;
  size_t dh_bytes, dz_bytes;
  int64_t block; /* the GPU's rows a block (all of them in one when they fit) */
  rlk_ll_rows r;
  int64_t hidden_stride;
  size_t gathered_at, rows_grad_at;
} ll_bwd_call;

/* A 128-byte-swizzled tensor map request over a 16-bit [rows, cols] matrix. */
static rlk_tma_desc_request ll_tma_req(const void *base, rlk_dtype dt, int64_t rows, int64_t cols,
                                       int64_t stride, uint32_t box_rows) {
  rlk_tma_desc_request r;
  memset(&r, 0, sizeof r);
  r.base = base;
  r.dtype = dt;
  r.rows = (uint64_t)rows;
  r.cols = (uint64_t)cols;
  r.row_stride = (uint64_t)stride;
  r.box_rows = box_rows;
  r.box_cols = LL_SM90_BK;
  r.swizzle = 128;
  return r;
}

/* The map of an f32 output that dh and dw store through shared staging: boxes of 64 rows x 32
 * columns (128 bytes, the swizzle's span). */
static rlk_tma_desc_request ll_tma_req_f32(void *base, int64_t rows, int64_t cols, int64_t stride) {
  rlk_tma_desc_request r = ll_tma_req(base, RLK_F32, rows, cols, stride, 64);
  r.box_cols = 32;
  return r;
}

/* Whether a tensor map can describe an f32 output (else its kernel writes from registers). */
static int ll_tma_ok(const rlk_tma_desc_request *r) {
  if (rlk_tma_check(r) == RLK_OK) return 1;
  rlk_error_clear();
  return 0;
}

/* Whether the sm_90a backward can run: the target, and tensor maps for hidden (the rows the
 * products read: the caller's, or a selection's gathered ones) and weight in the boxes it reads
 * (K-major and MN-major). */
static int ll_bwd_sm90_ok(const rlk_context *ctx, const rlk_linear_logprob_backward_args *a, const rlk_tensor *hidden,
                          const ll_bwd_call *k) {
  if (!ll_wgmma_target(ctx)) return 0;
  const rlk_tma_desc_request r[4] = {
      ll_tma_req(hidden->data, hidden->dtype, k->h.N, k->h.H, k->h.hs, LL_SM90_BM),
      ll_tma_req(hidden->data, hidden->dtype, k->h.N, k->h.H, k->h.hs, 64),
      ll_tma_req(a->weight.data, a->weight.dtype, k->h.V, k->h.H, k->h.ws, LL_SM90_BN),
      ll_tma_req(a->weight.data, a->weight.dtype, k->h.V, k->h.H, k->h.ws, 64)};
  for (int i = 0; i < 4; i++)
    if (rlk_tma_check(&r[i]) != RLK_OK) {
      rlk_debug("linear_logprob backward: no tensor map for %s (%s); the portable kernels run",
                i < 2 ? "hidden" : "weight", rlk_last_error());
      rlk_error_clear();
      return 0;
    }
  return 1;
}


/* A backward's `grad` setting (0 f32, 1 the inputs' dtype): grad_weight's, else grad_hidden's. */
static int ll_bwd_grad_line(const ll_bwd_config *c) { return (c->gw >= 0 ? c->gw : c->gh) > 0; }

static rlk_status ll_bwd_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_linear_logprob_backward_args *a = args;
  ll_bwd_call *k = (ll_bwd_call *)call;
  rlk_status st;
  if ((st = rlk_ll_check_head(&a->hidden, &a->weight, a->rows.data ? NULL : &a->labels, a->temperature, &k->h)))
    return st;
  k->hidden_stride = k->h.hs;
  if ((st = rlk_ll_rows_check(&a->rows, &a->labels, &k->h, &k->r))) return st;
  const rlk_tensor planned = k->r.data ? rlk_ll_rows_planned(&a->hidden, &k->r) : a->hidden;
  if (k->r.data) k->h.hs = k->r.pitch;
  /* grad_hidden keeps hidden's shape */
  const int64_t gh_rows = k->r.data ? k->r.all : k->h.N;
  const uint32_t f32 = RLK_DTYPE_BIT(RLK_F32);
  if ((st = rlk_check_vector(&a->lse, "lse", f32, k->h.N, 0, &k->lse_s))) return st;
  if (a->grad_logp.data && (st = rlk_check_vector(&a->grad_logp, "grad_logp", f32, k->h.N, 0, &k->glp_s)))
    return st;
  if (a->grad_entropy.data) {
    if ((st = rlk_check_vector(&a->grad_entropy, "grad_entropy", f32, k->h.N, 0, &k->gent_s))) return st;
    if (!a->entropy.data)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "entropy: required with grad_entropy (E_p[z] = lse - entropy)");
    if ((st = rlk_check_vector(&a->entropy, "entropy", f32, k->h.N, 0, &k->ent_s))) return st;
  }
  if (!a->grad_logp.data && !a->grad_entropy.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "grad_logp and grad_entropy: give at least one");
  if (!a->grad_hidden.data && !a->grad_weight.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "grad_hidden and grad_weight: give at least one");
  const uint32_t gdt = f32 | RLK_DTYPE_BIT(a->hidden.dtype);
  k->c.gh = k->c.gw = -1;
  if (a->grad_hidden.data &&
      (st = ll_check_grad(&a->grad_hidden, "grad_hidden", gdt, gh_rows, k->h.H, &k->ghs, &k->c.gh)))
    return st;
  if (a->grad_weight.data &&
      (st = ll_check_grad(&a->grad_weight, "grad_weight", gdt, k->h.V, k->h.H, &k->gws, &k->c.gw)))
    return st;
  if (a->status.data) {
    if ((st = rlk_check_tensor(&a->status, "status", 1))) return st;
    if ((st = rlk_check_dtype(&a->status, "status", RLK_DTYPE_BIT(RLK_I32)))) return st;
  }
  if (a->threshold.data) {
    if (a->shard) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "threshold: kept-set replay has no shard form");
    if ((st = rlk_check_vector(&a->threshold, "threshold", f32, k->h.N, 1, NULL))) return st;
  }
  if ((st = rlk_check_flag(a->accumulate, "accumulate"))) return st;
  if ((st = rlk_check_flag(a->shard, "shard"))) return st;
  if (!a->shard && a->vocab_start != 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "vocab_start: %lld without shard 1",
                     (long long)a->vocab_start);
  if ((st = rlk_check_vocab_start(a->vocab_start))) return st;
  if (a->chunk < 0 || a->chunk % LL_TILE)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "chunk: %d is not 0 or a positive multiple of 64", a->chunk);
  if (a->group < 0 || a->group > LL_BWD_GROUP_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "group: %d is not 0 (the default) or 1 to %d", a->group,
                     LL_BWD_GROUP_MAX);
  k->c.hidden = ll_dt_code(a->hidden.dtype);
  k->c.labels = a->labels.dtype;
  k->c.entropy = a->grad_entropy.data != NULL;
  /* one line per gradient dtype the call writes (grad_hidden and grad_weight may differ): the f32
   * one here, the other recorded by the launch */
  ll_line(&call->vals, 1, a->hidden.dtype, a->labels.dtype, k->c.entropy, !(k->c.gh == 0 || k->c.gw == 0),
          RLK_LINEAR_LOGPROB_AUTO, 0);
  if (k->r.data) rlk_op_values_set(&call->vals, LL_S_ROWS, ll_rows_line(&k->r));
  if (ctx->kind == RLK_BACKEND_HOST) {
    /* a selection: its gathered rows, and the rows of grad_hidden the host kernel writes (the
     * gathered call's, from what the selected rows held when accumulating) */
    if (k->r.data) {
      k->gathered_at = 0;
      k->rows_grad_at = rlk_ll_rows_bytes(k->h.N, k->r.pitch, 2);
      call->workspace = k->rows_grad_at + (k->c.gh >= 0 ? rlk_ll_rows_bytes(k->h.N, k->h.H,
                                                                            rlk_dtype_size(a->grad_hidden.dtype))
                                                          : 0);
    }
    return ll_bwd_specs(ctx, &k->c, call->specs, &call->nspecs);
  }
  int asked_chunk = a->chunk, group = a->group;
  if (!asked_chunk && !group)
    ll_tuned_bwd(ctx, a->hidden.dtype, a->labels.dtype, k->c.entropy, ll_bwd_grad_line(&k->c), k->h.H, k->h.V, k->h.N,
                 &asked_chunk, &group);
  k->group = group ? group : LL_BWD_GROUP;
  /* sm_90a: dz in 16 bits, chunks of whole 256-column tiles (the dz tile's width) */
  k->c.sm90 = ll_bwd_sm90_ok(ctx, a, &planned, k);
  if (!k->c.sm90 && ll_wgmma_target(ctx) && rlk_invariant())
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "hidden, weight: no tensor map describes them (16-byte aligned, row strides a multiple of 8 "
                     "elements), and the portable kernels they would fall back to round dz and sum in another "
                     "order; RLK_INVARIANT=1 refuses the fallback");
  const int64_t tile = k->c.sm90 ? LL_SM90_BN : LL_TILE, dzs = k->c.sm90 ? 2 : 4;
  /* an f32 grad_hidden is its own sum (but for a selection's, which scatter writes by row); a
   * 16-bit one needs the sum in the workspace */
  const int64_t sum_row = k->c.gh > 0 || (k->c.gh == 0 && k->r.data) ? 4 * k->h.H : 0;
  /* the rows go in blocks whose sums and a dz of LL_BWD_BLOCK_COLS columns fit the budget (all in
   * one while they do), so that the workspace follows a block, not N; a selection's gathered rows
   * come beside the budget, so that it blocks and chunks as the call on its gathered rows does */
  k->block = rlk_ll_bwd_block_rows(k->h.N, sum_row, dzs * LL_BWD_BLOCK_COLS, ll_bwd_budget);
  const int64_t R = k->block;
  k->dh_bytes = ll_align256((size_t)(R * sum_row));
  const size_t gathered = k->r.data ? rlk_ll_rows_bytes(R, k->r.pitch, 2) : 0;
  /* dz within what the sum leaves of the budget; the sm_90a kernels' width from their cost model
   * (whole waves of tiles), the portable ones' the fewest chunks cut evenly */
  rlk_ll_chunk_problem cp = {R, k->h.H, k->h.V, k->c.gh >= 0, k->c.gw >= 0, ctx->target.multiprocessors, 0};
  const int64_t chunk = rlk_ll_bwd_chunk(asked_chunk, k->h.V, tile, ll_bwd_budget - (int64_t)k->dh_bytes, dzs * R,
                                         k->c.sm90 ? &cp : NULL);
  k->chunk = chunk;
  k->dz_bytes = ll_align256((size_t)(R * chunk * dzs));
  k->gathered_at = k->dh_bytes + k->dz_bytes;
  call->workspace = k->gathered_at + gathered;
  return ll_bwd_specs(ctx, &k->c, call->specs, &call->nspecs);
}

RLK_API void rlk_linear_logprob_backward_args_init(rlk_linear_logprob_backward_args *args) {
  static const rlk_linear_logprob_backward_args defaults = {.temperature = 1.0f, .ignore_index = -100};
  if (args) *args = defaults;
}

/* The per-row inputs every backward kernel's arguments share (the host kernel, the portable dz,
 * linear_logprob_bwd_sm90), set from rlk_linear_logprob_backward's locals in one place. */
#define LL_BWD_ROW_INPUTS(x)                                                                         \
  do {                                                                                               \
    (x).labels = labels, (x).label_stride = k->h.ls, (x).V = V, (x).ignore_index = a->ignore_index;  \
    (x).lse = lse, (x).lse_s = k->lse_s, (x).g_lp = glp, (x).glp_s = k->glp_s;                       \
    (x).entropy = ent, (x).ent_s = k->ent_s, (x).g_ent = gent, (x).gent_s = k->gent_s;               \
    (x).status = status, (x).vocab_start = a->vocab_start;                                           \
    (x).temperature = a->temperature, (x).shard = a->shard;                                          \
    (x).threshold = thr;                                                                             \
  } while (0)

/* grad_hidden (+)= the f32 sum dh of the workspace. */
static rlk_status ll_bwd_dh_out(rlk_context *ctx, const rlk_kernel_spec *spec, const float *dh, int64_t N,
                                int64_t H, void *gh, int64_t ghs, int accumulate, void *stream) {
  const ll_bwd_dh_out_args o = {
      .dh = dh, .N = N, .H = H, .grad_hidden = gh, .gh_stride = ghs, .accumulate = accumulate};
  rlk_launch_dims d = rlk_op_grid((uint64_t)((N * H + LL_THREADS - 1) / LL_THREADS), 1, 1, LL_THREADS, 0);
  return rlk_context_launch_params(ctx, spec, &d, stream, &o);
}

/* One linear_logprob_bwd_sm90 product of g.M x g.Nn over g.K (g's tensor maps set): tiles of
 * 128 x 256, persistent blocks (one a multiprocessor, none more than tiles) that walk them. */
static rlk_status ll_bwd_sm90_launch(rlk_context *ctx, const rlk_kernel_spec *spec, ll_bwd_sm90_args *g,
                                     size_t smem, void *stream) {
  const int64_t tm = (g->M + LL_SM90_BM - 1) / LL_SM90_BM, tn = (g->Nn + LL_SM90_BN - 1) / LL_SM90_BN;
  if (tm * tn > INT32_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "linear_logprob_backward: %lld x %lld output tiles are too many",
                     (long long)tm, (long long)tn);
  g->tiles_m = (int)tm, g->tiles_n = (int)tn;
  const int64_t sms = ctx->target.multiprocessors > 0 ? ctx->target.multiprocessors : 1;
  const rlk_launch_dims d = rlk_op_grid((uint64_t)(tm * tn < sms ? tm * tn : sms), 1, 1, LL_SM90_THREADS, smem);
  return rlk_context_launch_params(ctx, spec, &d, stream, g);
}

/* The host's one fp64 kernel over every row (a selection's rows gathered first, and its grad_hidden
 * rows written by row after). */
static rlk_status ll_bwd_host(rlk_context *ctx, const rlk_linear_logprob_backward_args *a, const ll_bwd_call *k,
                              const rlk_kernel_spec *spec, void *stream) {
  rlk_status st;
  const void *hidden = a->hidden.data, *weight = a->weight.data, *labels = a->labels.data;
  const int64_t N = k->h.N, V = k->h.V, H = k->h.H;
  const float *lse = (const float *)a->lse.data, *glp = (const float *)a->grad_logp.data,
              *ent = k->c.entropy ? (const float *)a->entropy.data : NULL, *gent = (const float *)a->grad_entropy.data,
              *thr = (const float *)a->threshold.data;
  void *gh = a->grad_hidden.data, *gw = a->grad_weight.data;
  int *status = (int *)a->status.data;
  /* a selection's grad_hidden rows as the gathered call writes them (from the rows' held values
   * when accumulating), then written by row */
  void *rows_gh = gh;
  int64_t rows_ghs = k->ghs;
  if (k->r.data) {
    void *gathered = (char *)a->workspace + k->gathered_at;
    if ((st = rlk_ll_gather(ctx, &k->r, k->c.hidden, hidden, k->hidden_stride, H, 0, N, gathered, k->r.pitch, status,
                            stream)))
      return st;
    hidden = gathered;
    if (gh) {
      rows_gh = (char *)a->workspace + k->rows_grad_at;
      rows_ghs = H;
      if (a->accumulate &&
          (st = rlk_ll_gather(ctx, &k->r, k->c.gh, gh, k->ghs, H, 0, N, rows_gh, H, status, stream)))
        return st;
    }
  }
  ll_bwd_host_args h = {0};
  LL_BWD_ROW_INPUTS(h);
  h.hidden = hidden, h.h_stride = k->h.hs, h.weight = weight, h.w_stride = k->h.ws, h.N = N, h.H = H;
  h.grad_hidden = rows_gh, h.gh_stride = rows_ghs, h.grad_weight = gw, h.gw_stride = k->gws;
  h.accumulate = a->accumulate;
  rlk_launch_dims d = rlk_op_grid(1, 1, 1, 1, 0);
  if ((st = rlk_context_launch_params(ctx, spec, &d, stream, &h))) return st;
  return rows_gh != gh ? rlk_ll_scatter(ctx, &k->r, k->c.gh, rows_gh, H, H, gh, k->ghs, 0, !a->accumulate, stream)
                       : RLK_OK;
}

/* Row r0 of a per-row f32 input `stride` apart (NULL stays NULL). */
static const float *ll_row_at(const void *p, int64_t r0, int64_t stride) {
  return p ? (const float *)p + r0 * stride : NULL;
}

/* One block of the GPU backward, rows [r0, r0 + N) (the call's selected rows with a selection):
 * the chunks of the vocabulary in order: dz of the chunk (recomputed logits), the f32 sum of the
 * block's grad_hidden rows, grad_weight's rows of the chunk (written by the first block unless
 * accumulating, added to by the others); then the block's grad_hidden rows from their sum (a
 * 16-bit one's, or a selection's by row). */
static rlk_status ll_bwd_block(rlk_context *ctx, const rlk_linear_logprob_backward_args *a, const ll_bwd_call *k,
                               const rlk_kernel_spec *specs, size_t nspecs, int64_t r0, int64_t N, void *stream) {
  rlk_status st;
  const int64_t V = k->h.V, H = k->h.H;
  const void *weight = a->weight.data;
  const void *labels = (const char *)a->labels.data + (size_t)(r0 * k->h.ls) * rlk_dtype_size(a->labels.dtype);
  const float *lse = ll_row_at(a->lse.data, r0, k->lse_s), *glp = ll_row_at(a->grad_logp.data, r0, k->glp_s),
              *ent = k->c.entropy ? ll_row_at(a->entropy.data, r0, k->ent_s) : NULL,
              *gent = ll_row_at(a->grad_entropy.data, r0, k->gent_s), *thr = ll_row_at(a->threshold.data, r0, 1);
  void *gh = a->grad_hidden.data, *gw = a->grad_weight.data;
  int *status = (int *)a->status.data;
  /* the products read the block's rows: a selection's gathered into the workspace */
  const void *hidden = k->r.data ? (const void *)((char *)a->workspace + k->gathered_at)
                                  : (const void *)((const char *)a->hidden.data + (size_t)(r0 * k->h.hs) * 2u);
  if (k->r.data && (st = rlk_ll_gather(ctx, &k->r, k->c.hidden, a->hidden.data, k->hidden_stride, H, r0, N,
                                       (void *)hidden, k->r.pitch, status, stream)))
    return st;
  const int gw_add = a->accumulate || r0 > 0;
  /* the f32 grad_hidden sum: grad_hidden's rows themselves (its row stride; the first chunk adds to
   * them only when accumulating), or the workspace's (rows of H, converted by dh_out or, for a
   * selection, written by row at the end: an f32 selection's sum starts from what its rows held
   * when accumulating, as the gathered call's does) */
  const int dh_direct = k->c.gh == 0 && !k->r.data, seeded = gh && k->r.data && k->c.gh == 0 && a->accumulate;
  float *dh = !gh ? NULL : dh_direct ? (float *)gh + r0 * k->ghs : (float *)a->workspace;
  const int64_t dhs = dh_direct ? k->ghs : H;
  const int dh_add_first = (dh_direct || seeded) && a->accumulate;
  if (seeded && (st = rlk_ll_gather(ctx, &k->r, RLK_DT_F32, gh, k->ghs, H, r0, N, dh, H, status, stream))) return st;
  float *dz = (float *)((char *)a->workspace + k->dh_bytes);
  const rlk_kernel_spec *s_dz = &specs[0], *s_dh = gh ? &specs[1] : NULL,
                        *s_out = gh && !dh_direct && !k->r.data ? &specs[2] : NULL, *s_dw = gw ? &specs[nspecs - 1] : NULL;
  const int64_t Vc = k->chunk;
  if (k->c.sm90) {
    const rlk_dtype dt = a->hidden.dtype;
    rlk_tensor_map m_hk, m_wk, m_wmn, m_hmn, m_zk, m_zmn, m_dh;
    const rlk_tma_desc_request r_hk = ll_tma_req(hidden, dt, N, H, k->h.hs, LL_SM90_BM),
                               r_wk = ll_tma_req(weight, dt, V, H, k->h.ws, LL_SM90_BN),
                               r_wmn = ll_tma_req(weight, dt, V, H, k->h.ws, 64),
                               r_hmn = ll_tma_req(hidden, dt, N, H, k->h.hs, 64);
    if ((st = rlk_context_tensor_map(ctx, &r_hk, &m_hk)) ||
        (st = rlk_context_tensor_map(ctx, &r_wk, &m_wk)) ||
        (s_dh && (st = rlk_context_tensor_map(ctx, &r_wmn, &m_wmn))) ||
        (s_dw && (st = rlk_context_tensor_map(ctx, &r_hmn, &m_hmn))))
      return st;
    /* dh's sum and grad_weight leave through shared staging and TMA where a map describes them */
    const rlk_tma_desc_request r_dh = ll_tma_req_f32(dh, N, H, dhs);
    /* a 16-bit grad_weight that is added to keeps the register path */
    const int dh_staged = s_dh && ll_tma_ok(&r_dh), gw_staged = s_dw && (k->c.gw == 0 || !gw_add);
    if (dh_staged && (st = rlk_context_tensor_map(ctx, &r_dh, &m_dh))) return st;
    ll_bwd_sm90_args g = {0};
    LL_BWD_ROW_INPUTS(g);
    g.group = k->group;
    for (int64_t c0 = 0; c0 < V; c0 += Vc) {
      const int64_t nv = V - c0 < Vc ? V - c0 : Vc;
      g.c0 = c0;
      /* dz [N][nv] of this chunk (pitch Vc), as the next products' A operand both ways */
      const rlk_tma_desc_request r_zk = ll_tma_req(dz, dt, N, nv, Vc, LL_SM90_BM),
                                 r_zmn = ll_tma_req(dz, dt, N, nv, Vc, 64);
      if ((st = rlk_context_tensor_map(ctx, &r_zmn, &m_zmn)) ||
          (s_dh && (st = rlk_context_tensor_map(ctx, &r_zk, &m_zk))))
        return st;
      /* the third map is the output's: dz's (64 x 64 boxes), dh's or grad_weight's when staged (any
       * map otherwise, unread); the fourth is unread */
      g.M = N, g.Nn = nv, g.K = H, g.out = dz, g.out_stride = Vc, g.accumulate = 0, g.staged = 0;
      g.map_a = m_hk, g.map_b = m_wk, g.map_c = m_zmn, g.map_d = m_zmn;
      if ((st = ll_bwd_sm90_launch(ctx, s_dz, &g, LL_BWD_SM90_SMEM_STAGED, stream))) return st;
      if (s_dh) {
        g.M = N, g.Nn = H, g.K = nv, g.out = dh, g.out_stride = dhs, g.accumulate = c0 > 0 || dh_add_first;
        g.staged = dh_staged;
        g.map_a = m_zk, g.map_b = m_wmn, g.map_c = dh_staged ? m_dh : m_zmn, g.map_d = m_zmn;
        if ((st = ll_bwd_sm90_launch(ctx, s_dh, &g, dh_staged ? LL_BWD_SM90_SMEM_STAGED : LL_BWD_SM90_SMEM, stream)))
          return st;
      }
      if (s_dw) {
        /* this chunk's rows of grad_weight: a map of their own */
        const rlk_tma_desc_request r_gw =
            k->c.gw == 0 ? ll_tma_req_f32((float *)gw + c0 * k->gws, nv, H, k->gws)
                        : ll_tma_req((uint16_t *)gw + c0 * k->gws, a->grad_weight.dtype, nv, H, k->gws, 64);
        g.staged = gw_staged && ll_tma_ok(&r_gw);
        g.map_a = m_zmn, g.map_b = m_hmn, g.map_c = m_zmn, g.map_d = m_zmn;
        if (g.staged && (st = rlk_context_tensor_map(ctx, &r_gw, &g.map_c))) return st;
        g.M = nv, g.Nn = H, g.K = N, g.out = gw, g.out_stride = k->gws, g.accumulate = gw_add;
        if ((st = ll_bwd_sm90_launch(ctx, s_dw, &g, g.staged ? LL_BWD_SM90_SMEM_STAGED : LL_BWD_SM90_SMEM, stream)))
          return st;
      }
    }
  } else {
    const uint64_t rb = (uint64_t)((N + LL_TILE - 1) / LL_TILE);
    const uint64_t hb = (uint64_t)((H + LL_TILE - 1) / LL_TILE);
    for (int64_t c0 = 0; c0 < V; c0 += Vc) {
      const int64_t nv = V - c0 < Vc ? V - c0 : Vc;
      const uint64_t vb = (uint64_t)((nv + LL_TILE - 1) / LL_TILE);
      ll_bwd_dz_args z = {0};
      LL_BWD_ROW_INPUTS(z);
      z.hidden = hidden, z.h_stride = k->h.hs, z.weight = weight, z.w_stride = k->h.ws;
      z.N = N, z.H = H, z.c0 = c0, z.Vc = Vc, z.dz = dz;
      rlk_launch_dims d = rlk_op_grid(rb, vb, 1, LL_THREADS, 0);
      if ((st = rlk_context_launch_params(ctx, s_dz, &d, stream, &z))) return st;
      /* the two products of the chunk share their first arguments (RLK_LL_CHUNK_PRODUCT) */
      if (s_dh) {
        const ll_bwd_dh_args h = {.dz = dz, .Vc = Vc, .nv = nv, .c0 = c0, .N = N, .H = H,
                                  .weight = weight, .w_stride = k->h.ws,
                                  .dh = dh, .dh_stride = dhs, .beta = c0 || dh_add_first ? 1.0f : 0.0f};
        d = rlk_op_grid(rb, hb, 1, LL_THREADS, 0);
        if ((st = rlk_context_launch_params(ctx, s_dh, &d, stream, &h))) return st;
      }
      if (s_dw) {
        const ll_bwd_dw_args w = {.dz = dz, .Vc = Vc, .nv = nv, .c0 = c0, .N = N, .H = H,
                                  .hidden = hidden, .h_stride = k->h.hs,
                                  .grad_weight = gw, .gw_stride = k->gws, .accumulate = gw_add};
        d = rlk_op_grid(vb, hb, 1, LL_THREADS, 0);
        if ((st = rlk_context_launch_params(ctx, s_dw, &d, stream, &w))) return st;
      }
    }
  }
  if (!gh) return RLK_OK;
  if (k->r.data) {
    /* the block's part of the selection, by row: the first block writes 0 over every row not in
     * it (the later blocks' rows are written again by their own), the others only their rows */
    rlk_ll_rows part = k->r;
    part.data = (const char *)k->r.data + (size_t)(r0 * k->r.stride) * rlk_dtype_size(k->r.dtype);
    part.n = N;
    return rlk_ll_scatter(ctx, &part, k->c.gh, dh, H, H, gh, k->ghs, a->accumulate && k->c.gh > 0,
                          !a->accumulate && r0 == 0, stream);
  }
  return s_out ? ll_bwd_dh_out(ctx, s_out, dh, N, H, (char *)gh + (size_t)(r0 * k->ghs) * rlk_dtype_size(a->grad_hidden.dtype),
                               k->ghs, a->accumulate, stream)
               : RLK_OK;
}

/* The host's one kernel, or the GPU's blocks of rows in order (one block while the workspace
 * holds all rows' sums and a chunk's dz). */
static rlk_status ll_bwd_launch(rlk_context *ctx, const void *args, rlk_op_call *call, void *stream) {
  const rlk_linear_logprob_backward_args *a = args;
  const ll_bwd_call *k = (const ll_bwd_call *)call;
  rlk_status st;
  if (rlk_record_enabled() && (k->c.gh == 0 || k->c.gw == 0) && (k->c.gh > 0 || k->c.gw > 0)) {
    rlk_op_values same = call->vals;
    same.v[LL_S_GRAD] = 1;
    rlk_record_op(&rlk_op_linear_logprob, &same);
  }
  if (ctx->kind == RLK_BACKEND_HOST) return ll_bwd_host(ctx, a, k, &call->specs[0], stream);
  for (int64_t r0 = 0; r0 < k->h.N; r0 += k->block) {
    const int64_t n = k->h.N - r0 < k->block ? k->h.N - r0 : k->block;
    if ((st = ll_bwd_block(ctx, a, k, call->specs, call->nspecs, r0, n, stream))) return st;
  }
  return RLK_OK;
}

static const rlk_arg_field ll_bwd_fields[] = {
    RLK_ARG_IN(rlk_linear_logprob_backward_args, hidden),       RLK_ARG_IN(rlk_linear_logprob_backward_args, weight),
    RLK_ARG_IN(rlk_linear_logprob_backward_args, labels),       RLK_ARG_IN(rlk_linear_logprob_backward_args, lse),
    RLK_ARG_IN(rlk_linear_logprob_backward_args, grad_logp),    RLK_ARG_IN(rlk_linear_logprob_backward_args, grad_entropy),
    RLK_ARG_IN(rlk_linear_logprob_backward_args, entropy),      RLK_ARG_OUT(rlk_linear_logprob_backward_args, grad_hidden),
    RLK_ARG_OUT(rlk_linear_logprob_backward_args, grad_weight), RLK_ARG_OUT(rlk_linear_logprob_backward_args, status),
    RLK_ARG_IN(rlk_linear_logprob_backward_args, rows)};

static const rlk_op_entry ll_bwd_entry = {
    .name = "rlk_linear_logprob_backward", .op = &rlk_op_linear_logprob, .call_size = sizeof(ll_bwd_call),
    RLK_OP_FIELDS(ll_bwd_fields), .workspace = RLK_OP_WORKSPACE(rlk_linear_logprob_backward_args, 16),
    .validate = ll_bwd_validate, .launch = ll_bwd_launch};

RLK_API rlk_status rlk_linear_logprob_backward_workspace_size(rlk_context *ctx,
                                                              const rlk_linear_logprob_backward_args *args,
                                                              size_t *bytes) {
  return rlk_op_workspace_size(&ll_bwd_entry, ctx, args, bytes);
}

RLK_API rlk_status rlk_linear_logprob_backward(rlk_context *ctx, const rlk_linear_logprob_backward_args *a,
                                               void *stream) {
  return rlk_op_run(&ll_bwd_entry, ctx, a, stream);
}

/* ---------------------------------------------------------------------------------- */
/* Token chunks (linear_logprob_stored.h)                                              */
/* ---------------------------------------------------------------------------------- */

int rlk_ll_stored_ok(const rlk_context *ctx, const rlk_tensor *hidden, const rlk_tensor *weight, const char **why) {
  if (!ll_wgmma_target(ctx)) {
    *why = "needs an sm_90a target";
    return 0;
  }
  int64_t N, H, V, hs, ws, wH;
  if (ll_check_matrix(hidden, "hidden", &N, &H, &hs) || ll_check_matrix(weight, "weight", &V, &wH, &ws)) {
    rlk_error_clear();
    *why = "hidden or weight is no matrix the kernels take";
    return 0;
  }
  const rlk_tma_desc_request r[4] = {ll_tma_req(hidden->data, hidden->dtype, N, H, hs, LL_SM90_BM),
                                     ll_tma_req(hidden->data, hidden->dtype, N, H, hs, 64),
                                     ll_tma_req(weight->data, weight->dtype, V, H, ws, LL_SM90_BN),
                                     ll_tma_req(weight->data, weight->dtype, V, H, ws, 64)};
  for (int i = 0; i < 4; i++)
    if (rlk_tma_check(&r[i]) != RLK_OK) {
      rlk_error_clear();
      *why = i < 2 ? "no tensor map for hidden" : "no tensor map for weight";
      return 0;
    }
  return 1;
}

static int64_t ll_stored_pitch(int64_t V) { return (V + LL_STORED_PITCH - 1) / LL_STORED_PITCH * LL_STORED_PITCH; }

/* u's bytes in the workspace: rows x V, or (ksplit > 0) the lines [0, min(ksplit, V)) of u^T */
static size_t ll_stored_u_bytes(int64_t rows, int64_t V, int64_t ksplit) {
  return ll_align256(ksplit ? (size_t)((ksplit < V ? ksplit : V) * ll_stored_pitch(rows) * 2)
                            : (size_t)(rows * ll_stored_pitch(V) * 2));
}

size_t rlk_ll_stored_workspace(int64_t rows, int64_t V, int64_t ksplit) {
  const int64_t tiles = (V + RLK_LL_STORED_TILE - 1) / RLK_LL_STORED_TILE;
  return ll_stored_u_bytes(rows, V, ksplit) + ll_align256((size_t)(tiles * rows) * LL_RECORD_BYTES);
}

/* The rounds of persistent blocks grad_weight's slices of ks lines take (each slice a launch
 * of 128 x 256 tiles over `sms` blocks). */
static int64_t ll_slice_rounds(int64_t V, int64_t H, int64_t ks, int64_t sms) {
  const int64_t tn = (H + LL_SM90_BN - 1) / LL_SM90_BN;
  int64_t rounds = 0;
  for (int64_t v0 = 0; v0 < V; v0 += ks) {
    const int64_t lines = V - v0 < ks ? V - v0 : ks, tiles = (lines + LL_SM90_BM - 1) / LL_SM90_BM * tn;
    rounds += (tiles + sms - 1) / sms;
  }
  return rounds;
}

int64_t rlk_ll_stored_ksplit(int64_t N, int64_t H, int64_t V, int64_t room, int sms) {
  const int64_t line = ll_stored_pitch(N) * 2, most = (V + RLK_LL_STORED_TILE - 1) / RLK_LL_STORED_TILE * RLK_LL_STORED_TILE;
  const int64_t records = (int64_t)(rlk_ll_stored_workspace(N, V, 0) - ll_stored_u_bytes(N, V, 0));
  const int64_t left = room - records;
  int64_t k = left > 0 ? left / line / RLK_LL_STORED_TILE * RLK_LL_STORED_TILE : 0;
  if (k > most) k = most;
  if (k < most && sms > 0) {
    /* the fewest rounds among the sizes down to half: a slice's last round of tiles, part of the
     * blocks busy, is paid once a launch */
    int64_t best = k, least = ll_slice_rounds(V, H, k, sms);
    for (int64_t c = k - RLK_LL_STORED_TILE; c >= k / 2 && c > 0; c -= RLK_LL_STORED_TILE) {
      const int64_t r = ll_slice_rounds(V, H, c, sms);
      if (r < least) best = c, least = r;
    }
    k = best;
  }
  return k;
}

int rlk_ll_stored_over_weight_ok(const rlk_tensor *grad_weight, int64_t N, int64_t V, int64_t ksplit) {
  if (!grad_weight->data || grad_weight->dtype != RLK_F32 || grad_weight->ndim != 2 || ksplit <= 0 ||
      ksplit % RLK_LL_STORED_TILE)
    return 0;
  const int64_t gws = grad_weight->strides[0];
  if (grad_weight->strides[1] != 1 || gws % 4 || (uintptr_t)grad_weight->data % 16) return 0;
  if (ksplit >= V) return 1; /* all of u^T in the workspace */
  /* a line of u^T (N 16-bit values) within a row's own H values, never in the padding between
   * rows, which may be another tensor's */
  if (N > 2 * grad_weight->shape[1]) return 0;
  const rlk_tma_desc_request r = ll_tma_req(grad_weight->data, RLK_BF16, V - ksplit, N, 2 * gws, 64);
  return ll_tma_ok(&r);
}

/* The chunk's pieces: u (u^T's two parts when transposed), the records, and hidden / labels from
 * row r0. */
typedef struct ll_stored_chunk {
  int64_t N, H, V, hs, ws, ls, pitch, gws;
  void *u, *u2, *records; /* u2: u^T's lines from ksplit, 16-bit in grad_weight's memory */
  const void *hidden, *labels;
} ll_stored_chunk;

static void ll_stored_chunk_of(const rlk_ll_stored *s, int64_t r0, ll_stored_chunk *c) {
  int64_t wH;
  ll_check_matrix(&s->hidden, "hidden", &c->N, &c->H, &c->hs); /* checked by rlk_ll_stored_ok */
  ll_check_matrix(&s->weight, "weight", &c->V, &wH, &c->ws);
  c->ls = s->labels.ndim == 1 ? s->labels.strides[0] : 1;
  c->pitch = ll_stored_pitch(s->ksplit ? s->rows : c->V);
  c->gws = s->grad_weight.data ? s->grad_weight.strides[0] : 0;
  c->u = s->workspace;
  c->u2 = s->grad_weight.data;
  c->records = (char *)s->workspace + ll_stored_u_bytes(s->rows, c->V, s->ksplit);
  c->hidden = (const char *)s->hidden.data + (size_t)(r0 * c->hs) * 2u;
  c->labels = (const char *)s->labels.data + (size_t)(r0 * c->ls) * rlk_dtype_size(s->labels.dtype);
}

/* The maps of u: row-major [n][V] (64 x 64 boxes) into m_u; or, transposed, u^T's lines [0, ksplit)
 * in the workspace into m_u and [ksplit, V) in grad_weight into m_u2 (m_u again where u^T has no
 * such lines), boxes of box_lines lines x 64 rows. */
static rlk_status ll_stored_u_maps(rlk_context *ctx, const rlk_ll_stored *s, const ll_stored_chunk *c, int64_t n,
                                   uint32_t box_lines, rlk_tensor_map *m_u, rlk_tensor_map *m_u2) {
  const rlk_dtype dt = s->hidden.dtype;
  rlk_status st;
  if (!s->ksplit) {
    const rlk_tma_desc_request r = ll_tma_req(c->u, dt, n, c->V, c->pitch, 64);
    if ((st = rlk_context_tensor_map(ctx, &r, m_u))) return st;
    *m_u2 = *m_u;
    return RLK_OK;
  }
  const int64_t lo = s->ksplit < c->V ? s->ksplit : c->V;
  const rlk_tma_desc_request r = ll_tma_req(c->u, dt, lo, n, c->pitch, box_lines);
  if ((st = rlk_context_tensor_map(ctx, &r, m_u))) return st;
  if (lo == c->V) {
    *m_u2 = *m_u;
    return RLK_OK;
  }
  const rlk_tma_desc_request r2 = ll_tma_req(c->u2, dt, c->V - lo, n, 2 * c->gws, box_lines);
  return rlk_context_tensor_map(ctx, &r2, m_u2);
}

rlk_status rlk_ll_stored_logits(rlk_context *ctx, const rlk_ll_stored *s, int64_t r0, int64_t n, void *stream) {
  ll_stored_chunk c;
  ll_stored_chunk_of(s, r0, &c);
  if (r0 == 0 && rlk_record_enabled()) {
    rlk_op_values line;
    rlk_op_values_init(&rlk_op_linear_logprob, &line);
    ll_line(&line, 3, s->hidden.dtype, s->labels.dtype, s->entropy,
            s->grad_hidden.data && s->grad_hidden.dtype != RLK_F32, RLK_LINEAR_LOGPROB_AUTO, 0);
    rlk_record_op(&rlk_op_linear_logprob, &line);
  }
  const rlk_dtype dt = s->hidden.dtype;
  const int hd = dt == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16;
  const int tr = s->ksplit > 0;
  const rlk_kernel_spec lg = {&ll_bwd_sm90_tmpl, {tr ? LL_BWD_LOGITS_T : LL_BWD_LOGITS, hd, s->labels.dtype,
                                                  s->entropy, 0}},
                        cb = {&ll_combine_tmpl, {s->labels.dtype, s->entropy}};
  rlk_status st;
  if ((st = rlk_spec_validate(&lg)) || (st = rlk_spec_validate(&cb))) return st;
  ll_bwd_sm90_args g = {0};
  const rlk_tma_desc_request r_h = ll_tma_req(c.hidden, dt, n, c.H, c.hs, LL_SM90_BM),
                             r_w = ll_tma_req(s->weight.data, dt, c.V, c.H, c.ws, LL_SM90_BN);
  if ((st = rlk_context_tensor_map(ctx, &r_h, &g.map_a)) || (st = rlk_context_tensor_map(ctx, &r_w, &g.map_b)) ||
      (st = ll_stored_u_maps(ctx, s, &c, n, 64, &g.map_c, &g.map_d)))
    return st;
  g.labels = c.labels, g.label_stride = c.ls, g.V = c.V, g.ignore_index = s->ignore_index;
  g.temperature = s->temperature, g.group = s->group ? s->group : LL_BWD_GROUP;
  g.M = n, g.Nn = c.V, g.K = c.H, g.out = c.u, g.out_stride = c.pitch, g.out_aux = c.records, g.ksplit = s->ksplit;
  g.threshold = s->threshold ? s->threshold + r0 : NULL;
  if ((st = ll_bwd_sm90_launch(ctx, &lg, &g, LL_BWD_SM90_SMEM_STAGED, stream))) return st;
  return ll_combine(ctx, &cb, c.records, g.tiles_n, n, c.V, c.labels, c.ls, s->ignore_index, s->logp + r0,
                    s->lse + r0, s->entropy ? s->ent + r0 : NULL, s->status, NULL, 0, s->temperature, NULL, 0,
                    s->threshold ? s->threshold + r0 : NULL, stream);
}

/* u -> dz in place: the row-major pass over the chunk's rows, or the transposed one over u^T's
 * two parts. */
static rlk_status ll_stored_dz(rlk_context *ctx, const rlk_ll_stored *s, const ll_stored_chunk *c, int64_t r0,
                               int64_t n, void *stream) {
  const int hd = s->hidden.dtype == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16;
  const rlk_kernel_spec fx = {s->ksplit ? &ll_stored_dz_t_tmpl : &ll_stored_dz_tmpl,
                              {hd, s->labels.dtype, s->entropy}};
  rlk_status st;
  if ((st = rlk_spec_validate(&fx))) return st;
  ll_stored_dz_args z = {0};
  z.u = c->u;
  z.u_stride = c->pitch;
  z.u2 = c->u2;
  z.u2_stride = 2 * c->gws;
  z.ksplit = s->ksplit;
  z.partials = c->records;
  z.M = n;
  z.V = c->V;
  z.labels = c->labels;
  z.label_stride = c->ls;
  z.ignore_index = s->ignore_index;
  z.lse = s->lse + r0;
  z.g_lp = s->g_lp + r0;
  z.entropy = s->entropy ? s->ent + r0 : NULL;
  z.g_ent = s->entropy && s->g_ent ? s->g_ent + r0 : NULL;
  z.temperature = s->temperature;
  z.threshold = s->threshold ? s->threshold + r0 : NULL;
  const int64_t per_block = LL_THREADS * RLK_LL_STORED_VEC * RLK_LL_STORED_VECS;
  const rlk_launch_dims d =
      s->ksplit ? rlk_op_grid((uint64_t)((n + RLK_LL_STORED_T_ROWS - 1) / RLK_LL_STORED_T_ROWS),
                              (uint64_t)((c->V + RLK_LL_STORED_T_COLS - 1) / RLK_LL_STORED_T_COLS), 1, LL_THREADS, 0)
                : rlk_op_grid((uint64_t)((c->V + per_block - 1) / per_block), (uint64_t)n, 1, LL_THREADS, 0);
  return rlk_context_launch_params(ctx, &fx, &d, stream, &z);
}

/* dh = dz W over the whole vocabulary into the chunk's rows of grad_hidden, each element written
 * once: A = dz K-major (row-major u), or MN-major from u^T's two parts (the dh_t kind). */
static rlk_status ll_stored_dh(rlk_context *ctx, const rlk_ll_stored *s, const ll_stored_chunk *c, int64_t r0,
                               int64_t n, ll_bwd_sm90_args *g, void *stream) {
  const rlk_dtype dt = s->hidden.dtype, gd = s->grad_hidden.dtype;
  const int hd = dt == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16;
  const int64_t ghs = s->grad_hidden.strides[0];
  void *gh = (char *)s->grad_hidden.data + (size_t)(r0 * ghs) * rlk_dtype_size(gd);
  const rlk_kernel_spec dh = {&ll_bwd_sm90_tmpl, {s->ksplit ? LL_BWD_DH_T : LL_BWD_DH, hd, RLK_I32, 0, rlk_op_float_dt(gd)}};
  rlk_status st;
  if ((st = rlk_spec_validate(&dh))) return st;
  const rlk_tma_desc_request r_b = ll_tma_req(s->weight.data, dt, c->V, c->H, c->ws, 64),
                             r_c = gd == RLK_F32 ? ll_tma_req_f32(gh, n, c->H, ghs) : ll_tma_req(gh, gd, n, c->H, ghs, 64);
  /* a 16-bit grad_hidden that is added to keeps the register path */
  g->staged = (gd == RLK_F32 || !s->accumulate) && ll_tma_ok(&r_c);
  if (s->ksplit) {
    st = ll_stored_u_maps(ctx, s, c, n, 64, &g->map_a, &g->map_d);
  } else {
    const rlk_tma_desc_request r_a = ll_tma_req(c->u, dt, n, c->V, c->pitch, LL_SM90_BM);
    if (!(st = rlk_context_tensor_map(ctx, &r_a, &g->map_a))) g->map_d = g->map_a;
  }
  g->map_c = g->map_a;
  if (st || (st = rlk_context_tensor_map(ctx, &r_b, &g->map_b)) ||
      (g->staged && (st = rlk_context_tensor_map(ctx, &r_c, &g->map_c))))
    return st;
  g->M = n, g->Nn = c->H, g->K = c->V, g->c0 = 0, g->ksplit = s->ksplit, g->out = gh, g->out_stride = ghs;
  g->accumulate = s->accumulate;
  return ll_bwd_sm90_launch(ctx, &dh, g, g->staged ? LL_BWD_SM90_SMEM_STAGED : LL_BWD_SM90_SMEM, stream);
}

/* grad_weight from row-major chunks: dz^T h over the chunk's rows, added to the chunks before it
 * (first: the first chunk, which writes unless accumulating). */
static rlk_status ll_stored_dw(rlk_context *ctx, const rlk_ll_stored *s, const ll_stored_chunk *c, int64_t n,
                               int first, ll_bwd_sm90_args *g, void *stream) {
  const rlk_dtype dt = s->hidden.dtype;
  const int hd = dt == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16;
  const rlk_kernel_spec dw = {&ll_bwd_sm90_tmpl, {LL_BWD_DW, hd, RLK_I32, 0, 0}};
  rlk_status st;
  if ((st = rlk_spec_validate(&dw))) return st;
  const rlk_tma_desc_request r_a = ll_tma_req(c->u, dt, n, c->V, c->pitch, 64),
                             r_b = ll_tma_req(c->hidden, dt, n, c->H, c->hs, 64),
                             r_c = ll_tma_req_f32(s->grad_weight.data, c->V, c->H, c->gws);
  g->staged = ll_tma_ok(&r_c);
  if ((st = rlk_context_tensor_map(ctx, &r_a, &g->map_a)) || (st = rlk_context_tensor_map(ctx, &r_b, &g->map_b)))
    return st;
  g->map_c = g->map_d = g->map_a;
  if (g->staged && (st = rlk_context_tensor_map(ctx, &r_c, &g->map_c))) return st;
  g->M = c->V, g->Nn = c->H, g->K = n, g->c0 = 0, g->ksplit = 0, g->out = s->grad_weight.data, g->out_stride = c->gws;
  g->accumulate = !first || s->accumulate;
  return ll_bwd_sm90_launch(ctx, &dw, g, g->staged ? LL_BWD_SM90_SMEM_STAGED : LL_BWD_SM90_SMEM, stream);
}

/* grad_weight over u^T, in slices of ksplit lines from the last: slice j (lines [j ksplit,
 * (j + 1) ksplit)) reads dz^T's lines from the workspace (j = 0) or from grad_weight's rows
 * [(j - 1) ksplit, j ksplit), and writes grad_weight's rows [j ksplit, ...), which held slice
 * j + 1's, read by the launch before. Each slice is a dh-kind product (A = its dz^T lines,
 * K-major over the rows; B = h), written once: this layout needs an overwritten grad_weight. */
static rlk_status ll_stored_dw_slices(rlk_context *ctx, const rlk_ll_stored *s, const ll_stored_chunk *c, int64_t n,
                                      ll_bwd_sm90_args *g, void *stream) {
  const rlk_dtype dt = s->hidden.dtype;
  const int hd = dt == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16;
  const int64_t ks = s->ksplit, V = c->V;
  const rlk_kernel_spec dw = {&ll_bwd_sm90_tmpl, {LL_BWD_DH, hd, RLK_I32, 0, 0}};
  rlk_status st;
  if ((st = rlk_spec_validate(&dw))) return st;
  const rlk_tma_desc_request r_b = ll_tma_req(c->hidden, dt, n, c->H, c->hs, 64);
  if ((st = rlk_context_tensor_map(ctx, &r_b, &g->map_b))) return st;
  for (int64_t j = (V + ks - 1) / ks - 1; j >= 0; j--) {
    const int64_t v0 = j * ks, lines = V - v0 < ks ? V - v0 : ks;
    const void *src = j == 0 ? c->u : (const char *)c->u2 + (size_t)((j - 1) * ks * c->gws) * 4u;
    float *out = (float *)s->grad_weight.data + v0 * c->gws;
    const rlk_tma_desc_request r_a = ll_tma_req(src, dt, lines, n, j == 0 ? c->pitch : 2 * c->gws, LL_SM90_BM),
                               r_c = ll_tma_req_f32(out, lines, c->H, c->gws);
    g->staged = ll_tma_ok(&r_c);
    if ((st = rlk_context_tensor_map(ctx, &r_a, &g->map_a))) return st;
    g->map_c = g->map_d = g->map_a;
    if (g->staged && (st = rlk_context_tensor_map(ctx, &r_c, &g->map_c))) return st;
    g->M = lines, g->Nn = c->H, g->K = n, g->c0 = 0, g->ksplit = 0, g->out = out, g->out_stride = c->gws;
    g->accumulate = 0;
    if ((st = ll_bwd_sm90_launch(ctx, &dw, g, g->staged ? LL_BWD_SM90_SMEM_STAGED : LL_BWD_SM90_SMEM, stream)))
      return st;
  }
  return RLK_OK;
}

rlk_status rlk_ll_stored_grads(rlk_context *ctx, const rlk_ll_stored *s, int64_t r0, int64_t n, int first,
                               void *stream) {
  ll_stored_chunk c;
  ll_stored_chunk_of(s, r0, &c);
  rlk_status st;
  if ((st = ll_stored_dz(ctx, s, &c, r0, n, stream))) return st;
  ll_bwd_sm90_args g = {0};
  g.V = c.V, g.temperature = s->temperature, g.group = s->group ? s->group : LL_BWD_GROUP;
  if (s->grad_hidden.data && (st = ll_stored_dh(ctx, s, &c, r0, n, &g, stream))) return st;
  if (!s->grad_weight.data) return RLK_OK;
  return s->ksplit ? ll_stored_dw_slices(ctx, s, &c, n, &g, stream) : ll_stored_dw(ctx, s, &c, n, first, &g, stream);
}

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

/* chunks: rlk_linear_policy_loss's token chunks (sm_90a; elsewhere the kernels of both passes,
 * which that call runs there) */
static const char *const ll_pass_names[] = {"fwd", "bwd", "both", "chunks", NULL};
static const char *const ll_grad_line_names[] = {"f32", "same", NULL};


#define LL_KEY_DOC "a tuning key's (with hidden_size, vocab and tokens)"

static const rlk_op_setting ll_settings[LL_NSETTINGS] = {
    [LL_S_PASS] = RLK_SET_CHOICE("pass", ll_pass_names, 2,
                                 "linear_logprob_fwd_* linear_logprob_bwd_* linear_logprob_stored_dz",
                                 "the kernels to build"),
    [LL_S_HIDDEN] = RLK_SET_DTYPE("hidden", LL_HIDDEN_DTYPES, RLK_BF16, "linear_logprob_*.hidden",
                                  "the dtype of hidden and weight"),
    [LL_S_LABELS] = RLK_SET_DTYPE("labels", LL_LABEL_DTYPES, RLK_I64, "linear_logprob_*.labels", "the labels' dtype"),
    [LL_S_ENTROPY] = RLK_SET_FLAG("entropy", 0, "linear_logprob_*.entropy",
                                  "fwd: also the entropy; bwd: an entropy gradient"),
    [LL_S_GRAD] = RLK_SET_CHOICE("grad", ll_grad_line_names, 0, "linear_logprob_bwd_dh_out linear_logprob_bwd_*.gw",
                                 "the backward's grad_hidden and grad_weight dtype"),
    [LL_S_ROWS] = RLK_SET_CHOICE("rows", ll_rows_names, 0,
                                 "linear_logprob_gather linear_logprob_scatter linear_logprob_*.rows",
                                 "a row selection's index dtype (none: no selection): the kernels that gather the "
                                 "selected rows of hidden and write grad_hidden by row"),
    [LL_S_VARIANT] = RLK_SET_CHOICE("variant", ll_variant_names, RLK_LINEAR_LOGPROB_AUTO, "linear_logprob_*",
                                    "wgmma: the sm_90a kernels (elsewhere tiled runs); tiled: the portable ones only"),
    [LL_S_STAGES] = RLK_SET_INT("stages", 0, 0, LL_SM90_STAGES, "linear_logprob_fwd_sm90.stages",
                                "the sm_90a forward's operand stages, 2 to 4 (0: 4)"),
    [LL_S_SPLITS] = RLK_SET_INT("splits", 0, 0, 65535, "", "the forward's vocabulary splits (0: chosen); no kernel"),
    [LL_S_CHUNK] = RLK_SET_INT("chunk", 0, 0, INT32_MAX, "",
                               "the backward's vocabulary columns a chunk, a multiple of 64 (0: chosen); no kernel"),
    [LL_S_GROUP] = RLK_SET_INT("group", 0, 0, LL_BWD_GROUP_MAX, "",
                               "the sm_90a backward's tile order, rows of tiles a group (0: 8); no kernel"),
    [LL_S_HIDDEN_SIZE] = RLK_SET_INT("hidden_size", 0, 1, INT32_MAX, "", "H, " LL_KEY_DOC),
    [LL_S_VOCAB] = RLK_SET_INT("vocab", 0, 1, INT32_MAX, "", "V, " LL_KEY_DOC),
    [LL_S_TOKENS] = RLK_SET_INT("tokens", 0, 1, INT32_MAX, "",
                                "N, " LL_KEY_DOC "; with all of them and no tuning settings, a fwd line plans the "
                                "tuning database's winner for them on this context"),
};

static void ll_line(rlk_op_values *v, int pass, rlk_dtype hidden, rlk_dtype labels, int entropy, int grad,
                    int variant, int stages) {
  rlk_op_values_set(v, LL_S_PASS, pass);
  rlk_op_values_set(v, LL_S_HIDDEN, hidden);
  rlk_op_values_set(v, LL_S_LABELS, labels);
  rlk_op_values_set(v, LL_S_ENTROPY, entropy);
  rlk_op_values_set(v, LL_S_GRAD, grad);
  rlk_op_values_set(v, LL_S_VARIANT, variant);
  if (stages && stages != LL_SM90_STAGES) rlk_op_values_set(v, LL_S_STAGES, stages);
}

/* ---- tuning ---- */

/* The tuning settings, in the order of a winner's values (rlk_tune_entry_values). */
enum { LL_TUNE_STAGES, LL_TUNE_SPLITS, LL_TUNE_CHUNK, LL_TUNE_GROUP, LL_NTUNE };
static const int ll_tuning[LL_NTUNE] = {LL_S_STAGES, LL_S_SPLITS, LL_S_CHUNK, LL_S_GROUP};

/* What a sweep tool times against the default (valid on every target: elsewhere than sm_90a the
 * forward's depths and the backward's tile order change nothing). A smaller backward chunk, not
 * a larger one: the default's workspace is at the 0.28 GiB budget already. */
static const char *const ll_candidates[] = {"stages=2", "stages=3", "group=4", "group=16", "group=64", "chunk=8192",
                                            NULL};

static int ll_parse_tuning(const char *settings, int64_t values[RLK_TUNE_VALUES]) {
  return rlk_op_tuning_values(&rlk_op_linear_logprob, ll_tuning, LL_NTUNE, settings, values);
}

/* A configuration's shape in the tuning database for one pass (plan syntax): the settings its
 * kernels depend on and the problem's H and V; the backward adds its gradients' dtype. */
static int ll_tune_shape(int pass, rlk_dtype hidden, rlk_dtype labels, int entropy, int grad, int64_t H, int64_t V,
                         char *buf, size_t size) {
  char g[16] = "";
  if (pass == 1) rlk_format(g, sizeof g, " grad=%s", ll_grad_line_names[grad]);
  return rlk_format(buf, size, "pass=%s hidden=%s labels=%s entropy=%d%s hidden_size=%lld vocab=%lld",
                    ll_pass_names[pass], rlk_dtype_name(hidden), rlk_dtype_name(labels), entropy, g, (long long)H,
                    (long long)V);
}

/* 1 with the winner of `pass` for a key in v (its tuning values), or 0: no database, no record,
 * or a winner that does not parse (warned about once; the default runs). */
static int ll_tuned(const rlk_context *ctx, int pass, rlk_dtype hidden, rlk_dtype labels, int entropy, int grad,
                    int64_t H, int64_t V, int64_t N, int64_t v[RLK_TUNE_VALUES]) {
  char shape[256];
  return ll_tune_shape(pass, hidden, labels, entropy, grad, H, V, shape, sizeof shape) >= 0 &&
         rlk_op_tuned(ctx, &rlk_op_linear_logprob, shape, N, ll_parse_tuning, v);
}

static void ll_tuned_fwd(const rlk_context *ctx, rlk_dtype hidden, rlk_dtype labels, int entropy, int64_t H, int64_t V,
                         int64_t N, int *stages, int *splits) {
  int64_t v[RLK_TUNE_VALUES];
  if (!ll_tuned(ctx, 0, hidden, labels, entropy, 0, H, V, N, v)) return;
  *stages = (int)v[LL_TUNE_STAGES];
  *splits = (int)v[LL_TUNE_SPLITS];
}

static void ll_tuned_bwd(const rlk_context *ctx, rlk_dtype hidden, rlk_dtype labels, int entropy, int grad, int64_t H,
                         int64_t V, int64_t N, int *chunk, int *group) {
  int64_t v[RLK_TUNE_VALUES];
  if (!ll_tuned(ctx, 1, hidden, labels, entropy, grad, H, V, N, v)) return;
  /* a chunk that is no multiple of 64 would make the call refuse what it did not ask for */
  if (v[LL_TUNE_CHUNK] % LL_TILE == 0) *chunk = (int)v[LL_TUNE_CHUNK];
  *group = (int)v[LL_TUNE_GROUP];
}

static int ll_line_key(const rlk_op_values *s) {
  return RLK_OP_GIVEN(s, LL_S_HIDDEN_SIZE) && RLK_OP_GIVEN(s, LL_S_VOCAB) && RLK_OP_GIVEN(s, LL_S_TOKENS);
}

static int ll_line_tuning_given(const rlk_op_values *s) {
  return s->v[LL_S_STAGES] || s->v[LL_S_SPLITS] || s->v[LL_S_CHUNK] || s->v[LL_S_GROUP];
}

/* The tuning database key of plan settings: one pass, hidden_size, vocab and tokens, no tuning
 * settings, the automatic variant. */
static rlk_status ll_tune_key(const rlk_op_values *s, char *shape, size_t size, int64_t *tokens) {
  const int pass = (int)s->v[LL_S_PASS];
  if (pass >= 2) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "pass: a tuning key names one pass, fwd or bwd");
  if (!ll_line_key(s))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hidden_size, vocab, tokens: a tuning key needs all of them");
  if (ll_line_tuning_given(s))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "stages, splits, chunk, group: a tuning key holds no tuning settings");
  if (s->v[LL_S_VARIANT] != RLK_LINEAR_LOGPROB_AUTO)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "variant: a tuning key is the automatic variant's");
  if (ll_tune_shape(pass, (rlk_dtype)s->v[LL_S_HIDDEN], (rlk_dtype)s->v[LL_S_LABELS], (int)s->v[LL_S_ENTROPY],
                    (int)s->v[LL_S_GRAD], s->v[LL_S_HIDDEN_SIZE], s->v[LL_S_VOCAB], shape, size) < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "linear_logprob: the shape does not fit %zu bytes", size);
  *tokens = rlk_tune_bucket(s->v[LL_S_TOKENS]);
  return RLK_OK;
}

/* A row selection's kernels (rows: the setting's value) at specs, their count: the gather of
 * hidden's rows; for the backward (bwd) also the scatter of grad_hidden (dtype code gh) and the
 * gather of its rows that an accumulating call's sum starts from (an f32 one's on a GPU, where a
 * 16-bit one's sum starts from 0 and adds it at the end; any on the host). */
static size_t ll_rows_specs(const rlk_context *ctx, int64_t rows, int hidden, int bwd, int gh,
                            rlk_kernel_spec *specs) {
  const rlk_dtype r = ll_rows_dtype(rows);
  size_t n = 0;
  specs[n++] = rlk_ll_gather_spec(hidden, r);
  if (!bwd) return n;
  if (gh != hidden && (gh == RLK_DT_F32 || ctx->kind == RLK_BACKEND_HOST)) specs[n++] = rlk_ll_gather_spec(gh, r);
  specs[n++] = rlk_ll_scatter_spec(gh, r);
  return n;
}

static rlk_status ll_plan(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs,
                          size_t *nspecs) {
  const int64_t hidden = ll_dt_code(s->v[LL_S_HIDDEN]), labels = s->v[LL_S_LABELS], entropy = s->v[LL_S_ENTROPY];
  const int tiled = s->v[LL_S_VARIANT] == RLK_LINEAR_LOGPROB_TILED;
  rlk_op_values f = *s; /* the forward's configuration: with a key and no tuning, the winner's stages */
  if (ll_line_key(s) && !ll_line_tuning_given(s) && s->v[LL_S_PASS] == 0) {
    int stages = 0, splits = 0;
    ll_tuned_fwd(ctx, (rlk_dtype)s->v[LL_S_HIDDEN], (rlk_dtype)labels, (int)entropy, s->v[LL_S_HIDDEN_SIZE],
                 s->v[LL_S_VOCAB], s->v[LL_S_TOKENS], &stages, &splits);
    f.v[LL_S_STAGES] = stages;
  }
  int pass = (int)s->v[LL_S_PASS]; /* 0 fwd, 1 bwd, 2 both, 3 chunks */
  const int grad_same = s->v[LL_S_GRAD] == 1;
  const int64_t rows = s->v[LL_S_ROWS];
  size_t n = 0;
  rlk_status st;
  if (pass == 3 && rows)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rows, pass: rlk_linear_policy_loss's token chunks select no rows");
  if (pass == 3) {
    if (ll_wgmma_target(ctx) && !tiled) {
      /* rlk_ll_stored_logits's and _grads's, row-major chunks and u^T over grad_weight: grad
       * names grad_hidden's dtype (grad_weight is f32, its slices dh-kind products) */
      const rlk_kernel_spec k[9] = {
          {&ll_bwd_sm90_tmpl, {LL_BWD_LOGITS, hidden, labels, entropy, 0}},
          {&ll_combine_tmpl, {labels, entropy}},
          {&ll_stored_dz_tmpl, {hidden, labels, entropy}},
          {&ll_bwd_sm90_tmpl, {LL_BWD_DH, hidden, RLK_I32, 0, grad_same ? hidden : 0}},
          {&ll_bwd_sm90_tmpl, {LL_BWD_DW, hidden, RLK_I32, 0, 0}},
          {&ll_bwd_sm90_tmpl, {LL_BWD_LOGITS_T, hidden, labels, entropy, 0}},
          {&ll_stored_dz_t_tmpl, {hidden, labels, entropy}},
          {&ll_bwd_sm90_tmpl, {LL_BWD_DH_T, hidden, RLK_I32, 0, grad_same ? hidden : 0}},
          {&ll_bwd_sm90_tmpl, {LL_BWD_DH, hidden, RLK_I32, 0, 0}}};
      const size_t nk = grad_same ? 9 : 8; /* f32 dh is the slices' kernel already */
      for (size_t i = 0; i < nk; i++) {
        if ((st = rlk_spec_validate(&k[i]))) return st;
        specs[i] = k[i];
      }
      *nspecs = nk;
      return RLK_OK;
    }
    pass = 2;
  }
  if (pass != 0) {
    const int g = grad_same ? (int)hidden : 0;
    /* sm_90a: the wgmma kernels, then the portable ones that a call without tensor maps runs */
    const int sm90 = ll_wgmma_target(ctx) && !tiled;
    ll_bwd_config b = {(int)hidden, (rlk_dtype)labels, (int)entropy, g, g, sm90};
    size_t nb = 0;
    if ((st = ll_bwd_specs(ctx, &b, specs, &nb))) return st;
    n = nb;
    if (sm90) {
      b.sm90 = 0;
      if ((st = ll_bwd_specs(ctx, &b, specs + n, &nb))) return st;
      n += nb;
    }
    if (rows) n += ll_rows_specs(ctx, rows, (int)hidden, 1, g, specs + n);
    if (pass == 1) {
      *nspecs = n;
      return RLK_OK;
    }
  }
  ll_choice ch;
  if ((st = ll_select(ctx, &f, 1, &ch))) return st;
  specs[n++] = ch.gemm;
  if (ctx->kind != RLK_BACKEND_HOST) {
    if (ch.variant == RLK_LINEAR_LOGPROB_WGMMA) {
      /* a call whose tensors no tensor map can describe runs the tiled kernel */
      ll_choice fb;
      if ((st = ll_select(ctx, &f, 0, &fb))) return st;
      specs[n++] = fb.gemm;
    }
    specs[n++] = ch.combine;
  }
  if (rows && pass == 0) n += ll_rows_specs(ctx, rows, (int)hidden, 0, 0, specs + n);
  *nspecs = n;
  return RLK_OK;
}

static const char *const ll_samples[] = {
    "linear_logprob hidden=bf16 labels=i64 entropy=1",
    "linear_logprob pass=fwd hidden=f16 labels=i32",
    "linear_logprob pass=both hidden=bf16 labels=i32 variant=tiled grad=same",
    "linear_logprob pass=bwd hidden=f16 labels=i64 entropy=1 grad=same",
    /* the sm_90a forward's other ring depths (elsewhere the default kernels above) */
    "linear_logprob pass=fwd hidden=bf16 labels=i64 entropy=1 stages=2",
    "linear_logprob pass=fwd hidden=f16 labels=i32 stages=3",
    /* rlk_linear_policy_loss's token chunks (sm_90a; elsewhere both passes' kernels) */
    "linear_logprob pass=chunks hidden=bf16 labels=i64 entropy=1",
    "linear_logprob pass=chunks hidden=f16 labels=i32 grad=same",
    /* a row selection: its gather and scatter kernels beside each pass's */
    "linear_logprob pass=both hidden=bf16 labels=i64 entropy=1 rows=i32",
    "linear_logprob pass=bwd hidden=f16 labels=i32 grad=same rows=i64",
    NULL};

/* What changes a call, not its kernels: on a GPU the forward's vocabulary split and the
 * backward's chunk, on sm_90a (the wgmma kernels) also its tile order; nothing on the host, whose
 * one fp64 kernel a call runs whole. */
static const char *ll_runtime_tuning(const rlk_context *ctx, const rlk_op_values *s) {
  if (ctx->kind == RLK_BACKEND_HOST) return NULL;
  const int sm90 = ll_wgmma_target(ctx) && s->v[LL_S_VARIANT] != RLK_LINEAR_LOGPROB_TILED;
  switch (s->v[LL_S_PASS]) {
  case 0: return "splits";
  case 1: return sm90 ? "chunk group" : "chunk";
  case 3: return sm90 ? "group" : "splits chunk";
  default: return sm90 ? "splits chunk group" : "splits chunk";
  }
}

const rlk_op_desc rlk_op_linear_logprob = {
    .name = "linear_logprob", .settings = ll_settings, .nsettings = LL_NSETTINGS, .plan = ll_plan,
    .samples = ll_samples, .candidates = ll_candidates, .tune_key = ll_tune_key, .runtime_tuning = ll_runtime_tuning};

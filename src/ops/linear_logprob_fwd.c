/* linear_logprob_fwd.c - the fused LM head + token log-probs' forward (linear_logprob_fwd.h) and
 * the call that runs it whole, rlk_linear_logprob: its kernels' templates and choice, validation,
 * the records and row launches, the launches.
 *
 * Forward kernels (templates/cuda/linear_logprob*.cuh, templates/host/linear_logprob_fwd.c):
 *   linear_logprob_fwd_sm90   sm_90a: TMA + wgmma, 128 rows x 256 columns a tile
 *   linear_logprob_fwd_tiled  every GPU target: f32 tiles of 64 x 64 from shared memory
 *   linear_logprob_combine    merges each row's split records in split order
 *   linear_logprob_fwd_host   the host backend: fp64 throughout
 * A GPU forward is a GEMM launch over (row blocks, splits) writing [splits][N] records into the
 * caller's workspace, then the combine launch. Selection (rlk_ll_select) serves calls and the
 * precompile plan alike.
 */
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "ops/invariant.h"
#include "ops/linear_logprob_fwd.h"
#include "ops/linear_logprob_op.h"
#include "ops/linear_logprob_plan.h"
#include "ops/linear_logprob_rows.h"
#include "ops/ops.h"
#include "common/linear_logprob_params.h"

/* The kernels' arguments (templates/common/linear_logprob_params.h). */
RLK_PARAMS_DECLARE(ll_fwd_host_args, RLK_LL_FWD_HOST_PARAMS, RLK_LL_FWD_HOST_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ll_combine_args, RLK_LL_COMBINE_PARAMS, RLK_LL_COMBINE_PARAMS_SIZE);

#define LL_N(a) (sizeof(a) / sizeof((a)[0]))

/* The tiles and blocks the kernels are written for: LL_SM90_*, LL_TILE, LL_THREADS
 * (linear_logprob_params.h). The combine's block: eight rows, a warp a row. */

/* The forward's records at most (ceil(V / 256) a row, 16 bytes each; launches of fewer rows past
 * it): at V 151936, 14080 rows a launch. */
#define LL_FWD_WORKSPACE_BYTES ((int64_t)128 << 20)

static const rlk_value_decl *const ll_sm90_params[] = {
    RLK_PARAM_CHOICE("hidden", rlk_ll_dt_names, 1, 2),
    &rlk_ll_labels,
    RLK_PARAM_INT("stages", 2, 4),
    &rlk_ll_entropy,
};
static const rlk_value_decl *const ll_tiled_params[] = {
    RLK_PARAM_CHOICE("hidden", rlk_ll_dt_names, 1, 2),
    &rlk_ll_labels,
    &rlk_ll_entropy,
};
static const rlk_value_decl *const ll_combine_params[] = {
    &rlk_ll_labels,
    &rlk_ll_entropy,
};

static const rlk_template ll_sm90_tmpl = {"linear_logprob", "linear_logprob_fwd_sm90",
                                          "cuda/linear_logprob_sm90.cuh", NULL,
                                          LL_N(ll_sm90_params), ll_sm90_params, RLK_TARGET_WGMMA | RLK_TARGET_TMA};
static const rlk_template ll_tiled_tmpl = {"linear_logprob", "linear_logprob_fwd_tiled",
                                           "cuda/linear_logprob.cuh", NULL, LL_N(ll_tiled_params),
                                           ll_tiled_params};
const rlk_template rlk_ll_combine_tmpl = {"linear_logprob", "linear_logprob_combine", "cuda/linear_logprob.cuh", NULL,
                                          LL_N(ll_combine_params), ll_combine_params};
static const rlk_template ll_host_tmpl = {"linear_logprob", "linear_logprob_fwd_host", NULL,
                                          "host/linear_logprob_fwd.c", LL_N(ll_tiled_params),
                                          ll_tiled_params};

rlk_status rlk_ll_select(const rlk_context *ctx, const rlk_op_values *s, int tma_ok, rlk_ll_choice *ch) {
  memset(ch, 0, sizeof *ch);
  const int64_t hidden = rlk_ll_dt_code(s->v[RLK_LL_S_HIDDEN]), labels = s->v[RLK_LL_S_LABELS],
                entropy = s->v[RLK_LL_S_ENTROPY];
  const int variant = (int)s->v[RLK_LL_S_VARIANT];
  if (ctx->kind == RLK_BACKEND_HOST) {
    ch->variant = RLK_LINEAR_LOGPROB_AUTO;
    ch->gemm = (rlk_kernel_spec){&ll_host_tmpl, {hidden, labels, entropy}};
    return rlk_spec_validate(&ch->gemm);
  }
  int v = variant;
  if (v != RLK_LINEAR_LOGPROB_TILED)
    v = rlk_ll_wgmma_target(ctx) && tma_ok ? RLK_LINEAR_LOGPROB_WGMMA : RLK_LINEAR_LOGPROB_TILED;
  if (variant == RLK_LINEAR_LOGPROB_WGMMA && v != RLK_LINEAR_LOGPROB_WGMMA)
    rlk_debug("linear_logprob: wgmma is not available here (%s); using the tiled kernel",
              rlk_ll_wgmma_target(ctx) ? "no tensor map" : "needs sm_90a");
  ch->variant = v;
  if (v == RLK_LINEAR_LOGPROB_WGMMA)
    ch->gemm = (rlk_kernel_spec){
        &ll_sm90_tmpl, {hidden, labels, s->v[RLK_LL_S_STAGES] ? s->v[RLK_LL_S_STAGES] : LL_SM90_STAGES, entropy}};
  else
    ch->gemm = (rlk_kernel_spec){&ll_tiled_tmpl, {hidden, labels, entropy}};
  ch->combine = (rlk_kernel_spec){&rlk_ll_combine_tmpl, {labels, entropy}};
  rlk_status st = rlk_spec_validate(&ch->gemm);
  return st ? st : rlk_spec_validate(&ch->combine);
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
  if ((st = rlk_check_status(&a->status))) return st;
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
    rlk_ll_tuned_fwd(ctx, a->hidden.dtype, a->labels.dtype, entropy, k->f.h.H, k->f.h.V, N, &stages, &splits);
  /* a row selection: the kernels run on the gathered rows, which a tensor map always describes */
  const rlk_tensor planned = k->r.data ? rlk_ll_rows_planned(&a->hidden, &k->r) : a->hidden;
  if (k->r.data) k->f.h.hs = k->r.pitch;
  if ((st = rlk_ll_fwd_plan(ctx, &planned, &a->weight, &k->f.h, a->labels.dtype, entropy, (int)a->variant, stages,
                            splits, &call->vals, &k->f)))
    return st;
  if (k->r.data) {
    rlk_op_values_set(&call->vals, RLK_LL_S_ROWS, rlk_ll_rows_line(&k->r));
    call->specs[call->nspecs++] = rlk_ll_gather_spec(rlk_ll_dt_code(a->hidden.dtype), k->r.dtype);
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
    call->workspace = (size_t)k->f.records * (size_t)k->rows * RLK_LL_RECORD_BYTES;
  }
  if (k->r.data) {
    k->gathered_at = rlk_ll_align256(call->workspace);
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
  rlk_ll_line(vals, 0, hidden->dtype, labels, entropy, 0, variant, stages);
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
  if (!tma_ok && rlk_ll_wgmma_target(ctx) && variant != RLK_LINEAR_LOGPROB_TILED && rlk_invariant())
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "hidden, weight: no tensor map describes them (%s), and the tiled kernel they would fall back "
                     "to sums the logits in another order than the wgmma kernel's; RLK_INVARIANT=1 refuses the "
                     "fallback (variant tiled asks for it)",
                     "16-byte aligned, row strides a multiple of 8 elements");
  rlk_ll_choice ch;
  if ((st = rlk_ll_select(ctx, vals, tma_ok, &ch))) return st;
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

rlk_status rlk_ll_combine(rlk_context *ctx, const rlk_kernel_spec *spec, const void *partials, int64_t S, int64_t n,
                          int64_t V, const void *labels, int64_t label_stride, int64_t ignore_index, float *logp,
                          float *lse, float *entropy, int *status, float *records, int64_t vocab_start,
                          float temperature, const float *logits, int64_t logits_pitch, const float *threshold,
                          void *stream) {
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
  /* sm_90a: pairs of row blocks sharing each W box where a short last block would run ahead */
  const int cl = wg ? rlk_ll_fwd_cluster(n, ctx->target.cluster_sms[1], ctx->target.multiprocessors) : 1;
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
    /* fewer rows than a block's: boxes of as many rows as hold them (a power of two from 8) */
    uint32_t box = LL_SM90_BM;
    while (box > 8 && (int64_t)box / 2 >= n) box /= 2;
    rh.box_rows = box;
    w.h_box_rows = box;
    /* in pairs, each block copies half of a W box: boxes of half the rows */
    rlk_tma_desc_request rw = f->req_w;
    rw.box_rows = (uint32_t)(LL_SM90_BN / cl);
    w.cluster = cl;
    if ((st = rlk_context_tensor_map(ctx, &rh, &w.map_h)) || (st = rlk_context_tensor_map(ctx, &rw, &w.map_w)))
      return st;
    const size_t smem = (size_t)f->gemm.values[2] * LL_SM90_STAGE_BYTES + LL_SM90_ALIGN;
    rlk_launch_dims d = rlk_op_grid((uint64_t)row_blocks, (uint64_t)S, 1, LL_SM90_THREADS, smem);
    d.cluster = (unsigned)cl; /* a cluster launch only in pairs: a kernel alone is a plain launch */
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
  return rlk_ll_combine(ctx, &f->combine, partials, f->records, n, f->h.V, lab, f->h.ls, o->ignore_index,
                        o->logp ? o->logp + r0 : NULL, o->lse ? o->lse + r0 : NULL,
                        o->entropy ? o->entropy + r0 : NULL, o->status, o->records ? o->records + 4 * r0 : NULL,
                        o->vocab_start, temperature, logits, pitch, o->threshold ? o->threshold + r0 : NULL, stream);
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
      if ((st = rlk_ll_gather(ctx, &k->r, rlk_ll_dt_code(a->hidden.dtype), a->hidden.data, k->hidden_stride, k->f.h.H,
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
    RLK_ARG_IN(rlk_linear_logprob_args, rows),     RLK_ARG_IN(rlk_linear_logprob_args, threshold)};

static const rlk_op_entry ll_entry = {
    .name = "rlk_linear_logprob", .op = &rlk_op_linear_logprob, .call_size = sizeof(ll_call), RLK_OP_FIELDS(ll_fields),
    .workspace = RLK_OP_WORKSPACE(rlk_linear_logprob_args, 16), .validate = ll_validate, .launch = ll_launch};

RLK_OP_DEFINE_CALL_AND_SIZE(rlk_linear_logprob, rlk_linear_logprob_args, ll_entry)

/* logprob_shard.c - vocab-parallel log-probs: rlk_logprob's shard form (per-row records of a
 * vocabulary shard) and rlk_logprob_combine (the gathered records merged in rank order). The
 * record format is documented in include/rlk.h; the NCCL path is in logprob_nccl.c.
 *
 * Kernels (templates/cuda/logprob_shard.cuh, templates/host/logprob_shard_fwd.c and
 * logprob_combine.c):
 *   logprob_fwd_shard  rlk_logprob's vector kernel layout (rlk_logprob_vec_shape) over the shard;
 *                      the unsharded kernels are untouched
 *   logprob_combine    a thread per row, 256-thread blocks */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "ops/logprob_shard.h"
#include "ops/ops.h"
#include "common/logprob_shard_params.h"

/* The kernels' arguments (templates/common/logprob_shard_params.h). */
RLK_PARAMS_DECLARE(ls_fwd_kernel_args, RLK_LS_FWD_PARAMS, RLK_LS_FWD_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ls_combine_kernel_args, RLK_LS_COMBINE_PARAMS, RLK_LS_COMBINE_PARAMS_SIZE);

/* Choice names: the index of each is the code the templates see (dtypes: RLK_DT_*). */
static const char *const ls_dt_names[] = RLK_PARAMS_ENUM_NAMES(RLK_FLOAT_DTS);
static const char *const ls_pass_names[] = {"fwd", "combine", "both", NULL};
enum { LS_PASS_FWD = 0, LS_PASS_COMBINE = 1, LS_PASS_BOTH = 2 };

#define LS_LABEL_DTYPES (RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64))
#define LS_COMBINE_BLOCK 256

/* Parameters that the settings of their names feed unchanged. */
static const rlk_value_decl ls_logits = RLK_DECL_CHOICES("logits", ls_dt_names);
static const rlk_value_decl ls_labels = RLK_DECL_DTYPE("labels", LS_LABEL_DTYPES);
static const rlk_value_decl ls_entropy = RLK_DECL_FLAG("entropy");

static const rlk_value_decl *const ls_fwd_params[] = {
    &ls_logits,
    &ls_labels,
    RLK_PARAM_POW2("block", 1, 1024),
    RLK_PARAM_POW2("seg", 1, 1024),
    RLK_PARAM_POW2("unroll", 1, 8),
    &ls_entropy,
};

static const rlk_value_decl *const ls_combine_params[] = {&ls_labels, &ls_entropy};

#define LS_N(a) (sizeof(a) / sizeof((a)[0]))

static const rlk_template ls_fwd_tmpl = {"logprob", "logprob_fwd_shard", "cuda/logprob_shard.cuh",
                                         "host/logprob_shard_fwd.c", LS_N(ls_fwd_params),
                                         ls_fwd_params};
static const rlk_template ls_combine_tmpl = {"logprob", "logprob_combine", "cuda/logprob_shard.cuh",
                                             "host/logprob_combine.c", LS_N(ls_combine_params),
                                             ls_combine_params};

static int ls_dt_code(rlk_dtype d) { return d == RLK_F32 ? 0 : (d == RLK_F16 ? 1 : 2); }

static rlk_dtype ls_dt_of_code(int64_t k) { return k == 0 ? RLK_F32 : (k == 1 ? RLK_F16 : RLK_BF16); }

/* ---------------------------------------------------------------------------------- */
/* The settings and the plan (shared by the calls and precompiling)                   */
/* ---------------------------------------------------------------------------------- */

enum { LS_S_PASS, LS_S_LOGITS, LS_S_LABELS, LS_S_ENTROPY, LS_S_VOCAB, LS_S_BLOCK, LS_S_UNROLL, LS_NSETTINGS };

static const rlk_op_setting ls_settings[LS_NSETTINGS] = {
    [LS_S_PASS] = RLK_SET_CHOICE("pass", ls_pass_names, LS_PASS_BOTH, "logprob_fwd_shard logprob_combine",
                                 "the kernels to build: a shard's records, their combine"),
    [LS_S_LOGITS] = RLK_SET(ls_logits, 2, "logprob_fwd_shard.logits", "the logits' dtype"),
    [LS_S_LABELS] = RLK_SET(ls_labels, RLK_I64, "logprob_fwd_shard.labels logprob_combine.labels", "the labels' dtype"),
    [LS_S_ENTROPY] = RLK_SET(ls_entropy, 0, "logprob_fwd_shard.entropy logprob_combine.entropy",
                             "the records' entropy part and the combined entropy"),
    [LS_S_VOCAB] = RLK_SET_INT("vocab", 151936 / 2, 1, (int64_t)1 << 40, "logprob_fwd_shard.seg",
                               "the shard's columns V, picks the row layout"),
    [LS_S_BLOCK] = RLK_SET_INT("block", 0, 0, 1024, "logprob_fwd_shard.block",
                               "threads per block of the shard forward, 0 for the default"),
    [LS_S_UNROLL] = RLK_SET_INT("unroll", 0, 0, 8, "logprob_fwd_shard.unroll",
                                "16-byte vectors in flight per thread, 0 for the default"),
};

/* The kernels of the passes a line names: the shard forward (rlk_logprob's vector row layout
 * over the shard, rlk_logprob_vec_shape), the combine. */
static rlk_status ls_plan(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs,
                          size_t *nspecs) {
  const int64_t *v = s->v;
  size_t n = 0;
  rlk_status st;
  if (v[LS_S_PASS] != LS_PASS_COMBINE) {
    int b, seg, u;
    if ((st = rlk_logprob_vec_shape(ctx, ls_dt_of_code(v[LS_S_LOGITS]), v[LS_S_VOCAB], (int)v[LS_S_BLOCK],
                                    (int)v[LS_S_UNROLL], &b, &seg, &u)))
      return st;
    specs[n++] = (rlk_kernel_spec){&ls_fwd_tmpl, {v[LS_S_LOGITS], v[LS_S_LABELS], b, seg, u, v[LS_S_ENTROPY]}};
  }
  if (v[LS_S_PASS] != LS_PASS_FWD)
    specs[n++] = (rlk_kernel_spec){&ls_combine_tmpl, {v[LS_S_LABELS], v[LS_S_ENTROPY]}};
  return rlk_op_planned(specs, n, nspecs);
}

static const char *const ls_samples[] = {
    /* a tensor-parallel LM head of 151936 tokens over 2 ranks, with the entropy */
    "logprob_shard pass=both logits=bf16 labels=i64 vocab=75968 entropy=1",
    /* f16 / f32 shards, i32 labels; a tiny shard (rows share a block) */
    "logprob_shard pass=both logits=f16 labels=i32 vocab=18992",
    "logprob_shard pass=both logits=f32 labels=i64 vocab=7 entropy=1",
    NULL};

const rlk_op_desc rlk_op_logprob_shard = {
    .name = "logprob_shard", .settings = ls_settings, .nsettings = LS_NSETTINGS, .plan = ls_plan,
    .samples = ls_samples};

/* ---------------------------------------------------------------------------------- */
/* Validation                                                                          */
/* ---------------------------------------------------------------------------------- */

/* An f32 [P, N, 4] (or, with P < 0, [N, 4]) contiguous 16-byte aligned record tensor. */
static rlk_status ls_check_records(const rlk_tensor *t, const char *what, int64_t N, int64_t *P) {
  rlk_status st;
  const int nd = *P < 0 ? 2 : 3;
  if ((st = rlk_check_tensor_of(t, what, RLK_DTYPE_BIT(RLK_F32), nd, nd))) return st;
  const int64_t n = t->shape[nd - 2], f = t->shape[nd - 1];
  if (f != RLK_LOGPROB_PARTIAL_FIELDS || (N >= 0 && n != N))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape [..., %lld, %lld], expected [..., %lld, %d]",
                     what, (long long)n, (long long)f, (long long)(N >= 0 ? N : n),
                     RLK_LOGPROB_PARTIAL_FIELDS);
  if ((st = rlk_check_contiguous(t, what))) return st;
  if ((uintptr_t)t->data % 16u)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: data is not 16-byte aligned", what);
  if (nd == 3) *P = t->shape[0];
  return RLK_OK;
}

/* ---------------------------------------------------------------------------------- */
/* The shard forward                                                                   */
/* ---------------------------------------------------------------------------------- */

/* A call of either pass: its kernel's argument. */
typedef struct ls_call {
  rlk_op_call op;
  union {
    ls_fwd_kernel_args fwd;
    ls_combine_kernel_args combine;
  } k;
} ls_call;

static rlk_status ls_fwd_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  (void)ctx;
  const rlk_logprob_args *a = args;
  rlk_status st;
  ls_fwd_kernel_args *k = &((ls_call *)call)->k.fwd;
  if ((st = rlk_logprob_check_inputs(&a->logits, &a->labels, a->temperature, (int)a->variant, a->ignore_index, k)))
    return st;
  const int64_t N = k->N, V = k->V;
  int64_t P = -1;
  if ((st = ls_check_records(&a->partials, "partials", N, &P))) return st;
  if (a->logp.data || a->lse.data || a->entropy.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "logp, lse, entropy: absent in the shard form (partials given); "
                     "rlk_logprob_combine writes them");
  if ((st = rlk_check_vocab_start(a->vocab_start))) return st;
  if ((st = rlk_check_flag(a->partial_entropy, "partial_entropy"))) return st;
  if (a->threshold.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "threshold: kept-set replay has no shard form");
  rlk_op_values *v = &call->vals;
  rlk_op_values_set(v, LS_S_PASS, LS_PASS_FWD);
  rlk_op_values_set(v, LS_S_LOGITS, ls_dt_code(a->logits.dtype));
  rlk_op_values_set(v, LS_S_LABELS, a->labels.dtype);
  rlk_op_values_set(v, LS_S_ENTROPY, a->partial_entropy);
  rlk_op_values_set(v, LS_S_VOCAB, V);
  rlk_op_values_set(v, LS_S_BLOCK, a->block);
  rlk_op_values_set(v, LS_S_UNROLL, a->unroll);
  k->vocab_start = a->vocab_start;
  k->partials = a->partials.data;
  k->temperature = a->temperature;
  return RLK_OK;
}

/* The shard forward: rlk_logprob's vector layout, a block per group of rows. */
static void ls_fwd_dims(const rlk_context *ctx, const rlk_op_call *call, size_t i, rlk_launch_dims *d) {
  if (ctx->kind == RLK_BACKEND_HOST) return;
  const int64_t threads = call->specs[i].values[2], rows = threads / call->specs[i].values[3];
  const uint64_t blocks = (uint64_t)((((ls_call *)call)->k.fwd.N + rows - 1) / rows);
  d->grid[0] = (unsigned)(blocks ? (blocks < (1u << 20) ? blocks : (1u << 20)) : 1);
  d->block[0] = (unsigned)threads;
}

static const rlk_arg_field ls_fwd_fields[] = {RLK_ARG_IN(rlk_logprob_args, logits),
                                              RLK_ARG_IN(rlk_logprob_args, labels),
                                              RLK_ARG_OUT(rlk_logprob_args, partials)};

static const rlk_op_entry ls_fwd_entry = {
    .name = "rlk_logprob", .op = &rlk_op_logprob_shard, .call_size = sizeof(ls_call), RLK_OP_FIELDS(ls_fwd_fields),
    .validate = ls_fwd_validate, .params_at = offsetof(ls_call, k), .dims = ls_fwd_dims};

rlk_status rlk_logprob_shard_forward(rlk_context *ctx, const rlk_logprob_args *a, void *stream) {
  return rlk_op_run(&ls_fwd_entry, ctx, a, stream);
}

/* ---------------------------------------------------------------------------------- */
/* The combine                                                                         */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_logprob_combine_args_init(rlk_logprob_combine_args *args) {
  static const rlk_logprob_combine_args defaults = {.ignore_index = -100};
  if (args) *args = defaults;
}

rlk_status rlk_logprob_combine_check_outputs(const rlk_tensor *logp, const rlk_tensor *lse,
                                             const rlk_tensor *entropy, const rlk_tensor *status,
                                             int64_t N) {
  rlk_status st;
  const uint32_t f32 = RLK_DTYPE_BIT(RLK_F32);
  if ((st = rlk_check_vector(logp, "logp", f32, N, 1, NULL))) return st;
  if (lse->data && (st = rlk_check_vector(lse, "lse", f32, N, 1, NULL))) return st;
  if (entropy->data && (st = rlk_check_vector(entropy, "entropy", f32, N, 1, NULL))) return st;
  if ((st = rlk_check_status(status))) return st;
  if (logp->data == lse->data || logp->data == entropy->data ||
      (lse->data && lse->data == entropy->data))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "logp, lse, entropy: outputs must be distinct");
  return RLK_OK;
}

static rlk_status ls_combine_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  (void)ctx;
  const rlk_logprob_combine_args *a = args;
  rlk_status st;
  if ((st = rlk_check_tensor_of(&a->labels, "labels", LS_LABEL_DTYPES, 1, 1))) return st;
  const int64_t N = a->labels.shape[0];
  int64_t P = 0;
  if ((st = ls_check_records(&a->partials, "partials", N, &P))) return st;
  if ((st = rlk_logprob_combine_check_outputs(&a->logp, &a->lse, &a->entropy, &a->status, N)))
    return st;
  rlk_op_values *v = &call->vals;
  rlk_op_values_set(v, LS_S_PASS, LS_PASS_COMBINE);
  rlk_op_values_set(v, LS_S_LABELS, a->labels.dtype);
  rlk_op_values_set(v, LS_S_ENTROPY, a->entropy.data != NULL);
  ls_combine_kernel_args *k = &((ls_call *)call)->k.combine;
  k->partials = a->partials.data;
  k->P = P;
  k->N = N;
  k->labels = a->labels.data;
  k->label_stride = N > 1 ? a->labels.strides[0] : 1;
  k->ignore_index = a->ignore_index;
  k->logp = a->logp.data;
  k->lse = a->lse.data;
  k->entropy = a->entropy.data;
  k->status = a->status.data;
  return RLK_OK;
}

/* A thread per row. */
static void ls_combine_dims(const rlk_context *ctx, const rlk_op_call *call, size_t i, rlk_launch_dims *d) {
  (void)i;
  if (ctx->kind == RLK_BACKEND_HOST) return;
  const uint64_t blocks = (uint64_t)((((ls_call *)call)->k.combine.N + LS_COMBINE_BLOCK - 1) / LS_COMBINE_BLOCK);
  d->grid[0] = (unsigned)(blocks ? (blocks < (1u << 20) ? blocks : (1u << 20)) : 1);
  d->block[0] = LS_COMBINE_BLOCK;
}

static const rlk_arg_field ls_combine_fields[] = {
    RLK_ARG_IN(rlk_logprob_combine_args, partials), RLK_ARG_IN(rlk_logprob_combine_args, labels),
    RLK_ARG_OUT(rlk_logprob_combine_args, logp),    RLK_ARG_OUT(rlk_logprob_combine_args, lse),
    RLK_ARG_OUT(rlk_logprob_combine_args, entropy), RLK_ARG_OUT(rlk_logprob_combine_args, status)};

static const rlk_op_entry ls_combine_entry = {
    .name = "rlk_logprob_combine", .op = &rlk_op_logprob_shard, .call_size = sizeof(ls_call),
    RLK_OP_FIELDS(ls_combine_fields), .validate = ls_combine_validate, .params_at = offsetof(ls_call, k), .dims = ls_combine_dims};

RLK_OP_DEFINE_CALL(rlk_logprob_combine, rlk_logprob_combine_args, ls_combine_entry)

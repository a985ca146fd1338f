/* linear_sample.c - rlk_linear_sample: one token per row from the LM head's inputs, its log-prob
 * bitwise rlk_linear_logprob's (include/rlk.h). A call of calls, on one stream:
 *   1. the fused head's GEMM over the rows (linear_logprob_fwd.h): each row's records, as
 *      rlk_linear_logprob folds them, and its raw f32 logits, into the workspace;
 *   2. rlk_sample over those logits (the tokens, the kept set's threshold);
 *   3. the head's combine with the tokens as labels: the records' merge and the label's logit read
 *      from the logits the GEMM kept (the float its record would hold), so the log-prob is the one
 *      rlk_linear_logprob computes for that row and label.
 * Its kernels are the linear_logprob forward's (labels of the tokens' dtype) and rlk_sample's over
 * f32 logits: it records those two lines (the head's here, the sampler's by its own call). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "ops/linear_logprob_fwd.h"
#include "ops/ops.h"
#include "ops/sample.h"
#include "runtime/record.h"

/* The workspace's parts start at multiples of 256 bytes. */
#define LS_ALIGN ((size_t)256)
/* A stand-in workspace address for the size query (never dereferenced). */
#define LS_SIZE_BASE ((uint8_t *)(uintptr_t)0x100000)

static size_t ls_align(size_t x) { return (x + LS_ALIGN - 1) / LS_ALIGN * LS_ALIGN; }

/* A call: the head's forward and its configuration line, the draw's arguments over the workspace's
 * logits, their row pitch and where the records lie. */
typedef struct ls_call {
  rlk_op_call op;
  rlk_ll_fwd f;
  rlk_op_values head_line;
  rlk_sample_args s;
  int64_t pitch;
  size_t records_off, logp_off; /* logp_off: the log-probs when the caller asks for lse or
                                 * entropy without them */
  float T; /* the head's temperature */
} ls_call;

RLK_API void rlk_linear_sample_args_init(rlk_linear_sample_args *args) {
  static const rlk_linear_sample_args defaults = {
      .temperature = 1.0f, .top_p = 1.0f, .variant = RLK_LINEAR_LOGPROB_AUTO};
  if (args) *args = defaults;
}

static rlk_status ls_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_linear_sample_args *a = args;
  ls_call *k = (ls_call *)call;
  rlk_status st;
  if ((st = rlk_check_temperature(a->temperature, "temperature", 1))) return st;
  k->T = a->temperature > 0.0f ? a->temperature : 1.0f;
  rlk_ll_head h;
  if ((st = rlk_ll_check_head(&a->hidden, &a->weight, NULL, k->T, &h))) return st;
  if ((st = rlk_ll_check_variant((int)a->variant))) return st;
  const uint32_t f32 = RLK_DTYPE_BIT(RLK_F32);
  if (!a->tokens.data) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "tokens: data is NULL");
  /* the tokens' dtype before the head's plan takes it as its labels' */
  if ((st = rlk_check_dtype(&a->tokens, "tokens", RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64)))) return st;
  const rlk_tensor *out[3] = {&a->logp, &a->lse, &a->entropy};
  const char *names[3] = {"logp", "lse", "entropy"};
  for (int i = 0; i < 3; i++)
    if (out[i]->data && (st = rlk_check_vector_of(out[i], names[i], f32, h.N, "M", 1, NULL))) return st;
  /* the head's kernels: rlk_linear_logprob's forward for labels of the tokens' dtype */
  rlk_op_values_init(&rlk_op_linear_logprob, &k->head_line);
  if ((st = rlk_ll_fwd_plan(ctx, &a->hidden, &a->weight, &h, a->tokens.dtype, a->entropy.data != NULL,
                            (int)a->variant, 0, 0, &k->head_line, &k->f)))
    return st;
  /* the workspace: the logits [M][pitch] (16-byte rows), then on a GPU the records [records][M],
   * then the log-probs the combine writes where the caller asks for lse or entropy alone */
  k->pitch = (h.V + 3) / 4 * 4;
  const size_t logits = ls_align((size_t)(h.N * k->pitch) * 4u);
  k->records_off = logits;
  k->logp_off = logits + (ctx->kind == RLK_BACKEND_HOST ? 0 : ls_align((size_t)(k->f.records * h.N) * 16u));
  call->workspace = k->logp_off + (a->logp.data ? 0 : ls_align((size_t)h.N * 4u));
  /* the draw over them, checked as rlk_sample checks it */
  uint8_t *base = a->workspace ? (uint8_t *)a->workspace : LS_SIZE_BASE;
  rlk_sample_args *s = &k->s;
  rlk_sample_args_init(s);
  s->logits = rlk_tensor_2d(base, RLK_F32, h.N, h.V, k->pitch);
  s->temperature = a->temperature;
  s->top_ks = a->top_ks, s->top_k = a->top_k;
  s->top_ps = a->top_ps, s->top_p = a->top_p;
  s->min_ps = a->min_ps, s->min_p = a->min_p;
  s->seeds = a->seeds, s->seed = a->seed;
  s->offsets = a->offsets, s->offset = a->offset;
  s->tokens = a->tokens;
  s->threshold = a->threshold;
  s->status = a->status;
  /* what rlk_sample would name as its logits' or B is the weight's or M here */
  if (h.V > RLK_SAMPLE_MAX_V)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "weight: V = %lld rows, at most %lld (the sampler's vocabulary)",
                     (long long)h.V, (long long)RLK_SAMPLE_MAX_V);
  if ((st = rlk_sample_check_rows(s, h.N, "M"))) return st;
  return rlk_sample_check((rlk_context *)ctx, s);
}

static rlk_status ls_launch(rlk_context *ctx, const void *args, rlk_op_call *call, void *stream) {
  const rlk_linear_sample_args *a = args;
  const ls_call *k = (const ls_call *)call;
  rlk_status st;
  if (rlk_record_enabled()) rlk_record_op(&rlk_op_linear_logprob, &k->head_line);
  const int64_t M = k->f.h.N;
  float *logits = (float *)a->workspace;
  void *records = ctx->kind == RLK_BACKEND_HOST ? NULL : (uint8_t *)a->workspace + k->records_off;
  if ((st = rlk_ll_fwd_gemm(ctx, &k->f, NULL, a->tokens.dtype, 0, M, records, 0, k->T, NULL, logits, k->pitch,
                            stream)))
    return st;
  if ((st = rlk_sample(ctx, &k->s, stream))) return st;
  if (!a->logp.data && !a->lse.data && !a->entropy.data) return RLK_OK;
  /* no ignore_index: a row without a token (-1) gets NaN; rlk_sample set its status bit */
  float *logp = a->logp.data ? (float *)a->logp.data : (float *)((uint8_t *)a->workspace + k->logp_off);
  const rlk_ll_fwd_out o = {a->tokens.data, a->tokens.dtype, INT64_MIN, 0, NULL, logp,
                            (float *)a->lse.data, (float *)a->entropy.data, NULL, NULL};
  return rlk_ll_fwd_combine(ctx, &k->f, records, 0, M, &o, k->T, logits, k->pitch, stream);
}

static const rlk_arg_field ls_fields[] = {
    RLK_ARG_IN(rlk_linear_sample_args, hidden),    RLK_ARG_IN(rlk_linear_sample_args, weight),
    RLK_ARG_IN(rlk_linear_sample_args, top_ks),    RLK_ARG_IN(rlk_linear_sample_args, top_ps),
    RLK_ARG_IN(rlk_linear_sample_args, min_ps),    RLK_ARG_IN(rlk_linear_sample_args, seeds),
    RLK_ARG_IN(rlk_linear_sample_args, offsets),   RLK_ARG_OUT(rlk_linear_sample_args, tokens),
    RLK_ARG_OUT(rlk_linear_sample_args, logp),     RLK_ARG_OUT(rlk_linear_sample_args, lse),
    RLK_ARG_OUT(rlk_linear_sample_args, entropy),  RLK_ARG_OUT(rlk_linear_sample_args, threshold),
    RLK_ARG_OUT(rlk_linear_sample_args, status)};

/* No configuration line of its own: the head's (recorded at launch) and the sampler's. */
static const rlk_op_entry ls_entry = {
    .name = "rlk_linear_sample", .call_size = sizeof(ls_call), RLK_OP_FIELDS(ls_fields),
    .workspace = RLK_OP_WORKSPACE(rlk_linear_sample_args, 16), .validate = ls_validate, .launch = ls_launch};

RLK_OP_DEFINE_CALL_AND_SIZE(rlk_linear_sample, rlk_linear_sample_args, ls_entry)

/* sample.c - sampling one token per row (temperature, top-k, top-p, min-p, greedy) with per-row
 * Philox seeds: validation, variant selection, the launch.
 *
 * One kernel (templates/cuda/sample.cuh, templates/host/sample.c), one launch, a block per row;
 * or, for unfiltered calls on sm_90 that ask for it (row_split), templates/cuda/sample_split.cuh:
 * a row over the blocks of a cluster, the same arithmetic. Its first pass over a row is
 * rlk_logprob's vector forward over the same row layout, so the sampled token's logp is
 * rlk_logprob's, bit for bit; the layout comes from the logprob op itself
 * (rlk_logprob_vec_layout), with the caller's logprob_block / logprob_unroll when they tuned it.
 *
 * Specialization: the logits dtype, the token dtype, the row layout (SEG threads per row, UNROLL
 * vectors per chunk), whether any filter can be on (a kernel without the filter code is smaller and
 * keeps two 512-thread blocks per SM), and CAP, the candidates that fit in shared memory (CUDA
 * 4096: 64 KB; HIP 2048: LDS is 64 KB a workgroup). Per-row settings are read at run time, so one
 * kernel serves every mix of settings in a batch.
 *
 * The selection (smp_select) is the one function a call and rlk_precompile's plan go through. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ops/ops.h"
#include "ops/sample.h"
#include "common/sample_params.h"

/* The kernels' argument (templates/common/sample_params.h). */
RLK_PARAMS_DECLARE(smp_kernel_args, RLK_SAMPLE_PARAMS, RLK_SAMPLE_PARAMS_SIZE);

static const char *const smp_dt_names[] = RLK_PARAMS_ENUM_NAMES(RLK_FLOAT_DTS);

/* The kernels' status bits are the API's. */
_Static_assert(SMP_STATUS_NAN == RLK_SAMPLE_STATUS_NAN && SMP_STATUS_NO_TOKEN == RLK_SAMPLE_STATUS_NO_TOKEN &&
                   SMP_STATUS_BAD_PARAM == RLK_SAMPLE_STATUS_BAD_PARAM,
               "sample status bits: RLK_SAMPLE_STATUS_*");


#define SMP_TOKEN_DTYPES (RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64))
#define SMP_LOGIT_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F16) | RLK_DTYPE_BIT(RLK_BF16))
/* Fixed-point masses are 2^40 at most each: V below 2^23 keeps a row's sum below 2^63. */
#define SMP_MAX_V RLK_SAMPLE_MAX_V

/* Parameters that the settings of their names feed unchanged (logits: a dtype code). */
static const rlk_value_decl smp_tokens = RLK_DECL_DTYPE("tokens", SMP_TOKEN_DTYPES);
static const rlk_value_decl smp_filter = RLK_DECL_FLAG("filter");
static const rlk_value_decl smp_rows16 = RLK_DECL_FLAG("rows16");

static const rlk_value_decl *const smp_params[] = {
    RLK_PARAM_CHOICE("logits", smp_dt_names, 0, 2),
    &smp_tokens,
    RLK_PARAM_POW2("seg", 1, 1024),
    RLK_PARAM_POW2("unroll", 1, 8),
    &smp_filter,
    RLK_PARAM_POW2("cap", 32, 8192),
    &smp_rows16,
};

static const rlk_template smp_tmpl = {"sample", "sample", "cuda/sample.cuh", "host/sample.c",
                                      sizeof smp_params / sizeof smp_params[0], smp_params};

/* A row shared by the blocks of a cluster (sm_90+, no filters): split blocks a row, depth chunks
 * in flight a lane. */
static const rlk_value_decl *const smp_split_params[] = {
    RLK_PARAM_CHOICE("logits", smp_dt_names, 0, 2),
    &smp_tokens,
    RLK_PARAM_POW2("seg", 64, 1024),
    RLK_PARAM_POW2("unroll", 1, 8),
    RLK_PARAM_POW2("split", 2, 8),
    RLK_PARAM_POW2("depth", 1, 8),
    &smp_rows16,
};

static const rlk_template smp_split_tmpl = {"sample", "sample_split", "cuda/sample_split.cuh", NULL,
                                            sizeof smp_split_params / sizeof smp_split_params[0],
                                            smp_split_params, RLK_TARGET_CLUSTERS};

/* Candidates in shared memory and the filtered kernel's dynamic shared memory (the larger of a
 * 2048-bin histogram of counts and masses, 24 KB, and CAP candidates of 16 bytes). */
#define SMP_CAP_CUDA 4096
#define SMP_CAP_HIP 2048
#define SMP_HIST_BYTES (2048u * (4u + 8u))
#define SMP_CAND_BYTES 16u

/* ---------------------------------------------------------------------------------- */
/* The settings and the plan (shared by calls and precompiling)                        */
/* ---------------------------------------------------------------------------------- */

static const char *const smp_row_split_names[] = {"auto", "0", "1", "2", "4", "8", NULL};
static const int smp_row_split_values[] = {RLK_SAMPLE_ROW_SPLIT_AUTO, 0, 1, 2, 4, 8};

enum {
  SMP_S_LOGITS, SMP_S_TOKENS, SMP_S_FILTER, SMP_S_VOCAB, SMP_S_LOGPROB_BLOCK, SMP_S_LOGPROB_UNROLL, SMP_S_ROWS,
  SMP_S_ROW_SPLIT, SMP_S_ROWS16, SMP_NSETTINGS
};

static const rlk_op_setting smp_settings[SMP_NSETTINGS] = {
    [SMP_S_LOGITS] = RLK_SET_DTYPE("logits", RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F16) | RLK_DTYPE_BIT(RLK_BF16),
                                   RLK_BF16, "sample.logits", "the logits' dtype"),
    [SMP_S_TOKENS] = RLK_SET(smp_tokens, RLK_I64, "sample.tokens sample_split.tokens", "the token ids' dtype"),
    [SMP_S_FILTER] = RLK_SET(smp_filter, 1, "sample.filter",
                             "whether top-k, top-p or min-p can be on (0: temperature and greedy only)"),
    [SMP_S_VOCAB] = RLK_SET_INT("vocab", 151936, 1, SMP_MAX_V, "sample.seg", "V, picks the row layout"),
    [SMP_S_LOGPROB_BLOCK] = RLK_SET_INT("logprob_block", 0, 0, 1024, "sample.seg",
                                        "the rlk_logprob block size logp reproduces, 0 for its default"),
    [SMP_S_LOGPROB_UNROLL] = RLK_SET_INT("logprob_unroll", 0, 0, 8, "sample.unroll",
                                         "the rlk_logprob unroll logp reproduces, 0 for its default"),
    [SMP_S_ROWS] = RLK_SET_INT("rows", 256, 1, (int64_t)1 << 40, "sample_split.split", "B, with row_split"),
    [SMP_S_ROW_SPLIT] = RLK_SET_CHOICE("row_split", smp_row_split_names, 0, "sample_split.split",
                                       "the blocks that share a row (0: one; auto: by rows and the device's "
                                       "multiprocessors, 132 when unknown; on sm_90 and later with filter=0)"),
    [SMP_S_ROWS16] = RLK_SET(smp_rows16, 1, "sample.rows16 sample_split.rows16",
                             "whether every row starts on a 16-byte boundary (the logits' address and "
                             "row stride); 0 builds the narrower loads of a row that does not"),
};

/* Blocks that share a row: the caller's count, or by the batch, as many as keep every block on
 * its own multiprocessor (a split block's lanes hold up to 8 chunks in registers); at most the
 * row layout's warps, 1 where clusters are unavailable (before sm_90, HIP, the host) or filters
 * can be on (their passes work a row in one block). */
static int smp_split_of(const rlk_context *ctx, const rlk_op_values *s, int seg) {
  const int row_split = smp_row_split_values[s->v[SMP_S_ROW_SPLIT]];
  if (!(ctx->target.features & RLK_TARGET_CLUSTERS) || s->v[SMP_S_FILTER]) return 1;
  const int nw = seg / 32;
  int split = row_split == RLK_SAMPLE_ROW_SPLIT_AUTO ? 8 : row_split;
  if (split <= 1) return 1;
  if (row_split == RLK_SAMPLE_ROW_SPLIT_AUTO) {
    const int64_t sms = ctx->target.multiprocessors > 0 ? ctx->target.multiprocessors : 132;
    while (split > 1 && s->v[SMP_S_ROWS] * split > sms) split /= 2;
  }
  while (split > nw) split /= 2;
  return split >= 2 ? split : 1;
}

/* The kernel of a configuration: the row layout is rlk_logprob's vector forward's for the same
 * V, block and unroll; a row over a cluster's blocks (sample_split) or a block a row (sample). */
static rlk_status smp_plan(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs, size_t *nspecs) {
  const int64_t *v = s->v;
  const rlk_dtype logits = (rlk_dtype)v[SMP_S_LOGITS];
  int seg = 1, unroll = 1;
  rlk_status st = rlk_logprob_vec_layout(ctx, logits, v[SMP_S_VOCAB], (int)v[SMP_S_LOGPROB_BLOCK],
                                         (int)v[SMP_S_LOGPROB_UNROLL], &seg, &unroll);
  if (st) { /* said as this op's settings: its logprob_block and logprob_unroll are that layout's */
    char msg[384];
    rlk_format(msg, sizeof msg, "%s", rlk_last_error());
    return rlk_error(st, "logprob_block, logprob_unroll (the rows' log-prob layout's block, unroll): %s", msg);
  }
  const int split = smp_split_of(ctx, s, seg);
  /* the host kernel reads a row element by element: one kernel for either */
  const int64_t rows16 = ctx->kind == RLK_BACKEND_HOST ? 1 : v[SMP_S_ROWS16];
  if (split > 1) {
    /* chunks a lane has in an aligned row, up to what its registers hold: 8 below 512 threads a
     * block (255 registers a thread), 4 at 512 */
    const int64_t epv = 16 / (int64_t)rlk_dtype_size(logits);
    const int64_t chunks = ((v[SMP_S_VOCAB] / epv + seg - 1) / seg) / unroll;
    const int most = seg / split >= 512 ? 4 : 8;
    int depth = 1;
    while (depth < most && depth < chunks) depth *= 2;
    specs[0] = (rlk_kernel_spec){&smp_split_tmpl,
                                 {rlk_op_float_dt(logits), v[SMP_S_TOKENS], seg, unroll, split, depth, rows16}};
  } else {
    const int cap = ctx->kind == RLK_BACKEND_HIP ? SMP_CAP_HIP : SMP_CAP_CUDA;
    specs[0] = (rlk_kernel_spec){&smp_tmpl,
                                 {rlk_op_float_dt(logits), v[SMP_S_TOKENS], seg, unroll, v[SMP_S_FILTER], cap, rows16}};
  }
  return rlk_op_planned(specs, 1, nspecs);
}

static const char *const smp_samples[] = {
    "sample logits=bf16 tokens=i64 filter=1",
    "sample logits=f32 tokens=i32 filter=0",
    "sample logits=f16 tokens=i64 filter=1 vocab=32000",
    /* short rows: a warp segment per row */
    "sample logits=f32 tokens=i64 filter=1 vocab=1000",
    "sample logits=bf16 tokens=i32 filter=0 vocab=64",
    /* small batches on sm_90: a row over the blocks of a cluster */
    "sample logits=bf16 tokens=i64 filter=0 rows=1 row_split=auto",
    "sample logits=f32 tokens=i32 filter=0 rows=32 row_split=auto",
    "sample logits=f16 tokens=i64 filter=0 vocab=50257 rows=64 row_split=2",
    /* rows off the 16-byte grid (an odd V in 16 bits): the narrower loads built in */
    "sample logits=bf16 tokens=i64 filter=1 vocab=32003 rows16=0",
    "sample logits=bf16 tokens=i32 filter=0 vocab=32003 rows=2 row_split=auto rows16=0",
    NULL};

const rlk_op_desc rlk_op_sample = {
    .name = "sample", .settings = smp_settings, .nsettings = SMP_NSETTINGS, .plan = smp_plan, .samples = smp_samples};

/* ---------------------------------------------------------------------------------- */
/* Validation                                                                          */
/* ---------------------------------------------------------------------------------- */

/* An optional per-row tensor [rows], contiguous; `dim` names its dimension in messages. */
static rlk_status smp_check_row_tensor(const rlk_tensor *t, const char *what, uint32_t dtypes, int64_t rows,
                                       const char *dim) {
  if (!t->data) return RLK_OK;
  return rlk_check_vector_of(t, what, dtypes, rows, dim, 1, NULL);
}

rlk_status rlk_sample_check_rows(const rlk_sample_args *a, int64_t B, const char *dim) {
  const uint32_t f32 = RLK_DTYPE_BIT(RLK_F32), i64 = RLK_DTYPE_BIT(RLK_I64);
  rlk_status st;
  if ((st = smp_check_row_tensor(&a->temperatures, "temperatures", f32, B, dim))) return st;
  if ((st = smp_check_row_tensor(&a->top_ks, "top_ks", SMP_TOKEN_DTYPES, B, dim))) return st;
  if ((st = smp_check_row_tensor(&a->top_ps, "top_ps", f32, B, dim))) return st;
  if ((st = smp_check_row_tensor(&a->min_ps, "min_ps", f32, B, dim))) return st;
  if ((st = smp_check_row_tensor(&a->seeds, "seeds", i64, B, dim))) return st;
  if ((st = smp_check_row_tensor(&a->offsets, "offsets", i64, B, dim))) return st;
  if ((st = smp_check_row_tensor(&a->tokens, "tokens", SMP_TOKEN_DTYPES, B, dim))) return st;
  if ((st = smp_check_row_tensor(&a->logp, "logp", f32, B, dim))) return st;
  if ((st = smp_check_row_tensor(&a->logp_filtered, "logp_filtered", f32, B, dim))) return st;
  return smp_check_row_tensor(&a->threshold, "threshold", f32, B, dim);
}

RLK_API void rlk_sample_args_init(rlk_sample_args *args) {
  static const rlk_sample_args defaults = {
      .temperature = 1.0f, .top_p = 1.0f, .row_split = RLK_SAMPLE_ROW_SPLIT_AUTO, .pdl = 1};
  if (args) *args = defaults;
}

/* A call: the kernel's argument. */
typedef struct smp_call {
  rlk_op_call op;
  smp_kernel_args k;
  int pdl; /* may overlap the previous kernel's tail */
} smp_call;

static rlk_status smp_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  (void)ctx;
  const rlk_sample_args *a = args;
  rlk_status st;
  if ((st = rlk_check_flag(a->pdl, "pdl"))) return st;
  const rlk_tensor *L = &a->logits;
  if ((st = rlk_check_tensor_of(L, "logits", SMP_LOGIT_DTYPES, 2, 2))) return st;
  const int64_t B = L->shape[0], V = L->shape[1];
  int64_t row_stride = 0;
  if ((st = rlk_check_contiguous_rows(L, "logits", &row_stride))) return st;
  if (V > SMP_MAX_V)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "logits: V = %lld, at most %lld", (long long)V,
                     (long long)SMP_MAX_V);
  if (row_stride > ((int64_t)1 << 56) / B)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "logits: %lld rows of stride %lld are too large",
                     (long long)B, (long long)row_stride);

  if ((st = rlk_sample_check_rows(a, B, "B"))) return st;
  if (!a->temperatures.data && (st = rlk_check_temperature(a->temperature, "temperature", 1))) return st;
  if (!a->top_ks.data && a->top_k < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "top_k: %lld must be >= 0 (0: off)",
                     (long long)a->top_k);
  if (!a->top_ps.data && !(a->top_p > 0.0f && a->top_p <= 1.0f))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "top_p: %g is not in (0, 1] (1: off)", (double)a->top_p);
  if (!a->min_ps.data && !(a->min_p >= 0.0f && a->min_p <= 1.0f))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "min_p: %g is not in [0, 1] (0: off)", (double)a->min_p);

  if (!a->tokens.data) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "tokens: data is NULL");
  if ((st = rlk_check_status(&a->status))) return st;
  if (a->logprob_block < 0 || a->logprob_unroll < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "logprob_block, logprob_unroll: must be >= 0");
  int row_split = -1;
  for (int i = 0; smp_row_split_names[i]; i++)
    if (smp_row_split_values[i] == a->row_split) row_split = i;
  if (row_split < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "row_split: %d is not 0, 1, 2, 4, 8 or RLK_SAMPLE_ROW_SPLIT_AUTO (-1)", a->row_split);
  rlk_op_values *v = &call->vals;
  rlk_op_values_set(v, SMP_S_LOGITS, L->dtype);
  rlk_op_values_set(v, SMP_S_TOKENS, a->tokens.dtype);
  /* the filter code is in when a filter can be on in some row */
  rlk_op_values_set(v, SMP_S_FILTER, a->top_ks.data || a->top_ps.data || a->min_ps.data ||
                                         (a->top_k > 0 && a->top_k < V) || a->top_p < 1.0f || a->min_p > 0.0f);
  rlk_op_values_set(v, SMP_S_VOCAB, V);
  rlk_op_values_set(v, SMP_S_LOGPROB_BLOCK, a->logprob_block);
  rlk_op_values_set(v, SMP_S_LOGPROB_UNROLL, a->logprob_unroll);
  rlk_op_values_set(v, SMP_S_ROWS, B);
  rlk_op_values_set(v, SMP_S_ROW_SPLIT, row_split);
  /* a row's byte offset is its index times the stride's bytes: all rows are on the 16-byte grid
   * when the first is and the stride's bytes are a multiple of 16 (or there is one row) */
  const uint64_t stride_bytes = (uint64_t)row_stride * rlk_dtype_size(L->dtype);
  rlk_op_values_set(v, SMP_S_ROWS16, ((uintptr_t)L->data % 16 == 0) && (B == 1 || stride_bytes % 16 == 0));

  ((smp_call *)call)->pdl = a->pdl;
  smp_kernel_args *k = &((smp_call *)call)->k;
  k->logits = L->data;
  k->row_stride = row_stride;
  k->B = B;
  k->V = V;
  k->temperatures = a->temperatures.data;
  k->temperature = a->temperature;
  k->top_ks32 = a->top_ks.dtype == RLK_I32 ? a->top_ks.data : NULL;
  k->top_ks64 = a->top_ks.dtype == RLK_I64 ? a->top_ks.data : NULL;
  k->top_k = a->top_k;
  k->top_ps = a->top_ps.data;
  k->top_p = a->top_p;
  k->min_ps = a->min_ps.data;
  k->min_p = a->min_p;
  k->seeds = a->seeds.data;
  k->seed = a->seed;
  k->offsets = a->offsets.data;
  k->offset = a->offset;
  k->tokens = a->tokens.data;
  k->logp = a->logp.data;
  k->logp_filtered = a->logp_filtered.data;
  k->status = a->status.data;
  k->threshold = a->threshold.data;
  return RLK_OK;
}

/* A block a row, or a cluster of `split` blocks a row; rows past the grid are strided over it.
 * Both kernels wait for the stream first where they are built for sm_90 and later; code for an
 * older target that a newer device runs (PTX it compiles) has no wait, so it launches plainly. */
static void smp_dims(const rlk_context *ctx, const rlk_op_call *call, size_t i, rlk_launch_dims *d) {
  const rlk_kernel_spec *spec = &call->specs[i];
  const int pdl = ((const smp_call *)call)->pdl;
  if (ctx->kind == RLK_BACKEND_HOST) return;
  const int64_t B = call->vals.v[SMP_S_ROWS], seg = spec->values[2];
  const int64_t split = spec->tmpl == &smp_split_tmpl ? spec->values[4] : 1;
  const int64_t groups = B < ((int64_t)1 << 20) / split ? B : ((int64_t)1 << 20) / split;
  d->grid[0] = (unsigned)(groups * split);
  if (split > 1) {
    d->block[0] = (unsigned)(seg / split);
  } else {
    d->block[0] = (unsigned)(seg > ctx->target.warp_size ? seg : ctx->target.warp_size);
    if (spec->values[4]) { /* the filters' shared memory: a histogram, or the candidates */
      const size_t cand = (size_t)spec->values[5] * SMP_CAND_BYTES;
      d->shared_bytes = cand > SMP_HIST_BYTES ? cand : SMP_HIST_BYTES;
    }
  }
  if (pdl && (ctx->target.features & RLK_TARGET_PDL)) d->flags = RLK_LAUNCH_OVERLAP;
}

static const rlk_arg_field smp_fields[] = {
    RLK_ARG_IN(rlk_sample_args, logits),  RLK_ARG_IN(rlk_sample_args, temperatures),
    RLK_ARG_IN(rlk_sample_args, top_ks),  RLK_ARG_IN(rlk_sample_args, top_ps),
    RLK_ARG_IN(rlk_sample_args, min_ps),  RLK_ARG_IN(rlk_sample_args, seeds),
    RLK_ARG_IN(rlk_sample_args, offsets), RLK_ARG_OUT(rlk_sample_args, tokens),
    RLK_ARG_OUT(rlk_sample_args, logp),   RLK_ARG_OUT(rlk_sample_args, logp_filtered),
    RLK_ARG_OUT(rlk_sample_args, status), RLK_ARG_OUT(rlk_sample_args, threshold)};

static const rlk_op_entry smp_entry = {
    .name = "rlk_sample", .op = &rlk_op_sample, .call_size = sizeof(smp_call), RLK_OP_FIELDS(smp_fields),
    .validate = smp_validate, .params_at = offsetof(smp_call, k), .dims = smp_dims};

RLK_OP_DEFINE_CALL(rlk_sample, rlk_sample_args, smp_entry)

rlk_status rlk_sample_check(rlk_context *ctx, const rlk_sample_args *a) {
  size_t bytes;
  return rlk_op_workspace_size(&smp_entry, ctx, a, &bytes);
}

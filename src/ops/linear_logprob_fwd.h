/* linear_logprob_fwd.h - the fused head's forward as its calls share it (linear_logprob_fwd.c):
 * rlk_linear_logprob runs it whole; rlk_linear_sample runs the GEMM over its rows keeping the raw
 * logits, draws the tokens from them, then the combine of those tokens from the same records,
 * which gives them rlk_linear_logprob's bits for those rows and labels. */
#ifndef RLK_LINEAR_LOGPROB_FWD_H
#define RLK_LINEAR_LOGPROB_FWD_H

#include "core/core.h"
#include "runtime/op.h"

/* A record's bytes (four f32): a row's RLK_LL_RECORD_COLS columns folded. */
#define RLK_LL_RECORD_BYTES 16

/* The head's sizes: hidden [N, H], weight [V, H], their row strides, the labels' stride. */
typedef struct rlk_ll_head {
  int64_t N, H, V, hs, ws, ls;
} rlk_ll_head;

/* Checks hidden [N, H] and weight [V, H] of one 16-bit dtype, labels [N] (i32 or i64; absent where
 * `labels` is NULL) and a finite temperature > 0, as rlk_linear_logprob does (linear_logprob.c, with
 * the op's other checks). */
rlk_status rlk_ll_check_head(const rlk_tensor *hidden, const rlk_tensor *weight, const rlk_tensor *labels,
                             float temperature, rlk_ll_head *h);

/* Refuses `variant` unless it is an rlk_linear_logprob_variant (every call that runs the head's
 * kernels takes one). */
rlk_status rlk_ll_check_variant(int variant);

/* A forward's kernels: the GEMM (sm_90a's wgmma kernel where the target has it and tensor maps
 * describe hidden and weight, else the tiled one; the host's fp64 kernel) and the combine; a row's
 * records (ceil(V / 256)); the splits asked for (0: chosen a launch); the tensor maps' requests.
 * hidden holds the call's rows from hidden_row0 on. */
typedef struct rlk_ll_fwd {
  rlk_ll_head h;
  const void *hidden, *weight;
  int64_t hidden_row0; /* the call's row that hidden's first row is (a row selection's gathered
                        * rows: their launch's first; else 0) */
  int variant; /* rlk_linear_logprob_variant that runs: WGMMA or TILED on a GPU; AUTO on the host */
  rlk_kernel_spec gemm, combine;
  int64_t records;
  int splits;
  rlk_tma_desc_request req_h, req_w;
} rlk_ll_fwd;

/* The forward's kernels for hidden and weight (checked into h), a label dtype (the combine's and
 * the GEMM's), the entropy, the variant asked for and the sm_90a ring depth (0: the default);
 * records the configuration's line on `vals` (the op's settings values). */
rlk_status rlk_ll_fwd_plan(const rlk_context *ctx, const rlk_tensor *hidden, const rlk_tensor *weight,
                           const rlk_ll_head *h, rlk_dtype labels, int entropy, int variant, int stages, int splits,
                           rlk_op_values *vals, rlk_ll_fwd *f);

/* The GEMM over rows [r0, r0 + n): a record per row and 256 columns into partials [records][n];
 * labels (the call's, from row 0; NULL: none), threshold (kept-set replay, from row 0; NULL:
 * none); where `logits` is given, the rows' raw f32 logits into logits [n][pitch] (pitch a
 * multiple of 4, 16-byte aligned). On the host only the logits (the fp64 kernel: its dot products
 * rounded to f32), where given: rlk_ll_fwd_combine computes the rest there. */
rlk_status rlk_ll_fwd_gemm(rlk_context *ctx, const rlk_ll_fwd *f, const void *labels, rlk_dtype label_dtype,
                           int64_t r0, int64_t n, void *partials, int64_t vocab_start, float temperature,
                           const float *threshold, float *logits, int64_t pitch, void *stream);

/* The outputs of rows [r0, r0 + n) from their records (partials [records][n]), labels and
 * threshold from row 0, the outputs from row 0 (any NULL but logp); logits: the rows' raw logits
 * the GEMM kept, the labels' logits read there, else NULL. ignore_index as the call's; status may
 * be NULL. On the host: the fp64 kernel over the rows, whole. */
typedef struct rlk_ll_fwd_out {
  const void *labels;
  rlk_dtype label_dtype;
  int64_t ignore_index, vocab_start;
  const float *threshold;
  float *logp, *lse, *entropy, *records;
  int *status;
} rlk_ll_fwd_out;

rlk_status rlk_ll_fwd_combine(rlk_context *ctx, const rlk_ll_fwd *f, const void *partials, int64_t r0, int64_t n,
                              const rlk_ll_fwd_out *o, float temperature, const float *logits, int64_t pitch,
                              void *stream);

/* The forward's kernels as the op's plan and the token chunks take them. */

/* A forward's kernels, as rlk_ll_select chooses them. */
typedef struct rlk_ll_choice {
  int variant; /* what runs: WGMMA or TILED on a GPU; AUTO on the host */
  rlk_kernel_spec gemm, combine;
} rlk_ll_choice;

/* The forward's kernels of a configuration (hidden, labels, entropy, variant, stages); tma_ok:
 * hidden and weight can be described by 128-byte-swizzled tensor maps. */
rlk_status rlk_ll_select(const rlk_context *ctx, const rlk_op_values *s, int tma_ok, rlk_ll_choice *ch);

/* linear_logprob_combine (templates/cuda/linear_logprob.cuh): labels, entropy. */
extern const rlk_template rlk_ll_combine_tmpl;

/* The combine of a launch's `n` rows (records [S][n] at partials) into their outputs from row r0
 * (logits: the sampling head's raw logits of those rows, else NULL; threshold: kept-set replay's,
 * from the launch's first row, else NULL). */
rlk_status rlk_ll_combine(rlk_context *ctx, const rlk_kernel_spec *spec, const void *partials, int64_t S, int64_t n,
                          int64_t V, const void *labels, int64_t label_stride, int64_t ignore_index, float *logp,
                          float *lse, float *entropy, int *status, float *records, int64_t vocab_start,
                          float temperature, const float *logits, int64_t logits_pitch, const float *threshold,
                          void *stream);

#endif

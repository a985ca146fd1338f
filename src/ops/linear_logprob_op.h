/* linear_logprob_op.h - what the files of the linear_logprob op share beside its passes' own
 * headers (linear_logprob_fwd.h, _bwd.h, _stored.h): the configuration line's settings and the
 * functions that write a call's line or read the tuning database's winner for it, the head's
 * matrix check (all defined in linear_logprob.c), and the small helpers every pass uses. */
#ifndef RLK_LINEAR_LOGPROB_OP_H
#define RLK_LINEAR_LOGPROB_OP_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "ops/linear_logprob_rows.h"
#include "ops/ops.h"

#define RLK_LL_LABEL_DTYPES (RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64))
#define RLK_LL_HIDDEN_DTYPES (RLK_DTYPE_BIT(RLK_F16) | RLK_DTYPE_BIT(RLK_BF16))

/* The settings of a configuration line (the table is with the plan, in linear_logprob.c). */
enum {
  RLK_LL_S_PASS, RLK_LL_S_HIDDEN, RLK_LL_S_LABELS, RLK_LL_S_ENTROPY, RLK_LL_S_GRAD, RLK_LL_S_ROWS, RLK_LL_S_VARIANT,
  RLK_LL_S_STAGES, RLK_LL_S_SPLITS, RLK_LL_S_CHUNK, RLK_LL_S_GROUP, RLK_LL_S_HIDDEN_SIZE, RLK_LL_S_VOCAB,
  RLK_LL_S_TOKENS, RLK_LL_NSETTINGS
};

/* The names of the kernels' `hidden` template value (f32: not a choice), every pass's schemas'. */
extern const char *const rlk_ll_dt_names[RLK_DT_BF16 + 2];

/* `labels` and `entropy`: every pass's kernels' that have them, and the settings that feed them. */
extern const rlk_value_decl rlk_ll_labels, rlk_ll_entropy;

/* The rows setting's value of a call's selection (none, or its indices' dtype). */
int rlk_ll_rows_line(const rlk_ll_rows *r);

/* The tuning database's winner for a call's key (rlk_ll_tuned_fwd / rlk_ll_tuned_bwd): its
 * settings into *stages and *splits, or *chunk and *group; untouched without a usable record. */
void rlk_ll_tuned_fwd(const rlk_context *ctx, rlk_dtype hidden, rlk_dtype labels, int entropy, int64_t H, int64_t V,
                      int64_t N, int *stages, int *splits);
void rlk_ll_tuned_bwd(const rlk_context *ctx, rlk_dtype hidden, rlk_dtype labels, int entropy, int grad, int64_t H,
                      int64_t V, int64_t N, int *chunk, int *group);

/* A call's configuration line (pass 0 fwd, 1 bwd, 3 chunks; grad 0 f32, 1 the hidden dtype): the
 * settings its kernels depend on, the sm_90a forward's stages when not the default. */
void rlk_ll_line(rlk_op_values *v, int pass, rlk_dtype hidden, rlk_dtype labels, int entropy, int grad, int variant,
                 int stages);

/* A [rows, cols] matrix of one of `dtypes` with contiguous rows (its alignment and span checked
 * for its own dtype); writes the row stride. */
rlk_status rlk_ll_check_matrix_of(const rlk_tensor *t, const char *what, uint32_t dtypes, int64_t *rows,
                                  int64_t *cols, int64_t *stride);

/* rlk_ll_check_matrix_of for hidden's and weight's dtypes (f16, bf16). */
rlk_status rlk_ll_check_matrix(const rlk_tensor *t, const char *what, int64_t *rows, int64_t *cols, int64_t *stride);

/* sm_90a exactly: wgmma needs the arch-specific target. */
static inline int rlk_ll_wgmma_target(const rlk_context *ctx) {
  return ctx->kind == RLK_BACKEND_CUDA && (ctx->target.features & RLK_TARGET_WGMMA) != 0;
}

/* A 16-bit dtype's code as the kernels' `hidden` template value. */
static inline int rlk_ll_dt_code(int64_t dtype) { return dtype == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16; }

/* x rounded up to 256 (the workspace's pieces stay 256-byte aligned). */
static inline size_t rlk_ll_align256(size_t x) { return (x + 255u) & ~(size_t)255u; }

#endif

/* linear_logprob_stored.h - the LM head's token chunks for rlk_linear_policy_loss on sm_90a
 * (linear_logprob_stored.c).
 *
 * The forward's logits of a chunk of rows are stored once, in 16 bits, and turned into their
 * gradient in place once the loss has the rows' gradients: three products per chunk (the logits,
 * dh, dw) where rlk_linear_logprob + rlk_linear_logprob_backward take four (the backward
 * recomputes the logits). A chunk's steps, in order on one stream:
 *   rlk_ll_stored_logits  the logits kind (u = 2^(x c - m) and a record per 256-column tile),
 *                         then the forward's combine: logp, lse (and entropy) of the rows;
 *   (the caller's loss: the rows' g_lp, g_ent)
 *   rlk_ll_stored_grads   u -> dz in place, then dh into the rows of grad_hidden (K = V, each
 *                         element written once) and dw added into an f32 grad_weight (K = the
 *                         rows; TMA reduce-adds in chunk order: bitwise repeatable).
 *
 * Over grad_weight (ksplit > 0): one chunk of every row, u stored transposed (u^T [V][rows]), its
 * lines [0, ksplit) in the workspace and the rest in the memory of an f32 grad_weight that the
 * call overwrites (a line of rows 16-bit values in a row's H f32 ones: rows <= 2 H), which is
 * free until its first write. grad_weight is then written in slices of ksplit lines from the
 * last, each once (K = every row): no read-modify-write passes over it, whatever the rows. */
#ifndef RLK_LINEAR_LOGPROB_STORED_H
#define RLK_LINEAR_LOGPROB_STORED_H

#include "core/core.h"
#include "jit/template.h"

typedef struct rlk_ll_stored {
  /* the whole call's tensors: hidden [N, H], weight [V, H] (one 16-bit dtype), labels [N] */
  rlk_tensor hidden, weight, labels;
  float temperature;
  int64_t ignore_index;
  int entropy;                 /* the records' entropy sums, and the entropy's gradient */
  float *logp, *lse, *ent;     /* [N] outputs, contiguous (ent with entropy) */
  const float *g_lp, *g_ent;   /* [N] the loss's gradients (g_ent with entropy) */
  rlk_tensor grad_hidden;      /* optional: [N, H], f32 or hidden's dtype */
  rlk_tensor grad_weight;      /* optional: [V, H] f32 */
  int accumulate;              /* add to what the gradients hold (grad_weight: the first chunk) */
  int group;                   /* the tile order's rows of tiles; 0: the default */
  int *status;                 /* optional i32: the bad-label bit */
  const float *threshold;      /* optional [N]: kept-set replay's thresholds */
  int64_t rows;                /* the chunk's rows at most */
  int64_t ksplit;              /* > 0: over grad_weight (rlk_ll_stored_over_weight_ok), rows = N */
  void *workspace;             /* rlk_ll_stored_workspace(rows, V, ksplit) bytes, 256-byte aligned */
} rlk_ll_stored;

/* Whether the token chunks can run here: an sm_90a target and tensor maps for hidden and weight
 * (else a reason in *why). */
int rlk_ll_stored_ok(const rlk_context *ctx, const rlk_tensor *hidden, const rlk_tensor *weight, const char **why);

/* Bytes of workspace for chunks of `rows` rows over V columns: u (rows x V rounded up to 64, 16
 * bits; over grad_weight, u^T's first min(ksplit, V) lines of rows rounded up to 64) and the
 * records (one a 256-column tile and row, 16 bytes). */
size_t rlk_ll_stored_workspace(int64_t rows, int64_t V, int64_t ksplit);

/* ksplit for N rows over grad_weight [V, H]: a multiple of 256 (at most V rounded up to 256)
 * whose workspace fits in `room` bytes, 0 if none; among the sizes from the largest down to half
 * of it, the one whose slices take the fewest rounds of `sms` persistent blocks. */
int64_t rlk_ll_stored_ksplit(int64_t N, int64_t H, int64_t V, int64_t room, int sms);

/* Whether u^T of N rows can lie over grad_weight from line ksplit (a multiple of 256): an f32
 * [V, H] matrix with unit column stride, N <= 2 H, a row stride that is a multiple of 4, 16-byte
 * aligned, that a tensor map describes as 16-bit lines (all of u^T in the workspace when ksplit
 * >= V). The caller also needs grad_weight overwritten, not added to. */
int rlk_ll_stored_over_weight_ok(const rlk_tensor *grad_weight, int64_t N, int64_t V, int64_t ksplit);

/* The chunk of `n` rows from r0 (n <= s->rows): logits, records, logp / lse / entropy. */
rlk_status rlk_ll_stored_logits(rlk_context *ctx, const rlk_ll_stored *s, int64_t r0, int64_t n, void *stream);

/* The same chunk's gradients, after its g_lp (and g_ent) are written; first: the first chunk
 * (grad_weight overwritten unless accumulating). */
rlk_status rlk_ll_stored_grads(rlk_context *ctx, const rlk_ll_stored *s, int64_t r0, int64_t n, int first,
                               void *stream);

/* rlk_linear_policy_loss's budget for the workspace it sizes itself (0.3 GiB); `bytes` > 0 sets
 * another for the calls that follow in this process (the tests' small shapes reach the layouts a
 * large call takes), 0 restores it. Not thread-safe: tests only. */
void rlk_lpl_set_budget(int64_t bytes);

/* The chunks' u -> dz kernels (templates/cuda/linear_logprob_stored.cuh), row-major and over u^T,
 * for the op's precompile plan: hidden, labels, entropy. */
extern const rlk_template rlk_ll_stored_dz_tmpl, rlk_ll_stored_dz_t_tmpl;

#endif

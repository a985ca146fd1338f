/* logprob_params.h - the arguments of the logprob kernels (templates/cuda/logprob.cuh and
 * logprob_sm90.cuh, templates/host/logprob_fwd.c and logprob_bwd.c), filled by src/ops/logprob.c.
 *   forward:  logits [N, V] (row stride in elements), labels of the spec's dtype (stride
 *             label_stride) -> logp, lse, entropy [N] (lse and entropy may be NULL), status
 *             (may be NULL). Shared by logprob_fwd, logprob_fwd_bulk and logprob_fwd_tma (the
 *             last's struct holds its tensor map, then this one).
 *   backward: the same inputs, lse, grad_logp, entropy, grad_entropy each with its stride
 *             (grad_logp, entropy, grad_entropy may be NULL) -> grad (the logits' dtype or f32,
 *             row stride grad_stride); shard != 0: the logits are the columns [vocab_start,
 *             vocab_start + V) of the labels' vocabulary.
 *   threshold: kept-set replay (the kernels built with `kept`), f32 [N]: a row's logits below its
 *             threshold leave the softmax, its label stays. */
#ifndef RLK_LOGPROB_PARAMS_H
#define RLK_LOGPROB_PARAMS_H

#include "rlk_float_dtype.h"
#include "rlk_logprob_status.h"
#include "rlk_params.h"

/* The backward's gradient dtype ("grad"): the logits' (RLK_DT_*), or f32. */
#define RLK_LP_GRADS(X)   \
  X(LP_GRAD_SAME, "same") \
  X(LP_GRAD_F32, "f32")
RLK_PARAMS_ENUM(RLK_LP_GRADS);

/* The logits and the rows' labels, first in every list that reads logits (bytes 0 to 55; the
 * vocab-parallel shard's too, logprob_shard_params.h). */
#define RLK_LP_ROWS(F, S_)                                          \
  RLK_PARAMS_STRIDED(F, S_, const void *, logits, row_stride, 0)    \
  RLK_PARAMS_STRIDED(F, S_, const void *, labels, label_stride, 16) \
  F(S_, long long, N, 32)                                           \
  F(S_, long long, V, 40)                                           \
  F(S_, long long, ignore_index, 48)

#define RLK_LP_FWD_PARAMS(F, S_)      \
  RLK_LP_ROWS(F, S_)                  \
  F(S_, float *, logp, 56)            \
  F(S_, float *, lse, 64)             \
  F(S_, float *, entropy, 72)         \
  F(S_, int *, status, 80)            \
  F(S_, const float *, threshold, 88) \
  F(S_, float, temperature, 96)
RLK_PARAMS_DECLARE(lp_fwd_args, RLK_LP_FWD_PARAMS, 104);

/* logprob_fwd_tma's: the tensor map of the logits [N, V] (boxes of 512 bytes x the kernel's rows),
 * then the forward's struct. */
#define RLK_LP_FWD_TMA_PARAMS(F, S_) \
  F(S_, rlk_tensor_map, map, 0)      \
  F(S_, lp_fwd_args, rows, 128)
RLK_PARAMS_DECLARE(lp_fwd_tma_args, RLK_LP_FWD_TMA_PARAMS, 256);

#define RLK_LP_BWD_PARAMS(F, S_)                                                   \
  RLK_LP_ROWS(F, S_)                                                               \
  RLK_PARAMS_STRIDED(F, S_, const float *, lse, lse_stride, 56)                    \
  RLK_PARAMS_STRIDED(F, S_, const float *, grad_logp, grad_logp_stride, 72)        \
  RLK_PARAMS_STRIDED(F, S_, const float *, entropy, entropy_stride, 88)            \
  RLK_PARAMS_STRIDED(F, S_, const float *, grad_entropy, grad_entropy_stride, 104) \
  RLK_PARAMS_STRIDED(F, S_, void *, grad, grad_stride, 120)                        \
  F(S_, int *, status, 136)                                                        \
  F(S_, long long, vocab_start, 144)                                               \
  F(S_, float, temperature, 152)                                                   \
  F(S_, int, shard, 156)                                                           \
  F(S_, const float *, threshold, 160)
#define RLK_LP_BWD_PARAMS_SIZE 168

#endif

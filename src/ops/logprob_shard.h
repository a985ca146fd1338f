/* logprob_shard.h - the vocab-parallel pieces of the logprob family that its files share. */
#ifndef RLK_LOGPROB_SHARD_H
#define RLK_LOGPROB_SHARD_H

#include <stdint.h>

#include "rlk.h"

/* rlk_logprob's shard form (args->partials given): its records of a vocabulary shard
 * (logprob_shard.c). */
rlk_status rlk_logprob_shard_forward(rlk_context *ctx, const rlk_logprob_args *args, void *stream);

/* The inputs every logprob call checks alike (logprob.c): logits [N, V] with contiguous rows,
 * labels [N], a finite temperature > 0 and an rlk_logprob_variant. They go, with ignore_index, to
 * the front of `rows`: the argument struct of a kernel whose list begins with RLK_LP_ROWS
 * (templates/common/logprob_params.h: logits, labels, their strides, N, V, ignore_index). */
rlk_status rlk_logprob_check_inputs(const rlk_tensor *logits, const rlk_tensor *labels, float temperature,
                                    int variant, int64_t ignore_index, void *rows);

/* The combine's outputs as rlk_logprob_combine checks them, for N rows. */
rlk_status rlk_logprob_combine_check_outputs(const rlk_tensor *logp, const rlk_tensor *lse,
                                             const rlk_tensor *entropy, const rlk_tensor *status,
                                             int64_t N);

/* rlk_logprob's vector row layout for logits of that dtype and rows of V elements with the
 * tuning requests block and unroll (0: defaults): threads per block, per row, vectors per chunk. */
rlk_status rlk_logprob_vec_shape(const rlk_context *ctx, rlk_dtype logits, int64_t V, int block,
                                 int unroll, int *block_out, int *seg, int *unroll_out);

#endif

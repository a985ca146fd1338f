/* logprob_shard.h - the vocab-parallel pieces of the logprob family that other op files call. */
#ifndef RLK_LOGPROB_SHARD_H
#define RLK_LOGPROB_SHARD_H

#include <stdint.h>

#include "rlk.h"

/* rlk_logprob's shard form (args->partials given), after rlk_logprob checked the logits
 * ([N, V], row stride) and the labels (label stride), the temperature and the variant. */
rlk_status rlk_logprob_shard_forward(rlk_context *ctx, const rlk_logprob_args *args, int64_t N,
                                     int64_t V, int64_t row_stride, int64_t label_stride,
                                     void *stream);

/* Launches the shard forward writing its records at `partials` (f32 [N, 4], 16-byte aligned). */
rlk_status rlk_logprob_shard_launch(rlk_context *ctx, const rlk_logprob_args *args, int64_t N,
                                    int64_t V, int64_t row_stride, int64_t label_stride,
                                    int entropy, float *partials, void *stream);

/* Launches the combine of P gathered records (f32 [P, N, 4]) into args' outputs; the arguments
 * are checked by the caller. */
rlk_status rlk_logprob_combine_launch(rlk_context *ctx, const float *partials, int64_t P, int64_t N,
                                      const rlk_tensor *labels, int64_t label_stride,
                                      int64_t ignore_index, float *logp, float *lse, float *entropy,
                                      int32_t *status, void *stream);

/* The combine's outputs as rlk_logprob_combine checks them, for N rows. */
rlk_status rlk_logprob_combine_check_outputs(const rlk_tensor *logp, const rlk_tensor *lse,
                                             const rlk_tensor *entropy, const rlk_tensor *status,
                                             int64_t N);

/* rlk_logprob's vector row layout for logits of that dtype and rows of V elements with the
 * tuning requests block and unroll (0: defaults): threads per block, per row, vectors per chunk. */
rlk_status rlk_logprob_vec_shape(const rlk_context *ctx, rlk_dtype logits, int64_t V, int block,
                                 int unroll, int *block_out, int *seg, int *unroll_out);

#endif

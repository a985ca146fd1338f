/* logprob_shard_params.h - the arguments of the vocab-parallel logprob kernels (templates/cuda/
 * logprob_shard.cuh, templates/host/logprob_shard_fwd.c and logprob_combine.c), filled by
 * src/ops/logprob_shard.c; records as include/rlk.h documents them.
 *   shard forward: logits [N, V] of the shard (row stride in elements), global labels of the
 *                  spec's dtype, the shard's first column vocab_start -> partials [N] records
 *   combine:       partials [P, N] records, labels -> logp, lse, entropy [N] (lse and entropy
 *                  may be NULL), status (may be NULL) */
#ifndef RLK_LOGPROB_SHARD_PARAMS_H
#define RLK_LOGPROB_SHARD_PARAMS_H

#include "logprob_params.h"

#define RLK_LS_FWD_PARAMS(F, S_)    \
  RLK_LP_ROWS(F, S_)                \
  F(S_, long long, vocab_start, 56) \
  F(S_, void *, partials, 64)       \
  F(S_, float, temperature, 72)
#define RLK_LS_FWD_PARAMS_SIZE 80

#define RLK_LS_COMBINE_PARAMS(F, S_)                                \
  F(S_, const void *, partials, 0)                                  \
  F(S_, long long, P, 8)                                            \
  F(S_, long long, N, 16)                                           \
  RLK_PARAMS_STRIDED(F, S_, const void *, labels, label_stride, 24) \
  F(S_, long long, ignore_index, 40)                                \
  F(S_, float *, logp, 48)                                          \
  F(S_, float *, lse, 56)                                           \
  F(S_, float *, entropy, 64)                                       \
  F(S_, int *, status, 72)
#define RLK_LS_COMBINE_PARAMS_SIZE 80

#endif

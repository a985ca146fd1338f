/* group_advantage_params.h - the arguments of the three group_advantage kernels (templates/cuda/
 * group_advantage.cuh, templates/host/group_advantage_*.c), filled by src/ops/group_advantage.c.
 *   rowsum:    [B, T] token rewards (row stride reward_stride) summed under the mask into out [B],
 *              of the rewards' type (f64 rewards keep f64 sums)
 *   group:     scores (stride score_stride) -> adv [B]; group_size > 0 fixed, else num_groups
 *              groups by offsets (i32 or i64 as the spec says); eps, unbiased and singleton as
 *              rlk_group_advantage_args; weights (opo, the scores' type, stride weight_stride);
 *              nan_unscorable: RLK_NAN_SCORES_UNSCORABLE
 *   broadcast: out[b, t] = adv[b] x mask[b, t] */
#ifndef RLK_GROUP_ADVANTAGE_PARAMS_H
#define RLK_GROUP_ADVANTAGE_PARAMS_H

#include "rlk_params.h"
#include "rlk_seq_mask.h"

/* The advantage ("mode"), in rlk_advantage_mode order. */
#define RLK_GA_MODES(X)             \
  X(GA_MODE_GRPO, "grpo")           \
  X(GA_MODE_MEAN_ONLY, "mean-only") \
  X(GA_MODE_RLOO, "rloo")           \
  X(GA_MODE_BATCH_STD, "batch-std") \
  X(GA_MODE_OPO, "opo")             \
  X(GA_MODE_PASSK, "passk")         \
  X(GA_MODE_PASSK_UNSCALED, "passk-unscaled")
RLK_PARAMS_ENUM(RLK_GA_MODES);

/* A one-member group's advantage ("singleton"), in rlk_singleton_policy order. */
#define RLK_GA_SINGLETONS(X)               \
  X(GA_SINGLETON_MEAN0_STD1, "mean0-std1") \
  X(GA_SINGLETON_ZERO, "zero")
RLK_PARAMS_ENUM(RLK_GA_SINGLETONS);

/* How rows form groups ("offsets"): group_size consecutive rows, or offsets of i32 or i64. */
#define RLK_GA_OFFSETS(X)      \
  X(GA_OFFSETS_FIXED, "fixed") \
  X(GA_OFFSETS_I32, "i32")     \
  X(GA_OFFSETS_I64, "i64")
RLK_PARAMS_ENUM(RLK_GA_OFFSETS);

#define RLK_GA_ROWSUM_PARAMS(F, S_)                                  \
  RLK_PARAMS_STRIDED(F, S_, const void *, rewards, reward_stride, 0) \
  RLK_PARAMS_STRIDED(F, S_, const void *, mask, mask_stride, 16)     \
  F(S_, void *, out, 32)                                             \
  F(S_, long long, B, 40)                                            \
  F(S_, long long, T, 48)
RLK_PARAMS_DECLARE(ga_rowsum_args, RLK_GA_ROWSUM_PARAMS, 56);

#define RLK_GA_GROUP_PARAMS(F, S_)                                    \
  RLK_PARAMS_STRIDED(F, S_, const void *, scores, score_stride, 0)    \
  F(S_, float *, adv, 16)                                             \
  F(S_, long long, B, 24)                                             \
  F(S_, long long, group_size, 32)                                    \
  F(S_, long long, num_groups, 40)                                    \
  F(S_, const void *, offsets, 48)                                    \
  F(S_, float, eps, 56)                                               \
  F(S_, int, unbiased, 60)                                            \
  F(S_, int, singleton, 64)                                           \
  RLK_PARAMS_STRIDED(F, S_, const void *, weights, weight_stride, 72) \
  F(S_, int, nan_unscorable, 88)
RLK_PARAMS_DECLARE(ga_group_args, RLK_GA_GROUP_PARAMS, 96);

#define RLK_GA_BROADCAST_PARAMS(F, S_)                          \
  F(S_, const float *, adv, 0)                                  \
  RLK_PARAMS_STRIDED(F, S_, const void *, mask, mask_stride, 8) \
  RLK_PARAMS_STRIDED(F, S_, float *, out, out_stride, 24)       \
  F(S_, long long, B, 40)                                       \
  F(S_, long long, T, 48)
RLK_PARAMS_DECLARE(ga_broadcast_args, RLK_GA_BROADCAST_PARAMS, 56);

#endif

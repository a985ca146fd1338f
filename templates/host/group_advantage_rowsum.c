/* group_advantage_rowsum.c - host form of rlk::group_advantage_rowsum (see
 * templates/cuda/group_advantage.cuh): out[b] = sum_t r[b, t] * m[b, t] over the elements
 * whose mask value is non-zero, accumulated and stored in the reward type, in t order.
 * Parameters: RLK_P_SCORES (float or double), RLK_P_MASK (RLK_SEQ_MASK_*). */
#include "group_advantage_common.h"

typedef RLK_P_SCORES ga_score_t;

RLK_HOST_KERNEL rlk_group_advantage_rowsum(void **args) {
  const ga_rowsum_args *p_ = (const ga_rowsum_args *)args[0];
  const ga_score_t *rewards = (const ga_score_t *)p_->rewards;
  const rlk_i64 reward_stride = p_->reward_stride;
  const void *mask = p_->mask;
  const rlk_i64 mask_stride = p_->mask_stride;
  ga_score_t *out = (ga_score_t *)p_->out;
  const rlk_i64 B = p_->B, T = p_->T;
  for (rlk_i64 b = 0; b < B; b++) {
    const ga_score_t *r = rewards + b * reward_stride;
    ga_score_t acc = 0;
    for (rlk_i64 t = 0; t < T; t++) {
      if (RLK_P_MASK == RLK_SEQ_MASK_NONE) {
        acc += r[t];
      } else {
        const float w = rlk_mask_weight(RLK_P_MASK, mask, b * mask_stride + t);
        if (w != 0.0f) acc += r[t] * (ga_score_t)w;
      }
    }
    out[b] = acc;
  }
}

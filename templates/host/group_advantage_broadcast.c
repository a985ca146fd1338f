/* group_advantage_broadcast.c - host form of rlk::group_advantage_broadcast (see
 * templates/cuda/group_advantage.cuh): out[b, t] = adv[b] * m[b, t], exactly 0 where the mask
 * is 0, adv[b] without a mask. Parameter: RLK_P_MASK (RLK_SEQ_MASK_*). */
#include "group_advantage_common.h"

RLK_HOST_KERNEL rlk_group_advantage_broadcast(void **args) {
  const ga_broadcast_args *p_ = (const ga_broadcast_args *)args[0];
  const float *adv = p_->adv;
  const void *mask = p_->mask;
  const rlk_i64 mask_stride = p_->mask_stride;
  float *out = p_->out;
  const rlk_i64 out_stride = p_->out_stride;
  const rlk_i64 B = p_->B, T = p_->T;
  for (rlk_i64 b = 0; b < B; b++) {
    const float a = adv[b];
    float *o = out + b * out_stride;
    for (rlk_i64 t = 0; t < T; t++) {
      if (RLK_P_MASK == RLK_SEQ_MASK_NONE) {
        o[t] = a;
      } else {
        const float w = rlk_mask_weight(RLK_P_MASK, mask, b * mask_stride + t);
        o[t] = w != 0.0f ? a * w : 0.0f;
      }
    }
  }
}

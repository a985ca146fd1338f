/* group_advantage_broadcast.c - host form of rlk::group_advantage_broadcast (see
 * templates/cuda/group_advantage.cuh): out[b, t] = adv[b] * m[b, t], exactly 0 where the mask
 * is 0, adv[b] without a mask. Parameter: RLK_P_MASK (GA_MASK_*). */
#include "group_advantage_common.h"

RLK_HOST_KERNEL rlk_group_advantage_broadcast(void **args) {
  const float *adv = RLK_ARG(const float *, 0);
  const void *mask = RLK_ARG(const void *, 1);
  const rlk_i64 mask_stride = RLK_ARG(rlk_i64, 2);
  float *out = RLK_ARG(float *, 3);
  const rlk_i64 out_stride = RLK_ARG(rlk_i64, 4);
  const rlk_i64 B = RLK_ARG(rlk_i64, 5), T = RLK_ARG(rlk_i64, 6);
  for (rlk_i64 b = 0; b < B; b++) {
    const float a = adv[b];
    float *o = out + b * out_stride;
    for (rlk_i64 t = 0; t < T; t++) {
      if (RLK_P_MASK == GA_MASK_NONE) {
        o[t] = a;
      } else {
        const float w = ga_mask_at(RLK_P_MASK, mask, b * mask_stride + t);
        o[t] = w != 0.0f ? a * w : 0.0f;
      }
    }
  }
}

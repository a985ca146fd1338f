/* group_advantage_group.c - host form of rlk::group_advantage_group (see
 * templates/cuda/group_advantage.cuh): per-group two-pass mean and variance in the score
 * type, then the advantages, one group after another. scores may alias adv (in place): a
 * group's statistics are complete before its members are written, and the batch statistics
 * before any member is.
 * Parameters: RLK_P_SCORES (float or double), RLK_P_MODE, RLK_P_GROUP (a fixed group size, or
 * 0: read at run time), RLK_P_SEG (device only), RLK_P_OFFSETS (GA_OFFSETS_*); unbiased and the
 * singleton policy are run-time arguments. */
#include "group_advantage_common.h"

RLK_PARAMS_DECLARE(ga_group_params, RLK_GA_GROUP_PARAMS, RLK_GA_GROUP_PARAMS_SIZE);

typedef RLK_P_SCORES ga_score_t;

static inline ga_score_t ga_sqrt(ga_score_t x) { return (ga_score_t)rlk_sqrt((double)x); }

RLK_HOST_KERNEL rlk_group_advantage_group(void **args) {
  const ga_group_params *p_ = (const ga_group_params *)args[0];
  const ga_score_t *scores = (const ga_score_t *)p_->scores;
  const rlk_i64 stride = p_->score_stride;
  float *adv = p_->adv;
  const rlk_i64 B = p_->B;
  const rlk_i64 group_size = p_->group_size;
  const rlk_i64 num_groups = p_->num_groups;
  const void *offsets = p_->offsets;
  const ga_score_t e = (ga_score_t)p_->eps;
  const int unbiased = p_->unbiased;
  const int singleton = p_->singleton;

  ga_score_t batch_scale = 1;
  if (RLK_P_MODE == GA_MODE_BATCH_STD) {
    ga_score_t s = 0, q = 0;
    for (rlk_i64 i = 0; i < B; i++) s += scores[i * stride];
    const ga_score_t mean = s / (ga_score_t)B;
    for (rlk_i64 i = 0; i < B; i++) {
      const ga_score_t d = scores[i * stride] - mean;
      q += d * d;
    }
    batch_scale = ga_sqrt(q / (ga_score_t)(unbiased ? B - 1 : B)) + e;
  }

  for (rlk_i64 g = 0; g < num_groups; g++) {
    rlk_i64 start, end;
    if (RLK_P_OFFSETS == GA_OFFSETS_FIXED) {
      const rlk_i64 size = RLK_P_GROUP > 0 ? (rlk_i64)RLK_P_GROUP : group_size;
      start = g * size;
      end = start + size;
    } else {
      if (RLK_P_OFFSETS == GA_OFFSETS_I32) {
        start = ((const int32_t *)offsets)[g];
        end = ((const int32_t *)offsets)[g + 1];
      } else {
        start = ((const int64_t *)offsets)[g];
        end = ((const int64_t *)offsets)[g + 1];
      }
      /* Validated by the op; clamped anyway so nothing outside [0, B) is ever touched. */
      start = start < 0 ? 0 : (start > B ? B : start);
      end = end < start ? start : (end > B ? B : end);
    }
    if (end > B) end = B;
    const rlk_i64 n = end - start;
    if (n <= 0) continue;

    ga_score_t sum = 0;
    for (rlk_i64 i = start; i < end; i++) sum += scores[i * stride];
    const ga_score_t mean = sum / (ga_score_t)n;

    ga_score_t scale = 1;
    if (RLK_P_MODE == GA_MODE_GRPO && n > 1) {
      ga_score_t q = 0;
      for (rlk_i64 i = start; i < end; i++) {
        const ga_score_t d = scores[i * stride] - mean;
        q += d * d;
      }
      scale = ga_sqrt(q / (ga_score_t)(unbiased ? n - 1 : n)) + e;
    } else if (RLK_P_MODE == GA_MODE_BATCH_STD) {
      scale = batch_scale;
    }

    for (rlk_i64 i = start; i < end; i++) {
      const ga_score_t s = scores[i * stride];
      ga_score_t a;
      if (n == 1) {
        if (singleton == GA_SINGLETON_ZERO)
          a = 0;
        else if (RLK_P_MODE == GA_MODE_GRPO || RLK_P_MODE == GA_MODE_BATCH_STD)
          a = s / (1 + e);
        else
          a = s;
      } else if (RLK_P_MODE == GA_MODE_RLOO) {
        a = s - (sum - s) / (ga_score_t)(n - 1);
      } else if (RLK_P_MODE == GA_MODE_MEAN_ONLY) {
        a = s - mean;
      } else {
        a = (s - mean) / scale;
      }
      adv[i] = (float)a;
    }
  }
}

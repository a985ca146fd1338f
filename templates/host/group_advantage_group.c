/* group_advantage_group.c - host form of rlk::group_advantage_group (see
 * templates/cuda/group_advantage.cuh): per-group two-pass mean and variance in the score
 * type, then the advantages, one group after another. scores may alias adv (in place): a
 * group's statistics are complete before its members are written, and the batch statistics
 * before any member is.
 * Parameters: RLK_P_SCORES (float or double), RLK_P_MODE, RLK_P_GROUP (a fixed group size, or
 * 0: read at run time), RLK_P_SEG (device only), RLK_P_OFFSETS (GA_OFFSETS_*); unbiased, the
 * singleton policy and unscorable NaNs are run-time arguments. */
#include "group_advantage_common.h"
#include "rlk_host_offsets.h"

typedef RLK_P_SCORES ga_score_t;

#define GA_PASSK (RLK_P_MODE == GA_MODE_PASSK || RLK_P_MODE == GA_MODE_PASSK_UNSCALED)

static inline ga_score_t ga_sqrt(ga_score_t x) { return (ga_score_t)rlk_sqrt((double)x); }

/* Is s part of the statistics? Not a NaN when NaNs mark unscorable members. */
static inline int ga_scorable(ga_score_t s, int nan_skip) { return !nan_skip || s == s; }

RLK_HOST_KERNEL rlk_group_advantage_group(void **args) {
  const ga_group_args *p_ = (const ga_group_args *)args[0];
  const ga_score_t *scores = (const ga_score_t *)p_->scores;
  const ga_score_t *weights = (const ga_score_t *)p_->weights;
  const rlk_i64 stride = p_->score_stride, wstride = p_->weight_stride;
  float *adv = p_->adv;
  const rlk_i64 B = p_->B;
  const rlk_i64 group_size = p_->group_size;
  const rlk_i64 num_groups = p_->num_groups;
  const void *offsets = p_->offsets;
  const ga_score_t e = (ga_score_t)p_->eps;
  const int unbiased = p_->unbiased;
  const int singleton = p_->singleton;
  const int nan_skip = p_->nan_unscorable != 0;

  ga_score_t batch_scale = 1;
  if (RLK_P_MODE == GA_MODE_BATCH_STD) {
    ga_score_t s = 0, q = 0, nb = 0;
    for (rlk_i64 i = 0; i < B; i++) {
      const ga_score_t x = scores[i * stride];
      if (ga_scorable(x, nan_skip)) {
        s += x;
        nb += 1;
      }
    }
    const ga_score_t mean = s / nb;
    for (rlk_i64 i = 0; i < B; i++) {
      const ga_score_t x = scores[i * stride];
      const ga_score_t d = x - mean;
      if (ga_scorable(x, nan_skip)) q += d * d;
    }
    batch_scale = ga_sqrt(q / (unbiased ? nb - 1 : nb)) + e;
  }

  for (rlk_i64 g = 0; g < num_groups; g++) {
    rlk_i64 start, end;
    if (RLK_P_OFFSETS == GA_OFFSETS_FIXED) {
      const rlk_i64 size = RLK_P_GROUP > 0 ? (rlk_i64)RLK_P_GROUP : group_size;
      start = g * size;
      end = start + size;
    } else {
      rlk_offsets_range(offsets, RLK_P_OFFSETS == GA_OFFSETS_I32, g, B, &start, &end);
    }
    if (end > B) end = B;
    if (end <= start) continue;

    ga_score_t sum = 0;
    rlk_i64 n = 0;
    for (rlk_i64 i = start; i < end; i++) {
      const ga_score_t x = scores[i * stride];
      if (ga_scorable(x, nan_skip)) {
        sum += x;
        n++;
      }
    }
    const ga_score_t mean = sum / (ga_score_t)n;

    ga_score_t scale = 1;
    if ((RLK_P_MODE == GA_MODE_GRPO || RLK_P_MODE == GA_MODE_PASSK) && n > 1) {
      ga_score_t q = 0;
      for (rlk_i64 i = start; i < end; i++) {
        const ga_score_t x = scores[i * stride];
        const ga_score_t d = x - mean;
        if (ga_scorable(x, nan_skip)) q += d * d;
      }
      scale = ga_sqrt(q / (ga_score_t)(unbiased ? n - 1 : n)) + e;
    } else if (RLK_P_MODE == GA_MODE_BATCH_STD) {
      scale = batch_scale;
    }

    ga_score_t wmean = 0;
    if (RLK_P_MODE == GA_MODE_OPO) {
      ga_score_t ws = 0, w = 0;
      for (rlk_i64 i = start; i < end; i++) {
        const ga_score_t x = scores[i * stride], wi = weights[i * wstride];
        if (ga_scorable(x, nan_skip)) {
          ws += wi * x;
          w += wi;
        }
      }
      wmean = w != 0 ? ws / w : (ga_score_t)__builtin_nan(""); /* weights summing to 0: NaN, not +-inf */
    }

    /* passk: the best member (the first of equal maxima) and the second best score; where NaN
     * scores are arithmetic, a NaN ranks above every score (torch.topk's order): the first NaN
     * member is the best and the gap is NaN */
    rlk_i64 best = -1;
    ga_score_t gap = 0;
    if (GA_PASSK && !nan_skip)
      for (rlk_i64 i = start; i < end && best < 0; i++)
        if (scores[i * stride] != scores[i * stride]) best = i;
    if (GA_PASSK && best >= 0) {
      gap = (ga_score_t)__builtin_nan("");
    } else if (GA_PASSK) {
      const ga_score_t lowest = -(ga_score_t)__builtin_inf();
      ga_score_t m1 = lowest, m2 = lowest;
      for (rlk_i64 i = start; i < end; i++) {
        const ga_score_t x = scores[i * stride];
        if (ga_scorable(x, nan_skip) && (x > m1 || (best < 0 && x == m1))) {
          m1 = x;
          best = i;
        }
      }
      for (rlk_i64 i = start; i < end; i++) {
        const ga_score_t x = scores[i * stride];
        if (ga_scorable(x, nan_skip) && i != best && x > m2) m2 = x;
      }
      gap = RLK_P_MODE == GA_MODE_PASSK ? (m1 - m2) / scale : m1 - m2;
    }

    for (rlk_i64 i = start; i < end; i++) {
      const ga_score_t s = scores[i * stride];
      ga_score_t a;
      if (!ga_scorable(s, nan_skip)) {
        a = 0;
      } else if (GA_PASSK) {
        a = n >= 2 && i == best ? gap : 0;
      } else if (n == 1) {
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
      } else if (RLK_P_MODE == GA_MODE_OPO) {
        a = s - wmean;
      } else {
        a = (s - mean) / scale;
      }
      if (nan_skip && a != a) a = 0;
      adv[i] = (float)a;
    }
  }
}

/* group_advantage_ref.c - straightforward fp64 advantages: one group at a time, the formulas
 * exactly as the contract states them. */
#include "ref/group_advantage_ref.h"

#include <math.h>
#include <stdlib.h>

#include "rlk.h"

static double centred_divisor(const ga_ref_problem *p, double group_std, double batch_std) {
  switch (p->mode) {
  case RLK_ADV_GRPO:
    return group_std + p->eps;
  case RLK_ADV_BATCH_STD:
    return batch_std + p->eps;
  default:
    return 1.0;
  }
}

int ga_ref_compute(const ga_ref_problem *p, ga_ref_result *out) {
  const int64_t B = p->B;
  for (int64_t b = 0; b < B; b++) {
    if (p->rewards) {
      double s = 0;
      for (int64_t t = 0; t < p->T; t++) {
        const double w = p->mask ? p->mask[b * p->T + t] : 1.0;
        if (w != 0.0) s += p->rewards[b * p->T + t] * w;
      }
      out->score[b] = s;
    } else {
      out->score[b] = p->scores[b];
    }
  }

  /* the standard deviation of every score in the batch (batch-std) */
  double batch_std = 0;
  {
    double mean = 0, ss = 0;
    for (int64_t b = 0; b < B; b++) mean += out->score[b];
    mean /= (double)B;
    for (int64_t b = 0; b < B; b++) ss += (out->score[b] - mean) * (out->score[b] - mean);
    const int64_t dof = p->unbiased ? B - 1 : B;
    batch_std = dof > 0 ? sqrt(ss / (double)dof) : NAN;
  }

  if (p->offsets[0] != 0 || p->offsets[p->num_groups] != B) return -1;
  for (int64_t g = 0; g < p->num_groups; g++) {
    const int64_t lo = p->offsets[g], hi = p->offsets[g + 1], n = hi - lo;
    if (n <= 0) return -1;
    double sum = 0;
    for (int64_t i = lo; i < hi; i++) sum += out->score[i];
    const double mean = sum / (double)n;
    double ss = 0;
    for (int64_t i = lo; i < hi; i++) ss += (out->score[i] - mean) * (out->score[i] - mean);
    const double std = n > 1 ? sqrt(ss / (double)(p->unbiased ? n - 1 : n)) : 0.0;
    for (int64_t i = lo; i < hi; i++) {
      const double s = out->score[i];
      if (n == 1) {
        /* mean 0 and std 1: grpo and batch-std give s / (1 + eps), the others s */
        const int divides = p->mode == RLK_ADV_GRPO || p->mode == RLK_ADV_BATCH_STD;
        out->scale[i] = divides ? 1.0 + p->eps : 1.0;
        out->adv[i] = p->singleton == RLK_SINGLETON_ZERO ? 0.0 : s / out->scale[i];
        continue;
      }
      if (p->mode == RLK_ADV_RLOO) {
        out->scale[i] = 1.0;
        out->adv[i] = s - (sum - s) / (double)(n - 1);
      } else {
        out->scale[i] = centred_divisor(p, std, batch_std);
        out->adv[i] = (s - mean) / out->scale[i];
      }
    }
  }

  if (out->tokens)
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t < p->T; t++) {
        const double w = p->mask ? p->mask[b * p->T + t] : 1.0;
        out->tokens[b * p->T + t] = w != 0.0 ? out->adv[b] * w : 0.0;
      }
  return 0;
}

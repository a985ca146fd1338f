/* group_advantage_ref.c - straightforward fp64 advantages: one group at a time, the formulas
 * exactly as the contract states them. */
#include "ref/group_advantage_ref.h"

#include <math.h>
#include <stdlib.h>

#include "rlk.h"

static double centred_divisor(const ga_ref_problem *p, double group_std, double batch_std) {
  switch (p->mode) {
  case RLK_ADV_GRPO:
  case RLK_ADV_PASSK:
    return group_std + p->eps;
  case RLK_ADV_BATCH_STD:
    return batch_std + p->eps;
  default:
    return 1.0;
  }
}

/* Does score s take part in the statistics? (Unscorable: a NaN does not.) */
static int counts(const ga_ref_problem *p, double s) { return !(p->nan_unscorable && isnan(s)); }

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

  /* the standard deviation of every (scorable) score in the batch (batch-std) */
  double batch_std = 0;
  {
    double mean = 0, ss = 0;
    int64_t nb = 0;
    for (int64_t b = 0; b < B; b++)
      if (counts(p, out->score[b])) {
        mean += out->score[b];
        nb++;
      }
    mean /= (double)nb;
    for (int64_t b = 0; b < B; b++)
      if (counts(p, out->score[b])) ss += (out->score[b] - mean) * (out->score[b] - mean);
    const int64_t dof = p->unbiased ? nb - 1 : nb;
    batch_std = dof > 0 ? sqrt(ss / (double)dof) : NAN;
  }

  if (p->offsets[0] != 0 || p->offsets[p->num_groups] != B) return -1;
  for (int64_t g = 0; g < p->num_groups; g++) {
    const int64_t lo = p->offsets[g], hi = p->offsets[g + 1];
    if (hi <= lo) return -1;
    int64_t n = 0;
    double sum = 0, wsum = 0, wssum = 0;
    for (int64_t i = lo; i < hi; i++)
      if (counts(p, out->score[i])) {
        sum += out->score[i];
        n++;
        if (p->weights) {
          wsum += p->weights[i];
          wssum += p->weights[i] * out->score[i];
        }
      }
    const double mean = sum / (double)n;
    double ss = 0;
    for (int64_t i = lo; i < hi; i++)
      if (counts(p, out->score[i])) ss += (out->score[i] - mean) * (out->score[i] - mean);
    const double std = n > 1 ? sqrt(ss / (double)(p->unbiased ? n - 1 : n)) : 0.0;

    if (p->mode == RLK_ADV_PASSK || p->mode == RLK_ADV_PASSK_UNSCALED) {
      /* the first member holding the group's highest score, and the highest of the others */
      int64_t best = -1;
      for (int64_t i = lo; i < hi; i++)
        if (counts(p, out->score[i]) && (best < 0 || out->score[i] > out->score[best])) best = i;
      double second = -INFINITY;
      for (int64_t i = lo; i < hi; i++)
        if (counts(p, out->score[i]) && i != best && out->score[i] > second) second = out->score[i];
      const double div = p->mode == RLK_ADV_PASSK ? std + p->eps : 1.0;
      for (int64_t i = lo; i < hi; i++) {
        out->scale[i] = div;
        out->adv[i] = n >= 2 && i == best ? (out->score[best] - second) / div : 0.0;
      }
      continue;
    }
    for (int64_t i = lo; i < hi; i++) {
      const double s = out->score[i];
      if (!counts(p, s)) {
        out->scale[i] = 1.0;
        out->adv[i] = 0.0;
        continue;
      }
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
      } else if (p->mode == RLK_ADV_OPO) {
        out->scale[i] = 1.0;
        out->adv[i] = s - wssum / wsum;
      } else {
        out->scale[i] = centred_divisor(p, std, batch_std);
        out->adv[i] = (s - mean) / out->scale[i];
      }
      if (p->nan_unscorable && isnan(out->adv[i])) out->adv[i] = 0.0;
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

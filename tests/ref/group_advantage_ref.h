/* group_advantage_ref.h - an fp64 reference for rlk_group_advantage, written from the
 * contract in include/rlk.h and shared/specs/ops.md section 5, independent of the kernels. */
#ifndef RLK_GROUP_ADVANTAGE_REF_H
#define RLK_GROUP_ADVANTAGE_REF_H

#include <stdint.h>

typedef struct ga_ref_problem {
  int64_t B;
  /* Per-sequence scores [B], or NULL when rewards are given. */
  const double *scores;
  /* Token rewards [B, T] (dense, row-major) summed per row under the mask, or NULL. */
  const double *rewards;
  int64_t T;            /* columns of rewards / mask / token outputs; 0 if none */
  const double *mask;   /* [B, T] weights, or NULL (all ones) */
  const int64_t *offsets; /* [num_groups + 1]: the groups, fixed sizes included */
  int64_t num_groups;
  int mode;       /* rlk_advantage_mode */
  double eps;
  int unbiased;
  int singleton;  /* rlk_singleton_policy */
  const double *weights; /* [B] opo's per-member weights, or NULL */
  int nan_unscorable;    /* NaN scores are unscorable members (RLK_NAN_SCORES_UNSCORABLE) */
} ga_ref_problem;

typedef struct ga_ref_result {
  double *score;  /* [B] the per-sequence score used (the row sum for rewards) */
  double *adv;    /* [B] */
  double *scale;  /* [B] the divisor applied to the centred score (1 where there is none) */
  double *tokens; /* [B, T] adv * mask (0 where the mask is 0), or NULL to skip */
} ga_ref_result;

/* Computes the advantages (and token advantages when out->tokens is set). Returns 0, or -1 on
 * a problem the contract rejects (bad offsets, an empty group). */
int ga_ref_compute(const ga_ref_problem *p, ga_ref_result *out);

#endif

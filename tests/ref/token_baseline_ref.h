/* token_baseline_ref.h - an fp64 reference for rlk_token_baseline, written from the contract in
 * include/rlk.h, independent of the kernels: one group at a time, lengths sorted, plain sums. */
#ifndef RLK_TOKEN_BASELINE_REF_H
#define RLK_TOKEN_BASELINE_REF_H

#include <stdint.h>

typedef struct tb_ref_problem {
  int64_t B, T;
  const double *rewards;   /* [B, T] dense */
  const double *mask;      /* [B, T] weights, or NULL (all ones) */
  const double *old_logp;  /* [B, T] */
  const double *sum_pi_sq; /* [B, T] */
  const double *isw;       /* [B, T] or NULL */
  const int64_t *offsets;  /* [num_groups + 1]: the groups, fixed sizes included */
  int64_t num_groups;
  double eps;
  int zero_tail;
  int compact;
} tb_ref_problem;

typedef struct tb_ref_result {
  double *adv; /* [B, T] */
  double *ret; /* [B, T] */
  /* [B, T] the size of the sums behind adv (absolute values of every term through the scans
   * and the baseline's ratio): a computation in precision u is within a few u * T of adv
   * relative to it. */
  double *mag;
} tb_ref_result;

/* Returns 0, or -1 on bad offsets. */
int tb_ref_compute(const tb_ref_problem *p, tb_ref_result *out);

#endif

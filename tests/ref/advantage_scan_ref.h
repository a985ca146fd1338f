/* advantage_scan_ref.h - fp64 references for GAE, discounted returns, reverse cumulative sums
 * and masked whitening, each written as the trainer it reproduces computes it (a loop over time
 * with [B]-wide steps, masks multiplied in), from the descriptions in shared/research/rl-ops.md
 * sections 1.5 and 3 and shared/specs/ops.md section 5. Independent of the kernels.
 *
 * Every array is dense row-major [B, T]; masks hold 0 or 1 (NULL: all ones). */
#ifndef RLK_ADVANTAGE_SCAN_REF_H
#define RLK_ADVANTAGE_SCAN_REF_H

#include <stdint.h>

/* verl compute_gae_advantage_return before its whitening: a reversed loop carrying nextvalues
 * and lastgaelam, blended with the mask so masked steps leave both unchanged; returns = adv + V. */
void as_ref_gae_verl(int64_t B, int64_t T, const double *rewards, const double *values,
                     const double *mask, double gamma, double lam, double *adv, double *ret);

/* OpenRLHF get_advantages_and_returns (TRL's PPO loop is the same once padding is zeroed):
 * values and rewards multiplied by the mask, then the plain reversed loop with
 * nextvalues = values[t + 1] (0 at the end); returns = adv + masked values. */
void as_ref_gae_openrlhf(int64_t B, int64_t T, const double *rewards, const double *values,
                         const double *mask, double gamma, double lam, double *adv, double *ret);

/* verl REINFORCE++ returns: running = r_t + gamma running, stored, then running *= mask_t. */
void as_ref_returns_reinforce_pp(int64_t B, int64_t T, const double *rewards, const double *mask,
                                 double gamma, double *ret);

/* verl REINFORCE++ with observation tokens: new = r_t + gamma running; returns_t = new * mask_t;
 * running = new where valid, unchanged where masked. */
void as_ref_returns_reinforce_pp_carry(int64_t B, int64_t T, const double *rewards, const double *mask,
                                       double gamma, double *ret);

/* OpenRLHF get_cumulative_returns: rewards multiplied by the mask, cumulative = r_t + gamma cum. */
void as_ref_returns_openrlhf(int64_t B, int64_t T, const double *rewards, const double *mask,
                             double gamma, double *ret);

/* verl ReMax: returns = flip(cumsum(flip(rewards * mask))), adv = returns - baseline[b] * mask.
 * adv may be NULL (no baseline). */
void as_ref_remax(int64_t B, int64_t T, const double *rewards, const double *mask,
                  const double *baseline, double *ret, double *adv);

/* verl masked_whiten over all n elements: masked_mean divides by (sum(mask) + 1e-8), the
 * variance is the masked mean of squared deviations times sum / (sum - 1), out = (x - mean) *
 * rsqrt(var + 1e-8), plus mean when shift_mean is 0. Returns -1 where verl raises (a mask sum of
 * 0 or 1), 0 otherwise. */
int as_ref_whiten_verl(int64_t n, const double *x, const double *mask, int shift_mean, double *out);

/* TRL's PPO whitening: masked mean and unbiased masked variance (plain sums over sum(mask)),
 * out = (x - mean) * rsqrt(var + 1e-8) (+ mean when shift_mean is 0), then 0 where the mask is
 * 0. Returns -1 where the unbiased variance is undefined (a mask sum of 0 or 1). */
int as_ref_whiten_trl(int64_t n, const double *x, const double *mask, int shift_mean, double *out);

/* OpenRLHF's advantage normalization: mean over the action tokens, biased variance,
 * rstd = rsqrt(clamp(var, min 1e-8)) (1 with no_std_norm), out = (x - mean) * rstd everywhere. */
void as_ref_whiten_openrlhf(int64_t n, const double *x, const double *mask, int no_std_norm,
                            double *out);

/* The general form rlk_masked_whiten documents (include/rlk.h), with its parameters; stats gets
 * {mean, var, N}. Undefined statistics give NaN as documented. */
typedef struct as_ref_whiten_params {
  double eps, count_eps;
  int eps_clamp, unbiased, shift_mean, normalize_std, masked_zero;
} as_ref_whiten_params;
void as_ref_whiten(int64_t n, const double *x, const double *mask, const as_ref_whiten_params *p,
                   double *out, double stats[3]);

#endif

/* kl_estimator.h - host form of templates/cuda/kl_estimator.cuh: the KL estimators of a
 * reference penalty, one definition for the policy loss (policy_loss.c) and token_kl (token_kl.c),
 * in RLK_P_DTYPE. On e = logp - ref_logp: ec = clamp(e, in_lo, in_hi), the value
 * clamp(f(ec), out_lo, out_hi), and its derivative in e: f'(ec) passed by both clamps (kl_gate),
 * or, straight-through, e (k2's derivative of the unclamped e). */
#ifndef RLK_KL_ESTIMATOR_H
#define RLK_KL_ESTIMATOR_H

#include <math.h>

#include "rlk_kl_estimator.h"

typedef RLK_P_DTYPE kl_t;

static inline kl_t kl_clamp(kl_t x, kl_t lo, kl_t hi) { return x < lo ? lo : (x > hi ? hi : x); }
/* A KL clamp's gradient factor: 1 inside, bg on a bound, 0 outside or NaN; an infinite bound is
 * no clamp (the trainer calls none there), so +-inf passes it, and NaN passes where neither side
 * clamps (torch.clamp masks NaN out; no clamp, no mask). */
static inline kl_t kl_gate(kl_t x, kl_t lo, kl_t hi, kl_t bg) {
  if (x > lo && x < hi) return 1;
  if (x == lo) return isinf(lo) ? (kl_t)1 : bg;
  if (x == hi) return isinf(hi) ? (kl_t)1 : bg;
  return isinf(lo) && isinf(hi) && lo < hi ? (kl_t)1 : (kl_t)0;
}

/* The estimate at e; *grad gets its derivative in e. */
static inline kl_t kl_estimate(long long est, int st, kl_t e, kl_t in_lo, kl_t in_hi, kl_t out_lo,
                               kl_t out_hi, kl_t bg, kl_t *grad) {
  const kl_t ec = kl_clamp(e, in_lo, in_hi);
  kl_t v, gv;
  if (est == RLK_KL_EST_K1) {
    v = ec;
    gv = 1;
  } else if (est == RLK_KL_EST_ABS) {
    v = ec < 0 ? -ec : ec;
    gv = ec > 0 ? (kl_t)1 : (ec < 0 ? (kl_t)-1 : (kl_t)0);
  } else if (est == RLK_KL_EST_K2) {
    v = (kl_t)0.5 * ec * ec;
    gv = ec;
  } else { /* k3 = exp(-e) + e - 1 = expm1(-e) + e, accurate near 0 */
    const kl_t em = _Generic(ec, float: expm1f, default: expm1)(-ec);
    v = em + ec;
    gv = -em;
  }
  if (st) {
    *grad = e;
  } else {
    const kl_t gg = kl_gate(e, in_lo, in_hi, bg) * kl_gate(v, out_lo, out_hi, bg);
    *grad = gg != 0 ? gg * gv : (kl_t)0;
  }
  return kl_clamp(v, out_lo, out_hi);
}

#endif

/* kl_estimator.cuh - the KL estimators of a reference penalty, one definition for the policy
 * loss's KL term (policy_loss.cuh) and the token_kl op (token_kl.cuh).
 *
 * On e = logp - ref_logp: ec = clamp(e, in_lo, in_hi), the value clamp(f(ec), out_lo, out_hi)
 * with f of rlk_kl_estimator (k1 e, abs |e|, k2 e^2 / 2, k3 exp(-e) + e - 1), and its
 * derivative in e: f'(ec) passed by both clamps (kl::gate), or, straight-through, e itself (k2's
 * derivative of the unclamped e). */
#ifndef RLK_KL_ESTIMATOR_CUH
#define RLK_KL_ESTIMATOR_CUH

#include "rlk_kl_estimator.h"
#include "token_loss.cuh"

namespace rlk {
namespace kl {

template <typename T> RLK_DEVICE T expm1_(T x);
/* e^x - 1 in f32: the Taylor series through x^8 where |x| <= 0.5 (error below 2e-8 relative, no
 * cancellation), expf(x) - 1 elsewhere (|e^x - 1| >= 0.39 there: no cancellation either). Fewer
 * instructions than expm1f, as accurate for the KL terms. */
template <> RLK_DEVICE float expm1_(float x) {
  const float p =
      x * (1.0f + x * (0.5f + x * (1.0f / 6 + x * (1.0f / 24 + x * (1.0f / 120 +
          x * (1.0f / 720 + x * (1.0f / 5040 + x * (1.0f / 40320))))))));
  return fabsf(x) <= 0.5f ? p : expf(x) - 1.0f;
}
template <> RLK_DEVICE double expm1_(double x) { return expm1(x); }

/* A KL clamp's gradient factor: tl::gate's (1 inside, bg on a bound, 0 outside or NaN), where an
 * infinite bound is no clamp (the trainer calls none there): +-inf passes it, and NaN passes where
 * neither side clamps (torch.clamp masks NaN out; no clamp, no mask). */
template <typename T> RLK_DEVICE T gate(T x, T lo, T hi, T bg) {
  if (x > lo && x < hi) return T(1);
  if (x == lo) return isinf(lo) ? T(1) : bg;
  if (x == hi) return isinf(hi) ? T(1) : bg;
  return isinf(lo) && isinf(hi) && lo < hi ? T(1) : T(0);
}

/* The estimate at e; *grad gets its derivative in e. */
template <int EST, bool ST, typename T>
RLK_DEVICE T estimate(T e, T in_lo, T in_hi, T out_lo, T out_hi, T bg, T *grad) {
  const T ec = tl::clampv(e, in_lo, in_hi);
  T v, gv;
  if (EST == RLK_KL_EST_K1) {
    v = ec;
    gv = T(1);
  } else if (EST == RLK_KL_EST_ABS) {
    v = ec < T(0) ? -ec : ec;
    gv = ec > T(0) ? T(1) : (ec < T(0) ? T(-1) : T(0));
  } else if (EST == RLK_KL_EST_K2) {
    v = T(0.5) * ec * ec;
    gv = ec;
  } else { /* k3 = exp(-e) + e - 1 = expm1(-e) + e, accurate near 0 */
    const T em = expm1_(-ec);
    v = em + ec;
    gv = -em;
  }
  if (ST) {
    *grad = e;
  } else {
    const T gg = gate(e, in_lo, in_hi, bg) * gate(v, out_lo, out_hi, bg);
    *grad = gg != T(0) ? gg * gv : T(0);
  }
  return tl::clampv(v, out_lo, out_hi);
}

} /* namespace kl */
} /* namespace rlk */

#endif /* RLK_KL_ESTIMATOR_CUH */

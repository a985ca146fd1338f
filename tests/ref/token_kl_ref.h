/* token_kl_ref.h - an fp64 reference for rlk_token_kl, written from the contract in
 * include/rlk.h, independent of the kernels: each estimator's formula and its derivative by
 * hand, clamps as torch's autograd treats them. */
#ifndef RLK_TOKEN_KL_REF_H
#define RLK_TOKEN_KL_REF_H

typedef struct tk_ref_settings {
  int estimator; /* rlk_kl_estimator */
  double in_lo, in_hi, out_lo, out_hi;
  int straight_through;
  double w_max;   /* the importance weight's bound */
  double bound_g; /* a clamp's gradient on its bound */
} tk_ref_settings;

/* The estimate at e = logp - ref_logp (given, so the caller decides its rounding); *dlogp gets
 * d kl / d logp, times w (the straight-through weight, 1 when none). */
double tk_ref_token(const tk_ref_settings *s, double e, double w, double *dlogp);

#endif

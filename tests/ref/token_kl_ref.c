/* token_kl_ref.c - see token_kl_ref.h. */
#include "ref/token_kl_ref.h"

#include <math.h>

/* d clamp(x, lo, hi) / dx as torch forms it (0 at NaN), where an infinite bound is no clamp at
 * all: it passes +-inf, and NaN when neither side clamps */
static double clamp_grad(double x, double lo, double hi, double bound_g) {
  const int lo_on = isfinite(lo), hi_on = isfinite(hi);
  if (isnan(x)) return lo_on || hi_on ? 0.0 : 1.0;
  if ((x == lo && lo_on) || (x == hi && hi_on)) return bound_g;
  return (!lo_on || x >= lo) && (!hi_on || x <= hi) ? 1.0 : 0.0;
}

/* torch.clamp's value: NaN stays NaN (fmin and fmax would drop it) */
static double clamp_value(double x, double lo, double hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

double tk_ref_token(const tk_ref_settings *s, double e, double w, double *dlogp) {
  const double ec = clamp_value(e, s->in_lo, s->in_hi);
  double f, df;
  switch (s->estimator) {
  case 0: /* k1 */
    f = ec;
    df = 1.0;
    break;
  case 1: /* abs: torch's gradient of |x| at 0 is 0 */
    f = fabs(ec);
    df = ec > 0 ? 1.0 : (ec < 0 ? -1.0 : 0.0);
    break;
  case 2: /* k2 */
    f = 0.5 * ec * ec;
    df = ec;
    break;
  default: /* k3: exp(-e) - 1 + e */
    f = expm1(-ec) + ec;
    df = 1.0 - exp(-ec);
    break;
  }
  const double v = clamp_value(f, s->out_lo, s->out_hi);
  if (s->straight_through)
    *dlogp = w * e;
  else { /* a clamp that stops the gradient stops it whole (no 0 * inf where f overflowed) */
    const double pass = clamp_grad(e, s->in_lo, s->in_hi, s->bound_g) * clamp_grad(f, s->out_lo, s->out_hi, s->bound_g);
    *dlogp = pass == 0 ? 0.0 : df * pass;
  }
  return v;
}

/* logprob_check.c - the log-prob forward's tolerance and comparison (logprob_check.h). */
#include "logprob_check.h"

#include <check.h>
#include <math.h>

#include "test_util.h"

double lp_fwd_tol(double want, double max_z, double lse, int64_t V) {
  const double scale = fabs(want) + (isfinite(max_z) ? fabs(max_z) : 0) + (isfinite(lse) ? fabs(lse) : 0);
  return 2e-5 + 4e-6 * scale + 4e-7 * sqrt((double)V);
}

void lp_check_value(const char *what, const char *name, int64_t i, float got, double want, double tol) {
  if (isnan(want)) {
    ck_assert_msg(isnan(got), "%s: %s[%lld] = %.9g, reference NaN", what, name, (long long)i, (double)got);
    return;
  }
  if (isinf(want)) {
    ck_assert_msg((double)got == want, "%s: %s[%lld] = %.9g, reference %g", what, name, (long long)i, (double)got,
                  want);
    return;
  }
  ck_assert_msg(fabs((double)got - want) <= tol, "%s: %s[%lld] = %.9g, reference %.12g (tol %.3g)", what, name,
                (long long)i, (double)got, want, tol);
}

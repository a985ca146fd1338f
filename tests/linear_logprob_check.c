/* linear_logprob_check.c - the fused-head suites' exact inputs and forward bounds
 * (linear_logprob_check.h). */
#include <check.h>
#include <math.h>

#include "linear_logprob_check.h"
#include "test_util.h"

double ll_grid_step(int64_t H, double scale) {
  ck_assert_msg(441 * H < (1 << 20), "H %lld: the grid's sums would not stay exact", (long long)H);
  return exp2(round(log2(scale / (sqrt((double)H) * 1.08 * 36.7))));
}
double ll_grid_h(uint64_t *rng) { return (double)((int)(rlk_test_rand_u64(rng) % 15u) - 7) / 4.0; }
double ll_grid_w(uint64_t *rng, double step) {
  return (double)((int)(rlk_test_rand_u64(rng) % 127u) - 63) * step;
}

double ll_fold_eps(int64_t V) {
  const int64_t records = (V + 255) / 256;
  return (double)(92 + 11 * ((records + 31) / 32 + 5) + 44) * LL_U;
}

ll_bound ll_fwd_bound(const lp_ref_row *r, double eps) {
  const double a = 16 * LL_U * (fabs(r->max_z) + fabs(r->lse) + fabs(r->logp) + fabs(r->entropy) + 1.0);
  const ll_bound b = {eps + a, eps + a, eps * (1.0 + 3.0 * fabs(r->entropy)) + a};
  return b;
}

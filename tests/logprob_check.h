/* logprob_check.h - how the log-prob suites hold a forward output (logp, lse, entropy) to the fp64
 * reference of tests/ref/logprob_ref.c: the tolerance its arithmetic allows and the comparison. */
#ifndef RLK_TEST_LOGPROB_CHECK_H
#define RLK_TEST_LOGPROB_CHECK_H

#include <stdint.h>

/* |got - want| allowed for a forward output of magnitude `want` in a row whose largest z is
 * max_z and lse is lse: fp32 rounding of the inputs' scale plus the summation over V terms. */
double lp_fwd_tol(double want, double max_z, double lse, int64_t V);

/* Compares element i of output `name` with the reference, NaN for NaN and infinities exactly;
 * `what` names the case in the failure message. */
void lp_check_value(const char *what, const char *name, int64_t i, float got, double want, double tol);

#endif

/* rlk_kl_estimator.h - the KL estimator, a template value of the ops with a KL term (token_kl's
 * "est"; policy_loss's "kl" is one past it, after none): k1 e, abs |e|, k2 e^2 / 2, k3
 * exp(-e) + e - 1 on e = logp - ref_logp, in rlk_kl_estimator order (include/rlk.h). */
#ifndef RLK_KL_ESTIMATOR_KINDS_H
#define RLK_KL_ESTIMATOR_KINDS_H

#include "rlk_params.h"

#define RLK_KL_ESTIMATORS(X)   \
  X(RLK_KL_EST_K1, "k1")       \
  X(RLK_KL_EST_ABS, "abs")     \
  X(RLK_KL_EST_K2, "k2")       \
  X(RLK_KL_EST_K3, "k3")
RLK_PARAMS_ENUM(RLK_KL_ESTIMATORS);

#endif

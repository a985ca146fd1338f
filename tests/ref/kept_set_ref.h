/* kept_set_ref.h - an fp64 reference for kept-set replay (the `threshold` of rlk_logprob,
 * rlk_linear_logprob and rlk_linear_policy_loss), written from include/rlk.h: a row's kept set is
 * its logits at or above its threshold and its label; the softmax, log-prob, lse and entropy are
 * over that set, and the gradients' p is 0 off it. */
#ifndef RLK_KEPT_SET_REF_H
#define RLK_KEPT_SET_REF_H

#include <stdint.h>

#include "logprob_ref.h"

/* kept[v] for a row's raw logits x[V] (as the kernel compares them: f32 values), label y (< 0:
 * none) and threshold thr: x_v >= thr or v == y; -inf and NaN keep every logit. Returns how many
 * are kept. */
int64_t kept_ref_set(const double *x, int64_t V, int64_t y, float thr, unsigned char *kept);

/* The forward of one row over its kept set (lp_ref_forward's outputs and rules). */
void kept_ref_forward(const double *x, const unsigned char *kept, int64_t V, double temperature, int64_t label,
                      int64_t ignore_index, lp_ref_row *out);

/* The backward of one row into grad[V] over its kept set, from the forward's lse and E_p'[z]
 * (lse - entropy) as given (the values the kernel reads): p' = exp(z - lse) on the kept set, 0
 * elsewhere; 0 for an ignored row. */
void kept_ref_backward(const double *x, const unsigned char *kept, int64_t V, double temperature, int64_t label,
                       int64_t ignore_index, double lse, double ez, double g_lp, double g_H, double *grad);

#endif

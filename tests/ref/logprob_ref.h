/* logprob_ref.h - an fp64 reference for rlk_logprob and rlk_logprob_backward, written from the
 * contract in include/rlk.h and shared/specs/ops.md section 1, independent of the kernels. */
#ifndef RLK_LOGPROB_REF_H
#define RLK_LOGPROB_REF_H

#include <stdint.h>

/* One row of the forward: z = x / T, lse = log sum exp z, logp = z_y - lse (0 when y is
 * ignore_index), entropy = lse - sum p z, ez = E_p[z] = sum p z. A label outside [0, V) that is
 * not ignore_index makes logp, lse, entropy and ez NaN and sets *bad (may be NULL). A row whose
 * logits are all -inf has lse -inf and NaN logp (unless ignored), entropy and ez. */
typedef struct lp_ref_row {
  double lse, logp, entropy, ez;
  double max_z; /* the largest z of the row (-inf if none is finite) */
} lp_ref_row;

void lp_ref_forward(const double *x, int64_t V, double temperature, int64_t label,
                    int64_t ignore_index, lp_ref_row *out, int *bad);

/* The backward of one row into grad[V]:
 *   grad_j = (g_lp (onehot(y)_j - p_j) - g_H p_j (z_j - E_p[z])) / T,
 * 0 for an ignored row, NaN for a bad label. Uses its own forward (not the op's lse). */
void lp_ref_backward(const double *x, int64_t V, double temperature, int64_t label,
                     int64_t ignore_index, double g_lp, double g_H, double *grad);

#endif

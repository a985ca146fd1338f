/* sample_ref.h - the distribution rlk_sample draws from, in fp64, from its documented semantics
 * (include/rlk.h): min-p and top-k keep upper sets of logit values, top-p then keeps the tokens
 * whose strictly larger kept neighbours weigh below p of the kept mass; ties stay together. */
#ifndef RLK_SAMPLE_REF_H
#define RLK_SAMPLE_REF_H

#include <stdint.h>

/* probs[V]: the probability of each token (0 for filtered-out ones) for logits x[V] (as stored),
 * temperature T > 0, top_k (0: off), top_p (1: off), min_p (0: off). Returns the number of kept
 * tokens, and in *margin how close the filters came to flipping, scaled so that 1e-4 is about
 * where fp32 rounding could flip a token in or out: 100 x the distance, relative to the kept mass,
 * of top-p's sums on either side of the cut from p Z, and the distance in log2 units of the
 * elements on either side of min-p's bound. A caller redraws cases below 1e-4. */
int64_t smp_ref_probs(const double *x, int64_t V, double T, int64_t top_k, double top_p, double min_p,
                      double *probs, double *margin);

/* The Philox4x32-10 draw rlk_sample uses for a row: (R1, R2) from its seed, offset and the row's
 * stream word (the row index with a scalar seed, 0 with per-row seeds). */
void smp_ref_draw(uint64_t seed, uint64_t offset, uint64_t stream, uint64_t *r1, uint64_t *r2);

/* Upper-tail quantile of chi-square with `df` degrees of freedom at about z standard deviations
 * (Wilson-Hilferty). */
double smp_ref_chi2_bound(double df, double z);

#endif

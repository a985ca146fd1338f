/* logprob_ref.c - fp64 reference for token log-probs, entropy and their gradient (see
 * logprob_ref.h). Straightforward two-pass math: the maximum, then the sums. */
#include "ref/logprob_ref.h"

#include <math.h>
#include <stddef.h>

void lp_ref_forward(const double *x, int64_t V, double temperature, int64_t label,
                    int64_t ignore_index, lp_ref_row *out, int *bad) {
  double m = -INFINITY;
  for (int64_t j = 0; j < V; j++) {
    const double z = x[j] / temperature;
    if (z > m) m = z;
  }
  out->max_z = m;
  if (bad) *bad = 0;
  if (label != ignore_index && (label < 0 || label >= V)) {
    out->lse = out->logp = out->entropy = out->ez = NAN;
    if (bad) *bad = 1;
    return;
  }
  double s = 0.0, sz = 0.0;
  int nan = 0;
  for (int64_t j = 0; j < V; j++) {
    const double z = x[j] / temperature;
    if (isnan(z)) nan = 1;
    if (z == -INFINITY) continue; /* exp(-inf) = 0: no contribution */
    const double e = exp(z - m);
    s += e;
    sz += e * (z - m);
  }
  if (nan || m == INFINITY) {
    out->lse = out->logp = out->entropy = out->ez = NAN;
    if (label == ignore_index) out->logp = 0.0;
    return;
  }
  if (m == -INFINITY) { /* every logit -inf */
    out->lse = -INFINITY;
    out->entropy = out->ez = NAN;
    out->logp = label == ignore_index ? 0.0 : NAN;
    return;
  }
  out->lse = m + log(s);
  out->ez = m + sz / s;
  out->entropy = out->lse - out->ez;
  out->logp = label == ignore_index ? 0.0 : x[label] / temperature - out->lse;
}

void lp_ref_backward(const double *x, int64_t V, double temperature, int64_t label,
                     int64_t ignore_index, double g_lp, double g_H, double *grad) {
  if (label == ignore_index) {
    for (int64_t j = 0; j < V; j++) grad[j] = 0.0;
    return;
  }
  lp_ref_row r;
  lp_ref_forward(x, V, temperature, label, ignore_index, &r, NULL);
  if (isnan(r.lse) || isnan(r.ez) || r.lse == -INFINITY) {
    for (int64_t j = 0; j < V; j++) grad[j] = NAN;
    return;
  }
  for (int64_t j = 0; j < V; j++) {
    const double z = x[j] / temperature;
    const double p = z == -INFINITY ? 0.0 : exp(z - r.lse);
    double g = -g_lp * p;
    if (p != 0.0) g -= g_H * p * (z - r.ez);
    if (j == label) g += g_lp;
    grad[j] = g / temperature;
  }
}

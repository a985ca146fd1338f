/* kept_set_ref.c - see kept_set_ref.h. */
#include "kept_set_ref.h"

#include <math.h>

int64_t kept_ref_set(const double *x, int64_t V, int64_t y, float thr, unsigned char *kept) {
  int64_t n = 0;
  for (int64_t v = 0; v < V; v++) {
    kept[v] = isnan(thr) || (float)x[v] >= thr || v == y;
    n += kept[v];
  }
  return n;
}

void kept_ref_forward(const double *x, const unsigned char *kept, int64_t V, double temperature, int64_t label,
                      int64_t ignore_index, lp_ref_row *out) {
  double m = -INFINITY;
  for (int64_t v = 0; v < V; v++)
    if (kept[v] && x[v] / temperature > m) m = x[v] / temperature;
  double s = 0.0, sz = 0.0;
  for (int64_t v = 0; v < V; v++)
    if (kept[v]) {
      const double z = x[v] / temperature, e = exp(z - m);
      s += e;
      sz += e * z;
    }
  out->max_z = m;
  out->lse = m + log(s);
  out->ez = sz / s;
  out->entropy = out->lse - out->ez;
  out->logp = label == ignore_index ? 0.0 : x[label] / temperature - out->lse;
}

void kept_ref_backward(const double *x, const unsigned char *kept, int64_t V, double temperature, int64_t label,
                       int64_t ignore_index, double lse, double ez, double g_lp, double g_H, double *grad) {
  for (int64_t v = 0; v < V; v++) {
    if (label == ignore_index) {
      grad[v] = 0.0;
      continue;
    }
    const double z = x[v] / temperature, p = kept[v] ? exp(z - lse) : 0.0;
    grad[v] = (g_lp * ((v == label ? 1.0 : 0.0) - p) - g_H * p * (z - ez)) / temperature;
  }
}

/* prefix_attention_ref.c - see prefix_attention_ref.h. Per head: S = scale Q K^T with the causal
 * mask, P = softmax rows, O = P V; backward dP = dO V^T, dS = P o (dP - rowsum(P o dP)),
 * dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO. */
#include "prefix_attention_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void pa_ref_causal(int64_t L, int Hq, int Hkv, int D, double scale, const double *q, const double *k,
                   const double *v, const double *dout, double *out, double *lse, double *dq, double *dk,
                   double *dv) {
  double *Pm = calloc((size_t)(L * L), sizeof *Pm);
  double *dS = calloc((size_t)(L * L), sizeof *dS);
  if (dout) {
    memset(dk, 0, sizeof *dk * (size_t)(L * Hkv * D));
    memset(dv, 0, sizeof *dv * (size_t)(L * Hkv * D));
  }
  const int ratio = Hq / Hkv;
  for (int h = 0; h < Hq; h++) {
    const int hk = h / ratio;
#define Q(i, d) q[((i) * Hq + h) * D + (d)]
#define K(j, d) k[((j) * Hkv + hk) * D + (d)]
#define V(j, d) v[((j) * Hkv + hk) * D + (d)]
#define DO(i, d) dout[((i) * Hq + h) * D + (d)]
    for (int64_t i = 0; i < L; i++) {
      double m = -INFINITY;
      for (int64_t j = 0; j <= i; j++) {
        double s = 0;
        for (int d = 0; d < D; d++) s += Q(i, d) * K(j, d);
        Pm[i * L + j] = s * scale;
        if (Pm[i * L + j] > m) m = Pm[i * L + j];
      }
      double sum = 0;
      for (int64_t j = 0; j <= i; j++) sum += exp(Pm[i * L + j] - m);
      for (int64_t j = 0; j <= i; j++) Pm[i * L + j] = exp(Pm[i * L + j] - m) / sum;
      lse[i * Hq + h] = m + log(sum);
      for (int d = 0; d < D; d++) {
        double o = 0;
        for (int64_t j = 0; j <= i; j++) o += Pm[i * L + j] * V(j, d);
        out[(i * Hq + h) * D + d] = o;
      }
    }
    if (!dout) continue;
    for (int64_t i = 0; i < L; i++) {
      double rs = 0;
      for (int64_t j = 0; j <= i; j++) {
        double dp = 0;
        for (int d = 0; d < D; d++) dp += DO(i, d) * V(j, d);
        dS[i * L + j] = dp;
        rs += Pm[i * L + j] * dp;
      }
      for (int64_t j = 0; j <= i; j++) dS[i * L + j] = Pm[i * L + j] * (dS[i * L + j] - rs);
    }
    for (int64_t i = 0; i < L; i++)
      for (int d = 0; d < D; d++) {
        double a = 0;
        for (int64_t j = 0; j <= i; j++) a += dS[i * L + j] * K(j, d);
        dq[(i * Hq + h) * D + d] = scale * a;
      }
    for (int64_t j = 0; j < L; j++)
      for (int d = 0; d < D; d++) {
        double a = 0, b = 0;
        for (int64_t i = j; i < L; i++) {
          a += dS[i * L + j] * Q(i, d);
          b += Pm[i * L + j] * DO(i, d);
        }
        dk[(j * Hkv + hk) * D + d] += scale * a;
        dv[(j * Hkv + hk) * D + d] += b;
      }
#undef Q
#undef K
#undef V
#undef DO
  }
  free(Pm);
  free(dS);
}

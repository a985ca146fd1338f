/* prefix_attention_ref.c - see prefix_attention_ref.h. Per head: S = scale Q K^T with the causal
 * mask, P = softmax rows, O = P V; backward dP = dO V^T, dS = P o (dP - rowsum(P o dP)),
 * dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
 *
 * The bounds, per row i (K = i + 1 keys) and key j, follow the kernels' arithmetic
 * (templates/cuda/prefix_attention*.cuh; the host's, templates/host/prefix_attention_*.c, is the
 * same with fp64 sums and neither P nor dS rounded):
 *   exponents: z = scale q . k within dot of scale sum |q k| (at most amax) and the f32 scale's
 *     2^-24 |z|; c = scale log2 e, z c, its difference with the running max or with the lse (also
 *     read as lse log2 e) round a few times, each u of |z|, the max (at most zmax, the row's
 *     largest |z|) or |lse|: e_i = dot amax + 2^-24 zmax + 8 u (2 zmax + |lse|) in natural-log
 *     units bounds every exponent's error;
 *   the forward's weights w_j = p~_j C_j / l~: p~_j's exponential (ex), the rescales C_j of what
 *     was summed before the running max moved (at most `tiles`: an exponential and a multiply
 *     each), l~'s sum of K positive terms (K u): rho_i = (tiles + 1) ex + tiles u + K u; the
 *     numerator and the sum each within e_i + rho_i in the exponent, so
 *     |w_j / p_j - 1| <= eta_i = expm1(2 (e_i + rho_i));
 *   out_d = sum_j round16(w_j) v_jd: (eta_i + r16 (1 + eta_i)) M + a16 (1 + eta_i) S with
 *     M = sum_j p_j |v_jd| and S the |v_jd| of the keys whose p~ may be subnormal in 16 bits
 *     (p_j < 2 min16); then the sum, 1 / l and the 16-bit store (pa_ref_bound);
 *   lse = (m + log2 l~) ln 2 = ln sum_j e^(z~_j) (1 + rho): e_i + rho_i, and log2, the addition,
 *     ln 2 and the product (4 u of |lse| + ln K + 1), stored in f32 (2^-24 |lse|);
 *   the backward's P~ = exp2(z~ c - lse~ log2 e) from the forward's lse: within
 *     etaP_i = expm1(e_i + b_lse_i + 2 ex) of P (a P below 2^-120 may flush to 0: all of it);
 *     dP = dO . v within edP = dot sum |dO v|; delta: dO . O~ of the forward's 16-bit O, where
 *     O~ - O = sum_j (w~_j - p_j) v_j + the rest of O's bound, so within sum_j |w~_j - p_j| |dP_ij|
 *     + sum_d |dO_d| rest_d and the f32 sum of D products (3 D u); or, on the host, sum_j P dP
 *     (etaP, edP and the sum of K terms): bD;
 *   dS~ = P~ (dP~ - delta~): etaP P G + (1 + etaP) P (edP + bD) + 2 u (1 + etaP) P (G + edP + bD),
 *     G = |dP - D|, rounded to 16 bits (r16 of its size; below min16 at most min(a16, its size));
 *     P likewise for dv;
 *   dq, dk, dv: the rounded dS or P times the other operand's |value| carried (e), the sum of the
 *     terms' sizes (m) for pa_ref_bound; in dq, delta's error is the row's, so it moves dq_d by
 *     bD |sum_j P~_ij k_jd|, not by the sum of bD P |k_jd|. */
#include "prefix_attention_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PA_U32 0x1p-24 /* the kernels' scale and lse are f32 */

double pa_ref_bound(const pa_ref_arith *ar, double e, double m, double ref, int64_t K) {
  /* an f32 sum of K terms on the tensor cores: each product, aligned to the largest of its k16
   * group and the accumulator and truncated, loses at most 2 u of a partial sum of |terms|, and
   * each group's addition 2 u more: 3 K u of the sum of |terms| (sequential sums: (K - 1) u) */
  double b = e + 3.0 * (double)K * ar->u * m;
  /* times scale (the kernel's f32 copy) or 1 / l: two roundings */
  b += ((1 + PA_U32) * (1 + ar->u) - 1) * (fabs(ref) + b);
  /* stored in 16 bits (through f32 on the host) */
  return b + ((1 + PA_U32) * (1 + ar->o16) - 1) * (fabs(ref) + b) + ar->ao16;
}

/* The 16-bit rounding of a value within [x - e, x + e] (x >= 0 its exact size, e its error so
 * far): half an ulp of its size, or below the normal range at most a16 and at most itself. */
static double round16(const pa_ref_arith *ar, double x, double e) {
  if (ar->r16 == 0) return 0;
  double r = ar->r16 * (x + e);
  if (x - e < ar->min16) r += fmin(ar->a16, x + e);
  return r;
}

/* |w~_j - p_j| for a weight p of a row whose weights are within eta (relative) before their
 * 16-bit rounding, where p~ may be subnormal only if p < 2 min16 (p~ >= w~ / 2 >= p / 2). */
static double weight_err(const pa_ref_arith *ar, double eta, double p) {
  double e = (eta + ar->r16 * (1 + eta)) * p;
  if (ar->r16 > 0 && p < 2 * ar->min16) e += (1 + eta) * fmin(ar->a16, p);
  return e;
}

void pa_ref_causal(int64_t L, int Hq, int Hkv, int D, double scale, const double *q, const double *k,
                   const double *v, const double *dout, double *out, double *lse, double *dq, double *dk,
                   double *dv, const pa_ref_arith *ar, pa_ref_bounds *b) {
  if (!b) ar = NULL;
  double *Pm = calloc((size_t)(L * L), sizeof *Pm);
  double *dS = calloc((size_t)(L * L), sizeof *dS);
  double *acc = calloc((size_t)(6 * D), sizeof *acc); /* one row's sums over d */
  /* with ar: per (row, key) dS's bound (rounded), the same less delta's part, P's bound (rounded);
   * per row e_i, eta_i, etaP_i and delta's bound; per out element of the head the part of its
   * bound its weights' errors make */
  double *bS = NULL, *bSq = NULL, *bP = NULL, *erow = NULL, *trow = NULL, *prow = NULL, *drow = NULL, *oe = NULL;
  if (ar) {
    bS = calloc((size_t)(3 * L * L + 4 * L + L * D), sizeof *bS);
    bSq = bS + L * L, bP = bSq + L * L, erow = bP + L * L, trow = erow + L, prow = trow + L, drow = prow + L;
    oe = drow + L;
  }
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
      double m = -INFINITY, zmax = 0, amax = 0;
      for (int64_t j = 0; j <= i; j++) {
        double s = 0, a = 0;
        for (int d = 0; d < D; d++) s += Q(i, d) * K(j, d), a += fabs(Q(i, d) * K(j, d));
        Pm[i * L + j] = s * scale;
        if (Pm[i * L + j] > m) m = Pm[i * L + j];
        zmax = fmax(zmax, fabs(Pm[i * L + j]));
        amax = fmax(amax, a * scale);
      }
      double sum = 0;
      for (int64_t j = 0; j <= i; j++) sum += exp(Pm[i * L + j] - m);
      for (int64_t j = 0; j <= i; j++) Pm[i * L + j] = exp(Pm[i * L + j] - m) / sum;
      const double ls = m + log(sum);
      lse[i * Hq + h] = ls;
      if (ar) {
        const double Kd = (double)(i + 1), u = ar->u;
        const double rho = (double)(ar->tiles + 1) * ar->ex + (double)ar->tiles * u + Kd * u;
        erow[i] = ar->dot * amax + PA_U32 * zmax + 8 * u * (2 * zmax + fabs(ls));
        trow[i] = expm1(2 * (erow[i] + rho));
        b->lse[i * Hq + h] = erow[i] + rho + 4 * u * (fabs(ls) + log(Kd) + 1) + PA_U32 * fabs(ls);
      }
      double *o = acc, *e = o + D, *M = e + D; /* M: the size of the terms summed */
      memset(acc, 0, sizeof *acc * (size_t)(3 * D));
      for (int64_t j = 0; j <= i; j++) {
        const double p = Pm[i * L + j], w = ar ? weight_err(ar, trow[i], p) : 0.0;
        for (int d = 0; d < D; d++) {
          o[d] += p * V(j, d);
          e[d] += w * fabs(V(j, d));
          M[d] += p * fabs(V(j, d));
        }
      }
      for (int d = 0; d < D; d++) {
        out[(i * Hq + h) * D + d] = o[d];
        if (!ar) continue;
        oe[i * D + d] = e[d];
        b->out[(i * Hq + h) * D + d] = pa_ref_bound(ar, e[d], M[d] + e[d], o[d], i + 1);
      }
    }
    if (!dout) continue;
    for (int64_t i = 0; i < L; i++) {
      double rs = 0, pdp = 0, pb = 0;
      for (int64_t j = 0; j <= i; j++) {
        double dp = 0, a = 0;
        for (int d = 0; d < D; d++) dp += DO(i, d) * V(j, d), a += fabs(DO(i, d) * V(j, d));
        dS[i * L + j] = dp;
        rs += Pm[i * L + j] * dp;
        pdp += Pm[i * L + j] * fabs(dp);
        pb += Pm[i * L + j] * a;
        if (ar) bP[i * L + j] = ar->dot * a; /* (until P's bound: dP's error) */
      }
      if (ar) {
        const double u = ar->u;
        prow[i] = expm1(erow[i] + b->lse[i * Hq + h] + 2 * ar->ex);
        if (ar->delta_from_out) {
          /* O~ - O = sum_j (w~_j - p_j) v_j + the rest of its bound, so dO . O~ - dO . O is
           * within sum_j W |dP_ij| + sum_d |dO_d| rest_d; and the f32 sum of D products */
          double carried = 0, size = 0;
          for (int64_t j = 0; j <= i; j++) carried += weight_err(ar, trow[i], Pm[i * L + j]) * fabs(dS[i * L + j]);
          for (int d = 0; d < D; d++) {
            const double bo = b->out[(i * Hq + h) * D + d];
            carried += fabs(DO(i, d)) * (bo - oe[i * D + d]);
            size += fabs(DO(i, d)) * (fabs(out[(i * Hq + h) * D + d]) + bo);
          }
          drow[i] = carried + 3.0 * D * u * size;
        } else {
          drow[i] = (prow[i] + 3.0 * (double)(i + 1) * u * (1 + prow[i])) * pdp + (1 + prow[i]) * ar->dot * pb;
        }
      }
      for (int64_t j = 0; j <= i; j++) {
        const double p = Pm[i * L + j], G = fabs(dS[i * L + j] - rs);
        dS[i * L + j] = p * (dS[i * L + j] - rs);
        if (!ar) continue;
        const double etaP = prow[i], bD = drow[i], flush = p < 0x1p-120 ? p : 0.0, edp = bP[i * L + j];
        /* P~'s error times G, dP's and delta's errors times P~, the subtraction's and product's
         * roundings */
        const double ed = (1 + etaP) * p * bD;
        const double eq = p * (etaP * G + (1 + etaP) * edp + 2 * ar->u * (1 + etaP) * (G + edp + bD)) + flush * G;
        const double r = round16(ar, fabs(dS[i * L + j]), eq + ed);
        bS[i * L + j] = eq + ed + r;
        bSq[i * L + j] = eq + r;
        const double ep = etaP * p + flush;
        bP[i * L + j] = ep + round16(ar, p, ep);
      }
    }
    for (int64_t i = 0; i < L; i++) {
      double *a = acc, *e = a + D, *m = e + D, *pk = m + D, *pe = pk + D;
      memset(acc, 0, sizeof *acc * (size_t)(5 * D));
      for (int64_t j = 0; j <= i; j++) {
        const double g = dS[i * L + j], p = Pm[i * L + j];
        const double eq = ar ? bSq[i * L + j] : 0, sz = ar ? fabs(g) + bS[i * L + j] : 0;
        const double pp = ar ? prow[i] * p + (p < 0x1p-120 ? p : 0.0) : 0;
        for (int d = 0; d < D; d++) {
          const double kv = K(j, d);
          a[d] += g * kv;
          e[d] += eq * fabs(kv);
          m[d] += sz * fabs(kv);
          pk[d] += p * kv;
          pe[d] += pp * fabs(kv);
        }
      }
      for (int d = 0; d < D; d++) {
        dq[(i * Hq + h) * D + d] = scale * a[d];
        if (!ar) continue;
        /* delta's error is the row's: it moves dq by bD |sum_j P~_ij k_jd| */
        b->dq_e[(i * Hq + h) * D + d] += scale * (e[d] + drow[i] * (fabs(pk[d]) + pe[d]));
        b->dq_m[(i * Hq + h) * D + d] += scale * m[d];
      }
    }
    for (int64_t j = 0; j < L; j++) {
      double *a = acc, *c = a + D, *ek = c + D, *mk = ek + D, *ev = mk + D, *mv = ev + D;
      memset(acc, 0, sizeof *acc * (size_t)(6 * D));
      for (int64_t i = j; i < L; i++) {
        const double g = dS[i * L + j], p = Pm[i * L + j];
        const double es = ar ? bS[i * L + j] : 0, ep = ar ? bP[i * L + j] : 0;
        for (int d = 0; d < D; d++) {
          const double qv = Q(i, d), ov = DO(i, d);
          a[d] += g * qv;
          c[d] += p * ov;
          ek[d] += es * fabs(qv);
          mk[d] += (fabs(g) + es) * fabs(qv);
          ev[d] += ep * fabs(ov);
          mv[d] += (p + ep) * fabs(ov);
        }
      }
      for (int d = 0; d < D; d++) {
        const int64_t at = (j * Hkv + hk) * D + d;
        dk[at] += scale * a[d];
        dv[at] += c[d];
        if (!ar) continue;
        b->dk_e[at] += scale * ek[d];
        b->dk_m[at] += scale * mk[d];
        b->dv_e[at] += ev[d];
        b->dv_m[at] += mv[d];
      }
    }
#undef Q
#undef K
#undef V
#undef DO
  }
  free(Pm);
  free(dS);
  free(acc);
  free(bS);
}

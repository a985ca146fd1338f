/* linear_divergence_ref.c - see linear_divergence_ref.h. */
#include "linear_divergence_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One row's logits and log-probabilities of both heads. */
typedef struct ld_ref_logits {
  double *zs, *zt, *as, *at; /* logits, log-probs */
  double lse_s, lse_t;
} ld_ref_logits;

/* log-softmax; a row of only -inf logits has lse -inf (log of an empty sum) and NaN log-probs */
static double ref_log_softmax(const double *z, int64_t V, double *a) {
  double m = -INFINITY, s = 0.0;
  for (int64_t v = 0; v < V; v++) m = z[v] > m ? z[v] : m;
  for (int64_t v = 0; m > -INFINITY && v < V; v++) s += exp(z[v] - m);
  const double lse = m > -INFINITY ? m + log(s) : -INFINITY;
  for (int64_t v = 0; v < V; v++) a[v] = z[v] - lse;
  return lse;
}

static int ref_logits(const ld_ref_problem *p, int64_t i, ld_ref_logits *L) {
  const int64_t V = p->V;
  L->zs = malloc((size_t)V * 4 * sizeof(double));
  if (!L->zs) return -1;
  L->zt = L->zs + V, L->as = L->zt + V, L->at = L->as + V;
  for (int64_t v = 0; v < V; v++) {
    double s = 0.0, t = 0.0;
    for (int64_t c = 0; c < p->Hs; c++) s += p->hs[i * p->Hs + c] * p->ws[v * p->Hs + c];
    for (int64_t c = 0; c < p->Ht; c++) t += p->ht[i * p->Ht + c] * p->wt[v * p->Ht + c];
    L->zs[v] = s / p->Ts;
    L->zt[v] = t / p->Tt;
  }
  L->lse_s = ref_log_softmax(L->zs, V, L->as);
  L->lse_t = ref_log_softmax(L->zt, V, L->at);
  return 0;
}

/* The top-k set as flags: the k columns first in (z_t descending, column ascending) among those of
 * nonzero probability (z_t > -inf): fewer where fewer are finite. Returns the last member's
 * column, -1 for an empty set. */
static int64_t ref_topk(const double *zt, int64_t V, int k, char *in) {
  memset(in, 0, (size_t)V);
  int64_t last = -1;
  for (int j = 0; j < k; j++) {
    int64_t best = -1;
    for (int64_t v = 0; v < V; v++)
      if (!in[v] && zt[v] > -INFINITY && (best < 0 || zt[v] > zt[best])) best = v; /* the lowest column on a tie */
    if (best < 0) break;
    in[best] = 1;
    last = best;
  }
  return last;
}

/* |x| where x is finite, else 0: a -inf logit (probability 0) is exact on every path and enters no
 * bound */
static double ref_fin(double x) { return isfinite(x) ? fabs(x) : 0.0; }

/* log m = log((1 - beta) p_s + beta p_t) */
static double ref_log_mix(double as, double at, double beta) {
  return log((1.0 - beta) * exp(as) + beta * exp(at));
}

void ld_ref_forward_row(const ld_ref_problem *p, int64_t i, ld_ref_row *out) {
  memset(out, 0, sizeof *out);
  ld_ref_logits L;
  if (ref_logits(p, i, &L)) {
    out->D = NAN;
    return;
  }
  const int64_t V = p->V;
  out->lse_s = L.lse_s;
  out->lse_t = L.lse_t;
  for (int64_t v = 0; v < V; v++) {
    double as = 0.0, at = 0.0;
    for (int64_t c = 0; c < p->Hs; c++) as += fabs(p->hs[i * p->Hs + c] * p->ws[v * p->Hs + c]);
    for (int64_t c = 0; c < p->Ht; c++) at += fabs(p->ht[i * p->Ht + c] * p->wt[v * p->Ht + c]);
    as = isfinite(L.zs[v]) ? as / p->Ts : 0.0, at = isfinite(L.zt[v]) ? at / p->Tt : 0.0;
    out->abs_dot = as > out->abs_dot ? as : out->abs_dot;
    out->abs_dot = at > out->abs_dot ? at : out->abs_dot;
    out->entropy -= exp(L.as[v]) * L.as[v];
    const double m = ref_fin(L.zs[v]) > ref_fin(L.zt[v]) ? ref_fin(L.zs[v]) : ref_fin(L.zt[v]);
    out->max_abs_z = m > out->max_abs_z ? m : out->max_abs_z;
  }
  out->last = -1;
  if (p->top_k > 0) {
    char *in = malloc((size_t)(V > 0 ? V : 1));
    if (!in) {
      out->D = NAN;
      free(L.zs);
      return;
    }
    out->last = ref_topk(L.zt, V, p->top_k, in);
    out->topk_gap = INFINITY;
    if (out->last < 0) { /* no finite teacher logit: no distribution, rlk.h's empty set */
      out->D = out->a1 = NAN;
      out->a2 = INFINITY;
    } else {
      out->a2 = L.zt[out->last];
      for (int64_t v = 0; v < V; v++)
        if (!in[v] && out->a2 - L.zt[v] < out->topk_gap) out->topk_gap = out->a2 - L.zt[v];
      for (int64_t v = 0; v < V; v++)
        if (in[v]) {
          out->a1 += exp(L.at[v]);
          out->D += exp(L.at[v]) * (L.at[v] - L.as[v]);
        }
    }
    free(in);
  } else if (p->mode == 2) {
    for (int64_t v = 0; v < V; v++) {
      const double lm = ref_log_mix(L.as[v], L.at[v], p->beta);
      out->a1 += exp(L.as[v]) * (L.as[v] - lm);
      out->a2 += exp(L.at[v]) * (L.at[v] - lm);
    }
    out->D = p->beta * out->a2 + (1.0 - p->beta) * out->a1;
  } else {
    for (int64_t v = 0; v < V; v++) {
      if (p->mode == 0 && L.zt[v] == -INFINITY && L.lse_t > -INFINITY) continue; /* p_t = 0: p_t log p_t = 0 */
      out->D += p->mode == 0 ? exp(L.at[v]) * (L.at[v] - L.as[v]) : exp(L.as[v]) * (L.as[v] - L.at[v]);
    }
  }
  if (p->ignored && p->ignored[i]) out->D = out->a1 = out->a2 = 0.0;
  free(L.zs);
}

double ld_ref_loss(const ld_ref_problem *p, const double *g) {
  double s = 0.0;
  for (int64_t i = 0; i < p->N; i++) {
    ld_ref_row r;
    ld_ref_forward_row(p, i, &r);
    s += g[i] * r.D;
  }
  return s;
}

void ld_ref_backward(const ld_ref_problem *p, const double *g, double *dhs, double *dws, double *dht, double *dwt,
                     double delta, double dz_rel, double *bh_s, double *bw_s, double *bh_t, double *bw_t) {
  const int64_t N = p->N, V = p->V, Hs = p->Hs, Ht = p->Ht;
  if (dhs) memset(dhs, 0, (size_t)(N * Hs) * sizeof(double));
  if (dws) memset(dws, 0, (size_t)(V * Hs) * sizeof(double));
  if (dht) memset(dht, 0, (size_t)(N * Ht) * sizeof(double));
  if (dwt) memset(dwt, 0, (size_t)(V * Ht) * sizeof(double));
  double *ps_ = malloc((size_t)V * 4 * sizeof(double));
  char *in = malloc((size_t)(V > 0 ? V : 1));
  if (!ps_ || !in) {
    free(ps_), free(in);
    return;
  }
  double *das = ps_, *dat = ps_ + V, *dzs = ps_ + 2 * V, *dzt = ps_ + 3 * V;
  const double lb = p->mode == 2 ? fabs(log(p->beta)) + fabs(log(1.0 - p->beta)) : 0.0;
  for (int64_t i = 0; i < N; i++) {
    if (p->ignored && p->ignored[i]) continue;
    ld_ref_logits L;
    if (ref_logits(p, i, &L)) continue;
    ld_ref_row r;
    ld_ref_forward_row(p, i, &r);
    if (p->top_k > 0) ref_topk(L.zt, V, p->top_k, in);
    /* dD / d(log p) per column, from the definitions */
    for (int64_t v = 0; v < V; v++) {
      const double as = L.as[v], at = L.at[v], ps = exp(as), pt = exp(at);
      if (p->top_k > 0) {
        das[v] = in[v] ? -pt : 0.0;
        dat[v] = in[v] ? pt * (at - as) + pt : 0.0;
      } else if (p->mode == 0) {
        das[v] = -pt;
        dat[v] = pt * (at - as) + pt;
      } else if (p->mode == 1) {
        das[v] = ps * (as - at) + ps;
        dat[v] = -ps;
      } else {
        const double b = p->beta, lm = ref_log_mix(as, at, b), m = exp(lm), mix = b * pt + (1.0 - b) * ps;
        das[v] = (1.0 - b) * (ps * (as - lm) + ps) - mix * (1.0 - b) * ps / m;
        dat[v] = b * (pt * (at - lm) + pt) - mix * b * pt / m;
      }
    }
    /* through log-softmax: dz_v = d_v - p_v sum_u d_u */
    double ss = 0.0, st = 0.0;
    for (int64_t v = 0; v < V; v++) ss += das[v], st += dat[v];
    for (int64_t v = 0; v < V; v++) {
      dzs[v] = g[i] * (das[v] - exp(L.as[v]) * ss) / p->Ts;
      dzt[v] = g[i] * (dat[v] - exp(L.at[v]) * st) / p->Tt;
    }
    const double Lr = 1.0 + fabs(r.lse_s) + fabs(r.lse_t) + fabs(r.D) + fabs(r.a1) + fabs(r.a2) + lb;
    for (int64_t v = 0; v < V; v++) {
      /* a column of teacher probability 0 (z_t -inf): its log p_t enters no dz */
      const double e = 2.1 * delta * (exp(L.as[v]) + exp(L.at[v])) * Lr *
                       (2.0 + ref_fin(L.as[v]) + ref_fin(L.at[v]) + Lr) * fabs(g[i]);
      const double es = e / p->Ts + dz_rel * fabs(dzs[v]), et = e / p->Tt + dz_rel * fabs(dzt[v]);
      for (int64_t c = 0; c < Hs; c++) {
        if (dhs) dhs[i * Hs + c] += dzs[v] * p->ws[v * Hs + c];
        if (dws) dws[v * Hs + c] += dzs[v] * p->hs[i * Hs + c];
        if (bh_s) bh_s[i * Hs + c] += es * fabs(p->ws[v * Hs + c]);
        if (bw_s) bw_s[v * Hs + c] += es * fabs(p->hs[i * Hs + c]);
      }
      for (int64_t c = 0; c < Ht; c++) {
        if (dht) dht[i * Ht + c] += dzt[v] * p->wt[v * Ht + c];
        if (dwt) dwt[v * Ht + c] += dzt[v] * p->ht[i * Ht + c];
        if (bh_t) bh_t[i * Ht + c] += et * fabs(p->wt[v * Ht + c]);
        if (bw_t) bw_t[v * Ht + c] += et * fabs(p->ht[i * Ht + c]);
      }
    }
    free(L.zs);
  }
  free(ps_), free(in);
}

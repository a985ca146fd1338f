/* policy_loss_ref.c - fp64 references for the policy and value losses (see the header).
 *
 * Gradients: every per-token quantity is carried as a value and its derivative with respect to
 * one variable (the token's logp, or a sequence's log-ratio), combined by the rules torch's
 * autograd applies: clamp passes the derivative on its closed range, maximum/minimum split it
 * on a tie, detach drops it. Aggregations are linear, so d loss / d x = sum of each term's
 * aggregation weight times the term's derivative. */
#include "ref/policy_loss_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- values with a derivative ------------------------------------------------------------ */

typedef struct dd {
  double v, g;
} dd;

static dd dd_c(double v) { return (dd){v, 0.0}; }
static dd dd_var(double v) { return (dd){v, 1.0}; }
static dd dd_add(dd a, dd b) { return (dd){a.v + b.v, a.g + b.g}; }
static dd dd_sub(dd a, dd b) { return (dd){a.v - b.v, a.g - b.g}; }
static dd dd_mul(dd a, dd b) { return (dd){a.v * b.v, a.g * b.v + a.v * b.g}; }
static dd dd_neg(dd a) { return (dd){-a.v, -a.g}; }
static dd dd_exp(dd a) {
  const double e = exp(a.v);
  return (dd){e, e * a.g};
}
static dd dd_detach(dd a) { return (dd){a.v, 0.0}; }
static dd dd_clamp(dd a, double lo, double hi) {
  const double v = a.v < lo ? lo : (a.v > hi ? hi : a.v);
  return (dd){v, (a.v >= lo && a.v <= hi) ? a.g : 0.0};
}
/* a clamp whose gradient on a bound is bg (1: closed range, 0: open, 0.5: split) */
static dd dd_clamp_bg(dd a, double lo, double hi, double bg) {
  const double v = a.v < lo ? lo : (a.v > hi ? hi : a.v);
  const double f = (a.v > lo && a.v < hi) ? 1.0 : ((a.v == lo || a.v == hi) ? bg : 0.0);
  return (dd){v, f != 0.0 ? f * a.g : 0.0};
}
/* the KL's clamps: an infinite bound (off) is no clamp, which passes +-inf and NaN */
static dd dd_kl_clamp(dd a, double bound, double bg) {
  return isinf(bound) ? a : dd_clamp_bg(a, -bound, bound, bg);
}
static dd dd_maximum(dd a, dd b) {
  if (a.v > b.v) return a;
  if (b.v > a.v) return b;
  return (dd){a.v, 0.5 * (a.g + b.g)};
}
static dd dd_minimum(dd a, dd b) {
  if (a.v < b.v) return a;
  if (b.v < a.v) return b;
  return (dd){a.v, 0.5 * (a.g + b.g)};
}
/* sigmoid; its derivative s (1 - s) with 1 - s computed as sigmoid(-a), accurate where s is
 * close to 1 */
static dd dd_sigmoid(dd a) {
  const double s = 1.0 / (1.0 + exp(-a.v)), sn = 1.0 / (1.0 + exp(a.v));
  return (dd){s, s * sn * a.g};
}
static dd dd_abs(dd a) {
  const double sg = a.v > 0 ? 1.0 : (a.v < 0 ? -1.0 : 0.0);
  return (dd){fabs(a.v), sg * a.g};
}

static double adv_at(const plref_batch *b, int64_t i) {
  return b->adv_seq ? b->adv[i / b->T] : b->adv[i];
}

/* Token i in a loss loop: zeroes its gradients (a masked token's stay 0); 0 when it is masked
 * out, else 1 with its mask value, its advantage and its lp as the derivative variable. */
static int token_at(const plref_batch *b, plref_out *o, int64_t i, double *m, double *A, dd *lp) {
  o->grad_lp[i] = 0;
  if (o->grad_ent) o->grad_ent[i] = 0;
  *m = b->mask[i];
  if (*m == 0) return 0;
  *A = adv_at(b, i);
  *lp = dd_var(b->lp[i]);
  return 1;
}

/* sum of the mask over row r */
static double row_n(const plref_batch *b, int64_t r) {
  double n = 0;
  for (int64_t t = 0; t < b->T; t++) n += b->mask[r * b->T + t];
  return n;
}

/* ---- the rlk contract ----------------------------------------------------------------------- */

/* The KL estimator of rlk on e = lp - ref: value and derivative in e. */
static dd rlk_kl(const plref_params *p, dd e) {
  const dd ec = dd_kl_clamp(e, p->kl_in, p->bound_g);
  dd f;
  switch (p->kl) {
  case 0: /* k1 */
    f = ec;
    break;
  case 1: /* abs */
    f = dd_abs(ec);
    break;
  case 2: /* k2 */
    f = dd_mul(dd_c(0.5), dd_mul(ec, ec));
    break;
  default: { /* k3 = exp(-e) + e - 1, formed as expm1(-e) + e: exp(-e) - 1 + e loses all but a
              * few digits of a value near e^2 / 2 to cancellation where e is small */
    const double em = expm1(-ec.v);
    f = (dd){em + ec.v, -em * ec.g};
    break;
  }
  }
  f = dd_kl_clamp(f, p->kl_out, p->bound_g);
  if (p->kl_st) f.g = e.g * e.v; /* k2's gradient: d(e^2/2) = e */
  return f;
}

int plref_rlk(const plref_batch *b, const plref_params *p, plref_out *o) {
  const int64_t B = b->B, T = b->T;
  double K;
  switch (p->agg) {
  case 0: K = p->loss_scale / p->token_norm; break;
  case 1: K = p->loss_scale; break;
  case 2:
  case 3: K = p->loss_scale / p->seq_norm; break;
  case 4: K = p->loss_scale / (p->seq_norm * p->norm_scale); break;
  default: return -1;
  }
  const double lo = 1.0 - p->clip_low, hi = 1.0 + p->clip_high;
  double S_pg = 0, S_kl = 0, S_ent = 0, n_all = 0, clip = 0, dual = 0, low = 0, high = 0,
         approx = 0, klm = 0, entm = 0, rmax = -INFINITY, rmin = INFINITY;
  double A_pg = 0, A_kl = 0, A_ent = 0, A_n = 0, A_approx = 0, A_klm = 0, A_entm = 0;
  double approx_raw = 0, A_raw = 0, seq_low = 0, seq_high = 0, rows = 0;
  for (int64_t r = 0; r < B; r++) {
    const double n = row_n(b, r);
    const double rowfac = p->agg == 3 ? (n > 0 ? 1.0 / n : 0.0) : 1.0;
    /* GSPO: the sequence ratio, the same for every token; its derivative in each token's lp
     * is taken straight through (d s_t / d lp_t = s), or through the mean (d s / d lp_t =
     * s m_t / n: every token gets the row's summed derivative, row_g) */
    double s = 1.0, s_gate = 1.0, row_g = 0.0, row_g_abs = 0.0;
    if (p->mode == 1) {
      double sd = 0;
      for (int64_t t = 0; t < T; t++) {
        const int64_t i = r * T + t;
        if (b->mask[i] != 0) sd += b->mask[i] * (b->lp[i] - b->old[i]);
      }
      const double x = n > 0 ? sd / n : 0.0;
      const dd xs = dd_clamp_bg(dd_var(x), p->lr_min, p->lr_max, p->bound_g);
      s = exp(xs.v);
      s_gate = xs.g;
      if (b->adv_seq) {
        const double A = b->adv[r];
        if (s < lo && A < 0) seq_low += 1;
        if (s > hi && A > 0) seq_high += 1;
        rows += 1;
      }
      if (p->seq_grad) {
        /* sum_j w_j d l_j / d s, by the same rules as the tokens below */
        double sum = 0, sum_abs = 0;
        for (int64_t t = 0; t < T; t++) {
          const int64_t i = r * T + t;
          if (b->mask[i] == 0) continue;
          const double A = adv_at(b, i);
          const dd sv = dd_var(s);
          dd l = dd_maximum(dd_mul(dd_c(-A), sv),
                            dd_mul(dd_c(-A), dd_clamp_bg(sv, lo, hi, p->bound_g)));
          if (A < 0 && p->dual_clip > 1) l = dd_minimum(l, dd_c(-A * p->dual_clip));
          sum += b->mask[i] * rowfac * l.g * (b->isw ? b->isw[i] : 1.0);
          sum_abs += fabs(b->mask[i] * rowfac * l.g * (b->isw ? b->isw[i] : 1.0));
        }
        row_g = n > 0 ? s * s_gate * sum / n : 0.0;
        /* the row's terms may cancel: rounding is relative to their magnitudes */
        row_g_abs = n > 0 ? fabs(s * s_gate) * sum_abs / n : 0.0;
      }
    }
    for (int64_t t = 0; t < T; t++) {
      const int64_t i = r * T + t;
      if (o->grad_abs) o->grad_abs[i] = 0;
      double m, A;
      dd lp;
      if (!token_at(b, o, i, &m, &A, &lp)) continue;
      const dd lr = dd_clamp_bg(dd_sub(lp, dd_c(b->old[i])), p->lr_min, p->lr_max, p->bound_g);
      dd l;
      double ratio, l_g_abs = -1; /* |d l / d lp| for the tolerance when not |l.g| */
      int is_clip = 0, is_dual = 0;
      if (p->mode == 0 || p->mode == 1) {
        const dd rr = p->mode == 1 ? (dd){s, s * s_gate} : dd_exp(lr);
        ratio = rr.v;
        const dd l1 = dd_mul(dd_c(-A), rr);
        const dd l2 = dd_mul(dd_c(-A), dd_clamp_bg(rr, lo, hi, p->bound_g));
        l = dd_maximum(l1, l2);
        is_clip = l2.v > l1.v;
        if (A < 0 && p->dual_clip > 1) {
          const dd l3 = dd_c(-A * p->dual_clip);
          is_dual = l.v > l3.v;
          l = dd_minimum(l, l3);
        }
      } else if (p->mode == 2) {
        const dd rr = dd_exp(lr);
        ratio = rr.v;
        const dd w = dd_detach(dd_clamp(rr, lo, hi));
        l = dd_mul(dd_mul(dd_neg(w), dd_c(A)), lp);
        is_clip = ratio < lo || ratio > hi;
      } else if (p->mode == 5) {
        /* GMPO: the sequence's term -Abar exp(mean clipped d), differentiated in this token */
        double sd = 0, sa = 0, sa_abs = 0;
        dd mine = dd_c(0);
        for (int64_t u = 0; u < T; u++) {
          const int64_t k = r * T + u;
          if (b->mask[k] == 0) continue;
          const double Ak = adv_at(b, k);
          const dd dk = u == t ? dd_sub(lp, dd_c(b->old[k])) : dd_c(b->lp[k] - b->old[k]);
          const double sg = Ak > 0 ? 1.0 : (Ak < 0 ? -1.0 : 0.0);
          const dd dck = dd_clamp_bg(dk, -p->clip_low, p->clip_high, p->bound_g);
          dd mn = dd_minimum(dd_mul(dd_c(sg), dk), dd_mul(dd_c(sg), dck));
          mn = dd_mul(dd_c(sg), mn);
          if (u == t) mine = mn;
          sd += b->mask[k] * mn.v;
          sa += b->mask[k] * Ak;
          sa_abs += fabs(b->mask[k] * Ak);
        }
        const dd sr = dd_exp((dd){sd / n, b->mask[i] * mine.g / n});
        ratio = sr.v;
        l = dd_mul(dd_c(-sa / n), sr);
        /* the aggregation weighs the sequence's term once per token (W = n rowfac): the
         * derivative of the whole sum is carried by each token's own share */
        l.g = l.g * n / b->mask[i];
        /* the mean advantage's terms may cancel: rounding is relative to their magnitudes */
        l_g_abs = sa_abs / n * fabs(sr.g) * n / fabs(b->mask[i]);
        const double di = b->lp[i] - b->old[i];
        const int cl = di < -p->clip_low || di > p->clip_high;
        is_clip = cl && A > 0;
        is_dual = cl && A < 0;
      } else if (p->mode == 3) {
        const dd rr = dd_exp(lr);
        ratio = rr.v;
        const double tau = A > 0 ? p->tau_pos : p->tau_neg;
        const dd gate = dd_mul(dd_sigmoid(dd_mul(dd_c(tau), dd_sub(rr, dd_c(1.0)))), dd_c(4.0 / tau));
        l = dd_mul(dd_neg(gate), dd_c(A));
      } else {
        ratio = exp(lr.v);
        l = dd_mul(dd_c(-A), lp);
      }
      if (b->isw) l = dd_mul(l, dd_c(b->isw[i]));
      dd kl = dd_c(0);
      if (b->ref) kl = rlk_kl(p, dd_sub(lp, dd_c(b->ref[i])));
      const double ent = b->ent ? b->ent[i] : 0.0;
      const double w = m * rowfac;
      S_pg += w * l.v;
      S_kl += w * kl.v;
      S_ent += w * ent;
      n_all += m;
      if (is_clip) clip += m;
      if (is_dual) dual += m;
      if (p->mode <= 2) {
        if (ratio < lo && A < 0) low += m;
        if (ratio > hi && A > 0) high += m;
      }
      approx += m * -lr.v;
      approx_raw += m * -(b->lp[i] - b->old[i]);
      A_raw += fabs(m * (b->lp[i] - b->old[i]));
      klm += m * kl.v;
      entm += m * ent;
      A_pg += fabs(w * l.v);
      A_kl += fabs(w * kl.v);
      A_ent += fabs(w * ent);
      A_n += fabs(m);
      A_approx += fabs(m * lr.v);
      A_klm += fabs(m * kl.v);
      A_entm += fabs(m * ent);
      if (ratio > rmax) rmax = ratio;
      if (ratio < rmin) rmin = ratio;
      const double gpg = p->mode == 1 && p->seq_grad ? m * row_g : w * l.g;
      o->grad_lp[i] = K * (gpg + w * p->kl_coef * kl.g);
      const double gpg_abs = p->mode == 1 && p->seq_grad ? fabs(m) * row_g_abs
                             : l_g_abs >= 0                 ? fabs(w) * l_g_abs
                                                            : fabs(gpg);
      if (o->grad_abs) o->grad_abs[i] = fabs(K) * (gpg_abs + fabs(w * p->kl_coef * kl.g));
      if (o->grad_ent) o->grad_ent[i] = -p->ent_coef * K * w;
    }
  }
  o->loss = K * S_pg + p->kl_coef * K * S_kl - p->ent_coef * K * S_ent;
  const double inv = n_all != 0 ? 1.0 / n_all : 0.0;
  memset(o->metrics, 0, sizeof o->metrics);
  o->metrics[0] = clip * inv;
  o->metrics[1] = dual * inv;
  o->metrics[2] = low * inv;
  o->metrics[3] = high * inv;
  o->metrics[4] = approx * inv;
  o->metrics[5] = klm * inv;
  o->metrics[6] = entm * inv;
  o->metrics[7] = n_all != 0 ? rmax : 0.0;
  o->metrics[8] = n_all != 0 ? rmin : 0.0;
  o->metrics[9] = K * S_pg;
  o->metrics[10] = K * S_kl;
  o->metrics[11] = K * S_ent;
  o->metrics[12] = n_all;
  o->metrics[13] = approx_raw * inv;
  o->metrics[14] = rows != 0 ? seq_low / rows : low * inv;
  o->metrics[15] = rows != 0 ? seq_high / rows : high * inv;
  o->loss_abs = fabs(K) * (A_pg + fabs(p->kl_coef) * A_kl + fabs(p->ent_coef) * A_ent);
  const double ainv = n_all != 0 ? 1.0 / fabs(n_all) : 0.0;
  for (int k = 0; k < 4; k++) o->metrics_abs[k] = A_n * ainv;
  o->metrics_abs[4] = A_approx * ainv;
  o->metrics_abs[5] = A_klm * ainv;
  o->metrics_abs[6] = A_entm * ainv;
  o->metrics_abs[7] = fabs(o->metrics[7]);
  o->metrics_abs[8] = fabs(o->metrics[8]);
  o->metrics_abs[9] = fabs(K) * A_pg;
  o->metrics_abs[10] = fabs(K) * A_kl;
  o->metrics_abs[11] = fabs(K) * A_ent;
  o->metrics_abs[12] = A_n;
  o->metrics_abs[13] = A_raw * ainv;
  o->metrics_abs[14] = o->metrics_abs[15] = 1.0;
  return 0;
}

/* ---- verl ---------------------------------------------------------------------------------- */

/* agg_loss's weight of element i (it is linear in the loss matrix). */
static int verl_agg_weights(const plref_batch *b, const char *mode, double dp, double bnt,
                            double gbs, double lsf, double *wt) {
  const int64_t B = b->B, T = b->T;
  for (int64_t r = 0; r < B; r++) {
    const double n = row_n(b, r);
    for (int64_t t = 0; t < T; t++) {
      const int64_t i = r * T + t;
      const double m = b->mask[i];
      if (!strcmp(mode, "token-mean"))
        wt[i] = m / bnt * dp;
      else if (!strcmp(mode, "token-sum"))
        wt[i] = m * dp;
      else if (!strcmp(mode, "seq-mean-token-sum"))
        wt[i] = (n > 0 ? 1.0 : 0.0) * m / gbs * dp;
      else if (!strcmp(mode, "seq-mean-token-sum-norm"))
        wt[i] = (n > 0 ? 1.0 : 0.0) * m / gbs * dp / lsf;
      else if (!strcmp(mode, "seq-mean-token-mean"))
        wt[i] = (n > 0 ? 1.0 : 0.0) * m / (n + 1e-8) / gbs * dp;
      else
        return -1;
    }
  }
  return 0;
}

/* kl_penalty: the per-token estimator as a function of lp (its derivative in lp). */
static dd verl_kl(const char *type, dd lp, double ref) {
  const size_t len = strlen(type);
  if (len > 1 && type[len - 1] == '+') {
    char base[32];
    if (len - 1 >= sizeof base) return dd_c(NAN);
    memcpy(base, type, len - 1);
    base[len - 1] = '\0';
    const dd fwd = verl_kl(base, lp, ref);
    const dd d = dd_sub(lp, dd_c(ref));
    const dd k2 = dd_mul(dd_c(0.5), dd_mul(d, d));
    /* backward_score - backward_score.detach() + forward_score.detach() */
    return dd_add(dd_sub(k2, dd_detach(k2)), dd_detach(fwd));
  }
  if (!strcmp(type, "kl") || !strcmp(type, "k1")) return dd_sub(lp, dd_c(ref));
  if (!strcmp(type, "abs")) return dd_abs(dd_sub(lp, dd_c(ref)));
  if (!strcmp(type, "mse") || !strcmp(type, "k2")) {
    const dd d = dd_sub(lp, dd_c(ref));
    return dd_mul(dd_c(0.5), dd_mul(d, d));
  }
  if (!strcmp(type, "low_var_kl") || !strcmp(type, "k3")) {
    const dd kl = dd_clamp(dd_sub(dd_c(ref), lp), -20.0, 20.0);
    const dd ratio = dd_exp(kl);
    const dd kld = dd_sub(dd_sub(ratio, kl), dd_c(1.0));
    return dd_clamp(kld, -10.0, 10.0);
  }
  return dd_c(NAN);
}

int plref_verl(const plref_batch *b, const plref_verl_cfg *c, plref_out *o) {
  const int64_t B = b->B, T = b->T, N = B * T;
  double *wpg = malloc((size_t)N * sizeof *wpg), *wcfg = malloc((size_t)N * sizeof *wcfg);
  if (!wpg || !wcfg) {
    free(wpg);
    free(wcfg);
    return -1;
  }
  const int forced = !strcmp(c->loss_mode, "gspo") || !strcmp(c->loss_mode, "sapo");
  const char *pg_mode = forced ? "seq-mean-token-mean" : c->loss_agg_mode;
  int rc = verl_agg_weights(b, pg_mode, c->dp_size, c->batch_num_tokens, c->global_batch_size,
                            c->loss_scale_factor, wpg);
  if (!rc)
    rc = verl_agg_weights(b, c->loss_agg_mode, c->dp_size, c->batch_num_tokens,
                          c->global_batch_size, c->loss_scale_factor, wcfg);
  if (rc) {
    free(wpg);
    free(wcfg);
    return -1;
  }
  const double lo = 1.0 - c->clip_ratio_low, hi = 1.0 + c->clip_ratio_high;
  double loss = 0, msum = 0, clipfrac = 0, lower = 0, ppo_kl = 0;
  for (int64_t r = 0; r < B; r++) {
    /* gspo: the sequence's mean log-ratio (seq_lengths clamped at 1) */
    double seq = 0;
    if (!strcmp(c->loss_mode, "gspo")) {
      double sum = 0, n = 0;
      for (int64_t t = 0; t < T; t++) {
        const int64_t i = r * T + t;
        if (b->mask[i] != 0) sum += (b->lp[i] - b->old[i]) * b->mask[i];
        n += b->mask[i];
      }
      seq = sum / (n < 1 ? 1 : n);
    }
    for (int64_t t = 0; t < T; t++) {
      const int64_t i = r * T + t;
      double m, A;
      dd lp;
      if (!token_at(b, o, i, &m, &A, &lp)) continue; /* masked tokens carry weight 0 in every term */
      dd pg;
      if (!strcmp(c->loss_mode, "vanilla")) {
        const dd neg_kl = dd_clamp(dd_sub(lp, dd_c(b->old[i])), -20.0, 20.0);
        const dd ratio = dd_exp(neg_kl);
        ppo_kl += m * -neg_kl.v;
        const dd l1 = dd_mul(dd_c(-A), ratio);
        const dd l2 = dd_mul(dd_c(-A), dd_clamp(ratio, lo, hi));
        const dd c1 = dd_maximum(l1, l2);
        if (l2.v > l1.v) clipfrac += m;
        const dd l3 = dd_c(-A * c->clip_ratio_c);
        const dd c2 = dd_minimum(l3, c1);
        if (c1.v > l3.v && A < 0) lower += m;
        pg = A < 0 ? c2 : c1;
      } else if (!strcmp(c->loss_mode, "gspo")) {
        const dd neg_kl = dd_sub(lp, dd_c(b->old[i]));
        ppo_kl += m * -neg_kl.v;
        dd lsr = dd_add(dd_sub(lp, dd_detach(lp)), dd_c(seq));
        lsr = dd_clamp(lsr, -INFINITY, 10.0);
        const dd s = dd_exp(lsr);
        const dd l1 = dd_mul(dd_c(-A), s);
        const dd l2 = dd_mul(dd_c(-A), dd_clamp(s, lo, hi));
        pg = dd_maximum(l1, l2);
        if (l2.v > l1.v) clipfrac += m;
      } else if (!strcmp(c->loss_mode, "cispo")) {
        const dd neg_kl = dd_clamp(dd_sub(lp, dd_c(b->old[i])), -20.0, 20.0);
        ppo_kl += m * -neg_kl.v;
        const dd ratio = dd_exp(neg_kl);
        const dd w = dd_detach(dd_clamp(ratio, lo, hi));
        pg = dd_mul(dd_mul(dd_neg(dd_c(A)), w), lp);
      } else if (!strcmp(c->loss_mode, "sapo")) {
        const dd neg_kl = dd_clamp(dd_sub(lp, dd_c(b->old[i])), -20.0, 20.0);
        ppo_kl += m * -neg_kl.v;
        const dd ratio = dd_exp(neg_kl);
        const double tau = A > 0 ? c->tau_pos : c->tau_neg;
        const dd gate =
            dd_mul(dd_mul(dd_sigmoid(dd_mul(dd_c(tau), dd_sub(ratio, dd_c(1.0)))), dd_c(4.0)), dd_c(1.0 / tau));
        pg = dd_mul(dd_neg(gate), dd_c(A));
      } else if (!strcmp(c->loss_mode, "gpg")) {
        pg = dd_mul(dd_neg(lp), dd_c(A));
      } else {
        free(wpg);
        free(wcfg);
        return -1;
      }
      if (b->isw) pg = dd_mul(pg, dd_c(b->isw[i]));
      loss += wpg[i] * pg.v;
      double g = wpg[i] * pg.g;
      if (c->use_kl_loss && b->ref) {
        const dd kld = verl_kl(c->kl_loss_type, lp, b->ref[i]);
        loss += c->kl_loss_coef * wcfg[i] * kld.v;
        g += c->kl_loss_coef * wcfg[i] * kld.g;
      }
      if (b->ent && c->entropy_coeff != 0) {
        loss -= c->entropy_coeff * wcfg[i] * b->ent[i];
        if (o->grad_ent) o->grad_ent[i] = -c->entropy_coeff * wcfg[i];
      }
      o->grad_lp[i] = g;
      msum += m;
    }
  }
  o->loss = loss;
  memset(o->metrics, 0, sizeof o->metrics);
  /* verl_F.masked_mean: sum / (sum(mask) + 1e-8) */
  o->metrics[0] = clipfrac / (msum + 1e-8);
  o->metrics[1] = lower / (msum + 1e-8);
  o->metrics[4] = ppo_kl / (msum + 1e-8);
  o->metrics[13] = o->metrics[4]; /* gspo reports the unclamped log-ratio */
  free(wpg);
  free(wcfg);
  return 0;
}

/* ---- TRL ------------------------------------------------------------------------------------- */

int plref_trl(const plref_batch *b, const plref_trl_cfg *c, plref_out *o) {
  const int64_t B = b->B, T = b->T;
  const char *lt = c->loss_type;
  const int cispo = !strcmp(lt, "cispo"), sapo = !strcmp(lt, "sapo");
  /* the aggregation: "grpo"/"sapo" per-sequence means, "bnpo" local token mean, "dr_grpo"
   * B * max_completion_length, "dapo"/"cispo" num_items_in_batch / num_processes */
  double msum_all = 0;
  for (int64_t i = 0; i < B * T; i++) msum_all += b->mask[i];
  double low = 0, high = 0, region = 0, loss = 0;
  for (int64_t r = 0; r < B; r++) {
    const double n = row_n(b, r);
    double rowk; /* the aggregation weight of a token of this row, over its mask value */
    if (!strcmp(lt, "grpo") || sapo)
      rowk = 1.0 / (n < 1 ? 1 : n) / (double)B / c->gradient_accumulation_steps;
    else if (!strcmp(lt, "bnpo"))
      rowk = 1.0 / (msum_all < 1 ? 1 : msum_all) / c->gradient_accumulation_steps;
    else if (!strcmp(lt, "dr_grpo"))
      rowk = 1.0 / ((double)B * c->max_completion_length) / c->gradient_accumulation_steps;
    else if (!strcmp(lt, "dapo") || cispo)
      rowk = 1.0 / (c->num_items_in_batch / c->num_processes);
    else
      return -1;
    /* sequence level: x = masked mean of the log-ratio; every token's loss depends on it */
    double xseq = 0, nclamp = n < 1 ? 1 : n;
    if (c->sequence_level) {
      double s = 0;
      for (int64_t t = 0; t < T; t++) {
        const int64_t i = r * T + t;
        if (b->mask[i] != 0) s += (b->lp[i] - b->old[i]) * b->mask[i];
      }
      xseq = s / nclamp;
    }
    double G = 0; /* d loss / d xseq */
    for (int64_t t = 0; t < T; t++) {
      const int64_t i = r * T + t;
      double m, A;
      dd lp;
      if (!token_at(b, o, i, &m, &A, &lp)) continue;
      /* the derivative variable: the token's lp (token level) or the sequence's x */
      const dd lw = c->sequence_level ? dd_var(xseq) : dd_sub(lp, dd_c(b->old[i]));
      const dd coef_1 = dd_exp(lw);
      dd ptl;
      if (cispo) {
        const dd w = dd_detach(dd_clamp(coef_1, -INFINITY, c->epsilon_high));
        ptl = dd_mul(dd_mul(dd_neg(w), dd_c(A)), lp);
      } else if (sapo) {
        const double tau = A > 0 ? c->sapo_temperature_pos : c->sapo_temperature_neg;
        const dd gate = dd_mul(dd_sigmoid(dd_mul(dd_c(tau), dd_sub(coef_1, dd_c(1.0)))), dd_c(4.0 / tau));
        ptl = dd_neg(dd_mul(gate, dd_c(A)));
      } else {
        const dd coef_2 = dd_clamp(coef_1, 1.0 - c->epsilon_low, 1.0 + c->epsilon_high);
        ptl = dd_neg(dd_minimum(dd_mul(coef_1, dd_c(A)), dd_mul(coef_2, dd_c(A))));
      }
      if (!cispo && !sapo) {
        const int is_low = coef_1.v < 1.0 - c->epsilon_low && A < 0;
        const int is_high = coef_1.v > 1.0 + c->epsilon_high && A > 0;
        if (is_low) low += m;
        if (is_high) high += m;
        if (is_low || is_high) region += m;
      }
      double g_lp = 0; /* direct derivative in lp */
      if (c->sequence_level && !cispo)
        G += rowk * m * ptl.g;
      else
        g_lp += rowk * m * ptl.g;
      double val = ptl.v;
      if (c->beta != 0 && b->ref) {
        const dd d = dd_sub(dd_c(b->ref[i]), lp);
        const dd kl = dd_sub(dd_sub(dd_exp(d), d), dd_c(1.0));
        val += c->beta * kl.v;
        g_lp += rowk * m * c->beta * kl.g;
      }
      loss += rowk * m * val;
      o->grad_lp[i] = g_lp;
    }
    if (c->sequence_level && !cispo)
      for (int64_t t = 0; t < T; t++) {
        const int64_t i = r * T + t;
        if (b->mask[i] != 0) o->grad_lp[i] += G * b->mask[i] / nclamp;
      }
  }
  o->loss = loss;
  memset(o->metrics, 0, sizeof o->metrics);
  const double inv = msum_all != 0 ? 1.0 / msum_all : 0.0;
  o->metrics[0] = region * inv;
  o->metrics[2] = low * inv;
  o->metrics[3] = high * inv;
  return 0;
}

/* ---- OpenRLHF ---------------------------------------------------------------------------------- */

static dd openrlhf_kl(const char *est, dd lp, double base) {
  dd lr = dd_sub(lp, dd_c(base));
  if (!strcmp(est, "k2")) {
    lr = dd_mul(dd_mul(lr, lr), dd_c(0.5));
  } else if (!strcmp(est, "k3")) {
    lr = dd_neg(lr);
    lr = dd_add(dd_sub(dd_exp(lr), dd_c(1.0)), dd_neg(lr));
  } else if (strcmp(est, "k1") != 0) {
    return dd_c(NAN);
  }
  return dd_clamp(lr, -10.0, 10.0);
}

int plref_openrlhf(const plref_batch *b, const plref_openrlhf_cfg *c, plref_out *o) {
  const int64_t B = b->B, T = b->T;
  if (strcmp(c->policy_loss_type, "ppo") != 0) return -1;
  double loss = 0;
  for (int64_t r = 0; r < B; r++) {
    const double n = row_n(b, r);
    /* masked_mean(x, mask, dim=None) over the global tokens, or masked_mean(dim=-1).mean() */
    const double rowk = c->token_level_loss ? 1.0 / c->global_tokens : 1.0 / n / (double)B;
    for (int64_t t = 0; t < T; t++) {
      const int64_t i = r * T + t;
      double m, A;
      dd lp;
      if (!token_at(b, o, i, &m, &A, &lp)) continue;
      const dd ratio = dd_exp(dd_clamp(dd_sub(lp, dd_c(b->old[i])), -20.0, 20.0));
      const dd surr1 = dd_mul(ratio, dd_c(A));
      const dd surr2 = dd_mul(dd_clamp(ratio, 1.0 - c->clip_eps_low, 1.0 + c->clip_eps_high), dd_c(A));
      dd l;
      if (!(c->dual_clip > 1)) {
        l = dd_neg(dd_minimum(surr1, surr2));
      } else {
        const dd clip1 = dd_minimum(surr1, surr2);
        const dd clip2 = dd_maximum(clip1, dd_c(c->dual_clip * A));
        l = dd_neg(A < 0 ? clip2 : clip1);
      }
      if (b->isw) l = dd_mul(l, dd_c(b->isw[i]));
      double val = l.v, g = l.g;
      if (c->use_kl_loss && b->ref) {
        const dd kl = openrlhf_kl(c->kl_estimator, lp, b->ref[i]);
        val += c->kl_coef * kl.v;
        g += c->kl_coef * kl.g;
      }
      if (b->ent && c->entropy_loss_coef != 0) {
        val -= c->entropy_loss_coef * b->ent[i];
        if (o->grad_ent) o->grad_ent[i] = -c->entropy_loss_coef * rowk * m;
      }
      loss += rowk * m * val;
      o->grad_lp[i] = rowk * m * g;
    }
  }
  o->loss = loss;
  memset(o->metrics, 0, sizeof o->metrics);
  return 0;
}

/* ---- value loss -------------------------------------------------------------------------------- */

int vlref_rlk(const vlref_batch *b, double clip, int agg, double token_norm, double seq_norm,
              double norm_scale, double loss_scale, vlref_out *o) {
  double K;
  switch (agg) {
  case 0: K = loss_scale / token_norm; break;
  case 1: K = loss_scale; break;
  case 2:
  case 3: K = loss_scale / seq_norm; break;
  case 4: K = loss_scale / (seq_norm * norm_scale); break;
  default: return -1;
  }
  double S = 0, n_all = 0, clipn = 0, vs = 0, err = 0;
  for (int64_t r = 0; r < b->B; r++) {
    double n = 0;
    for (int64_t t = 0; t < b->T; t++) n += b->mask[r * b->T + t];
    const double rowfac = agg == 3 ? (n > 0 ? 1.0 / n : 0.0) : 1.0;
    for (int64_t t = 0; t < b->T; t++) {
      const int64_t i = r * b->T + t;
      const double m = b->mask[i];
      o->grad_v[i] = 0;
      if (m == 0) continue;
      const dd v = dd_var(b->v[i]);
      const dd vc = dd_clamp(v, b->old[i] - clip, b->old[i] + clip);
      const dd e1 = dd_sub(v, dd_c(b->ret[i])), e2 = dd_sub(vc, dd_c(b->ret[i]));
      const dd a = dd_mul(e1, e1), c2 = dd_mul(e2, e2);
      const dd l = dd_mul(dd_c(0.5), dd_maximum(a, c2));
      const double w = m * rowfac;
      S += w * l.v;
      n_all += m;
      if (c2.v > a.v) clipn += m;
      vs += m * v.v;
      err += m * a.v;
      o->grad_v[i] = K * w * l.g;
    }
  }
  o->loss = K * S;
  const double inv = n_all != 0 ? 1.0 / n_all : 0.0;
  o->metrics[0] = clipn * inv;
  o->metrics[1] = vs * inv;
  o->metrics[2] = err * inv;
  o->metrics[3] = n_all;
  return 0;
}

int vlref_verl(const vlref_batch *b, double cliprange_value, const char *loss_agg_mode,
               double dp_size, double batch_num_tokens, double global_batch_size,
               double loss_scale_factor, vlref_out *o) {
  const int64_t N = b->B * b->T;
  double *wt = malloc((size_t)N * sizeof *wt);
  if (!wt) return -1;
  plref_batch pb;
  memset(&pb, 0, sizeof pb);
  pb.B = b->B;
  pb.T = b->T;
  pb.mask = b->mask;
  if (verl_agg_weights(&pb, loss_agg_mode, dp_size, batch_num_tokens, global_batch_size,
                       loss_scale_factor, wt)) {
    free(wt);
    return -1;
  }
  double loss = 0, clipn = 0, msum = 0;
  for (int64_t i = 0; i < N; i++) {
    o->grad_v[i] = 0;
    if (b->mask[i] == 0) continue;
    const dd v = dd_var(b->v[i]);
    const dd vclip = dd_clamp(v, b->old[i] - cliprange_value, b->old[i] + cliprange_value);
    const dd l1 = dd_mul(dd_sub(v, dd_c(b->ret[i])), dd_sub(v, dd_c(b->ret[i])));
    const dd l2 = dd_mul(dd_sub(vclip, dd_c(b->ret[i])), dd_sub(vclip, dd_c(b->ret[i])));
    const dd cl = dd_maximum(l1, l2);
    if (l2.v > l1.v) clipn += b->mask[i];
    msum += b->mask[i];
    loss += 0.5 * wt[i] * cl.v;
    o->grad_v[i] = 0.5 * wt[i] * cl.g;
  }
  o->loss = loss;
  memset(o->metrics, 0, sizeof o->metrics);
  o->metrics[0] = clipn / (msum + 1e-8);
  free(wt);
  return 0;
}

int vlref_openrlhf(const vlref_batch *b, double clip_eps, vlref_out *o) {
  const int64_t N = b->B * b->T;
  double msum = 0;
  for (int64_t i = 0; i < N; i++) msum += b->mask[i];
  double loss = 0;
  for (int64_t i = 0; i < N; i++) {
    o->grad_v[i] = 0;
    if (b->mask[i] == 0) continue;
    const dd v = dd_var(b->v[i]);
    const dd vclip = dd_add(dd_c(b->old[i]), dd_clamp(dd_sub(v, dd_c(b->old[i])), -clip_eps, clip_eps));
    const dd surr1 = dd_mul(dd_sub(vclip, dd_c(b->ret[i])), dd_sub(vclip, dd_c(b->ret[i])));
    const dd surr2 = dd_mul(dd_sub(v, dd_c(b->ret[i])), dd_sub(v, dd_c(b->ret[i])));
    const dd l = dd_maximum(surr1, surr2);
    loss += b->mask[i] * l.v / msum;
    o->grad_v[i] = 0.5 * b->mask[i] * l.g / msum;
  }
  o->loss = 0.5 * loss;
  memset(o->metrics, 0, sizeof o->metrics);
  return 0;
}

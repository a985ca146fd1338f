/* linear_divergence_fwd.c - host form of rlk_linear_divergence's forward, the fp64 reference
 * path: per row, both heads' logits z = (h . w_v) / T as fp64 dot products over the row's columns,
 * then lse, the entropy and the divergence from their definitions (two passes over the row's
 * logits, which the host keeps: no single-pass form is needed here), rounded to f32 once. The
 * shard form writes rlk.h's vocab-parallel record instead. Parameters: RLK_P_SDT, RLK_P_TDT (RLK_DT_F16,
 * RLK_DT_BF16), RLK_P_LABELS (LD_LAB_*), RLK_P_MODE (LD_FKL, LD_RKL, LD_JSD, or LD_TOPK: forward KL
 * over the teacher's top k). */
#include "linear_divergence_host.h"
#include "linear_divergence_params.h"


/* log sum_v e^z_v; -inf when every z is -inf (no term: the GPU's combine's), not -inf - -inf */
static double ld_lse(const double *z, rlk_i64 V, double *max_out) {
  double m = -INFINITY;
  for (rlk_i64 v = 0; v < V; v++) m = z[v] > m ? z[v] : m;
  *max_out = m;
  if (m == -INFINITY) return m;
  double s = 0.0;
  for (rlk_i64 v = 0; v < V; v++) s += exp(z[v] - m);
  *max_out = m;
  return m + log(s);
}

RLK_HOST_KERNEL rlk_linear_divergence_fwd_host(void **args) {
  const ld_fwd_host_args *p_ = (const ld_fwd_host_args *)args[0];
  const rlk_i64 N = p_->N, V = p_->V, Hs = p_->Hs, Ht = p_->Ht;
  const double Ts = (double)p_->s_temperature, Tt = (double)p_->t_temperature, beta = p_->beta;
  const rlk_i64 k = p_->top_k;
  float *records = p_->records;
  double *zs = p_->scratch, *zt = p_->scratch + V;
  for (rlk_i64 i = 0; i < N; i++) {
    const uint16_t *hs = (const uint16_t *)p_->s_hidden + i * p_->s_h_stride;
    const uint16_t *ht = (const uint16_t *)p_->t_hidden + i * p_->t_h_stride;
    for (rlk_i64 v = 0; v < V; v++) {
      zs[v] = rlk_half_dot(hs, (const uint16_t *)p_->s_weight + v * p_->s_w_stride, Hs, RLK_P_SDT) / Ts;
      zt[v] = rlk_half_dot(ht, (const uint16_t *)p_->t_weight + v * p_->t_w_stride, Ht, RLK_P_TDT) / Tt;
    }
    double ms, mt;
    const double ls = ld_lse(zs, V, &ms), lt = ld_lse(zt, V, &mt);
    if (records) {
      /* the shard's record: sums relative to the shard's own maxima */
      double ss = 0, us = 0, st = 0, gt = 0, gs = 0;
      for (rlk_i64 v = 0; v < V; v++) {
        const double es = exp(zs[v] - ms);
        ss += es;
        us += es * (zs[v] - ms);
        if (zt[v] != -INFINITY) { /* p_t 0 adds 0 (not -inf - -inf, nor 0 times -inf) */
          const double et = exp(zt[v] - mt);
          st += et;
          gt += et * (zt[v] - zs[v]);
        }
        gs += es * (zs[v] - zt[v]);
      }
      float *r = records + 8 * i;
      r[0] = (float)ms, r[1] = (float)ss, r[2] = (float)us, r[3] = (float)mt;
      r[4] = (float)st, r[5] = (float)gt, r[6] = (float)gs, r[7] = 0.0f;
      if (p_->zeros) p_->zeros[i] = 0.0f;
      continue;
    }
    double ez = 0.0; /* sum p_s z_s */
    for (rlk_i64 v = 0; v < V; v++) ez += exp(zs[v] - ls) * zs[v];
    double D = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    if (!ld_ignored(p_->labels, p_->label_stride, i, p_->ignore_index)) {
      if (RLK_P_MODE == LD_FKL || RLK_P_MODE == LD_RKL) {
        for (rlk_i64 v = 0; v < V; v++) {
          const double lps = zs[v] - ls, lpt = zt[v] - lt;
          /* p_t 0 adds 0, not 0 times -inf (a row with no teacher distribution stays NaN) */
          if (RLK_P_MODE == LD_FKL && zt[v] == -INFINITY && lt != -INFINITY) continue;
          D += RLK_P_MODE == LD_FKL ? exp(lpt) * (lpt - lps) : exp(lps) * (lps - lpt);
        }
      } else if (RLK_P_MODE == LD_JSD) {
        const double lb = log(beta), l1b = log1p(-beta);
        for (rlk_i64 v = 0; v < V; v++) {
          const double lps = zs[v] - ls, lpt = zt[v] - lt;
          const double x = lps + l1b, y = lpt + lb, hi = x > y ? x : y;
          const double lm = hi + log1p(exp(-fabs(x - y)));
          a1 += exp(lps) * (lps - lm);
          a2 += exp(lpt) * (lpt - lm);
        }
        D = beta * a2 + (1.0 - beta) * a1;
      } else {
        /* the k largest teacher logits, in the top-k order, among those of nonzero probability:
         * a -inf logit (or a NaN one) never enters, so a row with fewer than k finite ones has
         * them all (n < k), and a row with none an empty set */
        double val[LD_TOPK_MAX];
        rlk_i64 col[LD_TOPK_MAX], n = 0;
        for (rlk_i64 v = 0; v < V; v++) {
          if (!(zt[v] > -INFINITY)) continue;
          if (n == k && !ld_before(zt[v], v, val[k - 1], col[k - 1])) continue;
          rlk_i64 j = n < k ? n++ : k - 1;
          for (; j > 0 && ld_before(zt[v], v, val[j - 1], col[j - 1]); j--) val[j] = val[j - 1], col[j] = col[j - 1];
          val[j] = zt[v], col[j] = v;
        }
        for (rlk_i64 j = 0; j < n; j++) {
          const double lpt = zt[col[j]] - lt, lps = zs[col[j]] - ls;
          a1 += exp(lpt);
          D += exp(lpt) * (lpt - lps);
        }
        if (n > 0) {
          a2 = val[n - 1];
          a3 = (double)(col[n - 1] + p_->vocab_start);
        } else { /* no teacher distribution: D and P NaN, a boundary no column comes before */
          D = a1 = NAN;
          a2 = INFINITY;
          a3 = -1.0;
        }
      }
    }
    p_->divergence[i] = (float)D;
    float *st = p_->stats + (rlk_i64)6 * i;
    st[0] = (float)ls, st[1] = (float)lt, st[2] = (float)D;
    st[3] = (float)a1, st[4] = (float)a2, st[5] = (float)a3;
    if (p_->entropy) p_->entropy[i] = (float)(ls - ez);
    if (p_->zeros) p_->zeros[i] = 0.0f;
  }
}

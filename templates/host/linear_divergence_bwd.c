/* linear_divergence_bwd.c - host form of rlk_linear_divergence_backward, in fp64: every logit of
 * both heads recomputed as an fp64 dot product, dz from the forward's stats (rlk.h's forms),
 * the gradients summed in fp64 and rounded once (added to the old values when accumulating).
 * Parameters as linear_divergence_fwd.c's; the gradients' dtypes (0 f32, 1 f16, 2 bf16) are
 * run-time fields, an absent gradient NULL. */

#include "linear_divergence_host.h"
#include "rlk_host_grad.h"
#include "linear_divergence_params.h"

/* grad (+)= sum, [rows, H] of row stride `stride` */
static void ld_store(void *grad, rlk_i64 dt, rlk_i64 stride, const double *sum, rlk_i64 rows, rlk_i64 H, int acc) {
  for (rlk_i64 r = 0; r < rows; r++)
    for (rlk_i64 c = 0; c < H; c++) {
      const rlk_i64 j = r * stride + c;
      rlk_grad_put(grad, (int)dt, j, (acc ? rlk_grad_get(grad, (int)dt, j) : 0.0) + sum[r * H + c]);
    }
}

RLK_HOST_KERNEL rlk_linear_divergence_bwd_host(void **args) {
  const ld_bwd_host_args *p_ = (const ld_bwd_host_args *)args[0];
  const rlk_i64 N = p_->N, V = p_->V, Hs = p_->Hs, Ht = p_->Ht;
  const double Ts = (double)p_->s_temperature, Tt = (double)p_->t_temperature, beta = p_->beta;
  const uint16_t *sh = (const uint16_t *)p_->s_hidden, *sw = (const uint16_t *)p_->s_weight;
  const uint16_t *th = (const uint16_t *)p_->t_hidden, *tw = (const uint16_t *)p_->t_weight;
  const rlk_i64 shs = p_->s_h_stride, sws = p_->s_w_stride, ths = p_->t_h_stride, tws = p_->t_w_stride;
  const int student = p_->gsh || p_->gsw, teacher = p_->gth || p_->gtw;
  /* the sums in the scratch, zeroed, in the order the op sized them */
  double *at = p_->scratch;
  double *dhs = p_->gsh ? at : NULL;
  at += p_->gsh ? N * Hs : 0;
  double *dws = p_->gsw ? at : NULL;
  at += p_->gsw ? V * Hs : 0;
  double *dht = p_->gth ? at : NULL;
  at += p_->gth ? N * Ht : 0;
  double *dwt = p_->gtw ? at : NULL;
  at += p_->gtw ? V * Ht : 0;
  double *thr = at; /* top-k: each row's k-th teacher logit */
  for (double *x = p_->scratch; x < at + N; x++) *x = 0.0;
  /* the set's last member's logit, recomputed as the forward computed it */
  if (RLK_P_MODE == LD_TOPK)
    for (rlk_i64 i = 0; i < N; i++) {
      const rlk_i64 c = (rlk_i64)p_->stats[i * p_->stats_stride + 5] - p_->vocab_start;
      thr[i] = c >= 0 && c < V ? rlk_half_dot(th + i * ths, tw + c * tws, Ht, RLK_P_TDT) / Tt : INFINITY;
    }
  const double lb = RLK_P_MODE == LD_JSD ? log(beta) : 0.0, l1b = RLK_P_MODE == LD_JSD ? log1p(-beta) : 0.0;
  for (rlk_i64 v = 0; v < V; v++) {
    for (rlk_i64 i = 0; i < N; i++) {
      if (ld_ignored(p_->labels, p_->label_stride, i, p_->ignore_index)) continue;
      const float *st = p_->stats + i * p_->stats_stride;
      const double g = p_->g[i * p_->g_stride];
      const double zs = rlk_half_dot(sh + i * shs, sw + v * sws, Hs, RLK_P_SDT) / Ts;
      const double zt = rlk_half_dot(th + i * ths, tw + v * tws, Ht, RLK_P_TDT) / Tt;
      const double lps = zs - st[0], lpt = zt - st[1], D = st[2], ps = exp(lps), pt = exp(lpt);
      double gs, gt;
      if (RLK_P_MODE == LD_FKL) {
        gs = ps - pt;
        gt = pt * (lpt - lps - D);
      } else if (RLK_P_MODE == LD_RKL) {
        gs = ps * (lps - lpt - D);
        gt = pt - ps;
      } else if (RLK_P_MODE == LD_JSD) {
        const double x = lps + l1b, y = lpt + lb, hi = x > y ? x : y;
        const double lm = hi + log1p(exp(-fabs(x - y)));
        gs = (1.0 - beta) * ps * (lps - lm - st[3]);
        gt = beta * pt * (lpt - lm - st[4]);
      } else {
        const rlk_i64 last = (rlk_i64)st[5] - p_->vocab_start;
        const int in = zt > thr[i] || (zt == thr[i] && v <= last);
        gs = st[3] * ps - (in ? pt : 0.0);
        gt = pt * ((in ? lpt - lps + 1.0 : 0.0) - D - st[3]);
      }
      gs *= g / Ts;
      gt *= g / Tt;
      if (student) {
        for (rlk_i64 c = 0; dhs && c < Hs; c++) dhs[i * Hs + c] += gs * rlk_half_at(sw + v * sws, c, RLK_P_SDT);
        for (rlk_i64 c = 0; dws && c < Hs; c++) dws[v * Hs + c] += gs * rlk_half_at(sh + i * shs, c, RLK_P_SDT);
      }
      if (teacher) {
        for (rlk_i64 c = 0; dht && c < Ht; c++) dht[i * Ht + c] += gt * rlk_half_at(tw + v * tws, c, RLK_P_TDT);
        for (rlk_i64 c = 0; dwt && c < Ht; c++) dwt[v * Ht + c] += gt * rlk_half_at(th + i * ths, c, RLK_P_TDT);
      }
    }
  }
  const int acc = p_->accumulate != 0;
  if (dhs) ld_store(p_->gsh, p_->gsh_dt, p_->gsh_stride, dhs, N, Hs, acc);
  if (dws) ld_store(p_->gsw, p_->gsw_dt, p_->gsw_stride, dws, V, Hs, acc);
  if (dht) ld_store(p_->gth, p_->gth_dt, p_->gth_stride, dht, N, Ht, acc);
  if (dwt) ld_store(p_->gtw, p_->gtw_dt, p_->gtw_stride, dwt, V, Ht, acc);
}

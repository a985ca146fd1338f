/* linear_logprob_bwd.c - host form of rlk_linear_logprob_backward, in fp64: every logit
 * z = (h . w_v) / T recomputed as an fp64 dot product, dz from the forward's lse (and entropy),
 * grad_hidden and grad_weight summed in fp64 and rounded once. Parameters: RLK_P_HIDDEN (1 f16,
 * 2 bf16), RLK_P_LABELS (int32_t / int64_t), RLK_P_GH and RLK_P_GW (the gradients' dtypes: 0 f32,
 * 1 f16, 2 bf16), RLK_P_ENTROPY (an entropy gradient is given). */
#include <math.h>

#include "rlk_host_grad.h"
#include "rlk_host_half.h"
#include "rlk_host_labels.h"
#include "linear_logprob_params.h"

RLK_PARAMS_DECLARE(ll_bwd_host_params, RLK_LL_BWD_HOST_PARAMS, RLK_LL_BWD_HOST_PARAMS_SIZE);

RLK_HOST_KERNEL rlk_linear_logprob_bwd_host(void **args) {
  const ll_bwd_host_params *p_ = (const ll_bwd_host_params *)args[0];
  const uint16_t *hidden = (const uint16_t *)p_->hidden;
  const rlk_i64 hs = p_->h_stride;
  const uint16_t *weight = (const uint16_t *)p_->weight;
  const rlk_i64 ws = p_->w_stride;
  const rlk_i64 ls = p_->label_stride;
  const rlk_i64 N = p_->N;
  const rlk_i64 V = p_->V;
  const rlk_i64 H = p_->H;
  const double T = (double)p_->temperature;
  const rlk_i64 ignore_index = p_->ignore_index;
  const float *lse = p_->lse;
  const rlk_i64 lse_s = p_->lse_s;
  const float *g_lp = p_->g_lp;
  const rlk_i64 glp_s = p_->glp_s;
  const float *ent = p_->entropy;
  const rlk_i64 ent_s = p_->ent_s;
  const float *g_h = p_->g_ent; /* the entropy's gradient */
  const rlk_i64 gh_s = p_->gent_s;
  void *gh = p_->grad_hidden;
  const rlk_i64 ghs = p_->gh_stride;
  void *gw = p_->grad_weight;
  const rlk_i64 gws = p_->gw_stride;
  const int32_t accumulate = p_->accumulate;
  int32_t *status = p_->status;
  const rlk_i64 vs = p_->vocab_start; /* labels index a vocabulary whose columns [vs, vs + V) are here */
  const int shard = p_->shard;        /* then a label outside them is no error */

  double *dh = gh ? p_->scratch : NULL;
  double *dw = p_->scratch + (gh ? N * H : 0);
  if (dh)
    for (rlk_i64 j = 0; j < N * H; j++) dh[j] = 0.0;
  for (rlk_i64 i = 0; i < N; i++) {
    const rlk_i64 yg = rlk_label_at(p_->labels, i * ls), y = yg - vs;
    if (!shard && yg != ignore_index && (y < 0 || y >= V) && status) *status |= LP_STATUS_BAD_LABEL;
  }
  for (rlk_i64 v = 0; v < V; v++) {
    const uint16_t *w = weight + v * ws;
    for (rlk_i64 k = 0; k < H; k++) dw[k] = 0.0;
    for (rlk_i64 i = 0; i < N; i++) {
      const uint16_t *h = hidden + i * hs;
      const rlk_i64 yg = rlk_label_at(p_->labels, i * ls), y = yg - vs;
      double g;
      if (yg == ignore_index) {
        continue;
      } else if (!shard && (y < 0 || y >= V)) {
        g = NAN;
      } else {
        const double x = rlk_half_dot(h, w, H, RLK_P_HIDDEN);
        const double z = x / T;
        /* kept-set replay: p 0 below the row's threshold (the raw logit rounded to f32), but for
         * the label */
        const int cut = p_->threshold && (float)x < p_->threshold[i] && v != y;
        const double l = lse[i * lse_s], p = cut ? 0.0 : exp(z - l);
        g = (g_lp ? g_lp[i * glp_s] : 0.0) * ((v == y ? 1.0 : 0.0) - p);
        /* p (z - E) tends to 0 with p: a column of -inf (p 0) adds nothing, not 0 * -inf */
        if (RLK_P_ENTROPY && g_h && p != 0.0) g -= g_h[i * gh_s] * p * (z - (l - ent[i * ent_s]));
        g /= T;
      }
      if (dh)
        for (rlk_i64 k = 0; k < H; k++) dh[i * H + k] += g * rlk_half_at(w, k, RLK_P_HIDDEN);
      for (rlk_i64 k = 0; k < H; k++) dw[k] += g * rlk_half_at(h, k, RLK_P_HIDDEN);
    }
    if (gw)
      for (rlk_i64 k = 0; k < H; k++) {
        const rlk_i64 j = v * gws + k;
        rlk_grad_put(gw, RLK_P_GW, j, (accumulate ? rlk_grad_get(gw, RLK_P_GW, j) : 0.0) + dw[k]);
      }
  }
  if (gh)
    for (rlk_i64 i = 0; i < N; i++)
      for (rlk_i64 k = 0; k < H; k++) {
        const rlk_i64 j = i * ghs + k;
        rlk_grad_put(gh, RLK_P_GH, j, (accumulate ? rlk_grad_get(gh, RLK_P_GH, j) : 0.0) + dh[i * H + k]);
      }
}

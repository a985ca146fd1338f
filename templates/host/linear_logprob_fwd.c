/* linear_logprob_fwd.c - host form of rlk_linear_logprob's forward, the fp64-accumulating
 * reference path: for each row, each logit z_v = (h . w_v) / T as an fp64 dot product, folded
 * into an fp64 online (max, sum of exp, sum of exp * z); outputs rounded to f32 once.
 * Kept-set replay (threshold): a column whose raw logit h . w_v, rounded to f32 (the value the
 * sampler compared), is below its row's threshold leaves the fold, unless it is the label of a
 * row that is not ignored; a logit of -inf contributes nothing, as in rlk_logprob. With
 * `logits` it also writes those f32 logits (rlk_linear_sample's); labels may be NULL (no label).
 * Parameters: RLK_P_HIDDEN (RLK_DT_F16 or RLK_DT_BF16), RLK_P_LABELS (int32_t or
 * int64_t), RLK_P_ENTROPY (0/1). */
#include <math.h>

#include "rlk_host_half.h"
#include "rlk_host_labels.h"
#include "linear_logprob_params.h"

RLK_PARAMS_DECLARE(ll_fwd_host_params, RLK_LL_FWD_HOST_PARAMS, RLK_LL_FWD_HOST_PARAMS_SIZE);

RLK_HOST_KERNEL rlk_linear_logprob_fwd_host(void **args) {
  const ll_fwd_host_params *p_ = (const ll_fwd_host_params *)args[0];
  const rlk_i64 V = p_->V, ignore_index = p_->ignore_index;
  const double T = (double)p_->temperature;
  float *records = p_->records; /* the shard form: one record per row instead of the outputs */

  for (rlk_i64 i = 0; i < p_->N; i++) {
    const uint16_t *h = (const uint16_t *)p_->hidden + i * p_->h_stride;
    const rlk_i64 yg = p_->labels ? rlk_label_at(p_->labels, i * p_->label_stride) : ignore_index,
                  y = yg - p_->vocab_start;
    const float thr = p_->threshold ? p_->threshold[i] : -INFINITY;
    const int scored = yg != ignore_index; /* an ignored row's label column is no exception */
    double m = -INFINITY, s = 0.0, pz = 0.0, zy = 0.0;
    for (rlk_i64 v = 0; v < V; v++) {
      const uint16_t *w = (const uint16_t *)p_->weight + v * p_->w_stride;
      const double x = rlk_half_dot(h, w, p_->H, RLK_P_HIDDEN), z = x / T;
      if (p_->logits) p_->logits[i * p_->logits_pitch + v] = (float)x; /* rlk_linear_sample's */
      if (v == y) zy = z;
      if ((float)x < thr && !(scored && v == y)) continue;
      if (z == -INFINITY) continue; /* contributes nothing (rlk_logprob's); exp(-inf - -inf) is NaN */
      if (z > m) {
        const double f = m == -INFINITY ? 0.0 : exp(m - z);
        s *= f;
        pz *= f;
        m = z;
      }
      const double e = exp(z - m);
      s += e;
      pz += e * z;
    }
    if (records) {
      /* rlk.h's vocab-parallel record over this weight's columns */
      const int own = yg != ignore_index && y >= 0 && y < V;
      records[4 * i + 0] = (float)m;
      records[4 * i + 1] = (float)s;
      records[4 * i + 2] = RLK_P_ENTROPY && s > 0.0 ? (float)(pz - m * s) : 0.0f;
      /* t = z_y rounded to f32, +inf "absent"; an owned z_y that rounds to +inf (a +inf logit,
       * or x_y / T past f32's range) is NaN, never the marker: its row is NaN either way */
      const float t = (float)zy;
      records[4 * i + 3] = !own ? (float)INFINITY : t == (float)INFINITY ? NAN : t;
      continue;
    }
    const double l = m + log(s);
    float lp, lf, hf;
    if (y != ignore_index && (y < 0 || y >= V)) {
      lp = lf = hf = NAN;
      if (p_->status) *p_->status |= LP_STATUS_BAD_LABEL;
    } else {
      lf = (float)l;
      hf = (float)(l - pz / s);
      lp = y == ignore_index ? 0.0f : (float)(zy - l);
    }
    if (p_->logp) p_->logp[i] = lp;
    if (p_->lse) p_->lse[i] = lf;
    if (RLK_P_ENTROPY && p_->entropy) p_->entropy[i] = hf;
  }
}

/* token_kl.c - host form of rlk::token_kl (templates/cuda/token_kl.cuh): the same per-token
 * arithmetic in RLK_P_DTYPE, row by row. Parameters: RLK_P_DTYPE (float or double), RLK_P_EST
 * (rlk_kl_estimator), RLK_P_MASK (RLK_SEQ_MASK_*), RLK_P_ST, RLK_P_OLD, RLK_P_GIN (0/1), RLK_P_OUT
 * (TK_OUT_*). */
#include "kl_estimator.h"
#include "rlk_host_seq_mask.h"
#include "token_kl_params.h"

RLK_HOST_KERNEL rlk_token_kl(void **args) {
  const tk_args *p_ = (const tk_args *)args[0];
  const kl_t *logp = (const kl_t *)p_->logp, *ref = (const kl_t *)p_->ref, *old = (const kl_t *)p_->old;
  const kl_t *gin = (const kl_t *)p_->grad_kl;
  kl_t *kl = (kl_t *)p_->kl, *grad = (kl_t *)p_->grad;
  const kl_t in_lo = (kl_t)p_->in_lo, in_hi = (kl_t)p_->in_hi, out_lo = (kl_t)p_->out_lo,
             out_hi = (kl_t)p_->out_hi, w_max = (kl_t)p_->w_max, bg = (kl_t)p_->bound_g;
  for (rlk_i64 b = 0; b < p_->B; b++)
    for (rlk_i64 t = 0; t < p_->T; t++) {
      const float m = rlk_mask_weight(RLK_P_MASK, p_->mask, b * p_->mask_stride + t);
      kl_t v = 0, g = 0;
      if (m != 0.0f) {
        const kl_t lp = logp[b * p_->logp_stride + t];
        v = kl_estimate(RLK_P_EST, RLK_P_ST, lp - ref[b * p_->ref_stride + t], in_lo, in_hi, out_lo, out_hi,
                        bg, &g);
        if (RLK_P_ST && RLK_P_OLD) {
          const kl_t w = _Generic(lp, float: expf, default: exp)(lp - old[b * p_->old_stride + t]);
          g = g * (w < w_max ? w : w_max);
        }
        if (RLK_P_GIN) g = g * gin[b * p_->grad_kl_stride + t];
        if (RLK_P_MASK != RLK_SEQ_MASK_NONE) {
          v = v * (kl_t)m;
          g = g * (kl_t)m;
        }
      }
      if (RLK_P_OUT != TK_OUT_GRAD) kl[b * p_->kl_stride + t] = v;
      if (RLK_P_OUT != TK_OUT_KL) grad[b * p_->grad_stride + t] = g;
    }
}

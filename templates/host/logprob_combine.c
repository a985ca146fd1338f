/* logprob_combine.c - host form of rlk::logprob_combine (templates/cuda/logprob_shard.cuh): each
 * row's P gathered records merged in rank order into logp, lse and entropy.
 * Parameters: RLK_P_LABELS (int32_t or int64_t), RLK_P_ENTROPY (0/1: entropy written). */
#include "logprob_common.h"
#include "rlk_host_labels.h"
#include "logprob_shard_params.h"

RLK_PARAMS_DECLARE(ls_combine_params, RLK_LS_COMBINE_PARAMS, RLK_LS_COMBINE_PARAMS_SIZE);

RLK_HOST_KERNEL rlk_logprob_combine(void **args) {
  const ls_combine_params *p_ = (const ls_combine_params *)args[0];
  const float *partials = (const float *)p_->partials;
  const rlk_i64 P = p_->P;
  const rlk_i64 N = p_->N;
  const rlk_i64 label_stride = p_->label_stride;
  const rlk_i64 ignore_index = p_->ignore_index;
  float *logp = p_->logp;
  float *lse = p_->lse;
  float *entropy = p_->entropy;
  int32_t *status = (int32_t *)p_->status;
  const int ent = RLK_P_ENTROPY;

  for (rlk_i64 i = 0; i < N; i++) {
    float M = -INFINITY;
    for (rlk_i64 r = 0; r < P; r++) M = fmaxf(M, partials[4 * (r * N + i)]);
    float S = 0.0f, U = 0.0f, t = 0.0f;
    int owners = 0;
    for (rlk_i64 r = 0; r < P; r++) {
      const float *p = partials + 4 * (r * N + i);
      if (p[1] != 0.0f) {
        const float d = p[0] - M;
        const float f = expf(d);
        S = fmaf(p[1], f, S);
        /* a record rescaled to 0 adds no U: d s may overflow (a shard at -FLT_MAX), 0 * -inf */
        if (ent && f != 0.0f) U = fmaf(f, fmaf(d, p[1], p[2]), U);
      }
      if (p[3] != INFINITY) {
        ++owners;
        t = p[3];
      }
    }
    const rlk_i64 y = rlk_label_at(p_->labels, i * label_stride);
    float lp, l, h;
    if (y != ignore_index && owners != 1) {
      lp = l = h = NAN;
      if (status) *status |= owners ? LP_STATUS_LABEL_OWNERS : LP_STATUS_BAD_LABEL;
    } else {
      const float ln_s = logf(S);
      l = M + ln_s;
      h = ent ? ln_s - U / S : 0.0f;
      lp = y == ignore_index ? 0.0f : (t - M) - ln_s;
    }
    logp[i] = lp;
    if (lse) lse[i] = l;
    if (ent && entropy) entropy[i] = h;
  }
}

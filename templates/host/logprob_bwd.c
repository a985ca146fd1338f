/* logprob_bwd.c - host form of rlk::logprob_bwd (templates/cuda/logprob.cuh):
 * dlogits = (g_lp (onehot(y) - p) - g_H p (z - E_p[z])) / T with p = 2^(x c - lse log2(e)) and
 * E_p[z] = lse - entropy, written as the logits' dtype or f32. grad may alias logits (each element
 * is read before it is written). Ignored rows get zeros; a label outside [0, V) NaN and the flag.
 * A shard (shard != 0) has the columns [vocab_start, vocab_start + V): a label outside is no error.
 * Parameters: RLK_P_LOGITS, RLK_P_GRAD (LP_GRAD_*), RLK_P_LABELS, RLK_P_ENTROPY (0/1: g_H given),
 * RLK_P_KEPT (kept-set replay: p is 0 below the row's threshold, but for the label). */
#include "logprob_common.h"
#include "logprob_params.h"

RLK_PARAMS_DECLARE(lp_bwd_params, RLK_LP_BWD_PARAMS, RLK_LP_BWD_PARAMS_SIZE);

typedef RLK_P_LABELS lp_label_t;

RLK_HOST_KERNEL rlk_logprob_bwd(void **args) {
  const lp_bwd_params *p_ = (const lp_bwd_params *)args[0];
  const void *logits = p_->logits;
  const rlk_i64 row_stride = p_->row_stride;
  const lp_label_t *labels = (const lp_label_t *)p_->labels;
  const rlk_i64 label_stride = p_->label_stride;
  const rlk_i64 N = p_->N;
  const rlk_i64 V = p_->V;
  const float temperature = p_->temperature;
  const rlk_i64 ignore_index = p_->ignore_index;
  const float *lse = p_->lse;
  const rlk_i64 lse_stride = p_->lse_stride;
  const float *grad_logp = p_->grad_logp;
  const rlk_i64 grad_logp_stride = p_->grad_logp_stride;
  const float *entropy = p_->entropy;
  const rlk_i64 entropy_stride = p_->entropy_stride;
  const float *grad_entropy = p_->grad_entropy;
  const rlk_i64 grad_entropy_stride = p_->grad_entropy_stride;
  void *grad = p_->grad;
  const rlk_i64 grad_stride = p_->grad_stride;
  int32_t *status = (int32_t *)p_->status;
  const rlk_i64 vocab_start = p_->vocab_start;
  const int32_t shard = p_->shard;
  const float *threshold = p_->threshold;
  const int dt = RLK_P_LOGITS, ent = RLK_P_ENTROPY;
  const int odt = RLK_P_GRAD == LP_GRAD_F32 ? RLK_DT_F32 : dt;
  const float c = LP_LOG2E / temperature;

  for (rlk_i64 i = 0; i < N; i++) {
    const char *row = (const char *)logits + (size_t)(i * row_stride) * lp_dt_bytes(dt);
    char *out = (char *)grad + (size_t)(i * grad_stride) * lp_dt_bytes(odt);
    const rlk_i64 yg = (rlk_i64)labels[i * label_stride];
    const rlk_i64 y = yg - vocab_start; /* a shard's other labels are other shards' */
    if (yg == ignore_index || (!shard && (y < 0 || y >= V))) {
      const float fill = yg == ignore_index ? 0.0f : NAN;
      if (yg != ignore_index && status) *status |= LP_STATUS_BAD_LABEL;
      for (rlk_i64 j = 0; j < V; j++) lp_store(out, odt, j, fill);
      continue;
    }
    const float l = lse[i * lse_stride];
    const float gl = grad_logp ? grad_logp[i * grad_logp_stride] : 0.0f;
    const float l2 = l * LP_LOG2E;
    const float gy = gl / temperature;
    float a = -gl / temperature, b = 0.0f;
    if (ent) {
      const float gh = grad_entropy[i * grad_entropy_stride];
      const float ez = l - entropy[i * entropy_stride];
      a = (gh * ez - gl) / temperature;
      b = -gh / (temperature * temperature);
    }
    const float thr = RLK_P_KEPT ? threshold[i] : -INFINITY;
    for (rlk_i64 j = 0; j < V; j++) {
      const float x = lp_load(row, dt, j);
      const float p = x < thr && j != y ? 0.0f : exp2f(fmaf(x, c, -l2));
      float g = ent ? p * fmaf(b, fmaxf(x, -1.0e20f), a) : p * a;
      if (j == y) g += gy;
      lp_store(out, odt, j, g);
    }
  }
}

/* logprob_bwd.c - host form of rlk::logprob_bwd (templates/cuda/logprob.cuh):
 * dlogits = (g_lp (onehot(y) - p) - g_H p (z - E_p[z])) / T with p = 2^(x c - lse log2(e)) and
 * E_p[z] = lse - entropy, written as the logits' dtype or f32. grad may alias logits (each element
 * is read before it is written). Ignored rows get zeros; a label outside [0, V) NaN and the flag.
 * A shard (shard != 0) has the columns [vocab_start, vocab_start + V): a label outside is no error.
 * Parameters: RLK_P_LOGITS, RLK_P_GRAD (LP_GRAD_*), RLK_P_LABELS, RLK_P_ENTROPY (0/1: g_H given),
 * RLK_P_KEPT (kept-set replay: p is 0 below the row's threshold, but for the label). */
#include "logprob_common.h"
#include "rlk_host_labels.h"
#include "logprob_params.h"

RLK_PARAMS_DECLARE(lp_bwd_params, RLK_LP_BWD_PARAMS, RLK_LP_BWD_PARAMS_SIZE);

RLK_HOST_KERNEL rlk_logprob_bwd(void **args) {
  const lp_bwd_params *p = (const lp_bwd_params *)args[0];
  const rlk_i64 V = p->V, ignore_index = p->ignore_index;
  const float temperature = p->temperature;
  const float *grad_logp = p->grad_logp;
  int32_t *status = (int32_t *)p->status;
  const int dt = RLK_P_LOGITS, ent = RLK_P_ENTROPY;
  const int odt = RLK_P_GRAD == LP_GRAD_F32 ? RLK_DT_F32 : dt;
  const float c = LP_LOG2E / temperature;

  for (rlk_i64 i = 0; i < p->N; i++) {
    const char *row = lp_row(p->logits, p->row_stride, dt, i);
    char *out = (char *)p->grad + (size_t)(i * p->grad_stride) * lp_dt_bytes(odt);
    const rlk_i64 yg = rlk_label_at(p->labels, i * p->label_stride);
    const rlk_i64 y = yg - p->vocab_start; /* a shard's other labels are other shards' */
    if (yg == ignore_index || (!p->shard && (y < 0 || y >= V))) {
      const float fill = yg == ignore_index ? 0.0f : NAN;
      if (yg != ignore_index && status) *status |= LP_STATUS_BAD_LABEL;
      for (rlk_i64 j = 0; j < V; j++) lp_store(out, odt, j, fill);
      continue;
    }
    const float l = p->lse[i * p->lse_stride];
    const float gl = grad_logp ? grad_logp[i * p->grad_logp_stride] : 0.0f;
    const float l2 = l * LP_LOG2E;
    const float gy = gl / temperature;
    float a = -gl / temperature, b = 0.0f;
    if (ent) {
      const float gh = p->grad_entropy[i * p->grad_entropy_stride];
      const float ez = l - p->entropy[i * p->entropy_stride];
      a = (gh * ez - gl) / temperature;
      b = -gh / (temperature * temperature);
    }
    const float thr = RLK_P_KEPT ? p->threshold[i] : -INFINITY;
    for (rlk_i64 j = 0; j < V; j++) {
      const float x = lp_load(row, dt, j);
      const float pr = x < thr && j != y ? 0.0f : exp2f(fmaf(x, c, -l2));
      /* a term of p 0 is 0: its linear factor b x + a may overflow (b = -g_H / T^2 at a small
       * temperature, x at -inf or far below the maximum), and 0 * inf is NaN */
      float g = ent ? (pr == 0.0f ? 0.0f : pr * fmaf(b, x, a)) : pr * a;
      if (j == y) g += gy;
      lp_store(out, odt, j, g);
    }
  }
}

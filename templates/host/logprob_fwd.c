/* logprob_fwd.c - host form of rlk::logprob_fwd (templates/cuda/logprob.cuh): one row after
 * another, chunks of LP_CHUNK logits folded into an f32 online state, then the row's outputs.
 * Parameters: RLK_P_LOGITS (RLK_DT_*), RLK_P_LABELS (int32_t or int64_t), RLK_P_ENTROPY (0/1),
 * RLK_P_KEPT (kept-set replay: logits below the row's threshold count as -inf, the label is
 * folded in last where it is one of them); block, seg and unroll only shape the GPU kernels. */
#include "logprob_common.h"
#include "logprob_params.h"

typedef RLK_P_LABELS lp_label_t;

RLK_HOST_KERNEL rlk_logprob_fwd(void **args) {
  const lp_fwd_args *p_ = (const lp_fwd_args *)args[0];
  const void *logits = p_->logits;
  const rlk_i64 row_stride = p_->row_stride;
  const lp_label_t *labels = (const lp_label_t *)p_->labels;
  const rlk_i64 label_stride = p_->label_stride;
  const rlk_i64 N = p_->N;
  const rlk_i64 V = p_->V;
  const float temperature = p_->temperature;
  const rlk_i64 ignore_index = p_->ignore_index;
  float *logp = p_->logp;
  float *lse = p_->lse;
  float *entropy = p_->entropy;
  int32_t *status = (int32_t *)p_->status;
  const int dt = RLK_P_LOGITS, ent = RLK_P_ENTROPY;
  const float c = LP_LOG2E / temperature;

  for (rlk_i64 i = 0; i < N; i++) {
    const char *row = (const char *)logits + (size_t)(i * row_stride) * lp_dt_bytes(dt);
    const float thr = RLK_P_KEPT ? p_->threshold[i] : -INFINITY;
    lp_state st = {-INFINITY, 0.0f, 0.0f};
    float x[LP_CHUNK];
    for (rlk_i64 j0 = 0; j0 < V; j0 += LP_CHUNK) {
      const int n = V - j0 < LP_CHUNK ? (int)(V - j0) : LP_CHUNK;
      for (int k = 0; k < n; k++) {
        x[k] = lp_load(row, dt, j0 + k);
        if (x[k] < thr) x[k] = -INFINITY;
      }
      lp_add_chunk(&st, x, n, c, ent);
    }
    const rlk_i64 y = (rlk_i64)labels[i * label_stride];
    if (RLK_P_KEPT && y != ignore_index && y >= 0 && y < V) {
      float xy = lp_load(row, dt, y);
      if (xy < thr) lp_add_chunk(&st, &xy, 1, c, ent);
    }
    const float ln_s = logf(st.s);
    float lp, l, h;
    if (y != ignore_index && (y < 0 || y >= V)) {
      lp = l = h = NAN;
      if (status) *status |= LP_STATUS_BAD_LABEL;
    } else {
      l = st.m / temperature + ln_s;
      h = ent ? ln_s - LP_LN2 * (st.q / st.s) : 0.0f;
      lp = y == ignore_index ? 0.0f : (lp_load(row, dt, y) - st.m) / temperature - ln_s;
    }
    logp[i] = lp;
    if (lse) lse[i] = l;
    if (ent && entropy) entropy[i] = h;
  }
}

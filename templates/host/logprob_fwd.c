/* logprob_fwd.c - host form of rlk::logprob_fwd (templates/cuda/logprob.cuh): one row after
 * another, chunks of LP_CHUNK logits folded into an f32 online state, then the row's outputs.
 * Parameters: RLK_P_LOGITS (RLK_DT_*), RLK_P_LABELS (int32_t or int64_t), RLK_P_ENTROPY (0/1),
 * RLK_P_KEPT (kept-set replay: logits below the row's threshold count as -inf, the label is
 * folded in last where it is one of them); block, seg and unroll only shape the GPU kernels. */
#include "logprob_common.h"
#include "rlk_host_labels.h"
#include "logprob_params.h"

RLK_HOST_KERNEL rlk_logprob_fwd(void **args) {
  const lp_fwd_args *p = (const lp_fwd_args *)args[0];
  const rlk_i64 V = p->V, ignore_index = p->ignore_index;
  const float temperature = p->temperature;
  int32_t *status = (int32_t *)p->status;
  const int dt = RLK_P_LOGITS, ent = RLK_P_ENTROPY;
  const float c = LP_LOG2E / temperature;

  for (rlk_i64 i = 0; i < p->N; i++) {
    const char *row = lp_row(p->logits, p->row_stride, dt, i);
    const float thr = RLK_P_KEPT ? p->threshold[i] : -INFINITY;
    lp_state st = lp_fold_row(row, dt, V, c, ent, thr);
    const rlk_i64 y = rlk_label_at(p->labels, i * p->label_stride);
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
    p->logp[i] = lp;
    if (p->lse) p->lse[i] = l;
    if (ent && p->entropy) p->entropy[i] = h;
  }
}

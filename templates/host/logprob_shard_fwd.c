/* logprob_shard_fwd.c - host form of rlk::logprob_fwd_shard (templates/cuda/logprob_shard.cuh):
 * logprob_fwd's row pass over a vocabulary shard, then the row's record {m, s, u, t} (the format
 * is in include/rlk.h). Parameters as logprob_fwd.c's. */
#include "logprob_common.h"
#include "rlk_host_labels.h"
#include "logprob_shard_params.h"

RLK_PARAMS_DECLARE(ls_fwd_params, RLK_LS_FWD_PARAMS, RLK_LS_FWD_PARAMS_SIZE);

RLK_HOST_KERNEL rlk_logprob_fwd_shard(void **args) {
  const ls_fwd_params *p = (const ls_fwd_params *)args[0];
  const rlk_i64 V = p->V;
  const float temperature = p->temperature;
  const int dt = RLK_P_LOGITS, ent = RLK_P_ENTROPY;
  const float c = LP_LOG2E / temperature;

  for (rlk_i64 i = 0; i < p->N; i++) {
    const char *row = lp_row(p->logits, p->row_stride, dt, i);
    const lp_state st = lp_fold_row(row, dt, V, c, ent, -INFINITY);
    const rlk_i64 y = rlk_label_at(p->labels, i * p->label_stride);
    const rlk_i64 yl = y - p->vocab_start;
    const int owned = y != p->ignore_index && yl >= 0 && yl < V;
    float *o = (float *)p->partials + 4 * i;
    o[0] = st.m / temperature;
    o[1] = st.s;
    o[2] = ent ? st.q * LP_LN2 : 0.0f;
    if (owned) {
      const float t = lp_load(row, dt, yl) / temperature;
      o[3] = t == INFINITY ? NAN : t;
    } else {
      o[3] = INFINITY;
    }
  }
}

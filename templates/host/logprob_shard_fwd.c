/* logprob_shard_fwd.c - host form of rlk::logprob_fwd_shard (templates/cuda/logprob_shard.cuh):
 * logprob_fwd's row pass over a vocabulary shard, then the row's record {m, s, u, t} (the format
 * is in include/rlk.h). Parameters as logprob_fwd.c's. */
#include "logprob_common.h"
#include "logprob_shard_params.h"

RLK_PARAMS_DECLARE(ls_fwd_params, RLK_LS_FWD_PARAMS, RLK_LS_FWD_PARAMS_SIZE);

typedef RLK_P_LABELS lp_label_t;

RLK_HOST_KERNEL rlk_logprob_fwd_shard(void **args) {
  const ls_fwd_params *p_ = (const ls_fwd_params *)args[0];
  const void *logits = p_->logits;
  const rlk_i64 row_stride = p_->row_stride;
  const lp_label_t *labels = (const lp_label_t *)p_->labels;
  const rlk_i64 label_stride = p_->label_stride;
  const rlk_i64 N = p_->N;
  const rlk_i64 V = p_->V;
  const float temperature = p_->temperature;
  const rlk_i64 ignore_index = p_->ignore_index;
  const rlk_i64 vocab_start = p_->vocab_start;
  float *partials = (float *)p_->partials;
  const int dt = RLK_P_LOGITS, ent = RLK_P_ENTROPY;
  const float c = LP_LOG2E / temperature;

  for (rlk_i64 i = 0; i < N; i++) {
    const char *row = (const char *)logits + (size_t)(i * row_stride) * lp_dt_bytes(dt);
    lp_state st = {-INFINITY, 0.0f, 0.0f};
    float x[LP_CHUNK];
    for (rlk_i64 j0 = 0; j0 < V; j0 += LP_CHUNK) {
      const int n = V - j0 < LP_CHUNK ? (int)(V - j0) : LP_CHUNK;
      for (int k = 0; k < n; k++) x[k] = lp_load(row, dt, j0 + k);
      lp_add_chunk(&st, x, n, c, ent);
    }
    const rlk_i64 y = (rlk_i64)labels[i * label_stride];
    const rlk_i64 yl = y - vocab_start;
    const int owned = y != ignore_index && yl >= 0 && yl < V;
    float *o = partials + 4 * i;
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

/* logprob_shard_fwd.c - host form of rlk::logprob_fwd_shard (templates/cuda/logprob_shard.cuh):
 * logprob_fwd's row pass over a vocabulary shard, then the row's record {m, s, u, t} (the format
 * is in include/rlk.h). Parameters as logprob_fwd.c's. */
#include "logprob_common.h"

typedef RLK_P_LABELS lp_label_t;

RLK_HOST_KERNEL rlk_logprob_fwd_shard(void **args) {
  const void *logits = RLK_ARG(const void *, 0);
  const rlk_i64 row_stride = RLK_ARG(rlk_i64, 1);
  const lp_label_t *labels = RLK_ARG(const lp_label_t *, 2);
  const rlk_i64 label_stride = RLK_ARG(rlk_i64, 3);
  const rlk_i64 N = RLK_ARG(rlk_i64, 4);
  const rlk_i64 V = RLK_ARG(rlk_i64, 5);
  const float temperature = RLK_ARG(float, 6);
  const rlk_i64 ignore_index = RLK_ARG(rlk_i64, 7);
  const rlk_i64 vocab_start = RLK_ARG(rlk_i64, 8);
  float *partials = RLK_ARG(float *, 9);
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

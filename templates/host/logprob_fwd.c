/* logprob_fwd.c - host form of rlk::logprob_fwd (templates/cuda/logprob.cuh): one row after
 * another, chunks of LP_CHUNK logits folded into an f32 online state, then the row's outputs.
 * Parameters: RLK_P_LOGITS (LP_DT_*), RLK_P_LABELS (int32_t or int64_t), RLK_P_ENTROPY (0/1);
 * block, seg and unroll only shape the GPU kernels. */
#include "logprob_common.h"

typedef RLK_P_LABELS lp_label_t;

RLK_HOST_KERNEL rlk_logprob_fwd(void **args) {
  const void *logits = RLK_ARG(const void *, 0);
  const rlk_i64 row_stride = RLK_ARG(rlk_i64, 1);
  const lp_label_t *labels = RLK_ARG(const lp_label_t *, 2);
  const rlk_i64 label_stride = RLK_ARG(rlk_i64, 3);
  const rlk_i64 N = RLK_ARG(rlk_i64, 4);
  const rlk_i64 V = RLK_ARG(rlk_i64, 5);
  const float temperature = RLK_ARG(float, 6);
  const rlk_i64 ignore_index = RLK_ARG(rlk_i64, 7);
  float *logp = RLK_ARG(float *, 8);
  float *lse = RLK_ARG(float *, 9);
  float *entropy = RLK_ARG(float *, 10);
  int32_t *status = RLK_ARG(int32_t *, 11);
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

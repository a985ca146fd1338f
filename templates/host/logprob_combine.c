/* logprob_combine.c - host form of rlk::logprob_combine (templates/cuda/logprob_shard.cuh): each
 * row's P gathered records merged in rank order into logp, lse and entropy.
 * Parameters: RLK_P_LABELS (int32_t or int64_t), RLK_P_ENTROPY (0/1: entropy written). */
#include "logprob_common.h"

typedef RLK_P_LABELS lp_label_t;

enum { LP_STATUS_LABEL_OWNERS = 2 };

RLK_HOST_KERNEL rlk_logprob_combine(void **args) {
  const float *partials = RLK_ARG(const float *, 0);
  const rlk_i64 P = RLK_ARG(rlk_i64, 1);
  const rlk_i64 N = RLK_ARG(rlk_i64, 2);
  const lp_label_t *labels = RLK_ARG(const lp_label_t *, 3);
  const rlk_i64 label_stride = RLK_ARG(rlk_i64, 4);
  const rlk_i64 ignore_index = RLK_ARG(rlk_i64, 5);
  float *logp = RLK_ARG(float *, 6);
  float *lse = RLK_ARG(float *, 7);
  float *entropy = RLK_ARG(float *, 8);
  int32_t *status = RLK_ARG(int32_t *, 9);
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
        if (ent) U = fmaf(f, fmaf(d, p[1], p[2]), U);
      }
      if (p[3] != INFINITY) {
        ++owners;
        t = p[3];
      }
    }
    const rlk_i64 y = (rlk_i64)labels[i * label_stride];
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

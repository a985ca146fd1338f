/* prefix_attention_fwd.c - host form of rlk::pattn_fwd (templates/cuda/prefix_attention.cuh):
 * for each query row and head, two passes over its keys in fp64 (max and sum of exponentials,
 * then the weighted values), one rounding per output. Parameters: RLK_P_DTYPE (PA_DT_*),
 * RLK_P_HEAD_DIM; the GPU tiling parameters do not apply. */
#include "prefix_attention_common.h"

#define D RLK_P_HEAD_DIM

/* Query token i (whose keys are ks), each of its heads: out and lse. */
static void pa_fwd_query(const void *args, rlk_i64 i, pa_keys ks) {
  const pa_fwd_args *p_ = (const pa_fwd_args *)args;
  const uint16_t *q = (const uint16_t *)p_->q, *k = (const uint16_t *)p_->k, *v = (const uint16_t *)p_->v;
  const int32_t Hq = p_->Hq, Hkv = p_->Hkv, ratio = Hq / Hkv;
  const double scale = p_->scale;
  uint16_t *out = (uint16_t *)p_->out;
  float *lse = p_->lse;
  for (int32_t h = 0; h < Hq; h++) {
    const int32_t hk = h / ratio;
    const uint16_t *qi = q + (i * Hq + h) * D;
    double qd[D], acc[D];
    for (int d = 0; d < D; d++) {
      qd[d] = pa_load(qi, d) * scale;
      acc[d] = 0.0;
    }
    double m = -INFINITY, l = 0.0;
    for (int pass = 0; pass < 2; pass++) {
      for (int part = 0; part < 2; part++) {
        const rlk_i64 j0 = part ? ks.b0 : ks.a0, j1 = part ? ks.b1 : ks.a1;
        for (rlk_i64 j = j0; j < j1; j++) {
          const double sc = pa_dot(qd, k + (j * Hkv + hk) * D, D);
          if (pass == 0) {
            pa_online_add(&m, &l, sc);
          } else {
            const double w = exp(sc - m) / l;
            const uint16_t *vj = v + (j * Hkv + hk) * D;
            for (int d = 0; d < D; d++) acc[d] += w * pa_load(vj, d);
          }
        }
      }
    }
    uint16_t *oi = out + (i * Hq + h) * D;
    for (int d = 0; d < D; d++) pa_store(oi, d, acc[d]);
    if (lse) lse[i * Hq + h] = (float)(m + log(l));
  }
}

RLK_HOST_KERNEL rlk_pattn_fwd(void **args) {
  const pa_fwd_args *p_ = (const pa_fwd_args *)args[0];
  pa_each_query(p_->seq, p_->grp, p_->P, pa_fwd_query, p_);
}

/* prefix_attention_bwd.c - host form of the prefix-attention backward (on a GPU, the pattn_bwd_*
 * kernels of templates/cuda/prefix_attention.cuh): for each query row and head, the softmax is
 * recomputed in fp64 (its lse and out are not read: recomputing is exact), then
 *   dP_ij = dO_i . v_j,  D_i = sum_j P_ij dP_ij,  dS_ij = P_ij (dP_ij - D_i),
 *   dq_i = scale sum_j dS_ij k_j,  dk_j += scale dS_ij q_i,  dv_j += P_ij dO_i,
 * with dk and dv accumulated in fp64 in the workspace in a fixed order (prompts, segments, rows,
 * heads), so a prefix key's gradient sums its whole group, then rounded once. */
#include "prefix_attention_common.h"

#define D RLK_P_HEAD_DIM

/* Query token i (whose keys are ks), each of its heads: dq, and its terms of the fp64 dk and dv
 * sums in the workspace. */
static void pa_bwd_query(const void *args, rlk_i64 i, pa_keys ks) {
  const pa_bwd_args *p_ = (const pa_bwd_args *)args;
  const uint16_t *q = (const uint16_t *)p_->q, *k = (const uint16_t *)p_->k, *v = (const uint16_t *)p_->v;
  const uint16_t *dout = (const uint16_t *)p_->dout;
  const int32_t Hq = p_->Hq, Hkv = p_->Hkv, ratio = Hq / Hkv;
  const double scale = p_->scale;
  uint16_t *dq = (uint16_t *)p_->dq;
  double *dk_acc = (double *)p_->work, *dv_acc = dk_acc + p_->T * Hkv * D;
  for (int32_t h = 0; h < Hq; h++) {
    const int32_t hk = h / ratio;
    const uint16_t *qi = q + (i * Hq + h) * D, *doi = dout + (i * Hq + h) * D;
    double qd[D], dod[D], dqa[D];
    for (int d = 0; d < D; d++) {
      qd[d] = pa_load(qi, d);
      dod[d] = pa_load(doi, d);
      dqa[d] = 0.0;
    }
    /* pass 0: max and sum; pass 1: D_i; pass 2: the gradients */
    double m = -INFINITY, l = 0.0, Di = 0.0;
    for (int pass = 0; pass < 3; pass++) {
      for (int part = 0; part < 2; part++) {
        const rlk_i64 j0 = part ? ks.b0 : ks.a0, j1 = part ? ks.b1 : ks.a1;
        for (rlk_i64 j = j0; j < j1; j++) {
          const uint16_t *kj = k + (j * Hkv + hk) * D, *vj = v + (j * Hkv + hk) * D;
          const double sc = pa_dot(qd, kj, D) * scale;
          if (pass == 0) {
            pa_online_add(&m, &l, sc);
            continue;
          }
          const double pij = exp(sc - m) / l;
          const double dp = pa_dot(dod, vj, D);
          if (pass == 1) {
            Di += pij * dp;
            continue;
          }
          const double ds = pij * (dp - Di);
          double *dka = dk_acc + (j * Hkv + hk) * D, *dva = dv_acc + (j * Hkv + hk) * D;
          for (int d = 0; d < D; d++) {
            dqa[d] += ds * pa_load(kj, d);
            dka[d] += scale * ds * qd[d];
            dva[d] += pij * dod[d];
          }
        }
      }
    }
    uint16_t *dqi = dq + (i * Hq + h) * D;
    for (int d = 0; d < D; d++) pa_store(dqi, d, scale * dqa[d]);
  }
}

RLK_HOST_KERNEL rlk_pattn_bwd(void **args) {
  const pa_bwd_args *p_ = (const pa_bwd_args *)args[0];
  uint16_t *dk = (uint16_t *)p_->dk, *dv = (uint16_t *)p_->dv;
  double *work = (double *)p_->work;
  const rlk_i64 nkv = p_->T * p_->Hkv * D;
  double *dk_acc = work, *dv_acc = work + nkv;
  for (rlk_i64 e = 0; e < 2 * nkv; e++) work[e] = 0.0;
  pa_each_query(p_->seq, p_->grp, p_->P, pa_bwd_query, p_);
  for (rlk_i64 e = 0; e < nkv; e++) {
    pa_store(dk, e, dk_acc[e]);
    pa_store(dv, e, dv_acc[e]);
  }
}

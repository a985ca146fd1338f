/* linear_divergence_combine.c - host form of rlk_linear_divergence_combine: each row's S records
 * (rlk.h's vocab-parallel units) merged in rank order in fp64, then lse, the entropy and the
 * forward or reverse KL, rounded to f32 once. Parameters: RLK_P_LABELS (0 none, 1 i32, 2 i64),
 * RLK_P_MODE (0 forward KL, 1 reverse KL). */
#include "linear_divergence_host.h"
#include "linear_divergence_params.h"

RLK_HOST_KERNEL rlk_linear_divergence_combine_host(void **args) {
  const ld_combine_args *p_ = (const ld_combine_args *)args[0];
  const rlk_i64 S = p_->S, N = p_->N;
  const float *rec = (const float *)p_->records;
  for (rlk_i64 i = 0; i < N; i++) {
    double M[2] = {-INFINITY, -INFINITY}; /* student, teacher */
    for (rlk_i64 r = 0; r < S; r++)
      for (int side = 0; side < 2; side++) {
        const double m = rec[(r * N + i) * 8 + 3 * side];
        M[side] = m > M[side] ? m : M[side];
      }
    double ss = 0, us = 0, gs = 0, st = 0, gt = 0;
    for (rlk_i64 r = 0; r < S; r++) {
      const float *x = rec + (r * N + i) * 8;
      if (x[1] > 0.0f) {
        const double d = (double)x[0] - M[0], f = exp(d);
        ss += f * x[1];
        us += f * ((double)x[2] + d * x[1]);
        gs += f * x[6];
      }
      if (x[4] > 0.0f) {
        const double f = exp((double)x[3] - M[1]);
        st += f * x[4];
        gt += f * x[5];
      }
    }
    const double ls = M[0] + log(ss), lt = M[1] + log(st);
    double D = 0.0;
    if (!ld_ignored(p_->labels, p_->label_stride, i, p_->ignore_index))
      D = RLK_P_MODE == LD_FKL ? gt / st - lt + ls : gs / ss - ls + lt;
    p_->divergence[i] = (float)D;
    float *o = p_->stats + 6 * i;
    o[0] = (float)ls, o[1] = (float)lt, o[2] = (float)D, o[3] = o[4] = o[5] = 0.0f;
    if (p_->entropy) p_->entropy[i] = (float)(log(ss) - us / ss);
    if (p_->zeros) p_->zeros[i] = 0.0f;
  }
}

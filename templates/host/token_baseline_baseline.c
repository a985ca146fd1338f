/* token_baseline_baseline.c - host form of rlk::token_baseline_baseline (see
 * templates/cuda/token_baseline.cuh): per group, the lengths, then per column (compact: per
 * valid-token index) the baseline summed over the members in order and the advantages; the
 * GPU thread's order. Parameters: RLK_P_DTYPE, RLK_P_MASK, RLK_P_COMPACT, RLK_P_OFFSETS
 * (TB_OFFSETS_*). */
#include "rlk_host_offsets.h"
#include "token_baseline_common.h"

RLK_HOST_KERNEL rlk_token_baseline_baseline(void **args) {
  const tb_baseline_args *p_ = (const tb_baseline_args *)args[0];
  const tb_t *returns = (const tb_t *)p_->returns;
  const void *mask = p_->mask;
  const tb_t *w_buf = (const tb_t *)p_->w_buf;
  const tb_t *g_buf = (const tb_t *)p_->g_buf;
  const int *pos = p_->pos;
  const int *len = p_->len;
  tb_t *adv = (tb_t *)p_->adv;
  const rlk_i64 rs = p_->returns_stride, ms = p_->mask_stride, as = p_->adv_stride, B = p_->B,
                T = p_->T;
  const tb_t eps = (tb_t)p_->eps;
  for (rlk_i64 g = 0; g < p_->num_groups; g++) {
    rlk_i64 start, end;
    if (RLK_P_OFFSETS == TB_OFFSETS_FIXED) {
      start = g * p_->group_size;
      end = start + p_->group_size;
      rlk_clamp_range(B, &start, &end);
    } else {
      rlk_offsets_range(p_->offsets, RLK_P_OFFSETS == TB_OFFSETS_I32, g, B, &start, &end);
    }

    int lmax = -1, lsecond = -1, nmax = 0;
    rlk_i64 imax = -1, n = 0;
    for (rlk_i64 i = start; i < end; i++) {
      const int L = len[i];
      if (RLK_P_COMPACT && L == 0) continue; /* no valid token: not a member of the group */
      n++;
      if (L > lmax) {
        lsecond = lmax;
        lmax = L;
        nmax = 1;
        imax = i;
      } else if (L == lmax) {
        lsecond = L;
        nmax++;
      } else if (L > lsecond) {
        lsecond = L;
      }
    }
    const int tail = p_->zero_tail && n >= 2 && nmax == 1;
    const rlk_i64 cols = RLK_P_COMPACT ? (lmax > 0 ? lmax : 0) : T;
    for (rlk_i64 t = 0; t < cols; t++) {
      tb_t b = 0;
      if (n >= 2) {
        tb_t num = 0, den = 0;
        for (rlk_i64 i = start; i < end; i++) {
          if (RLK_P_COMPACT) {
            if (t < len[i]) {
              const tb_t w = w_buf[i * T + t];
              num = num + g_buf[i * T + t] * w;
              den = den + w;
            }
          } else {
            const float m = rlk_mask_weight(RLK_P_MASK, mask, i * ms + t);
            if (m != 0.0f) {
              const tb_t w = w_buf[i * T + t];
              num = num + (returns[i * rs + t] * w) * (tb_t)m;
              den = den + w * (tb_t)m;
            }
          }
        }
        b = num / (den + eps);
      }
      for (rlk_i64 i = start; i < end; i++) {
        const tb_t bi = tail && i == imax && t >= lsecond ? (tb_t)0 : b;
        if (RLK_P_COMPACT) {
          if (t < len[i]) {
            const rlk_i64 col = pos[i * T + t];
            const float m = rlk_mask_weight(RLK_P_MASK, mask, i * ms + col);
            adv[i * as + col] = (g_buf[i * T + t] - bi) * (tb_t)m;
          }
        } else {
          const float m = rlk_mask_weight(RLK_P_MASK, mask, i * ms + t);
          adv[i * as + t] = m != 0.0f ? (returns[i * rs + t] - bi) * (tb_t)m : (tb_t)0;
        }
      }
    }
  }
}

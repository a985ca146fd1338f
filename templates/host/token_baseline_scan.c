/* token_baseline_scan.c - host form of rlk::token_baseline_scan (see
 * templates/cuda/token_baseline.cuh): per row, in 32-element chunks, the GPU team's inclusive
 * Hillis-Steele scan replayed lane by lane, then the carry of the earlier chunks: the same
 * additions in the same order. Parameters: RLK_P_DTYPE (float or double), RLK_P_MASK
 * (RLK_SEQ_MASK_*), RLK_P_COMPACT, RLK_P_ISW (0/1). */
#include "token_baseline_common.h"

static inline tb_t tb_exp(tb_t x) { return sizeof(tb_t) == sizeof(float) ? (tb_t)expf((float)x) : (tb_t)exp((double)x); }

/* In place: v[l] becomes the sum of v[0..l], added as the GPU team adds them. */
static void tb_team_scan(tb_t v[TB_TEAM], int32_t c[TB_TEAM]) {
  for (int d = 1; d < TB_TEAM; d <<= 1)
    for (int l = TB_TEAM - 1; l >= d; l--) {
      v[l] = v[l] + v[l - d];
      c[l] = c[l] + c[l - d];
    }
}

/* The mask weights m of a team's columns t0 + dir * l (0 outside [0, T)), and whether each counts
 * (k: its weight is nonzero). */
static void tb_team_mask(const void *mask, rlk_i64 m0, rlk_i64 t0, int dir, rlk_i64 T, float m[TB_TEAM],
                         int32_t k[TB_TEAM]) {
  for (int l = 0; l < TB_TEAM; l++) {
    const rlk_i64 t = t0 + dir * l;
    m[l] = t >= 0 && t < T ? rlk_mask_weight(RLK_P_MASK, mask, m0 + t) : 0.0f;
    k[l] = m[l] != 0.0f;
  }
}

RLK_HOST_KERNEL rlk_token_baseline_scan(void **args) {
  const tb_scan_args *p_ = (const tb_scan_args *)args[0];
  const tb_t *rewards = (const tb_t *)p_->rewards;
  const tb_t *old_logp = (const tb_t *)p_->old_logp;
  const tb_t *sum_pi_sq = (const tb_t *)p_->sum_pi_sq;
  const tb_t *isw = (const tb_t *)p_->isw;
  const void *mask = p_->mask;
  tb_t *returns = (tb_t *)p_->returns;
  tb_t *adv = (tb_t *)p_->adv;
  tb_t *w_buf = (tb_t *)p_->w_buf;
  tb_t *g_buf = (tb_t *)p_->g_buf;
  int *pos = p_->pos;
  int *len = p_->len;
  const rlk_i64 B = p_->B, T = p_->T;
  for (rlk_i64 row = 0; row < B; row++) {
    const rlk_i64 m0 = row * p_->mask_stride, ws0 = row * T;
    tb_t x[TB_TEAM], carry = 0;
    int32_t k[TB_TEAM], count = 0;
    float m[TB_TEAM];
    for (rlk_i64 c0 = 0; c0 < T; c0 += TB_TEAM) {
      tb_team_mask(mask, m0, c0, 1, T, m, k);
      for (int l = 0; l < TB_TEAM; l++) {
        const rlk_i64 t = c0 + l;
        tb_t w = 0;
        if (m[l] != 0.0f) {
          const tb_t pi = tb_exp(old_logp[row * p_->logp_stride + t]);
          w = ((tb_t)1 - (tb_t)2 * pi) + sum_pi_sq[row * p_->sps_stride + t];
          if (RLK_P_ISW) {
            const tb_t r = isw[row * p_->isw_stride + t];
            w = w * (r * r);
          }
          w = w * (tb_t)m[l];
        }
        x[l] = w;
      }
      tb_team_scan(x, k);
      for (int l = 0; l < TB_TEAM; l++) {
        const rlk_i64 t = c0 + l;
        const tb_t wt = carry + x[l];
        if (RLK_P_COMPACT) {
          if (m[l] != 0.0f) {
            w_buf[ws0 + count + k[l] - 1] = wt;
            pos[ws0 + count + k[l] - 1] = (int)t;
          }
        } else if (t < T) {
          w_buf[ws0 + t] = wt;
        }
      }
      carry = carry + x[TB_TEAM - 1];
      count += k[TB_TEAM - 1];
    }
    len[row] = count;

    carry = 0;
    int32_t after = 0;
    for (rlk_i64 c0 = 0; c0 < T; c0 += TB_TEAM) {
      tb_team_mask(mask, m0, T - 1 - c0, -1, T, m, k);
      for (int l = 0; l < TB_TEAM; l++) {
        const rlk_i64 t = T - 1 - (c0 + l);
        x[l] = m[l] != 0.0f ? rewards[row * p_->reward_stride + t] * (tb_t)m[l] : (tb_t)0;
      }
      tb_team_scan(x, k);
      for (int l = 0; l < TB_TEAM; l++) {
        const rlk_i64 t = T - 1 - (c0 + l);
        if (t < 0) break;
        const tb_t g = carry + x[l];
        returns[row * p_->returns_stride + t] = g;
        if (RLK_P_COMPACT) {
          if (m[l] != 0.0f)
            g_buf[ws0 + count - (after + k[l])] = g;
          else
            adv[row * p_->adv_stride + t] = 0;
        }
      }
      carry = carry + x[TB_TEAM - 1];
      after += k[TB_TEAM - 1];
    }
  }
}

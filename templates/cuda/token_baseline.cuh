/* token_baseline.cuh - optimal token baseline advantages (per-timestep group baselines weighted
 * by each member's cumulative path variance).
 *
 * Two entries, launched in this order by src/ops/token_baseline.c:
 *   token_baseline_scan      a 32-lane team per row: returns (reverse cumsum of rewards x mask),
 *                            W (cumsum of w x mask, w = 1 - 2 exp(old_logp) + sum_pi_sq, times
 *                            isw^2 when given) and the row's valid-token count; compact mode packs
 *                            each valid token's column, W and return at its index k
 *   token_baseline_baseline  a thread per column (compact: per valid-token index) of a group:
 *                            the baseline sum(G W m) / (sum(W m) + eps) over the members in
 *                            member order, then the members' advantages (G - baseline) x m
 *
 * Scans run in chunks of 32 elements: an inclusive Hillis-Steele scan over the team's lanes
 * (lane l adds lane l - d's partial for d = 1, 2, 4, 8, 16), then the running carry of earlier
 * chunks is added. The team is 32 lanes on every target (two teams per 64-lane wavefront), and
 * the host kernel replays the same lanes: the rounding depends on the values only. Masked
 * elements (mask 0) contribute exactly 0 whatever their values are. Bad group offsets are
 * clamped into [0, B]. Inputs, and what the scan left for the baseline kernel, are never written
 * by the kernel that reads them (outputs overlap no input): read-only loads (ld_ro). The enum
 * values are the indices of the op's choice names. */
#ifndef RLK_TOKEN_BASELINE_CUH
#define RLK_TOKEN_BASELINE_CUH

#include "rlk_prelude.cuh"
#include "seq_mask.cuh"
#include "token_baseline_params.h"

namespace rlk {
namespace tb {

/* The value of lane `lane - d` of the team (within the team; the caller ignores lanes < d). */
template <typename T> RLK_DEVICE T team_up(T v, int d) {
#if defined(RLK_HIP)
  return __shfl_up(v, (unsigned)d, TB_TEAM);
#else
  return __shfl_up_sync(0xffffffffu, v, (unsigned)d, TB_TEAM);
#endif
}

/* The value of the team's last lane. */
template <typename T> RLK_DEVICE T team_last(T v) {
#if defined(RLK_HIP)
  return __shfl(v, TB_TEAM - 1, TB_TEAM);
#else
  return __shfl_sync(0xffffffffu, v, TB_TEAM - 1, TB_TEAM);
#endif
}

/* Inclusive scan over the team's lanes (every lane of the team calls it). */
template <typename T> RLK_DEVICE T team_scan(T v, int lane) {
#pragma unroll
  for (int d = 1; d < TB_TEAM; d <<= 1) {
    const T u = team_up(v, d);
    if (lane >= d) v = v + u;
  }
  return v;
}

/* [start, end) of group g, clamped into [0, B] and non-decreasing. */
template <int OFFSETS>
RLK_DEVICE void group_range(i64 g, i64 B, i64 group_size, const void *offsets, i64 *start, i64 *end) {
  if (OFFSETS == TB_OFFSETS_FIXED) {
    *start = min_(g * group_size, B);
    *end = min_(*start + group_size, B);
    return;
  }
  clamped_offsets<OFFSETS == TB_OFFSETS_I32>(offsets, g, B, start, end);
}

} /* namespace tb */

/* Per row: W, returns and the valid-token count (see the top of the file). Rows are
 * grid-strided per team with a team-uniform loop, so every lane reaches every shuffle.
 * Forward pass (W, positions, count), then reverse pass (returns; compact: the returns of the
 * valid tokens, whose index is count - (valid tokens from here to the end), and 0 advantages
 * where masked). */
template <typename TS, int MASK, bool COMPACT, bool ISW>
__global__ void token_baseline_scan(RLK_PARAMS_ARG tb_scan_args p_) {
  const TS *__restrict__ rewards = (const TS *)p_.rewards;
  const TS *__restrict__ old_logp = (const TS *)p_.old_logp;
  const TS *__restrict__ sum_pi_sq = (const TS *)p_.sum_pi_sq;
  const TS *__restrict__ isw = (const TS *)p_.isw;
  const void *__restrict__ mask = p_.mask;
  TS *__restrict__ returns = (TS *)p_.returns;
  TS *__restrict__ adv = (TS *)p_.adv;
  TS *__restrict__ w_buf = (TS *)p_.w_buf;
  TS *__restrict__ g_buf = (TS *)p_.g_buf;
  i32 *__restrict__ pos = p_.pos;
  i32 *__restrict__ len = p_.len;
  const i64 reward_stride = p_.reward_stride, mask_stride = p_.mask_stride,
            logp_stride = p_.logp_stride, sps_stride = p_.sps_stride, isw_stride = p_.isw_stride,
            returns_stride = p_.returns_stride, adv_stride = p_.adv_stride, B = p_.B, T = p_.T;
  const int lane = (int)(threadIdx.x % TB_TEAM);
  const i64 teams = blockDim.x / TB_TEAM;
  for (i64 row = (i64)blockIdx.x * teams + threadIdx.x / TB_TEAM; row < B; row += (i64)gridDim.x * teams) {
    const i64 m0 = row * mask_stride, ws0 = row * T;
    TS carry = TS(0);
    i32 count = 0;
    for (i64 c0 = 0; c0 < T; c0 += TB_TEAM) {
      const i64 t = c0 + lane;
      const float m = t < T ? seq_mask_weight<MASK, true>(mask, m0 + t) : 0.0f;
      TS w = TS(0);
      if (m != 0.0f) {
        const TS pi = exp_(ld_ro(old_logp + row * logp_stride + t));
        w = (TS(1) - TS(2) * pi) + ld_ro(sum_pi_sq + row * sps_stride + t);
        if (ISW) {
          const TS r = ld_ro(isw + row * isw_stride + t);
          w = w * (r * r);
        }
        w = w * (TS)m;
      }
      const TS x = tb::team_scan(w, lane);
      const i32 k = tb::team_scan((i32)(m != 0.0f), lane);
      const TS wt = carry + x;
      if (COMPACT) {
        if (m != 0.0f) {
          w_buf[ws0 + count + k - 1] = wt;
          pos[ws0 + count + k - 1] = (i32)t;
        }
      } else if (t < T) {
        w_buf[ws0 + t] = wt;
      }
      carry = carry + tb::team_last(x);
      count += tb::team_last(k);
    }
    if (lane == 0) len[row] = count;

    carry = TS(0);
    i32 after = 0;
    for (i64 c0 = 0; c0 < T; c0 += TB_TEAM) {
      const i64 t = T - 1 - (c0 + lane);
      const float m = t >= 0 ? seq_mask_weight<MASK, true>(mask, m0 + t) : 0.0f;
      const TS r = m != 0.0f ? ld_ro(rewards + row * reward_stride + t) * (TS)m : TS(0);
      const TS x = tb::team_scan(r, lane);
      const i32 k = tb::team_scan((i32)(m != 0.0f), lane);
      const TS g = carry + x;
      if (t >= 0) {
        returns[row * returns_stride + t] = g;
        if (COMPACT) {
          if (m != 0.0f)
            g_buf[ws0 + count - (after + k)] = g;
          else
            adv[row * adv_stride + t] = TS(0);
        }
      }
      carry = carry + tb::team_last(x);
      after += tb::team_last(k);
    }
  }
}

/* Baselines and advantages: grid.y strides over groups, grid.x and the threads over columns
 * (compact: valid-token indices). Every thread reads the group's lengths itself (the longest
 * member, whether it is unique, the second-longest length), then sums over the members in
 * order. A group of fewer than two members (compact: with a valid token) has baseline 0. */
template <typename TS, int MASK, bool COMPACT, int OFFSETS>
__global__ void token_baseline_baseline(RLK_PARAMS_ARG tb_baseline_args p_) {
  const TS *__restrict__ returns = (const TS *)p_.returns;
  const void *__restrict__ mask = p_.mask;
  const TS *__restrict__ w_buf = (const TS *)p_.w_buf;
  const TS *__restrict__ g_buf = (const TS *)p_.g_buf;
  const i32 *__restrict__ pos = p_.pos;
  const i32 *__restrict__ len = p_.len;
  TS *__restrict__ adv = (TS *)p_.adv;
  const i64 returns_stride = p_.returns_stride, mask_stride = p_.mask_stride,
            adv_stride = p_.adv_stride, B = p_.B, T = p_.T, group_size = p_.group_size,
            num_groups = p_.num_groups;
  const void *offsets = p_.offsets;
  const TS eps = (TS)p_.eps;
  const bool zero_tail = p_.zero_tail != 0;
  for (i64 g = blockIdx.y; g < num_groups; g += gridDim.y) {
    i64 start, end;
    tb::group_range<OFFSETS>(g, B, group_size, offsets, &start, &end);
    i32 lmax = -1, lsecond = -1, nmax = 0;
    i64 imax = -1, n = 0;
    for (i64 i = start; i < end; ++i) {
      const i32 L = ld_ro(len + i);
      if (COMPACT && L == 0) continue; /* no valid token: not a member of the group */
      ++n;
      if (L > lmax) {
        lsecond = lmax;
        lmax = L;
        nmax = 1;
        imax = i;
      } else if (L == lmax) {
        lsecond = L;
        ++nmax;
      } else if (L > lsecond) {
        lsecond = L;
      }
    }
    const bool tail = zero_tail && n >= 2 && nmax == 1;
    const i64 cols = COMPACT ? (i64)max_(lmax, 0) : T;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < cols; t += (i64)gridDim.x * blockDim.x) {
      TS b = TS(0);
      if (n >= 2) {
        TS num = TS(0), den = TS(0);
        for (i64 i = start; i < end; ++i) {
          if (COMPACT) {
            if (t < ld_ro(len + i)) {
              const TS w = ld_ro(w_buf + i * T + t);
              num = num + ld_ro(g_buf + i * T + t) * w;
              den = den + w;
            }
          } else {
            const float m = seq_mask_weight<MASK, true>(mask, i * mask_stride + t);
            if (m != 0.0f) {
              const TS w = ld_ro(w_buf + i * T + t);
              num = num + (ld_ro(returns + i * returns_stride + t) * w) * (TS)m;
              den = den + w * (TS)m;
            }
          }
        }
        b = num / (den + eps);
      }
      for (i64 i = start; i < end; ++i) {
        const TS bi = tail && i == imax && t >= lsecond ? TS(0) : b;
        if (COMPACT) {
          if (t < ld_ro(len + i)) {
            const i64 col = ld_ro(pos + i * T + t);
            const float m = seq_mask_weight<MASK, true>(mask, i * mask_stride + col);
            adv[i * adv_stride + col] = (ld_ro(g_buf + i * T + t) - bi) * (TS)m;
          }
        } else {
          const float m = seq_mask_weight<MASK, true>(mask, i * mask_stride + t);
          adv[i * adv_stride + t] = m != 0.0f ? (ld_ro(returns + i * returns_stride + t) - bi) * (TS)m : TS(0);
        }
      }
    }
  }
}

} /* namespace rlk */

#endif /* RLK_TOKEN_BASELINE_CUH */

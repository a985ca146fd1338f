/* masked_whiten.cuh - whitening over all valid elements of a [B, T] batch, in two launches
 * (src/ops/masked_whiten.c):
 *   masked_whiten_stats  block g reduces the flat chunks g, g + G, ... to (count, mean, M2) in
 *                        fp64 and writes them to partials[g] (workspace, G = gridDim.x)
 *   masked_whiten_apply  every block merges the G partials in one fixed order (identical in
 *                        every block), derives mean and rstd, and transforms its chunks
 *
 * Statistics are robust two-pass ones without a second read: each warp takes the exact mean and
 * squared deviations of the (at most 32 * K) values it holds, then merges that into its running
 * (count, mean, M2) with Chan's pairwise update; warps, blocks and partials merge the same way in
 * index order. No atomics anywhere: bitwise repeatable for a shape on a device.
 *
 * Elements are a flat index over [B, T] (row b, column t = i - b T): a thread's K consecutive
 * elements use vector accesses when they lie in one row at aligned addresses. out may be x (in
 * place): each element is read and then written by the same thread. */
#ifndef RLK_MASKED_WHITEN_CUH
#define RLK_MASKED_WHITEN_CUH

#include "advantage_scan_common.cuh"
#include "masked_whiten_params.h"

namespace rlk {
namespace mw {

struct stat {
  double n, mean, m2;
};

RLK_DEVICE stat merge(const stat &a, const stat &b) {
  if (b.n == 0.0) return a;
  if (a.n == 0.0) return b;
  stat r;
  r.n = a.n + b.n;
  const double d = b.mean - a.mean;
  const double f = b.n / r.n;
  r.mean = a.mean + d * f;
  r.m2 = a.m2 + b.m2 + d * d * a.n * f;
  return r;
}

/* The K elements of flat index i0 (and their valid flags: false past the end); writes the
 * row/column of the group's first element and whether it lies in one row. RO: x is read-only
 * for the kernel (the statistics; the transform may run in place). */
template <typename TS, int K, bool RO>
RLK_DEVICE void load_group(const TS *x, i64 xs, const void *mask, i64 ms, int kind, i64 B, i64 T,
                           i64 i0, TS v[K], bool m[K], i64 *b0, i64 *t0, bool *one_row) {
  const i64 total = B * T;
  i64 b = i0 / T, t = i0 - (i0 / T) * T;
  *b0 = b;
  *t0 = t;
  *one_row = i0 < total && t + K <= T;
  if (*one_row) {
    const TS *p = x + b * xs + t;
    const bool vec = is_aligned<16>(p) && seq::mask_vec_ok<K>(mask, kind, b * ms + t);
    seq::load_vals<TS, K, RO>(p, K, vec, v);
    seq::load_valid<K>(mask, kind, b * ms + t, K, vec, m);
    return;
  }
#pragma unroll
  for (int j = 0; j < K; ++j) {
    if (i0 + j < total) {
      if (t == T) {
        t = 0;
        ++b;
      }
      v[j] = seq::rd<RO>(x + b * xs + t);
      m[j] = seq::valid_at(mask, kind, b * ms + t);
      ++t;
    } else {
      v[j] = TS(0);
      m[j] = false;
    }
  }
}

/* mean and rstd as the op defines them from the merged statistics; NaN where undefined. */
RLK_DEVICE void finish(const stat &a, double eps, double count_eps, int flags, double *mean_out,
                       double *var_out, double *rstd_out) {
  const double nan = limits<double>::quiet_nan();
  const double N = a.n;
  double mean = count_eps == 0.0 ? a.mean : N * a.mean / (N + count_eps);
  const double dm = a.mean - mean;
  double var = (a.m2 + N * dm * dm) / (N + count_eps);
  if (flags & MW_FLAG_UNBIASED) var = N > 1.0 ? var * (N / (N - 1.0)) : nan;
  if (N == 0.0) {
    mean = nan;
    var = nan;
  }
  double rstd;
  if (flags & MW_FLAG_NO_STD)
    rstd = 1.0;
  else if (flags & MW_FLAG_EPS_CLAMP)
    rstd = 1.0 / sqrt(var < eps ? eps : var); /* NaN stays NaN, like a clamp */
  else
    rstd = 1.0 / sqrt(var + eps);
  if (N == 0.0) rstd = nan;
  *mean_out = mean;
  *var_out = var;
  *rstd_out = rstd;
}

} /* namespace mw */

/* Partial statistics of the valid elements: block g covers the flat chunks of blockDim.x * K
 * elements g, g + gridDim.x, ...; partials[3 g + {0, 1, 2}] = count, mean, M2. */
template <typename TS>
__global__ void masked_whiten_stats(RLK_PARAMS_ARG mw_stats_args p_) {
  const TS *__restrict__ x = (const TS *)p_.x;
  const void *__restrict__ mask = p_.mask;
  const i64 xs = p_.xs, ms = p_.ms, B = p_.B, T = p_.T;
  const int mask_kind = p_.mask_kind;
  double *__restrict__ partials = p_.partials;
  constexpr int K = seq::group<TS>::size;
  __shared__ double sh[3 * RLK_MAX_WARPS];
  const int lane = (int)(threadIdx.x % RLK_WARP_SIZE);
  const int warp = (int)(threadIdx.x / RLK_WARP_SIZE);
  const int nw = (int)(blockDim.x / RLK_WARP_SIZE);
  const i64 chunk = (i64)blockDim.x * K;
  const i64 chunks = (B * T + chunk - 1) / chunk;
  mw::stat run = {0.0, 0.0, 0.0};
  for (i64 c = blockIdx.x; c < chunks; c += gridDim.x) {
    TS v[K];
    bool m[K];
    i64 b0, t0;
    bool one_row;
    mw::load_group<TS, K, true>(x, xs, mask, ms, mask_kind, B, T, c * chunk + (i64)threadIdx.x * K, v, m,
                          &b0, &t0, &one_row);
    double cnt = 0.0, sum = 0.0;
#pragma unroll
    for (int j = 0; j < K; ++j)
      if (m[j]) {
        cnt += 1.0;
        sum += (double)v[j];
      }
    cnt = warp_sum(cnt);
    sum = warp_sum(sum);
    if (cnt > 0.0) { /* warp-uniform: every lane holds the same butterfly total */
      const double mean = sum / cnt;
      double q = 0.0;
#pragma unroll
      for (int j = 0; j < K; ++j)
        if (m[j]) {
          const double d = (double)v[j] - mean;
          q += d * d;
        }
      q = warp_sum(q);
      const mw::stat s = {cnt, mean, q};
      run = mw::merge(run, s);
    }
  }
  if (lane == 0) {
    sh[3 * warp + 0] = run.n;
    sh[3 * warp + 1] = run.mean;
    sh[3 * warp + 2] = run.m2;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mw::stat tot = {0.0, 0.0, 0.0};
    for (int w = 0; w < nw; ++w) {
      const mw::stat s = {sh[3 * w + 0], sh[3 * w + 1], sh[3 * w + 2]};
      tot = mw::merge(tot, s);
    }
    partials[3 * (i64)blockIdx.x + 0] = tot.n;
    partials[3 * (i64)blockIdx.x + 1] = tot.mean;
    partials[3 * (i64)blockIdx.x + 2] = tot.m2;
  }
}

/* The transform. Warp 0 of every block merges partials[0 .. nparts) (lane l takes l, l + W, ...
 * in order, then a shuffle-down tree), so every block derives bitwise the same mean and rstd;
 * block 0 writes them to `stats` (may be NULL). Flags: MW_FLAG_*. */
template <typename TS>
__global__ void masked_whiten_apply(RLK_PARAMS_ARG mw_apply_args p_) {
  const TS *x = (const TS *)p_.x;
  const void *mask = p_.mask;
  TS *out = (TS *)p_.out;
  const i64 xs = p_.xs, ms = p_.ms, os = p_.os, B = p_.B, T = p_.T;
  const int mask_kind = p_.mask_kind, nparts = p_.nparts, flags = p_.flags;
  const double *partials = p_.partials;
  const double eps = p_.eps, count_eps = p_.count_eps;
  double *stats = p_.stats;
  constexpr int K = seq::group<TS>::size;
  __shared__ double coef[2];
  const int lane = (int)(threadIdx.x % RLK_WARP_SIZE);
  if (threadIdx.x < RLK_WARP_SIZE) {
    mw::stat a = {0.0, 0.0, 0.0};
    for (int i = lane; i < nparts; i += RLK_WARP_SIZE) {
      const mw::stat s = {partials[3 * i + 0], partials[3 * i + 1], partials[3 * i + 2]};
      a = mw::merge(a, s);
    }
#pragma unroll
    for (int off = RLK_WARP_SIZE / 2; off > 0; off >>= 1) {
      mw::stat o;
      o.n = shfl_down(a.n, off);
      o.mean = shfl_down(a.mean, off);
      o.m2 = shfl_down(a.m2, off);
      if (lane < off) a = mw::merge(a, o);
    }
    if (lane == 0) {
      double mean, var, rstd;
      mw::finish(a, eps, count_eps, flags, &mean, &var, &rstd);
      coef[0] = mean;
      coef[1] = rstd;
      if (blockIdx.x == 0 && stats) {
        stats[0] = mean;
        stats[1] = var;
        stats[2] = a.n;
      }
    }
  }
  __syncthreads();
  const TS mean = (TS)coef[0], rstd = (TS)coef[1];
  const bool keep_mean = (flags & MW_FLAG_KEEP_MEAN) != 0;
  const bool zero_masked = (flags & MW_FLAG_MASKED_ZERO) != 0;
  const i64 chunk = (i64)blockDim.x * K;
  const i64 total = B * T;
  const i64 chunks = (total + chunk - 1) / chunk;
  for (i64 c = blockIdx.x; c < chunks; c += gridDim.x) {
    const i64 i0 = c * chunk + (i64)threadIdx.x * K;
    if (i0 >= total) continue;
    TS v[K], y[K];
    bool m[K];
    i64 b0, t0;
    bool one_row;
    mw::load_group<TS, K, false>(x, xs, mask, ms, mask_kind, B, T, i0, v, m, &b0, &t0, &one_row);
#pragma unroll
    for (int j = 0; j < K; ++j) {
      TS w = (v[j] - mean) * rstd;
      if (keep_mean) w += mean;
      y[j] = (zero_masked && !m[j]) ? TS(0) : w;
    }
    if (one_row) {
      TS *p = out + b0 * os + t0;
      seq::store_vals<TS, K>(p, K, is_aligned<16>(p), y);
    } else {
      i64 b = b0, t = t0;
      for (int j = 0; j < K && i0 + j < total; ++j) {
        if (t == T) {
          t = 0;
          ++b;
        }
        out[b * os + t] = y[j];
        ++t;
      }
    }
  }
}

} /* namespace rlk */

#endif /* RLK_MASKED_WHITEN_CUH */

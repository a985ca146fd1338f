/* linear_divergence.cuh - rlk_linear_divergence's portable forward kernels (every CUDA target and
 * HIP), launched in this order by src/ops/linear_divergence.c:
 *
 *   linear_divergence_fwd_tiled  a block per (64-row block, vocabulary split): 64 x 64 tiles of both
 *                                heads' logits from shared memory in f32 (the fused head's
 *                                tile_product, K = H_s and K = H_t), folded into the row's state
 *                                (linear_divergence_common.cuh); the logits never leave the block.
 *                                KIND 1 also keeps, per row, the split's TOPK_MAX-bounded list of
 *                                its largest teacher logits in shared memory; KIND 2 is JSD's second
 *                                pass (the lse's from stats): per (split, row) {A, B} sums
 *   linear_divergence_combine    a thread a row: the records in split order -> lse's, entropy,
 *                                and the forward or reverse KL (or one merged record: the shard form)
 *   linear_divergence_jsd_combine  JSD: the second pass's sums in split order -> D, A, B
 *   linear_divergence_topk       top-k: a block a row merges the splits' lists into the set K, takes
 *                                the student's logits there (k dot products) -> D, P, the last member
 *                                (also after linear_divergence_fwd_sm90's lists, which hold z_t)
 * Fixed orders everywhere (splits, lanes by butterfly, lists by a total order): bitwise repeatable. */
#ifndef RLK_LINEAR_DIVERGENCE_CUH
#define RLK_LINEAR_DIVERGENCE_CUH

#include "linear_divergence_common.cuh"

namespace rlk {
namespace ld {

/* A teacher logit of a split's top-k list: value and column (-1: none). */
struct alignas(8) cand {
  float x;
  i32 col;
};

/* The top-k order: a before b when its value is larger, or equal at a lower column. */
RLK_DEVICE bool before(float xa, i32 ca, float xb, i32 cb) { return xa > xb || (xa == xb && ca < cb); }

} /* namespace ld */

template <int SDT, int TDT, int KIND>
__global__ void __launch_bounds__(LD_THREADS)
    linear_divergence_fwd_tiled(RLK_PARAMS_ARG ld_fwd_tiled_args p_) {
  typedef typename ll::elem<SDT>::type TS;
  typedef typename ll::elem<TDT>::type TT;
  const TS *sh = (const TS *)p_.s_hidden, *sw = (const TS *)p_.s_weight;
  const TT *th = (const TT *)p_.t_hidden, *tw = (const TT *)p_.t_weight;
  const i64 shs = p_.s_h_stride, sws = p_.s_w_stride, ths = p_.t_h_stride, tws = p_.t_w_stride;
  const i64 N = p_.N, V = p_.V, Hs = p_.Hs, Ht = p_.Ht, cols_per_split = p_.cols_per_split;
  constexpr int BM = LD_TILE, BN = LD_TILE;
  static_assert(BM == 64 && LD_THREADS == 256, "written for 64 x 64 tiles of 256 threads: 16 x 16, 4 x 4 each");
  /* the tile products' operands; between tiles (KIND 1) the teacher tile, column-major */
  __shared__ float buf[2][32][64];
  __shared__ float list_x[KIND == LD_KIND_TOPK ? LD_TOPK_MAX : 1][64];
  __shared__ i32 list_c[KIND == LD_KIND_TOPK ? LD_TOPK_MAX : 1][64];
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
  const i64 row0 = (i64)blockIdx.x * BM;
  const i64 v_begin = (i64)blockIdx.y * cols_per_split;
  const i64 v_end = min_(V, v_begin + cols_per_split);
  const float cs = RLK_LL_LOG2E / p_.s_temperature, ct = RLK_LL_LOG2E / p_.t_temperature;
  const i64 k = p_.top_k;
  ld::state st[4];
  float A[4], B[4], Ls[4], Lt[4];
  /* JSD: log2(1 - beta) and log2(beta), the mixture's weights */
  const float la = KIND == LD_KIND_JSD ? ld::log2_approx((float)(1.0 - p_.beta)) : 0.0f;
  const float lb = KIND == LD_KIND_JSD ? ld::log2_approx((float)p_.beta) : 0.0f;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    st[r] = ld::empty_state();
    A[r] = B[r] = Ls[r] = Lt[r] = 0.0f;
  }
  if (KIND == LD_KIND_TOPK && tid < BM)
    for (i64 j = 0; j < k; ++j) {
      list_x[j][tid] = -limits<float>::infinity();
      list_c[j][tid] = -1;
    }
  for (i64 col0 = v_begin; col0 < v_end; col0 += BN) {
    float as_[4][4], at_[4][4];
    const auto hsa = [&](int r, i64 kk) { return row0 + r < N ? to_float(sh[(row0 + r) * shs + kk]) : 0.0f; };
    const auto wsb = [&](int r, i64 kk) { return col0 + r < v_end ? to_float(sw[(col0 + r) * sws + kk]) : 0.0f; };
    const auto hta = [&](int r, i64 kk) { return row0 + r < N ? to_float(th[(row0 + r) * ths + kk]) : 0.0f; };
    const auto wtb = [&](int r, i64 kk) { return col0 + r < v_end ? to_float(tw[(col0 + r) * tws + kk]) : 0.0f; };
    tile_product(as_, hsa, wsb, Hs, buf[0], buf[1]);
    tile_product(at_, hta, wtb, Ht, buf[0], buf[1]);
    const i64 lim = v_end - col0 - tx; /* as_[r][cc] is column tx + 16 cc of the tile */
    bool ok[4];
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) ok[cc] = (i64)(16 * cc) < lim;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      float ys[4], yt[4];
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        ys[cc] = as_[r][cc] * cs;
        yt[cc] = at_[r][cc] * ct;
      }
      if (KIND != LD_KIND_JSD) {
        ld::fold<4>(st[r], ys, yt, ok);
      } else {
        const i64 row = row0 + ty * 4 + r;
        if (row < N && col0 == v_begin) {
          Ls[r] = p_.stats[row * LD_STATS + 0] * RLK_LL_LOG2E;
          Lt[r] = p_.stats[row * LD_STATS + 1] * RLK_LL_LOG2E;
        }
        ld::jsd_fold<4>(&A[r], &B[r], ys, yt, ok, Ls[r], Lt[r], la, lb);
      }
    }
    if (KIND == LD_KIND_TOPK) {
      /* the teacher tile into shared memory (free after the products), column-major, then a
       * thread a row merges its 64 values into the row's list */
      float *tile = &buf[0][0][0];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int cc = 0; cc < 4; ++cc)
          tile[(tx + 16 * cc) * 64 + ty * 4 + r] = ok[cc] ? at_[r][cc] : -limits<float>::infinity();
      __syncthreads();
      if (tid < BM) {
        for (int c = 0; c < BN; ++c) {
          const float x = tile[c * 64 + tid];
          const i32 col = (i32)(col0 + c);
          if (x == -limits<float>::infinity() || !ld::before(x, col, list_x[k - 1][tid], list_c[k - 1][tid])) continue;
          i64 j = k - 1;
          for (; j > 0 && ld::before(x, col, list_x[j - 1][tid], list_c[j - 1][tid]); --j) {
            list_x[j][tid] = list_x[j - 1][tid];
            list_c[j][tid] = list_c[j - 1][tid];
          }
          list_x[j][tid] = x;
          list_c[j][tid] = col;
        }
      }
      __syncthreads(); /* before the next products overwrite the tile */
    }
  }
  if (KIND == LD_KIND_JSD) {
    f32x4 *out = (f32x4 *)p_.partials;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float a = segment_sum<16>(A[r]), b = segment_sum<16>(B[r]);
      const i64 row = row0 + ty * 4 + r;
      if (tx == 0 && row < N) {
        f32x4 o;
        o.x = a * RLK_LL_LN2;
        o.y = b * RLK_LL_LN2;
        o.z = o.w = 0.0f;
        out[(i64)blockIdx.y * N + row] = o;
      }
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const ld::state s = ld::lane_merge<16>(st[r]);
    const i64 row = row0 + ty * 4 + r;
    if (tx == 0 && row < N) ld::store_record((float *)p_.partials + ((i64)blockIdx.y * N + row) * 8, s);
  }
  if (KIND == LD_KIND_TOPK && tid < BM && row0 + tid < N) {
    ld::cand *out = (ld::cand *)p_.lists + ((i64)blockIdx.y * N + row0 + tid) * k;
    for (i64 j = 0; j < k; ++j) {
      ld::cand c;
      c.x = list_x[j][tid];
      c.col = list_c[j][tid];
      out[j] = c;
    }
  }
}

/* One thread a row: the row's S records (records [S][N][8], rlk.h's units) merged in split
 * order. FKL / RKL: lse's, entropy, D and the stats; JSD / TOPK: lse's and entropy (the next
 * launch writes D and the rest). merged != NULL: the merged record instead (the shard form). */
template <int LAB, int MODE>
__global__ void __launch_bounds__(LD_THREADS) linear_divergence_combine(RLK_PARAMS_ARG ld_combine_args p_) {
  const float *__restrict__ rec = (const float *)p_.records;
  const i64 S = p_.S, N = p_.N;
  const i64 row = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= N) return;
  float Ms = -limits<float>::infinity(), Mt = -limits<float>::infinity();
  for (i64 r = 0; r < S; ++r) {
    Ms = fmaxf(Ms, rec[(r * N + row) * 8 + 0]);
    Mt = fmaxf(Mt, rec[(r * N + row) * 8 + 3]);
  }
  float ss = 0.0f, us = 0.0f, gs = 0.0f, st = 0.0f, gt = 0.0f;
  for (i64 r = 0; r < S; ++r) {
    const f32x4 a = *(const f32x4 *)(rec + (r * N + row) * 8), b = *(const f32x4 *)(rec + (r * N + row) * 8 + 4);
    if (a.y > 0.0f) {
      const float d = a.x - Ms, f = exp2_approx(d * RLK_LL_LOG2E);
      ss = fmaf(f, a.y, ss);
      us = fmaf(f, fmaf(d, a.y, a.z), us);
      gs = fmaf(f, b.z, gs);
    }
    if (b.x > 0.0f) {
      const float f = exp2_approx((a.w - Mt) * RLK_LL_LOG2E);
      st = fmaf(f, b.x, st);
      gt = fmaf(f, b.y, gt);
    }
  }
  if (p_.merged) {
    f32x4 a, b;
    a.x = Ms, a.y = ss, a.z = us, a.w = Mt;
    b.x = st, b.y = gt, b.z = gs, b.w = 0.0f;
    *(f32x4 *)(p_.merged + row * 8) = a;
    *(f32x4 *)(p_.merged + row * 8 + 4) = b;
    return;
  }
  const float ln_ss = logf(ss), ln_st = logf(st);
  float *o = p_.stats + row * LD_STATS;
  o[0] = Ms + ln_ss;
  o[1] = Mt + ln_st;
  if (p_.entropy) p_.entropy[row] = ln_ss - us / ss;
  if (p_.zeros) p_.zeros[row] = 0.0f;
  if (MODE == LD_FKL || MODE == LD_RKL) {
    const bool ign = ld::ignored<LAB>(p_.labels, p_.label_stride, row, p_.ignore_index);
    /* FKL: sum p_t (z_t - z_s) - lse_t + lse_s, with the maxima and logarithms paired */
    const float D = ign ? 0.0f
                    : MODE == LD_FKL ? (gt / st + (Ms - Mt)) + (ln_ss - ln_st)
                                      : (gs / ss + (Mt - Ms)) + (ln_st - ln_ss);
    p_.divergence[row] = D;
    o[2] = D;
    o[3] = o[4] = o[5] = 0.0f;
  }
}

/* JSD: one thread a row sums the second pass's {A, B} (records [S][N], natural log) in split
 * order: D = beta B + (1 - beta) A. */
template <int LAB>
__global__ void __launch_bounds__(LD_THREADS) linear_divergence_jsd_combine(RLK_PARAMS_ARG ld_jsd_combine_args p_) {
  const f32x4 *__restrict__ part = (const f32x4 *)p_.records;
  const i64 S = p_.S, N = p_.N;
  const i64 row = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= N) return;
  float A = 0.0f, B = 0.0f;
  for (i64 r = 0; r < S; ++r) {
    const f32x4 x = part[r * N + row];
    A += x.x;
    B += x.y;
  }
  /* each weight rounded from the double (1 - (float)beta loses 1 - beta's digits near 1) */
  const float wa = (float)(1.0 - p_.beta), wb = (float)p_.beta;
  const bool ign = ld::ignored<LAB>(p_.labels, p_.label_stride, row, p_.ignore_index);
  const float D = ign ? 0.0f : fmaf(wb, B, wa * A);
  p_.divergence[row] = D;
  float *o = p_.stats + row * LD_STATS;
  o[2] = D;
  o[3] = ign ? 0.0f : A;
  o[4] = ign ? 0.0f : B;
  o[5] = 0.0f;
}

/* Top-k: a block of 256 threads a row. The S lists of k (lists [S][N][k], each sorted in the top-k
 * order, empty entries (column -1) last) hold every candidate (each column in one split; a -inf
 * or NaN teacher logit never enters a list); a candidate's rank is the number of candidates
 * before it: its place in its own list plus, in each other list, the entries before it (a binary
 * search; an empty entry comes before none), so the set is the ranks below k, in order, whatever
 * order the lists came in. Fewer than k candidates in all (a row whose other teacher logits are
 * -inf: probability 0) fill the ranks below their count, n_k; the ranks past it are never read.
 * Then the student's logit at each member (a dot product by 8 threads, in a fixed order), and
 *   D = sum_K p_t (log p_t - log p_s),  P = sum_K p_t,  summed by one thread in rank order;
 * an empty set (every teacher logit -inf: no distribution) gives D and P NaN and the boundary
 * (+inf, column -1), before which no column comes (rlk.h). */
template <int SDT, int LAB>
__global__ void __launch_bounds__(LD_THREADS) linear_divergence_topk(RLK_PARAMS_ARG ld_topk_args p_) {
  typedef typename ll::elem<SDT>::type TS;
  const i64 S = p_.S, N = p_.N, k = p_.top_k, Hs = p_.Hs;
  const i64 row = (i64)blockIdx.x;
  const int tid = (int)threadIdx.x;
  __shared__ float cx[LD_TOPK_CANDS];
  __shared__ i32 cc_[LD_TOPK_CANDS];
  __shared__ float kx[LD_TOPK_MAX], kxs[LD_TOPK_MAX];
  __shared__ i32 kc[LD_TOPK_MAX];
  const i64 n = S * k; /* <= LD_TOPK_CANDS: the op keeps S within it */
  if (tid < k) kc[tid] = -1; /* a rank no candidate takes stays -1 */
  for (i64 t = tid; t < n; t += LD_THREADS) {
    const ld::cand c = ((const ld::cand *)p_.lists)[((t / k) * N + row) * k + t % k];
    cx[t] = c.x;
    cc_[t] = c.col;
  }
  __syncthreads();
  for (i64 t = tid; t < n; t += LD_THREADS) {
    if (cc_[t] < 0) continue;
    const float x = cx[t];
    const i32 c = cc_[t];
    const i64 own = t / k;
    i64 rank = t % k;
    for (i64 s = 0; s < S && rank < k; ++s) {
      if (s == own) continue;
      i64 lo = 0, hi = k;
      while (lo < hi) {
        const i64 mid = (lo + hi) / 2;
        if (ld::before(cx[s * k + mid], cc_[s * k + mid], x, c))
          lo = mid + 1;
        else
          hi = mid;
      }
      rank += lo;
    }
    if (rank < k) {
      kx[rank] = x;
      kc[rank] = c;
    }
  }
  __syncthreads();
  /* the set's size: the ranks taken are 0 .. n_k - 1 (the candidates' ranks are distinct) */
  int nk = 0;
  while (nk < k && kc[nk] >= 0) ++nk;
  /* the student's logit at member j = tid / 8, lanes tid % 8 over H */
  const int j = tid / 8, lane = tid % 8;
  float acc = 0.0f;
  if (j < nk) {
    const TS *h = (const TS *)p_.s_hidden + row * p_.s_h_stride;
    const TS *w = (const TS *)p_.s_weight + (i64)kc[j] * p_.s_w_stride;
    for (i64 c = lane; c < Hs; c += 8) acc = fmaf(to_float(h[c]), to_float(w[c]), acc);
  }
  acc = segment_sum<8>(acc);
  if (j < nk && lane == 0) kxs[j] = acc;
  __syncthreads();
  if (tid != 0) return;
  float *o = p_.stats + row * LD_STATS;
  /* il: what turns a list's value into z_t (1 where the lists hold z_t already) */
  const float ls = o[0], lt = o[1], is = 1.0f / p_.s_temperature, il = p_.scaled ? 1.0f : 1.0f / p_.t_temperature;
  float P = 0.0f, D = 0.0f;
  for (int m = 0; m < nk; ++m) {
    const float lpt = fmaf(kx[m], il, -lt), lps = fmaf(kxs[m], is, -ls), pt = exp2_approx(lpt * RLK_LL_LOG2E);
    P += pt;
    D = fmaf(pt, lpt - lps, D);
  }
  if (nk == 0) P = D = limits<float>::quiet_nan();
  const bool ign = ld::ignored<LAB>(p_.labels, p_.label_stride, row, p_.ignore_index);
  p_.divergence[row] = ign ? 0.0f : D;
  o[2] = ign ? 0.0f : D;
  o[3] = ign ? 0.0f : P;
  /* the set's boundary (threshold, last column) only where the row counts, as on the host */
  o[4] = ign ? 0.0f : nk ? kx[nk - 1] * il : limits<float>::infinity();
  o[5] = ign ? 0.0f : nk ? (float)kc[nk - 1] : -1.0f;
}

} /* namespace rlk */

#endif /* RLK_LINEAR_DIVERGENCE_CUH */

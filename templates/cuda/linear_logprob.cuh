/* linear_logprob.cuh - rlk_linear_logprob's portable kernels (every CUDA target and HIP):
 *
 *   linear_logprob_fwd_tiled  one block per (64-row block, vocabulary split): 64 x 64 logit tiles
 *                             of h W^T from shared memory in f32, each run of four (256 columns)
 *                             folded into a record per row (linear_logprob_common.cuh); logits
 *                             never leave the block
 *   linear_logprob_combine    (linear_logprob_common.cuh) a row's records merged in a fixed tree
 *
 * The sm_90a kernel (linear_logprob_sm90.cuh) writes records of the same columns with wgmma. A
 * record covers 256 columns whatever the split, so a row's bits do not depend on the batch. */
#ifndef RLK_LINEAR_LOGPROB_CUH
#define RLK_LINEAR_LOGPROB_CUH

#include "linear_logprob_common.cuh"

namespace rlk {

/* One 64 x 64 tile of C[m][n] = sum_k A(m, k) B(n, k) in f32 by a block of 256 threads: thread
 * (ty, tx) = (t / 16, t % 16) gets rows 4 ty .. 4 ty + 3 and columns tx + 16 cc (cc < 4). a(r, k)
 * and b(c, k) read tile row / column r, c and k (0 outside the operands). As and Bs: 32 x 64 f32
 * of shared memory each. Each element is one fmaf chain over k in order, from 0, or with `carry`
 * from the value acc holds (a chain continued: the same operations as one longer chain). Every
 * thread of the block must call it (it synchronizes). */
template <typename FA, typename FB>
RLK_DEVICE void tile_product(float (&acc)[4][4], const FA &a, const FB &b, i64 K, float (*As)[64],
                             float (*Bs)[64], bool carry = false) {
  constexpr int BK = 32;
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
  if (!carry) {
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) acc[r][cc] = 0.0f;
  }
  for (i64 k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
    for (int u = 0; u < 64 * BK / 256; ++u) {
      const int e = tid + 256 * u, r = e / BK, kk = e % BK;
      const i64 k = k0 + kk;
      As[kk][r] = k < K ? a(r, k) : 0.0f;
      Bs[kk][r] = k < K ? b(r, k) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < BK; ++kk) {
      float x[4], y[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) x[r] = As[kk][ty * 4 + r];
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) y[cc] = Bs[kk][tx + 16 * cc];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) acc[r][cc] = fmaf(x[r], y[cc], acc[r][cc]);
    }
    __syncthreads();
  }
}

template <int DT, typename L, bool ENTROPY>
__global__ void __launch_bounds__(LL_THREADS)
    linear_logprob_fwd_tiled(RLK_PARAMS_ARG ll::FwdTiledParams p_) {
  const void *__restrict__ hidden = p_.hidden, *__restrict__ weight = p_.weight;
  const L *__restrict__ labels = (const L *)p_.labels;
  const i64 h_stride = p_.h_stride, w_stride = p_.w_stride, label_stride = p_.label_stride;
  const i64 N = p_.N, V = p_.V, H = p_.H, cols_per_split = p_.cols_per_split;
  const float temperature = p_.temperature;
  ll::part *__restrict__ partials = (ll::part *)p_.partials;
  typedef typename ll::elem<DT>::type T;
  constexpr int BM = LL_TILE, BN = LL_TILE;
  static_assert(BM == 64 && LL_THREADS == 256, "written for 64 x 64 tiles of 256 threads: 16 x 16, 4 x 4 each");
  __shared__ float As[32][64];
  __shared__ float Bs[32][64];
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
  const i64 row0 = (i64)blockIdx.x * BM;
  const i64 v_begin = (i64)blockIdx.y * cols_per_split;
  const i64 v_end = min_(V, v_begin + cols_per_split);
  const float c = RLK_LL_LOG2E / temperature;
  const T *h = (const T *)hidden;
  const T *w = (const T *)weight;
  ll::part st[4];
  i64 y[4];
  float thr[4]; /* kept-set replay: the rows' thresholds (-inf: every logit) */
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const i64 row = row0 + ty * 4 + r;
    y[r] = row < N && labels ? ll::load_label(labels, row, label_stride) : -1;
    thr[r] = p_.threshold && row < N ? ld_ro(p_.threshold + row) : -limits<float>::infinity();
  }
  for (i64 col0 = v_begin; col0 < v_end; col0 += BN) {
    /* a record a 256 columns: four tiles folded by each thread, then its 16 lanes merged */
    if ((col0 - v_begin) % RLK_LL_RECORD_COLS == 0) {
#pragma unroll
      for (int r = 0; r < 4; ++r) st[r] = ll::empty_part();
    }
    float acc[4][4];
    const auto ha = [&](int r, i64 k) {
      return row0 + r < N ? to_float(h[(row0 + r) * h_stride + k]) : 0.0f;
    };
    const auto wb = [&](int r, i64 k) {
      return col0 + r < v_end ? to_float(w[(col0 + r) * w_stride + k]) : 0.0f;
    };
    tile_product(acc, ha, wb, H, As, Bs);
    const i64 lim = v_end - col0 - tx; /* acc[r][cc] is column tx + 16 cc of the tile */
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int cc = 0; cc < 4; ++cc)
        if ((i64)(16 * cc) >= lim) acc[r][cc] = -limits<float>::infinity();
      /* rlk_linear_sample: the raw logits, what its sampler draws from */
      if (p_.logits && row0 + ty * 4 + r < N) {
#pragma unroll
        for (int cc = 0; cc < 4; ++cc)
          if ((i64)(16 * cc) < lim) p_.logits[(row0 + ty * 4 + r) * p_.logits_pitch + col0 + tx + 16 * cc] = acc[r][cc];
      }
      /* the label's column in this tile; a shard's weight starts at vocab_start (read where it is
       * used: kept in a register through the loop it costs spills) */
      const i64 yc = y[r] - col0 - p_.vocab_start;
      if (yc >= 0 && yc < BN && yc % 16 == tx) {
#pragma unroll
        for (int cc = 0; cc < 4; ++cc)
          if (yc / 16 == cc) st[r].t = acc[r][cc];
      }
      /* kept-set replay: a logit below the row's threshold leaves the fold (the label too: the
       * combine merges it back) */
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) acc[r][cc] = acc[r][cc] < thr[r] ? -limits<float>::infinity() : acc[r][cc];
      ll::fold<4, ENTROPY>(st[r], acc[r], c);
    }
    if ((col0 + BN - v_begin) % RLK_LL_RECORD_COLS == 0 || col0 + BN >= v_end) {
      const i64 rec = col0 / RLK_LL_RECORD_COLS;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const ll::part p = ll::lane_merge<16, ENTROPY>(st[r]);
        const i64 row = row0 + ty * 4 + r;
        if (tx == 0 && row < N) partials[rec * N + row] = p;
      }
    }
  }
}

} /* namespace rlk */

#endif /* RLK_LINEAR_LOGPROB_CUH */

/* linear_logprob.cuh - rlk_linear_logprob's portable kernels (every CUDA target and HIP):
 *
 *   linear_logprob_fwd_tiled  one block per (64-row block, vocabulary split): 64 x 64 logit tiles
 *                             of h W^T from shared memory in f32, folded into per-row records
 *                             (linear_logprob_common.cuh); logits never leave the block
 *   linear_logprob_combine    (linear_logprob_common.cuh) the records of a row, in split order
 *
 * The sm_90a kernel (linear_logprob_sm90.cuh) writes the same records with wgmma. */
#ifndef RLK_LINEAR_LOGPROB_CUH
#define RLK_LINEAR_LOGPROB_CUH

#include "linear_logprob_common.cuh"

namespace rlk {

template <int DT, typename L, bool ENTROPY>
__global__ void __launch_bounds__(256)
    linear_logprob_fwd_tiled(const void *__restrict__ hidden, i64 h_stride,
                             const void *__restrict__ weight, i64 w_stride,
                             const L *__restrict__ labels, i64 label_stride, i64 N, i64 V, i64 H,
                             float temperature, i64 cols_per_split, ll::part *__restrict__ partials) {
  typedef typename ll::elem<DT>::type T;
  constexpr int BM = 64, BN = 64, BK = 32;
  __shared__ float As[BK][BM];
  __shared__ float Bs[BK][BN];
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
  const i64 row0 = (i64)blockIdx.x * BM;
  const i64 v_begin = (i64)blockIdx.y * cols_per_split;
  const i64 v_end = min_(V, v_begin + cols_per_split);
  const float c = RLK_LL_LOG2E / temperature;
  const T *h = (const T *)hidden;
  const T *w = (const T *)weight;
  ll::part st[4];
  i64 y[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    st[r] = ll::empty_part();
    const i64 row = row0 + ty * 4 + r;
    y[r] = row < N ? ll::load_label(labels, row, label_stride) : -1;
  }
  for (i64 col0 = v_begin; col0 < v_end; col0 += BN) {
    float acc[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) acc[r][cc] = 0.0f;
    for (i64 k0 = 0; k0 < H; k0 += BK) {
#pragma unroll
      for (int u = 0; u < BM * BK / 256; ++u) {
        const int e = tid + 256 * u, r = e / BK, kk = e % BK;
        const i64 row = row0 + r, col = col0 + r, k = k0 + kk;
        As[kk][r] = row < N && k < H ? to_float(h[row * h_stride + k]) : 0.0f;
        Bs[kk][r] = col < v_end && k < H ? to_float(w[col * w_stride + k]) : 0.0f;
      }
      __syncthreads();
#pragma unroll 8
      for (int kk = 0; kk < BK; ++kk) {
        float a[4], b[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = As[kk][ty * 4 + r];
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) b[cc] = Bs[kk][tx + 16 * cc];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int cc = 0; cc < 4; ++cc) acc[r][cc] = fmaf(a[r], b[cc], acc[r][cc]);
      }
      __syncthreads();
    }
    const i64 lim = v_end - col0 - tx; /* acc[r][cc] is column tx + 16 cc of the tile */
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int cc = 0; cc < 4; ++cc)
        if ((i64)(16 * cc) >= lim) acc[r][cc] = -limits<float>::infinity();
      ll::fold<4, ENTROPY>(st[r], acc[r], c);
      const i64 yc = y[r] - col0;
      if (yc >= 0 && yc < BN && yc % 16 == tx) {
#pragma unroll
        for (int cc = 0; cc < 4; ++cc)
          if (yc / 16 == cc) st[r].t = acc[r][cc];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const ll::part p = ll::lane_merge<16, ENTROPY>(st[r]);
    const i64 row = row0 + ty * 4 + r;
    if (tx == 0 && row < N) partials[(i64)blockIdx.y * N + row] = p;
  }
}

} /* namespace rlk */

#endif /* RLK_LINEAR_LOGPROB_CUH */

/* linear_logprob_bwd.cuh - rlk_linear_logprob_backward's portable kernels (every CUDA target and
 * HIP). The host walks the vocabulary in chunks of Vc columns, in order; for each chunk:
 *
 *   linear_logprob_bwd_dz  recomputes the chunk's logits z = h W_c^T / T (64 x 64 f32 tiles) and
 *                          writes dz = (g_lp (onehot(y) - p) - g_H p (z - E)) / T, f32 [N][Vc], with
 *                          p = exp(z - lse) and E = lse - entropy from the forward (kept-set
 *                          replay: p 0 below the row's threshold, but for the label)
 *   linear_logprob_bwd_dh  dH = beta dH + dz W_c, dH f32 [N][H] (row stride dh_stride): the
 *                          workspace, or grad_hidden itself when that is f32 (beta 0 on the first
 *                          chunk, unless that adds to the caller's gradient); beta 1 continues
 *                          each element's fmaf chain from dH, so that the chunks make one chain
 *                          over the vocabulary (a row's bits do not depend on the chunk width)
 *   linear_logprob_bwd_dw  grad_weight[c0 + v] = dz[:, v]^T h (+ the old value when accumulating):
 *                          each element written once, by one thread
 * and at the end, for 16-bit gradients, linear_logprob_bwd_dh_out writes grad_hidden from dH (+ the
 * old value when accumulating). Fixed chunk order and no atomics: bitwise repeatable. */
#ifndef RLK_LINEAR_LOGPROB_BWD_CUH
#define RLK_LINEAR_LOGPROB_BWD_CUH

#include "linear_logprob.cuh"

namespace rlk {

template <int DT, typename L, bool ENTROPY>
__global__ void __launch_bounds__(LL_THREADS)
    linear_logprob_bwd_dz(RLK_PARAMS_ARG ll::BwdDzParams p_) {
  const void *__restrict__ hidden = p_.hidden, *__restrict__ weight = p_.weight;
  const L *__restrict__ labels = (const L *)p_.labels;
  const i64 h_stride = p_.h_stride, w_stride = p_.w_stride, label_stride = p_.label_stride;
  const i64 N = p_.N, V = p_.V, H = p_.H, ignore_index = p_.ignore_index, vocab_start = p_.vocab_start;
  const float temperature = p_.temperature;
  const int shard = p_.shard; /* a label outside this weight's columns is no error */
  const float *__restrict__ lse = p_.lse, *__restrict__ g_lp = p_.g_lp, *__restrict__ entropy = p_.entropy;
  const float *__restrict__ g_h = p_.g_ent; /* the entropy's gradient */
  const i64 lse_s = p_.lse_s, glp_s = p_.glp_s, ent_s = p_.ent_s, gh_s = p_.gent_s, c0 = p_.c0, Vc = p_.Vc;
  float *__restrict__ dz = p_.dz;
  i32 *__restrict__ status = p_.status;
  typedef typename ll::elem<DT>::type T;
  __shared__ float As[32][64];
  __shared__ float Bs[32][64];
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
  const i64 row0 = (i64)blockIdx.x * 64, v0 = c0 + (i64)blockIdx.y * 64;
  const i64 v_end = min_(V, c0 + Vc);
  const T *h = (const T *)hidden;
  const T *w = (const T *)weight;
  float acc[4][4];
  const auto ha = [&](int r, i64 k) { return row0 + r < N ? to_float(h[(row0 + r) * h_stride + k]) : 0.0f; };
  const auto wb = [&](int r, i64 k) { return v0 + r < v_end ? to_float(w[(v0 + r) * w_stride + k]) : 0.0f; };
  tile_product(acc, ha, wb, H, As, Bs);
  const float c = RLK_LL_LOG2E / temperature, inv_t = 1.0f / temperature;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const i64 row = row0 + ty * 4 + r;
    if (row >= N) continue;
    const i64 yg = ll::load_label(labels, row, label_stride), y = yg - vocab_start;
    const bool ignored = yg == ignore_index, bad = !ignored && !shard && (y < 0 || y >= V);
    if (bad && status && blockIdx.y == 0 && tx == 0 && c0 == 0) atomicOr((int *)status, (int)LP_STATUS_BAD_LABEL);
    const float l = lse[row * lse_s];
    const float gl = g_lp ? g_lp[row * glp_s] : 0.0f;
    const float gh = ENTROPY && g_h ? g_h[row * gh_s] : 0.0f;
    const float E = ENTROPY && g_h ? l - entropy[row * ent_s] : 0.0f;
    /* kept-set replay: p is 0 below the row's threshold, but for the label */
    const float thr = p_.threshold ? ld_ro(p_.threshold + row) : -limits<float>::infinity();
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      const i64 v = v0 + tx + 16 * cc;
      if (v >= v_end) continue;
      const float p = acc[r][cc] < thr && v != y ? 0.0f : exp2_approx(fmaf(acc[r][cc], c, -l * RLK_LL_LOG2E));
      dz[row * Vc + (v - c0)] =
          ll::dz_of<ENTROPY>(ignored, bad, gl, gh, E, v == y ? 1.0f : 0.0f, p, acc[r][cc] * inv_t, true, inv_t);
    }
  }
}

template <int DT>
__global__ void __launch_bounds__(LL_THREADS)
    linear_logprob_bwd_dh(RLK_PARAMS_ARG ll::BwdDhParams p_) {
  const float *__restrict__ dz = p_.dz;
  const void *__restrict__ weight = p_.weight;
  const i64 Vc = p_.Vc, nv = p_.nv, w_stride = p_.w_stride, c0 = p_.c0, N = p_.N, H = p_.H;
  float *__restrict__ dh = p_.dh;
  const float beta = p_.beta;
  const i64 dh_stride = p_.dh_stride;
  typedef typename ll::elem<DT>::type T;
  __shared__ float As[32][64];
  __shared__ float Bs[32][64];
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
  const i64 row0 = (i64)blockIdx.x * 64, h0 = (i64)blockIdx.y * 64;
  const T *w = (const T *)weight;
  float acc[4][4];
  const bool carry = beta != 0.0f;
  if (carry) {
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        const i64 row = row0 + ty * 4 + r, col = h0 + tx + 16 * cc;
        acc[r][cc] = row < N && col < H ? dh[row * dh_stride + col] : 0.0f;
      }
  }
  const auto da = [&](int r, i64 k) { return row0 + r < N ? dz[(row0 + r) * Vc + k] : 0.0f; };
  const auto wb = [&](int r, i64 k) { return h0 + r < H ? to_float(w[(c0 + k) * w_stride + h0 + r]) : 0.0f; };
  tile_product(acc, da, wb, nv, As, Bs, carry);
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      const i64 row = row0 + ty * 4 + r, col = h0 + tx + 16 * cc;
      if (row < N && col < H) dh[row * dh_stride + col] = acc[r][cc];
    }
}

template <int DT, int GDT>
__global__ void __launch_bounds__(LL_THREADS)
    linear_logprob_bwd_dw(RLK_PARAMS_ARG ll::BwdDwParams p_) {
  const float *__restrict__ dz = p_.dz;
  const void *__restrict__ hidden = p_.hidden;
  const i64 Vc = p_.Vc, nv = p_.nv, h_stride = p_.h_stride, c0 = p_.c0, N = p_.N, H = p_.H;
  void *__restrict__ grad_weight = p_.grad_weight;
  const i64 gw_stride = p_.gw_stride;
  const i32 accumulate = p_.accumulate;
  typedef typename ll::elem<DT>::type T;
  typedef typename ll::elem<GDT>::type G;
  __shared__ float As[32][64];
  __shared__ float Bs[32][64];
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
  const i64 v0 = (i64)blockIdx.x * 64, h0 = (i64)blockIdx.y * 64;
  const T *h = (const T *)hidden;
  float acc[4][4];
  const auto da = [&](int r, i64 k) { return v0 + r < nv ? dz[k * Vc + v0 + r] : 0.0f; };
  const auto hb = [&](int r, i64 k) { return h0 + r < H ? to_float(h[k * h_stride + h0 + r]) : 0.0f; };
  tile_product(acc, da, hb, N, As, Bs);
  G *gw = (G *)grad_weight;
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      const i64 v = v0 + ty * 4 + r, col = h0 + tx + 16 * cc;
      if (v < nv && col < H) {
        G *o = gw + (c0 + v) * gw_stride + col;
        *o = store_as<G>::from(accumulate ? to_float(*o) + acc[r][cc] : acc[r][cc]);
      }
    }
}

template <int GDT>
__global__ void __launch_bounds__(LL_THREADS)
    linear_logprob_bwd_dh_out(RLK_PARAMS_ARG ll::BwdDhOutParams p_) {
  const float *__restrict__ dh = p_.dh;
  const i64 N = p_.N, H = p_.H, gh_stride = p_.gh_stride;
  void *__restrict__ grad_hidden = p_.grad_hidden;
  const i32 accumulate = p_.accumulate;
  typedef typename ll::elem<GDT>::type G;
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= N * H) return;
  const i64 row = i / H, col = i % H;
  G *o = (G *)grad_hidden + row * gh_stride + col;
  *o = store_as<G>::from(accumulate ? to_float(*o) + dh[i] : dh[i]);
}

} /* namespace rlk */

#endif /* RLK_LINEAR_LOGPROB_BWD_CUH */

/* linear_divergence_bwd.cuh - rlk_linear_divergence_backward's portable kernels (every CUDA target
 * and HIP). The host walks the vocabulary in chunks of Vc columns, in order; for each chunk:
 *
 *   linear_divergence_bwd_dz  recomputes the chunk's logits of both heads (64 x 64 f32 tiles, the
 *                             forward's tile products) and writes, per side asked for,
 *                             dz = g dD/dz / T in f32 [N][Vc] (rlk.h's forms, from the forward's
 *                             stats); top-k tells a column's membership by comparing its teacher
 *                             logit with the set's last member's, recomputed here by the same
 *                             chain of fused multiply-adds the tile products make (bitwise the
 *                             forward's value)
 * then, per side, the fused head's products over dz (linear_logprob_bwd.cuh, included here so that
 * this source instantiates them): linear_logprob_bwd_dh (the f32 grad_hidden sum),
 * linear_logprob_bwd_dw (grad_weight rows of the chunk) and, for a 16-bit grad_hidden, at the end
 * linear_logprob_bwd_dh_out. Fixed chunk order and no atomics: bitwise repeatable. */
#ifndef RLK_LINEAR_DIVERGENCE_BWD_CUH
#define RLK_LINEAR_DIVERGENCE_BWD_CUH

#include "linear_divergence_common.cuh"
#include "linear_logprob_bwd.cuh"

namespace rlk {

template <int SDT, int TDT, int LAB, int MODE, bool STUDENT, bool TEACHER>
__global__ void __launch_bounds__(LD_THREADS) linear_divergence_bwd_dz(RLK_PARAMS_ARG ld_bwd_dz_args p_) {
  typedef typename ll::elem<SDT>::type TS;
  typedef typename ll::elem<TDT>::type TT;
  const TS *sh = (const TS *)p_.s_hidden, *sw = (const TS *)p_.s_weight;
  const TT *th = (const TT *)p_.t_hidden, *tw = (const TT *)p_.t_weight;
  const i64 shs = p_.s_h_stride, sws = p_.s_w_stride, ths = p_.t_h_stride, tws = p_.t_w_stride;
  const i64 N = p_.N, V = p_.V, Hs = p_.Hs, Ht = p_.Ht, c0 = p_.c0, Vc = p_.Vc;
  const float *__restrict__ stats = p_.stats;
  const i64 ss_ = p_.stats_stride;
  __shared__ float As[32][64];
  __shared__ float Bs[32][64];
  __shared__ float thr[MODE == LD_TOPK ? 64 : 1]; /* top-k: each row's last member's logit */
  __shared__ i32 last[MODE == LD_TOPK ? 64 : 1];
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
  const i64 row0 = (i64)blockIdx.x * 64, v0 = c0 + (i64)blockIdx.y * 64;
  const i64 v_end = min_(V, c0 + Vc);
  if (MODE == LD_TOPK && tid < 64) {
    const i64 row = row0 + tid;
    float x = limits<float>::infinity();
    i32 c = -1;
    if (row < N) {
      const i64 col = (i64)stats[row * ss_ + 5] - p_.vocab_start;
      if (col >= 0 && col < V) {
        c = (i32)col;
        x = 0.0f;
        for (i64 kk = 0; kk < Ht; ++kk) x = fmaf(to_float(th[row * ths + kk]), to_float(tw[col * tws + kk]), x);
      }
    }
    thr[tid] = x;
    last[tid] = c;
  }
  float as_[4][4], at_[4][4];
  const auto hsa = [&](int r, i64 kk) { return row0 + r < N ? to_float(sh[(row0 + r) * shs + kk]) : 0.0f; };
  const auto wsb = [&](int r, i64 kk) { return v0 + r < v_end ? to_float(sw[(v0 + r) * sws + kk]) : 0.0f; };
  const auto hta = [&](int r, i64 kk) { return row0 + r < N ? to_float(th[(row0 + r) * ths + kk]) : 0.0f; };
  const auto wtb = [&](int r, i64 kk) { return v0 + r < v_end ? to_float(tw[(v0 + r) * tws + kk]) : 0.0f; };
  tile_product(as_, hsa, wsb, Hs, As, Bs); /* its barriers also publish thr and last */
  tile_product(at_, hta, wtb, Ht, As, Bs);
  const float is = 1.0f / p_.s_temperature, it = 1.0f / p_.t_temperature;
  const float wa = (float)(1.0 - p_.beta), wb = (float)p_.beta;
  const float la = MODE == LD_JSD ? ld::log2_approx((float)(1.0 - p_.beta)) : 0.0f;
  const float lb = MODE == LD_JSD ? ld::log2_approx((float)p_.beta) : 0.0f;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int rr = ty * 4 + r;
    const i64 row = row0 + rr;
    if (row >= N) continue;
    const bool ign = ld::ignored<LAB>(p_.labels, p_.label_stride, row, p_.ignore_index);
    const float *s = stats + row * ss_;
    const float ls = s[0], lt = s[1], D = s[2], a1 = s[3], a2 = s[4];
    const float g = p_.g[row * p_.g_stride];
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      const i64 v = v0 + tx + 16 * cc;
      if (v >= v_end) continue;
      float gs = 0.0f, gt = 0.0f;
      if (!ign) {
        const float xt = at_[r][cc];
        const bool in_k =
            MODE == LD_TOPK && (xt > thr[MODE == LD_TOPK ? rr : 0] ||
                                 (xt == thr[MODE == LD_TOPK ? rr : 0] && v <= (i64)last[MODE == LD_TOPK ? rr : 0]));
        ld::dz_of<MODE>(fmaf(as_[r][cc], is, -ls), fmaf(xt, it, -lt), D, a1, a2, in_k, wa, wb, la, lb, &gs, &gt);
        gs *= g * is;
        gt *= g * it;
      }
      if (STUDENT) p_.dz_s[row * Vc + (v - c0)] = gs;
      if (TEACHER) p_.dz_t[row * Vc + (v - c0)] = gt;
    }
  }
}

} /* namespace rlk */

#endif /* RLK_LINEAR_DIVERGENCE_BWD_CUH */

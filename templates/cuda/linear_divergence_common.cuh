/* linear_divergence_common.cuh - what the kernels of rlk_linear_divergence share: the per-row
 * state of one pass over some vocabulary columns of both heads, its fold and merge, the labels,
 * and the per-column forms of rlk.h (log m, the dz of each divergence).
 *
 * Units: a GEMM kernel folds raw dot products x = h . w; with c = log2(e) / T per side,
 * y = x c (z = y ln 2) and the state holds, over its columns,
 *   ms = max y_s, ss = sum 2^(y_s - ms), qs = sum 2^(y_s - ms) (y_s - ms),
 *   mt = max y_t, st = sum 2^(y_t - mt), gt = sum 2^(y_t - mt) (y_t - y_s), gs = sum 2^(y_s - ms) (y_s - y_t).
 * A split's state leaves its kernel as rlk.h's vocab-parallel record (natural log: m, q and g
 * times ln 2), the one format the combine merges, whether the records are a call's splits or
 * gathered shards. */
#ifndef RLK_LINEAR_DIVERGENCE_COMMON_CUH
#define RLK_LINEAR_DIVERGENCE_COMMON_CUH

#include "linear_logprob.cuh"
#include "linear_divergence_params.h"

namespace rlk {
namespace ld {

/* The sm_90a kernels' arguments, their tensor maps last (common/linear_divergence_params.h, filled
 * by src/ops/linear_divergence.c), declared with their lists like the other kernels'. */
typedef ::ld_fwd_sm90_args FwdSm90Params;
typedef ::ld_bwd_dz_sm90_args BwdDzSm90Params;

/* The modes, labels, kinds and LD_TOPK_MAX: common/linear_divergence_params.h. */

/* Whether row `row`'s label is ignore_index (never without labels). Labels are never written. */
template <int LAB> RLK_DEVICE bool ignored(const void *labels, i64 stride, i64 row, i64 ignore_index) {
  if (LAB == LD_LAB_NONE || !labels) return false;
  const i64 y = LAB == LD_LAB_I32 ? (i64)ld_ro((const i32 *)labels + row * stride)
                               : (i64)ld_ro((const i64 *)labels + row * stride);
  return y == ignore_index;
}

/* log2 with the hardware approximation (CUDA: lg2.approx.ftz, about 2^-22 absolute for an
 * argument in [1, 2]; HIP: log2f). */
RLK_DEVICE float log2_approx(float x) {
#if defined(RLK_CUDA)
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return log2f(x);
#endif
}

/* log2 m = log2((1 - beta) 2^a + beta 2^b) for a = log2 p_s, b = log2 p_t, with la = log2(1 - beta)
 * and lb = log2(beta). */
RLK_DEVICE float log2_mix(float a, float b, float la, float lb) {
  const float x = a + la, y = b + lb, hi = fmaxf(x, y), lo = fminf(x, y);
  return hi + log2_approx(1.0f + exp2_approx(lo - hi));
}

/* One row's state over some columns (or a split's). */
struct alignas(16) state {
  float ms, ss, qs, mt, st, gt, gs, pad;
};
static_assert(sizeof(state) == LD_RECORD * sizeof(float), "a record: the op's partials' rows");

RLK_DEVICE state empty_state() {
  state p;
  p.ms = p.mt = -limits<float>::infinity();
  p.ss = p.qs = p.st = p.gt = p.gs = p.pad = 0.0f;
  return p;
}

/* 2^(m - M) for a side holding s (0 for an empty side, whose m is -inf). */
RLK_DEVICE float factor(float m, float s, float M) { return s > 0.0f ? exp2_approx(m - M) : 0.0f; }

/* a and b merged (commutative bit for bit: either order gives the same floats). */
RLK_DEVICE state merge(const state &a, const state &b) {
  state r;
  r.ms = fmaxf(a.ms, b.ms);
  r.mt = fmaxf(a.mt, b.mt);
  float sa, qa, sb, qb;
  ll::rebase(a.ms, a.ss, a.qs, r.ms, &sa, &qa);
  ll::rebase(b.ms, b.ss, b.qs, r.ms, &sb, &qb);
  r.ss = sa + sb;
  r.qs = qa + qb;
  const float fa = factor(a.ms, a.ss, r.ms), fb = factor(b.ms, b.ss, r.ms);
  r.gs = fa * a.gs + fb * b.gs;
  const float ta = factor(a.mt, a.st, r.mt), tb = factor(b.mt, b.st, r.mt);
  r.st = ta * a.st + tb * b.st;
  r.gt = ta * a.gt + tb * b.gt;
  r.pad = 0.0f;
  return r;
}

/* Merge over aligned groups of W lanes (butterfly; every lane ends with the same bits). */
template <int W> RLK_DEVICE state lane_merge(state p) {
#pragma unroll
  for (int o = 1; o < W; o <<= 1) {
    state q;
    q.ms = shfl_xor(p.ms, o);
    q.ss = shfl_xor(p.ss, o);
    q.qs = shfl_xor(p.qs, o);
    q.mt = shfl_xor(p.mt, o);
    q.st = shfl_xor(p.st, o);
    q.gt = shfl_xor(p.gt, o);
    q.gs = shfl_xor(p.gs, o);
    q.pad = 0.0f;
    p = merge(p, q);
  }
  return p;
}

/* Folds NV columns of one row (y_s, y_t: the scaled logits; ok: inside the vocabulary) into p: the
 * columns' own sums first, relative to the new maxima, then the state before rescaled to them and
 * added (each of a fold's additions rounds relative to its columns' part, not to the whole row's).
 * A teacher logit of -inf (probability 0) adds exactly 0 to st and gt: its exponent is taken from
 * 0 where the maximum is -inf too (not -inf - -inf), and its gap, -inf, enters gt as -FLT_MAX
 * (0 times -inf would be NaN): one max a column, no register kept past the loop; finite gaps fold
 * to the same bits, and a NaN logit still gives a NaN row (through its exponent). */
template <int NV> RLK_DEVICE void fold(state &p, const float *ys, const float *yt, const bool *ok) {
  float mxs = -limits<float>::infinity(), mxt = -limits<float>::infinity();
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (ok[k]) {
      mxs = fmaxf(mxs, ys[k]);
      mxt = fmaxf(mxt, yt[k]);
    }
  const float Ms = fmaxf(p.ms, mxs), Mt = fmaxf(p.mt, mxt);
  if (Ms == -limits<float>::infinity()) return; /* nothing inside yet */
  const float Mtc = Mt == -limits<float>::infinity() ? 0.0f : Mt; /* every y_t -inf (or NaN): e^-inf = 0 */
  float ss = 0.0f, qs = 0.0f, st = 0.0f, gt = 0.0f, gs = 0.0f;
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (ok[k]) {
      const float ds = ys[k] - Ms, es = exp2_approx(ds), et = exp2_approx(yt[k] - Mtc), gap = yt[k] - ys[k];
      ss += es;
      qs = fmaf(es, ds, qs);
      st += et;
      gt = fmaf(et, fmaxf(gap, -limits<float>::max()), gt);
      gs = fmaf(-es, gap, gs);
    }
  const float fs = factor(p.ms, p.ss, Ms), ft = factor(p.mt, p.st, Mt);
  float s0, q0;
  ll::rebase(p.ms, p.ss, p.qs, Ms, &s0, &q0);
  p.ss = s0 + ss, p.qs = q0 + qs;
  p.st = fmaf(ft, p.st, st), p.gt = fmaf(ft, p.gt, gt), p.gs = fmaf(fs, p.gs, gs);
  p.ms = Ms, p.mt = Mt;
}

/* JSD's second pass over NV columns of one row (y_s, y_t scaled logits, Ls, Lt the row's lse's in
 * log2 units, la, lb log2(1 - beta), log2(beta)): adds sum p_s (log2 p_s - log2 m) to *A and
 * sum p_t (log2 p_t - log2 m) to *B, the columns' own sums first. */
template <int NV>
RLK_DEVICE void jsd_fold(float *A, float *B, const float *ys, const float *yt, const bool *ok, float Ls, float Lt,
                         float la, float lb) {
  float a_ = 0.0f, b_ = 0.0f;
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (ok[k]) {
      const float a = ys[k] - Ls, b = yt[k] - Lt, lm = log2_mix(a, b, la, lb);
      a_ = fmaf(exp2_approx(a), a - lm, a_);
      b_ = fmaf(exp2_approx(b), b - lm, b_);
    }
  *A += a_;
  *B += b_;
}

/* A state as rlk.h's record (natural log units). */
RLK_DEVICE void store_record(float *r, const state &p) {
  f32x4 a, b;
  a.x = p.ms * RLK_LL_LN2; /* -inf stays -inf */
  a.y = p.ss;
  a.z = p.qs * RLK_LL_LN2;
  a.w = p.mt * RLK_LL_LN2;
  b.x = p.st;
  b.y = p.gt * RLK_LL_LN2;
  b.z = p.gs * RLK_LL_LN2;
  b.w = 0.0f;
  *(f32x4 *)r = a;
  *(f32x4 *)(r + 4) = b;
}

/* A column's dD/dz for the student (gs) and the teacher (gt), rlk.h's forms; lps, lpt the
 * natural log-probs, D and a1, a2 the row's stats [2..4], in_k: the column is in the top-k set,
 * wa, wb: 1 - beta and beta (each rounded from the double: 1 - (float)beta loses 1 - beta's digits
 * near 1, or all of them), la, lb: their log2. */
template <int MODE>
RLK_DEVICE void dz_of(float lps, float lpt, float D, float a1, float a2, bool in_k, float wa, float wb, float la,
                      float lb, float *gs, float *gt) {
  const float ps = exp2_approx(lps * RLK_LL_LOG2E), pt = exp2_approx(lpt * RLK_LL_LOG2E);
  if (MODE == LD_FKL) {
    *gs = ps - pt;
    *gt = pt * (lpt - lps - D);
  } else if (MODE == LD_RKL) {
    *gs = ps * (lps - lpt - D);
    *gt = pt - ps;
  } else if (MODE == LD_JSD) {
    const float lm = RLK_LL_LN2 * log2_mix(lps * RLK_LL_LOG2E, lpt * RLK_LL_LOG2E, la, lb);
    *gs = wa * ps * (lps - lm - a1);
    *gt = wb * pt * (lpt - lm - a2);
  } else {
    *gs = a1 * ps - (in_k ? pt : 0.0f);
    *gt = pt * ((in_k ? lpt - lps + 1.0f : 0.0f) - D - a1);
  }
}

} /* namespace ld */
} /* namespace rlk */

#endif /* RLK_LINEAR_DIVERGENCE_COMMON_CUH */

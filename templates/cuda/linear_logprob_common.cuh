/* linear_logprob_common.cuh - what the kernels of rlk_linear_logprob share: the per-row record of
 * 256 vocabulary columns, its online update and merge, and the combine kernel that turns a row's
 * records into logp, lse and entropy.
 *
 * Units: a GEMM kernel folds raw dot products x = h . w_v; with c = log2(e) / T a record holds
 *   m = max_v x_v c,  s = sum_v 2^(x_v c - m),  q = sum_v 2^(x_v c - m) (x_v c - m),  t = x_y
 * over its 256 columns (t only in the record whose columns hold the label y, 0 elsewhere). Then
 *   lse = m ln2 + ln s,  entropy = ln s - ln2 q / s,  logp = (t c - m) ln2 - ln s,
 * the forms rlk_logprob uses (logprob_common.cuh). A row's records are merged in a tree fixed by
 * their count (ceil(V / 256)): the result is bitwise the same run after run, and whatever the
 * batch, the split or the kernel's schedule. */
#ifndef RLK_LINEAR_LOGPROB_COMMON_CUH
#define RLK_LINEAR_LOGPROB_COMMON_CUH

#include "rlk_prelude.cuh"
#include "linear_logprob_params.h"

#define RLK_LL_LOG2E 1.4426950408889634f
#define RLK_LL_LN2 0.69314718055994531f

namespace rlk {
namespace ll {

/* The kernels' arguments (common/linear_logprob_params.h, filled by src/ops/linear_logprob_fwd.c and _bwd.c). */
typedef ::ll_fwd_tiled_args FwdTiledParams;
typedef ::ll_fwd_sm90_args FwdSm90Params; /* its tensor maps, then FwdTiledParams */
RLK_PARAMS_DECLARE(CombineParams, RLK_LL_COMBINE_PARAMS, RLK_LL_COMBINE_PARAMS_SIZE);
RLK_PARAMS_DECLARE(BwdDzParams, RLK_LL_BWD_DZ_PARAMS, RLK_LL_BWD_DZ_PARAMS_SIZE);
RLK_PARAMS_DECLARE(BwdDhParams, RLK_LL_BWD_DH_PARAMS, RLK_LL_BWD_DH_PARAMS_SIZE);
RLK_PARAMS_DECLARE(BwdDwParams, RLK_LL_BWD_DW_PARAMS, RLK_LL_BWD_DW_PARAMS_SIZE);
RLK_PARAMS_DECLARE(BwdDhOutParams, RLK_LL_BWD_DH_OUT_PARAMS, RLK_LL_BWD_DH_OUT_PARAMS_SIZE);


template <int DT> struct elem;
template <> struct elem<RLK_DT_F32> { /* f32 gradients */
  typedef float type;
};
template <> struct elem<RLK_DT_F16> {
  typedef f16 type;
};
template <> struct elem<RLK_DT_BF16> {
  typedef bf16 type;
};

/* One row's state over some columns (or a split's record). */
struct alignas(16) part {
  float m, s, q, t;
};

RLK_DEVICE part empty_part() {
  part p;
  p.m = -limits<float>::infinity();
  p.s = p.q = p.t = 0.0f;
  return p;
}

/* q and s of a state re-expressed relative to a larger maximum M (0 for an empty state). */
RLK_DEVICE void rebase(float m, float s, float q, float M, float *s_out, float *q_out) {
  if (s > 0.0f) {
    const float d = m - M, f = exp2_approx(d);
    *s_out = s * f;
    *q_out = f * fmaf(d, s, q);
  } else {
    *s_out = 0.0f;
    *q_out = 0.0f;
  }
}

/* a and b merged (commutative bit for bit: either order gives the same floats). */
template <bool ENTROPY> RLK_DEVICE part merge(const part &a, const part &b) {
  part r;
  r.m = fmaxf(a.m, b.m);
  float sa, qa, sb, qb;
  rebase(a.m, a.s, a.q, r.m, &sa, &qa);
  rebase(b.m, b.s, b.q, r.m, &sb, &qb);
  r.s = sa + sb;
  r.q = ENTROPY ? qa + qb : 0.0f;
  r.t = a.t + b.t;
  return r;
}

/* Merge over aligned groups of W lanes (butterfly; every lane ends with the same bits). */
template <int W, bool ENTROPY> RLK_DEVICE part lane_merge(part p) {
#pragma unroll
  for (int o = 1; o < W; o <<= 1) {
    part o_;
    o_.m = shfl_xor(p.m, o);
    o_.s = shfl_xor(p.s, o);
    o_.q = shfl_xor(p.q, o);
    o_.t = shfl_xor(p.t, o);
    p = merge<ENTROPY>(p, o_);
  }
  return p;
}

/* Folds NV values x[] (raw dot products) of one row into p. A column outside the vocabulary is
 * given as -inf: it moves no maximum, and 2^-inf adds exactly 0 to s; with the entropy its
 * exponent is clamped, so that it adds 0 to q too (-inf times 0 would not; an exponent below -126
 * adds 0 anyway: ex2.approx flushes to zero). */
template <int NV, bool ENTROPY> RLK_DEVICE void fold(part &p, const float *x, float c) {
  float mx = -limits<float>::infinity();
#pragma unroll
  for (int k = 0; k < NV; ++k) mx = fmaxf(mx, x[k]);
  const float M = fmaxf(p.m, mx * c);
  if (M == -limits<float>::infinity()) return; /* nothing valid yet */
  float s0, q0;
  rebase(p.m, p.s, p.q, M, &s0, &q0);
  float s1 = 0.0f, q1 = 0.0f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const float d = ENTROPY ? fmaxf(fmaf(x[k], c, -M), -256.0f) : fmaf(x[k], c, -M);
    const float e = exp2_approx(d);
    if (k & 1) {
      s1 += e;
      if (ENTROPY) q1 = fmaf(e, d, q1);
    } else {
      s0 += e;
      if (ENTROPY) q0 = fmaf(e, d, q0);
    }
  }
  p.m = M;
  p.s = s0 + s1;
  p.q = ENTROPY ? q0 + q1 : 0.0f;
}

/* Kept-set replay's label: a label whose logit t is below the row's threshold (its record left
 * it out) merged back last, as a record of its own. */
template <bool ENTROPY> RLK_DEVICE part with_label(const part &acc, float t, float thr, float c) {
  if (!(t < thr)) return acc;
  part one;
  one.m = t * c, one.s = 1.0f, one.q = 0.0f, one.t = 0.0f; /* 2^0, and 2^0 (t c - t c) */
  return merge<ENTROPY>(acc, one);
}

/* The logits' gradient at one column of a row, dz = (g_lp (onehot - p) - g_H p (x / T - E)) / T
 * with E = lse - entropy (0 where the row is ignored, NaN where its label is bad); xt = x / T, read
 * only where entropy_term holds. */
template <bool ENTROPY>
RLK_DEVICE float dz_of(bool ignored, bool bad, float gl, float gh, float E, float onehot, float p, float xt,
                       bool entropy_term, float inv_t) {
  if (ignored) return 0.0f;
  if (bad) return limits<float>::quiet_nan();
  float g = gl * (onehot - p);
  if (ENTROPY && entropy_term) g -= gh * p * (xt - E);
  return g * inv_t;
}

/* (Labels are never written by these kernels: a read-only load.) */
template <typename L> RLK_DEVICE i64 load_label(const L *labels, i64 row, i64 stride) {
  return (i64)ld_ro(labels + row * stride);
}

} /* namespace ll */

/* A warp per row (256 threads a block: eight rows): lane k merges the row's records k, k + 32, ...
 * (partials [S][N], record-major) in order, then the lanes merge by a fixed butterfly, and lane 0
 * writes the row's outputs; the tree depends on S alone (kept-set replay merges a label below its
 * row's threshold back last, ll::with_label). The label's logit t is its record's
 * (record y / record_cols), or where `logits` is given (the sampling head's raw logits, f32 rows
 * of logits_pitch) the logit stored there, the same float. Shard form (records not NULL): the
 * row's record over this weight's columns in rlk.h's vocab-parallel units (natural log of
 * z = x / T: m, s, u, and t = z_y where the shard owns the label, else +inf; an owned z_y of +inf
 * is written NaN) instead of logp, lse and entropy; a label outside the shard is no error. */
template <typename L, bool ENTROPY>
__global__ void __launch_bounds__(LL_THREADS)
    linear_logprob_combine(RLK_PARAMS_ARG ll::CombineParams p_) {
  const ll::part *__restrict__ partials = (const ll::part *)p_.partials;
  const i64 S = p_.S, N = p_.N, V = p_.V, record_cols = p_.record_cols;
  const i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = (int)(threadIdx.x % 32);
  if (row >= N) return; /* the warp's 32 lanes alike */
  ll::part acc = ll::empty_part();
  for (i64 sp = lane; sp < S; sp += 32) acc = ll::merge<ENTROPY>(acc, partials[sp * N + row]);
  acc = ll::lane_merge<32, ENTROPY>(acc);
  if (lane != 0) return;
  const float temperature = p_.temperature, c = RLK_LL_LOG2E / temperature;
  const i64 yg = ll::load_label((const L *)p_.labels, row, p_.label_stride), y = yg - p_.vocab_start;
  const bool own = yg != p_.ignore_index && y >= 0 && y < V;
  const float t = !own ? 0.0f : p_.logits ? p_.logits[row * p_.logits_pitch + y] : partials[(y / record_cols) * N + row].t;
  if (p_.threshold && own) acc = ll::with_label<ENTROPY>(acc, t, ld_ro(p_.threshold + row), c);
  if (p_.records) {
    f32x4 r;
    r.x = acc.m * RLK_LL_LN2; /* -inf stays -inf */
    r.y = acc.s;
    r.z = ENTROPY ? RLK_LL_LN2 * acc.q : 0.0f;
    /* t = z_y, +inf "absent"; an owned z_y of +inf (a +inf logit, or x_y / T past f32's range)
     * is NaN, never the marker: its row is NaN either way, and the label stays owned */
    const float z = t / temperature;
    r.w = !own ? limits<float>::infinity() : z == limits<float>::infinity() ? limits<float>::quiet_nan() : z;
    *(f32x4 *)(p_.records + 4 * row) = r;
    return;
  }
  float lp, l, h;
  if (yg != p_.ignore_index && !own) {
    lp = l = h = limits<float>::quiet_nan();
    if (p_.status) atomicOr((int *)p_.status, (int)LP_STATUS_BAD_LABEL);
  } else {
    const float ln_s = logf(acc.s);
    l = acc.m * RLK_LL_LN2 + ln_s;
    h = ENTROPY ? ln_s - RLK_LL_LN2 * (acc.q / acc.s) : 0.0f;
    lp = own ? fmaf(t, c, -acc.m) * RLK_LL_LN2 - ln_s : 0.0f;
  }
  p_.logp[row] = lp;
  if (p_.lse) p_.lse[row] = l;
  if (ENTROPY && p_.entropy) p_.entropy[row] = h;
}

} /* namespace rlk */

#endif /* RLK_LINEAR_LOGPROB_COMMON_CUH */

/* advantage_scan.cuh - reverse first-order linear recurrences over time, one row (sequence) at a
 * time: GAE (both masked-position semantics) and discounted returns (reset or zero; a reverse
 * cumulative sum is the zero form with gamma 1). Launched by src/ops/advantage_scan.c.
 *
 * Every step t is an affine map on a small state carried from t + 1 to t:
 *   GAE      state (A, N) = (advantage, value bootstrap);  A' = p A + q N + u,  N' = s N + v
 *   returns  state x;                                      x' = a x + b
 * Maps compose (the composition of affine maps is affine), so a row splits into groups of K
 * consecutive steps per thread: each thread composes its group's maps, a warp-wide suffix scan
 * (Hillis-Steele over shuffles, from the highest lane down) composes the groups to its right,
 * and each thread then walks its group backwards from the state that enters it, writing the
 * outputs. Rows are cut into tiles processed last to first, the state carried between tiles:
 *   AS_ALGO_WARP   a warp per row (several rows per block), tiles of RLK_WARP_SIZE * K steps; the
 *               carry into the next tile is the state lane 0 reached at the tile's first step;
 *   AS_ALGO_BLOCK  a block per row, tiles of blockDim.x * K steps; warp 0 composes the warps' maps
 *               (a second suffix scan over shared memory) and carries the block's map forward.
 * The combination order is fixed by the launch shape: results are bitwise repeatable. Arithmetic
 * is in the data type (f32 maps decay with powers of gamma * lambda, they do not grow).
 *
 * Masked positions: a flag per step (valid where the mask is non-zero). Their rewards and values
 * are selected away, never multiplied by 0, so NaN or inf there cannot leak into other steps. */
#ifndef RLK_ADVANTAGE_SCAN_CUH
#define RLK_ADVANTAGE_SCAN_CUH

#include "advantage_scan_common.cuh"
#include "advantage_scan_params.h"

namespace rlk {
namespace as {

template <typename TS> struct gae_map {
  TS p, q, u, s, v;
};
template <typename TS> struct gae_state {
  TS a, n;
};
/* x' = a x + b, or x' = b where the steps pass a reset (k): a reset discards what is carried into
 * it, NaN and inf included, where 0 x would carry a NaN across it */
template <typename TS> struct ret_map {
  TS a, b;
  int k;
};
template <typename TS> struct ret_state {
  TS x;
};

template <typename TS, int FAMILY> struct family;

/* GAE. A valid step: A' = gl A + g N + (r - V), N' = V. A masked step: skip - the identity;
 * zero - A' = gl A + g N, N' = 0 (the plain recurrence on zeroed inputs). */
template <typename TS> struct family<TS, AS_FAMILY_GAE> {
  typedef gae_map<TS> map;
  typedef gae_state<TS> state;

  static RLK_DEVICE map identity() {
    map m;
    m.p = TS(1);
    m.q = TS(0);
    m.u = TS(0);
    m.s = TS(1);
    m.v = TS(0);
    return m;
  }
  static RLK_DEVICE state zero() {
    state x;
    x.a = TS(0);
    x.n = TS(0);
    return x;
  }
  /* L o R, where R covers the later steps (applied first). */
  static RLK_DEVICE map compose(const map &L, const map &R) {
    map m;
    m.p = L.p * R.p;
    m.q = L.p * R.q + L.q * R.s;
    m.u = L.p * R.u + L.q * R.v + L.u;
    m.s = L.s * R.s;
    m.v = L.s * R.v + L.v;
    return m;
  }
  static RLK_DEVICE state apply(const map &M, const state &x) {
    state y;
    y.a = M.p * x.a + M.q * x.n + M.u;
    y.n = M.s * x.n + M.v;
    return y;
  }
  /* (step t) o F, F the composition of the steps after t. */
  static RLK_DEVICE map push(const map &F, bool valid, TS r, TS v, TS g, TS gl, int masked) {
    if (!valid && masked == AS_GAE_SKIP) return F;
    map m;
    m.p = gl * F.p;
    m.q = gl * F.q + g * F.s;
    m.u = gl * F.u + g * F.v + (valid ? r - v : TS(0));
    m.s = TS(0);
    m.v = valid ? v : TS(0);
    return m;
  }
  /* The state at t from the state after it; o0 = A_t, o1 = returns_t. */
  static RLK_DEVICE state step(const state &x, bool valid, TS r, TS v, TS g, TS gl, int masked,
                               TS base, TS &o0, TS &o1) {
    (void)base;
    state y;
    if (valid) {
      y.a = gl * x.a + g * x.n + (r - v);
      y.n = v;
    } else if (masked == AS_GAE_SKIP) {
      y = x;
    } else {
      y.a = gl * x.a + g * x.n;
      y.n = TS(0);
    }
    o0 = y.a;
    o1 = y.a + ((valid || masked == AS_GAE_SKIP) ? v : TS(0));
    return y;
  }
  /* each field of m through the warp shuffle sh */
  template <class Shuffle> static RLK_DEVICE map shuffled(const map &m, Shuffle sh) {
    map r;
    r.p = sh(m.p);
    r.q = sh(m.q);
    r.u = sh(m.u);
    r.s = sh(m.s);
    r.v = sh(m.v);
    return r;
  }
  static RLK_DEVICE map down(const map &m, int d) {
    return shuffled(m, [d](TS x) { return shfl_down(x, d); });
  }
  static RLK_DEVICE map from(const map &m, int lane) {
    return shuffled(m, [lane](TS x) { return shfl_from(x, lane); });
  }
  static RLK_DEVICE state from(const state &x, int lane) {
    state y;
    y.a = shfl_from(x.a, lane);
    y.n = shfl_from(x.n, lane);
    return y;
  }
};

/* Discounted returns. reset: R_t = g x + r_t is written at every step, and the state carried to
 * t - 1 is R_t where valid, 0 where masked. zero: x' = g x + (valid ? r : 0), written as is.
 * carry: x' = g x + r where valid (written), x' = x where masked (0 written). */
template <typename TS> struct family<TS, AS_FAMILY_RETURNS> {
  typedef ret_map<TS> map;
  typedef ret_state<TS> state;

  static RLK_DEVICE map identity() {
    map m;
    m.a = TS(1);
    m.b = TS(0);
    m.k = 0;
    return m;
  }
  static RLK_DEVICE state zero() {
    state x;
    x.x = TS(0);
    return x;
  }
  static RLK_DEVICE map compose(const map &L, const map &R) {
    if (L.k) return L;
    map m;
    m.a = L.a * R.a;
    m.b = L.a * R.b + L.b;
    m.k = R.k;
    return m;
  }
  static RLK_DEVICE state apply(const map &M, const state &x) {
    state y;
    y.x = M.k ? M.b : M.a * x.x + M.b;
    return y;
  }
  static RLK_DEVICE map push(const map &F, bool valid, TS r, TS v, TS g, TS gl, int masked) {
    (void)v;
    (void)gl;
    map m;
    if (!valid && masked == AS_RETURNS_RESET) {
      m.a = TS(0);
      m.b = TS(0);
      m.k = 1;
    } else if (!valid && masked == AS_RETURNS_CARRY) {
      m = F;
    } else {
      m.a = g * F.a;
      m.b = g * F.b + (valid ? r : TS(0));
      m.k = F.k;
    }
    return m;
  }
  /* o0 = R_t; o1 = R_t - baseline where valid, R_t where masked (ReMax). */
  static RLK_DEVICE state step(const state &x, bool valid, TS r, TS v, TS g, TS gl, int masked,
                               TS base, TS &o0, TS &o1) {
    (void)v;
    (void)gl;
    state y;
    TS out;
    if (masked == AS_RETURNS_RESET) {
      out = g * x.x + r;
      y.x = valid ? out : TS(0);
    } else if (masked == AS_RETURNS_CARRY) {
      out = valid ? g * x.x + r : TS(0);
      y.x = valid ? out : x.x;
    } else {
      out = g * x.x + (valid ? r : TS(0));
      y.x = out;
    }
    o0 = out;
    o1 = valid ? out - base : out;
    return y;
  }
  static RLK_DEVICE map down(const map &m, int d) {
    map r;
    r.a = shfl_down(m.a, d);
    r.b = shfl_down(m.b, d);
    r.k = shfl_down(m.k, d);
    return r;
  }
  static RLK_DEVICE map from(const map &m, int lane) {
    map r;
    r.a = shfl_from(m.a, lane);
    r.b = shfl_from(m.b, lane);
    r.k = shfl_from(m.k, lane);
    return r;
  }
  static RLK_DEVICE state from(const state &x, int lane) {
    state y;
    y.x = shfl_from(x.x, lane);
    return y;
  }
};

/* Inclusive suffix composition over the lanes of a warp: lane l ends with
 * m_l o m_{l+1} o ... o m_{W-1}. Every lane must call it. */
template <typename F> RLK_DEVICE typename F::map suffix_scan(typename F::map m, int lane) {
#pragma unroll
  for (int off = 1; off < RLK_WARP_SIZE; off <<= 1) {
    const typename F::map o = F::down(m, off);
    if (lane + off < RLK_WARP_SIZE) m = F::compose(m, o);
  }
  return m;
}

/* The composition of the lanes above this one (identity on the last lane), from an inclusive
 * suffix scan. */
template <typename F> RLK_DEVICE typename F::map exclusive_of(const typename F::map &incl, int lane) {
  typename F::map e = F::down(incl, 1);
  if (lane == RLK_WARP_SIZE - 1) e = F::identity();
  return e;
}

/* One row. AS_ALGO_WARP: the calling warp owns the row. AS_ALGO_BLOCK: the whole block does (every
 * thread calls this; wagg and wcarry are the block's shared arrays). */
template <typename TS, int FAMILY, int ALGO>
RLK_DEVICE void scan_row(const TS *r, const TS *v, const void *mask, i64 m0, int mask_kind,
                         TS *out0, TS *out1, TS base, i64 T, TS g, TS gl, int masked, bool vec,
                         typename family<TS, FAMILY>::map *wagg,
                         typename family<TS, FAMILY>::state *wcarry) {
  typedef family<TS, FAMILY> F;
  typedef typename F::map map;
  typedef typename F::state state;
  constexpr int K = seq::group<TS>::size;
  const int lane = (int)(threadIdx.x % RLK_WARP_SIZE);
  const int warp = (int)(threadIdx.x / RLK_WARP_SIZE);
  const int nw = (int)(blockDim.x / RLK_WARP_SIZE);
  const i64 idx = ALGO == AS_ALGO_WARP ? (i64)lane : (i64)threadIdx.x;
  const i64 tile_len = (i64)(ALGO == AS_ALGO_WARP ? RLK_WARP_SIZE : (int)blockDim.x) * K;
  const i64 ntiles = (T + tile_len - 1) / tile_len;

  state carry = F::zero(); /* AS_ALGO_BLOCK: meaningful in warp 0 only */
  for (i64 tile = ntiles - 1; tile >= 0; --tile) {
    const i64 t0 = tile * tile_len + idx * K;
    const i64 left = T - t0;
    const int n = left <= 0 ? 0 : (left >= K ? K : (int)left);
    TS rv[K], vv[K];
    bool m[K];
    seq::load_vals<TS, K, true>(r + (n ? t0 : 0), n, vec, rv);
    if (FAMILY == AS_FAMILY_GAE) {
      seq::load_vals<TS, K, true>(v + (n ? t0 : 0), n, vec, vv);
    } else {
#pragma unroll
      for (int j = 0; j < K; ++j) vv[j] = TS(0);
    }
    seq::load_valid<K>(mask, mask_kind, m0 + (n ? t0 : 0), n, vec, m);

    /* this thread's group, composed from its last step to its first */
    map agg = F::identity();
#pragma unroll
    for (int j = K - 1; j >= 0; --j)
      if (j < n) agg = F::push(agg, m[j], rv[j], vv[j], g, gl, masked);
    const map incl = suffix_scan<F>(agg, lane);
    const map excl = exclusive_of<F>(incl, lane);

    state in;
    if (ALGO == AS_ALGO_WARP) {
      in = F::apply(excl, carry);
    } else {
      if (lane == 0) wagg[warp] = incl; /* the warp's whole map */
      __syncthreads();
      if (warp == 0) {
        const map w = lane < nw ? wagg[lane] : F::identity();
        const map wincl = suffix_scan<F>(w, lane);
        const map wexcl = exclusive_of<F>(wincl, lane);
        if (lane < nw) wcarry[lane] = F::apply(wexcl, carry);
        carry = F::apply(F::from(wincl, 0), carry); /* into the previous tile */
      }
      __syncthreads();
      in = F::apply(excl, wcarry[warp]);
    }

    TS y0[K], y1[K];
    state st = in;
#pragma unroll
    for (int j = K - 1; j >= 0; --j) {
      if (j < n) {
        st = F::step(st, m[j], rv[j], vv[j], g, gl, masked, base, y0[j], y1[j]);
      } else {
        y0[j] = TS(0);
        y1[j] = TS(0);
      }
    }
    if (n) {
      seq::store_vals<TS, K>(out0 + t0, n, vec, y0);
      if (out1) seq::store_vals<TS, K>(out1 + t0, n, vec, y1);
    }
    if (ALGO == AS_ALGO_WARP) carry = F::from(st, 0); /* lane 0 ends at the tile's first step */
  }
}

} /* namespace as */

/* GAE (AS_FAMILY_GAE) or discounted returns (AS_FAMILY_RETURNS) over B rows of T steps.
 *   x0, x1   rewards and values (x1 unused for returns), row strides s0, s1
 *   mask     [B, T] of kind mask_kind (RLK_SEQ_MASK_*; NULL with RLK_SEQ_MASK_NONE), row stride ms
 *   o0, o1   outputs: advantages and returns (GAE), or returns and ReMax advantages (returns);
 *            o1 may be NULL; baseline [B] (returns only) may be NULL (then 0)
 *   gamma, gamma_lambda (GAE's gamma * lambda, formed in double by the caller), masked: the
 *   run-time semantics (as::GAE_* or as::RETURNS_*).
 * AS_ALGO_WARP: blockDim.x / warp rows per block; AS_ALGO_BLOCK: one row per block. Rows are
 * grid-strided with block-uniform (AS_ALGO_BLOCK) or warp-uniform (AS_ALGO_WARP) loops. */
template <typename TS, int FAMILY, int ALGO>
__global__ void advantage_scan(RLK_PARAMS_ARG as_args p_) {
  const TS *__restrict__ x0 = (const TS *)p_.x0, *__restrict__ x1 = (const TS *)p_.x1;
  const i64 s0 = p_.s0, s1 = p_.s1, ms = p_.ms, os0 = p_.os0, os1 = p_.os1, B = p_.B, T = p_.T;
  const void *__restrict__ mask = p_.mask;
  const int mask_kind = p_.mask_kind, masked = p_.masked;
  TS *__restrict__ o0 = (TS *)p_.o0, *__restrict__ o1 = (TS *)p_.o1;
  const TS *__restrict__ baseline = (const TS *)p_.baseline;
  const double gamma = p_.gamma, gamma_lambda = p_.gamma_lambda;
  typedef as::family<TS, FAMILY> F;
  __shared__ typename F::map wagg[RLK_MAX_WARPS];
  __shared__ typename F::state wcarry[RLK_MAX_WARPS];
  constexpr int K = seq::group<TS>::size;
  const TS g = (TS)gamma, gl = (TS)gamma_lambda;
  const int warp = (int)(threadIdx.x / RLK_WARP_SIZE);
  const int nw = (int)(blockDim.x / RLK_WARP_SIZE);
  const int mb = seq::mask_bytes(mask_kind);

  i64 row, step;
  if (ALGO == AS_ALGO_WARP) {
    row = (i64)blockIdx.x * nw + warp;
    step = (i64)gridDim.x * nw;
  } else {
    row = blockIdx.x;
    step = gridDim.x;
  }
  for (; row < B; row += step) {
    const TS *r = x0 + row * s0;
    const TS *v = FAMILY == AS_FAMILY_GAE ? x1 + row * s1 : x0;
    TS *out0 = o0 + row * os0;
    TS *out1 = o1 ? o1 + row * os1 : nullptr;
    const i64 m0 = row * ms;
    const TS base = baseline ? ld_ro(baseline + row) : TS(0);
    bool vec = is_aligned<16>(r) && is_aligned<16>(v) && is_aligned<16>(out0) &&
               (!out1 || is_aligned<16>(out1));
    if (mb) vec = vec && seq::mask_vec_ok<K>(mask, mask_kind, m0);
    as::scan_row<TS, FAMILY, ALGO>(r, v, mask, m0, mask_kind, out0, out1, base, T, g, gl, masked,
                                   vec, wagg, wcarry);
  }
}

} /* namespace rlk */

#endif /* RLK_ADVANTAGE_SCAN_CUH */

/* linear_logprob_stored.cuh - rlk_linear_policy_loss's token chunks on sm_90a: the logits of a
 * chunk were stored once by linear_logprob_bwd_sm90's logits kind as u = 2^(x c - m) in 16 bits
 * (x = h . w_v, c = log2(e) / T, m the row's maximum x c over the 256-column tile), beside the
 * tile's record; once the loss has given each row's gradients, linear_logprob_stored_dz turns u
 * into the logits' gradient in place,
 *
 *   dz = (g_lp (onehot(y) - p) - g_H p (x / T - E)) / T,  p = u 2^(m - lse log2(e)),
 *   x / T = (log2 u + m) ln 2,  E = lse - entropy,
 *
 * the dz kind's formula, so that the dh and dw kinds take it as they take dz. u in [0, 1] keeps
 * 16-bit p within the relative rounding of the stored dz. Ignored rows get 0, rows with a bad
 * label NaN (the combine sets the status bit). Each element is read and written by one thread:
 * bitwise repeatable. linear_logprob_combine gives the rows' logp, lse and entropy from the
 * records before that: the forward's records and merge, so the forward's bits. */
#ifndef RLK_LINEAR_LOGPROB_STORED_CUH
#define RLK_LINEAR_LOGPROB_STORED_CUH

#include "linear_logprob_common.cuh"

namespace rlk {

namespace ll {
RLK_PARAMS_DECLARE(StoredDzParams, RLK_LL_STORED_DZ_PARAMS, RLK_LL_STORED_DZ_PARAMS_SIZE);
}

/* A tile record's RLK_LL_STORED_TILE columns; RLK_LL_STORED_VEC columns (16 bytes) a vector and
 * RLK_LL_STORED_VECS vectors a thread (linear_logprob_params.h), 2048 columns apart, blocks of 256
 * threads along a row: grid (ceil(V / 8192), M). A thread's loads all go out before its first
 * store (bytes in flight: the pass is a stream of u in and dz out), and its row's inputs are read
 * once for its four vectors. */

/* Element k of a vector of u (eight 16-bit values in four words), as a float. */
template <typename T> RLK_DEVICE float ll_stored_elem(const u32 (&w)[RLK_LL_STORED_VEC / 2], int k) {
  T e;
  e.bits = (u16)(w[k / 2] >> (16 * (k % 2)));
  return to_float(e);
}

/* A row's inputs to its logits' gradient (the row's lse, upstream gradients and label); a row past
 * M counts as ignored. py >= 0 where kept-set replay left the label out of its tile (u 0 there):
 * the label's p from its logit t (its record's), and xty its t / T. */
struct ll_stored_row {
  float lse2, gl, gh, E; /* lse in base 2; g_lp, g_ent; lse - entropy */
  float py, xty;
  i64 y;
  u8 state; /* 1 ignored, 2 bad label */
};

template <typename L, bool ENTROPY> RLK_DEVICE ll_stored_row ll_stored_row_of(const ll::StoredDzParams &p_, i64 row) {
  ll_stored_row r;
  r.lse2 = r.gl = r.gh = r.E = r.xty = 0.0f;
  r.py = -1.0f;
  r.y = -1;
  r.state = 1;
  if (row >= p_.M) return r;
  r.y = ll::load_label((const L *)p_.labels, row, p_.label_stride);
  r.state = r.y == p_.ignore_index ? 1 : (r.y < 0 || r.y >= p_.V) ? 2 : 0;
  r.lse2 = ld_ro(p_.lse + row) * RLK_LL_LOG2E;
  r.gl = p_.g_lp ? ld_ro(p_.g_lp + row) : 0.0f;
  if (ENTROPY && p_.g_ent) {
    r.gh = ld_ro(p_.g_ent + row);
    r.E = ld_ro(p_.lse + row) - ld_ro(p_.entropy + row);
  }
  if (p_.threshold && r.state == 0) {
    const float t = ld_ro(&((const ll::part *)p_.partials)[(r.y / RLK_LL_STORED_TILE) * p_.M + row].t);
    if (t < ld_ro(p_.threshold + row)) {
      r.py = exp2_approx(fmaf(t, RLK_LL_LOG2E / p_.temperature, -r.lse2));
      r.xty = t / p_.temperature;
    }
  }
  return r;
}

/* Element k of a vector of u turned into its gradient in place: p = u scale (scale = 2^(m -
 * lse2)), the row's inputs as ll_stored_row's, `label` where the element is the row's label; py
 * >= 0: the label's p and xty its x / T (a kept-set label u does not hold). */
template <typename T, bool ENTROPY>
RLK_DEVICE void ll_stored_dz_elem(u32 (&w)[RLK_LL_STORED_VEC / 2], int k, float scale, float m, u8 state, float gl,
                                  float gh, float E, bool label, float inv_t, float py, float xty) {
  const float uk = ll_stored_elem<T>(w, k);
  const bool own = label && py >= 0.0f;
  const float p = own ? py : uk * scale;
  /* u = 0 (below 2^-126 of the tile's maximum): p = 0, and so is its entropy term */
  const float xt = own ? xty : ENTROPY ? (log2f(uk) + m) * RLK_LL_LN2 : 0.0f;
  const float g =
      ll::dz_of<ENTROPY>(state & 1, state >> 1, gl, gh, E, label ? 1.0f : 0.0f, p, xt, own || uk > 0.0f, inv_t);
  const T o = store_as<T>::from(g);
  w[k / 2] = (w[k / 2] & ~(0xffffu << (16 * (k % 2)))) | ((u32)o.bits << (16 * (k % 2)));
}

template <int DT, typename L, bool ENTROPY>
__global__ void __launch_bounds__(LL_THREADS) linear_logprob_stored_dz(RLK_PARAMS_ARG ll::StoredDzParams p_) {
  typedef typename ll::elem<DT>::type T;
  constexpr int VEC = RLK_LL_STORED_VEC, VECS = RLK_LL_STORED_VECS, STEP = LL_THREADS * VEC;
  const i64 row = (i64)blockIdx.y, M = p_.M, V = p_.V;
  const i64 first = (i64)blockIdx.x * STEP * VECS + (i64)threadIdx.x * VEC;
  if (first >= V) return;
  T *u = (T *)p_.u + row * p_.u_stride;
  const ll::part *partials = (const ll::part *)p_.partials;
  u32 w[VECS][VEC / 2];
  float m[VECS];
#pragma unroll
  for (int v = 0; v < VECS; ++v) {
    const i64 v0 = first + (i64)v * STEP;
    m[v] = 0.0f;
#pragma unroll
    for (int k = 0; k < VEC / 2; ++k) w[v][k] = 0;
    if (v0 + VEC <= V) {
      const i32x4 x = *(const i32x4 *)(u + v0);
      w[v][0] = (u32)x.x, w[v][1] = (u32)x.y, w[v][2] = (u32)x.z, w[v][3] = (u32)x.w;
    } else {
      for (int k = 0; k < VEC && v0 + k < V; ++k) w[v][k / 2] |= (u32)u[v0 + k].bits << (16 * (k % 2));
    }
    if (v0 < V) m[v] = ld_ro(&partials[(v0 / RLK_LL_STORED_TILE) * M + row].m);
  }
  const ll_stored_row r = ll_stored_row_of<L, ENTROPY>(p_, row);
  const float inv_t = 1.0f / p_.temperature;
#pragma unroll
  for (int v = 0; v < VECS; ++v) {
    const i64 v0 = first + (i64)v * STEP;
    if (v0 >= V) break;
    const float scale = exp2_approx(m[v] - r.lse2); /* p = u scale */
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      ll_stored_dz_elem<T, ENTROPY>(w[v], k, scale, m[v], r.state, r.gl, r.gh, r.E, v0 + k == r.y, inv_t, r.py,
                                    r.xty);
    if (v0 + VEC <= V) {
      i32x4 x;
      x.x = (i32)w[v][0], x.y = (i32)w[v][1], x.z = (i32)w[v][2], x.w = (i32)w[v][3];
      *(i32x4 *)(u + v0) = x;
    } else {
      for (int k = 0; k < VEC && v0 + k < V; ++k) u[v0 + k].bits = (u16)(w[v][k / 2] >> (16 * (k % 2)));
    }
  }
}

/* linear_logprob_stored_dz over u^T [V][M] (the logits_t kind's layout: column v of the rows in
 * line v, from u below ksplit and from u2 at line v - ksplit above): a block takes 256 rows x 64
 * columns (inside one record's 256), a warp 512 contiguous bytes of a line at a time (a thread 8
 * rows, a 16-byte vector) over eight lines 8 apart. Its loads go out first; the rows' inputs and
 * records meanwhile go into shared memory, a thread a row, row rb + e at e 32 + rb / 8 (a warp's
 * reads of its element e fall on 32 banks). Grid (ceil(M / 256), ceil(V / 64)), 256 threads. The
 * element's formula is the row-major pass's. */
template <int DT, typename L, bool ENTROPY>
__global__ void __launch_bounds__(LL_THREADS) linear_logprob_stored_dz_t(RLK_PARAMS_ARG ll::StoredDzParams p_) {
  typedef typename ll::elem<DT>::type T;
  constexpr int VEC = RLK_LL_STORED_VEC, LINES = 8, ROWS = RLK_LL_STORED_T_ROWS;
  static_assert(8 * LINES == RLK_LL_STORED_T_COLS && ROWS == LL_THREADS, "a block: a thread a line of rows");
  __shared__ float s_scale[ROWS], s_m[ROWS], s_gl[ROWS], s_gh[ROWS], s_E[ROWS], s_py[ROWS], s_xty[ROWS];
  __shared__ i64 s_y[ROWS];
  __shared__ u8 s_state[ROWS]; /* 1 ignored, 2 bad */
  const i64 M = p_.M, V = p_.V, r0 = (i64)blockIdx.x * ROWS, c0 = (i64)blockIdx.y * (8 * LINES);
  const int tx = (int)threadIdx.x, rb = VEC * (tx % 32); /* the thread's rows r0 + rb + e */
  const i64 rfirst = r0 + rb;
  const bool mine = rfirst < M, whole = rfirst + VEC <= M;
  T *line[LINES];
  u32 w[LINES][VEC / 2];
#pragma unroll
  for (int k = 0; k < LINES; ++k) {
    const i64 v = c0 + tx / 32 + 8 * k;
    line[k] = nullptr;
#pragma unroll
    for (int e = 0; e < VEC / 2; ++e) w[k][e] = 0;
    if (!mine || v >= V) continue;
    line[k] = (v < p_.ksplit ? (T *)p_.u + v * p_.u_stride : (T *)p_.u2 + (v - p_.ksplit) * p_.u2_stride) + rfirst;
    if (whole) {
      const i32x4 x = *(const i32x4 *)line[k];
      w[k][0] = (u32)x.x, w[k][1] = (u32)x.y, w[k][2] = (u32)x.z, w[k][3] = (u32)x.w;
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        if (rfirst + e < M) w[k][e / 2] |= (u32)line[k][e].bits << (16 * (e % 2));
    }
  }
  {
    const i64 row = r0 + tx;
    const ll_stored_row r = ll_stored_row_of<L, ENTROPY>(p_, row);
    const float m = row < M ? ld_ro(&((const ll::part *)p_.partials)[(c0 / RLK_LL_STORED_TILE) * M + row].m) : 0.0f;
    const int at = (tx % VEC) * 32 + tx / VEC;
    s_scale[at] = exp2_approx(m - r.lse2); /* p = u scale */
    s_m[at] = m, s_gl[at] = r.gl, s_gh[at] = r.gh, s_E[at] = r.E, s_y[at] = r.y, s_state[at] = r.state;
    s_py[at] = r.py, s_xty[at] = r.xty;
  }
  __syncthreads();
  const float inv_t = 1.0f / p_.temperature;
#pragma unroll
  for (int k = 0; k < LINES; ++k) {
    if (!line[k]) continue;
    const i64 v = c0 + tx / 32 + 8 * k;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const int q = e * 32 + tx % 32;
      ll_stored_dz_elem<T, ENTROPY>(w[k], e, s_scale[q], s_m[q], s_state[q], s_gl[q], s_gh[q], s_E[q], v == s_y[q],
                                    inv_t, s_py[q], s_xty[q]);
    }
    if (whole) {
      i32x4 x;
      x.x = (i32)w[k][0], x.y = (i32)w[k][1], x.z = (i32)w[k][2], x.w = (i32)w[k][3];
      *(i32x4 *)line[k] = x;
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        if (rfirst + e < M) line[k][e].bits = (u16)(w[k][e / 2] >> (16 * (e % 2)));
    }
  }
}

} /* namespace rlk */

#endif /* RLK_LINEAR_LOGPROB_STORED_CUH */

/* logprob_common.cuh - the pieces every token log-prob / entropy kernel shares: 16-byte vectors
 * of logits, the online (max, sum-exp, sum p z) state, its merge and the per-row outputs.
 *
 * The math, in fp32, with c = log2(e) / temperature and m a running maximum of the raw logits x:
 *   s = sum_j 2^((x_j - m) c)                     (= sum_j exp(z_j - m / T))
 *   q = sum_j 2^((x_j - m) c) (x_j - m) c          (entropy only)
 *   lse = m / T + ln s,  logp = (x_y - m) / T - ln s,  entropy = ln s - ln2 q / s
 * A thread reads its logits in chunks (several 16-byte vectors); the maximum moves once per chunk,
 * rescaling s and q by 2^((m_old - m_new) c). States of threads merge symmetrically (bitwise the
 * same whichever side is which), in a fixed tree: a result depends only on the inputs and the
 * launch shape. -inf logits contribute exactly 0 (to q too); a NaN logit makes the row NaN; a row
 * of -inf has lse -inf and NaN logp / entropy (like log_softmax).
 *
 * The logits' dtype (the template parameter DT) is an RLK_DT_* code (rlk_float_dtype.h). */
#ifndef RLK_LOGPROB_COMMON_CUH
#define RLK_LOGPROB_COMMON_CUH

#include "rlk_prelude.cuh"
#include "logprob_params.h"

namespace rlk {
namespace lp {

/* The kernels' arguments (logprob_params.h): the forward's, shared by its three variants (the
 * tensor-map variant's holds its map before it), and the backward's. */
typedef ::lp_fwd_args FwdParams;
typedef ::lp_fwd_tma_args FwdTmaParams;
RLK_PARAMS_DECLARE(BwdParams, RLK_LP_BWD_PARAMS, RLK_LP_BWD_PARAMS_SIZE);


/* Bits in the caller's status word: LP_STATUS_* (common/rlk_logprob_status.h). */

#define RLK_LP_LOG2E 1.4426950408889634f
#define RLK_LP_LN2 0.69314718055994531f
/* q's factor (x - m) c is clamped at -BIG so that a -inf logit adds 0 * -BIG = 0, not NaN; its
 * 2^(...) is computed from the unclamped value (0 for -inf, NaN for NaN). */
#define RLK_LP_BIG 3.0e38f

template <int DT> struct logit_traits;
template <> struct logit_traits<RLK_DT_F32> {
  typedef float type;
  static constexpr int bytes = 4;
};
template <> struct logit_traits<RLK_DT_F16> {
  typedef f16 type;
  static constexpr int bytes = 2;
};
template <> struct logit_traits<RLK_DT_BF16> {
  typedef bf16 type;
  static constexpr int bytes = 2;
};

/* Elements of dtype DT in one 16-byte vector. */
template <int DT> struct epv {
  static constexpr int value = 16 / logit_traits<DT>::bytes;
};

struct alignas(16) u32x4 {
  u32 w[4];
};

/* A 16-byte load of data that nothing writes while the kernel runs (not kept in L1). */
RLK_DEVICE u32x4 load_stream(const void *p) {
  u32x4 v;
#if defined(RLK_CUDA)
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
      : "l"(p));
#else
  v = *(const u32x4 *)p;
#endif
  return v;
}

/* A 16-byte load of data the same kernel may overwrite later (the in-place backward). */
RLK_DEVICE u32x4 load_once(const void *p) {
  u32x4 v;
#if defined(RLK_CUDA)
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "l"(p)
               : "memory");
#else
  v = *(const u32x4 *)p;
#endif
  return v;
}

/* Element J of a 16-byte vector as a float (exact: bf16 is a shift, f16 a conversion). */
template <int DT, int J> RLK_DEVICE float element(const u32x4 &v) {
  if constexpr (DT == RLK_DT_F32) {
    return bits_as_float(v.w[J]);
  } else if constexpr (DT == RLK_DT_BF16) {
    return (J & 1) ? bits_as_float(v.w[J / 2] & 0xffff0000u) : bits_as_float(v.w[J / 2] << 16);
  } else {
    f16 h;
    h.bits = (u16)((J & 1) ? (v.w[J / 2] >> 16) : (v.w[J / 2] & 0xffffu));
    return to_float(h);
  }
}

/* One logit by index, as a float. */
template <int DT> RLK_DEVICE float load_logit(const void *row, i64 j) {
  if constexpr (DT == RLK_DT_F32) {
    return ((const float *)row)[j];
  } else {
    typedef typename logit_traits<DT>::type T;
    return to_float(((const T *)row)[j]);
  }
}

/* Largest element of U vectors (NaN elements are skipped unless all are NaN). 16-bit types on
 * CUDA compare two at a time with max.{bf16,f16}x2 (sm_80+), converting only the result. */
template <int DT, int U> RLK_DEVICE float vec_max(const u32x4 *v) {
#if defined(RLK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (DT != RLK_DT_F32) {
    u32 m = v[0].w[0];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = (u == 0 ? 1 : 0); k < 4; ++k) {
        if constexpr (DT == RLK_DT_BF16)
          asm("max.bf16x2 %0, %0, %1;" : "+r"(m) : "r"(v[u].w[k]));
        else
          asm("max.f16x2 %0, %0, %1;" : "+r"(m) : "r"(v[u].w[k]));
      }
    u32x4 t;
    t.w[0] = m;
    return fmaxf(element<DT, 0>(t), element<DT, 1>(t));
  }
#endif
  constexpr int E = epv<DT>::value;
  float m = element<DT, 0>(v[0]);
#pragma unroll
  for (int u = 0; u < U; ++u) {
#define RLK_LP_MAXJ(J) \
  if (J < E && (u > 0 || J > 0)) m = fmaxf(m, element<DT, (J < E ? J : 0)>(v[u]));
    RLK_LP_MAXJ(0) RLK_LP_MAXJ(1) RLK_LP_MAXJ(2) RLK_LP_MAXJ(3)
    RLK_LP_MAXJ(4) RLK_LP_MAXJ(5) RLK_LP_MAXJ(6) RLK_LP_MAXJ(7)
#undef RLK_LP_MAXJ
  }
  return m;
}

/* The online state of one thread (or, after merging, of a row). */
struct state {
  float m; /* running maximum of the raw logits; -inf while nothing finite was seen */
  float s; /* sum of 2^((x - m) c) */
  float q; /* sum of 2^((x - m) c) (x - m) c (entropy only) */
};

RLK_DEVICE state empty_state() {
  state st;
  st.m = -limits<float>::infinity();
  st.s = 0.0f;
  st.q = 0.0f;
  return st;
}

/* Moves the state's maximum up to cm (> st.m). An empty state (s == 0) just takes the maximum;
 * a NaN s stays NaN. Terms that the move takes to 0 take their part of q with them: d s may
 * overflow there (a logit at -FLT_MAX below a larger one), and 0 * -inf is NaN. */
template <bool ENTROPY> RLK_DEVICE void raise_max(state &st, float cm, float c) {
  if (st.s != 0.0f) {
    const float d = (st.m - cm) * c;
    const float f = exp2_approx(d);
    if (ENTROPY) st.q = f == 0.0f ? 0.0f : f * (st.q + d * st.s);
    st.s *= f;
  }
  st.m = cm;
}

/* Adds one logit to the state at the state's current maximum m0 (0 while the maximum is -inf,
 * so that -inf logits give 2^-inf = 0 rather than NaN): t = (x - m0) c, exactly 0 at the maximum
 * whatever m0 / T (a fused x c - m0 c would carry the rounding of m0 c, up to half its ulp, into
 * every term: at |m0| / T of 2^24 and beyond the log-probs' error, past 2^31 an overflow), and
 * an x - m0 that overflows is -inf, a term of 0. */
template <bool ENTROPY>
RLK_DEVICE void add_logit(float x, float m0, float c, float &s, float &q) {
  const float t = (x - m0) * c;
  const float p = exp2_approx(t);
  s += p;
  if (ENTROPY) q = fmaf(p, fmaxf(t, -RLK_LP_BIG), q);
}

/* A logit as kept-set replay folds it: below the row's threshold it counts as -inf (a NaN logit
 * stays NaN: it is not below anything). */
RLK_DEVICE float kept_logit(float x, float thr) { return x < thr ? -limits<float>::infinity() : x; }

/* add_vectors of the kept logits (kept_logit against thr): every element unpacked and compared
 * first, then the chunk's maximum and the elements in add_vectors' order. */
template <int DT, int U, bool ENTROPY>
RLK_DEVICE void add_vectors_kept(state &st, const u32x4 *v, float c, float thr) {
  constexpr int E = epv<DT>::value;
  float x[U * E];
#pragma unroll
  for (int u = 0; u < U; ++u) {
#define RLK_LP_KEPTJ(J) \
  if (J < E) x[u * E + (J < E ? J : 0)] = kept_logit(element<DT, (J < E ? J : 0)>(v[u]), thr);
    RLK_LP_KEPTJ(0) RLK_LP_KEPTJ(1) RLK_LP_KEPTJ(2) RLK_LP_KEPTJ(3)
    RLK_LP_KEPTJ(4) RLK_LP_KEPTJ(5) RLK_LP_KEPTJ(6) RLK_LP_KEPTJ(7)
#undef RLK_LP_KEPTJ
  }
  float cm = x[0];
#pragma unroll
  for (int k = 1; k < U * E; ++k) cm = fmaxf(cm, x[k]);
  if (cm > st.m) raise_max<ENTROPY>(st, cm, c);
  const float m0 = st.m == -limits<float>::infinity() ? 0.0f : st.m;
  float s0 = 0.0f, s1 = 0.0f, q0 = 0.0f, q1 = 0.0f;
#pragma unroll
  for (int k = 0; k < U * E; ++k) {
    if ((k & 1) == 0)
      add_logit<ENTROPY>(x[k], m0, c, s0, q0);
    else
      add_logit<ENTROPY>(x[k], m0, c, s1, q1);
  }
  st.s += s0 + s1;
  if (ENTROPY) st.q += q0 + q1;
}

/* Adds U vectors (one chunk) to the state: chunk maximum first, then every element. */
template <int DT, int U, bool ENTROPY>
RLK_DEVICE void add_vectors(state &st, const u32x4 *v, float c) {
  const float cm = vec_max<DT, U>(v);
  if (cm > st.m) raise_max<ENTROPY>(st, cm, c);
  const float m0 = st.m == -limits<float>::infinity() ? 0.0f : st.m;
  constexpr int E = epv<DT>::value;
  float s0 = 0.0f, s1 = 0.0f, q0 = 0.0f, q1 = 0.0f;
#pragma unroll
  for (int u = 0; u < U; ++u) {
#define RLK_LP_ADDJ(J)                                                          \
  if (J < E) {                                                                  \
    const float x = element<DT, (J < E ? J : 0)>(v[u]);                        \
    if ((J & 1) == 0)                                                           \
      add_logit<ENTROPY>(x, m0, c, s0, q0);                                     \
    else                                                                        \
      add_logit<ENTROPY>(x, m0, c, s1, q1);                                     \
  }
    RLK_LP_ADDJ(0) RLK_LP_ADDJ(1) RLK_LP_ADDJ(2) RLK_LP_ADDJ(3)
    RLK_LP_ADDJ(4) RLK_LP_ADDJ(5) RLK_LP_ADDJ(6) RLK_LP_ADDJ(7)
#undef RLK_LP_ADDJ
  }
  st.s += s0 + s1;
  if (ENTROPY) st.q += q0 + q1;
}

/* Adds one scalar logit (row heads and tails that are not 16-byte aligned). */
template <bool ENTROPY> RLK_DEVICE void add_scalar(state &st, float x, float c) {
  if (x > st.m) raise_max<ENTROPY>(st, x, c);
  const float m0 = st.m == -limits<float>::infinity() ? 0.0f : st.m;
  add_logit<ENTROPY>(x, m0, c, st.s, st.q);
}

/* Merges two states; symmetric, so both lanes of a butterfly get bitwise the same result. A
 * state rescaled to 0 adds no q (raise_max's rule). */
template <bool ENTROPY> RLK_DEVICE state merge(const state &a, const state &b, float c) {
  state r;
  r.m = fmaxf(a.m, b.m);
  float sa = 0.0f, qa = 0.0f, sb = 0.0f, qb = 0.0f;
  if (a.s != 0.0f) {
    const float d = (a.m - r.m) * c;
    const float f = exp2_approx(d);
    sa = a.s * f;
    if (ENTROPY) qa = f == 0.0f ? 0.0f : f * (a.q + d * a.s);
  }
  if (b.s != 0.0f) {
    const float d = (b.m - r.m) * c;
    const float f = exp2_approx(d);
    sb = b.s * f;
    if (ENTROPY) qb = f == 0.0f ? 0.0f : f * (b.q + d * b.s);
  }
  r.s = sa + sb;
  r.q = ENTROPY ? qa + qb : 0.0f;
  return r;
}

/* Butterfly merge over aligned segments of W lanes (W a power of two up to a warp). Every lane of
 * the warp must call it. */
template <int W, bool ENTROPY> RLK_DEVICE state segment_merge(state st, float c) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) {
    state other;
    other.m = shfl_xor(st.m, o);
    other.s = shfl_xor(st.s, o);
    other.q = ENTROPY ? shfl_xor(st.q, o) : 0.0f;
    st = merge<ENTROPY>(st, other, c);
  }
  return st;
}

/* The label of a row as a 64-bit integer. */
/* (Labels are never written by a log-prob kernel: a read-only load.) */
template <typename L> RLK_DEVICE i64 load_label(const L *labels, i64 row, i64 stride) {
  return (i64)ld_ro(labels + row * stride);
}

/* A row's log-prob of label y from its merged state, `xy` the raw logit at y; ln_s = log(st.s). */
RLK_DEVICE float row_logp(const state &st, float xy, float ln_s, float temperature) {
  return (xy - st.m) / temperature - ln_s;
}

/* Kept-set replay's label: a row's kept set is its logits at or above its threshold and its label
 * (a label below the threshold, which the fold left out, comes back as one more state merged last:
 * the same bits in every kernel that folds the kept logits). */
template <bool ENTROPY> RLK_DEVICE state with_label(const state &st, float xy, float thr, float c) {
  /* a -inf label adds nothing (the host's fold: a term of 0); merged into an empty state it
   * would be -inf - -inf, a NaN row where the kept set is all -inf and lse is -inf */
  if (!(xy < thr) || xy == -limits<float>::infinity()) return st;
  state one;
  one.m = xy;
  one.s = 1.0f; /* 2^0 */
  one.q = 0.0f; /* 2^0 (xy - xy) c */
  return merge<ENTROPY>(st, one, c);
}

/* Writes a row's outputs from its merged state. `y` is its label; `xy` the raw logit at the label
 * (read before the reduction so its latency hides behind it). Ignored rows (y == ignore_index) get
 * logp 0 (lse and entropy as usual); a label outside [0, V) makes every output of the row NaN and
 * raises LP_STATUS_BAD_LABEL in *status. */
template <bool ENTROPY>
RLK_DEVICE void write_row(const state &st, i64 row, i64 y, float xy, i64 V, i64 ignore_index,
                          float temperature, float *logp, float *lse, float *entropy,
                          i32 *status) {
  const float ln_s = logf(st.s);
  float lp, l, h;
  if (y != ignore_index && (y < 0 || y >= V)) {
    lp = l = h = limits<float>::quiet_nan();
    if (status) atomicOr((int *)status, (int)LP_STATUS_BAD_LABEL);
  } else {
    l = st.m / temperature + ln_s;
    h = ENTROPY ? ln_s - RLK_LP_LN2 * (st.q / st.s) : 0.0f;
    lp = y == ignore_index ? 0.0f : row_logp(st, xy, ln_s, temperature);
  }
  logp[row] = lp;
  if (lse) lse[row] = l;
  if (ENTROPY && entropy) entropy[row] = h;
}

/* Head, body and tail of a row: `head` elements up to the first 16-byte boundary, `nvec` whole
 * vectors, then `tail` elements (rows of any stride and any V). For the kernels whose copies need
 * the 16-byte grid (the bulk and tensor-map forwards, the backward's vector stores); a row's
 * split depends on its address. */
template <int DT> struct row_split_aligned {
  i64 head, nvec, tail;
  RLK_DEVICE row_split_aligned(const void *row, i64 V) {
    constexpr int B = logit_traits<DT>::bytes;
    const u64 a = (u64)row;
    i64 h = (i64)(((16u - (a & 15u)) & 15u) / (u64)B);
    if (h > V) h = V;
    head = h;
    nvec = (V - h) / epv<DT>::value;
    tail = V - h - nvec * epv<DT>::value;
  }
};

/* A row's layout by element index: `nvec` vectors of E elements from element 0, then `tail`
 * scalar elements (`head` is 0, kept so that a pass reads like a row_split_aligned one). Every row
 * of any stride, at any place of a batch, has this one layout, so what a pass folds from it is the
 * same bits as an aligned copy of the row gives (batch invariance); a vector of a row off the
 * 16-byte grid (`aligned` false: an odd V in 16 bits, a stride of odd elements) is loaded in
 * narrower pieces (load_row_vec). */
template <int DT> struct row_split {
  i64 head, nvec, tail;
  bool aligned;
  RLK_DEVICE row_split(const void *row, i64 V) {
    head = 0;
    nvec = V / epv<DT>::value;
    tail = V - nvec * epv<DT>::value;
    aligned = ((u64)row & 15u) == 0;
  }
};

/* 16 bytes of a row at p (read-only): one vector load where p is 16-byte aligned (ALIGNED), else
 * the same bytes in the widest loads p's alignment allows (4 bytes, or 2: an element at least). */
template <bool ALIGNED> RLK_DEVICE u32x4 load_row_vec(const u8 *p) {
  if constexpr (ALIGNED) {
    return load_stream(p);
  } else {
    u32x4 v;
    if (((u64)p & 3u) == 0) {
#pragma unroll
      for (int k = 0; k < 4; ++k) v.w[k] = ld_ro((const u32 *)p + k);
    } else {
      const u16 *q = (const u16 *)p;
#pragma unroll
      for (int k = 0; k < 4; ++k) v.w[k] = (u32)q[2 * k] | ((u32)q[2 * k + 1] << 16);
    }
    return v;
  }
}
RLK_DEVICE u32x4 load_row_vec(const u8 *p, bool aligned) {
  return aligned ? load_row_vec<true>(p) : load_row_vec<false>(p);
}

/* One thread's share of a row's forward state: lane `lane` of a row segment of SEG threads folds in
 * the scalar head and tail elements j = lane, lane + SEG, ... and its 16-byte vectors lane,
 * lane + SEG, ..., UNROLL vectors a chunk (their loads in flight together), then its last vectors
 * (fewer than UNROLL) one at a time. Those last vectors are loaded together, so a lane's pass ends
 * one memory round trip after its last chunk rather than one per leftover vector: the slowest
 * lanes of a block, which everyone waits for, are the ones with leftovers. Every forward
 * kernel whose outputs must agree bitwise with logprob_fwd (the sampler's log-probs) computes its
 * per-thread states through this function. */
template <int DT, int SEG, int UNROLL, bool ENTROPY, bool ALIGNED, bool KEPT>
RLK_DEVICE state thread_row_state_of(const u8 *r, i64 V, float c, int lane, float thr) {
  constexpr int B = logit_traits<DT>::bytes;
  constexpr int E = epv<DT>::value;
  state st = empty_state();
  const row_split<DT> sp(r, V);
  const auto x_at = [&](i64 j) { return KEPT ? kept_logit(load_logit<DT>(r, j), thr) : load_logit<DT>(r, j); };
  for (i64 j = lane; j < sp.head; j += SEG) add_scalar<ENTROPY>(st, x_at(j), c);
  const i64 t0 = sp.head + sp.nvec * E;
  for (i64 j = lane; j < sp.tail; j += SEG) add_scalar<ENTROPY>(st, x_at(t0 + j), c);
  const u8 *vb = r + sp.head * B + (i64)lane * 16;
  const i64 nv = lane < sp.nvec ? (sp.nvec - 1 - lane) / SEG + 1 : 0; /* this lane's vectors */
  const i64 nfull = nv / UNROLL;
  const int left = (int)(nv - nfull * UNROLL);
  for (i64 k = 0; k < nfull; ++k) {
    u32x4 raw[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) raw[u] = load_row_vec<ALIGNED>(vb + (k * UNROLL + u) * SEG * 16);
    if constexpr (KEPT)
      add_vectors_kept<DT, UNROLL, ENTROPY>(st, raw, c, thr);
    else
      add_vectors<DT, UNROLL, ENTROPY>(st, raw, c);
  }
  if (left > 0) {
    /* every slot is loaded (slots past `left` repeat the last vector, so the loads stay
     * unconditional and the slots in registers); only the first `left` are added */
    constexpr int NL = UNROLL > 1 ? UNROLL - 1 : 1;
    u32x4 last[NL];
#pragma unroll
    for (int u = 0; u < NL; ++u)
      last[u] = load_row_vec<ALIGNED>(vb + (nfull * UNROLL + (u < left ? u : left - 1)) * SEG * 16);
#pragma unroll
    for (int u = 0; u < NL; ++u)
      if (u < left) {
        if constexpr (KEPT)
          add_vectors_kept<DT, 1, ENTROPY>(st, &last[u], c, thr);
        else
          add_vectors<DT, 1, ENTROPY>(st, &last[u], c);
      }
  }
  return st;
}

/* thread_row_state_of for the row's alignment: one loop of vector loads where it is 16-byte
 * aligned, narrower loads of the same bytes where not; the same element order either way. KEPT:
 * the kept logits of the row (kept_logit against thr). ROWS16: the caller knows every row is
 * aligned (the host checked the base and the stride), so only the aligned loop is built. */
template <int DT, int SEG, int UNROLL, bool ENTROPY, bool KEPT = false, bool ROWS16 = false>
RLK_DEVICE state thread_row_state(const u8 *r, i64 V, float c, int lane, float thr = 0.0f) {
  if constexpr (ROWS16)
    return thread_row_state_of<DT, SEG, UNROLL, ENTROPY, true, KEPT>(r, V, c, lane, thr);
  else
    return ((u64)r & 15u) == 0 ? thread_row_state_of<DT, SEG, UNROLL, ENTROPY, true, KEPT>(r, V, c, lane, thr)
                               : thread_row_state_of<DT, SEG, UNROLL, ENTROPY, false, KEPT>(r, V, c, lane, thr);
}

/* thread_row_state with DEPTH chunks in flight instead of one: the same additions in the same
 * order (so bitwise the same state), the loads of chunk k + DEPTH issued as chunk k is added, and
 * the last vectors loaded with the first chunks. For kernels that give a lane few chunks and many
 * registers (a row split over several blocks), where one chunk in flight leaves a lane waiting a
 * memory round trip per chunk. */
template <int DT, int SEG, int UNROLL, int DEPTH, bool ENTROPY, bool ALIGNED>
RLK_DEVICE state thread_row_state_deep_of(const u8 *r, i64 V, float c, int lane) {
  static_assert(DEPTH >= 1, "DEPTH");
  constexpr int B = logit_traits<DT>::bytes;
  constexpr int E = epv<DT>::value;
  constexpr int NL = UNROLL > 1 ? UNROLL - 1 : 1;
  const row_split<DT> sp(r, V);
  const u8 *vb = r + sp.head * B + (i64)lane * 16;
  const i64 nv = lane < sp.nvec ? (sp.nvec - 1 - lane) / SEG + 1 : 0;
  const i64 nfull = nv / UNROLL;
  const int left = (int)(nv - nfull * UNROLL);
  /* the vectors' loads go out first; the scalar head and tail are still added first */
  u32x4 ring[DEPTH][UNROLL];
  u32x4 last[NL];
#pragma unroll
  for (int d = 0; d < DEPTH; ++d)
    if (d < nfull) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) ring[d][u] = load_row_vec<ALIGNED>(vb + ((i64)d * UNROLL + u) * SEG * 16);
    }
  if (left > 0) {
#pragma unroll
    for (int u = 0; u < NL; ++u)
      last[u] = load_row_vec<ALIGNED>(vb + (nfull * UNROLL + (u < left ? u : left - 1)) * SEG * 16);
  }
  state st = empty_state();
  for (i64 j = lane; j < sp.head; j += SEG) add_scalar<ENTROPY>(st, load_logit<DT>(r, j), c);
  const i64 t0 = sp.head + sp.nvec * E;
  for (i64 j = lane; j < sp.tail; j += SEG) add_scalar<ENTROPY>(st, load_logit<DT>(r, t0 + j), c);
  for (i64 k0 = 0; k0 < nfull; k0 += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      const i64 k = k0 + d;
      if (k < nfull) {
        add_vectors<DT, UNROLL, ENTROPY>(st, ring[d], c);
        if (k + DEPTH < nfull) {
#pragma unroll
          for (int u = 0; u < UNROLL; ++u)
            ring[d][u] = load_row_vec<ALIGNED>(vb + ((k + DEPTH) * UNROLL + u) * SEG * 16);
        }
      }
    }
  }
  if (left > 0) {
#pragma unroll
    for (int u = 0; u < NL; ++u)
      if (u < left) add_vectors<DT, 1, ENTROPY>(st, &last[u], c);
  }
  return st;
}

template <int DT, int SEG, int UNROLL, int DEPTH, bool ENTROPY, bool ROWS16 = false>
RLK_DEVICE state thread_row_state_deep(const u8 *r, i64 V, float c, int lane) {
  if constexpr (ROWS16)
    return thread_row_state_deep_of<DT, SEG, UNROLL, DEPTH, ENTROPY, true>(r, V, c, lane);
  else
    return ((u64)r & 15u) == 0 ? thread_row_state_deep_of<DT, SEG, UNROLL, DEPTH, ENTROPY, true>(r, V, c, lane)
                               : thread_row_state_deep_of<DT, SEG, UNROLL, DEPTH, ENTROPY, false>(r, V, c, lane);
}

/* Merges the states of a block's BLOCK threads (BLOCK > a warp, one row per block) in
 * logprob_fwd's fixed tree: a butterfly in each warp, then warp 0 merges the warps' states (a
 * butterfly over NWARPS lanes, the rest empty). The result is valid in warp 0. `scratch` holds
 * BLOCK / warp states; every thread of the block must call it (it synchronizes twice). */
template <int BLOCK, bool ENTROPY> RLK_DEVICE state block_merge(state st, float c, state *scratch) {
  constexpr int NWARPS = BLOCK / RLK_WARP_SIZE;
  st = segment_merge<RLK_WARP_SIZE, ENTROPY>(st, c);
  const int warp = (int)(threadIdx.x / RLK_WARP_SIZE);
  if (threadIdx.x % RLK_WARP_SIZE == 0) scratch[warp] = st;
  __syncthreads();
  if (warp == 0) {
    const int l = (int)threadIdx.x;
    st = l < NWARPS ? scratch[l] : empty_state();
    st = segment_merge<RLK_WARP_SIZE, ENTROPY>(st, c);
  }
  __syncthreads(); /* scratch is free again */
  return st;
}

} /* namespace lp */
} /* namespace rlk */

#endif /* RLK_LOGPROB_COMMON_CUH */

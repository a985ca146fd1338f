/* sample.cuh - one token per row of logits: temperature, top-k, top-p, min-p, greedy, with
 * per-row Philox seeds, and the sampled token's log-prob bitwise equal to logprob_fwd's.
 *
 * Entry (launched by src/ops/sample.c): rlk::sample, one block per row (rows grid-strided).
 *
 * The log-prob. A row's first pass is logprob_fwd's own (thread_row_state over the same row
 * layout SEG x UNROLL, merged in the same tree), so lse, and logp = (x_y - m) / T - ln s, carry the
 * very bits rlk_logprob writes for that row, temperature and label. T = 0 (greedy) rows use T = 1.
 *
 * Sampling without a sort. Every probability is handled as a fixed-point mass
 *   mass(x) = floor(2^((x - M) c) 2^40),  c = log2(e) / T,  M the row's maximum,
 * so a row's sums are exact 64-bit integers, the same in any order. A 64-bit Philox draw r picks
 * the token whose mass interval [P, P + mass) contains umulhi(r, Z) (Z the total): inverse-CDF
 * sampling in exact arithmetic, with no prefix-sum rounding to go wrong.
 *   - No filter: the first pass already holds each thread's (max, sum) state. The high half of
 *     the first draw picks a warp by the warps' weights, the low half a lane of it by the lanes'
 *     weights within the warp (32-bit draws, 2^-32 resolution), and the second draw an element of
 *     that lane's share of the row by its exact masses. After the first pass's barrier one warp
 *     does all of that (the merge, both draws, re-reading the share, a vector a lane) while the
 *     others go on. One pass over the row in all; the weights are the fp32 states, so a share's
 *     weight is its mass up to fp32 rounding.
 *   - Filters keep an upper set {x >= tau} (see src/ops/sample.c for the exact semantics: ties at a
 *     threshold are kept). The thresholds are found without sorting the vocabulary:
 *       top-k <= SEG: the k-th largest of the threads' maxima bounds the k-th largest logit from
 *         below, so {x >= that} holds the top-k set, typically about k elements; they are gathered
 *         into shared memory (at most CAP) and finished there (a bitonic sort of the candidates,
 *         exact top-k, min-p and top-p on their masses). Two passes.
 *       otherwise a radix select over order-preserving keys of the logits (11-bit digits, one
 *         pass each): counts for top-k, masses for top-p; as soon as what remains fits in CAP it is
 *         gathered and finished in shared memory. Top-p's first pass bins by mass instead (linear
 *         in log2 of it, mass_bin), which spreads a row's atomics over many bins; the digits then
 *         look into the boundary's bin alone, from the key bits its interval of logits fixes.
 *         min-p is a direct threshold on (x - M) c.
 *     then the token is drawn from the kept set: in shared memory, or by a masked pass that sums
 *     each thread's kept masses (a thread's share, then an element of it, from one draw).
 * Bits of the caller's status word: 1 a NaN or +inf logit (token -1, outputs NaN), 2 no finite
 * logit (token -1), 4 a per-row setting out of range (token -1). */
#ifndef RLK_SAMPLE_CUH
#define RLK_SAMPLE_CUH

#include "logprob_common.cuh"
#include "rlk_philox.cuh"
#include "sample_params.h"

namespace rlk {
namespace smp {

RLK_PARAMS_DECLARE(Params, RLK_SAMPLE_PARAMS, RLK_SAMPLE_PARAMS_SIZE);

using namespace lp;

/* Digits of the radix select: bins of the histogram pass. */
constexpr int DIGIT_BITS = 11;
constexpr int BINS = 1 << DIGIT_BITS;

/* 2^40: masses are relative to the row maximum (which weighs 2^40); V < 2^23 keeps sums < 2^63. */
#define RLK_SMP_MASS_SCALE 1099511627776.0f
#define RLK_SMP_LN2_D 0.69314718055994530942

/* A token's fixed-point mass relative to the row maximum mx: 2^((x - mx) c), exactly 2^40 at
 * the maximum whatever mx / T (add_logit's arithmetic). */
RLK_DEVICE u64 mass_of(float x, float c, float mx) {
  return (u64)(exp2_approx((x - mx) * c) * RLK_SMP_MASS_SCALE);
}

/* An order-preserving unsigned key of a float (-0 and +0 alike), keeping its KW significant bits:
 * 32 for f32, 16 for bf16, 19 for f16 (whose values, widened, end in 13 zero bits). */
template <int DT> struct key_width {
  static constexpr int value = DT == RLK_DT_F32 ? 32 : (DT == RLK_DT_BF16 ? 16 : 19);
};
template <int DT> RLK_DEVICE u32 key_of(float x) {
  u32 b = float_as_bits(x);
  if (b == 0x80000000u) b = 0u;
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return b >> (32 - key_width<DT>::value);
}

/* key_of<RLK_DT_F32>'s inverse: the float of a 32-bit order-preserving key (0 and -0 give +0). */
RLK_DEVICE float float_of_key(u32 k) {
  return bits_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* Top-p's first histogram bins a row's logits by their mass, linearly in d = (M - x) c (log2 of the
 * mass below the maximum's): bin BINS - 1 holds d in [0, 40 / BINS), each bin below the next such
 * step, bin 0 everything from d = 40 (BINS - 1) / BINS on, where masses are zero or nearly (2^40
 * is the maximum's). Radix digits of the keys would pile most of a row into the few bins of its
 * exponent bits, each element two shared atomics on one address; these spread it. A bin falls as
 * x does, so it is an interval of logits. cS = c BINS / 40. */
RLK_DEVICE u32 mass_bin(float x, float M, float cS) {
  const float t = (M - x) * cS;
  return t < (float)(BINS - 1) ? (u32)(BINS - 1) - (u32)t : 0u;
}

/* The leading key bits that every logit of mass bin b >= 1 shares, from the bin's interval of
 * logits widened well past rounding: their number, at most KW - 1 so that a digit pass still checks
 * them, and the bits in *prefix. */
template <int DT> RLK_DEVICE int mass_bin_prefix(u32 b, float M, float cS, u32 *prefix) {
  constexpr int KW = key_width<DT>::value;
  const double q = (double)(BINS - 1 - (int)b), w = 1.0 / (double)cS;
  const double slack = 1e-5 * ((q + 1.0) * w + fabs((double)M));
  const u32 lo = key_of<DT>((float)((double)M - (q + 1.0) * w - slack));
  const u32 hi = key_of<DT>((float)((double)M - q * w + slack));
  int nb = lo == hi ? KW : __clz((int)(lo ^ hi)) - (32 - KW);
  nb = nb < KW - 1 ? nb : KW - 1;
  *prefix = nb > 0 ? hi >> (KW - nb) : 0u;
  return nb;
}

/* Calls f(x, j) for every element of lane `lane`'s share of a row, in thread_row_state's order:
 * scalar head and tail elements j = lane + i SEG, then 16-byte vectors lane + i SEG, UNROLL of them
 * in flight at a time. */
template <int DT, typename F> RLK_DEVICE void visit_vector(const u32x4 &v, i64 j0, F &f) {
  constexpr int E = epv<DT>::value;
#define RLK_SMP_VJ(J) \
  if (J < E) f(element<DT, (J < E ? J : 0)>(v), j0 + J);
  RLK_SMP_VJ(0) RLK_SMP_VJ(1) RLK_SMP_VJ(2) RLK_SMP_VJ(3)
  RLK_SMP_VJ(4) RLK_SMP_VJ(5) RLK_SMP_VJ(6) RLK_SMP_VJ(7)
#undef RLK_SMP_VJ
}

template <int DT, int SEG, int UNROLL, bool ROWS16, typename F>
RLK_DEVICE void visit_lane(const u8 *r, i64 V, int lane, F &&f) {
  constexpr int B = logit_traits<DT>::bytes;
  constexpr int E = epv<DT>::value;
  const row_split<DT> sp(r, V);
  for (i64 j = lane; j < sp.head; j += SEG) f(load_logit<DT>(r, j), j);
  const i64 t0 = sp.head + sp.nvec * E;
  for (i64 j = lane; j < sp.tail; j += SEG) f(load_logit<DT>(r, t0 + j), t0 + j);
  const u8 *vb = r + sp.head * B;
  i64 v = lane;
  for (; v + (i64)(UNROLL - 1) * SEG < sp.nvec; v += (i64)UNROLL * SEG) {
    u32x4 raw[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) raw[u] = load_row_vec(vb + (v + (i64)u * SEG) * 16, ROWS16 || sp.aligned);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) visit_vector<DT>(raw[u], sp.head + (v + (i64)u * SEG) * E, f);
  }
  for (; v < sp.nvec; v += SEG) visit_vector<DT>(load_row_vec(vb + v * 16, ROWS16 || sp.aligned), sp.head + v * E, f);
}

/* visit_lane's elements in the same order, with a small body: the UNROLL vectors of a chunk are
 * loaded together, then their 32-bit words are walked in a loop (one or two elements each), so a
 * pass with a large per-element body instantiates it a few times rather than 8 x UNROLL times. */
template <int DT> struct word_elems {
  static constexpr int value = DT == RLK_DT_F32 ? 1 : 2;
};

template <int DT, int E2> RLK_DEVICE float word_element(u32 w) {
  if constexpr (DT == RLK_DT_F32) {
    return bits_as_float(w);
  } else if constexpr (DT == RLK_DT_BF16) {
    return E2 ? bits_as_float(w & 0xffff0000u) : bits_as_float(w << 16);
  } else {
    f16 h;
    h.bits = (u16)(E2 ? (w >> 16) : (w & 0xffffu));
    return to_float(h);
  }
}

template <int U> RLK_DEVICE u32 word_of(const u32x4 *raw, int k) {
  u32 w = raw[0].w[0];
#pragma unroll
  for (int i = 1; i < 4 * U; ++i)
    if (i == k) w = raw[i / 4].w[i % 4];
  return w;
}

template <int DT, int U, typename F> RLK_DEVICE void visit_words(const u32x4 *raw, i64 j0, F &f) {
  constexpr int EPW = word_elems<DT>::value;
#pragma unroll 1
  for (int k = 0; k < 4 * U; ++k) {
    const u32 w = word_of<U>(raw, k);
    f(word_element<DT, 0>(w), j0 + (i64)k * EPW);
    if constexpr (EPW == 2) f(word_element<DT, 1>(w), j0 + (i64)k * EPW + 1);
  }
}

template <int DT, int SEG, int UNROLL, bool ROWS16, typename F>
RLK_DEVICE void visit_lane_compact(const u8 *r, i64 V, int lane, F &&f) {
  constexpr int B = logit_traits<DT>::bytes;
  constexpr int E = epv<DT>::value;
  const row_split<DT> sp(r, V);
  const i64 t0 = sp.head + sp.nvec * E;
  /* the scalar head and tail through one loop */
  const i64 ns = (sp.head > lane ? (sp.head - lane + SEG - 1) / SEG : 0);
  const i64 nt = (sp.tail > lane ? (sp.tail - lane + SEG - 1) / SEG : 0);
#pragma unroll 1
  for (i64 q = 0; q < ns + nt; ++q) {
    const i64 j = q < ns ? lane + q * SEG : t0 + lane + (q - ns) * SEG;
    f(load_logit<DT>(r, j), j);
  }
  const u8 *vb = r + sp.head * B;
  i64 v = lane;
#pragma unroll 1
  for (; v + (i64)(UNROLL - 1) * SEG < sp.nvec; v += (i64)UNROLL * SEG) {
    u32x4 raw[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) raw[u] = load_row_vec(vb + (v + (i64)u * SEG) * 16, ROWS16 || sp.aligned);
    /* the chunk's vectors are SEG apart: walk them one by one */
#pragma unroll 1
    for (int u = 0; u < UNROLL; ++u) {
      u32x4 one[1];
      one[0] = raw[0];
#pragma unroll
      for (int q = 1; q < UNROLL; ++q)
        if (q == u) one[0] = raw[q];
      visit_words<DT, 1>(one, sp.head + (v + (i64)u * SEG) * E, f);
    }
  }
#pragma unroll 1
  for (; v < sp.nvec; v += SEG) {
    u32x4 one[1];
    one[0] = load_row_vec(vb + v * 16, ROWS16 || sp.aligned);
    visit_words<DT, 1>(one, sp.head + v * E, f);
  }
}

/* Inclusive sum over a warp (u64, exact); with N below the warp size, exact in lanes below N. */
template <int N = RLK_WARP_SIZE> RLK_DEVICE u64 warp_inclusive_scan(u64 v) {
  const int lane = (int)(threadIdx.x % RLK_WARP_SIZE);
#pragma unroll
  for (int o = 1; o < N; o <<= 1) {
    const u64 n = shfl_up(v, o);
    if (lane >= o) v += n;
  }
  return v;
}

/* Exclusive sum over the block's NT threads; *total gets the sum. `warps` holds NT / warp values.
 * Every thread must call it (it synchronizes twice). */
template <int NT> RLK_DEVICE u64 block_exclusive_scan(u64 v, u64 *warps, u64 *total) {
  constexpr int NW = NT / RLK_WARP_SIZE;
  const u64 inc = warp_inclusive_scan(v);
  const int w = (int)(threadIdx.x / RLK_WARP_SIZE);
  if (threadIdx.x % RLK_WARP_SIZE == RLK_WARP_SIZE - 1) warps[w] = inc;
  __syncthreads();
  u64 before = 0, all = 0;
#pragma unroll
  for (int i = 0; i < NW; ++i) {
    const u64 x = warps[i];
    if (i < w) before += x;
    all += x;
  }
  __syncthreads();
  *total = all;
  return before + inc - v;
}

/* ceil(p Z) for p in (0, 1) given as q = floor(p 2^32), Z < 2^63. */
RLK_DEVICE u64 ceil_fraction(u64 q, u64 Z) {
  const u64 lo = q * Z, hi = __umul64hi(q, Z);
  return ((hi << 32) | (lo >> 32)) + ((lo & 0xffffffffull) != 0 ? 1u : 0u);
}

/* One row's settings. */
struct row_settings {
  float temperature;
  i64 top_k;
  float top_p, min_p;
  u64 seed, offset;
};

/* A row's settings and its Philox block (two 64-bit draws), written by one thread while the others
 * finish their first pass, read by all after the row's first barrier. */
struct row_shared {
  row_settings rs;
  u64 R1, R2;
};

/* A lane's first-pass state without the entropy term, as the lane draw reads it. */
struct lane_state {
  float m, s;
};

/* Prefetches a row's per-row settings into L2 (issued at the row's start, read after its pass). */
RLK_DEVICE void prefetch_l2(const void *p) {
#if defined(RLK_CUDA)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

/* A row's settings given as tensors, as one thread (the filler) fetches them at the row's start
 * and reads them after its pass. On sm_80 and later they are copied into shared memory by
 * cp.async, which runs during the pass, so no load is left for after it; elsewhere the filler
 * prefetches them into L2 and loads them after the pass. Only the filler touches them. */
struct row_inputs {
  u64 seed, offset;
  i64 top_k64;
  i32 top_k32;
  float top_p, min_p;
};

#if defined(RLK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define RLK_SMP_COPY_INPUTS 1
template <int N> RLK_DEVICE void copy_to_shared_async(void *dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(smem_u32(dst)), "l"(src), "n"(N) : "memory");
}
#endif

/* The filler, at the row's start: starts fetching the row's tensor settings. */
RLK_DEVICE void row_inputs_fetch(row_inputs *in, i64 row, const i32 *top_ks32, const i64 *top_ks64,
                                 const float *top_ps, const float *min_ps, const u64 *seeds,
                                 const u64 *offsets) {
#if defined(RLK_SMP_COPY_INPUTS)
  if (top_ks32) copy_to_shared_async<4>(&in->top_k32, top_ks32 + row);
  if (top_ks64) copy_to_shared_async<8>(&in->top_k64, top_ks64 + row);
  if (top_ps) copy_to_shared_async<4>(&in->top_p, top_ps + row);
  if (min_ps) copy_to_shared_async<4>(&in->min_p, min_ps + row);
  if (seeds) copy_to_shared_async<8>(&in->seed, seeds + row);
  if (offsets) copy_to_shared_async<8>(&in->offset, offsets + row);
  asm volatile("cp.async.commit_group;" ::: "memory");
#else
  (void)in;
  if (top_ks32) prefetch_l2(top_ks32 + row);
  if (top_ks64) prefetch_l2(top_ks64 + row);
  if (top_ps) prefetch_l2(top_ps + row);
  if (min_ps) prefetch_l2(min_ps + row);
  if (seeds) prefetch_l2(seeds + row);
  if (offsets) prefetch_l2(offsets + row);
#endif
}

/* The row's Philox block: two 64-bit draws. A scalar seed is shared by the batch, so the counter
 * tells its rows apart; a per-row seed makes the draws independent of the row's place in the
 * batch. */
RLK_DEVICE void row_draws(const row_settings &rs, bool row_seeds, i64 row, u64 *R1, u64 *R2) {
  u32x4_ctr ctr;
  ctr.v[0] = (u32)rs.offset;
  ctr.v[1] = (u32)(rs.offset >> 32);
  ctr.v[2] = row_seeds ? 0u : (u32)row;
  ctr.v[3] = row_seeds ? 0u : (u32)((u64)row >> 32);
  const u32x4_ctr d = philox4x32_10(ctr, (u32)rs.seed, (u32)(rs.seed >> 32));
  *R1 = (u64)d.v[0] | ((u64)d.v[1] << 32);
  *R2 = (u64)d.v[2] | ((u64)d.v[3] << 32);
}

/* The filler, after its pass: the row's settings (the temperature is known) and, when `draws`, its
 * Philox block, for every thread after the row's first barrier. */
RLK_DEVICE void row_shared_fill(row_shared *sh, const row_inputs *in, float temperature, i64 row,
                                const i32 *top_ks32, const i64 *top_ks64, i64 top_k, const float *top_ps,
                                float top_p, const float *min_ps, float min_p, const u64 *seeds, u64 seed,
                                const u64 *offsets, u64 offset, bool draws) {
  row_settings rs;
  rs.temperature = temperature;
#if defined(RLK_SMP_COPY_INPUTS)
  asm volatile("cp.async.wait_all;" ::: "memory");
  rs.top_k = top_ks32 ? (i64)in->top_k32 : (top_ks64 ? in->top_k64 : top_k);
  rs.top_p = top_ps ? in->top_p : top_p;
  rs.min_p = min_ps ? in->min_p : min_p;
  rs.seed = seeds ? in->seed : seed;
  rs.offset = offsets ? in->offset : offset;
#else
  (void)in;
  rs.top_k = top_ks32 ? (i64)top_ks32[row] : (top_ks64 ? top_ks64[row] : top_k);
  rs.top_p = top_ps ? top_ps[row] : top_p;
  rs.min_p = min_ps ? min_ps[row] : min_p;
  rs.seed = seeds ? seeds[row] : seed;
  rs.offset = offsets ? offsets[row] : offset;
#endif
  sh->rs = rs;
  if (draws) row_draws(rs, seeds != nullptr, row, &sh->R1, &sh->R2);
}

/* Shared memory of the filtered path (dynamic): the histogram and the candidates are used one
 * after the other. */
struct hist_space {
  u32 count[BINS];
  u64 mass[BINS];

  /* the first nbins bins zeroed, a bin a thread in turn (every thread of the block calls it) */
  template <int NT> RLK_DEVICE void clear(int nbins) {
    for (int q = (int)threadIdx.x; q < nbins; q += NT) {
      count[q] = 0;
      mass[q] = 0;
    }
  }
  /* mass[q] += m as two 32-bit shared atomics, the low half's carry added to the high half: exact,
   * and native, where a 64-bit atomicAdd on shared memory is a compare-and-swap loop that spins
   * on a crowded bin. Read only after the block's barrier. */
  RLK_DEVICE void add_mass(int q, u64 m) {
    u32 *half = reinterpret_cast<u32 *>(&mass[q]); /* little-endian: [0] low, [1] high */
    const u32 lo = (u32)m;
    const u32 old = atomicAdd(&half[0], lo);
    const u32 hi = (u32)(m >> 32) + (old + lo < old ? 1u : 0u);
    if (hi != 0) atomicAdd(&half[1], hi);
  }
};
template <int CAP> struct cand_space {
  float x[CAP];
  i32 idx[CAP];
  u64 cum[CAP]; /* inclusive prefix of the candidates' masses, in sorted order */
};
template <int CAP> struct filter_smem {
  static constexpr u32 bytes =
      sizeof(hist_space) > sizeof(cand_space<CAP>) ? (u32)sizeof(hist_space) : (u32)sizeof(cand_space<CAP>);
};

/* "a comes before b": larger logit first, then lower index. */
RLK_DEVICE bool before(float xa, i32 ia, float xb, i32 ib) {
  return xa > xb || (xa == xb && ia < ib);
}


/* The lowest lane of the warp for which `cond` holds (the warp size when none does): one vote,
 * where a butterfly of minima took five dependent shuffles. Every lane of the warp calls it. */
RLK_DEVICE int warp_first(bool cond) {
#if defined(RLK_HIP)
  const unsigned long long m = __ballot(cond);
  return m ? (int)__ffsll(m) - 1 : RLK_WARP_SIZE;
#else
  const unsigned m = __ballot_sync(0xffffffffu, cond);
  return m ? __ffs((int)m) - 1 : RLK_WARP_SIZE;
#endif
}

/* floor(r z / 2^32): a 32-bit uniform draw scaled to [0, z) (z < 2^63). */
RLK_DEVICE u64 scale32(u32 r, u64 z) {
  return (u64)r * (z >> 32) + (((u64)r * (z & 0xffffffffull)) >> 32);
}

/* Vectors of a share that a lane of share_pick loads at once and keeps in registers. */
constexpr int PICK_VECTORS = 4;

/* One warp's draw of an element of lane t's share (of the row layout SEG) by mass, in two steps
 * so that the loads can be in flight while the warp does something else: load() issues them
 * (lane l takes the share's vectors l, l + warp, ..., the first PICK_VECTORS of them), finish()
 * sums the kept masses in that order (lane 0 first takes the scalar head and tail elements) and
 * finds the element whose range holds u. Every lane of the warp calls both. */
template <int DT, int SEG, bool ROWS16> struct share_pick {
  static constexpr int W = RLK_WARP_SIZE;
  const u8 *r;
  i64 V, nv;
  int t;
  u32x4 v[PICK_VECTORS];

  RLK_DEVICE void load(const u8 *row, i64 V_, int t_) {
    r = row;
    V = V_;
    t = t_;
    const row_split<DT> sp(r, V);
    nv = t < sp.nvec ? (sp.nvec - 1 - t) / SEG + 1 : 0;
    const int l = (int)(threadIdx.x % W);
#pragma unroll
    for (int k = 0; k < PICK_VECTORS; ++k)
      if (l + (i64)k * W < nv) v[k] = load_row_vec(vec_at(sp, l + (i64)k * W), ROWS16 || sp.aligned);
  }

  /* share vector i is row vector t + i SEG, its first element sp.head + (t + i SEG) E */
  RLK_DEVICE const u8 *vec_at(const row_split<DT> &sp, i64 i) const {
    return r + sp.head * logit_traits<DT>::bytes + (t + i * SEG) * 16;
  }
  RLK_DEVICE i64 elem0(const row_split<DT> &sp, i64 i) const {
    return sp.head + (t + i * SEG) * epv<DT>::value;
  }

  /* Calls f on this lane's elements of the share, in the order of the sums. */
  template <typename F> RLK_DEVICE void visit(F &f, bool reload_only_until_done) {
    const row_split<DT> sp(r, V);
    const int l = (int)(threadIdx.x % W);
    if (l == 0) {
      const i64 t0 = sp.head + sp.nvec * epv<DT>::value;
      for (i64 j = t; j < sp.head; j += SEG) f(load_logit<DT>(r, j), j);
      for (i64 j = t; j < sp.tail; j += SEG) f(load_logit<DT>(r, t0 + j), t0 + j);
    }
#pragma unroll
    for (int k = 0; k < PICK_VECTORS; ++k)
      if (l + (i64)k * W < nv) visit_words<DT, 1>(&v[k], elem0(sp, l + (i64)k * W), f);
#pragma unroll 1
    for (i64 i = l + (i64)PICK_VECTORS * W; i < nv && !(reload_only_until_done && f.done()); i += W) {
      u32x4 one[1];
      one[0] = load_row_vec(vec_at(sp, i), ROWS16 || sp.aligned);
      visit_words<DT, 1>(one, elem0(sp, i), f);
    }
  }

  /* The kept mass of one vector of the share, its elements in visit_words' order. */
  template <typename K>
  RLK_DEVICE static u64 vector_mass(const u32x4 &v, K &keep, float c, float mx) {
    u64 s = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float a = word_element<DT, 0>(v.w[k]);
      s += keep(a) ? mass_of(a, c, mx) : 0ull;
      if constexpr (word_elems<DT>::value == 2) {
        const float b = word_element<DT, 1>(v.w[k]);
        s += keep(b) ? mass_of(b, c, mx) : 0ull;
      }
    }
    return s;
  }

  /* The element at which the running kept mass passes u: u = umulhi(draw, the share's kept mass)
   * when `scale_draw`, else `draw` itself (then below that mass). Returns it in every lane and its
   * logit in *x. A share whose kept masses all round to 0 (drawn with probability below 2^-30)
   * gives its first kept element, and *x is NaN (not read).
   *
   * The masses are exact integers, so the running sum at an element is the same however it is
   * added up: each lane sums its scalars, each of its vectors and the rest; a scan over the lanes
   * finds the lane, its vector sums the vector, and the warp takes that vector's elements a lane
   * each for the element. Only a draw that lands on a scalar or past the vectors kept in
   * registers walks elements one at a time. */
  template <typename K>
  RLK_DEVICE u32 finish(float c, float mx, K keep, u64 draw, bool scale_draw, float *x) {
    constexpr int E = epv<DT>::value;
    constexpr int EPW = word_elems<DT>::value;
    const row_split<DT> sp(r, V);
    const int l = (int)(threadIdx.x % W);
    const i64 t0 = sp.head + sp.nvec * E;
    u64 scal = 0; /* lane 0: the share's scalar head and tail elements */
    if (l == 0) {
      for (i64 j = t; j < sp.head; j += SEG) {
        const float a = load_logit<DT>(r, j);
        scal += keep(a) ? mass_of(a, c, mx) : 0ull;
      }
      for (i64 j = t; j < sp.tail; j += SEG) {
        const float a = load_logit<DT>(r, t0 + j);
        scal += keep(a) ? mass_of(a, c, mx) : 0ull;
      }
    }
    u64 vs[PICK_VECTORS];
    u64 part = scal;
#pragma unroll
    for (int k = 0; k < PICK_VECTORS; ++k) {
      vs[k] = l + (i64)k * W < nv ? vector_mass(v[k], keep, c, mx) : 0ull;
      part += vs[k];
    }
#pragma unroll 1
    for (i64 i = l + (i64)PICK_VECTORS * W; i < nv; i += W)
      part += vector_mass(load_row_vec(vec_at(sp, i), ROWS16 || sp.aligned), keep, c, mx);
    const u64 inc = warp_inclusive_scan(part);
    const u64 total = shfl_from(inc, W - 1);
    *x = limits<float>::quiet_nan();
    if (total == 0) {
      struct firster {
        K &keep;
        u32 first;
        RLK_DEVICE bool done() const { return first != 0xffffffffu; }
        RLK_DEVICE void operator()(float xe, i64 j) {
          if (first == 0xffffffffu && keep(xe)) first = (u32)j;
        }
      } fs{keep, 0xffffffffu};
      visit(fs, true);
      u32 f = fs.first;
#pragma unroll
      for (int o = W / 2; o > 0; o >>= 1) {
        const u32 g = shfl_xor(f, o);
        f = g < f ? g : f;
      }
      return f;
    }
    const u64 u = scale_draw ? __umul64hi(draw, total) : draw;
    /* the lane whose range holds u, and the part of it: -1 its scalars, k < PICK_VECTORS its
     * vector k, PICK_VECTORS the vectors it reloads; base: the mass before that part */
    u64 base = inc - part;
    const bool owner = part != 0 && base <= u && u < inc;
    int unit = PICK_VECTORS;
    if (owner) {
      if (u < base + scal) {
        unit = -1;
      } else {
        base += scal;
#pragma unroll
        for (int k = 0; k < PICK_VECTORS; ++k)
          if (unit == PICK_VECTORS) {
            if (u < base + vs[k])
              unit = k;
            else
              base += vs[k];
          }
      }
    }
    const int o = warp_first(owner);
    unit = shfl_from(unit, o);
    base = shfl_from(base, o);
    if (unit >= 0 && unit < PICK_VECTORS) {
      /* lane j < E takes element j of lane o's vector `unit` */
      u32x4 vu = v[0];
#pragma unroll
      for (int k = 1; k < PICK_VECTORS; ++k)
        if (k == unit) vu = v[k];
      u32 wj = 0;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const u32 wq = shfl_from(vu.w[q], o);
        if (q == l / EPW) wj = wq;
      }
      const float xj = (EPW == 2 && (l & 1)) ? word_element<DT, 1>(wj) : word_element<DT, 0>(wj);
      const u64 mj = l < E && keep(xj) ? mass_of(xj, c, mx) : 0ull;
      const int j = warp_first(base + warp_inclusive_scan(mj) > u);
      *x = shfl_from(xj, j);
      return (u32)(elem0(sp, o + (i64)unit * W) + j);
    }
    /* a scalar or a reloaded vector: lane o walks that part from base */
    struct walker {
      K &keep;
      float c, mx;
      u64 run, u;
      u32 pick;
      float px;
      RLK_DEVICE bool done() const { return pick != 0xffffffffu; }
      RLK_DEVICE void operator()(float xe, i64 j) {
        if (pick == 0xffffffffu && keep(xe)) {
          run += mass_of(xe, c, mx);
          if (run > u) {
            pick = (u32)j;
            px = xe;
          }
        }
      }
    } walk{keep, c, mx, base, u, 0xffffffffu, 0.0f};
    if (l == o) {
      if (unit < 0) {
        for (i64 j = t; j < sp.head; j += SEG) walk(load_logit<DT>(r, j), j);
        for (i64 j = t; j < sp.tail; j += SEG) walk(load_logit<DT>(r, t0 + j), t0 + j);
      } else {
        for (i64 i = l + (i64)PICK_VECTORS * W; i < nv && !walk.done(); i += W) {
          u32x4 one[1];
          one[0] = load_row_vec(vec_at(sp, i), ROWS16 || sp.aligned);
          visit_words<DT, 1>(one, elem0(sp, i), walk);
        }
      }
    }
    *x = shfl_from(walk.px, o);
    return shfl_from(walk.pick, o);
  }
};

/* Whether a row's settings are out of range: its token is then -1 (SMP_STATUS_BAD_PARAM). A
 * temperature is 0 (greedy) or in [2^-60, FLT_MAX], as the host checks a scalar one. */
RLK_DEVICE bool settings_bad(const row_settings &rs) {
  return !(rs.temperature == 0.0f || (rs.temperature >= 0x1p-60f && rs.temperature <= limits<float>::max())) ||
         rs.top_k < 0 ||
         !(rs.top_p > 0.0f && rs.top_p <= 1.0f) || !(rs.min_p >= 0.0f && rs.min_p <= 1.0f);
}

/* The outputs of a row that has no token: a bad setting, else s (the row's merged sum) NaN for a
 * NaN or +inf logit, 0 for no finite logit (the threshold NaN: no kept set). One thread calls it. */
template <typename TOK>
RLK_DEVICE void write_no_token(i64 row, bool bad, float s, TOK *tokens, float *logp, float *logp_filtered,
                               float *threshold, i32 *status) {
  const bool nan = s != 0.0f;
  tokens[row] = (TOK)-1;
  const float o = bad || nan ? limits<float>::quiet_nan() : -limits<float>::infinity();
  if (logp) logp[row] = o;
  if (logp_filtered) logp_filtered[row] = o;
  if (threshold) threshold[row] = limits<float>::quiet_nan();
  if (status) atomicOr((int *)status, bad ? (int)SMP_STATUS_BAD_PARAM : (nan ? (int)SMP_STATUS_NAN : (int)SMP_STATUS_NO_TOKEN));
}

/* An unfiltered draw, in three steps of one warp each (see the top of this file). The weights are
 * the first pass's states, a state's sum relative to a maximum above it, so a share's weight is
 * its mass up to fp32 rounding; the element's draw is exact.
 *
 * Step 1, in every warp: its lane by the lanes' weights (own: this lane's state, wst: the warp's,
 * low half of R1); `drawn` starts loading that lane's share of the row (row lane warp W + lane). */
template <int DT, int SEG, bool ROWS16>
RLK_DEVICE void draw_lane(share_pick<DT, SEG, ROWS16> &drawn, const state &own, const state &wst, float c, u64 R1,
                          const u8 *r, i64 V, int warp) {
  const u64 w = own.s == 0.0f ? 0ull : (u64)(own.s * exp2_approx((own.m - wst.m) * c) * RLK_SMP_MASS_SCALE);
  const u64 inc = warp_inclusive_scan(w);
  const u64 u = scale32((u32)R1, shfl_from(inc, RLK_WARP_SIZE - 1));
  const int tl = warp_first(w != 0 && inc - w <= u && u < inc);
  drawn.load(r, V, warp * RLK_WARP_SIZE + (tl < RLK_WARP_SIZE ? tl : 0));
}

/* Step 2: the warp drawn by the warps' weights (lane l < NW holds warp l's state ws, the others
 * an empty state; M the row's maximum, high half of R1); every warp that calls it gets the same. */
template <int NW> RLK_DEVICE int draw_warp(const state &ws, float M, float c, u64 R1) {
  const int lane = (int)(threadIdx.x % RLK_WARP_SIZE);
  const u64 w = ws.s != 0.0f ? (u64)(ws.s * exp2_approx((ws.m - M) * c) * RLK_SMP_MASS_SCALE) : 0ull;
  const u64 inc = warp_inclusive_scan<NW>(w); /* the lanes past NW weigh nothing */
  const u64 u = scale32((u32)(R1 >> 32), shfl_from(inc, NW - 1));
  return warp_first(lane < NW && w != 0 && inc - w <= u && u < inc);
}

/* Step 3, in the drawn warp: the element of its drawn share by exact mass (R2), and the row's
 * outputs, logp from the row's merged state rst (every token kept: the threshold -inf). */
template <int DT, int SEG, bool ROWS16, typename TOK>
RLK_DEVICE void finish_unfiltered(share_pick<DT, SEG, ROWS16> &drawn, const state &rst, float c, float T, u64 R2,
                                  const u8 *r, i64 row, TOK *tokens, float *logp, float *logp_filtered,
                                  float *threshold) {
  float xy;
  const u32 y = drawn.finish(c, rst.m, [](float) { return true; }, R2, true, &xy);
  if (threadIdx.x % RLK_WARP_SIZE == 0) {
    if (xy != xy) xy = load_logit<DT>(r, (i64)y);
    const float lp = row_logp(rst, xy, logf(rst.s), T);
    tokens[row] = (TOK)y;
    if (logp) logp[row] = lp;
    if (logp_filtered) logp_filtered[row] = lp;
    if (threshold) threshold[row] = -limits<float>::infinity();
  }
}

/* The boundary bin of a histogram pass: with bins in key order and A_b the sum of the bins above
 * b, the bin b where A_b < target <= A_b + v_b (it exists when 0 < target <= the sum). Writes b to
 * found[0] and A_b to found_u64[0]; returns the sum of all bins. Every thread must call it. */
template <int NT, typename BIN>
RLK_DEVICE u64 boundary_bin(const BIN *bins, int nbins, u64 target, u64 *warp_sums, u32 *found,
                            u64 *found_u64) {
  const int tid = (int)threadIdx.x;
  if (tid == 0) {
    found[0] = 0;
    found_u64[0] = 0;
  }
  const int per = (nbins + NT - 1) / NT;
  /* thread t holds bins [hi - per, hi), hi = nbins - t per: chunks taken from the top down */
  const int hi = nbins - tid * per, lo = hi - per > 0 ? hi - per : 0;
  u64 mine = 0;
  for (int b = hi - 1; b >= lo; --b) mine += (u64)bins[b];
  u64 total;
  u64 above = block_exclusive_scan<NT>(mine, warp_sums, &total);
  for (int b = hi - 1; b >= lo; --b) {
    const u64 v = (u64)bins[b];
    if (above < target && target <= above + v) {
      found[0] = (u32)b;
      found_u64[0] = above;
    }
    above += v;
  }
  __syncthreads();
  return total;
}

/* v[0, NT) sorted in place, largest first, by a bitonic network (NT a power of two, one element
 * a thread). Every thread of the block calls it. */
template <int NT> RLK_DEVICE void sort_descending(float *v) {
  const int tid = (int)threadIdx.x;
  for (int size = 2; size <= NT; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const int o = tid ^ stride;
      if (o > tid) {
        const float a = v[tid], b2 = v[o];
        if ((tid & size) == 0 ? a < b2 : a > b2) {
          v[tid] = b2;
          v[o] = a;
        }
      }
      __syncthreads();
    }
}

/* A row's outputs for token y, drawn from the row's merged state rst (logp) and, filtered, from the
 * kept set of mass kept_mass and smallest logit thr (logp_filtered, threshold); x: y's logit where
 * the draw saw it (known), else it is loaded again (bitwise the same: the conversions are exact).
 * One thread calls it. */
template <int DT, typename TOK>
RLK_DEVICE void write_token(const u8 *r, i64 row, u32 y, const int &known, const float &x, const state &rst, float T,
                            bool greedy, u64 kept_mass, float thr, TOK *tokens, float *logp, float *logp_filtered,
                            float *threshold) {
  const float xy = known ? x : load_logit<DT>(r, (i64)y);
  const float M = rst.m;
  const float lp = row_logp(rst, xy, logf(rst.s), T);
  tokens[row] = (TOK)y;
  if (logp) logp[row] = lp;
  if (logp_filtered)
    logp_filtered[row] = greedy ? 0.0f : (xy - M) / T - (float)(log((double)kept_mass) - 40.0 * RLK_SMP_LN2_D);
  /* greedy keeps the maximum's ties */
  if (threshold) threshold[row] = greedy ? M : thr;
}

/* The elements a histogram pass counted above bin b (of nbins, in key order) where the boundary
 * was found by mass (by count, boundary_bin's sum above b is that number). Every thread of the
 * block calls it. */
template <int NT> RLK_DEVICE u64 count_above(bool by_mass, u32 b, int nbins, const u32 *count, u64 *warp_sums) {
  u64 mine = 0;
  if (by_mass)
    for (int q = (int)threadIdx.x; q < nbins; q += NT)
      if ((u32)q > b) mine += count[q];
  u64 above;
  block_exclusive_scan<NT>(mine, warp_sums, &above);
  return above;
}

/* The KEPT pass's draw of a lane's share by the lanes' kept masses (acc; kmin the lane's smallest
 * kept logit, whose key goes to kept_key): `pick` gets the lane, found_u64[1] what is left of the
 * draw (R1) inside its share; returns the kept mass. Every thread of the block calls it. */
template <int NT>
RLK_DEVICE u64 draw_share(u64 acc, float kmin, u64 R1, u64 *warp_sums, u32 &kept_key, u32 &pick, u64 *found_u64) {
  const int tid = (int)threadIdx.x;
  if (kmin != limits<float>::infinity()) atomicMin(&kept_key, key_of<RLK_DT_F32>(kmin));
  u64 total;
  const u64 below = block_exclusive_scan<NT>(acc, warp_sums, &total);
  const u64 u = __umul64hi(R1, total);
  if (acc != 0 && below <= u && u - below < acc) {
    pick = (u32)tid;
    found_u64[1] = u - below;
  }
  __syncthreads();
  return total;
}

/* Candidates [0, n) sorted in place, larger logit first, then lower index (a bitonic network over
 * the next power of two, padded with -inf). Every thread of the block calls it. */
template <int NT, int CAP> RLK_DEVICE void sort_candidates(cand_space<CAP> &cand, u32 n) {
  const int tid = (int)threadIdx.x;
  u32 np = 1;
  while (np < n) np <<= 1;
  for (u32 i = n + tid; i < np; i += NT) {
    cand.x[i] = -limits<float>::infinity();
    cand.idx[i] = 0x7fffffff;
  }
  __syncthreads();
  for (u32 size = 2; size <= np; size <<= 1)
    for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
      for (u32 i = tid; i < np / 2; i += NT) {
        const u32 a = 2 * stride * (i / stride) + (i % stride), b = a + stride;
        const float xa = cand.x[a], xb = cand.x[b];
        const i32 ia = cand.idx[a], ib = cand.idx[b];
        const bool up = (a & size) == 0;
        if (up ? before(xb, ib, xa, ia) : before(xa, ia, xb, ib)) {
          cand.x[a] = xb;
          cand.idx[a] = ib;
          cand.x[b] = xa;
          cand.idx[b] = ia;
        }
      }
      __syncthreads();
    }
}

/* The inclusive prefix of the sorted candidates' masses over [0, n) into cand.cum, a contiguous
 * chunk [*c0, *c1) a thread; returns their total. Every thread of the block calls it. */
template <int NT, int CAP>
RLK_DEVICE u64 prefix_masses(cand_space<CAP> &cand, u32 n, u64 *warp_sums, float c, float mx, u32 *c0, u32 *c1) {
  const u32 per = (n + NT - 1) / NT;
  const u32 lo = (u32)threadIdx.x * per < n ? (u32)threadIdx.x * per : n;
  const u32 hi = lo + per < n ? lo + per : n;
  u64 run = 0;
  for (u32 i = lo; i < hi; ++i) {
    run += mass_of(cand.x[i], c, mx);
    cand.cum[i] = run;
  }
  u64 total;
  const u64 off = block_exclusive_scan<NT>(run, warp_sums, &total);
  for (u32 i = lo; i < hi; ++i) cand.cum[i] += off;
  __syncthreads();
  *c0 = lo;
  *c1 = hi;
  return total;
}

/* Top-p's threshold inside the boundary's mass bin, whose n logits were gathered: sorted, the
 * first whose inclusive mass reaches target (what the bins above left to find), its key. Its ties
 * are kept with it, as a radix select's last digit would. found[1]: scratch (n may be read from
 * found[0]). Every thread of the block calls it. */
template <int DT, int NT, int CAP>
RLK_DEVICE u32 bin_threshold(cand_space<CAP> &cand, u32 n, u32 *found, u64 *warp_sums, u64 target, float c,
                             float mx) {
  if (threadIdx.x == 0) found[1] = n - 1;
  sort_candidates<NT>(cand, n);
  u32 c0, c1;
  prefix_masses<NT>(cand, n, warp_sums, c, mx, &c0, &c1);
  for (u32 i = c0; i < c1; ++i)
    if (cand.cum[i] >= target && (i == 0 || cand.cum[i - 1] < target)) found[1] = i;
  __syncthreads();
  const u32 key = key_of<DT>(cand.x[found[1]]);
  __syncthreads();
  return key;
}

/* The gathered candidates (found[1] of them, a superset of the kept set) in shared memory: sorted
 * (larger logit first, then lower index), cut by top-k (cut_k) and min-p (cut_m: keep_m) where no
 * pass applied them, then by top-p (pq; z0 the kept mass where a pass measured it), and the draw
 * by exact mass (R1) into pick, pick_x and pick_known. Returns the kept mass; thr gets the kept
 * set's smallest logit. Every thread of the block calls it. */
template <int NT, int CAP, typename KEEP>
RLK_DEVICE u64 draw_candidates(cand_space<CAP> &cand, u32 *found, u64 *warp_sums, i64 top_k, bool cut_k,
                               bool cut_m, const KEEP &keep_m, bool use_p, u64 pq, u64 z0, float c, float mx,
                               u64 R1, u32 &pick, float &pick_x, int &pick_known, float *thr) {
  const int tid = (int)threadIdx.x;
  const u32 n = found[1];
  sort_candidates<NT>(cand, n);
  /* the first index past what top-k and min-p keep */
  if (tid == 0) found[0] = n;
  __syncthreads();
  const float tau_k = cut_k ? cand.x[top_k - 1] : 0.0f;
  for (u32 i = tid; i < n; i += NT) {
    const float x = cand.x[i];
    if ((cut_k && x < tau_k) || (cut_m && !keep_m(x))) atomicMin(&found[0], i);
  }
  __syncthreads();
  u32 nk = found[0];
  u32 c0, c1;
  const u64 total = prefix_masses<NT>(cand, nk, warp_sums, c, mx, &c0, &c1);
  if (use_p) {
    /* top-p: the first index whose inclusive mass reaches the target; its ties stay */
    const u64 tgt = ceil_fraction(pq, z0 ? z0 : total);
    if (tid == 0) found[1] = nk;
    __syncthreads();
    for (u32 i = c0; i < c1; ++i)
      if (cand.cum[i] >= tgt && (i == 0 || cand.cum[i - 1] < tgt)) found[1] = i;
    __syncthreads();
    const u32 istar = found[1];
    if (istar < nk) {
      const float xs = cand.x[istar];
      for (u32 i = c0; i < c1; ++i)
        if (i > istar && cand.x[i] < xs) atomicMin(&found[0], i);
    }
    __syncthreads();
    nk = found[0];
  }
  const u64 kept_mass = cand.cum[nk - 1];
  *thr = cand.x[nk - 1]; /* sorted: the kept prefix's last, with every tie of it */
  const u64 u = __umul64hi(R1, kept_mass);
  for (u32 i = c0; i < c1 && i < nk; ++i)
    if (cand.cum[i] > u && (i == 0 || cand.cum[i - 1] <= u)) {
      pick = (u32)cand.idx[i];
      pick_x = cand.x[i];
      pick_known = 1;
    }
  __syncthreads();
  return kept_mass;
}

} /* namespace smp */

/* The one argument of both sampling kernels (common/sample_params.h, filled by
 * src/ops/sample.c), and its fields as the kernels' typed locals (TOK: the token type). */
#define RLK_SMP_KERNEL_PARAMS RLK_PARAMS_ARG ::rlk::smp::Params p_
#define RLK_SMP_UNPACK                                                   \
  const void *__restrict__ logits = p_.logits;                           \
  const i64 row_stride = p_.row_stride, B = p_.B, V = p_.V;              \
  const float *__restrict__ temperatures = p_.temperatures;              \
  const float temperature = p_.temperature;                              \
  const i32 *__restrict__ top_ks32 = p_.top_ks32;                        \
  const i64 *__restrict__ top_ks64 = p_.top_ks64;                        \
  const i64 top_k = p_.top_k;                                            \
  const float *__restrict__ top_ps = p_.top_ps;                          \
  const float top_p = p_.top_p;                                          \
  const float *__restrict__ min_ps = p_.min_ps;                          \
  const float min_p = p_.min_p;                                          \
  const u64 *__restrict__ seeds = p_.seeds;                              \
  const u64 seed = p_.seed;                                              \
  const u64 *__restrict__ offsets = p_.offsets;                          \
  const u64 offset = p_.offset;                                          \
  TOK *__restrict__ tokens = (TOK *)p_.tokens;                           \
  float *__restrict__ logp = p_.logp;                                    \
  float *__restrict__ logp_filtered = p_.logp_filtered;                  \
  float *__restrict__ threshold = p_.threshold;                          \
  i32 *__restrict__ status = p_.status;

/* One block per row. SEG x UNROLL is the row layout of the logprob_fwd kernel the log-probs must
 * match (SEG threads per row: a block, or a segment of a warp for short rows); the block has
 * max(SEG, warp) threads. FILTER: top-k, top-p and min-p may be set (else only temperature and
 * greedy rows). CAP: candidates that fit in shared memory. ROWS16: every row starts on the 16-byte
 * grid (the host checked the base and the stride), so no pass carries the narrower loads of a row
 * that does not (row_split); the same element order, the same bits either way. */
template <int DT, typename TOK, int SEG, int UNROLL, bool FILTER, int CAP, bool ROWS16>
__global__ void __launch_bounds__(SEG >= RLK_WARP_SIZE ? SEG : RLK_WARP_SIZE,
                                  SEG >= 256 ? 1024 / SEG : 1)
    sample(RLK_SMP_KERNEL_PARAMS) {
  using namespace smp;
  RLK_SMP_UNPACK
  static_assert(SEG >= 1 && SEG <= RLK_MAX_BLOCK && (SEG & (SEG - 1)) == 0, "SEG");
  static_assert(CAP >= RLK_WARP_SIZE && (CAP & (CAP - 1)) == 0, "CAP: a power of two");
  constexpr int NT = SEG >= RLK_WARP_SIZE ? SEG : RLK_WARP_SIZE;
  constexpr int NW = NT / RLK_WARP_SIZE;
  constexpr int BYTES = logit_traits<DT>::bytes;
  constexpr int KW = key_width<DT>::value;
  /* Whether the filler computes the row's Philox block before the first barrier. Without filters
   * and with more than a warp a row, only an unfiltered draw needs it, and warp 0 computes it
   * there, off the path to the barrier (the filler's warp may be the last to get there). */
  constexpr bool FILLER_DRAWS = FILTER || SEG <= RLK_WARP_SIZE;

  /* What the warp that finishes an unfiltered row reads after the others have gone on: the warps'
   * states, the lanes' (m, s), the row's settings and draws (from the block's last thread). Two
   * of each, by the parity of the block's row: the others write the next row's before they can
   * pass its first barrier, which the finishing warp must reach too. */
  constexpr int NL = SEG > RLK_WARP_SIZE ? NT : 1;
  __shared__ state warp_st[2][NW];
  __shared__ lane_state lane_st[2][NL];
  __shared__ row_shared row_sh[2];
  __shared__ row_inputs inputs; /* the filler's alone */
  __shared__ float lane_m[FILTER ? NT : 1]; /* the lanes' maxima (the top-k bound) */
  __shared__ u64 warp_sums[NW];
  __shared__ u32 pick;        /* a lane, then the chosen token */
  __shared__ float pick_x;    /* the chosen token's logit, when pick_known */
  __shared__ int pick_known;
  __shared__ u32 found[2];    /* results of block searches */
  __shared__ u32 kept_key;    /* KEPT: the smallest kept logit's key (key_of<RLK_DT_F32>) */
  __shared__ u32 bin_miss;    /* MASS: a logit of the mass bin outside the prefix its interval gave */
  __shared__ u64 found_u64[2];
  extern __shared__ __align__(16) u8 dyn[];
  hist_space &hist = *reinterpret_cast<hist_space *>(dyn);
  cand_space<CAP> &cand = *reinterpret_cast<cand_space<CAP> *>(dyn);

  const int tid = (int)threadIdx.x;
  const int wid = tid / RLK_WARP_SIZE;

  const int lane = tid % RLK_WARP_SIZE;
  /* the block's last lane has the fewest vectors of a row (leftovers go to the first lanes), so it
   * fetches the row's settings (row_inputs_fetch) and, where FILLER_DRAWS, draws its randoms */
  const bool filler = tid == NT - 1;
  /* an overlapping launch (RLK_LAUNCH_OVERLAP) touches no global memory before the stream's
   * previous kernel is done; the next one's blocks may then take whatever room this grid leaves */
  grid_dependency_wait();
  grid_dependents_launch();

  for (i64 row = blockIdx.x, it = 0; row < B; row += gridDim.x, ++it) {
    state *scratch = warp_st[it & 1];
    row_shared &sh = row_sh[it & 1];
    /* the first pass needs only the temperature; a setting out of range is reported after it */
    const float t_row = temperatures ? temperatures[row] : temperature;
    const bool greedy = t_row == 0.0f;
    const float T = greedy ? 1.0f : t_row;
    const float c = RLK_LP_LOG2E / T;
    const u8 *r = (const u8 *)logits + row * row_stride * BYTES;
    if (filler) row_inputs_fetch(&inputs, row, top_ks32, top_ks64, top_ps, min_ps, seeds, offsets);
    if (tid == 0) {
      pick = 0xffffffffu;
      pick_known = 0;
    }

    /* ---- pass 1: logprob_fwd's lane states, merged in its tree ---- */
    const state own = tid < SEG ? thread_row_state<DT, SEG, UNROLL, false, false, ROWS16>(r, V, c, tid) : empty_state();
    if constexpr (FILTER) lane_m[tid] = own.m;
    if constexpr (SEG > RLK_WARP_SIZE) lane_st[it & 1][tid] = lane_state{own.m, own.s};
    /* the warp's butterfly: logprob_fwd's first level */
    const state wst = segment_merge<(SEG < RLK_WARP_SIZE ? SEG : RLK_WARP_SIZE), false>(own, c);
    if (SEG > RLK_WARP_SIZE && lane == 0) scratch[wid] = wst;
    if (filler)
      row_shared_fill(&sh, &inputs, t_row, row, top_ks32, top_ks64, top_k, top_ps, top_p, min_ps, min_p, seeds,
                      seed, offsets, offset, FILLER_DRAWS);
    __syncthreads(); /* barrier 1 */
    const row_settings rs = sh.rs;
    u64 R1 = FILLER_DRAWS ? sh.R1 : 0ull, R2 = FILLER_DRAWS ? sh.R2 : 0ull;
    const bool bad = settings_bad(rs);
    const bool unfiltered = !FILTER || greedy ||
                            (!(rs.top_k > 0 && rs.top_k < V) && !(rs.top_p < 1.0f) && !(rs.min_p > 0.0f));
    const bool plain = !greedy && unfiltered && !bad;
    share_pick<DT, SEG, ROWS16> drawn; /* the drawn lane's share */
    state rst, ws = empty_state(); /* lane l < NW: warp l's state */
    if constexpr (SEG > RLK_WARP_SIZE) {
      if (plain) {
        /* No filter: warp 0 alone merges, draws the warp, its lane (from the states the lanes
         * left in shared memory: the very values that warp computed) and the element. The
         * others go on at once; a tail in every warp would cost 16 times the issue slots. */
        if (wid != 0) continue;
        if (lane < NW) ws = scratch[lane];
        /* without filters the filler left the draws to this warp: they run beside the merge */
        if constexpr (!FILLER_DRAWS) row_draws(rs, seeds != nullptr, row, &R1, &R2);
        rst = segment_merge<RLK_WARP_SIZE, false>(ws, c);
        if (!(rst.s > 0.0f)) {
          if (lane == 0) write_no_token(row, false, rst.s, tokens, logp, logp_filtered, threshold, status);
          continue;
        }
        int w = draw_warp<NW>(ws, rst.m, c, R1);
        w = w < NW ? w : 0;
        const lane_state l = lane_st[it & 1][w * RLK_WARP_SIZE + lane];
        state lo = empty_state();
        lo.m = l.m;
        lo.s = l.s;
        draw_lane(drawn, lo, scratch[w], c, R1, r, V, w);
        finish_unfiltered(drawn, rst, c, T, R2, r, row, tokens, logp, logp_filtered, threshold);
        continue;
      }
    }
    /* A row of one warp: the lane is drawn, and its share loading, while the state is merged. */
    if (SEG <= RLK_WARP_SIZE && plain) draw_lane(drawn, own, wst, c, R1, r, V, wid);
    if constexpr (SEG > RLK_WARP_SIZE) {
      /* logprob_fwd's second level in every warp: bitwise the state its warp 0 computes */
      if (lane < NW) ws = scratch[lane];
      rst = segment_merge<RLK_WARP_SIZE, false>(ws, c);
    } else {
      rst.m = shfl_from(wst.m, 0);
      rst.s = shfl_from(wst.s, 0);
      rst.q = 0.0f;
    }
    const float M = rst.m;
    /* every path below synchronizes again before the filler writes the next row's settings */
    if (bad || !(rst.s > 0.0f)) {
      if (tid == 0) write_no_token(row, bad, rst.s, tokens, logp, logp_filtered, threshold, status);
      __syncthreads();
      continue; /* block-uniform */
    }

    if (plain) { /* a row of one warp */
      finish_unfiltered(drawn, rst, c, T, R2, r, row, tokens, logp, logp_filtered, threshold);
      continue;
    }

    const bool use_k = FILTER && !greedy && rs.top_k > 0 && rs.top_k < V;
    const bool use_p = FILTER && !greedy && rs.top_p < 1.0f;
    const bool use_m = FILTER && !greedy && rs.min_p > 0.0f;
    /* min-p keeps p(x) >= min_p p(max), i.e. (x - M) c >= log2(min_p) */
    const float l2min = use_m ? log2f(rs.min_p) : 0.0f;
    auto keep_m = [&](float x) { return !use_m || (x - M) * c >= l2min; };
    u64 kept_mass = 0;                                 /* else the kept set's mass */

    /* Every pass after the first is this one loop over the lanes' shares, its job chosen at run
     * time (one instantiation of the element loop keeps the kernel small), driven by a state
     * machine: GREEDY, or GATHER / COUNT / MASS / KEPT for the filters. */
    enum { GREEDY, GATHER, COUNT, MASS, KEPT, DONE };
    int step = DONE;
    float theta = -limits<float>::infinity(); /* the top-k bound of the lane maxima */
    u32 edge = 0; /* GATHER: key >= edge, and with s0 the kept set so far (key >= klo, min-p) */
    bool s0 = false;
    u32 klo = 0;
    u32 prefix = 0, wmask = 0; /* COUNT, MASS: the digit below the nb-bit prefix */
    int nb = 0, shift = 0;
    u64 need = 0, target = 0, z0 = 0, cnt_above = 0;
    bool binned = false; /* MASS: the first pass binned by mass; the rest look into bin mbin alone */
    bool skipped = false; /* MASS: nb bits of mbin's keys taken from its interval, unchecked yet */
    bool bin_gather = false; /* GATHER: mbin's logits alone, for top-p's threshold among them */
    u32 mbin = 0;
    const float cS = c * ((float)BINS / 40.0f);
    u64 acc = 0; /* KEPT: this lane's kept mass */
    float kmin = limits<float>::infinity(); /* KEPT: this lane's smallest kept logit */
    float thr = -limits<float>::infinity(); /* the kept set's smallest logit (tid 0's, at the end) */
    bool gathered = false, cut_k = false, cut_m = false;
    /* KEPT: the draw of an element inside lane share_t's kept mass */
    bool pick_share = false;
    int share_t = 0;
    u64 share_draw = 0;

    if (greedy) {
      step = GREEDY;
    } else if (use_k && rs.top_k <= SEG) {
      /* top-k <= SEG: the k-th largest lane maximum theta bounds the k-th largest logit from
       * below, so {x >= theta} (usually about k elements) holds the top-k set: gathered. */
      sort_descending<NT>(lane_m);
      theta = lane_m[rs.top_k - 1];
      cut_k = true;
      cut_m = use_m;
      if (tid == 0) found[0] = 0;
      __syncthreads();
      if (tid < SEG)
        visit_lane<DT, SEG, UNROLL, ROWS16>(r, V, tid, [&](float x, i64 j) {
          if (x >= theta) {
            const u32 at = atomicAdd(&found[0], 1u);
            if (at < (u32)CAP) {
              cand.x[at] = x;
              cand.idx[at] = (i32)j;
            }
          }
        });
      __syncthreads();
      const u32 n = found[0];
      if (n <= (u32)CAP) {
        gathered = true;
        if (tid == 0) found[1] = n;
      } else {
        step = COUNT; /* the bound let too many through: the radix select instead */
        need = (u64)rs.top_k;
      }
      __syncthreads();
    } else {
      step = use_k ? COUNT : (use_p ? MASS : KEPT);
      need = (u64)rs.top_k;
    }
    const u64 pq = use_p ? (u64)RLK_SAMPLE_TOP_P_STEPS(rs.top_p) : 0ull;

    while (step != DONE) {
      /* ---- set up the pass ---- */
      int w = 0;
      if (step == COUNT || step == MASS) {
        w = KW - nb < DIGIT_BITS ? KW - nb : DIGIT_BITS;
        shift = KW - nb - w;
        wmask = (1u << w) - 1u;
        hist.clear<NT>(1 << w);
      }
      if (tid == 0) {
        found[0] = 0;
        kept_key = 0xffffffffu;
        bin_miss = 0;
      }
      acc = 0;
      __syncthreads();
      /* ---- the pass ---- */
      if (tid < SEG && (step != GREEDY || own.m == M))
        visit_lane_compact<DT, SEG, UNROLL, ROWS16>(r, V, tid, [&](float x, i64 j) {
          if (!FILTER || step == GREEDY) {
            if (x == M) atomicMin(&pick, (u32)j);
            return;
          }
          const u32 key = key_of<DT>(x);
          switch (step) {
            case GATHER: {
              /* after a MASS pass: the mass bins above mbin, and mbin's logits from edge up */
              bool in = key >= edge;
              if (bin_gather) {
                in = mass_bin(x, M, cS) == mbin && key >= klo && keep_m(x);
              } else if (s0) {
                const u32 q = mass_bin(x, M, cS);
                in = (q > mbin || (q == mbin && in)) && key >= klo && keep_m(x);
              }
              if (in) {
                const u32 at = atomicAdd(&found[0], 1u);
                if (at < (u32)CAP) {
                  cand.x[at] = x;
                  cand.idx[at] = (i32)j;
                }
              }
              break;
            }
            case COUNT:
              if (nb == 0 || (key >> (KW - nb)) == prefix) atomicAdd(&hist.count[(key >> shift) & wmask], 1u);
              break;
            case MASS:
              if (key >= klo && keep_m(x)) {
                const u32 mb = mass_bin(x, M, cS);
                if (!binned) {
                  const u64 m = mass_of(x, c, M);
                  if (mb != 0) atomicAdd(&hist.count[mb], 1u); /* bin 0 is never counted, nor gathered */
                  if (m != 0) hist.add_mass(mb, m);
                } else if (mb == mbin) {
                  if (nb == 0 || (key >> (KW - nb)) == prefix) {
                    const u32 q = (key >> shift) & wmask;
                    atomicAdd(&hist.count[q], 1u);
                    hist.add_mass(q, mass_of(x, c, M));
                  } else if (skipped) {
                    bin_miss = 1u;
                  }
                }
              }
              break;
            default: /* KEPT */
              if (key >= klo && keep_m(x)) {
                acc += mass_of(x, c, M);
                kmin = fminf(kmin, x);
              }
              break;
          }
        });
      __syncthreads();
      /* ---- what it found ---- */
      if (!FILTER || step == GREEDY) {
        step = DONE;
      } else if (step == GATHER && bin_gather) {
        /* top-p's threshold from the boundary bin's logits; then the kept set is drawn by a pass */
        klo = bin_threshold<DT, NT>(cand, found[0], found, warp_sums, target, c, M);
        bin_gather = false;
        step = KEPT;
      } else if (step == GATHER) {
        /* a radix-edge gather: what remained was counted, so it fits */
        gathered = true;
        if (tid == 0) found[1] = found[0]; /* read by the finish */
        step = DONE;
      } else if (step == MASS && bin_miss) {
        /* the mass bin's keys left the prefix its interval promised: its digits from the top */
        prefix = 0;
        nb = 0;
        skipped = false;
      } else if (step == COUNT || step == MASS) {
        const bool first_mass = step == MASS && !binned;
        skipped = false;
        if (first_mass) {
          /* the kept mass first: top-p's target is a fraction of it */
          u64 mine = 0;
          for (int q = tid; q < (1 << w); q += NT) mine += hist.mass[q];
          block_exclusive_scan<NT>(mine, warp_sums, &z0);
          target = ceil_fraction(pq, z0);
        }
        if (step == COUNT)
          boundary_bin<NT>(hist.count, 1 << w, need, warp_sums, found, found_u64);
        else
          boundary_bin<NT>(hist.mass, 1 << w, target, warp_sums, found, found_u64);
        const u32 b = found[0];
        const u64 above = found_u64[0];
        const u64 cabove = count_above<NT>(step == MASS, b, 1 << w, hist.count, warp_sums);
        const u64 in_bin = hist.count[b];
        __syncthreads();
        if (step == COUNT) {
          need -= above;
          cnt_above += above;
        } else {
          target -= above;
          cnt_above += cabove;
        }
        if (first_mass) {
          /* mass bin b holds the boundary (bin 0 was not counted: it is never gathered). The bins
           * above are kept whole: what fits is gathered, else b's logits alone where they fit (the
           * threshold among them), else b's key digits, from those its interval fixes. */
          binned = true;
          mbin = b;
          prefix = 0;
          nb = 0;
          const bool all_fit = b != 0 && cnt_above + in_bin <= (u64)CAP;
          bin_gather = b != 0 && !all_fit && in_bin <= (u64)CAP;
          if (b != 0 && !all_fit && !bin_gather) {
            nb = mass_bin_prefix<DT>(b, M, cS, &prefix);
            skipped = nb > 0;
          }
        } else {
          prefix = (prefix << w) | b;
          nb += w;
        }
        if (bin_gather) {
          step = GATHER;
        } else if (cnt_above + in_bin <= (u64)CAP && !(first_mass && b == 0)) {
          /* what is left fits: gather it and finish in shared memory */
          edge = nb > 0 ? prefix << (KW - nb) : 0u;
          s0 = step == MASS;
          cut_k = step == COUNT;
          cut_m = step == COUNT && use_m;
          step = GATHER;
        } else if (nb < KW) {
          /* the next digit */
        } else {
          klo = prefix; /* the k-th largest key, or top-p's threshold key, exactly */
          if (step == COUNT) {
            step = use_p ? MASS : KEPT;
            prefix = 0;
            nb = 0;
            cnt_above = 0;
          } else {
            step = KEPT;
          }
        }
      } else { /* KEPT: a lane's kept mass picks its share, the rest of the draw an element */
        const u64 total = draw_share<NT>(acc, kmin, R1, warp_sums, kept_key, pick, found_u64);
        share_t = (int)pick;
        share_draw = found_u64[1];
        pick_share = true;
        kept_mass = total;
        thr = float_of_key(kept_key); /* the scan synchronized after every lane's atomicMin */
        step = DONE;
      }
      __syncthreads();
    }

    if (pick_share) {
      const u32 klo_ = klo;
      __syncthreads(); /* every thread has read the chosen lane out of `pick` */
      if (wid == 0) {
        float x;
        share_pick<DT, SEG, ROWS16> sp;
        sp.load(r, V, share_t);
        const u32 y = sp.finish(c, M, [&](float xe) { return key_of<DT>(xe) >= klo_ && keep_m(xe); },
                                share_draw, false, &x);
        if (lane == 0) {
          pick = y;
          if (x == x) {
            pick_x = x;
            pick_known = 1;
          }
        }
      }
      __syncthreads();
    }

    /* ---- in shared memory: the candidates sorted, cut and drawn from ---- */
    if (FILTER && gathered)
      kept_mass = draw_candidates<NT>(cand, found, warp_sums, rs.top_k, cut_k, cut_m, keep_m, use_p, pq, z0, c, M,
                                      R1, pick, pick_x, pick_known, &thr);

    /* ---- outputs ---- */
    if (tid == 0)
      write_token<DT>(r, row, pick, pick_known, pick_x, rst, T, greedy, kept_mass, thr, tokens, logp, logp_filtered,
                      threshold);
    __syncthreads();
  }
}

} /* namespace rlk */

#endif /* RLK_SAMPLE_CUH */

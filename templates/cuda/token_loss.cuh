/* token_loss.cuh - the pass shared by the fused token losses (policy loss, value loss).
 *
 * A token loss reads a few per-token streams, writes per-token gradients, and sums per-token
 * terms into a scalar loss and metrics. The pass here walks the tokens; an Op (policy_loss.cuh,
 * value_loss.cuh) supplies the per-token math:
 *
 *   Op::NIN, Op::NOUT          stream counts; Op::IN_BITS / OUT_BITS say which are present
 *   Op::NACC                   accumulators, each reduced by Op::reduce_kind(k) (RED_*)
 *   Op::ROWSTAT, Op::PRE_BITS  whether a sequence needs a first pass over its tokens (sums that
 *                              its gradients depend on), and which input streams that pass reads
 *   Op::NPRE                   the first pass's sums per sequence
 *   op.row_begin(row, len)     per-sequence values (a per-sequence advantage; len is the
 *                              sequence's token count)
 *   op.pre(x, m, pre)          the first pass: adds a token into pre[0..NPRE-1]
 *   op.row_stats(pre)          the first pass's block-wide sums
 *   op.row_done(acc)           with ROWSTAT, once per sequence (thread 0, after its tokens):
 *                              per-sequence terms
 *   op.token(x, m, acc, y)     one token: inputs x[NIN], mask weight m -> gradients y[NOUT],
 *                              terms added into acc (m == 0: y = 0 and nothing added)
 *
 * Work items: in the padded layout a row is cut into tiles of `tile` tokens (one tile per row
 * when the Op needs row statistics); in the packed layout an item is a whole sequence. Blocks
 * take items in a grid-stride loop (block-uniform, so barriers inside are safe). Within an item,
 * 4-token chunks go to threads round robin, RLK_TL_UNROLL chunks loaded before any is used
 * (16-byte loads and stores where every stream is aligned; otherwise element by element, same
 * order of arithmetic per token). Each thread accumulates its tokens in order; at the end the
 * block combines threads (warp butterflies, then warps in index order) and writes one row of
 * partials[blockIdx.x][NACC] (f64). A second one-block kernel (reduce_partials) combines the
 * partials in a fixed order. No float atomics: the result depends only on the inputs and the
 * launch shape, which the host derives from the problem shape and the device.
 *
 * The aggregation's divisor (tl_norm): a host number is folded into the constant c the kernels get;
 * a device scalar (the caller's global count, all-reduced on the device) is read by every block;
 * without either, token-mean divides by this call's mask count, which a pre-pass (count_pass)
 * sums into per-block partials that every block of the later kernels adds up in the same fixed
 * order (grad_scale): the same bits everywhere, no float atomics, nothing read by the host.
 *
 * The layouts, the streams (S: an op's streams struct, RLK_TL_STREAMS) and the divisor (tl_norm)
 * are declared in templates/common/token_loss_params.h. */
#ifndef RLK_TOKEN_LOSS_CUH
#define RLK_TOKEN_LOSS_CUH

#include "rlk_prelude.cuh"
#include "seq_mask.cuh"
#include "token_loss_params.h"

namespace rlk {
namespace tl {

enum { RED_SUM = 0, RED_MAX = 1, RED_MIN = 2 };

/* ---- 4-element vectors -------------------------------------------------------------- */

RLK_DEVICE void load4(const float *p, float v[4]) {
  const f32x4 q = *(const f32x4 *)p;
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}
RLK_DEVICE void load4(const double *p, double v[4]) {
  const f64x2 a = ((const f64x2 *)p)[0], b = ((const f64x2 *)p)[1];
  v[0] = a.x;
  v[1] = a.y;
  v[2] = b.x;
  v[3] = b.y;
}
RLK_DEVICE void put4(float *p, const float v[4]) { store4(p, v[0], v[1], v[2], v[3]); }
RLK_DEVICE void put4(double *p, const double v[4]) {
  f64x2 a, b;
  a.x = v[0];
  a.y = v[1];
  b.x = v[2];
  b.y = v[3];
  ((f64x2 *)p)[0] = a;
  ((f64x2 *)p)[1] = b;
}

/* ---- reductions ------------------------------------------------------------------- */

template <int KIND, typename T> RLK_DEVICE T combine(T a, T b) {
  if (KIND == RED_MAX) return fmax_(a, b);
  if (KIND == RED_MIN) return fmin_(a, b);
  return a + b;
}

template <int KIND, typename T> RLK_DEVICE T identity() {
  if (KIND == RED_MAX) return -limits<T>::infinity();
  if (KIND == RED_MIN) return limits<T>::infinity();
  return T(0);
}

/* Butterfly over a warp: every lane ends with the same, bitwise identical value. */
template <int KIND, typename T> RLK_DEVICE T warp_combine(T v) {
#pragma unroll
  for (int o = RLK_WARP_SIZE / 2; o > 0; o >>= 1) v = combine<KIND>(v, shfl_xor(v, o));
  return v;
}

/* Value k of every warp (sh[k * RLK_MAX_WARPS + w], w < nwarps) combined in warp order. */
template <int KIND, typename T> RLK_DEVICE T combine_warps(const T *sh, int k, int nwarps) {
  T v = sh[k * RLK_MAX_WARPS];
  for (int w = 1; w < nwarps; ++w) v = combine<KIND>(v, sh[k * RLK_MAX_WARPS + w]);
  return v;
}

/* Static unrolled loop: calls f(integral_constant k) for k in [0, N). */
template <int K> struct int_c {
  static constexpr int value = K;
};
template <int K, int N> struct static_for {
  template <class F> static RLK_DEVICE void run(F &f) {
    f(int_c<K>());
    static_for<K + 1, N>::run(f);
  }
};
template <int N> struct static_for<N, N> {
  template <class F> static RLK_DEVICE void run(F &) {}
};

/* Combines acc[N] over the block (warps in index order) and writes it as f64 to out[N] from
 * threads 0..N-1. sh holds N * RLK_MAX_WARPS values. Every thread must call it. */
template <class Op, typename T, int N> struct block_reduce_fn {
  T *acc;
  T *sh;
  int warp, lane;
  template <class K> RLK_DEVICE void operator()(K) {
    constexpr int k = K::value;
    const T v = warp_combine<Op::reduce_kind(k)>(acc[k]);
    if (lane == 0) sh[k * RLK_MAX_WARPS + warp] = v;
  }
};
template <class Op, typename T, int N> struct block_finish_fn {
  const T *sh;
  int nwarps;
  double *out;
  template <class K> RLK_DEVICE void operator()(K) {
    constexpr int k = K::value;
    if ((int)threadIdx.x == k) out[k] = (double)combine_warps<Op::reduce_kind(k)>(sh, k, nwarps);
  }
};

template <class Op, typename T, int N>
RLK_DEVICE void block_reduce_to(T (&acc)[N], T *sh, double *out) {
  static_assert(N <= RLK_TL_BLOCK, "accumulators");
  block_reduce_fn<Op, T, N> f{acc, sh, (int)(threadIdx.x / RLK_WARP_SIZE),
                              (int)(threadIdx.x % RLK_WARP_SIZE)};
  static_for<0, N>::run(f);
  __syncthreads();
  block_finish_fn<Op, T, N> g{sh, (int)(blockDim.x / RLK_WARP_SIZE), out};
  static_for<0, N>::run(g);
}

/* Block-wide sums of v[0..1], returned to every thread (fixed order). sh holds
 * 2 * RLK_MAX_WARPS values; every thread must call it. */
/* N block-wide sums, every thread gets them (sh: N * RLK_MAX_WARPS). */
template <int N, typename T> RLK_DEVICE void block_sum_n(T v[N], T *sh) {
  const int warp = (int)(threadIdx.x / RLK_WARP_SIZE), lane = (int)(threadIdx.x % RLK_WARP_SIZE);
  const int nwarps = (int)(blockDim.x / RLK_WARP_SIZE);
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const T a = warp_combine<RED_SUM>(v[k]);
    if (lane == 0) sh[k * RLK_MAX_WARPS + warp] = a;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = combine_warps<RED_SUM>(sh, k, nwarps);
  __syncthreads(); /* sh may be reused as soon as this returns */
}

/* ---- row geometry ------------------------------------------------------------------ */

/* Sequence `row` of a packed layout: its first token and its length, offsets clamped into
 * [0, N] and non-decreasing (bad offsets never cause an access out of bounds). */
template <int LAYOUT>
RLK_DEVICE void packed_row(const void *offsets, i64 row, i64 n, i64 *first, i64 *len) {
  i64 b;
  clamped_offsets<LAYOUT == TL_LAYOUT_PACKED_I32>(offsets, row, n, first, &b);
  *len = b - *first;
}

/* A pass's work items: a padded row in tiles of s.tile columns, a packed row whole. */
template <int LAYOUT, class S> RLK_DEVICE i64 items_per_row(const S &s) {
  return LAYOUT == TL_LAYOUT_PADDED ? s.tiles_per_row : 1;
}

/* Work item `item`: its row, the row's first token and length, and the columns [b, e) it covers. */
struct row_item {
  i64 row, first, len, b, e;
};

template <int LAYOUT, class S> RLK_DEVICE row_item row_item_of(const S &s, i64 item, i64 per_row) {
  row_item it;
  it.row = item / per_row;
  it.first = 0;
  it.len = s.cols;
  if (LAYOUT == TL_LAYOUT_PADDED) {
    it.b = (item % per_row) * s.tile;
    it.e = min_(it.b + s.tile, s.cols);
  } else {
    packed_row<LAYOUT>(s.offsets, it.row, s.cols, &it.first, &it.len);
    it.b = 0;
    it.e = it.len;
  }
  return it;
}

/* Pointers of one row: stream k's element 0 of the row, and the mask's element index. */
template <typename T, int NIN, int NOUT> struct RowPtrs {
  const T *in[NIN];
  T *out[NOUT];
  i64 mask0;
};

template <typename T, int LAYOUT, class S, int NIN, int NOUT>
RLK_DEVICE void row_ptrs(const S &s, i64 row, i64 first, RowPtrs<T, NIN, NOUT> *p) {
#pragma unroll
  for (int k = 0; k < NIN; ++k)
    p->in[k] = (const T *)s.in[k] + (LAYOUT == TL_LAYOUT_PADDED ? row * s.in_stride[k] : first);
#pragma unroll
  for (int k = 0; k < NOUT; ++k)
    p->out[k] = (T *)s.out[k] + (LAYOUT == TL_LAYOUT_PADDED ? row * s.out_stride[k] : first);
  p->mask0 = LAYOUT == TL_LAYOUT_PADDED ? row * s.mask_stride : first;
}

/* Can every present stream and the mask be accessed 4 elements at a time from element j? */
template <typename T, int MASK, unsigned INB, unsigned OUTB, int NIN, int NOUT>
RLK_DEVICE bool vec_ok(const RowPtrs<T, NIN, NOUT> &p, const void *mask, i64 j) {
  bool ok = true;
#pragma unroll
  for (int k = 0; k < NIN; ++k)
    if ((INB >> k) & 1u) ok = ok && is_aligned<16>(p.in[k] + j);
#pragma unroll
  for (int k = 0; k < NOUT; ++k)
    if ((OUTB >> k) & 1u) ok = ok && is_aligned<16>(p.out[k] + j);
  if (MASK != RLK_SEQ_MASK_NONE)
    ok = ok && is_aligned<4 * seq_mask_bytes<MASK>::value>((const u8 *)mask +
                                                          (p.mask0 + j) * seq_mask_bytes<MASK>::value);
  return ok;
}

/* The split of a segment [s, e) into a scalar head [s, j0), 4-element chunks [j0, j1) and a
 * scalar tail [j1, e). Chunks start where the first stream is 16-byte aligned; when some stream
 * is not aligned there, the whole segment is scalar (j0 = j1 = e). */
template <typename T, int MASK, unsigned INB, unsigned OUTB, int NIN, int NOUT>
RLK_DEVICE void split(const RowPtrs<T, NIN, NOUT> &p, const void *mask, i64 s, i64 e, i64 *j0,
                      i64 *j1) {
  const i64 phase = (i64)(((u64)(p.in[0] + s) / sizeof(T)) & 3u);
  i64 a = s + ((4 - phase) & 3);
  if (a > e) a = e;
  if (!vec_ok<T, MASK, INB, OUTB>(p, mask, a)) a = e;
  *j0 = a;
  *j1 = a + ((e - a) & ~(i64)3);
}

/* ---- the pass ------------------------------------------------------------------------ */

/* Chunks in flight per thread: f64 streams are twice the registers, so half as many. */
template <typename T> struct unroll_of {
  static constexpr int value = sizeof(T) == 8 ? 1 : RLK_TL_UNROLL;
};

/* Loads element j of the present streams and the mask weight. */
template <typename T, int MASK, unsigned BITS, int NIN, int NOUT>
RLK_DEVICE float load1(const RowPtrs<T, NIN, NOUT> &p, const void *mask, i64 j, T x[NIN]) {
#pragma unroll
  for (int k = 0; k < NIN; ++k) x[k] = ((BITS >> k) & 1u) ? p.in[k][j] : T(0);
  return seq_mask_weight<MASK, false>(mask, p.mask0 + j);
}

/* The first pass over a row segment: op.pre over its tokens, then the block-wide sums. */
template <typename T, int MASK, class Op, int NIN, int NOUT>
RLK_DEVICE void row_prepass(Op &op, const RowPtrs<T, NIN, NOUT> &p, const void *mask, i64 s, i64 e,
                            T *sh2) {
  constexpr unsigned PB = Op::PRE_BITS;
  T pre[Op::NPRE];
#pragma unroll
  for (int k = 0; k < Op::NPRE; ++k) pre[k] = T(0);
  i64 j0, j1;
  split<T, MASK, PB, 0u>(p, mask, s, e, &j0, &j1);
  const i64 bd = blockDim.x, tid = threadIdx.x;
  for (i64 j = s + tid; j < j0; j += bd) {
    T x[NIN];
    const float m = load1<T, MASK, PB>(p, mask, j, x);
    op.pre(x, m, pre);
  }
  const i64 nch = (j1 - j0) / 4;
  constexpr int U = unroll_of<T>::value;
  for (i64 c0 = tid; c0 < nch; c0 += U * bd) {
    T x[U][NIN][4];
    float m[U][4];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const i64 c = c0 + u * bd;
      if (c < nch) {
        const i64 j = j0 + 4 * c;
#pragma unroll
        for (int k = 0; k < NIN; ++k)
          if ((PB >> k) & 1u) load4(p.in[k] + j, x[u][k]);
        seq_mask_weight4<MASK, false>(mask, p.mask0 + j, m[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c0 + u * bd < nch) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          T xi[NIN];
#pragma unroll
          for (int k = 0; k < NIN; ++k) xi[k] = ((PB >> k) & 1u) ? x[u][k][q] : T(0);
          op.pre(xi, m[u][q], pre);
        }
      }
    }
  }
  for (i64 j = j1 + tid; j < e; j += bd) {
    T x[NIN];
    const float m = load1<T, MASK, PB>(p, mask, j, x);
    op.pre(x, m, pre);
  }
  block_sum_n<Op::NPRE>(pre, sh2);
  op.row_stats(pre);
}

/* The main pass over a row segment: op.token per token, gradients stored. */
template <typename T, int MASK, class Op, int NIN, int NOUT, int NACC>
RLK_DEVICE void row_main(Op &op, const RowPtrs<T, NIN, NOUT> &p, const void *mask, i64 s, i64 e,
                         T (&acc)[NACC]) {
  constexpr unsigned IB = Op::IN_BITS, OB = Op::OUT_BITS;
  i64 j0, j1;
  split<T, MASK, IB, OB>(p, mask, s, e, &j0, &j1);
  const i64 bd = blockDim.x, tid = threadIdx.x;
  for (i64 j = s + tid; j < j0; j += bd) {
    T x[NIN], y[NOUT];
    const float m = load1<T, MASK, IB>(p, mask, j, x);
    op.token(x, m, acc, y);
#pragma unroll
    for (int k = 0; k < NOUT; ++k)
      if ((OB >> k) & 1u) p.out[k][j] = y[k];
  }
  const i64 nch = (j1 - j0) / 4;
  constexpr int U = unroll_of<T>::value;
  for (i64 c0 = tid; c0 < nch; c0 += U * bd) {
    T x[U][NIN][4];
    float m[U][4];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const i64 c = c0 + u * bd;
      if (c < nch) {
        const i64 j = j0 + 4 * c;
#pragma unroll
        for (int k = 0; k < NIN; ++k)
          if ((IB >> k) & 1u) load4(p.in[k] + j, x[u][k]);
        seq_mask_weight4<MASK, false>(mask, p.mask0 + j, m[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const i64 c = c0 + u * bd;
      if (c < nch) {
        T y[NOUT][4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          T xi[NIN], yi[NOUT];
#pragma unroll
          for (int k = 0; k < NIN; ++k) xi[k] = ((IB >> k) & 1u) ? x[u][k][q] : T(0);
          op.token(xi, m[u][q], acc, yi);
#pragma unroll
          for (int k = 0; k < NOUT; ++k) y[k][q] = yi[k];
        }
        const i64 j = j0 + 4 * c;
#pragma unroll
        for (int k = 0; k < NOUT; ++k)
          if ((OB >> k) & 1u) put4(p.out[k] + j, y[k]);
      }
    }
  }
  for (i64 j = j1 + tid; j < e; j += bd) {
    T x[NIN], y[NOUT];
    const float m = load1<T, MASK, IB>(p, mask, j, x);
    op.token(x, m, acc, y);
#pragma unroll
    for (int k = 0; k < NOUT; ++k)
      if ((OB >> k) & 1u) p.out[k][j] = y[k];
  }
}

/* The whole token pass of one block: items, then the block's partials. Shared memory is passed
 * in by the kernel (sh_acc: NACC * RLK_MAX_WARPS, sh2: NPRE * RLK_MAX_WARPS). */
template <typename T, int LAYOUT, int MASK, class Op, class S>
RLK_DEVICE void token_pass(Op &op, const S &s, double *partials, T *sh_acc, T *sh2) {
  constexpr int NACC = Op::NACC;
  T acc[NACC];
  op.acc_init(acc);
  const i64 per_row = items_per_row<LAYOUT>(s);
  const i64 items = s.rows * per_row;
  for (i64 item = blockIdx.x; item < items; item += gridDim.x) {
    const row_item it = row_item_of<LAYOUT>(s, item, per_row);
    RowPtrs<T, Op::NIN, Op::NOUT> p;
    row_ptrs<T, LAYOUT>(s, it.row, it.first, &p);
    op.row_begin(it.row, it.len);
    if (Op::ROWSTAT) row_prepass<T, MASK>(op, p, s.mask, it.b, it.e, sh2);
    row_main<T, MASK>(op, p, s.mask, it.b, it.e, acc);
    if (Op::ROWSTAT && threadIdx.x == 0) op.row_done(acc);
  }
  block_reduce_to<Op>(acc, sh_acc, partials + (i64)blockIdx.x * NACC);
}

/* Combines partials[P][N] in a fixed order (threads stride over blocks' rows, then warps, then
 * warps in index order); the result lands in out[N] of thread 0. sh holds N * RLK_MAX_WARPS. */
template <class Op, int N> struct partial_load_fn {
  const double *partials;
  i64 P;
  double *a;
  template <class K> RLK_DEVICE void operator()(K) {
    constexpr int k = K::value;
    double v = identity<Op::reduce_kind(k), double>();
    for (i64 p = threadIdx.x; p < P; p += blockDim.x) v = combine<Op::reduce_kind(k)>(v, partials[p * N + k]);
    a[k] = v;
  }
};
template <class Op, int N> struct partial_finish_fn {
  const double *sh;
  int nwarps;
  double *out;
  template <class K> RLK_DEVICE void operator()(K) {
    constexpr int k = K::value;
    out[k] = combine_warps<Op::reduce_kind(k)>(sh, k, nwarps);
  }
};

template <class Op, int N>
RLK_DEVICE void reduce_partials(const double *partials, i64 P, double *sh, double (&out)[N]) {
  double a[N];
  partial_load_fn<Op, N> f{partials, P, a};
  static_for<0, N>::run(f);
  block_reduce_fn<Op, double, N> g{a, sh, (int)(threadIdx.x / RLK_WARP_SIZE),
                                   (int)(threadIdx.x % RLK_WARP_SIZE)};
  static_for<0, N>::run(g);
  __syncthreads();
  if (threadIdx.x == 0) {
    partial_finish_fn<Op, N> h{sh, (int)(blockDim.x / RLK_WARP_SIZE), out};
    static_for<0, N>::run(h);
  }
}

/* The constant of the gradients and the loss: c as the host gave it (TL_NORM_VALUE), or the
 * numerator c divided by the device scalar or by the mask count (0 when nothing counts).
 * The count's partials are summed with a block of RLK_TL_BLOCK threads (thread i takes partials
 * i, i + RLK_TL_BLOCK, ...; warps in index order), so every kernel gets the same bits. Every
 * thread must call it; sh holds RLK_MAX_WARPS doubles. */
RLK_DEVICE double grad_scale(const tl_norm &n, double c, double *sh) {
  if (n.kind == TL_NORM_F32) return c / (double)*(const float *)n.value;
  if (n.kind == TL_NORM_F64) return c / *(const double *)n.value;
  if (n.kind != TL_NORM_COUNT) return c;
  double v = 0.0;
  for (i64 i = threadIdx.x; i < n.num_counts; i += RLK_TL_BLOCK) v += n.counts[i];
  const double total = block_sum(v, sh);
  return total > 0.0 ? c / total : 0.0;
}

/* The mask count pass: the weight of the tokens that count (m != 0), over the same items as
 * token_pass, per block in a fixed order -> counts[blockIdx.x]. Launched with RLK_TL_BLOCK
 * threads. */
template <int LAYOUT, int MASK, class S>
RLK_DEVICE void count_pass(const S &s, double *counts, double *sh) {
  double v = 0.0;
  const i64 per_row = items_per_row<LAYOUT>(s);
  const i64 items = s.rows * per_row;
  const i64 bd = blockDim.x, tid = threadIdx.x;
  for (i64 item = blockIdx.x; item < items; item += gridDim.x) {
    const row_item it = row_item_of<LAYOUT>(s, item, per_row);
    const i64 m0 = LAYOUT == TL_LAYOUT_PADDED ? it.row * s.mask_stride : it.first;
    for (i64 j = it.b + tid; j < it.e; j += bd) {
      const float m = seq_mask_weight<MASK, false>(s.mask, m0 + j);
      if (m != 0.0f) v += (double)m;
    }
  }
  const double total = block_sum(v, sh);
  if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

/* Per-token helpers shared by the ops. */
template <typename T> RLK_DEVICE T clampv(T x, T lo, T hi) { return x < lo ? lo : (x > hi ? hi : x); }
/* Inside [lo, hi], boundaries included (false for NaN). */
template <typename T> RLK_DEVICE bool inside(T x, T lo, T hi) { return x >= lo && x <= hi; }
/* A clamp's gradient factor: 1 strictly inside, bg on a bound (the caller's convention), 0
 * outside or NaN. */
template <typename T> RLK_DEVICE T gate(T x, T lo, T hi, T bg) {
  return (x > lo && x < hi) ? T(1) : ((x == lo || x == hi) ? bg : T(0));
}

} /* namespace tl */
} /* namespace rlk */

#endif /* RLK_TOKEN_LOSS_CUH */

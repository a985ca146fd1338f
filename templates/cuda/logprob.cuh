/* logprob.cuh - token log-probs and entropy from logits, forward and backward, with 16-byte
 * vector loads (every CUDA arch and HIP). The sm_90 variants that stream through shared memory
 * (1-D bulk copies, tensor maps) are in logprob_sm90.cuh; the math is in logprob_common.cuh.
 *
 * Entries (launched by src/ops/logprob.c):
 *   logprob_fwd  logp[i] = z[i, y_i] - lse[i], optional lse and entropy, one pass over the row
 *   logprob_bwd  dlogits = (g_lp (onehot(y) - p) - g_H p (z - E_p[z])) / T, in place allowed
 *
 * Rows: SEG threads share a row, SEG a power of two up to a warp (BLOCK / SEG rows per block, for
 * small V) or SEG == BLOCK (a block per row). Rows are grid-strided with a block-uniform loop, so
 * every lane reaches every shuffle and barrier. The forward lays a row out by element index
 * (row_split: 16-byte vectors of elements from the row's first, then a scalar tail), whatever its
 * address, so a row's bits do not depend on its place in a batch; a row off the 16-byte grid loads
 * its vectors in narrower pieces. Thread k of a segment reads vectors k, k + SEG, ... UNROLL at a
 * time (loads in flight), then folds them into its state in a fixed order. The backward, which
 * writes each element on its own, splits a row at the 16-byte grid (row_split_aligned) for its
 * vector stores. */
#ifndef RLK_LOGPROB_CUH
#define RLK_LOGPROB_CUH

#include "logprob_common.cuh"

namespace rlk {

/* Forward. One row's state per segment, merged by shuffles (and through shared memory across the
 * warps of a block); lane 0 of the segment writes the row. KEPT: kept-set replay, over the logits
 * at or above the row's threshold and its label (with_label). */
template <int DT, typename L, int BLOCK, int SEG, int UNROLL, bool ENTROPY, bool KEPT>
__global__ void __launch_bounds__(BLOCK)
    logprob_fwd(RLK_PARAMS_ARG lp::FwdParams p_) {
  const void *__restrict__ logits = p_.logits;
  const L *__restrict__ labels = (const L *)p_.labels;
  const i64 row_stride = p_.row_stride, label_stride = p_.label_stride, N = p_.N, V = p_.V,
            ignore_index = p_.ignore_index;
  const float temperature = p_.temperature;
  float *__restrict__ logp = p_.logp, *__restrict__ lse = p_.lse;
  float *__restrict__ entropy = p_.entropy;
  i32 *__restrict__ status = p_.status;
  using namespace lp;
  static_assert(SEG == BLOCK || (SEG >= 1 && SEG <= RLK_WARP_SIZE && (SEG & (SEG - 1)) == 0),
                "SEG: a power of two up to a warp, or the whole block");
  static_assert(BLOCK % RLK_WARP_SIZE == 0 && BLOCK <= RLK_MAX_BLOCK, "BLOCK");
  constexpr int B = logit_traits<DT>::bytes;
  constexpr int RPB = BLOCK / SEG;
  constexpr int NWARPS = BLOCK / RLK_WARP_SIZE;
  __shared__ state scratch[NWARPS];
  const float c = RLK_LP_LOG2E / temperature;
  const int lane = (int)(threadIdx.x % SEG);
  const int sub = (int)(threadIdx.x / SEG);

  for (i64 base = (i64)blockIdx.x * RPB; base < N; base += (i64)gridDim.x * RPB) {
    const i64 row = base + sub;
    state st = empty_state();
    i64 y = 0;
    float xy = 0.0f, thr = 0.0f;
    if (row < N) {
      const u8 *r = (const u8 *)logits + row * row_stride * B;
      if (KEPT) thr = ld_ro(p_.threshold + row);
      if (lane == 0) {
        y = load_label(labels, row, label_stride);
        if (y >= 0 && y < V) xy = load_logit<DT>(r, y);
      }
      st = thread_row_state<DT, SEG, UNROLL, ENTROPY, KEPT>(r, V, c, lane, thr);
    }
    if constexpr (SEG > RLK_WARP_SIZE)
      st = block_merge<BLOCK, ENTROPY>(st, c, scratch);
    else
      st = segment_merge<SEG, ENTROPY>(st, c);
    if (row < N && lane == 0) {
      if (KEPT && y != ignore_index && y >= 0 && y < V) st = with_label<ENTROPY>(st, xy, thr, c);
      write_row<ENTROPY>(st, row, y, xy, V, ignore_index, temperature, logp, lse, entropy, status);
    }
  }
}

namespace lp {

/* Gradient element type: the logits' dtype or f32. */
template <int DT, int GRAD> struct grad_traits {
  static constexpr int odt = GRAD == LP_GRAD_F32 ? RLK_DT_F32 : DT;
  static constexpr int bytes = logit_traits<odt>::bytes;
};

/* Two floats as packed 16-bit values (lo in the low half), rounded to nearest even. */
template <int ODT> RLK_DEVICE u32 pack2(float lo, float hi) {
#if defined(RLK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 d;
  if constexpr (ODT == RLK_DT_BF16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#else
  if constexpr (ODT == RLK_DT_BF16)
    return (u32)to_bf16(lo).bits | ((u32)to_bf16(hi).bits << 16);
  else
    return (u32)to_f16(lo).bits | ((u32)to_f16(hi).bits << 16);
#endif
}

/* Stores E gradient values (one input vector's worth) at a 16-byte aligned address. */
template <int ODT, int E> RLK_DEVICE void store_grad(void *p, const float *g) {
  if constexpr (ODT == RLK_DT_F32) {
#pragma unroll
    for (int k = 0; k < E / 4; ++k) {
      u32x4 o;
      o.w[0] = float_as_bits(g[4 * k + 0]);
      o.w[1] = float_as_bits(g[4 * k + 1]);
      o.w[2] = float_as_bits(g[4 * k + 2]);
      o.w[3] = float_as_bits(g[4 * k + 3]);
      ((u32x4 *)p)[k] = o;
    }
  } else {
#pragma unroll
    for (int k = 0; k < E / 8; ++k) {
      u32x4 o;
      o.w[0] = pack2<ODT>(g[8 * k + 0], g[8 * k + 1]);
      o.w[1] = pack2<ODT>(g[8 * k + 2], g[8 * k + 3]);
      o.w[2] = pack2<ODT>(g[8 * k + 4], g[8 * k + 5]);
      o.w[3] = pack2<ODT>(g[8 * k + 6], g[8 * k + 7]);
      ((u32x4 *)p)[k] = o;
    }
  }
}

/* Stores one gradient value. */
template <int ODT> RLK_DEVICE void store_grad1(void *row, i64 j, float g) {
  if constexpr (ODT == RLK_DT_F32)
    ((float *)row)[j] = g;
  else if constexpr (ODT == RLK_DT_BF16)
    ((bf16 *)row)[j] = to_bf16(g);
  else
    ((f16 *)row)[j] = to_f16(g);
}

/* A row's backward coefficients: dlogits_j = p_j (a + b x_j) + [j == y] gy, with
 * p_j = 2^(x_j c - l2). mode 0: normal; 1: zeros (ignored row); 2: NaN (bad label). */
struct bwd_row {
  float a, b, gy, l2;
  float thr; /* kept-set replay: the row's threshold */
  int mode;
};

/* One gradient value from a raw logit. */
template <bool ENTROPY, bool KEPT = false> RLK_DEVICE float grad_of(float x, float c, const bwd_row &k) {
  /* kept-set replay: a logit below the row's threshold has p 0 (the label's own term is k.fix) */
  if (KEPT && x < k.thr) return 0.0f;
  const float p = exp2_approx(fmaf(x, c, -k.l2));
  /* a term of p 0 is 0: its linear factor b x + a may overflow (b = -g_H / T^2 at a small
   * temperature, x at -inf or far below the maximum), and 0 * inf is NaN */
  return ENTROPY ? (p == 0.0f ? 0.0f : p * fmaf(k.b, x, k.a)) : p * k.a;
}

/* The label's term beside grad_of's: g_lp / T, and under kept-set replay, for a label below the
 * threshold (kept all the same), the p term grad_of left out. Read by the thread that writes the
 * label's element, before it writes it (in place: the logit is still there). */
template <int DT, bool ENTROPY, bool KEPT>
RLK_DEVICE float label_grad(const u8 *r, i64 y, float c, const bwd_row &k) {
  if (!KEPT) return k.gy;
  const float xy = load_logit<DT>(r, y);
  return xy < k.thr ? k.gy + grad_of<ENTROPY>(xy, c, k) : k.gy;
}

} /* namespace lp */

/* Backward: re-reads the logits, writes dlogits (dtype GRAD: the logits' or f32). `grad` may be
 * `logits` itself (same dtype and row stride): each element is read, then written, by one thread.
 * grad_logp may be NULL (a zero g_lp); with ENTROPY, grad_entropy and entropy are given and
 * E_p[z] = lse - entropy. Rows split over gridDim.y in contiguous vector ranges (for few rows).
 * shard != 0: the logits are the columns [vocab_start, vocab_start + V) of the vocabulary the
 * labels index (the one-hot term only where the label falls in them); 0: vocab_start is 0. KEPT:
 * kept-set replay (lse and entropy the kept forward's): p is 0 below the row's threshold, but for
 * the label. */
template <int DT, int GRAD, typename L, int BLOCK, int SEG, int UNROLL, bool ENTROPY, bool KEPT>
__global__ void __launch_bounds__(BLOCK)
    logprob_bwd(RLK_PARAMS_ARG lp::BwdParams p_) {
  const void *logits = p_.logits;
  const L *__restrict__ labels = (const L *)p_.labels;
  const i64 row_stride = p_.row_stride, label_stride = p_.label_stride, N = p_.N, V = p_.V,
            ignore_index = p_.ignore_index;
  const float temperature = p_.temperature;
  const float *__restrict__ lse = p_.lse, *__restrict__ grad_logp = p_.grad_logp;
  const float *__restrict__ entropy = p_.entropy, *__restrict__ grad_entropy = p_.grad_entropy;
  const i64 lse_stride = p_.lse_stride, grad_logp_stride = p_.grad_logp_stride,
            entropy_stride = p_.entropy_stride, grad_entropy_stride = p_.grad_entropy_stride;
  void *grad = p_.grad;
  const i64 grad_stride = p_.grad_stride, vocab_start = p_.vocab_start;
  i32 *__restrict__ status = p_.status;
  const i32 shard = p_.shard;
  using namespace lp;
  static_assert(SEG == BLOCK || (SEG >= 1 && SEG <= RLK_WARP_SIZE && (SEG & (SEG - 1)) == 0),
                "SEG: a power of two up to a warp, or the whole block");
  constexpr int B = logit_traits<DT>::bytes;
  constexpr int E = epv<DT>::value;
  constexpr int ODT = grad_traits<DT, GRAD>::odt;
  constexpr int OB = grad_traits<DT, GRAD>::bytes;
  constexpr int RPB = BLOCK / SEG;
  const float c = RLK_LP_LOG2E / temperature;
  const int lane = (int)(threadIdx.x % SEG);
  const int sub = (int)(threadIdx.x / SEG);
  const i64 splits = gridDim.y, split = blockIdx.y;

  for (i64 base = (i64)blockIdx.x * RPB; base < N; base += (i64)gridDim.x * RPB) {
    const i64 row = base + sub;
    if (row >= N) continue; /* no barrier or shuffle below */
    const u8 *r = (const u8 *)logits + row * row_stride * B;
    u8 *o = (u8 *)grad + row * grad_stride * OB;

    bwd_row k;
    const i64 yg = load_label(labels, row, label_stride);
    /* the label's column: a shard's labels outside [0, V) are another shard's, not bad */
    const i64 y = yg - vocab_start;
    k.a = k.b = k.gy = k.l2 = 0.0f;
    k.thr = -limits<float>::infinity();
    k.mode = 0;
    if (yg == ignore_index) {
      k.mode = 1;
    } else if (!shard && (y < 0 || y >= V)) {
      k.mode = 2;
      if (status && lane == 0 && split == 0) atomicOr((int *)status, (int)LP_STATUS_BAD_LABEL);
    } else {
      const float l = ld_ro(lse + row * lse_stride);
      const float gl = grad_logp ? ld_ro(grad_logp + row * grad_logp_stride) : 0.0f;
      k.l2 = l * RLK_LP_LOG2E;
      k.gy = gl / temperature;
      k.a = -gl / temperature;
      if (ENTROPY) {
        const float gh = ld_ro(grad_entropy + row * grad_entropy_stride);
        const float ez = l - ld_ro(entropy + row * entropy_stride);
        k.a = (gh * ez - gl) / temperature;
        k.b = -gh / (temperature * temperature);
      }
      if (KEPT) k.thr = ld_ro(p_.threshold + row);
    }

    const row_split_aligned<DT> sp(r, V);
    const bool vec_ok = (((u64)(o + sp.head * OB)) & 15u) == 0;
    /* this block's range of vectors, and whether it owns the head and the tail */
    const i64 nv = vec_ok ? sp.nvec : 0;
    const i64 v_begin = nv * split / splits, v_end = nv * (split + 1) / splits;
    const bool own_ends = split == splits - 1;
    const bool own_head = split == 0;

    if (k.mode != 0) {
      const float fill = k.mode == 1 ? 0.0f : limits<float>::quiet_nan();
      float g[E];
#pragma unroll
      for (int j = 0; j < E; ++j) g[j] = fill;
      for (i64 v = v_begin + lane; v < v_end; v += SEG) store_grad<ODT, E>(o + (sp.head + v * E) * OB, g);
      if (vec_ok) {
        if (own_head)
          for (i64 j = lane; j < sp.head; j += SEG) store_grad1<ODT>(o, j, fill);
        if (own_ends)
          for (i64 j = sp.head + sp.nvec * E + lane; j < V; j += SEG) store_grad1<ODT>(o, j, fill);
      } else if (own_head) {
        for (i64 j = lane; j < V; j += SEG) store_grad1<ODT>(o, j, fill);
      }
      continue;
    }

    if (vec_ok) {
      if (own_head)
        for (i64 j = lane; j < sp.head; j += SEG) {
          const float gj = grad_of<ENTROPY, KEPT>(load_logit<DT>(r, j), c, k) + (j == y ? label_grad<DT, ENTROPY, KEPT>(r, y, c, k) : 0.0f);
          store_grad1<ODT>(o, j, gj);
        }
      if (own_ends)
        for (i64 j = sp.head + sp.nvec * E + lane; j < V; j += SEG) {
          const float gj = grad_of<ENTROPY, KEPT>(load_logit<DT>(r, j), c, k) + (j == y ? label_grad<DT, ENTROPY, KEPT>(r, y, c, k) : 0.0f);
          store_grad1<ODT>(o, j, gj);
        }
      const u8 *vb = r + sp.head * B;
      u8 *ob = o + sp.head * OB;
      const i64 yv = y - sp.head; /* the label's offset in the vector body */
      i64 v = v_begin + lane;
      for (; v + (i64)(UNROLL - 1) * SEG < v_end; v += (i64)UNROLL * SEG) {
        u32x4 raw[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) raw[u] = load_once(vb + (v + (i64)u * SEG) * 16);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          float g[E];
#define RLK_LP_GJ(J) \
  if (J < E) g[J < E ? J : 0] = grad_of<ENTROPY, KEPT>(element<DT, (J < E ? J : 0)>(raw[u]), c, k);
          RLK_LP_GJ(0) RLK_LP_GJ(1) RLK_LP_GJ(2) RLK_LP_GJ(3)
          RLK_LP_GJ(4) RLK_LP_GJ(5) RLK_LP_GJ(6) RLK_LP_GJ(7)
          const i64 vi = v + (i64)u * SEG;
          if ((u64)(yv - vi * E) < (u64)E) {
#pragma unroll
            for (int j = 0; j < E; ++j)
              if (yv - vi * E == j) g[j] += label_grad<DT, ENTROPY, KEPT>(r, y, c, k);
          }
          store_grad<ODT, E>(ob + vi * E * OB, g);
        }
      }
      for (; v < v_end; v += SEG) {
        u32x4 raw[1];
        raw[0] = load_once(vb + v * 16);
        const int u = 0;
        float g[E];
        RLK_LP_GJ(0) RLK_LP_GJ(1) RLK_LP_GJ(2) RLK_LP_GJ(3)
        RLK_LP_GJ(4) RLK_LP_GJ(5) RLK_LP_GJ(6) RLK_LP_GJ(7)
#undef RLK_LP_GJ
        if ((u64)(yv - v * E) < (u64)E) {
#pragma unroll
          for (int j = 0; j < E; ++j)
            if (yv - v * E == j) g[j] += label_grad<DT, ENTROPY, KEPT>(r, y, c, k);
        }
        store_grad<ODT, E>(ob + v * E * OB, g);
      }
    } else if (own_head) {
      /* the output row is not 16-byte aligned where the input is: element by element */
      for (i64 j = lane; j < V; j += SEG) {
        const float gj = grad_of<ENTROPY, KEPT>(load_logit<DT>(r, j), c, k) + (j == y ? label_grad<DT, ENTROPY, KEPT>(r, y, c, k) : 0.0f);
        store_grad1<ODT>(o, j, gj);
      }
    }
  }
}

} /* namespace rlk */

#endif /* RLK_LOGPROB_CUH */

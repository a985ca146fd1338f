/* logprob_sm90.cuh - the forward of logprob.cuh streamed through shared memory by the copy
 * engine of sm_90 and later (CUDA only; the op never selects these elsewhere).
 *
 *   logprob_fwd_bulk  1-D bulk copies (cp.async.bulk) of 16-byte aligned row segments, a ring of
 *                     STAGES tiles, full/empty mbarriers; a producer warp and CWARPS consumer warps,
 *                     persistent blocks over rows (the ring runs on across row boundaries). The
 *                     unaligned head and tail of a row (< 16 bytes each) are read with plain loads.
 *   logprob_fwd_tma   2-D tensor-map copies (cp.async.bulk.tensor): boxes of 512 bytes
 *                     x ROWS rows, NBOX boxes a stage; a consumer warp per row. The tensor map is
 *                     encoded on the host per launch into the kernel's __grid_constant__ struct.
 *                     Not a default anywhere until it has run correctly on a GPU.
 *
 * Both accumulate exactly like logprob_fwd (logprob_common.cuh): the same outputs up to the order
 * in which partial sums are combined. */
#ifndef RLK_LOGPROB_SM90_CUH
#define RLK_LOGPROB_SM90_CUH

#include "logprob_common.cuh"

#if defined(RLK_CUDA)
namespace rlk {

/* Bytes of the ring of logprob_fwd_bulk: STAGES tiles of CWARPS * 32 threads x UNROLL vectors. */
template <int CWARPS, int UNROLL, int STAGES> struct lp_bulk_smem {
  static constexpr u32 tile = (u32)CWARPS * 32u * 16u * (u32)UNROLL;
  static constexpr u32 bytes = tile * (u32)STAGES;
};

template <int DT, typename L, int CWARPS, int UNROLL, int STAGES, bool ENTROPY>
__global__ void __launch_bounds__((CWARPS + 1) * 32)
    logprob_fwd_bulk(RLK_PARAMS_ARG lp::FwdParams p_) {
#if defined(RLK_HAS_BULK_COPY)
  const void *__restrict__ logits = p_.logits;
  const L *__restrict__ labels = (const L *)p_.labels;
  const i64 row_stride = p_.row_stride, label_stride = p_.label_stride, N = p_.N, V = p_.V,
            ignore_index = p_.ignore_index;
  const float temperature = p_.temperature;
  float *__restrict__ logp = p_.logp, *__restrict__ lse = p_.lse;
  float *__restrict__ entropy = p_.entropy;
  i32 *__restrict__ status = p_.status;
  using namespace lp;
  static_assert(CWARPS >= 1 && CWARPS <= 31 && STAGES >= 2 && STAGES <= 8, "shape");
  constexpr int B = logit_traits<DT>::bytes;
  constexpr int E = epv<DT>::value;
  constexpr int CT = CWARPS * 32;
  constexpr u32 TILE = lp_bulk_smem<CWARPS, UNROLL, STAGES>::tile;
  extern __shared__ __align__(128) u8 lp_ring[];
  __shared__ alignas(8) u64 full[STAGES];
  __shared__ alignas(8) u64 empty[STAGES];
  __shared__ state scratch[2][CWARPS];
  const int warp = (int)(threadIdx.x / 32), lane = (int)(threadIdx.x % 32);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], CWARPS);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == CWARPS) {
    /* producer: one lane walks the same (row, tile) sequence as the consumers */
    if (lane != 0) return;
    u32 it = 0;
    for (i64 row = blockIdx.x; row < N; row += gridDim.x) {
      const u8 *r = (const u8 *)logits + row * row_stride * B;
      const row_split_aligned<DT> sp(r, V);
      const u8 *body = r + sp.head * B;
      const i64 bytes = sp.nvec * 16;
      for (i64 off = 0; off < bytes; off += TILE, ++it) {
        const u32 s = it % STAGES;
        if (it >= (u32)STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1u) & 1u);
        const u32 n = (u32)(bytes - off < (i64)TILE ? bytes - off : (i64)TILE);
        mbar_arrive_expect_tx(&full[s], n);
        bulk_copy_g2s(lp_ring + s * TILE, body + off, n, &full[s]);
      }
    }
    return;
  }

  /* consumers */
  const float c = RLK_LP_LOG2E / temperature;
  const int ct = (int)threadIdx.x;
  u32 it = 0, parity = 0;
  for (i64 row = blockIdx.x; row < N; row += gridDim.x, parity ^= 1u) {
    const u8 *r = (const u8 *)logits + row * row_stride * B;
    state st = empty_state();
    i64 y = 0;
    float xy = 0.0f;
    if (ct == 0) {
      y = load_label(labels, row, label_stride);
      if (y >= 0 && y < V) xy = load_logit<DT>(r, y);
    }
    const row_split_aligned<DT> sp(r, V);
    for (i64 j = ct; j < sp.head; j += CT) add_scalar<ENTROPY>(st, load_logit<DT>(r, j), c);
    const i64 t0 = sp.head + sp.nvec * E;
    for (i64 j = ct; j < sp.tail; j += CT) add_scalar<ENTROPY>(st, load_logit<DT>(r, t0 + j), c);
    const i64 bytes = sp.nvec * 16;
    for (i64 off = 0; off < bytes; off += TILE, ++it) {
      const u32 s = it % STAGES;
      mbar_wait(&full[s], (it / STAGES) & 1u);
      const u32x4 *tile = (const u32x4 *)(lp_ring + s * TILE);
      if (bytes - off >= (i64)TILE) {
        /* a whole tile: into registers, hand the stage back, then compute */
        u32x4 raw[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) raw[u] = tile[ct + u * CT];
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
        add_vectors<DT, UNROLL, ENTROPY>(st, raw, c);
      } else {
        const int nv = (int)((bytes - off) / 16);
        for (int v = ct; v < nv; v += CT) {
          u32x4 raw[1];
          raw[0] = tile[v];
          add_vectors<DT, 1, ENTROPY>(st, raw, c);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
      }
    }
    st = segment_merge<32, ENTROPY>(st, c);
    if (lane == 0) scratch[parity][warp] = st;
    /* scratch[parity] is rewritten two rows later, after every consumer warp (warp 0 included,
     * done reading it) has passed the next row's barrier */
    named_barrier(1, CT);
    if (warp == 0) {
      st = lane < CWARPS ? scratch[parity][lane] : empty_state();
      st = segment_merge<32, ENTROPY>(st, c);
      if (lane == 0)
        write_row<ENTROPY>(st, row, y, xy, V, ignore_index, temperature, logp, lse, entropy, status);
    }
  }
#endif
}

/* Bytes of the ring of logprob_fwd_tma: STAGES stages of NBOX boxes of ROWS x 512 bytes. */
template <int ROWS, int NBOX, int STAGES> struct lp_tma_smem {
  static constexpr u32 stage = (u32)ROWS * 512u * (u32)NBOX;
  static constexpr u32 bytes = stage * (u32)STAGES;
};

/* The tensor map lies in the struct, which is __grid_constant__: the copy engine reads it where
 * it lies in parameter space. */
template <int DT, typename L, int ROWS, int NBOX, int STAGES, bool ENTROPY>
__global__ void __launch_bounds__((ROWS + 1) * 32)
    logprob_fwd_tma(RLK_PARAMS_ARG lp::FwdTmaParams p_) {
#if defined(RLK_HAS_BULK_COPY)
  const void *__restrict__ logits = p_.rows.logits;
  const L *__restrict__ labels = (const L *)p_.rows.labels;
  const i64 row_stride = p_.rows.row_stride, label_stride = p_.rows.label_stride, N = p_.rows.N, V = p_.rows.V,
            ignore_index = p_.rows.ignore_index;
  const float temperature = p_.rows.temperature;
  float *__restrict__ logp = p_.rows.logp, *__restrict__ lse = p_.rows.lse;
  float *__restrict__ entropy = p_.rows.entropy;
  i32 *__restrict__ status = p_.rows.status;
  using namespace lp;
  static_assert(ROWS >= 1 && ROWS <= 31 && STAGES >= 2 && STAGES <= 8 && NBOX >= 1 && NBOX <= 8,
                "shape");
  constexpr int B = logit_traits<DT>::bytes;
  constexpr int E = epv<DT>::value;
  constexpr int BOXC = 512 / B;   /* box columns: 512 bytes, within the 256-element limit */
  constexpr u32 BOXBYTES = 512u * ROWS;
  constexpr u32 STAGE = lp_tma_smem<ROWS, NBOX, STAGES>::stage;
  constexpr i64 TCOLS = (i64)BOXC * NBOX; /* columns per stage */
  extern __shared__ __align__(128) u8 lp_ring[];
  __shared__ alignas(8) u64 full[STAGES];
  __shared__ alignas(8) u64 empty[STAGES];
  const int warp = (int)(threadIdx.x / 32), lane = (int)(threadIdx.x % 32);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], ROWS);
    }
    mbar_init_fence();
  }
  __syncthreads();
  const i64 groups = (N + ROWS - 1) / ROWS;
  const i64 ntiles = (V + TCOLS - 1) / TCOLS;

  if (warp == ROWS) {
    if (lane != 0) return;
    u32 it = 0;
    for (i64 g = blockIdx.x; g < groups; g += gridDim.x)
      for (i64 t = 0; t < ntiles; ++t, ++it) {
        const u32 s = it % STAGES;
        if (it >= (u32)STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1u) & 1u);
        mbar_arrive_expect_tx(&full[s], STAGE);
#pragma unroll
        for (int b = 0; b < NBOX; ++b)
          tma_load_2d(lp_ring + s * STAGE + b * BOXBYTES, &p_.map, (i32)(t * TCOLS + b * BOXC),
                      (i32)(g * ROWS), &full[s]);
      }
    return;
  }

  const float c = RLK_LP_LOG2E / temperature;
  u32 it = 0;
  for (i64 g = blockIdx.x; g < groups; g += gridDim.x) {
    const i64 row = g * ROWS + warp;
    state st = empty_state();
    i64 y = 0;
    float xy = 0.0f;
    if (lane == 0 && row < N) {
      y = load_label(labels, row, label_stride);
      if (y >= 0 && y < V) xy = load_logit<DT>((const u8 *)logits + row * row_stride * B, y);
    }
    for (i64 t = 0; t < ntiles; ++t, ++it) {
      const u32 s = it % STAGES;
      mbar_wait(&full[s], (it / STAGES) & 1u);
      u32x4 raw[NBOX];
#pragma unroll
      for (int b = 0; b < NBOX; ++b)
        raw[b] = *(const u32x4 *)(lp_ring + s * STAGE + b * BOXBYTES + warp * 512 + lane * 16);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
      if ((t + 1) * TCOLS <= V) {
        add_vectors<DT, NBOX, ENTROPY>(st, raw, c);
      } else {
        /* the last stage reaches past V: the zero fill there must not count */
#pragma unroll
        for (int b = 0; b < NBOX; ++b) {
          const i64 col0 = t * TCOLS + b * BOXC + (i64)lane * E;
#define RLK_LP_TMAJ(J)                                                                  \
  if (J < E && col0 + J < V) add_scalar<ENTROPY>(st, element<DT, (J < E ? J : 0)>(raw[b]), c);
          RLK_LP_TMAJ(0) RLK_LP_TMAJ(1) RLK_LP_TMAJ(2) RLK_LP_TMAJ(3)
          RLK_LP_TMAJ(4) RLK_LP_TMAJ(5) RLK_LP_TMAJ(6) RLK_LP_TMAJ(7)
#undef RLK_LP_TMAJ
        }
      }
    }
    st = segment_merge<32, ENTROPY>(st, c);
    if (lane == 0 && row < N)
      write_row<ENTROPY>(st, row, y, xy, V, ignore_index, temperature, logp, lse, entropy, status);
  }
#endif
}

} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_LOGPROB_SM90_CUH */

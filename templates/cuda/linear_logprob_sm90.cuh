/* linear_logprob_sm90.cuh - rlk_linear_logprob's forward on sm_90a: logit tiles of h W^T by wgmma
 * from TMA-filled shared memory, each folded into a record per row in registers (never stored).
 *
 * A block owns 128 rows (tokens) and one vocabulary split (cols_per_split columns, a multiple of
 * 256) and walks the split's 256-column tiles. Warpgroup 0 is the producer: one thread issues the
 * TMA copies of h [128 x 64] and W [256 x 64] boxes (128-byte swizzle) into a ring of STAGES
 * stages (48 KB each), full/empty mbarriers between it and the consumers. Warpgroups 1 and 2 are
 * the consumers: each multiplies its 64 rows by the 256 columns (wgmma m64n256k16, 128 f32
 * accumulators a thread, K in order), then writes each row's record of the tile (ll_tile_record:
 * max, sum of exp, sum of p z, the label's logit) to partials [tile][N] and goes on to the next
 * tile (and, for rlk_linear_sample, stores the tile's raw logits); a consumer whose rows all lie
 * past N multiplies nothing (ll_sm90_tile_pass). A row's records depend on its
 * hidden state and the weight alone: not on the split, the
 * row's place in the tile or the number of rows, so the combine's merge gives a row the same bits
 * in any batch (linear_logprob_plan.h). Registers move from the producer (40) to the consumers
 * (232) with setmaxnreg.
 *
 * Pairs (cluster 2, a launch of few row blocks: rlk_ll_fwd_cluster): the two blocks of a cluster
 * hold consecutive row blocks of one split; each block's producer copies its own h box and the
 * half of each W box at its rank (the W map's boxes are then 128 rows high), multicast into both,
 * so that the pair reads W once where the blocks alone read it twice; a stage is free once the
 * consumers of both blocks handed it back (each arrives on both blocks' empty barriers). The
 * shared-memory layout, the products and so the records are a block alone's, bit for bit. The
 * launch sets the cluster (a launch attribute); the kernel reads it from its arguments.
 *
 * Needs: h and W 16-byte aligned with row strides a multiple of 8 elements (tensor maps), the
 * 128-byte swizzle; the host falls back to linear_logprob_fwd_tiled otherwise. */
#ifndef RLK_LINEAR_LOGPROB_SM90_CUH
#define RLK_LINEAR_LOGPROB_SM90_CUH

#include "hopper_tma.cuh"
#include "linear_logprob_common.cuh"
#include "linear_logprob_sm90_tile.cuh"

#if defined(RLK_CUDA)
namespace rlk {

/* The tensor maps lie in the struct, which is __grid_constant__: TMA reads them where they lie in
 * parameter space. */
template <int DT, typename L, int STAGES, bool ENTROPY>
__global__ void __launch_bounds__(LL_SM90_THREADS, 1)
    linear_logprob_fwd_sm90(RLK_PARAMS_ARG ll::FwdSm90Params p_) {
#if defined(RLK_SM90A_ASM)
  const L *__restrict__ labels = (const L *)p_.pass.labels;
  const i64 label_stride = p_.pass.label_stride, N = p_.pass.N, V = p_.pass.V, H = p_.pass.H,
            cols_per_split = p_.pass.cols_per_split;
  const i64 vocab_start = p_.pass.vocab_start;
  const float temperature = p_.pass.temperature;
  ll::part *__restrict__ partials = (ll::part *)p_.pass.partials;
  static_assert(STAGES >= 2 && STAGES <= 4, "stages: 2..4 (48 KB each)");
  constexpr int BM = ll_sm90::BM, BN = ll_sm90::BN, BK = ll_sm90::BK;
  constexpr u32 ABYTES = ll_sm90::ABYTES, STAGE = ll_sm90::STAGE;
  constexpr int AB = DT == RLK_DT_BF16 ? sm90::WGMMA_BF16 : sm90::WGMMA_F16;
  constexpr u32 CONSUMER_WARPS = 8;
  extern __shared__ __align__(LL_SM90_ALIGN) u8 ll_smem_raw[];
  u8 *smem = (u8 *)(((u64)ll_smem_raw + 1023u) & ~(u64)1023u);
  __shared__ alignas(8) u64 full[STAGES];
  __shared__ alignas(8) u64 empty[STAGES];
  const int wg = (int)(threadIdx.x / 128);
  const i64 row0 = (i64)blockIdx.x * BM;
  const i64 v_begin = (i64)blockIdx.y * cols_per_split;
  const i64 v_end = min_(V, v_begin + cols_per_split);
  const int ntiles = (int)((v_end - v_begin + BN - 1) / BN);
  const int kblocks = (int)((H + BK - 1) / BK);
  const u32 cl = (u32)p_.cluster; /* 1, or 2: pairs sharing each W box */
  if (threadIdx.x == 0) sm90::ring_init<STAGES>(full, empty, CONSUMER_WARPS * cl);
  /* boxes of fewer rows than BM (a launch of at most 64 rows): the rows of every stage's A box
   * that no copy writes, up to the 64 the consumer with rows reads, are zero from here on, as a
   * full box's zero fill past N would make them; then visible to wgmma's reads (async proxy) */
  const u32 hrows = (u32)p_.h_box_rows;
  if (hrows < 64u) {
    for (u32 q = threadIdx.x; q < (u32)STAGES * (64u - hrows) * 8u; q += LL_SM90_THREADS) {
      const u32 s = q / ((64u - hrows) * 8u), e = q % ((64u - hrows) * 8u);
      reinterpret_cast<uint4 *>(smem + s * STAGE + hrows * 128u)[e] = make_uint4(0u, 0u, 0u, 0u);
    }
    sm90::fence_proxy_async();
  }
  if (cl == 1u) {
    __syncthreads();
  } else { /* every block's barriers ready before another's copy or arrival reaches them */
    cluster_arrive();
    cluster_wait();
  }

  if (wg == 0) {
    /* producer */
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      sm90::tma_prefetch_map(&p_.map_h);
      sm90::tma_prefetch_map(&p_.map_w);
      u32 it = 0;
      for (int t = 0; t < ntiles; ++t)
        for (int kb = 0; kb < kblocks; ++kb, ++it) {
          const u32 s = it % STAGES;
          if (it >= (u32)STAGES) sm90::mbar_wait(&empty[s], ((it / STAGES) - 1u) & 1u);
          sm90::mbar_arrive_expect_tx(&full[s], STAGE - ABYTES + hrows * 128u);
          u8 *a = smem + s * STAGE;
          const i32 n0 = (i32)(v_begin + (i64)t * BN);
          sm90::tma_load_2d(a, &p_.map_h, kb * BK, (i32)row0, &full[s]);
          if (cl == 1u) {
            sm90::tma_load_2d(a + ABYTES, &p_.map_w, kb * BK, n0, &full[s]);
          } else {
            const u32 r = cluster_rank();
            sm90::tma_load_2d_multicast(a + ABYTES + r * (ll_sm90::BBYTES / 2u), &p_.map_w, kb * BK,
                                        n0 + (i32)(r * (u32)(BN / 2)), &full[s], (u16)3u);
          }
        }
    }
    if (cl > 1u) { /* no block leaves while the other's copies and arrivals may still reach it */
      cluster_arrive();
      cluster_wait();
    }
    return;
  }

  /* consumers */
  sm90::setmaxnreg_inc<232>();
  const int cw = wg - 1, tw = (int)(threadIdx.x % 128), w = tw / 32, l = tw % 32;
  const float c = RLK_LL_LOG2E / temperature;
  const i64 tile0 = v_begin / BN;
  i64 y[2], row[2];
  float thr[2]; /* kept-set replay: the rows' thresholds (-inf: every logit) */
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row[i] = row0 + cw * 64 + 16 * w + l / 4 + 8 * i;
    /* the label's column in this weight (a shard's: outside [0, V) it owns no column here; none
     * without labels) */
    y[i] = row[i] < N && labels ? ll::load_label(labels, row[i], label_stride) - vocab_start : -1;
    thr[i] = p_.pass.threshold && row[i] < N ? ld_ro(p_.pass.threshold + row[i]) : -limits<float>::infinity();
  }
  float acc[BN / 2];
  u32 it = 0;
  /* a warpgroup whose 64 rows all lie past N (a call of at most 64 rows in its last block) only
   * hands the stages back */
  const bool idle = row0 + cw * 64 >= N;
  for (int t = 0; t < ntiles; ++t) {
    const i64 col0 = v_begin + (i64)t * BN;
    if (idle) {
      ll_sm90_tile_pass(full, empty, l, kblocks, it, STAGES, cl);
      continue;
    }
    ll_sm90_tile_products<STAGES, AB, 0, 0>(acc, full, empty, smem, cw, l, kblocks, it, false, cl);

    /* the last tile: columns past V (zero-filled by the copy) count as -inf; acc is rewritten by
     * the next tile's first product */
    ll_mask_past(acc, V, col0, l);
    if (p_.pass.logits) ll_store_logits(acc, p_.pass.logits, p_.pass.logits_pitch, row, N, col0, V, l);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      /* the label's logit, where it is a column of this tile inside the vocabulary (a shard's
       * label past its end is not) */
      const ll::part rec = ll_tile_record<ENTROPY, false>(acc, i, c, ll_owned_q(y[i] - col0, V - col0, l), thr[i]);
      if ((l & 3) == 0 && row[i] < N) partials[(tile0 + t) * N + row[i]] = rec;
    }
  }
  if (cl > 1u) {
    cluster_arrive();
    cluster_wait();
  }
#else
  (void)p_;
#endif
}

} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_LINEAR_LOGPROB_SM90_CUH */

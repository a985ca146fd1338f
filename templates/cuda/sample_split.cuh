/* sample_split.cuh - unfiltered sampling (temperature, greedy) with each row shared by the S
 * blocks of a thread-block cluster (sm_90 and later), for batches too small to fill the GPU with
 * a block per row.
 *
 * Entry (launched by src/ops/sample.c): rlk::sample_split, one cluster of S blocks per row (rows
 * grid-strided over the clusters), SEG / S threads a block.
 *
 * It is rlk::sample's unfiltered path with the row's lanes spread over S blocks. Block b of a
 * cluster holds lanes [b SEG / S, (b + 1) SEG / S) of the row layout SEG x UNROLL, whole warps. Its
 * threads compute their lanes' states with thread_row_state_deep (thread_row_state's sums, DEPTH
 * chunks in flight: a lane has few chunks and time for nothing else) and each warp merges its
 * lanes (logprob_fwd's first level). After a cluster barrier every block reads the row's NW warp
 * states out of the blocks' shared memory into one warp and merges them in logprob_fwd's second
 * level, so every block holds the row's state bitwise as rlk_logprob computes it. A warp is then
 * drawn by the same weights and the same Philox block as in rlk::sample, and the block that holds
 * it finishes the draw: tokens, logp and logp_filtered are those of one block a row, bit for bit.
 * Greedy rows min-reduce the lowest index of the maximum into block 0's shared memory.
 *
 * Barriers: the cluster barrier is split into arrive and wait. Per row a thread arrives and waits
 * once after the first pass (every block's warp states are in), and arrives again when it is done
 * with the cluster's shared memory; that second wait comes before the next row's writes to it (or
 * before the block exits, so that no block's shared memory goes away while another reads it), or
 * at once on a greedy row, whose block 0 then reads the reduced index. */
#ifndef RLK_SAMPLE_SPLIT_CUH
#define RLK_SAMPLE_SPLIT_CUH

#include "sample.cuh"

#if !defined(RLK_CUDA) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900)
#error "sample_split.cuh needs thread-block clusters (sm_90 and later)"
#endif

namespace rlk {

/* S blocks a row (2, 4 or 8, a portable cluster size), SEG x UNROLL the row layout of the
 * logprob_fwd kernel whose log-probs are reproduced, DEPTH the chunks a lane keeps in flight,
 * ROWS16 as rlk::sample's. */
template <int DT, typename TOK, int SEG, int UNROLL, int S, int DEPTH, bool ROWS16>
__global__ void __cluster_dims__(S, 1, 1) __launch_bounds__(SEG / S)
    sample_split(RLK_SMP_KERNEL_PARAMS) {
  using namespace smp;
  RLK_SMP_UNPACK
  static_assert(S == 2 || S == 4 || S == 8, "S: 2, 4 or 8 blocks a row");
  static_assert((SEG & (SEG - 1)) == 0 && SEG <= RLK_MAX_BLOCK && SEG >= S * RLK_WARP_SIZE,
                "SEG: whole warps in every block");
  constexpr int NT = SEG / S;               /* threads a block */
  constexpr int NW = SEG / RLK_WARP_SIZE;   /* warps of the row layout (at most a warp's lanes) */
  constexpr int WPB = NT / RLK_WARP_SIZE;   /* of them in a block */
  constexpr int BYTES = logit_traits<DT>::bytes;

  __shared__ state scratch[WPB]; /* this block's warp states, read by the cluster */
  __shared__ row_shared sh;      /* the row's settings and draws, from the block's last thread */
  __shared__ row_inputs inputs;  /* that thread's copies of the row's tensor settings */
  __shared__ u32 pick;           /* greedy: the lowest index of the maximum (block 0's counts) */

  const int tid = (int)threadIdx.x;
  const int wid = tid / RLK_WARP_SIZE;
  const int lane = tid % RLK_WARP_SIZE;
  const u32 part = cluster_rank();
  const int t = (int)part * NT + tid; /* the thread's lane of the row layout */
  const int w = (int)part * WPB + wid; /* and its warp */
  const bool filler = tid == NT - 1;
  const u32 pick0 = cluster_map(&pick, 0);
  const i64 clusters = (i64)(gridDim.x / S);
  bool pending = false; /* an arrival at the row's second barrier is not yet waited for */
  /* an overlapping launch (RLK_LAUNCH_OVERLAP) touches no global memory before the stream's
   * previous kernel is done; the next one's blocks may then take whatever room this grid leaves */
  grid_dependency_wait();
  grid_dependents_launch();

  for (i64 row = (i64)(blockIdx.x / S); row < B; row += clusters) {
    const float t_row = temperatures ? temperatures[row] : temperature;
    const bool greedy = t_row == 0.0f;
    const float T = greedy ? 1.0f : t_row;
    const float c = RLK_LP_LOG2E / T;
    const u8 *r = (const u8 *)logits + row * row_stride * BYTES;
    if (filler) row_inputs_fetch(&inputs, row, top_ks32, top_ks64, top_ps, min_ps, seeds, offsets);

    /* ---- pass 1: this block's lanes, and their warps' butterflies ---- */
    const state own = thread_row_state_deep<DT, SEG, UNROLL, DEPTH, false, ROWS16>(r, V, c, t);
    const state wst = segment_merge<RLK_WARP_SIZE, false>(own, c);
    if (pending) cluster_wait(); /* the cluster is done with the previous row's shared state */
    if (lane == 0) scratch[wid] = wst;
    if (part == 0 && tid == 0) pick = 0xffffffffu;
    if (filler)
      row_shared_fill(&sh, &inputs, t_row, row, top_ks32, top_ks64, top_k, top_ps, top_p, min_ps, min_p, seeds,
                      seed, offsets, offset, true);
    cluster_arrive();
    cluster_wait(); /* every block's warp states are in */

    const row_settings rs = sh.rs;
    const u64 R1 = sh.R1, R2 = sh.R2;
    const bool bad = settings_bad(rs);
    const bool plain = !greedy && !bad;
    /* as in rlk::sample: each warp draws its lane and starts loading that share */
    share_pick<DT, SEG, ROWS16> drawn;
    if (plain) draw_lane(drawn, own, wst, c, R1, r, V, w);
    /* logprob_fwd's second level, over the warp states of the whole cluster */
    state ws = empty_state();
    if (lane < NW) {
      const state &from = scratch[lane % WPB];
      ws.m = cluster_load_f32(cluster_map(&from.m, (u32)(lane / WPB)));
      ws.s = cluster_load_f32(cluster_map(&from.s, (u32)(lane / WPB)));
    }
    const state rst = segment_merge<RLK_WARP_SIZE, false>(ws, c);
    const float M = rst.m;
    const bool fail = bad || !(rst.s > 0.0f); /* s NaN: a NaN or +inf logit; 0: no finite logit */
    if (greedy && !fail && own.m == M)
      visit_lane<DT, SEG, UNROLL, ROWS16>(r, V, t, [&](float x, i64 j) {
        if (x == M) cluster_atomic_min_u32(pick0, (u32)j);
      });
    cluster_arrive(); /* done with the cluster's shared memory for this row */
    pending = true;

    if (fail) { /* row-uniform, as greedy is: every block read the same settings and states */
      if (part == 0 && tid == 0) write_no_token(row, bad, rst.s, tokens, logp, logp_filtered, threshold, status);
      continue;
    }
    if (greedy) {
      cluster_wait(); /* every block's index is in block 0's `pick` */
      pending = false;
      if (part == 0 && tid == 0) {
        const u32 y = pick;
        tokens[row] = (TOK)y;
        if (logp) logp[row] = row_logp(rst, M, logf(rst.s), T);
        if (logp_filtered) logp_filtered[row] = 0.0f;
        if (threshold) threshold[row] = M; /* the kept set: the maximum's ties */
      }
      continue;
    }

    /* plain: the warp by its weight, then the element of its drawn lane's share */
    if (w != draw_warp<NW>(ws, M, c, R1)) continue;
    finish_unfiltered(drawn, rst, c, T, R2, r, row, tokens, logp, logp_filtered, threshold);
  }
  if (pending) cluster_wait(); /* no block leaves while another may still read its shared memory */
}

} /* namespace rlk */

#endif /* RLK_SAMPLE_SPLIT_CUH */

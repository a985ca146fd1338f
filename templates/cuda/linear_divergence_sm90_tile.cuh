/* linear_divergence_sm90_tile.cuh - what rlk_linear_divergence's sm_90a kernels share (the
 * forward's passes, linear_divergence_sm90.cuh; the backward's dz, linear_divergence_bwd_sm90.cuh):
 * a tile of both heads' logits for the same rows and columns by TMA + wgmma, the accumulators in
 * registers, never stored.
 *
 * The tile: 128 rows x 128 columns of each head. A block is one producer warpgroup (one thread
 * issues the TMA copies) and two consumer warpgroups; consumer cw multiplies rows [64 cw, 64 cw +
 * 64) by the tile's 128 columns, first the student's K steps (K = H_s) into acc_s, then the
 * teacher's (K = H_t) into acc_t (wgmma m64n128k16, 64 f32 accumulators a thread each), and then
 * folds both sets column by column: the divergences need z_s and z_t of the same (row, column)
 * together (G_t = sum e^(z_t - m_t) (z_t - z_s), log m of JSD, each dz).
 *
 * Why this shape:
 *   registers   two accumulator sets of 64 = 128 a consumer thread, the two rows' running state
 *               (7 floats each), the fold's temporaries and addresses within setmaxnreg's 232
 *               (producer 40: 128 x 40 + 256 x 232 = 64512 of the 65536). The fused head's 128 x 256
 *               tile would take 2 x 128 accumulators, more than a thread can hold.
 *   shared      a stage is one head's K step: A's box (128 rows x 64 K, 16 KB) then B's (128 x 64,
 *               16 KB), both with the 128-byte swizzle; STAGES = 6 stages, 192 KB; the backward's dz
 *               adds 32 KB of staging (each consumer's 64 x 128 16-bit tile, two 64 x 64 boxes):
 *               225 KB with the 1 KB alignment, within the 227 KB a block may have.
 *   cooperative both consumers read one stage (one B box for 128 rows), so a tile moves
 *               2 (128 + 128) H 2 bytes from L2 for 2 x 2 x 128 x 128 H FLOP (64 FLOP a byte; the
 *               fused head's 128 x 256 tile: 85). Ping-pong consumers, each on its own 64 x 128
 *               tile of both heads, would need the same 128 accumulators, read twice the operand
 *               bytes for the same products (43 FLOP a byte) and two rings' worth of stages; what
 *               they would hide is the fold, which here is 3-5% of a tile: at H 4096 the products
 *               take 2 x 2 x 128 x 128 x 4096 FLOP = 65536 cycles of an SM's tensor cores (4096
 *               dense bf16 FLOP a cycle), the fold two MUFU.EX2 a (row, column) = 2048 cycles at 16
 *               a cycle and about twelve FP32 operations = 1536 cycles at 128 a cycle, partly
 *               beside each other. As in the fused head's forward, the fold is not overlapped with
 *               the products; the producer keeps loading the next tile's stages meanwhile.
 *   order       the ring runs on from tile to tile and from head to head: the producer walks a
 *               tile's student steps, then its teacher steps, then the next tile's; a consumer
 *               hands a stage back as soon as the products reading it are done (one wgmma group
 *               in flight behind the newest), so that the two heads' products follow each other
 *               without draining the tensor cores.
 *
 * Parts of a box outside a tensor are zero-filled (rows past N, columns past V, K past H): their
 * logits are 0 and the kernels leave them out (columns) or do not write them (rows). */
#ifndef RLK_LINEAR_DIVERGENCE_SM90_TILE_CUH
#define RLK_LINEAR_DIVERGENCE_SM90_TILE_CUH

#include "linear_divergence_common.cuh"
#include "linear_logprob_bwd_sm90.cuh"

#if defined(RLK_CUDA)
namespace rlk {

/* Tile and ring (linear_divergence_params.h declares them for the op's launch shapes and shared
 * memory too). */
struct ld_sm90 {
  static constexpr int BM = LD_SM90_BM, BN = LD_SM90_BN, BK = LD_SM90_BK, THREADS = LD_SM90_THREADS;
  static constexpr int STAGES = LD_SM90_STAGES;
  static constexpr u32 ABYTES = (u32)BM * BK * 2, BBYTES = (u32)BN * BK * 2, STAGE = ABYTES + BBYTES;
  static_assert(STAGE == LD_SM90_STAGE_BYTES, "a stage: the 16-bit A and B boxes of one K step");
  static constexpr u32 STAGING = LD_SM90_STAGING_BYTES; /* dz: two consumers x two 64 x 64 16-bit boxes */
  static constexpr int ACC = BN / 2;                   /* accumulators a thread a head */
};

template <int DT> struct ld_wgmma_type {
  static constexpr int AB = DT == RLK_DT_BF16 ? sm90::WGMMA_BF16 : sm90::WGMMA_F16;
};

/* The block's dynamic shared memory from its first 1024-byte boundary, which the ring's swizzled
 * boxes need (the launch asks for LD_SM90_ALIGN bytes more than they take). */
RLK_DEVICE u8 *ld_sm90_smem() {
  extern __shared__ __align__(LD_SM90_ALIGN) u8 ld_smem_raw[];
  return (u8 *)(((u64)ld_smem_raw + 1023u) & ~(u64)1023u);
}

/* A block's start: its ring's barriers (two consumer warpgroups release a stage: 8 warps; in a
 * cluster of CL blocks that share their B boxes, the consumers of every block of the cluster),
 * ready for every thread (CL > 1: of every block of the cluster, before any copy or arrival of
 * another block reaches them). */
template <int CL = 1> RLK_DEVICE void ld_sm90_ring_start(u64 *full, u64 *empty) {
  if (threadIdx.x == 0) sm90::ring_init<ld_sm90::STAGES>(full, empty, 8 * CL);
  if (CL == 1) {
    __syncthreads();
  } else {
    cluster_arrive();
    cluster_wait();
  }
}

/* Hands a stage back (one consumer warp's arrival): to this block's producer, or in a cluster of
 * CL blocks whose producers each multicast part of the B box into all of them, to every block's. */
template <int CL> RLK_DEVICE void ld_sm90_release(u64 *empty) {
  if (CL == 1) {
    sm90::mbar_arrive(empty);
  } else {
#pragma unroll
    for (u32 r = 0; r < (u32)CL; ++r) sm90::mbar_arrive_cluster(empty, r);
  }
}

/* The K steps of a head of width H. */
RLK_DEVICE int ld_sm90_ksteps(i64 H) { return (int)((H + ld_sm90::BK - 1) / ld_sm90::BK); }

/* The heads' tensor maps into the copy engine's descriptor cache (the producer's thread, once). */
RLK_DEVICE void ld_sm90_prefetch_heads(const tensor_map *hs, const tensor_map *ws, const tensor_map *ht,
                                       const tensor_map *wt) {
  sm90::tma_prefetch_map(hs);
  sm90::tma_prefetch_map(ws);
  sm90::tma_prefetch_map(ht);
  sm90::tma_prefetch_map(wt);
}

/* The producer's copies of one tile: the student's K steps (h_s rows from m0, W_s rows from n0),
 * then the teacher's, each a stage (A's box, then B's) at ring positions it, it + 1, ... In a
 * cluster of CL blocks (the same columns, CL row blocks) each block copies its own A box and the
 * 1 / CL of the B box at its rank (the W maps' boxes are BN / CL rows high) into every block of
 * the cluster, so that the cluster reads each B box once; a block's stage still receives STAGE
 * bytes. */
template <int CL = 1>
RLK_DEVICE void ld_sm90_load_tile(const tensor_map *hs, const tensor_map *ws, const tensor_map *ht,
                                  const tensor_map *wt, u64 *full, u64 *empty, u8 *smem, i32 m0, i32 n0, int kbs,
                                  int kbt, u32 &it) {
  typedef ld_sm90 C;
#pragma unroll 1
  for (int side = 0; side < 2; ++side) {
    const tensor_map *ma = side ? ht : hs, *mb = side ? wt : ws;
    const int kblocks = side ? kbt : kbs;
#pragma unroll 1
    for (int kb = 0; kb < kblocks; ++kb, ++it) {
      const u32 s = it % C::STAGES;
      if (it >= (u32)C::STAGES) sm90::mbar_wait(&empty[s], ((it / C::STAGES) - 1u) & 1u);
      sm90::mbar_arrive_expect_tx(&full[s], C::STAGE);
      u8 *a = smem + s * C::STAGE;
      sm90::tma_load_2d(a, ma, kb * C::BK, m0, &full[s]);
      if (CL == 1) {
        sm90::tma_load_2d(a + C::ABYTES, mb, kb * C::BK, n0, &full[s]);
      } else {
        const u32 r = cluster_rank(), part = C::BBYTES / (u32)CL;
        sm90::tma_load_2d_multicast(a + C::ABYTES + r * part, mb, kb * C::BK, n0 + (i32)(r * (u32)(C::BN / CL)),
                                    &full[s], (u16)((1u << CL) - 1u));
      }
    }
  }
}

/* One head's K steps of a tile for consumer warpgroup cw (lane l of its warp): acc = A B^T over
 * ring positions it, it + 1, ... (it advances past them). The first product overwrites acc
 * (scale-d 0). Each stage goes back to the producer once the products reading it are done; with
 * `pending` the stage before `it` (the other head's last) is still being read and goes back after
 * this head's first step. The last stage stays with the caller (ld_sm90_tile_done). */
template <int AB, int CL = 1>
RLK_DEVICE void ld_sm90_head(float (&acc)[ld_sm90::ACC], u64 *full, u64 *empty, const u8 *smem, int cw, int l,
                             int kblocks, u32 &it, bool pending) {
  typedef ld_sm90 C;
#pragma unroll 1
  for (int kb = 0; kb < kblocks; ++kb, ++it) {
    const u32 s = it % C::STAGES;
    sm90::mbar_wait(&full[s], (it / C::STAGES) & 1u);
    const u8 *a = smem + s * C::STAGE, *b = a + C::ABYTES;
    const u64 da = sm90::smem_desc(a + cw * 64 * 128, sm90::SWIZZLE_128B, 0, 1024);
    const u64 db = sm90::smem_desc(b, sm90::SWIZZLE_128B, 0, 1024);
    sm90::wgmma_fence();
#pragma unroll
    for (int k = 0; k < C::BK / 16; ++k)
      sm90::wgmma<C::BN>::template ss<AB, 0, 0>(acc, sm90::desc_advance(da, 32u * k), sm90::desc_advance(db, 32u * k),
                                                (kb > 0 || k > 0) ? 1u : 0u);
    sm90::wgmma_commit();
    if (kb > 0 || pending) {
      /* the previous stage's products are done: hand it back */
      sm90::wgmma_wait<1>();
      if (l == 0) ld_sm90_release<CL>(&empty[(it - 1u) % C::STAGES]);
    }
  }
}

/* Both heads' products of a tile into acc_s and acc_t: at the end both are complete and every
 * stage the tile read is back with the producer. */
template <int SDT, int TDT, int CL = 1>
RLK_DEVICE void ld_sm90_tile_products(float (&acc_s)[ld_sm90::ACC], float (&acc_t)[ld_sm90::ACC], u64 *full,
                                      u64 *empty, const u8 *smem, int cw, int l, int kbs, int kbt, u32 &it) {
  ld_sm90_head<ld_wgmma_type<SDT>::AB, CL>(acc_s, full, empty, smem, cw, l, kbs, it, false);
  ld_sm90_head<ld_wgmma_type<TDT>::AB, CL>(acc_t, full, empty, smem, cw, l, kbt, it, true);
  sm90::wgmma_wait<0>();
  if (l == 0) ld_sm90_release<CL>(&empty[(it - 1u) % ld_sm90::STAGES]);
  sm90::wgmma_fence_operands(acc_s);
  sm90::wgmma_fence_operands(acc_t);
}

/* A consumer thread's share of the tile: for its rows i = 0, 1 (16 w + l / 4 + 8 i of the
 * consumer's 64) the columns 8 j + 2 (l % 4) + e in acc[4 j + 2 i + e]; q = 2 j + e numbers a
 * row's 32. */
RLK_DEVICE int ld_sm90_col(int q, int l) { return 8 * (q >> 1) + 2 * (l % 4) + (q & 1); }
RLK_DEVICE int ld_sm90_acc(int i, int q) { return 4 * (q >> 1) + 2 * i + (q & 1); }

/* Row i's scaled logits of both heads (c: log2(e) / T a side) and which columns lie inside
 * [0, left) of the tile: every one where WHOLE (all but a split's or a chunk's last tile). */
template <bool WHOLE>
RLK_DEVICE void ld_sm90_row(const float (&acc_s)[ld_sm90::ACC], const float (&acc_t)[ld_sm90::ACC], int i, float cs,
                            float ct, i64 left, int l, float (&ys)[ld_sm90::ACC / 2], float (&yt)[ld_sm90::ACC / 2],
                            bool (&ok)[ld_sm90::ACC / 2]) {
#pragma unroll
  for (int q = 0; q < ld_sm90::ACC / 2; ++q) {
    ys[q] = acc_s[ld_sm90_acc(i, q)] * cs;
    yt[q] = acc_t[ld_sm90_acc(i, q)] * ct;
    ok[q] = WHOLE || ld_sm90_col(q, l) < left;
  }
}

} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_LINEAR_DIVERGENCE_SM90_TILE_CUH */

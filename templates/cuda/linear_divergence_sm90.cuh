/* linear_divergence_sm90.cuh - rlk_linear_divergence's forward on sm_90a: both heads' logit tiles
 * by TMA + wgmma (linear_divergence_sm90_tile.cuh), folded in registers into the records of
 * linear_divergence_fwd_tiled (the same layout: the combines of linear_divergence.cuh merge them).
 *
 *   KIND 0  a row's state over a split (ld::fold: both maxima and sums of exponentials, the
 *           student's sum of p z, the cross sums G_t and G_s), written as rlk.h's record
 *           [splits][N][8]
 *   KIND 1  the same and the split's top_k largest teacher logits z_t = x_t / T_t (value, column),
 *           the lists [splits][N][top_k] of linear_divergence_topk (values already divided by T_t:
 *           linear_divergence_bwd_dz_sm90's membership test compares the same products)
 *   KIND 2  JSD's second pass (the lse's from stats): a row's {A, B} over the split, [splits][N]
 *
 * A block owns 128 rows and one vocabulary split (cols_per_split columns, a multiple of 256) and
 * walks the split's 128-column tiles; the blocks' index is mapped to (row block, split) in groups
 * of `group` row blocks, split-major inside a group, so that the blocks resident together share
 * their h panels and W tiles in L2 (at N 8192, H 4096, 33 splits and a group of 8: the 132 blocks
 * of a wave read 8 row blocks' h and 17 splits' W, about 49 MB, where the plain order would read
 * all 64 row blocks' h for two splits, 132 MB, each tile's time over). A consumer thread keeps
 * its two rows' state (or A and B) across the tiles; at the split's end the four lanes of a row
 * merge by a fixed butterfly and one writes the record. Bitwise repeatable: fixed orders
 * everywhere, the splits merged in order by the combine.
 *
 * Clusters (CL 2 or 4, linear_divergence_params.h; 1: a block alone): a cluster is the row blocks
 * CL c .. CL c + CL - 1 of one split (the tile order's groups hold a multiple of CL row blocks, so
 * consecutive blocks map to them); each block's producer copies its own h boxes and the 1 / CL of
 * each W box at its rank, multicast into all of them, and a stage is free when the consumers of
 * every block have handed it back (each arrives on every block's empty barrier). The products,
 * the shared-memory layout and so the records are those of a block alone, bit for bit; a block of
 * no rows (past N) multiplies zeros and writes nothing, as the others need its part of the W
 * boxes. The launch sets the cluster (a launch attribute, not __cluster_dims__: a kernel compiled
 * with cluster dimensions is a cluster launch even of one block, which ran 1.3x slower at 1000
 * rows).
 *
 * Needs: each head's hidden and weight 16-byte aligned with row strides a multiple of 8 elements
 * (tensor maps of 64 x 128 boxes, the 128-byte swizzle); the op falls back to
 * linear_divergence_fwd_tiled otherwise.
 *
 * Top-k: a row's top_k entries lie in shared memory past the ring as a heap whose root is the
 * entry that comes last (entry j of the block's row r at [j][r]: a warp's eight rows side by
 * side, no bank conflicts); each tile, the four lanes of a row compare their 32 columns with the
 * root (kept in registers) and, one lane after another, put what comes before it in the root's
 * place and sift it down (log2 top_k steps). After a split's first tiles that is rare (about
 * top_k ln(columns / top_k) insertions a row in all), and a warp with none skips the step. At the
 * split's end the heap is sorted into the list linear_divergence_topk reads. The entries are the
 * split's top_k by the order (value, then the lower column): the same set in any insertion
 * order. */
#ifndef RLK_LINEAR_DIVERGENCE_SM90_CUH
#define RLK_LINEAR_DIVERGENCE_SM90_CUH

#include "linear_divergence.cuh"
#include "linear_divergence_sm90_tile.cuh"

#if defined(RLK_CUDA)
namespace rlk {

/* A consumer thread's fold of one tile into its two rows' state (KIND 0) or sums (KIND 2); WHOLE:
 * every column of the tile is inside the split. */
template <int KIND, bool WHOLE>
RLK_DEVICE void ld_sm90_fold(const float (&acc_s)[ld_sm90::ACC], const float (&acc_t)[ld_sm90::ACC],
                             ld::state (&st)[2], float (&A)[2], float (&B)[2], const float (&Ls)[2],
                             const float (&Lt)[2], float cs, float ct, float la, float lb, i64 left, int l) {
  constexpr int NV = ld_sm90::ACC / 2;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float ys[NV], yt[NV];
    bool ok[NV];
    ld_sm90_row<WHOLE>(acc_s, acc_t, i, cs, ct, left, l, ys, yt, ok);
    if (KIND == LD_KIND_JSD)
      ld::jsd_fold<NV>(&A[i], &B[i], ys, yt, ok, Ls[i], Lt[i], la, lb);
    else
      ld::fold<NV>(st[i], ys, yt, ok);
  }
}

/* Top-k: z placed at node i of a heap of n entries (entry j at L[j BM]) whose every parent comes
 * after its children in the top-k order: the children that come after z move up. */
RLK_DEVICE void ld_sm90_heap_sift(ld::cand *L, int n, int i, ld::cand z) {
  constexpr int BM = ld_sm90::BM;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= n) break;
    ld::cand w = L[c * BM];
    if (c + 1 < n) {
      const ld::cand w2 = L[(c + 1) * BM];
      if (ld::before(w.x, w.col, w2.x, w2.col)) w = w2, ++c; /* the child that comes last */
    }
    if (!ld::before(z.x, z.col, w.x, w.col)) break;
    L[i * BM] = w;
    i = c;
  }
  L[i * BM] = z;
}

/* Top-k: one tile's teacher logits into the heaps of a consumer thread's two rows (row i's entry
 * j at list[j BM + 8 i], its root last[i]): z = x_t / T_t (it_ = 1 / T_t) at column col0 + its
 * tile column, those of the tile's first `left` columns that come before the root. A warp none of
 * whose lanes' largest x_t reaches its roots goes on at once (the common case once a split's
 * first tiles are in: a max a value). Otherwise a bit a column marks the candidates (z at least
 * the root's; the insertion tells ties by the column; the compares unrolled: acc stays in
 * registers), and the four lanes of a row insert theirs one lane after another (the warp's eight
 * rows at once), each candidate's value picked by its bit (one copy of the insertion, not one a
 * column: the code stays small). */
RLK_DEVICE void ld_sm90_topk_tile(const float (&acc_t)[ld_sm90::ACC], ld::cand *list, ld::cand (&last)[2], int k,
                                  float it_, i32 col0, i64 left, int l) {
  constexpr int NV = ld_sm90::ACC / 2;
  bool reach = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    /* the largest x_t of the lane's columns (those past `left` too: a superset) */
    float mx = acc_t[ld_sm90_acc(i, 0)];
#pragma unroll
    for (int q = 1; q < NV; ++q) mx = fmaxf(mx, acc_t[ld_sm90_acc(i, q)]);
    reach |= mx * it_ >= last[i].x;
  }
  if (!__any_sync(0xffffffffu, reach)) return;
  u32 marks[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int q = 0; q < NV; ++q)
      if (ld_sm90_col(q, l) < left && acc_t[ld_sm90_acc(i, q)] * it_ >= last[i].x) marks[i] |= 1u << q;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    ld::cand *L = list + 8 * i;
#pragma unroll 1
    for (int lane = 0; lane < 4; ++lane) {
      if ((l & 3) == lane) {
        for (u32 m = marks[i]; m != 0u; m &= m - 1u) {
          const int q = __ffs((int)m) - 1;
          float x = 0.0f;
#pragma unroll
          for (int p = 0; p < NV; ++p) x = p == q ? acc_t[ld_sm90_acc(i, p)] : x;
          const float z = x * it_;
          const i32 col = col0 + ld_sm90_col(q, l);
          if (!ld::before(z, col, last[i].x, last[i].col)) continue; /* the root rose past it meanwhile */
          ld::cand c;
          c.x = z;
          c.col = col;
          ld_sm90_heap_sift(L, k, 0, c);
          last[i] = L[0];
        }
      }
      __syncwarp();
      last[i] = L[0];
    }
  }
}

/* The tensor maps lie in the struct, which is __grid_constant__: TMA reads them in parameter
 * space. */
template <int SDT, int TDT, int KIND, int CL>
__global__ void __launch_bounds__(LD_SM90_THREADS, 1)
    linear_divergence_fwd_sm90(RLK_PARAMS_ARG ld::FwdSm90Params p_) {
#if defined(RLK_SM90A_ASM)
  static_assert(KIND == LD_KIND_STATS || KIND == LD_KIND_TOPK || KIND == LD_KIND_JSD, "fwd_sm90: a kind");
  static_assert(CL == 1 || CL == 2 || CL == LD_SM90_FWD_CLUSTER_MAX, "fwd_sm90: clusters of 1, 2 or 4 row blocks");
  typedef ld_sm90 C;
  constexpr int BM = C::BM, BN = C::BN;
  u8 *smem = ld_sm90_smem();
  __shared__ alignas(8) u64 full[C::STAGES];
  __shared__ alignas(8) u64 empty[C::STAGES];
  const i64 N = p_.N, V = p_.V, cols_per_split = p_.cols_per_split;
  int rb, sp;
  ll_bwd_tile((int)blockIdx.x, p_.tiles_m, p_.tiles_n, p_.group, &rb, &sp);
  const i64 row0 = (i64)rb * BM, v_begin = (i64)sp * cols_per_split, v_end = min_(V, v_begin + cols_per_split);
  const int ntiles = (int)((v_end - v_begin + BN - 1) / BN);
  const int kbs = ld_sm90_ksteps(p_.Hs), kbt = ld_sm90_ksteps(p_.Ht), wg = (int)(threadIdx.x / 128);
  ld_sm90_ring_start<CL>(full, empty);

  if (wg == 0) {
    /* producer */
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      ld_sm90_prefetch_heads(&p_.map_hs, &p_.map_ws, &p_.map_ht, &p_.map_wt);
      u32 it = 0;
#pragma unroll 1
      for (int t = 0; t < ntiles; ++t)
        ld_sm90_load_tile<CL>(&p_.map_hs, &p_.map_ws, &p_.map_ht, &p_.map_wt, full, empty, smem, (i32)row0,
                              (i32)(v_begin + (i64)t * BN), kbs, kbt, it);
    }
    if (CL > 1) { /* no block leaves while another's copies and arrivals may still reach it */
      cluster_arrive();
      cluster_wait();
    }
    return;
  }

  /* consumers */
  sm90::setmaxnreg_inc<232>();
  const int cw = wg - 1, tw = (int)(threadIdx.x % 128), w = tw / 32, l = tw % 32;
  const float cs = RLK_LL_LOG2E / p_.s_temperature, ct = RLK_LL_LOG2E / p_.t_temperature;
  ld::state st[2];
  float A[2], B[2], Ls[2], Lt[2];
  i64 row[2];
  /* JSD: log2(1 - beta) and log2(beta), the mixture's weights, and the row's lse's (log2 units) */
  const float la = KIND == LD_KIND_JSD ? ld::log2_approx((float)(1.0 - p_.beta)) : 0.0f;
  const float lb = KIND == LD_KIND_JSD ? ld::log2_approx((float)p_.beta) : 0.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    st[i] = ld::empty_state();
    A[i] = B[i] = Ls[i] = Lt[i] = 0.0f;
    row[i] = row0 + cw * 64 + 16 * w + l / 4 + 8 * i;
    if (KIND == LD_KIND_JSD && row[i] < N) {
      Ls[i] = p_.stats[row[i] * 6 + 0] * RLK_LL_LOG2E;
      Lt[i] = p_.stats[row[i] * 6 + 1] * RLK_LL_LOG2E;
    }
  }
  /* top-k: the rows' heaps past the ring, [top_k][128]; each heap's root in registers */
  const int k = KIND == LD_KIND_TOPK ? (int)p_.top_k : 0;
  ld::cand *lists = (ld::cand *)(smem + (u32)C::STAGES * C::STAGE), last[2];
  if (KIND == LD_KIND_TOPK) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      last[i].x = -limits<float>::infinity();
      last[i].col = -1;
      if ((l & 3) == 0)
        for (int j = 0; j < k; ++j) lists[j * BM + cw * 64 + 16 * w + l / 4 + 8 * i] = last[i];
    }
    __syncwarp();
  }
  const float it_ = 1.0f / p_.t_temperature;
  float acc_s[C::ACC], acc_t[C::ACC];
  u32 it = 0;
#pragma unroll 1
  for (int t = 0; t < ntiles; ++t) {
    const i64 col0 = v_begin + (i64)t * BN, left = v_end - col0;
    ld_sm90_tile_products<SDT, TDT, CL>(acc_s, acc_t, full, empty, smem, cw, l, kbs, kbt, it);
    if (col0 + BN <= v_end)
      ld_sm90_fold<KIND, true>(acc_s, acc_t, st, A, B, Ls, Lt, cs, ct, la, lb, left, l);
    else
      ld_sm90_fold<KIND, false>(acc_s, acc_t, st, A, B, Ls, Lt, cs, ct, la, lb, left, l);
    if (KIND == LD_KIND_TOPK)
      ld_sm90_topk_tile(acc_t, lists + cw * 64 + 16 * w + l / 4, last, k, it_, (i32)col0, left, l);
  }
  if (KIND == LD_KIND_TOPK) {
    /* each heap sorted in place into its list (the root, the entry that comes last, to the end
     * each step) */
    if ((l & 3) == 0)
      for (int i = 0; i < 2; ++i) {
        ld::cand *L = lists + cw * 64 + 16 * w + l / 4 + 8 * i;
        for (int e = k - 1; e > 0; --e) {
          const ld::cand r = L[0];
          ld_sm90_heap_sift(L, e, 0, L[e * BM]);
          L[e * BM] = r;
        }
      }
    __syncwarp();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (KIND == LD_KIND_JSD) {
      float a = A[i], b = B[i];
      a += shfl_xor(a, 1);
      b += shfl_xor(b, 1);
      a += shfl_xor(a, 2);
      b += shfl_xor(b, 2);
      if ((l & 3) == 0 && row[i] < N) {
        f32x4 o;
        o.x = a * RLK_LL_LN2;
        o.y = b * RLK_LL_LN2;
        o.z = o.w = 0.0f;
        ((f32x4 *)p_.partials)[(i64)sp * N + row[i]] = o;
      }
    } else {
      const ld::state s = ld::lane_merge<4>(st[i]);
      if ((l & 3) == 0 && row[i] < N) ld::store_record((float *)p_.partials + ((i64)sp * N + row[i]) * 8, s);
      if (KIND == LD_KIND_TOPK && row[i] < N) {
        /* the row's four lanes copy its list out */
        const ld::cand *src = lists + cw * 64 + 16 * w + l / 4 + 8 * i;
        ld::cand *out = (ld::cand *)p_.lists + ((i64)sp * N + row[i]) * k;
        for (int j = l & 3; j < k; j += 4) out[j] = src[j * BM];
      }
    }
  }
  if (CL > 1) {
    cluster_arrive();
    cluster_wait();
  }
#else
  (void)p_;
#endif
}

} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_LINEAR_DIVERGENCE_SM90_CUH */

/* linear_divergence_bwd_sm90.cuh - rlk_linear_divergence_backward on sm_90a. The host walks the
 * vocabulary in chunks of Vc columns (a multiple of 256), in order; for each chunk:
 *
 *   linear_divergence_bwd_dz_sm90  both heads' logits of the chunk recomputed by the forward's
 *                     tiles (linear_divergence_sm90_tile.cuh: 128 x 128 a head, TMA + wgmma), each
 *                     element's dz of the sides asked for (rlk.h's forms from the forward's stats,
 *                     ld::dz_of, times g / T), written in the head's 16-bit dtype: a consumer's
 *                     64 x 128 tile of a side goes through 16 KB of shared staging as two 64 x 64
 *                     boxes and leaves by TMA stores (the fused head's ll_b16_half), which drain
 *                     while the next tile's products run. Blocks are persistent (one a
 *                     multiprocessor): block b computes tiles b, b + gridDim.x, ... of the chunk's
 *                     tiles_m x tiles_n, in groups of `group` rows of tiles (ll_bwd_tile), the ring
 *                     running on from tile to tile. The rows' inputs (stats, g, the label) are
 *                     read before a tile's products. As the forward, pairs of blocks may share
 *                     each W box (CL = LD_SM90_DZ_CLUSTER, linear_divergence_sm90.cuh): then
 *                     tiles_m and the grid are even, so blocks 2c and 2c + 1 take the tiles t and
 *                     t + 1, two row blocks of the same columns, tile after tile.
 *
 * then, per side, the fused head's sm_90a products over dz (linear_logprob_bwd_sm90.cuh,
 * instantiated from this source): its dh kind (the f32 grad_hidden sum (+)= dz W_c) and dw kind
 * (grad_weight's rows of the chunk = dz^T h), and for a 16-bit grad_hidden at the end
 * linear_logprob_bwd_dh_out. dz in 16 bits is what a bf16 autograd graph keeps of the logits'
 * gradient (the fused head's sm_90a backward does the same): each term of a gradient's sum carries
 * that rounding, at most half an ulp of dz. Every output element is written by one block, its K
 * sum in a fixed order, the chunks in order: bitwise repeatable. Top-k: a column is in the set
 * when its z_t = x_t / T_t comes before the set's last member (stats [4], [5]) in the top-k order;
 * x_t is recomputed by the forward's own tile products (linear_divergence_fwd_sm90, whose lists
 * hold the same z_t), so the set is the forward's to the bit. */
#ifndef RLK_LINEAR_DIVERGENCE_BWD_SM90_CUH
#define RLK_LINEAR_DIVERGENCE_BWD_SM90_CUH

#include "linear_divergence_sm90_tile.cuh"

#if defined(RLK_CUDA)
namespace rlk {

/* What dz's epilogue needs of a row, read before the tile's products. */
struct ld_dz_row {
  float ls, lt, D, a1, a2; /* the stats: lse's, D and the mode's auxiliaries */
  float ks, kt;            /* g / T of each side */
  i64 last;                /* top-k: the set's last member's column in the weights */
  bool ign;                /* ignored, or past the last row: dz 0 */
};

template <int LAB> RLK_DEVICE ld_dz_row ld_dz_row_inputs(const ld::BwdDzSm90Params &p_, i64 r) {
  ld_dz_row d;
  d.ls = d.lt = d.D = d.a1 = d.a2 = d.ks = d.kt = 0.0f;
  d.last = -1;
  d.ign = true;
  if (r >= p_.N) return d;
  d.ign = ld::ignored<LAB>(p_.labels, p_.label_stride, r, p_.ignore_index);
  const float *s = p_.stats + r * p_.stats_stride;
  d.ls = s[0], d.lt = s[1], d.D = s[2], d.a1 = s[3], d.a2 = s[4];
  d.last = (i64)s[5] - p_.vocab_start;
  const float g = p_.g[r * p_.g_stride];
  d.ks = g * (1.0f / p_.s_temperature);
  d.kt = g * (1.0f / p_.t_temperature);
  return d;
}

/* The struct's tensor maps: map_hs, map_ht the hidden states (64 x 128 boxes), map_ws, map_wt the
 * weights (128 / CL x 64: a cluster's part of a B box); map_zs,
 * map_zt dz_s and dz_t [N][nv] of pitch Vc (64 x 64 boxes), each any map where its side is not
 * asked for. */
template <int SDT, int TDT, int LAB, int MODE, bool STUDENT, bool TEACHER, int CL>
__global__ void __launch_bounds__(LD_SM90_THREADS, 1)
    linear_divergence_bwd_dz_sm90(RLK_PARAMS_ARG ld::BwdDzSm90Params p_) {
#if defined(RLK_SM90A_ASM)
  static_assert(STUDENT || TEACHER, "bwd_dz_sm90: at least one side");
  static_assert(CL == 1 || CL == LD_SM90_DZ_CLUSTER, "bwd_dz_sm90: a block alone or pairs");
  typedef ld_sm90 C;
  constexpr int BM = C::BM, BN = C::BN;
  u8 *smem = ld_sm90_smem();
  __shared__ alignas(8) u64 full[C::STAGES];
  __shared__ alignas(8) u64 empty[C::STAGES];
  const int tiles_m = p_.tiles_m, tiles_n = p_.tiles_n, ntiles = tiles_m * tiles_n;
  const int kbs = ld_sm90_ksteps(p_.Hs), kbt = ld_sm90_ksteps(p_.Ht), wg = (int)(threadIdx.x / 128);
  ld_sm90_ring_start<CL>(full, empty);

  if (wg == 0) {
    /* producer: the chunk's columns are the weights' rows from c0 */
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      ld_sm90_prefetch_heads(&p_.map_hs, &p_.map_ws, &p_.map_ht, &p_.map_wt);
      if (STUDENT) sm90::tma_prefetch_map(&p_.map_zs);
      if (TEACHER) sm90::tma_prefetch_map(&p_.map_zt);
      u32 it = 0;
#pragma unroll 1
      for (int tile = (int)blockIdx.x; tile < ntiles; tile += (int)gridDim.x) {
        int tm, tn;
        ll_bwd_tile(tile, tiles_m, tiles_n, p_.group, &tm, &tn);
        ld_sm90_load_tile<CL>(&p_.map_hs, &p_.map_ws, &p_.map_ht, &p_.map_wt, full, empty, smem, tm * BM,
                              (i32)(p_.c0 + (i64)tn * BN), kbs, kbt, it);
      }
    }
    if (CL > 1) { /* no block leaves while the other's copies and arrivals may still reach it */
      cluster_arrive();
      cluster_wait();
    }
    return;
  }

  /* consumers */
  sm90::setmaxnreg_inc<232>();
  const int cw = wg - 1, tw = (int)(threadIdx.x % 128), w = tw / 32, l = tw % 32, rl = 16 * w + l / 4;
  u8 *stage = smem + (u32)C::STAGES * C::STAGE + (u32)cw * (C::STAGING / 2u);
  const float is = 1.0f / p_.s_temperature, it_ = 1.0f / p_.t_temperature;
  const float wa = (float)(1.0 - p_.beta), wb = (float)p_.beta;
  const float la = MODE == LD_JSD ? ld::log2_approx((float)(1.0 - p_.beta)) : 0.0f;
  const float lb = MODE == LD_JSD ? ld::log2_approx((float)p_.beta) : 0.0f;
  float acc_s[C::ACC], acc_t[C::ACC];
  u32 it = 0;
#pragma unroll 1
  for (int tile = (int)blockIdx.x; tile < ntiles; tile += (int)gridDim.x) {
    int tm, tn;
    ll_bwd_tile(tile, tiles_m, tiles_n, p_.group, &tm, &tn);
    const i64 m0w = (i64)tm * BM + cw * 64, n0 = (i64)tn * BN;
    /* the rows' inputs load while the products run */
    const ld_dz_row row[2] = {ld_dz_row_inputs<LAB>(p_, m0w + rl), ld_dz_row_inputs<LAB>(p_, m0w + rl + 8)};
    ld_sm90_tile_products<SDT, TDT, CL>(acc_s, acc_t, full, empty, smem, cw, l, kbs, kbt, it);
    /* each logit pair becomes its dz pair in place */
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int q = 0; q < C::ACC / 2; ++q) {
        const int k = ld_sm90_acc(i, q);
        /* top-k: the set's members come before its last (z, column) or are it */
        const float z = acc_t[k] * it_;
        const i64 v = p_.c0 + n0 + ld_sm90_col(q, l);
        const bool in_k = MODE == LD_TOPK && (z > row[i].a2 || (z == row[i].a2 && v <= row[i].last));
        float gs, gt;
        ld::dz_of<MODE>(fmaf(acc_s[k], is, -row[i].ls), fmaf(acc_t[k], it_, -row[i].lt), row[i].D, row[i].a1,
                        row[i].a2, in_k, wa, wb, la, lb, &gs, &gt);
        acc_s[k] = row[i].ign ? 0.0f : gs * row[i].ks;
        acc_t[k] = row[i].ign ? 0.0f : gt * row[i].kt;
      }
    /* the consumer's 64 x 128 of each side through its staging (columns past the chunk and rows
     * past N are clipped by the stores) */
    if (STUDENT) {
      const auto dz = [&](int i, int j, int e) { return acc_s[4 * j + 2 * i + e]; };
      ll_b16_half<0, SDT>(&p_.map_zs, dz, stage, m0w, n0, rl, tw, 1u + (u32)cw, false);
    }
    if (TEACHER) {
      const auto dz = [&](int i, int j, int e) { return acc_t[4 * j + 2 * i + e]; };
      ll_b16_half<0, TDT>(&p_.map_zt, dz, stage, m0w, n0, rl, tw, 1u + (u32)cw, false);
    }
  }
  /* the stores are done before the block (and its staging) goes */
  if (tw == 0) sm90::tma_store_drain<0>();
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

#endif /* RLK_LINEAR_DIVERGENCE_BWD_SM90_CUH */

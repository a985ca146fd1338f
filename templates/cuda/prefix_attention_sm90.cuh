/* prefix_attention_sm90.cuh - rlk_prefix_attention's forward on sm_90a: S = Q K^T and O += P V by
 * wgmma from TMA-filled shared memory, the online softmax in registers (flash-attention style).
 *
 * The tiling is the mma kernel's (prefix_attention.cuh: a block per query tile of a region and
 * query head, the region's key tiles in order, the response rows stacked so that a tile of them
 * reads each prefix K/V tile once), with 128-row query tiles and 128-key tiles.
 * Warpgroup 0 is the producer: one thread loads the block's Q once, then K and V tiles into two
 * rings of STAGES stages (TMA boxes of 64 head-dim columns, 128-byte swizzle), full/empty mbarriers
 * between it and the consumers; K and V have barriers of their own so that S = Q K^T starts before
 * V has landed. Warpgroups 1 and 2 are the consumers, 64 query rows each: per key tile t,
 *   S [64 x 128] = Q K^T       wgmma m64n128k16, both operands K-major in shared memory
 *   mask, online softmax       the mma kernel's per-row bounds, exp2 by ex2.approx
 *   O [64 x D] += P V          wgmma m64nDk16, P rounded to the 16-bit dtype in registers (the
 *                              accumulator layout is the A-fragment layout), V MN-major in shared
 *                              memory
 * pipelined within the warpgroup: S of tile t is issued together with P V of tile t - 1, so t's
 * softmax runs while the tensor cores do t - 1's P V (two products in flight, P held as packed
 * fragments until its product ends). A prefix's causal tiles start heaviest first. At the end
 * O / l and the log-sum-exp go straight from registers to global memory. Registers move from the
 * producer (40) to the consumers (232) with setmaxnreg.
 *
 * Needs: q, k, v 16-byte aligned (tensor maps over [T, H * D], rows H * D elements apart); the
 * host runs the mma kernel otherwise. Every output is written once after a fixed sequence of
 * operations: bitwise repeatable. */
#ifndef RLK_PREFIX_ATTENTION_SM90_CUH
#define RLK_PREFIX_ATTENTION_SM90_CUH

#include "hopper_tma.cuh"
#include "hopper_wgmma.cuh"
#include "prefix_attention.cuh"

#if defined(RLK_CUDA)
namespace rlk {

/* Tile shape and rings (the host's launch shape and tensor-map boxes mirror these:
 * src/ops/prefix_attention.c, PA_SM90_*). */
template <int D> struct pa_sm90 {
  static constexpr int BM = 128, BN = 128, THREADS = 384, STAGES = 2;
  static constexpr int NB = D / 64;                        /* 64-column boxes across the head dim */
  static constexpr u32 QBOX = 64u * 128u;                  /* 64 rows x 64 columns of a Q box */
  static constexpr u32 KVBOX = (u32)BN * 128u;             /* BN rows x 64 columns of a K or V box */
  static constexpr u32 QBYTES = 2u * NB * QBOX, KVBYTES = NB * KVBOX;
  static constexpr u32 SMEM = QBYTES + 2u * STAGES * KVBYTES; /* plus 1024 for the alignment */
};

template <int DT, int D>
__global__ void __launch_bounds__(384, 1)
    pattn_fwd_sm90(const __grid_constant__ tensor_map map_q, const __grid_constant__ tensor_map map_k,
                   const __grid_constant__ tensor_map map_v, RLK_PARAMS_ARG pa::FwdParams p_) {
#if defined(RLK_SM90A_ASM)
  using namespace pa;
  using C = pa_sm90<D>;
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  constexpr int BN = C::BN, NB = C::NB, STAGES = C::STAGES;
  constexpr int AB = DT == DT_BF16 ? sm90::WGMMA_BF16 : sm90::WGMMA_F16;
  constexpr u32 CONSUMER_WARPS = 8;
  float *__restrict__ lse = p_.lse;
  const i32 *__restrict__ seq = p_.seq, *__restrict__ grp = p_.grp;
  const i32 Hq = p_.Hq, Hkv = p_.Hkv;
  void *__restrict__ out = p_.out;
  const region rg = region_of(seq, grp);
  const i64 ntiles = (rg.r1 - rg.r0 + C::BM - 1) / C::BM;
  if ((i64)blockIdx.x >= ntiles) return;
  /* a prefix's causal tiles heaviest first (blocks start in x order), so that the short ones
   * fill the end of the wave */
  const i64 q0 = rg.r0 + (rg.resp ? (i64)blockIdx.x : ntiles - 1 - (i64)blockIdx.x) * C::BM;
  const i64 qend = min_(q0 + C::BM, rg.r1);
  const i32 h = (i32)blockIdx.z, hk = h / (Hq / Hkv);
  const kv_tiles kt = kv_tiles_of(rg, seq, q0, qend, BN);

  extern __shared__ __align__(1024) u8 pa_sm90_raw[];
  u8 *smem = (u8 *)(((u64)pa_sm90_raw + 1023u) & ~(u64)1023u);
  u8 *sQ = smem, *sK = sQ + C::QBYTES, *sV = sK + STAGES * C::KVBYTES;
  __shared__ alignas(8) u64 q_full;
  __shared__ alignas(8) u64 k_full[STAGES], k_empty[STAGES], v_full[STAGES], v_empty[STAGES];
  const int wg = (int)(threadIdx.x / 128);
  if (threadIdx.x == 0) {
    sm90::mbar_init(&q_full, 1);
    sm90::ring_init<STAGES>(k_full, k_empty, CONSUMER_WARPS);
    sm90::ring_init<STAGES>(v_full, v_empty, CONSUMER_WARPS);
  }
  __syncthreads();

  if (wg == 0) {
    /* producer */
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      sm90::tma_prefetch_map(&map_q);
      sm90::tma_prefetch_map(&map_k);
      sm90::tma_prefetch_map(&map_v);
      sm90::mbar_arrive_expect_tx(&q_full, C::QBYTES);
      for (int half = 0; half < 2; ++half)
        for (int b = 0; b < NB; ++b)
          sm90::tma_load_2d(sQ + (half * NB + b) * C::QBOX, &map_q, h * D + 64 * b, (i32)(q0 + 64 * half), &q_full);
      for (int t = 0; t < kt.n; ++t) {
        const u32 s = (u32)t % STAGES, use = (u32)t / STAGES;
        const i32 kv0 = (i32)kt.start(t);
        if (t >= STAGES) sm90::mbar_wait(&k_empty[s], (use - 1u) & 1u);
        sm90::mbar_arrive_expect_tx(&k_full[s], C::KVBYTES);
        for (int b = 0; b < NB; ++b)
          sm90::tma_load_2d(sK + s * C::KVBYTES + b * C::KVBOX, &map_k, hk * D + 64 * b, kv0, &k_full[s]);
        if (t >= STAGES) sm90::mbar_wait(&v_empty[s], (use - 1u) & 1u);
        sm90::mbar_arrive_expect_tx(&v_full[s], C::KVBYTES);
        for (int b = 0; b < NB; ++b)
          sm90::tma_load_2d(sV + s * C::KVBYTES + b * C::KVBOX, &map_v, hk * D + 64 * b, kv0, &v_full[s]);
      }
    }
    return;
  }

  /* consumers: warpgroup cw owns query rows q0 + 64 cw .. + 63 */
  sm90::setmaxnreg_inc<232>();
  const int cw = wg - 1, tw = (int)(threadIdx.x % 128), w = tw / 32, l = tw % 32, t4 = l % 4;
  /* this thread's two rows (accumulator rows 16 w + l / 4 + 8 r) and what they see: phase A keys
   * < a1, phase B keys in [b0r, row] */
  i64 rows[2], a1[2], b0r[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rows[r] = q0 + 64 * cw + 16 * w + l / 4 + 8 * r;
    const i64 ri = min_(rows[r], qend - 1);
    a1[r] = rg.resp ? rg.pe : rows[r] + 1;
    b0r[r] = rg.resp ? row_lo(rg, seq, ri) : 0;
  }
  /* a phase-A tile needs no mask when it ends at or below every row's a1 */
  const i64 a1_min = rg.resp ? rg.pe : q0 + 64 * cw + 1;
  const float c = p_.scale * LOG2E;
  /* o: the output rows; sacc: S of the current tile, then its exponentials; pf: P of the previous
   * tile as A fragments (k-step ks, keys 16 ks ..: pf[ks][r + 2 hh] = accumulator columns
   * 8 (2 ks + hh) + 2 t4 + {0, 1} of row r) */
  float o[D / 2], sacc[BN / 2], m[2], lsum[2], cf[2];
  u32 pf[BN / 16][4];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  m[0] = m[1] = -limits<float>::infinity();
  lsum[0] = lsum[1] = 0.0f;
  const u8 *qw = sQ + cw * NB * C::QBOX;

  /* S = Q K_t^T over the head dim (k-step kk reads 16 columns of box kk / 4); one commit group */
  auto issue_s = [&](int t) {
    const u32 st = (u32)t % STAGES;
    sm90::mbar_wait(&k_full[st], ((u32)t / STAGES) & 1u);
    const u8 *kb = sK + st * C::KVBYTES;
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const u32 off = 32u * (u32)(kk % 4);
      const u64 da = sm90::smem_desc(qw + (kk / 4) * C::QBOX + off, sm90::SWIZZLE_128B, 0, 1024);
      const u64 db = sm90::smem_desc(kb + (kk / 4) * C::KVBOX + off, sm90::SWIZZLE_128B, 0, 1024);
      sm90::wgmma<BN>::template ss<AB, 0, 0>(sacc, da, db, kk > 0 ? 1u : 0u);
    }
    sm90::wgmma_commit();
  };
  /* O += P_t V_t (pf) over the tile's keys, V MN-major; one commit group */
  auto issue_pv = [&](int t) {
    const u32 st = (u32)t % STAGES;
    sm90::mbar_wait(&v_full[st], ((u32)t / STAGES) & 1u);
    const u64 dv = sm90::smem_desc_mn(sV + st * C::KVBYTES, C::KVBOX);
    sm90::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) sm90::wgmma<D>::template rs<AB, 1>(o, pf[ks], sm90::desc_advance(dv, 2048u * ks), 1u);
    sm90::wgmma_commit();
  };
  /* Tile t's S (complete) to exponentials in place, the running max and sum, and cf: the factor
   * for what O holds so far. */
  auto softmax = [&](int t) {
    const i64 kv0 = kt.start(t);
    const bool phase_a = t < kt.na;
    const bool masked = !phase_a || kv0 + BN > a1_min;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -limits<float>::infinity();
      if (masked) {
        /* visible key offsets within the tile: [lo, hi] */
        const int lo = phase_a ? 0 : (int)max_<i64>(b0r[r] - kv0, -1);
        const int hi = (int)min_<i64>(max_<i64>((phase_a ? a1[r] - 1 : rows[r]) - kv0, -1), BN);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int off = 8 * j + 2 * t4 + e;
            if (off < lo || off > hi) sacc[4 * j + 2 * r + e] = -limits<float>::infinity();
          }
      }
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(sacc[4 * j + 2 * r], sacc[4 * j + 2 * r + 1]));
      mx = fmaxf(mx, shfl_xor(mx, 1));
      mx = fmaxf(mx, shfl_xor(mx, 2));
      /* in the exp2 domain: x c; a row with nothing visible yet keeps m = -inf and adds zeros */
      const float mn = fmaxf(m[r], mx * c);
      const float mu = mn == -limits<float>::infinity() ? 0.0f : mn;
      cf[r] = exp2_approx(m[r] - mu);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pj = exp2_approx(fmaf(sacc[4 * j + 2 * r + e], c, -mu));
          sacc[4 * j + 2 * r + e] = pj;
          sum += pj;
        }
      lsum[r] = lsum[r] * cf[r] + sum;
      m[r] = mn;
    }
  };
  /* O *= cf, then the exponentials to pf (after the previous P V has finished reading pf) */
  auto rescale_pack = [&]() {
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        o[4 * j + 2 * r] *= cf[r];
        o[4 * j + 2 * r + 1] *= cf[r];
      }
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i0 = 4 * (2 * ks + hh) + 2 * r;
          pf[ks][r + 2 * hh] = DT == DT_BF16 ? sm90::pack_bf16x2(sacc[i0], sacc[i0 + 1])
                                             : sm90::pack_f16x2(sacc[i0], sacc[i0 + 1]);
        }
  };

  /* The pipeline within the warpgroup: S of tile t is issued with P V of tile t - 1 behind it, so
   * that t's softmax runs while the tensor cores do t - 1's P V. */
  sm90::mbar_wait(&q_full, 0);
  issue_s(0);
  sm90::wgmma_wait<0>();
  sm90::wgmma_fence_operands(sacc);
  if (l == 0) sm90::mbar_arrive(&k_empty[0]);
  softmax(0);
  rescale_pack();
  for (int t = 1; t < kt.n; ++t) {
    issue_s(t);
    issue_pv(t - 1);
    sm90::wgmma_wait<1>(); /* S_t done, P V of t - 1 may still run */
    sm90::wgmma_fence_operands(sacc);
    if (l == 0) sm90::mbar_arrive(&k_empty[(u32)t % STAGES]);
    softmax(t);
    sm90::wgmma_wait<0>();
    sm90::wgmma_fence_operands(o);
    sm90::wgmma_fence_operands(pf);
    if (l == 0) sm90::mbar_arrive(&v_empty[(u32)(t - 1) % STAGES]);
    rescale_pack();
  }
  issue_pv(kt.n - 1);
  sm90::wgmma_wait<0>();
  sm90::wgmma_fence_operands(o);
  sm90::wgmma_fence_operands(pf);
  if (l == 0) sm90::mbar_arrive(&v_empty[(u32)(kt.n - 1) % STAGES]);

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = lsum[r];
    sum += shfl_xor(sum, 1);
    sum += shfl_xor(sum, 2);
    if (rows[r] >= qend) continue;
    const float inv = 1.0f / sum;
    u32 *orow = (u32 *)((u16 *)out + (rows[r] * Hq + h) * D);
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      orow[4 * j + t4] = pack<DT>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    if (lse && t4 == 0) lse[rows[r] * Hq + h] = (m[r] + log2f(sum)) * LN2;
  }
#else
  (void)map_q, (void)map_k, (void)map_v, (void)p_;
#endif
}

} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_PREFIX_ATTENTION_SM90_CUH */

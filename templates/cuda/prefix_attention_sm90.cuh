/* prefix_attention_sm90.cuh - rlk_prefix_attention's kernels on sm_90a, TMA copies and wgmma:
 * pattn_fwd_sm90 (described here), and the backward's pattn_bwd_dkdv_sm90 and pattn_bwd_dq_sm90
 * (described where they are defined), with the steps they share as pa::sm90_* helpers.
 *
 * The forward: S = Q K^T and O += P V by wgmma from TMA-filled shared memory, the online softmax
 * in registers (flash-attention style).
 *
 * The tiling is the mma kernel's (prefix_attention.cuh: a block per query tile of a prompt, in
 * prompt_tile's order, and query head; the tile's key tiles in order; the response rows
 * stacked so that a tile of them reads each prefix K/V tile once), with 128-row query tiles and
 * 128-key tiles.
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
 * Needs: q, k, v (and for the backward every other tensor) 16-byte aligned: tensor maps over
 * [T, H * D], rows H * D elements apart; otherwise the host runs the portable kernels. Every output
 * is written once after a fixed sequence of operations: bitwise repeatable. */
#ifndef RLK_PREFIX_ATTENTION_SM90_CUH
#define RLK_PREFIX_ATTENTION_SM90_CUH

#include "hopper_tma.cuh"
#include "hopper_wgmma.cuh"
#include "prefix_attention.cuh"

#if defined(RLK_CUDA)
namespace rlk {

namespace pa {

/* The wgmma operand type of the 16-bit dtype DT. */
template <int DT> constexpr int sm90_ab = DT == PA_DT_BF16 ? sm90::WGMMA_BF16 : sm90::WGMMA_F16;

/* The arrivals that release a ring stage: the consumers' warps (warpgroups 1 and 2). */
constexpr u32 SM90_CONSUMER_WARPS = 8;

/* The dynamic shared memory of a kernel with head dim D whose rings take `bytes`, aligned to 1024
 * bytes (the 128-byte swizzle's period). */
template <int D, u32 bytes> RLK_DEVICE u8 *sm90_smem() {
  static_assert(bytes + PA_SM90_ALIGN <= PA_SM90_SMEM_LIMIT, "the rings fit in an SM's 227 KB of shared memory");
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  extern __shared__ __align__(PA_SM90_ALIGN) u8 pa_sm90_raw[];
  return (u8 *)(((u64)pa_sm90_raw + 1023u) & ~(u64)1023u);
}

/* Loads rows [row0, row0 + box rows) of one head (its D columns from col0) as D / 64 boxes of 64
 * columns, box_bytes apart at dst, completing on bar. */
template <int D>
RLK_DEVICE void sm90_load_head(u8 *dst, u32 box_bytes, const tensor_map *map, i32 col0, i32 row0, u64 *bar) {
#pragma unroll
  for (int b = 0; b < D / 64; ++b) sm90::tma_load_2d(dst + b * box_bytes, map, col0 + 64 * b, row0, bar);
}

/* The barriers of a kernel that loads its query tile once and streams key tiles: q_full, and the
 * K and V rings (full: the copies landed; empty: `consumers` arrivals released the stage). */
template <int STAGES> struct sm90_kv_bars {
  u64 q_full, k_full[STAGES], k_empty[STAGES], v_full[STAGES], v_empty[STAGES];
  /* by one thread; a block barrier follows */
  RLK_DEVICE void init(u32 consumers) {
    sm90::mbar_init(&q_full, 1);
    sm90::ring_init<STAGES>(k_full, k_empty, consumers);
    sm90::ring_init<STAGES>(v_full, v_empty, consumers);
  }
};

/* The producer's key tiles: K and V of tile t into stage t % STAGES of their rings (KVBOX bytes a
 * box), each after the consumers released the stage's previous use. */
template <int D, int STAGES, u32 KVBOX>
RLK_DEVICE void sm90_load_kv(u8 *sK, u8 *sV, const tensor_map *map_k, const tensor_map *map_v, const kv_tiles &kt,
                             i32 hk, sm90_kv_bars<STAGES> &bar) {
  u64 *k_full = bar.k_full, *k_empty = bar.k_empty, *v_full = bar.v_full, *v_empty = bar.v_empty;
  constexpr u32 BYTES = (D / 64) * KVBOX;
  for (int t = 0; t < kt.n; ++t) {
    const u32 s = (u32)t % STAGES, use = (u32)t / STAGES;
    const i32 kv0 = (i32)kt.start(t);
    if (t >= STAGES) sm90::mbar_wait(&k_empty[s], (use - 1u) & 1u);
    sm90::mbar_arrive_expect_tx(&k_full[s], BYTES);
    sm90_load_head<D>(sK + s * BYTES, KVBOX, map_k, hk * D, kv0, &k_full[s]);
    if (t >= STAGES) sm90::mbar_wait(&v_empty[s], (use - 1u) & 1u);
    sm90::mbar_arrive_expect_tx(&v_full[s], BYTES);
    sm90_load_head<D>(sV + s * BYTES, KVBOX, map_v, hk * D, kv0, &v_full[s]);
  }
}

/* acc [64 x N] (=) A B^T over the head dim, both K-major in boxes of 64 columns (ABOX / BBOX bytes
 * apart): k-step kk reads 16 columns of box kk / 4. Issued, not committed. */
template <int D, int N, int AB, u32 ABOX, u32 BBOX>
RLK_DEVICE void sm90_ss_head(float (&acc)[N / 2], const u8 *a, const u8 *b) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const u32 off = 32u * (u32)(kk % 4);
    const u64 da = sm90::smem_desc(a + (kk / 4) * ABOX + off, sm90::SWIZZLE_128B, 0, 1024);
    const u64 db = sm90::smem_desc(b + (kk / 4) * BBOX + off, sm90::SWIZZLE_128B, 0, 1024);
    sm90::wgmma<N>::template ss<AB, 0, 0>(acc, da, db, kk > 0 ? 1u : 0u);
  }
}

/* The same with A from registers (sm90_load_a's fragments, k-step kk: columns 16 kk ..). Issued,
 * not committed. */
template <int D, int N, int AB, u32 BBOX>
RLK_DEVICE void sm90_rs_head(float (&acc)[N / 2], const u32 (&a)[D / 16][4], const u8 *b) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const u64 db = sm90::smem_desc(b + (kk / 4) * BBOX + 32u * (u32)(kk % 4), sm90::SWIZZLE_128B, 0, 1024);
    sm90::wgmma<N>::template rs<AB, 0>(acc, a[kk], db, kk > 0 ? 1u : 0u);
  }
}

/* acc [64 x D] += A B over N rows of B: A from registers (sm90_pack_a's fragments), B [N x D]
 * MN-major in shared memory at descriptor db; k-step ks takes B's rows 16 ks ... Issued, not
 * committed. */
template <int D, int N, int AB>
RLK_DEVICE void sm90_rs_mn(float (&acc)[D / 2], const u32 (&a)[N / 16][4], u64 db) {
#pragma unroll
  for (int ks = 0; ks < N / 16; ++ks)
    sm90::wgmma<D>::template rs<AB, 1>(acc, a[ks], sm90::desc_advance(db, 2048u * ks), 1u);
}

/* An accumulator [64 x N] in the 16-bit dtype as the A fragments of the next product: k-step ks
 * (columns 16 ks ..), f[ks][r + 2 hh] = columns 8 (2 ks + hh) + 2 t4 + {0, 1} of row r. */
template <int DT, int N> RLK_DEVICE void sm90_pack_a(const float (&acc)[N / 2], u32 (&f)[N / 16][4]) {
#pragma unroll
  for (int ks = 0; ks < N / 16; ++ks)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i0 = 4 * (2 * ks + hh) + 2 * r;
        f[ks][r + 2 * hh] = sm90::pack_half2<DT == PA_DT_BF16>(acc[i0], acc[i0 + 1]);
      }
}

/* The dot product of two pairs of 16-bit values packed in u32s (element 0 in the low half). */
template <int DT> RLK_DEVICE float dot2(u32 a, u32 b) {
  if (DT == PA_DT_BF16) return bits_as_float(a << 16) * bits_as_float(b << 16) +
                            bits_as_float(a & 0xffff0000u) * bits_as_float(b & 0xffff0000u);
  const f16 a0 = {(u16)a}, a1 = {(u16)(a >> 16)}, b0 = {(u16)b}, b1 = {(u16)(b >> 16)};
  return to_float(a0) * to_float(b0) + to_float(a1) * to_float(b1);
}

/* A warpgroup's 64 rows x D of a 16-bit tile in shared memory (boxes of 64 columns, box_bytes
 * apart, 128-byte swizzle: the TMA layout) as the A fragments of its products: k-step ks (columns
 * 16 ks ..), f[ks][r + 2 hh] = columns 16 ks + 8 hh + 2 t4 + {0, 1} of row 16 w + l / 4 + 8 r, the
 * layout sm90_pack_a writes. One ldmatrix.x4 a k-step: lane l addresses row 16 w + l % 16 of the
 * column half l / 16. */
template <int D> RLK_DEVICE void sm90_load_a(u32 (&f)[D / 16][4], const u8 *tile, u32 box_bytes) {
  const int tw = (int)(threadIdx.x % 128), row = 16 * (tw / 32) + tw % 16, half = (tw % 32) / 16;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int cg = 2 * ks + half; /* 16-byte chunk across the head dim */
    ldsm4(f[ks], tile + (cg / 8) * box_bytes + row * 128 + (((cg % 8) ^ (row % 8)) << 4));
  }
}

/* A consumer thread's two query rows (accumulator rows 16 w + l / 4 + 8 r of its warpgroup's 64)
 * and what they see: phase-A keys below a1, phase-B keys in [b0, row]; rows past the tile see
 * nothing. */
struct sm90_rows {
  i64 row[2], a1[2], b0[2];
  RLK_DEVICE sm90_rows(const region &rg, const i32 *seq, i64 r0, i64 qend) {
    const int tw = (int)(threadIdx.x % 128), w = tw / 32, l = tw % 32;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row[r] = r0 + 16 * w + l / 4 + 8 * r;
      a1[r] = row[r] < qend ? (rg.resp ? rg.pe : row[r] + 1) : 0;
      b0[r] = rg.resp ? row_lo(rg, seq, min_(row[r], qend - 1)) : 0;
    }
  }
  /* the visible key offsets [lo, hi] of row r in the key tile at kv0 (BN keys) */
  template <int BN> RLK_DEVICE void bounds(int r, bool phase_a, i64 kv0, int &lo, int &hi) const {
    lo = phase_a ? 0 : (int)max_<i64>(b0[r] - kv0, -1);
    hi = (int)min_<i64>(max_<i64>((phase_a ? a1[r] - 1 : (a1[r] ? row[r] : -1)) - kv0, -1), BN);
  }
};

/* Rows [16 w + l / 4 + 8 r] of acc [64 x D] times mul[r] to out [T, H, D] (head h), the rows below
 * qend. */
template <int DT, int D>
RLK_DEVICE void sm90_store_rows(void *out, const sm90_rows &rs, i64 qend, i32 H, i32 h, const float (&acc)[D / 2],
                                const float (&mul)[2]) {
  const int t4 = (int)(threadIdx.x % 4);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rs.row[r] >= qend) continue;
    u32 *g = (u32 *)((u16 *)out + (rs.row[r] * H + h) * D);
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      g[4 * j + t4] = pack<DT>(acc[4 * j + 2 * r] * mul[r], acc[4 * j + 2 * r + 1] * mul[r]);
  }
}

} // namespace pa

/* Tile shape and rings (prefix_attention_params.h declares them for the op's launch shapes and
 * tensor-map boxes too); STAGES_ K/V stages (the fwd_stages setting). */
template <int D, int STAGES_> struct pa_sm90 {
  static constexpr int BM = PA_SM90_BM, BN = PA_SM90_BN, THREADS = PA_SM90_THREADS, STAGES = STAGES_;
  static constexpr int NB = D / 64;                        /* 64-column boxes across the head dim */
  static constexpr u32 QBOX = 64u * 128u;                  /* 64 rows x 64 columns of a Q box */
  static constexpr u32 KVBOX = (u32)BN * 128u;             /* BN rows x 64 columns of a K or V box */
  static constexpr u32 QBYTES = 2u * NB * QBOX, KVBYTES = NB * KVBOX;
  static constexpr u32 SMEM = QBYTES + 2u * STAGES * KVBYTES; /* plus 1024 for the alignment */
};

template <int DT, int D, int STAGES_>
__global__ void __launch_bounds__(PA_SM90_THREADS, 1)
    pattn_fwd_sm90(RLK_PARAMS_ARG pa_fwd_sm90_args p_) {
#if defined(RLK_SM90A_ASM)
  using namespace pa;
  using C = pa_sm90<D, STAGES_>;
  constexpr int BN = C::BN, NB = C::NB, STAGES = C::STAGES;
  constexpr int AB = sm90_ab<DT>;
  float *__restrict__ lse = p_.pass.lse;
  const i32 *__restrict__ seq = p_.pass.seq, *__restrict__ grp = p_.pass.grp;
  const i32 Hq = p_.pass.Hq, Hkv = p_.pass.Hkv;
  void *__restrict__ out = p_.pass.out;
  region rg;
  const i64 q0 = prompt_tile(seq, grp, (i32)blockIdx.y, (i64)blockIdx.x, C::BM, false, rg);
  if (q0 < 0) return;
  const i64 qend = min_(q0 + C::BM, rg.r1);
  const i32 h = (i32)blockIdx.z, hk = h / (Hq / Hkv);
  const kv_tiles kt = kv_tiles_of(rg, seq, q0, qend, BN);

  u8 *smem = sm90_smem<D, C::SMEM>();
  u8 *sQ = smem, *sK = sQ + C::QBYTES, *sV = sK + STAGES * C::KVBYTES;
  __shared__ alignas(8) sm90_kv_bars<STAGES> bar;
  const int wg = (int)(threadIdx.x / 128);
  if (threadIdx.x == 0) bar.init(SM90_CONSUMER_WARPS);
  __syncthreads();

  if (wg == 0) {
    /* producer */
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      sm90::tma_prefetch_map(&p_.map_q);
      sm90::tma_prefetch_map(&p_.map_k);
      sm90::tma_prefetch_map(&p_.map_v);
      sm90::mbar_arrive_expect_tx(&bar.q_full, C::QBYTES);
      for (int half = 0; half < 2; ++half)
        sm90_load_head<D>(sQ + half * NB * C::QBOX, C::QBOX, &p_.map_q, h * D, (i32)(q0 + 64 * half), &bar.q_full);
      sm90_load_kv<D, STAGES, C::KVBOX>(sK, sV, &p_.map_k, &p_.map_v, kt, hk, bar);
    }
    return;
  }

  /* consumers: warpgroup cw owns query rows q0 + 64 cw .. + 63 */
  sm90::setmaxnreg_inc<232>();
  const int cw = wg - 1, l = (int)(threadIdx.x % 32), t4 = l % 4;
  const sm90_rows rs(rg, seq, q0 + 64 * cw, qend);
  /* a phase-A tile needs no mask when it ends at or below every row's a1 (rows past the tile
   * are not stored) */
  const i64 a1_min = rg.resp ? rg.pe : q0 + 64 * cw + 1;
  const float c = p_.pass.scale * LOG2E;
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
    sm90::mbar_wait(&bar.k_full[st], ((u32)t / STAGES) & 1u);
    sm90::wgmma_fence();
    sm90_ss_head<D, BN, AB, C::QBOX, C::KVBOX>(sacc, qw, sK + st * C::KVBYTES);
    sm90::wgmma_commit();
  };
  /* O += P_t V_t (pf) over the tile's keys, V MN-major; one commit group */
  auto issue_pv = [&](int t) {
    const u32 st = (u32)t % STAGES;
    sm90::mbar_wait(&bar.v_full[st], ((u32)t / STAGES) & 1u);
    const u64 dv = sm90::smem_desc_mn(sV + st * C::KVBYTES, C::KVBOX);
    sm90::wgmma_fence();
    sm90_rs_mn<D, BN, AB>(o, pf, dv);
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
        int lo, hi;
        rs.bounds<BN>(r, phase_a, kv0, lo, hi);
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
    sm90_pack_a<DT, BN>(sacc, pf);
  };

  /* The pipeline within the warpgroup: S of tile t is issued with P V of tile t - 1 behind it, so
   * that t's softmax runs while the tensor cores do t - 1's P V. */
  sm90::mbar_wait(&bar.q_full, 0);
  issue_s(0);
  sm90::wgmma_wait<0>();
  sm90::wgmma_fence_operands(sacc);
  if (l == 0) sm90::mbar_arrive(&bar.k_empty[0]);
  softmax(0);
  rescale_pack();
  for (int t = 1; t < kt.n; ++t) {
    issue_s(t);
    issue_pv(t - 1);
    sm90::wgmma_wait<1>(); /* S_t done, P V of t - 1 may still run */
    sm90::wgmma_fence_operands(sacc);
    if (l == 0) sm90::mbar_arrive(&bar.k_empty[(u32)t % STAGES]);
    softmax(t);
    sm90::wgmma_wait<0>();
    sm90::wgmma_fence_operands(o);
    sm90::wgmma_fence_operands(pf);
    if (l == 0) sm90::mbar_arrive(&bar.v_empty[(u32)(t - 1) % STAGES]);
    rescale_pack();
  }
  issue_pv(kt.n - 1);
  sm90::wgmma_wait<0>();
  sm90::wgmma_fence_operands(o);
  sm90::wgmma_fence_operands(pf);
  if (l == 0) sm90::mbar_arrive(&bar.v_empty[(u32)(kt.n - 1) % STAGES]);

  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = lsum[r];
    sum += shfl_xor(sum, 1);
    sum += shfl_xor(sum, 2);
    inv[r] = 1.0f / sum;
    if (lse && t4 == 0 && rs.row[r] < qend) lse[rs.row[r] * Hq + h] = (m[r] + log2f(sum)) * LN2;
  }
  sm90_store_rows<DT, D>(out, rs, qend, Hq, h, o, inv);
#else
  (void)p_;
#endif
}

/* The backward's dk, dv kernel (pattn_bwd_dkdv_sm90): 128-key tiles, 64-row query tiles, STAGES_
 * stages of Q and dO (the dkdv_stages setting; declared for the op too: PA_SM90_*). */
template <int D, int STAGES_> struct pa_sm90_bwd {
  static constexpr int BN = PA_SM90_BN, BQ = PA_SM90_BQ, THREADS = PA_SM90_THREADS, STAGES = STAGES_;
  static constexpr int NB = D / 64;
  static constexpr u32 KVBOX = (u32)BN * 128u;            /* 128 keys x 64 columns */
  static constexpr u32 QBOX = (u32)BQ * 128u;             /* 64 rows x 64 columns */
  static constexpr u32 KVBYTES = NB * KVBOX, QBYTES = NB * QBOX;
  static constexpr u32 SMEM = 2u * KVBYTES + 2u * STAGES * QBYTES; /* plus 1024 for the alignment */
  static constexpr int AUX = 64;                          /* producer threads staging per-row data */
};

/* Backward dk, dv on sm_90a: a block per (key head, 128-key tile of a prompt, prompt), prompts
 * slowest (the blocks that run together read one prompt's Q and dO), then key tiles, a prompt's
 * heaviest (its prefix's first) first. The block walks the query tiles that see its
 * keys (the mma kernel's, in the same order) for each query head of its GQA group in turn,
 * summing the group in its accumulators: no partials, no reduce pass. Warpgroup 0 produces: one
 * thread loads K and V once and then each (head, 64-row query tile)'s Q and dO by TMA into a
 * four-stage ring; 64 of its threads stage the tile's per-row lse (log2 units), delta and first
 * visible key. Consumers 1 and 2 own 64 keys each; per query tile
 *   S^T = K Q^T, dP^T = V dO^T         wgmma m64n64k16, K-major operands in shared memory
 *   P^T = exp2(S^T c - lse)            masked, in registers
 *   dV += P^T dO                       wgmma m64nDk16, P^T from registers, dO MN-major from the
 *                                       same shared tile; issued before dS^T is computed
 *   dS^T = P^T (dP^T - delta), dK += dS^T Q     likewise
 * with the next tile's S^T and dP^T issued while dK's product still runs; at the end dK (times
 * the scale) and dV leave from registers. */
template <int DT, int D, int STAGES_>
__global__ void __launch_bounds__(PA_SM90_THREADS, 1)
    pattn_bwd_dkdv_sm90(RLK_PARAMS_ARG pa_bwd_sm90_args p_) {
#if defined(RLK_SM90A_ASM)
  using namespace pa;
  using C = pa_sm90_bwd<D, STAGES_>;
  constexpr int BN = C::BN, BQ = C::BQ, STAGES = C::STAGES;
  constexpr int AB = sm90_ab<DT>;
  const float *__restrict__ lse = p_.pass.lse;
  void *__restrict__ work = p_.pass.work;
  const i32 *__restrict__ seq = p_.pass.seq, *__restrict__ grp = p_.pass.grp;
  const i32 Hq = p_.pass.Hq, Hkv = p_.pass.Hkv;
  const float scale = p_.pass.scale;
  region rg;
  const i64 k0 = prompt_tile(seq, grp, (i32)blockIdx.z, (i64)blockIdx.y, BN, true, rg);
  if (k0 < 0) return;
  const i64 kend = min_(k0 + BN, rg.r1);
  const i32 ratio = Hq / Hkv, hk = (i32)blockIdx.x;
  /* the queries that see these keys: from k0 to the prompt's end (prefix keys) or to the end of
   * the response holding the last key */
  const i64 qlast = rg.resp ? seq[last_le(seq, rg.rs0, rg.rs1, kend - 1) + 1] : rg.pend;
  const int nq = (int)((qlast - k0 + BQ - 1) / BQ);
  /* step u: query head hk ratio + u / nq, query tile u % nq */
  const int nu = ratio * nq;

  u8 *smem = sm90_smem<D, C::SMEM>();
  u8 *sK = smem, *sV = sK + C::KVBYTES, *sQ = sV + C::KVBYTES, *sO = sQ + STAGES * C::QBYTES;
  __shared__ float sL[STAGES][BQ], sD[STAGES][BQ];
  __shared__ i32 sLo[STAGES][BQ];
  __shared__ alignas(8) u64 kv_full, q_full[STAGES], q_empty[STAGES], aux_full[STAGES];
  const int wg = (int)(threadIdx.x / 128);
  if (threadIdx.x == 0) {
    sm90::mbar_init(&kv_full, 1);
    sm90::ring_init<STAGES>(q_full, q_empty, SM90_CONSUMER_WARPS);
#pragma unroll
    for (int st = 0; st < STAGES; ++st) sm90::mbar_init(&aux_full[st], C::AUX);
    sm90::mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    sm90::setmaxnreg_dec<24>();
    if (threadIdx.x == 0) {
      /* the copies */
      sm90::tma_prefetch_map(&p_.map_q);
      sm90::tma_prefetch_map(&p_.map_do);
      sm90::mbar_arrive_expect_tx(&kv_full, 2u * C::KVBYTES);
      sm90_load_head<D>(sK, C::KVBOX, &p_.map_k, hk * D, (i32)k0, &kv_full);
      sm90_load_head<D>(sV, C::KVBOX, &p_.map_v, hk * D, (i32)k0, &kv_full);
      for (int u = 0; u < nu; ++u) {
        const u32 st = (u32)u % STAGES;
        const i32 h = hk * ratio + u / nq, q0 = (i32)(k0 + (i64)(u % nq) * BQ);
        if (u >= STAGES) sm90::mbar_wait(&q_empty[st], ((u32)u / STAGES - 1u) & 1u);
        sm90::mbar_arrive_expect_tx(&q_full[st], 2u * C::QBYTES);
        sm90_load_head<D>(sQ + st * C::QBYTES, C::QBOX, &p_.map_q, h * D, q0, &q_full[st]);
        sm90_load_head<D>(sO + st * C::QBYTES, C::QBOX, &p_.map_do, h * D, q0, &q_full[st]);
      }
    } else if (threadIdx.x >= 128 - C::AUX) {
      /* a query row's lse (log2 units), delta and first visible key offset (past the tile: none) */
      const int rr = (int)threadIdx.x - (128 - C::AUX);
      const float *delta = (const float *)work;
      for (int u = 0; u < nu; ++u) {
        const u32 st = (u32)u % STAGES;
        const i32 h = hk * ratio + u / nq;
        if (u >= STAGES) sm90::mbar_wait(&q_empty[st], ((u32)u / STAGES - 1u) & 1u);
        const i64 i = k0 + (i64)(u % nq) * BQ + rr;
        const bool ok = i < qlast;
        sL[st][rr] = ok ? lse[i * Hq + h] * LOG2E : 0.0f;
        sD[st][rr] = ok ? delta[i * Hq + h] : 0.0f;
        sLo[st][rr] = ok ? (rg.resp ? (i32)max_<i64>(row_lo(rg, seq, i) - k0, -1) : -1) : BN;
        sm90::mbar_arrive(&aux_full[st]);
      }
    }
    return;
  }

  sm90::setmaxnreg_inc<240>(); /* the next step's S^T and dP^T beside this one's dS^T fragments */
  const int cw = wg - 1, tw = (int)(threadIdx.x % 128), w = tw / 32, l = tw % 32, t4 = l % 4;
  const int kn = (int)(kend - k0);
  /* this thread's keys (accumulator rows 16 w + l / 4 + 8 r of the warpgroup's 64) */
  int kr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) kr[r] = 64 * cw + 16 * w + l / 4 + 8 * r;
  const float c = scale * LOG2E;
  float gk[D / 2], gv[D / 2], st_[BQ / 2], dp[BQ / 2];
  u32 pf[BQ / 16][4], df[BQ / 16][4];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) gk[i] = gv[i] = 0.0f;
  const u8 *kw = sK + cw * 64 * 128, *vw = sV + cw * 64 * 128;
  sm90::mbar_wait(&kv_full, 0);

  /* Pipelined: S^T and dP^T of step u are issued right behind dK of step u - 1, whose stage is
   * released once the wait below has seen it done. */
  for (int u = 0; u < nu; ++u) {
    const int t = u % nq;
    const u32 st = (u32)u % STAGES, ph = ((u32)u / STAGES) & 1u;
    const u8 *qb = sQ + st * C::QBYTES, *ob = sO + st * C::QBYTES;
    /* (zeroed although the first product overwrites them: without it the compiler copies the
     * accumulators between the products, and ptxas serializes them; pinned here, so that the
     * zeros are not sunk past the fence) */
#pragma unroll
    for (int i = 0; i < BQ / 2; ++i) st_[i] = dp[i] = 0.0f;
    sm90::wgmma_fence_operands(st_);
    sm90::wgmma_fence_operands(dp);
    sm90::mbar_wait(&q_full[st], ph);
    /* S^T = K Q^T and dP^T = V dO^T over the head dim (k-step kk: 16 columns of box kk / 4) */
    sm90::wgmma_fence();
    sm90_ss_head<D, BQ, AB, C::KVBOX, C::QBOX>(st_, kw, qb);
    sm90_ss_head<D, BQ, AB, C::KVBOX, C::QBOX>(dp, vw, ob);
    sm90::wgmma_commit();
    sm90::mbar_wait(&aux_full[st], ph);
    sm90::wgmma_wait<0>();
    sm90::wgmma_fence_operands(st_);
    sm90::wgmma_fence_operands(dp);
    sm90::wgmma_fence_operands(gk);
    sm90::wgmma_fence_operands(df);
    if (u > 0 && l == 0) sm90::mbar_arrive(&q_empty[(u32)(u - 1) % STAGES]);
    /* P^T: element (key kr[r], query 8 j + 2 t4 + e of the tile) */
#pragma unroll
    for (int j = 0; j < BQ / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 8 * j + 2 * t4 + e;
        const float Lc = sL[st][col];
        const int lo = sLo[st][col];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const bool vis = kr[r] < kn && kr[r] <= t * BQ + col && kr[r] >= lo;
          const int i = 4 * j + 2 * r + e;
          st_[i] = vis ? exp2_approx(fmaf(st_[i], c, -Lc)) : 0.0f;
        }
      }
    sm90_pack_a<DT, BQ>(st_, pf);
    /* dV += P^T dO, issued before dS^T is computed so that the two overlap; then dK += dS^T Q.
     * k-step ks takes query rows 16 ks .. of the MN-major tiles. */
    const u64 dmo = sm90::smem_desc_mn(ob, C::QBOX), dmq = sm90::smem_desc_mn(qb, C::QBOX);
    sm90::wgmma_fence();
    sm90_rs_mn<D, BQ, AB>(gv, pf, dmo);
    sm90::wgmma_commit();
#pragma unroll
    for (int j = 0; j < BQ / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float Dc = sD[st][8 * j + 2 * t4 + e];
#pragma unroll
        for (int r = 0; r < 2; ++r) dp[4 * j + 2 * r + e] = st_[4 * j + 2 * r + e] * (dp[4 * j + 2 * r + e] - Dc);
      }
    sm90_pack_a<DT, BQ>(dp, df);
    sm90::wgmma_fence();
    sm90_rs_mn<D, BQ, AB>(gk, df, dmq);
    sm90::wgmma_commit();
    /* dV done (P^T's registers free for the next step's products); dK may still run */
    sm90::wgmma_wait<1>();
    sm90::wgmma_fence_operands(gv);
    sm90::wgmma_fence_operands(pf);
  }
  sm90::wgmma_wait<0>();
  sm90::wgmma_fence_operands(gv);
  sm90::wgmma_fence_operands(gk);

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (kr[r] >= kn) continue;
    const i64 at = ((k0 + kr[r]) * Hkv + hk) * D;
    u32 *gkp = (u32 *)((u16 *)p_.pass.dk + at), *gvp = (u32 *)((u16 *)p_.pass.dv + at);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      gkp[4 * j + t4] = pack<DT>(gk[4 * j + 2 * r] * scale, gk[4 * j + 2 * r + 1] * scale);
      gvp[4 * j + t4] = pack<DT>(gv[4 * j + 2 * r], gv[4 * j + 2 * r + 1]);
    }
  }
#else
  (void)p_;
#endif
}

/* The backward's dq kernel (pattn_bwd_dq_sm90): the forward's 128-row query tiles with 64-key
 * tiles in STAGES_ stages (the dq_stages setting; three accumulator tiles a thread: S, dP and dq;
 * Q and dO as A fragments). */
template <int D, int STAGES_> struct pa_sm90_dq {
  static constexpr int BM = PA_SM90_BM, BN = PA_SM90_DQ_BN, THREADS = PA_SM90_THREADS, STAGES = STAGES_;
  static constexpr int NB = D / 64;
  static constexpr u32 QBOX = 64u * 128u, KVBOX = (u32)BN * 128u;
  static constexpr u32 QBYTES = 2u * NB * QBOX, KVBYTES = NB * KVBOX;
  static constexpr u32 SMEM = 2u * QBYTES + 2u * STAGES * KVBYTES; /* plus 1024 for the alignment */
};

/* Backward dq on sm_90a: a block per (128-row query tile of a prompt, prompt, query head), the
 * forward's tiling, key tiles and masks. It runs first: its rows' delta = dO . O (O read in the
 * dO fragments' layout while the copies land) goes to the workspace for the dk/dv kernel, which
 * would otherwise need a pass of its own. The producer loads Q and dO once and the key tiles' K
 * and V into two rings; consumers 1 and 2 own 64 rows each, their Q and dO read into registers
 * once; per key tile
 *   S = Q K^T, dP = dO V^T              wgmma m64n64k16, Q and dO from registers, K and V K-major
 *                                       in shared memory (an SS product of this shape would read
 *                                       shared memory as fast as it can deliver)
 *   P = exp2(S c - lse), dS = P (dP - delta)      masked, in registers
 *   dQ += dS K                          wgmma m64nDk16, dS from registers, K MN-major
 * and dq (times the scale) leaves from registers: written once, no atomics. */
template <int DT, int D, int STAGES_>
__global__ void __launch_bounds__(PA_SM90_THREADS, 1)
    pattn_bwd_dq_sm90(RLK_PARAMS_ARG pa_bwd_sm90_args p_) {
#if defined(RLK_SM90A_ASM)
  using namespace pa;
  using C = pa_sm90_dq<D, STAGES_>;
  constexpr int BN = C::BN, NB = C::NB, STAGES = C::STAGES;
  constexpr int AB = sm90_ab<DT>;
  const float *__restrict__ lse = p_.pass.lse;
  float *__restrict__ delta = (float *)p_.pass.work;
  const i32 *__restrict__ seq = p_.pass.seq, *__restrict__ grp = p_.pass.grp;
  const i32 Hq = p_.pass.Hq, Hkv = p_.pass.Hkv;
  const float scale = p_.pass.scale;
  region rg;
  const i64 q0 = prompt_tile(seq, grp, (i32)blockIdx.y, (i64)blockIdx.x, C::BM, false, rg);
  if (q0 < 0) return;
  const i64 qend = min_(q0 + C::BM, rg.r1);
  const i32 h = (i32)blockIdx.z, hk = h / (Hq / Hkv);
  const kv_tiles kt = kv_tiles_of(rg, seq, q0, qend, BN);

  u8 *smem = sm90_smem<D, C::SMEM>();
  u8 *sQ = smem, *sO = sQ + C::QBYTES, *sK = sO + C::QBYTES, *sV = sK + STAGES * C::KVBYTES;
  __shared__ alignas(8) sm90_kv_bars<STAGES> bar;
  const int wg = (int)(threadIdx.x / 128);
  if (threadIdx.x == 0) bar.init(SM90_CONSUMER_WARPS);
  __syncthreads();

  if (wg == 0) {
    sm90::setmaxnreg_dec<24>();
    if (threadIdx.x == 0) {
      sm90::tma_prefetch_map(&p_.map_k);
      sm90::tma_prefetch_map(&p_.map_v);
      sm90::mbar_arrive_expect_tx(&bar.q_full, 2u * C::QBYTES);
      for (int half = 0; half < 2; ++half) {
        sm90_load_head<D>(sQ + half * NB * C::QBOX, C::QBOX, &p_.map_q, h * D, (i32)(q0 + 64 * half), &bar.q_full);
        sm90_load_head<D>(sO + half * NB * C::QBOX, C::QBOX, &p_.map_do, h * D, (i32)(q0 + 64 * half), &bar.q_full);
      }
      sm90_load_kv<D, STAGES, C::KVBOX>(sK, sV, &p_.map_k, &p_.map_v, kt, hk, bar);
    }
    return;
  }

  sm90::setmaxnreg_inc<240>(); /* the Q and dO fragments take 64 registers a thread */
  const int cw = wg - 1, l = (int)(threadIdx.x % 32), t4 = l % 4;
  /* this thread's two rows, what they see (the forward's bounds), their lse (log2 units) and
   * their O in the dO fragments' layout (u32 4 j + t4 of a row: columns 8 j + 2 t4, + 1), loaded
   * while the tile's copies land */
  const sm90_rows rs(rg, seq, q0 + 64 * cw, qend);
  float L[2], Dl[2];
  u32 ov[2][D / 8];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const i64 ri = min_(rs.row[r], qend - 1);
    L[r] = lse[ri * Hq + h] * LOG2E;
    const u32 *__restrict__ orow = (const u32 *)((const u16 *)p_.pass.o + (ri * Hq + h) * D);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) ov[r][j] = orow[4 * j + t4];
  }
  const float c = scale * LOG2E;
  float acc[D / 2], s_[BN / 2], dp[BN / 2];
  u32 df[BN / 16][4], qf[D / 16][4], of[D / 16][4];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.0f;
  sm90::mbar_wait(&bar.q_full, 0);
  sm90_load_a<D>(qf, sQ + cw * NB * C::QBOX, C::QBOX);
  sm90_load_a<D>(of, sO + cw * NB * C::QBOX, C::QBOX);
  /* delta = dO . O of each row (what pattn_bwd_prep computes on the other paths), summed over the
   * row's quad, written once for pattn_bwd_dkdv_sm90, which runs next */
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) sum += dot2<DT>(of[j / 2][r + 2 * (j % 2)], ov[r][j]);
    sum += shfl_xor(sum, 1);
    sum += shfl_xor(sum, 2);
    Dl[r] = sum;
    if (t4 == 0 && rs.row[r] < qend) delta[rs.row[r] * Hq + h] = sum;
  }

  for (int t = 0; t < kt.n; ++t) {
    const u32 st = (u32)t % STAGES, ph = ((u32)t / STAGES) & 1u;
    const i64 kv0 = kt.start(t);
    const u8 *kb = sK + st * C::KVBYTES, *vb = sV + st * C::KVBYTES;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) s_[i] = dp[i] = 0.0f; /* see pattn_bwd_dkdv_sm90 */
    sm90::mbar_wait(&bar.k_full[st], ph);
    sm90::mbar_wait(&bar.v_full[st], ph);
    sm90::wgmma_fence();
    sm90_rs_head<D, BN, AB, C::KVBOX>(s_, qf, kb);
    sm90_rs_head<D, BN, AB, C::KVBOX>(dp, of, vb);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::wgmma_fence_operands(s_);
    sm90::wgmma_fence_operands(dp);
    sm90::wgmma_fence_operands(qf);
    sm90::wgmma_fence_operands(of);
    if (l == 0) sm90::mbar_arrive(&bar.v_empty[st]);

    const bool phase_a = t < kt.na;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int lo, hi;
      rs.bounds<BN>(r, phase_a, kv0, lo, hi);
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 4 * j + 2 * r + e, off = 8 * j + 2 * t4 + e;
          const float pj = off < lo || off > hi ? 0.0f : exp2_approx(fmaf(s_[i], c, -L[r]));
          s_[i] = pj * (dp[i] - Dl[r]);
        }
    }
    sm90_pack_a<DT, BN>(s_, df);
    /* dQ += dS K: k-step ks takes keys 16 ks .. of the MN-major K tile */
    const u64 dk_ = sm90::smem_desc_mn(kb, C::KVBOX);
    sm90::wgmma_fence();
    sm90_rs_mn<D, BN, AB>(acc, df, dk_);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::wgmma_fence_operands(acc);
    sm90::wgmma_fence_operands(df);
    if (l == 0) sm90::mbar_arrive(&bar.k_empty[st]);
  }
  const float mul[2] = {scale, scale};
  sm90_store_rows<DT, D>(p_.pass.dq, rs, qend, Hq, h, acc, mul);
#else
  (void)p_;
#endif
}

} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_PREFIX_ATTENTION_SM90_CUH */

/* linear_logprob_bwd_sm90.cuh - rlk_linear_logprob_backward on sm_90a: the three GEMMs of a
 * vocabulary chunk [c0, c0 + nv) by TMA + wgmma, one kernel with the product chosen by KIND:
 *
 *   KIND 0, dz   dz [N][nv] (16-bit, the inputs' dtype) from z = h W_c^T: A = h, B = W_c, both
 *                K-major (K = H); the epilogue turns each logit into its gradient,
 *                dz = (g_lp (onehot(y) - p) - g_H p (z - E)) / T with p = exp(z - lse)
 *   KIND 1, dh   dh [N][H] (f32, the workspace) (+)= dz W_c: A = dz (K-major, K = nv),
 *                B = W_c stored [nv][H] (MN-major)
 *   KIND 2, dw   grad_weight[c0 + v] (+)= dz[:, v]^T h: A = dz^T and B = h, both MN-major
 *                (K = N, the tokens)
 *
 * A block owns one 128 x 256 output tile (tiles in groups of 8 rows of tiles, so that the blocks
 * resident together share their operand panels in L2) and walks K in steps of 64 through a ring
 * of STAGES stages of 48 KB. Warpgroup 0 is the producer (one thread issues the TMA copies);
 * warpgroups 1 and 2 each multiply 64 rows by the 256 columns (m64n256k16, 128 f32 accumulators
 * a thread), then write their rows. K-major operands arrive as one box (64 K columns x rows),
 * MN-major ones as boxes of 64 MN columns x 64 K rows (hopper_wgmma.cuh's smem_desc_mn). Parts
 * of a box past a tensor's end are zero-filled, so K tails add nothing.
 *
 * Every output element is written by one block, its K sum in a fixed order, and the host walks
 * the chunks in order: the gradients are bitwise the same run after run. */
#ifndef RLK_LINEAR_LOGPROB_BWD_SM90_CUH
#define RLK_LINEAR_LOGPROB_BWD_SM90_CUH

#include "hopper_tma.cuh"
#include "hopper_wgmma.cuh"
#include "linear_logprob_common.cuh"

#if defined(RLK_CUDA)
namespace rlk {

namespace ll {
RLK_PARAMS_DECLARE(BwdSm90Params, RLK_LL_BWD_SM90_PARAMS, RLK_LL_BWD_SM90_PARAMS_SIZE);
}

struct ll_bwd_sm90 {
  static constexpr int BM = 128, BN = 256, BK = 64, THREADS = 384, STAGES = 4, GROUP = 8;
  static constexpr u32 ABYTES = (u32)BM * BK * 2, BBYTES = (u32)BN * BK * 2, BOX = 64u * 128u;
  static constexpr u32 STAGE = ABYTES + BBYTES;
  enum { DZ = 0, DH = 1, DW = 2 };
};

/* Stores a pair of adjacent f32 values as T (both, or only the first when `both` is false). */
template <typename T> RLK_DEVICE void ll_store_pair(T *p, float a, float b, bool both, bool vec) {
  if (both && vec) {
    if constexpr (sizeof(T) == 4) {
      f32x2 v;
      v.x = a;
      v.y = b;
      *(f32x2 *)p = v;
    } else {
      T lo = store_as<T>::from(a), hi = store_as<T>::from(b);
      *(u32 *)p = (u32)lo.bits | ((u32)hi.bits << 16);
    }
  } else {
    p[0] = store_as<T>::from(a);
    if (both) p[1] = store_as<T>::from(b);
  }
}

template <int KIND, int DT, typename L, bool ENTROPY, int GDT>
__global__ void __launch_bounds__(384, 1)
    linear_logprob_bwd_sm90(const __grid_constant__ tensor_map map_a,
                            const __grid_constant__ tensor_map map_b, RLK_PARAMS_ARG ll::BwdSm90Params p_) {
#if defined(RLK_SM90A_ASM)
  typedef ll_bwd_sm90 C;
  constexpr int BM = C::BM, BN = C::BN, BK = C::BK, STAGES = C::STAGES;
  constexpr u32 ABYTES = C::ABYTES, STAGE = C::STAGE, BOX = C::BOX;
  constexpr int TA = KIND == C::DW ? 1 : 0, TB = KIND == C::DZ ? 0 : 1;
  constexpr int AB = DT == ll::DT_BF16 ? sm90::WGMMA_BF16 : sm90::WGMMA_F16;
  constexpr u32 CONSUMER_WARPS = 8;
  extern __shared__ __align__(1024) u8 llb_smem_raw[];
  u8 *smem = (u8 *)(((u64)llb_smem_raw + 1023u) & ~(u64)1023u);
  __shared__ alignas(8) u64 full[STAGES];
  __shared__ alignas(8) u64 empty[STAGES];
  const int wg = (int)(threadIdx.x / 128);
  /* the tile: groups of GROUP tile rows, column-major inside a group */
  const int tiles_m = p_.tiles_m, tiles_n = p_.tiles_n, bid = (int)blockIdx.x;
  const int per_group = C::GROUP * tiles_n, first = bid / per_group * C::GROUP;
  const int gsize = min_(tiles_m - first, C::GROUP);
  const int tm = first + (bid % per_group) % gsize, tn = (bid % per_group) / gsize;
  const i64 m0 = (i64)tm * BM, n0 = (i64)tn * BN;
  const int kblocks = (int)((p_.K + BK - 1) / BK);
  if (threadIdx.x == 0) sm90::ring_init<STAGES>(full, empty, CONSUMER_WARPS);
  __syncthreads();

  if (wg == 0) {
    /* producer: A then B of each K step; dh reads W's rows from c0, dz W's columns from c0 */
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      sm90::tma_prefetch_map(&map_a);
      sm90::tma_prefetch_map(&map_b);
      const i32 b_k0 = KIND == C::DH ? (i32)p_.c0 : 0, b_n0 = (i32)(n0 + (KIND == C::DZ ? p_.c0 : 0));
      for (int kb = 0; kb < kblocks; ++kb) {
        const u32 s = (u32)kb % STAGES;
        if (kb >= STAGES) sm90::mbar_wait(&empty[s], (((u32)kb / STAGES) - 1u) & 1u);
        sm90::mbar_arrive_expect_tx(&full[s], STAGE);
        u8 *a = smem + s * STAGE, *b = a + ABYTES;
        if (TA == 0) {
          sm90::tma_load_2d(a, &map_a, kb * BK, (i32)m0, &full[s]);
        } else {
          sm90::tma_load_2d(a, &map_a, (i32)m0, kb * BK, &full[s]);
          sm90::tma_load_2d(a + BOX, &map_a, (i32)m0 + 64, kb * BK, &full[s]);
        }
        if (TB == 0) {
          sm90::tma_load_2d(b, &map_b, kb * BK, b_n0, &full[s]);
        } else {
#pragma unroll
          for (int j = 0; j < BN / 64; ++j)
            sm90::tma_load_2d(b + BOX * (u32)j, &map_b, b_n0 + 64 * j, b_k0 + kb * BK, &full[s]);
        }
      }
    }
    return;
  }

  /* consumers */
  sm90::setmaxnreg_inc<232>();
  const int cw = wg - 1, tw = (int)(threadIdx.x % 128), w = tw / 32, l = tw % 32;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  sm90::wgmma_fence_operands(acc);
  for (int kb = 0; kb < kblocks; ++kb) {
    const u32 s = (u32)kb % STAGES;
    sm90::mbar_wait(&full[s], ((u32)kb / STAGES) & 1u);
    const u8 *a = smem + s * STAGE, *b = a + ABYTES;
    const u64 da = TA == 0 ? sm90::smem_desc(a + cw * 64 * 128, sm90::SWIZZLE_128B, 0, 1024)
                           : sm90::smem_desc_mn(a + cw * BOX, BOX);
    const u64 db = TB == 0 ? sm90::smem_desc(b, sm90::SWIZZLE_128B, 0, 1024) : sm90::smem_desc_mn(b, BOX);
    constexpr u32 ASTEP = TA == 0 ? 32u : 2048u, BSTEP = TB == 0 ? 32u : 2048u;
    sm90::wgmma_fence();
#pragma unroll
    for (int k = 0; k < BK / 16; ++k)
      sm90::wgmma<BN>::template ss<AB, TA, TB>(acc, sm90::desc_advance(da, ASTEP * k),
                                               sm90::desc_advance(db, BSTEP * k), (kb > 0 || k > 0) ? 1u : 0u);
    sm90::wgmma_commit();
    if (kb > 0) {
      /* the previous stage's products are done: hand it back */
      sm90::wgmma_wait<1>();
      if (l == 0) sm90::mbar_arrive(&empty[(u32)(kb - 1) % STAGES]);
    }
  }
  sm90::wgmma_wait<0>();
  sm90::wgmma_fence_operands(acc);

  /* epilogue: acc[4 j + 2 i + e] is row 16 w + l / 4 + 8 i, column 8 j + 2 (l % 4) + e */
  const i64 M = p_.M, NC = p_.Nn, ostride = p_.out_stride;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const i64 r = m0 + cw * 64 + 16 * w + l / 4 + 8 * i;
    if (r >= M) continue;
    if (KIND == C::DZ) {
      typedef typename ll::elem<DT>::type T;
      const L *__restrict__ labels = (const L *)p_.labels;
      const i64 yg = ll::load_label(labels, r, p_.label_stride), y = yg - p_.vocab_start;
      const bool ignored = yg == p_.ignore_index;
      const bool bad = !ignored && !p_.shard && (y < 0 || y >= p_.V);
      if (bad && p_.status && p_.c0 == 0 && tn == 0 && (l & 3) == 0)
        atomicOr((int *)p_.status, (int)ll::STATUS_BAD_LABEL);
      const float temperature = p_.temperature, inv_t = 1.0f / temperature, c = RLK_LL_LOG2E / temperature;
      const float lse2 = p_.lse[r * p_.lse_s] * RLK_LL_LOG2E;
      const float gl = p_.g_lp ? p_.g_lp[r * p_.glp_s] : 0.0f;
      const float gh = ENTROPY && p_.g_ent ? p_.g_ent[r * p_.gent_s] : 0.0f;
      const float E = ENTROPY && p_.g_ent ? p_.lse[r * p_.lse_s] - p_.entropy[r * p_.ent_s] : 0.0f;
      const i64 yc = y - p_.c0 - n0; /* the label's column in this tile */
      T *out = (T *)p_.out + r * ostride + n0;
      const bool vec = true; /* dz: the workspace, pitch a multiple of 256 */
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int col = 8 * j + 2 * (l % 4);
        if (n0 + col >= NC) continue;
        float g[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = acc[4 * j + 2 * i + e];
          if (ignored) {
            g[e] = 0.0f;
          } else if (bad) {
            g[e] = limits<float>::quiet_nan();
          } else {
            const float p = exp2_approx(fmaf(x, c, -lse2));
            float v = gl * (((i64)(col + e) == yc ? 1.0f : 0.0f) - p);
            if (ENTROPY) v -= gh * p * (x * inv_t - E);
            g[e] = v * inv_t;
          }
        }
        ll_store_pair<T>(out + col, g[0], g[1], n0 + col + 1 < NC, vec);
      }
    } else {
      /* dh (GDT 0: f32, the workspace) or grad_weight's rows from c0 */
      typedef typename ll::elem<GDT>::type G;
      G *out = (G *)p_.out + (KIND == C::DW ? p_.c0 + r : r) * ostride + n0;
      const bool add = p_.accumulate != 0;
      /* pairs as one store where the row stride and base keep them aligned */
      const bool vec = (ostride % 2) == 0 && ((u64)p_.out % (2 * sizeof(G))) == 0;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int col = 8 * j + 2 * (l % 4);
        if (n0 + col >= NC) continue;
        const bool both = n0 + col + 1 < NC;
        float a0 = acc[4 * j + 2 * i], a1 = acc[4 * j + 2 * i + 1];
        if (add) {
          a0 += to_float(out[col]);
          if (both) a1 += to_float(out[col + 1]);
        }
        ll_store_pair<G>(out + col, a0, a1, both, vec);
      }
    }
  }
#else
  (void)map_a, (void)map_b, (void)p_;
#endif
}

} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_LINEAR_LOGPROB_BWD_SM90_CUH */

/* linear_logprob_sm90_tile.cuh - what rlk_linear_logprob's sm_90a kernels (the forward and the
 * backward's three products) share: the 128 x 256 tile and its ring of 48 KB stages, and a consumer
 * warpgroup's walk down a tile's K.
 *
 * A stage holds A's box (128 rows x 64 K, 16 KB) and then B's (256 x 64, 32 KB); an operand is
 * K-major (one box, 128-byte swizzle) or MN-major (boxes of 64 MN columns x 64 K rows,
 * hopper_wgmma.cuh's smem_desc_mn). Consumer warpgroup cw multiplies A's rows [64 cw, 64 cw + 64)
 * by B's 256 columns (wgmma m64n256k16, 128 f32 accumulators a thread). */
#ifndef RLK_LINEAR_LOGPROB_SM90_TILE_CUH
#define RLK_LINEAR_LOGPROB_SM90_TILE_CUH

#include "hopper_mbarrier.cuh"
#include "hopper_wgmma.cuh"
#include "linear_logprob_common.cuh"

#if defined(RLK_CUDA)
namespace rlk {

/* Tile shape and ring (linear_logprob_params.h declares them for the op's launch shapes and shared
 * memory too). */
struct ll_sm90 {
  static constexpr int BM = LL_SM90_BM, BN = LL_SM90_BN, BK = LL_SM90_BK, THREADS = LL_SM90_THREADS;
  static constexpr u32 ABYTES = (u32)BM * BK * 2, BBYTES = (u32)BN * BK * 2, BOX = LL_SM90_BOX_BYTES;
  static constexpr u32 STAGE = ABYTES + BBYTES;
  static_assert(STAGE == LL_SM90_STAGE_BYTES, "a stage: the 16-bit A and B boxes of one K step");
};

/* Hands a stage back (one consumer warp's arrival): to this block's producer, or in a cluster of
 * cl blocks whose producers each multicast part of the B box into all of them, to every block's. */
RLK_DEVICE void ll_sm90_release(u64 *empty, u32 cl) {
  if (cl == 1u) {
    sm90::mbar_arrive(empty);
  } else {
    for (u32 r = 0; r < cl; ++r) sm90::mbar_arrive_cluster(empty, r);
  }
}

/* One tile's products for consumer warpgroup cw (lane l of its warp): the K steps [0, kblocks)
 * from ring positions it, it + 1, ... (it advances past them; the ring runs on across tiles). The
 * tile's first product overwrites acc (scale-d 0): no zeroing between tiles; with `carry` it adds
 * to the acc the caller loaded (a K chain continued from a sum in memory: the same operations as
 * one longer chain). Each stage goes back to the producer (empty) once the products reading it
 * are done (ll_sm90_release: in a cluster of cl blocks, to each of them); at the end acc is complete.
 * TA, TB: 0 K-major, 1 MN-major; AB: the wgmma input type. */
template <int STAGES, int AB, int TA, int TB>
RLK_DEVICE void ll_sm90_tile_products(float (&acc)[ll_sm90::BN / 2], u64 *full, u64 *empty, const u8 *smem, int cw,
                                      int l, int kblocks, u32 &it, bool carry = false, u32 cl = 1u) {
  typedef ll_sm90 C;
  constexpr u32 ASTEP = TA == 0 ? 32u : 2048u, BSTEP = TB == 0 ? 32u : 2048u;
  for (int kb = 0; kb < kblocks; ++kb, ++it) {
    const u32 s = it % STAGES;
    sm90::mbar_wait(&full[s], (it / STAGES) & 1u);
    const u8 *a = smem + s * C::STAGE, *b = a + C::ABYTES;
    const u64 da = TA == 0 ? sm90::smem_desc(a + cw * 64 * 128, sm90::SWIZZLE_128B, 0, 1024)
                           : sm90::smem_desc_mn(a + cw * C::BOX, C::BOX);
    const u64 db = TB == 0 ? sm90::smem_desc(b, sm90::SWIZZLE_128B, 0, 1024) : sm90::smem_desc_mn(b, C::BOX);
    sm90::wgmma_fence();
#pragma unroll
    for (int k = 0; k < C::BK / 16; ++k)
      sm90::wgmma<C::BN>::template ss<AB, TA, TB>(acc, sm90::desc_advance(da, ASTEP * k),
                                                  sm90::desc_advance(db, BSTEP * k),
                                                  (carry || kb > 0 || k > 0) ? 1u : 0u);
    sm90::wgmma_commit();
    if (kb > 0) {
      /* the previous stage's products are done: hand it back */
      sm90::wgmma_wait<1>();
      if (l == 0) ll_sm90_release(&empty[(it - 1u) % STAGES], cl);
    }
  }
  sm90::wgmma_wait<0>();
  if (l == 0) ll_sm90_release(&empty[(it - 1u) % STAGES], cl);
  sm90::wgmma_fence_operands(acc);
}

/* A consumer warpgroup none of whose rows exists (past N: a call of fewer rows than the tile's)
 * hands each of a tile's stages back once it is filled, with no products: the ring runs on as
 * if it had multiplied (the other warpgroup's products and records are the same either way), and
 * the tensor cores do half a tile's work where a call has at most 64 rows. */
RLK_DEVICE void ll_sm90_tile_pass(u64 *full, u64 *empty, int l, int kblocks, u32 &it, int stages, u32 cl = 1u) {
  for (int kb = 0; kb < kblocks; ++kb, ++it) {
    const u32 s = it % (u32)stages;
    sm90::mbar_wait(&full[s], (it / (u32)stages) & 1u);
    __syncwarp();
    if (l == 0) ll_sm90_release(&empty[s], cl);
  }
}

/* A consumer thread's accumulators hold, for its rows i = 0, 1, the columns 8 j + 2 (l % 4) + e of
 * the tile in acc[4 j + 2 i + e]; q = 2 j + e numbers a row's 64. */

/* Columns past the output's last (Nn, from the tile's first n0) count as -inf: only the tile that
 * crosses it pays the compares. */
RLK_DEVICE void ll_mask_past(float (&acc)[ll_sm90::BN / 2], i64 Nn, i64 n0, int l) {
  constexpr int BN = ll_sm90::BN;
  if (n0 + BN <= Nn) return;
  const int lim = (int)(Nn - n0) - 2 * (l % 4);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (8 * j + e >= lim) acc[4 * j + e] = acc[4 * j + 2 + e] = -limits<float>::infinity();
}

/* q of the tile-local column yc for the thread at lane l, or -1 where yc is not one of the tile's
 * `left` columns inside the output or belongs to another lane. */
RLK_DEVICE int ll_owned_q(i64 yc, i64 left, int l) {
  return yc >= 0 && yc < ll_sm90::BN && yc < left && (int)((yc >> 1) & 3) == (l & 3)
             ? (int)(((yc >> 3) << 1) | (yc & 1))
             : -1;
}

/* Row i's value q for a run-time q, kept in registers (an indexed read would put acc in local
 * memory): a select a column, for the rare thread that needs it. */
RLK_DEVICE float ll_pick(const float (&acc)[ll_sm90::BN / 2], int i, int q) {
  float x = 0.0f;
#pragma unroll
  for (int k = 0; k < ll_sm90::BN / 4; ++k) x = k == q ? acc[4 * (k >> 1) + 2 * i + (k & 1)] : x;
  return x;
}

/* The tile's raw logits of a consumer thread's rows row[0], row[1] (those below N) into logits
 * [N][pitch] (f32, pitch a multiple of 4 elements, 16-byte aligned rows), columns below V, pairs
 * of adjacent columns as one 8-byte store. */
RLK_DEVICE void ll_store_logits(const float (&acc)[ll_sm90::BN / 2], float *logits, i64 pitch, const i64 (&row)[2],
                                i64 N, i64 n0, i64 V, int l) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (row[i] >= N) continue;
    float *out = logits + row[i] * pitch + n0;
#pragma unroll
    for (int j = 0; j < ll_sm90::BN / 8; ++j) {
      const int col = 8 * j + 2 * (l % 4);
      if (n0 + col + 1 < V) {
        f32x2 v;
        v.x = acc[4 * j + 2 * i], v.y = acc[4 * j + 2 * i + 1];
        *(f32x2 *)(out + col) = v;
      } else if (n0 + col < V) {
        out[col] = acc[4 * j + 2 * i];
      }
    }
  }
}

/* Row i's record of one 256-column tile (ll::part in the units of linear_logprob_common.cuh),
 * the same bits in every kernel that calls it (the forward, the token chunks' logits kind, the
 * rollout's sampling head): m = M = the tile's largest x c (a max over the row's four lanes), then
 * s = sum 2^(x c - M) and q = sum 2^(x c - M) (x c - M) relative to it, each lane's 64 columns in
 * two alternating chains, the four lanes added by butterfly (both orders give the same floats), and
 * t = the label's x (qy: its q on the one lane that holds it, else -1). Columns given as -inf add
 * exactly 0 (with the entropy the exponent is clamped, so that they add 0 to q too); a tile with
 * every column -inf gives m = -inf and s = q = 0. Kept-set replay: x below the row's threshold thr
 * (-inf: none) counts as -inf, the label included (t keeps its logit; the combine merges it back,
 * ll::with_label). U: acc's values of row i become u = 2^(x c - M) (what the token chunks store).
 * Every lane of the warp calls it. */
template <bool ENTROPY, bool U>
RLK_DEVICE ll::part ll_tile_record(float (&acc)[ll_sm90::BN / 2], int i, float c, int qy,
                                   float thr = -limits<float>::infinity()) {
  constexpr int BN = ll_sm90::BN;
  float t = qy >= 0 ? ll_pick(acc, i, qy) : 0.0f;
  if (thr != -limits<float>::infinity()) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float &x = acc[4 * j + 2 * i + e];
        x = x < thr ? -limits<float>::infinity() : x;
      }
  }
  float m0 = -limits<float>::infinity(), m1 = m0;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    m0 = fmaxf(m0, acc[4 * j + 2 * i]);
    m1 = fmaxf(m1, acc[4 * j + 2 * i + 1]);
  }
  float mx = fmaxf(m0, m1);
  mx = fmaxf(mx, shfl_xor(mx, 1));
  mx = fmaxf(mx, shfl_xor(mx, 2));
  const float M = mx * c, Mc = M == -limits<float>::infinity() ? 0.0f : M;
  float s0 = 0.0f, s1 = 0.0f, q0 = 0.0f, q1 = 0.0f;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float &x = acc[4 * j + 2 * i + e];
      const float d = ENTROPY ? fmaxf(fmaf(x, c, -Mc), -256.0f) : fmaf(x, c, -Mc), u = exp2_approx(d);
      (e ? s1 : s0) += u;
      if (ENTROPY) (e ? q1 : q0) = fmaf(u, d, e ? q1 : q0);
      if (U) x = u;
    }
  float s = s0 + s1, q = q0 + q1;
  s += shfl_xor(s, 1);
  s += shfl_xor(s, 2);
  if (ENTROPY) {
    q += shfl_xor(q, 1);
    q += shfl_xor(q, 2);
  }
  t += shfl_xor(t, 1);
  t += shfl_xor(t, 2);
  ll::part rec;
  rec.m = M, rec.s = s, rec.q = ENTROPY ? q : 0.0f, rec.t = t;
  return rec;
}

} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_LINEAR_LOGPROB_SM90_TILE_CUH */

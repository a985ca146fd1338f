/* linear_logprob_bwd_sm90.cuh - rlk_linear_logprob_backward on sm_90a: the three GEMMs of a
 * vocabulary chunk [c0, c0 + nv) by TMA + wgmma, one kernel with the product chosen by KIND:
 *
 *   KIND 0, dz   dz [N][nv] (16-bit, the inputs' dtype) from z = h W_c^T: A = h, B = W_c, both
 *                K-major (K = H); the epilogue turns each logit into its gradient,
 *                dz = (g_lp (onehot(y) - p) - g_H p (z - E)) / T with p = exp(z - lse) (kept-set
 *                replay: p 0 below the row's threshold, but for the label)
 *   KIND 1, dh   dh [N][H] (f32, the workspace) (+)= dz W_c: A = dz (K-major, K = nv),
 *                B = W_c stored [nv][H] (MN-major)
 *   KIND 2, dw   grad_weight[c0 + v] (+)= dz[:, v]^T h: A = dz^T and B = h, both MN-major
 *                (K = N, the tokens)
 *   KIND 3, logits  (rlk_linear_policy_loss's token chunks, every column: c0 = 0, Nn = V) as dz,
 *                but the epilogue stores u = 2^(x c - m) in 16 bits, m the row's maximum x c over
 *                the tile, and the tile's record (m, sum u, sum u (x c - m), the label's x) into
 *                partials [tiles_n][M]: the forward's records, one split a tile (ll::part).
 *                linear_logprob_stored.cuh turns u into dz once the loss has its gradient.
 *   KIND 4, logits_t  the logits kind over all of a call's tokens, u stored transposed, u^T [V][M]:
 *                columns [0, ksplit) into map_c (the workspace), the rest into map_d at row
 *                v - ksplit (grad_weight's memory, free until its first write; ksplit a multiple
 *                of 256, so that a tile goes to one map). The 16-bit tile leaves through stmatrix
 *                .trans into boxes of 64 columns x 64 tokens.
 *   KIND 5, dh_t  dh as KIND 1 from that u^T (once dz): A = dz MN-major, its K rows [0, ksplit)
 *                from map_a and the rest from map_d. grad_weight's slices are KIND 1 products
 *                too (A = a slice of dz^T, K-major over the tokens; B = h).
 *
 * The blocks are persistent (one per multiprocessor at most): block b computes the 128 x 256
 * output tiles b, b + gridDim.x, ... (tiles in groups of 8 rows of tiles, so that the blocks
 * resident together share their operand panels in L2), walking K in steps of 64 through a ring of
 * 48 KB stages that runs on from one tile to the next: the producer loads the next tile's first
 * stages while the consumers write the last one. Warpgroup 0 is the producer (one thread issues
 * the TMA copies); warpgroups 1 and 2 each multiply 64 rows by the 256 columns (m64n256k16, 128
 * f32 accumulators a thread), then write their rows. K-major operands arrive as one box (64 K
 * columns x rows), MN-major ones as boxes of 64 MN columns x 64 K rows (hopper_wgmma.cuh's
 * smem_desc_mn). Parts of a box past a tensor's end are zero-filled, so K tails add nothing.
 *
 * dz's epilogue is the long one (an exponential an element, and the whole tile stored in 16
 * bits): each consumer writes its 64 x 256 gradients into a staging area of shared memory in the
 * 128-byte-swizzled layout of four 64 x 64 boxes, and one thread hands them to TMA stores
 * (map_c: dz), which clip at the chunk's edges and drain while the next tile's products run. The
 * area holds half a tile (32 KB, beside the four 48 KB stages: a third stage would leave the
 * products waiting on their operands), so each consumer writes its columns in two halves; the row
 * inputs (label, lse, upstream gradients) are read before a tile's products, not after.
 *
 * dh's f32 sum and grad_weight, where a tensor map describes them (p_.staged; map_c: the output
 * in boxes of 64 rows x 32 f32 or 64 16-bit columns), leave the same way (a quarter of a
 * consumer's f32 columns, or half of its 16-bit ones, at a time) by TMA stores, or by TMA
 * reduce-adds when adding to grad_weight (done in L2 while the next tile's products run). dh's
 * sum over the chunks is one K chain: a tile of a chunk after the first loads the sum so far into
 * its accumulators before its products (ll_carry_load), so a row's grad_hidden is the same bits
 * whatever the chunk width (linear_logprob_plan.h). Other outputs are written from registers.
 *
 * Every output element is written by one block, its K sum in a fixed order, and the host walks
 * the chunks in order: the gradients are bitwise the same run after run. */
#ifndef RLK_LINEAR_LOGPROB_BWD_SM90_CUH
#define RLK_LINEAR_LOGPROB_BWD_SM90_CUH

#include "hopper_tma.cuh"
#include "linear_logprob_common.cuh"
#include "linear_logprob_sm90_tile.cuh"

#if defined(RLK_CUDA)
namespace rlk {

namespace ll {
typedef ::ll_bwd_sm90_args BwdSm90Params;
}

/* Tile and ring shapes (src/ops/linear_logprob_bwd.c mirrors the launch shape and shared memory). */
struct ll_bwd_sm90 : ll_sm90 {
  static constexpr int STAGES = LL_SM90_STAGES;
  static constexpr u32 STAGING = LL_SM90_STAGING_BYTES; /* dz: two consumers x two 64 x 64 16-bit boxes */
  enum { DZ = 0, DH = 1, DW = 2, LOGITS = 3, LOGITS_T = 4, DH_T = 5 };
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

/* Tile `tile` of tiles_m x tiles_n: groups of `group` tile rows (the call's), column-major inside a
 * group, so that consecutive tiles (the blocks resident together) share their operand panels in L2. */
RLK_DEVICE void ll_bwd_tile(int tile, int tiles_m, int tiles_n, int group, int *tm, int *tn) {
  const int per_group = group * tiles_n, first = tile / per_group * group;
  const int gsize = min_(tiles_m - first, group);
  *tm = first + (tile % per_group) % gsize;
  *tn = (tile % per_group) / gsize;
}

/* What dz's epilogue needs of a row, read before the tile's products. */
struct ll_dz_row {
  float lse2, gl, gh, E; /* lse in base 2; the upstream gradients; lse - entropy */
  float thr;             /* kept-set replay: the threshold (-inf: every logit) */
  i64 y;                 /* the label's column in the chunk */
  bool ignored, bad;
};

template <typename L, bool ENTROPY>
RLK_DEVICE ll_dz_row ll_dz_row_inputs(const ll::BwdSm90Params &p_, i64 r) {
  ll_dz_row d;
  d.lse2 = d.gl = d.gh = d.E = 0.0f;
  d.thr = -limits<float>::infinity();
  d.y = -1;
  d.ignored = true;
  d.bad = false;
  if (r >= p_.M) return d;
  const i64 yg = ll::load_label((const L *)p_.labels, r, p_.label_stride), y = yg - p_.vocab_start;
  d.ignored = yg == p_.ignore_index;
  d.bad = !d.ignored && !p_.shard && (y < 0 || y >= p_.V);
  d.y = y - p_.c0;
  const float lse = p_.lse[r * p_.lse_s];
  d.lse2 = lse * RLK_LL_LOG2E;
  d.gl = p_.g_lp ? p_.g_lp[r * p_.glp_s] : 0.0f;
  if (ENTROPY && p_.g_ent) {
    d.gh = p_.g_ent[r * p_.gent_s];
    d.E = lse - p_.entropy[r * p_.ent_s];
  }
  if (p_.threshold) d.thr = ld_ro(p_.threshold + r);
  return d;
}

/* The staging's two hands. ll_stage_take: the consumer's last stores have read its staging, which
 * its 128 threads may write again. ll_stage_give: the written staging (two boxes) goes to TMA
 * stores, or reduce-adds when `add`, box b at coordinates (x0 + dx b, y0 + dy b) (inner, outer),
 * issued by thread 0 of the consumer. */
RLK_DEVICE void ll_stage_take(int tw, u32 barrier) {
  if (tw == 0) sm90::tma_store_wait<0>();
  sm90::bar_sync(barrier, 128);
}
RLK_DEVICE void ll_stage_give(const tensor_map *map_c, u8 *stage, i64 x0, i64 dx, i64 y0, i64 dy, int tw,
                              u32 barrier, bool add) {
  sm90::fence_proxy_async();
  sm90::bar_sync(barrier, 128);
  if (tw == 0) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const i32 c0 = (i32)(x0 + dx * b), c1 = (i32)(y0 + dy * b);
      if (add)
        sm90::tma_reduce_add_2d(map_c, stage + (u32)b * ll_bwd_sm90::BOX, c0, c1);
      else
        sm90::tma_store_2d(map_c, stage + (u32)b * ll_bwd_sm90::BOX, c0, c1);
    }
    sm90::tma_store_commit();
  }
}

/* The one element of a consumer thread's 64 a row (q = 2 j + e: column 8 j + 2 (l % 4) + e of
 * the tile) that the generic formula of a 16-bit epilogue does not give: the label's column, whose
 * value the thread that owns it works out on its own (q < 0: none here). */
struct ll_patch {
  int q[2];
  float v[2];
};

/* A consumer thread's values of columns [128 HALF, 128 HALF + 128) packed in 16-bit pairs:
 * packed[i][jj] holds value(i, j, 0) and value(i, j, 1), j = 16 HALF + jj. Computed before the
 * staging is waited for, so that the previous half's stores drain meanwhile. */
template <int HALF, int DT, typename F>
RLK_DEVICE void ll_pack_half(const F &value, u32 (&packed)[2][ll_bwd_sm90::BN / 16]) {
  constexpr int J = ll_bwd_sm90::BN / 16;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int jj = 0; jj < J; ++jj) {
      const int j = HALF * J + jj;
      const float a = value(i, j, 0), b = value(i, j, 1);
      packed[i][jj] = sm90::pack_half2<DT == RLK_DT_BF16>(a, b);
    }
}

/* A 16-bit output's epilogue for one consumer, columns [128 HALF, 128 HALF + 128) of its rows
 * (r0 + 8 i, i = 0, 1 for this thread): value(i, j, e) is the element at row i, column
 * n0 + 8 j + 2 (l % 4) + e (from acc[4 j + 2 i + e]), and where PATCH the elements that `patch`
 * names take its values instead (a branch on the rare threads that own one, so that the formula
 * costs no compare an element). The half is computed and packed into registers first, so that the
 * previous half's stores read the staging meanwhile; then it goes into `stage` as two 64 x 64
 * boxes of 128-byte rows with the 128-byte swizzle (16-byte chunk c of row r at c ^ (r % 8): the
 * eight rows a warp writes at once land on distinct banks), and thread 0 of the consumer hands them
 * to TMA stores (reduce-adds when `add`) at (n0 + 128 HALF + 64 b, m0w). */
template <int HALF, int DT, bool PATCH = false, typename F>
RLK_DEVICE void ll_b16_half(const tensor_map *map_c, const F &value, u8 *stage, i64 m0w, i64 n0, int rl, int tw,
                            u32 barrier, bool add, const ll_patch *patch = nullptr) {
  constexpr int J = ll_bwd_sm90::BN / 16; /* 8-column groups a half */
  const int l = tw % 32;
  u32 packed[2][J];
  ll_pack_half<HALF, DT>(value, packed);
  ll_stage_take(tw, barrier);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int rr = rl + 8 * i; /* the row in the consumer's 64 */
#pragma unroll
    for (int jj = 0; jj < J; ++jj) {
      const u32 chunk = (u32)(jj % 8) ^ (u32)(rr % 8);
      *(u32 *)(stage + (u32)(jj / 8) * ll_bwd_sm90::BOX + (u32)rr * 128u + chunk * 16u + (u32)(l % 4) * 4u) =
          packed[i][jj];
    }
  }
  if constexpr (PATCH) {
    /* over the element in the staging (a register array indexed at run time would go to local
     * memory); the same thread wrote it just before */
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int q = patch->q[i], rr = rl + 8 * i;
      if (q >= 0 && (q >> 5) == HALF) {
        const u32 jj = (u32)(q >> 1) & (J - 1), chunk = (jj % 8) ^ (u32)(rr % 8);
        const u32 v = sm90::pack_half2<DT == RLK_DT_BF16>(patch->v[i], patch->v[i]);
        *(u16 *)(stage + (jj / 8) * ll_bwd_sm90::BOX + (u32)rr * 128u + chunk * 16u + (u32)(l % 4) * 4u +
                 (u32)(q & 1) * 2u) = (u16)v;
      }
    }
  }
  ll_stage_give(map_c, stage, n0 + 128 * HALF, 64, m0w, 0, tw, barrier, add);
}

/* ll_b16_half's transposed twin (the logits_t kind): the half's 128 columns x the consumer's 64
 * rows go into `stage` as two boxes of 64 columns x 64 rows (a 128-byte line a column, the
 * 128-byte swizzle) by stmatrix .trans, whose 8 x 8 blocks are the accumulator's (rows 16 w + 8 i
 * + l / 4, columns 8 j + 2 (l % 4) + e): block (i, j) lands as 8 lines (its columns) of one
 * 16-byte chunk (its rows). Thread 0 of the consumer stores them at (m0w, v0 + 128 HALF + 64 b). */
template <int HALF, int DT, typename F>
RLK_DEVICE void ll_b16_half_t(const tensor_map *map, const F &value, u8 *stage, i64 m0w, i64 v0, int w, int tw,
                              u32 barrier) {
  constexpr int J = ll_bwd_sm90::BN / 16;
  const int l = tw % 32, mi = (l / 8) & 1, mj = (l / 8) >> 1, r = l % 8;
  u32 packed[2][J];
  ll_pack_half<HALF, DT>(value, packed);
  ll_stage_take(tw, barrier);
#pragma unroll
  for (int g = 0; g < J / 2; ++g) {
    /* matrices (i, jj): (0, 2g), (1, 2g), (0, 2g + 1), (1, 2g + 1); this lane's line: column
     * 8 (2g + mj) + r of the half, chunk 2 w + mi */
    const u32 vr = (u32)(8 * (2 * g + mj) + r), chunk = (u32)(2 * w + mi) ^ (vr % 8);
    sm90::stmatrix_x4<true>(stage + (vr / 64) * ll_bwd_sm90::BOX + (vr % 64) * 128u + chunk * 16u, packed[0][2 * g],
                            packed[1][2 * g], packed[0][2 * g + 1], packed[1][2 * g + 1]);
  }
  ll_stage_give(map, stage, m0w, 0, v0 + 128 * HALF, 64, tw, barrier, false);
}

/* The logits kinds' epilogue for one consumer (rows m0w + rl, + 8 of this thread; y: their
 * labels' columns, -1 for none; thr: their kept-set thresholds, whose masked logits store u 0):
 * each row's tile record into partials (ll_tile_record: the
 * forward's records, bit for bit), then u in place of acc, stored in two halves (ll_b16_half, or
 * ll_b16_half_t into map_c / map_d when TRANS). Columns past V count as -inf (their u is 0). */
template <int DT, bool ENTROPY, bool TRANS>
RLK_DEVICE void ll_logits_epilogue(const ll::BwdSm90Params &p_, const tensor_map *map_c, const tensor_map *map_d,
                                   float (&acc)[ll_bwd_sm90::BN / 2], const i64 (&y)[2], const float (&thr)[2],
                                   u8 *stage, i64 m0w, i64 n0, int tn, int rl, int tw, u32 barrier) {
  const float c = RLK_LL_LOG2E / p_.temperature;
  const int l = tw % 32;
  ll::part *__restrict__ partials = (ll::part *)p_.out_aux;
  ll_mask_past(acc, p_.Nn, n0, l);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const ll::part rec = ll_tile_record<ENTROPY, true>(acc, i, c, ll_owned_q(y[i] - n0, p_.Nn - n0, l), thr[i]);
    const i64 r = m0w + rl + 8 * i;
    if ((l & 3) == 0 && r < p_.M) partials[(i64)tn * p_.M + r] = rec;
  }
  const auto u = [&](int i, int j, int e) { return acc[4 * j + 2 * i + e]; };
  if constexpr (TRANS) {
    const bool lo = n0 < p_.ksplit;
    const tensor_map *map = lo ? map_c : map_d;
    const i64 v0 = lo ? n0 : n0 - p_.ksplit;
    ll_b16_half_t<0, DT>(map, u, stage, m0w, v0, tw / 32, tw, barrier);
    ll_b16_half_t<1, DT>(map, u, stage, m0w, v0, tw / 32, tw, barrier);
  } else {
    ll_b16_half<0, DT>(map_c, u, stage, m0w, n0, rl, tw, barrier, false);
    ll_b16_half<1, DT>(map_c, u, stage, m0w, n0, rl, tw, barrier, false);
  }
}

/* dz's epilogue for one consumer (rows m0w + rl, + 8 of this thread): each logit turned into its
 * gradient, in two halves through a 16 KB staging area (ll_b16_half). A row's terms fold into two
 * coefficients, dz = p (b + k x) with p = 2^(x c - lse2), b = (g_H E - g_lp) / T, k = -g_H / T^2
 * (k = 0 without the entropy): an ignored row takes lse2 = +inf (p = 0), a bad one b = NaN. The
 * label's column adds g_lp / T: its owner works that element out on its own (ll_patch), from the
 * unfolded formula, where 1 - p keeps its precision. */
template <int DT, bool ENTROPY>
RLK_DEVICE void ll_dz_epilogue(const ll::BwdSm90Params &p_, const tensor_map *map_c,
                               const float (&acc)[ll_bwd_sm90::BN / 2], const ll_dz_row (&row)[2], u8 *stage,
                               i64 m0w, i64 n0, int tn, int rl, int tw, u32 barrier) {
  const float inv_t = 1.0f / p_.temperature, c = RLK_LL_LOG2E / p_.temperature;
  const int l = tw % 32;
  float lse2[2], cb[2], ck[2];
  ll_patch fix;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const ll_dz_row &d = row[i];
    if (d.bad && p_.status && p_.c0 == 0 && tn == 0 && (tw & 3) == 0)
      atomicOr((int *)p_.status, (int)LP_STATUS_BAD_LABEL);
    lse2[i] = d.ignored ? limits<float>::infinity() : d.lse2;
    cb[i] = d.ignored ? 0.0f : d.bad ? limits<float>::quiet_nan() : (ENTROPY ? d.gh * d.E - d.gl : -d.gl) * inv_t;
    ck[i] = ENTROPY && !d.ignored ? -d.gh * inv_t * inv_t : 0.0f;
    fix.q[i] = d.ignored || d.bad ? -1 : ll_owned_q(d.y - n0, p_.Nn - n0, l);
    fix.v[i] = 0.0f;
    if (fix.q[i] >= 0) {
      const float x = ll_pick(acc, i, fix.q[i]), p = exp2_approx(fmaf(x, c, -d.lse2));
      fix.v[i] = ll::dz_of<ENTROPY>(false, false, d.gl, d.gh, d.E, 1.0f, p, x * inv_t, true, inv_t);
    }
  }
  const auto grad = [&](int i, int j, int e) {
    const float x = acc[4 * j + 2 * i + e], p = exp2_approx(fmaf(x, c, -lse2[i]));
    return ENTROPY ? p * fmaf(ck[i], x, cb[i]) : p * cb[i];
  };
  if (!p_.threshold) {
    ll_b16_half<0, DT, true>(map_c, grad, stage, m0w, n0, rl, tw, barrier, false, &fix);
    ll_b16_half<1, DT, true>(map_c, grad, stage, m0w, n0, rl, tw, barrier, false, &fix);
    return;
  }
  /* kept-set replay: 0 below the row's threshold (the label's element is the patch's); a row with
   * a bad label keeps every element (NaN: no threshold compares below NaN), as ll::dz_of makes
   * its row NaN in the portable kernels */
  const float thr[2] = {row[0].bad ? limits<float>::quiet_nan() : row[0].thr,
                        row[1].bad ? limits<float>::quiet_nan() : row[1].thr};
  const auto kept = [&](int i, int j, int e) {
    return acc[4 * j + 2 * i + e] < thr[i] ? 0.0f : grad(i, j, e);
  };
  ll_b16_half<0, DT, true>(map_c, kept, stage, m0w, n0, rl, tw, barrier, false, &fix);
  ll_b16_half<1, DT, true>(map_c, kept, stage, m0w, n0, rl, tw, barrier, false, &fix);
}

/* An f32 output's epilogue for one consumer, columns [64 Q, 64 Q + 64) of its rows (r0 + 8 i,
 * i = 0, 1 for this thread; acc[4 j + 2 i + e] is column n0 + 8 j + 2 (l % 4) + e): into `stage`
 * as two boxes of 64 rows x 32 f32 columns (128-byte rows, the 128-byte swizzle: 16-byte chunk c
 * of row r at c ^ (r % 8)), then TMA stores or reduce-adds at (n0 + 64 Q + 32 b, m0w) by thread 0
 * of the consumer. */
template <int Q>
RLK_DEVICE void ll_f32_quarter(const tensor_map *map_c, const float (&acc)[ll_bwd_sm90::BN / 2], u8 *stage, i64 m0w,
                               i64 n0, int rl, int tw, u32 barrier, bool add) {
  const int l = tw % 32;
  ll_stage_take(tw, barrier);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int rr = rl + 8 * i;
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const int j = 8 * Q + jj;
      const u32 chunk = (u32)(2 * (jj % 4) + (l % 4) / 2) ^ (u32)(rr % 8);
      f32x2 v;
      v.x = acc[4 * j + 2 * i];
      v.y = acc[4 * j + 2 * i + 1];
      *(f32x2 *)(stage + (u32)(jj / 4) * ll_bwd_sm90::BOX + (u32)rr * 128u + chunk * 16u + (u32)(l % 2) * 8u) = v;
    }
  }
  ll_stage_give(map_c, stage, n0 + 64 * Q, 32, m0w, 0, tw, barrier, add);
}

/* dh's or dw's epilogue: a consumer thread's rows r0 and r0 + 8 from its accumulators
 * (acc[4 j + 2 i + e] is row r0 + 8 i, column n0 + 8 j + 2 (l % 4) + e), added to what is there
 * when `add`. */
template <int KIND, int GDT>
RLK_DEVICE void ll_bwd_store(const ll::BwdSm90Params &p_, const float (&acc)[ll_bwd_sm90::BN / 2], i64 r0, i64 n0,
                             int l, bool add) {
  constexpr int BN = ll_bwd_sm90::BN;
  typedef typename ll::elem<GDT>::type G;
  const i64 M = p_.M, NC = p_.Nn, ostride = p_.out_stride;
  /* pairs as one store where the row stride and base keep them aligned */
  const bool vec = (ostride % 2) == 0 && ((u64)p_.out % (2 * sizeof(G))) == 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const i64 r = r0 + 8 * i;
    if (r >= M) continue;
    /* dh (GDT RLK_DT_F32: the workspace) or grad_weight's rows from c0 */
    G *out = (G *)p_.out + (KIND == ll_bwd_sm90::DW ? p_.c0 + r : r) * ostride + n0;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int col = 8 * j + 2 * (l % 4);
      if (n0 + col >= NC) continue;
      const bool both = n0 + col + 1 < NC;
      float a0 = acc[4 * j + 2 * i], a1 = acc[4 * j + 2 * i + 1];
      if (add) {
        float o0, o1 = 0.0f;
        if constexpr (sizeof(G) == 4) {
          if (both && vec) {
            const f32x2 o = *(const f32x2 *)(out + col); /* the pair in one 8-byte load */
            o0 = o.x, o1 = o.y;
          } else {
            o0 = out[col];
            if (both) o1 = out[col + 1];
          }
        } else {
          o0 = to_float(out[col]);
          if (both) o1 = to_float(out[col + 1]);
        }
        a0 += o0;
        a1 += o1;
      }
      ll_store_pair<G>(out + col, a0, a1, both, vec);
    }
  }
}

/* dh's accumulators of a consumer thread's rows r0 and r0 + 8 loaded from the sum so far (the
 * output, G), where a chunk continues its K chain (0 outside [M, Nn): never stored). */
template <int GDT>
RLK_DEVICE void ll_carry_load(const ll::BwdSm90Params &p_, float (&acc)[ll_bwd_sm90::BN / 2], i64 r0, i64 n0, int l) {
  constexpr int BN = ll_bwd_sm90::BN;
  typedef typename ll::elem<GDT>::type G;
  const bool vec = (p_.out_stride % 2) == 0 && ((u64)p_.out % (2 * sizeof(G))) == 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const i64 r = r0 + 8 * i;
    const G *row = (const G *)p_.out + r * p_.out_stride + n0;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int col = 8 * j + 2 * (l % 4);
      float a0 = 0.0f, a1 = 0.0f;
      if (r < p_.M && n0 + col < p_.Nn) {
        const bool both = n0 + col + 1 < p_.Nn;
        if (sizeof(G) == 4 && both && vec) {
          const f32x2 o = *(const f32x2 *)(row + col);
          a0 = o.x, a1 = o.y;
        } else {
          a0 = to_float(row[col]);
          if (both) a1 = to_float(row[col + 1]);
        }
      }
      acc[4 * j + 2 * i] = a0;
      acc[4 * j + 2 * i + 1] = a1;
    }
  }
}

/* The struct's tensor maps: map_a, map_b the operands; map_c dz (KIND 0's output, 64 x 64 boxes),
 * the output (64 x 32 f32 or 64 x 64 16-bit boxes) when p_.staged, any map otherwise; map_d the
 * second half of u^T (KIND 4's output from column ksplit, KIND 5's A from K row ksplit), any map
 * otherwise. */
template <int KIND, int DT, typename L, bool ENTROPY, int GDT>
__global__ void __launch_bounds__(LL_SM90_THREADS, 1)
    linear_logprob_bwd_sm90(RLK_PARAMS_ARG ll::BwdSm90Params p_) {
#if defined(RLK_SM90A_ASM)
  typedef ll_bwd_sm90 C;
  constexpr int BM = C::BM, BN = C::BN, BK = C::BK, STAGES = C::STAGES;
  constexpr u32 ABYTES = C::ABYTES, STAGE = C::STAGE, BOX = C::BOX;
  constexpr bool LOGITS = KIND == C::LOGITS || KIND == C::LOGITS_T, SPLIT = KIND == C::LOGITS_T || KIND == C::DH_T;
  constexpr int TA = KIND == C::DW || KIND == C::DH_T ? 1 : 0, TB = KIND == C::DZ || LOGITS ? 0 : 1;
  constexpr bool STORE16 = KIND == C::DZ || LOGITS; /* a 16-bit output through the staging */
  constexpr int AB = DT == RLK_DT_BF16 ? sm90::WGMMA_BF16 : sm90::WGMMA_F16;
  constexpr u32 CONSUMER_WARPS = 8;
  extern __shared__ __align__(LL_SM90_ALIGN) u8 llb_smem_raw[];
  u8 *smem = (u8 *)(((u64)llb_smem_raw + 1023u) & ~(u64)1023u);
  __shared__ alignas(8) u64 full[STAGES];
  __shared__ alignas(8) u64 empty[STAGES];
  const int wg = (int)(threadIdx.x / 128);
  const int tiles_m = p_.tiles_m, tiles_n = p_.tiles_n, ntiles = tiles_m * tiles_n;
  const int kblocks = (int)((p_.K + BK - 1) / BK);
  if (threadIdx.x == 0) sm90::ring_init<STAGES>(full, empty, CONSUMER_WARPS);
  __syncthreads();

  if (wg == 0) {
    /* producer: A then B of each K step, tile after tile, the ring running on across tiles; dh
     * reads W's rows from c0, dz W's columns from c0 */
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      sm90::tma_prefetch_map(&p_.map_a);
      sm90::tma_prefetch_map(&p_.map_b);
      if (STORE16 || p_.staged) sm90::tma_prefetch_map(&p_.map_c);
      if (SPLIT) sm90::tma_prefetch_map(&p_.map_d);
      u32 it = 0;
      for (int tile = (int)blockIdx.x; tile < ntiles; tile += (int)gridDim.x) {
        int tm, tn;
        ll_bwd_tile(tile, tiles_m, tiles_n, p_.group, &tm, &tn);
        const i32 m0 = tm * BM;
        const i32 b_k0 = KIND == C::DH || KIND == C::DH_T ? (i32)p_.c0 : 0,
                  b_n0 = (i32)((i64)tn * BN + (KIND == C::DZ ? p_.c0 : 0));
        for (int kb = 0; kb < kblocks; ++kb, ++it) {
          const u32 s = it % STAGES;
          if (it >= (u32)STAGES) sm90::mbar_wait(&empty[s], ((it / STAGES) - 1u) & 1u);
          sm90::mbar_arrive_expect_tx(&full[s], STAGE);
          u8 *a = smem + s * STAGE, *b = a + ABYTES;
          if (TA == 0) {
            sm90::tma_load_2d(a, &p_.map_a, kb * BK, m0, &full[s]);
          } else {
            /* dh_t: K rows from ksplit on are map_d's (a K step never straddles it) */
            const bool hi = KIND == C::DH_T && kb * BK >= p_.ksplit;
            const tensor_map *ma = hi ? &p_.map_d : &p_.map_a;
            const i32 kr = kb * BK - (hi ? (i32)p_.ksplit : 0);
            sm90::tma_load_2d(a, ma, m0, kr, &full[s]);
            sm90::tma_load_2d(a + BOX, ma, m0 + 64, kr, &full[s]);
          }
          if (TB == 0) {
            sm90::tma_load_2d(b, &p_.map_b, kb * BK, b_n0, &full[s]);
          } else {
#pragma unroll
            for (int j = 0; j < BN / 64; ++j)
              sm90::tma_load_2d(b + BOX * (u32)j, &p_.map_b, b_n0 + 64 * j, b_k0 + kb * BK, &full[s]);
          }
        }
      }
    }
    return;
  }

  /* consumers */
  sm90::setmaxnreg_inc<232>();
  const int cw = wg - 1, tw = (int)(threadIdx.x % 128), w = tw / 32, l = tw % 32;
  u8 *stage = smem + (u32)STAGES * STAGE + (u32)cw * (C::STAGING / 2u);
  float acc[BN / 2];
  u32 it = 0;
  for (int tile = (int)blockIdx.x; tile < ntiles; tile += (int)gridDim.x) {
    int tm, tn;
    ll_bwd_tile(tile, tiles_m, tiles_n, p_.group, &tm, &tn);
    const i64 m0 = (i64)tm * BM, n0 = (i64)tn * BN, r0 = m0 + cw * 64 + 16 * w + l / 4;
    ll_dz_row row[2];
    i64 y[2];
    float thr[2];
    if (KIND == C::DZ) {
      /* the row inputs load while the products run */
      row[0] = ll_dz_row_inputs<L, ENTROPY>(p_, r0);
      row[1] = ll_dz_row_inputs<L, ENTROPY>(p_, r0 + 8);
    } else if (LOGITS) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        y[i] = r0 + 8 * i < p_.M ? ll::load_label((const L *)p_.labels, r0 + 8 * i, p_.label_stride) - p_.vocab_start
                                 : (i64)-1;
        thr[i] = p_.threshold && r0 + 8 * i < p_.M ? ld_ro(p_.threshold + r0 + 8 * i) : -limits<float>::infinity();
      }
    }
    /* dh continues the chunks' K chain from the sum so far (accumulate: the output holds it) */
    const bool carry = (KIND == C::DH || KIND == C::DH_T) && p_.accumulate != 0;
    if (carry) ll_carry_load<GDT>(p_, acc, r0, n0, l);
    ll_sm90_tile_products<STAGES, AB, TA, TB>(acc, full, empty, smem, cw, l, kblocks, it, carry);
    if constexpr (KIND == C::DZ) {
      ll_dz_epilogue<DT, ENTROPY>(p_, &p_.map_c, acc, row, stage, m0 + cw * 64, n0, tn, 16 * w + l / 4, tw,
                                  1u + (u32)cw);
    } else if constexpr (LOGITS) {
      ll_logits_epilogue<DT, ENTROPY, KIND == C::LOGITS_T>(p_, &p_.map_c, &p_.map_d, acc, y, thr, stage,
                                                           m0 + cw * 64, n0, tn, 16 * w + l / 4, tw, 1u + (u32)cw);
    } else if (p_.staged) {
      const bool add = !carry && p_.accumulate != 0;
      const i64 m0w = m0 + cw * 64;
      const int rl = 16 * w + l / 4;
      if constexpr (GDT == RLK_DT_F32) {
        ll_f32_quarter<0>(&p_.map_c, acc, stage, m0w, n0, rl, tw, 1u + (u32)cw, add);
        ll_f32_quarter<1>(&p_.map_c, acc, stage, m0w, n0, rl, tw, 1u + (u32)cw, add);
        ll_f32_quarter<2>(&p_.map_c, acc, stage, m0w, n0, rl, tw, 1u + (u32)cw, add);
        ll_f32_quarter<3>(&p_.map_c, acc, stage, m0w, n0, rl, tw, 1u + (u32)cw, add);
      } else {
        const auto out = [&](int i, int j, int e) { return acc[4 * j + 2 * i + e]; };
        ll_b16_half<0, GDT>(&p_.map_c, out, stage, m0w, n0, rl, tw, 1u + (u32)cw, add);
        ll_b16_half<1, GDT>(&p_.map_c, out, stage, m0w, n0, rl, tw, 1u + (u32)cw, add);
      }
    } else {
      ll_bwd_store<KIND, GDT>(p_, acc, r0, n0, l, !carry && p_.accumulate != 0);
    }
  }
  /* the stores are done before the block (and its staging) goes */
  if ((STORE16 || p_.staged) && tw == 0) sm90::tma_store_drain<0>();
#else
  (void)p_;
#endif
}

} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_LINEAR_LOGPROB_BWD_SM90_CUH */

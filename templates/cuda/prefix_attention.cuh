/* prefix_attention.cuh - prefix-shared attention for GRPO groups, forward and backward.
 *
 * Layout (include/rlk.h): segments [seq[s], seq[s + 1]) in token order; prompt p owns segments
 * [grp[p], grp[p + 1]), the first its prefix, the others its responses. A prefix token sees the
 * prefix causally; a response token sees the whole prefix, then its own response causally.
 * Tensors: q, out, dout, dq [T, Hq, D]; k, v, dk, dv [T, Hkv, D]; lse, delta [T, Hq] f32.
 *
 * Entries (launched by src/ops/prefix_attention.c):
 *   pattn_fwd, pattn_bwd_prep, pattn_bwd_dkdv, pattn_bwd_dq
 *       portable (every CUDA arch and HIP): a warp per (row, head) or (key, key head), lanes over
 *       the head dimension, keys or queries in order; fp32 throughout.
 *   pattn_fwd_mma, pattn_bwd_dkdv_mma, pattn_bwd_dq_mma (CUDA sm_80+)
 *       flash-attention-2 style on mma.sync m16n8k16 with fp32 accumulators, 64 x 64 tiles, four
 *       warps of 16 rows. Query tiles are cut per region: a prompt's prefix rows (causal), or all
 *       its response rows stacked (the G responses back to back), so a tile of response rows reads
 *       each prefix K/V tile once for up to 64 rows of several responses, then its own responses'
 *       keys with a per-row mask. The dk/dv kernel owns a key tile of one key head and walks every
 *       query tile that sees it, for each query head of the group in order: a prefix key's
 *       gradient is summed over its prefix queries and all responses in one fixed order, no
 *       atomics. dq has its own query-stationary kernel for the same reason.
 * Every result is written by exactly one thread after a fixed sequence of operations: bitwise
 * repeatable. */
#ifndef RLK_PREFIX_ATTENTION_CUH
#define RLK_PREFIX_ATTENTION_CUH

#include "rlk_prelude.cuh"
#include "prefix_attention_params.h"

namespace rlk {
namespace pa {

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.69314718055994531f;
constexpr int PW = PA_PORTABLE_WARPS; /* warps per block of the portable kernels */
constexpr int TILE = PA_TILE;         /* rows of a query or key tile of the mma kernels */
constexpr int THREADS = PA_MMA_THREADS;

template <int DT> struct elem;
template <> struct elem<PA_DT_F16> {
  typedef f16 type;
};
template <> struct elem<PA_DT_BF16> {
  typedef bf16 type;
};

template <int DT> RLK_DEVICE float ld(const void *p, i64 i) {
  return to_float(((const typename elem<DT>::type *)p)[i]);
}
template <int DT> RLK_DEVICE void st(void *p, i64 i, float x) {
  ((typename elem<DT>::type *)p)[i] = store_as<typename elem<DT>::type>::from(x);
}

/* The last index s in [lo, hi) with a[s] <= x (a non-decreasing, a[lo] <= x). */
RLK_DEVICE i32 last_le(const i32 *a, i32 lo, i32 hi, i64 x) {
  while (hi - lo > 1) {
    const i32 mid = lo + (hi - lo) / 2;
    if ((i64)a[mid] <= x)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/* Where token i lies: its prompt's prefix [ps, pe), the prompt's end, and its segment's start and
 * end; resp is 0 for a prefix token. */
struct place {
  i64 ps, pe, pend, s0, s1;
  int resp;
};

RLK_DEVICE place locate(const i32 *seq, const i32 *grp, i64 P, i64 i) {
  const i32 S = grp[P];
  const i32 s = last_le(seq, 0, S, i);
  const i32 p = last_le(grp, 0, (i32)P, s);
  const i32 g = grp[p];
  place r;
  r.ps = seq[g];
  r.pe = seq[g + 1];
  r.pend = seq[grp[p + 1]];
  r.s0 = seq[s];
  r.s1 = seq[s + 1];
  r.resp = s != g;
  return r;
}

/* The keys [j0, j1) that row i (at pl) sees, in two runs: part 0 its prompt's prefix (all of it
 * for a response row, up to i for a prefix row), part 1 its own response up to i (none for a
 * prefix row). */
RLK_DEVICE void key_run(const place &pl, i64 i, int part, i64 &j0, i64 &j1) {
  j0 = part ? pl.s0 : pl.ps;
  j1 = part ? (pl.resp ? i + 1 : 0) : (pl.resp ? pl.pe : i + 1);
}

/* Sum over a warp, the same tree on every lane. */
RLK_DEVICE float warp_sum(float x) {
#pragma unroll
  for (int o = RLK_WARP_SIZE / 2; o > 0; o >>= 1) x += shfl_xor(x, o);
  return x;
}

} // namespace pa

/* ---------------------------------------------------------------------------------- */
/* Portable kernels                                                                    */
/* ---------------------------------------------------------------------------------- */

/* Forward: a warp per (query row, head); one online-softmax pass over the row's keys. */
template <int DT, int D>
__global__ void __launch_bounds__(pa::PW *RLK_WARP_SIZE)
    pattn_fwd(RLK_PARAMS_ARG pa_fwd_args p_) {
  const void *__restrict__ q = p_.q, *__restrict__ k = p_.k, *__restrict__ v = p_.v;
  float *__restrict__ lse = p_.lse;
  const i32 *__restrict__ seq = p_.seq, *__restrict__ grp = p_.grp;
  const i64 P = p_.P, T = p_.T;
  const i32 Hq = p_.Hq, Hkv = p_.Hkv;
  const float scale = p_.scale;
  void *__restrict__ out = p_.out;
  constexpr int W = RLK_WARP_SIZE, E = D / W;
  const int lane = (int)threadIdx.x % W;
  const i64 i = (i64)blockIdx.x * pa::PW + (i64)threadIdx.x / W;
  if (i >= T) return;
  const i32 h = (i32)blockIdx.y, hk = h / (Hq / Hkv);
  const pa::place pl = pa::locate(seq, grp, P, i);
  const float c = scale * pa::LOG2E;
  float qv[E], acc[E];
#pragma unroll
  for (int e = 0; e < E; e++) {
    qv[e] = pa::ld<DT>(q, (i * Hq + h) * D + lane + W * e) * c;
    acc[e] = 0.0f;
  }
  float m = -limits<float>::infinity(), l = 0.0f;
  for (int part = 0; part < 2; part++) {
    i64 j0, j1;
    pa::key_run(pl, i, part, j0, j1);
    for (i64 j = j0; j < j1; j++) {
      const i64 base = (j * Hkv + hk) * D + lane;
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < E; e++) s += qv[e] * pa::ld<DT>(k, base + W * e);
      s = pa::warp_sum(s);
      const float mn = fmaxf(m, s), cf = exp2f(m - mn), pj = exp2f(s - mn);
      l = l * cf + pj;
#pragma unroll
      for (int e = 0; e < E; e++) acc[e] = acc[e] * cf + pj * pa::ld<DT>(v, base + W * e);
      m = mn;
    }
  }
  const float inv = 1.0f / l;
#pragma unroll
  for (int e = 0; e < E; e++) pa::st<DT>(out, (i * Hq + h) * D + lane + W * e, acc[e] * inv);
  if (lse && lane == 0) lse[i * Hq + h] = (m + log2f(l)) * pa::LN2;
}

/* Backward, step 1 (every GPU path): delta[i, h] = dO[i, h] . O[i, h], a warp per (row, head). */
template <int DT, int D>
__global__ void __launch_bounds__(PA_PASS_THREADS)
    pattn_bwd_prep(RLK_PARAMS_ARG pa_bwd_args p_) {
  const void *__restrict__ o = p_.o, *__restrict__ dout = p_.dout;
  void *__restrict__ work = p_.work;
  const i64 T = p_.T;
  const i32 Hq = p_.Hq;
  constexpr int W = RLK_WARP_SIZE, E = D / W;
  const int lane = (int)threadIdx.x % W;
  const i64 r = (i64)blockIdx.x * (256 / W) + (i64)threadIdx.x / W;
  if (r >= T * Hq) return;
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < E; e++) s += pa::ld<DT>(o, r * D + lane + W * e) * pa::ld<DT>(dout, r * D + lane + W * e);
  s = pa::warp_sum(s);
  if (lane == 0) ((float *)work)[r] = s;
}

/* Backward dk, dv (portable): a warp per (key, key head). The queries that see key j are one
 * range: to the end of its prompt for a prefix key, to the end of its response otherwise. Query
 * heads of the group, then rows, in order. */
template <int DT, int D>
__global__ void __launch_bounds__(pa::PW *RLK_WARP_SIZE)
    pattn_bwd_dkdv(RLK_PARAMS_ARG pa_bwd_args p_) {
  const void *__restrict__ q = p_.q, *__restrict__ k = p_.k, *__restrict__ v = p_.v, *__restrict__ dout = p_.dout;
  const float *__restrict__ lse = p_.lse;
  void *__restrict__ work = p_.work;
  const i32 *__restrict__ seq = p_.seq, *__restrict__ grp = p_.grp;
  const i64 P = p_.P, T = p_.T;
  const i32 Hq = p_.Hq, Hkv = p_.Hkv;
  const float scale = p_.scale;
  void *__restrict__ dk = p_.dk, *__restrict__ dv = p_.dv;
  constexpr int W = RLK_WARP_SIZE, E = D / W;
  const int lane = (int)threadIdx.x % W;
  const i64 j = (i64)blockIdx.x * pa::PW + (i64)threadIdx.x / W;
  if (j >= T) return;
  const i32 hk = (i32)blockIdx.y, ratio = Hq / Hkv;
  const pa::place pl = pa::locate(seq, grp, P, j);
  const i64 iend = pl.resp ? pl.s1 : pl.pend;
  const float c = scale * pa::LOG2E;
  const float *delta = (const float *)work;
  float kv[E], vv[E], gk[E], gv[E];
#pragma unroll
  for (int e = 0; e < E; e++) {
    kv[e] = pa::ld<DT>(k, (j * Hkv + hk) * D + lane + W * e);
    vv[e] = pa::ld<DT>(v, (j * Hkv + hk) * D + lane + W * e);
    gk[e] = gv[e] = 0.0f;
  }
  for (i32 h = hk * ratio; h < (hk + 1) * ratio; h++) {
    for (i64 i = j; i < iend; i++) {
      const i64 base = (i * Hq + h) * D + lane;
      float s = 0.0f, dp = 0.0f, qv[E], dov[E];
#pragma unroll
      for (int e = 0; e < E; e++) {
        qv[e] = pa::ld<DT>(q, base + W * e);
        dov[e] = pa::ld<DT>(dout, base + W * e);
        s += qv[e] * kv[e];
        dp += dov[e] * vv[e];
      }
      s = pa::warp_sum(s);
      dp = pa::warp_sum(dp);
      const float pij = exp2f(s * c - lse[i * Hq + h] * pa::LOG2E);
      const float ds = pij * (dp - delta[i * Hq + h]);
#pragma unroll
      for (int e = 0; e < E; e++) {
        gv[e] += pij * dov[e];
        gk[e] += ds * qv[e];
      }
    }
  }
#pragma unroll
  for (int e = 0; e < E; e++) {
    pa::st<DT>(dk, (j * Hkv + hk) * D + lane + W * e, gk[e] * scale);
    pa::st<DT>(dv, (j * Hkv + hk) * D + lane + W * e, gv[e]);
  }
}

/* Backward dq (portable): a warp per (query row, head), its keys in the forward's order. */
template <int DT, int D>
__global__ void __launch_bounds__(pa::PW *RLK_WARP_SIZE)
    pattn_bwd_dq(RLK_PARAMS_ARG pa_bwd_args p_) {
  const void *__restrict__ q = p_.q, *__restrict__ k = p_.k, *__restrict__ v = p_.v, *__restrict__ dout = p_.dout;
  const float *__restrict__ lse = p_.lse;
  void *__restrict__ work = p_.work;
  const i32 *__restrict__ seq = p_.seq, *__restrict__ grp = p_.grp;
  const i64 P = p_.P, T = p_.T;
  const i32 Hq = p_.Hq, Hkv = p_.Hkv;
  const float scale = p_.scale;
  void *__restrict__ dq = p_.dq;
  constexpr int W = RLK_WARP_SIZE, E = D / W;
  const int lane = (int)threadIdx.x % W;
  const i64 i = (i64)blockIdx.x * pa::PW + (i64)threadIdx.x / W;
  if (i >= T) return;
  const i32 h = (i32)blockIdx.y, hk = h / (Hq / Hkv);
  const pa::place pl = pa::locate(seq, grp, P, i);
  const float c = scale * pa::LOG2E, L = lse[i * Hq + h] * pa::LOG2E, Di = ((const float *)work)[i * Hq + h];
  float qv[E], dov[E], g[E];
#pragma unroll
  for (int e = 0; e < E; e++) {
    qv[e] = pa::ld<DT>(q, (i * Hq + h) * D + lane + W * e);
    dov[e] = pa::ld<DT>(dout, (i * Hq + h) * D + lane + W * e);
    g[e] = 0.0f;
  }
  for (int part = 0; part < 2; part++) {
    i64 j0, j1;
    pa::key_run(pl, i, part, j0, j1);
    for (i64 j = j0; j < j1; j++) {
      const i64 base = (j * Hkv + hk) * D + lane;
      float s = 0.0f, dp = 0.0f, kv[E];
#pragma unroll
      for (int e = 0; e < E; e++) {
        kv[e] = pa::ld<DT>(k, base + W * e);
        s += qv[e] * kv[e];
        dp += dov[e] * pa::ld<DT>(v, base + W * e);
      }
      s = pa::warp_sum(s);
      dp = pa::warp_sum(dp);
      const float ds = exp2f(s * c - L) * (dp - Di);
#pragma unroll
      for (int e = 0; e < E; e++) g[e] += ds * kv[e];
    }
  }
#pragma unroll
  for (int e = 0; e < E; e++) pa::st<DT>(dq, (i * Hq + h) * D + lane + W * e, g[e] * scale);
}

#if defined(RLK_CUDA)
/* ---------------------------------------------------------------------------------- */
/* mma.sync kernels (sm_80+)                                                           */
/* ---------------------------------------------------------------------------------- */

namespace pa {

RLK_DEVICE u32 smem_u32(const void *p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

/* 16 bytes global -> shared, zero-filled when !valid. */
RLK_DEVICE void cp16(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
RLK_DEVICE void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> RLK_DEVICE void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

RLK_DEVICE void ldsm4(u32 r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
RLK_DEVICE void ldsm4t(u32 r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

/* c += a b on a 16 x 8 x 16 tile (row-major a, column-major b, fp32 c). */
template <int DT> RLK_DEVICE void mma(float c[4], const u32 a[4], u32 b0, u32 b1) {
  if constexpr (DT == PA_DT_BF16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The two n8 tiles of a frag_b / frag_bt pair: c0 += a b (b[0], b[1]), c1 += a b (b[2], b[3]). */
template <int DT> RLK_DEVICE void mma_pair(float c0[4], float c1[4], const u32 a[4], const u32 b[4]) {
  mma<DT>(c0, a, b[0], b[1]);
  mma<DT>(c1, a, b[2], b[3]);
}

/* Two floats as a packed 16-bit pair (lo in the low half), rounded to nearest even. */
template <int DT> RLK_DEVICE u32 pack(float lo, float hi) {
  u32 d;
  if constexpr (DT == PA_DT_BF16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

/* The A operand (16 x 16, keys 16 kt..) from the fp32 accumulators of key tiles 2 kt and
 * 2 kt + 1 (an accumulator's layout is the A operand's, half the columns), packed to 16 bits. */
template <int DT> RLK_DEVICE void frag_a_of_acc(u32 a[4], const float (&x)[8][4], int kt) {
  a[0] = pack<DT>(x[2 * kt][0], x[2 * kt][1]);
  a[1] = pack<DT>(x[2 * kt][2], x[2 * kt][3]);
  a[2] = pack<DT>(x[2 * kt + 1][0], x[2 * kt + 1][1]);
  a[3] = pack<DT>(x[2 * kt + 1][2], x[2 * kt + 1][3]);
}

/* Shared-memory tiles: TILE rows of D 16-bit elements, rows padded by 8 elements (16 bytes) so
 * that the eight rows an ldmatrix phase reads fall in distinct banks. */
template <int D> struct tile {
  static constexpr int LD = D + 8;
  static constexpr int ELEMS = TILE * LD;
};

/* Loads rows [r0, r0 + TILE) of head `head` of a [T, H, D] tensor into a tile (rows at or past
 * rend zero-filled). Every thread of the block takes part; completes at cp_wait. */
template <int D>
RLK_DEVICE void load_tile(u16 *s, const void *g, i64 r0, i64 rend, i32 H, i32 head) {
  constexpr int CH = D / 8; /* 16-byte chunks per row */
  for (int c = (int)threadIdx.x; c < TILE * CH; c += THREADS) {
    const int r = c / CH, col = (c % CH) * 8;
    const i64 row = r0 + r;
    const bool ok = row < rend;
    const u16 *src = (const u16 *)g + (ok ? (row * H + head) * D + col : 0);
    cp16(s + r * tile<D>::LD + col, src, ok);
  }
}

/* A operand (16 x 16, rows m0.., cols k0..) of a row-major tile. */
template <int D> RLK_DEVICE void frag_a(u32 a[4], const u16 *s, int m0, int k0) {
  const int lane = (int)threadIdx.x % 32;
  ldsm4(a, s + (m0 + (lane % 16)) * tile<D>::LD + k0 + (lane / 16) * 8);
}

/* B operands of two n8 tiles where B[k][n] = s[n0 + n][k0 + k] (s's rows are the n index): r[0],
 * r[1] for tile n0, r[2], r[3] for tile n0 + 8. */
template <int D> RLK_DEVICE void frag_b(u32 r[4], const u16 *s, int n0, int k0) {
  const int lane = (int)threadIdx.x % 32, mat = lane / 8;
  ldsm4(r, s + (n0 + (mat / 2) * 8 + lane % 8) * tile<D>::LD + k0 + (mat % 2) * 8);
}

/* B operands of two n8 tiles where B[k][n] = s[k0 + k][n0 + n] (s's rows are the k index). */
template <int D> RLK_DEVICE void frag_bt(u32 r[4], const u16 *s, int k0, int n0) {
  const int lane = (int)threadIdx.x % 32, mat = lane / 8;
  ldsm4t(r, s + (k0 + (mat % 2) * 8 + lane % 8) * tile<D>::LD + n0 + (mat / 2) * 8);
}

/* A tile's region: rows [r0, r1) of prompt p = y / 2 (its prefix for even y, its stacked
 * responses for odd y) and the prompt's bounds. */
struct region {
  i64 ps, pe, pend, r0, r1;
  i32 rs0, rs1; /* the prompt's response segments [rs0, rs1) */
  int resp;
};

RLK_DEVICE region region_of(const i32 *seq, const i32 *grp, i32 y) {
  region r;
  const i32 p = y >> 1, g = grp[p];
  r.resp = y & 1;
  r.ps = seq[g];
  r.pe = seq[g + 1];
  r.pend = seq[grp[p + 1]];
  r.rs0 = g + 1;
  r.rs1 = grp[p + 1];
  r.r0 = r.resp ? r.pe : r.ps;
  r.r1 = r.resp ? r.pend : r.pe;
  return r;
}

/* A prompt's tiles of `tile` rows as one grid index x, so that a grid over prompts has no blocks
 * that find nothing to do where prefixes and response groups differ in length. Query tiles (keys
 * false): its prefix's from the last (which sees the most keys), then its stacked response rows'
 * (the order of the grid of regions this replaced); key tiles (keys true): its prefix's from the first (seen by the most rows), then its
 * response keys'. Sets rg to the tile's region of prompt p and returns the tile's first row, or -1
 * past the prompt's tiles (the host sizes x for the prompt with the most: pa_shape.tiles in
 * src/ops/prefix_attention.c). */
RLK_DEVICE i64 prompt_tile(const i32 *seq, const i32 *grp, i32 p, i64 x, int tile, bool keys, region &rg) {
  rg = region_of(seq, grp, 2 * p + 1);
  const i64 nr = (rg.pend - rg.pe + tile - 1) / tile, np = (rg.pe - rg.ps + tile - 1) / tile;
  const bool resp = x >= np;
  const i64 i = resp ? x - np : keys ? x : np - 1 - x;
  if (i < 0 || i >= (resp ? nr : np)) return -1;
  if (!resp) {
    rg.resp = 0;
    rg.r0 = rg.ps;
    rg.r1 = rg.pe;
  }
  return rg.r0 + i * tile;
}

/* The first key a row may see in its own segment: its response's start (rows of a response
 * region), else the prefix start. */
RLK_DEVICE i64 row_lo(const region &rg, const i32 *seq, i64 i) {
  if (!rg.resp) return rg.ps;
  return seq[last_le(seq, rg.rs0, rg.rs1, i)];
}

/* Key tiles of a query tile: first the prefix keys [ps, a_end) in na tiles (all of them for
 * response rows, up to the last row for prefix rows), then (response rows) the keys of their own
 * responses from the first row's response start b0. */
struct kv_tiles {
  i64 ps, b0;
  int na, n, tile;
  RLK_DEVICE i64 start(int t) const { return t < na ? ps + (i64)t * tile : b0 + (i64)(t - na) * tile; }
};

/* `tile` keys a tile (TILE for the mma kernels). */
RLK_DEVICE kv_tiles kv_tiles_of(const region &rg, const i32 *seq, i64 q0, i64 qend, int tile = TILE) {
  kv_tiles r;
  const i64 a_end = rg.resp ? rg.pe : qend;
  r.ps = rg.ps;
  r.b0 = rg.resp ? row_lo(rg, seq, q0) : 0;
  r.tile = tile;
  r.na = (int)((a_end - rg.ps + tile - 1) / tile);
  r.n = r.na + (rg.resp ? (int)((qend - r.b0 + tile - 1) / tile) : 0);
  return r;
}

/* The key offsets [lo, hi] within the key tile at kv0 that a query row sees: phase-A keys below
 * a1, phase-B keys in [b0, row]. */
RLK_DEVICE void visible_keys(bool phase_a, i64 kv0, i64 row, i64 a1, i64 b0, int &lo, int &hi) {
  lo = phase_a ? 0 : (int)max_<i64>(b0 - kv0, -1);
  hi = (int)min_<i64>(max_<i64>((phase_a ? a1 - 1 : row) - kv0, -1), TILE);
}

/* Key tile t + 1 of kt streams into the other half of sK and sV while tile t is used; then waits
 * for tile t (the last one: for everything). */
template <int D>
RLK_DEVICE void load_next_kv(u16 *sK, u16 *sV, const void *k, const void *v, const kv_tiles &kt, int t, int n,
                             i64 T, i32 Hkv, i32 hk) {
  if (t + 1 < n) {
    const i64 nx = kt.start(t + 1);
    load_tile<D>(sK + ((t + 1) & 1) * tile<D>::ELEMS, k, nx, T, Hkv, hk);
    load_tile<D>(sV + ((t + 1) & 1) * tile<D>::ELEMS, v, nx, T, Hkv, hk);
    cp_commit();
    cp_wait<1>();
  } else {
    cp_wait<0>();
  }
}

/* The warp's two 16 x 64 products over the head dim, s = A0 B0^T and dp = A1 B1^T: A0, A1 the
 * warp's 16 rows (from row 16 w) of a0, a1; B0, B1 64-row tiles. */
template <int DT, int D>
RLK_DEVICE void mma_two_products(float (&s)[8][4], float (&dp)[8][4], const u16 *a0, const u16 *b0, const u16 *a1,
                                 const u16 *b1, int w) {
  for (int j = 0; j < 8; j++)
    for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    u32 x0[4], x1[4];
    frag_a<D>(x0, a0, w * 16, kk * 16);
    frag_a<D>(x1, a1, w * 16, kk * 16);
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      u32 f[4];
      frag_b<D>(f, b0, j * 8, kk * 16);
      mma_pair<DT>(s[j], s[j + 1], x0, f);
      frag_b<D>(f, b1, j * 8, kk * 16);
      mma_pair<DT>(dp[j], dp[j + 1], x1, f);
    }
  }
}

/* acc (the warp's 16 rows x D) += X B: X the warp's 16 x 64 accumulator fragments x, rounded to
 * DT; B a 64-row tile in shared memory. */
template <int DT, int D>
RLK_DEVICE void mma_acc_times_tile(float (&acc)[D / 8][4], const float (&x)[8][4], const u16 *b) {
#pragma unroll
  for (int kt = 0; kt < 4; kt++) {
    u32 a[4];
    frag_a_of_acc<DT>(a, x, kt);
#pragma unroll
    for (int d = 0; d < D / 8; d += 2) {
      u32 f[4];
      frag_bt<D>(f, b, kt * 16, d * 8);
      mma_pair<DT>(acc[d], acc[d + 1], a, f);
    }
  }
}

} // namespace pa

/* Forward (sm_80+): a block per (64-row query tile of a prompt, prompt, query head), the prompt's
 * tiles in prompt_tile's order. */
template <int DT, int D>
__global__ void __launch_bounds__(pa::THREADS)
    pattn_fwd_mma(RLK_PARAMS_ARG pa_fwd_args p_) {
  const void *__restrict__ q = p_.q, *__restrict__ k = p_.k, *__restrict__ v = p_.v;
  float *__restrict__ lse = p_.lse;
  const i32 *__restrict__ seq = p_.seq, *__restrict__ grp = p_.grp;
  const i64 T = p_.T;
  const i32 Hq = p_.Hq, Hkv = p_.Hkv;
  const float scale = p_.scale;
  void *__restrict__ out = p_.out;
  using namespace pa;
  constexpr int ND = D / 8, KD = D / 16;
  extern __shared__ __align__(16) u16 pa_smem[];
  u16 *sQ = pa_smem, *sK = sQ + tile<D>::ELEMS, *sV = sK + 2 * tile<D>::ELEMS;
  region rg;
  const i64 q0 = prompt_tile(seq, grp, (i32)blockIdx.y, (i64)blockIdx.x, TILE, false, rg);
  if (q0 < 0) return;
  const i64 qend = min_(q0 + TILE, rg.r1);
  const i32 h = (i32)blockIdx.z, hk = h / (Hq / Hkv);
  const int lane = (int)threadIdx.x % 32, w = (int)threadIdx.x / 32, g8 = lane / 4, t4 = lane % 4;

  /* this thread's two rows and what they see: phase A keys < a1, phase B keys in [b0, b1) */
  i64 rows[2], a1[2], b0r[2];
  for (int r = 0; r < 2; r++) {
    rows[r] = q0 + w * 16 + g8 + 8 * r;
    const i64 ri = min_(rows[r], qend - 1);
    a1[r] = rg.resp ? rg.pe : rows[r] + 1;
    b0r[r] = rg.resp ? row_lo(rg, seq, ri) : 0;
  }
  const kv_tiles kt_ = kv_tiles_of(rg, seq, q0, qend);
  const int na = kt_.na, n = kt_.n;
  /* a phase-A tile needs no mask when it ends at or below every row's a1 */
  const i64 a1_min = rg.resp ? rg.pe : q0 + 1;

  load_tile<D>(sQ, q, q0, qend, Hq, h);
  load_tile<D>(sK, k, kt_.start(0), T, Hkv, hk);
  load_tile<D>(sV, v, kt_.start(0), T, Hkv, hk);
  cp_commit();

  const float c = scale * LOG2E;
  float acc[ND][4], m[2], l[2];
  for (int d = 0; d < ND; d++) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;
  m[0] = m[1] = -limits<float>::infinity();
  l[0] = l[1] = 0.0f;
  u32 qa[KD][4];

  for (int t = 0; t < n; t++) {
    const i64 kv0 = kt_.start(t);
    load_next_kv<D>(sK, sV, k, v, kt_, t, n, T, Hkv, hk);
    __syncthreads();
    if (t == 0)
      for (int kk = 0; kk < KD; kk++) frag_a<D>(qa[kk], sQ, w * 16, kk * 16);
    const u16 *bK = sK + (t & 1) * tile<D>::ELEMS, *bV = sV + (t & 1) * tile<D>::ELEMS;

    float s[8][4];
    for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KD; kk++)
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        u32 b[4];
        frag_b<D>(b, bK, j * 8, kk * 16);
        mma_pair<DT>(s[j], s[j + 1], qa[kk], b);
      }
    const bool phase_a = t < na;
    const bool masked = !phase_a || kv0 + TILE > a1_min;
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float mx = m[r];
      int lo, hi;
      visible_keys(phase_a, kv0, rows[r], a1[r], b0r[r], lo, hi);
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          float x = s[j][2 * r + e] * c;
          const int off = j * 8 + 2 * t4 + e;
          if (masked && (off < lo || off > hi)) x = -limits<float>::infinity();
          s[j][2 * r + e] = x;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, shfl_xor(mx, 1));
      mx = fmaxf(mx, shfl_xor(mx, 2));
      const float mu = mx == -limits<float>::infinity() ? 0.0f : mx;
      const float cf = exp2f(m[r] - mu);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const float pj = exp2f(s[j][2 * r + e] - mu);
          s[j][2 * r + e] = pj;
          sum += pj;
        }
      l[r] = l[r] * cf + sum;
      m[r] = mx;
#pragma unroll
      for (int d = 0; d < ND; d++) {
        acc[d][2 * r] *= cf;
        acc[d][2 * r + 1] *= cf;
      }
    }
    mma_acc_times_tile<DT, D>(acc, s, bV); /* O += P V */
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float sum = l[r];
    sum += shfl_xor(sum, 1);
    sum += shfl_xor(sum, 2);
    if (rows[r] >= qend) continue;
    const float inv = 1.0f / sum;
    u32 *o = (u32 *)((u16 *)out + (rows[r] * Hq + h) * D);
#pragma unroll
    for (int d = 0; d < ND; d++) o[d * 4 + t4] = pack<DT>(acc[d][2 * r] * inv, acc[d][2 * r + 1] * inv);
    if (lse && t4 == 0) lse[rows[r] * Hq + h] = (m[r] + log2f(sum)) * LN2;
  }
}

/* Backward dq (sm_80+): the forward's tiling; per key tile S = Q K^T, P = exp(S - lse),
 * dP = dO V^T, dS = P (dP - delta), dq += dS K. */
template <int DT, int D>
__global__ void __launch_bounds__(pa::THREADS)
    pattn_bwd_dq_mma(RLK_PARAMS_ARG pa_bwd_args p_) {
  const void *__restrict__ q = p_.q, *__restrict__ k = p_.k, *__restrict__ v = p_.v, *__restrict__ dout = p_.dout;
  const float *__restrict__ lse = p_.lse;
  void *__restrict__ work = p_.work;
  const i32 *__restrict__ seq = p_.seq, *__restrict__ grp = p_.grp;
  const i64 T = p_.T;
  const i32 Hq = p_.Hq, Hkv = p_.Hkv;
  const float scale = p_.scale;
  void *__restrict__ dq = p_.dq;
  using namespace pa;
  constexpr int ND = D / 8;
  extern __shared__ __align__(16) u16 pa_smem[];
  u16 *sQ = pa_smem, *sO = sQ + tile<D>::ELEMS, *sK = sO + tile<D>::ELEMS, *sV = sK + 2 * tile<D>::ELEMS;
  region rg;
  const i64 q0 = prompt_tile(seq, grp, (i32)blockIdx.y, (i64)blockIdx.x, TILE, false, rg);
  if (q0 < 0) return;
  const i64 qend = min_(q0 + TILE, rg.r1);
  const i32 h = (i32)blockIdx.z, hk = h / (Hq / Hkv);
  const int lane = (int)threadIdx.x % 32, w = (int)threadIdx.x / 32, g8 = lane / 4, t4 = lane % 4;
  const float *delta = (const float *)work;
  const float c = scale * LOG2E;

  i64 rows[2], a1[2], b0r[2];
  float L[2], Dl[2];
  for (int r = 0; r < 2; r++) {
    rows[r] = q0 + w * 16 + g8 + 8 * r;
    const i64 ri = min_(rows[r], qend - 1);
    a1[r] = rg.resp ? rg.pe : rows[r] + 1;
    b0r[r] = rg.resp ? row_lo(rg, seq, ri) : 0;
    L[r] = lse[ri * Hq + h] * LOG2E;
    Dl[r] = delta[ri * Hq + h];
  }
  const kv_tiles kt_ = kv_tiles_of(rg, seq, q0, qend);
  const int na = kt_.na, n = kt_.n;
  const i64 a1_min = rg.resp ? rg.pe : q0 + 1;

  load_tile<D>(sQ, q, q0, qend, Hq, h);
  load_tile<D>(sO, dout, q0, qend, Hq, h);
  load_tile<D>(sK, k, kt_.start(0), T, Hkv, hk);
  load_tile<D>(sV, v, kt_.start(0), T, Hkv, hk);
  cp_commit();
  float acc[ND][4];
  for (int d = 0; d < ND; d++) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;

  for (int t = 0; t < n; t++) {
    const i64 kv0 = kt_.start(t);
    load_next_kv<D>(sK, sV, k, v, kt_, t, n, T, Hkv, hk); /* the next key tile streams in meanwhile */
    __syncthreads();
    const u16 *bK = sK + (t & 1) * tile<D>::ELEMS, *bV = sV + (t & 1) * tile<D>::ELEMS;
    float s[8][4], dp[8][4];
    mma_two_products<DT, D>(s, dp, sQ, bK, sO, bV, w); /* S = Q K^T, dP = dO V^T */
    const bool phase_a = t < na;
    const bool masked = !phase_a || kv0 + TILE > a1_min;
    int lo[2], hi[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      visible_keys(phase_a, kv0, rows[r], a1[r], b0r[r], lo[r], hi[r]);
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int r = e / 2, off = j * 8 + 2 * t4 + (e % 2);
        float pj = exp2f(s[j][e] * c - L[r]);
        if (masked && (off < lo[r] || off > hi[r])) pj = 0.0f;
        s[j][e] = pj * (dp[j][e] - Dl[r]);
      }
    mma_acc_times_tile<DT, D>(acc, s, bK); /* dq += dS K */
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    if (rows[r] >= qend) continue;
    u32 *g = (u32 *)((u16 *)dq + (rows[r] * Hq + h) * D);
#pragma unroll
    for (int d = 0; d < ND; d++) g[d * 4 + t4] = pack<DT>(acc[d][2 * r] * scale, acc[d][2 * r + 1] * scale);
  }
}

/* The workspace of the mma backward: delta [T, Hq] f32, then (GQA) the per-query-head partial
 * dk and dv, f32 [2][ratio][T][Hkv][D], at a 16-byte boundary. */
RLK_DEVICE float *pa_partials(void *work, i64 T, i32 Hq) {
  return (float *)work + ((T * Hq + 3) & ~(i64)3);
}

/* Backward dk, dv (sm_80+): a block per (64-key tile of a prompt, prompt, query head). Each warp owns 16
 * keys and walks every 64-row query tile that sees them (a prefix tile: its own prefix rows from
 * the tile on, then every response row of the prompt; a response tile: rows from the tile to the
 * end of the response holding its last key), the next tile streaming in meanwhile:
 * S^T = K Q^T, P^T = exp(S^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - delta),
 * dv += P^T dO, dk += dS^T Q. Without GQA the block writes dk, dv; with it, an f32 partial per
 * query head that pattn_bwd_reduce sums over the group's heads in order. */
template <int DT, int D>
__global__ void __launch_bounds__(pa::THREADS)
    pattn_bwd_dkdv_mma(RLK_PARAMS_ARG pa_bwd_args p_) {
  const void *__restrict__ q = p_.q, *__restrict__ k = p_.k, *__restrict__ v = p_.v, *__restrict__ dout = p_.dout;
  const float *__restrict__ lse = p_.lse;
  void *__restrict__ work = p_.work;
  const i32 *__restrict__ seq = p_.seq, *__restrict__ grp = p_.grp;
  const i64 T = p_.T;
  const i32 Hq = p_.Hq, Hkv = p_.Hkv;
  const float scale = p_.scale;
  void *__restrict__ dk = p_.dk, *__restrict__ dv = p_.dv;
  using namespace pa;
  constexpr int ND = D / 8;
  extern __shared__ __align__(16) u16 pa_smem[];
  u16 *sK = pa_smem, *sV = sK + tile<D>::ELEMS, *sQ = sV + tile<D>::ELEMS, *sO = sQ + 2 * tile<D>::ELEMS;
  float *sL = (float *)(sO + 2 * tile<D>::ELEMS), *sD = sL + 2 * TILE; /* [2][TILE] each */
  i32 *sLo = (i32 *)(sD + 2 * TILE);
  region rg;
  const i64 k0 = prompt_tile(seq, grp, (i32)blockIdx.y, (i64)blockIdx.x, TILE, true, rg);
  if (k0 < 0) return;
  const i64 kend = min_(k0 + TILE, rg.r1);
  const i32 h = (i32)blockIdx.z, ratio = Hq / Hkv, hk = h / ratio;
  const int lane = (int)threadIdx.x % 32, w = (int)threadIdx.x / 32, g8 = lane / 4, t4 = lane % 4;
  const float *delta = (const float *)work;
  const float c = scale * LOG2E;
  /* the queries that see these keys */
  const i64 qlast = rg.resp ? seq[last_le(seq, rg.rs0, rg.rs1, kend - 1) + 1] : rg.pend;
  const int nq = (int)((qlast - k0 + TILE - 1) / TILE);
  const int kn = (int)(kend - k0), kr[2] = {w * 16 + g8, w * 16 + g8 + 8};

  /* query tile t into buffer b: rows, their lse, delta and first visible key offset */
  auto stage = [&](int t, int b) {
    const i64 q0 = k0 + (i64)t * TILE, qend = min_(q0 + TILE, qlast);
    load_tile<D>(sQ + b * tile<D>::ELEMS, q, q0, qend, Hq, h);
    load_tile<D>(sO + b * tile<D>::ELEMS, dout, q0, qend, Hq, h);
    if (threadIdx.x < TILE) {
      const i64 i = q0 + threadIdx.x;
      const bool ok = i < qend;
      sL[b * TILE + threadIdx.x] = ok ? lse[i * Hq + h] * LOG2E : 0.0f;
      sD[b * TILE + threadIdx.x] = ok ? delta[i * Hq + h] : 0.0f;
      /* a row sees these keys from offset lo on: its response's start (response keys), else all */
      sLo[b * TILE + threadIdx.x] = ok ? (rg.resp ? (int)max_<i64>(row_lo(rg, seq, i) - k0, -1) : -1) : TILE;
    }
  };
  load_tile<D>(sK, k, k0, kend, Hkv, hk);
  load_tile<D>(sV, v, k0, kend, Hkv, hk);
  stage(0, 0);
  cp_commit();
  float gk[ND][4], gv[ND][4];
  for (int d = 0; d < ND; d++)
    for (int e = 0; e < 4; e++) gk[d][e] = gv[d][e] = 0.0f;

  for (int t = 0; t < nq; t++) {
    if (t + 1 < nq) {
      stage(t + 1, (t + 1) & 1);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const int b = t & 1;
    const u16 *bQ = sQ + b * tile<D>::ELEMS, *bO = sO + b * tile<D>::ELEMS;
    const float *bL = sL + b * TILE, *bD = sD + b * TILE;
    const i32 *bLo = sLo + b * TILE;
    float s[8][4], dp[8][4];
    mma_two_products<DT, D>(s, dp, sK, bQ, sV, bO, w); /* S^T = K Q^T, dP^T = V dO^T */
    /* element (key k0 + kr[e / 2], query q0 + j * 8 + 2 * t4 + e % 2) */
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = j * 8 + 2 * t4 + (e % 2), key = kr[e / 2];
        const bool vis = key < kn && key <= t * TILE + col && key >= bLo[col];
        const float pj = vis ? exp2f(s[j][e] * c - bL[col]) : 0.0f;
        s[j][e] = pj;
        dp[j][e] = pj * (dp[j][e] - bD[col]);
      }
#pragma unroll
    for (int kt = 0; kt < 4; kt++) {
      u32 a[4], ds[4];
      frag_a_of_acc<DT>(a, s, kt);
      frag_a_of_acc<DT>(ds, dp, kt);
#pragma unroll
      for (int d = 0; d < ND; d += 2) {
        u32 f[4];
        frag_bt<D>(f, bO, kt * 16, d * 8);
        mma_pair<DT>(gv[d], gv[d + 1], a, f);
        frag_bt<D>(f, bQ, kt * 16, d * 8);
        mma_pair<DT>(gk[d], gk[d + 1], ds, f);
      }
    }
    __syncthreads();
  }
  float *part = ratio > 1 ? pa_partials(work, T, Hq) : nullptr;
  const i64 nkv = T * Hkv * D;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    if (kr[r] >= kn) continue;
    const i64 at = ((k0 + kr[r]) * Hkv + hk) * D;
    if (part) {
      float *pk = part + (i64)(h % ratio) * nkv + at, *pv = pk + (i64)ratio * nkv;
#pragma unroll
      for (int d = 0; d < ND; d++) {
        *(f32x2 *)(pk + d * 8 + 2 * t4) = f32x2{gk[d][2 * r] * scale, gk[d][2 * r + 1] * scale};
        *(f32x2 *)(pv + d * 8 + 2 * t4) = f32x2{gv[d][2 * r], gv[d][2 * r + 1]};
      }
    } else {
      u32 *gkp = (u32 *)((u16 *)dk + at), *gvp = (u32 *)((u16 *)dv + at);
#pragma unroll
      for (int d = 0; d < ND; d++) {
        gkp[d * 4 + t4] = pack<DT>(gk[d][2 * r] * scale, gk[d][2 * r + 1] * scale);
        gvp[d * 4 + t4] = pack<DT>(gv[d][2 * r], gv[d][2 * r + 1]);
      }
    }
  }
}

/* Backward with GQA, last step (sm_80+): dk, dv = the sums of the query heads' f32 partials,
 * heads in order, rounded once. A thread per element. */
template <int DT, int D>
__global__ void __launch_bounds__(PA_PASS_THREADS)
    pattn_bwd_reduce(RLK_PARAMS_ARG pa_bwd_args p_) {
  void *__restrict__ work = p_.work;
  const i64 T = p_.T;
  const i32 Hq = p_.Hq, Hkv = p_.Hkv;
  void *__restrict__ dk = p_.dk, *__restrict__ dv = p_.dv;
  const i64 e = (i64)blockIdx.x * 256 + threadIdx.x, n = T * Hkv * D;
  if (e >= n) return;
  const i32 ratio = Hq / Hkv;
  const float *part = pa_partials(work, T, Hq);
  float sk = 0.0f, sv = 0.0f;
  for (i32 r = 0; r < ratio; r++) {
    sk += part[r * n + e];
    sv += part[(ratio + r) * n + e];
  }
  pa::st<DT>(dk, e, sk);
  pa::st<DT>(dv, e, sv);
}
#endif /* RLK_CUDA */

} // namespace rlk

#endif

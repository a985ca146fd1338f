/* test_prefix_attention.c - rlk_prefix_attention and its backward against an fp64 reference on
 * the replicated layout (tests/ref/prefix_attention_ref.c): each [prefix; r_g] run as its own
 * causal sequence, the prefix's gradients summed over the group by the test. Every element is
 * checked against a bound the reference derives from the arithmetic of the kernels that made it:
 * the fp64 host path (one rounding per output) on the host, the CUDA kernels (f32 sums, P and dS
 * in 16 bits) with RLK_TEST_GPU=1, plus bitwise repeatability. pa_power_check shows on each
 * case's data that the GPU bounds would catch a kernel that dropped a key or query tile or mixed
 * up heads. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "ref/prefix_attention_ref.h"
#include "suites.h"
#include "test_util.h"

/* A batch: P prompts, prompt p with prefix[p] tokens and G[p] responses whose lengths are taken
 * in order from resp[]. */
typedef struct pa_case {
  int P;
  int prefix[4];
  int G[4];
  int resp[64];
  int Hq, Hkv, D;
  rlk_dtype dt;
  float scale; /* 0: the default 1/sqrt(D) */
} pa_case;

/* Everything one case needs, host side. */
typedef struct pa_run {
  int64_t T, S;
  int32_t seq[80], grp[5];
  size_t nq, nkv;
  uint16_t *q, *k, *v, *dout;          /* inputs as stored */
  double *qd, *kd, *vd, *dod;          /* the same values */
  uint16_t *out, *dq, *dk, *dv;        /* outputs read back */
  float *lse;
} pa_run;

static void build_layout(const pa_case *c, pa_run *r) {
  int64_t t = 0, s = 0, ri = 0;
  for (int p = 0; p < c->P; p++) {
    r->grp[p] = (int32_t)s;
    r->seq[s++] = (int32_t)t;
    t += c->prefix[p];
    for (int g = 0; g < c->G[p]; g++) {
      r->seq[s++] = (int32_t)t;
      t += c->resp[ri++];
    }
  }
  r->grp[c->P] = (int32_t)s;
  r->seq[s] = (int32_t)t;
  r->T = t;
  r->S = s;
}

/* Inputs on a grid: a / 4 with a uniform on the integers -7..7 (deviation 1.08), exact in both
 * 16-bit dtypes. Every product of two is a multiple of 1/16 and every partial sum of a dot product
 * over D < 21399 one below 49 D / 16 < 2^16: 20 significant bits, which f32 holds exactly in any
 * order and under any truncation (four bits to spare for an accumulator that keeps fewer than
 * 24): the kernels' q . k and dO . v are exact, as the reference's bounds take them. */
static void fill(uint16_t *x, double *xd, size_t n, rlk_dtype dt, uint64_t *rng) {
  for (size_t i = 0; i < n; i++)
    xd[i] = rlk_test_store(x, dt, (int64_t)i, (double)((int)(rlk_test_rand_u64(rng) % 15u) - 7) / 4.0);
}

static void run_alloc(const pa_case *c, pa_run *r, uint64_t *rng) {
  memset(r, 0, sizeof *r);
  build_layout(c, r);
  r->nq = (size_t)(r->T * c->Hq * c->D);
  r->nkv = (size_t)(r->T * c->Hkv * c->D);
  r->q = malloc(r->nq * 2);
  r->dout = malloc(r->nq * 2);
  r->k = malloc(r->nkv * 2);
  r->v = malloc(r->nkv * 2);
  r->qd = malloc(r->nq * sizeof(double));
  r->dod = malloc(r->nq * sizeof(double));
  r->kd = malloc(r->nkv * sizeof(double));
  r->vd = malloc(r->nkv * sizeof(double));
  r->out = malloc(r->nq * 2);
  r->dq = malloc(r->nq * 2);
  r->dk = malloc(r->nkv * 2);
  r->dv = malloc(r->nkv * 2);
  r->lse = malloc((size_t)(r->T * c->Hq) * sizeof(float));
  ck_assert_int_lt(c->D, 21399);
  fill(r->q, r->qd, r->nq, c->dt, rng);
  fill(r->k, r->kd, r->nkv, c->dt, rng);
  fill(r->v, r->vd, r->nkv, c->dt, rng);
  fill(r->dout, r->dod, r->nq, c->dt, rng);
}

static void run_free(pa_run *r) {
  void *all[] = {r->q, r->k, r->v, r->dout, r->qd, r->kd, r->vd, r->dod, r->out, r->dq, r->dk, r->dv, r->lse};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* Runs the forward and backward on ctx; outputs into r. */
static void run_op(rlk_context *ctx, const pa_case *c, pa_run *r) {
  const int host = rlk_context_backend(ctx) == RLK_BACKEND_HOST;
  void *dq = rlk_test_dev_upload(ctx, r->q, r->nq * 2), *dk = rlk_test_dev_upload(ctx, r->k, r->nkv * 2);
  void *dv = rlk_test_dev_upload(ctx, r->v, r->nkv * 2), *ddo = rlk_test_dev_upload(ctx, r->dout, r->nq * 2);
  void *dout = rlk_test_dev_alloc(ctx, r->nq * 2), *dlse = rlk_test_dev_alloc(ctx, (size_t)(r->T * c->Hq) * 4);
  void *gq = rlk_test_dev_alloc(ctx, r->nq * 2), *gk = rlk_test_dev_alloc(ctx, r->nkv * 2);
  void *gv = rlk_test_dev_alloc(ctx, r->nkv * 2);
  void *dseq = rlk_test_dev_upload(ctx, r->seq, (size_t)(r->S + 1) * 4);
  void *dgrp = rlk_test_dev_upload(ctx, r->grp, (size_t)(c->P + 1) * 4);

  rlk_prefix_attention_layout l = {
      .host_seq_offsets = r->seq, .host_group_offsets = r->grp, .num_segments = r->S, .num_prompts = c->P};
  if (!host) { /* the host backend reads the host arrays: its device tensors may be absent */
    l.seq_offsets = rlk_tensor_1d(dseq, RLK_I32, r->S + 1);
    l.group_offsets = rlk_tensor_1d(dgrp, RLK_I32, c->P + 1);
  }

  rlk_prefix_attention_args a;
  rlk_prefix_attention_args_init(&a);
  a.q = rlk_test_tensor_3d(dq, c->dt, r->T, c->Hq, c->D);
  a.k = rlk_test_tensor_3d(dk, c->dt, r->T, c->Hkv, c->D);
  a.v = rlk_test_tensor_3d(dv, c->dt, r->T, c->Hkv, c->D);
  a.layout = l;
  a.scale = c->scale;
  a.out = rlk_test_tensor_3d(dout, c->dt, r->T, c->Hq, c->D);
  a.lse = rlk_tensor_2d(dlse, RLK_F32, r->T, c->Hq, c->Hq);
  ck_assert_msg(rlk_prefix_attention(ctx, &a, NULL) == RLK_OK, "forward: %s", rlk_last_error());

  rlk_prefix_attention_backward_args b;
  rlk_prefix_attention_backward_args_init(&b);
  b.q = a.q;
  b.k = a.k;
  b.v = a.v;
  b.layout = l;
  b.scale = c->scale;
  b.out = a.out;
  b.lse = a.lse;
  b.grad_out = rlk_test_tensor_3d(ddo, c->dt, r->T, c->Hq, c->D);
  b.grad_q = rlk_test_tensor_3d(gq, c->dt, r->T, c->Hq, c->D);
  b.grad_k = rlk_test_tensor_3d(gk, c->dt, r->T, c->Hkv, c->D);
  b.grad_v = rlk_test_tensor_3d(gv, c->dt, r->T, c->Hkv, c->D);
  size_t ws = 0;
  ck_assert_msg(rlk_prefix_attention_backward_workspace_size(ctx, &b, &ws) == RLK_OK, "%s", rlk_last_error());
  b.workspace = rlk_test_dev_alloc(ctx, ws);
  b.workspace_bytes = ws;
  ck_assert_msg(rlk_prefix_attention_backward(ctx, &b, NULL) == RLK_OK, "backward: %s", rlk_last_error());
  ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, r->out, dout, r->nq * 2), RLK_OK);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, r->lse, dlse, (size_t)(r->T * c->Hq) * 4), RLK_OK);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, r->dq, gq, r->nq * 2), RLK_OK);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, r->dk, gk, r->nkv * 2), RLK_OK);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, r->dv, gv, r->nkv * 2), RLK_OK);
  void *all[] = {dq, dk, dv, ddo, dout, dlse, gq, gk, gv, dseq, dgrp, b.workspace};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) rlk_free(ctx, all[i]);
}

/* ---------------------------------------------------------------------------------- */
/* The reference and what the arithmetic allows                                        */
/* ---------------------------------------------------------------------------------- */

/* The arithmetic of the kernels that ran (pa_ref_arith): the host's fp64 (exp within an ulp; its
 * dot products of D terms within 3 D u: a product and an addition each), or the GPU's f32 sums
 * and operations (its dot products exact on the grid) with exponentials within 8 u (exp2f: 2 ulp;
 * ex2.approx: about 2^-22) and, where `tiles16` (sm_80+: the mma and wgmma kernels), P and dS rounded to the
 * 16-bit dtype before the second products and 64-key tiles or larger, at most T / 64 + 2 of them
 * for a row (its keys lie in [0, T) in at most two runs); the portable kernels (older devices)
 * keep P and dS in f32 and rescale at every key. The outputs are rounded to the 16-bit dtype:
 * half an ulp, 2^-8 (bf16) or 2^-11 (f16) of the value, or below the normal range (2^-126,
 * 2^-14) half the subnormals' spacing (2^-134, 2^-25). */
static pa_ref_arith pa_arith(rlk_dtype dt, int D, int gpu, int tiles16, int64_t T) {
  const int f16 = dt == RLK_F16;
  pa_ref_arith a;
  memset(&a, 0, sizeof a);
  a.o16 = f16 ? 0x1p-11 : 0x1p-8;
  a.ao16 = a.a16 = f16 ? 0x1p-25 : 0x1p-134;
  a.min16 = f16 ? 0x1p-14 : 0x1p-126;
  a.u = gpu ? 0x1p-24 : 0x1p-53;
  a.dot = gpu ? 0.0 : 3.0 * D * a.u;
  a.ex = gpu ? 8 * a.u : 0x1p-52;
  a.r16 = gpu && tiles16 ? a.o16 : 0.0;
  a.tiles = gpu && tiles16 ? T / 64 + 2 : T + 2;
  a.delta_from_out = gpu;
  return a;
}

/* The arithmetic of ctx's kernels (the GPU's family by its compute capability). */
static pa_ref_arith pa_arith_of(rlk_context *ctx, rlk_dtype dt, int D, int64_t T) {
  if (rlk_context_backend(ctx) == RLK_BACKEND_HOST) return pa_arith(dt, D, 0, 0, T);
  rlk_device_info info;
  ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
  return pa_arith(dt, D, 1, info.compute_major >= 8, T);
}

/* Where packed token t lies: its prompt's prefix [ps, pe), the prompt's end, its segment
 * [s0, s1); resp is 0 for a prefix token. */
typedef struct pa_where {
  int64_t ps, pe, pend, s0, s1;
  int resp;
} pa_where;

static pa_where pa_where_of(const pa_case *c, const pa_run *r, int64_t t) {
  pa_where w;
  memset(&w, 0, sizeof w);
  for (int p = 0; p < c->P; p++) {
    const int64_t g = r->grp[p];
    if (t >= r->seq[r->grp[p + 1]]) continue;
    w.ps = r->seq[g], w.pe = r->seq[g + 1], w.pend = r->seq[r->grp[p + 1]];
    for (int64_t s = g; s < r->grp[p + 1]; s++)
      if (t < r->seq[s + 1]) {
        w.s0 = r->seq[s], w.s1 = r->seq[s + 1], w.resp = s != g;
        break;
      }
    break;
  }
  return w;
}

/* The keys packed query row i sees: [ps, a1) then [b0, b1). */
static void pa_keys(const pa_where *w, int64_t i, int64_t *a1, int64_t *b0, int64_t *b1) {
  *a1 = w->resp ? w->pe : i + 1;
  *b0 = w->resp ? w->s0 : 0;
  *b1 = w->resp ? i + 1 : 0;
}

/* The reference on the replicated layout: for prompt p and each response g, the sequence
 * [prefix; r_g] (the prefix alone when G = 0) as plain causal attention. The prefix's upstream
 * gradient goes to replica 0 only (the other copies' prefix outputs are not part of the loss), so
 * the shared prefix's gradients are the sums over replicas. dk1 receives replica 0's prefix dk
 * alone. b*: each element's bound under the arithmetic given; the packed kernels sum dq over the
 * row's keys, dk and dv over the query rows that see the key and the GQA group's heads (with the
 * mma path's per-head partials and their sum: ratio + 2 more terms). */
typedef struct pa_refs {
  double *out, *lse, *dq, *dk, *dv, *dk1;
  double *bout, *blse, *bdq, *bdk, *bdv;
} pa_refs;

static void reference(const pa_case *c, const pa_run *r, const pa_ref_arith *ar, pa_refs *f) {
  const int Hq = c->Hq, Hkv = c->Hkv, D = c->D, ratio = Hq / Hkv;
  double **all[] = {&f->out, &f->dq, &f->lse, &f->dk, &f->dv, &f->dk1, &f->bout, &f->bdq, &f->blse, &f->bdk, &f->bdv};
  const size_t len[] = {r->nq, r->nq, (size_t)(r->T * Hq), r->nkv, r->nkv, r->nkv, r->nq, r->nq, (size_t)(r->T * Hq),
                        r->nkv, r->nkv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    *all[i] = calloc(len[i], sizeof(double));
    ck_assert(*all[i]);
  }
  double *em = calloc(2 * (r->nq + 2 * r->nkv), sizeof(double)); /* dq, dk, dv: e then m */
  ck_assert(em);
  double *dq_e = em, *dq_m = dq_e + r->nq, *dk_e = dq_m + r->nq, *dk_m = dk_e + r->nkv, *dv_e = dk_m + r->nkv;
  double *dv_m = dv_e + r->nkv;
  const double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)D);
  for (int p = 0; p < c->P; p++) {
    const int64_t s0 = r->grp[p], s1 = r->grp[p + 1];
    const int64_t ps = r->seq[s0], Lp = r->seq[s0 + 1] - ps;
    const int64_t reps = s1 - s0 - 1 > 0 ? s1 - s0 - 1 : 1;
    for (int64_t g = 0; g < reps; g++) {
      const int64_t rs = s1 - s0 > 1 ? r->seq[s0 + 1 + g] : 0, Lr = s1 - s0 > 1 ? r->seq[s0 + 2 + g] - rs : 0;
      const int64_t L = Lp + Lr, nq = L * Hq * D, nkv = L * Hkv * D;
      if (L == 0) continue;
      double *buf = calloc((size_t)(7 * nq + 8 * nkv + 2 * L * Hq), sizeof(double));
      ck_assert(buf);
      double *q = buf, *dout = q + nq, *out = dout + nq, *dq = out + nq, *k = dq + nq, *v = k + nkv;
      double *dk = v + nkv, *dv = dk + nkv, *lse = dv + nkv, *bo = lse + L * Hq, *bl = bo + nq;
      pa_ref_bounds b = {bo, bl, bl + L * Hq, bl + L * Hq + nq, NULL, NULL, NULL, NULL};
      b.dk_e = b.dq_m + nq, b.dk_m = b.dk_e + nkv, b.dv_e = b.dk_m + nkv, b.dv_m = b.dv_e + nkv;
      for (int64_t i = 0; i < L; i++) {
        const int64_t src = i < Lp ? ps + i : rs + (i - Lp);
        memcpy(q + i * Hq * D, r->qd + src * Hq * D, sizeof(double) * (size_t)(Hq * D));
        memcpy(k + i * Hkv * D, r->kd + src * Hkv * D, sizeof(double) * (size_t)(Hkv * D));
        memcpy(v + i * Hkv * D, r->vd + src * Hkv * D, sizeof(double) * (size_t)(Hkv * D));
        if (i >= Lp || g == 0) memcpy(dout + i * Hq * D, r->dod + src * Hq * D, sizeof(double) * (size_t)(Hq * D));
      }
      pa_ref_causal(L, Hq, Hkv, D, scale, q, k, v, dout, out, lse, dq, dk, dv, ar, &b);
      for (int64_t i = 0; i < L; i++) {
        const int64_t dst = i < Lp ? ps + i : rs + (i - Lp);
        const int shared = i < Lp;
        if (!shared || g == 0) {
          memcpy(f->out + dst * Hq * D, out + i * Hq * D, sizeof(double) * (size_t)(Hq * D));
          memcpy(f->lse + dst * Hq, lse + i * Hq, sizeof(double) * (size_t)Hq);
          memcpy(f->bout + dst * Hq * D, bo + i * Hq * D, sizeof(double) * (size_t)(Hq * D));
          memcpy(f->blse + dst * Hq, bl + i * Hq, sizeof(double) * (size_t)Hq);
        }
        for (int64_t e = 0; e < Hq * D; e++) {
          f->dq[dst * Hq * D + e] += dq[i * Hq * D + e];
          dq_e[dst * Hq * D + e] += b.dq_e[i * Hq * D + e];
          dq_m[dst * Hq * D + e] += b.dq_m[i * Hq * D + e];
        }
        for (int64_t e = 0; e < Hkv * D; e++) {
          const int64_t at = dst * Hkv * D + e, from = i * Hkv * D + e;
          f->dk[at] += dk[from];
          f->dv[at] += dv[from];
          dk_e[at] += b.dk_e[from], dk_m[at] += b.dk_m[from];
          dv_e[at] += b.dv_e[from], dv_m[at] += b.dv_m[from];
          if (g == 0) f->dk1[at] = dk[from];
        }
      }
      free(buf);
    }
  }
  for (int64_t t = 0; t < r->T; t++) {
    const pa_where w = pa_where_of(c, r, t);
    int64_t a1, b0, b1;
    pa_keys(&w, t, &a1, &b0, &b1);
    const int64_t keys = a1 - w.ps + b1 - b0, rows = w.resp ? w.s1 - t : w.pend - t;
    for (int64_t e = t * Hq * D; e < (t + 1) * Hq * D; e++)
      f->bdq[e] = pa_ref_bound(ar, dq_e[e], dq_m[e], f->dq[e], keys);
    for (int64_t e = t * Hkv * D; e < (t + 1) * Hkv * D; e++) {
      f->bdk[e] = pa_ref_bound(ar, dk_e[e], dk_m[e], f->dk[e], ratio * (rows + 1) + 2);
      f->bdv[e] = pa_ref_bound(ar, dv_e[e], dv_m[e], f->dv[e], ratio * (rows + 1) + 2);
    }
  }
  free(em);
}

static void refs_free(pa_refs *f) {
  double *all[] = {f->out, f->lse, f->dq, f->dk, f->dv, f->dk1, f->bout, f->blse, f->bdq, f->bdk, f->bdv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* Each element within its bound; returns the largest |x - ref| / bound. x: 16-bit (dt) or, with
 * lse, f32. */
static double check_bounded(const char *what, const void *x, rlk_dtype dt, const double *ref, const double *bound,
                            size_t n, const char *label) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    const double got = rlk_test_load(x, dt, (int64_t)i), err = fabs(got - ref[i]);
    ck_assert_msg(err <= bound[i], "%s %s: element %zu is %.9g, fp64 %.9g, bound %.3g (seed %llu)", label, what, i,
                  got, ref[i], bound[i], (unsigned long long)rlk_test_seed());
    worst = fmax(worst, err / bound[i]);
  }
  return worst;
}

/* ---------------------------------------------------------------------------------- */
/* The bounds' power                                                                   */
/* ---------------------------------------------------------------------------------- */

/* A kernel that dropped a tile or mixed up heads must fail: each fault below has to move some
 * element it touches by more than twice its bound (an error within the bound on top of it then
 * cannot hide it: |fault + err| >= |fault| - bound > bound). A kernel's fault is the same in each
 * of its blocks, those of the mma kernels here (the finest: 64-row query tiles, 64-key tiles; the
 * sm_90a kernels' are 128 wide where they differ), on the packed layout, in every head:
 *   key tile: each query tile (64 rows of a prefix, or of its responses stacked) leaves out the
 *     t-th of the key tiles it walks (its prefix's from the start, then from its first row's
 *     response start; t counts where that tile is whole), or its last, its last prefix tile or
 *     its first response tile; each row of it then gets out = (out - sum_K p v) / (1 - sum_K p),
 *     lse + ln(1 - sum_K p) and dq less scale sum_K dS k (a row that sees nothing else counts as
 *     caught);
 *   query tile: each key tile (64 keys of a prefix, or of its responses stacked) leaves out the
 *     t-th (where whole) or the last of the query tiles it walks (64 rows from its first key on,
 *     in each query head of its group): dk less scale sum_Q dS q, dv less sum_Q p dO;
 *   head: out and dq of the next query head; dk and dv of the next key head, or with one key
 *     head, without one query head's share.
 * p = exp(z - lse) and dS = p (dP - dO . out) from the reference's lse and out (fp64). A fault
 * that moves nothing (a row's only key: dS = 0) is none. Reported: the weakest fault of each kind,
 * the most its largest element exceeds its bound. (A tile that is not whole is the last of its
 * run; one block's alone can hold a key or two of little weight, which moves the outputs by less
 * than P's 16-bit rounding may: no bound that holds every correct kernel can see that, so such a
 * tile counts in the faults that take it from every block, the last tile's.) */
typedef struct pa_power {
  double tile_out, tile_lse, tile_dq, tile_kv, head_out, head_dq, head_kv;
} pa_power;

/* The blocks: for each token as a query row, its query tile's end (qe), number of key tiles (nt),
 * prefix tiles among them (na) and first key of its response tiles (b0); as a key, its key
 * tile's first key (k0), last query row + 1 (ql) and number of query tiles (nq). Fault families:
 * key tile t < nf - 3, then the last, the last prefix tile, the first response tile; query tile
 * t < nkf - 1, then the last. */
enum { PA_LAST = 1, PA_PREFIX_LAST = 2, PA_RESP_FIRST = 3 };
typedef struct pa_blocks {
  int64_t *qe, *nt, *na, *b0, *k0, *ql, *nq;
  int64_t nf, nkf;
} pa_blocks;

static pa_blocks pa_blocks_of(const pa_case *c, const pa_run *r) {
  pa_blocks bl;
  int64_t *all = malloc(sizeof(int64_t) * (size_t)(7 * r->T)), most = 0, most_q = 0;
  ck_assert(all);
  bl.qe = all, bl.nt = all + r->T, bl.na = all + 2 * r->T, bl.b0 = all + 3 * r->T, bl.k0 = all + 4 * r->T;
  bl.ql = all + 5 * r->T, bl.nq = all + 6 * r->T;
  for (int p = 0; p < c->P; p++) {
    const int64_t g = r->grp[p], ps = r->seq[g], pe = r->seq[g + 1], pend = r->seq[r->grp[p + 1]];
    for (int64_t t0 = ps; t0 < pend;) {
      const int resp = t0 >= pe;
      const int64_t tend = t0 + 64 < (resp ? pend : pe) ? t0 + 64 : (resp ? pend : pe);
      /* as a query tile */
      const int64_t b0 = resp ? pa_where_of(c, r, t0).s0 : 0, na = ((resp ? pe : tend) - ps + 63) / 64;
      const int64_t nt = na + (resp ? (tend - b0 + 63) / 64 : 0);
      /* as a key tile: the rows from t0 to the prompt's end (prefix keys) or to the end of the
       * response holding its last key */
      const int64_t ql = resp ? pa_where_of(c, r, tend - 1).s1 : pend, nq = (ql - t0 + 63) / 64;
      for (int64_t t = t0; t < tend; t++) {
        bl.qe[t] = tend, bl.nt[t] = nt, bl.na[t] = na, bl.b0[t] = b0;
        bl.k0[t] = t0, bl.ql[t] = ql, bl.nq[t] = nq;
      }
      most = nt > most ? nt : most;
      most_q = nq > most_q ? nq : most_q;
      t0 = tend;
    }
  }
  bl.nf = most + 3;
  bl.nkf = most_q + 1;
  return bl;
}

/* The largest |delta[e]| / bound[e] over n elements. */
static double pa_moved(const double *delta, const double *bound, int64_t n) {
  double x = 0;
  for (int64_t e = 0; e < n; e++) x = fmax(x, fabs(delta[e]) / bound[e]);
  return x;
}

/* One head's walk: each key's dk and dv from the query tile it is in (cur, -1: none). */
typedef struct pa_walk {
  const pa_refs *f;
  const pa_blocks *bl;
  int Hkv, hk, D;
  double *qk, *qv, *r_kv;
  int64_t *cur;
} pa_walk;

/* Key j's query tile ends: what leaving it out moves. */
static void pa_walk_flush(pa_walk *w, int64_t j) {
  if (w->cur[j] < 0) return;
  const int D = w->D;
  const int64_t at = (j * w->Hkv + w->hk) * D, t = w->cur[j], last = w->bl->nkf - 1;
  const double m = fmax(pa_moved(w->qk + j * D, w->f->bdk + at, D), pa_moved(w->qv + j * D, w->f->bdv + at, D));
  if (w->bl->k0[j] + 64 * (t + 1) <= w->bl->ql[j]) w->r_kv[t] = fmax(w->r_kv[t], m);
  if (t == w->bl->nq[j] - 1) w->r_kv[last] = fmax(w->r_kv[last], m);
  memset(w->qk + j * D, 0, sizeof(double) * (size_t)D);
  memset(w->qv + j * D, 0, sizeof(double) * (size_t)D);
  w->cur[j] = -1;
}

/* Key tile t of row i's query tile moved out, lse and dq by these over their bounds: into the
 * faults it belongs to (row i of a prompt whose prefix starts at ps and ends at pe). */
static void pa_key_fault(const pa_blocks *bl, int64_t i, int64_t ps, int64_t pe, int resp, int64_t t, const double m[3],
                         double *rec) {
  int64_t fam[4], n = 0;
  const int64_t na = bl->na[i];
  if (t < na ? ps + 64 * (t + 1) <= (resp ? pe : bl->qe[i]) : bl->b0[i] + 64 * (t - na + 1) <= bl->qe[i]) fam[n++] = t;
  if (t == bl->nt[i] - 1) fam[n++] = bl->nf - PA_LAST;
  if (resp && t == bl->na[i] - 1) fam[n++] = bl->nf - PA_PREFIX_LAST;
  if (resp && t == bl->na[i]) fam[n++] = bl->nf - PA_RESP_FIRST;
  for (int64_t x = 0; x < n; x++)
    for (int q = 0; q < 3; q++) rec[q * bl->nf + fam[x]] = fmax(rec[q * bl->nf + fam[x]], m[q]);
}

static pa_power pa_power_of(const pa_case *c, const pa_run *r, const pa_refs *f) {
  const int Hq = c->Hq, Hkv = c->Hkv, D = c->D, ratio = Hq / Hkv;
  const int64_t T = r->T;
  const double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)D);
  const pa_blocks bl = pa_blocks_of(c, r);
  /* each fault's most moved element: out, lse, dq of the key-tile faults; dk, dv of the others */
  double *rec = calloc((size_t)(3 * bl.nf + bl.nkf), sizeof(double));
  /* each key's dk and dv from its current query tile (the group's heads together), and from
   * each head of the group; a row's sums over a key tile of p v and of scale dS k; out moved */
  double *acc = calloc((size_t)(2 * (ratio + 1) * T * D + 3 * D), sizeof(double));
  int64_t *cur = malloc((size_t)T * 8);
  ck_assert(rec && acc && cur);
  double *r_out = rec, *r_lse = r_out + bl.nf, *r_dq = r_lse + bl.nf, *r_kv = r_dq + bl.nf;
  double *qk = acc, *qv = qk + T * D, *hs = qv + T * D, *sk = hs + 2 * ratio * T * D, *sq = sk + D, *delta = sq + D;
  pa_power pw = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY};
  for (int hk = 0; hk < Hkv; hk++) {
    pa_walk wk = {f, &bl, Hkv, hk, D, qk, qv, r_kv, cur};
    memset(hs, 0, sizeof(double) * (size_t)(2 * ratio * T * D));
    for (int64_t j = 0; j < T; j++) cur[j] = -1;
    for (int64_t i = 0; i < T; i++) {
      const pa_where w = pa_where_of(c, r, i);
      int64_t a1, b0, b1;
      pa_keys(&w, i, &a1, &b0, &b1);
      for (int h = hk * ratio; h < (hk + 1) * ratio; h++) {
        const double *qi = r->qd + (i * Hq + h) * D, *doi = r->dod + (i * Hq + h) * D, *oi = f->out + (i * Hq + h) * D;
        double *shk = hs + (h % ratio) * 2 * T * D, *shv = shk + T * D;
        double Di = 0, PK = 0;
        for (int d = 0; d < D; d++) Di += doi[d] * oi[d];
        const double ls = f->lse[i * Hq + h];
        int64_t cur_k = -1;
        for (int64_t x = w.ps;; x++) {
          const int64_t j = x < a1 ? x : b0 + (x - a1);
          const int done = j >= (x < a1 ? a1 : b1);
          const int64_t kt = done ? -1 : j < w.pe ? (j - w.ps) / 64 : bl.na[i] + (j - bl.b0[i]) / 64;
          if (kt != cur_k) { /* the row's part of key tile cur_k ends */
            if (cur_k >= 0) {
              const int64_t at = (i * Hq + h) * D;
              const double rem = 1 - PK;
              double m[3] = {INFINITY, INFINITY, pa_moved(sq, f->bdq + at, D)};
              if (rem > 1e-12) {
                for (int d = 0; d < D; d++) delta[d] = (oi[d] - sk[d]) / rem - oi[d];
                m[0] = pa_moved(delta, f->bout + at, D);
                m[1] = fabs(log(rem)) / f->blse[i * Hq + h];
              }
              pa_key_fault(&bl, i, w.ps, w.pe, w.resp, cur_k, m, rec);
            }
            if (done) break;
            cur_k = kt;
            PK = 0;
            memset(sk, 0, sizeof(double) * (size_t)(2 * D));
          }
          const double *kj = r->kd + (j * Hkv + hk) * D, *vj = r->vd + (j * Hkv + hk) * D;
          double z = 0, dp = 0;
          for (int d = 0; d < D; d++) z += qi[d] * kj[d], dp += doi[d] * vj[d];
          const double p = exp(z * scale - ls), ds = p * (dp - Di);
          PK += p;
          const int64_t qt = (i - bl.k0[j]) / 64;
          if (qt != cur[j]) pa_walk_flush(&wk, j), cur[j] = qt;
          for (int d = 0; d < D; d++) {
            sk[d] += p * vj[d];
            sq[d] += scale * ds * kj[d];
            qk[j * D + d] += scale * ds * qi[d];
            qv[j * D + d] += p * doi[d];
            shk[j * D + d] += scale * ds * qi[d];
            shv[j * D + d] += p * doi[d];
          }
        }
      }
    }
    for (int64_t j = 0; j < T; j++) pa_walk_flush(&wk, j);
    for (int x = 0; Hkv == 1 && ratio > 1 && x < ratio; x++) { /* without one query head's share */
      const double *shk = hs + x * 2 * T * D, *shv = shk + T * D;
      pw.head_kv = fmin(pw.head_kv, fmax(pa_moved(shk, f->bdk, T * D), pa_moved(shv, f->bdv, T * D)));
    }
  }
  for (int h = 0; Hq > 1 && h < Hq; h++) { /* out and dq of the next query head */
    double mo = 0, mq = 0;
    for (int64_t i = 0; i < T; i++)
      for (int d = 0; d < D; d++) {
        const int64_t at = (i * Hq + h) * D + d, nx = (i * Hq + (h + 1) % Hq) * D + d;
        mo = fmax(mo, fabs(f->out[nx] - f->out[at]) / f->bout[at]);
        mq = fmax(mq, fabs(f->dq[nx] - f->dq[at]) / f->bdq[at]);
      }
    pw.head_out = fmin(pw.head_out, mo);
    pw.head_dq = fmin(pw.head_dq, mq);
  }
  for (int hk = 0; Hkv > 1 && hk < Hkv; hk++) { /* dk and dv of the next key head */
    double m = 0;
    for (int64_t j = 0; j < T; j++)
      for (int d = 0; d < D; d++) {
        const int64_t at = (j * Hkv + hk) * D + d, nx = (j * Hkv + (hk + 1) % Hkv) * D + d;
        m = fmax(m, fmax(fabs(f->dk[nx] - f->dk[at]) / f->bdk[at], fabs(f->dv[nx] - f->dv[at]) / f->bdv[at]));
      }
    pw.head_kv = fmin(pw.head_kv, m);
  }
  for (int64_t e = 0; e < bl.nf; e++) { /* a fault that moves nothing is none */
    if (r_out[e] > 0) pw.tile_out = fmin(pw.tile_out, r_out[e]);
    if (r_lse[e] > 0) pw.tile_lse = fmin(pw.tile_lse, r_lse[e]);
    if (r_dq[e] > 0) pw.tile_dq = fmin(pw.tile_dq, r_dq[e]);
  }
  for (int64_t e = 0; e < bl.nkf; e++)
    if (r_kv[e] > 0) pw.tile_kv = fmin(pw.tile_kv, r_kv[e]);
  free(bl.qe), free(rec), free(acc), free(cur);
  return pw;
}

/* The GPU bounds (sm_80+) on the case's data catch every fault of pa_power_of, and the prefix's
 * dk from replica 0 alone (a kernel that dropped the other responses) where a prompt has two or
 * more responses. f: the reference under that arithmetic. */
static void pa_power_check(const pa_case *c, const pa_run *r, const pa_refs *f, const char *label) {
  const pa_power pw = pa_power_of(c, r, f);
  printf("prefix_attention %s: the GPU bounds' weakest catch (a fault's largest move over its bound): key tile "
         "out %.3g lse %.3g dq %.3g, query tile dk/dv %.3g, head out %.3g dq %.3g dk/dv %.3g\n",
         label, pw.tile_out, pw.tile_lse, pw.tile_dq, pw.tile_kv, pw.head_out, pw.head_dq, pw.head_kv);
  const double all[] = {pw.tile_out, pw.tile_lse, pw.tile_dq, pw.tile_kv, pw.head_out, pw.head_dq, pw.head_kv};
  static const char *const name[] = {"a key tile (out)", "a key tile (lse)", "a key tile (dq)", "a query tile (dk, dv)",
                                     "a head (out)",     "a head (dq)",      "a head (dk, dv)"};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    ck_assert_msg(all[i] > 2, "%s: dropping %s moves no element by more than twice its bound (%.3g, seed %llu)", label,
                  name[i], all[i], (unsigned long long)rlk_test_seed());
  for (int p = 0; p < c->P; p++) {
    const int64_t s0 = r->grp[p], ps = r->seq[s0], pe = r->seq[s0 + 1];
    if (r->grp[p + 1] - s0 < 3 || pe == ps) continue;
    const int64_t n = (pe - ps) * c->Hkv * c->D, at = ps * c->Hkv * c->D;
    double m = 0;
    for (int64_t e = at; e < at + n; e++) m = fmax(m, fabs(f->dk[e] - f->dk1[e]) / f->bdk[e]);
    ck_assert_msg(m > 2, "%s: the prefix dk of one response is within the bounds of the group's sum (%.3g)", label, m);
  }
}

/* The seed of a case's inputs. */
static uint64_t pa_case_seed(const pa_case *c) {
  return rlk_test_seed() ^ (uint64_t)(c->prefix[0] * 131 + c->G[0] * 7 + c->Hq);
}

/* Runs a case on ctx and checks every output against its bound; `repeat`: and bitwise the same
 * on a second run. The GPU bounds' power on the case's data too (pa_power_check). */
static void check_case(rlk_context *ctx, const pa_case *c, const char *label, int repeat) {
  uint64_t rng = pa_case_seed(c);
  pa_run r;
  run_alloc(c, &r, &rng);
  run_op(ctx, c, &r);
  const pa_ref_arith ar = pa_arith_of(ctx, c->dt, c->D, r.T);
  pa_refs f;
  reference(c, &r, &ar, &f);
  const double w_out = check_bounded("out", r.out, c->dt, f.out, f.bout, r.nq, label);
  const double w_lse = check_bounded("lse", r.lse, RLK_F32, f.lse, f.blse, (size_t)(r.T * c->Hq), label);
  const double w_dq = check_bounded("dq", r.dq, c->dt, f.dq, f.bdq, r.nq, label);
  const double w_dk = check_bounded("dk", r.dk, c->dt, f.dk, f.bdk, r.nkv, label);
  const double w_dv = check_bounded("dv", r.dv, c->dt, f.dv, f.bdv, r.nkv, label);
  printf("prefix_attention %s: T=%lld Hq=%d Hkv=%d D=%d %s: the worst error over its bound: out %.2f lse %.2f dq %.2f "
         "dk %.2f dv %.2f\n",
         label, (long long)r.T, c->Hq, c->Hkv, c->D, rlk_dtype_name(c->dt), w_out, w_lse, w_dq, w_dk, w_dv);
  if (ar.r16 > 0) {
    pa_power_check(c, &r, &f, label);
  } else {
    const pa_ref_arith gpu = pa_arith(c->dt, c->D, 1, 1, r.T);
    pa_refs g;
    reference(c, &r, &gpu, &g);
    pa_power_check(c, &r, &g, label);
    refs_free(&g);
  }
  if (repeat) { /* bitwise the same on a second run */
    pa_run r2 = r;
    r2.out = malloc(r.nq * 2);
    r2.dq = malloc(r.nq * 2);
    r2.dk = malloc(r.nkv * 2);
    r2.dv = malloc(r.nkv * 2);
    r2.lse = malloc((size_t)(r.T * c->Hq) * 4);
    run_op(ctx, c, &r2);
    ck_assert_msg(!memcmp(r.out, r2.out, r.nq * 2) && !memcmp(r.dq, r2.dq, r.nq * 2) &&
                      !memcmp(r.dk, r2.dk, r.nkv * 2) && !memcmp(r.dv, r2.dv, r.nkv * 2) &&
                      !memcmp(r.lse, r2.lse, (size_t)(r.T * c->Hq) * 4),
                  "%s: a second run differs", label);
    free(r2.out);
    free(r2.dq);
    free(r2.dk);
    free(r2.dv);
    free(r2.lse);
  }
  refs_free(&f);
  run_free(&r);
}

/* ---------------------------------------------------------------------------------- */
/* Cases                                                                               */
/* ---------------------------------------------------------------------------------- */

/* G = 1 (plain causal), prefix 1, GQA 8, D 128, f16. */
static const pa_case case_g1 = {1, {1}, {1}, {129}, 8, 1, 128, RLK_F16, 0.0f};
/* G = 3, prefix 17, responses 1, 5, 129, GQA 4, D 64, bf16. */
static const pa_case case_g3 = {1, {17}, {3}, {1, 5, 129}, 4, 1, 64, RLK_BF16, 0.0f};
/* G = 16, prefix 333, responses cycling 1, 5, 129, GQA 1, D 64, bf16, scale 0.3. */
static const pa_case case_g16 = {
    1, {333}, {16}, {1, 5, 129, 1, 5, 129, 1, 5, 129, 1, 5, 129, 1, 5, 129, 1}, 2, 2, 64, RLK_BF16, 0.3f};
/* Several prompts in one batch: an empty prefix, a prompt with no responses, GQA 4, D 128. */
static const pa_case case_batch = {4, {17, 0, 1, 5}, {2, 1, 3, 0}, {5, 1, 3, 129, 5, 1}, 8, 2, 128, RLK_BF16, 0.0f};

RLK_HOST_TEST(g1, check_case(ctx, &case_g1, "host G=1", 0))
RLK_HOST_TEST(g3, check_case(ctx, &case_g3, "host G=3", 1))
RLK_HOST_TEST(g16, check_case(ctx, &case_g16, "host G=16", 0))
RLK_HOST_TEST(batch, check_case(ctx, &case_batch, "host batch", 0))

/* The argument checks' problem: one prompt, a prefix and two responses of 4 tokens (T 12), two
 * heads of 64, bf16 (values never read: static zeros). */
enum { SMALL_T = 12, SMALL_H = 2, SMALL_D = 64, SMALL_N = SMALL_T * SMALL_H * SMALL_D /* one [T, H, D] */ };
typedef struct small_problem {
  uint16_t q[SMALL_N], k[SMALL_N], v[SMALL_N], o[SMALL_N];
  float lse[SMALL_T * SMALL_H];
  int32_t seq[4], grp[2];
} small_problem;

/* The layout of p (its offsets rewritten). */
static rlk_prefix_attention_layout small_layout(small_problem *p) {
  static const int32_t seq[4] = {0, 4, 8, 12}, grp[2] = {0, 3};
  memcpy(p->seq, seq, sizeof seq);
  memcpy(p->grp, grp, sizeof grp);
  rlk_prefix_attention_layout l;
  memset(&l, 0, sizeof l);
  l.host_seq_offsets = p->seq;
  l.host_group_offsets = p->grp;
  l.num_segments = 3;
  l.num_prompts = 1;
  return l;
}

/* The forward's tensors and layout over p, which both passes take. */
static void small_inputs(small_problem *p, rlk_tensor *q, rlk_tensor *k, rlk_tensor *v, rlk_tensor *out,
                         rlk_tensor *lse, rlk_prefix_attention_layout *l) {
  *q = rlk_test_tensor_3d(p->q, RLK_BF16, SMALL_T, SMALL_H, SMALL_D);
  *k = rlk_test_tensor_3d(p->k, RLK_BF16, SMALL_T, SMALL_H, SMALL_D);
  *v = rlk_test_tensor_3d(p->v, RLK_BF16, SMALL_T, SMALL_H, SMALL_D);
  *out = rlk_test_tensor_3d(p->o, RLK_BF16, SMALL_T, SMALL_H, SMALL_D);
  *lse = rlk_tensor_2d(p->lse, RLK_F32, SMALL_T, SMALL_H, SMALL_H);
  *l = small_layout(p);
}

/* Every layout and tensor error is refused with a message naming it. */
START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  static small_problem p, p2;
  rlk_prefix_attention_args a;
  rlk_prefix_attention_args_init(&a);
  small_inputs(&p, &a.q, &a.k, &a.v, &a.out, &a.lse, &a.layout);
  ck_assert_msg(rlk_prefix_attention(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  struct {
    int what;
    const char *needle;
  } bad[] = {
      {0, "seq_offsets[2]: 4 after seq_offsets[1] = 4: a response of prompt 0 has a zero length"},
      {14, "seq_offsets[2]: 2 after seq_offsets[1] = 4: a response of prompt 0 has a negative length"},
      {1, "seq_offsets[3]"},  /* does not end at T */
      {2, "group_offsets[1]"}, /* not S */
      {3, "num_prompts"},     {4, "head dim"},  {5, "multiple"}, {6, "scale"},
      {7, "out: overlaps"},   {8, "dtypes"},    {9, "lse: shape"},
      {10, "tuning.variant"}, {11, "tuning.dq_stages"},
      {12, "overlaps layout.host_seq_offsets"}, /* the host kernel reads them while it writes lse */
      {13, "overlaps layout.seq_offsets"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rlk_prefix_attention_args b = a;
    b.layout = small_layout(&p2);
    switch (bad[i].what) {
    case 0: p2.seq[2] = 4; p2.seq[1] = 4; break;
    case 1: p2.seq[3] = 11; break;
    case 2: p2.grp[1] = 2; break;
    case 3: b.layout.num_prompts = 0; break;
    case 4:
      b.q = rlk_test_tensor_3d(p.q, RLK_BF16, SMALL_T, SMALL_H * 2, SMALL_D / 2);
      b.k = rlk_test_tensor_3d(p.k, RLK_BF16, SMALL_T, SMALL_H * 2, SMALL_D / 2);
      b.v = rlk_test_tensor_3d(p.v, RLK_BF16, SMALL_T, SMALL_H * 2, SMALL_D / 2);
      break;
    case 5: b.q = rlk_test_tensor_3d(p.q, RLK_BF16, SMALL_T, 1, SMALL_D); break;
    case 6: b.scale = -1.0f; break;
    case 7: b.out = rlk_test_tensor_3d(p.q, RLK_BF16, SMALL_T, SMALL_H, SMALL_D); break;
    case 8: b.k.dtype = RLK_F16; break;
    case 9: b.lse = rlk_tensor_2d(p.lse, RLK_F32, SMALL_T, 1, 1); break;
    case 10: b.tuning.variant = (rlk_prefix_attention_variant)7; break;
    case 11: b.tuning.dq_stages = 1; break;
    case 12:
      memcpy(p.lse, p2.seq, sizeof p2.seq);
      b.layout.host_seq_offsets = (const int32_t *)p.lse;
      break;
    case 13: b.layout.seq_offsets = rlk_tensor_1d(p.o, RLK_I32, 4); break;
    case 14: p2.seq[2] = 2; break;
    }
    rlk_status st = rlk_prefix_attention(ctx, &b, NULL);
    ck_assert_msg(st == RLK_ERR_INVALID_ARGUMENT && strstr(rlk_last_error(), bad[i].needle),
                  "case %zu: status %d, '%s' (expected '%s')", i, (int)st, rlk_last_error(), bad[i].needle);
  }
  rlk_context_destroy(ctx);
}
END_TEST

/* The backward refuses what it cannot run, naming it; its workspace size follows the backend. */
START_TEST(bad_backward_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  static small_problem p;
  static uint16_t dout[SMALL_N], gq[SMALL_N], gk[SMALL_N], gv[SMALL_N];
  static double work[2 * SMALL_N];
  rlk_prefix_attention_backward_args a;
  rlk_prefix_attention_backward_args_init(&a);
  small_inputs(&p, &a.q, &a.k, &a.v, &a.out, &a.lse, &a.layout);
  a.grad_out = rlk_test_tensor_3d(dout, RLK_BF16, SMALL_T, SMALL_H, SMALL_D);
  a.grad_q = rlk_test_tensor_3d(gq, RLK_BF16, SMALL_T, SMALL_H, SMALL_D);
  a.grad_k = rlk_test_tensor_3d(gk, RLK_BF16, SMALL_T, SMALL_H, SMALL_D);
  a.grad_v = rlk_test_tensor_3d(gv, RLK_BF16, SMALL_T, SMALL_H, SMALL_D);
  size_t ws = 0;
  ck_assert_msg(rlk_prefix_attention_backward_workspace_size(ctx, &a, &ws) == RLK_OK, "%s", rlk_last_error());
  ck_assert_uint_eq(ws, sizeof work); /* the host's fp64 dk, dv accumulators */
  a.workspace = work;
  a.workspace_bytes = ws;
  ck_assert_msg(rlk_prefix_attention_backward(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  for (int i = 0; i < 5; i++) {
    rlk_prefix_attention_backward_args b = a;
    const char *needle = NULL;
    switch (i) {
    case 0: b.lse.data = NULL; needle = "lse: data is NULL"; break;
    case 1: b.workspace_bytes = ws - 8; needle = "workspace"; break;
    case 2:
      b.grad_q = rlk_test_tensor_3d(p.q, RLK_BF16, SMALL_T, SMALL_H, SMALL_D);
      needle = "grad_q: overlaps q";
      break;
    case 3: b.grad_k = rlk_test_tensor_3d(gk, RLK_F16, SMALL_T, SMALL_H, SMALL_D); needle = "grad_k: dtype"; break;
    case 4: b.tuning.fwd_stages = 5; needle = "tuning.fwd_stages"; break;
    }
    rlk_status st = rlk_prefix_attention_backward(ctx, &b, NULL);
    ck_assert_msg(st == RLK_ERR_INVALID_ARGUMENT && strstr(rlk_last_error(), needle),
                  "case %d: status %d, '%s' (expected '%s')", i, (int)st, rlk_last_error(), needle);
  }
  rlk_context_destroy(ctx);
}
END_TEST

/* The kernels a configuration line plans: the wgmma family on sm_90a (its dq kernel computes
 * delta and runs first, so no prep; its dk/dv kernel sums the GQA heads, so no reduce), the mma
 * family on sm_80+ (wgmma asked for there falls back to it),
 * the portable one when asked (and on HIP, as the sample compiles show), the host's two; bad
 * settings are refused. */
START_TEST(plan_per_target) {
  static const struct {
    const char *target, *line;
    const char *entries[6];
  } rows[] = {
      {"sm_90a", "prefix_attention pass=both",
       {"pattn_fwd_sm90", "pattn_bwd_dq_sm90", "pattn_bwd_dkdv_sm90", NULL}},
      {"sm_90a", "prefix_attention pass=fwd variant=mma", {"pattn_fwd_mma", NULL}},
      {"sm_90a", "prefix_attention pass=bwd variant=mma",
       {"pattn_bwd_prep", "pattn_bwd_dkdv_mma", "pattn_bwd_reduce", "pattn_bwd_dq_mma", NULL}},
      {"sm_80", "prefix_attention pass=fwd dtype=f16 head_dim=64", {"pattn_fwd_mma", NULL}},
      {"sm_80", "prefix_attention pass=fwd variant=wgmma", {"pattn_fwd_mma", NULL}},
      {"sm_90a", "prefix_attention pass=both variant=portable", {"pattn_fwd", "pattn_bwd_prep", "pattn_bwd_dkdv", "pattn_bwd_dq", NULL}},
      {"sm_75", "prefix_attention pass=bwd", {"pattn_bwd_prep", "pattn_bwd_dkdv", "pattn_bwd_dq", NULL}},
  };
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    rlk_context *ctx = rlk_test_compile_only_cuda_context(rows[r].target, "prefix_attention plan");
    if (!ctx) continue;
    rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
    size_t n = 0;
    ck_assert_msg(rlk_test_plan_line(&rlk_op_prefix_attention, ctx, rows[r].line, specs, &n) == RLK_OK, "%s",
                  rlk_last_error());
    size_t want = 0;
    while (rows[r].entries[want]) want++;
    ck_assert_uint_eq(n, want);
    for (size_t i = 0; i < n; i++) ck_assert_str_eq(specs[i].tmpl->entry, rows[r].entries[i]);
    static const char *const bad[] = {"prefix_attention head_dim=96", "prefix_attention dtype=f32",
                                      "prefix_attention variant=tensor", "prefix_attention pass=all",
                                      "prefix_attention vocab=5", "prefix_attention fwd_stages=5",
                                      "prefix_attention q_heads=0"};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
      ck_assert_int_eq(rlk_test_plan_line(&rlk_op_prefix_attention, ctx, bad[b], specs, &n), RLK_ERR_INVALID_ARGUMENT);
    }
    rlk_context_destroy(ctx);
  }
}
END_TEST

/* The backward's GPU workspace with GQA (8 query heads a key head): delta, T x Hq f32, plus the
 * per-query-head f32 partial dk, dv only where the mma kernels run (the portable and sm_90a ones
 * sum a group's heads themselves; the portable kernels once asked for the partials too, 33x). */
START_TEST(backward_workspace_per_kernels) {
  enum { T = 12, HQ = 8, HKV = 1, D = 64 };
  static const struct {
    const char *target;
    rlk_prefix_attention_variant variant;
    int partials;
  } rows[] = {{"sm_75", RLK_PREFIX_ATTENTION_VARIANT_AUTO, 0},
              {"sm_80", RLK_PREFIX_ATTENTION_VARIANT_AUTO, 1},
              {"sm_80", RLK_PREFIX_ATTENTION_VARIANT_PORTABLE, 0},
              {"sm_90a", RLK_PREFIX_ATTENTION_VARIANT_AUTO, 0},
              {"sm_90a", RLK_PREFIX_ATTENTION_VARIANT_MMA, 1},
              {"sm_90a", RLK_PREFIX_ATTENTION_VARIANT_PORTABLE, 0}};
  small_problem p;
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    rlk_context *ctx = rlk_test_compile_only_cuda_context(rows[r].target, "prefix_attention workspace");
    if (!ctx) return;
    char *fake = (char *)(uintptr_t)0x7f0000000000ull; /* never dereferenced: shapes and alignment */
    rlk_prefix_attention_backward_args b;
    rlk_prefix_attention_backward_args_init(&b);
    b.layout = small_layout(&p);
    b.layout.seq_offsets = rlk_tensor_1d(fake + (9 << 20), RLK_I32, 4);
    b.layout.group_offsets = rlk_tensor_1d(fake + (10 << 20), RLK_I32, 2);
    b.q = rlk_test_tensor_3d(fake, RLK_BF16, T, HQ, D);
    b.out = rlk_test_tensor_3d(fake + (1 << 20), RLK_BF16, T, HQ, D);
    b.grad_out = rlk_test_tensor_3d(fake + (2 << 20), RLK_BF16, T, HQ, D);
    b.grad_q = rlk_test_tensor_3d(fake + (3 << 20), RLK_BF16, T, HQ, D);
    b.k = rlk_test_tensor_3d(fake + (4 << 20), RLK_BF16, T, HKV, D);
    b.v = rlk_test_tensor_3d(fake + (5 << 20), RLK_BF16, T, HKV, D);
    b.grad_k = rlk_test_tensor_3d(fake + (6 << 20), RLK_BF16, T, HKV, D);
    b.grad_v = rlk_test_tensor_3d(fake + (7 << 20), RLK_BF16, T, HKV, D);
    b.lse = rlk_tensor_2d(fake + (8 << 20), RLK_F32, T, HQ, HQ);
    b.tuning.variant = rows[r].variant;
    size_t ws = 0;
    ck_assert_msg(rlk_prefix_attention_backward_workspace_size(ctx, &b, &ws) == RLK_OK, "%s: %s", rows[r].target,
                  rlk_last_error());
    const size_t delta = (size_t)T * HQ * 4u, partials = rows[r].partials ? (size_t)8 * T * HQ * D : 0u;
    ck_assert_msg(ws == delta + partials, "%s variant %d: %zu bytes, expected %zu", rows[r].target,
                  (int)rows[r].variant, ws, delta + partials);
    rlk_context_destroy(ctx);
  }
}
END_TEST

/* More prompts than a grid dimension holds (65536, each a token of prefix and one response of a
 * token): the tiled kernels (mma, wgmma) refuse it already at the backward's workspace-size
 * query, as their forward does; the portable kernels, whose grids do not count prompts, take it
 * (the backward once refused it at launch for every kernel, after the size query had passed). */
START_TEST(backward_prompts_past_the_grid) {
  enum { P = 65536, S = 2 * P, T = S, H = 1, D = 64 };
  int32_t *seq = malloc((S + 1) * sizeof *seq), *grp = malloc((P + 1) * sizeof *grp);
  ck_assert(seq && grp);
  for (int i = 0; i <= S; i++) seq[i] = i;
  for (int p = 0; p <= P; p++) grp[p] = 2 * p;
  static const struct {
    const char *target;
    rlk_prefix_attention_variant variant;
    int refused;
  } rows[] = {{"sm_75", RLK_PREFIX_ATTENTION_VARIANT_AUTO, 0},
              {"sm_80", RLK_PREFIX_ATTENTION_VARIANT_AUTO, 1},
              {"sm_80", RLK_PREFIX_ATTENTION_VARIANT_PORTABLE, 0},
              {"sm_90a", RLK_PREFIX_ATTENTION_VARIANT_AUTO, 1}};
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    rlk_context *ctx = rlk_test_compile_only_cuda_context(rows[r].target, "prefix_attention prompts");
    if (!ctx) break;
    char *fake = (char *)(uintptr_t)0x7f0000000000ull; /* never dereferenced */
    const int64_t mb = (int64_t)T * H * D * 2;
    rlk_prefix_attention_backward_args b;
    rlk_prefix_attention_backward_args_init(&b);
    b.layout.host_seq_offsets = seq, b.layout.host_group_offsets = grp;
    b.layout.num_segments = S, b.layout.num_prompts = P;
    b.layout.seq_offsets = rlk_tensor_1d(fake + 10 * mb, RLK_I32, S + 1);
    b.layout.group_offsets = rlk_tensor_1d(fake + 11 * mb, RLK_I32, P + 1);
    rlk_tensor *t[] = {&b.q, &b.k, &b.v, &b.out, &b.grad_out, &b.grad_q, &b.grad_k, &b.grad_v};
    for (int i = 0; i < 8; i++) *t[i] = rlk_test_tensor_3d(fake + i * mb, RLK_BF16, T, H, D);
    b.lse = rlk_tensor_2d(fake + 9 * mb, RLK_F32, T, H, H);
    b.tuning.variant = rows[r].variant;
    size_t ws = 0;
    const rlk_status st = rlk_prefix_attention_backward_workspace_size(ctx, &b, &ws);
    if (rows[r].refused)
      ck_assert_msg(st == RLK_ERR_INVALID_ARGUMENT && strstr(rlk_last_error(), "num_prompts: 65536"), "%s: %d '%s'",
                    rows[r].target, (int)st, rlk_last_error());
    else
      ck_assert_msg(st == RLK_OK, "%s: %s", rows[r].target, rlk_last_error());
    rlk_context_destroy(ctx);
  }
  free(seq);
  free(grp);
}
END_TEST

RLK_SAMPLES_CASE("prefix_attention", &rlk_op_prefix_attention)

/* ---------------------------------------------------------------------------------- */
/* CUDA (RLK_TEST_GPU=1)                                                               */
/* ---------------------------------------------------------------------------------- */

static const pa_case gpu_cases[] = {
    {1, {333}, {16}, {1, 5, 129, 1, 5, 129, 1, 5, 129, 1, 5, 129, 1, 5, 129, 1}, 8, 1, 128, RLK_BF16, 0.0f},
    {1, {17}, {3}, {1, 5, 129}, 4, 1, 64, RLK_F16, 0.0f},
    {1, {1}, {1}, {129}, 4, 4, 128, RLK_BF16, 0.0f},
    {4, {17, 0, 1, 130}, {2, 1, 3, 0}, {5, 1, 3, 129, 5, 1}, 8, 2, 128, RLK_F16, 0.25f},
    {1, {200}, {5}, {64, 63, 65, 1, 127}, 16, 2, 64, RLK_BF16, 0.0f},
};

/* The cases on the forward the device selects (sm_90a: wgmma; sm_80+: mma) or, with `variant`
 * (RLK_PREFIX_ATTENTION_VARIANT, read once per process), on that one. */
static void gpu_cases_run(const char *variant) {
  if (!rlk_test_gpu_enabled("prefix_attention")) return;
  if (variant) {
    const char *fork_mode = getenv("CK_FORK");
    if (fork_mode && !strcmp(fork_mode, "no")) {
      printf("skip (prefix_attention gpu, variant %s): the variant is read once per process; needs a forked "
             "test process (CK_FORK=no)\n",
             variant);
      return;
    }
    setenv("RLK_PREFIX_ATTENTION_VARIANT", variant, 1);
  }
  rlk_context *ctx = rlk_test_cuda_context("prefix_attention");
  if (!ctx) return;
  /* RLK_TEST_PA_CACHE: a cache tree with these kernels precompiled (rlk-precompile), so that a
   * short GPU session spends no time compiling */
  const char *pre = getenv("RLK_TEST_PA_CACHE");
  if (pre && *pre) {
    rlk_context_destroy(ctx);
    rlk_context_options o;
    rlk_context_options_init(&o);
    o.backend = RLK_BACKEND_CUDA;
    o.cache_dir = pre;
    ck_assert_msg(rlk_context_create(&ctx, &o) == RLK_OK, "%s", rlk_last_error());
  }
  for (size_t i = 0; i < sizeof gpu_cases / sizeof gpu_cases[0]; i++) {
    char label[48];
    snprintf(label, sizeof label, "gpu case %zu (%s)", i, variant ? variant : "auto");
    check_case(ctx, &gpu_cases[i], label, 1);
  }
  rlk_context_destroy(ctx);
}

START_TEST(gpu_numerics) { gpu_cases_run(NULL); }
END_TEST

/* The GPU cases' data (the inputs their runs draw) under the GPU bounds: every fault caught, here
 * on any machine (pa_power_check). */
START_TEST(gpu_bounds_catch_faults) {
  for (size_t i = 0; i < sizeof gpu_cases / sizeof gpu_cases[0]; i++) {
    const pa_case *c = &gpu_cases[i];
    uint64_t rng = pa_case_seed(c);
    pa_run r;
    run_alloc(c, &r, &rng);
    const pa_ref_arith ar = pa_arith(c->dt, c->D, 1, 1, r.T);
    pa_refs f;
    reference(c, &r, &ar, &f);
    char label[48];
    snprintf(label, sizeof label, "gpu case %zu", i);
    pa_power_check(c, &r, &f, label);
    refs_free(&f);
    run_free(&r);
  }
}
END_TEST

START_TEST(gpu_numerics_mma) { gpu_cases_run("mma"); }
END_TEST

Suite *prefix_attention_suite(void) {
  Suite *s = suite_create("prefix_attention");
  rlk_test_add_case(s, "host", 300, TESTS(host_g1, host_g3, host_g16, host_batch, bad_arguments,
      bad_backward_arguments, gpu_bounds_catch_faults));
  rlk_test_add_case(s, "plan", 300, TESTS(plan_per_target, backward_workspace_per_kernels, backward_prompts_past_the_grid,
                                              samples_compile_every_target));
  rlk_test_add_case(s, "gpu", 600, TESTS(gpu_numerics, gpu_numerics_mma));
  return s;
}

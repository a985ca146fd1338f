/* test_linear_logprob.c - rlk_linear_logprob and rlk_linear_logprob_backward against the fp64
 * reference (tests/ref/): on the host backend at small and odd shapes, and with RLK_TEST_GPU=1 on
 * CUDA for both forward kernels (wgmma on sm_90a, tiled everywhere) at odd shapes up to
 * V = 151937, the backward (f32 and 16-bit gradients, chunks, accumulation), bitwise
 * repeatability, labels ignored and out of range; argument checks; the precompile plan and samples
 * on every target. Outputs are poisoned before each call and every element is checked, each
 * against a bound derived from the arithmetic that produced it (ll_fold_eps, ll_check_grads).
 * Large cases check a sample of rows, and one large vocabulary every row. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/linear_logprob_plan.h"
#include "ops/linear_logprob_stored.h"
#include "ops/ops.h"
#include "linear_logprob_check.h"
#include "ref/linear_logprob_ref.h"
#include "ref/policy_loss_ref.h"
#include "suites.h"
#include "test_util.h"

typedef struct ll_case {
  int64_t N, V, H;
  rlk_dtype dt;        /* hidden and weight */
  rlk_dtype ldt;       /* labels */
  int64_t hpad, wpad;  /* row strides H + pad */
  int64_t lstride;     /* label stride (0: 1) */
  float T;
  int entropy, ignored, bad;
  rlk_linear_logprob_variant variant;
  int splits;
  double scale;        /* logits ~ scale * N(0, 1) */
  int64_t check_rows;  /* rows compared with fp64 (0: all) */
} ll_case;

static ll_case ll_base(int64_t N, int64_t V, int64_t H) {
  return (ll_case){.N = N, .V = V, .H = H, .dt = RLK_BF16, .ldt = RLK_I64, .T = 1.0f, .entropy = 1,
      .scale = 3.0};
}

typedef struct ll_out {
  float *logp, *lse, *ent;
  int32_t status;
} ll_out;

/* Runs a case on ctx; fills *o (caller frees) and checks against fp64 when `check`. */
static void ll_run(rlk_context *ctx, const ll_case *c, uint64_t seed, int check, ll_out *o) {
  uint64_t rng = seed;
  const double t0 = rlk_test_now();
  const int64_t hs = c->H + c->hpad, ws = c->H + c->wpad, ls = c->lstride ? c->lstride : 1;
  const size_t hbytes = (size_t)(c->N * hs) * 2, wbytes = (size_t)(c->V * ws) * 2;
  uint16_t *h = malloc(hbytes), *w = malloc(wbytes);
  int64_t *lab = malloc((size_t)(c->N * ls) * 8);
  ck_assert(h && w && lab);
  memset(h, 0x7f, hbytes); /* padding: huge values that must not be read */
  memset(w, 0x7f, wbytes);
  for (int64_t i = 0; i < c->N; i++)
    for (int64_t k = 0; k < c->H; k++) rlk_test_store(h, c->dt, i * hs + k, ll_grid_h(&rng));
  const double step = ll_grid_step(c->H, c->scale);
  for (int64_t v = 0; v < c->V; v++)
    for (int64_t k = 0; k < c->H; k++) rlk_test_store(w, c->dt, v * ws + k, ll_grid_w(&rng, step));
  for (int64_t i = 0; i < c->N; i++) {
    int64_t y = (int64_t)(rlk_test_rand_u64(&rng) % (uint64_t)c->V);
    if (i == c->N - 1 && c->N > 1) y = c->V - 1; /* the last column (a partial tile) */
    if (c->ignored && i % 5 == 1) y = -100;
    if (c->bad && i % 7 == 2) y = i % 2 ? c->V : -3;
    lab[i * ls] = y;
  }
  void *lab_dev_src = lab;
  int32_t *lab32 = NULL;
  if (c->ldt == RLK_I32) {
    lab32 = malloc((size_t)(c->N * ls) * 4);
    for (int64_t i = 0; i < c->N * ls; i++) lab32[i] = (int32_t)lab[i];
    lab_dev_src = lab32;
  }
  const size_t lbytes = (size_t)(c->N * ls) * (c->ldt == RLK_I32 ? 4 : 8);
  const int host = rlk_context_backend(ctx) == RLK_BACKEND_HOST;
  void *dh, *dw, *dl, *dlp, *dlse, *dent, *dst;
  const size_t ob = (size_t)c->N * sizeof(float);
  if (host) {
    dh = h;
    dw = w;
    dl = lab_dev_src;
    dlp = malloc(ob);
    dlse = malloc(ob);
    dent = malloc(ob);
    dst = calloc(1, 4);
    memset(dlp, 0xff, ob);
    memset(dlse, 0xff, ob);
    memset(dent, 0xff, ob);
  } else {
    dh = rlk_test_dev_upload(ctx, h, hbytes);
    dw = rlk_test_dev_upload(ctx, w, wbytes);
    dl = rlk_test_dev_upload(ctx, lab_dev_src, lbytes);
    dlp = rlk_test_dev_alloc(ctx, ob);
    dlse = rlk_test_dev_alloc(ctx, ob);
    dent = rlk_test_dev_alloc(ctx, ob);
    dst = rlk_test_dev_alloc(ctx, 4);
    ck_assert_int_eq(rlk_memset(ctx, dlp, 0xff, ob), RLK_OK);
    ck_assert_int_eq(rlk_memset(ctx, dlse, 0xff, ob), RLK_OK);
    ck_assert_int_eq(rlk_memset(ctx, dent, 0xff, ob), RLK_OK);
    ck_assert_int_eq(rlk_memset(ctx, dst, 0, 4), RLK_OK);
  }
  rlk_linear_logprob_args a;
  rlk_linear_logprob_args_init(&a);
  a.hidden = rlk_tensor_2d(dh, c->dt, c->N, c->H, hs);
  a.weight = rlk_tensor_2d(dw, c->dt, c->V, c->H, ws);
  a.labels = rlk_tensor_1d(dl, c->ldt, c->N);
  a.labels.strides[0] = ls;
  a.temperature = c->T;
  a.logp = rlk_tensor_1d(dlp, RLK_F32, c->N);
  a.lse = rlk_tensor_1d(dlse, RLK_F32, c->N);
  if (c->entropy) a.entropy = rlk_tensor_1d(dent, RLK_F32, c->N);
  a.status = rlk_tensor_1d(dst, RLK_I32, 1);
  a.variant = c->variant;
  a.splits = c->splits;
  size_t wsb = 0;
  rlk_test_workspace(ctx, rlk_linear_logprob_workspace_size(ctx, &a, &wsb), &wsb, &a.workspace, &a.workspace_bytes);
  const double t1 = rlk_test_now();
  rlk_status st = rlk_linear_logprob(ctx, &a, NULL);
  ck_assert_msg(st == RLK_OK, "N=%lld V=%lld H=%lld: %s", (long long)c->N, (long long)c->V,
                (long long)c->H, rlk_last_error());
  o->logp = malloc(ob);
  o->lse = malloc(ob);
  o->ent = malloc(ob);
  if (host) {
    memcpy(o->logp, dlp, ob);
    memcpy(o->lse, dlse, ob);
    memcpy(o->ent, dent, ob);
    memcpy(&o->status, dst, 4);
    free(dlp), free(dlse), free(dent), free(dst);
  } else {
    ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
    ck_assert_int_eq(rlk_memcpy_to_host(ctx, o->logp, dlp, ob), RLK_OK);
    ck_assert_int_eq(rlk_memcpy_to_host(ctx, o->lse, dlse, ob), RLK_OK);
    ck_assert_int_eq(rlk_memcpy_to_host(ctx, o->ent, dent, ob), RLK_OK);
    ck_assert_int_eq(rlk_memcpy_to_host(ctx, &o->status, dst, 4), RLK_OK);
    rlk_free(ctx, dh), rlk_free(ctx, dw), rlk_free(ctx, dl), rlk_free(ctx, dlp);
    rlk_free(ctx, dlse), rlk_free(ctx, dent), rlk_free(ctx, dst);
    if (a.workspace) rlk_free(ctx, a.workspace);
  }
  const double t2 = rlk_test_now();
  if (check) {
    double *x = malloc((size_t)c->V * sizeof(double));
    int any_bad = 0;
    double worst = 0.0, worst_ratio = 0.0;
    const double eps = ll_fold_eps(c->V);
    const int64_t nrows = c->check_rows && c->check_rows < c->N ? c->check_rows : c->N;
    for (int64_t r = 0; r < nrows; r++) {
      /* every row, or the first, second, last and a spread of the others */
      const int64_t i = nrows == c->N ? r : r == 0 ? 0 : r == 1 ? c->N - 1 : (r * 7919) % c->N;
      lp_ref_row ref;
      int bad = 0;
      ll_ref_row(h, hs, w, ws, c->dt == RLK_F16, i, c->V, c->H, c->T, lab[i * ls], -100, x, &ref, &bad);
      any_bad |= bad;
      const ll_bound b = ll_fwd_bound(&ref, eps);
      const double got[3] = {o->logp[i], o->lse[i], o->ent[i]};
      const double want[3] = {ref.logp, ref.lse, ref.entropy};
      for (int q = 0; q < (c->entropy ? 3 : 2); q++) {
        if (isnan(want[q])) {
          ck_assert_msg(isnan(got[q]), "row %lld output %d: %g, expected NaN", (long long)i, q, got[q]);
          continue;
        }
        const double err = fabs(got[q] - want[q]), tol = q == 0 ? b.logp : q == 1 ? b.lse : b.entropy;
        if (err > worst) worst = err;
        if (err / tol > worst_ratio) worst_ratio = err / tol;
        ck_assert_msg(err <= tol,
                      "N=%lld V=%lld H=%lld variant=%d splits %d row %lld output %d (logp, lse, entropy): %.7g, "
                      "fp64 %.7g, bound %.3g",
                      (long long)c->N, (long long)c->V, (long long)c->H, (int)c->variant, c->splits, (long long)i,
                      q, got[q], want[q], tol);
      }
    }
    for (int64_t i = 0; i < c->N; i++) /* rows not compared count too */
      if (lab[i * ls] != -100 && (lab[i * ls] < 0 || lab[i * ls] >= c->V)) any_bad = 1;
    ck_assert_int_eq(o->status != 0, any_bad);
    printf("linear_logprob %s N=%lld V=%lld H=%lld %s variant=%d splits %d: %lld rows vs fp64, worst |err| %.3g "
           "(%.2g of its bound; inputs %.1f s, call %.1f s, reference %.1f s)\n",
           host ? "host" : "gpu", (long long)c->N, (long long)c->V, (long long)c->H, rlk_dtype_name(c->dt),
           (int)c->variant, c->splits, (long long)nrows, worst, worst_ratio, t1 - t0, t2 - t1, rlk_test_now() - t2);
    free(x);
  }
  free(h), free(w), free(lab), free(lab32);
}

static void ll_free(ll_out *o) { free(o->logp), free(o->lse), free(o->ent); }

static void ll_check(rlk_context *ctx, const ll_case *c, uint64_t seed) {
  ll_out o;
  ll_run(ctx, c, seed, 1, &o);
  ll_free(&o);
}

/* ---------------------------------------------------------------------------------- */
/* The backward                                                                        */
/* ---------------------------------------------------------------------------------- */

typedef struct ll_bcase {
  int64_t N, V, H;
  rlk_dtype dt, gdt; /* inputs; gradients (f32 or dt) */
  int g_lp, g_h;     /* upstream gradients given */
  int want_gh, want_gw;
  int accumulate, chunk, ignored;
  float T;
  int64_t gh_pad; /* grad_hidden's row stride is H + gh_pad (the padding must stay untouched) */
  int blocked;    /* the backward's budget at its least: its rows in blocks of 128 */
} ll_bcase;

static double ll_load16(const void *p, rlk_dtype d, int64_t i) {
  return ll_ref_half(((const uint16_t *)p)[i], d == RLK_F16);
}

static double ll_load_g(const void *p, rlk_dtype d, int64_t i) {
  return d == RLK_F32 ? (double)((const float *)p)[i] : ll_load16(p, d, i);
}

/* The head's gradients against fp64 for upstream gradients g_lp, g_H (doubles, [N]): got_h / got_w
 * (NULL: not checked) hold grad_hidden / grad_weight in gdt, old_h / old_w what they held before an
 * accumulating call. dg_lp / dg_H (NULL: exact) bound the errors of the gradients the call used
 * (its own from its own log-probs, where the loss made them); fwd_eps bounds the fold of the
 * forward whose lse and entropy the backward read (0: ll_fold_eps); stored:
 * the logits were kept as u = 2^(x c - m) in the inputs' 16-bit dtype (the token chunks). */
typedef struct ll_gradref {
  const uint16_t *h, *w;
  rlk_dtype dt;
  const int64_t *lab;
  int64_t N, V, H;
  float T;
  const double *g_lp, *g_H;
  rlk_dtype gdt;
  const void *got_h, *got_w, *old_h, *old_w;
  int accumulate;
  const double *dg_lp, *dg_H;
  double fwd_eps;
  int stored;
  int64_t blocks; /* the backward's blocks of rows at most (0: one): each rounds a 16-bit grad_weight */
} ll_gradref;

/* f32 sums of K products on any path: wgmma adds each k16 group into its f32 accumulator and
 * aligns the group's products to the largest, both truncating (at most 2 u each of a partial sum,
 * itself at most the sum of |terms|): 3 K u; the f32 additions of chunks, splits and reduce-adds
 * (fewer than K / 16 + 64) add u each. 4 (K + 64) u holds both. */
static double ll_sum_eps(int64_t K) { return 4.0 * (double)(K + 64) * LL_U; }

/* Each element of a gradient against fp64, bounded by what its arithmetic allows:
 *   the error of the dz the kernels multiply, per row i and column v (b below), times the other
 *   operand's |value|, summed as the product sums it;
 *   the product's f32 sum: ll_sum_eps(K) of the sum of |terms| (K = V for grad_hidden, N for
 *   grad_weight);
 *   the output's rounding (f32, or the 16-bit gdt): u_out of |result| and of |part added|, and
 *   half the subnormals' spacing twice.
 * b = u_dz |dz| + a_dz + e, where
 *   u_dz: dz kept in the inputs' 16-bit dtype (the sm_90a kernels on sm_90 with rows tensor maps
 *     describe, and the token chunks): half an ulp, 2^-8 (bf16) or 2^-11 (f16) of |dz|; a_dz: f16's
 *     subnormals below 2^-14, where half an ulp is 2^-25 whatever the value;
 *   e: dz = (g_lp (onehot - p) - g_H p (z - E)) / T in f32 from p = 2^(x c - lse log2 e), exact x:
 *     p's relative error ep is the forward's lse bound, the exponent's roundings 8 u (|z| + |lse|)
 *     and ex2.approx's 8 u (stored: u's own 16-bit rounding too, u_dz, and for f16 2^-25 absolute);
 *     E = lse - entropy within the forward's two bounds; the upstream gradients within dg; dz's
 *     own operations 4 u |dz|. A p below 2^-120 may flush to 0: its whole dz is allowed. */
static void ll_check_grads(rlk_context *ctx, const ll_gradref *c) {
  const int64_t N = c->N, V = c->V, H = c->H;
  const uint16_t *h = c->h, *w = c->w;
  double *x = malloc((size_t)V * 8), *dz = malloc((size_t)V * 8), *bz = malloc((size_t)V * 8);
  double *rh = calloc((size_t)(N * H), 8), *rw = calloc((size_t)(V * H), 8);
  double *mh = calloc((size_t)(N * H), 8), *mw = calloc((size_t)(V * H), 8); /* sums of |terms| */
  double *eh = calloc((size_t)(N * H), 8), *ew = calloc((size_t)(V * H), 8); /* dz's errors carried */
  double *hk = malloc((size_t)H * 8);
  ck_assert(x && dz && bz && rh && rw && mh && mw && eh && ew && hk);
  rlk_device_info info;
  const int dz16 = c->stored || (rlk_context_backend(ctx) == RLK_BACKEND_CUDA &&
                                 rlk_context_device_info(ctx, &info) == RLK_OK && info.compute_major == 9 &&
                                 (H * 2) % 16 == 0);
  const int f16 = c->dt == RLK_F16;
  const double u_dz = !dz16 ? 0.0 : f16 ? 0x1p-11 : 0x1p-8, a_dz = dz16 && f16 ? 0x1p-25 : 0.0;
  const double fwd_eps = c->fwd_eps > 0 ? c->fwd_eps : ll_fold_eps(V), T = c->T;
  for (int64_t i = 0; i < N; i++) {
    lp_ref_row row;
    ll_ref_row(h, H, w, H, f16, i, V, H, T, c->lab[i], -100, x, &row, NULL);
    lp_ref_backward(x, V, T, c->lab[i], -100, c->g_lp[i], c->g_H[i], dz);
    if (c->lab[i] == -100) continue; /* no gradient at all: exactly 0 */
    const ll_bound fb = ll_fwd_bound(&row, fwd_eps);
    const double gl = fabs(c->g_lp[i]), gH = fabs(c->g_H[i]), dgl = c->dg_lp ? c->dg_lp[i] : 0.0,
                 dgH = c->dg_H ? c->dg_H[i] : 0.0, E = row.lse - row.entropy;
    const double dE = gH + dgH > 0 ? fb.lse + fb.entropy + 4 * LL_U * (fabs(row.lse) + fabs(E)) : 0.0;
    for (int64_t v = 0; v < V; v++) {
      const double z = x[v] / T, p = exp(z - row.lse), zE = fabs(z - E), oh = v == c->lab[i] ? 1.0 : 0.0;
      const double ep = fb.lse + 8 * LL_U * (fabs(z) + fabs(row.lse) + 1.0) + (c->stored ? u_dz : 0.0);
      const double pabs = c->stored && f16 ? 0x1p-25 : 0.0; /* u's subnormals */
      double e = ((gl + dgl) * (p * ep + pabs) + dgl * fabs(oh - p) +
                  gH * ((p * ep + pabs) * zE + p * (dE + 4 * LL_U * (fabs(z) + fabs(E)))) + dgH * p * zE) /
                     T +
                 4 * LL_U * fabs(dz[v]);
      if (p < 0x1p-120) e += fabs(dz[v]);
      bz[v] = u_dz * fabs(dz[v]) + a_dz + e;
    }
    for (int64_t k = 0; k < H; k++) hk[k] = ll_load16(h, c->dt, i * H + k);
    for (int64_t v = 0; v < V; v++) {
      if (dz[v] == 0.0 && bz[v] == 0.0) continue;
      const double d = dz[v], ad = fabs(d), b = bz[v];
      double *rwv = rw + v * H, *mwv = mw + v * H, *ewv = ew + v * H;
      double *rhi = rh + i * H, *mhi = mh + i * H, *ehi = eh + i * H;
      for (int64_t k = 0; k < H; k++) {
        const double wk = ll_load16(w, c->dt, v * H + k), aw = fabs(wk), ah = fabs(hk[k]);
        rhi[k] += d * wk;
        mhi[k] += ad * aw;
        ehi[k] += b * aw;
        rwv[k] += d * hk[k];
        mwv[k] += ad * ah;
        ewv[k] += b * ah;
      }
    }
  }
  /* the output's rounding: half an ulp relative, and below the normal range half the subnormals'
   * spacing (f16's 2^-25 matters: gradients of 1e-5 are subnormal there); twice where an
   * accumulating call rounds its part and then the sum */
  const double u_out = c->gdt == RLK_F32 ? LL_U : c->gdt == RLK_F16 ? 0x1p-11 : 0x1p-8;
  const double a_out = 2.0 * (c->gdt == RLK_F32 ? 0x1p-150 : c->gdt == RLK_F16 ? 0x1p-25 : 0x1p-134);
  for (int q = 0; q < 2; q++) {
    const void *got = q == 0 ? c->got_h : c->got_w, *old = q == 0 ? c->old_h : c->old_w;
    if (!got) continue;
    const int64_t n = q == 0 ? N * H : V * H;
    const double *ref = q == 0 ? rh : rw, *mag = q == 0 ? mh : mw, *prop = q == 0 ? eh : ew;
    const double g_sum = ll_sum_eps(q == 0 ? V : N);
    double worst = 0.0, worst_ratio = 0.0;
    int64_t zero_rows = 0;
    for (int64_t i = 0; i < n; i++) {
      const double prior = c->accumulate ? ll_load_g(old, c->gdt, i) : 0.0;
      const double want = ref[i] + prior;
      const double g = ll_load_g(got, c->gdt, i), err = fabs(g - want);
      /* grad_hidden's sum over the vocabulary is one chain that starts from what the output held
       * when accumulating: every addition of the chain rounds at a magnitude that includes it */
      const double chain = q == 0 ? fabs(prior) : 0.0;
      /* blocks of rows: a 16-bit grad_weight rounds its partial sum (at most |prior| plus the sum
       * of |terms|) after each block but the last */
      const double blocks = q == 1 && c->gdt != RLK_F32 && c->blocks > 1 ? (double)(c->blocks - 1) : 0.0;
      const double tol = (prop[i] + g_sum * (mag[i] + chain)) * (1.0 + 2.0 * u_out) +
                         u_out * (fabs(ref[i]) + fabs(want)) + a_out +
                         blocks * (u_out * (mag[i] + fabs(prior)) + a_out);
      worst = err > worst ? err : worst;
      if (tol > 0 && err / tol > worst_ratio) worst_ratio = err / tol;
      ck_assert_msg(err <= tol,
                    "%s N=%lld V=%lld H=%lld grad=%s acc=%d: element %lld (row %lld) = %.9g, fp64 %.9g, bound %.3g "
                    "(sum of |terms| %.3g)",
                    q ? "grad_weight" : "grad_hidden", (long long)N, (long long)V, (long long)H,
                    rlk_dtype_name(c->gdt), c->accumulate, (long long)i, (long long)(i / H), g, want, tol, mag[i]);
    }
    for (int64_t r = 0; r < n / H; r++) { /* rows whose gradient is not 0 where it must not be */
      int nonzero = 0;
      for (int64_t k = 0; k < H && !nonzero; k++) nonzero = ref[r * H + k] != 0.0;
      zero_rows += !nonzero;
    }
    printf("linear_logprob backward %s %s N=%lld V=%lld H=%lld grad=%s: worst |err| %.3g, %.2g of its bound "
           "(%lld rows of exact zeros)\n",
           rlk_context_backend(ctx) == RLK_BACKEND_HOST ? "host" : "gpu", q ? "grad_weight" : "grad_hidden",
           (long long)N, (long long)V, (long long)H, rlk_dtype_name(c->gdt), worst, worst_ratio, (long long)zero_rows);
  }
  free(x), free(dz), free(bz), free(rh), free(rw), free(mh), free(mw), free(eh), free(ew), free(hk);
}

/* Forward then backward on ctx; gradients against fp64 (lp_ref_backward's dz, summed in fp64). */
static void ll_bwd_check(rlk_context *ctx, const ll_bcase *c, uint64_t seed, int check, void **out_gh,
                         void **out_gw) {
  uint64_t rng = seed;
  const int64_t N = c->N, V = c->V, H = c->H;
  const size_t es = 2, gs = rlk_dtype_size(c->gdt);
  uint16_t *h = malloc((size_t)(N * H) * es), *w = malloc((size_t)(V * H) * es);
  int64_t *lab = malloc((size_t)N * 8);
  float *glp = malloc((size_t)N * 4), *gH = malloc((size_t)N * 4);
  void *gh0 = malloc((size_t)(N * H) * gs), *gw0 = malloc((size_t)(V * H) * gs);
  ck_assert(h && w && lab && glp && gH && gh0 && gw0);
  const double step = ll_grid_step(H, 3.0);
  for (int64_t i = 0; i < N * H; i++) rlk_test_store(h, c->dt, i, ll_grid_h(&rng));
  for (int64_t i = 0; i < V * H; i++) rlk_test_store(w, c->dt, i, ll_grid_w(&rng, step));
  for (int64_t i = 0; i < N; i++) {
    lab[i] = (int64_t)(rlk_test_rand_u64(&rng) % (uint64_t)V);
    if (c->ignored && i % 4 == 1) lab[i] = -100;
    glp[i] = (float)rlk_test_rand_normal(&rng);
    gH[i] = (float)rlk_test_rand_normal(&rng);
  }
  for (int64_t i = 0; i < N * H; i++) rlk_test_store(gh0, c->gdt, i, c->accumulate ? rlk_test_rand_normal(&rng) : 0.0);
  for (int64_t i = 0; i < V * H; i++) rlk_test_store(gw0, c->gdt, i, c->accumulate ? rlk_test_rand_normal(&rng) : 0.0);
  memset(gh0, c->accumulate ? 0 : 0xff, c->accumulate ? 0 : (size_t)(N * H) * gs); /* poison when overwritten */
  memset(gw0, c->accumulate ? 0 : 0xff, c->accumulate ? 0 : (size_t)(V * H) * gs);
  void *dh = rlk_test_put(ctx, h, (size_t)(N * H) * es), *dw = rlk_test_put(ctx, w, (size_t)(V * H) * es);
  void *dl = rlk_test_put(ctx, lab, (size_t)N * 8), *dglp = rlk_test_put(ctx, glp, (size_t)N * 4),
       *dgH = rlk_test_put(ctx, gH, (size_t)N * 4);
  /* grad_hidden in rows of H + gh_pad, the padding a pattern no write leaves behind */
  const int64_t ghs = H + c->gh_pad;
  unsigned char *gh_rows = malloc((size_t)(N * ghs) * gs);
  ck_assert(gh_rows);
  memset(gh_rows, 0x5a, (size_t)(N * ghs) * gs);
  for (int64_t i = 0; i < N; i++) memcpy(gh_rows + (size_t)(i * ghs) * gs, (char *)gh0 + (size_t)(i * H) * gs, (size_t)H * gs);
  void *dgh = rlk_test_put(ctx, gh_rows, (size_t)(N * ghs) * gs), *dgw = rlk_test_put(ctx, gw0, (size_t)(V * H) * gs);
  float *zeros = calloc((size_t)N, 4);
  void *dlp = rlk_test_put(ctx, zeros, (size_t)N * 4), *dlse = rlk_test_put(ctx, zeros, (size_t)N * 4),
       *dent = rlk_test_put(ctx, zeros, (size_t)N * 4);
  /* the forward's lse and entropy, from the op itself */
  rlk_linear_logprob_args f;
  rlk_linear_logprob_args_init(&f);
  f.hidden = rlk_tensor_2d(dh, c->dt, N, H, H);
  f.weight = rlk_tensor_2d(dw, c->dt, V, H, H);
  f.labels = rlk_tensor_1d(dl, RLK_I64, N);
  f.temperature = c->T;
  f.logp = rlk_tensor_1d(dlp, RLK_F32, N);
  f.lse = rlk_tensor_1d(dlse, RLK_F32, N);
  f.entropy = rlk_tensor_1d(dent, RLK_F32, N);
  size_t wsb = 0;
  rlk_test_workspace(ctx, rlk_linear_logprob_workspace_size(ctx, &f, &wsb), &wsb, &f.workspace, &f.workspace_bytes);
  ck_assert_msg(rlk_linear_logprob(ctx, &f, NULL) == RLK_OK, "%s", rlk_last_error());
  rlk_linear_logprob_backward_args b;
  rlk_linear_logprob_backward_args_init(&b);
  b.hidden = f.hidden;
  b.weight = f.weight;
  b.labels = f.labels;
  b.temperature = c->T;
  b.lse = f.lse;
  if (c->g_lp) b.grad_logp = rlk_tensor_1d(dglp, RLK_F32, N);
  if (c->g_h) {
    b.grad_entropy = rlk_tensor_1d(dgH, RLK_F32, N);
    b.entropy = f.entropy;
  }
  if (c->want_gh) b.grad_hidden = rlk_tensor_2d(dgh, c->gdt, N, H, ghs);
  if (c->want_gw) b.grad_weight = rlk_tensor_2d(dgw, c->gdt, V, H, H);
  b.accumulate = c->accumulate;
  b.chunk = c->chunk;
  size_t bwb = 0;
  if (c->blocked) rlk_ll_bwd_set_budget(1);
  rlk_test_workspace(ctx, rlk_linear_logprob_backward_workspace_size(ctx, &b, &bwb), &bwb, &b.workspace,
                     &b.workspace_bytes);
  const rlk_status bst = rlk_linear_logprob_backward(ctx, &b, NULL);
  rlk_ll_bwd_set_budget(0);
  ck_assert_msg(bst == RLK_OK, "%s", rlk_last_error());
  if (rlk_context_backend(ctx) != RLK_BACKEND_HOST) ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  void *got_h = malloc((size_t)(N * H) * gs), *got_w = malloc((size_t)(V * H) * gs);
  unsigned char *got_rows = malloc((size_t)(N * ghs) * gs);
  ck_assert(got_h && got_w && got_rows);
  rlk_test_get(ctx, got_rows, dgh, (size_t)(N * ghs) * gs);
  for (int64_t i = 0; i < N; i++) {
    const unsigned char *row = got_rows + (size_t)(i * ghs) * gs;
    memcpy((char *)got_h + (size_t)(i * H) * gs, row, (size_t)H * gs);
    for (size_t b0 = (size_t)H * gs; b0 < (size_t)ghs * gs; b0++)
      ck_assert_msg(row[b0] == 0x5a, "grad_hidden: row %lld's padding written", (long long)i);
  }
  free(gh_rows), free(got_rows);
  rlk_test_get(ctx, got_w, dgw, (size_t)(V * H) * gs);
  if (check) {
    double *g1 = malloc((size_t)N * 8), *g2 = malloc((size_t)N * 8);
    ck_assert(g1 && g2);
    for (int64_t i = 0; i < N; i++) {
      g1[i] = c->g_lp ? glp[i] : 0.0;
      g2[i] = c->g_h ? gH[i] : 0.0;
    }
    ll_gradref r = {h, w, c->dt, lab, N, V, H, c->T, g1, g2, c->gdt, c->want_gh ? got_h : NULL,
                    c->want_gw ? got_w : NULL, gh0, gw0, c->accumulate};
    r.blocks = c->blocked ? (N + 127) / 128 : 1;
    ll_check_grads(ctx, &r);
    free(g1), free(g2);
  }
  if (out_gh) *out_gh = got_h; else free(got_h);
  if (out_gw) *out_gw = got_w; else free(got_w);
  rlk_test_drop(ctx, dh), rlk_test_drop(ctx, dw), rlk_test_drop(ctx, dl), rlk_test_drop(ctx, dglp),
      rlk_test_drop(ctx, dgH);
  rlk_test_drop(ctx, dgh), rlk_test_drop(ctx, dgw), rlk_test_drop(ctx, dlp), rlk_test_drop(ctx, dlse),
      rlk_test_drop(ctx, dent);
  if (f.workspace) rlk_free(ctx, f.workspace);
  if (b.workspace) rlk_free(ctx, b.workspace);
  free(h), free(w), free(lab), free(glp), free(gH), free(gh0), free(gw0), free(zeros);
}

static void ll_bwd_cases(rlk_context *ctx, uint64_t seed) {
  ll_bcase c = {13, 700, 72, RLK_BF16, RLK_F32, 1, 1, 1, 1, 0, 0, 1, 1.0f};
  ll_bwd_check(ctx, &c, seed, 1, NULL, NULL);
  ll_bcase d = {5, 333, 40, RLK_F16, RLK_F16, 1, 0, 1, 1, 1, 128, 0, 0.7f}; /* accumulate, f16 grads, chunks */
  ll_bwd_check(ctx, &d, seed + 1, 1, NULL, NULL);
  ll_bcase e = {70, 257, 64, RLK_BF16, RLK_F32, 0, 1, 0, 1, 0, 64, 1, 1.3f}; /* grad_weight only, g_H only */
  ll_bwd_check(ctx, &e, seed + 2, 1, NULL, NULL);
  /* f32 grad_hidden in rows of H + 8, three chunks, accumulating (on a GPU the sum itself) */
  ll_bcase f = {9, 300, 40, RLK_BF16, RLK_F32, 1, 1, 1, 0, 1, 128, 0, 1.0f, 8};
  ll_bwd_check(ctx, &f, seed + 3, 1, NULL, NULL);
}

/* ---------------------------------------------------------------------------------- */
/* Vocab-parallel shards of the head                                                   */
/* ---------------------------------------------------------------------------------- */

/* Shard [v0, v0 + Vp) of a bf16 head: all N rows of hidden [N, H], its Vp rows of weight, the
 * i64 labels. */
static void shard_head(void *hidden, void *weight, void *labels, int64_t N, int64_t H, int64_t v0, int64_t Vp,
                       rlk_tensor *h, rlk_tensor *w, rlk_tensor *l) {
  *h = rlk_tensor_2d(hidden, RLK_BF16, N, H, H);
  *w = rlk_tensor_2d((uint16_t *)weight + v0 * H, RLK_BF16, Vp, H, H);
  *l = rlk_tensor_1d(labels, RLK_I64, N);
}

/* The head's rows split into P shards at `cuts` (cuts[0] = 0, cuts[P] = V): each shard's forward
 * writes its records (weight rows [v0, v1), vocab_start v0), the records gathered in rank order
 * are merged by rlk_logprob_combine and compared with fp64 over the whole vocabulary; then each
 * shard's backward (shard 1, the combined lse and entropy) gives its grad_weight rows and adds
 * its part of grad_hidden, compared with the fp64 gradient of the whole head. Labels sit on the
 * shard edges, some are ignored. */
static void ll_shard_check(rlk_context *ctx, int64_t N, int64_t H, const int64_t *cuts, int P,
                           int entropy, uint64_t seed) {
  uint64_t rng = seed;
  const int64_t V = cuts[P];
  uint16_t *h = malloc((size_t)(N * H) * 2), *w = malloc((size_t)(V * H) * 2);
  int64_t *lab = malloc((size_t)N * 8);
  float *glp = malloc((size_t)N * 4), *gH = malloc((size_t)N * 4);
  ck_assert(h && w && lab && glp && gH);
  const double step = ll_grid_step(H, 3.0);
  for (int64_t i = 0; i < N * H; i++) rlk_test_store(h, RLK_BF16, i, ll_grid_h(&rng));
  for (int64_t i = 0; i < V * H; i++) rlk_test_store(w, RLK_BF16, i, ll_grid_w(&rng, step));
  for (int64_t i = 0; i < N; i++) {
    const int p = (int)(i % P);
    switch (i % 4) { /* a shard's first and last columns, a random one, an ignored row */
    case 0: lab[i] = cuts[p]; break;
    case 1: lab[i] = cuts[p + 1] - 1; break;
    case 2: lab[i] = (int64_t)(rlk_test_rand_u64(&rng) % (uint64_t)V); break;
    default: lab[i] = i % 8 == 3 ? -100 : (int64_t)(rlk_test_rand_u64(&rng) % (uint64_t)V); break;
    }
    glp[i] = (float)rlk_test_rand_normal(&rng);
    gH[i] = (float)rlk_test_rand_normal(&rng);
  }
  const int host = rlk_context_backend(ctx) == RLK_BACKEND_HOST;
  void *dh = rlk_test_put(ctx, h, (size_t)(N * H) * 2), *dw = rlk_test_put(ctx, w, (size_t)(V * H) * 2);
  void *dl = rlk_test_put(ctx, lab, (size_t)N * 8), *dglp = rlk_test_put(ctx, glp, (size_t)N * 4),
       *dgH = rlk_test_put(ctx, gH, (size_t)N * 4);
  float *zero = calloc((size_t)(P * N * 4 + V * H + N * H), 4);
  void *drec = rlk_test_put(ctx, zero, (size_t)(P * N * 4) * 4); /* [P, N, 4] */
  void *dlp = rlk_test_put(ctx, zero, (size_t)N * 4), *dlse = rlk_test_put(ctx, zero, (size_t)N * 4),
       *dent = rlk_test_put(ctx, zero, (size_t)N * 4), *dst = rlk_test_put(ctx, zero, 4);
  void *dgh = rlk_test_put(ctx, zero, (size_t)(N * H) * 4), *dgw = rlk_test_put(ctx, zero, (size_t)(V * H) * 4);
  for (int p = 0; p < P; p++) {
    const int64_t v0 = cuts[p], Vp = cuts[p + 1] - v0;
    rlk_linear_logprob_args a;
    rlk_linear_logprob_args_init(&a);
    shard_head(dh, dw, dl, N, H, v0, Vp, &a.hidden, &a.weight, &a.labels);
    a.partials = rlk_tensor_2d((float *)drec + (int64_t)p * N * 4, RLK_F32, N, 4, 4);
    a.vocab_start = v0;
    a.partial_entropy = entropy;
    size_t wsb = 0;
    rlk_test_workspace(ctx, rlk_linear_logprob_workspace_size(ctx, &a, &wsb), &wsb, &a.workspace, &a.workspace_bytes);
    ck_assert_msg(rlk_linear_logprob(ctx, &a, NULL) == RLK_OK, "shard %d: %s", p, rlk_last_error());
    if (a.workspace) rlk_free(ctx, a.workspace);
  }
  rlk_logprob_combine_args cb;
  rlk_logprob_combine_args_init(&cb);
  cb.partials = rlk_test_tensor_3d(drec, RLK_F32, P, N, 4);
  cb.labels = rlk_tensor_1d(dl, RLK_I64, N);
  cb.logp = rlk_tensor_1d(dlp, RLK_F32, N);
  cb.lse = rlk_tensor_1d(dlse, RLK_F32, N);
  if (entropy) cb.entropy = rlk_tensor_1d(dent, RLK_F32, N);
  cb.status = rlk_tensor_1d(dst, RLK_I32, 1);
  ck_assert_msg(rlk_logprob_combine(ctx, &cb, NULL) == RLK_OK, "%s", rlk_last_error());
  for (int p = 0; p < P; p++) {
    const int64_t v0 = cuts[p], Vp = cuts[p + 1] - v0;
    rlk_linear_logprob_backward_args b;
    rlk_linear_logprob_backward_args_init(&b);
    shard_head(dh, dw, dl, N, H, v0, Vp, &b.hidden, &b.weight, &b.labels);
    b.lse = rlk_tensor_1d(dlse, RLK_F32, N);
    b.grad_logp = rlk_tensor_1d(dglp, RLK_F32, N);
    if (entropy) {
      b.grad_entropy = rlk_tensor_1d(dgH, RLK_F32, N);
      b.entropy = rlk_tensor_1d(dent, RLK_F32, N);
    }
    b.grad_hidden = rlk_tensor_2d(dgh, RLK_F32, N, H, H);
    b.grad_weight = rlk_tensor_2d((float *)dgw + v0 * H, RLK_F32, Vp, H, H);
    b.accumulate = 1; /* grad_hidden: the sum over shards; grad_weight rows start at 0 */
    b.shard = 1;
    b.vocab_start = v0;
    size_t bwb = 0;
    rlk_test_workspace(ctx, rlk_linear_logprob_backward_workspace_size(ctx, &b, &bwb), &bwb, &b.workspace,
                       &b.workspace_bytes);
    ck_assert_msg(rlk_linear_logprob_backward(ctx, &b, NULL) == RLK_OK, "shard %d: %s", p, rlk_last_error());
    if (b.workspace) rlk_free(ctx, b.workspace);
  }
  if (!host) ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  float *lp = malloc((size_t)N * 4), *lse = malloc((size_t)N * 4), *ent = malloc((size_t)N * 4);
  float *gh = malloc((size_t)(N * H) * 4), *gw = malloc((size_t)(V * H) * 4);
  int32_t status = 0;
  rlk_test_get(ctx, lp, dlp, (size_t)N * 4);
  rlk_test_get(ctx, lse, dlse, (size_t)N * 4);
  rlk_test_get(ctx, ent, dent, (size_t)N * 4);
  rlk_test_get(ctx, gh, dgh, (size_t)(N * H) * 4);
  rlk_test_get(ctx, gw, dgw, (size_t)(V * H) * 4);
  rlk_test_get(ctx, &status, dst, 4);
  ck_assert_int_eq(status, 0);
  double *x = malloc((size_t)V * 8), *g_lp = malloc((size_t)N * 8), *g_H = malloc((size_t)N * 8);
  ck_assert(x && g_lp && g_H);
  double worst = 0.0;
  /* each shard's records fold as a forward over at most V columns; the combine merges P more */
  const double eps = ll_fold_eps(V) + 11.0 * (P + 5) * LL_U;
  for (int64_t i = 0; i < N; i++) {
    lp_ref_row ref;
    ll_ref_row(h, H, w, H, 0, i, V, H, 1.0, lab[i], -100, x, &ref, NULL);
    const ll_bound b = ll_fwd_bound(&ref, eps);
    const double got[3] = {lp[i], lse[i], ent[i]}, want[3] = {ref.logp, ref.lse, ref.entropy};
    const double bound[3] = {b.logp, b.lse, b.entropy};
    for (int q = 0; q < (entropy ? 3 : 2); q++) {
      const double err = fabs(got[q] - want[q]), tol = bound[q];
      worst = err > worst ? err : worst;
      ck_assert_msg(err <= tol, "%d shards, row %lld (label %lld) output %d (logp, lse, entropy): %.7g, fp64 %.7g",
                    P, (long long)i, (long long)lab[i], q, got[q], want[q]);
    }
    g_lp[i] = glp[i];
    g_H[i] = entropy ? gH[i] : 0.0;
  }
  /* The shards' gradients against the unsharded head's: grad_hidden summed over the shards,
   * grad_weight one shard's rows each. */
  const ll_gradref gr = {.h = h, .w = w, .dt = RLK_BF16, .lab = lab, .N = N, .V = V, .H = H, .T = 1.0f,
                         .g_lp = g_lp, .g_H = g_H, .gdt = RLK_F32, .got_h = gh, .got_w = gw, .fwd_eps = eps};
  ll_check_grads(ctx, &gr);
  printf("linear_logprob %s %d shards N=%lld V=%lld H=%lld: combined outputs worst |err| %.3g\n",
         host ? "host" : "gpu", P, (long long)N, (long long)V, (long long)H, worst);
  free(x), free(g_lp), free(g_H), free(lp), free(lse), free(ent), free(gh), free(gw);
  rlk_test_drop(ctx, dh), rlk_test_drop(ctx, dw), rlk_test_drop(ctx, dl), rlk_test_drop(ctx, dglp),
      rlk_test_drop(ctx, dgH), rlk_test_drop(ctx, drec);
  rlk_test_drop(ctx, dlp), rlk_test_drop(ctx, dlse), rlk_test_drop(ctx, dent), rlk_test_drop(ctx, dst),
      rlk_test_drop(ctx, dgh), rlk_test_drop(ctx, dgw);
  free(h), free(w), free(lab), free(glp), free(gH), free(zero);
}

static void ll_shard_cases(rlk_context *ctx, uint64_t seed) {
  static const int64_t two[] = {0, 150, 301};           /* uneven halves */
  static const int64_t three[] = {0, 1, 256, 513};      /* a one-column shard, a whole tile */
  ll_shard_check(ctx, 11, 40, two, 2, 1, seed);
  ll_shard_check(ctx, 7, 64, three, 3, 0, seed + 1);
}

/* Infinite label logits in the shard form's records (rlk.h's format): t is z_y = x_y / T where
 * the shard owns the label and +inf, the "absent" marker, elsewhere, so an owned z_y of +inf is
 * written NaN, never +inf: the combine still finds the label owned (no status bit) and the row
 * NaN. A bf16 head [12, 8] in shards [0, 5) and [5, 12) at T 2^-60; hidden a / 4 and weights
 * b / 8 (|a| <= 7, |b| <= 15) so that every finite logit is exact in f32 and on both paths, and
 * x_y / T (a power of two) too: t is compared bit for bit. Column 7's first weight is +inf, every
 * row's first hidden value nonzero: row 0 (label 7) has a +inf label logit, row 1 (label 7) a -inf
 * one (t -inf, logp -inf), row 5 a +inf logit off its label (t finite, the row NaN), row 3 is
 * ignored (+inf in every record); row 4's label logit is about 2^120, finite, but x / T is past
 * f32's range (t NaN). */
static void ll_shard_label_inf(rlk_context *ctx, uint64_t seed) {
  enum { N = 6, H = 8, V = 12, P = 2 };
  static const int64_t cut[P + 1] = {0, 5, 12};
  static const int64_t lab[N] = {7, 7, 3, -100, 9, 0};
  static const double h0[N] = {1.0, -1.0, -1.0, 1.0, -0.5, 0.75}; /* the sign picks column 7's infinity */
  const float T = 0x1p-60f;
  uint64_t rng = seed;
  uint16_t h[N * H], w[V * H];
  double hd[N * H], wd[V * H];
  for (int64_t k = 0; k < N * H; k++)
    hd[k] = rlk_test_store(h, RLK_BF16, k, (double)((int)(rlk_test_rand_u64(&rng) % 15u) - 7) / 4.0);
  for (int64_t k = 0; k < V * H; k++)
    wd[k] = rlk_test_store(w, RLK_BF16, k, (double)((int)(rlk_test_rand_u64(&rng) % 31u) - 15) / 8.0);
  for (int64_t i = 0; i < N; i++) hd[i * H] = rlk_test_store(h, RLK_BF16, i * H, h0[i]);
  wd[7 * H] = rlk_test_store(w, RLK_BF16, 7 * H, INFINITY);
  hd[4 * H + 1] = rlk_test_store(h, RLK_BF16, 4 * H + 1, 0x1p60);
  wd[9 * H + 1] = rlk_test_store(w, RLK_BF16, 9 * H + 1, 0x1p60);
  void *dh = rlk_test_put(ctx, h, sizeof h), *dw = rlk_test_put(ctx, w, sizeof w), *dl = rlk_test_put(ctx, lab, sizeof lab);
  void *drec = rlk_test_poisoned(ctx, (size_t)(P * N * 4) * 4), *dlp = rlk_test_poisoned(ctx, (size_t)N * 4);
  const int32_t zero = 0;
  void *dst = rlk_test_put(ctx, &zero, 4);
  for (int p = 0; p < P; p++) {
    rlk_linear_logprob_args a;
    rlk_linear_logprob_args_init(&a);
    shard_head(dh, dw, dl, N, H, cut[p], cut[p + 1] - cut[p], &a.hidden, &a.weight, &a.labels);
    a.temperature = T;
    a.partials = rlk_tensor_2d((float *)drec + (int64_t)p * N * 4, RLK_F32, N, 4, 4);
    a.vocab_start = cut[p];
    size_t wsb = 0;
    rlk_test_workspace(ctx, rlk_linear_logprob_workspace_size(ctx, &a, &wsb), &wsb, &a.workspace, &a.workspace_bytes);
    ck_assert_msg(rlk_linear_logprob(ctx, &a, NULL) == RLK_OK, "shard %d: %s", p, rlk_last_error());
    if (rlk_context_backend(ctx) != RLK_BACKEND_HOST) ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
    if (a.workspace) rlk_free(ctx, a.workspace);
  }
  rlk_logprob_combine_args cb;
  rlk_logprob_combine_args_init(&cb);
  cb.partials = rlk_test_tensor_3d(drec, RLK_F32, P, N, 4);
  cb.labels = rlk_tensor_1d(dl, RLK_I64, N);
  cb.logp = rlk_tensor_1d(dlp, RLK_F32, N);
  cb.status = rlk_tensor_1d(dst, RLK_I32, 1);
  ck_assert_msg(rlk_logprob_combine(ctx, &cb, NULL) == RLK_OK, "%s", rlk_last_error());
  if (rlk_context_backend(ctx) != RLK_BACKEND_HOST) ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  float rec[P * N * 4], lp[N];
  int32_t status = -1;
  rlk_test_get(ctx, rec, drec, sizeof rec);
  rlk_test_get(ctx, lp, dlp, sizeof lp);
  rlk_test_get(ctx, &status, dst, 4);
  for (int p = 0; p < P; p++)
    for (int64_t i = 0; i < N; i++) {
      const float t = rec[((int64_t)p * N + i) * 4 + 3];
      const int owns = lab[i] != -100 && lab[i] >= cut[p] && lab[i] < cut[p + 1];
      double x = 0.0;
      for (int64_t k = 0; owns && k < H; k++) x += hd[i * H + k] * wd[lab[i] * H + k];
      const float z = owns ? (float)(x / (double)T) : INFINITY;
      if (owns && z == INFINITY)
        ck_assert_msg(isnan(t), "record %d/%lld: an owned z_y of +inf written as %g, not NaN", p, (long long)i,
                      (double)t);
      else
        ck_assert_msg(!memcmp(&t, &z, 4), "record %d/%lld: t = %.9g, want %.9g", p, (long long)i, (double)t,
                      (double)z);
    }
  ck_assert_msg(status == 0, "status %d: an owned infinite label logit counted as no owner's", status);
  ck_assert_msg(isnan(lp[0]) && lp[1] == -INFINITY && isfinite(lp[2]) && lp[3] == 0.0f && isnan(lp[4]) &&
                    isnan(lp[5]),
                "logp %g %g %g %g %g %g", (double)lp[0], (double)lp[1], (double)lp[2], (double)lp[3], (double)lp[4],
                (double)lp[5]);
  rlk_test_drop(ctx, dh), rlk_test_drop(ctx, dw), rlk_test_drop(ctx, dl), rlk_test_drop(ctx, drec),
      rlk_test_drop(ctx, dlp), rlk_test_drop(ctx, dst);
}

START_TEST(host_shard_label_inf) {
  rlk_context *ctx = rlk_test_host_context();
  ll_shard_label_inf(ctx, rlk_test_seed());
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(host_shards) {
  rlk_context *ctx = rlk_test_host_context();
  ll_shard_cases(ctx, rlk_test_seed());
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(host_shapes) {
  rlk_context *ctx = rlk_test_host_context();
  const uint64_t seed = rlk_test_seed();
  ll_case c = ll_base(3, 1000, 96);
  ll_check(ctx, &c, seed);
  c = ll_base(1, 257, 64);
  c.dt = RLK_F16;
  c.ldt = RLK_I32;
  c.entropy = 0;
  c.T = 0.7f;
  ll_check(ctx, &c, seed + 1);
  c = ll_base(17, 300, 40);
  c.hpad = 5;
  c.wpad = 3;
  c.lstride = 2;
  c.ignored = c.bad = 1;
  ll_check(ctx, &c, seed + 2);
  ll_bwd_cases(ctx, seed + 10);
  /* the model shape's odd vocabulary: one row through V = 151937, H = 896 */
  c = ll_base(1, 151937, 896);
  ll_check(ctx, &c, seed + 3);
  rlk_context_destroy(ctx);
}
END_TEST

/* RLK_JIT_RECORD: the forward, the backward (one line per gradient dtype) and the shard form's
 * combine each leave a line that precompiles. */
START_TEST(host_records_its_configurations) {
  rlk_context *ctx = rlk_test_recording_host_context();
  if (!ctx) return;
  const uint64_t seed = rlk_test_seed() ^ 0x4ecu;
  ll_case c = ll_base(3, 300, 40);
  c.dt = RLK_F16;
  c.ldt = RLK_I32;
  ll_check(ctx, &c, seed);
  ll_bcase b = {5, 333, 40, RLK_BF16, RLK_F32, 1, 1, 1, 1, 0, 0, 1, 1.0f};
  ll_bwd_check(ctx, &b, seed + 1, 1, NULL, NULL);
  static const int64_t two[] = {0, 150, 301};
  ll_shard_check(ctx, 3, 40, two, 2, 1, seed + 2);
  static const char *const want[] = {"linear_logprob pass=fwd hidden=f16 labels=i32 entropy=1",
                                     "linear_logprob pass=bwd hidden=bf16 labels=i64 entropy=1 grad=f32",
                                     "logprob_shard pass=combine", NULL};
  rlk_test_record_expect(ctx, want);
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  uint16_t h[4 * 8], w[5 * 8];
  int64_t lab[4];
  float lp[4], lse[4];
  memset(h, 0, sizeof h), memset(w, 0, sizeof w), memset(lab, 0, sizeof lab);
  rlk_linear_logprob_args a;
  rlk_linear_logprob_args_init(&a);
  ck_assert_float_eq(a.temperature, 1.0f);
  ck_assert_int_eq(a.ignore_index, -100);
  a.hidden = rlk_tensor_2d(h, RLK_BF16, 4, 8, 8);
  a.weight = rlk_tensor_2d(w, RLK_BF16, 5, 8, 8);
  a.labels = rlk_tensor_1d(lab, RLK_I64, 4);
  a.logp = rlk_tensor_1d(lp, RLK_F32, 4);
  a.lse = rlk_tensor_1d(lse, RLK_F32, 4);
  ck_assert_int_eq(rlk_linear_logprob(ctx, &a, NULL), RLK_OK);
  static const struct {
    int what;
    const char *needle;
  } bad[] = {{0, "weight"}, {1, "weight"}, {2, "temperature"}, {3, "labels"}, {4, "logp"},
             {5, "outputs must be distinct"}, {6, "hidden"}, {7, "splits"}, {8, "variant"},
             {9, "stages"}, {10, "stages"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rlk_linear_logprob_args b = a;
    switch (bad[i].what) {
    case 0: b.weight = rlk_tensor_2d(w, RLK_BF16, 5, 7, 8); break;   /* H differs */
    case 1: b.weight = rlk_tensor_2d(w, RLK_F16, 5, 8, 8); break;    /* dtype differs */
    case 2: b.temperature = 0.0f; break;
    case 3: b.labels = rlk_tensor_1d(lab, RLK_F32, 4); break;
    case 4: b.logp = rlk_tensor_1d(lp, RLK_F32, 3); break;
    case 5: b.lse = b.logp; break;
    case 6: b.hidden = rlk_tensor_2d(h, RLK_F32, 4, 8, 8); break;
    case 7: b.splits = -1; break;
    case 8: b.variant = (rlk_linear_logprob_variant)7; break;
    case 9: b.stages = 1; break;
    case 10: b.stages = 5; break;
    }
    ck_assert_msg(rlk_linear_logprob(ctx, &b, NULL) == RLK_ERR_INVALID_ARGUMENT, "case %zu accepted", i);
    ck_assert_msg(strstr(rlk_last_error(), bad[i].needle) != NULL, "case %zu: '%s' lacks '%s'", i,
                  rlk_last_error(), bad[i].needle);
  }
  a.stages = 3; /* in range: the host has no stages, and runs */
  ck_assert_int_eq(rlk_linear_logprob(ctx, &a, NULL), RLK_OK);
  /* the backward's chunk and tile order */
  float g[4] = {1, 2, 3, 4}, gh[4 * 8];
  rlk_linear_logprob_backward_args w0;
  rlk_linear_logprob_backward_args_init(&w0);
  w0.hidden = a.hidden;
  w0.weight = a.weight;
  w0.labels = a.labels;
  w0.lse = a.lse;
  w0.grad_logp = rlk_tensor_1d(g, RLK_F32, 4);
  w0.grad_hidden = rlk_tensor_2d(gh, RLK_F32, 4, 8, 8);
  /* the host's fp64 sums: (N H + H) doubles */
  static _Alignas(16) char ws[512];
  size_t need = 0;
  ck_assert_int_eq(rlk_linear_logprob_backward_workspace_size(ctx, &w0, &need), RLK_OK);
  ck_assert_uint_eq(need, (4 * 8 + 8) * 8);
  w0.workspace = ws, w0.workspace_bytes = sizeof ws;
  ck_assert_int_eq(rlk_linear_logprob_backward(ctx, &w0, NULL), RLK_OK);
  /* the kept set's threshold is read: it shares memory with no output and not the workspace */
  rlk_linear_logprob_backward_args t = w0;
  t.threshold = rlk_tensor_1d(gh + 4, RLK_F32, 4);
  ck_assert_int_eq(rlk_linear_logprob_backward(ctx, &t, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "threshold") && strstr(rlk_last_error(), "overlaps"), "%s", rlk_last_error());
  t.threshold = rlk_tensor_1d(ws + 64, RLK_F32, 4);
  ck_assert_int_eq(rlk_linear_logprob_backward(ctx, &t, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "threshold") && strstr(rlk_last_error(), "overlaps"), "%s", rlk_last_error());
  rlk_linear_logprob_args tf = a;
  tf.threshold = tf.logp;
  ck_assert_int_eq(rlk_linear_logprob(ctx, &tf, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "threshold") && strstr(rlk_last_error(), "overlaps"), "%s", rlk_last_error());
  static const struct {
    int chunk, group;
    const char *needle;
  } bwd[] = {{3, 0, "chunk"}, {-64, 0, "chunk"}, {0, -1, "group"}, {0, 65, "group"}};
  for (size_t i = 0; i < sizeof bwd / sizeof bwd[0]; i++) {
    rlk_linear_logprob_backward_args b = w0;
    b.chunk = bwd[i].chunk;
    b.group = bwd[i].group;
    ck_assert_msg(rlk_linear_logprob_backward(ctx, &b, NULL) == RLK_ERR_INVALID_ARGUMENT, "backward case %zu accepted",
                  i);
    ck_assert_msg(strstr(rlk_last_error(), bwd[i].needle) != NULL, "backward case %zu: '%s' lacks '%s'", i,
                  rlk_last_error(), bwd[i].needle);
  }
  w0.chunk = 128;
  w0.group = 64;
  ck_assert_int_eq(rlk_linear_logprob_backward(ctx, &w0, NULL), RLK_OK);
  /* f32 gradients are checked as f32: 4-byte alignment, and their span in 4-byte elements (a
   * [4, 8] f32 matrix of row stride 8 needs 128 bytes; 64 would do for 16-bit ones) */
  static float gbuf[4 * 8 + 1];
  rlk_linear_logprob_backward_args b = w0;
  b.grad_hidden = rlk_tensor_2d((char *)gbuf + 2, RLK_F32, 4, 8, 8);
  ck_assert_int_eq(rlk_linear_logprob_backward(ctx, &b, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "grad_hidden") && strstr(rlk_last_error(), "aligned"), "%s", rlk_last_error());
  b = w0;
  b.grad_hidden.data = NULL;
  b.grad_weight = rlk_tensor_2d((char *)gbuf + 2, RLK_F32, 5, 8, 8);
  ck_assert_int_eq(rlk_linear_logprob_backward(ctx, &b, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "grad_weight") && strstr(rlk_last_error(), "aligned"), "%s", rlk_last_error());
  /* A row stride whose f32 span reaches past what can be addressed: a 16-bit count passes. */
  b = w0;
  b.grad_hidden = rlk_tensor_2d(gbuf, RLK_F32, 4, 8, ((int64_t)1 << 56) / 9); /* 2^56 bytes lie between */
  ck_assert_int_eq(rlk_linear_logprob_backward(ctx, &b, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "grad_hidden"), "%s", rlk_last_error());
  rlk_context_destroy(ctx);
}
END_TEST

/* The plan of each target: sm_90a gets the wgmma kernel, its tiled fallback and the combine;
 * other GPU targets the tiled kernel and the combine; the host its one fp64 kernel. */
/* The sm_90a backward's chunk width: the cost model picks widths whose dz and dw tiles fill whole
 * waves of the multiprocessors (what an H200 measured fastest), within [widest / 2, widest]. */
START_TEST(sm90_chunk_model) {
  rlk_ll_chunk_problem p = {8192, 4096, 151936, 1, 1, 132, 10240}; /* bf16 gradients: the sum's room */
  const int64_t w = rlk_ll_bwd_sm90_chunk(&p);
  ck_assert_int_eq(w, 8448);
  ck_assert_int_eq((8192 / 128) * (w / 256) % 132, 0); /* dz: 2112 tiles, 16 waves */
  ck_assert_int_eq((w / 128) * (4096 / 256) % 132, 0);  /* dw: 1056 tiles, 8 waves */
  p.widest = 18432; /* f32 gradients: dz alone */
  ck_assert_int_eq(rlk_ll_bwd_sm90_chunk(&p), 16896);
  for (int sms = 1; sms <= 160; sms += 13) {
    for (int64_t widest = 256; widest <= 40000; widest = widest * 3 + 256) {
      const rlk_ll_chunk_problem q = {1000 + sms, 1000, 50001, sms % 2, 1, sms, widest};
      const int64_t c = rlk_ll_bwd_sm90_chunk(&q);
      const int64_t top = widest < 50176 ? widest : 50176; /* V rounded up to 256 */
      ck_assert_int_eq(c % 256, 0);
      ck_assert_int_ge(2 * c, top);
      ck_assert_int_le(c, top);
    }
  }
  /* no multiprocessor count (a compile-only context): the fewest chunks, even widths */
  p.multiprocessors = 0;
  p.widest = 10240;
  ck_assert_int_eq(rlk_ll_bwd_sm90_chunk(&p), 10240); /* 15 chunks of 10129 columns, whole tiles */
  p.widest = 18432;
  ck_assert_int_eq(rlk_ll_bwd_sm90_chunk(&p), 16896);
}
END_TEST

/* The token chunks' rows: whole multiples of 64 between half the widest and the widest (or all
 * rows, rounded up), the most the budget allows where dw's read-modify-write of grad_weight is
 * what a chunk costs; without a multiprocessor count, the widest cut evenly. */
START_TEST(token_chunk_model) {
  /* H200, N 8192, H 4096, V 151936: dw's 5 GB read-modify-write a chunk makes fewer chunks pay */
  const int64_t r = rlk_ll_token_chunk(8192, 4096, 151936, 1, 1, 132, 960);
  ck_assert_int_eq(r % 64, 0);
  ck_assert_int_ge(r, 896);
  ck_assert_int_le(r, 960);
  for (int sms = 1; sms <= 160; sms += 13)
    for (int64_t widest = 64; widest <= 5000; widest = widest * 3 + 64)
      for (int64_t n = 1; n <= 9000; n = n * 4 + 3) {
        const int64_t c = rlk_ll_token_chunk(n, 1000 + sms, 50001, sms % 2, 1, sms, widest);
        const int64_t npad = (n + 63) / 64 * 64, top = widest < npad ? widest : npad;
        ck_assert_int_eq(c % 64, 0);
        ck_assert_int_ge(2 * c, top);
        ck_assert_int_le(c, top);
      }
  ck_assert_int_eq(rlk_ll_token_chunk(8192, 4096, 151936, 1, 1, 0, 960), 960); /* 9 chunks, the last of 512 */
  ck_assert_int_eq(rlk_ll_token_chunk(100, 4096, 151936, 1, 1, 0, 960), 128);
}
END_TEST

/* The portable backward's chunk: its column tiles are a launch's grid.y, so at most 65535 of them,
 * however wide the vocabulary, the room or the chunk asked for; sm_90a's (a persistent grid) only
 * within V. */
/* The sm_90a forward's pairs: 2 or 4 row blocks whose last holds at most 64 rows, only where
 * pairs keep every multiprocessor busy. */
START_TEST(forward_pairs) {
  static const struct {
    int64_t n;
    int cl;
  } want[] = {{1, 1}, {128, 1}, {129, 2}, {192, 2}, {193, 1}, {256, 1}, {300, 1}, {448, 2}, {449, 1},
              {512, 1}, {577, 1}, {8192, 1}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    ck_assert_msg(rlk_ll_fwd_cluster(want[i].n, 132, 132) == want[i].cl, "n %lld", (long long)want[i].n);
  ck_assert_int_eq(rlk_ll_fwd_cluster(129, 130, 132), 1); /* pairs would leave two idle */
  ck_assert_int_eq(rlk_ll_fwd_cluster(129, 0, 132), 1);   /* unknown */
  ck_assert_int_eq(rlk_ll_fwd_cluster(129, 0, 0), 1);     /* compile-only */
}
END_TEST

START_TEST(portable_chunk_grid) {
  const int64_t V = 5000000, most = (int64_t)65535 * 64;
  /* one row: the budget's room holds every column's dz */
  ck_assert_int_eq(rlk_ll_bwd_chunk(0, V, 64, (int64_t)300 << 20, 4, NULL), most);
  ck_assert_int_eq(rlk_ll_bwd_chunk((int64_t)1 << 30, V, 64, (int64_t)300 << 20, 4, NULL), most);
  ck_assert_int_eq(rlk_ll_bwd_chunk(0, 151936, 64, (int64_t)300 << 20, 4, NULL), 151936);
  ck_assert_int_eq(rlk_ll_bwd_chunk(4096, V, 64, (int64_t)300 << 20, 4, NULL), 4096);
  rlk_ll_chunk_problem p = {1, 1024, V, 1, 1, 0, 0};
  ck_assert_int_eq(rlk_ll_bwd_chunk(0, V, 256, (int64_t)300 << 20, 2, &p), (V + 255) / 256 * 256);
}
END_TEST

/* rlk_linear_policy_loss's workspace on sm_90a (the size query reads shapes only): the token
 * chunks take the rows that fit in 0.3 GiB with the rest of the call's workspace, 1024 at
 * N 8192, V 151936 (eight chunks of whole 128-row tiles). */
START_TEST(policy_loss_chunk_budget) {
  rlk_context *ctx = rlk_test_compile_only_cuda_context("sm_90a", "linear_policy_loss chunk budget");
  if (!ctx) return;
  const int64_t N = 8192, H = 4096, V = 151936, B = 8, T = N / B;
  char *fake = (char *)(uintptr_t)0x7f0000000000ull; /* never dereferenced */
  rlk_linear_policy_loss_args a;
  rlk_linear_policy_loss_args_init(&a);
  a.head.hidden = rlk_tensor_2d(fake, RLK_BF16, N, H, H);
  a.head.weight = rlk_tensor_2d(fake + (1 << 30), RLK_BF16, V, H, H);
  a.head.labels = rlk_tensor_1d(fake, RLK_I64, N);
  a.loss.old_logp = rlk_tensor_2d(fake, RLK_F32, B, T, T);
  a.loss.advantages = rlk_tensor_2d(fake, RLK_F32, B, T, T);
  a.loss.mask = rlk_tensor_2d(fake, RLK_BOOL, B, T, T);
  a.loss.loss = rlk_tensor_1d(fake, RLK_F32, 1);
  a.grad_hidden = rlk_tensor_2d(fake, RLK_F32, N, H, H);
  a.grad_weight = rlk_tensor_2d(fake, RLK_F32, V, H, H);
  for (int entropy = 0; entropy < 2; entropy++) {
    a.loss.entropy_coef = entropy ? 0.01 : 0.0;
    size_t auto_bytes = 0, chunk_bytes = 0;
    ck_assert_msg(rlk_linear_policy_loss_workspace_size(ctx, &a, &auto_bytes) == RLK_OK, "%s", rlk_last_error());
    a.chunk_tokens = 1024;
    ck_assert_msg(rlk_linear_policy_loss_workspace_size(ctx, &a, &chunk_bytes) == RLK_OK, "%s", rlk_last_error());
    a.chunk_tokens = 0;
    printf("linear_policy_loss sm_90a N %lld H %lld V %lld entropy %d: workspace %zu B\n", (long long)N,
           (long long)H, (long long)V, entropy, auto_bytes);
    ck_assert_uint_le(auto_bytes, (size_t)3 * ((size_t)1 << 30) / 10);
    ck_assert_uint_le(chunk_bytes, (size_t)3 * ((size_t)1 << 30) / 10);
    ck_assert_uint_ge(chunk_bytes, rlk_ll_stored_workspace(1024, V, 0));
    /* the call overwrites grad_weight: every row in one chunk over it, the workspace holding u^T's
     * first lines (a multiple of 256) */
    const int64_t ks = rlk_ll_stored_ksplit(N, H, V, (int64_t)auto_bytes, 132);
    ck_assert_int_ge(ks, 7424);
    ck_assert_uint_ge(auto_bytes, rlk_ll_stored_workspace(N, V, ks));
    ck_assert(rlk_ll_stored_over_weight_ok(&a.grad_weight, N, V, ks));
    /* added to, it takes the row-major chunks' 1024 rows */
    a.accumulate = 1;
    ck_assert_msg(rlk_linear_policy_loss_workspace_size(ctx, &a, &auto_bytes) == RLK_OK, "%s", rlk_last_error());
    a.accumulate = 0;
    ck_assert_uint_eq(auto_bytes, chunk_bytes);
  }
  /* rows past 2 H: no line of u^T fits in a row of grad_weight */
  ck_assert(!rlk_ll_stored_over_weight_ok(&a.grad_weight, 2 * H + 64, V, 16384));
  ck_assert(rlk_ll_stored_over_weight_ok(&a.grad_weight, 2 * H, V, 16384));
  const rlk_tensor padded = rlk_tensor_2d(fake, RLK_F32, V, H, H + 8); /* padding is not its memory */
  ck_assert(!rlk_ll_stored_over_weight_ok(&padded, 2 * H + 8, V, 16384));
  ck_assert(!rlk_ll_stored_over_weight_ok(&a.grad_weight, N, V, 1000)); /* not a multiple of 256 */
  /* u^T's 64-column blocks are a launch's grid.y: a vocabulary past 65535 of them stays row-major */
  const int64_t wide = (int64_t)65535 * 64, ks_all = (int64_t)16384 * 256; /* ks_all > wide */
  const rlk_tensor gw_wide = rlk_tensor_2d(fake, RLK_F32, wide + 1, H, H);
  ck_assert(rlk_ll_stored_over_weight_ok(&gw_wide, N, wide, ks_all));
  ck_assert(!rlk_ll_stored_over_weight_ok(&gw_wide, N, wide + 1, ks_all));
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(plan_per_target) {
  static const struct {
    rlk_backend backend;
    const char *target;
    const char *first;
    size_t n;
  } targets[] = {{RLK_BACKEND_CUDA, "sm_90a", "linear_logprob_fwd_sm90", 3},
                 {RLK_BACKEND_CUDA, "sm_80", "linear_logprob_fwd_tiled", 2},
                 {RLK_BACKEND_HIP, "gfx90a", "linear_logprob_fwd_tiled", 2},
                 {RLK_BACKEND_HOST, NULL, "linear_logprob_fwd_host", 1}};
  for (size_t t = 0; t < 4; t++) {
    rlk_context *ctx = rlk_test_compile_only_context(targets[t].backend, targets[t].target, "linear_logprob plan");
    if (!ctx) continue;
    rlk_op_config_pair pairs[2] = {{"entropy", "1"}, {"pass", "fwd"}};
    rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
    size_t n = 0;
    ck_assert_int_eq(rlk_op_plan(&rlk_op_linear_logprob, ctx, 2, pairs, specs, &n), RLK_OK);
    ck_assert_uint_eq(n, targets[t].n);
    ck_assert_str_eq(specs[0].tmpl->entry, targets[t].first);
    /* the backward: dz, dh, dh_out, dw on a GPU (sm_90a: the wgmma kinds, then the portable
     * fallback's four); one kernel on the host; then the forward's */
    rlk_op_config_pair both[1] = {{"grad", "same"}};
    ck_assert_int_eq(rlk_op_plan(&rlk_op_linear_logprob, ctx, 1, both, specs, &n), RLK_OK);
    const int sm90 = targets[t].n == 3;
    ck_assert_uint_eq(n, targets[t].backend == RLK_BACKEND_HOST ? 2 : (sm90 ? 8 : 4) + targets[t].n);
    ck_assert_str_eq(specs[0].tmpl->entry, targets[t].backend == RLK_BACKEND_HOST ? "linear_logprob_bwd_host"
                                           : sm90                                  ? "linear_logprob_bwd_sm90"
                                                                                   : "linear_logprob_bwd_dz");
    if (sm90) {
      ck_assert_str_eq(specs[1].tmpl->entry, "linear_logprob_bwd_sm90");
      ck_assert_str_eq(specs[2].tmpl->entry, "linear_logprob_bwd_dh_out");
      ck_assert_str_eq(specs[3].tmpl->entry, "linear_logprob_bwd_sm90");
      ck_assert_str_eq(specs[4].tmpl->entry, "linear_logprob_bwd_dz");
      for (int kind = 0; kind < 3; kind++) ck_assert_int_eq(specs[kind == 2 ? 3 : kind].values[0], kind);
    }
    rlk_op_config_pair tiled[2] = {{"variant", "tiled"}, {"pass", "fwd"}};
    ck_assert_int_eq(rlk_op_plan(&rlk_op_linear_logprob, ctx, 2, tiled, specs, &n), RLK_OK);
    if (targets[t].backend != RLK_BACKEND_HOST) ck_assert_str_eq(specs[0].tmpl->entry, "linear_logprob_fwd_tiled");
    rlk_op_config_pair badp[1] = {{"hidden", "f32"}};
    ck_assert_int_eq(rlk_op_plan(&rlk_op_linear_logprob, ctx, 1, badp, specs, &n), RLK_ERR_INVALID_ARGUMENT);
    rlk_context_destroy(ctx);
  }
  ck_assert_ptr_nonnull(strstr(rlk_precompile_ops(), "linear_logprob"));
  ck_assert_ptr_nonnull(strstr(rlk_precompile_help("linear_logprob"), "variant"));
}
END_TEST

RLK_SAMPLES_CASE("linear_logprob", &rlk_op_linear_logprob)


/* ---------------------------------------------------------------------------------- */
/* rlk_linear_policy_loss                                                              */
/* ---------------------------------------------------------------------------------- */

/* The PPO loss (clip 0.2 / 0.28, dual clip 3, k3 KL, an entropy bonus) of B x T tokens straight from
 * hidden states, against an fp64 chain built from the references alone: the head's log-probs and
 * entropy (ll_ref_row), the loss and its gradients (plref_rlk), the head's gradients
 * (ll_check_grads). Ignored labels are masked out. path and chunk_tokens as the call's; count: the
 * token-mean normalizer left to the call (the mask's count), else 9; gw_pad: f32 elements between
 * grad_weight's rows (1: rows no tensor map can describe; any: a NaN pattern there that must
 * survive the call bit for bit); accumulate: both gradients added to random values they hold. */
static void ll_policy_check(rlk_context *ctx, int64_t B, int64_t T, int64_t V, int64_t H, rlk_dtype dt,
                            float temp, uint64_t seed, rlk_linear_policy_loss_path path, int chunk_tokens,
                            int count, int64_t gw_pad, int accumulate) {
  uint64_t rng = seed;
  const int64_t N = B * T;
  uint16_t *h = malloc((size_t)(N * H) * 2), *w = malloc((size_t)(V * H) * 2);
  int64_t *lab = malloc((size_t)N * 8);
  double *lp = calloc((size_t)N, 8), *ent = calloc((size_t)N, 8), *old = calloc((size_t)N, 8);
  double *adv = calloc((size_t)N, 8), *ref = calloc((size_t)N, 8), *mask = calloc((size_t)N, 8);
  double *glp = calloc((size_t)N, 8), *gent = calloc((size_t)N, 8), *x = malloc((size_t)V * 8);
  float *f_old = malloc((size_t)N * 4), *f_adv = malloc((size_t)N * 4), *f_ref = malloc((size_t)N * 4);
  uint8_t *m8 = malloc((size_t)N);
  double *lp_tol = malloc((size_t)N * 8), *ent_tol = malloc((size_t)N * 8), *gabs = calloc((size_t)N, 8);
  double *dg_lp = malloc((size_t)N * 8), *dg_H = malloc((size_t)N * 8);
  ck_assert(h && w && lab && lp && ent && old && adv && ref && mask && glp && gent && x && f_old && f_adv && f_ref && m8);
  ck_assert(lp_tol && ent_tol && gabs && dg_lp && dg_H);
  const double step = ll_grid_step(H, 2.0), eps = ll_fold_eps(V);
  for (int64_t i = 0; i < N * H; i++) rlk_test_store(h, dt, i, ll_grid_h(&rng));
  for (int64_t i = 0; i < V * H; i++) rlk_test_store(w, dt, i, ll_grid_w(&rng, step));
  for (int64_t i = 0; i < N; i++) {
    lab[i] = i % 7 == 3 ? -100 : (int64_t)(rlk_test_rand_u64(&rng) % (uint64_t)V);
    lp_ref_row r;
    ll_ref_row(h, H, w, H, dt == RLK_F16, i, V, H, temp, lab[i], -100, x, &r, NULL);
    lp[i] = r.logp;
    ent[i] = r.entropy;
    const ll_bound fb = ll_fwd_bound(&r, eps);
    lp_tol[i] = lab[i] == -100 ? 0.0 : fb.logp; /* an ignored row's logp is 0 exactly */
    ent_tol[i] = fb.entropy;
    mask[i] = lab[i] == -100 || rlk_test_rand_uniform(&rng) < 0.15 ? 0.0 : 1.0;
    /* old log-probs that put ratios on both sides of the clip range, never within 1e-3 of a kink
     * (the f32 and fp64 decisions would differ there) */
    double r_old;
    do {
      old[i] = (double)(float)(lp[i] + 0.4 * rlk_test_rand_normal(&rng));
      r_old = exp(lp[i] - old[i]);
    } while (fabs(r_old - 0.8) < 1e-3 || fabs(r_old - 1.28) < 1e-3 || fabs(r_old - 3.0) < 1e-3);
    adv[i] = (double)(float)rlk_test_rand_normal(&rng);
    ref[i] = (double)(float)(lp[i] + 0.2 * rlk_test_rand_normal(&rng));
    f_old[i] = (float)old[i], f_adv[i] = (float)adv[i], f_ref[i] = (float)ref[i];
    m8[i] = (uint8_t)mask[i];
  }
  double norm = 9.0;
  const double kl_coef = 0.05, ent_coef = 0.01;
  if (count) {
    norm = 0.0;
    for (int64_t i = 0; i < N; i++) norm += mask[i];
  }
  plref_batch pb = {B, T, lp, old, adv, 0, mask, ref, ent, NULL};
  plref_params pp;
  memset(&pp, 0, sizeof pp);
  pp.mode = RLK_POLICY_PPO;
  pp.clip_low = 0.2, pp.clip_high = 0.28, pp.dual_clip = 3.0, pp.lr_min = -20, pp.lr_max = 20;
  pp.kl = RLK_KL_K3, pp.kl_coef = kl_coef, pp.kl_in = 20, pp.kl_out = 10, pp.ent_coef = ent_coef;
  pp.agg = RLK_AGG_TOKEN_MEAN, pp.token_norm = norm, pp.loss_scale = 1, pp.bound_g = 1;
  plref_out po;
  memset(&po, 0, sizeof po);
  po.grad_lp = glp;
  po.grad_ent = gent;
  po.grad_abs = gabs;
  ck_assert_int_eq(plref_rlk(&pb, &pp, &po), 0);
  /* The call's loss gradients come from its own log-probs (within lp_tol): the policy part scales
   * with the ratio (its derivative in logp is itself), the k3 part's derivative is kl_coef K m
   * e^(ref - lp); twice the first order, and 16 u of their f32 evaluation. grad_entropy is the
   * constant -entropy_coef K m (4 u). The loss moves by at most its gradients times those
   * errors (twice the first order), plus its f32 sum over the tokens (ll_sum_eps of the sum of
   * |terms|) and their evaluation (16 u of it). */
  double loss_tol = (ll_sum_eps(N) + 16 * LL_U) * po.loss_abs;
  for (int64_t i = 0; i < N; i++) {
    const double kl_d = kl_coef * mask[i] / norm * exp(ref[i] - lp[i]);
    dg_lp[i] = 2.0 * lp_tol[i] * (gabs[i] + kl_d) + 16 * LL_U * gabs[i];
    dg_H[i] = 4 * LL_U * fabs(gent[i]);
    loss_tol += 2.0 * (gabs[i] * lp_tol[i] + fabs(gent[i]) * ent_tol[i]);
  }

  void *dh = rlk_test_put(ctx, h, (size_t)(N * H) * 2), *dw = rlk_test_put(ctx, w, (size_t)(V * H) * 2);
  void *dl = rlk_test_put(ctx, lab, (size_t)N * 8), *dold = rlk_test_put(ctx, f_old, (size_t)N * 4);
  void *dadv = rlk_test_put(ctx, f_adv, (size_t)N * 4), *dref = rlk_test_put(ctx, f_ref, (size_t)N * 4);
  void *dm = rlk_test_put(ctx, m8, (size_t)N);
  const int64_t gws = H + gw_pad;
  const uint32_t pad_bits = 0x7fc5a5a5u; /* a quiet NaN: read as data anywhere, it would show */
  float *zero = calloc((size_t)(V * gws > 32 ? V * gws : 32), 4);
  float *gh0 = calloc((size_t)(N * H), 4), *gw0 = calloc((size_t)(V * H), 4), *gw_rows = malloc((size_t)(V * gws) * 4);
  ck_assert(zero && gh0 && gw0 && gw_rows);
  for (int64_t i = 0; accumulate && i < N * H; i++) gh0[i] = (float)rlk_test_rand_normal(&rng);
  for (int64_t i = 0; accumulate && i < V * H; i++) gw0[i] = (float)rlk_test_rand_normal(&rng);
  for (int64_t v = 0; v < V; v++) {
    memcpy(gw_rows + v * gws, gw0 + v * H, (size_t)H * 4);
    for (int64_t j = H; j < gws; j++) memcpy(gw_rows + v * gws + j, &pad_bits, 4);
  }
  void *dloss = rlk_test_put(ctx, zero, 4 * (1 + RLK_POLICY_LOSS_METRICS)),
       *dgh = rlk_test_put(ctx, gh0, (size_t)(N * H) * 4);
  void *dgw = rlk_test_put(ctx, gw_rows, (size_t)(V * gws) * 4), *dlogp = rlk_test_put(ctx, zero, (size_t)N * 4);
  rlk_linear_policy_loss_args a;
  rlk_linear_policy_loss_args_init(&a);
  a.head.hidden = rlk_tensor_2d(dh, dt, N, H, H);
  a.head.weight = rlk_tensor_2d(dw, dt, V, H, H);
  a.head.labels = rlk_tensor_1d(dl, RLK_I64, N);
  a.head.temperature = temp;
  a.head.logp = rlk_tensor_1d(dlogp, RLK_F32, N); /* asked for: written on the way */
  a.loss.old_logp = rlk_tensor_2d(dold, RLK_F32, B, T, T);
  a.loss.advantages = rlk_tensor_2d(dadv, RLK_F32, B, T, T);
  a.loss.ref_logp = rlk_tensor_2d(dref, RLK_F32, B, T, T);
  a.loss.mask = rlk_tensor_2d(dm, RLK_BOOL, B, T, T);
  a.loss.clip_low = 0.2, a.loss.clip_high = 0.28, a.loss.dual_clip = 3.0;
  a.loss.kl_estimator = RLK_KL_K3, a.loss.kl_coef = kl_coef, a.loss.entropy_coef = ent_coef;
  a.loss.agg = RLK_AGG_TOKEN_MEAN, a.loss.token_normalizer = count ? 0.0 : norm;
  a.loss.loss = rlk_tensor_1d(dloss, RLK_F32, 1);
  a.path = path;
  a.chunk_tokens = chunk_tokens;
  a.loss.metrics = rlk_tensor_1d((float *)dloss + 1, RLK_F32, RLK_POLICY_LOSS_METRICS);
  a.grad_hidden = rlk_tensor_2d(dgh, RLK_F32, N, H, H);
  a.grad_weight = rlk_tensor_2d(dgw, RLK_F32, V, H, gws);
  a.accumulate = accumulate;
  size_t wsb = 0;
  ck_assert_msg(rlk_linear_policy_loss_workspace_size(ctx, &a, &wsb) == RLK_OK, "%s", rlk_last_error());
  void *ws = rlk_test_dev_alloc(ctx, wsb);
  a.workspace = ws;
  a.workspace_bytes = wsb - 1;
  ck_assert_int_eq(rlk_linear_policy_loss(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT); /* short */
  a.workspace_bytes = wsb;
  ck_assert_msg(rlk_linear_policy_loss(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  if (rlk_context_backend(ctx) != RLK_BACKEND_HOST) ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  float got_loss[1 + RLK_POLICY_LOSS_METRICS], *got_lp = malloc((size_t)N * 4);
  float *got_h = malloc((size_t)(N * H) * 4), *got_w = malloc((size_t)(V * gws) * 4);
  rlk_test_get(ctx, got_loss, dloss, sizeof got_loss);
  rlk_test_get(ctx, got_lp, dlogp, (size_t)N * 4);
  rlk_test_get(ctx, got_h, dgh, (size_t)(N * H) * 4);
  rlk_test_get(ctx, got_w, dgw, (size_t)(V * gws) * 4);
  for (int64_t v = 0; v < V && gw_pad; v++) {
    for (int64_t j = H; j < gws; j++) /* nothing written between the rows */
      ck_assert_msg(memcmp(got_w + v * gws + j, &pad_bits, 4) == 0, "grad_weight row %lld: padding %lld written",
                    (long long)v, (long long)(j - H));
    memmove(got_w + v * H, got_w + v * gws, (size_t)H * 4); /* rows packed */
  }
  for (int64_t i = 0; i < N; i++)
    ck_assert_msg(fabs(got_lp[i] - lp[i]) <= lp_tol[i], "logp[%lld] %.7g, fp64 %.7g, bound %.3g", (long long)i,
                  (double)got_lp[i], lp[i], lp_tol[i]);
  ck_assert_msg(fabs(got_loss[0] - po.loss) <= loss_tol, "loss %.7g, fp64 %.7g, bound %.3g", (double)got_loss[0],
                po.loss, loss_tol);
  ck_assert_msg(fabs(got_loss[1 + RLK_PL_METRIC_CLIPFRAC] - po.metrics[RLK_PL_METRIC_CLIPFRAC]) <= 1e-6,
                "clipfrac %.7g, fp64 %.7g", (double)got_loss[1 + RLK_PL_METRIC_CLIPFRAC], po.metrics[RLK_PL_METRIC_CLIPFRAC]);
  /* the token chunks keep the logits as 16-bit u on sm_90a (the host has no token chunks: its
   * AUTO is the recompute path) */
  const int stored = path == RLK_LPL_TOKEN_CHUNKS || (path == RLK_LPL_AUTO && H >= 4096 &&
                                                      rlk_context_backend(ctx) == RLK_BACKEND_CUDA);
  const ll_gradref r = {h, w, dt, lab, N, V, H, temp, glp, gent, RLK_F32, got_h, got_w, gh0, gw0, accumulate,
                        dg_lp, dg_H, eps, stored};
  ll_check_grads(ctx, &r);
  printf("linear_policy_loss %s B=%lld T=%lld V=%lld H=%lld %s path %d chunk_tokens %d%s%s%s: loss %.6g (fp64 %.6g, "
         "bound %.2g), workspace %zu B\n",
         rlk_context_backend(ctx) == RLK_BACKEND_HOST ? "host" : "gpu", (long long)B, (long long)T, (long long)V,
         (long long)H, rlk_dtype_name(dt), (int)path, chunk_tokens, count ? " (mask count)" : "",
         gw_pad ? " (grad_weight rows padded)" : "", accumulate ? " (accumulated)" : "", (double)got_loss[0], po.loss,
         loss_tol, wsb);
  rlk_test_drop(ctx, dh), rlk_test_drop(ctx, dw), rlk_test_drop(ctx, dl), rlk_test_drop(ctx, dold),
      rlk_test_drop(ctx, dadv), rlk_test_drop(ctx, dref);
  rlk_test_drop(ctx, dm), rlk_test_drop(ctx, dloss), rlk_test_drop(ctx, dgh), rlk_test_drop(ctx, dgw),
      rlk_test_drop(ctx, dlogp);
  rlk_free(ctx, ws);
  free(h), free(w), free(lab), free(lp), free(ent), free(old), free(adv), free(ref), free(mask), free(glp), free(gent);
  free(x), free(f_old), free(f_adv), free(f_ref), free(m8), free(zero), free(got_lp), free(got_h), free(got_w);
  free(lp_tol), free(ent_tol), free(gabs), free(dg_lp), free(dg_H), free(gh0), free(gw0), free(gw_rows);
}

START_TEST(host_policy_loss) {
  rlk_context *ctx = rlk_test_host_context();
  ll_policy_check(ctx, 3, 5, 301, 40, RLK_BF16, 0.8f, rlk_test_seed() ^ 0x71u, RLK_LPL_AUTO, 0, 0, 0, 0);
  ll_policy_check(ctx, 2, 7, 128, 64, RLK_F16, 1.0f, rlk_test_seed() ^ 0x72u, RLK_LPL_AUTO, 0, 1, 3, 1);
  rlk_context_destroy(ctx);
}
END_TEST

/* What the fused call checks itself; the rest is the three calls' own checks. */
START_TEST(policy_loss_bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  static uint16_t h[4 * 8], w[16 * 8];
  static int64_t lab[4];
  static float old[4], adv[4], loss[1];
  rlk_linear_policy_loss_args a;
  rlk_linear_policy_loss_args_init(&a);
  a.head.hidden = rlk_tensor_2d(h, RLK_BF16, 4, 8, 8);
  a.head.weight = rlk_tensor_2d(w, RLK_BF16, 16, 8, 8);
  a.head.labels = rlk_tensor_1d(lab, RLK_I64, 4);
  a.loss.old_logp = rlk_tensor_2d(old, RLK_F32, 2, 2, 2);
  a.loss.advantages = rlk_tensor_2d(adv, RLK_F32, 2, 2, 2);
  a.loss.loss = rlk_tensor_1d(loss, RLK_F32, 1);
  a.grad_hidden = rlk_tensor_2d(h, RLK_BF16, 4, 8, 8);
  size_t n = 0;
  ck_assert_msg(rlk_linear_policy_loss_workspace_size(ctx, &a, &n) == RLK_OK, "%s", rlk_last_error());
  ck_assert_uint_gt(n, 0);
  ck_assert_int_eq(rlk_linear_policy_loss(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT); /* no workspace */
  ck_assert_ptr_nonnull(strstr(rlk_last_error(), "workspace"));
  rlk_linear_policy_loss_args b = a;
  b.loss.old_logp = rlk_tensor_2d(old, RLK_F32, 1, 3, 3); /* 3 tokens, 4 rows */
  rlk_test_expect_error(rlk_linear_policy_loss_workspace_size(ctx, &b, &n), RLK_ERR_INVALID_ARGUMENT, "4 rows",
                        "rlk_linear_policy_loss_workspace_size");
  b = a;
  b.loss.logp = a.loss.old_logp;
  rlk_test_expect_error(rlk_linear_policy_loss_workspace_size(ctx, &b, &n), RLK_ERR_INVALID_ARGUMENT, "loss.logp",
                        "rlk_linear_policy_loss_workspace_size");
  b = a;
  b.loss.grad_logp = a.loss.old_logp;
  ck_assert_int_eq(rlk_linear_policy_loss_workspace_size(ctx, &b, &n), RLK_ERR_INVALID_ARGUMENT);
  b = a;
  b.head.partials = rlk_tensor_2d(old, RLK_F32, 1, 4, 4);
  rlk_test_expect_error(rlk_linear_policy_loss_workspace_size(ctx, &b, &n), RLK_ERR_INVALID_ARGUMENT, "partials",
                        "rlk_linear_policy_loss_workspace_size");
  b = a;
  b.path = (rlk_linear_policy_loss_path)7;
  rlk_test_expect_error(rlk_linear_policy_loss_workspace_size(ctx, &b, &n), RLK_ERR_INVALID_ARGUMENT, "path",
                        "rlk_linear_policy_loss_workspace_size");
  b = a;
  b.chunk_tokens = 100;
  rlk_test_expect_error(rlk_linear_policy_loss_workspace_size(ctx, &b, &n), RLK_ERR_INVALID_ARGUMENT, "chunk_tokens",
                        "rlk_linear_policy_loss_workspace_size");
  b = a;
  b.path = RLK_LPL_TOKEN_CHUNKS; /* the host has no token chunks */
  rlk_test_expect_error(rlk_linear_policy_loss_workspace_size(ctx, &b, &n), RLK_ERR_INVALID_ARGUMENT, "token chunks",
                        "rlk_linear_policy_loss_workspace_size");
  ck_assert_int_eq(rlk_linear_policy_loss_workspace_size(NULL, &a, &n), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_linear_policy_loss(ctx, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);
  /* What the call writes shares memory with nothing it reads: a grad_weight that holds old_logp
   * (the stored-logits layout writes grad_weight before the loss reads its inputs), a
   * grad_hidden over the hidden states, a workspace over grad_weight. */
  static float gw[16 * 8], gh[4 * 8];
  static uint8_t ws[1 << 16] __attribute__((aligned(16)));
  ck_assert_msg(rlk_linear_policy_loss_workspace_size(ctx, &a, &n) == RLK_OK && n <= sizeof ws, "%zu", n);
  a.grad_hidden = rlk_tensor_2d(gh, RLK_F32, 4, 8, 8);
  a.grad_weight = rlk_tensor_2d(gw, RLK_F32, 16, 8, 8);
  a.workspace = ws;
  a.workspace_bytes = sizeof ws;
  ck_assert_msg(rlk_linear_policy_loss(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  b = a;
  b.loss.old_logp = rlk_tensor_2d(gw + 37, RLK_F32, 2, 2, 2);
  ck_assert_int_eq(rlk_linear_policy_loss(ctx, &b, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "grad_weight: overlaps loss.old_logp"), "%s", rlk_last_error());
  b = a;
  b.grad_hidden = rlk_tensor_2d(h, RLK_BF16, 4, 8, 8);
  ck_assert_int_eq(rlk_linear_policy_loss(ctx, &b, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "grad_hidden: overlaps head.hidden"), "%s", rlk_last_error());
  b = a;
  b.workspace = (uint8_t *)gw;
  b.workspace_bytes = n;
  ck_assert_int_eq(rlk_linear_policy_loss(ctx, &b, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "workspace") && strstr(rlk_last_error(), "overlaps"), "%s", rlk_last_error());
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* CUDA                                                                                */
/* ---------------------------------------------------------------------------------- */

static void gpu_cases(rlk_context *ctx, rlk_linear_logprob_variant variant, uint64_t seed) {
  ll_case c = ll_base(3, 1000, 96);
  c.variant = variant;
  ll_check(ctx, &c, seed);
  c = ll_base(1, 151937, 896);
  c.variant = variant;
  ll_check(ctx, &c, seed + 1);
  c = ll_base(4097, 32000, 896);
  c.variant = variant;
  c.ignored = c.bad = 1;
  c.ldt = RLK_I32;
  c.check_rows = 24;
  ll_check(ctx, &c, seed + 2);
  /* a large GEMM on the wgmma path; the tiled path (f32 from shared memory) gets a smaller one */
  c = variant == RLK_LINEAR_LOGPROB_TILED ? ll_base(64, 151937, 1024) : ll_base(130, 151937, 2048);
  c.variant = variant;
  c.dt = RLK_F16;
  c.T = 0.6f;
  c.hpad = 64;
  c.check_rows = 8;
  ll_check(ctx, &c, seed + 3);
  c = ll_base(129, 2000, 200); /* H not a multiple of 64: zero-filled K tail */
  c.variant = variant;
  c.scale = 8.0;
  ll_check(ctx, &c, seed + 4);
  /* every row of a large vocabulary: three 128-row blocks (the last of one row), the model's odd
   * V, labels ignored and out of range, so that no tile of any row can go missing unseen (a
   * 256-column tile holds about 1/600 of a row's sum, moving lse by ~1.7e-3: ten times the bound) */
  c = ll_base(257, 151937, 128);
  c.variant = variant;
  c.ignored = c.bad = 1;
  ll_check(ctx, &c, seed + 5);
}

static void cases_shapes(rlk_context *ctx, uint64_t *rng) {
  gpu_cases(ctx, RLK_LINEAR_LOGPROB_AUTO, *rng);
  gpu_cases(ctx, RLK_LINEAR_LOGPROB_TILED, *rng + 100);
}

RLK_GPU_CASE("linear_logprob", shapes)

/* Bitwise the same outputs from two calls; splits change nothing beyond rounding. */
static void cases_backward(rlk_context *ctx, uint64_t *rng) {
  const uint64_t seed = *rng;
  ll_bwd_cases(ctx, seed);
  ll_bcase c = {300, 3001, 256, RLK_BF16, RLK_F32, 1, 1, 1, 1, 0, 1024, 1, 1.0f};
  ll_bwd_check(ctx, &c, seed + 5, 1, NULL, NULL);
  /* sm_90a: several 128 x 256 tiles each way, five chunks, ragged ends, accumulating bf16 grads */
  ll_bcase m = {257, 4099, 328, RLK_BF16, RLK_BF16, 1, 1, 1, 1, 1, 1024, 1, 0.8f};
  ll_bwd_check(ctx, &m, seed + 7, 1, NULL, NULL);
  ll_bcase f = {130, 2100, 520, RLK_F16, RLK_F32, 1, 0, 1, 1, 0, 0, 0, 1.0f};
  ll_bwd_check(ctx, &f, seed + 8, 1, NULL, NULL);
  /* sm_90a: more tiles than multiprocessors, so that a persistent block walks several (the ring
   * running on across them, K tails of 8 and 12): dz and grad_weight here, dh in the next */
  ll_bcase wide = {300, 20000, 136, RLK_BF16, RLK_BF16, 1, 1, 1, 1, 0, 0, 1, 1.0f};
  ll_bwd_check(ctx, &wide, seed + 12, 1, NULL, NULL);
  ll_bcase tall = {2200, 300, 2060, RLK_F16, RLK_F32, 1, 0, 1, 1, 1, 0, 0, 0.9f, 0};
  ll_bwd_check(ctx, &tall, seed + 13, 1, NULL, NULL);
  /* an f32 grad_hidden is its own sum: rows of H + 24, three chunks, added to and overwritten */
  ll_bcase pad = {200, 1800, 264, RLK_BF16, RLK_F32, 1, 1, 1, 0, 1, 768, 1, 1.0f, 24};
  ll_bwd_check(ctx, &pad, seed + 14, 1, NULL, NULL);
  pad.accumulate = 0;
  ll_bwd_check(ctx, &pad, seed + 15, 1, NULL, NULL);
  /* rows of 36 elements (72 bytes) have no tensor map: the portable kernels everywhere */
  ll_bcase p = {33, 1500, 36, RLK_BF16, RLK_F32, 1, 1, 1, 1, 0, 0, 1, 1.0f};
  ll_bwd_check(ctx, &p, seed + 9, 1, NULL, NULL);
  /* bitwise repeatable */
  ll_bcase r = {129, 5000, 200, RLK_BF16, RLK_BF16, 1, 1, 1, 1, 0, 0, 0, 1.0f};
  void *h1, *w1, *h2, *w2;
  ll_bwd_check(ctx, &r, seed + 6, 1, &h1, &w1);
  ll_bwd_check(ctx, &r, seed + 6, 0, &h2, &w2);
  ck_assert(memcmp(h1, h2, 129 * 200 * 2) == 0);
  ck_assert(memcmp(w1, w2, 5000 * 200 * 2) == 0);
  free(h2), free(w2);
  /* blocks of 128 rows (the backward's budget at its least, as beyond about 16384 rows at H 4096):
   * grad_hidden's rows bitwise the one block's, and every gradient within its bound (grad_weight
   * summed block after block); 16-bit gradients added to on sm_90a, an f32 grad_hidden that holds
   * its own sum in padded rows, and the portable kernels (rows of 2060 f16 have no tensor map) */
  r.blocked = 1;
  ll_bwd_check(ctx, &r, seed + 6, 1, &h2, &w2);
  ck_assert_msg(memcmp(h1, h2, 129 * 200 * 2) == 0, "grad_hidden: a row's bits changed with the blocks of rows");
  free(h1), free(w1), free(h2), free(w2);
  ll_bcase mb = m, pb = pad, tb = tall;
  mb.blocked = pb.blocked = tb.blocked = 1;
  pb.accumulate = 1;
  ll_bwd_check(ctx, &mb, seed + 28, 1, NULL, NULL);
  ll_bwd_check(ctx, &pb, seed + 29, 1, NULL, NULL);
  ll_bwd_check(ctx, &tb, seed + 30, 1, NULL, NULL);
  /* the whole policy loss from hidden states: the wgmma kernels (rows of 128 bytes and more),
   * recomputing the logits; then the token chunks on sm_90 (three chunks, the last of 4 rows;
   * then V and H off every tile, chunks of 256, 256 and 88 rows; then the call's own rows, one
   * chunk, the mask's count) */
  ll_policy_check(ctx, 4, 33, 3001, 256, RLK_BF16, 0.9f, seed + 11, RLK_LPL_RECOMPUTE, 0, 0, 0, 0);
  rlk_device_info info;
  ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
  if (info.compute_major == 9 && info.compute_minor == 0) {
    /* sm_90: the token chunks must run (a refusal fails the case) */
    ll_policy_check(ctx, 4, 33, 3001, 256, RLK_BF16, 0.9f, seed + 16, RLK_LPL_TOKEN_CHUNKS, 64, 1, 0, 0);
    ll_policy_check(ctx, 3, 200, 4099, 328, RLK_F16, 1.0f, seed + 17, RLK_LPL_TOKEN_CHUNKS, 256, 0, 0, 0);
    ll_policy_check(ctx, 2, 300, 2999, 2048, RLK_BF16, 0.8f, seed + 18, RLK_LPL_TOKEN_CHUNKS, 0, 1, 0, 0);
    /* the logits over grad_weight with budgets that leave the workspace 1024 of u^T's lines (600
     * rows: 1280 bytes a line; 111 rows: 256), the rest in grad_weight's memory, its slices
     * written last first (three; then five, the last of 3 lines, with vectors cut at the rows'
     * end) */
    rlk_lpl_set_budget(1536 << 10);
    ll_policy_check(ctx, 2, 300, 2999, 2048, RLK_BF16, 0.8f, seed + 20, RLK_LPL_TOKEN_CHUNKS, 0, 1, 0, 0);
    rlk_lpl_set_budget(300 << 10);
    ll_policy_check(ctx, 3, 37, 4099, 328, RLK_F16, 1.0f, seed + 21, RLK_LPL_TOKEN_CHUNKS, 0, 0, 0, 0);
    rlk_lpl_set_budget(0);
    /* grad_weight's rows 4 H + 4 bytes apart: dw from registers, two chunks of 128 rows */
    ll_policy_check(ctx, 2, 128, 2999, 256, RLK_BF16, 1.0f, seed + 19, RLK_LPL_TOKEN_CHUNKS, 128, 0, 1, 0);
    /* the stored layout's edges (H 256): N = 2 H exactly, every line of u^T a whole row of
     * grad_weight; N = 2 H + 1, past it (row-major chunks); rows H + 8 apart (32 bytes of NaN
     * padding a row that no line may take) at N = 2 H and below; and the token chunks adding to
     * what the gradients hold (accumulate: row-major chunks), with and without padding; budgets
     * that leave the workspace about 1024 of u^T's lines (1024 bytes each at N 512; 384 at 171) */
    rlk_lpl_set_budget(1536 << 10);
    ll_policy_check(ctx, 2, 256, 2999, 256, RLK_BF16, 1.0f, seed + 22, RLK_LPL_TOKEN_CHUNKS, 0, 1, 0, 0);
    ll_policy_check(ctx, 3, 171, 2999, 256, RLK_BF16, 1.0f, seed + 23, RLK_LPL_TOKEN_CHUNKS, 0, 1, 0, 0);
    ll_policy_check(ctx, 2, 256, 2999, 256, RLK_BF16, 1.0f, seed + 24, RLK_LPL_TOKEN_CHUNKS, 0, 0, 8, 0);
    rlk_lpl_set_budget(300 << 10);
    ll_policy_check(ctx, 3, 57, 4099, 328, RLK_F16, 1.0f, seed + 25, RLK_LPL_TOKEN_CHUNKS, 0, 1, 8, 0);
    rlk_lpl_set_budget(0);
    ll_policy_check(ctx, 3, 200, 4099, 328, RLK_F16, 1.0f, seed + 26, RLK_LPL_TOKEN_CHUNKS, 0, 1, 0, 1);
    ll_policy_check(ctx, 2, 128, 2999, 256, RLK_BF16, 0.9f, seed + 27, RLK_LPL_TOKEN_CHUNKS, 128, 0, 8, 1);
    /* one chunk of 65600 rows, more than a grid's 65535 in y: the row-major dz pass goes in two
     * slices */
    ll_policy_check(ctx, 2, 32800, 300, 64, RLK_BF16, 1.0f, seed + 31, RLK_LPL_TOKEN_CHUNKS, 65600, 0, 0, 0);
  } else {
    printf("skip (linear_policy_loss token chunks): compute capability %d.%d is not sm_90\n", info.compute_major,
           info.compute_minor);
  }
}

RLK_GPU_CASE("linear_logprob", backward)

/* The shard form on CUDA: both forward kernels (wgmma where the target has it) and the backward. */
static void cases_shards(rlk_context *ctx, uint64_t *rng) {
  const uint64_t seed = *rng;
  ll_shard_cases(ctx, seed);
  static const int64_t two[] = {0, 3000, 6001}; /* whole 256-column splits and a ragged end */
  ll_shard_check(ctx, 130, 128, two, 2, 1, seed + 2);
  ll_shard_label_inf(ctx, seed + 3);
}

RLK_GPU_CASE("linear_logprob", shards)

static void cases_deterministic(rlk_context *ctx, uint64_t *rng) {
  const uint64_t seed = *rng;
  ll_case c = ll_base(777, 50257, 1024);
  ll_out a, b;
  ll_run(ctx, &c, seed, 0, &a);
  ll_run(ctx, &c, seed, 0, &b);
  ck_assert(memcmp(a.logp, b.logp, 777 * 4) == 0);
  ck_assert(memcmp(a.lse, b.lse, 777 * 4) == 0);
  ck_assert(memcmp(a.ent, b.ent, 777 * 4) == 0);
  ll_free(&b);
  c.splits = 3;
  c.check_rows = 16;
  ll_run(ctx, &c, seed, 1, &b);
  ll_free(&a);
  ll_free(&b);
}

RLK_GPU_CASE("linear_logprob", deterministic)

Suite *linear_logprob_suite(void) {
  Suite *s = suite_create("linear_logprob");
  rlk_test_add_case(s, "host", 300, TESTS(host_shapes, bad_arguments, host_shards, host_shard_label_inf,
      host_records_its_configurations, host_policy_loss, policy_loss_bad_arguments));
  rlk_test_add_case(s, "plan", 600, TESTS(plan_per_target, sm90_chunk_model, token_chunk_model,
      forward_pairs, portable_chunk_grid, policy_loss_chunk_budget, samples_compile_every_target));
  rlk_test_add_case(s, "gpu", 600, TESTS(gpu_shapes, gpu_deterministic, gpu_shards));
  /* a case of its own, so that the backward's GPU checks can run beside the forward's */
  rlk_test_add_case(s, "gpu_backward", 600, TESTS(gpu_backward));
  return s;
}

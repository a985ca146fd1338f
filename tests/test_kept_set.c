/* test_kept_set.c - kept-set replay (`threshold`): rlk_logprob, rlk_logprob_backward,
 * rlk_linear_logprob, rlk_linear_logprob_backward and rlk_linear_policy_loss over each row's kept
 * set (its logits at or above its threshold, and its label), against the fp64 reference of
 * tests/ref/kept_set_ref.c from the documented semantics:
 *   - thresholds of every kind a row meets: -inf and NaN (every logit: bitwise the plain call's
 *     outputs), one that keeps the top 40 logits, one that keeps about half, one above the label
 *     (the label kept all the same), one above every logit (the label alone);
 *   - the forwards' logp, lse and entropy within bounds derived from their arithmetic; the
 *     gradients within theirs, and exactly 0 at every logit off the kept set;
 *   - rlk_linear_policy_loss's log-probs bitwise rlk_linear_logprob's with the same threshold, and
 *     its recompute path's grad_hidden bitwise the backward's of its own loss gradients;
 *   - replay of a sampler's rows: rlk_sample's threshold fed to rlk_logprob gives the sampled
 *     token's log-prob under the kept, renormalized distribution (the sampler's logp_filtered).
 * Host cases run in `make test`; the CUDA ones with RLK_TEST_GPU=1. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "linear_logprob_check.h"
#include "ref/kept_set_ref.h"
#include "ref/linear_logprob_ref.h"
#include "suites.h"
#include "test_util.h"

#define KS_U 0x1p-24 /* f32's unit roundoff */

static void ks_down(rlk_context *ctx, void *dst, const void *src, size_t bytes) {
  ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, dst, src, bytes), RLK_OK);
}

static int ks_cmp_desc(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* A float strictly between the distinct values a > b (their midpoint, which f32 holds when the
 * gap is more than two of its ulps); NaN when none is. */
static float ks_between(double a, double b) {
  const float t = (float)((a + b) / 2.0);
  return (double)t > b && (double)t < a ? t : NAN;
}

/* A row's threshold of kind k (0: -inf, 1: NaN, 2: the top 40 kept, 3: about half, 4: above the
 * label's logit, 5: above every logit, 6: exactly the second largest logit, which "at or above"
 * keeps: where the two largest differ, the kept set is two logits, or one were it "above") for raw
 * logits x[V] (f32 values) and label y. */
#define KS_KINDS 7
static float ks_threshold(int k, const double *x, int64_t V, int64_t y) {
  if (k == 0) return -INFINITY;
  if (k == 1) return NAN;
  double *s = malloc((size_t)V * sizeof *s);
  memcpy(s, x, (size_t)V * sizeof *s);
  qsort(s, (size_t)V, sizeof *s, ks_cmp_desc);
  if (k == 6) {
    const float t = (float)s[V > 1 ? 1 : 0];
    free(s);
    return t;
  }
  int64_t r = k == 2 ? (V > 41 ? 39 : V / 2) : k == 3 ? V / 2 : 0;
  if (k == 4) {
    /* the threshold between two logits above the label's (where there are two) */
    const double xy = y >= 0 ? x[y] : s[V / 2];
    while (r + 2 < V && s[r + 2] > xy) r++;
    if (r > 0) r--;
  }
  float t = NAN;
  if (k == 5) {
    t = (float)(s[0] + 1.0);
  } else {
    for (; r + 1 < V && isnan(t); r++)
      if (s[r] > s[r + 1]) t = ks_between(s[r], s[r + 1]);
  }
  free(s);
  return isnan(t) ? -INFINITY : t;
}

/* Bounds on a forward row's errors for a fold of V logits whose sum of exponentials is within
 * eps relative (each kernel's derivation: the logprob kernels' chains of at most V additions and
 * rebases, 2 V + 64 u; the fused head's records), and the last operations' roundings (16 u of the
 * row's magnitudes), the entropy's q / s three times eps (as test_linear_logprob's). */
static double ks_finite(double v) { return isfinite(v) ? fabs(v) : 0.0; }

static void ks_bounds(const lp_ref_row *r, double eps, double b[3]) {
  const double a =
      16 * KS_U * (ks_finite(r->max_z) + ks_finite(r->lse) + ks_finite(r->logp) + ks_finite(r->entropy) + 1.0);
  b[0] = eps + a, b[1] = eps + a, b[2] = eps * (1.0 + 3.0 * ks_finite(r->entropy)) + a;
}

/* A row's outputs against the reference: within the bounds, or, where the reference's value is
 * not finite (an ignored row whose kept set is empty: lse -inf, entropy NaN), the same. */
static void ks_check_row(const char *what, int64_t i, int kind, const float *got, const lp_ref_row *r, double eps,
                         int entropy) {
  double b[3];
  ks_bounds(r, eps, b);
  const double want[3] = {r->logp, r->lse, r->entropy};
  for (int q = 0; q < (entropy ? 3 : 2); q++)
    ck_assert_msg(isfinite(want[q]) ? fabs(got[q] - want[q]) <= b[q] : isnan(want[q]) ? isnan(got[q]) : got[q] == want[q],
                  "%s row %lld (threshold kind %d) output %d (logp, lse, entropy): %.8g, fp64 %.8g, bound %.3g", what,
                  (long long)i, kind, q, (double)got[q], want[q], b[q]);
}

/* ---------------------------------------------------------------------------------- */
/* rlk_logprob and its backward                                                        */
/* ---------------------------------------------------------------------------------- */

/* logp, lse, entropy [3][N] of a call on the device logits (threshold given or not). */
static void ks_logprob(rlk_context *ctx, void *x, rlk_dtype dt, int64_t N, int64_t V, void *lab, void *thr,
                       float T, float *out) {
  void *o = rlk_test_dev_alloc(ctx, (size_t)N * 12);
  rlk_logprob_args a;
  rlk_logprob_args_init(&a);
  a.logits = rlk_tensor_2d(x, dt, N, V, V);
  a.labels = rlk_tensor_1d(lab, RLK_I64, N);
  a.temperature = T;
  a.logp = rlk_test_block_row(o, RLK_F32, 0, N);
  a.lse = rlk_test_block_row(o, RLK_F32, 1, N);
  a.entropy = rlk_test_block_row(o, RLK_F32, 2, N);
  if (thr) a.threshold = rlk_tensor_1d(thr, RLK_F32, N);
  ck_assert_msg(rlk_logprob(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  ks_down(ctx, out, o, (size_t)N * 12);
  rlk_free(ctx, o);
}

static void ks_logprob_case(rlk_context *ctx, uint64_t *rng, int64_t N, int64_t V, rlk_dtype dt, float T) {
  const size_t es = rlk_dtype_size(dt);
  void *xs = malloc((size_t)(N * V) * es);
  double *x = malloc((size_t)(N * V) * sizeof *x);
  int64_t *lab = malloc((size_t)N * 8);
  float *thr = malloc((size_t)N * 4);
  unsigned char *kept = malloc((size_t)V);
  double *ref = malloc((size_t)V * sizeof *ref);
  for (int64_t i = 0; i < N * V; i++) x[i] = rlk_test_store(xs, dt, i, 2.0 * rlk_test_rand_normal(rng));
  for (int64_t i = 0; i < N; i++) {
    lab[i] = i % 13 == 7 ? -100 : (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)V);
    thr[i] = ks_threshold((int)(i % KS_KINDS), x + i * V, V, lab[i] < 0 ? -1 : lab[i]);
  }
  void *dx = rlk_test_dev_upload(ctx, xs, (size_t)(N * V) * es), *dl = rlk_test_dev_upload(ctx, lab, (size_t)N * 8),
       *dt_ = rlk_test_dev_upload(ctx, thr, (size_t)N * 4);
  float *kf = malloc((size_t)N * 12), *pf = malloc((size_t)N * 12);
  ks_logprob(ctx, dx, dt, N, V, dl, dt_, T, kf);
  ks_logprob(ctx, dx, dt, N, V, dl, NULL, T, pf);
  const double eps = (2.0 * (double)V + 64.0) * KS_U;
  for (int64_t i = 0; i < N; i++) {
    const float got[3] = {kf[i], kf[N + i], kf[2 * N + i]};
    if (i % KS_KINDS < 2) /* -inf and NaN keep every logit: the plain call's bits */
      for (int q = 0; q < 3; q++)
        ck_assert_msg(memcmp(&got[q], &pf[q * N + i], 4) == 0, "logprob row %lld threshold %g: output %d not the plain "
                      "call's", (long long)i, (double)thr[i], q);
    kept_ref_set(x + i * V, V, lab[i] < 0 ? -1 : lab[i], thr[i], kept);
    lp_ref_row r;
    kept_ref_forward(x + i * V, kept, V, T, lab[i], -100, &r);
    ks_check_row("logprob", i, (int)(i % KS_KINDS), got, &r, eps, 1);
  }
  /* the backward from the call's own lse and entropy: p' off the kept set exactly 0 */
  float *glp = malloc((size_t)N * 4), *gh = malloc((size_t)N * 4);
  for (int64_t i = 0; i < N; i++) glp[i] = (float)rlk_test_rand_normal(rng), gh[i] = (float)(0.3 * rlk_test_rand_normal(rng));
  void *dglp = rlk_test_dev_upload(ctx, glp, (size_t)N * 4), *dgh = rlk_test_dev_upload(ctx, gh, (size_t)N * 4);
  void *dlse = rlk_test_dev_upload(ctx, kf + N, (size_t)N * 4), *dent = rlk_test_dev_upload(ctx, kf + 2 * N, (size_t)N * 4);
  void *dg = rlk_test_dev_alloc(ctx, (size_t)(N * V) * 4);
  rlk_logprob_backward_args b;
  rlk_logprob_backward_args_init(&b);
  b.logits = rlk_tensor_2d(dx, dt, N, V, V);
  b.labels = rlk_tensor_1d(dl, RLK_I64, N);
  b.temperature = T;
  b.lse = rlk_tensor_1d(dlse, RLK_F32, N);
  b.entropy = rlk_tensor_1d(dent, RLK_F32, N);
  b.grad_logp = rlk_tensor_1d(dglp, RLK_F32, N);
  b.grad_entropy = rlk_tensor_1d(dgh, RLK_F32, N);
  b.grad_logits = rlk_tensor_2d(dg, RLK_F32, N, V, V);
  b.threshold = rlk_tensor_1d(dt_, RLK_F32, N);
  ck_assert_msg(rlk_logprob_backward(ctx, &b, NULL) == RLK_OK, "%s", rlk_last_error());
  float *g = malloc((size_t)(N * V) * 4);
  ks_down(ctx, g, dg, (size_t)(N * V) * 4);
  for (int64_t i = 0; i < N; i++) {
    kept_ref_set(x + i * V, V, lab[i] < 0 ? -1 : lab[i], thr[i], kept);
    const double l = kf[N + i], ez = (double)kf[N + i] - (double)kf[2 * N + i];
    kept_ref_backward(x + i * V, kept, V, T, lab[i], -100, l, ez, glp[i], gh[i], ref);
    for (int64_t v = 0; v < V; v++) {
      const float gv = g[i * V + v];
      if (!kept[v] || lab[i] < 0) {
        ck_assert_msg(gv == 0.0f, "logprob_backward row %lld column %lld: %g off the kept set", (long long)i,
                      (long long)v, (double)gv);
        continue;
      }
      /* p = 2^(x c - lse log2 e): the exponent's rounding (2 u of |x c - l2|) and ex2 (8 u), the
       * linear factor's products (4 u of each term), the one-hot term's addition (u) */
      const double z = x[i * V + v] / T, p = exp(z - l);
      const double terms = fabs(glp[i]) * (p + (v == lab[i])) + fabs(gh[i]) * p * (fabs(z) + fabs(ez));
      const double tol = (16.0 + 2.0 * fabs(z - l) / log(2.0)) * KS_U * terms / T + 1e-30;
      ck_assert_msg(fabs(gv - ref[v]) <= tol, "logprob_backward row %lld column %lld: %.8g, fp64 %.8g, bound %.3g",
                    (long long)i, (long long)v, (double)gv, ref[v], tol);
    }
  }
  printf("kept_set %s: logprob and its backward, N %lld V %lld %s, every threshold kind within bounds\n",
         rlk_context_backend(ctx) == RLK_BACKEND_HOST ? "host" : "gpu", (long long)N, (long long)V,
         rlk_dtype_name(dt));
  rlk_free(ctx, dx), rlk_free(ctx, dl), rlk_free(ctx, dt_), rlk_free(ctx, dglp), rlk_free(ctx, dgh);
  rlk_free(ctx, dlse), rlk_free(ctx, dent), rlk_free(ctx, dg);
  free(xs), free(x), free(lab), free(thr), free(kept), free(ref), free(kf), free(pf), free(glp), free(gh), free(g);
}

/* A label at -inf below the threshold, kept all the same, adds nothing: row 0 keeps the logits
 * at or above the median too (logp -inf; lse and entropy those of the others), row 1 nothing
 * else (its kept set is all -inf: lse -inf, logp and entropy NaN, as a row of -inf). */
static void ks_neg_inf_label(rlk_context *ctx, uint64_t *rng) {
  enum { V = 40 };
  float x[2 * V], thr[2], out[6];
  int64_t lab[2] = {5, 17};
  for (int64_t j = 0; j < 2 * V; j++) x[j] = (float)(2.0 * rlk_test_rand_normal(rng));
  x[lab[0]] = x[V + lab[1]] = -INFINITY;
  double s[V];
  for (int64_t j = 0; j < V; j++) s[j] = x[j];
  qsort(s, V, sizeof *s, ks_cmp_desc);
  thr[0] = ks_between(s[V / 2 - 1], s[V / 2]);
  if (isnan(thr[0])) thr[0] = (float)s[V / 2 - 1];
  thr[1] = 1e30f;
  void *dx = rlk_test_dev_upload(ctx, x, sizeof x), *dl = rlk_test_dev_upload(ctx, lab, sizeof lab),
       *dt_ = rlk_test_dev_upload(ctx, thr, sizeof thr);
  ks_logprob(ctx, dx, RLK_F32, 2, V, dl, dt_, 1.0f, out);
  double m = -INFINITY, sum = 0.0, sz = 0.0;
  for (int64_t j = 0; j < V; j++)
    if (x[j] >= thr[0] && x[j] > m) m = x[j];
  for (int64_t j = 0; j < V; j++)
    if (x[j] >= thr[0]) sum += exp(x[j] - m), sz += exp(x[j] - m) * x[j];
  const double lse = m + log(sum), ent = lse - sz / sum;
  const double tol = 64 * KS_U * (fabs(lse) + fabs(ent) + 1.0);
  ck_assert_msg(out[0] == -INFINITY, "kept -inf label: logp %g, want -inf", (double)out[0]);
  ck_assert_msg(fabs(out[2] - lse) <= tol, "kept -inf label: lse %.8g, fp64 %.8g", (double)out[2], lse);
  ck_assert_msg(fabs(out[4] - ent) <= tol, "kept -inf label: entropy %.8g, fp64 %.8g", (double)out[4], ent);
  ck_assert_msg(out[3] == -INFINITY && isnan(out[1]) && isnan(out[5]),
                "kept set of a -inf label alone: logp %g lse %g entropy %g, want NaN, -inf, NaN", (double)out[1],
                (double)out[3], (double)out[5]);
  rlk_free(ctx, dx), rlk_free(ctx, dl), rlk_free(ctx, dt_);
}

static void cases_logprob(rlk_context *ctx, uint64_t *rng) {
  ks_neg_inf_label(ctx, rng);
  if (rlk_context_backend(ctx) == RLK_BACKEND_HOST) {
    ks_logprob_case(ctx, rng, 25, 1000, RLK_BF16, 0.8f);
    ks_logprob_case(ctx, rng, 13, 77, RLK_F32, 1.0f);
    return;
  }
  ks_logprob_case(ctx, rng, 37, 32003, RLK_BF16, 0.8f);
  ks_logprob_case(ctx, rng, 25, 151936, RLK_F32, 1.0f);
  ks_logprob_case(ctx, rng, 64, 77, RLK_F16, 1.2f);
}

RLK_HOST_CASE(logprob)
RLK_GPU_CASE("kept_set", logprob)

/* ---------------------------------------------------------------------------------- */
/* The fused head                                                                      */
/* ---------------------------------------------------------------------------------- */

/* A head on a grid whose logits every path sums exactly (test_linear_logprob.c's: h = a / 4,
 * w = b step), so that the thresholds between them are exact on every path too. */
typedef struct ks_head {
  int64_t N, V, H;
  rlk_dtype dt;
  uint16_t *h, *w;
  int64_t *lab;
  double *x; /* N x V exact logits */
  float *thr;
  void *dh, *dw, *dl, *dthr;
} ks_head;

static void ks_head_new(rlk_context *ctx, uint64_t *rng, int64_t N, int64_t V, int64_t H, rlk_dtype dt, ks_head *k) {
  ck_assert_msg(441 * H < (1 << 20), "H %lld: the grid's sums would not stay exact", (long long)H);
  k->N = N, k->V = V, k->H = H, k->dt = dt;
  k->h = malloc((size_t)(N * H) * 2), k->w = malloc((size_t)(V * H) * 2);
  k->lab = malloc((size_t)N * 8), k->x = malloc((size_t)(N * V) * sizeof(double)), k->thr = malloc((size_t)N * 4);
  ck_assert(k->h && k->w && k->lab && k->x && k->thr);
  const double step = exp2(round(log2(3.0 / (sqrt((double)H) * 1.08 * 36.7))));
  for (int64_t i = 0; i < N * H; i++) rlk_test_store(k->h, dt, i, (double)((int)(rlk_test_rand_u64(rng) % 15u) - 7) / 4.0);
  for (int64_t i = 0; i < V * H; i++)
    rlk_test_store(k->w, dt, i, (double)((int)(rlk_test_rand_u64(rng) % 127u) - 63) * step);
  for (int64_t i = 0; i < N; i++) {
    for (int64_t v = 0; v < V; v++) {
      double s = 0.0;
      for (int64_t j = 0; j < H; j++)
        s += ll_ref_half(k->h[i * H + j], dt == RLK_F16) * ll_ref_half(k->w[v * H + j], dt == RLK_F16);
      k->x[i * V + v] = s;
    }
    k->lab[i] = i % 11 == 5 ? -100 : (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)V);
    k->thr[i] = ks_threshold((int)(i % KS_KINDS), k->x + i * V, V, k->lab[i] < 0 ? -1 : k->lab[i]);
  }
  k->dh = rlk_test_dev_upload(ctx, k->h, (size_t)(N * H) * 2);
  k->dw = rlk_test_dev_upload(ctx, k->w, (size_t)(V * H) * 2);
  k->dl = rlk_test_dev_upload(ctx, k->lab, (size_t)N * 8);
  k->dthr = rlk_test_dev_upload(ctx, k->thr, (size_t)N * 4);
}

static void ks_head_free(rlk_context *ctx, ks_head *k) {
  free(k->h), free(k->w), free(k->lab), free(k->x), free(k->thr);
  rlk_free(ctx, k->dh), rlk_free(ctx, k->dw), rlk_free(ctx, k->dl), rlk_free(ctx, k->dthr);
}

/* logp, lse, entropy [3][N] of rlk_linear_logprob (kept: with the thresholds) on the device (*d,
 * when asked, keeps them there). */
static void ks_linear_fwd(rlk_context *ctx, const ks_head *k, int kept, rlk_linear_logprob_variant variant, float T,
                          float *out, void **d) {
  const int64_t N = k->N;
  void *o = rlk_test_dev_alloc(ctx, (size_t)N * 12);
  ll_forward_block(ctx, k->dt, k->dh, k->dw, N, k->V, k->H, k->dl, kept ? k->dthr : NULL, T, variant, o);
  ks_down(ctx, out, o, (size_t)N * 12);
  if (d) *d = o; else rlk_free(ctx, o);
}

/* The fused head's fold of exact logits (test_linear_logprob.c's ll_fold_eps: a record's 92 u, the
 * combine's merges 11 u each, 44 u a term), and one merge more for a label left out. */
static double ks_fold_eps(int64_t V) {
  const int64_t records = (V + 255) / 256;
  return (double)(92 + 11 * ((records + 31) / 32 + 6) + 44) * KS_U;
}

/* dz's error that no relative bound covers, where dz itself is near 0 (p near 1 at the label: a
 * row whose kept set is the label alone): p = exp(z - lse) from the call's f32 lse (the fold's
 * error eps and the last roundings, of the row's magnitudes) and exp's few roundings moves each
 * column's dz by at most p c_i; sum_t p_t = 1 bounds its part of grad_hidden [i, j] by
 * c_i max_t |w[t, j]| (w_col[j]), and of grad_weight [r, j] by sum_i c_i |h[i, j]| (h_col[j]).
 * f [3][N]: the forward's logp, lse, entropy; gent NULL: no entropy gradient. w_col and h_col
 * come zeroed. */
static void ks_dz_floor(const ks_head *k, const float *f, const float *glp, const float *gent, float T, double eps,
                        double *c_abs, double *w_col, double *h_col) {
  const int64_t N = k->N, V = k->V, H = k->H;
  const int f16 = k->dt == RLK_F16;
  for (int64_t i = 0; i < N; i++) {
    double zmax = 0.0;
    for (int64_t t = 0; t < V; t++) zmax = fmax(zmax, fabs(k->x[i * V + t]) / T);
    const double lse = fabs((double)f[N + i]), E = fabs((double)f[N + i] - (double)f[2 * N + i]);
    const double gH = gent ? fabs(gent[i]) : 0.0;
    /* lse: the fold's relative error of its sum, then m + log(s) rounded; p: z - lse rounded and
     * exp's own error */
    const double dlse = eps + 4 * KS_U * (lse + zmax + 1.0), dp = dlse + 4 * KS_U * (lse + zmax + 1.0);
    /* an ignored row (no label) has no gradient and its outputs need not be finite */
    c_abs[i] = k->lab[i] < 0 || !isfinite(lse + E + zmax)
                   ? 0.0
                   : ((fabs(glp[i]) + gH * (E + zmax + 1.0)) * dp + 2.0 * gH * dlse) / T;
    for (int64_t j = 0; j < H; j++) h_col[j] += c_abs[i] * fabs(ll_ref_half(k->h[i * H + j], f16));
  }
  for (int64_t t = 0; t < V; t++)
    for (int64_t j = 0; j < H; j++) w_col[j] = fmax(w_col[j], fabs(ll_ref_half(k->w[t * H + j], f16)));
}

static void ks_linear_case(rlk_context *ctx, uint64_t *rng, int64_t N, int64_t V, int64_t H, rlk_dtype dt, float T,
                           rlk_linear_logprob_variant variant) {
  ks_head k;
  ks_head_new(ctx, rng, N, V, H, dt, &k);
  float *kf = malloc((size_t)N * 12), *pf = malloc((size_t)N * 12);
  void *d_out;
  ks_linear_fwd(ctx, &k, 1, variant, T, kf, &d_out);
  ks_linear_fwd(ctx, &k, 0, variant, T, pf, NULL);
  unsigned char *kept = malloc((size_t)V);
  const double eps = ks_fold_eps(V);
  for (int64_t i = 0; i < N; i++) {
    const float got[3] = {kf[i], kf[N + i], kf[2 * N + i]};
    if (i % KS_KINDS < 2)
      for (int q = 0; q < 3; q++)
        ck_assert_msg(memcmp(&got[q], &pf[q * N + i], 4) == 0,
                      "linear_logprob row %lld threshold %g: output %d not the plain call's", (long long)i,
                      (double)k.thr[i], q);
    kept_ref_set(k.x + i * V, V, k.lab[i] < 0 ? -1 : k.lab[i], k.thr[i], kept);
    lp_ref_row r;
    kept_ref_forward(k.x + i * V, kept, V, T, k.lab[i], -100, &r);
    ks_check_row("linear_logprob", i, (int)(i % KS_KINDS), got, &r, eps, 1);
  }
  /* the backward (f32 gradients) from the call's lse and entropy, against the reference's dz
   * summed in fp64: the products' f32 sums (3 K u of the sum of |terms|, test_linear_logprob.c's
   * ll_sum_eps) and dz's own errors (16-bit on sm_90a: 2^-8 of each term; f32 elsewhere: 32 u) */
  float *glp = malloc((size_t)N * 4), *gent = malloc((size_t)N * 4);
  for (int64_t i = 0; i < N; i++) glp[i] = (float)rlk_test_rand_normal(rng), gent[i] = (float)(0.3 * rlk_test_rand_normal(rng));
  void *dglp = rlk_test_dev_upload(ctx, glp, (size_t)N * 4), *dgent = rlk_test_dev_upload(ctx, gent, (size_t)N * 4);
  void *dgh = rlk_test_dev_alloc(ctx, (size_t)(N * H) * 4), *dgw = rlk_test_dev_alloc(ctx, (size_t)(V * H) * 4);
  rlk_linear_logprob_backward_args b;
  rlk_linear_logprob_backward_args_init(&b);
  b.hidden = rlk_tensor_2d(k.dh, dt, N, H, H);
  b.weight = rlk_tensor_2d(k.dw, dt, V, H, H);
  b.labels = rlk_tensor_1d(k.dl, RLK_I64, N);
  b.temperature = T;
  b.lse = rlk_test_block_row(d_out, RLK_F32, 1, N);
  b.entropy = rlk_test_block_row(d_out, RLK_F32, 2, N);
  b.grad_logp = rlk_tensor_1d(dglp, RLK_F32, N);
  b.grad_entropy = rlk_tensor_1d(dgent, RLK_F32, N);
  b.grad_hidden = rlk_tensor_2d(dgh, RLK_F32, N, H, H);
  b.grad_weight = rlk_tensor_2d(dgw, RLK_F32, V, H, H);
  b.threshold = rlk_tensor_1d(k.dthr, RLK_F32, N);
  rlk_test_workspace(ctx, rlk_linear_logprob_backward_workspace_size(ctx, &b, &b.workspace_bytes),
                     &b.workspace_bytes, &b.workspace, &b.workspace_bytes);
  ck_assert_msg(rlk_linear_logprob_backward(ctx, &b, NULL) == RLK_OK, "%s", rlk_last_error());
  float *gh = malloc((size_t)(N * H) * 4), *gw = malloc((size_t)(V * H) * 4);
  ks_down(ctx, gh, dgh, (size_t)(N * H) * 4);
  ks_down(ctx, gw, dgw, (size_t)(V * H) * 4);
  double *dz = malloc((size_t)(N * V) * sizeof *dz);
  for (int64_t i = 0; i < N; i++) {
    kept_ref_set(k.x + i * V, V, k.lab[i] < 0 ? -1 : k.lab[i], k.thr[i], kept);
    kept_ref_backward(k.x + i * V, kept, V, T, k.lab[i], -100, kf[N + i], (double)kf[N + i] - (double)kf[2 * N + i],
                      glp[i], gent[i], dz + i * V);
  }
  /* dz's own rounding, by the backward's kernels (whatever the forward's variant): f32 on the host
   * and in the portable kernels; on sm_90 (rows tensor maps describe) the wgmma kernels keep dz in
   * the inputs' 16-bit dtype, half an ulp of |dz| and, for f16's subnormals, 2^-25 whatever the
   * value (test_linear_logprob.c's u_dz and a_dz) */
  const int host = rlk_context_backend(ctx) == RLK_BACKEND_HOST;
  rlk_device_info info;
  const int dz16 = !host && rlk_context_device_info(ctx, &info) == RLK_OK && info.compute_major == 9 &&
                   info.compute_minor == 0 && (H * 2) % 16 == 0;
  const double dz_rel = host ? 4 * KS_U : !dz16 ? 32 * KS_U : dt == RLK_F16 ? 0x1p-11 : 0x1p-8,
               dz_abs = dz16 && dt == RLK_F16 ? 0x1p-25 : 0.0;
  double *c_abs = malloc((size_t)N * sizeof *c_abs), *w_col = calloc((size_t)H, sizeof *w_col),
         *h_col = calloc((size_t)H, sizeof *h_col);
  ks_dz_floor(&k, kf, glp, gent, T, eps, c_abs, w_col, h_col);
  double worst = 0.0;
  for (int q = 0; q < 2; q++) { /* 0: grad_hidden [N, H] = dz W; 1: grad_weight [V, H] = dz^T h */
    const int64_t rows = q ? V : N, K = q ? N : V;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t j = 0; j < H; j++) {
        double want = 0.0, mag = 0.0, omag = 0.0;
        for (int64_t t = 0; t < K; t++) {
          const double d = q ? dz[t * V + r] : dz[r * V + t];
          const double o = q ? ll_ref_half(k.h[t * H + j], dt == RLK_F16) : ll_ref_half(k.w[t * H + j], dt == RLK_F16);
          want += d * o;
          mag += fabs(d * o), omag += fabs(o);
        }
        const double got = q ? gw[r * H + j] : gh[r * H + j];
        const double tol = (4.0 * (double)(K + 64) * KS_U + dz_rel) * mag + dz_abs * omag +
                           (q ? h_col[j] : c_abs[r] * w_col[j]) + 1e-30;
        if (fabs(got - want) / tol > worst) worst = fabs(got - want) / tol;
        ck_assert_msg(fabs(got - want) <= tol, "linear_logprob_backward %s [%lld, %lld]: %.8g, fp64 %.8g, bound %.3g",
                      q ? "grad_weight" : "grad_hidden", (long long)r, (long long)j, got, want, tol);
      }
  }
  printf("kept_set %s: linear_logprob variant %d and its backward, N %lld V %lld H %lld: within bounds (gradients "
         "at %.2g of theirs)\n",
         host ? "host" : "gpu", (int)variant, (long long)N, (long long)V, (long long)H, worst);
  if (b.workspace) rlk_free(ctx, b.workspace);
  rlk_free(ctx, d_out), rlk_free(ctx, dglp), rlk_free(ctx, dgent), rlk_free(ctx, dgh), rlk_free(ctx, dgw);
  free(kf), free(pf), free(kept), free(glp), free(gent), free(gh), free(gw), free(dz);
  free(c_abs), free(w_col), free(h_col);
  ks_head_free(ctx, &k);
}

/* rlk_linear_policy_loss with thresholds: its log-probs rlk_linear_logprob's (bitwise), and by the
 * recompute path its grad_hidden the backward's of its own loss gradients (bitwise: the same
 * calls); on sm_90a the token chunks' log-probs too, their grad_hidden within the sum of both
 * paths' bounds against the fp64 reference's dz (derived where they are checked). */
static void ks_policy_case(rlk_context *ctx, uint64_t *rng, int64_t N, int64_t V, int64_t H,
                           rlk_linear_policy_loss_path path) {
  ks_head k;
  ks_head_new(ctx, rng, N, V, H, RLK_BF16, &k);
  float *fwd = malloc((size_t)N * 12);
  ks_linear_fwd(ctx, &k, 1, RLK_LINEAR_LOGPROB_AUTO, 1.0f, fwd, NULL);
  float *old = malloc((size_t)N * 4), *adv = malloc((size_t)N * 4);
  for (int64_t i = 0; i < N; i++) old[i] = fwd[i] + (float)(0.3 * rlk_test_rand_normal(rng)), adv[i] = (float)rlk_test_rand_normal(rng);
  void *dold = rlk_test_dev_upload(ctx, old, (size_t)N * 4), *dadv = rlk_test_dev_upload(ctx, adv, (size_t)N * 4);
  void *dlp = rlk_test_dev_alloc(ctx, (size_t)N * 4), *dloss = rlk_test_dev_alloc(ctx, 4);
  void *dgh = rlk_test_dev_alloc(ctx, (size_t)(N * H) * 4);
  rlk_linear_policy_loss_args a;
  rlk_linear_policy_loss_args_init(&a);
  a.head.hidden = rlk_tensor_2d(k.dh, k.dt, N, H, H);
  a.head.weight = rlk_tensor_2d(k.dw, k.dt, V, H, H);
  a.head.labels = rlk_tensor_1d(k.dl, RLK_I64, N);
  a.head.logp = rlk_tensor_1d(dlp, RLK_F32, N);
  a.head.threshold = rlk_tensor_1d(k.dthr, RLK_F32, N);
  ll_policy_over_rows(&a, dold, dadv, dloss, dgh, N, H, 64.0, path);
  ll_run_policy_loss(ctx, &a);
  float *lp = malloc((size_t)N * 4), *gh = malloc((size_t)(N * H) * 4);
  ks_down(ctx, lp, dlp, (size_t)N * 4);
  ks_down(ctx, gh, dgh, (size_t)(N * H) * 4);
  for (int64_t i = 0; i < N; i++)
    ck_assert_msg(memcmp(&lp[i], &fwd[i], 4) == 0, "linear_policy_loss path %d row %lld: logp %.9g, linear_logprob "
                  "%.9g", (int)path, (long long)i, (double)lp[i], (double)fwd[i]);
  /* the recompute chain by hand: the loss's gradients, then the kept backward */
  void *dglp = rlk_test_dev_alloc(ctx, (size_t)N * 4), *dfwd = NULL;
  float *f2 = malloc((size_t)N * 12);
  ks_linear_fwd(ctx, &k, 1, RLK_LINEAR_LOGPROB_AUTO, 1.0f, f2, &dfwd);
  rlk_policy_loss_args pl = a.loss;
  pl.logp = rlk_tensor_2d(dfwd, RLK_F32, 1, N, N); /* the kept logp: the first [N] of the outputs */
  pl.grad_logp = rlk_tensor_2d(dglp, RLK_F32, 1, N, N);
  pl.workspace = NULL;
  rlk_test_workspace(ctx, rlk_policy_loss_workspace_size(ctx, &pl, &pl.workspace_bytes),
                     &pl.workspace_bytes, &pl.workspace, &pl.workspace_bytes);
  ck_assert_msg(rlk_policy_loss(ctx, &pl, NULL) == RLK_OK, "%s", rlk_last_error());
  void *dgh2 = rlk_test_dev_alloc(ctx, (size_t)(N * H) * 4);
  rlk_linear_logprob_backward_args b;
  rlk_linear_logprob_backward_args_init(&b);
  b.hidden = a.head.hidden, b.weight = a.head.weight, b.labels = a.head.labels, b.threshold = a.head.threshold;
  b.lse = rlk_test_block_row(dfwd, RLK_F32, 1, N);
  b.grad_logp = rlk_tensor_1d(dglp, RLK_F32, N);
  b.grad_hidden = rlk_tensor_2d(dgh2, RLK_F32, N, H, H);
  rlk_test_workspace(ctx, rlk_linear_logprob_backward_workspace_size(ctx, &b, &b.workspace_bytes),
                     &b.workspace_bytes, &b.workspace, &b.workspace_bytes);
  ck_assert_msg(rlk_linear_logprob_backward(ctx, &b, NULL) == RLK_OK, "%s", rlk_last_error());
  float *gh2 = malloc((size_t)(N * H) * 4);
  ks_down(ctx, gh2, dgh2, (size_t)(N * H) * 4);
  if (path == RLK_LPL_RECOMPUTE) {
    ck_assert_msg(memcmp(gh, gh2, (size_t)(N * H) * 4) == 0, "linear_policy_loss recompute: grad_hidden is not its "
                  "chain's");
  } else {
    /* Each path's grad_hidden [i, j] against the exact sum_t dz_t w[t, j] (the loss gradients g_i
     * both read, bitwise the same from bitwise the same log-probs; no entropy term): the recompute
     * rounds each f32 dz_t to 16 bits (r16 of |dz_t|); the token chunks also store p_t as 16-bit
     * u (r16 of g_i p_t / T more). Both sum in f32 (4 (V + 64) u of the sum of |terms|) and both
     * read an f32 lse (ks_dz_floor's part). Each is checked against the exact sum. */
    const double r16 = 0x1p-8, eps = ks_fold_eps(V);
    float *g = malloc((size_t)N * 4);
    ks_down(ctx, g, dglp, (size_t)N * 4);
    double *c_abs = malloc((size_t)N * sizeof *c_abs), *w_col = calloc((size_t)H, sizeof *w_col),
           *h_col = calloc((size_t)H, sizeof *h_col), *dz = malloc((size_t)V * sizeof *dz),
           *pt = malloc((size_t)V * sizeof *pt);
    unsigned char *kept = malloc((size_t)V);
    ks_dz_floor(&k, f2, g, NULL, 1.0f, eps, c_abs, w_col, h_col);
    for (int64_t i = 0; i < N; i++) {
      kept_ref_set(k.x + i * V, V, k.lab[i] < 0 ? -1 : k.lab[i], k.thr[i], kept);
      kept_ref_backward(k.x + i * V, kept, V, 1.0, k.lab[i], -100, f2[N + i], (double)f2[N + i] - (double)f2[2 * N + i],
                        g[i], 0.0, dz);
      for (int64_t t = 0; t < V; t++) pt[t] = k.lab[i] < 0 || !kept[t] ? 0.0 : exp(k.x[i * V + t] - (double)f2[N + i]);
      for (int64_t j = 0; j < H; j++) {
        double mag = 0.0, pw = 0.0, exact = 0.0;
        for (int64_t t = 0; t < V; t++) {
          const double w = ll_ref_half(k.w[t * H + j], 0);
          mag += fabs(dz[t] * w), pw += pt[t] * fabs(w), exact += dz[t] * w;
        }
        const double rec = (r16 + 4.0 * (double)(V + 64) * KS_U) * mag + c_abs[i] * w_col[j] + 1e-30,
                     chunks = rec + r16 * fabs(g[i]) * pw;
        const float x1 = gh[i * H + j], x2 = gh2[i * H + j];
        ck_assert_msg(fabs(x1 - exact) <= chunks, "token chunks grad_hidden [%lld, %lld]: %.8g, fp64 %.8g, bound %.3g",
                      (long long)i, (long long)j, (double)x1, exact, chunks);
        ck_assert_msg(fabs(x2 - exact) <= rec, "recompute grad_hidden [%lld, %lld]: %.8g, fp64 %.8g, bound %.3g",
                      (long long)i, (long long)j, (double)x2, exact, rec);
      }
    }
    free(g), free(c_abs), free(w_col), free(h_col), free(dz), free(pt), free(kept);
  }
  printf("kept_set %s: linear_policy_loss path %d, N %lld V %lld H %lld: logp bitwise linear_logprob's\n",
         rlk_context_backend(ctx) == RLK_BACKEND_HOST ? "host" : "gpu", (int)path, (long long)N, (long long)V,
         (long long)H);
  if (pl.workspace) rlk_free(ctx, pl.workspace);
  if (b.workspace) rlk_free(ctx, b.workspace);
  rlk_free(ctx, a.workspace), rlk_free(ctx, dold), rlk_free(ctx, dadv), rlk_free(ctx, dlp), rlk_free(ctx, dloss);
  rlk_free(ctx, dgh), rlk_free(ctx, dglp), rlk_free(ctx, dfwd), rlk_free(ctx, dgh2);
  free(fwd), free(old), free(adv), free(lp), free(gh), free(gh2), free(f2);
  ks_head_free(ctx, &k);
}

/* A row whose label is outside the vocabulary, under a threshold above every one of its logits:
 * its forward is NaN and sets the status bit, and its backward makes the gradients NaN as the
 * contract says of a bad label, kept set or not: grad_hidden's row and every element of
 * grad_weight (each sums the row's dz), while the other rows' grad_hidden stay finite. */
static void ks_bad_label_case(rlk_context *ctx, uint64_t *rng, int64_t N, int64_t V, int64_t H) {
  ks_head k;
  ks_head_new(ctx, rng, N, V, H, RLK_BF16, &k);
  double top = -INFINITY;
  for (int64_t v = 0; v < V; v++) top = fmax(top, k.x[v]);
  k.lab[0] = V;
  k.thr[0] = (float)(top + 1.0);
  for (int64_t i = 1; i < N; i++) k.lab[i] = i % V, k.thr[i] = -INFINITY;
  rlk_free(ctx, k.dl), rlk_free(ctx, k.dthr);
  k.dl = rlk_test_dev_upload(ctx, k.lab, (size_t)N * 8);
  k.dthr = rlk_test_dev_upload(ctx, k.thr, (size_t)N * 4);
  float *f = malloc((size_t)N * 12);
  void *d_out;
  ks_linear_fwd(ctx, &k, 1, RLK_LINEAR_LOGPROB_AUTO, 1.0f, f, &d_out);
  ck_assert_msg(isnan(f[0]) && isnan(f[N]), "bad label under a threshold: logp %g, lse %g", (double)f[0],
                (double)f[N]);
  float *glp = malloc((size_t)N * 4);
  for (int64_t i = 0; i < N; i++) glp[i] = 1.0f;
  const int32_t zero = 0;
  void *dglp = rlk_test_dev_upload(ctx, glp, (size_t)N * 4), *dgh = rlk_test_dev_alloc(ctx, (size_t)(N * H) * 4),
       *dgw = rlk_test_dev_alloc(ctx, (size_t)(V * H) * 4), *dst = rlk_test_dev_upload(ctx, &zero, 4);
  rlk_linear_logprob_backward_args b;
  rlk_linear_logprob_backward_args_init(&b);
  b.hidden = rlk_tensor_2d(k.dh, RLK_BF16, N, H, H);
  b.weight = rlk_tensor_2d(k.dw, RLK_BF16, V, H, H);
  b.labels = rlk_tensor_1d(k.dl, RLK_I64, N);
  b.lse = rlk_test_block_row(d_out, RLK_F32, 1, N);
  b.grad_logp = rlk_tensor_1d(dglp, RLK_F32, N);
  b.grad_hidden = rlk_tensor_2d(dgh, RLK_F32, N, H, H);
  b.grad_weight = rlk_tensor_2d(dgw, RLK_F32, V, H, H);
  b.threshold = rlk_tensor_1d(k.dthr, RLK_F32, N);
  b.status = rlk_tensor_1d(dst, RLK_I32, 1);
  rlk_test_workspace(ctx, rlk_linear_logprob_backward_workspace_size(ctx, &b, &b.workspace_bytes),
                     &b.workspace_bytes, &b.workspace, &b.workspace_bytes);
  ck_assert_msg(rlk_linear_logprob_backward(ctx, &b, NULL) == RLK_OK, "%s", rlk_last_error());
  float *gh = malloc((size_t)(N * H) * 4), *gw = malloc((size_t)(V * H) * 4);
  int32_t status = 0;
  ks_down(ctx, gh, dgh, (size_t)(N * H) * 4);
  ks_down(ctx, gw, dgw, (size_t)(V * H) * 4);
  ks_down(ctx, &status, dst, 4);
  ck_assert_msg(status & RLK_LOGPROB_STATUS_BAD_LABEL, "status %d without the bad label's bit", (int)status);
  for (int64_t j = 0; j < H; j++) ck_assert_msg(isnan(gh[j]), "grad_hidden [0, %lld] = %g, not NaN", (long long)j,
                                                (double)gh[j]);
  for (int64_t i = H; i < N * H; i++)
    ck_assert_msg(isfinite(gh[i]), "grad_hidden [%lld, %lld] = %g", (long long)(i / H), (long long)(i % H),
                  (double)gh[i]);
  for (int64_t i = 0; i < V * H; i++)
    ck_assert_msg(isnan(gw[i]), "grad_weight [%lld, %lld] = %g, not NaN (a bad label's row is cut by its threshold)",
                  (long long)(i / H), (long long)(i % H), (double)gw[i]);
  printf("kept_set %s: a bad label under a threshold above its row, N %lld V %lld H %lld: NaN gradients\n",
         rlk_context_backend(ctx) == RLK_BACKEND_HOST ? "host" : "gpu", (long long)N, (long long)V, (long long)H);
  if (b.workspace) rlk_free(ctx, b.workspace);
  rlk_free(ctx, d_out), rlk_free(ctx, dglp), rlk_free(ctx, dgh), rlk_free(ctx, dgw), rlk_free(ctx, dst);
  free(f), free(glp), free(gh), free(gw);
  ks_head_free(ctx, &k);
}

static void cases_linear(rlk_context *ctx, uint64_t *rng) {
  if (rlk_context_backend(ctx) == RLK_BACKEND_HOST) {
    ks_linear_case(ctx, rng, 24, 700, 40, RLK_BF16, 0.9f, RLK_LINEAR_LOGPROB_AUTO);
    ks_linear_case(ctx, rng, 7, 301, 24, RLK_F16, 1.0f, RLK_LINEAR_LOGPROB_AUTO);
    ks_policy_case(ctx, rng, 30, 500, 32, RLK_LPL_RECOMPUTE);
    ks_bad_label_case(ctx, rng, 5, 70, 16);
    return;
  }
  ks_linear_case(ctx, rng, 130, 20000, 256, RLK_BF16, 0.9f, RLK_LINEAR_LOGPROB_AUTO);
  ks_linear_case(ctx, rng, 130, 20000, 256, RLK_BF16, 0.9f, RLK_LINEAR_LOGPROB_TILED);
  ks_linear_case(ctx, rng, 67, 5003, 136, RLK_F16, 1.1f, RLK_LINEAR_LOGPROB_AUTO);
  ks_policy_case(ctx, rng, 300, 4099, 256, RLK_LPL_RECOMPUTE);
  ks_bad_label_case(ctx, rng, 130, 1000, 256);
  rlk_device_info info;
  ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
  if (info.compute_major == 9 && info.compute_minor == 0)
    ks_policy_case(ctx, rng, 300, 4099, 256, RLK_LPL_TOKEN_CHUNKS);
  else
    printf("skip (kept_set token chunks): compute capability %d.%d is not sm_90\n", info.compute_major,
           info.compute_minor);
}

RLK_HOST_CASE(linear)
RLK_GPU_CASE("kept_set", linear)

/* ---------------------------------------------------------------------------------- */
/* Replaying the sampler's kept sets                                                   */
/* ---------------------------------------------------------------------------------- */

/* Rows sampled with top-k and top-p; their thresholds fed to rlk_logprob with the sampled tokens
 * give each token's log-prob over the kept set, which the sampler reports as logp_filtered from
 * its fixed-point masses: within the fold's bound (2 V + 64 u of s), ex2's 8 u and the masses'
 * truncation (at most 1 of 2^40 a term, V 2^-40 of the kept mass), and 16 u of the row's
 * magnitudes for the last operations. */
static void cases_replay(rlk_context *ctx, uint64_t *rng) {
  const int64_t B = 64, V = rlk_context_backend(ctx) == RLK_BACKEND_HOST ? 2000 : 151936;
  float *x = malloc((size_t)(B * V) * 4);
  for (int64_t i = 0; i < B * V; i++) x[i] = (float)(2.5 * rlk_test_rand_normal(rng));
  void *dx = rlk_test_dev_upload(ctx, x, (size_t)(B * V) * 4);
  void *tok = rlk_test_dev_alloc(ctx, (size_t)B * 8), *lpf = rlk_test_dev_alloc(ctx, (size_t)B * 4),
       *thr = rlk_test_dev_alloc(ctx, (size_t)B * 4);
  rlk_sample_args s;
  rlk_sample_args_init(&s);
  s.logits = rlk_tensor_2d(dx, RLK_F32, B, V, V);
  s.temperature = 0.9f;
  s.top_k = 200;
  s.top_p = 0.8f;
  s.seed = rlk_test_rand_u64(rng);
  s.tokens = rlk_tensor_1d(tok, RLK_I64, B);
  s.logp_filtered = rlk_tensor_1d(lpf, RLK_F32, B);
  s.threshold = rlk_tensor_1d(thr, RLK_F32, B);
  ck_assert_msg(rlk_sample(ctx, &s, NULL) == RLK_OK, "%s", rlk_last_error());
  float *out = malloc((size_t)B * 12), *want = malloc((size_t)B * 4);
  ks_down(ctx, want, lpf, (size_t)B * 4);
  ks_logprob(ctx, dx, RLK_F32, B, V, tok, thr, 0.9f, out);
  int64_t *t = malloc((size_t)B * 8);
  float *th = malloc((size_t)B * 4);
  ks_down(ctx, t, tok, (size_t)B * 8);
  ks_down(ctx, th, thr, (size_t)B * 4);
  for (int64_t i = 0; i < B; i++) {
    ck_assert_msg(x[i * V + t[i]] >= th[i], "row %lld: the sampled token is below its row's threshold", (long long)i);
    const double mag = fabs(out[i]) + fabs(out[B + i]) + fabs(th[i] / 0.9) + 1.0;
    const double tol = (2.0 * (double)V + 72.0) * KS_U + (double)V * 0x1p-40 + 16 * KS_U * mag;
    ck_assert_msg(fabs(out[i] - want[i]) <= tol, "row %lld: replayed logp %.8g, the sampler's logp_filtered %.8g, "
                  "bound %.3g", (long long)i, (double)out[i], (double)want[i], tol);
  }
  printf("kept_set %s: %lld sampled rows (top-k 200, top-p 0.8) replayed within bounds\n",
         rlk_context_backend(ctx) == RLK_BACKEND_HOST ? "host" : "gpu", (long long)B);
  rlk_free(ctx, dx), rlk_free(ctx, tok), rlk_free(ctx, lpf), rlk_free(ctx, thr);
  free(x), free(out), free(want), free(t), free(th);
}

RLK_HOST_CASE(replay)
RLK_GPU_CASE("kept_set", replay)

START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  float thr[4] = {0}, x[8] = {0}, lp[4];
  int64_t lab[4] = {0};
  rlk_logprob_args a;
  rlk_logprob_args_init(&a);
  a.logits = rlk_tensor_2d(x, RLK_F32, 4, 2, 2);
  a.labels = rlk_tensor_1d(lab, RLK_I64, 4);
  a.logp = rlk_tensor_1d(lp, RLK_F32, 4);
  a.threshold = rlk_tensor_1d(thr, RLK_F32, 3);
  rlk_test_expect_error(rlk_logprob(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT, "threshold", "rlk_logprob");
  a.threshold = rlk_tensor_1d(thr, RLK_I32, 4);
  ck_assert_int_eq(rlk_logprob(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT);
  /* no shard form */
  float rec[16];
  a.threshold = rlk_tensor_1d(thr, RLK_F32, 4);
  a.logp.data = NULL;
  a.partials = rlk_tensor_2d(rec, RLK_F32, 4, 4, 4);
  rlk_test_expect_error(rlk_logprob(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT, "threshold", "rlk_logprob");
  rlk_context_destroy(ctx);
}
END_TEST

Suite *kept_set_suite(void) {
  Suite *s = suite_create("kept_set");
  rlk_test_add_case(s, "host", 300, TESTS(host_logprob, host_linear, host_replay, bad_arguments));
  rlk_test_add_case(s, "gpu", 900, TESTS(gpu_logprob, gpu_linear, gpu_replay));
  return s;
}

/* test_token_kl.c - rlk_token_kl against the fp64 reference (tests/ref/) on the host backend
 * and, with RLK_TEST_GPU=1, on CUDA: every estimator, gradient form, mask kind, dtype and
 * output set; [B, T] rows with padding and 1-D calls; log-ratios across the clamps and exactly
 * on them under each bound convention; NaN where masked; argument validation; the precompile
 * plan and the combinations it refuses; the samples compiled for every target. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "ref/token_kl_ref.h"
#include "suites.h"
#include "test_util.h"

enum { OUT_KL = 0, OUT_GRAD = 1, OUT_BOTH = 2 };

typedef struct tk_case {
  int64_t B, T;          /* B == 0: a 1-D [T] call */
  int64_t pad;           /* extra elements after each row */
  rlk_dtype dtype;       /* RLK_F32 / RLK_F64 */
  rlk_dtype mask_dtype;  /* RLK_DTYPE_INVALID: no mask */
  int estimator, st, old, gin, out;
  double in_lo, in_hi, out_lo, out_hi, w_max, bg;
} tk_case;

static void describe(const tk_case *c, char *buf, size_t size) {
  snprintf(buf, size,
           "B=%lld T=%lld pad=%lld dtype=%s mask=%s est=%d st=%d old=%d gin=%d out=%d in=[%g, %g] "
           "out=[%g, %g] w_max=%g bg=%g seed=%llu",
           (long long)c->B, (long long)c->T, (long long)c->pad, rlk_dtype_name(c->dtype),
           c->mask_dtype ? rlk_dtype_name(c->mask_dtype) : "none", c->estimator, c->st, c->old, c->gin,
           c->out, c->in_lo, c->in_hi, c->out_lo, c->out_hi, c->w_max, c->bg,
           (unsigned long long)rlk_test_seed());
}

static tk_case base_case(int64_t B, int64_t T) {
  return (tk_case){.B = B, .T = T, .pad = 3, .dtype = RLK_F32, .mask_dtype = RLK_BOOL, .estimator = RLK_KL_K3,
      .out = OUT_BOTH, .in_lo = -20, .in_hi = 20, .out_lo = -10, .out_hi = 10, .w_max = INFINITY, .bg = 1};
}

/* A finite clamp bound, or 0 when both are infinite (no tie to plant). */
static double some_bound(const tk_case *c, uint64_t *rng) {
  const int hi = rlk_test_rand_uniform(rng) < 0.5;
  if (hi && isfinite(c->in_hi)) return c->in_hi;
  if (isfinite(c->in_lo)) return c->in_lo;
  return isfinite(c->in_hi) ? c->in_hi : NAN;
}

/* Runs one call with fresh inputs and poisoned outputs, checks it against the reference, and
 * copies the outputs (dense) to kl_out / g_out when given. */
static void run_case(rlk_context *ctx, const tk_case *c, uint64_t *rng, double *kl_out, double *g_out) {
  char what[512];
  describe(c, what, sizeof what);
  const int one_d = c->B == 0;
  const int64_t B = one_d ? 1 : c->B, T = c->T, S = one_d ? T : T + c->pad, n = B * T;
  double *lp = malloc((size_t)n * sizeof *lp), *rf = malloc((size_t)n * sizeof *rf),
         *od = malloc((size_t)n * sizeof *od), *gi = malloc((size_t)n * sizeof *gi),
         *mw = malloc((size_t)n * sizeof *mw);
  for (int64_t i = 0; i < n; i++) {
    /* log-ratios mostly near 0, some across every clamp; some exactly on an input bound */
    const double u = rlk_test_rand_uniform(rng);
    const double e = u < 0.6 ? 0.5 * rlk_test_rand_normal(rng) : -25.0 + 50.0 * rlk_test_rand_uniform(rng);
    lp[i] = -6.0 * rlk_test_rand_uniform(rng);
    rf[i] = lp[i] - e;
    const double bound = some_bound(c, rng);
    if (i % 11 == 5 && isfinite(bound)) { /* exact in both dtypes: lp a multiple of 1/4 */
      lp[i] = -0.25 * (double)(rlk_test_rand_u64(rng) % 20);
      rf[i] = lp[i] - bound;
    }
    od[i] = lp[i] + 1.5 * rlk_test_rand_normal(rng); /* w = exp(logp - old) often above 10 */
    gi[i] = rlk_test_rand_normal(rng);
    mw[i] = 1.0;
    if (c->mask_dtype != RLK_DTYPE_INVALID && rlk_test_rand_uniform(rng) < 0.15) {
      mw[i] = 0.0;
      lp[i] = rf[i] = od[i] = gi[i] = NAN; /* never read into an output */
    } else if (c->mask_dtype == RLK_F32) {
      mw[i] = 0.25 + 1.5 * rlk_test_rand_uniform(rng);
    } else if (c->mask_dtype == RLK_I32) {
      mw[i] = rlk_test_rand_uniform(rng) < 0.8 ? 1.0 : 3.0;
    }
  }
  const rlk_dtype d = c->dtype;
  void *lpd = rlk_test_upload_rows(ctx, d, B, T, S, NAN, lp);
  void *rfd = rlk_test_upload_rows(ctx, d, B, T, S, NAN, rf);
  void *odd = c->old ? rlk_test_upload_rows(ctx, d, B, T, S, NAN, od) : NULL;
  void *gid = c->gin ? rlk_test_upload_rows(ctx, d, B, T, S, NAN, gi) : NULL;
  void *mdd = c->mask_dtype ? rlk_test_upload_rows(ctx, c->mask_dtype, B, T, S, 7, mw) : NULL;
  const size_t es = rlk_dtype_size(d), out_bytes = (size_t)((B - 1) * S + T) * es;
  void *kld = c->out != OUT_GRAD ? rlk_test_dev_alloc(ctx, out_bytes) : NULL;
  void *gd = c->out != OUT_KL ? rlk_test_dev_alloc(ctx, out_bytes) : NULL;
  if (kld) ck_assert_int_eq(rlk_memset(ctx, kld, 0xff, out_bytes), RLK_OK);
  if (gd) ck_assert_int_eq(rlk_memset(ctx, gd, 0xff, out_bytes), RLK_OK);

  rlk_token_kl_args a;
  rlk_token_kl_args_init(&a);
#define TK_T(p, dt) (one_d ? rlk_tensor_1d(p, dt, T) : rlk_tensor_2d(p, dt, B, T, S))
  a.logp = TK_T(lpd, d);
  a.ref_logp = TK_T(rfd, d);
  if (odd) a.old_logp = TK_T(odd, d);
  if (gid) a.grad_kl = TK_T(gid, d);
  if (mdd) a.mask = TK_T(mdd, c->mask_dtype);
  if (kld) a.kl = TK_T(kld, d);
  if (gd) a.grad_logp = TK_T(gd, d);
#undef TK_T
  a.estimator = (rlk_kl_estimator)c->estimator;
  a.input_min = c->in_lo;
  a.input_max = c->in_hi;
  a.output_min = c->out_lo;
  a.output_max = c->out_hi;
  a.straight_through = c->st;
  a.is_weight_max = c->w_max;
  a.clamp_bound_grad = c->bg;
  rlk_test_expect_call_done(ctx, rlk_token_kl(ctx, &a, NULL), what);
  unsigned char *klh = malloc(out_bytes), *gh = malloc(out_bytes);
  if (kld) ck_assert_int_eq(rlk_memcpy_to_host(ctx, klh, kld, out_bytes), RLK_OK);
  if (gd) ck_assert_int_eq(rlk_memcpy_to_host(ctx, gh, gd, out_bytes), RLK_OK);

  const tk_ref_settings rs = {c->estimator, c->in_lo, c->in_hi, c->out_lo, c->out_hi, c->st, c->w_max, c->bg};
  const double u = d == RLK_F64 ? DBL_EPSILON : FLT_EPSILON;
  int ties = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      const int64_t i = b * T + t, at = b * S + t;
      const double got_v = kld ? rlk_test_load(klh, d, at) : 0.0, got_g = gd ? rlk_test_load(gh, d, at) : 0.0;
      if (mw[i] == 0.0) {
        ck_assert_msg(got_v == 0.0 && got_g == 0.0, "%s: [%lld, %lld] masked: kl %g, grad %g, expected 0", what,
                      (long long)b, (long long)t, got_v, got_g);
        continue;
      }
      /* e as the dtype forms it (a rounded subtraction), so ties and gates are the kernel's */
      const double e = d == RLK_F64 ? lp[i] - rf[i] : (double)((float)lp[i] - (float)rf[i]);
      const double w = c->st && c->old ? fmin(exp(lp[i] - od[i]), c->w_max) : 1.0;
      double dref;
      const double v = tk_ref_token(&rs, e, w, &dref) * mw[i];
      const double g = dref * (c->gin ? gi[i] : 1.0) * mw[i];
      ties += e == c->in_lo || e == c->in_hi;
      /* a few roundings of the terms: e's, exp's, the products */
      const double ec = fmin(fmax(e, c->in_lo), c->in_hi);
      const double size = 1.0 + fabs(e) + (c->estimator == RLK_KL_K3 ? exp(fmin(-ec, 700.0)) : 0.0);
      const double scale = size * (1.0 + fabs(lp[i]) + fabs(rf[i])) * fabs(mw[i]);
      if (kld)
        ck_assert_msg(fabs(got_v - v) <= 64 * u * scale, "%s: kl[%lld, %lld] = %.17g, reference %.17g (e %.17g)", what,
                      (long long)b, (long long)t, got_v, v, e);
      /* the value's own rounding may move it across an output bound: the gradient's gate there is
       * the kernel's business */
      double fv;
      tk_ref_settings free_out = rs;
      free_out.out_lo = -INFINITY;
      free_out.out_hi = INFINITY;
      double unused;
      fv = tk_ref_token(&free_out, e, w, &unused);
      const int near_out = fabs(fv - c->out_lo) <= 1e-4 * (1 + fabs(c->out_lo)) ||
                           fabs(fv - c->out_hi) <= 1e-4 * (1 + fabs(c->out_hi));
      if (gd && !near_out) {
        const double gs = scale * w * (c->gin ? fabs(gi[i]) : 1.0);
        ck_assert_msg(fabs(got_g - g) <= 64 * u * gs, "%s: grad_logp[%lld, %lld] = %.17g, reference %.17g (e %.17g)",
                      what, (long long)b, (long long)t, got_g, g, e);
      }
    }
  /* padding between rows untouched */
  for (int64_t b = 0; b + 1 < B; b++)
    for (int64_t t = T; t < S; t++)
      for (size_t q = 0; q < es; q++) {
        if (kld) ck_assert_msg(klh[(size_t)(b * S + t) * es + q] == 0xff, "%s: kl padding written", what);
        if (gd) ck_assert_msg(gh[(size_t)(b * S + t) * es + q] == 0xff, "%s: grad padding written", what);
      }
  if (n > 200 && (isfinite(c->in_lo) || isfinite(c->in_hi)))
    ck_assert_msg(ties > 0, "%s: test setup: no log-ratio on a clamp bound", what);
  for (int64_t i = 0; i < n; i++) {
    const int64_t at = (i / T) * S + i % T;
    if (kl_out) kl_out[i] = kld ? rlk_test_load(klh, d, at) : 0.0;
    if (g_out) g_out[i] = gd ? rlk_test_load(gh, d, at) : 0.0;
  }
  rlk_free(ctx, lpd);
  rlk_free(ctx, rfd);
  rlk_free(ctx, odd);
  rlk_free(ctx, gid);
  rlk_free(ctx, mdd);
  rlk_free(ctx, kld);
  rlk_free(ctx, gd);
  free(lp);
  free(rf);
  free(od);
  free(gi);
  free(mw);
  free(klh);
  free(gh);
}

/* ---------------------------------------------------------------------------------- */
/* Case sets, run on the host and on CUDA                                              */
/* ---------------------------------------------------------------------------------- */

/* Every estimator x gradient form x output set, with each mask kind and dtype in turn, under
 * verl's and OpenRLHF's clamps and with none. */
static void cases_variants(rlk_context *ctx, uint64_t *rng) {
  static const rlk_dtype masks[] = {RLK_DTYPE_INVALID, RLK_BOOL, RLK_I32, RLK_F32};
  static const double clamps[][4] = {
      {-20, 20, -10, 10},                       /* verl low_var_kl */
      {-10, INFINITY, -10, 10},                 /* OpenRLHF k3 */
      {-INFINITY, INFINITY, -INFINITY, INFINITY} /* none (verl k1, abs, k2) */
  };
  int k = 0;
  for (int est = 0; est < 4; est++)
    for (int form = 0; form < 4; form++) /* pathwise, straight-through, + old_logp, + both and grad_kl */
      for (int out = 0; out < 3; out++) {
        if (form > 0 && out == OUT_KL) continue;
        tk_case c = base_case(5, 67);
        c.estimator = est;
        c.st = form > 0;
        c.old = form >= 2;
        c.gin = (form == 3 || (out == OUT_GRAD && form == 0)) && out != OUT_KL;
        c.out = out;
        c.dtype = k % 2 ? RLK_F64 : RLK_F32;
        c.mask_dtype = masks[k % 4];
        const double *cl = clamps[k % 3];
        c.in_lo = cl[0], c.in_hi = cl[1], c.out_lo = cl[2], c.out_hi = cl[3];
        c.w_max = form == 2 ? 10.0 : INFINITY;
        c.bg = (k % 5) * 0.25;
        run_case(ctx, &c, rng, NULL, NULL);
        k++;
      }
}

/* Odd sizes: one token, one row, a long row, 1-D calls, rows with no padding. */
static void cases_shapes(rlk_context *ctx, uint64_t *rng) {
  static const int64_t shapes[][3] = {{1, 1, 0}, {1, 300, 5}, {3, 1, 1}, {0, 1, 0},
                                      {0, 4099, 0}, {17, 257, 0}, {2, 5000, 31}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    tk_case c = base_case(shapes[i][0], shapes[i][1]);
    c.pad = shapes[i][2];
    c.dtype = i % 2 ? RLK_F64 : RLK_F32;
    c.estimator = (int)(i % 4);
    c.st = i % 3 == 2;
    c.old = c.st;
    c.gin = i % 2;
    run_case(ctx, &c, rng, NULL, NULL);
  }
}

/* The bound conventions on exact ties: 1 passes, 0 stops, 0.5 splits the gradient; the tie
 * counts of every case are checked in run_case. */
static void cases_ties(rlk_context *ctx, uint64_t *rng) {
  for (int i = 0; i < 6; i++) {
    tk_case c = base_case(4, 120);
    c.estimator = i % 2 ? RLK_KL_K1 : RLK_KL_K3;
    c.bg = (double)(i / 2) * 0.5;
    c.in_lo = -3.0, c.in_hi = 2.0;
    c.mask_dtype = RLK_DTYPE_INVALID;
    c.dtype = i < 3 ? RLK_F32 : RLK_F64;
    run_case(ctx, &c, rng, NULL, NULL);
  }
}

/* The same call twice gives the same bits; the value and the gradient written alone equal
 * those written together. */
static void cases_deterministic(rlk_context *ctx, uint64_t *rng) {
  tk_case c = base_case(9, 311);
  c.gin = 1;
  c.mask_dtype = RLK_F32;
  const int64_t n = c.B * c.T;
  double *k1 = malloc((size_t)n * sizeof *k1), *g1 = malloc((size_t)n * sizeof *g1),
         *k2 = malloc((size_t)n * sizeof *k2), *g2 = malloc((size_t)n * sizeof *g2);
  const uint64_t start = *rng;
  run_case(ctx, &c, rng, k1, g1);
  *rng = start;
  run_case(ctx, &c, rng, k2, g2);
  ck_assert(memcmp(k1, k2, (size_t)n * sizeof *k1) == 0 && memcmp(g1, g2, (size_t)n * sizeof *g1) == 0);
  *rng = start;
  c.out = OUT_KL;
  c.gin = 0;
  run_case(ctx, &c, rng, k2, NULL);
  ck_assert(memcmp(k1, k2, (size_t)n * sizeof *k1) == 0);
  *rng = start;
  c.out = OUT_GRAD;
  c.gin = 1;
  run_case(ctx, &c, rng, NULL, g2);
  ck_assert(memcmp(g1, g2, (size_t)n * sizeof *g1) == 0);
  free(k1);
  free(g1);
  free(k2);
  free(g2);
}

/* Log-ratios of +-inf and NaN (a reference log-prob of -inf, a NaN log-prob): value and gradient
 * exactly the reference's, torch's autograd of the same formula and clamps, under each bound
 * convention. An infinite bound is no clamp: it passes +-inf, and NaN where neither side clamps
 * (k1's gradient 1, k3's 1 at +inf, -inf at -inf, NaN at NaN). */
static void cases_nonfinite(rlk_context *ctx, uint64_t *rng) {
  (void)rng;
  static const double bounds[][4] = {
      {-20, 20, -10, 10},                        /* verl k3 */
      {-10, INFINITY, -10, 10},                  /* OpenRLHF k3 */
      {-INFINITY, INFINITY, -INFINITY, INFINITY} /* none */
  };
  static const double bgs[] = {1.0, 0.5, 0.0};
  double lp[] = {0.0, 0.0, NAN, -1.0}, rf[] = {-INFINITY, INFINITY, 0.0, NAN};
  const int64_t T = 4;
  for (int dt = 0; dt < 2; dt++)
    for (int est = 0; est < 4; est++)
      for (size_t bi = 0; bi < 3; bi++)
        for (size_t gi = 0; gi < 3; gi++) {
          const rlk_dtype d = dt ? RLK_F32 : RLK_F64;
          const double *bd = bounds[bi];
          void *lpd = rlk_test_upload_rows(ctx, d, 1, T, T, 0, lp), *rfd = rlk_test_upload_rows(ctx, d, 1, T, T, 0, rf);
          const size_t bytes = (size_t)T * rlk_dtype_size(d);
          void *kld = rlk_test_dev_alloc(ctx, bytes), *gd = rlk_test_dev_alloc(ctx, bytes);
          rlk_token_kl_args a;
          rlk_token_kl_args_init(&a);
          a.logp = rlk_tensor_1d(lpd, d, T);
          a.ref_logp = rlk_tensor_1d(rfd, d, T);
          a.kl = rlk_tensor_1d(kld, d, T);
          a.grad_logp = rlk_tensor_1d(gd, d, T);
          a.estimator = (rlk_kl_estimator)est;
          a.input_min = bd[0];
          a.input_max = bd[1];
          a.output_min = bd[2];
          a.output_max = bd[3];
          a.clamp_bound_grad = bgs[gi];
          char what[256];
          snprintf(what, sizeof what, "token_kl non-finite dtype=%s est=%d in=[%g, %g] out=[%g, %g] bg=%g",
                   rlk_dtype_name(d), est, bd[0], bd[1], bd[2], bd[3], bgs[gi]);
          rlk_test_expect_call_done(ctx, rlk_token_kl(ctx, &a, NULL), what);
          unsigned char kh[4 * sizeof(double)], gh[4 * sizeof(double)];
          ck_assert_int_eq(rlk_memcpy_to_host(ctx, kh, kld, bytes), RLK_OK);
          ck_assert_int_eq(rlk_memcpy_to_host(ctx, gh, gd, bytes), RLK_OK);
          const tk_ref_settings rs = {est, bd[0], bd[1], bd[2], bd[3], 0, INFINITY, bgs[gi]};
          for (int64_t t = 0; t < T; t++) {
            double g;
            const double v = tk_ref_token(&rs, lp[t] - rf[t], 1.0, &g);
            const double gv = rlk_test_load(kh, d, t), gg = rlk_test_load(gh, d, t);
            ck_assert_msg((isnan(v) && isnan(gv)) || v == gv, "%s: kl at e = %g is %g, reference %g", what,
                          lp[t] - rf[t], gv, v);
            ck_assert_msg((isnan(g) && isnan(gg)) || g == gg, "%s: grad at e = %g is %g, reference %g", what,
                          lp[t] - rf[t], gg, g);
          }
          rlk_free(ctx, lpd);
          rlk_free(ctx, rfd);
          rlk_free(ctx, kld);
          rlk_free(ctx, gd);
        }
}

RLK_HOST_CASE(variants)
RLK_HOST_CASE(shapes)
RLK_HOST_CASE(ties)
RLK_HOST_CASE(deterministic)
RLK_HOST_CASE(nonfinite)

START_TEST(args_init_defaults) {
  rlk_token_kl_args a;
  memset(&a, 0x5a, sizeof a);
  rlk_token_kl_args_init(&a);
  ck_assert_int_eq(a.estimator, RLK_KL_K3);
  ck_assert(a.input_min == -20 && a.input_max == 20 && a.output_min == -10 && a.output_max == 10);
  ck_assert(isinf(a.is_weight_max) && a.is_weight_max > 0);
  ck_assert(a.clamp_bound_grad == 1.0);
  ck_assert_int_eq(a.straight_through, 0);
  ck_assert_ptr_null(a.logp.data);
  ck_assert_ptr_null(a.old_logp.data);
  ck_assert_ptr_null(a.kl.data);
  ck_assert_ptr_null(a.grad_logp.data);
  rlk_token_kl_args_init(NULL);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Argument errors                                                                     */
/* ---------------------------------------------------------------------------------- */

static void expect_bad(rlk_context *ctx, const rlk_token_kl_args *a, const char *needle) {
  rlk_test_expect_error(rlk_token_kl(ctx, a, NULL), RLK_ERR_INVALID_ARGUMENT, needle, needle);
}

START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  enum { B = 3, T = 4 };
  static float lp[B * T], rf[B * T], od[B * T], kl[B * T], g[B * T], gi[B * T];
  static double d64[B * T];
  static uint8_t m[B * T];
  for (int i = 0; i < B * T; i++) lp[i] = -1.0f, rf[i] = -1.5f, od[i] = -1.2f, gi[i] = 1.0f, m[i] = 1, d64[i] = 0;
  rlk_token_kl_args good;
  rlk_token_kl_args_init(&good);
  good.logp = rlk_tensor_2d(lp, RLK_F32, B, T, T);
  good.ref_logp = rlk_tensor_2d(rf, RLK_F32, B, T, T);
  good.mask = rlk_tensor_2d(m, RLK_BOOL, B, T, T);
  good.kl = rlk_tensor_2d(kl, RLK_F32, B, T, T);
  good.grad_logp = rlk_tensor_2d(g, RLK_F32, B, T, T);
  ck_assert_int_eq(rlk_token_kl(ctx, &good, NULL), RLK_OK);
  ck_assert_int_eq(rlk_token_kl(NULL, &good, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_token_kl(ctx, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);

  rlk_token_kl_args a;
  a = good, a.logp.data = NULL;
  expect_bad(ctx, &a, "logp");
  a = good, a.logp.dtype = RLK_BF16;
  expect_bad(ctx, &a, "logp");
  a = good, a.ref_logp = rlk_tensor_2d(d64, RLK_F64, B, T, T);
  expect_bad(ctx, &a, "ref_logp");
  a = good, a.ref_logp.data = NULL;
  expect_bad(ctx, &a, "ref_logp");
  a = good, a.ref_logp.shape[1] = T - 1;
  expect_bad(ctx, &a, "ref_logp");
  a = good, a.ref_logp = rlk_tensor_1d(rf, RLK_F32, B * T);
  expect_bad(ctx, &a, "ref_logp");
  a = good, a.mask.dtype = RLK_F64;
  expect_bad(ctx, &a, "mask");
  a = good, a.mask.strides[1] = 2;
  expect_bad(ctx, &a, "mask");
  a = good, a.kl.strides[0] = T - 1;
  expect_bad(ctx, &a, "kl");
  a = good, a.kl.data = NULL, a.grad_logp.data = NULL;
  expect_bad(ctx, &a, "write nothing");
  a = good, a.kl.data = lp;
  expect_bad(ctx, &a, "overlaps logp");
  a = good, a.grad_logp.data = kl;
  expect_bad(ctx, &a, "overlaps");
  a = good, a.grad_logp.data = m;
  expect_bad(ctx, &a, "overlaps mask");
  a = good, a.estimator = (rlk_kl_estimator)4;
  expect_bad(ctx, &a, "estimator");
  a = good, a.input_min = 1, a.input_max = -1;
  expect_bad(ctx, &a, "input_min");
  a = good, a.output_max = NAN;
  expect_bad(ctx, &a, "output_min");
  a = good, a.straight_through = 2;
  expect_bad(ctx, &a, "straight_through");
  a = good, a.is_weight_max = 0;
  expect_bad(ctx, &a, "is_weight_max");
  a = good, a.clamp_bound_grad = 1.5;
  expect_bad(ctx, &a, "clamp_bound_grad");
  a = good, a.old_logp = rlk_tensor_2d(od, RLK_F32, B, T, T);
  expect_bad(ctx, &a, "old_logp"); /* without straight_through it would be ignored */
  a = good, a.grad_logp.data = NULL, a.grad_kl = rlk_tensor_2d(gi, RLK_F32, B, T, T);
  expect_bad(ctx, &a, "grad_kl");
  a = good, a.grad_logp.data = NULL, a.straight_through = 1;
  expect_bad(ctx, &a, "straight_through");
  /* 1-D calls: every tensor [N] and contiguous */
  a = good;
  a.logp = rlk_tensor_1d(lp, RLK_F32, B * T);
  a.ref_logp = rlk_tensor_1d(rf, RLK_F32, B * T);
  a.mask = rlk_tensor_1d(m, RLK_BOOL, B * T);
  a.kl = rlk_tensor_1d(kl, RLK_F32, B * T);
  a.grad_logp = rlk_tensor_1d(g, RLK_F32, B * T);
  ck_assert_int_eq(rlk_token_kl(ctx, &a, NULL), RLK_OK);
  rlk_token_kl_args b = a;
  b.kl.strides[0] = 2, b.kl.shape[0] = B * T / 2;
  expect_bad(ctx, &b, "kl");
  b = a, b.mask = rlk_tensor_2d(m, RLK_BOOL, B, T, T);
  expect_bad(ctx, &b, "mask");
  /* straight-through with an importance weight passes */
  a = good, a.straight_through = 1, a.old_logp = rlk_tensor_2d(od, RLK_F32, B, T, T), a.is_weight_max = 10;
  ck_assert_int_eq(rlk_token_kl(ctx, &a, NULL), RLK_OK);
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

/* Precompiling a configuration builds exactly what the matching call looks up. */
START_TEST(plan_matches_call) {
  static const struct {
    const char *line;
    int estimator, st, old, gin, out;
    rlk_dtype dtype, mask;
  } rows[] = {
      {"token_kl", RLK_KL_K3, 0, 0, 0, OUT_KL, RLK_F32, RLK_DTYPE_INVALID},
      {"token_kl dtype=f64 estimator=k2 mask=i32 outputs=both straight_through=1 old_logp=1 grad_kl=1",
       RLK_KL_K2, 1, 1, 1, OUT_BOTH, RLK_F64, RLK_I32},
      {"token_kl estimator=abs mask=bool outputs=grad", RLK_KL_ABS, 0, 0, 0, OUT_GRAD, RLK_F32, RLK_BOOL},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    rlk_context *ctx = rlk_test_precompiled_host_context(rows[i].line, 1);
    tk_case c = base_case(4, 33);
    c.estimator = rows[i].estimator;
    c.st = rows[i].st;
    c.old = rows[i].old;
    c.gin = rows[i].gin;
    c.out = rows[i].out;
    c.dtype = rows[i].dtype;
    c.mask_dtype = rows[i].mask;
    uint64_t rng = rlk_test_seed() + i;
    run_case(ctx, &c, &rng, NULL, NULL);
    rlk_test_expect_compiled_none(ctx, 1, rows[i].line);
  }
}
END_TEST

/* The combinations a call refuses are refused by a precompile line too (tests/test_ops.c checks
 * the settings' own values for every op). */
START_TEST(plan_rejects_bad_settings) {
  static const char *const bad[][2] = {
      {"token_kl old_logp=1 outputs=grad", "old_logp"},
      {"token_kl grad_kl=1", "grad_kl"},
      {"token_kl straight_through=1", "straight_through"},
  };
  rlk_test_expect_bad_lines(bad, sizeof bad / sizeof bad[0]);
}
END_TEST

RLK_SAMPLES_CASE("token_kl", &rlk_op_token_kl)

/* ---------------------------------------------------------------------------------- */
/* CUDA (RLK_TEST_GPU=1)                                                               */
/* ---------------------------------------------------------------------------------- */

RLK_GPU_CASE("token_kl", variants)
RLK_GPU_CASE("token_kl", shapes)
RLK_GPU_CASE("token_kl", ties)
RLK_GPU_CASE("token_kl", deterministic)
RLK_GPU_CASE("token_kl", nonfinite)

/* A training-sized batch beyond one grid row of blocks. */
static void cases_large(rlk_context *ctx, uint64_t *rng) {
  tk_case c = base_case(512, 4097);
  run_case(ctx, &c, rng, NULL, NULL);
  c = base_case(0, 1 << 21);
  c.out = OUT_KL;
  run_case(ctx, &c, rng, NULL, NULL);
}

RLK_GPU_CASE("token_kl", large)

Suite *token_kl_suite(void) {
  Suite *s = suite_create("token_kl");
  rlk_test_add_case(s, "host", 300, TESTS(args_init_defaults, host_variants, host_shapes, host_ties, host_nonfinite,
      host_deterministic, bad_arguments));

  rlk_test_add_case(s, "plan", 300, TESTS(plan_matches_call, plan_rejects_bad_settings,
      samples_compile_every_target));

  rlk_test_add_case(s, "gpu", 300, TESTS(gpu_variants, gpu_shapes, gpu_ties, gpu_nonfinite, gpu_deterministic, gpu_large));
  return s;
}

/* test_advantage_scan.c - rlk_gae, rlk_discounted_returns, rlk_reverse_cumsum and
 * rlk_masked_whiten against the fp64 trainer references (tests/ref/advantage_scan_ref.c) on the
 * host backend and, with RLK_TEST_GPU=1, on CUDA: every op x masked-position semantics x algorithm
 * on odd shapes, multi-turn masks with holes, all-masked and single-token rows, every mask dtype,
 * strided rows, NaN in masked inputs, bitwise repeatability; argument validation; the precompile
 * plans; the sample configurations compiled for every target whose compiler is present. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops/ops.h"
#include "ref/advantage_scan_ref.h"
#include "suites.h"
#include "test_util.h"

/* Rounding-error budget of the scans in units of the dtype's epsilon, applied to the running sum
 * of the magnitudes each output is built from (see *_bound below): K sequential steps per
 * thread, two levels of log2 suffix scans, a few ulps per composed map. */
#define SCAN_ULPS 160.0

/* ---------------------------------------------------------------------------------- */
/* Data                                                                                */
/* ---------------------------------------------------------------------------------- */

typedef struct seq_case {
  int64_t B, T;
  rlk_dtype dtype;      /* values and outputs: RLK_F32 / RLK_F64 */
  rlk_dtype mask_dtype; /* RLK_DTYPE_INVALID: no mask */
  int64_t pad;          /* extra elements after each row of every [B, T] tensor */
  rlk_scan_algo algo;
  int holes;            /* masked spans inside responses (multi-turn tool outputs) */
  int odd_mask;         /* valid mask values other than 1 (i32 7, f32 0.5, -2, NaN), f32 -0.0 */
  int nan_masked;       /* masked inputs are NaN instead of finite garbage */
} seq_case;

static seq_case base_case(int64_t B, int64_t T, rlk_dtype dtype) {
  return (seq_case){.B = B, .T = T, .dtype = dtype, .mask_dtype = RLK_BOOL, .algo = RLK_SCAN_AUTO,
      .holes = 1};
}

static const char *algo_name(rlk_scan_algo a) {
  return a == RLK_SCAN_ROW_WARP ? "warp" : (a == RLK_SCAN_ROW_BLOCK ? "block" : "auto");
}

static void describe(const seq_case *c, const char *op, char *buf, size_t size) {
  snprintf(buf, size, "%s B=%lld T=%lld %s mask=%s pad=%lld algo=%s holes=%d odd_mask=%d nan=%d seed=%llu",
           op, (long long)c->B, (long long)c->T, rlk_dtype_name(c->dtype),
           c->mask_dtype ? rlk_dtype_name(c->mask_dtype) : "none", (long long)c->pad,
           algo_name(c->algo), c->holes, c->odd_mask, c->nan_masked,
           (unsigned long long)rlk_test_seed());
}

static double round_to(rlk_dtype d, double x) { return d == RLK_F32 ? (double)(float)x : x; }

static double eps_of(rlk_dtype d) { return d == RLK_F32 ? FLT_EPSILON : DBL_EPSILON; }

/* An absolute floor for scan tolerances: decayed terms (powers of gamma * lambda over long masked
 * or valid spans) fall below the dtype's normal range, where rounding is absolute. */
static double tiny_of(rlk_dtype d) { return 64.0 * (d == RLK_F32 ? FLT_MIN : DBL_MIN); }

/* A response mask per row: a span of random length (none, one token, the whole row, or any),
 * sometimes not at the row's start, with masked holes inside when asked. */
static void gen_mask(uint64_t *rng, int64_t B, int64_t T, int holes, double *m) {
  for (int64_t b = 0; b < B; b++) {
    const double u = rlk_test_rand_uniform(rng);
    int64_t L;
    if (u < 0.08)
      L = 0;
    else if (u < 0.16)
      L = 1;
    else if (u < 0.3)
      L = T;
    else
      L = 1 + (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)T);
    int64_t s = 0;
    if (L < T && rlk_test_rand_uniform(rng) < 0.2) s = (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)(T - L + 1));
    for (int64_t t = 0; t < T; t++) m[b * T + t] = (t >= s && t < s + L) ? 1.0 : 0.0;
    if (holes && L > 3) {
      const int k = 1 + (int)(rlk_test_rand_u64(rng) % 3);
      for (int h = 0; h < k; h++) {
        const int64_t hs = s + 1 + (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)(L - 2));
        const int64_t hl = 1 + (int64_t)(rlk_test_rand_u64(rng) % 8);
        for (int64_t t = hs; t < hs + hl && t < s + L - 1; t++) m[b * T + t] = 0.0;
      }
    }
  }
}

/* Inputs as the op sees them (rounded to the dtype); masked entries hold garbage or NaN. */
typedef struct seq_data {
  int64_t B, T;
  double *r, *v, *m, *base;
} seq_data;

static void gen_data(uint64_t *rng, const seq_case *c, seq_data *d) {
  const int64_t n = c->B * c->T;
  d->B = c->B;
  d->T = c->T;
  d->r = malloc((size_t)n * sizeof *d->r);
  d->v = malloc((size_t)n * sizeof *d->v);
  d->m = malloc((size_t)n * sizeof *d->m);
  d->base = malloc((size_t)c->B * sizeof *d->base);
  if (c->mask_dtype == RLK_DTYPE_INVALID) {
    for (int64_t i = 0; i < n; i++) d->m[i] = 1.0;
  } else {
    gen_mask(rng, c->B, c->T, c->holes, d->m);
  }
  for (int64_t i = 0; i < n; i++) {
    /* the same draws either way, so a NaN twin of a case differs only where masked */
    const double a = rlk_test_rand_normal(rng), b = rlk_test_rand_normal(rng);
    if (d->m[i] != 0.0) {
      d->r[i] = round_to(c->dtype, 0.3 + a);
      d->v[i] = round_to(c->dtype, 0.5 + 1.5 * b);
    } else if (c->nan_masked) {
      d->r[i] = NAN;
      d->v[i] = NAN;
    } else {
      d->r[i] = round_to(c->dtype, 2.0 + 3.0 * a);
      d->v[i] = round_to(c->dtype, -1.0 + 3.0 * b);
    }
  }
  for (int64_t b = 0; b < c->B; b++) d->base[b] = round_to(c->dtype, rlk_test_rand_normal(rng));
}

static void free_data(seq_data *d) {
  free(d->r);
  free(d->v);
  free(d->m);
  free(d->base);
  memset(d, 0, sizeof *d);
}

/* ---------------------------------------------------------------------------------- */
/* Device buffers: [B, T] with row stride T + pad, padding poisoned                    */
/* ---------------------------------------------------------------------------------- */

static size_t rows_bytes(const seq_case *c, rlk_dtype d) {
  return (size_t)((c->B - 1) * (c->T + c->pad) + c->T) * rlk_dtype_size(d);
}

/* Uploads dense values as dtype d; the padding between rows holds NaN (floats) or 0x5a bytes. */
static void *upload_rows(rlk_context *ctx, const seq_case *c, rlk_dtype d, const double *dense) {
  const int64_t stride = c->T + c->pad;
  const size_t bytes = rows_bytes(c, d);
  unsigned char *h = malloc(bytes);
  memset(h, 0x5a, bytes);
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t t = 0; t < c->T + (b + 1 < c->B ? c->pad : 0); t++) {
      const int64_t i = b * stride + t;
      const int pad = t >= c->T;
      const double x = pad ? NAN : dense[b * c->T + t];
      if (d == RLK_F32)
        ((float *)h)[i] = (float)x;
      else if (d == RLK_F64)
        ((double *)h)[i] = x;
      else if (pad)
        continue;
      else if (d == RLK_BOOL)
        h[i] = x != 0.0;
      else if (d == RLK_I32)
        ((int32_t *)h)[i] = (int32_t)x;
    }
  void *p = rlk_test_dev_alloc(ctx, bytes);
  ck_assert_int_eq(rlk_memcpy_to_device(ctx, p, h, bytes), RLK_OK);
  free(h);
  return p;
}

/* The mask as a dtype; odd: valid values other than 1 and -0.0 for masked f32. */
static void *upload_mask(rlk_context *ctx, const seq_case *c, const double *m, uint64_t *rng) {
  if (c->mask_dtype == RLK_DTYPE_INVALID) return NULL;
  const int64_t n = c->B * c->T;
  double *w = malloc((size_t)n * sizeof *w);
  for (int64_t i = 0; i < n; i++) {
    w[i] = m[i];
    if (!c->odd_mask) continue;
    const double u = rlk_test_rand_uniform(rng);
    if (c->mask_dtype == RLK_I32 && m[i] != 0.0)
      w[i] = u < 0.3 ? 7.0 : (u < 0.6 ? -3.0 : 1.0);
    else if (c->mask_dtype == RLK_F32 && m[i] != 0.0)
      w[i] = u < 0.25 ? 0.5 : (u < 0.5 ? -2.0 : (u < 0.75 ? NAN : 1e-30));
    else if (c->mask_dtype == RLK_F32 && m[i] == 0.0 && u < 0.5)
      w[i] = -0.0;
  }
  void *p = upload_rows(ctx, c, c->mask_dtype, w);
  free(w);
  return p;
}

/* An output buffer filled with 0xff bytes (NaN). */
static void *alloc_out(rlk_context *ctx, const seq_case *c) {
  const size_t bytes = rows_bytes(c, c->dtype);
  void *p = rlk_test_dev_alloc(ctx, bytes);
  ck_assert_int_eq(rlk_memset(ctx, p, 0xff, bytes), RLK_OK);
  return p;
}

/* Reads an output back as dense doubles and checks the padding between rows was not written. */
static void download_rows(rlk_context *ctx, const seq_case *c, const void *p, double *dense,
                          const char *what, const char *name) {
  const size_t bytes = rows_bytes(c, c->dtype);
  unsigned char *h = malloc(bytes);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, h, p, bytes), RLK_OK);
  const int64_t stride = c->T + c->pad;
  const size_t es = rlk_dtype_size(c->dtype);
  for (int64_t b = 0; b < c->B; b++) {
    for (int64_t t = 0; t < c->T; t++) {
      const int64_t i = b * stride + t;
      dense[b * c->T + t] = c->dtype == RLK_F32 ? (double)((float *)h)[i] : ((double *)h)[i];
    }
    if (b + 1 < c->B)
      for (int64_t t = c->T; t < stride; t++)
        for (size_t k = 0; k < es; k++)
          ck_assert_msg(h[(size_t)(b * stride + t) * es + k] == 0xff, "%s: %s padding [%lld, %lld] was written",
                        what, name, (long long)b, (long long)t);
  }
  free(h);
}

static rlk_tensor rows_tensor(void *p, rlk_dtype d, const seq_case *c) {
  return rlk_tensor_2d(p, d, c->B, c->T, c->T + c->pad);
}

/* |got - want| <= tol[i] everywhere (tol NULL: bitwise equal); NaN only where want is NaN. */
static void check_close(const char *what, const char *name, const seq_case *c, const double *got,
                        const double *want, const double *tol) {
  for (int64_t i = 0; i < c->B * c->T; i++) {
    const int64_t b = i / c->T, t = i % c->T;
    if (isnan(want[i])) {
      ck_assert_msg(isnan(got[i]), "%s: %s[%lld, %lld] = %.17g, expected NaN", what, name,
                    (long long)b, (long long)t, got[i]);
      continue;
    }
    const double tl = tol ? tol[i] : 0.0;
    ck_assert_msg(got[i] == want[i] || fabs(got[i] - want[i]) <= tl, "%s: %s[%lld, %lld] = %.17g, reference %.17g (tolerance %.3g)",
                  what, name, (long long)b, (long long)t, got[i], want[i], tl);
  }
}

/* ---------------------------------------------------------------------------------- */
/* Error bounds (fp64, from the reference outputs)                                     */
/* ---------------------------------------------------------------------------------- */

/* GAE: S_t sums the magnitudes that reach A_t, each decayed like the recurrence does. */
static void gae_bound(const seq_data *d, double g, double gl, rlk_gae_masked masked,
                      const double *adv, rlk_dtype dtype, double *tol_adv, double *tol_ret) {
  const double eps = eps_of(dtype), tiny = tiny_of(dtype);
  for (int64_t b = 0; b < d->B; b++) {
    double S = 0.0, next_v = 0.0, next_a = 0.0;
    for (int64_t t = d->T - 1; t >= 0; t--) {
      const int64_t i = b * d->T + t;
      const int valid = d->m[i] != 0.0;
      if (valid) {
        S = fabs(gl) * S + fabs(d->r[i]) + fabs(d->v[i]) + fabs(g * next_v) + fabs(gl * next_a) + fabs(adv[i]);
        next_v = d->v[i];
        next_a = adv[i];
      } else if (masked == RLK_GAE_MASKED_ZERO) {
        S = fabs(gl) * S + fabs(g * next_v) + fabs(gl * next_a) + fabs(adv[i]);
        next_v = 0.0;
        next_a = adv[i];
      }
      tol_adv[i] = SCAN_ULPS * eps * S + tiny;
      const double vr = (valid || masked == RLK_GAE_MASKED_SKIP) ? fabs(d->v[i]) : 0.0;
      tol_ret[i] = tol_adv[i] + 2.0 * eps * (fabs(adv[i]) + vr);
    }
  }
}

/* Returns (and reverse sums: zero with g = 1). */
static void returns_bound(const seq_data *d, double g, rlk_returns_masked masked, const double *ret,
                          rlk_dtype dtype, double *tol, double *tol_adv) {
  const double eps = eps_of(dtype), tiny = tiny_of(dtype);
  for (int64_t b = 0; b < d->B; b++) {
    double carry = 0.0;
    for (int64_t t = d->T - 1; t >= 0; t--) {
      const int64_t i = b * d->T + t;
      const int valid = d->m[i] != 0.0;
      const double r = (valid || masked == RLK_RETURNS_MASKED_RESET) ? fabs(d->r[i]) : 0.0;
      const double S = fabs(g) * carry + r + fabs(ret[i]);
      /* carry: a masked step passes the running value on (its own output is 0) */
      if (masked == RLK_RETURNS_MASKED_CARRY && !valid) {
        tol[i] = tiny;
        if (tol_adv) tol_adv[i] = tol[i] + 2.0 * eps * (fabs(ret[i]) + fabs(d->base[b]));
        continue;
      }
      carry = (valid || masked != RLK_RETURNS_MASKED_RESET) ? S : 0.0;
      tol[i] = SCAN_ULPS * eps * S + tiny;
      if (tol_adv) tol_adv[i] = tol[i] + 2.0 * eps * (fabs(ret[i]) + fabs(d->base[b]));
    }
  }
}

/* ---------------------------------------------------------------------------------- */
/* Op runners: fresh device buffers, one call, outputs back as dense doubles           */
/* ---------------------------------------------------------------------------------- */

typedef struct gae_out {
  double *adv, *ret;
} gae_out;

static void run_gae(rlk_context *ctx, const seq_case *c, const seq_data *d, double gamma,
                    double lambda, rlk_gae_masked masked, int want_returns, uint64_t *rng,
                    gae_out *o) {
  char what[512];
  describe(c, masked == RLK_GAE_MASKED_SKIP ? "gae skip" : "gae zero", what, sizeof what);
  void *rd = upload_rows(ctx, c, c->dtype, d->r), *vd = upload_rows(ctx, c, c->dtype, d->v);
  void *md = upload_mask(ctx, c, d->m, rng);
  void *ad = alloc_out(ctx, c), *retd = want_returns ? alloc_out(ctx, c) : NULL;
  rlk_gae_args a;
  rlk_gae_args_init(&a);
  a.rewards = rows_tensor(rd, c->dtype, c);
  a.values = rows_tensor(vd, c->dtype, c);
  if (md) a.mask = rows_tensor(md, c->mask_dtype, c);
  a.gamma = gamma;
  a.lambda = lambda;
  a.masked = masked;
  a.advantages = rows_tensor(ad, c->dtype, c);
  if (retd) a.returns = rows_tensor(retd, c->dtype, c);
  a.algo = c->algo;
  rlk_test_expect_call_done(ctx, rlk_gae(ctx, &a, NULL), what);
  const size_t n = (size_t)(c->B * c->T);
  o->adv = malloc(n * sizeof(double));
  o->ret = want_returns ? malloc(n * sizeof(double)) : NULL;
  download_rows(ctx, c, ad, o->adv, what, "advantages");
  if (retd) download_rows(ctx, c, retd, o->ret, what, "returns");
  rlk_free(ctx, rd);
  rlk_free(ctx, vd);
  rlk_free(ctx, md);
  rlk_free(ctx, ad);
  rlk_free(ctx, retd);
}

static void run_returns(rlk_context *ctx, const seq_case *c, const seq_data *d, double gamma,
                        rlk_returns_masked masked, uint64_t *rng, double *out) {
  char what[512];
  describe(c, masked == RLK_RETURNS_MASKED_RESET ? "returns reset" : "returns zero", what, sizeof what);
  void *rd = upload_rows(ctx, c, c->dtype, d->r), *md = upload_mask(ctx, c, d->m, rng);
  void *od = alloc_out(ctx, c);
  rlk_discounted_returns_args a;
  rlk_discounted_returns_args_init(&a);
  a.rewards = rows_tensor(rd, c->dtype, c);
  if (md) a.mask = rows_tensor(md, c->mask_dtype, c);
  a.gamma = gamma;
  a.masked = masked;
  a.returns = rows_tensor(od, c->dtype, c);
  a.algo = c->algo;
  rlk_test_expect_call_done(ctx, rlk_discounted_returns(ctx, &a, NULL), what);
  download_rows(ctx, c, od, out, what, "returns");
  rlk_free(ctx, rd);
  rlk_free(ctx, md);
  rlk_free(ctx, od);
}

static void run_cumsum(rlk_context *ctx, const seq_case *c, const seq_data *d, int with_baseline,
                       uint64_t *rng, double *out, double *adv) {
  char what[512];
  describe(c, with_baseline ? "reverse_cumsum+baseline" : "reverse_cumsum", what, sizeof what);
  void *xd = upload_rows(ctx, c, c->dtype, d->r), *md = upload_mask(ctx, c, d->m, rng);
  void *od = alloc_out(ctx, c), *ad = with_baseline ? alloc_out(ctx, c) : NULL;
  void *bd = NULL;
  if (with_baseline) {
    const size_t es = rlk_dtype_size(c->dtype);
    unsigned char *h = malloc((size_t)c->B * es);
    for (int64_t b = 0; b < c->B; b++) {
      if (c->dtype == RLK_F32)
        ((float *)h)[b] = (float)d->base[b];
      else
        ((double *)h)[b] = d->base[b];
    }
    bd = rlk_test_dev_alloc(ctx, (size_t)c->B * es);
    ck_assert_int_eq(rlk_memcpy_to_device(ctx, bd, h, (size_t)c->B * es), RLK_OK);
    free(h);
  }
  rlk_reverse_cumsum_args a;
  rlk_reverse_cumsum_args_init(&a);
  a.values = rows_tensor(xd, c->dtype, c);
  if (md) a.mask = rows_tensor(md, c->mask_dtype, c);
  a.out = rows_tensor(od, c->dtype, c);
  if (with_baseline) {
    a.baseline = rlk_tensor_1d(bd, c->dtype, c->B);
    a.advantages = rows_tensor(ad, c->dtype, c);
  }
  a.algo = c->algo;
  rlk_test_expect_call_done(ctx, rlk_reverse_cumsum(ctx, &a, NULL), what);
  download_rows(ctx, c, od, out, what, "out");
  if (with_baseline) download_rows(ctx, c, ad, adv, what, "advantages");
  rlk_free(ctx, xd);
  rlk_free(ctx, md);
  rlk_free(ctx, od);
  rlk_free(ctx, ad);
  rlk_free(ctx, bd);
}

/* ---------------------------------------------------------------------------------- */
/* Scan cases                                                                          */
/* ---------------------------------------------------------------------------------- */

/* The trainers' settings. verl: skip, gamma 1, lambda 1. OpenRLHF and TRL: zero, gamma 1,
 * lambda 0.95. Plus settings off the defaults, exact in f32 (so the f32 kernels and the
 * reference use the same coefficients). */
typedef struct gae_setting {
  const char *who;
  rlk_gae_masked masked;
  double gamma, lambda;
} gae_setting;

static const gae_setting gae_settings[] = {
    {"verl", RLK_GAE_MASKED_SKIP, 1.0, 1.0},
    {"openrlhf", RLK_GAE_MASKED_ZERO, 1.0, 0.95},
    {"trl", RLK_GAE_MASKED_ZERO, 1.0, 0.95},
    {"skip-discounted", RLK_GAE_MASKED_SKIP, 0.96875, 0.9375},
    {"zero-discounted", RLK_GAE_MASKED_ZERO, 0.99609375, 0.75},
    {"skip-verl-gamma", RLK_GAE_MASKED_SKIP, 0.99, 0.95},
};
#define N_GAE_SETTINGS (sizeof gae_settings / sizeof gae_settings[0])

/* One GAE case against the matching trainer reference. */
static void gae_case(rlk_context *ctx, const seq_case *c, const gae_setting *s, uint64_t *rng) {
  seq_data d;
  gen_data(rng, c, &d);
  gae_out o;
  run_gae(ctx, c, &d, s->gamma, s->lambda, s->masked, 1, rng, &o);
  const size_t n = (size_t)(c->B * c->T);
  double *adv = malloc(n * sizeof *adv), *ret = malloc(n * sizeof *ret);
  double *ta = malloc(n * sizeof *ta), *tr = malloc(n * sizeof *tr);
  if (s->masked == RLK_GAE_MASKED_SKIP)
    as_ref_gae_verl(c->B, c->T, d.r, d.v, d.m, s->gamma, s->lambda, adv, ret);
  else
    as_ref_gae_openrlhf(c->B, c->T, d.r, d.v, d.m, s->gamma, s->lambda, adv, ret);
  gae_bound(&d, s->gamma, s->gamma * s->lambda, s->masked, adv, c->dtype, ta, tr);
  char what[600], desc[512];
  describe(c, "gae", desc, sizeof desc);
  snprintf(what, sizeof what, "%s (%s gamma=%g lambda=%g)", desc, s->who, s->gamma, s->lambda);
  check_close(what, "advantages", c, o.adv, adv, ta);
  check_close(what, "returns", c, o.ret, ret, tr);
  free(adv);
  free(ret);
  free(ta);
  free(tr);
  free(o.adv);
  free(o.ret);
  free_data(&d);
}

static const rlk_dtype mask_dtypes[] = {RLK_BOOL, RLK_I32, RLK_F32, RLK_DTYPE_INVALID};
static const rlk_scan_algo algos[] = {RLK_SCAN_AUTO, RLK_SCAN_ROW_WARP, RLK_SCAN_ROW_BLOCK};

/* Case k of a grid of settings x dtype (dt: f64, f32) x algorithm (ai), its shape cycling through
 * `shapes`. */
static seq_case grid_case(const int64_t (*shapes)[2], size_t nshapes, int k, int dt, size_t ai) {
  const int64_t *sh = shapes[(size_t)k % nshapes];
  seq_case c = base_case(sh[0], sh[1], dt ? RLK_F32 : RLK_F64);
  c.algo = algos[ai];
  return c;
}

/* Every trainer setting x dtype x algorithm on small odd shapes, every mask dtype in turn,
 * strided rows in some. */
static void cases_gae(rlk_context *ctx, uint64_t *rng) {
  static const int64_t shapes[][2] = {{1, 1}, {3, 2}, {3, 33}, {257, 33}, {1, 4097}, {3, 300}};
  int k = 0;
  for (size_t si = 0; si < N_GAE_SETTINGS; si++)
    for (int dt = 0; dt < 2; dt++)
      for (size_t ai = 0; ai < 3; ai++, k++) {
        seq_case c = grid_case(shapes, sizeof shapes / sizeof shapes[0], k, dt, ai);
        c.mask_dtype = mask_dtypes[(size_t)k % 4];
        c.pad = k % 3 == 1 ? 5 : (k % 5 == 2 ? 8 : 0);
        c.holes = k % 4 != 3;
        gae_case(ctx, &c, &gae_settings[si], rng);
      }
}

/* Long rows with few sequences (the DAPO shape) and many short rows, both algorithms. */
static void cases_gae_long(rlk_context *ctx, uint64_t *rng) {
  for (int ai = 1; ai < 3; ai++) {
    seq_case c = base_case(8, 20480, ai == 1 ? RLK_F64 : RLK_F32);
    c.algo = algos[ai];
    gae_case(ctx, &c, &gae_settings[ai == 1 ? 0 : 1], rng);
    c = base_case(3, 4097, ai == 1 ? RLK_F32 : RLK_F64);
    c.algo = algos[ai];
    c.mask_dtype = RLK_F32;
    gae_case(ctx, &c, &gae_settings[3], rng);
  }
}

static void returns_case(rlk_context *ctx, const seq_case *c, double gamma,
                         rlk_returns_masked masked, uint64_t *rng) {
  seq_data d;
  gen_data(rng, c, &d);
  const size_t n = (size_t)(c->B * c->T);
  double *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want), *tol = malloc(n * sizeof *tol);
  run_returns(ctx, c, &d, gamma, masked, rng, got);
  if (masked == RLK_RETURNS_MASKED_RESET)
    as_ref_returns_reinforce_pp(c->B, c->T, d.r, d.m, gamma, want);
  else if (masked == RLK_RETURNS_MASKED_CARRY)
    as_ref_returns_reinforce_pp_carry(c->B, c->T, d.r, d.m, gamma, want);
  else
    as_ref_returns_openrlhf(c->B, c->T, d.r, d.m, gamma, want);
  returns_bound(&d, gamma, masked, want, c->dtype, tol, NULL);
  char what[600], desc[512];
  static const char *const names[] = {"returns reset (verl REINFORCE++)", "returns zero (OpenRLHF)",
                                      "returns carry (verl REINFORCE++, multi-turn)"};
  describe(c, names[masked], desc, sizeof desc);
  snprintf(what, sizeof what, "%s gamma=%g", desc, gamma);
  check_close(what, "returns", c, got, want, tol);
  free(got);
  free(want);
  free(tol);
  free_data(&d);
}

static void cases_returns(rlk_context *ctx, uint64_t *rng) {
  static const int64_t shapes[][2] = {{1, 1}, {3, 33}, {257, 33}, {1, 4097}, {3, 2}, {8, 20480}};
  static const double gammas[] = {1.0, 0.96875, 0.99};
  int k = 0;
  for (int masked = 0; masked <= RLK_RETURNS_MASKED_CARRY; masked++)
    for (int dt = 0; dt < 2; dt++)
      for (size_t ai = 0; ai < 3; ai++, k++) {
        seq_case c = grid_case(shapes, sizeof shapes / sizeof shapes[0], k, dt, ai);
        c.mask_dtype = mask_dtypes[(size_t)k % 4];
        c.pad = k % 4 == 1 ? 3 : 0;
        returns_case(ctx, &c, gammas[(size_t)k % 3], (rlk_returns_masked)masked, rng);
      }
}

static void cumsum_case(rlk_context *ctx, const seq_case *c, int with_baseline, uint64_t *rng) {
  seq_data d;
  gen_data(rng, c, &d);
  const size_t n = (size_t)(c->B * c->T);
  double *out = malloc(n * sizeof *out), *adv = malloc(n * sizeof *adv);
  double *ret = malloc(n * sizeof *ret), *radv = malloc(n * sizeof *radv);
  double *tol = malloc(n * sizeof *tol), *tola = malloc(n * sizeof *tola);
  run_cumsum(ctx, c, &d, with_baseline, rng, out, adv);
  as_ref_remax(c->B, c->T, d.r, d.m, d.base, ret, radv);
  returns_bound(&d, 1.0, RLK_RETURNS_MASKED_ZERO, ret, c->dtype, tol, tola);
  char what[512];
  describe(c, with_baseline ? "reverse_cumsum (ReMax, baseline)" : "reverse_cumsum", what, sizeof what);
  check_close(what, "out", c, out, ret, tol);
  if (with_baseline) check_close(what, "advantages", c, adv, radv, tola);
  free(out);
  free(adv);
  free(ret);
  free(radv);
  free(tol);
  free(tola);
  free_data(&d);
}

static void cases_cumsum(rlk_context *ctx, uint64_t *rng) {
  static const int64_t shapes[][2] = {{1, 1}, {3, 33}, {257, 40}, {2, 4097}, {3, 2}, {5, 999}};
  int k = 0;
  for (int bl = 0; bl < 2; bl++)
    for (int dt = 0; dt < 2; dt++)
      for (size_t ai = 0; ai < 3; ai++, k++) {
        seq_case c = grid_case(shapes, sizeof shapes / sizeof shapes[0], k, dt, ai);
        c.mask_dtype = mask_dtypes[(size_t)(k + 1) % 4];
        c.pad = k % 3 == 2 ? 4 : 0;
        cumsum_case(ctx, &c, bl, rng);
      }
}

/* Edge cases: every row masked, every row one token, zero inputs (exactly zero outputs). */
static void cases_scan_edges(rlk_context *ctx, uint64_t *rng) {
  for (size_t ai = 0; ai < 3; ai++)
    for (int dt = 0; dt < 2; dt++) {
      const rlk_dtype dtype = dt ? RLK_F32 : RLK_F64;
      /* all masked: skip gives 0 advantages, returns = V; zero gives 0 and 0 */
      seq_case c = base_case(5, 70, dtype);
      c.algo = algos[ai];
      seq_data d;
      gen_data(rng, &c, &d);
      for (int64_t i = 0; i < c.B * c.T; i++) d.m[i] = 0.0;
      for (int masked = 0; masked < 2; masked++) {
        gae_out o;
        run_gae(ctx, &c, &d, 0.99, 0.95, (rlk_gae_masked)masked, 1, rng, &o);
        for (int64_t i = 0; i < c.B * c.T; i++) {
          ck_assert_msg(o.adv[i] == 0.0, "all masked, %s: advantages[%lld] = %g", masked ? "zero" : "skip",
                        (long long)i, o.adv[i]);
          ck_assert_msg(o.ret[i] == (masked ? 0.0 : d.v[i]), "all masked, %s: returns[%lld] = %g",
                        masked ? "zero" : "skip", (long long)i, o.ret[i]);
        }
        free(o.adv);
        free(o.ret);
      }
      /* reset returns of an all-masked row are the rewards themselves; zero returns are 0 */
      double *out = malloc((size_t)(c.B * c.T) * sizeof *out);
      run_returns(ctx, &c, &d, 0.9, RLK_RETURNS_MASKED_RESET, rng, out);
      for (int64_t i = 0; i < c.B * c.T; i++) ck_assert_msg(out[i] == d.r[i], "all masked reset: %g vs %g", out[i], d.r[i]);
      run_returns(ctx, &c, &d, 0.9, RLK_RETURNS_MASKED_ZERO, rng, out);
      for (int64_t i = 0; i < c.B * c.T; i++) ck_assert_msg(out[i] == 0.0, "all masked zero: %g", out[i]);
      free(out);
      free_data(&d);

      /* single-token rows, valid: A = r - V exactly (no discounting reaches it) */
      c = base_case(33, 1, dtype);
      c.algo = algos[ai];
      c.mask_dtype = RLK_DTYPE_INVALID;
      gen_data(rng, &c, &d);
      gae_out o;
      run_gae(ctx, &c, &d, 0.99, 0.95, RLK_GAE_MASKED_SKIP, 1, rng, &o);
      for (int64_t i = 0; i < c.B; i++) {
        const double want = round_to(dtype, d.r[i] - d.v[i]);
        ck_assert_msg(o.adv[i] == want, "single token: %.17g vs %.17g", o.adv[i], want);
      }
      free(o.adv);
      free(o.ret);
      free_data(&d);

      /* zero rewards and values: exactly zero advantages and returns */
      c = base_case(4, 600, dtype);
      c.algo = algos[ai];
      gen_data(rng, &c, &d);
      for (int64_t i = 0; i < c.B * c.T; i++) d.r[i] = d.v[i] = 0.0;
      run_gae(ctx, &c, &d, 0.99, 0.95, (rlk_gae_masked)(ai % 2), 1, rng, &o);
      for (int64_t i = 0; i < c.B * c.T; i++)
        ck_assert_msg(o.adv[i] == 0.0 && o.ret[i] == 0.0, "zero inputs: %g %g", o.adv[i], o.ret[i]);
      free(o.adv);
      free(o.ret);
      free_data(&d);
    }
}

static int same_bits(const double *a, const double *b, int64_t n) {
  return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

/* NaN in masked inputs changes nothing that the formulas do not read at that position; valid
 * mask values other than 1 (and f32 -0.0 as masked) mean exactly what 1 and 0 mean. */
static void cases_mask_robustness(rlk_context *ctx, uint64_t *rng) {
  for (size_t ai = 0; ai < 3; ai++)
    for (int dt = 0; dt < 2; dt++) {
      seq_case c = base_case(6, 777, dt ? RLK_F32 : RLK_F64);
      c.algo = algos[ai];
      c.mask_dtype = ai == 1 ? RLK_I32 : RLK_F32;
      const uint64_t seed = rlk_test_rand_u64(rng);
      uint64_t s1 = seed, s2 = seed;
      seq_data d1, d2;
      gen_data(&s1, &c, &d1);
      seq_case cn = c;
      cn.nan_masked = 1;
      cn.odd_mask = 1;
      gen_data(&s2, &cn, &d2);
      const int64_t n = c.B * c.T;
      for (int masked = 0; masked < 2; masked++) {
        gae_out a, b;
        run_gae(ctx, &c, &d1, 0.99, 0.95, (rlk_gae_masked)masked, 1, rng, &a);
        run_gae(ctx, &cn, &d2, 0.99, 0.95, (rlk_gae_masked)masked, 1, rng, &b);
        for (int64_t i = 0; i < n; i++) {
          const int valid = d1.m[i] != 0.0;
          ck_assert_msg(!memcmp(&a.adv[i], &b.adv[i], sizeof(double)), "gae %d: NaN/odd mask changed advantages[%lld]: %g vs %g",
                        masked, (long long)i, a.adv[i], b.adv[i]);
          if (valid || masked == RLK_GAE_MASKED_ZERO)
            ck_assert_msg(!memcmp(&a.ret[i], &b.ret[i], sizeof(double)), "gae %d: NaN/odd mask changed returns[%lld]",
                          masked, (long long)i);
          else
            ck_assert_msg(isnan(b.ret[i]), "gae skip: returns at a masked position read its value (NaN)");
        }
        free(a.adv);
        free(a.ret);
        free(b.adv);
        free(b.ret);
      }
      double *o1 = malloc((size_t)n * sizeof *o1), *o2 = malloc((size_t)n * sizeof *o2);
      for (int masked = 0; masked < 2; masked++) {
        run_returns(ctx, &c, &d1, 0.99, (rlk_returns_masked)masked, rng, o1);
        run_returns(ctx, &cn, &d2, 0.99, (rlk_returns_masked)masked, rng, o2);
        for (int64_t i = 0; i < n; i++) {
          if (d1.m[i] != 0.0 || masked == RLK_RETURNS_MASKED_ZERO)
            ck_assert_msg(!memcmp(&o1[i], &o2[i], sizeof(double)), "returns %d: NaN/odd mask changed [%lld]: %g vs %g",
                          masked, (long long)i, o1[i], o2[i]);
        }
      }
      double *a1 = malloc((size_t)n * sizeof *a1), *a2 = malloc((size_t)n * sizeof *a2);
      run_cumsum(ctx, &c, &d1, 1, rng, o1, a1);
      run_cumsum(ctx, &cn, &d2, 1, rng, o2, a2);
      ck_assert_msg(same_bits(o1, o2, n) && same_bits(a1, a2, n), "reverse_cumsum: NaN/odd mask changed the output");
      free(o1);
      free(o2);
      free(a1);
      free(a2);
      free_data(&d1);
      free_data(&d2);
    }
}

/* A reset (a masked position in reset mode) ends what the steps after it carry: a NaN or inf
 * reward after a reset leaves every output whose steps up to the next reset hold none of them bit
 * for bit as it is with finite rewards there, and makes the others NaN (NaN) or non-finite (inf).
 * The chunked scans compose the steps' affine maps, where 0 x would carry NaN across. */
static void cases_reset_stops_nonfinite(rlk_context *ctx, uint64_t *rng) {
  static const double gammas[] = {0.99, 0.0, -0.5};
  static const double poisons[] = {NAN, INFINITY, -INFINITY};
  for (size_t ai = 0; ai < 3; ai++)
    for (int dt = 0; dt < 2; dt++)
      for (size_t gi = 0; gi < 3; gi++) {
        seq_case c = base_case(5, ai == 2 ? 3000 : 777, dt ? RLK_F32 : RLK_F64);
        c.algo = algos[ai];
        seq_data d;
        gen_data(rng, &c, &d);
        const int64_t n = c.B * c.T;
        double *r0 = malloc((size_t)n * sizeof *r0), *o1 = malloc((size_t)n * sizeof *o1),
               *o2 = malloc((size_t)n * sizeof *o2);
        memcpy(r0, d.r, (size_t)n * sizeof *r0);
        char *bad = calloc((size_t)n, 1);
        int64_t poisoned = 0;
        for (int64_t i = 0; i < n; i++)
          if (d.m[i] != 0.0 && rlk_test_rand_u64(rng) % 97 == 0) {
            d.r[i] = poisons[(gi + (size_t)poisoned++) % 3];
            bad[i] = 1;
          }
        /* a mask of few steps may draw none at 1 in 97: then its first step */
        for (int64_t i = 0; i < n && !poisoned; i++)
          if (d.m[i] != 0.0) {
            d.r[i] = poisons[gi % 3];
            bad[i] = 1;
            poisoned++;
          }
        if (!poisoned) { /* every step masked (5 rows of length 0): nothing to carry */
          free(bad), free(r0), free(o1), free(o2);
          free_data(&d);
          continue;
        }
        seq_data d0 = d;
        d0.r = r0;
        run_returns(ctx, &c, &d0, gammas[gi], RLK_RETURNS_MASKED_RESET, rng, o1);
        run_returns(ctx, &c, &d, gammas[gi], RLK_RETURNS_MASKED_RESET, rng, o2);
        int64_t kept = 0, hit = 0;
        for (int64_t b = 0; b < c.B; b++) {
          /* walking back: whether a non-finite reward lies between t and the next reset */
          int tainted = 0, nan_tainted = 0;
          for (int64_t t = c.T - 1; t >= 0; t--) {
            const int64_t i = b * c.T + t;
            if (t + 1 < c.T && d.m[i + 1] == 0.0) tainted = nan_tainted = 0; /* the reset at t + 1 */
            if (bad[i]) {
              tainted = 1;
              nan_tainted |= isnan(d.r[i]);
            }
            if (!tainted) {
              ck_assert_msg(!memcmp(&o1[i], &o2[i], sizeof(double)),
                            "returns reset %s dtype=%s gamma=%g: [%lld, %lld] = %.17g with non-finite rewards "
                            "past a reset, %.17g without", algo_name(c.algo), dt ? "f32" : "f64", gammas[gi],
                            (long long)b, (long long)t, o2[i], o1[i]);
              kept++;
            } else {
              ck_assert_msg(!isfinite(o2[i]) && (!nan_tainted || isnan(o2[i])),
                            "returns reset %s dtype=%s gamma=%g: [%lld, %lld] = %.17g, expected %s",
                            algo_name(c.algo), dt ? "f32" : "f64", gammas[gi], (long long)b, (long long)t,
                            o2[i], nan_tainted ? "NaN" : "non-finite");
              hit++;
            }
          }
        }
        ck_assert_msg(kept > 0 && hit > 0, "reset: the case checks both sides (%lld kept, %lld hit)",
                      (long long)kept, (long long)hit);
        free(bad);
        free(r0);
        free(o1);
        free(o2);
        free_data(&d);
      }
}

/* The same inputs twice: bitwise the same outputs, every op and algorithm. */
static void cases_scan_deterministic(rlk_context *ctx, uint64_t *rng) {
  for (size_t ai = 0; ai < 3; ai++) {
    seq_case c = base_case(40, 3000, RLK_F32);
    c.algo = algos[ai];
    seq_data d;
    gen_data(rng, &c, &d);
    const int64_t n = c.B * c.T;
    gae_out a, b;
    run_gae(ctx, &c, &d, 0.99, 0.95, RLK_GAE_MASKED_SKIP, 1, rng, &a);
    run_gae(ctx, &c, &d, 0.99, 0.95, RLK_GAE_MASKED_SKIP, 1, rng, &b);
    ck_assert_msg(same_bits(a.adv, b.adv, n) && same_bits(a.ret, b.ret, n), "gae differs between runs (%s)",
                  algo_name(c.algo));
    free(a.adv);
    free(a.ret);
    free(b.adv);
    free(b.ret);
    double *o1 = malloc((size_t)n * sizeof *o1), *o2 = malloc((size_t)n * sizeof *o2);
    run_returns(ctx, &c, &d, 0.99, RLK_RETURNS_MASKED_RESET, rng, o1);
    run_returns(ctx, &c, &d, 0.99, RLK_RETURNS_MASKED_RESET, rng, o2);
    ck_assert_msg(same_bits(o1, o2, n), "returns differ between runs (%s)", algo_name(c.algo));
    free(o1);
    free(o2);
    free_data(&d);
  }
}

/* ---------------------------------------------------------------------------------- */
/* Whitening                                                                           */
/* ---------------------------------------------------------------------------------- */

typedef struct whiten_case {
  seq_case c;
  int one_d;    /* x, mask and out as [T] (B must be 1) */
  int in_place; /* out = x */
} whiten_case;

/* Runs rlk_masked_whiten on dense x with mask m (0/1), writing dense out and stats. */
static void run_whiten(rlk_context *ctx, const whiten_case *w, const double *x, const double *m,
                       const rlk_masked_whiten_args *params, uint64_t *rng, double *out,
                       double stats[3]) {
  const seq_case *c = &w->c;
  char what[512];
  describe(c, w->in_place ? "masked_whiten in place" : "masked_whiten", what, sizeof what);
  void *xd = upload_rows(ctx, c, c->dtype, x), *md = upload_mask(ctx, c, m, rng);
  void *od = w->in_place ? xd : alloc_out(ctx, c);
  double *sd = rlk_test_dev_alloc(ctx, 3 * sizeof(double));
  ck_assert_int_eq(rlk_memset(ctx, sd, 0xff, 3 * sizeof(double)), RLK_OK);
  rlk_masked_whiten_args a = *params;
  if (w->one_d) {
    a.x = rlk_tensor_1d(xd, c->dtype, c->T);
    if (md) a.mask = rlk_tensor_1d(md, c->mask_dtype, c->T);
    a.out = rlk_tensor_1d(od, c->dtype, c->T);
  } else {
    a.x = rows_tensor(xd, c->dtype, c);
    if (md) a.mask = rows_tensor(md, c->mask_dtype, c);
    a.out = rows_tensor(od, c->dtype, c);
  }
  a.stats = rlk_tensor_1d(sd, RLK_F64, 3);
  size_t ws = 0;
  ck_assert_int_eq(rlk_masked_whiten_workspace_size(ctx, &a, &ws), RLK_OK);
  void *wd = ws ? rlk_test_dev_alloc(ctx, ws) : NULL;
  a.workspace = wd;
  a.workspace_bytes = ws;
  rlk_test_expect_call_done(ctx, rlk_masked_whiten(ctx, &a, NULL), what);
  if (w->in_place) {
    /* the padding holds the NaN the upload wrote: read the rows only */
    const size_t bytes = rows_bytes(c, c->dtype);
    unsigned char *h = malloc(bytes);
    ck_assert_int_eq(rlk_memcpy_to_host(ctx, h, od, bytes), RLK_OK);
    for (int64_t b = 0; b < c->B; b++)
      for (int64_t t = 0; t < c->T; t++) {
        const int64_t i = b * (c->T + c->pad) + t;
        out[b * c->T + t] = c->dtype == RLK_F32 ? (double)((float *)h)[i] : ((double *)h)[i];
      }
    free(h);
  } else {
    download_rows(ctx, c, od, out, what, "out");
  }
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, stats, sd, 3 * sizeof(double)), RLK_OK);
  rlk_free(ctx, xd);
  rlk_free(ctx, md);
  if (!w->in_place) rlk_free(ctx, od);
  rlk_free(ctx, sd);
  rlk_free(ctx, wd);
}

/* The documented parameters of a trainer's whitening. */
typedef enum whiten_who { W_VERL, W_VERL_NO_SHIFT, W_VERL_RPP, W_TRL, W_TRL_NO_SHIFT, W_OPENRLHF,
                          W_OPENRLHF_NO_STD, W_GENERIC } whiten_who;

static const char *who_name(whiten_who w) {
  static const char *n[] = {"verl", "verl shift_mean=0", "verl REINFORCE++ (x mask)", "trl",
                            "trl shift_mean=0", "openrlhf", "openrlhf no_std_norm", "generic"};
  return n[w];
}

static void who_params(whiten_who who, rlk_masked_whiten_args *a, as_ref_whiten_params *p) {
  rlk_masked_whiten_args_init(a);
  switch (who) {
  case W_VERL:
  case W_VERL_NO_SHIFT:
  case W_VERL_RPP:
    a->shift_mean = who != W_VERL_NO_SHIFT;
    a->masked = who == W_VERL_RPP ? RLK_WHITEN_MASKED_ZERO : RLK_WHITEN_MASKED_APPLY;
    break;
  case W_TRL:
  case W_TRL_NO_SHIFT:
    a->count_eps = 0.0;
    a->shift_mean = who == W_TRL;
    a->masked = RLK_WHITEN_MASKED_ZERO;
    break;
  case W_OPENRLHF:
  case W_OPENRLHF_NO_STD:
    a->count_eps = 0.0;
    a->unbiased = 0;
    a->eps_mode = RLK_WHITEN_EPS_CLAMP;
    a->normalize_std = who == W_OPENRLHF;
    break;
  default:
    break;
  }
  p->eps = a->eps;
  p->count_eps = a->count_eps;
  p->eps_clamp = a->eps_mode == RLK_WHITEN_EPS_CLAMP;
  p->unbiased = a->unbiased;
  p->shift_mean = a->shift_mean;
  p->normalize_std = a->normalize_std;
  p->masked_zero = a->masked == RLK_WHITEN_MASKED_ZERO;
}

/* One whitening call against the trainer's reference (and the general one, for the statistics). */
static void whiten_check(rlk_context *ctx, const whiten_case *w, const double *x, const double *m,
                         whiten_who who, const rlk_masked_whiten_args *gen, uint64_t *rng) {
  const seq_case *c = &w->c;
  const int64_t n = c->B * c->T;
  rlk_masked_whiten_args a;
  as_ref_whiten_params p;
  who_params(who, &a, &p);
  if (who == W_GENERIC) {
    a = *gen;
    p.eps = a.eps;
    p.count_eps = a.count_eps;
    p.eps_clamp = a.eps_mode == RLK_WHITEN_EPS_CLAMP;
    p.unbiased = a.unbiased;
    p.shift_mean = a.shift_mean;
    p.normalize_std = a.normalize_std;
    p.masked_zero = a.masked == RLK_WHITEN_MASKED_ZERO;
  }
  double *out = malloc((size_t)n * sizeof *out), *want = malloc((size_t)n * sizeof *want);
  double *gen_want = malloc((size_t)n * sizeof *gen_want), *tol = malloc((size_t)n * sizeof *tol);
  double stats[3], rstats[3];
  run_whiten(ctx, w, x, m, &a, rng, out, stats);
  as_ref_whiten(n, x, m, &p, gen_want, rstats);
  int raised = 0;
  switch (who) {
  case W_VERL:
  case W_VERL_NO_SHIFT:
    raised = as_ref_whiten_verl(n, x, m, who == W_VERL, want);
    break;
  case W_VERL_RPP:
    raised = as_ref_whiten_verl(n, x, m, 1, want);
    for (int64_t i = 0; i < n && !raised; i++) want[i] *= m[i];
    break;
  case W_TRL:
  case W_TRL_NO_SHIFT:
    raised = as_ref_whiten_trl(n, x, m, who == W_TRL, want);
    break;
  case W_OPENRLHF:
  case W_OPENRLHF_NO_STD:
    as_ref_whiten_openrlhf(n, x, m, who == W_OPENRLHF_NO_STD, want);
    break;
  default:
    memcpy(want, gen_want, (size_t)n * sizeof *want);
  }
  char what[700], desc[512];
  describe(c, "masked_whiten", desc, sizeof desc);
  snprintf(what, sizeof what, "%s (%s%s%s)", desc, who_name(who), w->one_d ? ", 1-D" : "",
           w->in_place ? ", in place" : "");
  if (raised) {
    /* the trainer raises: the op writes NaN where the transform applies */
    for (int64_t i = 0; i < n; i++) {
      if (p.masked_zero && m[i] == 0.0)
        ck_assert_msg(out[i] == 0.0, "%s: undefined statistics, masked out[%lld] = %g", what, (long long)i, out[i]);
      else
        ck_assert_msg(isnan(out[i]), "%s: undefined statistics, out[%lld] = %g, expected NaN", what,
                      (long long)i, out[i]);
    }
  } else {
    const double e = eps_of(c->dtype);
    const double mean = rstats[0];
    const double rstd = p.normalize_std ? (p.eps_clamp ? 1.0 / sqrt(fmax(rstats[1], p.eps)) : 1.0 / sqrt(rstats[1] + p.eps)) : 1.0;
    for (int64_t i = 0; i < n; i++)
      tol[i] = (8.0 * e + 1e-10) * ((fabs(x[i]) + fabs(mean)) * rstd + (p.shift_mean ? 0.0 : fabs(mean))) + 1e-300;
    check_close(what, "out (trainer formula)", c, out, want, tol);
  }
  check_close(what, "out (documented formula)", c, out, gen_want, raised ? NULL : tol);
  ck_assert_msg(stats[2] == rstats[2], "%s: stats count %g, expected %g", what, stats[2], rstats[2]);
  for (int k = 0; k < 2; k++) {
    if (isnan(rstats[k]))
      ck_assert_msg(isnan(stats[k]), "%s: stats[%d] = %g, expected NaN", what, k, stats[k]);
    else
      ck_assert_msg(fabs(stats[k] - rstats[k]) <= 1e-9 * (fabs(rstats[k]) + fabs(rstats[0]) + 1e-300),
                    "%s: stats[%d] = %.17g, reference %.17g", what, k, stats[k], rstats[k]);
  }
  free(out);
  free(want);
  free(gen_want);
  free(tol);
}

/* Inputs like GAE advantages (mean away from 0); masked entries finite garbage. */
static void gen_whiten(uint64_t *rng, const seq_case *c, double *x, double *m) {
  const int64_t n = c->B * c->T;
  if (c->mask_dtype == RLK_DTYPE_INVALID)
    for (int64_t i = 0; i < n; i++) m[i] = 1.0;
  else
    gen_mask(rng, c->B, c->T, c->holes, m);
  const double mu = 3.0 * rlk_test_rand_normal(rng), sigma = 0.5 + 2.0 * rlk_test_rand_uniform(rng);
  for (int64_t i = 0; i < n; i++)
    x[i] = round_to(c->dtype, m[i] != 0.0 ? mu + sigma * rlk_test_rand_normal(rng)
                                          : 50.0 * rlk_test_rand_normal(rng));
}

static void cases_whiten(rlk_context *ctx, uint64_t *rng) {
  static const int64_t shapes[][2] = {{1, 1}, {3, 33}, {257, 65}, {1, 4097}, {2, 3}, {8, 3000}};
  int k = 0;
  for (int who = W_VERL; who <= W_GENERIC; who++)
    for (int dt = 0; dt < 2; dt++, k++) {
      const int64_t *sh = shapes[(size_t)k % (sizeof shapes / sizeof shapes[0])];
      whiten_case w;
      memset(&w, 0, sizeof w);
      w.c = base_case(sh[0], sh[1], dt ? RLK_F32 : RLK_F64);
      w.c.mask_dtype = mask_dtypes[(size_t)k % 4];
      w.c.pad = k % 3 == 1 ? 6 : 0;
      w.one_d = w.c.B == 1 && k % 2;
      if (w.one_d) w.c.pad = 0;
      w.in_place = k % 4 == 2;
      const int64_t n = w.c.B * w.c.T;
      double *x = malloc((size_t)n * sizeof *x), *m = malloc((size_t)n * sizeof *m);
      gen_whiten(rng, &w.c, x, m);
      rlk_masked_whiten_args g;
      rlk_masked_whiten_args_init(&g);
      g.eps = k % 3 ? 1e-5 : 0.0;
      g.eps_mode = (rlk_whiten_eps)(k % 2);
      g.unbiased = (k / 2) % 2;
      g.count_eps = k % 5 == 0 ? 1e-3 : 0.0;
      g.shift_mean = k % 3 != 1;
      g.normalize_std = k % 7 != 3;
      g.masked = (rlk_whiten_masked)((k / 3) % 2);
      whiten_check(ctx, &w, x, m, (whiten_who)who, &g, rng);
      free(x);
      free(m);
    }
}

/* Undefined and degenerate statistics: no valid element, one valid element, all-zero input. */
static void cases_whiten_edges(rlk_context *ctx, uint64_t *rng) {
  for (int dt = 0; dt < 2; dt++) {
    whiten_case w;
    memset(&w, 0, sizeof w);
    w.c = base_case(4, 50, dt ? RLK_F32 : RLK_F64);
    const int64_t n = w.c.B * w.c.T;
    double *x = malloc((size_t)n * sizeof *x), *m = malloc((size_t)n * sizeof *m);
    gen_whiten(rng, &w.c, x, m);
    /* no valid element: NaN (verl and TRL raise; OpenRLHF divides 0 by 0) */
    for (int64_t i = 0; i < n; i++) m[i] = 0.0;
    for (int who = W_VERL; who <= W_OPENRLHF_NO_STD; who++) whiten_check(ctx, &w, x, m, (whiten_who)who, NULL, rng);
    /* one valid element: undefined with the unbiased variance; biased: var 0 */
    m[77] = 1.0;
    for (int who = W_VERL; who <= W_OPENRLHF_NO_STD; who++) whiten_check(ctx, &w, x, m, (whiten_who)who, NULL, rng);
    /* all-zero advantages: exactly zero out */
    for (int64_t i = 0; i < n; i++) {
      x[i] = 0.0;
      m[i] = i % 3 ? 1.0 : 0.0;
    }
    double *out = malloc((size_t)n * sizeof *out), stats[3];
    rlk_masked_whiten_args a;
    as_ref_whiten_params p;
    for (int who = W_VERL; who <= W_OPENRLHF_NO_STD; who++) {
      who_params((whiten_who)who, &a, &p);
      run_whiten(ctx, &w, x, m, &a, rng, out, stats);
      for (int64_t i = 0; i < n; i++) ck_assert_msg(out[i] == 0.0, "%s: zero input gave %g", who_name((whiten_who)who), out[i]);
      ck_assert(stats[0] == 0.0 && stats[1] == 0.0);
    }
    free(out);
    free(x);
    free(m);
  }
}

static void cases_whiten_deterministic(rlk_context *ctx, uint64_t *rng) {
  whiten_case w;
  memset(&w, 0, sizeof w);
  w.c = base_case(64, 3001, RLK_F32);
  const int64_t n = w.c.B * w.c.T;
  double *x = malloc((size_t)n * sizeof *x), *m = malloc((size_t)n * sizeof *m);
  double *o1 = malloc((size_t)n * sizeof *o1), *o2 = malloc((size_t)n * sizeof *o2), s1[3], s2[3];
  gen_whiten(rng, &w.c, x, m);
  rlk_masked_whiten_args a;
  rlk_masked_whiten_args_init(&a);
  run_whiten(ctx, &w, x, m, &a, rng, o1, s1);
  run_whiten(ctx, &w, x, m, &a, rng, o2, s2);
  ck_assert_msg(same_bits(o1, o2, n) && !memcmp(s1, s2, sizeof s1), "masked_whiten differs between runs");
  free(x);
  free(m);
  free(o1);
  free(o2);
}

/* GAE, then whitening: verl's and OpenRLHF's whole advantage step on one batch. */
static void cases_pipeline(rlk_context *ctx, uint64_t *rng) {
  for (int trainer = 0; trainer < 2; trainer++) {
    seq_case c = base_case(17, 513, RLK_F64);
    seq_data d;
    gen_data(rng, &c, &d);
    const gae_setting *s = &gae_settings[trainer];
    gae_out o;
    run_gae(ctx, &c, &d, s->gamma, s->lambda, s->masked, 1, rng, &o);
    const int64_t n = c.B * c.T;
    double *adv = malloc((size_t)n * sizeof *adv), *ret = malloc((size_t)n * sizeof *ret);
    double *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got), stats[3];
    if (trainer == 0) {
      as_ref_gae_verl(c.B, c.T, d.r, d.v, d.m, s->gamma, s->lambda, adv, ret);
      ck_assert_int_eq(as_ref_whiten_verl(n, adv, d.m, 1, want), 0);
    } else {
      as_ref_gae_openrlhf(c.B, c.T, d.r, d.v, d.m, s->gamma, s->lambda, adv, ret);
      as_ref_whiten_openrlhf(n, adv, d.m, 0, want);
    }
    whiten_case w;
    memset(&w, 0, sizeof w);
    w.c = c;
    rlk_masked_whiten_args a;
    as_ref_whiten_params p;
    who_params(trainer == 0 ? W_VERL : W_OPENRLHF, &a, &p);
    run_whiten(ctx, &w, o.adv, d.m, &a, rng, got, stats);
    for (int64_t i = 0; i < n; i++)
      ck_assert_msg(fabs(got[i] - want[i]) <= 1e-9 * (1.0 + fabs(want[i])), "%s GAE + whitening: [%lld] %.17g vs %.17g",
                    s->who, (long long)i, got[i], want[i]);
    free(adv);
    free(ret);
    free(want);
    free(got);
    free(o.adv);
    free(o.ret);
    free_data(&d);
  }
}

/* ---------------------------------------------------------------------------------- */
/* Host backend                                                                        */
/* ---------------------------------------------------------------------------------- */

RLK_HOST_CASE(gae)
RLK_HOST_CASE(gae_long)
RLK_HOST_CASE(returns)
RLK_HOST_CASE(cumsum)
RLK_HOST_CASE(scan_edges)
RLK_HOST_CASE(mask_robustness)
RLK_HOST_CASE(reset_stops_nonfinite)
RLK_HOST_CASE(scan_deterministic)
RLK_HOST_CASE(whiten)
RLK_HOST_CASE(whiten_edges)
RLK_HOST_CASE(whiten_deterministic)
RLK_HOST_CASE(pipeline)

START_TEST(args_init_defaults) {
  rlk_gae_args g;
  memset(&g, 0x5a, sizeof g);
  rlk_gae_args_init(&g);
  ck_assert(g.gamma == 1.0 && g.lambda == 1.0);
  ck_assert_int_eq(g.masked, RLK_GAE_MASKED_SKIP);
  ck_assert_int_eq(g.algo, RLK_SCAN_AUTO);
  ck_assert_ptr_null(g.rewards.data);
  ck_assert_ptr_null(g.values.data);
  ck_assert_ptr_null(g.mask.data);
  ck_assert_ptr_null(g.advantages.data);
  ck_assert_ptr_null(g.returns.data);
  rlk_discounted_returns_args r;
  memset(&r, 0x5a, sizeof r);
  rlk_discounted_returns_args_init(&r);
  ck_assert(r.gamma == 1.0);
  ck_assert_int_eq(r.masked, RLK_RETURNS_MASKED_RESET);
  ck_assert_ptr_null(r.returns.data);
  rlk_reverse_cumsum_args s;
  memset(&s, 0x5a, sizeof s);
  rlk_reverse_cumsum_args_init(&s);
  ck_assert_ptr_null(s.values.data);
  ck_assert_ptr_null(s.baseline.data);
  ck_assert_int_eq(s.algo, RLK_SCAN_AUTO);
  rlk_masked_whiten_args w;
  memset(&w, 0x5a, sizeof w);
  rlk_masked_whiten_args_init(&w);
  ck_assert(w.eps == 1e-8 && w.count_eps == 1e-8);
  ck_assert_int_eq(w.eps_mode, RLK_WHITEN_EPS_ADD);
  ck_assert(w.unbiased == 1 && w.shift_mean == 1 && w.normalize_std == 1);
  ck_assert_int_eq(w.masked, RLK_WHITEN_MASKED_APPLY);
  ck_assert_ptr_null(w.workspace);
  ck_assert_ptr_null(w.stats.data);
  rlk_gae_args_init(NULL);
  rlk_discounted_returns_args_init(NULL);
  rlk_reverse_cumsum_args_init(NULL);
  rlk_masked_whiten_args_init(NULL);
}
END_TEST

/* The host backend's workspace is empty; NULL workspace is fine there. */
START_TEST(host_whiten_no_workspace) {
  rlk_context *ctx = rlk_test_host_context();
  float x[6] = {1, 2, 3, 4, 5, 6}, out[6];
  rlk_masked_whiten_args a;
  rlk_masked_whiten_args_init(&a);
  a.x = rlk_tensor_1d(x, RLK_F32, 6);
  a.out = rlk_tensor_1d(out, RLK_F32, 6);
  size_t ws = 99;
  ck_assert_int_eq(rlk_masked_whiten_workspace_size(ctx, &a, &ws), RLK_OK);
  ck_assert_uint_eq(ws, 0);
  ck_assert_int_eq(rlk_masked_whiten(ctx, &a, NULL), RLK_OK);
  ck_assert(out[0] < 0 && out[5] > 0 && fabsf(out[0] + out[5]) < 1e-6f);
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Argument validation                                                                 */
/* ---------------------------------------------------------------------------------- */

enum { BB = 4, BT = 6 };

typedef struct bad_fixture {
  float r[BB * BT], v[BB * BT], adv[BB * BT], ret[BB * BT], maskf[BB * BT], base[BB];
  double r64[BB * BT];
  uint8_t maskb[BB * BT];
  rlk_gae_args g;
  rlk_discounted_returns_args d;
  rlk_reverse_cumsum_args s;
  rlk_masked_whiten_args w;
} bad_fixture;

static void bad_reset(bad_fixture *f) {
  for (int i = 0; i < BB * BT; i++) {
    f->r[i] = (float)i;
    f->v[i] = 0.5f * (float)i;
    f->maskb[i] = i % 5 != 0;
    f->maskf[i] = 1.0f;
  }
  memset(f->adv, 0xff, sizeof f->adv);
  memset(f->ret, 0xff, sizeof f->ret);
  rlk_gae_args_init(&f->g);
  f->g.rewards = rlk_tensor_2d(f->r, RLK_F32, BB, BT, BT);
  f->g.values = rlk_tensor_2d(f->v, RLK_F32, BB, BT, BT);
  f->g.mask = rlk_tensor_2d(f->maskb, RLK_BOOL, BB, BT, BT);
  f->g.advantages = rlk_tensor_2d(f->adv, RLK_F32, BB, BT, BT);
  f->g.returns = rlk_tensor_2d(f->ret, RLK_F32, BB, BT, BT);
  rlk_discounted_returns_args_init(&f->d);
  f->d.rewards = f->g.rewards;
  f->d.mask = f->g.mask;
  f->d.returns = f->g.advantages;
  rlk_reverse_cumsum_args_init(&f->s);
  f->s.values = f->g.rewards;
  f->s.mask = f->g.mask;
  f->s.out = f->g.advantages;
  rlk_masked_whiten_args_init(&f->w);
  f->w.x = f->g.rewards;
  f->w.mask = f->g.mask;
  f->w.out = f->g.advantages;
}

/* The fixture (static: too large for the stack), reset. */
static bad_fixture *bad_fresh(void) {
  static bad_fixture fx;
  bad_reset(&fx);
  return &fx;
}

typedef enum bad_op { OP_GAE, OP_RETURNS, OP_CUMSUM, OP_WHITEN } bad_op;

static rlk_status call_op(rlk_context *ctx, bad_fixture *f, bad_op op) {
  switch (op) {
  case OP_GAE:
    return rlk_gae(ctx, &f->g, NULL);
  case OP_RETURNS:
    return rlk_discounted_returns(ctx, &f->d, NULL);
  case OP_CUMSUM:
    return rlk_reverse_cumsum(ctx, &f->s, NULL);
  default:
    return rlk_masked_whiten(ctx, &f->w, NULL);
  }
}

/* The call fails with `want`, the message names `arg`, and no output was written. */
static void expect_bad(rlk_context *ctx, bad_fixture *f, bad_op op, rlk_status want, const char *arg,
                       const char *label) {
  rlk_test_expect_error(call_op(ctx, f, op), want, arg, label);
  rlk_test_expect_untouched(f->adv, RLK_F32, BB * BT, "advantages", label);
  rlk_test_expect_untouched(f->ret, RLK_F32, BB * BT, "returns", label);
  bad_reset(f);
}

START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  bad_fixture *f = bad_fresh();
  for (int op = OP_GAE; op <= OP_WHITEN; op++) {
    ck_assert_msg(call_op(ctx, f, (bad_op)op) == RLK_OK, "baseline op %d: %s", op, rlk_last_error());
    bad_reset(f);
  }
  rlk_test_expect_error(rlk_gae(NULL, &f->g, NULL), RLK_ERR_INVALID_ARGUMENT, "ctx", "rlk_gae");
  ck_assert_int_eq(rlk_gae(ctx, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_discounted_returns(ctx, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_reverse_cumsum(NULL, &f->s, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_masked_whiten(ctx, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);
  size_t ws;
  ck_assert_int_eq(rlk_masked_whiten_workspace_size(ctx, &f->w, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_masked_whiten_workspace_size(NULL, &f->w, &ws), RLK_ERR_INVALID_ARGUMENT);

  /* GAE */
  f->g.rewards.data = NULL;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "rewards", "absent rewards");
  f->g.values.data = NULL;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "values", "absent values");
  f->g.advantages.data = NULL;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "advantages", "absent advantages");
  f->g.rewards.dtype = RLK_BF16;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "rewards", "bf16 rewards");
  f->g.rewards = rlk_tensor_2d(f->r64, RLK_F64, BB, BT, BT);
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "values", "mixed dtypes");
  f->g.rewards = rlk_tensor_1d(f->r, RLK_F32, BB * BT);
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "rewards", "1-D rewards");
  f->g.values = rlk_tensor_2d(f->v, RLK_F32, BB, BT - 1, BT);
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "values", "values T mismatch");
  f->g.mask = rlk_tensor_2d(f->maskb, RLK_BOOL, BB - 1, BT, BT);
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "mask", "mask B mismatch");
  f->g.mask.dtype = RLK_F64;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "mask", "f64 mask");
  f->g.mask.dtype = RLK_I64;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "mask", "i64 mask");
  f->g.returns.dtype = RLK_F64;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "returns", "f64 returns for f32 inputs");
  f->g.rewards = rlk_tensor_2d(f->r, RLK_F32, BB, BT, BT - 1);
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "rewards", "overlapping rows");
  f->g.rewards.strides[1] = 2;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "rewards", "strided columns");
  f->g.rewards.data = (char *)f->r + 2;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "rewards", "misaligned");
  f->g.rewards.shape[1] = 0;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "rewards", "T = 0");
  f->g.gamma = NAN;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "gamma", "NaN gamma");
  f->g.lambda = INFINITY;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "lambda", "infinite lambda");
  f->g.gamma = 1e30, f->g.lambda = 1e30; /* each within f32, the product the kernel takes not */
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "gamma * lambda", "overflowing gamma lambda");
  f->g.gamma = 1e39; /* beyond the f32 data's range */
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "gamma", "gamma beyond f32");
  f->g.masked = (rlk_gae_masked)2;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "masked", "masked 2");
  f->g.algo = (rlk_scan_algo)3;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "algo", "algo 3");
  f->g.returns.data = f->adv;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "overlaps", "returns = advantages");
  f->g.advantages.data = f->v;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "overlaps", "advantages = values");
  f->g.advantages = rlk_tensor_2d(f->v + BT, RLK_F32, BB, BT, BT); /* the tail of values */
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "overlaps", "advantages inside values");

  /* discounted returns */
  f->d.rewards.data = NULL;
  expect_bad(ctx, f, OP_RETURNS, RLK_ERR_INVALID_ARGUMENT, "rewards", "absent rewards");
  f->d.returns.data = NULL;
  expect_bad(ctx, f, OP_RETURNS, RLK_ERR_INVALID_ARGUMENT, "returns", "absent returns");
  f->d.gamma = -INFINITY;
  expect_bad(ctx, f, OP_RETURNS, RLK_ERR_INVALID_ARGUMENT, "gamma", "infinite gamma");
  f->d.masked = (rlk_returns_masked)-1;
  expect_bad(ctx, f, OP_RETURNS, RLK_ERR_INVALID_ARGUMENT, "masked", "masked -1");
  f->d.returns.data = f->r;
  expect_bad(ctx, f, OP_RETURNS, RLK_ERR_INVALID_ARGUMENT, "overlaps", "in place");
  f->d.mask = rlk_tensor_2d(f->maskb, RLK_BOOL, BB, BT + 1, BT + 1);
  expect_bad(ctx, f, OP_RETURNS, RLK_ERR_INVALID_ARGUMENT, "mask", "mask T mismatch");

  /* reverse cumulative sums */
  f->s.baseline = rlk_tensor_1d(f->base, RLK_F32, BB);
  expect_bad(ctx, f, OP_CUMSUM, RLK_ERR_INVALID_ARGUMENT, "advantages", "baseline without advantages");
  f->s.advantages = rlk_tensor_2d(f->ret, RLK_F32, BB, BT, BT);
  expect_bad(ctx, f, OP_CUMSUM, RLK_ERR_INVALID_ARGUMENT, "baseline", "advantages without baseline");
  f->s.baseline = rlk_tensor_1d(f->base, RLK_F32, BB - 1);
  f->s.advantages = rlk_tensor_2d(f->ret, RLK_F32, BB, BT, BT);
  expect_bad(ctx, f, OP_CUMSUM, RLK_ERR_INVALID_ARGUMENT, "baseline", "baseline too short");
  f->s.baseline = rlk_tensor_1d(f->base, RLK_F64, BB);
  f->s.advantages = rlk_tensor_2d(f->ret, RLK_F32, BB, BT, BT);
  expect_bad(ctx, f, OP_CUMSUM, RLK_ERR_INVALID_ARGUMENT, "baseline", "f64 baseline");
  f->s.baseline = rlk_tensor_1d(f->base, RLK_F32, BB);
  f->s.baseline.strides[0] = 2;
  f->s.advantages = rlk_tensor_2d(f->ret, RLK_F32, BB, BT, BT);
  expect_bad(ctx, f, OP_CUMSUM, RLK_ERR_INVALID_ARGUMENT, "baseline", "strided baseline");
  f->s.baseline = rlk_tensor_1d(f->base, RLK_F32, BB);
  f->s.advantages = f->s.out;
  expect_bad(ctx, f, OP_CUMSUM, RLK_ERR_INVALID_ARGUMENT, "overlaps", "advantages = out");
  f->s.out.data = NULL;
  expect_bad(ctx, f, OP_CUMSUM, RLK_ERR_INVALID_ARGUMENT, "out", "absent out");
  f->s.values.dtype = RLK_I32;
  expect_bad(ctx, f, OP_CUMSUM, RLK_ERR_INVALID_ARGUMENT, "values", "i32 values");
  f->s.algo = (rlk_scan_algo)-1;
  expect_bad(ctx, f, OP_CUMSUM, RLK_ERR_INVALID_ARGUMENT, "algo", "algo -1");

  /* whitening */
  f->w.x.data = NULL;
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "x", "absent x");
  f->w.out.data = NULL;
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "out", "absent out");
  f->w.out.dtype = RLK_F64;
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "out", "f64 out for f32 x");
  f->w.out = rlk_tensor_1d(f->adv, RLK_F32, BB * BT);
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "out", "1-D out for 2-D x");
  f->w.mask = rlk_tensor_1d(f->maskb, RLK_BOOL, BB * BT);
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "mask", "1-D mask for 2-D x");
  f->w.out = rlk_tensor_2d(f->r + 1, RLK_F32, BB, BT, BT);
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "overlaps", "out shifted over x");
  f->w.eps = -1.0;
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "eps", "negative eps");
  f->w.unbiased = 2;
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "unbiased", "unbiased 2");
  f->w.shift_mean = -1;
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "shift_mean", "shift_mean -1");
  f->w.count_eps = NAN;
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "count_eps", "NaN count_eps");
  f->w.eps_mode = (rlk_whiten_eps)2;
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "eps_mode", "eps_mode 2");
  f->w.masked = (rlk_whiten_masked)5;
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "masked", "masked 5");
  f->w.stats = rlk_tensor_1d(f->r64, RLK_F64, 2);
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "stats", "stats [2]");
  f->w.stats = rlk_tensor_1d(f->r, RLK_F32, 3);
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "stats", "f32 stats");
  f->w.x = rlk_tensor_2d(f->r, RLK_F32, BB, BT, BT);
  f->w.x.ndim = 3;
  expect_bad(ctx, f, OP_WHITEN, RLK_ERR_INVALID_ARGUMENT, "x", "3-D x");
  /* in place is fine */
  f->w.x = f->w.out = rlk_tensor_2d(f->ret, RLK_F32, BB, BT, BT);
  for (int i = 0; i < BB * BT; i++) f->ret[i] = (float)i;
  ck_assert_int_eq(rlk_masked_whiten(ctx, &f->w, NULL), RLK_OK);
  rlk_context_destroy(ctx);

  /* a compile-only context checks the arguments, then refuses to launch */
  ctx = rlk_test_compile_only_host_context();
  bad_reset(f);
  f->g.gamma = NAN;
  expect_bad(ctx, f, OP_GAE, RLK_ERR_INVALID_ARGUMENT, "gamma", "compile-only, bad gamma");
  for (int op = OP_GAE; op <= OP_WHITEN; op++) expect_bad(ctx, f, (bad_op)op, RLK_ERR_UNSUPPORTED, "", "compile-only");
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Precompile plans                                                                    */
/* ---------------------------------------------------------------------------------- */

#define MY_OPS &rlk_op_gae, &rlk_op_discounted_returns, &rlk_op_reverse_cumsum, &rlk_op_masked_whiten
static const rlk_op_desc *const my_ops[] = {MY_OPS};
#define N_MY_OPS (sizeof my_ops / sizeof my_ops[0])

/* Precompiling a configuration builds exactly what the matching call looks up. */
START_TEST(plan_matches_call) {
  for (int row = 0; row < 3; row++) {
    static const char *lines[] = {"gae dtype=f64 masked=zero mask=i32", "reverse_cumsum dtype=f32 algo=block baseline=1",
                                  "masked_whiten dtype=f32 mask=f32"};
    static const int kernels[] = {1, 1, 1};
    rlk_context *ctx = rlk_test_precompiled_host_context(lines[row], kernels[row]);
    uint64_t rng = rlk_test_seed() + (uint64_t)row;
    if (row == 0) {
      seq_case c = base_case(3, 40, RLK_F64);
      c.mask_dtype = RLK_I32;
      gae_case(ctx, &c, &gae_settings[1], &rng);
    } else if (row == 1) {
      seq_case c = base_case(3, 40, RLK_F32);
      c.algo = RLK_SCAN_ROW_BLOCK;
      cumsum_case(ctx, &c, 1, &rng);
    } else {
      whiten_case w;
      memset(&w, 0, sizeof w);
      w.c = base_case(3, 40, RLK_F32);
      w.c.mask_dtype = RLK_F32;
      const int64_t nn = w.c.B * w.c.T;
      double *x = malloc((size_t)nn * sizeof *x), *m = malloc((size_t)nn * sizeof *m);
      gen_whiten(&rng, &w.c, x, m);
      m[0] = m[1] = 1.0;
      whiten_check(ctx, &w, x, m, W_VERL, NULL, &rng);
      free(x);
      free(m);
    }
    rlk_test_expect_compiled_none(ctx, (uint64_t)kernels[row], lines[row]);
  }
}
END_TEST

START_TEST(plan_rejects_bad_settings) {
  static const char *const bad[][2] = {
      {"gae dtype=bf16", "dtype"},
      {"gae algo=thread", "algo"},
      {"gae B=0", "B"},
      {"gae T=x", "T"},
      {"gae mask=f64", "mask"},
      {"gae masked=reset", "masked"},
      {"gae baseline=1", "baseline"},
      {"discounted_returns masked=skip", "masked"},
      {"reverse_cumsum baseline=2", "baseline"},
      {"reverse_cumsum masked=zero", "masked"},
      {"masked_whiten dtype=f16", "dtype"},
      {"masked_whiten eps_mode=max", "eps_mode"},
      {"masked_whiten unbiased=2", "unbiased"},
      {"masked_whiten masked=keep", "masked"},
      {"masked_whiten algo=warp", "algo"},
  };
  rlk_test_expect_bad_lines(bad, sizeof bad / sizeof bad[0]);
  /* every op is listed, and its help names its settings */
  const char *ops = rlk_precompile_ops();
  for (size_t i = 0; i < N_MY_OPS; i++) {
    ck_assert_msg(strstr(ops, my_ops[i]->name) != NULL, "%s not in '%s'", my_ops[i]->name, ops);
    const char *help = rlk_precompile_help(my_ops[i]->name);
    ck_assert_ptr_nonnull(strstr(help, "dtype"));
    ck_assert_ptr_nonnull(strstr(help, "mask"));
  }
  ck_assert_ptr_nonnull(strstr(rlk_precompile_help("gae"), "algo"));
  ck_assert_ptr_nonnull(strstr(rlk_precompile_help("reverse_cumsum"), "baseline"));
  ck_assert_ptr_nonnull(strstr(rlk_precompile_help("masked_whiten"), "eps_mode"));
}
END_TEST

/* On a GPU target the samples reach every dtype x family and family x algorithm pair of the scan
 * template and both whitening entries in both dtypes; auto selection picks by shape. */
START_TEST(samples_cover_every_variant) {
  rlk_context *ctx = rlk_test_compile_only_cuda_context("sm_90a", "advantage_scan samples coverage");
  if (!ctx) return;
  int pairs_df[2][2] = {{0}}, pairs_fa[2][2] = {{0}}, pairs_da[2][2] = {{0}}, whiten[2][2] = {{0}};
  for (size_t i = 0; i < N_MY_OPS; i++)
    for (size_t j = 0; my_ops[i]->samples[j]; j++) {
      rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
      size_t ns = 0;
      ck_assert_msg(rlk_test_plan_line(my_ops[i], ctx, my_ops[i]->samples[j], specs, &ns) == RLK_OK, "%s: %s",
                    my_ops[i]->samples[j], rlk_last_error());
      for (size_t k = 0; k < ns; k++) {
        const int d = specs[k].values[0] == RLK_F64;
        if (!strcmp(specs[k].tmpl->entry, "advantage_scan")) {
          const int f = (int)specs[k].values[1], a = (int)specs[k].values[2];
          pairs_df[d][f]++;
          pairs_fa[f][a]++;
          pairs_da[d][a]++;
        } else {
          whiten[d][strstr(specs[k].tmpl->entry, "apply") != NULL]++;
        }
      }
    }
  for (int x = 0; x < 2; x++)
    for (int y = 0; y < 2; y++) {
      ck_assert_msg(pairs_df[x][y] && pairs_fa[x][y] && pairs_da[x][y], "a scan variant pair is not sampled");
      ck_assert_msg(whiten[x][y], "a whitening entry/dtype is not sampled");
    }
  /* auto: short rows a warp each, long rows a block each; no shape: both */
  static const struct {
    const char *line;
    int algo; /* -1: both */
  } autos[] = {{"gae T=512 B=4", 0}, {"gae T=513 B=4", 1}, {"gae dtype=f64 T=257 B=1", 1},
               {"gae dtype=f64 T=256 B=100", 0}, {"gae", -1}};
  for (size_t i = 0; i < sizeof autos / sizeof autos[0]; i++) {
    rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
    size_t ns = 0;
    ck_assert_int_eq(rlk_test_plan_line(&rlk_op_gae, ctx, autos[i].line, specs, &ns), RLK_OK);
    if (autos[i].algo < 0) {
      ck_assert_uint_eq(ns, 2);
      ck_assert(specs[0].values[2] != specs[1].values[2]);
    } else {
      ck_assert_uint_eq(ns, 1);
      ck_assert_msg(specs[0].values[2] == autos[i].algo, "%s: algo %lld", autos[i].line, (long long)specs[0].values[2]);
    }
  }
  rlk_context_destroy(ctx);
}
END_TEST

RLK_SAMPLES_CASE("advantage_scan", MY_OPS)

/* ---------------------------------------------------------------------------------- */
/* CUDA (RLK_TEST_GPU=1)                                                               */
/* ---------------------------------------------------------------------------------- */

static rlk_context *cuda_context(void) { return rlk_test_cuda_context("advantage_scan"); }

RLK_GPU_CASE("advantage_scan", gae)
RLK_GPU_CASE("advantage_scan", gae_long)
RLK_GPU_CASE("advantage_scan", returns)
RLK_GPU_CASE("advantage_scan", cumsum)
RLK_GPU_CASE("advantage_scan", scan_edges)
RLK_GPU_CASE("advantage_scan", mask_robustness)
RLK_GPU_CASE("advantage_scan", reset_stops_nonfinite)
RLK_GPU_CASE("advantage_scan", scan_deterministic)
RLK_GPU_CASE("advantage_scan", whiten)
RLK_GPU_CASE("advantage_scan", whiten_edges)
RLK_GPU_CASE("advantage_scan", whiten_deterministic)
RLK_GPU_CASE("advantage_scan", pipeline)

/* The benchmark shapes, against the references, every algorithm; whitening over many partials. */
START_TEST(gpu_bench_shapes) {
  if (!rlk_test_gpu_enabled("advantage_scan")) return;
  rlk_context *ctx = cuda_context();
  if (!ctx) return;
  uint64_t rng = rlk_test_seed() ^ 0x5eed;
  static const int64_t shapes[][2] = {{256, 4096}, {8, 20480}, {256, 1024}, {4096, 64}, {1, 100000}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t ai = 0; ai < 3; ai++) {
      seq_case c = base_case(shapes[s][0], shapes[s][1], s % 2 ? RLK_F64 : RLK_F32);
      c.algo = algos[ai];
      gae_case(ctx, &c, &gae_settings[(s + ai) % N_GAE_SETTINGS], &rng);
      returns_case(ctx, &c, 0.99, (rlk_returns_masked)(ai % 2), &rng);
    }
  whiten_case w;
  memset(&w, 0, sizeof w);
  w.c = base_case(1024, 4096, RLK_F32);
  const int64_t n = w.c.B * w.c.T;
  double *x = malloc((size_t)n * sizeof *x), *m = malloc((size_t)n * sizeof *m);
  gen_whiten(&rng, &w.c, x, m);
  whiten_check(ctx, &w, x, m, W_VERL, NULL, &rng);
  whiten_check(ctx, &w, x, m, W_OPENRLHF, NULL, &rng);
  free(x);
  free(m);
  rlk_context_destroy(ctx);
}
END_TEST

Suite *advantage_scan_suite(void) {
  Suite *s = suite_create("advantage_scan");
  rlk_test_add_case(s, "host", 120, TESTS(args_init_defaults, host_gae, host_gae_long, host_returns,
      host_cumsum, host_scan_edges, host_mask_robustness, host_reset_stops_nonfinite, host_scan_deterministic, host_whiten,
      host_whiten_edges, host_whiten_deterministic, host_pipeline, host_whiten_no_workspace, bad_arguments));

  rlk_test_add_case(s, "plan", 300, TESTS(plan_matches_call, plan_rejects_bad_settings,
      samples_cover_every_variant, samples_compile_every_target));

  rlk_test_add_case(s, "gpu", 300, TESTS(gpu_gae, gpu_gae_long, gpu_returns, gpu_cumsum, gpu_scan_edges,
      gpu_mask_robustness, gpu_reset_stops_nonfinite, gpu_scan_deterministic, gpu_whiten, gpu_whiten_edges, gpu_whiten_deterministic,
      gpu_pipeline, gpu_bench_shapes));
  return s;
}

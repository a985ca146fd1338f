/* test_sample.c - rlk_sample on the host backend and, with RLK_TEST_GPU=1, on CUDA:
 *   - the drawn distribution is the filtered, renormalized one (chi-square against the fp64
 *     reference of tests/ref/sample_ref.c, for every filter combination; filtered-out tokens
 *     never drawn);
 *   - logp bitwise equal to rlk_logprob's for the same row, temperature and label;
 *   - the threshold: the smallest logit the reference keeps (-inf unfiltered, the maximum for a
 *     greedy row, NaN without a token);
 *   - reproducibility (same seed and offset, same tokens; a row with its own seed independent of
 *     the batch around it; a scalar seed gives rows their own streams), the Philox draws against
 *     the reference generator, greedy rows, the edge cases (top_k >= V, a tiny top_p, -inf logits,
 *     equal logits, NaN rows, bad per-row settings) and argument validation;
 *   - a row split over the blocks of a cluster (row_split): the same tokens and log-probs as one
 *     block a row, and its draws against the reference distribution;
 *   - calls back to back, each seeded by the previous one's tokens: the same results with pdl
 *     (overlapping launches) as plainly launched and synchronized calls;
 *   - the precompile plan (row_split's choices included) and the op's samples compiled for every
 *     target.
 * Outputs are poisoned before each call. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../templates/host/rlk_host_philox.h"
#include "ops/ops.h"
#include "ref/sample_ref.h"
#include "suites.h"
#include "test_util.h"

/* ---------------------------------------------------------------------------------- */
/* Storage                                                                             */
/* ---------------------------------------------------------------------------------- */

static void dev_download(rlk_context *ctx, void *dst, const void *src, size_t bytes) {
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, dst, src, bytes), RLK_OK);
}

static int is_gpu(rlk_context *ctx) { return rlk_context_backend(ctx) != RLK_BACKEND_HOST; }

/* ---------------------------------------------------------------------------------- */
/* One call                                                                            */
/* ---------------------------------------------------------------------------------- */

/* A batch: B rows of V logits (row stride V + pad) in dtype dt, on the host. */
typedef struct smp_batch {
  int64_t B, V, pad;
  rlk_dtype dt;
  void *x;    /* the stored logits */
  double *xd; /* their values, B x V */
  void *dev;  /* when set: the logits already on the device (run_sample uses them as they are) */
} smp_batch;

static smp_batch batch_new(int64_t B, int64_t V, int64_t pad, rlk_dtype dt) {
  smp_batch b;
  b.B = B;
  b.V = V;
  b.pad = pad;
  b.dt = dt;
  const int64_t elems = (B - 1) * (V + pad) + V;
  b.x = malloc((size_t)elems * rlk_dtype_size(dt));
  memset(b.x, 0x7f, (size_t)elems * rlk_dtype_size(dt)); /* padding: huge values, never read */
  b.xd = malloc((size_t)(B * V) * sizeof(double));
  b.dev = NULL;
  return b;
}

static void batch_set(smp_batch *b, int64_t i, int64_t j, double v) {
  b->xd[i * b->V + j] = rlk_test_store(b->x, b->dt, i * (b->V + b->pad) + j, v);
}

/* Row i's largest logit's column (the lowest of equal maxima): the greedy token. */
static int64_t batch_argmax(const smp_batch *b, int64_t i) {
  const int64_t V = b->V;
  int64_t arg = 0;
  for (int64_t j = 1; j < V; j++)
    if (b->xd[i * V + j] > b->xd[i * V + arg]) arg = j;
  return arg;
}

/* Every row a copy of row 0. */
static void batch_copy_row0(smp_batch *b) {
  const size_t es = rlk_dtype_size(b->dt), row = (size_t)b->V * es;
  for (int64_t i = 1; i < b->B; i++) {
    memcpy((char *)b->x + (size_t)(i * (b->V + b->pad)) * es, b->x, row);
    memcpy(b->xd + i * b->V, b->xd, (size_t)b->V * sizeof(double));
  }
}

/* Every row the same copy of x[V]: row 0 stored, then copied. */
static void batch_fill_rows(smp_batch *b, const double *x) {
  for (int64_t j = 0; j < b->V; j++) batch_set(b, 0, j, x[j]);
  batch_copy_row0(b);
}

static void batch_free(smp_batch *b) {
  free(b->x);
  free(b->xd);
}

/* Settings of a call: scalars, or per-row arrays when the pointers are set. */
typedef struct smp_settings {
  float temperature;
  int64_t top_k;
  float top_p, min_p;
  uint64_t seed, offset;
  const float *temperatures;
  const int64_t *top_ks;
  const float *top_ps, *min_ps;
  const uint64_t *seeds, *offsets;
  rlk_dtype token_dtype;
  int logprob_block, logprob_unroll;
  int row_split;
} smp_settings;

static smp_settings settings_default(void) {
  return (smp_settings){.temperature = 1.0f, .top_p = 1.0f, .token_dtype = RLK_I64};
}

typedef struct smp_out {
  int64_t *tokens;
  float *logp, *logp_filtered, *threshold;
  int32_t status;
} smp_out;

static void out_free(smp_out *o) {
  free(o->tokens);
  free(o->logp);
  free(o->logp_filtered);
  free(o->threshold);
  memset(o, 0, sizeof *o);
}

/* Runs rlk_sample on ctx; the status of the call is returned (the outputs are read only on OK). */
static rlk_status run_sample(rlk_context *ctx, const smp_batch *b, const smp_settings *s, smp_out *o) {
  const int64_t B = b->B, V = b->V, rs = V + b->pad;
  const size_t es = rlk_dtype_size(b->dt), ts = rlk_dtype_size(s->token_dtype);
  const int64_t elems = (B - 1) * rs + V;
  void *xd = b->dev ? b->dev : rlk_test_dev_upload(ctx, b->x, (size_t)elems * es);
  void *tok = rlk_test_dev_alloc(ctx, (size_t)B * ts), *lp = rlk_test_dev_alloc(ctx, (size_t)B * 4),
       *lpf = rlk_test_dev_alloc(ctx, (size_t)B * 4), *st = rlk_test_dev_alloc(ctx, 4),
       *thr = rlk_test_dev_alloc(ctx, (size_t)B * 4);
  ck_assert_int_eq(rlk_memset(ctx, tok, 0xa5, (size_t)B * ts), RLK_OK);
  ck_assert_int_eq(rlk_memset(ctx, lp, 0xff, (size_t)B * 4), RLK_OK);
  ck_assert_int_eq(rlk_memset(ctx, lpf, 0xff, (size_t)B * 4), RLK_OK);
  ck_assert_int_eq(rlk_memset(ctx, thr, 0xff, (size_t)B * 4), RLK_OK);
  ck_assert_int_eq(rlk_memset(ctx, st, 0, 4), RLK_OK);
  void *dT = NULL, *dK = NULL, *dP = NULL, *dM = NULL, *dS = NULL, *dO = NULL;
  rlk_sample_args a;
  rlk_sample_args_init(&a);
  a.logits = rlk_tensor_2d(xd, b->dt, B, V, rs);
  a.temperature = s->temperature;
  a.top_k = s->top_k;
  a.top_p = s->top_p;
  a.min_p = s->min_p;
  a.seed = s->seed;
  a.offset = s->offset;
  if (s->temperatures) a.temperatures = rlk_tensor_1d(dT = rlk_test_dev_upload(ctx, s->temperatures, (size_t)B * 4), RLK_F32, B);
  if (s->top_ks) a.top_ks = rlk_tensor_1d(dK = rlk_test_dev_upload(ctx, s->top_ks, (size_t)B * 8), RLK_I64, B);
  if (s->top_ps) a.top_ps = rlk_tensor_1d(dP = rlk_test_dev_upload(ctx, s->top_ps, (size_t)B * 4), RLK_F32, B);
  if (s->min_ps) a.min_ps = rlk_tensor_1d(dM = rlk_test_dev_upload(ctx, s->min_ps, (size_t)B * 4), RLK_F32, B);
  if (s->seeds) a.seeds = rlk_tensor_1d(dS = rlk_test_dev_upload(ctx, s->seeds, (size_t)B * 8), RLK_I64, B);
  if (s->offsets) a.offsets = rlk_tensor_1d(dO = rlk_test_dev_upload(ctx, s->offsets, (size_t)B * 8), RLK_I64, B);
  a.tokens = rlk_tensor_1d(tok, s->token_dtype, B);
  a.logp = rlk_tensor_1d(lp, RLK_F32, B);
  a.logp_filtered = rlk_tensor_1d(lpf, RLK_F32, B);
  a.threshold = rlk_tensor_1d(thr, RLK_F32, B);
  a.status = rlk_tensor_1d(st, RLK_I32, 1);
  a.logprob_block = s->logprob_block;
  a.logprob_unroll = s->logprob_unroll;
  a.row_split = s->row_split;
  const rlk_status r = rlk_sample(ctx, &a, NULL);
  if (r == RLK_OK) {
    ck_assert_msg(rlk_stream_synchronize(ctx, NULL) == RLK_OK, "sync: %s", rlk_last_error());
    o->tokens = malloc((size_t)B * 8);
    o->logp = malloc((size_t)B * 4);
    o->logp_filtered = malloc((size_t)B * 4);
    o->threshold = malloc((size_t)B * 4);
    void *th = malloc((size_t)B * ts);
    dev_download(ctx, th, tok, (size_t)B * ts);
    for (int64_t i = 0; i < B; i++)
      o->tokens[i] = s->token_dtype == RLK_I32 ? ((int32_t *)th)[i] : ((int64_t *)th)[i];
    free(th);
    dev_download(ctx, o->logp, lp, (size_t)B * 4);
    dev_download(ctx, o->logp_filtered, lpf, (size_t)B * 4);
    dev_download(ctx, o->threshold, thr, (size_t)B * 4);
    dev_download(ctx, &o->status, st, 4);
  }
  void *all[] = {b->dev ? NULL : xd, tok, lp, lpf, st, thr, dT, dK, dP, dM, dS, dO};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]) rlk_free(ctx, all[i]);
  return r;
}

static void sample_ok(rlk_context *ctx, const smp_batch *b, const smp_settings *s, smp_out *o) {
  const rlk_status r = run_sample(ctx, b, s, o);
  ck_assert_msg(r == RLK_OK, "rlk_sample: %s", rlk_last_error());
}

/* ---------------------------------------------------------------------------------- */
/* The distribution                                                                    */
/* ---------------------------------------------------------------------------------- */

typedef struct dist_case {
  int64_t V;
  rlk_dtype dt;
  double scale; /* logits ~ scale N(0, 1) */
  float T;
  int64_t top_k;
  float top_p, min_p;
  int ties;     /* quantize the logits so that many are equal */
  int neg_inf;  /* some -inf logits */
  int row_split; /* rlk_sample_args.row_split */
  int64_t pad;   /* row stride V + pad: rows that start off a 16-byte boundary */
  int block;     /* rlk_sample_args.logprob_block */
} dist_case;

/* Draws logits for a case whose filters are not within rounding of a flip (re-drawn otherwise:
 * row 0 alone until one is clear, then copied to every row). A case none of 100 draws leaves
 * clear is a case that tests rounding, not the sampler: it fails. */
static void draw_case_logits(uint64_t *rng, const dist_case *c, smp_batch *b, double *probs) {
  double *x = malloc((size_t)c->V * sizeof *x);
  double margin = 0.0;
  for (int attempt = 0; attempt < 100; attempt++) {
    for (int64_t j = 0; j < c->V; j++) {
      double v = c->scale * rlk_test_rand_normal(rng);
      if (c->ties) v = floor(v * 2.0) / 2.0;
      if (c->neg_inf && rlk_test_rand_uniform(rng) < 0.3) v = -INFINITY;
      x[j] = v;
    }
    if (c->neg_inf) x[rlk_test_rand_u64(rng) % (uint64_t)c->V] = 1.0; /* something finite */
    for (int64_t j = 0; j < c->V; j++) batch_set(b, 0, j, x[j]);
    smp_ref_probs(b->xd, c->V, (double)c->T, c->top_k, (double)c->top_p, (double)c->min_p, probs,
                  &margin);
    if (margin > 1e-4) break;
  }
  free(x);
  ck_assert_msg(margin > 1e-4,
                "V=%lld T=%g k=%lld p=%g min_p=%g: no draw of 100 leaves the filters clear of rounding",
                (long long)c->V, (double)c->T, (long long)c->top_k, (double)c->top_p, (double)c->min_p);
  batch_copy_row0(b);
}

/* The threshold a row of logits x (as stored) should get: the smallest logit the reference keeps
 * where a filter is on (every logit at or above it kept), -inf where none is. */
static float expected_threshold(const dist_case *c, const double *x, const double *probs) {
  if (!((c->top_k > 0 && c->top_k < c->V) || c->top_p < 1.0f || c->min_p > 0.0f)) return -INFINITY;
  double lo = INFINITY;
  for (int64_t j = 0; j < c->V; j++)
    if (probs[j] > 0.0 && x[j] < lo) lo = x[j];
  for (int64_t j = 0; j < c->V; j++)
    ck_assert_msg(!(x[j] >= lo) || probs[j] > 0.0, "the reference's kept set is no upper set at %lld", (long long)j);
  return (float)lo;
}

/* Draws n tokens of one case (rows of identical logits, a seed per row, offsets advancing) and
 * checks them against the reference distribution: never a filtered-out token, and a chi-square
 * statistic below its 5-sigma bound; and every row's threshold the smallest kept logit. */
static void check_distribution(rlk_context *ctx, const dist_case *c, uint64_t *rng, int64_t n) {
  /* rows per call: 4096, fewer for a large vocabulary (the batch is copied to the device) */
  const int64_t cap = c->V > 100000 ? 2048 : 4096, B = n < cap ? n : cap;
  smp_batch b = batch_new(B, c->V, c->pad, c->dt);
  double *probs = malloc((size_t)c->V * sizeof *probs);
  draw_case_logits(rng, c, &b, probs);
  int64_t *counts = calloc((size_t)c->V, sizeof *counts);
  uint64_t *seeds = malloc((size_t)B * 8);
  const uint64_t base = rlk_test_rand_u64(rng);
  smp_settings s = settings_default();
  s.temperature = c->T;
  s.top_k = c->top_k;
  s.top_p = c->top_p;
  s.min_p = c->min_p;
  s.seeds = seeds;
  s.row_split = c->row_split;
  s.logprob_block = c->block;
  int64_t drawn = 0;
  const float thr = expected_threshold(c, b.xd, probs);
  for (uint64_t round = 0; drawn < n; round++) {
    for (int64_t i = 0; i < B; i++) seeds[i] = base + (uint64_t)i * 0x9e3779b97f4a7c15ull;
    s.offset = round;
    smp_out o;
    sample_ok(ctx, &b, &s, &o);
    ck_assert_int_eq(o.status, 0);
    for (int64_t i = 0; i < B && drawn < n; i++, drawn++) {
      const int64_t y = o.tokens[i];
      ck_assert_msg(y >= 0 && y < c->V, "token %lld out of range", (long long)y);
      ck_assert_msg(probs[y] > 0.0,
                    "V=%lld T=%g k=%lld p=%g min_p=%g: drew token %lld, which the filters remove",
                    (long long)c->V, (double)c->T, (long long)c->top_k, (double)c->top_p,
                    (double)c->min_p, (long long)y);
      counts[y]++;
      ck_assert_msg(memcmp(&o.threshold[i], &thr, 4) == 0,
                    "V=%lld T=%g k=%lld p=%g min_p=%g: threshold %.9g, the smallest kept logit is %.9g",
                    (long long)c->V, (double)c->T, (long long)c->top_k, (double)c->top_p, (double)c->min_p,
                    (double)o.threshold[i], (double)thr);
    }
    out_free(&o);
  }
  /* chi-square over tokens expected at least 5 times; the rest pooled in one bin */
  double chi = 0.0, pool_e = 0.0;
  int64_t pool_o = 0, bins = 0;
  for (int64_t j = 0; j < c->V; j++) {
    const double e = probs[j] * (double)n;
    if (probs[j] == 0.0) continue;
    if (e >= 5.0) {
      chi += ((double)counts[j] - e) * ((double)counts[j] - e) / e;
      bins++;
    } else {
      pool_e += e;
      pool_o += counts[j];
    }
  }
  if (pool_e >= 5.0) {
    chi += ((double)pool_o - pool_e) * ((double)pool_o - pool_e) / pool_e;
    bins++;
  }
  if (bins >= 2) {
    const double bound = smp_ref_chi2_bound((double)(bins - 1), 5.0);
    ck_assert_msg(chi <= bound,
                  "V=%lld %s T=%g k=%lld p=%g min_p=%g ties=%d: chi-square %.1f over %lld bins "
                  "(bound %.1f, %lld draws, seed %llu)",
                  (long long)c->V, rlk_dtype_name(c->dt), (double)c->T, (long long)c->top_k,
                  (double)c->top_p, (double)c->min_p, c->ties, chi, (long long)bins, bound,
                  (long long)n, (unsigned long long)rlk_test_seed());
  }
  free(counts);
  free(seeds);
  free(probs);
  batch_free(&b);
}

/* Every filter combination at one vocabulary size. */
static void cases_distribution(rlk_context *ctx, uint64_t *rng, int64_t V, rlk_dtype dt, int64_t n) {
  const dist_case cases[] = {
      {V, dt, 1.5, 1.0f, 0, 1.0f, 0.0f, 0, 0},     /* plain */
      {V, dt, 1.5, 0.7f, 0, 1.0f, 0.0f, 0, 0},     /* temperature */
      {V, dt, 2.0, 1.0f, 10, 1.0f, 0.0f, 0, 0},    /* top-k */
      {V, dt, 2.0, 1.3f, 0, 0.8f, 0.0f, 0, 0},     /* top-p */
      {V, dt, 2.0, 1.0f, 0, 1.0f, 0.05f, 0, 0},    /* min-p */
      {V, dt, 2.0, 0.7f, 40, 0.9f, 0.0f, 0, 0},    /* top-k then top-p */
      {V, dt, 2.0, 1.0f, 30, 0.7f, 0.02f, 0, 0},   /* all three */
      {V, dt, 2.0, 1.0f, 25, 0.6f, 0.0f, 1, 0},    /* ties at the thresholds */
      {V, dt, 2.0, 1.0f, V / 2, 0.95f, 0.0f, 0, 0}, /* a large k */
      {V, dt, 2.0, 1.0f, 0, 0.9f, 0.0f, 0, 1},     /* -inf logits */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_distribution(ctx, &cases[i], rng, n);
}

/* ---------------------------------------------------------------------------------- */
/* logp against rlk_logprob                                                            */
/* ---------------------------------------------------------------------------------- */

/* rlk_logprob of row i of the batch's device logits (the very memory the sampler read: the
 * row's 16-byte alignment decides how rlk_logprob splits it) with label y and temperature T. */
static float logprob_of(rlk_context *ctx, const smp_batch *b, int64_t i, int64_t y, float T, int block,
                        int unroll) {
  const size_t es = rlk_dtype_size(b->dt);
  void *ld = rlk_test_dev_upload(ctx, &y, 8);
  float *lp = rlk_test_dev_alloc(ctx, 4);
  rlk_logprob_args a;
  rlk_logprob_args_init(&a);
  a.logits = rlk_tensor_2d((char *)b->dev + (size_t)(i * (b->V + b->pad)) * es, b->dt, 1, b->V, b->V);
  a.labels = rlk_tensor_1d(ld, RLK_I64, 1);
  a.temperature = T;
  a.logp = rlk_tensor_1d(lp, RLK_F32, 1);
  a.block = block;
  a.unroll = unroll;
  ck_assert_msg(rlk_logprob(ctx, &a, NULL) == RLK_OK, "rlk_logprob: %s", rlk_last_error());
  float out;
  dev_download(ctx, &out, lp, 4);
  rlk_free(ctx, ld);
  rlk_free(ctx, lp);
  return out;
}

/* Samples rows with mixed per-row temperatures (greedy ones included) and filters; every logp
 * must carry rlk_logprob's bits for its row, temperature and token. */
static void check_logp_bitwise(rlk_context *ctx, uint64_t *rng, int64_t B, int64_t V, rlk_dtype dt,
                               int64_t pad, int filters, int block, int unroll) {
  smp_batch b = batch_new(B, V, pad, dt);
  for (int64_t i = 0; i < B; i++)
    for (int64_t j = 0; j < V; j++) batch_set(&b, i, j, 3.0 * rlk_test_rand_normal(rng));
  b.dev = rlk_test_dev_upload(ctx, b.x, (size_t)((B - 1) * (V + pad) + V) * rlk_dtype_size(dt));
  float *T = malloc((size_t)B * 4);
  int64_t *K = malloc((size_t)B * 8);
  float *P = malloc((size_t)B * 4);
  uint64_t *S = malloc((size_t)B * 8);
  static const float temps[] = {1.0f, 0.7f, 0.0f, 1.3f, 0.25f};
  for (int64_t i = 0; i < B; i++) {
    T[i] = temps[i % 5];
    K[i] = filters ? (int64_t)(i % 3 == 0 ? 0 : 1 + i % 50) : 0;
    P[i] = filters && i % 2 ? 0.9f : 1.0f;
    S[i] = rlk_test_rand_u64(rng);
  }
  smp_settings s = settings_default();
  s.temperatures = T;
  s.top_ks = filters ? K : NULL;
  s.top_ps = filters ? P : NULL;
  s.seeds = S;
  s.logprob_block = block;
  s.logprob_unroll = unroll;
  smp_out o;
  sample_ok(ctx, &b, &s, &o);
  ck_assert_int_eq(o.status, 0);
  for (int64_t i = 0; i < B; i++) {
    const int64_t y = o.tokens[i];
    ck_assert_msg(y >= 0 && y < V, "row %lld: token %lld", (long long)i, (long long)y);
    const float want = logprob_of(ctx, &b, i, y, T[i] == 0.0f ? 1.0f : T[i], block, unroll);
    uint32_t gb, wb;
    memcpy(&gb, &o.logp[i], 4);
    memcpy(&wb, &want, 4);
    ck_assert_msg(gb == wb,
                  "V=%lld %s row %lld T=%g k=%lld p=%g token %lld: logp %.9g (0x%08x), rlk_logprob "
                  "%.9g (0x%08x)",
                  (long long)V, rlk_dtype_name(dt), (long long)i, (double)T[i], (long long)K[i],
                  (double)P[i], (long long)y, (double)o.logp[i], gb, (double)want, wb);
    if (T[i] == 0.0f) {
      /* greedy: the lowest index of the maximum */
      const int64_t arg = batch_argmax(&b, i);
      ck_assert_msg(y == arg, "row %lld greedy: token %lld, argmax %lld", (long long)i, (long long)y,
                    (long long)arg);
      ck_assert(o.logp_filtered[i] == 0.0f);
      ck_assert_msg(o.threshold[i] == (float)b.xd[i * V + arg], "row %lld greedy: threshold %g, not the maximum",
                    (long long)i, (double)o.threshold[i]);
    } else if (!filters || (K[i] == 0 && P[i] == 1.0f)) {
      ck_assert_msg(memcmp(&o.logp_filtered[i], &o.logp[i], 4) == 0, "row %lld: unfiltered logp_filtered",
                    (long long)i);
      ck_assert_msg(o.threshold[i] == -INFINITY, "row %lld unfiltered: threshold %g", (long long)i,
                    (double)o.threshold[i]);
    } else {
      ck_assert_msg(o.logp_filtered[i] >= o.logp[i] - 1e-5f && o.logp_filtered[i] <= 1e-5f,
                    "row %lld: logp_filtered %g, logp %g", (long long)i, (double)o.logp_filtered[i],
                    (double)o.logp[i]);
    }
  }
  out_free(&o);
  free(T);
  free(K);
  free(P);
  free(S);
  rlk_free(ctx, b.dev);
  batch_free(&b);
}

/* ---------------------------------------------------------------------------------- */
/* A row over the blocks of a cluster                                                  */
/* ---------------------------------------------------------------------------------- */

/* Unfiltered rows (temperatures mixed, greedy ones included, and with B 33 a NaN row, an all -inf
 * row and a bad temperature) sampled with every row_split: the tokens, log-probs and status are
 * those of one block a row, bit for bit, and logp is rlk_logprob's. */
static void cases_row_split(rlk_context *ctx, uint64_t *rng) {
  static const struct {
    int64_t V, pad;
    rlk_dtype dt;
  } shapes[] = {{151936, 0, RLK_BF16}, {151936, 0, RLK_F32}, {50257, 3, RLK_F16},
                {128256, 0, RLK_BF16}, {32000, 8, RLK_F32},   {4097, 0, RLK_BF16}};
  static const int64_t batches[] = {1, 3, 33};
  static const int splits[] = {2, 4, 8, RLK_SAMPLE_ROW_SPLIT_AUTO};
  static const float temps[] = {1.0f, 0.7f, 0.0f, 1.3f, 0.25f};
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
    for (size_t q = 0; q < sizeof batches / sizeof batches[0]; q++) {
      const int64_t B = batches[q], V = shapes[k].V;
      smp_batch b = batch_new(B, V, shapes[k].pad, shapes[k].dt);
      for (int64_t i = 0; i < B; i++)
        for (int64_t j = 0; j < V; j++) batch_set(&b, i, j, 3.0 * rlk_test_rand_normal(rng));
      float *T = malloc((size_t)B * 4);
      uint64_t *S = malloc((size_t)B * 8);
      for (int64_t i = 0; i < B; i++) {
        T[i] = temps[(i + (int64_t)k) % 5];
        S[i] = rlk_test_rand_u64(rng);
      }
      if (B == 33) {
        batch_set(&b, 5, V / 3, NAN);
        for (int64_t j = 0; j < V; j++) batch_set(&b, 7, j, -INFINITY);
        T[9] = -1.0f;
      }
      b.dev = rlk_test_dev_upload(ctx, b.x, (size_t)((B - 1) * (V + b.pad) + V) * rlk_dtype_size(b.dt));
      smp_settings s = settings_default();
      s.temperatures = T;
      s.seeds = S;
      s.offset = rlk_test_rand_u64(rng);
      s.row_split = 1;
      smp_out one;
      sample_ok(ctx, &b, &s, &one);
      for (size_t m = 0; m < sizeof splits / sizeof splits[0]; m++) {
        s.row_split = splits[m];
        smp_out o;
        sample_ok(ctx, &b, &s, &o);
        ck_assert_int_eq(o.status, one.status);
        for (int64_t i = 0; i < B; i++)
          ck_assert_msg(o.tokens[i] == one.tokens[i] && !memcmp(&o.logp[i], &one.logp[i], 4) &&
                            !memcmp(&o.logp_filtered[i], &one.logp_filtered[i], 4),
                        "V=%lld %s B=%lld row_split %d row %lld (T %g): token %lld logp %.9g lpf %.9g; one "
                        "block a row: %lld %.9g %.9g",
                        (long long)V, rlk_dtype_name(b.dt), (long long)B, splits[m], (long long)i, (double)T[i],
                        (long long)o.tokens[i], (double)o.logp[i], (double)o.logp_filtered[i],
                        (long long)one.tokens[i], (double)one.logp[i], (double)one.logp_filtered[i]);
        out_free(&o);
      }
      for (int64_t i = 0; i < B; i++) {
        if (B == 33 && (i == 5 || i == 7 || i == 9)) {
          ck_assert_int_eq(one.tokens[i], -1);
          continue;
        }
        const int64_t y = one.tokens[i];
        ck_assert_msg(y >= 0 && y < V, "row %lld: token %lld", (long long)i, (long long)y);
        const float want = logprob_of(ctx, &b, i, y, T[i] == 0.0f ? 1.0f : T[i], 0, 0);
        ck_assert_msg(!memcmp(&want, &one.logp[i], 4), "V=%lld row %lld: logp %.9g, rlk_logprob %.9g",
                      (long long)V, (long long)i, (double)one.logp[i], (double)want);
      }
      if (B == 33)
        ck_assert_int_eq(one.status, RLK_SAMPLE_STATUS_NAN | RLK_SAMPLE_STATUS_NO_TOKEN | RLK_SAMPLE_STATUS_BAD_PARAM);
      out_free(&one);
      free(T);
      free(S);
      rlk_free(ctx, b.dev);
      batch_free(&b);
    }
}

/* ---------------------------------------------------------------------------------- */
/* Reproducibility, the generator, edge cases                                          */
/* ---------------------------------------------------------------------------------- */

static void cases_reproducible(rlk_context *ctx, uint64_t *rng, int64_t V, int filters) {
  const int64_t B = 64;
  smp_batch b = batch_new(B, V, 0, RLK_F32);
  double *x = malloc((size_t)V * sizeof *x);
  for (int64_t j = 0; j < V; j++) x[j] = 0.5 * rlk_test_rand_normal(rng); /* flat: many outcomes */
  batch_fill_rows(&b, x);
  uint64_t seeds[64];
  for (int i = 0; i < B; i++) seeds[i] = rlk_test_rand_u64(rng);
  smp_settings s = settings_default();
  s.seeds = seeds;
  s.offset = 17;
  if (filters) {
    s.top_k = V / 2;
    s.top_p = 0.95f;
  }
  smp_out o1, o2, o3;
  sample_ok(ctx, &b, &s, &o1);
  sample_ok(ctx, &b, &s, &o2);
  ck_assert_msg(memcmp(o1.tokens, o2.tokens, (size_t)B * 8) == 0, "same seeds and offset, other tokens");
  ck_assert(memcmp(o1.logp, o2.logp, (size_t)B * 4) == 0);
  s.offset = 18;
  sample_ok(ctx, &b, &s, &o3);
  int differ = 0;
  for (int i = 0; i < B; i++) differ += o1.tokens[i] != o3.tokens[i];
  ck_assert_msg(differ > B / 4, "a new offset changed only %d of %lld tokens", differ, (long long)B);
  out_free(&o3);

  /* a row with its own seed: the same token at another place in a smaller batch (at the same
   * 16-byte alignment: a row's split into vectors depends on it) */
  smp_batch b2 = batch_new(5, V, 4, RLK_F32);
  batch_fill_rows(&b2, x);
  uint64_t seeds2[5] = {seeds[40], seeds[3], seeds[63], seeds[0], seeds[17]};
  const int at[5] = {40, 3, 63, 0, 17};
  smp_settings s2 = s;
  s2.seeds = seeds2;
  s2.offset = 17;
  smp_out o4;
  sample_ok(ctx, &b2, &s2, &o4);
  for (int i = 0; i < 5; i++)
    ck_assert_msg(o4.tokens[i] == o1.tokens[at[i]], "row with seed of row %d: token %lld, was %lld", at[i],
                  (long long)o4.tokens[i], (long long)o1.tokens[at[i]]);
  out_free(&o4);
  batch_free(&b2);

  /* a scalar seed: rows draw from their own streams */
  smp_settings s3 = settings_default();
  s3.seed = 12345;
  if (filters) s3.top_k = V / 2;
  smp_out o5;
  sample_ok(ctx, &b, &s3, &o5);
  int distinct = 0;
  for (int i = 1; i < B; i++) distinct += o5.tokens[i] != o5.tokens[0];
  ck_assert_msg(distinct > B / 4, "a scalar seed: %d of %lld rows differ from row 0", distinct, (long long)B);
  out_free(&o5);
  out_free(&o1);
  out_free(&o2);
  free(x);
  batch_free(&b);
}

/* Equal logits make every mass exactly 2^40, so the masked draw's token is umulhi(R1, V 2^40) >> 40
 * when the kernel walks the row in index order: the kernel's Philox draws and counters against the
 * reference generator (min_p > 0 takes the masked path; min_p 1 keeps every token since all are
 * the maximum). V = 8 f32 rows are two aligned 16-byte vectors in one thread's share, which the GPU
 * walks in index order (a share's scalar head and tail come first, so V must have none). */
static void cases_philox(rlk_context *ctx) {
  const int64_t B = 300, V = 8;
  smp_batch b = batch_new(B, V, 0, RLK_F32);
  for (int64_t i = 0; i < B; i++)
    for (int64_t j = 0; j < V; j++) batch_set(&b, i, j, 0.0);
  uint64_t seeds[300], offsets[300];
  for (int i = 0; i < B; i++) {
    seeds[i] = 0x243f6a8885a308d3ull * (uint64_t)(i + 1);
    offsets[i] = (uint64_t)i << 33 | (uint64_t)i;
  }
  for (int scalar = 0; scalar < 2; scalar++) {
    smp_settings s = settings_default();
    s.min_p = 1.0f;
    if (scalar) {
      s.seed = 0xfedcba9876543210ull;
      s.offset = 0x0123456789abcdefull;
    } else {
      s.seeds = seeds;
      s.offsets = offsets;
    }
    smp_out o;
    sample_ok(ctx, &b, &s, &o);
    for (int64_t i = 0; i < B; i++) {
      uint64_t r1, r2;
      if (scalar)
        smp_ref_draw(s.seed, s.offset, (uint64_t)i, &r1, &r2);
      else
        smp_ref_draw(seeds[i], offsets[i], 0, &r1, &r2);
      const uint64_t Z = (uint64_t)V << 40;
      const int64_t want = (int64_t)((uint64_t)(((unsigned __int128)r1 * Z) >> 64) >> 40);
      ck_assert_msg(o.tokens[i] == want, "%s seed, row %lld: token %lld, reference draw gives %lld",
                    scalar ? "scalar" : "per-row", (long long)i, (long long)o.tokens[i],
                    (long long)want);
    }
    out_free(&o);
  }
  batch_free(&b);
}

static void cases_edges(rlk_context *ctx, uint64_t *rng) {
  const int64_t V = 1000, B = 8;
  smp_batch b = batch_new(B, V, 0, RLK_F32);
  for (int64_t i = 0; i < B; i++)
    for (int64_t j = 0; j < V; j++) batch_set(&b, i, j, 2.0 * rlk_test_rand_normal(rng));
  uint64_t seeds[8];
  for (int i = 0; i < B; i++) seeds[i] = rlk_test_rand_u64(rng);

  /* top_k >= V and top_p 1 are no filter: the tokens of a plain call */
  smp_settings s = settings_default();
  s.seeds = seeds;
  smp_out plain, o;
  sample_ok(ctx, &b, &s, &plain);
  s.top_k = V;
  sample_ok(ctx, &b, &s, &o);
  ck_assert(memcmp(o.tokens, plain.tokens, (size_t)B * 8) == 0);
  out_free(&o);
  s.top_k = V + 100;
  sample_ok(ctx, &b, &s, &o);
  ck_assert(memcmp(o.tokens, plain.tokens, (size_t)B * 8) == 0);
  out_free(&o);

  /* a tiny top_p keeps the largest logit alone */
  s = settings_default();
  s.seeds = seeds;
  s.top_p = 1e-6f;
  sample_ok(ctx, &b, &s, &o);
  for (int64_t i = 0; i < B; i++) {
    const int64_t arg = batch_argmax(&b, i);
    ck_assert_int_eq(o.tokens[i], arg);
    ck_assert_msg(fabsf(o.logp_filtered[i]) < 1e-5f, "one token kept: logp_filtered %g",
                  (double)o.logp_filtered[i]);
  }
  out_free(&o);
  out_free(&plain);

  /* special rows: NaN, all -inf, +inf, equal logits with ties broken low, some -inf */
  for (int64_t j = 0; j < V; j++) {
    batch_set(&b, 1, j, -INFINITY);
    batch_set(&b, 3, j, 0.25);
    batch_set(&b, 4, j, j % 3 ? -INFINITY : 0.5 * rlk_test_rand_normal(rng));
  }
  batch_set(&b, 0, 17, NAN);
  batch_set(&b, 2, 5, INFINITY);
  s = settings_default();
  s.seeds = seeds;
  float temps[8] = {1, 1, 1, 0, 1, 1, 1, 1};
  s.temperatures = temps;
  sample_ok(ctx, &b, &s, &o);
  ck_assert_int_eq(o.status, RLK_SAMPLE_STATUS_NAN | RLK_SAMPLE_STATUS_NO_TOKEN);
  ck_assert_int_eq(o.tokens[0], -1);
  ck_assert(isnan(o.logp[0]));
  ck_assert_int_eq(o.tokens[1], -1);
  ck_assert(isinf(o.logp[1]) && o.logp[1] < 0);
  ck_assert_int_eq(o.tokens[2], -1);
  ck_assert(isnan(o.logp[2]));
  for (int i = 0; i < 3; i++) ck_assert(isnan(o.threshold[i])); /* no token, no kept set */
  ck_assert(o.threshold[3] == 0.25f);                          /* greedy: the maximum, every tie kept */
  ck_assert_int_eq(o.tokens[3], 0); /* greedy over equal logits: the lowest index */
  ck_assert_msg(fabs(o.logp[3] + log((double)V)) < 1e-5, "uniform row: logp %g", (double)o.logp[3]);
  ck_assert_msg(o.tokens[4] >= 0 && o.tokens[4] % 3 == 0, "a -inf logit drawn: %lld", (long long)o.tokens[4]);
  for (int i = 5; i < B; i++) ck_assert(o.tokens[i] >= 0 && o.tokens[i] < V);
  out_free(&o);

  /* equal logits with top-k keep every tie: all V tokens stay possible */
  smp_batch u = batch_new(2048, 16, 0, RLK_BF16);
  for (int64_t i = 0; i < 2048; i++)
    for (int64_t j = 0; j < 16; j++) batch_set(&u, i, j, 1.5);
  s = settings_default();
  s.seed = 99;
  s.top_k = 3;
  s.top_p = 0.5f;
  sample_ok(ctx, &u, &s, &o);
  int seen[16] = {0};
  for (int64_t i = 0; i < 2048; i++) seen[o.tokens[i]]++;
  for (int j = 0; j < 16; j++) ck_assert_msg(seen[j] > 60, "equal logits: token %d drawn %d times", j, seen[j]);
  for (int64_t i = 0; i < 2048; i++) ck_assert(o.threshold[i] == 1.5f); /* the ties' one value */
  out_free(&o);
  batch_free(&u);

  /* top_p below 2^-32 (the scalar, and per row down to a subnormal): the largest logit alone, as
   * at 2^-32 (it once came out as 0 steps of the fixed point and kept every token) */
  {
    const float tiny[8] = {1e-10f, 0x1p-33f, 1e-40f, 0x1p-149f, 1e-20f, 2.3e-10f, 1e-30f, 0x1p-32f};
    for (int64_t i = 0; i < B; i++)
      for (int64_t j = 0; j < V; j++) batch_set(&b, i, j, 2.0 * rlk_test_rand_normal(rng));
    for (int k = 0; k < 2; k++) {
      s = settings_default();
      s.seeds = seeds;
      if (k)
        s.top_ps = tiny;
      else
        s.top_p = 1e-10f;
      sample_ok(ctx, &b, &s, &o);
      ck_assert_int_eq(o.status, 0);
      for (int64_t i = 0; i < B; i++) {
        const int64_t arg = batch_argmax(&b, i);
        ck_assert_msg(o.tokens[i] == arg && o.logp_filtered[i] == 0.0f && o.threshold[i] == (float)b.xd[i * V + arg],
                      "top_p %g row %lld: token %lld (the maximum's %lld), logp_filtered %g, threshold %g",
                      (double)(k ? tiny[i] : s.top_p), (long long)i, (long long)o.tokens[i], (long long)arg,
                      (double)o.logp_filtered[i], (double)o.threshold[i]);
      }
      out_free(&o);
    }
  }

  /* bad per-row settings in device memory: those rows get -1 and the status bit */
  for (int64_t i = 0; i < B; i++)
    for (int64_t j = 0; j < V; j++) batch_set(&b, i, j, 2.0 * rlk_test_rand_normal(rng));
  float bt[8] = {1, -1, NAN, 0x1p-61f, 1, 1, 1, INFINITY}; /* [3]: below the scalar's 2^-60 floor */
  float bp[8] = {0.5f, 1, 1, 1, 1.5f, 1, 1, 1};
  float bm[8] = {0, 0, 0, 0, 0, 2, 0, 0};
  int64_t bk[8] = {0, 0, 0, 0, 0, 0, -3, 0};
  s = settings_default();
  s.seeds = seeds;
  s.temperatures = bt;
  s.top_ps = bp;
  s.min_ps = bm;
  s.top_ks = bk;
  sample_ok(ctx, &b, &s, &o);
  ck_assert_int_eq(o.status, RLK_SAMPLE_STATUS_BAD_PARAM);
  ck_assert(o.tokens[0] >= 0 && o.tokens[0] < V);
  for (int i = 1; i < 8; i++) {
    ck_assert_msg(o.tokens[i] == -1, "bad row %d: token %lld", i, (long long)o.tokens[i]);
    ck_assert(isnan(o.logp[i]));
  }
  out_free(&o);

  /* the largest logit over T huge (T near its floor, logits of 1e10): the masses are taken
   * relative to the row maximum, so the maximum is drawn (its mass 2^40, the others' 0) with a
   * log-prob of exactly 0, and no finite row is NO_TOKEN */
  for (int64_t i = 0; i < B; i++)
    for (int64_t j = 0; j < V; j++) batch_set(&b, i, j, 3.0 * rlk_test_rand_normal(rng));
  batch_set(&b, 7, 0, 1e10), batch_set(&b, 7, 1, 0), batch_set(&b, 7, 2, 1e10 - 1e3);
  for (int64_t j = 3; j < V; j++) batch_set(&b, 7, j, -1e10);
  for (int k = 0; k < 2; k++) {
    s = settings_default();
    s.seeds = seeds;
    s.temperature = k ? 0x1p-60f : 1e-9f;
    sample_ok(ctx, &b, &s, &o);
    ck_assert_int_eq(o.status, 0);
    for (int64_t i = 0; i < B; i++) {
      const int64_t arg = batch_argmax(&b, i);
      ck_assert_msg(o.tokens[i] == arg && o.logp[i] == 0.0f, "T %g row %lld: token %lld (the maximum's %lld), logp %g",
                    (double)s.temperature, (long long)i, (long long)o.tokens[i], (long long)arg, (double)o.logp[i]);
    }
    out_free(&o);
  }
  batch_free(&b);
}

/* ---------------------------------------------------------------------------------- */
/* Host cases                                                                          */
/* ---------------------------------------------------------------------------------- */

START_TEST(args_init_defaults) {
  rlk_sample_args a;
  memset(&a, 0x5c, sizeof a);
  rlk_sample_args_init(&a);
  ck_assert(a.temperature == 1.0f && a.top_p == 1.0f && a.min_p == 0.0f && a.top_k == 0);
  ck_assert(a.seed == 0 && a.offset == 0 && a.logits.data == NULL && a.tokens.data == NULL);
  ck_assert(a.logprob_block == 0 && a.logprob_unroll == 0);
  ck_assert_int_eq(a.row_split, RLK_SAMPLE_ROW_SPLIT_AUTO);
  ck_assert_int_eq(a.pdl, 1);
  rlk_sample_args_init(NULL);
}
END_TEST

START_TEST(philox_known_answers) {
  /* Random123's known-answer vectors for Philox4x32-10 */
  static const struct {
    uint32_t ctr[4], key[2], out[4];
  } kat[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
    rlk_philox_ctr c = {{kat[i].ctr[0], kat[i].ctr[1], kat[i].ctr[2], kat[i].ctr[3]}};
    const rlk_philox_ctr o = rlk_philox4x32_10(c, kat[i].key[0], kat[i].key[1]);
    for (int k = 0; k < 4; k++)
      ck_assert_msg(o.v[k] == kat[i].out[k], "vector %zu word %d: %08x, expected %08x", i, k, o.v[k],
                    kat[i].out[k]);
  }
}
END_TEST

#define HOST_CASE(name, call) RLK_HOST_TEST(name, call)

HOST_CASE(distribution_64, cases_distribution(ctx, &rng, 64, RLK_F32, 40000))
HOST_CASE(distribution_1000, cases_distribution(ctx, &rng, 1000, RLK_BF16, 30000))

START_TEST(host_logp_bitwise) {
  rlk_context *ctx = rlk_test_host_context();
  uint64_t rng = rlk_test_seed() ^ 0xb17;
  static const struct {
    int64_t V, pad;
    rlk_dtype dt;
  } shapes[] = {{1, 0, RLK_F32}, {3, 1, RLK_BF16}, {64, 0, RLK_F16}, {1000, 5, RLK_F32},
                {4097, 0, RLK_BF16}, {50257, 3, RLK_F32}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    check_logp_bitwise(ctx, &rng, 12, shapes[i].V, shapes[i].dt, shapes[i].pad, (int)(i % 2), 0, 0);
  rlk_context_destroy(ctx);
}
END_TEST

HOST_CASE(reproducible, (cases_reproducible(ctx, &rng, 500, 0), cases_reproducible(ctx, &rng, 500, 1),
                         cases_philox(ctx)))
HOST_CASE(edges, cases_edges(ctx, &rng))

START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  float x[12];
  for (int i = 0; i < 12; i++) x[i] = (float)i;
  int64_t tok[3];
  int32_t tok32[3];
  float lp[3], temps[3] = {1, 1, 1};
  int64_t seeds[4] = {0};
  rlk_sample_args a, g;
  rlk_sample_args_init(&g);
  g.logits = rlk_tensor_2d(x, RLK_F32, 3, 4, 4);
  g.tokens = rlk_tensor_1d(tok, RLK_I64, 3);
  ck_assert_int_eq(rlk_sample(ctx, &g, NULL), RLK_OK);
  ck_assert_int_eq(rlk_sample(NULL, &g, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_sample(ctx, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);
#define BAD(edit, needle)                                                                        \
  do {                                                                                           \
    a = g;                                                                                       \
    edit;                                                                                        \
    rlk_test_expect_error(rlk_sample(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT, needle, #edit);       \
  } while (0)
  BAD(a.logits.data = NULL, "logits");
  BAD(a.logits.dtype = RLK_F64, "logits");
  BAD(a.logits = rlk_tensor_1d(x, RLK_F32, 12), "logits");
  BAD(a.logits.strides[0] = 3, "logits");
  BAD(a.logits.strides[1] = 2, "logits");
  BAD((a.logits.shape[0] = 1, a.logits.shape[1] = (int64_t)1 << 23), "V");
  BAD(a.tokens.data = NULL, "tokens");
  BAD(a.tokens.dtype = RLK_F32, "tokens");
  BAD(a.tokens.shape[0] = 2, "tokens");
  BAD(a.temperature = -0.5f, "temperature");
  BAD(a.temperature = INFINITY, "temperature");
  BAD(a.temperature = 1e-39f, "temperature"); /* log2(e) / T would overflow f32: no draw */
  BAD(a.temperature = NAN, "temperature");
  BAD(a.top_k = -1, "top_k");
  BAD(a.top_p = 0.0f, "top_p");
  BAD(a.top_p = 1.5f, "top_p");
  BAD(a.min_p = -0.1f, "min_p");
  BAD(a.min_p = 1.1f, "min_p");
  BAD(a.temperatures = rlk_tensor_1d(temps, RLK_F64, 3), "temperatures");
  BAD(a.temperatures = rlk_tensor_1d(temps, RLK_F32, 2), "temperatures");
  BAD((a.seeds = rlk_tensor_1d(seeds, RLK_I64, 3), a.seeds.strides[0] = 2), "seeds");
  BAD(a.offsets = rlk_tensor_1d(seeds, RLK_I32, 3), "offsets");
  BAD(a.top_ks = rlk_tensor_1d(temps, RLK_F32, 3), "top_ks");
  BAD(a.logp = rlk_tensor_1d(tok, RLK_I64, 3), "logp");
  BAD(a.logp = rlk_tensor_1d(tok, RLK_F32, 3), "overlaps");
  BAD(a.status = rlk_tensor_1d(lp, RLK_F32, 1), "status");
  BAD(a.logprob_block = 100, "block");
  BAD(a.row_split = 3, "row_split");
  BAD(a.row_split = 16, "row_split");
  BAD(a.row_split = -2, "row_split");
#undef BAD
  /* i32 tokens, per-row tensors and a scalar both given: the tensor wins */
  a = g;
  a.tokens = rlk_tensor_1d(tok32, RLK_I32, 3);
  a.temperature = 0.0f;
  a.temperatures = rlk_tensor_1d(temps, RLK_F32, 3);
  ck_assert_int_eq(rlk_sample(ctx, &a, NULL), RLK_OK);
  /* a row split where clusters do not exist (the host) is one block a row */
  a = g;
  a.row_split = RLK_SAMPLE_ROW_SPLIT_AUTO;
  ck_assert_int_eq(rlk_sample(ctx, &a, NULL), RLK_OK);
  a.row_split = 8;
  ck_assert_int_eq(rlk_sample(ctx, &a, NULL), RLK_OK);
  /* a compile-only context refuses to launch */
  rlk_context *co = rlk_test_compile_only_host_context();
  ck_assert_int_eq(rlk_sample(co, &g, NULL), RLK_ERR_UNSUPPORTED);
  rlk_context_destroy(co);
  rlk_context_destroy(ctx);
}
END_TEST

/* rows16: a call's record says whether every row starts on the 16-byte grid, from the logits'
 * address and row stride (one row: its address alone), which is what picks the GPU kernel
 * without the narrower loads. */
START_TEST(record_rows_on_the_grid) {
  rlk_context *ctx = rlk_test_recording_host_context();
  if (!ctx) return;
  _Alignas(16) float x[64];
  for (int i = 0; i < 64; i++) x[i] = (float)(i % 7) * 0.25f;
  int64_t tok[3];
  rlk_sample_args a;
  rlk_sample_args_init(&a);
  static const struct {
    int off, rows, cols, stride;
  } calls[] = {
      {0, 2, 12, 12}, /* 48-byte rows from an aligned base: on the grid */
      {0, 3, 13, 13}, /* 52-byte rows: the second is off it */
      {0, 1, 11, 11}, /* one row from an aligned base */
      {1, 1, 11, 11}, /* one row 4 bytes off */
      {0, 2, 11, 12}, /* 11 columns of 48-byte rows */
  };
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    a.logits = rlk_tensor_2d(x + calls[i].off, RLK_F32, calls[i].rows, calls[i].cols, calls[i].stride);
    a.tokens = rlk_tensor_1d(tok, RLK_I64, calls[i].rows);
    ck_assert_msg(rlk_sample(ctx, &a, NULL) == RLK_OK, "call %zu: %s", i, rlk_last_error());
  }
#define LINE(v, rows, on) \
  "sample logits=f32 tokens=i64 filter=0 vocab=" #v " logprob_block=0 logprob_unroll=0 rows=" #rows " row_split=auto rows16=" #on
  static const char *const want[] = {LINE(12, 2, 1), LINE(13, 3, 0), LINE(11, 1, 1), LINE(11, 1, 0), LINE(11, 2, 1), NULL};
#undef LINE
  rlk_test_record_expect(ctx, want);
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(plan_matches_call) {
  rlk_context *ctx = rlk_test_host_context();
  int n = 0;
  ck_assert_int_eq(rlk_precompile(ctx, "sample logits=f32 tokens=i64 filter=1 vocab=12", &n), RLK_OK);
  ck_assert_int_eq(n, 1);
  ck_assert_int_eq(rlk_precompile(ctx, "sample logits=f32 tokens=i32 filter=0 vocab=12", &n), RLK_OK);
  const uint64_t before = rlk_test_compiles(ctx);
  float x[24];
  for (int i = 0; i < 24; i++) x[i] = (float)(i % 5);
  int64_t tok[2];
  int32_t tok32[2];
  rlk_sample_args a;
  rlk_sample_args_init(&a);
  a.logits = rlk_tensor_2d(x, RLK_F32, 2, 12, 12);
  a.tokens = rlk_tensor_1d(tok, RLK_I64, 2);
  a.top_p = 0.9f;
  ck_assert_int_eq(rlk_sample(ctx, &a, NULL), RLK_OK);
  a.top_p = 1.0f;
  a.tokens = rlk_tensor_1d(tok32, RLK_I32, 2);
  ck_assert_int_eq(rlk_sample(ctx, &a, NULL), RLK_OK);
  ck_assert_msg(rlk_test_compiles(ctx) == before, "a precompiled configuration compiled again");
  ck_assert_int_eq(rlk_precompile(ctx, "sample logits=f64", &n), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_precompile(ctx, "sample filter=2", &n), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_precompile(ctx, "sample vocab=0", &n), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_precompile(ctx, "sample colour=red", &n), RLK_ERR_INVALID_ARGUMENT);
  ck_assert(strstr(rlk_precompile_ops(), "sample") != NULL);
  ck_assert(strstr(rlk_precompile_help("sample"), "filter") != NULL);
  rlk_context_destroy(ctx);
}
END_TEST

/* The kernel a configuration line plans on `target`: "sample" or "sample_split", and the blocks a
 * row (*split) and chunks in flight (*depth) of the latter. */
static const char *planned(rlk_context *ctx, const char *line, int *split, int *depth) {
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
  size_t ns = 0;
  ck_assert_msg(rlk_test_plan_line(&rlk_op_sample, ctx, line, specs, &ns) == RLK_OK, "%s: %s", line, rlk_last_error());
  ck_assert_uint_eq(ns, 1);
  const int is_split = !strcmp(specs[0].tmpl->entry, "sample_split");
  *split = is_split ? (int)specs[0].values[4] : 1;
  *depth = is_split ? (int)specs[0].values[5] : 0;
  return specs[0].tmpl->entry;
}

/* row_split: sm_90 and later, unfiltered calls only, at most one block a warp of the layout, auto by
 * the rows (132 multiprocessors on a compile-only context); everywhere else one block a row. */
START_TEST(plan_row_split) {
  static const struct {
    const char *target, *line;
    int split, depth;
  } cases[] = {
      {"sm_90a", "sample filter=0 rows=1 row_split=auto", 8, 8},
      {"sm_90a", "sample filter=0 rows=16 row_split=auto", 8, 8},
      {"sm_90a", "sample filter=0 rows=17 row_split=auto", 4, 8},
      {"sm_90a", "sample filter=0 rows=32 row_split=auto", 4, 8},
      {"sm_90a", "sample filter=0 rows=66 row_split=auto", 2, 8},
      {"sm_90a", "sample filter=0 rows=67 row_split=auto", 1, 0},
      {"sm_90a", "sample filter=0 rows=256 row_split=auto", 1, 0},
      /* auto unless told: what rlk_sample_args_init's calls use */
      {"sm_90a", "sample filter=0 rows=1", 8, 8},
      {"sm_90a", "sample filter=0 rows=32", 4, 8},
      {"sm_90a", "sample filter=0", 1, 0},
      {"sm_90a", "sample filter=0 rows=1 row_split=0", 1, 0},
      {"sm_90a", "sample filter=0 rows=1 row_split=1", 1, 0},
      {"sm_90a", "sample filter=0 rows=4096 row_split=2", 2, 8},
      {"sm_90a", "sample filter=1 rows=1 row_split=8", 1, 0},
      /* bf16 rows of V 32000 (under 64 KB) take 256 x 4: four chunks a lane */
      {"sm_90a", "sample filter=0 vocab=32000 rows=1 row_split=8", 8, 4},
      /* a 1024-thread layout split in two: 512 threads a block hold 4 chunks */
      {"sm_90a", "sample filter=0 logprob_block=1024 logprob_unroll=2 rows=1 row_split=2", 2, 4},
      /* a layout of one warp (short rows) cannot be split */
      {"sm_90a", "sample filter=0 vocab=64 rows=1 row_split=auto", 1, 0},
      {"sm_80", "sample filter=0 rows=1 row_split=auto", 1, 0},
      {"sm_80", "sample filter=0 rows=1 row_split=8", 1, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    rlk_context *ctx = rlk_test_compile_only_cuda_context(cases[i].target, "sample row_split plans");
    if (!ctx) return;
    int split = 0, depth = 0;
    const char *entry = planned(ctx, cases[i].line, &split, &depth);
    ck_assert_msg(split == cases[i].split && depth == cases[i].depth, "%s %s: %s split %d depth %d, expected %d, %d",
                  cases[i].target, cases[i].line, entry, split, depth, cases[i].split, cases[i].depth);
    rlk_context_destroy(ctx);
  }
  rlk_context *h = rlk_test_compile_only_host_context();
  int split = 0, depth = 0;
  ck_assert_str_eq(planned(h, "sample filter=0 rows=1 row_split=auto", &split, &depth), "sample");
  int n = 0;
  ck_assert_int_eq(rlk_precompile(h, "sample row_split=3", &n), RLK_ERR_INVALID_ARGUMENT);
  ck_assert(strstr(rlk_last_error(), "row_split") != NULL);
  ck_assert_int_eq(rlk_precompile(h, "sample row_split=many", &n), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_precompile(h, "sample rows=0", &n), RLK_ERR_INVALID_ARGUMENT);
  rlk_context_destroy(h);
}
END_TEST

RLK_SAMPLES_CASE("sample", &rlk_op_sample)

/* ---------------------------------------------------------------------------------- */
/* CUDA (RLK_TEST_GPU=1)                                                               */
/* ---------------------------------------------------------------------------------- */

static rlk_context *cuda_context(void) { return rlk_test_cuda_context("sample"); }

#define GPU_CASE(name, call) RLK_GPU_TEST("sample", name, ck_assert(is_gpu(ctx)); call)

GPU_CASE(distribution_64, cases_distribution(ctx, &rng, 64, RLK_F32, 200000))
GPU_CASE(distribution_1000, cases_distribution(ctx, &rng, 1000, RLK_BF16, 200000))
GPU_CASE(distribution_32000, cases_distribution(ctx, &rng, 32000, RLK_F16, 100000))
GPU_CASE(distribution_151936, cases_distribution(ctx, &rng, 151936, RLK_BF16, 24000))
GPU_CASE(reproducible, (cases_reproducible(ctx, &rng, 5000, 0), cases_reproducible(ctx, &rng, 5000, 1),
                        cases_reproducible(ctx, &rng, 151936, 1), cases_philox(ctx)))
GPU_CASE(edges, cases_edges(ctx, &rng))
GPU_CASE(row_split, cases_row_split(ctx, &rng))

/* The unfiltered draws of a row over a cluster of 8 (and of 4 at V 32000, 256 threads a row)
 * against the reference distribution. */
static void cases_distribution_split(rlk_context *ctx, uint64_t *rng) {
  const dist_case cases[] = {
      {151936, RLK_BF16, 1.5, 1.0f, 0, 1.0f, 0.0f, 0, 0, 8},
      {151936, RLK_F32, 1.5, 0.7f, 0, 1.0f, 0.0f, 0, 1, 8},
      {32000, RLK_F16, 1.5, 0.7f, 0, 1.0f, 0.0f, 1, 0, 4},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_distribution(ctx, &cases[i], rng, 24000);
}
GPU_CASE(distribution_split, cases_distribution_split(ctx, &rng))

/* Row layouts whose draws take the rarer steps of an element's pick: rows off a 16-byte boundary
 * (the scalar head and tail elements of a share, many of them at V 1000), and a long share (one
 * warp a row at V 151936: 593 vectors a lane, most of them re-read after the first 128). */
static void cases_distribution_layouts(rlk_context *ctx, uint64_t *rng) {
  const dist_case cases[] = {
      {1000, RLK_BF16, 1.5, 1.0f, 0, 1.0f, 0.0f, 0, 0, 0, 3, 0},
      {1000, RLK_F32, 2.0, 0.7f, 40, 0.9f, 0.0f, 0, 0, 0, 1, 0},
      {1000, RLK_F16, 1.5, 1.0f, 0, 1.0f, 0.0f, 0, 0, 0, 5, 32},
      {4097, RLK_BF16, 1.5, 1.3f, 0, 1.0f, 0.0f, 0, 0, 0, 7, 0},
      {151936, RLK_BF16, 1.5, 1.0f, 0, 1.0f, 0.0f, 0, 0, 0, 0, 32},
      {151936, RLK_F32, 1.5, 0.7f, 0, 1.0f, 0.0f, 0, 0, 0, 1, 32},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    check_distribution(ctx, &cases[i], rng, cases[i].V > 10000 ? 24000 : 200000);
}
GPU_CASE(distribution_layouts, cases_distribution_layouts(ctx, &rng))

/* Top-p without top-k at a large vocabulary, each dtype: the first pass bins the row by mass, the
 * next ones take the boundary's bin by key digits (from the bits its interval of logits fixes),
 * then the kept set is drawn by a masked pass or gathered. Ties at the threshold, min-p beside it,
 * and wide rows where most masses are zero. (A filter whose cut lies in a crowd of logits, as
 * top_p 0.9999 on the wide rows or min_p 0.01 at the centre of N(0, 1) rows, is within rounding
 * of a flip in every draw: draw_case_logits fails it.) */
static void cases_distribution_top_p(rlk_context *ctx, uint64_t *rng) {
  const dist_case cases[] = {
      {151936, RLK_F32, 2.0, 1.3f, 0, 0.8f, 0.0f, 0, 0},
      {151936, RLK_F16, 1.0, 0.6f, 0, 0.9f, 0.0f, 0, 0},
      {151936, RLK_BF16, 2.0, 1.0f, 0, 0.85f, 0.0f, 1, 0},  /* ties */
      {151936, RLK_F32, 2.0, 1.0f, 0, 0.9f, 0.05f, 0, 0},   /* and min-p */
      {151936, RLK_BF16, 12.0, 1.0f, 0, 0.95f, 0.0f, 0, 0}, /* most masses zero */
      {151936, RLK_F32, 6.0, 1.0f, 0, 0.99f, 0.0f, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_distribution(ctx, &cases[i], rng, 12000);
}
GPU_CASE(distribution_top_p, cases_distribution_top_p(ctx, &rng))

/* Calls back to back, each one's seeds the previous one's tokens, with pdl (the default) and
 * without: the same tokens and log-probs. An overlapping launch that read its seeds before the
 * previous call had written them would draw from the poison instead. The plain, split and
 * filtered kernels alternate. */
static void cases_overlap_chain(rlk_context *ctx, uint64_t *rng) {
  enum { STEPS = 6 };
  static const struct {
    float T;
    int64_t top_k;
    float top_p;
    int row_split;
  } steps[STEPS] = {{1.0f, 0, 1.0f, 1}, {0.8f, 0, 1.0f, 8}, {0.7f, 50, 0.9f, 1},
                    {1.2f, 0, 1.0f, 1}, {1.0f, 0, 1.0f, 4}, {1.0f, 20, 1.0f, 1}};
  const int64_t B = 256, V = 151936;
  const size_t xbytes = (size_t)(B * V) * 2;
  void *x = malloc(xbytes);
  for (int64_t i = 0; i < B * V; i++) rlk_test_store(x, RLK_BF16, i, 2.0 * rlk_test_rand_normal(rng));
  void *xd = rlk_test_dev_upload(ctx, x, xbytes);
  uint64_t s0[256];
  for (int64_t i = 0; i < B; i++) s0[i] = rlk_test_rand_u64(rng);
  void *seeds0 = rlk_test_dev_upload(ctx, s0, sizeof s0);
  void *tok[STEPS], *lp[STEPS];
  int64_t want_tok[STEPS][256], got_tok[256];
  float want_lp[STEPS][256], got_lp[256];
  for (int pdl = 0; pdl <= 1; pdl++) {
    for (int k = 0; k < STEPS; k++) {
      if (!pdl) {
        tok[k] = rlk_test_dev_alloc(ctx, (size_t)B * 8);
        lp[k] = rlk_test_dev_alloc(ctx, (size_t)B * 4);
      }
      ck_assert_int_eq(rlk_memset(ctx, tok[k], 0xa5, (size_t)B * 8), RLK_OK);
      ck_assert_int_eq(rlk_memset(ctx, lp[k], 0xff, (size_t)B * 4), RLK_OK);
    }
    ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
    for (int k = 0; k < STEPS; k++) {
      rlk_sample_args a;
      rlk_sample_args_init(&a);
      ck_assert_int_eq(a.pdl, 1);
      a.pdl = pdl;
      a.logits = rlk_tensor_2d(xd, RLK_BF16, B, V, V);
      a.temperature = steps[k].T;
      a.top_k = steps[k].top_k;
      a.top_p = steps[k].top_p;
      a.row_split = steps[k].row_split;
      a.seeds = rlk_tensor_1d(k ? tok[k - 1] : seeds0, RLK_I64, B);
      a.offset = (uint64_t)k;
      a.tokens = rlk_tensor_1d(tok[k], RLK_I64, B);
      a.logp = rlk_tensor_1d(lp[k], RLK_F32, B);
      ck_assert_msg(rlk_sample(ctx, &a, NULL) == RLK_OK, "rlk_sample: %s", rlk_last_error());
      if (!pdl) ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
    }
    ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
    for (int k = 0; k < STEPS; k++) {
      int64_t *t = pdl ? got_tok : want_tok[k];
      float *l = pdl ? got_lp : want_lp[k];
      dev_download(ctx, t, tok[k], (size_t)B * 8);
      dev_download(ctx, l, lp[k], (size_t)B * 4);
      for (int64_t i = 0; i < B; i++) {
        if (!pdl) {
          ck_assert_msg(t[i] >= 0 && t[i] < V, "step %d row %lld: token %lld", k, (long long)i,
                        (long long)t[i]);
          continue;
        }
        ck_assert_msg(got_tok[i] == want_tok[k][i] && !memcmp(&got_lp[i], &want_lp[k][i], 4),
                      "step %d row %lld: with pdl token %lld logp %.9g, plain %lld %.9g", k,
                      (long long)i, (long long)got_tok[i], (double)got_lp[i],
                      (long long)want_tok[k][i], (double)want_lp[k][i]);
      }
    }
  }
  for (int k = 0; k < STEPS; k++) {
    rlk_free(ctx, tok[k]);
    rlk_free(ctx, lp[k]);
  }
  rlk_free(ctx, seeds0);
  rlk_free(ctx, xd);
  free(x);
}
GPU_CASE(overlap_chain, cases_overlap_chain(ctx, &rng))

START_TEST(gpu_logp_bitwise) {
  if (!rlk_test_gpu_enabled("sample")) return;
  rlk_context *ctx = cuda_context();
  if (!ctx) return;
  uint64_t rng = rlk_test_seed() ^ 0xb17b17;
  static const struct {
    int64_t V, pad;
    rlk_dtype dt;
  } shapes[] = {{1, 0, RLK_F32},      {3, 1, RLK_BF16},        {64, 0, RLK_F16},
                {1000, 5, RLK_F32},   {4097, 0, RLK_BF16},     {32000, 8, RLK_F16},
                {50257, 3, RLK_BF16}, {128256, 0, RLK_BF16},   {151936, 0, RLK_BF16},
                {151936, 0, RLK_F32}, {152064, 16, RLK_BF16}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    check_logp_bitwise(ctx, &rng, 24, shapes[i].V, shapes[i].dt, shapes[i].pad, 0, 0, 0);
    check_logp_bitwise(ctx, &rng, 24, shapes[i].V, shapes[i].dt, shapes[i].pad, 1, 0, 0);
  }
  /* a tuned logprob: the same tuning given to the sampler */
  check_logp_bitwise(ctx, &rng, 16, 151936, RLK_BF16, 0, 1, 256, 8);
  check_logp_bitwise(ctx, &rng, 16, 50257, RLK_F32, 0, 0, 1024, 2);
  rlk_context_destroy(ctx);
}
END_TEST

Suite *sample_suite(void) {
  Suite *s = suite_create("sample");
  rlk_test_add_case(s, "host", 300, TESTS(args_init_defaults, philox_known_answers, host_distribution_64,
      host_distribution_1000, host_logp_bitwise, host_reproducible, host_edges, bad_arguments));

  rlk_test_add_case(s, "plan", 300, TESTS(plan_matches_call, plan_row_split, samples_compile_every_target, record_rows_on_the_grid));

  rlk_test_add_case(s, "gpu", 600, TESTS(gpu_logp_bitwise, gpu_reproducible, gpu_edges, gpu_row_split,
      gpu_overlap_chain, gpu_distribution_split, gpu_distribution_layouts, gpu_distribution_top_p, gpu_distribution_64,
      gpu_distribution_1000, gpu_distribution_32000, gpu_distribution_151936));
  return s;
}

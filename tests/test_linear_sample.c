/* test_linear_sample.c - rlk_linear_sample, on the host backend and, with RLK_TEST_GPU=1, on CUDA:
 *   - the rollout's log-prob, lse and entropy bitwise rlk_linear_logprob's for the same rows and
 *     the drawn tokens, the trainer's call taking every row at once in another order (a batch of
 *     another size: the fused head is batch invariant);
 *   - the draw: the raw logits the call keeps (its workspace's first M rows) within the f32 dot
 *     products' bound of fp64, and the tokens and thresholds rlk_sample gives over those very
 *     logits with the same settings and seeds (every filter, greedy);
 *   - kept-set replay of a rollout: rlk_linear_logprob with the call's thresholds gives each token
 *     its log-prob over the kept set (between the plain log-prob and 0);
 *   - argument checks. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "linear_logprob_check.h"
#include "ref/linear_logprob_ref.h"
#include "suites.h"
#include "test_util.h"

#define LS_U 0x1p-24

static void ls_down(rlk_context *ctx, void *dst, const void *src, size_t bytes) {
  ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, dst, src, bytes), RLK_OK);
}

/* A head: hidden [P, H] and weight [V, H] of random 16-bit values (logits of spread about 3). */
typedef struct ls_head {
  int64_t P, H, V;
  rlk_dtype dt;
  uint16_t *h, *w;
  void *dh, *dw;
} ls_head;

static void ls_head_new(rlk_context *ctx, uint64_t *rng, int64_t P, int64_t H, int64_t V, rlk_dtype dt, ls_head *k) {
  k->P = P, k->H = H, k->V = V, k->dt = dt;
  k->h = malloc((size_t)(P * H) * 2), k->w = malloc((size_t)(V * H) * 2);
  ck_assert(k->h && k->w);
  const double ws = 3.0 / sqrt((double)H);
  for (int64_t i = 0; i < P * H; i++) rlk_test_store(k->h, dt, i, rlk_test_rand_unit(rng));
  for (int64_t i = 0; i < V * H; i++) rlk_test_store(k->w, dt, i, ws * rlk_test_rand_unit(rng));
  k->dh = rlk_test_dev_upload(ctx, k->h, (size_t)(P * H) * 2);
  k->dw = rlk_test_dev_upload(ctx, k->w, (size_t)(V * H) * 2);
}

static void ls_head_free(rlk_context *ctx, ls_head *k) {
  free(k->h), free(k->w);
  rlk_free(ctx, k->dh), rlk_free(ctx, k->dw);
}

/* The settings a rollout draws with: a temperature for the call, per-row filters and seeds. */
typedef struct ls_settings {
  float T;
  int64_t *top_k;
  float *top_p, *min_p;
  int64_t *seed;
} ls_settings;

/* The settings of rows [r0, r0 + M) on the device, as both calls take them. */
typedef struct ls_draw {
  rlk_tensor top_ks, top_ps, min_ps, seeds;
} ls_draw;

static ls_draw ls_draw_up(rlk_context *ctx, const ls_settings *s, int64_t r0, int64_t M) {
  ls_draw d;
  d.top_ks = rlk_tensor_1d(rlk_test_dev_upload(ctx, s->top_k + r0, (size_t)M * 8), RLK_I64, M);
  d.top_ps = rlk_tensor_1d(rlk_test_dev_upload(ctx, s->top_p + r0, (size_t)M * 4), RLK_F32, M);
  d.min_ps = rlk_tensor_1d(rlk_test_dev_upload(ctx, s->min_p + r0, (size_t)M * 4), RLK_F32, M);
  d.seeds = rlk_tensor_1d(rlk_test_dev_upload(ctx, s->seed + r0, (size_t)M * 8), RLK_I64, M);
  return d;
}

static void ls_draw_free(rlk_context *ctx, ls_draw *d) {
  rlk_free(ctx, d->top_ks.data), rlk_free(ctx, d->top_ps.data), rlk_free(ctx, d->min_ps.data);
  rlk_free(ctx, d->seeds.data);
}

/* The draw into args `a` of rlk_linear_sample or rlk_sample (fields of the same names): the
 * call's temperature, the rows' filters and seeds, offset 3. */
#define LS_SET_DRAW(a, s, d) \
  ((a).temperature = (s)->T, (a).top_ks = (d).top_ks, (a).top_ps = (d).top_ps, (a).min_ps = (d).min_ps, \
   (a).seeds = (d).seeds, (a).offset = 3)

/* What one rlk_linear_sample call gives M rows (the rows of hidden from row r0): tokens, logp,
 * lse, entropy, threshold, and its workspace's logits [M][pitch]. */
typedef struct ls_out {
  int64_t M, pitch;
  int64_t *tokens;
  float *logp, *lse, *ent, *thr, *logits;
} ls_out;

static void ls_out_free(ls_out *o) { free(o->tokens), free(o->logp), free(o->lse), free(o->ent), free(o->thr), free(o->logits); }

static void ls_run(rlk_context *ctx, const ls_head *k, int64_t r0, int64_t M, const ls_settings *s,
                   rlk_linear_logprob_variant variant, ls_out *o) {
  ls_draw d = ls_draw_up(ctx, s, r0, M);
  void *tok = rlk_test_dev_alloc(ctx, (size_t)M * 8), *out = rlk_test_dev_alloc(ctx, (size_t)M * 16),
       *st = rlk_test_dev_alloc(ctx, 4);
  ck_assert_int_eq(rlk_memset(ctx, out, 0xff, (size_t)M * 16), RLK_OK);
  ck_assert_int_eq(rlk_memset(ctx, st, 0, 4), RLK_OK);
  rlk_linear_sample_args a;
  rlk_linear_sample_args_init(&a);
  a.hidden = rlk_tensor_2d((uint16_t *)k->dh + r0 * k->H, k->dt, M, k->H, k->H);
  a.weight = rlk_tensor_2d(k->dw, k->dt, k->V, k->H, k->H);
  LS_SET_DRAW(a, s, d);
  a.tokens = rlk_tensor_1d(tok, RLK_I64, M);
  a.logp = rlk_test_block_row(out, RLK_F32, 0, M);
  a.lse = rlk_test_block_row(out, RLK_F32, 1, M);
  a.entropy = rlk_test_block_row(out, RLK_F32, 2, M);
  a.threshold = rlk_test_block_row(out, RLK_F32, 3, M);
  a.status = rlk_tensor_1d(st, RLK_I32, 1);
  a.variant = variant;
  rlk_test_workspace(ctx, rlk_linear_sample_workspace_size(ctx, &a, &a.workspace_bytes),
                     &a.workspace_bytes, &a.workspace, &a.workspace_bytes);
  ck_assert_msg(rlk_linear_sample(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  o->M = M;
  o->pitch = (k->V + 3) / 4 * 4;
  o->tokens = malloc((size_t)M * 8);
  float *t = malloc((size_t)M * 16);
  o->logits = malloc((size_t)(M * o->pitch) * 4);
  ls_down(ctx, o->tokens, tok, (size_t)M * 8);
  ls_down(ctx, t, out, (size_t)M * 16);
  ls_down(ctx, o->logits, a.workspace, (size_t)(M * o->pitch) * 4);
  int32_t status;
  ls_down(ctx, &status, st, 4);
  ck_assert_int_eq(status, 0);
  o->logp = malloc((size_t)M * 4), o->lse = malloc((size_t)M * 4), o->ent = malloc((size_t)M * 4), o->thr = malloc((size_t)M * 4);
  memcpy(o->logp, t, (size_t)M * 4), memcpy(o->lse, t + M, (size_t)M * 4), memcpy(o->ent, t + 2 * M, (size_t)M * 4);
  memcpy(o->thr, t + 3 * M, (size_t)M * 4);
  free(t);
  ls_draw_free(ctx, &d);
  rlk_free(ctx, tok), rlk_free(ctx, out), rlk_free(ctx, st), rlk_free(ctx, a.workspace);
}

/* The trainer's rlk_linear_logprob over rows idx[0, n) of hidden (gathered in that order) with the
 * given labels (and thresholds, or NULL): logp, lse, entropy [3][n]. */
static void ls_trainer(rlk_context *ctx, const ls_head *k, const int64_t *idx, int64_t n, const int64_t *labels,
                       const float *thr, float T, rlk_linear_logprob_variant variant, float *out) {
  uint16_t *h = malloc((size_t)(n * k->H) * 2);
  for (int64_t j = 0; j < n; j++) memcpy(h + j * k->H, k->h + idx[j] * k->H, (size_t)k->H * 2);
  void *dh = rlk_test_dev_upload(ctx, h, (size_t)(n * k->H) * 2), *dl = rlk_test_dev_upload(ctx, labels, (size_t)n * 8);
  void *dt = thr ? rlk_test_dev_upload(ctx, thr, (size_t)n * 4) : NULL, *o = rlk_test_dev_alloc(ctx, (size_t)n * 12);
  ll_forward_block(ctx, k->dt, dh, k->dw, n, k->V, k->H, dl, dt, T, variant, o);
  ls_down(ctx, out, o, (size_t)n * 12);
  rlk_free(ctx, dh), rlk_free(ctx, dl), rlk_free(ctx, o);
  if (dt) rlk_free(ctx, dt);
  free(h);
}

/* rlk_sample over logits [M][pitch] (the call's own) with the rows' settings: tokens and
 * thresholds. */
static void ls_resample(rlk_context *ctx, const ls_out *o, int64_t V, const ls_settings *s, int64_t r0, int64_t *tok,
                        float *thr) {
  const int64_t M = o->M;
  void *x = rlk_test_dev_upload(ctx, o->logits, (size_t)(M * o->pitch) * 4);
  ls_draw d = ls_draw_up(ctx, s, r0, M);
  void *dtok = rlk_test_dev_alloc(ctx, (size_t)M * 8), *dthr = rlk_test_dev_alloc(ctx, (size_t)M * 4);
  rlk_sample_args a;
  rlk_sample_args_init(&a);
  a.logits = rlk_tensor_2d(x, RLK_F32, M, V, o->pitch);
  LS_SET_DRAW(a, s, d);
  a.tokens = rlk_tensor_1d(dtok, RLK_I64, M);
  a.threshold = rlk_tensor_1d(dthr, RLK_F32, M);
  ck_assert_msg(rlk_sample(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  ls_down(ctx, tok, dtok, (size_t)M * 8);
  ls_down(ctx, thr, dthr, (size_t)M * 4);
  ls_draw_free(ctx, &d);
  rlk_free(ctx, x), rlk_free(ctx, dtok), rlk_free(ctx, dthr);
}

/* A rollout of P rows in steps of M rows (each step its own call, as a decode loop makes them),
 * then the trainer's call over all P rows in a shuffled order. */
static void ls_rollout_case(rlk_context *ctx, uint64_t *rng, int64_t P, int64_t M, int64_t H, int64_t V, rlk_dtype dt,
                            float T, rlk_linear_logprob_variant variant) {
  ls_head k;
  ls_head_new(ctx, rng, P, H, V, dt, &k);
  ls_settings s = {T, malloc((size_t)P * 8), malloc((size_t)P * 4), malloc((size_t)P * 4), malloc((size_t)P * 8)};
  for (int64_t i = 0; i < P; i++) {
    const int mix = (int)(i % 5); /* none, top-k, top-p, min-p, all */
    s.top_k[i] = mix == 1 || mix == 4 ? 1 + (int64_t)(rlk_test_rand_u64(rng) % 50) : 0;
    s.top_p[i] = mix == 2 || mix == 4 ? (float)(0.5 + 0.45 * rlk_test_rand_uniform(rng)) : 1.0f;
    s.min_p[i] = mix == 3 || mix == 4 ? (float)(0.05 * rlk_test_rand_uniform(rng)) : 0.0f;
    s.seed[i] = (int64_t)rlk_test_rand_u64(rng);
  }
  int64_t *tokens = malloc((size_t)P * 8);
  float *roll = malloc((size_t)P * 12), *thr = malloc((size_t)P * 4);
  double *log_kept = malloc((size_t)P * sizeof(double)); /* log of the kept set's mass, fp64 */
  double worst_x = 0.0;
  const double Th = T > 0.0f ? T : 1.0;
  for (int64_t r0 = 0; r0 < P; r0 += M) {
    const int64_t m = P - r0 < M ? P - r0 : M;
    ls_out o;
    ls_run(ctx, &k, r0, m, &s, variant, &o);
    /* the logits drawn from: the f32 dot products within 3 H u of the sum of |terms| (fp64 on the
     * host: one rounding, u) of fp64; every 7th column of every 37th row of a large pool (the fp64
     * sums of a row at V 151936, H 4096 take the host a fifth of a second) */
    const int64_t every = P > 100 ? 37 : 1;
    for (int64_t j = (every - r0 % every) % every; j < m; j += every)
      for (int64_t v = 0; v < V; v += 7) {
        double x = 0.0, mag = 0.0;
        for (int64_t q = 0; q < H; q++) {
          const double t = ll_ref_half(k.h[(r0 + j) * H + q], dt == RLK_F16) * ll_ref_half(k.w[v * H + q], dt == RLK_F16);
          x += t, mag += fabs(t);
        }
        const double err = fabs(o.logits[j * o.pitch + v] - x), tol = (3.0 * (double)H + 1.0) * LS_U * mag + 1e-30;
        if (err / tol > worst_x) worst_x = err / tol;
        ck_assert_msg(err <= tol, "row %lld logit %lld: %.9g, fp64 %.9g", (long long)(r0 + j), (long long)v,
                      (double)o.logits[j * o.pitch + v], x);
      }
    /* the draw is rlk_sample's over those logits */
    int64_t *t2 = malloc((size_t)m * 8);
    float *h2 = malloc((size_t)m * 4);
    ls_resample(ctx, &o, V, &s, r0, t2, h2);
    for (int64_t j = 0; j < m; j++) {
      ck_assert_msg(t2[j] == o.tokens[j], "row %lld: token %lld, rlk_sample over its logits %lld", (long long)(r0 + j),
                    (long long)o.tokens[j], (long long)t2[j]);
      ck_assert_msg(memcmp(&h2[j], &o.thr[j], 4) == 0, "row %lld: threshold %g, rlk_sample's %g", (long long)(r0 + j),
                    (double)o.thr[j], (double)h2[j]);
      tokens[r0 + j] = o.tokens[j];
      roll[3 * (r0 + j)] = o.logp[j], roll[3 * (r0 + j) + 1] = o.lse[j], roll[3 * (r0 + j) + 2] = o.ent[j];
      thr[r0 + j] = o.thr[j];
      /* the kept set's mass of the drawn logits: the logits at or above the threshold (every one
       * for -inf or NaN) and the token */
      const float *x = o.logits + j * o.pitch;
      double mx = -INFINITY, all = 0.0, kept = 0.0;
      for (int64_t v = 0; v < V; v++) mx = fmax(mx, (double)x[v] / Th);
      for (int64_t v = 0; v < V; v++) {
        const double e = exp((double)x[v] / Th - mx);
        all += e;
        if (!(x[v] < o.thr[j]) || v == o.tokens[j]) kept += e;
      }
      log_kept[r0 + j] = log(kept / all);
    }
    free(t2), free(h2);
    ls_out_free(&o);
  }
  /* the trainer: every row in one call, shuffled */
  int64_t *idx = malloc((size_t)P * 8), *lab = malloc((size_t)P * 8);
  for (int64_t i = 0; i < P; i++) idx[i] = i;
  for (int64_t i = P - 1; i > 0; i--) {
    const int64_t j = (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)(i + 1)), t = idx[i];
    idx[i] = idx[j], idx[j] = t;
  }
  float *tr = malloc((size_t)P * 12), *kr = malloc((size_t)P * 12), *th2 = malloc((size_t)P * 4);
  for (int64_t j = 0; j < P; j++) lab[j] = tokens[idx[j]], th2[j] = thr[idx[j]];
  ls_trainer(ctx, &k, idx, P, lab, NULL, (float)Th, variant, tr);
  ls_trainer(ctx, &k, idx, P, lab, th2, (float)Th, variant, kr);
  for (int64_t j = 0; j < P; j++) {
    const int64_t i = idx[j];
    const float want[3] = {tr[j], tr[P + j], tr[2 * P + j]};
    for (int q = 0; q < 3; q++)
      ck_assert_msg(memcmp(&roll[3 * i + q], &want[q], 4) == 0,
                    "row %lld (output %d: logp, lse, entropy): rollout %.9g, trainer %.9g (rollout steps of %lld, the "
                    "trainer's %lld rows)",
                    (long long)i, q, (double)roll[3 * i + q], (double)want[q], (long long)M, (long long)P);
    /* kept-set replay: the log-prob over the kept set is the plain one less the log of the kept
     * set's mass, each call's log-prob within ll_fwd_bound's (its fold's ll_fold_eps and 16 u of
     * |max z| + |lse| + |logp| + |entropy| + 1, |max z| <= |lse| + ln V), the fp64 mass's error
     * far below them */
    const double eps = ll_fold_eps(V), lnV = log((double)V);
    const double tol = 2 * eps + 16 * LS_U * (2 * fabs(tr[P + j]) + lnV + fabs(tr[j]) + fabs(tr[2 * P + j]) + 1.0) +
                       16 * LS_U * (2 * fabs(kr[P + j]) + lnV + fabs(kr[j]) + fabs(kr[2 * P + j]) + 1.0);
    const double shift = -log_kept[i];
    ck_assert_msg(fabs((double)kr[j] - ((double)tr[j] + shift)) <= tol && kr[j] <= 16 * LS_U,
                  "row %lld: kept-set logp %.9g, plain %.9g, the kept set's mass exp(-%.6g), bound %.3g", (long long)i,
                  (double)kr[j], (double)tr[j], shift, tol);
  }
  printf("linear_sample %s: %lld rows in steps of %lld (V %lld, H %lld, %s, T %g, variant %d): every log-prob, lse and "
         "entropy bitwise the trainer's; logits at %.2g of their bound\n",
         rlk_context_backend(ctx) == RLK_BACKEND_HOST ? "host" : "gpu", (long long)P, (long long)M, (long long)V,
         (long long)H, rlk_dtype_name(dt), (double)T, (int)variant, worst_x);
  free(tokens), free(roll), free(thr), free(log_kept), free(idx), free(lab), free(tr), free(kr), free(th2);
  free(s.top_k), free(s.top_p), free(s.min_p), free(s.seed);
  ls_head_free(ctx, &k);
}

static void cases_rollout(rlk_context *ctx, uint64_t *rng) {
  if (rlk_context_backend(ctx) == RLK_BACKEND_HOST) {
    ls_rollout_case(ctx, rng, 23, 4, 40, 900, RLK_BF16, 0.8f, RLK_LINEAR_LOGPROB_AUTO);
    ls_rollout_case(ctx, rng, 9, 1, 24, 301, RLK_F16, 0.0f, RLK_LINEAR_LOGPROB_AUTO); /* greedy */
    return;
  }
  static const int64_t steps[] = {1, 2, 7, 64, 256};
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
    ls_rollout_case(ctx, rng, 600, steps[i], 4096, 151936, RLK_BF16, 0.9f, RLK_LINEAR_LOGPROB_AUTO);
  ls_rollout_case(ctx, rng, 300, 32, 1024, 50257, RLK_F16, 0.7f, RLK_LINEAR_LOGPROB_TILED);
  ls_rollout_case(ctx, rng, 100, 3, 896, 32000, RLK_BF16, 0.0f, RLK_LINEAR_LOGPROB_AUTO);
}

RLK_HOST_CASE(rollout)
RLK_GPU_CASE("linear_sample", rollout)

START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  uint16_t h[8] = {0}, w[16] = {0};
  int64_t tok[2];
  float f[2];
  rlk_linear_sample_args a;
  rlk_linear_sample_args_init(&a);
  a.hidden = rlk_tensor_2d(h, RLK_BF16, 2, 4, 4);
  a.weight = rlk_tensor_2d(w, RLK_BF16, 4, 4, 4);
  size_t b = 1;
  rlk_test_expect_error(rlk_linear_sample_workspace_size(ctx, &a, &b), RLK_ERR_INVALID_ARGUMENT, "tokens",
                        "rlk_linear_sample_workspace_size");
  ck_assert_uint_eq(b, 0);
  a.tokens = rlk_tensor_1d(f, RLK_F32, 2); /* said as the tokens', not as the head's labels */
  rlk_test_expect_error(rlk_linear_sample_workspace_size(ctx, &a, &b), RLK_ERR_INVALID_ARGUMENT, "tokens: dtype f32",
                        "rlk_linear_sample_workspace_size");
  a.tokens = rlk_tensor_1d(tok, RLK_I64, 2);
  a.temperature = -1.0f;
  rlk_test_expect_error(rlk_linear_sample_workspace_size(ctx, &a, &b), RLK_ERR_INVALID_ARGUMENT, "temperature",
                        "rlk_linear_sample_workspace_size");
  a.temperature = 1.0f;
  a.top_p = 1.5f; /* the sampler's own checks */
  rlk_test_expect_error(rlk_linear_sample_workspace_size(ctx, &a, &b), RLK_ERR_INVALID_ARGUMENT, "top_p",
                        "rlk_linear_sample_workspace_size");
  a.top_p = 1.0f;
  /* the rows are M here and the vocabulary the weight's (the sampler's own checks say B, logits) */
  a.logp = rlk_tensor_1d(f, RLK_F32, 3);
  rlk_test_expect_error(rlk_linear_sample_workspace_size(ctx, &a, &b), RLK_ERR_INVALID_ARGUMENT, "logp: ",
                        "rlk_linear_sample_workspace_size");
  ck_assert_msg(strstr(rlk_last_error(), "(M)"), "%s", rlk_last_error());
  a.logp = rlk_tensor_1d(f, RLK_F32, 2);
  a.top_ps = rlk_tensor_1d(f, RLK_F32, 1);
  rlk_test_expect_error(rlk_linear_sample_workspace_size(ctx, &a, &b), RLK_ERR_INVALID_ARGUMENT, "top_ps: ",
                        "rlk_linear_sample_workspace_size");
  ck_assert_msg(strstr(rlk_last_error(), "(M)"), "%s", rlk_last_error());
  a.top_ps = (rlk_tensor){0};
  a.weight = rlk_tensor_2d((void *)(uintptr_t)0x7f0000000000ull, RLK_BF16, (int64_t)1 << 23, 4, 4); /* never read */
  rlk_test_expect_error(rlk_linear_sample_workspace_size(ctx, &a, &b), RLK_ERR_INVALID_ARGUMENT, "weight: V = 8388608",
                        "rlk_linear_sample_workspace_size");
  a.weight = rlk_tensor_2d(w, RLK_F16, 4, 4, 4);
  ck_assert_int_eq(rlk_linear_sample_workspace_size(ctx, &a, &b), RLK_ERR_INVALID_ARGUMENT);
  a.weight = rlk_tensor_2d(w, RLK_BF16, 4, 4, 4);
  ck_assert_int_eq(rlk_linear_sample_workspace_size(ctx, &a, &b), RLK_OK);
  ck_assert_uint_ge(b, (size_t)(2 * 4 * 4)); /* the logits at least */
  ck_assert_int_eq(rlk_linear_sample(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT); /* no workspace */
  ck_assert_ptr_nonnull(strstr(rlk_last_error(), "workspace"));
  static _Alignas(16) char ws[1024];
  ck_assert_uint_le(b, sizeof ws - 4);
  a.workspace = ws + 4, a.workspace_bytes = sizeof ws - 4; /* misaligned: said before the logits' view of it */
  ck_assert_int_eq(rlk_linear_sample(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "workspace: not 16-byte aligned"), "%s", rlk_last_error());
  rlk_context_destroy(ctx);
}
END_TEST

Suite *linear_sample_suite(void) {
  Suite *s = suite_create("linear_sample");
  rlk_test_add_case(s, "host", 300, TESTS(host_rollout, bad_arguments));
  rlk_test_add_case(s, "gpu", 1800, TESTS(gpu_rollout));
  return s;
}

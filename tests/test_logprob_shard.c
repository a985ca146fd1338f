/* test_logprob_shard.c - vocab-parallel log-probs simulated in one process: P shards of a
 * vocabulary (uneven widths, row strides of the whole row), rlk_logprob's shard form per shard,
 * the records gathered in rank order, rlk_logprob_combine run once per simulated rank (bitwise
 * equal results), against the fp64 reference of the whole row (tests/ref/logprob_ref.c); the
 * shard backward against the reference gradient's columns; labels at shard edges, ignore_index,
 * labels no shard or two shards own; infinite label logits in the records; the NCCL path's
 * library loading and refusals. Host backend always, CUDA with RLK_TEST_GPU=1 (case "gpu": the
 * same simulation, and rlk_logprob_vocab_parallel through a real one-rank NCCL communicator when
 * libnccl is present). */
#include <check.h>
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "logprob_check.h"
#include "ref/logprob_ref.h"
#include "suites.h"
#include "test_util.h"

enum { F = RLK_LOGPROB_PARTIAL_FIELDS };

typedef struct sh_case {
  int64_t N, V;
  rlk_dtype dtype;
  rlk_dtype label_dtype;
  int P;
  float temperature;
  int entropy;
  int overlap; /* shard 1 starts one column early: its first label is owned twice */
  int mask;    /* every third row: shard 0's columns at the dtype's lowest finite value */
  double scale;
} sh_case;

/* The dtype's lowest finite value: what a model masks logits with (torch.finfo(dtype).min). */
static double dtype_floor(rlk_dtype dt) {
  return dt == RLK_F32 ? -(double)FLT_MAX : (dt == RLK_BF16 ? -0x1.fep127 : -65504.0);
}

/* Shard r's columns [v0[r], v0[r + 1]): uneven widths (odd, not multiples of a vector). */
static void split(const sh_case *c, uint64_t *rng, int64_t *v0) {
  v0[0] = 0;
  for (int r = 1; r < c->P; r++) {
    const int64_t even = c->V * r / c->P;
    const int64_t jitter = (int64_t)(rlk_test_rand_u64(rng) % 7) - 3;
    v0[r] = even + jitter;
  }
  v0[c->P] = c->V;
}

static void *dev_copy(rlk_context *ctx, const void *src, size_t bytes) {
  return rlk_test_dev_upload(ctx, src, bytes);
}

static void to_host(rlk_context *ctx, void *dst, const void *src, size_t bytes) {
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, dst, src, bytes), RLK_OK);
}

static void store_label(void *labels, rlk_dtype d, int64_t i, int64_t y) {
  if (d == RLK_I32)
    ((int32_t *)labels)[i] = (int32_t)y;
  else
    ((int64_t *)labels)[i] = y;
}

/* One simulated run: forward per shard, P combines, checks; then the shard backward. */
static void run_case(rlk_context *ctx, uint64_t *rng, const sh_case *c) {
  const int64_t N = c->N, V = c->V;
  const int P = c->P;
  const size_t es = rlk_dtype_size(c->dtype), ls = rlk_dtype_size(c->label_dtype);
  char what[256];
  snprintf(what, sizeof what, "N=%lld V=%lld P=%d %s labels=%s T=%g ent=%d overlap=%d mask=%d seed=%llu",
           (long long)N, (long long)V, P, rlk_dtype_name(c->dtype), rlk_dtype_name(c->label_dtype),
           (double)c->temperature, c->entropy, c->overlap, c->mask, (unsigned long long)rlk_test_seed());
  int64_t v0[9], start[9];
  split(c, rng, v0);
  for (int r = 0; r <= P; r++) start[r] = v0[r];
  if (c->overlap) start[1] = v0[1] - 1; /* shard 1 = [v0[1] - 1, v0[2]) */

  /* logits [N, V] rounded to the dtype; x holds what was stored */
  double *x = malloc((size_t)(N * V) * sizeof *x);
  void *h_logits = malloc((size_t)(N * V) * es);
  for (int64_t k = 0; k < N * V; k++)
    x[k] = rlk_test_store(h_logits, c->dtype, k, c->scale * rlk_test_rand_normal(rng));
  /* a spike in a few rows, at a shard edge: the max of one shard dominates */
  for (int64_t i = 0; i < N; i += 5) {
    const int64_t j = v0[1 + (int)(i / 5) % (P - 1 > 0 ? P - 1 : 1)] - (i % 2);
    x[i * V + j] = rlk_test_store(h_logits, c->dtype, i * V + j, 25.0 + (double)(i % 7));
  }
  /* masked rows: a whole shard's record has m at the floor, far below the combined maximum */
  if (c->mask)
    for (int64_t i = 1; i < N; i += 3)
      for (int64_t j = 0; j < v0[1]; j++)
        x[i * V + j] = rlk_test_store(h_logits, c->dtype, i * V + j, dtype_floor(c->dtype));
  /* labels: shard edges first, then random; a few ignored, one past V, one negative */
  int64_t *y = malloc((size_t)N * sizeof *y);
  void *h_labels = malloc((size_t)N * ls);
  for (int64_t i = 0; i < N; i++) {
    const int64_t k = i % 12;
    const int r = (int)((i / 12) % P);
    if (k == 0) y[i] = v0[r];
    else if (k == 1) y[i] = v0[r + 1] - 1;
    else if (k == 2) y[i] = 0;
    else if (k == 3) y[i] = V - 1;
    else if (k == 4) y[i] = -100;
    else y[i] = (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)V);
  }
  if (N > 7) y[7] = V;  /* no shard owns it */
  if (N > 8) y[8] = -3; /* neither: a bad label, not ignore_index */
  for (int64_t i = 0; i < N; i++) store_label(h_labels, c->label_dtype, i, y[i]);

  void *d_logits = dev_copy(ctx, h_logits, (size_t)(N * V) * es);
  void *d_labels = dev_copy(ctx, h_labels, (size_t)N * ls);
  const size_t rec_bytes = (size_t)N * F * sizeof(float);
  float *d_gathered = rlk_test_dev_alloc(ctx, rec_bytes * (size_t)P);
  ck_assert_int_eq(rlk_memset(ctx, d_gathered, 0xff, rec_bytes * (size_t)P), RLK_OK);

  /* each rank's forward, its records straight into its slot of the gathered buffer */
  for (int r = 0; r < P; r++) {
    const int64_t Vs = v0[r + 1] - start[r];
    rlk_logprob_args a;
    rlk_logprob_args_init(&a);
    a.logits = rlk_tensor_2d((char *)d_logits + (size_t)start[r] * es, c->dtype, N, Vs, V);
    a.labels = rlk_tensor_1d(d_labels, c->label_dtype, N);
    a.temperature = c->temperature;
    a.partials = rlk_tensor_2d(d_gathered + (size_t)r * N * F, RLK_F32, N, F, F);
    a.vocab_start = start[r];
    a.partial_entropy = c->entropy;
    ck_assert_msg(rlk_logprob(ctx, &a, NULL) == RLK_OK, "%s: shard %d: %s", what, r, rlk_last_error());
  }
  float *gathered = malloc(rec_bytes * (size_t)P);
  ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  to_host(ctx, gathered, d_gathered, rec_bytes * (size_t)P);

  /* every record written; ownership as labelled */
  for (int r = 0; r < P; r++)
    for (int64_t i = 0; i < N; i++) {
      const float *rec = gathered + ((size_t)r * N + i) * F;
      uint32_t bits;
      memcpy(&bits, &rec[3], 4);
      ck_assert_msg(bits != 0xffffffffu, "%s: record %d/%lld not written", what, r, (long long)i);
      const int owns = y[i] != -100 && y[i] >= start[r] && y[i] < v0[r + 1];
      ck_assert_msg(owns == (rec[3] != INFINITY), "%s: record %d/%lld: t = %g, owns %d", what, r,
                    (long long)i, (double)rec[3], owns);
    }

  /* every simulated rank combines its own copy of the gathered records */
  float *out[8][3];
  int32_t status[8];
  for (int k = 0; k < P; k++) {
    float *d_copy = dev_copy(ctx, gathered, rec_bytes * (size_t)P);
    float *d_out = rlk_test_dev_alloc(ctx, 3 * (size_t)N * sizeof(float));
    int32_t zero = 0;
    int32_t *d_status = dev_copy(ctx, &zero, sizeof zero);
    rlk_logprob_combine_args ca;
    rlk_logprob_combine_args_init(&ca);
    ca.partials = rlk_test_tensor_3d(d_copy, RLK_F32, P, N, F);
    ca.labels = rlk_tensor_1d(d_labels, c->label_dtype, N);
    ca.logp = rlk_tensor_1d(d_out, RLK_F32, N);
    ca.lse = rlk_tensor_1d(d_out + N, RLK_F32, N);
    if (c->entropy) ca.entropy = rlk_tensor_1d(d_out + 2 * N, RLK_F32, N);
    ca.status = rlk_tensor_1d(d_status, RLK_I32, 1);
    ck_assert_msg(rlk_logprob_combine(ctx, &ca, NULL) == RLK_OK, "%s: combine: %s", what,
                  rlk_last_error());
    ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
    for (int o = 0; o < 3; o++) {
      out[k][o] = malloc((size_t)N * sizeof(float));
      to_host(ctx, out[k][o], d_out + (size_t)o * N, (size_t)N * sizeof(float));
    }
    to_host(ctx, &status[k], d_status, sizeof(int32_t));
    rlk_free(ctx, d_copy);
    rlk_free(ctx, d_out);
    rlk_free(ctx, d_status);
  }
  for (int k = 1; k < P; k++) {
    for (int o = 0; o < (c->entropy ? 3 : 2); o++)
      ck_assert_msg(!memcmp(out[k][o], out[0][o], (size_t)N * sizeof(float)),
                    "%s: rank %d's output %d differs from rank 0's", what, k, o);
    ck_assert_int_eq(status[k], status[0]);
  }

  /* against the fp64 reference of the whole row */
  int want_status = 0;
  lp_ref_row *ref = malloc((size_t)N * sizeof *ref);
  for (int64_t i = 0; i < N; i++) {
    int bad = 0;
    lp_ref_forward(x + i * V, V, c->temperature, y[i], -100, &ref[i], &bad);
    const lp_ref_row *rr = &ref[i];
    if (bad) want_status |= RLK_LOGPROB_STATUS_BAD_LABEL;
    const int twice = c->overlap && y[i] == v0[1] - 1;
    if (twice) want_status |= RLK_LOGPROB_STATUS_LABEL_OWNERS;
    const double tol = lp_fwd_tol(rr->logp, rr->max_z, rr->lse, V);
    if (twice) {
      ck_assert_msg(isnan(out[0][0][i]) && isnan(out[0][1][i]), "%s: row %lld owned twice is not NaN",
                    what, (long long)i);
      continue;
    }
    if (c->overlap) continue; /* one column is counted twice: only the status is defined */
    lp_check_value(what, "logp", i, out[0][0][i], rr->logp, tol);
    lp_check_value(what, "lse", i, out[0][1][i], rr->lse, lp_fwd_tol(rr->lse, rr->max_z, rr->lse, V));
    if (c->entropy)
      lp_check_value(what, "entropy", i, out[0][2][i], rr->entropy,
                  lp_fwd_tol(rr->entropy, rr->max_z, rr->lse, V));
  }
  ck_assert_msg(status[0] == want_status, "%s: status %d, expected %d", what, status[0], want_status);

  /* the backward, shard by shard, from the combined lse / entropy (no overlap: one owner each) */
  if (!c->overlap) {
    float *d_lse = dev_copy(ctx, out[0][1], (size_t)N * sizeof(float));
    float *d_ent = dev_copy(ctx, out[0][2], (size_t)N * sizeof(float));
    float *glp = malloc((size_t)N * sizeof *glp), *gh = malloc((size_t)N * sizeof *gh);
    for (int64_t i = 0; i < N; i++) {
      glp[i] = (float)rlk_test_rand_normal(rng);
      gh[i] = c->entropy ? (float)rlk_test_rand_normal(rng) : 0.0f;
    }
    float *d_glp = dev_copy(ctx, glp, (size_t)N * sizeof(float));
    float *d_gh = dev_copy(ctx, gh, (size_t)N * sizeof(float));
    float *d_grad = rlk_test_dev_alloc(ctx, (size_t)(N * V) * sizeof(float));
    for (int r = 0; r < P; r++) {
      const int64_t Vs = v0[r + 1] - v0[r];
      rlk_logprob_backward_args b;
      rlk_logprob_backward_args_init(&b);
      b.logits = rlk_tensor_2d((char *)d_logits + (size_t)v0[r] * es, c->dtype, N, Vs, V);
      b.labels = rlk_tensor_1d(d_labels, c->label_dtype, N);
      b.temperature = c->temperature;
      b.lse = rlk_tensor_1d(d_lse, RLK_F32, N);
      b.grad_logp = rlk_tensor_1d(d_glp, RLK_F32, N);
      if (c->entropy) {
        b.grad_entropy = rlk_tensor_1d(d_gh, RLK_F32, N);
        b.entropy = rlk_tensor_1d(d_ent, RLK_F32, N);
      }
      b.grad_logits = rlk_tensor_2d(d_grad + v0[r], RLK_F32, N, Vs, V);
      b.shard = 1;
      b.vocab_start = v0[r];
      ck_assert_msg(rlk_logprob_backward(ctx, &b, NULL) == RLK_OK, "%s: backward shard %d: %s",
                    what, r, rlk_last_error());
    }
    float *grad = malloc((size_t)(N * V) * sizeof *grad);
    double *gref = malloc((size_t)V * sizeof *gref);
    ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
    to_host(ctx, grad, d_grad, (size_t)(N * V) * sizeof(float));
    for (int64_t i = 0; i < N; i++) {
      lp_ref_backward(x + i * V, V, c->temperature, y[i], -100, glp[i], gh[i], gref);
      const lp_ref_row *rr = &ref[i];
      const double lse_err = lp_fwd_tol(rr->lse, rr->max_z, rr->lse, V);
      for (int64_t j = 0; j < V; j++) {
        const double got = grad[i * V + j], want = gref[j];
        if (isnan(want)) {
          ck_assert_msg(isnan(got), "%s: grad[%lld, %lld] = %g, reference NaN", what,
                        (long long)i, (long long)j, got);
          continue;
        }
        const double z = x[i * V + j] / c->temperature;
        const double p = exp(z - rr->lse);
        const double mag = p * (fabs(glp[i]) + fabs(gh[i]) * (fabs(z - rr->ez) + 1.0)) / c->temperature;
        const double tol = 1e-6 * fabs(want) + (1e-5 + lse_err) * mag + 1e-30;
        ck_assert_msg(fabs(got - want) <= tol,
                      "%s: grad[%lld, %lld] = %.9g, reference %.12g (tol %.3g, label %lld)", what,
                      (long long)i, (long long)j, got, want, tol, (long long)y[i]);
      }
    }
    free(grad);
    free(gref);
    free(glp);
    free(gh);
    rlk_free(ctx, d_lse);
    rlk_free(ctx, d_ent);
    rlk_free(ctx, d_glp);
    rlk_free(ctx, d_gh);
    rlk_free(ctx, d_grad);
  }

  for (int k = 0; k < P; k++)
    for (int o = 0; o < 3; o++) free(out[k][o]);
  free(ref);
  free(gathered);
  free(x);
  free(h_logits);
  free(y);
  free(h_labels);
  rlk_free(ctx, d_logits);
  rlk_free(ctx, d_labels);
  rlk_free(ctx, d_gathered);
}

static sh_case mk(int64_t N, int64_t V, rlk_dtype dt, int P, int entropy) {
  return (sh_case){.N = N, .V = V, .dtype = dt, .label_dtype = RLK_I64, .P = P, .temperature = 1.0f,
      .entropy = entropy, .scale = 3.0};
}

static void cases_simulated(rlk_context *ctx, uint64_t *rng, int64_t V) {
  static const int Ps[] = {2, 4, 8};
  static const rlk_dtype dts[] = {RLK_BF16, RLK_F16, RLK_F32};
  for (size_t p = 0; p < 3; p++)
    for (size_t d = 0; d < 3; d++) {
      sh_case c = mk(40, V, dts[d], Ps[p], (int)((p + d) % 2 == 0) || d == 0);
      c.label_dtype = d == 1 ? RLK_I32 : RLK_I64;
      c.temperature = p == 1 ? 0.7f : 1.0f;
      run_case(ctx, rng, &c);
    }
  sh_case o = mk(30, V, RLK_BF16, 4, 1);
  o.overlap = 1;
  run_case(ctx, rng, &o);
  /* a shard masked with the dtype's lowest value: its terms vanish from the combined entropy */
  for (size_t d = 0; d < 3; d++) {
    sh_case m = mk(31, V, dts[d], d == 1 ? 2 : 3, 1);
    m.mask = 1;
    run_case(ctx, rng, &m);
  }
}

/* An unsharded batch in ctx's memory: bf16 [N, V] logits (normal, sd 3) and i64 labels (with
 * `ignore_every` > 0, every such row's -100); `a` the forward's args over them, outputs unset. */
typedef struct unsharded {
  void *logits, *labels;
  rlk_logprob_args a;
} unsharded;

static unsharded unsharded_batch(rlk_context *ctx, uint64_t *rng, int64_t N, int64_t V, int ignore_every) {
  uint16_t *h = malloc((size_t)(N * V) * 2);
  int64_t *y = malloc((size_t)N * sizeof *y);
  ck_assert(h && y);
  for (int64_t k = 0; k < N * V; k++) rlk_test_store(h, RLK_BF16, k, 3.0 * rlk_test_rand_normal(rng));
  for (int64_t i = 0; i < N; i++)
    y[i] = ignore_every && i % ignore_every == 0 ? -100 : (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)V);
  unsharded u;
  u.logits = dev_copy(ctx, h, (size_t)(N * V) * 2);
  u.labels = dev_copy(ctx, y, (size_t)N * 8);
  free(h);
  free(y);
  rlk_logprob_args_init(&u.a);
  u.a.logits = rlk_tensor_2d(u.logits, RLK_BF16, N, V, V);
  u.a.labels = rlk_tensor_1d(u.labels, RLK_I64, N);
  return u;
}

static void unsharded_free(rlk_context *ctx, unsharded *u) {
  rlk_free(ctx, u->logits);
  rlk_free(ctx, u->labels);
}

/* Reads back 2 * n outputs of N floats at o: the unsharded forward's n (logp, lse[, entropy]),
 * then the same n by `how`; lse must agree bit for bit, the others within 1e-5 relative. */
static void expect_as_unsharded(rlk_context *ctx, const float *o, int64_t N, int n, const char *how) {
  static const char *const names[] = {"logp", "lse", "entropy"};
  float *r = malloc(2 * (size_t)n * (size_t)N * 4);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  to_host(ctx, r, o, 2 * (size_t)n * (size_t)N * 4);
  for (int k = 0; k < n; k++)
    for (int64_t i = 0; i < N; i++) {
      const float want = r[k * N + i], got = r[(n + k) * N + i];
      if (k == 1)
        ck_assert_msg(!memcmp(&want, &got, 4), "lse[%lld]: %.9g unsharded, %.9g %s", (long long)i, (double)want,
                      (double)got, how);
      else
        ck_assert_msg(fabsf(want - got) <= 1e-5f * (1.0f + fabsf(want)), "%s[%lld]: %.9g unsharded, %.9g %s",
                      names[k], (long long)i, (double)want, (double)got, how);
    }
  free(r);
}

/* P = 1: the combine of one record gives rlk_logprob's lse bit for bit (same row pass). */
static void case_single_shard(rlk_context *ctx, uint64_t *rng, int64_t V) {
  const int64_t N = 33;
  unsharded u = unsharded_batch(ctx, rng, N, V, 0);
  float *rec = rlk_test_dev_alloc(ctx, (size_t)N * F * 4), *o = rlk_test_dev_alloc(ctx, 4 * (size_t)N * 4);
  rlk_logprob_args a = u.a;
  a.logp = rlk_tensor_1d(o, RLK_F32, N);
  a.lse = rlk_tensor_1d(o + N, RLK_F32, N);
  ck_assert_msg(rlk_logprob(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  rlk_logprob_args s = a;
  s.logp = s.lse = (rlk_tensor){0};
  s.partials = rlk_tensor_2d(rec, RLK_F32, N, F, F);
  ck_assert_msg(rlk_logprob(ctx, &s, NULL) == RLK_OK, "%s", rlk_last_error());
  rlk_logprob_combine_args ca;
  rlk_logprob_combine_args_init(&ca);
  ca.partials = rlk_test_tensor_3d(rec, RLK_F32, 1, N, F);
  ca.labels = a.labels;
  ca.logp = rlk_tensor_1d(o + 2 * N, RLK_F32, N);
  ca.lse = rlk_tensor_1d(o + 3 * N, RLK_F32, N);
  ck_assert_msg(rlk_logprob_combine(ctx, &ca, NULL) == RLK_OK, "%s", rlk_last_error());
  expect_as_unsharded(ctx, o, N, 2, "combined");
  unsharded_free(ctx, &u);
  rlk_free(ctx, rec);
  rlk_free(ctx, o);
}

/* Infinite label logits in the records (rlk.h's format): t is z_y where the shard owns the label
 * and +inf, the "absent" marker, elsewhere, so an owned z_y of +inf (a +inf logit, or x_y / T
 * past f32's range) is written NaN: the combine still finds the label owned (no status bit) and
 * the row NaN. An owned -inf logit stays -inf (logp -inf); a +inf logit off the label leaves t
 * finite (the row is NaN by its m and s); an ignored row's t is +inf in every record. f32 logits
 * [6, 12] in two shards [0, 5) and [5, 12) at T 0.5. */
static void case_label_inf(rlk_context *ctx, uint64_t *rng) {
  enum { N = 6, V = 12, P = 2 };
  static const int64_t cut[P + 1] = {0, 5, 12};
  static const int64_t y[N] = {7, 2, 9, -100, 4, 10};
  const float T = 0.5f;
  float x[N * V];
  for (int64_t k = 0; k < N * V; k++) x[k] = (float)rlk_test_rand_normal(rng);
  x[0 * V + 7] = INFINITY;  /* the label's logit +inf: t NaN */
  x[1 * V + 2] = -INFINITY; /* the label's logit -inf: t -inf, owned */
  x[2 * V + 9] = 3e38f;     /* finite, but x / T is past f32's range: t NaN */
  x[3 * V + 6] = INFINITY;  /* an ignored row */
  x[5 * V + 1] = INFINITY;  /* +inf off the label, in the other shard */
  void *d_x = dev_copy(ctx, x, sizeof x), *d_y = dev_copy(ctx, y, sizeof y);
  float *d_rec = rlk_test_dev_alloc(ctx, (size_t)(P * N * F) * 4);
  for (int r = 0; r < P; r++) {
    rlk_logprob_args a;
    rlk_logprob_args_init(&a);
    a.logits = rlk_tensor_2d((float *)d_x + cut[r], RLK_F32, N, cut[r + 1] - cut[r], V);
    a.labels = rlk_tensor_1d(d_y, RLK_I64, N);
    a.temperature = T;
    a.partials = rlk_tensor_2d(d_rec + (size_t)r * N * F, RLK_F32, N, F, F);
    a.vocab_start = cut[r];
    ck_assert_msg(rlk_logprob(ctx, &a, NULL) == RLK_OK, "shard %d: %s", r, rlk_last_error());
  }
  float *d_out = rlk_test_dev_alloc(ctx, (size_t)N * 4);
  int32_t zero = 0, status = -1;
  int32_t *d_status = dev_copy(ctx, &zero, sizeof zero);
  rlk_logprob_combine_args ca;
  rlk_logprob_combine_args_init(&ca);
  ca.partials = rlk_test_tensor_3d(d_rec, RLK_F32, P, N, F);
  ca.labels = rlk_tensor_1d(d_y, RLK_I64, N);
  ca.logp = rlk_tensor_1d(d_out, RLK_F32, N);
  ca.status = rlk_tensor_1d(d_status, RLK_I32, 1);
  ck_assert_msg(rlk_logprob_combine(ctx, &ca, NULL) == RLK_OK, "%s", rlk_last_error());
  ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  float rec[P * N * F], lp[N];
  to_host(ctx, rec, d_rec, sizeof rec);
  to_host(ctx, lp, d_out, sizeof lp);
  to_host(ctx, &status, d_status, sizeof status);
  for (int r = 0; r < P; r++)
    for (int64_t i = 0; i < N; i++) {
      const float t = rec[((size_t)r * N + i) * F + 3];
      const int owns = y[i] != -100 && y[i] >= cut[r] && y[i] < cut[r + 1];
      const float z = owns ? x[i * V + y[i]] / T : INFINITY; /* the kernels' f32 division */
      if (owns && z == INFINITY)
        ck_assert_msg(isnan(t), "record %d/%lld: an owned z_y of +inf written as %g, not NaN", r, (long long)i,
                      (double)t);
      else
        ck_assert_msg(!memcmp(&t, &z, 4), "record %d/%lld: t = %.9g, want %.9g", r, (long long)i, (double)t,
                      (double)z);
    }
  ck_assert_msg(status == 0, "status %d: an owned infinite label logit counted as no owner's", status);
  ck_assert_msg(isnan(lp[0]) && lp[1] == -INFINITY && isnan(lp[2]) && lp[3] == 0.0f && isfinite(lp[4]) &&
                    isnan(lp[5]),
                "logp %g %g %g %g %g %g", (double)lp[0], (double)lp[1], (double)lp[2], (double)lp[3], (double)lp[4],
                (double)lp[5]);
  rlk_free(ctx, d_x);
  rlk_free(ctx, d_y);
  rlk_free(ctx, d_rec);
  rlk_free(ctx, d_out);
  rlk_free(ctx, d_status);
}

/* ---------------------------------------------------------------------------------- */
/* Host                                                                                */
/* ---------------------------------------------------------------------------------- */

START_TEST(host_simulated) {
  rlk_context *ctx = rlk_test_host_context();
  uint64_t rng = rlk_test_seed() ^ 0x5a5a;
  cases_simulated(ctx, &rng, 1001);
  case_single_shard(ctx, &rng, 517);
  rlk_context_destroy(ctx);
}
END_TEST

/* RLK_JIT_RECORD: a shard's forward and the combine each leave a line that precompiles. */
START_TEST(host_records_its_configurations) {
  rlk_context *ctx = rlk_test_recording_host_context();
  if (!ctx) return;
  uint64_t rng = rlk_test_seed() ^ 0x4ecu;
  case_single_shard(ctx, &rng, 517);
  static const char *const want[] = {"logprob_shard pass=fwd", "logprob_shard pass=combine", NULL};
  rlk_test_record_expect(ctx, want);
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  float logits[4 * 8] = {0}, rec[4 * F + 4], out[4];
  int64_t labels[4] = {0, 1, 2, 3};
  float *rec16 = (float *)(((uintptr_t)rec + 15) & ~(uintptr_t)15);
  rlk_logprob_args a;
  rlk_logprob_args_init(&a);
  a.logits = rlk_tensor_2d(logits, RLK_F32, 4, 8, 8);
  a.labels = rlk_tensor_1d(labels, RLK_I64, 4);
  a.partials = rlk_tensor_2d(rec16, RLK_F32, 4, F, F);
  a.logp = rlk_tensor_1d(out, RLK_F32, 4);
  ck_assert_int_eq(rlk_logprob(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT); /* logp with partials */
  ck_assert_ptr_nonnull(strstr(rlk_last_error(), "shard form"));
  a.logp = (rlk_tensor){0};
  a.partials = rlk_tensor_2d(rec16, RLK_F32, 4, 3, 3);
  ck_assert_int_eq(rlk_logprob(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT); /* [N, 3] */
  a.partials = rlk_tensor_2d(rec16 + 1, RLK_F32, 4, F, F);
  ck_assert_int_eq(rlk_logprob(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT); /* unaligned */
  a.partials = rlk_tensor_2d(rec16, RLK_F32, 4, F, F);
  a.vocab_start = -1;
  ck_assert_int_eq(rlk_logprob(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT);
  a.vocab_start = 8;
  ck_assert_int_eq(rlk_logprob(ctx, &a, NULL), RLK_OK);

  rlk_logprob_combine_args ca;
  rlk_logprob_combine_args_init(&ca);
  ck_assert_int_eq(ca.ignore_index, -100);
  ca.partials = a.partials; /* [N, 4]: not [P, N, 4] */
  ca.labels = a.labels;
  ca.logp = rlk_tensor_1d(out, RLK_F32, 4);
  ck_assert_int_eq(rlk_logprob_combine(ctx, &ca, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_logprob_combine(ctx, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);
  /* the status word is one i32: [P = 1, N, 4] records combine, a word of 2 or 0 is refused */
  int32_t words[2] = {0, 0};
  ca.partials.ndim = 3;
  ca.partials.shape[0] = 1, ca.partials.shape[1] = 4, ca.partials.shape[2] = F;
  ca.partials.strides[0] = 4 * F, ca.partials.strides[1] = F, ca.partials.strides[2] = 1;
  ca.status = rlk_tensor_1d(words, RLK_I32, 1);
  ck_assert_msg(rlk_logprob_combine(ctx, &ca, NULL) == RLK_OK, "%s", rlk_last_error());
  ca.status.shape[0] = 2;
  rlk_test_expect_error(rlk_logprob_combine(ctx, &ca, NULL), RLK_ERR_INVALID_ARGUMENT, "status",
                        "combine, status of 2 words");
  ca.status.shape[0] = 0;
  rlk_test_expect_error(rlk_logprob_combine(ctx, &ca, NULL), RLK_ERR_INVALID_ARGUMENT, "status",
                        "combine, empty status");
  ca.status = (rlk_tensor){0};

  rlk_logprob_backward_args b;
  rlk_logprob_backward_args_init(&b);
  b.logits = a.logits;
  b.labels = a.labels;
  b.lse = rlk_tensor_1d(out, RLK_F32, 4);
  b.grad_logp = b.lse;
  float g[32];
  b.grad_logits = rlk_tensor_2d(g, RLK_F32, 4, 8, 8);
  b.shard = 2;
  ck_assert_int_eq(rlk_logprob_backward(ctx, &b, NULL), RLK_ERR_INVALID_ARGUMENT);
  b.shard = 1;
  b.vocab_start = -4;
  ck_assert_int_eq(rlk_logprob_backward(ctx, &b, NULL), RLK_ERR_INVALID_ARGUMENT);

  /* the NCCL path off CUDA, and without a communicator */
  rlk_logprob_vocab_parallel_args v;
  rlk_logprob_vocab_parallel_args_init(&v);
  ck_assert(v.fwd.temperature == 1.0f && v.fwd.ignore_index == -100);
  v.fwd.logits = a.logits;
  v.fwd.labels = a.labels;
  v.fwd.logp = rlk_tensor_1d(out, RLK_F32, 4);
  rlk_test_expect_error(rlk_logprob_vocab_parallel(ctx, &v, NULL), RLK_ERR_INVALID_ARGUMENT, "nccl_comm",
                        "rlk_logprob_vocab_parallel");
  v.nccl_comm = (void *)&v; /* never dereferenced: refused before NCCL is asked */
  ck_assert_int_eq(rlk_logprob_vocab_parallel(ctx, &v, NULL), RLK_ERR_UNSUPPORTED);
  size_t bytes = 7;
  ck_assert_int_eq(rlk_logprob_vocab_parallel_workspace_size(ctx, &v, &bytes), RLK_ERR_UNSUPPORTED);
  ck_assert_uint_eq(bytes, 0); /* refused: no size */
  rlk_context_destroy(ctx);
}
END_TEST

/* RLK_NCCL_LIB naming a missing file: RLK_ERR_UNAVAILABLE naming it (no other library is tried,
 * and none is loaded in this process). Each test runs in its own process. */
START_TEST(nccl_missing_library) {
  setenv("RLK_NCCL_LIB", "/nonexistent/rlk-test/libnccl.so.2", 1);
  int version = -1;
  ck_assert_int_eq(rlk_nccl_version(&version, NULL, 0), RLK_ERR_UNAVAILABLE);
  ck_assert_int_eq(version, -1);
  ck_assert_msg(strstr(rlk_last_error(), "/nonexistent/rlk-test/libnccl.so.2") &&
                    strstr(rlk_last_error(), "libnccl is not available"),
                "%s", rlk_last_error());
  unsetenv("RLK_NCCL_LIB");
}
END_TEST

/* The system's libnccl when there is one: a 2.x version code and the file it came from. */
START_TEST(nccl_system_library) {
  unsetenv("RLK_NCCL_LIB");
  int version = 0;
  char path[512] = "";
  const rlk_status st = rlk_nccl_version(&version, path, sizeof path);
  if (st == RLK_ERR_UNAVAILABLE) {
    printf("note (logprob_shard): no libnccl here: %s\n", rlk_last_error());
    return;
  }
  ck_assert_msg(st == RLK_OK, "%s", rlk_last_error());
  ck_assert_msg(version >= 20000 && version < 30000, "version %d", version);
  ck_assert_ptr_nonnull(strstr(path, "nccl"));
}
END_TEST

START_TEST(host_label_inf) {
  rlk_context *ctx = rlk_test_host_context();
  uint64_t rng = rlk_test_seed() ^ 0x1f1fu;
  case_label_inf(ctx, &rng);
  rlk_context_destroy(ctx);
}
END_TEST

RLK_SAMPLES_CASE("logprob_shard", &rlk_op_logprob_shard)

/* ---------------------------------------------------------------------------------- */
/* CUDA                                                                                */
/* ---------------------------------------------------------------------------------- */

static void cases_simulated_gpu(rlk_context *ctx, uint64_t *rng) {
  cases_simulated(ctx, rng, 1001);
  cases_simulated(ctx, rng, 151936 / 8 + 13);
  case_single_shard(ctx, rng, 517);
  case_single_shard(ctx, rng, 151936);
  case_label_inf(ctx, rng);
}

RLK_GPU_TEST("logprob_shard", simulated, cases_simulated_gpu(ctx, &rng))

/* rlk_logprob_vocab_parallel through a real NCCL communicator of one rank (one GPU): the library
 * this test loads (RTLD_GLOBAL) is the copy rlk must find in the process; the records, an
 * in-place ncclAllGather of one rank, the combine. P = 1 gives rlk_logprob's lse bit for bit. */
typedef struct nccl_id_t {
  char internal[128];
} nccl_id_t;

START_TEST(gpu_nccl_one_rank) {
  if (!rlk_test_gpu_enabled("logprob_shard")) return;
  rlk_context *ctx = rlk_test_cuda_context("logprob_shard");
  if (!ctx) return;
  void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    printf("skip (logprob_shard gpu_nccl_one_rank): no libnccl.so.2: %s\n", dlerror());
    rlk_context_destroy(ctx);
    return;
  }
  int (*get_id)(nccl_id_t *);
  int (*init_rank)(void **, int, nccl_id_t, int);
  int (*destroy)(void *);
  void *f;
  f = dlsym(lib, "ncclGetUniqueId");
  memcpy(&get_id, &f, sizeof f);
  f = dlsym(lib, "ncclCommInitRank");
  memcpy(&init_rank, &f, sizeof f);
  f = dlsym(lib, "ncclCommDestroy");
  memcpy(&destroy, &f, sizeof f);
  ck_assert(get_id && init_rank && destroy);
  nccl_id_t id;
  void *comm = NULL;
  ck_assert_int_eq(get_id(&id), 0);
  ck_assert_int_eq(init_rank(&comm, 1, id, 0), 0);

  uint64_t rng = rlk_test_seed() ^ 0x7c7c;
  const int64_t N = 1000, V = 151936;
  unsharded u = unsharded_batch(ctx, &rng, N, V, 17);
  float *o = rlk_test_dev_alloc(ctx, 6 * (size_t)N * 4);
  rlk_logprob_args a = u.a;
  a.logp = rlk_tensor_1d(o, RLK_F32, N);
  a.lse = rlk_tensor_1d(o + N, RLK_F32, N);
  a.entropy = rlk_tensor_1d(o + 2 * N, RLK_F32, N);
  ck_assert_msg(rlk_logprob(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());

  rlk_logprob_vocab_parallel_args v;
  rlk_logprob_vocab_parallel_args_init(&v);
  v.fwd = a;
  v.fwd.logp = rlk_tensor_1d(o + 3 * N, RLK_F32, N);
  v.fwd.lse = rlk_tensor_1d(o + 4 * N, RLK_F32, N);
  v.fwd.entropy = rlk_tensor_1d(o + 5 * N, RLK_F32, N);
  v.nccl_comm = comm;
  size_t bytes = 0;
  ck_assert_msg(rlk_logprob_vocab_parallel_workspace_size(ctx, &v, &bytes) == RLK_OK, "%s", rlk_last_error());
  ck_assert_uint_eq(bytes, (size_t)N * 16);
  v.workspace = rlk_test_dev_alloc(ctx, bytes);
  v.workspace_bytes = bytes;
  ck_assert_msg(rlk_logprob_vocab_parallel(ctx, &v, NULL) == RLK_OK, "%s", rlk_last_error());
  expect_as_unsharded(ctx, o, N, 3, "through NCCL");
  int version = 0;
  char path[512];
  ck_assert_int_eq(rlk_nccl_version(&version, path, sizeof path), RLK_OK);
  printf("note (logprob_shard gpu_nccl_one_rank): libnccl %d from %s\n", version, path);
  destroy(comm);
  unsharded_free(ctx, &u);
  rlk_free(ctx, o);
  rlk_free(ctx, v.workspace);
  rlk_context_destroy(ctx);
}
END_TEST

Suite *logprob_shard_suite(void) {
  Suite *s = suite_create("logprob_shard");
  rlk_test_add_case(s, "host", 300, TESTS(host_simulated, host_label_inf, bad_arguments, host_records_its_configurations,
      nccl_missing_library, nccl_system_library));
  rlk_test_add_case(s, "plan", 300, TESTS(samples_compile_every_target));
  rlk_test_add_case(s, "gpu", 600, TESTS(gpu_simulated, gpu_nccl_one_rank));
  return s;
}

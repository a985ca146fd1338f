/* test_logprob.c - rlk_logprob and rlk_logprob_backward against the fp64 reference (tests/ref/)
 * on the host backend and, with RLK_TEST_GPU=1, on CUDA (every variant; the tensor-map variant only
 * unless RLK_TEST_TMA=0); argument validation; the precompile plan; the op's sample configurations
 * compiled for every target whose compiler is present. Outputs are poisoned before each call and
 * every element is checked to have been written. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops/ops.h"
#include "logprob_check.h"
#include "ref/logprob_ref.h"
#include "suites.h"
#include "test_util.h"

/* ---------------------------------------------------------------------------------- */
/* Storage of logits and gradients                                                     */
/* ---------------------------------------------------------------------------------- */

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* ---------------------------------------------------------------------------------- */
/* One case: data, calls and checks                                                    */
/* ---------------------------------------------------------------------------------- */

enum { LD_NORMAL = 0, LD_SPIKES = 1, LD_NEG_INF = 2, LD_SPECIAL = 3, LD_FLOOR = 4 };

/* The dtype's lowest finite value: what a model masks logits with (torch.finfo(dtype).min). */
static double dtype_floor(rlk_dtype dt) {
  return dt == RLK_F32 ? -(double)FLT_MAX : (dt == RLK_BF16 ? -0x1.fep127 : -65504.0);
}

typedef struct lp_case {
  int64_t N, V;
  rlk_dtype dtype;       /* logits */
  rlk_dtype label_dtype; /* RLK_I32 / RLK_I64 */
  int64_t row_pad;       /* row stride = V + row_pad */
  int64_t label_stride;  /* elements between labels (0: 1) */
  float temperature;
  int64_t ignore_index;
  int entropy;           /* forward writes the entropy (and the backward gets g_H when g_H) */
  int lse;               /* forward writes lse (always with a backward) */
  int data;              /* LD_* */
  double scale;          /* logits ~ scale * N(0, 1) */
  int ignored;           /* some rows carry ignore_index */
  int bad;               /* some rows carry labels outside [0, V) */
  int status;            /* pass a status word */
  int backward;
  rlk_dtype grad_dtype;  /* the logits' dtype or RLK_F32 */
  int in_place;
  int64_t grad_pad;      /* out of place: grad row stride = V + grad_pad */
  int g_lp, g_H;         /* which upstream gradients are given */
  rlk_logprob_variant variant;
  int block, unroll, stages;
} lp_case;

static lp_case base_case(int64_t N, int64_t V, rlk_dtype dt) {
  return (lp_case){.N = N, .V = V, .dtype = dt, .label_dtype = RLK_I64, .temperature = 1.0f,
      .ignore_index = -100, .lse = 1, .scale = 3.0, .status = 1, .grad_dtype = dt, .g_lp = 1};
}

static void describe(const lp_case *c, char *buf, size_t size) {
  snprintf(buf, size,
           "N=%lld V=%lld logits=%s labels=%s pad=%lld lstride=%lld T=%g ignore=%lld ent=%d data=%d "
           "ignored=%d bad=%d bwd=%d grad=%s inplace=%d gpad=%lld g_lp=%d g_H=%d variant=%d block=%d "
           "unroll=%d stages=%d seed=%llu",
           (long long)c->N, (long long)c->V, rlk_dtype_name(c->dtype), rlk_dtype_name(c->label_dtype),
           (long long)c->row_pad, (long long)c->label_stride, (double)c->temperature,
           (long long)c->ignore_index, c->entropy, c->data, c->ignored, c->bad, c->backward,
           rlk_dtype_name(c->grad_dtype), c->in_place, (long long)c->grad_pad, c->g_lp, c->g_H,
           (int)c->variant, c->block, c->unroll, c->stages, (unsigned long long)rlk_test_seed());
}

static void *dev_poisoned(rlk_context *ctx, size_t bytes) {
  void *p = rlk_test_dev_alloc(ctx, bytes);
  ck_assert_int_eq(rlk_memset(ctx, p, 0xff, bytes), RLK_OK);
  return p;
}

static int64_t rand_below(uint64_t *rng, int64_t n) {
  return (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)n);
}

/* Logits of row i into x[V] (as doubles, before rounding to the dtype). */
static void draw_row(uint64_t *rng, const lp_case *c, int64_t i, double *x) {
  const int64_t V = c->V;
  for (int64_t j = 0; j < V; j++) x[j] = c->scale * rlk_test_rand_normal(rng);
  if (c->data == LD_SPIKES || c->data == LD_NEG_INF) {
    /* a few large logits at the ends of the row and at random places: missing one of them
     * (a skipped head, tail or vector) would move lse by O(1) */
    const int64_t spots[4] = {i % 3 == 0 ? 0 : V - 1, rand_below(rng, V), rand_below(rng, V < 16 ? V : 16),
                              V - 1 - rand_below(rng, V < 16 ? V : 16)};
    if (c->data == LD_NEG_INF)
      for (int64_t j = 0; j < V; j++)
        if (rlk_test_rand_uniform(rng) < 0.6) x[j] = -INFINITY;
    for (int k = 0; k < 4; k++) x[spots[k]] = c->scale * (4.0 + 2.0 * rlk_test_rand_uniform(rng));
  }
  if (c->data == LD_FLOOR) {
    /* the first half of the row and most of the rest masked with the dtype's lowest value, a
     * few spikes above it in the second half: sums over the masked columns are rescaled to the
     * spikes' maximum (their terms underflow to 0, their distance to it overflows) */
    const double lo = dtype_floor(c->dtype);
    for (int64_t j = 0; j < V; j++)
      if (j < V / 2 || rlk_test_rand_uniform(rng) < 0.6) x[j] = lo;
    for (int k = 0; k < 3; k++) x[V / 2 + rand_below(rng, V - V / 2)] = c->scale * (4.0 + 2.0 * rlk_test_rand_uniform(rng));
  }
  if (c->data == LD_SPECIAL && c->N > 4) {
    if (i == 1)
      for (int64_t j = 0; j < V; j++) x[j] = -INFINITY; /* a row of -inf */
    if (i == 2) x[rand_below(rng, V)] = NAN;               /* a NaN logit */
    if (i == 3 && V > 1)
      for (int64_t j = 0; j < V; j += 2) x[j] = -INFINITY; /* masked vocabulary */
  }
}

/* Labels: random, with row 0 -> 0 and the last row -> V - 1; ignored and bad rows on request. */
static int64_t draw_label(uint64_t *rng, const lp_case *c, int64_t i, const double *x) {
  const int64_t V = c->V;
  if (c->data == LD_FLOOR) /* an unmasked column (z_y of a masked one may overflow f32) */
    for (int64_t j = V / 2;; j++)
      if (x[j] != dtype_floor(c->dtype)) return j;
  if (i == 0) return 0;
  if (i == c->N - 1) return V - 1;
  if (c->ignored && i % 5 == 2) return c->ignore_index;
  if (c->bad && i % 7 == 3) {
    static const int64_t bad[] = {-1, -2, 0, 1};
    const int64_t k = (i / 7) % 4;
    /* -1 and -2 (when they are not the ignore index), V, V + 1 */
    int64_t y = k < 2 ? bad[k] : V + bad[k];
    if (y == c->ignore_index) y = V + 7;
    if (c->label_dtype == RLK_I64 && i % 2) y = k < 2 ? INT64_MIN + 5 : INT64_MAX - 3;
    return y;
  }
  if (c->data == LD_SPECIAL && i == 3 && V > 1) return 0; /* a -inf logit: logp -inf */
  int64_t y = rand_below(rng, V);
  if (c->data == LD_NEG_INF && x[y] == -INFINITY && rlk_test_rand_uniform(rng) < 0.7) {
    for (int64_t j = 0; j < V; j++)
      if (x[(y + j) % V] != -INFINITY) return (y + j) % V;
  }
  if (y == c->ignore_index && !c->ignored) y = (y + 1) % V;
  return y;
}

/* Outputs of one run, dense, for comparisons between runs. */
typedef struct lp_outputs {
  float *logp, *lse, *entropy;
  double *grad; /* N x V, as doubles */
  int32_t status;
} lp_outputs;

static void free_outputs(lp_outputs *o) {
  free(o->logp);
  free(o->lse);
  free(o->entropy);
  free(o->grad);
  memset(o, 0, sizeof *o);
}

/* Runs the forward (and the backward) of one case on ctx with fresh data from *rng, checks every
 * output against the reference, and keeps the outputs in *keep when given. */
static void run_case(rlk_context *ctx, const lp_case *c, uint64_t *rng, lp_outputs *keep) {
  char what[768];
  describe(c, what, sizeof what);
  const int64_t N = c->N, V = c->V;
  const int64_t rs = V + c->row_pad;
  const size_t es = rlk_dtype_size(c->dtype);
  const int64_t elems = (N - 1) * rs + V;
  const int backward = c->backward;

  /* logits with poisoned padding (never read), and their rounded values */
  void *xh = malloc((size_t)elems * es);
  memset(xh, 0xff, (size_t)elems * es);
  double *xd = malloc((size_t)(N * V) * sizeof *xd);
  double *row = malloc((size_t)V * sizeof *row);
  int64_t *labels = malloc((size_t)N * sizeof *labels);
  for (int64_t i = 0; i < N; i++) {
    draw_row(rng, c, i, row);
    for (int64_t j = 0; j < V; j++) xd[i * V + j] = rlk_test_store(xh, c->dtype, i * rs + j, row[j]);
    labels[i] = draw_label(rng, c, i, xd + i * V);
  }
  const int64_t lst = c->label_stride ? c->label_stride : 1;
  const size_t lsz = rlk_dtype_size(c->label_dtype);
  const int64_t lelems = (N - 1) * lst + 1;
  void *lh = malloc((size_t)lelems * lsz);
  memset(lh, 0x5a, (size_t)lelems * lsz);
  for (int64_t i = 0; i < N; i++) {
    if (c->label_dtype == RLK_I32) {
      int64_t y = labels[i];
      if (y > INT32_MAX || y < INT32_MIN) y = y < 0 ? INT32_MIN : INT32_MAX;
      labels[i] = y;
      ((int32_t *)lh)[i * lst] = (int32_t)y;
    } else {
      ((int64_t *)lh)[i * lst] = labels[i];
    }
  }

  /* reference */
  lp_ref_row *ref = malloc((size_t)N * sizeof *ref);
  int any_bad = 0;
  for (int64_t i = 0; i < N; i++) {
    int bad = 0;
    lp_ref_forward(xd + i * V, V, (double)c->temperature, labels[i], c->ignore_index, &ref[i], &bad);
    any_bad |= bad;
  }

  /* device buffers; outputs poisoned */
  void *xdv = rlk_test_dev_upload(ctx, xh, (size_t)elems * es);
  void *ldv = rlk_test_dev_upload(ctx, lh, (size_t)lelems * lsz);
  float *lp_d = dev_poisoned(ctx, (size_t)N * 4);
  const int want_lse = c->lse || backward;
  float *lse_d = want_lse ? dev_poisoned(ctx, (size_t)N * 4) : NULL;
  float *ent_d = c->entropy ? dev_poisoned(ctx, (size_t)N * 4) : NULL;
  int32_t *st_d = NULL;
  if (c->status) {
    st_d = rlk_test_dev_alloc(ctx, 4);
    ck_assert_int_eq(rlk_memset(ctx, st_d, 0, 4), RLK_OK);
  }

  rlk_logprob_args a;
  rlk_logprob_args_init(&a);
  a.logits = rlk_tensor_2d(xdv, c->dtype, N, V, rs);
  a.labels = rlk_tensor_1d(ldv, c->label_dtype, N);
  a.labels.strides[0] = lst;
  a.temperature = c->temperature;
  a.ignore_index = c->ignore_index;
  a.logp = rlk_tensor_1d(lp_d, RLK_F32, N);
  if (lse_d) a.lse = rlk_tensor_1d(lse_d, RLK_F32, N);
  if (ent_d) a.entropy = rlk_tensor_1d(ent_d, RLK_F32, N);
  if (st_d) a.status = rlk_tensor_1d(st_d, RLK_I32, 1);
  a.variant = c->variant;
  a.block = c->block;
  a.unroll = c->unroll;
  a.stages = c->stages;
  rlk_status st = rlk_logprob(ctx, &a, NULL);
  ck_assert_msg(st == RLK_OK, "%s: rlk_logprob: %s: %s", what, rlk_status_string(st), rlk_last_error());
  ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);

  float *lp = malloc((size_t)N * 4), *lse = calloc((size_t)N, 4), *ent = calloc((size_t)N, 4);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, lp, lp_d, (size_t)N * 4), RLK_OK);
  if (lse_d) ck_assert_int_eq(rlk_memcpy_to_host(ctx, lse, lse_d, (size_t)N * 4), RLK_OK);
  if (ent_d) ck_assert_int_eq(rlk_memcpy_to_host(ctx, ent, ent_d, (size_t)N * 4), RLK_OK);
  int32_t status = 0;
  if (st_d) ck_assert_int_eq(rlk_memcpy_to_host(ctx, &status, st_d, 4), RLK_OK);

  for (int64_t i = 0; i < N; i++) {
    ck_assert_msg(f32_bits(lp[i]) != 0xffffffffu, "%s: logp[%lld] was not written", what, (long long)i);
    if (lse_d)
      ck_assert_msg(f32_bits(lse[i]) != 0xffffffffu, "%s: lse[%lld] was not written", what, (long long)i);
    if (ent_d)
      ck_assert_msg(f32_bits(ent[i]) != 0xffffffffu, "%s: entropy[%lld] was not written", what,
                    (long long)i);
    const lp_ref_row *r = &ref[i];
    lp_check_value(what, "logp", i, lp[i], r->logp, lp_fwd_tol(r->logp, r->max_z, r->lse, V));
    if (lse_d) lp_check_value(what, "lse", i, lse[i], r->lse, lp_fwd_tol(r->lse, r->max_z, r->lse, V));
    if (ent_d)
      lp_check_value(what, "entropy", i, ent[i], r->entropy, lp_fwd_tol(r->entropy, r->max_z, r->lse, V));
    if (labels[i] == c->ignore_index)
      ck_assert_msg(lp[i] == 0.0f, "%s: logp[%lld] of an ignored row is %g", what, (long long)i,
                    (double)lp[i]);
  }
  if (st_d)
    ck_assert_msg(status == (any_bad ? RLK_LOGPROB_STATUS_BAD_LABEL : 0),
                  "%s: status %d, expected %d", what, (int)status, any_bad);

  lp_outputs out;
  memset(&out, 0, sizeof out);
  out.status = status;

  if (backward) {
    /* upstream gradients */
    float *glp = malloc((size_t)N * 4), *gh = malloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) {
      glp[i] = c->g_lp ? (float)(0.5 + rlk_test_rand_normal(rng)) : 0.0f;
      gh[i] = c->g_H ? (float)(0.3 * rlk_test_rand_normal(rng)) : 0.0f;
    }
    if (c->g_lp && N > 2) glp[N / 2] = 0.0f; /* a zero gradient row */
    float *glp_d = c->g_lp ? rlk_test_dev_upload(ctx, glp, (size_t)N * 4) : NULL;
    float *gh_d = c->g_H ? rlk_test_dev_upload(ctx, gh, (size_t)N * 4) : NULL;
    if (c->g_H) ck_assert_msg(ent_d != NULL, "test setup: g_H needs the entropy");
    const rlk_dtype gd = c->in_place ? c->dtype : c->grad_dtype;
    const size_t ges = rlk_dtype_size(gd);
    const int64_t gs = c->in_place ? rs : V + c->grad_pad;
    const int64_t gelems = (N - 1) * gs + V;
    void *g_d = c->in_place ? xdv : dev_poisoned(ctx, (size_t)gelems * ges);
    if (st_d) ck_assert_int_eq(rlk_memset(ctx, st_d, 0, 4), RLK_OK);

    rlk_logprob_backward_args b;
    rlk_logprob_backward_args_init(&b);
    b.logits = a.logits;
    b.labels = a.labels;
    b.temperature = c->temperature;
    b.ignore_index = c->ignore_index;
    b.lse = a.lse;
    if (glp_d) b.grad_logp = rlk_tensor_1d(glp_d, RLK_F32, N);
    if (gh_d) {
      b.grad_entropy = rlk_tensor_1d(gh_d, RLK_F32, N);
      b.entropy = a.entropy;
    }
    b.grad_logits = rlk_tensor_2d(g_d, gd, N, V, gs);
    b.status = a.status;
    b.variant = c->variant;
    b.block = c->block;
    b.unroll = c->unroll;
    st = rlk_logprob_backward(ctx, &b, NULL);
    ck_assert_msg(st == RLK_OK, "%s: rlk_logprob_backward: %s: %s", what, rlk_status_string(st),
                  rlk_last_error());
    ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
    void *gh_host = malloc((size_t)gelems * ges);
    ck_assert_int_eq(rlk_memcpy_to_host(ctx, gh_host, g_d, (size_t)gelems * ges), RLK_OK);
    if (st_d) {
      int32_t s2 = 0;
      ck_assert_int_eq(rlk_memcpy_to_host(ctx, &s2, st_d, 4), RLK_OK);
      ck_assert_msg(s2 == (any_bad ? RLK_LOGPROB_STATUS_BAD_LABEL : 0),
                    "%s: backward status %d, expected %d", what, (int)s2, any_bad);
    }

    double *gref = malloc((size_t)V * sizeof *gref);
    out.grad = malloc((size_t)(N * V) * sizeof *out.grad);
    const double rel = gd == RLK_BF16 ? 0x1p-7 : (gd == RLK_F16 ? 0x1p-10 : 0.0);
    const double floor_abs = gd == RLK_F16 ? 0x1p-24 : 0.0;
    for (int64_t i = 0; i < N; i++) {
      const double T = c->temperature;
      lp_ref_backward(xd + i * V, V, T, labels[i], c->ignore_index, glp[i], gh[i], gref);
      const lp_ref_row *r = &ref[i];
      const double lse_err = lp_fwd_tol(r->lse, r->max_z, r->lse, V);
      for (int64_t j = 0; j < V; j++) {
        const int64_t k = i * gs + j;
        ck_assert_msg(!rlk_test_is_poison(gh_host, gd, k) || (c->in_place && isnan(xd[i * V + j])),
                      "%s: grad[%lld, %lld] was not written", what, (long long)i, (long long)j);
        const double got = rlk_test_load(gh_host, gd, k);
        out.grad[i * V + j] = got;
        const double want = gref[j];
        if (labels[i] == c->ignore_index) {
          ck_assert_msg(got == 0.0, "%s: grad[%lld, %lld] of an ignored row = %g", what,
                        (long long)i, (long long)j, got);
          continue;
        }
        if (isnan(want)) {
          ck_assert_msg(isnan(got), "%s: grad[%lld, %lld] = %g, reference NaN", what, (long long)i,
                        (long long)j, got);
          continue;
        }
        const double z = xd[i * V + j] / T;
        const double p = z == -INFINITY ? 0.0 : exp(z - r->lse);
        const double mag =
            p == 0.0 ? 0.0 : p * (fabs(glp[i]) + fabs(gh[i]) * (fabs(z - r->ez) + 1.0)) / T;
        const double tol = 1e-6 * fabs(want) + (1e-5 + lse_err) * mag + rel * fabs(want) +
                           floor_abs + 1e-30;
        ck_assert_msg(fabs(got - want) <= tol,
                      "%s: grad[%lld, %lld] = %.9g, reference %.12g (tol %.3g, label %lld, p %.3g)",
                      what, (long long)i, (long long)j, got, want, tol, (long long)labels[i], p);
      }
      /* padding between rows is left alone */
      if (!c->in_place && i + 1 < N)
        for (int64_t j = V; j < gs; j++)
          ck_assert_msg(rlk_test_is_poison(gh_host, gd, i * gs + j), "%s: grad padding [%lld, %lld] written",
                        what, (long long)i, (long long)j);
    }
    free(gref);
    free(gh_host);
    free(glp);
    free(gh);
    rlk_free(ctx, glp_d);
    rlk_free(ctx, gh_d);
    if (!c->in_place) rlk_free(ctx, g_d);
  }

  if (keep) {
    out.logp = lp;
    out.lse = lse;
    out.entropy = ent;
    *keep = out;
  } else {
    free(lp);
    free(lse);
    free(ent);
    free(out.grad);
  }
  rlk_free(ctx, xdv);
  rlk_free(ctx, ldv);
  rlk_free(ctx, lp_d);
  rlk_free(ctx, lse_d);
  rlk_free(ctx, ent_d);
  rlk_free(ctx, st_d);
  free(xh);
  free(xd);
  free(row);
  free(labels);
  free(lh);
  free(ref);
}

/* ---------------------------------------------------------------------------------- */
/* Case families, run on any context                                                   */
/* ---------------------------------------------------------------------------------- */

static const rlk_dtype dtypes[] = {RLK_BF16, RLK_F16, RLK_F32};

/* Odd and small vocabularies, N = 1, 3, 4097, every dtype; forward with entropy and backward. */
static void cases_shapes(rlk_context *ctx, uint64_t *rng) {
  static const struct {
    int64_t N, V;
  } shapes[] = {{1, 1}, {3, 7}, {1, 33}, {3, 1000}, {4097, 5}, {4, 1537}, {3, 9001}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int d = 0; d < 3; d++) {
      lp_case c = base_case(shapes[s].N, shapes[s].V, dtypes[d]);
      c.entropy = 1;
      c.data = (s + (size_t)d) % 2 ? LD_SPIKES : LD_NORMAL;
      c.label_dtype = (s + (size_t)d) % 2 ? RLK_I32 : RLK_I64;
      c.backward = shapes[s].N * shapes[s].V < 200000;
      c.g_H = d == 0;
      c.ignored = s % 3 == 1;
      run_case(ctx, &c, rng, NULL);
    }
}

/* A large odd vocabulary (50257), a few rows, every dtype; row strides and label strides. */
static void cases_vocab(rlk_context *ctx, uint64_t *rng, int64_t V, int64_t N) {
  for (int d = 0; d < 3; d++) {
    lp_case c = base_case(N, V, dtypes[d]);
    c.entropy = 1;
    c.data = LD_SPIKES;
    c.row_pad = d == 1 ? 3 : (d == 2 ? 8 : 0);
    c.label_stride = d == 2 ? 3 : 1;
    c.label_dtype = d == 1 ? RLK_I32 : RLK_I64;
    c.ignored = 1;
    c.backward = 1;
    c.g_H = d != 1;
    c.grad_dtype = d == 0 ? RLK_F32 : dtypes[d];
    c.grad_pad = d == 2 ? 5 : 0;
    run_case(ctx, &c, rng, NULL);
  }
}

/* Temperatures, custom ignore indices (one inside [0, V)), -inf logits, special rows. */
static void cases_semantics(rlk_context *ctx, uint64_t *rng) {
  static const float temps[] = {0.7f, 1.0f, 2.3f};
  for (int k = 0; k < 3; k++) {
    lp_case c = base_case(37, 301 + 64 * k, dtypes[k]);
    c.temperature = temps[k];
    c.entropy = 1;
    c.data = k == 0 ? LD_NEG_INF : LD_SPECIAL;
    c.ignored = 1;
    c.ignore_index = k == 1 ? 5 : -100; /* a real token id as the ignore index */
    c.backward = 1;
    c.g_H = 1;
    c.g_lp = k != 2;
    run_case(ctx, &c, rng, NULL);
  }
  /* logits masked with the dtype's lowest finite value before larger ones: the masked terms
   * vanish from the entropy as from lse (no 0 * -inf) */
  for (int d = 0; d < 3; d++) {
    lp_case f = base_case(11, 1000 + 37 * d, dtypes[d]);
    f.data = LD_FLOOR;
    f.temperature = d == 1 ? 1.0f : 0.6f;
    f.entropy = 1;
    f.backward = 1;
    f.g_H = 1;
    run_case(ctx, &f, rng, NULL);
  }
  /* a temperature near its floor with -inf logits: the entropy gradient's linear factor
   * g_H (E - z) / T of a -inf logit overflows, its probability is 0: the gradient is 0 there.
   * Logits of the temperature's scale keep lse small (the backward's p carries lse's rounding);
   * bf16 and f32 hold them, f16 does not. */
  for (int d = 0; d < 3; d += 2) {
    lp_case t = base_case(13, 203, dtypes[d]);
    t.data = LD_NEG_INF;
    t.temperature = d == 2 ? 0x1p-60f : 0x1p-40f;
    t.scale = 3.0 * t.temperature;
    t.entropy = 1;
    t.backward = 1;
    t.g_H = 1;
    t.grad_dtype = RLK_F32;
    run_case(ctx, &t, rng, NULL);
  }
  /* -inf everywhere but a few spikes, with a large row stride */
  lp_case c = base_case(9, 4099, RLK_BF16);
  c.data = LD_NEG_INF;
  c.row_pad = 61;
  c.temperature = 0.7f;
  c.entropy = 1;
  c.backward = 1;
  c.g_H = 1;
  run_case(ctx, &c, rng, NULL);
}

/* Rows whose largest logit over the temperature is huge (a temperature near its 2^-60 floor,
 * logits of 1e9, a padding row of -FLT_MAX): the terms are taken relative to the row maximum, so
 * its own log-prob is exactly 0 and a row of equal logits gives -ln V within logf's ulp (a
 * fused x c - m c once carried the rounding of m c into every term: logp off by up to half its
 * ulp, 2^-inf and 2^+inf past 2^31). f32 logits, one row a call. */
static void cases_scaled_maximum(rlk_context *ctx, uint64_t *rng) {
  enum { VMAX = 5000 };
  static float row[VMAX];
  const float ln5 = (float)log(5.0), tiny = 0x1p-60f;
  struct {
    int64_t V, label;
    float T, fill; /* fill: every logit, else drawn (randn * 3) with row[label] raised to the maximum */
    float want_logp;
    double tol;                /* on logp, absolute */
  } rows[] = {
      {3, 0, tiny, NAN, 0.0f, 0.0},
      {VMAX, 17, 1e-6f, NAN, 0.0f, 0.0},
      {VMAX, 4000, 1e-9f, NAN, 0.0f, 0.0},
      {5, 2, 1.0f, -1e9f, -ln5, 2 * 0x1p-23 * ln5},
      {5, 1, 1.0f, -FLT_MAX, -ln5, 2 * 0x1p-23 * ln5},
      {4, 3, 1.0f, NAN, 0.0f, 0.0}, /* [0, 1, 2, 1e9] */
      {1, 0, 0.7f, 3.5f, 0.0f, 0.0},
  };
  void *dl = rlk_test_poisoned(ctx, sizeof row), *dy = rlk_test_poisoned(ctx, 8), *dp = rlk_test_poisoned(ctx, 4),
       *ds = rlk_test_poisoned(ctx, 4), *de = rlk_test_poisoned(ctx, 4);
  for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
    const int64_t V = rows[k].V, y = rows[k].label;
    for (int64_t j = 0; j < V; j++) row[j] = isnan(rows[k].fill) ? (float)(3.0 * rlk_test_rand_normal(rng)) : rows[k].fill;
    if (V == 4) row[0] = 0, row[1] = 1, row[2] = 2, row[3] = 1e9f;
    else if (isnan(rows[k].fill)) {
      float m = row[0];
      for (int64_t j = 1; j < V; j++) m = fmaxf(m, row[j]);
      row[y] = m + 1.0f; /* the label the row's maximum, alone */
    }
    rlk_test_drop(ctx, dl);
    dl = rlk_test_put(ctx, row, (size_t)V * 4);
    rlk_test_drop(ctx, dy);
    dy = rlk_test_put(ctx, &y, 8);
    rlk_logprob_args a;
    rlk_logprob_args_init(&a);
    a.logits = rlk_tensor_2d(dl, RLK_F32, 1, V, V);
    a.labels = rlk_tensor_1d(dy, RLK_I64, 1);
    a.logp = rlk_tensor_1d(dp, RLK_F32, 1);
    a.lse = rlk_tensor_1d(ds, RLK_F32, 1);
    a.entropy = rlk_tensor_1d(de, RLK_F32, 1);
    a.temperature = rows[k].T;
    ck_assert_msg(rlk_logprob(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
    float lp, lse, ent;
    rlk_test_get(ctx, &lp, dp, 4), rlk_test_get(ctx, &lse, ds, 4), rlk_test_get(ctx, &ent, de, 4);
    /* the maximum's own log-prob 0; lse = max / T + ln s in f32: max / T rounded (u of it), ln s
     * (ln V for equal rows, else 0: the others' terms underflow) within logf's ulp, the sum
     * rounded once more: 2 u |lse| + 2 u ln V */
    const double lnV = isnan(rows[k].fill) ? 0.0 : log((double)V);
    const double want_lse = (double)row[y] / rows[k].T + lnV;
    ck_assert_msg(fabs((double)lp - rows[k].want_logp) <= rows[k].tol, "row %zu (V %lld, T %g): logp %.9g, want %.9g",
                  k, (long long)V, (double)rows[k].T, (double)lp, (double)rows[k].want_logp);
    ck_assert_msg(isfinite(lse) && fabs((double)lse - want_lse) <= 0x1p-23 * (fabs(want_lse) + lnV) + 1e-30,
                  "row %zu: lse %.9g, want %.9g", k, (double)lse, want_lse);
    ck_assert_msg(isfinite(ent) && ent >= -1e-6f && ent <= (float)log((double)V) + 1e-5f, "row %zu: entropy %.9g", k,
                  (double)ent);
  }
  rlk_test_drop(ctx, dl), rlk_test_drop(ctx, dy), rlk_test_drop(ctx, dp), rlk_test_drop(ctx, ds),
      rlk_test_drop(ctx, de);
  printf("logprob %s: scaled maxima up to 2^60 / T exact at the maximum\n",
         rlk_context_backend(ctx) == RLK_BACKEND_HOST ? "host" : "gpu");
}

/* Bad labels: NaN rows and the status bit, forward and backward, both label dtypes. */
static void cases_bad_labels(rlk_context *ctx, uint64_t *rng) {
  for (int k = 0; k < 4; k++) {
    lp_case c = base_case(29, k % 2 ? 77 : 2050, dtypes[k % 3]);
    c.label_dtype = k < 2 ? RLK_I64 : RLK_I32;
    c.bad = 1;
    c.ignored = 1;
    c.entropy = k != 1;
    c.backward = 1;
    c.g_H = c.entropy;
    run_case(ctx, &c, rng, NULL);
  }
  /* without a status word the rows are still NaN */
  lp_case c = base_case(16, 40, RLK_F32);
  c.bad = 1;
  c.status = 0;
  c.backward = 1;
  run_case(ctx, &c, rng, NULL);
}

/* The backward in place over the logits, f32 gradients, only g_H, only g_lp. */
static void cases_backward(rlk_context *ctx, uint64_t *rng) {
  for (int d = 0; d < 3; d++) {
    lp_case c = base_case(6, 3001, dtypes[d]);
    c.entropy = 1;
    c.backward = 1;
    c.in_place = 1;
    c.row_pad = d == 0 ? 0 : 9;
    c.g_H = 1;
    c.g_lp = d != 2;
    c.temperature = 0.7f;
    c.ignored = 1;
    run_case(ctx, &c, rng, NULL);
    c.in_place = 0;
    c.grad_dtype = RLK_F32;
    c.grad_pad = 4;
    c.g_lp = 1;
    c.g_H = d == 1;
    run_case(ctx, &c, rng, NULL);
  }
}

/* Two runs on the same inputs give bitwise the same outputs. */
static void cases_deterministic(rlk_context *ctx, uint64_t *rng, int64_t N, int64_t V) {
  lp_case c = base_case(N, V, RLK_BF16);
  c.entropy = 1;
  c.backward = 1;
  c.g_H = 1;
  c.ignored = 1;
  const uint64_t seed = rlk_test_rand_u64(rng);
  uint64_t s1 = seed, s2 = seed;
  lp_outputs o1, o2;
  run_case(ctx, &c, &s1, &o1);
  run_case(ctx, &c, &s2, &o2);
  ck_assert_msg(memcmp(o1.logp, o2.logp, (size_t)N * 4) == 0, "logp differs between runs");
  ck_assert_msg(memcmp(o1.lse, o2.lse, (size_t)N * 4) == 0, "lse differs between runs");
  ck_assert_msg(memcmp(o1.entropy, o2.entropy, (size_t)N * 4) == 0, "entropy differs between runs");
  ck_assert_msg(memcmp(o1.grad, o2.grad, (size_t)(N * V) * sizeof(double)) == 0,
                "gradients differ between runs");
  free_outputs(&o1);
  free_outputs(&o2);
}

/* ---------------------------------------------------------------------------------- */
/* Host backend                                                                        */
/* ---------------------------------------------------------------------------------- */

#define HOST_CASE(name, call) RLK_HOST_TEST(name, call)

HOST_CASE(shapes, cases_shapes(ctx, &rng))
HOST_CASE(vocab_50257, cases_vocab(ctx, &rng, 50257, 3))
HOST_CASE(semantics, cases_semantics(ctx, &rng))
HOST_CASE(scaled_maximum, cases_scaled_maximum(ctx, &rng))
HOST_CASE(bad_labels, cases_bad_labels(ctx, &rng))
HOST_CASE(backward, cases_backward(ctx, &rng))
HOST_CASE(deterministic, cases_deterministic(ctx, &rng, 5, 999))

START_TEST(args_init_defaults) {
  rlk_logprob_args a;
  memset(&a, 0x5a, sizeof a);
  rlk_logprob_args_init(&a);
  ck_assert_float_eq(a.temperature, 1.0f);
  ck_assert_int_eq(a.ignore_index, -100);
  ck_assert_int_eq(a.variant, RLK_LOGPROB_VARIANT_AUTO);
  ck_assert_int_eq(a.block, 0);
  ck_assert_int_eq(a.unroll, 0);
  ck_assert_int_eq(a.stages, 0);
  ck_assert_ptr_null(a.logits.data);
  ck_assert_ptr_null(a.labels.data);
  ck_assert_ptr_null(a.logp.data);
  ck_assert_ptr_null(a.lse.data);
  ck_assert_ptr_null(a.entropy.data);
  ck_assert_ptr_null(a.status.data);
  rlk_logprob_backward_args b;
  memset(&b, 0x5a, sizeof b);
  rlk_logprob_backward_args_init(&b);
  ck_assert_float_eq(b.temperature, 1.0f);
  ck_assert_int_eq(b.ignore_index, -100);
  ck_assert_int_eq(b.variant, RLK_LOGPROB_VARIANT_AUTO);
  ck_assert_ptr_null(b.grad_logits.data);
  ck_assert_ptr_null(b.grad_logp.data);
  ck_assert_ptr_null(b.grad_entropy.data);
  rlk_logprob_args_init(NULL); /* no crash */
  rlk_logprob_backward_args_init(NULL);
}
END_TEST

/* Every variant and tuning request runs on the host (they fall back to the vector kernel
 * there) and gives the same results. */
START_TEST(host_variants_fall_back) {
  rlk_context *ctx = rlk_test_host_context();
  uint64_t rng = rlk_test_seed() ^ 991;
  static const struct {
    rlk_logprob_variant v;
    int block, unroll, stages;
  } t[] = {{RLK_LOGPROB_VARIANT_VEC, 64, 2, 0},
           {RLK_LOGPROB_VARIANT_BULK, 256, 4, 3},
           {RLK_LOGPROB_VARIANT_TMA, 128, 8, 4}};
  for (size_t k = 0; k < 3; k++) {
    lp_case c = base_case(4, 777, RLK_BF16);
    c.entropy = 1;
    c.variant = t[k].v;
    c.block = t[k].block;
    c.unroll = t[k].unroll;
    c.stages = t[k].stages;
    c.backward = 1;
    c.g_H = 1;
    run_case(ctx, &c, &rng, NULL);
  }
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Argument validation                                                                 */
/* ---------------------------------------------------------------------------------- */

typedef struct bad_fixture {
  float x[6 * 12], grad[6 * 12], logp[6], lse[6], ent[6], glp[6], gh[6];
  uint16_t xb[6 * 12];
  int64_t labels[6];
  int32_t status[2];
  rlk_logprob_args a;
  rlk_logprob_backward_args b;
} bad_fixture;

static void bad_reset(bad_fixture *f) {
  for (int i = 0; i < 72; i++) f->x[i] = (float)(i % 7) * 0.25f;
  for (int i = 0; i < 6; i++) f->labels[i] = i;
  memset(f->logp, 0xff, sizeof f->logp);
  memset(f->grad, 0xff, sizeof f->grad);
  f->status[0] = f->status[1] = 0;
  rlk_logprob_args_init(&f->a);
  f->a.logits = rlk_tensor_2d(f->x, RLK_F32, 6, 10, 12);
  f->a.labels = rlk_tensor_1d(f->labels, RLK_I64, 6);
  f->a.logp = rlk_tensor_1d(f->logp, RLK_F32, 6);
  f->a.lse = rlk_tensor_1d(f->lse, RLK_F32, 6);
  f->a.entropy = rlk_tensor_1d(f->ent, RLK_F32, 6);
  f->a.status = rlk_tensor_1d(f->status, RLK_I32, 1);
  rlk_logprob_backward_args_init(&f->b);
  f->b.logits = f->a.logits;
  f->b.labels = f->a.labels;
  f->b.lse = f->a.lse;
  f->b.entropy = f->a.entropy;
  f->b.grad_logp = rlk_tensor_1d(f->glp, RLK_F32, 6);
  f->b.grad_entropy = rlk_tensor_1d(f->gh, RLK_F32, 6);
  f->b.grad_logits = rlk_tensor_2d(f->grad, RLK_F32, 6, 10, 12);
  f->b.status = f->a.status;
  for (int i = 0; i < 6; i++) f->glp[i] = f->gh[i] = 1.0f;
}

/* The fixture (static: too large for the stack), reset. */
static bad_fixture *bad_fresh(void) {
  static bad_fixture fx;
  bad_reset(&fx);
  return &fx;
}

/* The forward fails with `want`, the message names `arg`, logp is untouched. */
static void expect_bad_fwd(rlk_context *ctx, bad_fixture *f, rlk_status want, const char *arg,
                           const char *label) {
  rlk_test_expect_error(rlk_logprob(ctx, &f->a, NULL), want, arg, label);
  rlk_test_expect_untouched(f->logp, RLK_F32, 6, "logp", label);
  bad_reset(f);
}

static void expect_bad_bwd(rlk_context *ctx, bad_fixture *f, rlk_status want, const char *arg,
                           const char *label) {
  rlk_test_expect_error(rlk_logprob_backward(ctx, &f->b, NULL), want, arg, label);
  rlk_test_expect_untouched(f->grad, RLK_F32, 72, "grad", label);
  bad_reset(f);
}

START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  bad_fixture *f = bad_fresh();
  ck_assert_int_eq(rlk_logprob(ctx, &f->a, NULL), RLK_OK); /* the baselines are valid */
  ck_assert_int_eq(rlk_logprob_backward(ctx, &f->b, NULL), RLK_OK);
  bad_reset(f);

  rlk_test_expect_error(rlk_logprob(NULL, &f->a, NULL), RLK_ERR_INVALID_ARGUMENT, "ctx", "rlk_logprob");
  rlk_test_expect_error(rlk_logprob(ctx, NULL, NULL), RLK_ERR_INVALID_ARGUMENT, "args", "rlk_logprob");
  ck_assert_int_eq(rlk_logprob_backward(NULL, &f->b, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_logprob_backward(ctx, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);

  /* logits */
  const rlk_status E = RLK_ERR_INVALID_ARGUMENT;
  f->a.logits.data = NULL;
  expect_bad_fwd(ctx, f, E, "logits", "absent logits");
  f->a.logits.dtype = RLK_F64;
  expect_bad_fwd(ctx, f, E, "logits", "f64 logits");
  f->a.logits.dtype = RLK_I32;
  expect_bad_fwd(ctx, f, E, "logits", "i32 logits");
  f->a.logits = rlk_tensor_1d(f->x, RLK_F32, 60);
  expect_bad_fwd(ctx, f, E, "logits", "1-D logits");
  f->a.logits.strides[1] = 2;
  expect_bad_fwd(ctx, f, E, "logits", "strided columns");
  f->a.logits.strides[0] = 9;
  expect_bad_fwd(ctx, f, E, "logits", "overlapping rows");
  f->a.logits.shape[1] = 0;
  expect_bad_fwd(ctx, f, E, "logits", "V = 0");
  f->a.logits.shape[0] = -1;
  expect_bad_fwd(ctx, f, E, "logits", "negative N");
  f->a.logits.data = (char *)f->x + 2;
  expect_bad_fwd(ctx, f, E, "logits", "misaligned logits");
  f->a.logits.ndim = 5;
  expect_bad_fwd(ctx, f, E, "logits", "5-D logits");
  /* labels */
  f->a.labels.data = NULL;
  expect_bad_fwd(ctx, f, E, "labels", "absent labels");
  f->a.labels.dtype = RLK_F32;
  expect_bad_fwd(ctx, f, E, "labels", "f32 labels");
  f->a.labels.shape[0] = 5;
  expect_bad_fwd(ctx, f, E, "labels", "labels too short");
  f->a.labels = rlk_tensor_2d(f->labels, RLK_I64, 6, 1, 1);
  expect_bad_fwd(ctx, f, E, "labels", "2-D labels");
  /* temperature, variant, tuning */
  f->a.temperature = 0.0f;
  expect_bad_fwd(ctx, f, E, "temperature", "zero temperature");
  f->a.temperature = -1.0f;
  expect_bad_fwd(ctx, f, E, "temperature", "negative temperature");
  f->a.temperature = NAN;
  expect_bad_fwd(ctx, f, E, "temperature", "NaN temperature");
  f->a.temperature = INFINITY;
  expect_bad_fwd(ctx, f, E, "temperature", "infinite temperature");
  f->a.temperature = 1e-39f; /* log2(e) / T would overflow f32: NaN outputs */
  expect_bad_fwd(ctx, f, E, "temperature", "subnormal temperature");
  f->a.variant = (rlk_logprob_variant)4;
  expect_bad_fwd(ctx, f, E, "variant", "variant 4");
  f->a.variant = (rlk_logprob_variant)-1;
  expect_bad_fwd(ctx, f, E, "variant", "variant -1");
  f->a.unroll = 3;
  expect_bad_fwd(ctx, f, E, "unroll", "unroll 3");
  f->a.stages = 9;
  expect_bad_fwd(ctx, f, E, "stages", "stages 9");
  f->a.block = -32;
  expect_bad_fwd(ctx, f, E, "block", "negative block");
  f->a.block = 2048;
  expect_bad_fwd(ctx, f, E, "block", "block 2048");
  /* outputs */
  f->a.logp.data = NULL;
  expect_bad_fwd(ctx, f, E, "logp", "absent logp");
  f->a.logp.dtype = RLK_F64;
  expect_bad_fwd(ctx, f, E, "logp", "f64 logp");
  f->a.logp.shape[0] = 7;
  expect_bad_fwd(ctx, f, E, "logp", "logp too long");
  f->a.logp.strides[0] = 2;
  expect_bad_fwd(ctx, f, E, "logp", "strided logp");
  f->a.lse.dtype = RLK_BF16;
  expect_bad_fwd(ctx, f, E, "lse", "bf16 lse");
  f->a.entropy.shape[0] = 5;
  expect_bad_fwd(ctx, f, E, "entropy", "entropy too short");
  f->a.entropy.data = f->logp;
  expect_bad_fwd(ctx, f, E, "entropy", "entropy aliasing logp");
  f->a.status.dtype = RLK_I64;
  expect_bad_fwd(ctx, f, E, "status", "i64 status");
  f->a.status = rlk_tensor_2d(f->status, RLK_I32, 1, 1, 1);
  expect_bad_fwd(ctx, f, E, "status", "2-D status");
  f->a.status.shape[0] = 2; /* one word: the kernels OR into element 0 only */
  expect_bad_fwd(ctx, f, E, "status", "status of 2 words");
  f->a.status.shape[0] = 0; /* would be written past its end */
  expect_bad_fwd(ctx, f, E, "status", "empty status");
  ck_assert_int_eq(f->status[1], 0);

  /* backward */
  f->b.lse.data = NULL;
  expect_bad_bwd(ctx, f, E, "lse", "absent lse");
  f->b.lse.shape[0] = 5;
  expect_bad_bwd(ctx, f, E, "lse", "lse too short");
  f->b.grad_logp.data = NULL;
  f->b.grad_entropy.data = NULL;
  expect_bad_bwd(ctx, f, E, "grad_logp", "no upstream gradient");
  f->b.entropy.data = NULL;
  expect_bad_bwd(ctx, f, E, "entropy", "grad_entropy without entropy");
  f->b.grad_entropy.dtype = RLK_F16;
  expect_bad_bwd(ctx, f, E, "grad_entropy", "f16 grad_entropy");
  f->b.grad_logp.shape[0] = 3;
  expect_bad_bwd(ctx, f, E, "grad_logp", "grad_logp too short");
  f->b.grad_logits.data = NULL;
  expect_bad_bwd(ctx, f, E, "grad_logits", "absent grad_logits");
  f->b.grad_logits.dtype = RLK_BF16;
  expect_bad_bwd(ctx, f, E, "grad_logits", "bf16 grad of f32 logits");
  f->b.grad_logits = rlk_tensor_2d(f->grad, RLK_F32, 6, 9, 12);
  expect_bad_bwd(ctx, f, E, "grad_logits", "grad_logits shape");
  f->b.grad_logits = rlk_tensor_2d(f->grad, RLK_F32, 6, 10, 9);
  expect_bad_bwd(ctx, f, E, "grad_logits", "grad_logits overlapping rows");
  f->b.grad_logits = rlk_tensor_2d(f->x, RLK_F32, 6, 10, 11);
  expect_bad_bwd(ctx, f, E, "grad_logits", "in place with another stride");
  f->b.grad_logits = rlk_tensor_2d(f->x + 5, RLK_F32, 6, 10, 12);
  expect_bad_bwd(ctx, f, E, "grad_logits", "partial overlap with the logits");
  f->b.temperature = 0.0f;
  expect_bad_bwd(ctx, f, E, "temperature", "backward zero temperature");
  f->b.unroll = 5;
  expect_bad_bwd(ctx, f, E, "unroll", "backward unroll 5");
  f->b.status.shape[0] = 2;
  expect_bad_bwd(ctx, f, E, "status", "backward status of 2 words");
  f->b.shard = 1, f->b.vocab_start = INT64_MAX; /* the shard form's checks are its forward's */
  expect_bad_bwd(ctx, f, E, "vocab_start", "backward shard vocab_start 2^63 - 1");
  f->b.shard = 1, f->b.threshold = rlk_tensor_1d(f->grad, RLK_F32, 6);
  expect_bad_bwd(ctx, f, E, "threshold", "backward shard with a kept set");
  f->b.logits = rlk_tensor_2d(f->xb, RLK_BF16, 6, 10, 12);
  f->b.grad_logits = rlk_tensor_2d(f->grad, RLK_F16, 6, 10, 12);
  expect_bad_bwd(ctx, f, E, "grad_logits", "f16 grad of bf16 logits");

  /* the same tensor in place is fine, and f32 gradients of bf16 logits */
  f->b.grad_logits = f->b.logits;
  ck_assert_int_eq(rlk_logprob_backward(ctx, &f->b, NULL), RLK_OK);
  bad_reset(f);
  f->b.logits = rlk_tensor_2d(f->xb, RLK_BF16, 6, 10, 12);
  ck_assert_int_eq(rlk_logprob_backward(ctx, &f->b, NULL), RLK_OK);
  rlk_context_destroy(ctx);

  /* a compile-only context checks the arguments, then refuses to launch */
  ctx = rlk_test_compile_only_host_context();
  bad_reset(f);
  f->a.temperature = 0.0f;
  expect_bad_fwd(ctx, f, E, "temperature", "compile-only, bad temperature");
  expect_bad_fwd(ctx, f, RLK_ERR_UNSUPPORTED, "", "compile-only");
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

/* Plans logprob settings ("pass=fwd ...", or a whole line) on ctx. */
static rlk_status plan_line(const rlk_context *ctx, const char *settings, rlk_kernel_spec *specs, size_t *n) {
  char line[512];
  snprintf(line, sizeof line, "%s%s", strncmp(settings, "logprob ", 8) ? "logprob " : "", settings);
  return rlk_test_plan_line(&rlk_op_logprob, ctx, line, specs, n);
}

/* Precompiling a configuration builds exactly what the matching calls look up. */
START_TEST(plan_matches_call) {
  static const struct {
    const char *line;
    int kernels;
    int64_t V;
    rlk_dtype dt, labels, grad;
    int entropy;
  } rows[] = {
      {"logprob logits=bf16 labels=i64 entropy=1 vocab=3001", 2, 3001, RLK_BF16, RLK_I64, RLK_BF16, 1},
      {"logprob logits=f16 labels=i32 grad=f32 vocab=20", 2, 20, RLK_F16, RLK_I32, RLK_F32, 0},
      {"logprob pass=fwd logits=f32 vocab=100", 1, 100, RLK_F32, RLK_I64, RLK_F32, 0},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    rlk_context *ctx = rlk_test_precompiled_host_context(rows[i].line, rows[i].kernels);
    lp_case c = base_case(3, rows[i].V, rows[i].dt);
    c.label_dtype = rows[i].labels;
    c.entropy = rows[i].entropy;
    c.backward = rows[i].kernels == 2;
    c.grad_dtype = rows[i].grad;
    c.g_H = rows[i].entropy;
    uint64_t rng = rlk_test_seed() + i;
    run_case(ctx, &c, &rng, NULL);
    rlk_test_expect_compiled_none(ctx, (uint64_t)rows[i].kernels, rows[i].line);
  }
}
END_TEST

START_TEST(plan_rejects_bad_settings) {
  static const char *const bad[][2] = {
      {"logprob pass=all", "pass"},        {"logprob logits=f64", "logits"},
      {"logprob labels=u8", "labels"},     {"logprob entropy=yes", "entropy"},
      {"logprob grad=bf16", "grad"},       {"logprob vocab=0", "vocab"},
      {"logprob vocab=12x", "vocab"},      {"logprob variant=fast", "variant"},
      {"logprob block=100", "block"},      {"logprob block=2048", "block"},
      {"logprob unroll=3", "unroll"},      {"logprob stages=9", "stages"},
      {"logprob seg=3", "seg"},            {"logprob colour=blue", "colour"},
  };
  rlk_test_expect_bad_lines(bad, sizeof bad / sizeof bad[0]);
  const char *help = rlk_precompile_help("logprob");
  static const char *names[] = {"pass", "logits", "labels", "entropy", "grad", "vocab",
                                "variant", "block", "seg", "unroll", "stages"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    ck_assert_msg(strstr(help, names[i]) != NULL, "help lacks %s", names[i]);
  ck_assert_ptr_nonnull(strstr(rlk_precompile_ops(), "logprob"));
}
END_TEST

/* The variant each target plans: sm_90a gets the bulk and tensor-map kernels when asked (the
 * tensor-map line also builds its fallback); sm_80, gfx90a and the host fall back to the vector
 * kernel; the default is the vector kernel everywhere; every tuning candidate plans everywhere. */
START_TEST(plan_variants_per_target) {
  static const struct {
    rlk_backend backend;
    const char *target;
  } targets[] = {{RLK_BACKEND_CUDA, "sm_90a"}, {RLK_BACKEND_CUDA, "sm_80"},
                 {RLK_BACKEND_HIP, "gfx90a"}, {RLK_BACKEND_HOST, NULL}};
  for (size_t t = 0; t < 4; t++) {
    rlk_context *ctx = rlk_test_compile_only_context(targets[t].backend, targets[t].target, "logprob plan");
    if (!ctx) continue;
    rlk_status st;
    const int sm90 = t == 0;
    rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
    size_t n = 0;
    ck_assert_int_eq(plan_line(ctx, "pass=fwd", specs, &n), RLK_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(specs[0].tmpl->entry, "logprob_fwd");
    ck_assert_int_eq(plan_line(ctx, "pass=fwd variant=bulk", specs, &n), RLK_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(specs[0].tmpl->entry, sm90 ? "logprob_fwd_bulk" : "logprob_fwd");
    ck_assert_int_eq(plan_line(ctx, "pass=fwd variant=tma", specs, &n), RLK_OK);
    ck_assert_uint_eq(n, sm90 ? 2 : 1);
    ck_assert_str_eq(specs[0].tmpl->entry, sm90 ? "logprob_fwd_tma" : "logprob_fwd");
    if (sm90) ck_assert_str_eq(specs[1].tmpl->entry, "logprob_fwd");
    ck_assert_int_eq(plan_line(ctx, "pass=both variant=bulk", specs, &n), RLK_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(specs[1].tmpl->entry, "logprob_bwd");
    /* small vocabularies share blocks between rows: seg < block on a GPU */
    ck_assert_int_eq(plan_line(ctx, "pass=fwd vocab=7", specs, &n), RLK_OK);
    if (targets[t].backend != RLK_BACKEND_HOST)
      ck_assert_int_lt(specs[0].values[3], specs[0].values[2]);
    for (size_t k = 0; rlk_op_logprob.candidates[k]; k++) {
      st = plan_line(ctx, rlk_op_logprob.candidates[k], specs, &n);
      ck_assert_msg(st == RLK_OK, "%s: candidate '%s': %s", targets[t].target ? targets[t].target : "host",
                    rlk_op_logprob.candidates[k], rlk_last_error());
    }
    /* a ring too large for shared memory is refused where the variant runs */
    st = plan_line(ctx, "pass=fwd variant=bulk block=992 unroll=8 stages=8", specs, &n);
    ck_assert_int_eq(st, sm90 ? RLK_ERR_INVALID_ARGUMENT : RLK_OK);
    rlk_context_destroy(ctx);
  }
}
END_TEST

RLK_SAMPLES_CASE("logprob", &rlk_op_logprob)

/* The samples reach every entry, logits dtype, label dtype, gradient dtype and entropy flag
 * (planned for sm_90a, where every entry exists). */
START_TEST(samples_cover_every_variant) {
  rlk_context *ctx = rlk_test_compile_only_cuda_context("sm_90a", "logprob sample coverage");
  if (!ctx) return;
  int entries[4] = {0}, dts[3] = {0}, labels[8] = {0}, grads[2] = {0}, ent[2] = {0}, shared = 0;
  for (size_t i = 0; rlk_op_logprob.samples[i]; i++) {
    rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
    size_t n = 0;
    ck_assert_int_eq(plan_line(ctx, rlk_op_logprob.samples[i], specs, &n), RLK_OK);
    for (size_t k = 0; k < n; k++) {
      const char *e = specs[k].tmpl->entry;
      const int bwd = !strcmp(e, "logprob_bwd");
      entries[!strcmp(e, "logprob_fwd") ? 0 : bwd ? 1 : !strcmp(e, "logprob_fwd_bulk") ? 2 : 3]++;
      dts[specs[k].values[0]]++;
      labels[specs[k].values[bwd ? 2 : 1]]++;
      if (bwd) grads[specs[k].values[1]]++;
      ent[specs[k].values[bwd ? 6 : 5]]++;
      if ((!strcmp(e, "logprob_fwd") || bwd) && specs[k].values[bwd ? 4 : 3] < specs[k].values[bwd ? 3 : 2])
        shared++;
    }
  }
  for (int i = 0; i < 4; i++) ck_assert_int_gt(entries[i], 0);
  for (int i = 0; i < 3; i++) ck_assert_int_gt(dts[i], 0);
  ck_assert_int_gt(labels[RLK_I32], 0);
  ck_assert_int_gt(labels[RLK_I64], 0);
  ck_assert_int_gt(grads[0], 0);
  ck_assert_int_gt(grads[1], 0);
  ck_assert_int_gt(ent[0], 0);
  ck_assert_int_gt(ent[1], 0);
  ck_assert_int_gt(shared, 0);
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* CUDA (RLK_TEST_GPU=1; RLK_TEST_TMA=0 leaves the tensor-map variant out)             */
/* ---------------------------------------------------------------------------------- */

static rlk_context *cuda_context(void) { return rlk_test_cuda_context("logprob"); }

static int tma_enabled(void) {
  const char *e = getenv("RLK_TEST_TMA");
  return !(e && !strcmp(e, "0"));
}

static int sm90(rlk_context *ctx) {
  rlk_device_info info;
  ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
  return info.compute_major >= 9;
}

#define GPU_CASE(name, call) RLK_GPU_TEST("logprob", name, call)

GPU_CASE(shapes, cases_shapes(ctx, &rng))
GPU_CASE(semantics, cases_semantics(ctx, &rng))
GPU_CASE(scaled_maximum, cases_scaled_maximum(ctx, &rng))
GPU_CASE(bad_labels, cases_bad_labels(ctx, &rng))
GPU_CASE(backward, cases_backward(ctx, &rng))
GPU_CASE(deterministic, cases_deterministic(ctx, &rng, 64, 151936))
GPU_CASE(vocab_151936, cases_vocab(ctx, &rng, 151936, 40))
GPU_CASE(vocab_152064, cases_vocab(ctx, &rng, 152064, 24))
GPU_CASE(vocab_128256, cases_vocab(ctx, &rng, 128256, 24))
GPU_CASE(vocab_50257, cases_vocab(ctx, &rng, 50257, 40))

/* Few rows of a large vocabulary (the backward splits rows over blocks), many rows of a small
 * one (rows share blocks). */
START_TEST(gpu_extreme_shapes) {
  if (!rlk_test_gpu_enabled("logprob")) return;
  rlk_context *ctx = cuda_context();
  if (!ctx) return;
  uint64_t rng = rlk_test_seed() ^ 0x5151;
  lp_case c = base_case(1, 151936, RLK_BF16);
  c.entropy = 1;
  c.data = LD_SPIKES;
  c.backward = 1;
  c.g_H = 1;
  run_case(ctx, &c, &rng, NULL);
  c = base_case(3, 262147, RLK_F32);
  c.backward = 1;
  c.grad_pad = 1;
  run_case(ctx, &c, &rng, NULL);
  c = base_case(40000, 7, RLK_BF16);
  c.entropy = 1;
  c.backward = 1;
  c.ignored = 1;
  c.bad = 1;
  run_case(ctx, &c, &rng, NULL);
  c = base_case(4097, 300, RLK_F16);
  c.entropy = 1;
  c.label_stride = 2;
  c.backward = 1;
  c.in_place = 1;
  run_case(ctx, &c, &rng, NULL);
  rlk_context_destroy(ctx);
}
END_TEST

/* Same inputs through every variant this GPU runs (and tuning choices): each against fp64, and
 * the variants against each other. */
START_TEST(gpu_variants_agree) {
  if (!rlk_test_gpu_enabled("logprob")) return;
  rlk_context *ctx = cuda_context();
  if (!ctx) return;
  const int tma = tma_enabled();
  if (!tma) printf("note (logprob gpu): the tensor-map variant is left out (RLK_TEST_TMA=0)\n");
  static const struct {
    rlk_logprob_variant v;
    int block, unroll, stages;
  } t[] = {{RLK_LOGPROB_VARIANT_VEC, 0, 0, 0},    {RLK_LOGPROB_VARIANT_VEC, 256, 2, 0},
           {RLK_LOGPROB_VARIANT_VEC, 1024, 8, 0}, {RLK_LOGPROB_VARIANT_BULK, 0, 0, 0},
           {RLK_LOGPROB_VARIANT_BULK, 512, 2, 3}, {RLK_LOGPROB_VARIANT_BULK, 128, 8, 2},
           {RLK_LOGPROB_VARIANT_TMA, 0, 0, 0},    {RLK_LOGPROB_VARIANT_TMA, 128, 8, 3}};
  static const struct {
    int64_t N, V, pad;
    rlk_dtype dt;
  } shapes[] = {{96, 151936, 0, RLK_BF16}, {33, 50257, 0, RLK_BF16}, {40, 128256, 8, RLK_F16},
                {17, 32000, 0, RLK_F32},   {20, 4099, 3, RLK_BF16}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const uint64_t seed = rlk_test_seed() ^ (0x77 + s);
    lp_outputs first;
    memset(&first, 0, sizeof first);
    int have_first = 0;
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
      if (t[k].v == RLK_LOGPROB_VARIANT_TMA && !tma) continue;
      if (t[k].v != RLK_LOGPROB_VARIANT_VEC && !sm90(ctx)) continue;
      lp_case c = base_case(shapes[s].N, shapes[s].V, shapes[s].dt);
      c.row_pad = shapes[s].pad;
      c.entropy = 1;
      c.data = s % 2 ? LD_SPIKES : LD_NORMAL;
      c.ignored = 1;
      c.bad = s == 1;
      c.variant = t[k].v;
      c.block = t[k].block;
      c.unroll = t[k].unroll;
      c.stages = t[k].stages;
      uint64_t rng = seed;
      lp_outputs o;
      run_case(ctx, &c, &rng, &o);
      if (!have_first) {
        first = o;
        have_first = 1;
        continue;
      }
      for (int64_t i = 0; i < c.N; i++) {
        const double tl = 2e-5 + 4e-6 * fabs((double)first.lse[i]);
        ck_assert_msg((isnan(o.logp[i]) && isnan(first.logp[i])) || fabs(o.logp[i] - first.logp[i]) <= tl,
                      "variant %d block %d: logp[%lld] %.9g vs %.9g", (int)t[k].v, t[k].block,
                      (long long)i, (double)o.logp[i], (double)first.logp[i]);
        ck_assert_msg((isnan(o.entropy[i]) && isnan(first.entropy[i])) ||
                          fabs(o.entropy[i] - first.entropy[i]) <= tl,
                      "variant %d block %d: entropy[%lld] %.9g vs %.9g", (int)t[k].v, t[k].block,
                      (long long)i, (double)o.entropy[i], (double)first.entropy[i]);
      }
      ck_assert_int_eq(o.status, first.status);
      free_outputs(&o);
    }
    if (have_first) free_outputs(&first);
  }
  rlk_context_destroy(ctx);
}
END_TEST

Suite *logprob_suite(void) {
  Suite *s = suite_create("logprob");
  rlk_test_add_case(s, "host", 120, TESTS(args_init_defaults, host_shapes, host_vocab_50257, host_semantics,
                                          host_scaled_maximum,
      host_bad_labels, host_backward, host_deterministic, host_variants_fall_back, bad_arguments));

  rlk_test_add_case(s, "plan", 300, TESTS(plan_matches_call, plan_rejects_bad_settings,
      plan_variants_per_target, samples_cover_every_variant, samples_compile_every_target));

  rlk_test_add_case(s, "gpu", 600, TESTS(gpu_shapes, gpu_semantics, gpu_scaled_maximum, gpu_bad_labels, gpu_backward,
      gpu_deterministic, gpu_vocab_151936, gpu_vocab_152064, gpu_vocab_128256, gpu_vocab_50257,
      gpu_extreme_shapes, gpu_variants_agree));

  /* the variants alone (CK_RUN_CASE=gpu_variants) */
  rlk_test_add_case(s, "gpu_variants", 600, TESTS(gpu_variants_agree));
  return s;
}

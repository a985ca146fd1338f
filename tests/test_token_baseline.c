/* test_token_baseline.c - rlk_token_baseline against the fp64 reference (tests/ref/) on the
 * host backend and, with RLK_TEST_GPU=1, on CUDA: both modes, every dtype, mask and offsets kind,
 * odd shapes, holes and empty rows, unique and tied longest members, strided rows; argument
 * validation; the precompile plan; the samples compiled for every target. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "ref/token_baseline_ref.h"
#include "suites.h"
#include "test_util.h"

/* ---------------------------------------------------------------------------------- */
/* One call, its data and its checks                                                   */
/* ---------------------------------------------------------------------------------- */

typedef struct tb_case {
  int64_t B, T;
  int64_t group_size;      /* > 0 fixed; 0: uneven groups from sizes[] */
  const int64_t *sizes;    /* num_groups sizes (group_size == 0) */
  int64_t num_groups;
  rlk_dtype offsets_dtype; /* RLK_I32 / RLK_I64 */
  rlk_dtype dtype;         /* RLK_F32 / RLK_F64 */
  rlk_dtype mask_dtype;    /* RLK_DTYPE_INVALID: no mask */
  int isw, compact, zero_tail;
  double eps;
  int64_t pad;             /* extra elements at the end of every row of every [B, T] tensor */
  const int64_t *lengths;  /* [B] exact valid-token counts at random places, or NULL: random */
} tb_case;

static void describe(const tb_case *c, char *buf, size_t size) {
  snprintf(buf, size,
           "B=%lld T=%lld G=%lld groups=%lld offsets=%s dtype=%s mask=%s isw=%d compact=%d "
           "zero_tail=%d eps=%g pad=%lld lengths=%s seed=%llu",
           (long long)c->B, (long long)c->T, (long long)c->group_size, (long long)c->num_groups,
           c->group_size ? "-" : rlk_dtype_name(c->offsets_dtype), rlk_dtype_name(c->dtype),
           c->mask_dtype ? rlk_dtype_name(c->mask_dtype) : "none", c->isw, c->compact, c->zero_tail,
           c->eps, (long long)c->pad, c->lengths ? "given" : "random",
           (unsigned long long)rlk_test_seed());
}

static tb_case base_case(int64_t B, int64_t T, int64_t G) {
  return (tb_case){.B = B, .T = T, .group_size = G, .offsets_dtype = RLK_I64, .dtype = RLK_F32,
      .mask_dtype = RLK_BOOL, .zero_tail = 1, .eps = 1e-8};
}


/* A valid token's mask value (never 0). */
static double mask_value(uint64_t *rng, rlk_dtype d) {
  if (d == RLK_I32) return rlk_test_rand_uniform(rng) < 0.9 ? 1.0 : 2.0;
  if (d == RLK_F32) return 0.25 + 1.5 * rlk_test_rand_uniform(rng);
  return 1.0;
}

/* Row b's mask (dense weights, 0 where masked): exactly `len` valid tokens at random places. */
static void mask_row_len(uint64_t *rng, rlk_dtype d, int64_t T, int64_t len, double *row) {
  int64_t need = len;
  for (int64_t t = 0; t < T; t++) {
    const int take = rlk_test_rand_uniform(rng) * (double)(T - t) < (double)need;
    row[t] = take ? mask_value(rng, d) : 0.0;
    need -= take;
  }
}

/* The masks of a group: empty rows, copies of the previous member (tied lengths), and
 * responses of a random length with holes. */
static void mask_rows(uint64_t *rng, const tb_case *c, int64_t start, int64_t end, double *mw) {
  const int64_t T = c->T;
  for (int64_t b = start; b < end; b++) {
    double *row = mw + b * T;
    if (c->mask_dtype == RLK_DTYPE_INVALID) {
      for (int64_t t = 0; t < T; t++) row[t] = 1.0;
      continue;
    }
    if (c->lengths) {
      mask_row_len(rng, c->mask_dtype, T, c->lengths[b], row);
      continue;
    }
    const double u = rlk_test_rand_uniform(rng);
    if (u < 0.1) {
      for (int64_t t = 0; t < T; t++) row[t] = 0.0;
    } else if (b > start && u < 0.35) {
      memcpy(row, row - T, (size_t)T * sizeof *row);
    } else {
      const int64_t L = rlk_test_rand_uniform(rng) < 0.2 ? T : 1 + (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)T);
      for (int64_t t = 0; t < T; t++)
        row[t] = t < L && rlk_test_rand_uniform(rng) >= 0.2 ? mask_value(rng, c->mask_dtype) : 0.0;
    }
  }
}

/* Runs one call on ctx with fresh data and poisoned outputs, checks everything against the
 * reference, and copies the outputs (dense, as doubles) to adv_out / ret_out when given. */
static void run_case(rlk_context *ctx, const tb_case *c, uint64_t *rng, double *adv_out, double *ret_out) {
  char what[512];
  describe(c, what, sizeof what);
  const int64_t B = c->B, T = c->T, S = T + c->pad, n = B * T;
  const int64_t ng = c->group_size > 0 ? B / c->group_size : c->num_groups;
  int64_t *offs = malloc((size_t)(ng + 1) * sizeof *offs);
  offs[0] = 0;
  for (int64_t g = 0; g < ng; g++) offs[g + 1] = offs[g] + (c->group_size ? c->group_size : c->sizes[g]);
  ck_assert_msg(offs[ng] == B, "test setup: groups cover %lld of %lld", (long long)offs[ng], (long long)B);

  /* inputs: w = 1 - 2 pi + sum pi^2 with sum pi^2 in [pi^2, pi^2 + (1 - pi)^2], as a real
   * distribution has it (w > 0) */
  double *mw = malloc((size_t)n * sizeof *mw), *r = malloc((size_t)n * sizeof *r),
         *lp = malloc((size_t)n * sizeof *lp), *sp = malloc((size_t)n * sizeof *sp),
         *iw = malloc((size_t)n * sizeof *iw);
  for (int64_t g = 0; g < ng; g++) mask_rows(rng, c, offs[g], offs[g + 1], mw);
  for (int64_t i = 0; i < n; i++) {
    const double pi = 0.02 + 0.96 * rlk_test_rand_uniform(rng);
    r[i] = 0.3 + rlk_test_rand_normal(rng);
    lp[i] = log(pi);
    sp[i] = pi * pi + rlk_test_rand_uniform(rng) * (1 - pi) * (1 - pi);
    iw[i] = 0.5 + rlk_test_rand_uniform(rng);
  }
  const int has_mask = c->mask_dtype != RLK_DTYPE_INVALID;
  void *rd = rlk_test_upload_rows(ctx, c->dtype, B, T, S, NAN, r);
  void *ld = rlk_test_upload_rows(ctx, c->dtype, B, T, S, NAN, lp);
  void *sd = rlk_test_upload_rows(ctx, c->dtype, B, T, S, NAN, sp);
  void *id = c->isw ? rlk_test_upload_rows(ctx, c->dtype, B, T, S, NAN, iw) : NULL;
  void *md = has_mask ? rlk_test_upload_rows(ctx, c->mask_dtype, B, T, S, 7, mw) : NULL;
  void *od = c->group_size == 0 ? rlk_test_upload_offsets(ctx, c->offsets_dtype, offs, ng + 1) : NULL;
  const size_t es = rlk_dtype_size(c->dtype), out_bytes = (size_t)((B - 1) * S + T) * es;
  void *ad = rlk_test_dev_alloc(ctx, out_bytes), *retd = rlk_test_dev_alloc(ctx, out_bytes);
  ck_assert_int_eq(rlk_memset(ctx, ad, 0xff, out_bytes), RLK_OK);
  ck_assert_int_eq(rlk_memset(ctx, retd, 0xff, out_bytes), RLK_OK);

  rlk_token_baseline_args a;
  rlk_token_baseline_args_init(&a);
  a.rewards = rlk_tensor_2d(rd, c->dtype, B, T, S);
  a.old_logp = rlk_tensor_2d(ld, c->dtype, B, T, S);
  a.sum_pi_squared = rlk_tensor_2d(sd, c->dtype, B, T, S);
  if (id) a.rollout_is_weights = rlk_tensor_2d(id, c->dtype, B, T, S);
  if (md) a.mask = rlk_tensor_2d(md, c->mask_dtype, B, T, S);
  a.group_size = c->group_size;
  if (od) a.group_offsets = rlk_tensor_1d(od, c->offsets_dtype, ng + 1);
  a.epsilon = c->eps;
  a.handle_zero_tail = c->zero_tail;
  a.compact = c->compact;
  a.advantages = rlk_tensor_2d(ad, c->dtype, B, T, S);
  a.returns = rlk_tensor_2d(retd, c->dtype, B, T, S);
  size_t wsb = 0;
  ck_assert_int_eq(rlk_token_baseline_workspace_size(ctx, &a, &wsb), RLK_OK);
  const size_t want_ws = (size_t)n * es + (size_t)B * 4 + (c->compact ? (size_t)n * (es + 4) : 0);
  ck_assert_uint_eq(wsb, want_ws);
  a.workspace = rlk_test_dev_alloc(ctx, wsb);
  a.workspace_bytes = wsb;
  rlk_test_expect_call_done(ctx, rlk_token_baseline(ctx, &a, NULL), what);

  unsigned char *adv = malloc(out_bytes), *ret = malloc(out_bytes);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, adv, ad, out_bytes), RLK_OK);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, ret, retd, out_bytes), RLK_OK);

  tb_ref_problem p = {B, T, r, has_mask ? mw : NULL, lp, sp, c->isw ? iw : NULL, offs, ng, c->eps,
                      c->zero_tail, c->compact};
  double *ra = malloc((size_t)n * sizeof *ra), *rr = malloc((size_t)n * sizeof *rr),
         *rm = malloc((size_t)n * sizeof *rm);
  tb_ref_result res = {ra, rr, rm};
  ck_assert_int_eq(tb_ref_compute(&p, &res), 0);

  /* a few roundings per element of the scans and the group sums, relative to the absolute size
   * of everything summed */
  const double u = c->dtype == RLK_F64 ? DBL_EPSILON : FLT_EPSILON;
  const int64_t ng_max = B;
  const double k = 4.0 * (40.0 + (double)T / 8.0 + (double)ng_max);
  for (int64_t b = 0; b < B; b++) {
    double gabs = 0;
    for (int64_t t = T - 1; t >= 0; t--) {
      const int64_t i = b * T + t;
      gabs += fabs(r[i] * mw[i]);
      const double got_r = rlk_test_load(ret, c->dtype, b * S + t), got_a = rlk_test_load(adv, c->dtype, b * S + t);
      const double tol_r = k * u * gabs + 1e-300;
      ck_assert_msg(fabs(got_r - rr[i]) <= tol_r, "%s: returns[%lld, %lld] = %.17g, reference %.17g (tolerance %.3g)",
                    what, (long long)b, (long long)t, got_r, rr[i], tol_r);
      if (mw[i] == 0.0) {
        ck_assert_msg(got_a == 0.0, "%s: advantages[%lld, %lld] = %.17g where masked, expected 0", what,
                      (long long)b, (long long)t, got_a);
        continue;
      }
      const double tol_a = k * u * rm[i] + 1e-300;
      ck_assert_msg(fabs(got_a - ra[i]) <= tol_a,
                    "%s: advantages[%lld, %lld] = %.17g, reference %.17g (return %.17g, tolerance %.3g)", what,
                    (long long)b, (long long)t, got_a, ra[i], rr[i], tol_a);
    }
    /* padding between rows untouched */
    if (b + 1 < B)
      for (int64_t t = T; t < S; t++) {
        const unsigned char *pa = adv + (size_t)(b * S + t) * es, *pr = ret + (size_t)(b * S + t) * es;
        for (size_t q = 0; q < es; q++)
          ck_assert_msg(pa[q] == 0xff && pr[q] == 0xff, "%s: padding [%lld, %lld] was written", what,
                        (long long)b, (long long)t);
      }
  }
  if (adv_out)
    for (int64_t i = 0; i < n; i++) adv_out[i] = rlk_test_load(adv, c->dtype, (i / T) * S + i % T);
  if (ret_out)
    for (int64_t i = 0; i < n; i++) ret_out[i] = rlk_test_load(ret, c->dtype, (i / T) * S + i % T);

  rlk_free(ctx, rd);
  rlk_free(ctx, ld);
  rlk_free(ctx, sd);
  rlk_free(ctx, id);
  rlk_free(ctx, md);
  rlk_free(ctx, od);
  rlk_free(ctx, ad);
  rlk_free(ctx, retd);
  rlk_free(ctx, a.workspace);
  free(offs);
  free(mw);
  free(r);
  free(lp);
  free(sp);
  free(iw);
  free(adv);
  free(ret);
  free(ra);
  free(rr);
  free(rm);
}

/* ---------------------------------------------------------------------------------- */
/* Suites of cases, run on any context                                                 */
/* ---------------------------------------------------------------------------------- */

static const rlk_dtype mask_kinds[] = {RLK_DTYPE_INVALID, RLK_BOOL, RLK_I32, RLK_F32};

/* Every dtype x mode x mask x offsets kind; rollout weights and the tail rule alternate. */
static void cases_variants(rlk_context *ctx, uint64_t *rng) {
  int64_t sizes[64];
  for (int dt = 0; dt < 2; dt++)
    for (int compact = 0; compact < 2; compact++)
      for (int mk = 0; mk < 4; mk++)
        for (int ok = 0; ok < 3; ok++) {
          const int64_t T = 1 + (int64_t)(rlk_test_rand_u64(rng) % 90);
          tb_case c;
          if (ok == 0) {
            static const int64_t Gs[] = {1, 2, 3, 5, 8};
            const int64_t G = Gs[rlk_test_rand_u64(rng) % 5];
            c = base_case(G * (1 + (int64_t)(rlk_test_rand_u64(rng) % 5)), T, G);
          } else {
            const int64_t B = 1 + (int64_t)(rlk_test_rand_u64(rng) % 40);
            c = base_case(B, T, 0);
            c.sizes = sizes;
            c.num_groups = rlk_test_random_group_sizes(rng, B, 6, sizes);
            c.offsets_dtype = ok == 1 ? RLK_I32 : RLK_I64;
          }
          c.dtype = dt ? RLK_F64 : RLK_F32;
          c.compact = compact;
          c.mask_dtype = mask_kinds[mk];
          c.isw = (mk + ok + dt) % 2;
          c.zero_tail = (mk + ok + compact) % 2 == 0;
          run_case(ctx, &c, rng, NULL, NULL);
        }
}

/* Row lengths around the 32-element chunks, one row, one-member groups, long rows. */
static void cases_shapes(rlk_context *ctx, uint64_t *rng) {
  static const int64_t Ts[] = {1, 2, 31, 32, 33, 63, 64, 65, 200, 1000};
  static const int64_t Bs[] = {1, 2, 7};
  for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
    for (size_t bi = 0; bi < sizeof Bs / sizeof Bs[0]; bi++)
      for (int compact = 0; compact < 2; compact++) {
        const int64_t B = Bs[bi];
        tb_case c = base_case(B, Ts[ti], bi == 2 ? 7 : 1);
        c.compact = compact;
        c.dtype = (ti + bi) % 2 ? RLK_F64 : RLK_F32;
        c.isw = (int)(ti % 2);
        run_case(ctx, &c, rng, NULL, NULL);
      }
}

/* Every [B, T] tensor with a row stride beyond T, the padding checked untouched. */
static void cases_strided(rlk_context *ctx, uint64_t *rng) {
  int64_t sizes[64];
  for (int compact = 0; compact < 2; compact++)
    for (int dt = 0; dt < 2; dt++) {
      tb_case c = base_case(24, 37, 0);
      c.sizes = sizes;
      c.num_groups = rlk_test_random_group_sizes(rng, 24, 5, sizes);
      c.compact = compact;
      c.dtype = dt ? RLK_F64 : RLK_F32;
      c.isw = 1;
      c.pad = 3 + (int64_t)(rlk_test_rand_u64(rng) % 9);
      c.mask_dtype = dt ? RLK_I32 : RLK_F32;
      run_case(ctx, &c, rng, NULL, NULL);
    }
}

/* The tail rule on chosen lengths: a unique longest member, tied longest members, empty rows
 * (in compact mode not members), a group whose only non-empty member stands alone. */
static void cases_tails(rlk_context *ctx, uint64_t *rng) {
  static const int64_t lengths[] = {9, 4, 4, /**/ 7, 7, 3, /**/ 0, 5, /**/ 0, 0, 6, 2, /**/ 0, 0, /**/ 8, /**/ 3, 3, 3, 10};
  static const int64_t sizes[] = {3, 3, 2, 4, 2, 1, 4};
  for (int compact = 0; compact < 2; compact++)
    for (int tail = 0; tail < 2; tail++)
      for (int mk = 1; mk < 4; mk++) {
        tb_case c = base_case(19, 12, 0);
        c.sizes = sizes;
        c.num_groups = 7;
        c.lengths = lengths;
        c.compact = compact;
        c.zero_tail = tail;
        c.mask_dtype = mask_kinds[mk];
        c.dtype = mk == 2 ? RLK_F64 : RLK_F32;
        c.isw = mk == 3;
        run_case(ctx, &c, rng, NULL, NULL);
      }
}

/* The same call twice: bitwise the same outputs. */
static void cases_deterministic(rlk_context *ctx, uint64_t *rng) {
  for (int compact = 0; compact < 2; compact++) {
    tb_case c = base_case(48, 150, 8);
    c.compact = compact;
    c.isw = 1;
    const size_t n = (size_t)(c.B * c.T);
    double *a1 = malloc(n * sizeof *a1), *a2 = malloc(n * sizeof *a2), *r1 = malloc(n * sizeof *r1),
           *r2 = malloc(n * sizeof *r2);
    uint64_t s1 = *rng, s2 = *rng;
    run_case(ctx, &c, &s1, a1, r1);
    run_case(ctx, &c, &s2, a2, r2);
    ck_assert_msg(memcmp(a1, a2, n * sizeof *a1) == 0 && memcmp(r1, r2, n * sizeof *r1) == 0,
                  "compact=%d: two calls differ", compact);
    *rng = s1;
    free(a1);
    free(a2);
    free(r1);
    free(r2);
  }
}

RLK_HOST_CASE(variants)
RLK_HOST_CASE(shapes)
RLK_HOST_CASE(strided)
RLK_HOST_CASE(tails)
RLK_HOST_CASE(deterministic)

START_TEST(args_init_defaults) {
  rlk_token_baseline_args a;
  memset(&a, 0x5a, sizeof a);
  rlk_token_baseline_args_init(&a);
  ck_assert(a.epsilon == 1e-8);
  ck_assert_int_eq(a.handle_zero_tail, 1);
  ck_assert_int_eq(a.compact, 0);
  ck_assert_int_eq(a.group_size, 0);
  ck_assert_ptr_null(a.rewards.data);
  ck_assert_ptr_null(a.mask.data);
  ck_assert_ptr_null(a.rollout_is_weights.data);
  ck_assert_ptr_null(a.workspace);
  rlk_token_baseline_args_init(NULL);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Argument errors                                                                     */
/* ---------------------------------------------------------------------------------- */

static void expect_bad(rlk_context *ctx, const rlk_token_baseline_args *a, const char *needle) {
  rlk_test_expect_error(rlk_token_baseline(ctx, a, NULL), RLK_ERR_INVALID_ARGUMENT, needle, needle);
}

START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  enum { B = 4, T = 5 };
  static float r[B * T], l[B * T], s[B * T], adv[B * T], ret[B * T], w[B * T];
  static double d[B * T];
  static uint8_t m[B * T];
  static int64_t offs[] = {0, 1, 4};
  static int64_t bad_offs[] = {0, 3, 3};
  static _Alignas(8) unsigned char ws[4096];
  for (int i = 0; i < B * T; i++) r[i] = l[i] = s[i] = w[i] = 0.5f, m[i] = 1, d[i] = 0.5;
  rlk_token_baseline_args good;
  rlk_token_baseline_args_init(&good);
  good.rewards = rlk_tensor_2d(r, RLK_F32, B, T, T);
  good.old_logp = rlk_tensor_2d(l, RLK_F32, B, T, T);
  good.sum_pi_squared = rlk_tensor_2d(s, RLK_F32, B, T, T);
  good.mask = rlk_tensor_2d(m, RLK_BOOL, B, T, T);
  good.group_size = 2;
  good.advantages = rlk_tensor_2d(adv, RLK_F32, B, T, T);
  good.returns = rlk_tensor_2d(ret, RLK_F32, B, T, T);
  good.workspace = ws;
  good.workspace_bytes = sizeof ws;
  ck_assert_int_eq(rlk_token_baseline(ctx, &good, NULL), RLK_OK);

  ck_assert_int_eq(rlk_token_baseline(NULL, &good, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_token_baseline(ctx, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);
  size_t bytes = 1;
  ck_assert_int_eq(rlk_token_baseline_workspace_size(ctx, &good, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_token_baseline_workspace_size(NULL, &good, &bytes), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_uint_eq(bytes, 0);

  rlk_token_baseline_args a;
  a = good, a.rewards.data = NULL;
  expect_bad(ctx, &a, "rewards");
  a = good, a.rewards.dtype = RLK_BF16;
  expect_bad(ctx, &a, "rewards");
  a = good, a.rewards = rlk_tensor_1d(r, RLK_F32, B);
  expect_bad(ctx, &a, "rewards");
  a = good, a.old_logp = rlk_tensor_2d(d, RLK_F64, B, T, T);
  expect_bad(ctx, &a, "old_logp");
  a = good, a.sum_pi_squared.shape[1] = T - 1;
  expect_bad(ctx, &a, "sum_pi_squared");
  a = good, a.sum_pi_squared.data = NULL;
  expect_bad(ctx, &a, "sum_pi_squared");
  a = good, a.rollout_is_weights = rlk_tensor_2d(w, RLK_F32, B, T - 1, T);
  expect_bad(ctx, &a, "rollout_is_weights");
  a = good, a.mask.dtype = RLK_F64;
  expect_bad(ctx, &a, "mask");
  a = good, a.mask.strides[0] = T - 1;
  expect_bad(ctx, &a, "mask");
  a = good, a.old_logp.strides[1] = 2;
  expect_bad(ctx, &a, "old_logp");
  a = good, a.epsilon = -1.0;
  expect_bad(ctx, &a, "epsilon");
  a = good, a.epsilon = NAN;
  expect_bad(ctx, &a, "epsilon");
  a = good, a.compact = 2;
  expect_bad(ctx, &a, "compact");
  a = good, a.group_size = 3;
  expect_bad(ctx, &a, "group_size");
  a = good, a.group_size = -1;
  expect_bad(ctx, &a, "group_size");
  a = good, a.group_size = 0;
  expect_bad(ctx, &a, "group_offsets");
  a = good, a.group_offsets = rlk_tensor_1d(offs, RLK_I64, 3);
  expect_bad(ctx, &a, "group_offsets");
  a = good, a.group_size = 0, a.group_offsets = rlk_tensor_1d(offs, RLK_F32, 3);
  expect_bad(ctx, &a, "group_offsets");
  a = good, a.group_size = 0, a.group_offsets = rlk_tensor_1d(bad_offs, RLK_I64, 3);
  expect_bad(ctx, &a, "group_offsets");
  a = good, a.group_size = 0, a.group_offsets = rlk_tensor_1d(offs, RLK_I64, 1);
  expect_bad(ctx, &a, "group_offsets");
  a = good, a.group_size = 0, a.group_offsets = rlk_tensor_1d(offs, RLK_I64, 2);
  expect_bad(ctx, &a, "group_offsets"); /* last offset 1, not B */
  a = good, a.advantages.data = NULL;
  expect_bad(ctx, &a, "advantages");
  a = good, a.advantages.dtype = RLK_F64;
  expect_bad(ctx, &a, "advantages");
  a = good, a.returns.shape[0] = B - 1;
  expect_bad(ctx, &a, "returns");
  a = good, a.returns.data = adv;
  expect_bad(ctx, &a, "overlap");
  a = good, a.workspace = NULL;
  expect_bad(ctx, &a, "workspace");
  a = good, a.workspace_bytes = 8;
  expect_bad(ctx, &a, "workspace");
  a = good, a.workspace = ws + 4;
  expect_bad(ctx, &a, "aligned");

  /* uneven groups and f64 pass */
  a = good, a.group_size = 0, a.group_offsets = rlk_tensor_1d(offs, RLK_I64, 3);
  ck_assert_int_eq(rlk_token_baseline(ctx, &a, NULL), RLK_OK);
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

/* Precompiling a configuration builds exactly what the matching call looks up. */
START_TEST(plan_matches_call) {
  static const int64_t sizes[] = {5, 1, 10, 8};
  static const struct {
    const char *line;
    tb_case c;
  } rows[] = {
      {"token_baseline dtype=f32 mask=bool offsets=fixed",
       {.B = 24, .T = 9, .group_size = 6, .dtype = RLK_F32, .mask_dtype = RLK_BOOL, .zero_tail = 1, .eps = 1e-8}},
      {"token_baseline dtype=f64 mask=i32 offsets=i32 compact=1 isw=1",
       {.B = 24, .T = 40, .group_size = 0, .sizes = sizes, .num_groups = 4, .offsets_dtype = RLK_I32,
        .dtype = RLK_F64, .mask_dtype = RLK_I32, .isw = 1, .compact = 1, .eps = 1e-8}},
      {"token_baseline mask=none offsets=i64 compact=1",
       {.B = 24, .T = 3, .group_size = 0, .sizes = sizes, .num_groups = 4, .offsets_dtype = RLK_I64,
        .dtype = RLK_F32, .compact = 1, .eps = 1e-6}},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    rlk_context *ctx = rlk_test_precompiled_host_context(rows[i].line, 2);
    uint64_t rng = rlk_test_seed() + i;
    run_case(ctx, &rows[i].c, &rng, NULL, NULL);
    rlk_test_expect_compiled_none(ctx, 2, rows[i].line);
  }
}
END_TEST

START_TEST(plan_rejects_bad_settings) {
  static const char *const bad[][2] = {
      {"token_baseline dtype=bf16", "dtype"},     {"token_baseline mask=f64", "mask"},
      {"token_baseline offsets=i16", "offsets"},  {"token_baseline compact=2", "compact"},
      {"token_baseline isw=yes", "isw"},          {"token_baseline colour=blue", "colour"},
  };
  rlk_test_expect_bad_lines(bad, sizeof bad / sizeof bad[0]);
}
END_TEST

/* The samples reach both entries with every dtype, mask, offsets kind, mode and isw. */
START_TEST(samples_cover_every_variant) {
  rlk_context *ctx = rlk_test_host_context();
  int dtypes[8] = {0}, masks[4] = {0}, offsets[3] = {0}, compact[2][2] = {{0}}, isw[2][2] = {{0}};
  for (size_t i = 0; rlk_op_token_baseline.samples[i]; i++) {
    rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
    size_t ns = 0;
    ck_assert_int_eq(rlk_test_plan_line(&rlk_op_token_baseline, ctx, rlk_op_token_baseline.samples[i], specs, &ns),
                     RLK_OK);
    ck_assert_uint_eq(ns, 2);
    dtypes[specs[0].values[0]]++;
    masks[specs[0].values[1]]++;
    compact[specs[0].values[0] == RLK_F64][specs[0].values[2]]++;
    isw[specs[0].values[2]][specs[0].values[3]]++;
    offsets[specs[1].values[3]]++;
  }
  ck_assert_int_gt(dtypes[RLK_F32], 0);
  ck_assert_int_gt(dtypes[RLK_F64], 0);
  for (int i = 0; i < 4; i++) ck_assert_int_gt(masks[i], 0);
  for (int i = 0; i < 3; i++) ck_assert_int_gt(offsets[i], 0);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      ck_assert_int_gt(compact[i][j], 0);
      ck_assert_int_gt(isw[i][j], 0);
    }
  rlk_context_destroy(ctx);
}
END_TEST

RLK_SAMPLES_CASE("token_baseline", &rlk_op_token_baseline)

/* ---------------------------------------------------------------------------------- */
/* CUDA (RLK_TEST_GPU=1)                                                               */
/* ---------------------------------------------------------------------------------- */

RLK_GPU_CASE("token_baseline", variants)
RLK_GPU_CASE("token_baseline", shapes)
RLK_GPU_CASE("token_baseline", strided)
RLK_GPU_CASE("token_baseline", tails)
RLK_GPU_CASE("token_baseline", deterministic)

/* A training-sized batch: many groups, long responses, both modes. */
static void cases_large(rlk_context *ctx, uint64_t *rng) {
  for (int compact = 0; compact < 2; compact++) {
    tb_case c = base_case(256, 2049, 16);
    c.compact = compact;
    c.isw = compact;
    run_case(ctx, &c, rng, NULL, NULL);
  }
}

RLK_GPU_CASE("token_baseline", large)

Suite *token_baseline_suite(void) {
  Suite *s = suite_create("token_baseline");
  rlk_test_add_case(s, "host", 300, TESTS(args_init_defaults, host_variants, host_shapes, host_strided,
      host_tails, host_deterministic, bad_arguments));

  rlk_test_add_case(s, "plan", 300, TESTS(plan_matches_call, plan_rejects_bad_settings,
      samples_cover_every_variant, samples_compile_every_target));

  rlk_test_add_case(s, "gpu", 300, TESTS(gpu_variants, gpu_shapes, gpu_strided, gpu_tails, gpu_deterministic,
      gpu_large));
  return s;
}

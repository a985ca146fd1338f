/* test_group_advantage.c - rlk_group_advantage against the fp64 reference (tests/ref/) on the
 * host backend and, with RLK_TEST_GPU=1, on CUDA; argument validation; the precompile plan;
 * and the op's sample configurations compiled for every target whose compiler is present. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops/ops.h"
#include "ref/group_advantage_ref.h"
#include "suites.h"
#include "test_util.h"

/* ---------------------------------------------------------------------------------- */
/* One call, its data and its checks                                                   */
/* ---------------------------------------------------------------------------------- */

typedef struct ga_case {
  int64_t B, T;             /* T: columns of rewards / mask / token outputs (0: none) */
  int64_t group_size;       /* > 0 fixed; 0: uneven groups from sizes[] */
  const int64_t *sizes;     /* group sizes, num_groups of them (group_size == 0) */
  int64_t num_groups;
  rlk_dtype offsets_dtype;  /* RLK_I32 / RLK_I64 */
  rlk_advantage_mode mode;
  int unbiased;
  rlk_singleton_policy singleton;
  float eps;
  rlk_dtype scores_dtype;   /* RLK_F32 / RLK_F64 */
  int scores_2d;
  int64_t score_stride;     /* elements between scores (1-D) or rows (2-D); 0: dense */
  rlk_dtype mask_dtype;     /* RLK_DTYPE_INVALID: no mask */
  int64_t mask_stride;      /* 0: dense */
  int broadcast;
  int64_t tok_stride;       /* 0: dense */
  int discrete;             /* scores from {0, 1}, like pass/fail rewards: many ties */
  double nan_frac;          /* > 0: this share of the scores is NaN, unscorable members */
} ga_case;

static const char *mode_name(int m) {
  static const char *n[] = {"grpo", "mean-only", "rloo", "batch-std", "opo", "passk", "passk-unscaled"};
  return m >= 0 && m < 7 ? n[m] : "?";
}

static void describe(const ga_case *c, char *buf, size_t size) {
  snprintf(buf, size,
           "B=%lld T=%lld G=%lld groups=%lld offsets=%s mode=%s unbiased=%d singleton=%d eps=%g "
           "scores=%s%s stride=%lld mask=%s broadcast=%d discrete=%d nan=%g seed=%llu",
           (long long)c->B, (long long)c->T, (long long)c->group_size, (long long)c->num_groups,
           c->group_size ? "-" : rlk_dtype_name(c->offsets_dtype), mode_name(c->mode),
           c->unbiased, (int)c->singleton, (double)c->eps, rlk_dtype_name(c->scores_dtype),
           c->scores_2d ? "[B,T]" : "[B]", (long long)c->score_stride,
           c->mask_dtype ? rlk_dtype_name(c->mask_dtype) : "none", c->broadcast, c->discrete,
           c->nan_frac, (unsigned long long)rlk_test_seed());
}

static ga_case base_case(int64_t B, int64_t G) {
  return (ga_case){.B = B, .group_size = G, .offsets_dtype = RLK_I64, .mode = RLK_ADV_GRPO, .unbiased = 1,
      .singleton = RLK_SINGLETON_MEAN0_STD1, .eps = 1e-6f, .scores_dtype = RLK_F32};
}


/* A fresh score: continuous (normal, shifted and scaled per call) or pass/fail. */
static double draw_score(uint64_t *rng, const ga_case *c) {
  if (c->discrete) return rlk_test_rand_uniform(rng) < 0.5 ? 0.0 : 1.0;
  return 0.5 + 2.0 * rlk_test_rand_normal(rng);
}

static double draw_mask(uint64_t *rng, rlk_dtype d) {
  const double u = rlk_test_rand_uniform(rng);
  if (u < 0.3) return 0.0;
  if (d == RLK_BOOL) return 1.0;
  if (d == RLK_I32) return u < 0.9 ? 1.0 : 2.0;
  return 0.25 + 1.5 * rlk_test_rand_uniform(rng);
}

static uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Runs one call on ctx with fresh data, poisoned outputs, and checks everything against the
 * reference. The outputs are copied to adv_out / tok_out (dense) when those are given. */
static void run_case(rlk_context *ctx, const ga_case *c, uint64_t *rng, float *adv_out,
                     float *tok_out) {
  char what[512];
  describe(c, what, sizeof what);
  const int64_t B = c->B, T = c->T;
  const int64_t ng = c->group_size > 0 ? B / c->group_size : c->num_groups;

  /* groups */
  int64_t *offs = malloc((size_t)(ng + 1) * sizeof *offs);
  offs[0] = 0;
  for (int64_t g = 0; g < ng; g++) offs[g + 1] = offs[g] + (c->group_size ? c->group_size : c->sizes[g]);
  ck_assert_msg(offs[ng] == B, "test setup: groups cover %lld of %lld", (long long)offs[ng], (long long)B);

  /* scores or rewards, with padding between rows that holds NaN (never read) */
  const int64_t cols = c->scores_2d ? T : 1;
  const int64_t sstride = c->score_stride ? c->score_stride : cols;
  const size_t sbytes = rlk_dtype_size(c->scores_dtype);
  const int64_t s_elems = (B - 1) * sstride + cols;
  void *sh = malloc((size_t)s_elems * sbytes);
  for (int64_t i = 0; i < s_elems; i++) rlk_test_store(sh, c->scores_dtype, i, NAN);
  double *dense = malloc((size_t)(B * cols) * sizeof *dense);

  /* mask */
  const int has_mask = c->mask_dtype != RLK_DTYPE_INVALID;
  const int64_t mstride = c->mask_stride ? c->mask_stride : T;
  void *mh = NULL;
  double *mw = NULL;
  if (has_mask) {
    const int64_t m_elems = (B - 1) * mstride + T;
    mh = malloc((size_t)m_elems * rlk_dtype_size(c->mask_dtype));
    for (int64_t i = 0; i < m_elems; i++) rlk_test_store(mh, c->mask_dtype, i, 7);
    mw = malloc((size_t)(B * T) * sizeof *mw);
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t < T; t++) {
        const double w = draw_mask(rng, c->mask_dtype);
        rlk_test_store(mh, c->mask_dtype, b * mstride + t, w);
        mw[b * T + t] = rlk_test_load(mh, c->mask_dtype, b * mstride + t);
      }
  }
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < cols; t++) {
      /* a masked-out reward may be anything, NaN included: it must not count */
      const int masked_out = c->scores_2d && has_mask && mw[b * T + t] == 0.0;
      double v = masked_out && t % 2 ? NAN : draw_score(rng, c);
      if (!masked_out && c->nan_frac > 0 && rlk_test_rand_uniform(rng) < c->nan_frac / (double)cols)
        v = NAN; /* an unscorable member (one NaN reward makes its row sum NaN) */
      rlk_test_store(sh, c->scores_dtype, b * sstride + t, v);
      dense[b * cols + t] = rlk_test_load(sh, c->scores_dtype, b * sstride + t);
    }

  /* opo's weights: token counts, now and then fractional */
  void *wh = NULL, *wd = NULL;
  double *wv = NULL;
  if (c->mode == RLK_ADV_OPO) {
    wh = malloc((size_t)B * sbytes);
    wv = malloc((size_t)B * sizeof *wv);
    for (int64_t b = 0; b < B; b++) {
      double w = (double)(1 + rlk_test_rand_u64(rng) % 300);
      if (b % 7 == 3) w *= rlk_test_rand_uniform(rng);
      rlk_test_store(wh, c->scores_dtype, b, w);
      wv[b] = rlk_test_load(wh, c->scores_dtype, b);
    }
    wd = rlk_test_dev_upload(ctx, wh, (size_t)B * sbytes);
  }

  /* device copies; outputs poisoned with 0xff bytes (NaN) */
  void *sd = rlk_test_dev_upload(ctx, sh, (size_t)s_elems * sbytes);
  void *md = has_mask ? rlk_test_dev_upload(ctx, mh, (size_t)((B - 1) * mstride + T) * rlk_dtype_size(c->mask_dtype)) : NULL;
  void *od = c->group_size == 0 ? rlk_test_upload_offsets(ctx, c->offsets_dtype, offs, ng + 1) : NULL;
  float *ad = rlk_test_dev_alloc(ctx, (size_t)B * sizeof(float));
  ck_assert_int_eq(rlk_memset(ctx, ad, 0xff, (size_t)B * sizeof(float)), RLK_OK);
  const int64_t tstride = c->tok_stride ? c->tok_stride : T;
  const int64_t t_elems = c->broadcast ? (B - 1) * tstride + T : 0;
  float *td = NULL;
  if (c->broadcast) {
    td = rlk_test_dev_alloc(ctx, (size_t)t_elems * sizeof(float));
    ck_assert_int_eq(rlk_memset(ctx, td, 0xff, (size_t)t_elems * sizeof(float)), RLK_OK);
  }

  rlk_group_advantage_args a;
  rlk_group_advantage_args_init(&a);
  a.scores = c->scores_2d ? rlk_tensor_2d(sd, c->scores_dtype, B, T, sstride)
                          : rlk_tensor_1d(sd, c->scores_dtype, B);
  if (!c->scores_2d) a.scores.strides[0] = sstride;
  a.group_size = c->group_size;
  if (c->group_size == 0) a.group_offsets = rlk_tensor_1d(od, c->offsets_dtype, ng + 1);
  a.mode = c->mode;
  a.eps = c->eps;
  a.unbiased = c->unbiased;
  a.singleton = c->singleton;
  a.nan_scores = c->nan_frac > 0 ? RLK_NAN_SCORES_UNSCORABLE : RLK_NAN_SCORES_PROPAGATE;
  if (wd) a.weights = rlk_tensor_1d(wd, c->scores_dtype, B);
  a.advantages = rlk_tensor_1d(ad, RLK_F32, B);
  if (has_mask) a.mask = rlk_tensor_2d(md, c->mask_dtype, B, T, mstride);
  if (c->broadcast) a.token_advantages = rlk_tensor_2d(td, RLK_F32, B, T, tstride);
  size_t wsb = 0;
  ck_assert_int_eq(rlk_group_advantage_workspace_size(ctx, &a, &wsb), RLK_OK);
  ck_assert_uint_eq(wsb, c->scores_2d && c->scores_dtype == RLK_F64 ? (size_t)B * 8 : 0);
  if (wsb) {
    a.workspace = rlk_test_dev_alloc(ctx, wsb);
    a.workspace_bytes = wsb;
  }
  rlk_test_expect_call_done(ctx, rlk_group_advantage(ctx, &a, NULL), what);

  float *adv = malloc((size_t)B * sizeof *adv);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, adv, ad, (size_t)B * sizeof(float)), RLK_OK);
  float *tok = NULL;
  if (c->broadcast) {
    tok = malloc((size_t)t_elems * sizeof *tok);
    ck_assert_int_eq(rlk_memcpy_to_host(ctx, tok, td, (size_t)t_elems * sizeof(float)), RLK_OK);
  }

  /* reference */
  ga_ref_problem p;
  memset(&p, 0, sizeof p);
  p.B = B;
  p.T = T;
  if (c->scores_2d)
    p.rewards = dense;
  else
    p.scores = dense;
  p.mask = mw;
  p.offsets = offs;
  p.num_groups = ng;
  p.mode = c->mode;
  p.eps = (double)c->eps;
  p.unbiased = c->unbiased;
  p.singleton = c->singleton;
  p.weights = wv;
  p.nan_unscorable = c->nan_frac > 0;
  double *rs = malloc((size_t)B * sizeof *rs), *ra = malloc((size_t)B * sizeof *ra),
         *rsc = malloc((size_t)B * sizeof *rsc);
  ga_ref_result r = {rs, ra, rsc, NULL};
  ck_assert_int_eq(ga_ref_compute(&p, &r), 0);

  /* Tolerance: the output's rounding plus the computation's error on the scores (in the
   * precision the op computes in) divided by the scale the centred score is divided by. */
  const int f64_path = c->scores_dtype == RLK_F64; /* f64 row sums stay f64 */
  const double ec = f64_path ? DBL_EPSILON : FLT_EPSILON;
  for (int64_t g = 0; g < ng; g++) {
    const int64_t n = offs[g + 1] - offs[g];
    double mx = 0, sum = 0;
    for (int64_t i = offs[g]; i < offs[g + 1]; i++) {
      if (isnan(rs[i])) continue; /* unscorable */
      double e = fabs(rs[i]);
      if (c->scores_2d) { /* row sum error in the reward type (f32 sums: rounded to f32) */
        double abs_sum = 0;
        for (int64_t t = 0; t < T; t++) {
          const double w = has_mask ? mw[i * T + t] : 1.0;
          if (w != 0.0) abs_sum += fabs(dense[i * T + t] * w);
        }
        const double er = c->scores_dtype == RLK_F64 ? DBL_EPSILON : FLT_EPSILON;
        e += (T * er * abs_sum + (f64_path ? 0.0 : FLT_EPSILON * fabs(rs[i]))) / ec;
      }
      mx = e > mx ? e : mx;
      sum += rs[i];
    }
    const double nstat = c->mode == RLK_ADV_BATCH_STD ? (double)B : (double)n;
    const double rtol = (f64_path ? 1e-6 : 1e-5) + 8 * sqrt(nstat) * ec;
    const double abs_err = 8 * sqrt((double)n) * ec * (mx + fabs(sum / (double)n));
    for (int64_t i = offs[g]; i < offs[g + 1]; i++) {
      if (ra[i] == 0.0 && (c->nan_frac > 0 || c->mode >= RLK_ADV_PASSK)) {
        /* unscorable, and pass@k's members that are not the best: exactly 0 */
        ck_assert_msg((double)adv[i] == 0.0, "%s: advantages[%lld] = %.9g, expected 0 (score %.9g)",
                      what, (long long)i, (double)adv[i], rs[i]);
        continue;
      }
      const double tol = rtol * fabs(ra[i]) + abs_err / rsc[i] + 1e-30;
      ck_assert_msg(fabs((double)adv[i] - ra[i]) <= tol,
                    "%s: advantages[%lld] = %.9g, reference %.9g (score %.9g, group %lld of "
                    "size %lld, tolerance %.3g)",
                    what, (long long)i, (double)adv[i], ra[i], rs[i], (long long)g,
                    (long long)n, tol);
    }
  }

  /* token advantages: exactly adv[b] * mask in f32, 0 where masked; padding untouched */
  if (c->broadcast) {
    for (int64_t b = 0; b < B; b++) {
      for (int64_t t = 0; t < T; t++) {
        const float w = has_mask ? (float)mw[b * T + t] : 1.0f;
        const float want = w != 0.0f ? adv[b] * w : 0.0f;
        const float got = tok[b * tstride + t];
        ck_assert_msg(float_bits(got) == float_bits(want),
                      "%s: token_advantages[%lld, %lld] = %.9g, expected %.9g", what, (long long)b,
                      (long long)t, (double)got, (double)want);
      }
      if (b + 1 < B)
        for (int64_t t = T; t < tstride; t++)
          ck_assert_msg(float_bits(tok[b * tstride + t]) == 0xffffffffu,
                        "%s: token_advantages padding [%lld, %lld] was written", what,
                        (long long)b, (long long)t);
    }
  }

  if (adv_out) memcpy(adv_out, adv, (size_t)B * sizeof *adv);
  if (tok_out && c->broadcast)
    for (int64_t b = 0; b < B; b++) memcpy(tok_out + b * T, tok + b * tstride, (size_t)T * sizeof *tok);

  rlk_free(ctx, sd);
  rlk_free(ctx, md);
  rlk_free(ctx, od);
  rlk_free(ctx, ad);
  rlk_free(ctx, td);
  free(offs);
  free(sh);
  free(dense);
  free(mh);
  free(mw);
  free(adv);
  free(tok);
  free(rs);
  free(ra);
  free(rsc);
  free(wh);
  free(wv);
  rlk_free(ctx, wd);
  rlk_free(ctx, a.workspace);
}

/* ---------------------------------------------------------------------------------- */
/* Suites of cases, run on any context                                                 */
/* ---------------------------------------------------------------------------------- */

static const int64_t fixed_groups[] = {1, 2, 3, 16, 33, 64};
#define N_FIXED (sizeof fixed_groups / sizeof fixed_groups[0])

/* Every mode x unbiased x singleton x fixed group size; f32 and f64 scores alternate. */
static void cases_fixed_groups(rlk_context *ctx, uint64_t *rng) {
  for (size_t gi = 0; gi < N_FIXED; gi++)
    for (int mode = 0; mode < 4; mode++)
      for (int unbiased = 0; unbiased < 2; unbiased++)
        for (int singleton = 0; singleton < 2; singleton++) {
          const int64_t G = fixed_groups[gi];
          ga_case c = base_case(G * (1 + (int64_t)(rlk_test_rand_u64(rng) % 6)), G);
          c.mode = mode;
          c.unbiased = unbiased;
          c.singleton = singleton;
          c.scores_dtype = (gi + (size_t)mode) % 2 ? RLK_F64 : RLK_F32;
          c.discrete = (unbiased + singleton) == 1 && rlk_test_rand_uniform(rng) < 0.5;
          run_case(ctx, &c, rng, NULL, NULL);
        }
}

/* Uneven groups from offsets (singletons among them), both offset dtypes, every policy. */
static void cases_uneven_groups(rlk_context *ctx, uint64_t *rng) {
  enum { MAXB = 4097 };
  static int64_t sizes[MAXB];
  int k = 0;
  for (int mode = 0; mode < 4; mode++)
    for (int unbiased = 0; unbiased < 2; unbiased++)
      for (int singleton = 0; singleton < 2; singleton++, k++) {
        const int64_t B = k == 0 ? MAXB : 1 + (int64_t)(rlk_test_rand_u64(rng) % 300);
        ga_case c = base_case(B, 0);
        c.num_groups = rlk_test_random_group_sizes(rng, B, k % 4 == 1 ? 40 : 7, sizes);
        c.sizes = sizes;
        c.offsets_dtype = singleton ? RLK_I32 : RLK_I64;
        c.mode = mode;
        c.unbiased = unbiased;
        c.singleton = singleton;
        c.scores_dtype = mode % 2 ? RLK_F64 : RLK_F32;
        c.discrete = k % 5 == 0;
        run_case(ctx, &c, rng, NULL, NULL);
      }
}

/* B = 1, 3 and 4097 (odd, prime-ish), where the grouping allows. */
static void cases_odd_batches(rlk_context *ctx, uint64_t *rng) {
  static const struct {
    int64_t B, G;
  } shapes[] = {{1, 1}, {3, 1}, {3, 3}, {4097, 1}, {4097, 17}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (int mode = 0; mode < 4; mode++) {
      ga_case c = base_case(shapes[i].B, shapes[i].G);
      c.mode = mode;
      c.singleton = (int)(i + (size_t)mode) % 2;
      run_case(ctx, &c, rng, NULL, NULL);
    }
}

/* [B, T] token rewards under every mask dtype, strided rows, and the broadcast. */
static void cases_token_rewards(rlk_context *ctx, uint64_t *rng) {
  static const rlk_dtype masks[] = {RLK_DTYPE_INVALID, RLK_BOOL, RLK_I32, RLK_F32};
  int k = 0;
  for (size_t m = 0; m < 4; m++)
    for (int d = 0; d < 2; d++, k++) {
      /* G and mode as in cases_fixed_groups with f32 scores: the group kernel is shared */
      const int mode = k % 4;
      const int64_t G = mode % 2 ? (k % 3 ? 2 : 16) : (k % 3 ? 3 : 1);
      ga_case c = base_case(G * (2 + (int64_t)(rlk_test_rand_u64(rng) % 4)), G);
      /* rows a multiple of 4 long (vector loads on a GPU where aligned) or not */
      c.T = k % 2 ? 4 * (1 + (int64_t)(rlk_test_rand_u64(rng) % 60))
                  : 1 + (int64_t)(rlk_test_rand_u64(rng) % 200);
      c.scores_2d = 1;
      c.scores_dtype = d ? RLK_F64 : RLK_F32;
      c.score_stride = k % 4 == 1 ? c.T + 5 : (k % 4 == 3 ? c.T + 4 : 0);
      c.mask_dtype = masks[m];
      c.mask_stride = masks[m] && k % 3 == 2 ? c.T + 3 : 0;
      c.broadcast = k % 4 != 2;
      c.tok_stride = k % 3 == 1 ? c.T + 7 : (k % 3 == 0 ? c.T + 8 : 0);
      c.mode = mode;
      run_case(ctx, &c, rng, NULL, NULL);
    }
}

/* Per-sequence scores with a broadcast over tokens, with and without a mask. */
static void cases_broadcast(rlk_context *ctx, uint64_t *rng) {
  static const rlk_dtype masks[] = {RLK_DTYPE_INVALID, RLK_BOOL, RLK_I32, RLK_F32};
  for (size_t m = 0; m < 4; m++) {
    ga_case c = base_case(48, 8);
    c.T = 1 + (int64_t)(rlk_test_rand_u64(rng) % 700);
    c.mask_dtype = masks[m];
    c.broadcast = 1;
    c.tok_stride = m % 2 ? c.T + 2 : 0;
    run_case(ctx, &c, rng, NULL, NULL);
  }
}

/* The three trainers' epsilons, and zero, on continuous scores. */
static void cases_eps(rlk_context *ctx, uint64_t *rng) {
  static const float eps[] = {1e-6f, 1e-4f, 1e-9f, 0.0f};
  for (size_t i = 0; i < 4; i++) {
    ga_case c = base_case(64, 16);
    c.eps = eps[i];
    run_case(ctx, &c, rng, NULL, NULL);
    c.mode = RLK_ADV_BATCH_STD;
    run_case(ctx, &c, rng, NULL, NULL);
  }
}

/* Scores that are a strided column of a larger array. */
static void cases_strided_scores(rlk_context *ctx, uint64_t *rng) {
  ga_case c = base_case(96, 16);
  c.score_stride = 3;
  run_case(ctx, &c, rng, NULL, NULL);
  c.scores_dtype = RLK_F64;
  c.score_stride = 5;
  c.mode = RLK_ADV_RLOO;
  run_case(ctx, &c, rng, NULL, NULL);
}

/* opo (length weights), pass@k and its unscaled form over fixed and uneven groups, f32 and
 * f64, continuous and pass/fail scores (ties for the best place). */
static void cases_outcome_modes(rlk_context *ctx, uint64_t *rng) {
  static int64_t sizes[300];
  static const int modes[] = {RLK_ADV_OPO, RLK_ADV_PASSK, RLK_ADV_PASSK_UNSCALED};
  for (size_t mi = 0; mi < 3; mi++) {
    for (size_t gi = 0; gi < N_FIXED; gi++) {
      const int64_t G = fixed_groups[gi];
      ga_case c = base_case(G * (1 + (int64_t)(rlk_test_rand_u64(rng) % 5)), G);
      c.mode = modes[mi];
      c.unbiased = (int)(gi % 2);
      c.singleton = (int)((gi / 2) % 2);
      c.scores_dtype = (gi + mi) % 2 ? RLK_F64 : RLK_F32;
      c.discrete = gi % 3 == 1;
      run_case(ctx, &c, rng, NULL, NULL);
    }
    ga_case c = base_case(1 + (int64_t)(rlk_test_rand_u64(rng) % 250), 0);
    c.num_groups = rlk_test_random_group_sizes(rng, c.B, 20, sizes);
    c.sizes = sizes;
    c.offsets_dtype = mi % 2 ? RLK_I32 : RLK_I64;
    c.mode = modes[mi];
    run_case(ctx, &c, rng, NULL, NULL);
    /* [B, T] rewards: f64 row sums (pass@k's order of the best is then exact) */
    c = base_case(48, 16);
    c.T = 1 + (int64_t)(rlk_test_rand_u64(rng) % 90);
    c.scores_2d = 1;
    c.scores_dtype = modes[mi] == RLK_ADV_OPO ? RLK_F32 : RLK_F64;
    c.mask_dtype = RLK_BOOL;
    c.broadcast = 1;
    c.mode = modes[mi];
    run_case(ctx, &c, rng, NULL, NULL);
  }
}

/* NaN scores as unscorable members under every mode: left out of the statistics, advantage 0
 * (TRL's settings among them: eps 1e-4, one-member groups 0). */
static void cases_unscorable(rlk_context *ctx, uint64_t *rng) {
  static const int64_t groups[] = {1, 4, 16, 64};
  int k = 0;
  for (int mode = 0; mode <= RLK_ADV_PASSK_UNSCALED; mode++)
    for (size_t gi = 0; gi < 4; gi++, k++) {
      const int64_t G = groups[gi];
      ga_case c = base_case(G * (1 + (int64_t)(rlk_test_rand_u64(rng) % 4)), G);
      c.mode = mode;
      c.nan_frac = k % 3 == 0 ? 0.6 : 0.25;
      c.eps = k % 2 ? 1e-4f : 1e-6f;
      c.singleton = k % 2 ? RLK_SINGLETON_ZERO : RLK_SINGLETON_MEAN0_STD1;
      c.scores_dtype = k % 4 == 1 ? RLK_F64 : RLK_F32;
      c.discrete = k % 5 == 2;
      if (k % 7 == 3) { /* token rewards whose unmasked NaN makes the row unscorable */
        c.T = 1 + (int64_t)(rlk_test_rand_u64(rng) % 40);
        c.scores_2d = 1;
        c.mask_dtype = RLK_F32;
        c.broadcast = 1;
        if (mode >= RLK_ADV_PASSK) c.scores_dtype = RLK_F64;
      }
      run_case(ctx, &c, rng, NULL, NULL);
    }
}

/* One call on 1-D scores of `dt` in groups of G (weights for opo, may be NULL), NaN scores
 * arithmetic; advantages into adv. */
static void run_plain(rlk_context *ctx, rlk_dtype dt, const double *scores, const double *weights, int64_t B,
                      int64_t G, rlk_advantage_mode mode, float *adv, const char *what) {
  const size_t es = rlk_dtype_size(dt);
  unsigned char *sh = malloc((size_t)B * es), *wh = malloc((size_t)B * es);
  for (int64_t b = 0; b < B; b++) {
    rlk_test_store(sh, dt, b, scores[b]);
    if (weights) rlk_test_store(wh, dt, b, weights[b]);
  }
  void *sd = rlk_test_dev_upload(ctx, sh, (size_t)B * es), *wd = weights ? rlk_test_dev_upload(ctx, wh, (size_t)B * es) : NULL;
  float *ad = rlk_test_dev_alloc(ctx, (size_t)B * sizeof(float));
  rlk_group_advantage_args a;
  rlk_group_advantage_args_init(&a);
  a.scores = rlk_tensor_1d(sd, dt, B);
  a.group_size = G;
  a.mode = mode;
  if (wd) a.weights = rlk_tensor_1d(wd, dt, B);
  a.advantages = rlk_tensor_1d(ad, RLK_F32, B);
  rlk_test_expect_call_done(ctx, rlk_group_advantage(ctx, &a, NULL), what);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, adv, ad, (size_t)B * sizeof(float)), RLK_OK);
  rlk_free(ctx, sd);
  rlk_free(ctx, wd);
  rlk_free(ctx, ad);
  free(sh);
  free(wh);
}

/* NaN scores arithmetic (the default): a group holding one gets NaN statistics under every mode.
 * pass@k ranks NaN above every score, as torch.topk does (verl's grpo_passk): the group's first
 * NaN member gets NaN, the others 0; batch-std's NaN std makes every group NaN. opo: weights
 * summing to 0 give NaN, not +-inf. Groups without NaN are otherwise bit for bit what they are in
 * a batch without any. */
static void cases_nan_arithmetic(rlk_context *ctx, uint64_t *rng) {
  static const int64_t groups[] = {4, 48};
  for (int dt = 0; dt < 2; dt++)
    for (size_t gi = 0; gi < 2; gi++)
      for (int mode = 0; mode <= RLK_ADV_PASSK_UNSCALED; mode++) {
        const int64_t G = groups[gi], ng = 6, B = G * ng;
        const rlk_dtype d = dt ? RLK_F64 : RLK_F32;
        double *sc = malloc((size_t)B * sizeof *sc), *clean = malloc((size_t)B * sizeof *clean),
               *w = malloc((size_t)B * sizeof *w);
        int64_t first_nan[6];
        for (int64_t b = 0; b < B; b++) {
          sc[b] = clean[b] = round((rlk_test_rand_normal(rng) + 1.0) * 8.0) / 8.0;
          w[b] = (double)(1 + rlk_test_rand_u64(rng) % 50);
        }
        for (int64_t g = 0; g < ng; g++) {
          first_nan[g] = -1;
          if (g % 2 == 0) continue; /* even groups clean */
          const int64_t i = g * G + (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)G);
          sc[i] = NAN;
          clean[i] = 0.5;
          first_nan[g] = i;
          if (g == 3) { /* a second NaN after the first */
            const int64_t j = g * G + G - 1;
            if (j > i) sc[j] = NAN, clean[j] = 0.5;
          }
        }
        if (mode == RLK_ADV_OPO) { /* group 4 (clean scores): weights summing to 0 */
          for (int64_t b = 4 * G; b < 5 * G; b++) w[b] = (b - 4 * G) % 2 ? -1.0 : 1.0;
          if (G % 2) w[5 * G - 1] = 0.0;
          sc[4 * G] = clean[4 * G] = 3.0; /* the weighted sum is not 0 */
        }
        float *adv = malloc((size_t)B * sizeof *adv), *ref = malloc((size_t)B * sizeof *ref);
        char what[160];
        snprintf(what, sizeof what, "group_advantage NaN arithmetic dtype=%s G=%lld mode=%d", dt ? "f64" : "f32",
                 (long long)G, mode);
        run_plain(ctx, d, sc, mode == RLK_ADV_OPO ? w : NULL, B, G, (rlk_advantage_mode)mode, adv, what);
        run_plain(ctx, d, clean, mode == RLK_ADV_OPO ? w : NULL, B, G, (rlk_advantage_mode)mode, ref, what);
        for (int64_t g = 0; g < ng; g++)
          for (int64_t i = g * G; i < (g + 1) * G; i++) {
            if (mode == RLK_ADV_OPO && g == 4) {
              ck_assert_msg(isnan(adv[i]), "%s: [%lld] = %g, weights summing to 0 give NaN", what, (long long)i,
                            (double)adv[i]);
            } else if (mode == RLK_ADV_BATCH_STD) { /* the batch's std holds the NaN: every group */
              ck_assert_msg(isnan(adv[i]), "%s: [%lld] = %g, the batch's std is NaN", what, (long long)i,
                            (double)adv[i]);
            } else if (first_nan[g] < 0) {
              ck_assert_msg(!memcmp(&adv[i], &ref[i], sizeof(float)), "%s: clean group's [%lld] = %g, %g alone", what,
                            (long long)i, (double)adv[i], (double)ref[i]);
            } else if (mode >= RLK_ADV_PASSK) {
              if (i == first_nan[g])
                ck_assert_msg(isnan(adv[i]), "%s: the first NaN member [%lld] = %g, expected NaN", what,
                              (long long)i, (double)adv[i]);
              else
                ck_assert_msg(adv[i] == 0.0f, "%s: [%lld] = %g, expected 0 beside the NaN member", what,
                              (long long)i, (double)adv[i]);
            } else {
              ck_assert_msg(isnan(adv[i]), "%s: [%lld] = %g in a group with a NaN, expected NaN", what,
                            (long long)i, (double)adv[i]);
            }
          }
        free(sc);
        free(clean);
        free(w);
        free(adv);
        free(ref);
      }
}

/* Two runs on the same inputs give bitwise the same outputs. */
static void cases_deterministic(rlk_context *ctx, uint64_t *rng) {
  static int64_t sizes[600];
  for (int mode = 0; mode < 4; mode++) {
    ga_case c = base_case(512, mode == 1 ? 64 : 16);
    if (mode == 2) {
      c.group_size = 0;
      c.num_groups = rlk_test_random_group_sizes(rng, c.B, 40, sizes);
      c.sizes = sizes;
    }
    if (mode == 3) {
      c.T = 37;
      c.scores_2d = 1;
      c.mask_dtype = RLK_F32;
      c.broadcast = 1;
    }
    c.mode = mode;
    const uint64_t seed = rlk_test_rand_u64(rng);
    float *a1 = malloc((size_t)c.B * sizeof(float)), *a2 = malloc((size_t)c.B * sizeof(float));
    float *t1 = calloc((size_t)(c.B * (c.T ? c.T : 1)), sizeof(float));
    float *t2 = calloc((size_t)(c.B * (c.T ? c.T : 1)), sizeof(float));
    uint64_t s1 = seed, s2 = seed;
    run_case(ctx, &c, &s1, a1, t1);
    run_case(ctx, &c, &s2, a2, t2);
    ck_assert_msg(memcmp(a1, a2, (size_t)c.B * sizeof(float)) == 0, "mode %s: advantages differ between runs", mode_name(mode));
    ck_assert_msg(memcmp(t1, t2, (size_t)(c.B * (c.T ? c.T : 1)) * sizeof(float)) == 0,
                  "mode %s: token advantages differ between runs", mode_name(mode));
    free(a1);
    free(a2);
    free(t1);
    free(t2);
  }
}

/* ---------------------------------------------------------------------------------- */
/* Host backend                                                                        */
/* ---------------------------------------------------------------------------------- */

RLK_HOST_CASE(fixed_groups)
RLK_HOST_CASE(uneven_groups)
RLK_HOST_CASE(odd_batches)
RLK_HOST_CASE(token_rewards)
RLK_HOST_CASE(broadcast)
RLK_HOST_CASE(eps)
RLK_HOST_CASE(strided_scores)
RLK_HOST_CASE(deterministic)
RLK_HOST_CASE(outcome_modes)
RLK_HOST_CASE(unscorable)
RLK_HOST_CASE(nan_arithmetic)

START_TEST(args_init_defaults) {
  rlk_group_advantage_args a;
  memset(&a, 0x5a, sizeof a);
  rlk_group_advantage_args_init(&a);
  ck_assert_int_eq(a.mode, RLK_ADV_GRPO);
  ck_assert_float_eq(a.eps, 1e-6f);
  ck_assert_int_eq(a.unbiased, 1);
  ck_assert_int_eq(a.singleton, RLK_SINGLETON_MEAN0_STD1);
  ck_assert_int_eq(a.group_size, 0);
  ck_assert_ptr_null(a.scores.data);
  ck_assert_ptr_null(a.group_offsets.data);
  ck_assert_ptr_null(a.advantages.data);
  ck_assert_ptr_null(a.mask.data);
  ck_assert_ptr_null(a.token_advantages.data);
  rlk_group_advantage_args_init(NULL); /* no crash */
}
END_TEST

/* Scores may be the advantages buffer itself (f32, contiguous). */
/* f64 [B, T] rewards keep f64 through the row sums: a low-variance group whose sums differ
 * below f32's resolution still gets its f64 advantages (rounding the sums to f32 made them 0). */
START_TEST(host_f64_token_rewards) {
  rlk_context *ctx = rlk_test_host_context();
  enum { B = 4, T = 3 };
  double r[B * T];
  unsigned char m[B * T];
  double s[B];
  for (int b = 0; b < B; b++) {
    s[b] = 0;
    for (int t = 0; t < T; t++) {
      r[b * T + t] = t == 0 ? 1.0 + 1e-9 * (double)(b * b) : (t == 1 ? 0.25 : 1e3);
      m[b * T + t] = t < 2; /* the last token is masked out */
      if (t < 2) s[b] += r[b * T + t];
    }
  }
  double mean = 0, var = 0;
  for (int b = 0; b < B; b++) mean += s[b] / B;
  for (int b = 0; b < B; b++) var += (s[b] - mean) * (s[b] - mean) / (B - 1);
  float adv[B];
  rlk_group_advantage_args a;
  rlk_group_advantage_args_init(&a);
  a.scores = rlk_tensor_2d(r, RLK_F64, B, T, T);
  a.mask = rlk_tensor_2d(m, RLK_BOOL, B, T, T);
  a.group_size = B;
  a.eps = 0;
  a.advantages = rlk_tensor_1d(adv, RLK_F32, B);
  rlk_test_expect_error(rlk_group_advantage(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT, "workspace",
                        "rlk_group_advantage");
  double ws[B];
  size_t need = 0;
  ck_assert_int_eq(rlk_group_advantage_workspace_size(ctx, &a, &need), RLK_OK);
  ck_assert_uint_eq(need, sizeof ws);
  a.workspace = ws;
  a.workspace_bytes = sizeof ws;
  ck_assert_msg(rlk_group_advantage(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  for (int b = 0; b < B; b++) {
    const double want = (s[b] - mean) / sqrt(var);
    ck_assert_msg(fabs((double)adv[b] - want) <= 1e-6 * fabs(want) + 1e-6,
                  "advantages[%d] = %.9g, f64 reference %.9g", b, (double)adv[b], want);
  }
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(host_in_place) {
  rlk_context *ctx = rlk_test_host_context();
  uint64_t rng = rlk_test_seed() ^ 77;
  enum { B = 64 };
  for (int mode = 0; mode < 4; mode++) {
    float buf[B], orig[B], sep[B];
    for (int i = 0; i < B; i++) orig[i] = buf[i] = (float)rlk_test_rand_normal(&rng);
    rlk_group_advantage_args a;
    rlk_group_advantage_args_init(&a);
    a.mode = mode;
    a.group_size = 8;
    a.scores = rlk_tensor_1d(orig, RLK_F32, B);
    a.advantages = rlk_tensor_1d(sep, RLK_F32, B);
    ck_assert_int_eq(rlk_group_advantage(ctx, &a, NULL), RLK_OK);
    a.scores = rlk_tensor_1d(buf, RLK_F32, B);
    a.advantages = rlk_tensor_1d(buf, RLK_F32, B);
    ck_assert_int_eq(rlk_group_advantage(ctx, &a, NULL), RLK_OK);
    ck_assert_msg(memcmp(buf, sep, sizeof buf) == 0, "mode %s: in place differs", mode_name(mode));
  }
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Argument validation                                                                 */
/* ---------------------------------------------------------------------------------- */

typedef struct bad_fixture {
  float scores[24], adv[24], tok[24 * 5], maskf[24 * 5];
  double scores64[24];
  int64_t offs[4];
  rlk_group_advantage_args a;
} bad_fixture;

static void bad_reset(bad_fixture *f) {
  for (int i = 0; i < 24; i++) f->scores[i] = (float)i;
  memset(f->adv, 0xff, sizeof f->adv);
  f->offs[0] = 0;
  f->offs[1] = 5;
  f->offs[2] = 6;
  f->offs[3] = 24;
  rlk_group_advantage_args_init(&f->a);
  f->a.scores = rlk_tensor_1d(f->scores, RLK_F32, 24);
  f->a.advantages = rlk_tensor_1d(f->adv, RLK_F32, 24);
  f->a.group_size = 4;
}

/* The fixture (static: too large for the stack), reset. */
static bad_fixture *bad_fresh(void) {
  static bad_fixture fx;
  bad_reset(&fx);
  return &fx;
}

/* The call fails with `want`, the message names `arg`, and the output is untouched. */
static void expect_bad(rlk_context *ctx, bad_fixture *f, rlk_status want, const char *arg,
                       const char *label) {
  rlk_test_expect_error(rlk_group_advantage(ctx, &f->a, NULL), want, arg, label);
  rlk_test_expect_untouched(f->adv, RLK_F32, 24, "advantages", label);
  bad_reset(f);
}

START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  bad_fixture *f = bad_fresh();
  ck_assert_int_eq(rlk_group_advantage(ctx, &f->a, NULL), RLK_OK); /* the baseline is valid */
  memset(f->adv, 0xff, sizeof f->adv);

  rlk_test_expect_error(rlk_group_advantage(NULL, &f->a, NULL), RLK_ERR_INVALID_ARGUMENT, "ctx", "rlk_group_advantage");
  rlk_test_expect_error(rlk_group_advantage(ctx, NULL, NULL), RLK_ERR_INVALID_ARGUMENT, "args", "rlk_group_advantage");

  /* scores */
  f->a.scores.data = NULL;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "scores", "absent scores");
  f->a.scores.dtype = RLK_I32;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "scores", "i32 scores");
  f->a.scores.dtype = RLK_BF16;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "scores", "bf16 scores");
  f->a.scores.dtype = (rlk_dtype)99;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "scores", "bogus dtype");
  f->a.scores = rlk_tensor_2d(f->scores, RLK_F32, 2, 3, 3);
  f->a.scores.ndim = 3;
  f->a.scores.shape[2] = 4;
  f->a.scores.strides[2] = 1;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "scores", "3-D scores");
  f->a.scores.ndim = 0;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "scores", "0-D scores");
  f->a.scores.shape[0] = 0;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "scores", "empty scores");
  f->a.scores.shape[0] = -4;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "scores", "negative B");
  f->a.scores.strides[0] = -1;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "scores", "negative stride");
  f->a.scores.data = (char *)f->scores + 1;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "scores", "misaligned scores");
  f->a.scores = rlk_tensor_2d(f->scores, RLK_F32, 4, 6, 6);
  f->a.scores.strides[1] = 2;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "scores", "2-D scores, strided columns");
  f->a.scores = rlk_tensor_2d(f->scores, RLK_F32, 4, 6, 5);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "scores", "2-D scores, overlapping rows");

  /* mode, singleton, eps */
  f->a.mode = (rlk_advantage_mode)4;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "mode", "mode 4");
  f->a.mode = (rlk_advantage_mode)-1;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "mode", "mode -1");
  f->a.singleton = (rlk_singleton_policy)2;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "singleton", "singleton 2");
  f->a.eps = -1e-6f;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "eps", "negative eps");
  f->a.eps = NAN;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "eps", "NaN eps");
  f->a.eps = INFINITY;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "eps", "infinite eps");

  /* groups */
  f->a.group_size = -4;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "group_size", "negative group size");
  f->a.group_size = 5;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "group_size", "G does not divide B");
  f->a.group_size = 48;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "group_size", "G > B");
  f->a.group_offsets = rlk_tensor_1d(f->offs, RLK_I64, 4);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "group_offsets", "both group size and offsets");
  f->a.group_size = 0;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "group_offsets", "neither group size nor offsets");

  /* offsets: shape and dtype, then values (checked in full on the host) */
  f->a.group_size = 0;
  f->a.group_offsets = rlk_tensor_1d(f->offs, RLK_I64, 4);
  ck_assert_int_eq(rlk_group_advantage(ctx, &f->a, NULL), RLK_OK);
  memset(f->adv, 0xff, sizeof f->adv);
#define OFFS_BAD(stmt, label)                                                   \
  do {                                                                          \
    f->a.group_size = 0;                                                        \
    f->a.group_offsets = rlk_tensor_1d(f->offs, RLK_I64, 4);                    \
    stmt;                                                                       \
    expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "group_offsets", label);       \
  } while (0)
  OFFS_BAD(f->a.group_offsets.dtype = RLK_F32, "f32 offsets");
  OFFS_BAD(f->a.group_offsets.dtype = RLK_BOOL, "bool offsets");
  OFFS_BAD(f->a.group_offsets.shape[0] = 1, "one offset");
  OFFS_BAD(f->a.group_offsets = rlk_tensor_2d(f->offs, RLK_I64, 2, 2, 2), "2-D offsets");
  OFFS_BAD(f->a.group_offsets.strides[0] = 2, "strided offsets");
  OFFS_BAD(f->offs[0] = 1, "first offset not 0");
  OFFS_BAD(f->offs[3] = 23, "last offset not B");
  OFFS_BAD(f->offs[3] = 25, "last offset past B");
  OFFS_BAD((f->offs[1] = 7, f->offs[2] = 6), "decreasing offsets");
  OFFS_BAD(f->offs[2] = 5, "empty group");
  OFFS_BAD(f->offs[1] = -1, "negative offset");
  {
    static int64_t many[30];
    for (int i = 0; i < 30; i++) many[i] = i;
    OFFS_BAD(f->a.group_offsets = rlk_tensor_1d(many, RLK_I64, 30), "more groups than B");
  }
  {
    int32_t o32[4] = {0, 5, 5, 24};
    OFFS_BAD(f->a.group_offsets = rlk_tensor_1d(o32, RLK_I32, 4), "i32 empty group");
  }

  /* advantages */
  f->a.advantages.data = NULL;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "advantages", "absent advantages");
  f->a.advantages.dtype = RLK_F64;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "advantages", "f64 advantages");
  f->a.advantages.shape[0] = 23;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "advantages", "advantages too short");
  f->a.advantages = rlk_tensor_1d(f->adv, RLK_F32, 12);
  f->a.advantages.shape[0] = 24;
  f->a.advantages.strides[0] = 2;
  f->a.advantages.data = f->tok;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "advantages", "strided advantages");
  f->a.advantages = rlk_tensor_2d(f->adv, RLK_F32, 24, 1, 1);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "advantages", "2-D advantages");

  /* mask and token_advantages */
  f->a.mask = rlk_tensor_2d(f->maskf, RLK_F32, 24, 5, 5);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "mask", "mask with nothing to apply to");
  const struct {
    rlk_tensor mask;
    const char *label;
  } bad_masks[] = {{rlk_tensor_2d(f->maskf, RLK_F32, 24, 4, 4), "mask T mismatch"},
                   {rlk_tensor_2d(f->maskf, RLK_F32, 20, 5, 5), "mask B mismatch"},
                   {rlk_tensor_2d(f->maskf, RLK_F64, 24, 5, 5), "f64 mask"},
                   {rlk_tensor_1d(f->maskf, RLK_F32, 24), "1-D mask"}};
  for (size_t i = 0; i < sizeof bad_masks / sizeof bad_masks[0]; i++) {
    f->a.token_advantages = rlk_tensor_2d(f->tok, RLK_F32, 24, 5, 5);
    f->a.mask = bad_masks[i].mask;
    expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "mask", bad_masks[i].label);
  }
  f->a.token_advantages = rlk_tensor_2d(f->tok, RLK_F32, 24, 5, 4);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "token_advantages", "overlapping token rows");
  f->a.token_advantages = rlk_tensor_2d(f->tok, RLK_F32, 24, 5, 5);
  f->a.token_advantages.dtype = RLK_BF16;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "token_advantages", "bf16 token advantages");
  f->a.token_advantages = rlk_tensor_2d(f->tok, RLK_F32, 23, 5, 5);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "token_advantages", "token rows != B");
  f->a.token_advantages = rlk_tensor_1d(f->tok, RLK_F32, 24);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "token_advantages", "1-D token advantages");
  f->a.scores = rlk_tensor_2d(f->tok, RLK_F32, 24, 5, 5);
  f->a.token_advantages = rlk_tensor_2d(f->maskf, RLK_F32, 24, 4, 4);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "token_advantages", "token T != scores T");
  f->a.scores = rlk_tensor_2d(f->tok, RLK_F32, 24, 5, 5);
  f->a.mask = rlk_tensor_2d(f->maskf, RLK_F32, 24, 4, 4);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "mask", "mask T != scores T");

  /* f64 scores are fine */
  f->a.scores = rlk_tensor_1d(f->scores64, RLK_F64, 24);
  for (int i = 0; i < 24; i++) f->scores64[i] = i;
  ck_assert_int_eq(rlk_group_advantage(ctx, &f->a, NULL), RLK_OK);
  rlk_context_destroy(ctx);

  /* a compile-only context checks the arguments, then refuses to launch */
  ctx = rlk_test_compile_only_host_context();
  bad_reset(f);
  f->a.group_size = 5;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "group_size", "compile-only, bad group size");
  expect_bad(ctx, f, RLK_ERR_UNSUPPORTED, "", "compile-only");
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

/* Precompiling a configuration builds exactly what the matching call looks up: the call after
 * it compiles nothing, with JIT compiles counted on a fresh cache. */
START_TEST(plan_matches_call) {
  static const int64_t sizes[] = {5, 1, 10, 8};
  static const struct {
    const char *line;
    int kernels;
    ga_case c;
  } rows[] = {
      {"group_advantage group_size=6 mode=rloo", 1,
       {.B = 24, .group_size = 6, .mode = RLK_ADV_RLOO, .unbiased = 1, .eps = 1e-6f,
        .scores_dtype = RLK_F32}},
      {"group_advantage offsets=i32 mode=batch-std scores=f64 unbiased=0 singleton=zero", 1,
       {.B = 24, .group_size = 0, .sizes = sizes, .num_groups = 4, .offsets_dtype = RLK_I32,
        .mode = RLK_ADV_BATCH_STD, .singleton = RLK_SINGLETON_ZERO, .eps = 1e-6f, .scores_dtype = RLK_F64}},
      {"group_advantage group_size=4 scores=f64 scores_2d=1 mask=i32 broadcast=1", 3,
       {.B = 24, .T = 9, .group_size = 4, .unbiased = 1, .eps = 1e-4f, .scores_dtype = RLK_F64,
        .scores_2d = 1, .mask_dtype = RLK_I32, .broadcast = 1}},
      {"group_advantage group_size=2000 mode=mean-only broadcast=1", 2,
       {.B = 4000, .T = 3, .group_size = 2000, .mode = RLK_ADV_MEAN_ONLY, .unbiased = 1,
        .eps = 1e-6f, .scores_dtype = RLK_F32, .broadcast = 1}},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    rlk_context *ctx = rlk_test_precompiled_host_context(rows[i].line, rows[i].kernels);
    uint64_t rng = rlk_test_seed() + i;
    run_case(ctx, &rows[i].c, &rng, NULL, NULL);
    rlk_test_expect_compiled_none(ctx, (uint64_t)rows[i].kernels, rows[i].line);
  }
}
END_TEST

START_TEST(plan_rejects_bad_settings) {
  static const char *const bad[][2] = {
      {"group_advantage mode=ppo", "mode"},
      {"group_advantage group_size=-1", "group_size"},
      {"group_advantage group_size=4x", "group_size"},
      {"group_advantage offsets=f32", "offsets"},
      {"group_advantage offsets=i32 group_size=4", "offsets"},
      {"group_advantage scores=bf16", "scores"},
      {"group_advantage scores_2d=2", "scores_2d"},
      {"group_advantage mask=f64 broadcast=1", "mask"},
      {"group_advantage mask=bool", "mask"},
      {"group_advantage unbiased=yes", "unbiased"},
      {"group_advantage singleton=one", "singleton"},
      {"group_advantage broadcast=true", "broadcast"},
      {"group_advantage colour=blue", "colour"},
  };
  rlk_test_expect_bad_lines(bad, sizeof bad / sizeof bad[0]);
  /* every setting the help names is accepted */
  const char *help = rlk_precompile_help("group_advantage");
  static const char *names[] = {"mode", "group_size", "offsets", "scores", "scores_2d", "mask",
                                "unbiased", "singleton", "broadcast"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    ck_assert_msg(strstr(help, names[i]) != NULL, "help lacks %s", names[i]);
}
END_TEST

RLK_SAMPLES_CASE("group_advantage", &rlk_op_group_advantage)

/* The samples reach every entry, every mode, both score dtypes, every mask and offset kind. */
START_TEST(samples_cover_every_variant) {
  rlk_context *ctx = rlk_test_host_context();
  int entries[3] = {0, 0, 0}, modes[RLK_ADV_PASSK_UNSCALED + 1] = {0}, score_dtypes[8] = {0}, masks[4] = {0},
      offsets[3] = {0}, baked = 0, runtime_g = 0;
  for (size_t i = 0; rlk_op_group_advantage.samples[i]; i++) {
    rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
    size_t ns = 0;
    ck_assert_int_eq(rlk_test_plan_line(&rlk_op_group_advantage, ctx, rlk_op_group_advantage.samples[i], specs, &ns),
                     RLK_OK);
    for (size_t k = 0; k < ns; k++) {
      const char *e = specs[k].tmpl->entry;
      if (strstr(e, "rowsum")) {
        entries[0]++;
        score_dtypes[specs[k].values[0]]++;
        masks[specs[k].values[1]]++;
      } else if (strstr(e, "broadcast")) {
        entries[2]++;
        masks[specs[k].values[0]]++;
      } else {
        entries[1]++;
        score_dtypes[specs[k].values[0]]++;
        modes[specs[k].values[1]]++;
        offsets[specs[k].values[4]]++;
        if (specs[k].values[2] > 0)
          baked++;
        else
          runtime_g++;
      }
    }
  }
  for (int i = 0; i < 3; i++) ck_assert_int_gt(entries[i], 0);
  for (int i = 0; i <= RLK_ADV_PASSK_UNSCALED; i++) ck_assert_msg(modes[i] > 0, "no sample of mode %d", i);
  for (int i = 0; i < 4; i++) ck_assert_int_gt(masks[i], 0);
  for (int i = 0; i < 3; i++) ck_assert_int_gt(offsets[i], 0);
  ck_assert_int_gt(score_dtypes[RLK_F32], 0);
  ck_assert_int_gt(score_dtypes[RLK_F64], 0);
  ck_assert_int_gt(baked, 0);
  ck_assert_int_gt(runtime_g, 0);
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* CUDA (RLK_TEST_GPU=1)                                                               */
/* ---------------------------------------------------------------------------------- */

/* called with RLK_TEST_GPU=1 only: no context there is a failure */
static rlk_context *cuda_context(const char *cache_dir) { return rlk_test_context_at(RLK_BACKEND_CUDA, cache_dir); }

RLK_GPU_CASE("group_advantage", fixed_groups)
RLK_GPU_CASE("group_advantage", uneven_groups)
RLK_GPU_CASE("group_advantage", odd_batches)
RLK_GPU_CASE("group_advantage", token_rewards)
RLK_GPU_CASE("group_advantage", broadcast)
RLK_GPU_CASE("group_advantage", eps)
RLK_GPU_CASE("group_advantage", strided_scores)
RLK_GPU_CASE("group_advantage", deterministic)
RLK_GPU_CASE("group_advantage", outcome_modes)
RLK_GPU_CASE("group_advantage", unscorable)
RLK_GPU_CASE("group_advantage", nan_arithmetic)

/* Large and odd shapes: the launch-bound GRPO shape, big groups, many tokens. */
START_TEST(gpu_large_shapes) {
  if (!rlk_test_gpu_enabled("group_advantage")) return;
  rlk_context *ctx = cuda_context(NULL);
  if (!ctx) return;
  uint64_t rng = rlk_test_seed() ^ 0xabcdef;
  static int64_t sizes[70001];
  ga_case c = base_case(1024, 16);
  for (int mode = 0; mode < 4; mode++) {
    c.mode = mode;
    run_case(ctx, &c, &rng, NULL, NULL);
  }
  c = base_case(4096, 4096); /* one group, a block of threads */
  run_case(ctx, &c, &rng, NULL, NULL);
  c = base_case(3 * 2049, 2049); /* run-time G */
  c.mode = RLK_ADV_BATCH_STD;
  run_case(ctx, &c, &rng, NULL, NULL);
  c = base_case(70001, 0); /* many uneven groups, batch statistics in every block */
  c.num_groups = rlk_test_random_group_sizes(&rng, c.B, 12, sizes);
  c.sizes = sizes;
  c.mode = RLK_ADV_BATCH_STD;
  run_case(ctx, &c, &rng, NULL, NULL);
  /* batch-std over row sums: the statistics read the buffer the advantages overwrite */
  static const struct {
    int64_t B, G, T;
    rlk_dtype mask;
  } row_sums[] = {{4096, 2048, 37, RLK_BOOL}, {16384, 16, 5, RLK_DTYPE_INVALID}};
  for (size_t i = 0; i < sizeof row_sums / sizeof row_sums[0]; i++) {
    c = base_case(row_sums[i].B, row_sums[i].G);
    c.mode = RLK_ADV_BATCH_STD;
    c.T = row_sums[i].T;
    c.scores_2d = 1;
    c.mask_dtype = row_sums[i].mask;
    run_case(ctx, &c, &rng, NULL, NULL);
  }
  c = base_case(129, 1);
  c.T = 4099;
  c.scores_2d = 1;
  c.mask_dtype = RLK_BOOL;
  c.broadcast = 1;
  c.score_stride = 4101;
  c.tok_stride = 4103;
  run_case(ctx, &c, &rng, NULL, NULL);
  rlk_context_destroy(ctx);
}
END_TEST

/* One child process runs the op and reports its compile count; a second, with the same fresh
 * cache, must load everything from disk. The parent never touches CUDA. */
static void child_run(const char *dir, int fd) {
  uint64_t report[3] = {0, 0, 0}; /* ok, compiles, disk hits */
  unsetenv("RLK_CACHE_RO_DIRS"); /* the compiles counted are this cache's alone */
  rlk_context *ctx = cuda_context(dir);
  if (ctx) {
    rlk_context_reset_counters(ctx);
    ga_case c = base_case(64, 16);
    c.T = 10;
    c.broadcast = 1;
    uint64_t rng = rlk_test_seed();
    run_case(ctx, &c, &rng, NULL, NULL);
    rlk_counters k;
    if (rlk_context_counters(ctx, &k) == RLK_OK) {
      report[0] = 1;
      report[1] = k.compiles;
      report[2] = k.disk_hits;
    }
    rlk_context_destroy(ctx);
  }
  ssize_t w = write(fd, report, sizeof report);
  _exit(w == (ssize_t)sizeof report ? 0 : 3);
}

static void run_child(const char *dir, uint64_t report[3]) {
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    child_run(dir, fds[1]);
  }
  close(fds[1]);
  ssize_t got = read(fds[0], report, 3 * sizeof(uint64_t));
  close(fds[0]);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed (status %d)", status);
  ck_assert_int_eq(got, (ssize_t)(3 * sizeof(uint64_t)));
}

START_TEST(gpu_second_process_loads_from_disk) {
  if (!rlk_test_gpu_enabled("group_advantage")) return;
  char dir[1024];
  rlk_test_mkdtemp(dir, sizeof dir, "gpu-cache");
  uint64_t first[3], second[3];
  run_child(dir, first);
  ck_assert_msg(first[0], "group_advantage gpu, second process: the first child had no CUDA context");
  ck_assert_uint_ge(first[1], 2);
  run_child(dir, second);
  ck_assert_uint_eq(second[0], 1);
  ck_assert_msg(second[1] == 0, "the second process compiled %llu kernels", (unsigned long long)second[1]);
  ck_assert_uint_ge(second[2], 2);
}
END_TEST

Suite *group_advantage_suite(void) {
  Suite *s = suite_create("group_advantage");
  rlk_test_add_case(s, "host", 120, TESTS(args_init_defaults, host_fixed_groups, host_uneven_groups,
      host_odd_batches, host_token_rewards, host_broadcast, host_eps, host_strided_scores, host_deterministic,
      host_outcome_modes, host_unscorable, host_nan_arithmetic, host_in_place, host_f64_token_rewards, bad_arguments));

  rlk_test_add_case(s, "plan", 300, TESTS(plan_matches_call, plan_rejects_bad_settings,
      samples_cover_every_variant, samples_compile_every_target));

  rlk_test_add_case(s, "gpu", 300, TESTS(gpu_fixed_groups, gpu_uneven_groups, gpu_odd_batches,
      gpu_token_rewards, gpu_broadcast, gpu_eps, gpu_strided_scores, gpu_deterministic, gpu_outcome_modes,
      gpu_unscorable, gpu_nan_arithmetic, gpu_large_shapes, gpu_second_process_loads_from_disk));
  return s;
}

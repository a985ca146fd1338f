/* test_linear_divergence.c - rlk_linear_divergence, its backward and the vocab-parallel combine
 * against the fp64 reference (tests/ref/linear_divergence_ref.c): every divergence (forward KL,
 * reverse KL, JSD, the teacher's top-k) on the host backend at small and odd shapes, both
 * temperatures, ignored rows, padded rows, mixed dtypes, teacher logits of -inf (top-k over fewer
 * finite ones than k, rows with none); the gradients of both heads (f32 and
 * 16-bit, overwritten and accumulated) against the reference, whose own gradients are checked by
 * finite differences; the loss through rlk_policy_loss's aggregations; the shard form against the
 * whole head; argument checks; the precompile plan and samples on every target; and with
 * RLK_TEST_GPU=1 the GPU kernels against fp64: on an sm_90 device the wgmma kernels wherever tensor
 * maps describe the heads and the portable ones beside them (the tiled variant, and heads whose
 * rows no tensor map takes). The GPU cases' inputs lie on a grid whose products sum exactly in f32
 * on either path, so that what their bounds leave room for is the fold of exponentials, dz and
 * the gradients' sums. Outputs are poisoned before each call and every element is checked against
 * a bound derived from the arithmetic that produced it. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/linear_divergence_plan.h"
#include "ops/ops.h"
#include "ref/linear_divergence_ref.h"
#include "suites.h"
#include "test_util.h"

#define LD_U 0x1p-24 /* f32's unit roundoff */

typedef struct ld_case {
  int64_t N, V, Hs, Ht;
  rlk_dtype sdt, tdt;
  int64_t pad;     /* row padding of every hidden and weight matrix */
  int mode;        /* rlk_divergence_mode */
  double beta;
  int top_k;
  float Ts, Tt;
  rlk_dtype ldt;   /* labels: RLK_I32, RLK_I64, or RLK_DTYPE_INVALID for none */
  int64_t lstride;
  int ignored;     /* every fifth row's label is ignore_index */
  double scale;    /* the logits' spread */
  int grid;        /* inputs on ld_grid_step's grid: every logit exact in f32 */
  int splits;      /* the forward's vocabulary splits (0: the call's choice) */
  rlk_linear_logprob_variant variant;
  int tail;        /* on the grid: the last tile's columns (V mod 256) carry most of every row's mass */
  int t_finite;    /* > 0: every teacher logit -inf but at this many columns (ld_teacher_mask) */
  int t_void;      /* every fourth row's teacher logits all -inf (ld_teacher_mask) */
} ld_case;

static ld_case ld_base(int64_t N, int64_t V, int64_t Hs, int64_t Ht, int mode) {
  return (ld_case){.N = N, .V = V, .Hs = Hs, .Ht = Ht, .sdt = RLK_BF16, .tdt = RLK_BF16, .mode = mode,
      .beta = 0.5, .Ts = 1.0f, .Tt = 1.0f, .ldt = RLK_DTYPE_INVALID, .scale = 2.0};
}

/* ---------------------------------------------------------------------------------- */
/* Inputs and buffers                                                                  */
/* ---------------------------------------------------------------------------------- */

/* A case's inputs: the 16-bit matrices (padded rows) on ctx, their values as fp64, the labels. */
typedef struct ld_data {
  int64_t shs, sws, ths, tws, ls;
  uint16_t *sh, *sw, *th, *tw; /* host copies */
  double *hs, *ws, *ht, *wt;   /* the stored values, dense */
  void *d_sh, *d_sw, *d_th, *d_tw, *d_lab;
  int *ignored;
  ld_ref_problem p;
} ld_data;

static void ld_fill(rlk_dtype dt, int64_t rows, int64_t cols, int64_t stride, double sd, uint64_t *rng, uint16_t **buf,
                    double **dense) {
  *buf = malloc((size_t)(rows * stride) * 2);
  *dense = malloc((size_t)(rows * cols) * sizeof(double));
  ck_assert(*buf && *dense);
  memset(*buf, 0x7f, (size_t)(rows * stride) * 2); /* padding: huge values that must not be read */
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      (*dense)[r * cols + c] = rlk_test_store(*buf, dt, r * stride + c, sd * rlk_test_rand_normal(rng));
}

/* The grid: hidden a / 4 and weight b step (a, b integers, |a| <= 7, |b| <= 63, step a power of
 * two), so that every product of a logit is a multiple of step / 4 of at most 441 step / 4 and
 * every partial sum one below 441 H step / 4: f32 holds them exactly while 441 H < 2^20 (four bits
 * to spare below 2^24 for an accumulator that aligns its addends and keeps fewer), in any order
 * and under any truncation, on the CUDA cores and the tensor cores alike. step puts the logits'
 * spread near `scale` (a / 4's deviation 1.08, b's 36.7); both are 16-bit values (b step is a
 * normal f16 number for these H). */
static double ld_grid_step(int64_t H, double scale) {
  ck_assert_msg(441 * H < (1 << 20), "H %lld: the grid's sums would not stay exact", (long long)H);
  return exp2(round(log2(scale / (sqrt((double)H) * 1.08 * 36.7))));
}

/* A grid matrix as ld_fill makes a Gaussian one: weights (step > 0) b step, hidden (step 0) a / 4. */
static void ld_fill_grid(rlk_dtype dt, int64_t rows, int64_t cols, int64_t stride, double step, uint64_t *rng,
                         uint16_t **buf, double **dense) {
  *buf = malloc((size_t)(rows * stride) * 2);
  *dense = malloc((size_t)(rows * cols) * sizeof(double));
  ck_assert(*buf && *dense);
  memset(*buf, 0x7f, (size_t)(rows * stride) * 2);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      const double v = step > 0 ? (double)((int)(rlk_test_rand_u64(rng) % 127u) - 63) * step
                                : (double)((int)(rlk_test_rand_u64(rng) % 15u) - 7) / 4.0;
      (*dense)[r * cols + c] = rlk_test_store(*buf, dt, r * stride + c, v);
      ck_assert((*dense)[r * cols + c] == v);
    }
}

/* Teacher logits of -inf (probability 0) from infinities in the inputs, with no 0 times inf: with
 * t_finite, teacher weight rows of every column but t_finite random ones start with -inf and every
 * row's first teacher hidden value is positive (a grid value); with t_void, every teacher weight
 * row's second value is positive and rows 2, 6, 10, ... have -inf there (all their logits -inf).
 * The dense copies hold the same infinities: the reference's logits are -inf there too. */
static void ld_teacher_mask(const ld_case *c, ld_data *d, uint64_t *rng) {
  const double step = c->grid ? ld_grid_step(c->Ht, c->scale) : c->scale / sqrt((double)c->Ht);
  if (c->t_finite) {
    ck_assert(c->t_finite <= c->V);
    char *keep = calloc((size_t)c->V, 1);
    ck_assert(keep);
    for (int j = 0; j < c->t_finite;) {
      const int64_t v = (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)c->V);
      if (!keep[v]) keep[v] = 1, j++;
    }
    for (int64_t v = 0; v < c->V; v++)
      if (!keep[v]) d->wt[v * c->Ht] = rlk_test_store(d->tw, c->tdt, v * d->tws, -INFINITY);
    for (int64_t i = 0; i < c->N; i++)
      d->ht[i * c->Ht] = rlk_test_store(d->th, c->tdt, i * d->ths, (double)(1 + (int)(rlk_test_rand_u64(rng) % 7u)) / 4.0);
    free(keep);
  }
  if (c->t_void) {
    ck_assert(c->Ht >= 2);
    for (int64_t v = 0; v < c->V; v++)
      d->wt[v * c->Ht + 1] = rlk_test_store(d->tw, c->tdt, v * d->tws + 1,
                                            (double)(1 + (int)(rlk_test_rand_u64(rng) % 63u)) * step);
    for (int64_t i = 2; i < c->N; i += 4) d->ht[i * c->Ht + 1] = rlk_test_store(d->th, c->tdt, i * d->ths + 1, -INFINITY);
  }
}

static void ld_data_make(rlk_context *ctx, const ld_case *c, uint64_t seed, ld_data *d) {
  memset(d, 0, sizeof *d);
  uint64_t rng = seed;
  d->shs = c->Hs + c->pad, d->sws = c->Hs + c->pad, d->ths = c->Ht + c->pad, d->tws = c->Ht + c->pad;
  if (c->grid) {
    ld_fill_grid(c->sdt, c->N, c->Hs, d->shs, 0.0, &rng, &d->sh, &d->hs);
    ld_fill_grid(c->sdt, c->V, c->Hs, d->sws, ld_grid_step(c->Hs, c->scale), &rng, &d->sw, &d->ws);
    ld_fill_grid(c->tdt, c->N, c->Ht, d->ths, 0.0, &rng, &d->th, &d->ht);
    ld_fill_grid(c->tdt, c->V, c->Ht, d->tws, ld_grid_step(c->Ht, c->scale), &rng, &d->tw, &d->wt);
    if (c->tail) { /* the tile's weights the grid's largest, signed as the rows' sum: logits near 13 */
      const int64_t t0 = c->V - (c->V % 256 ? c->V % 256 : 256);
      for (int side = 0; side < 2; side++) {
        const int64_t H = side ? c->Ht : c->Hs, ws = side ? d->tws : d->sws;
        const double *h = side ? d->ht : d->hs, step = ld_grid_step(H, c->scale);
        double *w = side ? d->wt : d->ws;
        for (int64_t k = 0; k < H; k++) {
          double s = 0.0;
          for (int64_t i = 0; i < c->N; i++) s += h[i * H + k];
          for (int64_t v = t0; v < c->V; v++)
            w[v * H + k] = rlk_test_store(side ? d->tw : d->sw, side ? c->tdt : c->sdt, v * ws + k,
                                          (s < 0 ? -63.0 : 63.0) * step);
        }
      }
    }
  } else {
    /* hidden ~ N(0, 1), weight ~ N(0, scale^2 / H): logits of spread `scale` */
    ld_fill(c->sdt, c->N, c->Hs, d->shs, 1.0, &rng, &d->sh, &d->hs);
    ld_fill(c->sdt, c->V, c->Hs, d->sws, c->scale / sqrt((double)c->Hs), &rng, &d->sw, &d->ws);
    ld_fill(c->tdt, c->N, c->Ht, d->ths, 1.0, &rng, &d->th, &d->ht);
    ld_fill(c->tdt, c->V, c->Ht, d->tws, c->scale / sqrt((double)c->Ht), &rng, &d->tw, &d->wt);
  }
  if (c->t_finite || c->t_void) ld_teacher_mask(c, d, &rng);
  d->ignored = calloc((size_t)c->N, sizeof(int));
  ck_assert(d->ignored);
  d->ls = c->lstride ? c->lstride : 1;
  if (c->ldt != RLK_DTYPE_INVALID) {
    const size_t esz = c->ldt == RLK_I32 ? 4 : 8, lb = (size_t)(c->N * d->ls) * esz;
    char *lab = malloc(lb);
    ck_assert(lab);
    memset(lab, 0x55, lb);
    for (int64_t i = 0; i < c->N; i++) {
      d->ignored[i] = c->ignored && i % 5 == 1;
      const int64_t y = d->ignored[i] ? -100 : (int64_t)(rlk_test_rand_u64(&rng) % (uint64_t)c->V);
      if (c->ldt == RLK_I32)
        ((int32_t *)lab)[i * d->ls] = (int32_t)y;
      else
        ((int64_t *)lab)[i * d->ls] = y;
    }
    d->d_lab = rlk_test_put(ctx, lab, lb);
    free(lab);
  }
  d->d_sh = rlk_test_put(ctx, d->sh, (size_t)(c->N * d->shs) * 2);
  d->d_sw = rlk_test_put(ctx, d->sw, (size_t)(c->V * d->sws) * 2);
  d->d_th = rlk_test_put(ctx, d->th, (size_t)(c->N * d->ths) * 2);
  d->d_tw = rlk_test_put(ctx, d->tw, (size_t)(c->V * d->tws) * 2);
  ld_ref_problem p = {c->N, c->V, c->Hs, c->Ht, d->hs, d->ws, d->ht, d->wt, c->Ts, c->Tt,
                      c->mode, c->beta, c->top_k, d->ignored};
  d->p = p;
}

static void ld_data_free(rlk_context *ctx, ld_data *d) {
  free(d->sh), free(d->sw), free(d->th), free(d->tw), free(d->hs), free(d->ws), free(d->ht), free(d->wt);
  free(d->ignored);
  rlk_test_drop(ctx, d->d_sh), rlk_test_drop(ctx, d->d_sw), rlk_test_drop(ctx, d->d_th), rlk_test_drop(ctx, d->d_tw);
  if (d->d_lab) rlk_test_drop(ctx, d->d_lab);
}

static rlk_tensor ld_mat(void *p, rlk_dtype dt, int64_t rows, int64_t cols, int64_t stride) {
  return rlk_tensor_2d(p, dt, rows, cols, stride);
}

static void ld_fwd_args(const ld_case *c, const ld_data *d, rlk_linear_divergence_args *a) {
  rlk_linear_divergence_args_init(a);
  a->student_hidden = ld_mat(d->d_sh, c->sdt, c->N, c->Hs, d->shs);
  a->student_weight = ld_mat(d->d_sw, c->sdt, c->V, c->Hs, d->sws);
  a->teacher_hidden = ld_mat(d->d_th, c->tdt, c->N, c->Ht, d->ths);
  a->teacher_weight = ld_mat(d->d_tw, c->tdt, c->V, c->Ht, d->tws);
  a->student_temperature = c->Ts;
  a->teacher_temperature = c->Tt;
  a->mode = (rlk_divergence_mode)c->mode;
  a->beta = c->beta;
  a->top_k = c->top_k;
  a->splits = c->splits;
  a->variant = c->variant;
  if (d->d_lab) {
    a->labels = rlk_tensor_1d(d->d_lab, c->ldt, c->N);
    a->labels.strides[0] = d->ls;
  }
}

/* The workspace a call asked for (`size_status` and *bytes: what its workspace_size call
 * returned), poisoned, into *ws and *ws_bytes. */
static void ld_workspace_give(rlk_context *ctx, rlk_status size_status, const size_t *bytes, void **ws,
                              size_t *ws_bytes) {
  ck_assert_msg(size_status == RLK_OK, "%s", rlk_last_error());
  *ws = *bytes ? rlk_test_poisoned(ctx, *bytes) : NULL;
  *ws_bytes = *bytes;
}

/* After a call that used it: waits for the call (on a device), then frees and clears the workspace. */
static void ld_workspace_take_back(rlk_context *ctx, void **ws, size_t *ws_bytes) {
  if (rlk_context_backend(ctx) != RLK_BACKEND_HOST) ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  if (*ws) rlk_test_drop(ctx, *ws);
  *ws = NULL;
  *ws_bytes = 0;
}

/* Runs rlk_linear_divergence (with whatever of a's workspace the call asks for) and waits. */
/* Whether a call since ld_watch(1) ran the portable kernels where the sm_90a ones were planned:
 * the op says so at debug level ("... the portable kernels run"), which a GPU case expecting the
 * wgmma path turns into a failure. */
static int ld_portable_ran;
static void ld_watch_log(rlk_log_level level, const char *message, void *user) {
  (void)level, (void)user;
  if (strstr(message, "linear_divergence") && strstr(message, "portable")) ld_portable_ran = 1;
  else if (level <= RLK_LOG_WARN)
    fprintf(stderr, "rlk: %s\n", message);
}
static void ld_watch(int on) {
  ld_portable_ran = 0;
  rlk_set_log_callback(on ? ld_watch_log : NULL, RLK_LOG_DEBUG, NULL);
}

static void ld_call(rlk_context *ctx, rlk_linear_divergence_args *a) {
  size_t wsb = 0;
  ld_workspace_give(ctx, rlk_linear_divergence_workspace_size(ctx, a, &wsb), &wsb, &a->workspace,
                    &a->workspace_bytes);
  ck_assert_msg(rlk_linear_divergence(ctx, a, NULL) == RLK_OK, "%s", rlk_last_error());
  ld_workspace_take_back(ctx, &a->workspace, &a->workspace_bytes);
}

/* ld_call for rlk_linear_divergence_backward. */
static void ld_call_backward(rlk_context *ctx, rlk_linear_divergence_backward_args *b) {
  size_t wsb = 0;
  ld_workspace_give(ctx, rlk_linear_divergence_backward_workspace_size(ctx, b, &wsb), &wsb, &b->workspace,
                    &b->workspace_bytes);
  ck_assert_msg(rlk_linear_divergence_backward(ctx, b, NULL) == RLK_OK, "%s", rlk_last_error());
  ld_workspace_take_back(ctx, &b->workspace, &b->workspace_bytes);
}

/* ---------------------------------------------------------------------------------- */
/* What the arithmetic allows                                                          */
/* ---------------------------------------------------------------------------------- */

/* A row's magnitude: every quantity its outputs are formed from is at most this in absolute value
 * (a probability-weighted sum of log-probabilities is at most the largest |log p| <= |z| + |lse|). */
static double ld_fin(double x) { return isfinite(x) ? fabs(x) : 0.0; }
static double ld_row_scale(const ld_ref_row *r) {
  /* a row without a teacher distribution (lse_t -inf, D NaN) has no finite output formed from them:
   * the student's are bounded by the rest */
  return 1.0 + 2.0 * r->max_abs_z + fabs(r->lse_s) + ld_fin(r->lse_t) + ld_fin(r->D) + fabs(r->entropy) +
         ld_fin(r->a1) + ld_fin(r->a2);
}

/* The host path's error in an output of row r, beside f32's rounding of the output itself (u |y|):
 * both the kernel and the reference compute in fp64 (differently: the kernel from the raw dot
 * products, the reference through the log-softmax), each rounding at most 2^-53 relative per
 * operation, over sums of at most V + max(Hs, Ht) terms whose magnitudes the row's scale bounds
 * (a dot product's terms by its absolute sum, which the reference's z bounds within a factor the
 * scale's 2^7 spare takes: |h| |w| sums of Gaussian inputs stay within 2^7 of |z| + 1 at these H),
 * and exp / log within an ulp: (V + H + 16) 2^-53 scale x 2^7 x 2 (two computations). */
static double ld_host_bound(const ld_case *c, const ld_ref_row *r, double y) {
  const double n = (double)(c->V + (c->Hs > c->Ht ? c->Hs : c->Ht) + 16);
  return LD_U * fabs(y) + n * 0x1p-53 * ld_row_scale(r) * 0x1p8;
}

/* A logit's error on a GPU (z units): the scaling by log2(e) / T (its rounding and the product's:
 * 2 u |z|) after a dot product of exact 16-bit products in f32, exact on the grid (ld_grid_step).
 * Off the grid, on either path: the portable kernels' sequential fused multiply-adds round to
 * nearest (gamma_H of sum |h w|, gamma_n <= 1.01 n u here); the tensor cores add a block of k >= 2
 * products and the accumulator aligned to the largest and truncated (each at most an ulp of the
 * largest, 2 u of it, and the sum truncated once: (k + 2) 2 u sum |h w| a block), 2 (1 + 2 / k) H u
 * sum |h w| <= 4 H u sum |h w| over the H / k blocks. */
static double ld_logit_error(const ld_case *c, const ld_ref_row *r) {
  const int64_t H = c->Hs > c->Ht ? c->Hs : c->Ht;
  return (c->grid ? 0.0 : 4.0 * (double)H * LD_U * r->abs_dot) + 2.0 * LD_U * r->max_abs_z;
}

/* The relative error of a folded sum on a GPU (s, q, G of a record, JSD's A and B, at any split
 * count; the mixed-sign ones relative to their terms' absolute sum). A fold sums its columns on
 * their own (their additions round relative to the columns' part, and the parts of all folds add
 * up to at most the sum: a chain of n columns costs (n - 1) u of the sum once), then adds them to
 * the rescaled state (an addition, and a rebase: a multiply and ex2.approx's 8 u when the maximum
 * moved: 10 u a fold). The portable kernel: per 256 columns a thread's four folds of 4 values,
 * 40 u, and 3 u once; the lane merges (4 levels). The sm_90a kernel: per 256 columns two folds of
 * 32 values, 20 u, and 31 u once; the lane merges (2 levels). Then the splits' merge in order (S)
 * and the lane merges: a rebase and an addition each, 11 u; the conversion to natural units and
 * the combine's rescaling (ex2.approx of d log2(e)): 16 u; each term's ex2.approx and the
 * rounding of its exponent: 8 u + 2 u |y - m| (p-weighted: within the row's scale, counted by
 * the caller). Over S from 1 to the tiles, at most 40 tiles + 31 + 11 (tiles + 4) + 24 u:
 * 64 tiles + 128 u bounds them. */
static double ld_fold_eps(int64_t V) {
  const int64_t tiles = (V + 255) / 256;
  return (64.0 * (double)tiles + 128.0) * LD_U;
}

/* The portable GPU path's error in an output of row r (beside u |y|): each output is a function
 * of the row's logits whose derivatives sum to at most 2 + 2 M over them (M the row's scale:
 * probability-weighted differences of log-probabilities), of folded sums whose relative errors
 * move it by at most M each (D = G / S + ...: |G / S| <= M; lse by the relative error itself;
 * four such sums), and of a few last operations (logf, the differences, JSD's log2 / exp2
 * approximations of each term, 24 u of its terms' absolute sum <= M): 32 u M. */
static double ld_gpu_bound(const ld_case *c, const ld_ref_row *r, double y) {
  const double M = ld_row_scale(r);
  return LD_U * fabs(y) + (2.0 + 2.0 * M) * ld_logit_error(c, r) + 4.0 * M * ld_fold_eps(c->V) + 32.0 * LD_U * M;
}

/* ---------------------------------------------------------------------------------- */
/* The forward                                                                         */
/* ---------------------------------------------------------------------------------- */

typedef struct ld_fwd_out {
  float *D, *stats, *ent;
} ld_fwd_out;

/* Runs the forward on ctx into o (host copies; the caller frees) and, with `bound` (NULL: the host
 * path's), checks every row's outputs against fp64. */
typedef double (*ld_bound_fn)(const ld_case *c, const ld_ref_row *r, double y);

static int ld_sm90_runs(rlk_context *ctx, const ld_case *c, const ld_data *d);

static double ld_run_fwd(rlk_context *ctx, const ld_case *c, const ld_data *d, ld_fwd_out *o, ld_bound_fn bound) {
  const size_t nb = (size_t)c->N * 4, sb = (size_t)c->N * 6 * 4;
  void *dD = rlk_test_poisoned(ctx, nb), *dS = rlk_test_poisoned(ctx, sb), *dE = rlk_test_poisoned(ctx, nb);
  rlk_linear_divergence_args a;
  ld_fwd_args(c, d, &a);
  a.divergence = rlk_tensor_1d(dD, RLK_F32, c->N);
  a.stats = rlk_tensor_2d(dS, RLK_F32, c->N, 6, 6);
  a.entropy = rlk_tensor_1d(dE, RLK_F32, c->N);
  const int want90 = bound && c->variant != RLK_LINEAR_LOGPROB_TILED && ld_sm90_runs(ctx, c, d);
  ld_watch(want90);
  ld_call(ctx, &a);
  const int portable = ld_portable_ran;
  ld_watch(0);
  ck_assert_msg(!want90 || !portable, "mode %d top_k %d N=%lld: the portable forward ran where sm_90a's was expected",
                c->mode, c->top_k, (long long)c->N);
  o->D = malloc(nb), o->stats = malloc(sb), o->ent = malloc(nb);
  rlk_test_get(ctx, o->D, dD, nb), rlk_test_get(ctx, o->stats, dS, sb), rlk_test_get(ctx, o->ent, dE, nb);
  rlk_test_drop(ctx, dD), rlk_test_drop(ctx, dS), rlk_test_drop(ctx, dE);
  const int gpu = bound != NULL;
  if (!bound) bound = ld_host_bound;
  double worst = 0.0;
  for (int64_t i = 0; i < c->N; i++) {
    ld_ref_row r;
    ld_ref_forward_row(&d->p, i, &r);
    if (gpu && c->top_k && !d->ignored[i] && r.topk_gap <= 4.0 * ld_logit_error(c, &r)) {
      /* the k-th and the next teacher logit lie within the f32 logits' error of each other:
       * either may be the set's last member */
      printf("linear_divergence gpu: row %lld's top-k boundary is within rounding (gap %.3g); not compared\n",
             (long long)i, r.topk_gap);
      continue;
    }
    const float *s = o->stats + 6 * i;
    const double got[7] = {o->D[i], s[0], s[1], s[2], s[3], s[4], o->ent[i]};
    const int ign = d->ignored[i], jsd = c->mode == RLK_DIVERGENCE_JSD && !c->top_k, topk = c->top_k > 0;
    /* what each output must hold: the auxiliaries only where the mode has them, 0 elsewhere and on
     * ignored rows */
    const double want[7] = {r.D, r.lse_s, r.lse_t, r.D, (jsd || topk) && !ign ? r.a1 : 0.0,
                            jsd && !ign ? r.a2 : topk && !ign ? r.a2 : 0.0, r.entropy};
    static const char *const names[7] = {"divergence", "lse_s", "lse_t", "stats D", "stats [3]", "stats [4]", "entropy"};
    for (int q = 0; q < 7; q++) {
      if (!isfinite(want[q])) { /* a row without a teacher distribution: its lse_t, D, P, boundary */
        ck_assert_msg(isnan(want[q]) ? isnan(got[q]) : got[q] == want[q],
                      "mode %d top_k %d N=%lld V=%lld row %lld %s: %.9g, fp64 %.9g", c->mode, c->top_k,
                      (long long)c->N, (long long)c->V, (long long)i, names[q], got[q], want[q]);
        continue;
      }
      const double err = fabs(got[q] - want[q]), tol = bound(c, &r, want[q]);
      if (err / tol > worst) worst = err / tol;
      ck_assert_msg(err <= tol, "mode %d top_k %d N=%lld V=%lld row %lld %s: %.9g, fp64 %.9g, bound %.3g", c->mode,
                    c->top_k, (long long)c->N, (long long)c->V, (long long)i, names[q], got[q], want[q], tol);
    }
    const double last = topk && !ign ? (double)r.last : 0.0;
    ck_assert_msg(s[5] == last, "row %lld: the top-k set's last column %g, fp64's %g", (long long)i, (double)s[5], last);
  }
  return worst;
}

static void ld_free_fwd(ld_fwd_out *o) { free(o->D), free(o->stats), free(o->ent); }

static void ld_check_fwd(rlk_context *ctx, const ld_case *c, uint64_t seed) {
  ld_data d;
  ld_data_make(ctx, c, seed, &d);
  ld_fwd_out o;
  const double worst = ld_run_fwd(ctx, c, &d, &o, NULL);
  printf("linear_divergence host mode %d top_k %d N=%lld V=%lld Hs=%lld Ht=%lld: worst err %.2g of its bound\n",
         c->mode, c->top_k, (long long)c->N, (long long)c->V, (long long)c->Hs, (long long)c->Ht, worst);
  ld_free_fwd(&o);
  ld_data_free(ctx, &d);
}

/* Teacher logits of -inf (probability 0, ld_teacher_mask): the top-k set holds the finite ones
 * only, fewer than k where fewer are finite (1, k - 1, k, k + 1 of them with k 8, and k 1 with
 * one), and rows with none get rlk.h's empty set (D and P NaN, boundary (+inf, -1), lse_t -inf);
 * the forward KL over the whole vocabulary adds nothing for them. */
static void ld_check_fwd_masked(rlk_context *ctx, uint64_t seed) {
  static const int finite[] = {1, 7, 8, 9};
  for (size_t f = 0; f < sizeof finite / sizeof *finite; f++) {
    ld_case c = ld_base(11, 61, 12, 16, RLK_DIVERGENCE_FORWARD_KL);
    c.top_k = 8, c.t_finite = finite[f], c.t_void = 1, c.ldt = RLK_I64, c.ignored = 1, c.Tt = 0.8f;
    ld_check_fwd(ctx, &c, seed + f);
  }
  ld_case c = ld_base(6, 40, 8, 8, RLK_DIVERGENCE_FORWARD_KL);
  c.top_k = 1, c.t_finite = 1, c.t_void = 1, c.grid = 1;
  ld_check_fwd(ctx, &c, seed + 10);
  c.top_k = 0, c.t_finite = 5;
  ld_check_fwd(ctx, &c, seed + 11);
}

START_TEST(host_forward) {
  rlk_context *ctx = rlk_test_host_context();
  const uint64_t seed = rlk_test_seed();
  for (int mode = 0; mode < 3; mode++) {
    ld_case c = ld_base(5, 257, 24, 40, mode); /* an odd vocabulary, heads of different widths */
    c.beta = 0.3;
    ld_check_fwd(ctx, &c, seed + (uint64_t)mode);
    c = ld_base(7, 33, 16, 16, mode);
    c.sdt = RLK_F16, c.Ts = 0.7f, c.Tt = 1.3f; /* both temperatures, mixed dtypes */
    c.ldt = RLK_I32, c.lstride = 2, c.ignored = 1, c.pad = 3;
    c.beta = 0.9;
    ld_check_fwd(ctx, &c, seed + 10 + (uint64_t)mode);
  }
  ld_case c = ld_base(6, 301, 20, 28, RLK_DIVERGENCE_FORWARD_KL);
  c.top_k = 5, c.ldt = RLK_I64, c.ignored = 1, c.Tt = 0.5f;
  ld_check_fwd(ctx, &c, seed + 20);
  c.top_k = 32, c.V = 32; /* the whole vocabulary: the exact forward KL */
  ld_check_fwd(ctx, &c, seed + 21);
  c = ld_base(3, 1, 8, 8, RLK_DIVERGENCE_REVERSE_KL); /* one column: every divergence 0 */
  ld_check_fwd(ctx, &c, seed + 22);
  c = ld_base(4, 70, 200, 96, RLK_DIVERGENCE_JSD); /* the GPU cases' grid inputs, f16 among them */
  c.grid = 1, c.sdt = RLK_F16;
  ld_check_fwd(ctx, &c, seed + 23);
  ld_check_fwd_masked(ctx, seed + 30);
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* The backward                                                                        */
/* ---------------------------------------------------------------------------------- */

typedef struct ld_bcase {
  ld_case c;
  rlk_dtype gs, gt;  /* the gradients' dtypes: f32 or the head's; RLK_DTYPE_INVALID: not asked */
  int accumulate;
  int chunk;
  int gpad;          /* the gradients' row padding (0: 1), checked untouched */
} ld_bcase;

static double ld_unit(rlk_dtype d) { return d == RLK_F32 ? LD_U : d == RLK_BF16 ? 0x1p-8 : 0x1p-11; }

/* A gradient [rows, cols] (row stride cols + pad: the padding must stay untouched) against fp64:
 * got = round(old + sum), so |got - (old + ref)| <= bound + u |old + ref| (+ f16's subnormal
 * spacing / 2 = 2^-25), with `bound` ld_ref_backward's per-element bound of the stats' rounding
 * (the fp64 arithmetic of both sides, at most 2^-45 |dz| a term, is inside it: each e(i, v) is at
 * least 4.2 delta (p_s + p_t) |g| L >= 2^-22 |dz| / (2 + |log p_s| + |log p_t| + L)). */
static double ld_grad_tol(rlk_dtype dt, double bnd, double want) {
  return bnd + ld_unit(dt) * fabs(want) + (dt == RLK_F16 ? 0x1p-25 : 0.0) + 1e-300;
}
static double ld_check_grad(const char *what, rlk_dtype dt, const void *got, const double *old, const double *ref,
                            const double *bnd, int64_t rows, int64_t cols, int64_t pad) {
  double worst = 0.0;
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t k = 0; k < cols; k++) {
      const int64_t j = r * (cols + pad) + k;
      const double want = (old ? old[r * cols + k] : 0.0) + ref[r * cols + k];
      const double g = rlk_test_load(got, dt, j);
      const double tol = ld_grad_tol(dt, bnd[r * cols + k], want);
      const double err = fabs(g - want);
      if (err / tol > worst) worst = err / tol;
      ck_assert_msg(err <= tol, "%s [%lld, %lld]: %.9g, fp64 %.9g, bound %.3g", what, (long long)r, (long long)k, g,
                    want, tol);
    }
    for (int64_t k = cols; k < cols + pad; k++) {
      const double v = rlk_test_load(got, dt, r * (cols + pad) + k);
      ck_assert_msg(v == 0.25, "%s row %lld: the padding changed to %g", what, (long long)r, v);
    }
  }
  return worst;
}

/* The host forward's stats (and what the GPU backward's check gives it): fp64 rounded to f32 once, 2^-24 relative (the fp64 part, below 2^-40
 * relative of the row's scale, is inside the 2^-20 spare). */
#define LD_HOST_DELTA (LD_U * (1.0 + 0x1p-20))

/* The bounds' power on a case's data: a backward that left a gradient unwritten (zeros, or the old
 * values where it accumulates), wrote half of it, or left out the last 256 vocabulary columns (a
 * weight gradient's last rows: a tail tile or split) moves some element past twice its bound. */
static void ld_power_check(const char *what, rlk_dtype dt, const double *old, const double *ref, const double *bnd,
                           int64_t rows, int64_t cols, int weight) {
  double all = 0.0, tail = 0.0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < cols; k++) {
      const double want = (old ? old[r * cols + k] : 0.0) + ref[r * cols + k];
      const double m = fabs(ref[r * cols + k]) / ld_grad_tol(dt, bnd[r * cols + k], want);
      all = m > all ? m : all;
      if (r >= rows - 256) tail = m > tail ? m : tail;
    }
  ck_assert_msg(all / 2 > 2, "%s: halving the gradient moves no element by more than twice its bound (%.3g)", what,
                all / 2);
  if (weight)
    ck_assert_msg(tail > 2, "%s: leaving out the last 256 columns moves no element by more than twice its bound (%.3g)",
                  what, tail);
}

/* A gradient buffer [rows, cols + pad] of dtype dt: 0.25 in the padding, random old values where
 * the call accumulates (kept in *old), poison where it overwrites. */
static void *ld_grad_buf(rlk_context *ctx, rlk_dtype dt, int64_t rows, int64_t cols, int64_t pad, int accumulate,
                         uint64_t *rng, double **old) {
  const size_t es = rlk_dtype_size(dt), bytes = (size_t)(rows * (cols + pad)) * es;
  void *h = malloc(bytes);
  ck_assert(h);
  memset(h, 0xff, bytes);
  *old = accumulate ? malloc((size_t)(rows * cols) * sizeof(double)) : NULL;
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t k = cols; k < cols + pad; k++) rlk_test_store(h, dt, r * (cols + pad) + k, 0.25);
    if (accumulate)
      for (int64_t k = 0; k < cols; k++)
        (*old)[r * cols + k] = rlk_test_store(h, dt, r * (cols + pad) + k, 0.01 * rlk_test_rand_normal(rng));
  }
  void *p = rlk_test_put(ctx, h, bytes);
  free(h);
  return p;
}

/* Whether a GPU backward of this case runs the sm_90a kernels: an sm_90 device (the op's target is
 * sm_90a there) and every head's rows 16-byte aligned (the buffers are). */
static int ld_sm90_runs(rlk_context *ctx, const ld_case *c, const ld_data *d) {
  rlk_device_info info;
  (void)c;
  if (rlk_context_backend(ctx) != RLK_BACKEND_CUDA || rlk_context_device_info(ctx, &info) != RLK_OK ||
      info.compute_major != 9)
    return 0;
  return (d->shs * 2) % 16 == 0 && (d->sws * 2) % 16 == 0 && (d->ths * 2) % 16 == 0 && (d->tws * 2) % 16 == 0;
}

/* The stats a GPU backward reads and its tolerances (delta, dz_rel of ld_ref_backward): fp64's
 * stats rounded to f32 (LD_HOST_DELTA relative, of the row's L >= 1 + |lse_s| + |lse_t| + |D| as
 * ld_ref_backward takes it), but top-k's set boundary ([4], [5]) the forward's (fwd_stats), so that
 * the set the backward recomputes is the kernel's own (the forward's check compared it with
 * fp64's); the backward's own logits within ld_logit_error and its ex2.approx within 8 u of each
 * probability (absolute: over L). The portable kernels store dz in f32 (u) and sum its exact
 * products with f32 fused multiply-adds over at most N + V terms (gamma); the sm_90a ones round dz
 * to its head's 16 bits (u16 of the stored value, whose own error the (1 + u16) on delta covers)
 * and sum its exact 16-bit products on the tensor cores (4 n u of the terms' absolute sum,
 * ld_logit_error's argument) and each chunk's part into the f32 sum (an addition a chunk, fewer
 * than V). */
static void ld_gpu_bwd_stats(const ld_case *c, const ld_data *d, const float *fwd_stats, int sm90, float *bstats,
                             double *delta, double *dz_rel) {
  const int jsd = c->mode == RLK_DIVERGENCE_JSD && !c->top_k;
  for (int64_t i = 0; i < c->N; i++) {
    ld_ref_row r;
    ld_ref_forward_row(&d->p, i, &r);
    const double L = 1.0 + fabs(r.lse_s) + fabs(r.lse_t) + fabs(r.D);
    const double x = LD_HOST_DELTA + (ld_logit_error(c, &r) + 8.0 * LD_U) / L;
    *delta = x > *delta ? x : *delta;
    float *s = bstats + 6 * i;
    const int ign = d->ignored[i];
    s[0] = (float)r.lse_s, s[1] = (float)r.lse_t, s[2] = ign ? 0.0f : (float)r.D;
    s[3] = (jsd || c->top_k) && !ign ? (float)r.a1 : 0.0f;
    s[4] = c->top_k ? fwd_stats[6 * i + 4] : jsd && !ign ? (float)r.a2 : 0.0f;
    s[5] = c->top_k ? fwd_stats[6 * i + 5] : 0.0f;
  }
  const double u16 = !sm90 ? 0.0 : c->sdt == RLK_BF16 || c->tdt == RLK_BF16 ? 0x1p-8 : 0x1p-11;
  *delta *= 1.0 + u16;
  *dz_rel = sm90 ? u16 + 4.04 * (double)(c->N + c->V + 2) * LD_U : 1.01 * (double)(c->N + c->V + 2) * LD_U;
}

/* The forward's stats and the backward of sum_i g_i D_i on ctx, every gradient asked for checked
 * (and the bounds' power on the case's data: ld_power_check); delta bounds the relative error of
 * the stats the backward reads (ld_ref_backward). On a GPU (gpu) the backward is checked on its own:
 * it reads fp64's stats rounded to f32 rather than the forward's (checked within the forward's
 * bound, which would swamp the backward's), and delta is computed here. */
static void ld_check_bwd(rlk_context *ctx, const ld_bcase *b, uint64_t seed, double delta, int gpu) {
  const ld_case *c = &b->c;
  const int64_t gpad = b->gpad ? b->gpad : 1;
  ld_data d;
  ld_data_make(ctx, c, seed, &d);
  ld_fwd_out o;
  ld_run_fwd(ctx, c, &d, &o, gpu ? ld_gpu_bound : NULL);
  const int sm90 = gpu && ld_sm90_runs(ctx, c, &d);
  double dz_rel = 0.0;
  float *bstats = o.stats; /* what the backward reads */
  if (gpu) {
    bstats = malloc((size_t)c->N * 6 * sizeof(float));
    ld_gpu_bwd_stats(c, &d, o.stats, sm90, bstats, &delta, &dz_rel);
  }
  uint64_t rng = seed ^ 0xbadu;
  double *g = malloc((size_t)c->N * sizeof(double));
  float *gf = malloc((size_t)c->N * 2 * sizeof(float)); /* stride 2 */
  for (int64_t i = 0; i < c->N; i++) {
    gf[2 * i] = (float)(0.5 + rlk_test_rand_uniform(&rng));
    gf[2 * i + 1] = NAN;
    g[i] = gf[2 * i];
  }
  void *dS = rlk_test_put(ctx, bstats, (size_t)c->N * 6 * 4), *dG = rlk_test_put(ctx, gf, (size_t)c->N * 8);
  rlk_linear_divergence_backward_args a;
  rlk_linear_divergence_backward_args_init(&a);
  rlk_linear_divergence_args f;
  ld_fwd_args(c, &d, &f);
  a.student_hidden = f.student_hidden, a.student_weight = f.student_weight;
  a.teacher_hidden = f.teacher_hidden, a.teacher_weight = f.teacher_weight;
  a.student_temperature = c->Ts, a.teacher_temperature = c->Tt, a.mode = f.mode, a.beta = c->beta, a.top_k = c->top_k;
  a.labels = f.labels;
  a.stats = rlk_tensor_2d(dS, RLK_F32, c->N, 6, 6);
  a.grad_divergence = rlk_tensor_1d(dG, RLK_F32, c->N);
  a.grad_divergence.strides[0] = 2;
  a.accumulate = b->accumulate;
  a.chunk = b->chunk;
  double *old[4] = {NULL, NULL, NULL, NULL};
  void *buf[4] = {NULL, NULL, NULL, NULL};
  const int64_t rows[4] = {c->N, c->V, c->N, c->V}, cols[4] = {c->Hs, c->Hs, c->Ht, c->Ht};
  const rlk_dtype gdt[4] = {b->gs, b->gs, b->gt, b->gt};
  rlk_tensor *out[4] = {&a.grad_student_hidden, &a.grad_student_weight, &a.grad_teacher_hidden, &a.grad_teacher_weight};
  for (int q = 0; q < 4; q++) {
    if (gdt[q] == RLK_DTYPE_INVALID) continue;
    buf[q] = ld_grad_buf(ctx, gdt[q], rows[q], cols[q], gpad, b->accumulate, &rng, &old[q]);
    *out[q] = rlk_tensor_2d(buf[q], gdt[q], rows[q], cols[q], cols[q] + gpad);
  }
  ld_watch(sm90);
  ld_call_backward(ctx, &a);
  const int portable = ld_portable_ran;
  ld_watch(0);
  ck_assert_msg(!sm90 || !portable, "mode %d N=%lld: the portable backward ran where sm_90a's was expected", c->mode,
                (long long)c->N);
  double *ref[4], *bnd[4];
  for (int q = 0; q < 4; q++) {
    ref[q] = calloc((size_t)(rows[q] * cols[q]), sizeof(double));
    bnd[q] = calloc((size_t)(rows[q] * cols[q]), sizeof(double));
  }
  ld_ref_backward(&d.p, g, ref[0], ref[1], ref[2], ref[3], delta, dz_rel, bnd[0], bnd[1], bnd[2], bnd[3]);
  if (sm90) {
    /* an f16 dz below f16's normal range rounds to its subnormals' spacing: 2^-25 absolute an element
     * (ignored rows' dz is exactly 0), through |w| into grad_hidden and |h| into grad_weight */
    const int f16[2] = {c->sdt == RLK_F16, c->tdt == RLK_F16};
    const double *hh[2] = {d.hs, d.ht}, *ww[2] = {d.ws, d.wt};
    for (int side = 0; side < 2; side++) {
      if (!f16[side]) continue;
      const int64_t H = side ? c->Ht : c->Hs;
      for (int64_t k = 0; k < H; k++) {
        double sw = 0.0, sh = 0.0;
        for (int64_t v = 0; v < c->V; v++) sw += fabs(ww[side][v * H + k]);
        for (int64_t i = 0; i < c->N; i++) sh += d.ignored[i] ? 0.0 : fabs(hh[side][i * H + k]);
        for (int64_t i = 0; i < c->N; i++) bnd[2 * side][i * H + k] += 0x1p-25 * sw;
        for (int64_t v = 0; v < c->V; v++) bnd[2 * side + 1][v * H + k] += 0x1p-25 * sh;
      }
    }
  }
  static const char *const names[4] = {"grad_student_hidden", "grad_student_weight", "grad_teacher_hidden",
                                       "grad_teacher_weight"};
  double worst = 0.0;
  for (int q = 0; q < 4; q++) {
    if (!buf[q]) continue;
    const size_t bytes = (size_t)(rows[q] * (cols[q] + gpad)) * rlk_dtype_size(gdt[q]);
    void *h = malloc(bytes);
    rlk_test_get(ctx, h, buf[q], bytes);
    const double w = ld_check_grad(names[q], gdt[q], h, old[q], ref[q], bnd[q], rows[q], cols[q], gpad);
    worst = w > worst ? w : worst;
    ld_power_check(names[q], gdt[q], old[q], ref[q], bnd[q], rows[q], cols[q], q % 2);
    free(h);
    rlk_test_drop(ctx, buf[q]);
  }
  printf("linear_divergence %s backward mode %d top_k %d N=%lld V=%lld: worst err %.2g of its bound\n",
         rlk_context_backend(ctx) == RLK_BACKEND_HOST ? "host" : sm90 ? "gpu sm_90a" : "gpu portable", c->mode,
         c->top_k, (long long)c->N, (long long)c->V, worst);
  for (int q = 0; q < 4; q++) free(ref[q]), free(bnd[q]), free(old[q]);
  rlk_test_drop(ctx, dS), rlk_test_drop(ctx, dG);
  free(g), free(gf);
  if (bstats != o.stats) free(bstats);
  ld_free_fwd(&o);
  ld_data_free(ctx, &d);
}

START_TEST(host_backward) {
  rlk_context *ctx = rlk_test_host_context();
  const uint64_t seed = rlk_test_seed();
  for (int mode = 0; mode < 3; mode++) {
    ld_bcase b = {ld_base(5, 67, 12, 20, mode), RLK_F32, RLK_F32, 0, 0};
    b.c.beta = 0.25, b.c.Ts = 0.8f, b.c.Tt = 1.5f, b.c.ldt = RLK_I64, b.c.ignored = 1;
    ld_check_bwd(ctx, &b, seed + (uint64_t)mode, LD_HOST_DELTA, 0);
    /* 16-bit gradients added to, the teacher's only */
    b.c.sdt = RLK_F16;
    b.gs = RLK_DTYPE_INVALID, b.gt = RLK_BF16, b.accumulate = 1;
    ld_check_bwd(ctx, &b, seed + 10 + (uint64_t)mode, LD_HOST_DELTA, 0);
  }
  ld_bcase b = {ld_base(6, 129, 16, 16, RLK_DIVERGENCE_FORWARD_KL), RLK_BF16, RLK_F32, 1, 0};
  b.c.top_k = 7, b.c.pad = 2, b.c.ldt = RLK_I32, b.c.ignored = 1;
  ld_check_bwd(ctx, &b, seed + 20, LD_HOST_DELTA, 0);
  /* top-k with fewer finite teacher logits than k (the rest -inf): no -inf column is a member; the
   * student's gradients (the teacher's weights hold -inf, whose own gradients are 0 times inf) */
  b = (ld_bcase){ld_base(6, 129, 16, 16, RLK_DIVERGENCE_FORWARD_KL), RLK_F32, RLK_DTYPE_INVALID, 0, 0};
  b.c.top_k = 7, b.c.t_finite = 5, b.c.ldt = RLK_I64, b.c.ignored = 1;
  ld_check_bwd(ctx, &b, seed + 21, LD_HOST_DELTA, 0);
  rlk_context_destroy(ctx);
}
END_TEST

/* The reference's gradients are those of its divergences: central differences of sum_i g_i D_i
 * with step e, beside the wider stencil's (2 e): both differ from the derivative by e^2 f''' / 6
 * and 4 e^2 f''' / 6 (+ higher orders), so |d1 - f'| is about |d2 - d1| / 3, and |d2 - d1| bounds
 * it with room for the next orders; f's own fp64 error (2^-52 (V + H + 8) sum_i |g_i| scale_i, a
 * difference quotient turns it into that over e) adds to it. */
START_TEST(reference_gradients) {
  uint64_t rng = rlk_test_seed();
  const int64_t N = 3, V = 23, Hs = 5, Ht = 4;
  double hs[N * Hs], ws[V * Hs], ht[N * Ht], wt[V * Ht], g[N];
  for (size_t i = 0; i < N * Hs; i++) hs[i] = rlk_test_rand_normal(&rng);
  for (size_t i = 0; i < V * Hs; i++) ws[i] = rlk_test_rand_normal(&rng);
  for (size_t i = 0; i < N * Ht; i++) ht[i] = rlk_test_rand_normal(&rng);
  for (size_t i = 0; i < V * Ht; i++) wt[i] = rlk_test_rand_normal(&rng);
  for (int64_t i = 0; i < N; i++) g[i] = 0.5 + rlk_test_rand_uniform(&rng);
  static const struct {
    int mode, top_k;
    double beta;
  } modes[] = {{0, 0, 0.5}, {1, 0, 0.5}, {2, 0, 0.2}, {2, 0, 0.7}, {0, 4, 0.5}};
  for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
    ld_ref_problem p = {N, V, Hs, Ht, hs, ws, ht, wt, 0.9, 1.2, modes[m].mode, modes[m].beta, modes[m].top_k, NULL};
    double dh[N * Hs], dw[V * Hs], dht[N * Ht], dwt[V * Ht];
    ld_ref_backward(&p, g, dh, dw, dht, dwt, 0.0, 0.0, NULL, NULL, NULL, NULL);
    double scale = 0.0;
    for (int64_t i = 0; i < N; i++) {
      ld_ref_row r;
      ld_ref_forward_row(&p, i, &r);
      scale += fabs(g[i]) * (1.0 + 2.0 * r.max_abs_z + fabs(r.lse_s) + fabs(r.lse_t));
    }
    const double rho = 0x1p-52 * (double)(V + Hs + Ht + 8) * scale;
    double *x[4] = {hs, ws, ht, wt}, *an[4] = {dh, dw, dht, dwt};
    const int64_t n[4] = {N * Hs, V * Hs, N * Ht, V * Ht};
    double worst = 0.0;
    for (int q = 0; q < 4; q++)
      for (int64_t j = 0; j < n[q]; j += q == 1 || q == 3 ? 3 : 1) {
        const double x0 = x[q][j], e = 1e-4 * (1.0 + fabs(x0));
        double f[4];
        const double steps[4] = {-2 * e, -e, e, 2 * e};
        for (int s = 0; s < 4; s++) {
          x[q][j] = x0 + steps[s];
          f[s] = ld_ref_loss(&p, g);
        }
        x[q][j] = x0;
        const double d1 = (f[2] - f[1]) / (2 * e), d2 = (f[3] - f[0]) / (4 * e);
        const double tol = fabs(d2 - d1) + 4 * rho / e + 1e-300;
        if (fabs(d1 - an[q][j]) / tol > worst) worst = fabs(d1 - an[q][j]) / tol;
        ck_assert_msg(fabs(d1 - an[q][j]) <= tol, "mode %d top_k %d operand %d element %lld: analytic %.12g, "
                      "central difference %.12g (wider %.12g)", modes[m].mode, modes[m].top_k, q, (long long)j,
                      an[q][j], d1, d2);
      }
    printf("linear_divergence reference mode %d top_k %d beta %g: gradients vs finite differences, worst %.2g of the "
           "bound\n", modes[m].mode, modes[m].top_k, modes[m].beta, worst);
  }
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* The loss                                                                            */
/* ---------------------------------------------------------------------------------- */

/* loss = agg(D) through rlk_policy_loss, against fp64 sums of the call's own D: token-mean over
 * a [B, T] mask, seq-mean-token-mean, and packed sequences with token-sum; the loss (an f32 of
 * f64 partial sums of f32 terms w D, w the aggregation's weight) within 4 u sum |w D| + u |loss|,
 * the gradient w (one f32 multiply of f32 factors) within 2 u |w|. */
START_TEST(host_loss) {
  rlk_context *ctx = rlk_test_host_context();
  const uint64_t seed = rlk_test_seed();
  const int64_t B = 3, T = 4, N = B * T;
  ld_case c = ld_base(N, 41, 8, 12, RLK_DIVERGENCE_REVERSE_KL);
  ld_data d;
  ld_data_make(ctx, &c, seed, &d);
  uint8_t mask[N];
  for (int64_t i = 0; i < N; i++) mask[i] = (uint8_t)(i % 3 != 2);
  mask[T] = mask[T + 1] = mask[T + 2] = mask[T + 3] = 0; /* an empty row */
  const int32_t offs[4] = {0, 5, 5, N};                  /* packed: an empty sequence */
  for (int form = 0; form < 3; form++) {
    const size_t nb = (size_t)N * 4;
    void *dD = rlk_test_poisoned(ctx, nb), *dS = rlk_test_poisoned(ctx, nb * 6), *dL = rlk_test_poisoned(ctx, 4),
         *dG = rlk_test_poisoned(ctx, nb);
    void *dM = rlk_test_put(ctx, mask, sizeof mask), *dO = rlk_test_put(ctx, offs, sizeof offs);
    rlk_linear_divergence_args a;
    ld_fwd_args(&c, &d, &a);
    a.divergence = rlk_tensor_1d(dD, RLK_F32, N);
    a.stats = rlk_tensor_2d(dS, RLK_F32, N, 6, 6);
    a.loss = rlk_tensor_1d(dL, RLK_F32, 1);
    a.grad_divergence = rlk_tensor_1d(dG, RLK_F32, N);
    a.loss_scale = 0.5;
    if (form == 0) {
      a.mask = rlk_tensor_2d(dM, RLK_BOOL, B, T, T);
      a.agg = RLK_AGG_TOKEN_MEAN;
    } else if (form == 1) {
      a.mask = rlk_tensor_2d(dM, RLK_BOOL, B, T, T);
      a.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
    } else {
      a.seq_offsets = rlk_tensor_1d(dO, RLK_I32, 4);
      a.agg = RLK_AGG_TOKEN_SUM;
    }
    ld_call(ctx, &a);
    float D[N], G[N], L;
    rlk_test_get(ctx, D, dD, nb), rlk_test_get(ctx, G, dG, nb), rlk_test_get(ctx, &L, dL, 4);
    double w[N], want = 0.0, mag = 0.0, count = 0.0;
    for (int64_t i = 0; i < N; i++) count += mask[i];
    for (int64_t i = 0; i < N; i++) {
      const int64_t b = i / T;
      double n = 0.0;
      for (int64_t t = 0; t < T; t++) n += mask[b * T + t];
      w[i] = form == 0 ? (mask[i] ? 1.0 / count : 0.0)
             : form == 1 ? (mask[i] ? 1.0 / (n * B) : 0.0)
                         : 1.0;
      w[i] *= 0.5;
      want += w[i] * D[i];
      mag += fabs(w[i] * D[i]);
    }
    ck_assert_msg(fabs(L - want) <= 4 * LD_U * mag + LD_U * fabs(want), "form %d: loss %.9g, fp64 %.9g", form,
                  (double)L, want);
    for (int64_t i = 0; i < N; i++)
      ck_assert_msg(fabs(G[i] - w[i]) <= 2 * LD_U * fabs(w[i]), "form %d token %lld: grad_divergence %.9g, weight %.9g",
                    form, (long long)i, (double)G[i], w[i]);
    rlk_test_drop(ctx, dD), rlk_test_drop(ctx, dS), rlk_test_drop(ctx, dL), rlk_test_drop(ctx, dG),
        rlk_test_drop(ctx, dM), rlk_test_drop(ctx, dO);
  }
  ld_data_free(ctx, &d);
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* The shard form                                                                      */
/* ---------------------------------------------------------------------------------- */

/* The vocabulary cut at cuts[0..P] (uneven shards, one of one column): each shard's records from
 * rows [v0, v1) of both weights, gathered in rank order and combined, against the whole head's fp64
 * outputs; then each shard's backward (shard 1, the combined stats) summed over the shards
 * (grad_hidden) and laid side by side (grad_weight rows) against the whole head's gradients. The
 * records round each field to f32 (2^-24 relative of m, s, the entropy's part and G), which the
 * combine's rescaling carries into lse (u (|m| + 1)) and G / S (relative 2 u, plus the maxima's
 * errors times |z_t - z_s| <= 2 max |z|): the outputs within 16 u scale^2 of fp64, and the stats
 * the backward reads within that relative bound (delta = 16 u scale). */
static void ld_shard_check(rlk_context *ctx, int mode, const int64_t *cuts, int P, int64_t Hs, int64_t Ht,
                           uint64_t seed) {
  ld_case c = ld_base(7, cuts[P], Hs, Ht, mode);
  const int gpu = rlk_context_backend(ctx) != RLK_BACKEND_HOST;
  c.ldt = RLK_I64, c.ignored = 1, c.Ts = 1.3f, c.grid = gpu;
  ld_data d;
  ld_data_make(ctx, &c, seed, &d);
  const int64_t N = c.N;
  const int sm90 = gpu && ld_sm90_runs(ctx, &c, &d);
  float *all = malloc((size_t)(P * N * 8) * 4);
  for (int r = 0; r < P; r++) {
    void *dR = rlk_test_poisoned(ctx, (size_t)(N * 8) * 4);
    rlk_linear_divergence_args a;
    ld_fwd_args(&c, &d, &a);
    const int64_t v0 = cuts[r], Vs = cuts[r + 1] - cuts[r];
    a.student_weight = ld_mat((char *)d.d_sw + (size_t)(v0 * d.sws) * 2, c.sdt, Vs, c.Hs, d.sws);
    a.teacher_weight = ld_mat((char *)d.d_tw + (size_t)(v0 * d.tws) * 2, c.tdt, Vs, c.Ht, d.tws);
    a.partials = rlk_tensor_2d(dR, RLK_F32, N, 8, 8);
    a.vocab_start = v0;
    ld_watch(sm90);
    ld_call(ctx, &a);
    const int portable = ld_portable_ran;
    ld_watch(0);
    ck_assert_msg(!portable, "shard %d: the portable forward ran where sm_90a's was expected", r);
    rlk_test_get(ctx, all + (size_t)(r * N * 8), dR, (size_t)(N * 8) * 4);
    rlk_test_drop(ctx, dR);
  }
  void *dP = rlk_test_put(ctx, all, (size_t)(P * N * 8) * 4);
  void *dD = rlk_test_poisoned(ctx, (size_t)N * 4), *dS = rlk_test_poisoned(ctx, (size_t)N * 24),
       *dE = rlk_test_poisoned(ctx, (size_t)N * 4);
  rlk_linear_divergence_combine_args k;
  rlk_linear_divergence_combine_args_init(&k);
  k.partials = (rlk_tensor){dP, RLK_F32, 3, {P, N, 8}, {N * 8, 8, 1}};
  k.mode = (rlk_divergence_mode)mode;
  k.labels = rlk_tensor_1d(d.d_lab, RLK_I64, N);
  k.divergence = rlk_tensor_1d(dD, RLK_F32, N);
  k.stats = rlk_tensor_2d(dS, RLK_F32, N, 6, 6);
  k.entropy = rlk_tensor_1d(dE, RLK_F32, N);
  ck_assert_msg(rlk_linear_divergence_combine(ctx, &k, NULL) == RLK_OK, "%s", rlk_last_error());
  if (rlk_context_backend(ctx) != RLK_BACKEND_HOST) ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  float D[64], S[64 * 6], E[64];
  rlk_test_get(ctx, D, dD, (size_t)N * 4), rlk_test_get(ctx, S, dS, (size_t)N * 24),
      rlk_test_get(ctx, E, dE, (size_t)N * 4);
  double zmax = 0.0;
  for (int64_t i = 0; i < N; i++) {
    ld_ref_row r;
    ld_ref_forward_row(&d.p, i, &r);
    const double sc = ld_row_scale(&r);
    zmax = sc > zmax ? sc : zmax;
    const double got[5] = {D[i], S[6 * i], S[6 * i + 1], S[6 * i + 2], E[i]};
    const double want[5] = {r.D, r.lse_s, r.lse_t, r.D, r.entropy};
    for (int q = 0; q < 5; q++) {
      const double tol = 16 * LD_U * sc * sc + (gpu ? ld_gpu_bound(&c, &r, want[q]) : 0.0);
      ck_assert_msg(fabs(got[q] - want[q]) <= tol, "%d shards mode %d row %lld output %d: %.9g, fp64 %.9g", P, mode,
                    (long long)i, q, got[q], want[q]);
    }
  }
  /* the backward reads the combined stats on the host (their error bounds it: 16 u scale relative);
   * a GPU's reads fp64's rounded, as ld_check_bwd's does, so that its own error is what is bounded */
  double delta = 16 * LD_U * zmax, dz_rel = 0.0;
  void *dSb = NULL;
  if (gpu) {
    float bstats[64 * 6];
    delta = 0.0;
    ld_gpu_bwd_stats(&c, &d, NULL, sm90, bstats, &delta, &dz_rel);
    dSb = rlk_test_put(ctx, bstats, (size_t)N * 24);
  }
  /* the backward, shard by shard */
  float gf[64];
  double g[64];
  uint64_t rng = seed ^ 0x5eedu;
  for (int64_t i = 0; i < N; i++) g[i] = gf[i] = (float)(0.5 + rlk_test_rand_uniform(&rng));
  void *dG = rlk_test_put(ctx, gf, (size_t)N * 4);
  double *gh = calloc((size_t)(N * c.Hs), sizeof(double)), *gw = calloc((size_t)(c.V * c.Hs), sizeof(double));
  for (int r = 0; r < P; r++) {
    const int64_t v0 = cuts[r], Vs = cuts[r + 1] - cuts[r];
    float *h = malloc((size_t)(N * (c.Hs + 1)) * 4), *w = malloc((size_t)(Vs * (c.Hs + 1)) * 4);
    void *dh = rlk_test_poisoned(ctx, (size_t)(N * (c.Hs + 1)) * 4),
         *dw = rlk_test_poisoned(ctx, (size_t)(Vs * (c.Hs + 1)) * 4);
    rlk_linear_divergence_backward_args b;
    rlk_linear_divergence_backward_args_init(&b);
    rlk_linear_divergence_args f;
    ld_fwd_args(&c, &d, &f);
    b.student_hidden = f.student_hidden, b.teacher_hidden = f.teacher_hidden;
    b.student_weight = ld_mat((char *)d.d_sw + (size_t)(v0 * d.sws) * 2, c.sdt, Vs, c.Hs, d.sws);
    b.teacher_weight = ld_mat((char *)d.d_tw + (size_t)(v0 * d.tws) * 2, c.tdt, Vs, c.Ht, d.tws);
    b.student_temperature = c.Ts, b.teacher_temperature = c.Tt, b.mode = f.mode, b.labels = f.labels;
    b.stats = gpu ? rlk_tensor_2d(dSb, RLK_F32, N, 6, 6) : k.stats, b.grad_divergence = rlk_tensor_1d(dG, RLK_F32, N);
    b.grad_student_hidden = rlk_tensor_2d(dh, RLK_F32, N, c.Hs, c.Hs + 1);
    b.grad_student_weight = rlk_tensor_2d(dw, RLK_F32, Vs, c.Hs, c.Hs + 1);
    b.shard = 1, b.vocab_start = v0;
    ld_watch(sm90);
    ld_call_backward(ctx, &b);
    const int portable = ld_portable_ran;
    ld_watch(0);
    ck_assert_msg(!portable, "shard %d: the portable backward ran where sm_90a's was expected", r);
    rlk_test_get(ctx, h, dh, (size_t)(N * (c.Hs + 1)) * 4), rlk_test_get(ctx, w, dw, (size_t)(Vs * (c.Hs + 1)) * 4);
    for (int64_t i = 0; i < N; i++)
      for (int64_t q = 0; q < c.Hs; q++) gh[i * c.Hs + q] += h[i * (c.Hs + 1) + q];
    for (int64_t v = 0; v < Vs; v++)
      for (int64_t q = 0; q < c.Hs; q++) gw[(v0 + v) * c.Hs + q] = w[v * (c.Hs + 1) + q];
    rlk_test_drop(ctx, dh), rlk_test_drop(ctx, dw);
    free(h), free(w);
  }
  double *rh = malloc((size_t)(N * c.Hs) * sizeof(double)), *rw = malloc((size_t)(c.V * c.Hs) * sizeof(double));
  double *bh = calloc((size_t)(N * c.Hs), sizeof(double)), *bw = calloc((size_t)(c.V * c.Hs), sizeof(double));
  ld_ref_backward(&d.p, g, rh, rw, NULL, NULL, delta, dz_rel, bh, bw, NULL, NULL);
  /* grad_hidden: P f32 parts (each rounded, u |part| <= u sum) added in f64 */
  for (int64_t j = 0; j < N * c.Hs; j++)
    ck_assert_msg(fabs(gh[j] - rh[j]) <= bh[j] + P * LD_U * (fabs(rh[j]) + bh[j]) + 1e-300,
                  "%d shards: grad_student_hidden [%lld]: %.9g, fp64 %.9g", P, (long long)j, gh[j], rh[j]);
  for (int64_t j = 0; j < c.V * c.Hs; j++)
    ck_assert_msg(fabs(gw[j] - rw[j]) <= bw[j] + LD_U * fabs(rw[j]) + 1e-300,
                  "%d shards: grad_student_weight [%lld]: %.9g, fp64 %.9g", P, (long long)j, gw[j], rw[j]);
  printf("linear_divergence %s shards: %d, mode %d, forward and backward against the whole head\n",
         !gpu ? "host" : sm90 ? "gpu sm_90a" : "gpu portable", P, mode);
  if (dSb) rlk_test_drop(ctx, dSb);
  free(gh), free(gw), free(rh), free(rw), free(bh), free(bw), free(all);
  rlk_test_drop(ctx, dG), rlk_test_drop(ctx, dP), rlk_test_drop(ctx, dD), rlk_test_drop(ctx, dS),
      rlk_test_drop(ctx, dE);
  ld_data_free(ctx, &d);
}

START_TEST(host_shards) {
  rlk_context *ctx = rlk_test_host_context();
  const uint64_t seed = rlk_test_seed();
  static const int64_t two[] = {0, 20, 53}, three[] = {0, 1, 30, 61};
  ld_shard_check(ctx, RLK_DIVERGENCE_FORWARD_KL, two, 2, 12, 10, seed);
  ld_shard_check(ctx, RLK_DIVERGENCE_REVERSE_KL, three, 3, 12, 10, seed + 1);
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Arguments, recording, plans                                                         */
/* ---------------------------------------------------------------------------------- */

START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  uint16_t sh[4 * 8], sw[5 * 8], th[4 * 6], tw[5 * 6];
  float D[4], S[24], L[1];
  memset(sh, 0, sizeof sh), memset(sw, 0, sizeof sw), memset(th, 0, sizeof th), memset(tw, 0, sizeof tw);
  rlk_linear_divergence_args a;
  rlk_linear_divergence_args_init(&a);
  ck_assert_float_eq(a.student_temperature, 1.0f);
  ck_assert_int_eq(a.ignore_index, -100);
  ck_assert_int_eq(a.mode, RLK_DIVERGENCE_FORWARD_KL);
  a.student_hidden = rlk_tensor_2d(sh, RLK_BF16, 4, 8, 8);
  a.student_weight = rlk_tensor_2d(sw, RLK_BF16, 5, 8, 8);
  a.teacher_hidden = rlk_tensor_2d(th, RLK_F16, 4, 6, 6);
  a.teacher_weight = rlk_tensor_2d(tw, RLK_F16, 5, 6, 6);
  a.divergence = rlk_tensor_1d(D, RLK_F32, 4);
  a.stats = rlk_tensor_2d(S, RLK_F32, 4, 6, 6);
  /* the host's scratch: a row's logits (16 V bytes), then the loss's; the backward's fp64 sums */
  static _Alignas(16) char ws[4096];
  size_t need = 0;
  ck_assert_int_eq(rlk_linear_divergence(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "workspace") != NULL, "%s", rlk_last_error());
  ck_assert_int_eq(rlk_linear_divergence_workspace_size(ctx, &a, &need), RLK_OK);
  ck_assert_uint_eq(need, 256);
  a.workspace = ws + 8, a.workspace_bytes = sizeof ws - 8; /* misaligned: said as such */
  ck_assert_int_eq(rlk_linear_divergence(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "aligned") != NULL, "%s", rlk_last_error());
  a.workspace = ws, a.workspace_bytes = sizeof ws;
  ck_assert_msg(rlk_linear_divergence(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  static const struct {
    int what;
    const char *needle;
  } bad[] = {{0, "student_weight"}, {1, "teacher_weight"}, {2, "teacher_hidden"}, {3, "student_temperature"},
             {4, "teacher_temperature"}, {5, "mode"}, {6, "beta"}, {7, "top_k"}, {8, "top_k"}, {9, "top_k"},
             {10, "stats"}, {11, "divergence"}, {12, "grad_divergence"}, {13, "vocab_start"}, {14, "partials"},
             {15, "splits"}, {16, "stats"}, {17, "mask"}, {18, "mask"}, {19, "mask"}, {20, "mask"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rlk_linear_divergence_args b = a;
    switch (bad[i].what) {
    case 0: b.student_weight = rlk_tensor_2d(sw, RLK_BF16, 5, 7, 8); break;  /* H differs */
    case 1: b.teacher_weight = rlk_tensor_2d(tw, RLK_BF16, 5, 6, 6); break;  /* dtype differs */
    case 2: b.teacher_hidden = rlk_tensor_2d(th, RLK_F16, 3, 6, 6); break;   /* N differs */
    case 3: b.student_temperature = 0.0f; break;
    case 4: b.teacher_temperature = INFINITY; break;
    case 5: b.mode = (rlk_divergence_mode)3; break;
    case 6: b.mode = RLK_DIVERGENCE_JSD, b.beta = 1.0; break;
    case 7: b.top_k = 33; break;
    case 8: b.top_k = 2, b.mode = RLK_DIVERGENCE_REVERSE_KL; break;
    case 9: b.top_k = 6; break; /* more than V */
    case 10: b.stats.data = NULL; break;
    case 11: b.divergence = rlk_tensor_1d(D, RLK_F32, 3); break;
    case 12: b.grad_divergence = rlk_tensor_1d(D, RLK_F32, 4); break; /* without a loss */
    case 13: b.vocab_start = 3; break;
    case 14: b.partials = rlk_tensor_2d(S, RLK_F32, 4, 8, 8); break; /* with the outputs */
    case 15: b.splits = -1; break;
    case 16: b.stats = rlk_tensor_2d(S, RLK_F32, 4, 5, 6); break;
    case 17: b.loss = rlk_tensor_1d(L, RLK_F32, 1); b.mask = rlk_tensor_2d(sh, RLK_BOOL, 3, 3, 3); break;
    case 18: /* a [N] mask the loss would read as contiguous */
      b.loss = rlk_tensor_1d(L, RLK_F32, 1), b.mask = rlk_tensor_1d(sh, RLK_BOOL, 4), b.mask.strides[0] = 2;
      break;
    case 19: b.loss = rlk_tensor_1d(L, RLK_F32, 1), b.mask = rlk_tensor_1d(sh, RLK_BOOL, 4), b.mask.strides[0] = 0; break;
    case 20: /* [2^32, 2^32] of stride 0: its product overflows */
      b.loss = rlk_tensor_1d(L, RLK_F32, 1), b.mask = rlk_tensor_2d(sh, RLK_BOOL, 1, 1, 0);
      b.mask.shape[0] = b.mask.shape[1] = (int64_t)1 << 32, b.mask.strides[0] = b.mask.strides[1] = 0;
      break;
    }
    ck_assert_msg(rlk_linear_divergence(ctx, &b, NULL) != RLK_OK, "case %zu accepted", i);
    ck_assert_msg(strstr(rlk_last_error(), bad[i].needle) != NULL, "case %zu: '%s' lacks '%s'", i, rlk_last_error(),
                  bad[i].needle);
  }
  /* the backward */
  float g[4] = {1, 1, 1, 1}, gh[4 * 8];
  rlk_linear_divergence_backward_args b0;
  rlk_linear_divergence_backward_args_init(&b0);
  b0.student_hidden = a.student_hidden, b0.student_weight = a.student_weight;
  b0.teacher_hidden = a.teacher_hidden, b0.teacher_weight = a.teacher_weight;
  b0.stats = a.stats, b0.grad_divergence = rlk_tensor_1d(g, RLK_F32, 4);
  b0.grad_student_hidden = rlk_tensor_2d(gh, RLK_F32, 4, 8, 8);
  ck_assert_int_eq(rlk_linear_divergence_backward_workspace_size(ctx, &b0, &need), RLK_OK);
  ck_assert_uint_eq(need, 512); /* (N Hs + N) doubles, 288 bytes, in whole 256 */
  b0.workspace = ws, b0.workspace_bytes = sizeof ws;
  ck_assert_msg(rlk_linear_divergence_backward(ctx, &b0, NULL) == RLK_OK, "%s", rlk_last_error());
  static const struct {
    int what;
    const char *needle;
  } bbad[] = {{0, "give at least one"}, {1, "grad_student_hidden"}, {2, "chunk"}, {3, "accumulate"},
              {4, "vocab_start"}, {5, "shard"}, {6, "grad_divergence"}, {7, "grad_teacher_weight"}};
  for (size_t i = 0; i < sizeof bbad / sizeof bbad[0]; i++) {
    rlk_linear_divergence_backward_args b = b0;
    switch (bbad[i].what) {
    case 0: b.grad_student_hidden.data = NULL; break;
    case 1: b.grad_student_hidden = rlk_tensor_2d(gh, RLK_F16, 4, 8, 8); break; /* not the student's dtype */
    case 2: b.chunk = 100; break;
    case 3: b.accumulate = 2; break;
    case 4: b.vocab_start = 5; break;
    case 5: b.shard = 1, b.mode = RLK_DIVERGENCE_JSD; break;
    case 6: b.grad_divergence.data = NULL; break;
    case 7: b.grad_teacher_weight = rlk_tensor_2d(gh, RLK_F32, 5, 8, 8); break; /* the teacher's H is 6 */
    }
    ck_assert_msg(rlk_linear_divergence_backward(ctx, &b, NULL) != RLK_OK, "backward case %zu accepted", i);
    ck_assert_msg(strstr(rlk_last_error(), bbad[i].needle) != NULL, "backward case %zu: '%s' lacks '%s'", i,
                  rlk_last_error(), bbad[i].needle);
  }
  rlk_context_destroy(ctx);
}
END_TEST

/* RLK_JIT_RECORD: the forward, the backward and the combine each leave a line that precompiles. */
START_TEST(host_records_its_configurations) {
  rlk_context *ctx = rlk_test_recording_host_context();
  if (!ctx) return;
  const uint64_t seed = rlk_test_seed() ^ 0x1dcu;
  ld_bcase b = {ld_base(3, 40, 8, 8, RLK_DIVERGENCE_JSD), RLK_F32, RLK_DTYPE_INVALID, 0, 0};
  b.c.ldt = RLK_I32;
  ld_check_bwd(ctx, &b, seed, LD_HOST_DELTA, 0);
  static const int64_t two[] = {0, 20, 41};
  ld_shard_check(ctx, RLK_DIVERGENCE_FORWARD_KL, two, 2, 12, 10, seed + 1);
  static const char *const want[] = {
      "linear_divergence pass=fwd student=bf16 teacher=bf16 labels=i32 mode=jsd topk=0 shard=0",
      "linear_divergence pass=bwd student=bf16 teacher=bf16 labels=i32 mode=jsd topk=0 grad=f32 teacher_grad=none",
      "linear_divergence pass=fwd student=bf16 teacher=bf16 labels=i64 mode=forward-kl topk=0 shard=1",
      "linear_divergence pass=combine labels=i64 mode=forward-kl", NULL};
  rlk_test_record_expect(ctx, want);
  rlk_context_destroy(ctx);
}
END_TEST

/* Each target's plan: the host's one fp64 kernel a pass; a GPU's tiled GEMM and combine, JSD's
 * second pass and its combine, top-k's set; the backward's dz and the fused head's products. On
 * sm_90a the wgmma kernels first (the forward's two passes in quads, pairs and alone, top-k's in
 * pairs and alone, dz in pairs and alone; per gradient dtype the fused head's sm_90a dh and dw),
 * then the portable ones a call without tensor maps runs; the tiled variant plans the portable
 * ones alone. */
START_TEST(plan_per_target) {
  static const struct {
    rlk_backend backend;
    const char *target;
    const char *line;
    const char *first;
    size_t n;
  } cases[] = {
      {RLK_BACKEND_HOST, NULL, "linear_divergence mode=jsd", "linear_divergence_fwd_host", 2},
      {RLK_BACKEND_CUDA, "sm_90a", "linear_divergence pass=fwd mode=jsd", "linear_divergence_fwd_sm90", 10},
      {RLK_BACKEND_CUDA, "sm_90a", "linear_divergence pass=fwd mode=jsd variant=tiled", "linear_divergence_fwd_tiled", 4},
      {RLK_BACKEND_CUDA, "sm_90a", "linear_divergence pass=fwd topk=1", "linear_divergence_fwd_sm90", 5},
      {RLK_BACKEND_CUDA, "sm_90a", "linear_divergence pass=fwd topk=1 variant=tiled", "linear_divergence_fwd_tiled", 3},
      {RLK_BACKEND_CUDA, "sm_90a", "linear_divergence pass=bwd grad=same teacher_grad=f32",
       "linear_divergence_bwd_dz_sm90", 10},
      {RLK_BACKEND_CUDA, "sm_90a", "linear_divergence pass=bwd topk=1 grad=f32", "linear_divergence_bwd_dz_sm90", 7},
      {RLK_BACKEND_CUDA, "sm_80", "linear_divergence pass=fwd topk=1", "linear_divergence_fwd_tiled", 3},
      {RLK_BACKEND_CUDA, "sm_80", "linear_divergence pass=bwd grad=same teacher_grad=f32", "linear_divergence_bwd_dz", 5},
      {RLK_BACKEND_HIP, "gfx90a", "linear_divergence pass=combine mode=reverse-kl", "linear_divergence_combine", 1},
  };
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
    rlk_context *ctx = rlk_test_compile_only_context(cases[t].backend, cases[t].target, "linear_divergence plan");
    if (!ctx) continue;
    rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
    size_t n = 0;
    ck_assert_msg(rlk_test_plan_line(&rlk_op_linear_divergence, ctx, cases[t].line, specs, &n) == RLK_OK, "%s",
                  rlk_last_error());
    ck_assert_msg(n == cases[t].n, "%s on %s: %zu kernels, expected %zu", cases[t].line,
                  cases[t].target ? cases[t].target : "host", n, cases[t].n);
    ck_assert_str_eq(specs[0].tmpl->entry, cases[t].first);
    rlk_context_destroy(ctx);
  }
  static const char *const bad[][2] = {
      {"linear_divergence mode=reverse-kl topk=1", "topk"},
      {"linear_divergence mode=jsd shard=1", "shard"},
      {"linear_divergence pass=bwd grad=none", "both none"},
  };
  rlk_test_expect_bad_lines(bad, sizeof bad / sizeof bad[0]);
}
END_TEST

/* The sm_90a forward's cluster from the device's shape: quads where they keep at least 85 percent
 * of the SMs pairs keep (an H100's 120 of 132), pairs below (108 of 132), quads where the shapes
 * are unknown; pairs for top-k, a block alone below 32 row blocks. */
START_TEST(cluster_from_device) {
  rlk_target t;
  memset(&t, 0, sizeof t);
  ck_assert_int_eq(rlk_ld_sm90_fwd_cluster(&t, 64, 0), 4);
  ck_assert_int_eq(rlk_ld_sm90_fwd_cluster(&t, 64, 1), 2);
  t.cluster_sms[1] = 132, t.cluster_sms[2] = 120, t.cluster_sms[3] = 120;
  ck_assert_int_eq(rlk_ld_sm90_fwd_cluster(&t, 64, 0), 4);
  ck_assert_int_eq(rlk_ld_sm90_fwd_cluster(&t, RLK_LD_SM90_CLUSTER_ROWS, 0), 4);
  ck_assert_int_eq(rlk_ld_sm90_fwd_cluster(&t, RLK_LD_SM90_CLUSTER_ROWS - 1, 0), 1);
  t.cluster_sms[2] = 112; /* 84.8 percent */
  ck_assert_int_eq(rlk_ld_sm90_fwd_cluster(&t, 64, 0), 2);
  ck_assert_int_eq(rlk_ld_sm90_fwd_cluster(&t, 64, 1), 2);
  t.cluster_sms[1] = 120, t.cluster_sms[2] = 104; /* 86.7 percent */
  ck_assert_int_eq(rlk_ld_sm90_fwd_cluster(&t, 64, 0), 4);
}
END_TEST

/* The workspace at N 8192, H 4096 both heads, V 151936 (the size queries read shapes only) on an
 * sm_90a context of 132 multiprocessors and one that does not know its count: within 0.3 GiB for
 * every divergence's forward (with the loss) and for the backward with the student's gradients in
 * f32 or bf16, and with the teacher's too. A compile-only context knows no multiprocessor count: the
 * test gives it an H200's. */
START_TEST(workspace_budget) {
  rlk_context *ctx = rlk_test_compile_only_cuda_context("sm_90a", "linear_divergence workspace budget");
  if (!ctx) return;
  const int64_t N = 8192, H = 4096, V = 151936, B = 8, T = N / B;
  char *fake = (char *)(uintptr_t)0x7f0000000000ull; /* never dereferenced */
  const size_t budget = (size_t)3 * ((size_t)1 << 30) / 10;
  for (int sms = 0; sms <= 132; sms += 132) {
    ctx->target.multiprocessors = sms;
    for (int mode = 0; mode < 4; mode++) {
      rlk_linear_divergence_args a;
      rlk_linear_divergence_args_init(&a);
      a.student_hidden = a.teacher_hidden = rlk_tensor_2d(fake, RLK_BF16, N, H, H);
      a.student_weight = a.teacher_weight = rlk_tensor_2d(fake + ((size_t)1 << 30), RLK_BF16, V, H, H);
      a.mode = mode == 3 ? RLK_DIVERGENCE_FORWARD_KL : (rlk_divergence_mode)mode;
      a.top_k = mode == 3 ? 32 : 0;
      a.divergence = rlk_tensor_1d(fake, RLK_F32, N);
      a.stats = rlk_tensor_2d(fake, RLK_F32, N, 6, 6);
      a.loss = rlk_tensor_1d(fake, RLK_F32, 1);
      a.mask = rlk_tensor_2d(fake, RLK_BOOL, B, T, T);
      size_t bytes = 0;
      ck_assert_msg(rlk_linear_divergence_workspace_size(ctx, &a, &bytes) == RLK_OK, "%s", rlk_last_error());
      printf("linear_divergence sm_90a (%d SMs) forward mode %d top_k %d: workspace %zu B\n", sms, (int)a.mode,
             a.top_k, bytes);
      ck_assert_uint_le(bytes, budget);
      rlk_linear_divergence_backward_args b;
      rlk_linear_divergence_backward_args_init(&b);
      b.student_hidden = a.student_hidden, b.student_weight = a.student_weight;
      b.teacher_hidden = a.teacher_hidden, b.teacher_weight = a.teacher_weight;
      b.mode = a.mode, b.top_k = a.top_k, b.stats = a.stats, b.grad_divergence = a.divergence;
      for (int grads = 0; grads < 3; grads++) {
        const rlk_dtype g = grads == 1 ? RLK_BF16 : RLK_F32;
        b.grad_student_hidden = rlk_tensor_2d(fake, g, N, H, H);
        b.grad_student_weight = rlk_tensor_2d(fake, g, V, H, H);
        if (grads == 2) {
          b.grad_teacher_hidden = rlk_tensor_2d(fake, RLK_BF16, N, H, H);
          b.grad_teacher_weight = rlk_tensor_2d(fake, RLK_BF16, V, H, H);
        }
        ck_assert_msg(rlk_linear_divergence_backward_workspace_size(ctx, &b, &bytes) == RLK_OK, "%s",
                      rlk_last_error());
        printf("linear_divergence sm_90a backward mode %d, gradients %d: workspace %zu B\n", (int)b.mode, grads, bytes);
        ck_assert_uint_le(bytes, budget);
      }
    }
  }
  /* heads of row stride 0 describe N and V up to 2^31 each: a backward whose sizes would overflow is refused */
  rlk_linear_divergence_backward_args b;
  rlk_linear_divergence_backward_args_init(&b);
  const int64_t bigN = (int64_t)1 << 30, bigV = (int64_t)1 << 30;
  b.student_hidden = b.teacher_hidden = rlk_tensor_2d(fake, RLK_BF16, bigN, H, 0);
  b.student_weight = b.teacher_weight = rlk_tensor_2d(fake, RLK_BF16, bigV, H, 0);
  b.stats = rlk_tensor_2d(fake, RLK_F32, bigN, 6, 6), b.grad_divergence = rlk_tensor_1d(fake, RLK_F32, bigN);
  b.grad_student_weight = rlk_tensor_2d(fake, RLK_F32, bigV, H, H);
  size_t bytes = 1;
  rlk_test_expect_error(rlk_linear_divergence_backward_workspace_size(ctx, &b, &bytes), RLK_ERR_INVALID_ARGUMENT,
                        "beyond the workspace", "rlk_linear_divergence_backward_workspace_size");
  rlk_context_destroy(ctx);
}
END_TEST

RLK_SAMPLES_CASE("linear_divergence", &rlk_op_linear_divergence)

/* ---------------------------------------------------------------------------------- */
/* GPU                                                                                 */
/* ---------------------------------------------------------------------------------- */

/* One forward case on the GPU against fp64 (ld_gpu_bound), its worst error printed. */
/* The model's vocabulary on a few rows, its last tile (129 columns) holding most of the mass. */
static ld_case ld_tail_case(void) {
  ld_case c = ld_base(4, 151937, 128, 192, RLK_DIVERGENCE_REVERSE_KL);
  c.grid = 1, c.tail = 1;
  return c;
}

/* A tail case's power: a forward that left out the last tile's columns (fp64 over the first
 * V - V mod 256) moves some row's D and lse_s past twice the GPU bound. */
static void ld_tail_power(const ld_case *c, const ld_data *d) {
  ld_ref_problem cut = d->p;
  cut.V = c->V - (c->V % 256 ? c->V % 256 : 256);
  double mD = 0.0, ml = 0.0;
  for (int64_t i = 0; i < c->N; i++) {
    if (d->ignored[i]) continue;
    ld_ref_row r, q;
    ld_ref_forward_row(&d->p, i, &r);
    ld_ref_forward_row(&cut, i, &q);
    mD = fmax(mD, fabs(r.D - q.D) / ld_gpu_bound(c, &r, r.D));
    ml = fmax(ml, fabs(r.lse_s - q.lse_s) / ld_gpu_bound(c, &r, r.lse_s));
  }
  printf("linear_divergence tail power: leaving out the last tile moves D %.3g and lse_s %.3g of the bound\n", mD, ml);
  ck_assert_msg(mD > 2 && ml > 2, "the tail case cannot tell a missing last tile (D %.3g, lse_s %.3g of the bound)",
                mD, ml);
}

/* The GPU forward's tail case can tell a forward that left out its last tile (ld_tail_power, on
 * the case's data made here). */
START_TEST(tail_case_power) {
  rlk_context *ctx = rlk_test_host_context();
  const ld_case c = ld_tail_case();
  ld_data d;
  ld_data_make(ctx, &c, rlk_test_seed(), &d);
  ld_tail_power(&c, &d);
  ld_data_free(ctx, &d);
  rlk_context_destroy(ctx);
}
END_TEST

static void ld_gpu_fwd_case(rlk_context *ctx, const ld_case *c, uint64_t seed, const char *what) {
  ld_data d;
  ld_data_make(ctx, c, seed, &d);
  if (c->tail) ld_tail_power(c, &d);
  ld_fwd_out o;
  const double w = ld_run_fwd(ctx, c, &d, &o, ld_gpu_bound);
  printf("linear_divergence gpu %s mode %d top_k %d N=%lld V=%lld Hs=%lld Ht=%lld variant %d: worst err %.2g of its "
         "bound\n", what, c->mode, c->top_k, (long long)c->N, (long long)c->V, (long long)c->Hs, (long long)c->Ht,
         (int)c->variant, w);
  ld_free_fwd(&o);
  ld_data_free(ctx, &d);
}

/* Every divergence at odd shapes (a partial tile of rows and columns, heads of different widths
 * with K tails, both temperatures, ignored rows), each by the automatic variant (on an sm_90
 * device the wgmma kernels) and the tiled one; the wgmma kernels' ring over many tiles in one
 * split and over many splits, mixed dtypes; top-k at k 32 and 5 with a teacher temperature (its
 * lists hold z_t on sm_90a, x_t in the tiled kernels), each variant, the model's vocabulary
 * (151937: one more than a whole number of tiles) on a few rows, and row counts that the sm_90a
 * forward runs in clusters (the others run a block alone). */
static void cases_forward(rlk_context *ctx, uint64_t *rng) {
  for (int mode = 0; mode < 3; mode++)
    for (int tiled = 0; tiled < 2; tiled++) {
      ld_case c = ld_base(300, 1009, 256, 200, mode);
      c.beta = 0.3, c.Ts = 0.8f, c.Tt = 1.2f, c.ldt = RLK_I64, c.ignored = 1, c.pad = 8, c.grid = 1;
      c.variant = tiled ? RLK_LINEAR_LOGPROB_TILED : RLK_LINEAR_LOGPROB_AUTO;
      ld_gpu_fwd_case(ctx, &c, rlk_test_rand_u64(rng), "odd shapes");
    }
  ld_case c = ld_base(257, 2000, 128, 320, RLK_DIVERGENCE_JSD);
  c.sdt = RLK_F16, c.beta = 0.7, c.grid = 1, c.splits = 1; /* one split of 16 tiles */
  ld_gpu_fwd_case(ctx, &c, rlk_test_rand_u64(rng), "one split");
  c.mode = RLK_DIVERGENCE_FORWARD_KL, c.tdt = RLK_F16, c.sdt = RLK_BF16, c.splits = 7; /* splits of 2 and 3 tiles */
  ld_gpu_fwd_case(ctx, &c, rlk_test_rand_u64(rng), "seven splits");
  for (int tiled = 0; tiled < 2; tiled++) {
    c = ld_base(200, 4099, 128, 136, RLK_DIVERGENCE_FORWARD_KL);
    c.top_k = 32, c.sdt = RLK_F16, c.ldt = RLK_I32, c.ignored = 1, c.grid = 1, c.Tt = 0.7f;
    c.variant = tiled ? RLK_LINEAR_LOGPROB_TILED : RLK_LINEAR_LOGPROB_AUTO;
    ld_gpu_fwd_case(ctx, &c, rlk_test_rand_u64(rng), "top-k 32");
    c = ld_base(131, 20011, 64, 64, RLK_DIVERGENCE_FORWARD_KL);
    c.top_k = 5, c.grid = 1, c.Tt = 1.3f, c.splits = 3;
    c.variant = tiled ? RLK_LINEAR_LOGPROB_TILED : RLK_LINEAR_LOGPROB_AUTO;
    ld_gpu_fwd_case(ctx, &c, rlk_test_rand_u64(rng), "top-k 5");
  }
  c = ld_tail_case();
  ld_gpu_fwd_case(ctx, &c, rlk_test_rand_u64(rng), "V=151937");
  /* on sm_90a the forward in clusters of row blocks sharing each W box: 33 row blocks, nine quads
   * whose last has three blocks of no rows (JSD), and 17 pairs whose last has one (top-k) */
  c = ld_base(33 * 128 - 5, 1500, 64, 128, RLK_DIVERGENCE_JSD);
  c.beta = 0.4, c.grid = 1, c.ignored = 1, c.ldt = RLK_I32;
  ld_gpu_fwd_case(ctx, &c, rlk_test_rand_u64(rng), "quads, a part-empty last");
  c = ld_base(33 * 128 - 5, 1001, 64, 64, RLK_DIVERGENCE_FORWARD_KL);
  c.top_k = 8, c.grid = 1, c.Tt = 0.9f;
  ld_gpu_fwd_case(ctx, &c, rlk_test_rand_u64(rng), "pairs, top-k 8");
  /* teacher logits of -inf (ld_teacher_mask), each variant: top-k 16 over 9 finite columns, 32
   * over 33, in splits most of which hold none of them (no candidate in a list), rows with none
   * at all (the empty set), and the whole vocabulary's forward KL over them */
  for (int tiled = 0; tiled < 2; tiled++) {
    c = ld_base(200, 3001, 64, 64, RLK_DIVERGENCE_FORWARD_KL);
    c.top_k = 16, c.t_finite = 9, c.t_void = 1, c.grid = 1, c.Tt = 0.9f, c.ldt = RLK_I64, c.ignored = 1, c.splits = 5;
    c.variant = tiled ? RLK_LINEAR_LOGPROB_TILED : RLK_LINEAR_LOGPROB_AUTO;
    ld_gpu_fwd_case(ctx, &c, rlk_test_rand_u64(rng), "top-k 16, 9 finite teacher logits");
    c.top_k = 32, c.t_finite = 33, c.splits = 0;
    ld_gpu_fwd_case(ctx, &c, rlk_test_rand_u64(rng), "top-k 32, 33 finite teacher logits");
    c.top_k = 0, c.t_finite = 40;
    ld_gpu_fwd_case(ctx, &c, rlk_test_rand_u64(rng), "forward KL, 40 finite teacher logits");
  }
}
RLK_GPU_CASE("linear_divergence", forward)

/* Both heads' gradients, f32 and 16-bit, overwritten and accumulated, in several chunks; on an
 * sm_90 device by the wgmma kernels: gradients written from registers (rows of H + 1) and through
 * TMA (rows of H + 8), the teacher's alone in f16; and the portable kernels beside them (heads whose
 * rows of H + 3 no tensor map takes); top-k by both (its forward by the same kernels); dz in pairs
 * of row blocks whose last has a block of no rows. */
static void cases_backward(rlk_context *ctx, uint64_t *rng) {
  for (int mode = 0; mode < 3; mode++) {
    ld_bcase b = {ld_base(130, 517, 96, 160, mode), RLK_F32, RLK_F32, 0, 128, 0};
    b.c.beta = 0.6, b.c.Ts = 1.1f, b.c.ldt = RLK_I64, b.c.ignored = 1, b.c.grid = 1;
    ld_check_bwd(ctx, &b, rlk_test_rand_u64(rng), 0.0, 1);
    b.gs = RLK_BF16, b.gt = RLK_DTYPE_INVALID, b.accumulate = 1, b.chunk = 0;
    ld_check_bwd(ctx, &b, rlk_test_rand_u64(rng), 0.0, 1);
    b.gs = RLK_F32, b.gt = RLK_BF16, b.accumulate = 0, b.gpad = 8, b.chunk = 256;
    ld_check_bwd(ctx, &b, rlk_test_rand_u64(rng), 0.0, 1);
    b.gs = RLK_F32, b.gt = RLK_DTYPE_INVALID, b.accumulate = 1, b.gpad = 8, b.chunk = 0;
    ld_check_bwd(ctx, &b, rlk_test_rand_u64(rng), 0.0, 1);
  }
  ld_bcase b = {ld_base(200, 700, 64, 136, RLK_DIVERGENCE_JSD), RLK_DTYPE_INVALID, RLK_F16, 0, 0, 8};
  b.c.tdt = RLK_F16, b.c.grid = 1, b.c.Tt = 0.9f; /* the teacher's gradients alone, f16 */
  ld_check_bwd(ctx, &b, rlk_test_rand_u64(rng), 0.0, 1);
  b = (ld_bcase){ld_base(70, 333, 64, 96, RLK_DIVERGENCE_REVERSE_KL), RLK_BF16, RLK_F32, 1, 128, 0};
  b.c.pad = 3, b.c.grid = 1; /* rows of H + 3: the portable kernels */
  ld_check_bwd(ctx, &b, rlk_test_rand_u64(rng), 0.0, 1);
  /* on sm_90a dz in pairs of row blocks, the last pair with a block of no rows (nine row blocks) */
  b = (ld_bcase){ld_base(9 * 128 - 3, 300, 64, 64, RLK_DIVERGENCE_FORWARD_KL), RLK_F32, RLK_F32, 0, 128, 0};
  b.c.grid = 1, b.c.ldt = RLK_I32, b.c.ignored = 1;
  ld_check_bwd(ctx, &b, rlk_test_rand_u64(rng), 0.0, 1);
  for (int pad = 0; pad < 4; pad += 3) {
    b = (ld_bcase){ld_base(70, 1000, 64, 64, RLK_DIVERGENCE_FORWARD_KL), RLK_F32, RLK_F16, 0, 192, 0};
    b.c.top_k = 16, b.c.tdt = RLK_F16, b.c.grid = 1, b.c.Tt = 1.3f, b.c.pad = pad;
    ld_check_bwd(ctx, &b, rlk_test_rand_u64(rng), 0.0, 1);
    /* top-k over 10 finite teacher logits (the rest -inf): the student's gradients */
    b = (ld_bcase){ld_base(70, 1000, 64, 64, RLK_DIVERGENCE_FORWARD_KL), RLK_F32, RLK_DTYPE_INVALID, 0, 192, 0};
    b.c.top_k = 16, b.c.t_finite = 10, b.c.grid = 1, b.c.ldt = RLK_I64, b.c.ignored = 1, b.c.pad = pad;
    ld_check_bwd(ctx, &b, rlk_test_rand_u64(rng), 0.0, 1);
  }
}
RLK_GPU_CASE("linear_divergence", backward)

/* A backward call's gradients (f32, the student's and the teacher's) and its forward's stats as
 * host copies, for comparing two runs bit for bit. */
static void ld_bwd_bits(rlk_context *ctx, const ld_case *c, const ld_data *d, const float *stats, float **grads) {
  const size_t nb = (size_t)c->N * 4;
  void *dS = rlk_test_put(ctx, stats, nb * 6), *dG = NULL;
  float *g = malloc(nb);
  for (int64_t i = 0; i < c->N; i++) g[i] = 0.5f + (float)(i % 7) * 0.125f;
  dG = rlk_test_put(ctx, g, nb);
  rlk_linear_divergence_args f;
  ld_fwd_args(c, d, &f);
  rlk_linear_divergence_backward_args a;
  rlk_linear_divergence_backward_args_init(&a);
  a.student_hidden = f.student_hidden, a.student_weight = f.student_weight;
  a.teacher_hidden = f.teacher_hidden, a.teacher_weight = f.teacher_weight, a.mode = f.mode, a.beta = c->beta;
  a.stats = rlk_tensor_2d(dS, RLK_F32, c->N, 6, 6), a.grad_divergence = rlk_tensor_1d(dG, RLK_F32, c->N);
  const int64_t rows[4] = {c->N, c->V, c->N, c->V}, cols[4] = {c->Hs, c->Hs, c->Ht, c->Ht};
  rlk_tensor *out[4] = {&a.grad_student_hidden, &a.grad_student_weight, &a.grad_teacher_hidden, &a.grad_teacher_weight};
  void *buf[4];
  for (int q = 0; q < 4; q++) {
    buf[q] = rlk_test_poisoned(ctx, (size_t)(rows[q] * cols[q]) * 4);
    *out[q] = rlk_tensor_2d(buf[q], RLK_F32, rows[q], cols[q], cols[q]);
  }
  a.chunk = 512;
  ld_call_backward(ctx, &a);
  for (int q = 0; q < 4; q++) {
    grads[q] = malloc((size_t)(rows[q] * cols[q]) * 4);
    rlk_test_get(ctx, grads[q], buf[q], (size_t)(rows[q] * cols[q]) * 4);
    rlk_test_drop(ctx, buf[q]);
  }
  rlk_test_drop(ctx, dS), rlk_test_drop(ctx, dG);
  free(g);
}

/* Whether all n floats are finite (the outputs start as NaN poison: a kernel that wrote nothing
 * would repeat its poison bit for bit). */
static int ld_all_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return 0;
  return 1;
}

/* The same call twice gives the same bits (splits merged in order, no atomics; the backward's
 * chunks in order, each gradient element written by one block a launch), every output written. */
static void cases_deterministic(rlk_context *ctx, uint64_t *rng) {
  for (int mode = 0; mode < 3; mode++) {
    ld_case c = ld_base(777, 50257, 128, 96, mode);
    c.top_k = mode == 0 ? 8 : 0;
    ld_data d;
    ld_data_make(ctx, &c, rlk_test_rand_u64(rng), &d);
    const size_t nb = (size_t)c.N * 4, sb = nb * 6;
    float *out[2][2];
    for (int run = 0; run < 2; run++) {
      void *dD = rlk_test_poisoned(ctx, nb), *dS = rlk_test_poisoned(ctx, sb);
      rlk_linear_divergence_args a;
      ld_fwd_args(&c, &d, &a);
      a.divergence = rlk_tensor_1d(dD, RLK_F32, c.N);
      a.stats = rlk_tensor_2d(dS, RLK_F32, c.N, 6, 6);
      ld_call(ctx, &a);
      out[run][0] = malloc(nb), out[run][1] = malloc(sb);
      rlk_test_get(ctx, out[run][0], dD, nb), rlk_test_get(ctx, out[run][1], dS, sb);
      rlk_test_drop(ctx, dD), rlk_test_drop(ctx, dS);
    }
    ck_assert_msg(!memcmp(out[0][0], out[1][0], nb) && !memcmp(out[0][1], out[1][1], sb),
                  "mode %d: two calls differ", mode);
    ck_assert_msg(ld_all_finite(out[0][0], (size_t)c.N) && ld_all_finite(out[0][1], (size_t)c.N * 6),
                  "mode %d: an output not written or not finite", mode);
    if (mode == 2) {
      /* JSD's backward, both heads' gradients, twice, over the first 3001 columns (small gradients;
       * the whole vocabulary's stats serve a repeat as well as any finite ones) */
      c.V = 3001;
      float *g[2][4];
      for (int run = 0; run < 2; run++) ld_bwd_bits(ctx, &c, &d, out[0][1], g[run]);
      const size_t bytes[4] = {(size_t)(c.N * c.Hs) * 4, (size_t)(c.V * c.Hs) * 4, (size_t)(c.N * c.Ht) * 4,
                               (size_t)(c.V * c.Ht) * 4};
      for (int q = 0; q < 4; q++) {
        ck_assert_msg(!memcmp(g[0][q], g[1][q], bytes[q]), "backward gradient %d: two calls differ", q);
        ck_assert_msg(ld_all_finite(g[0][q], bytes[q] / 4), "backward gradient %d: not written or not finite", q);
        free(g[0][q]), free(g[1][q]);
      }
      c.V = 50257;
    }
    for (int run = 0; run < 2; run++) free(out[run][0]), free(out[run][1]);
    ld_data_free(ctx, &d);
  }
}
RLK_GPU_CASE("linear_divergence", deterministic)

/* rows of 16-byte multiples (the sm_90a kernels on an sm_90 device), then of 12 and 10 elements
 * (the portable ones) */
static void cases_shards(rlk_context *ctx, uint64_t *rng) {
  static const int64_t two[] = {0, 700, 1283}, three[] = {0, 1, 520, 1111};
  ld_shard_check(ctx, RLK_DIVERGENCE_FORWARD_KL, two, 2, 64, 136, rlk_test_rand_u64(rng));
  ld_shard_check(ctx, RLK_DIVERGENCE_REVERSE_KL, three, 3, 72, 64, rlk_test_rand_u64(rng));
  ld_shard_check(ctx, RLK_DIVERGENCE_FORWARD_KL, two, 2, 12, 10, rlk_test_rand_u64(rng));
}
RLK_GPU_CASE("linear_divergence", shards)

Suite *linear_divergence_suite(void) {
  Suite *s = suite_create("linear_divergence");
  rlk_test_add_case(s, "host", 300, TESTS(host_forward, host_backward, reference_gradients, tail_case_power,
      host_loss, host_shards, bad_arguments, host_records_its_configurations));
  rlk_test_add_case(s, "plan", 600, TESTS(plan_per_target, cluster_from_device, workspace_budget, samples_compile_every_target));
  rlk_test_add_case(s, "gpu", 900, TESTS(gpu_forward, gpu_backward, gpu_deterministic, gpu_shards));
  return s;
}

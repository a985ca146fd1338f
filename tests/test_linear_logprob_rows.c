/* test_linear_logprob_rows.c - rlk_linear_logprob's row selection (`rows`), forward and backward:
 * a selected row's outputs bitwise those of the same call on the gathered rows (hidden[rows] as a
 * contiguous [n, H]) and, in the forward, within the derived bounds of the fp64 reference; the
 * backward's grad_hidden by row (a selected row the gathered call's, the others 0 or untouched
 * when accumulating, over a sentinel) and grad_weight the gathered call's; i32 and i64 indices
 * with strides; one row, every row, random selections, a call cut into launches; bad indices (a
 * NaN row and RLK_LOGPROB_STATUS_BAD_ROW); argument errors. On the host backend, and with
 * RLK_TEST_GPU=1 on CUDA (sm_90a's wgmma kernels at an aligned H, the portable ones where hidden's
 * rows are no multiple of 8 elements). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "linear_logprob_check.h"
#include "ops/linear_logprob_plan.h"
#include "ops/linear_logprob_rows.h"
#include "ops/ops.h"
#include "ref/linear_logprob_ref.h"
#include "suites.h"
#include "test_util.h"

/* A head and a selection of its rows: hidden [N, H] in rows H + hpad apart, weight [V, H], the
 * selection's n indices of dtype rdt, rstride apart; its labels (i64, [n]). */
typedef struct llr_case {
  int64_t N, V, H, hpad;
  rlk_dtype dt, rdt;
  int64_t rstride;
  const int64_t *sel;
  int64_t n;
  rlk_linear_logprob_variant variant;
} llr_case;

/* The inputs on the host and in ctx's memory, gathered too: hg [n, H] = hidden's selected rows. */
typedef struct llr_inputs {
  uint16_t *h, *w, *hg;
  int64_t *lab;
  void *d_h, *d_w, *d_hg, *d_lab, *d_rows;
} llr_inputs;

static void llr_make(rlk_context *ctx, const llr_case *c, uint64_t seed, llr_inputs *in) {
  uint64_t rng = seed;
  const int64_t N = c->N, V = c->V, H = c->H, hs = H + c->hpad, n = c->n;
  in->h = malloc((size_t)(N * hs) * 2);
  in->w = malloc((size_t)(V * H) * 2);
  in->hg = malloc((size_t)(n * H) * 2);
  in->lab = malloc((size_t)n * 8);
  ck_assert(in->h && in->w && in->hg && in->lab);
  memset(in->h, 0x7f, (size_t)(N * hs) * 2); /* padding: huge values that must not be read */
  for (int64_t i = 0; i < N; i++)
    for (int64_t k = 0; k < H; k++) rlk_test_store(in->h, c->dt, i * hs + k, ll_grid_h(&rng));
  const double step = ll_grid_step(H, 3.0);
  for (int64_t i = 0; i < V * H; i++) rlk_test_store(in->w, c->dt, i, ll_grid_w(&rng, step));
  for (int64_t j = 0; j < n; j++) {
    memcpy(in->hg + j * H, in->h + c->sel[j] * hs, (size_t)H * 2);
    in->lab[j] = j % 5 == 3 ? -100 : (int64_t)(rlk_test_rand_u64(&rng) % (uint64_t)V);
  }
  /* the indices `rstride` apart, what lies between them a value no selection may read */
  const size_t rs = rlk_dtype_size(c->rdt), rbytes = (size_t)(n * c->rstride) * rs;
  void *rows = malloc(rbytes);
  ck_assert(rows);
  for (int64_t i = 0; i < n * c->rstride; i++) {
    const int64_t v = i % c->rstride ? -7 : c->sel[i / c->rstride];
    if (c->rdt == RLK_I32)
      ((int32_t *)rows)[i] = (int32_t)v;
    else
      ((int64_t *)rows)[i] = v;
  }
  in->d_h = rlk_test_put(ctx, in->h, (size_t)(N * hs) * 2);
  in->d_w = rlk_test_put(ctx, in->w, (size_t)(V * H) * 2);
  in->d_hg = rlk_test_put(ctx, in->hg, (size_t)(n * H) * 2);
  in->d_lab = rlk_test_put(ctx, in->lab, (size_t)n * 8);
  in->d_rows = rlk_test_put(ctx, rows, rbytes);
  free(rows);
}

static void llr_free(rlk_context *ctx, llr_inputs *in) {
  rlk_test_drop(ctx, in->d_h), rlk_test_drop(ctx, in->d_w), rlk_test_drop(ctx, in->d_hg);
  rlk_test_drop(ctx, in->d_lab), rlk_test_drop(ctx, in->d_rows);
  free(in->h), free(in->w), free(in->hg), free(in->lab);
}

static rlk_tensor llr_rows(const llr_case *c, const llr_inputs *in) {
  rlk_tensor r = rlk_tensor_1d(in->d_rows, c->rdt, c->n);
  r.strides[0] = c->rstride;
  return r;
}

/* The forward's arguments over the selection (gathered 0) or over the gathered rows (1). */
static rlk_linear_logprob_args llr_fwd_args(const llr_case *c, const llr_inputs *in, int gathered) {
  rlk_linear_logprob_args a;
  rlk_linear_logprob_args_init(&a);
  if (gathered) {
    a.hidden = rlk_tensor_2d(in->d_hg, c->dt, c->n, c->H, c->H);
  } else {
    a.hidden = rlk_tensor_2d(in->d_h, c->dt, c->N, c->H, c->H + c->hpad);
    a.rows = llr_rows(c, in);
  }
  a.weight = rlk_tensor_2d(in->d_w, c->dt, c->V, c->H, c->H);
  a.labels = rlk_tensor_1d(in->d_lab, RLK_I64, c->n);
  a.variant = c->variant;
  return a;
}

/* A forward's outputs, [n] each, and its status word. */
typedef struct llr_out {
  float *logp, *lse, *ent;
  int32_t status;
} llr_out;

static void llr_forward(rlk_context *ctx, rlk_linear_logprob_args a, int64_t n, llr_out *o) {
  const size_t ob = (size_t)n * 4;
  void *dlp = rlk_test_poisoned(ctx, ob), *dlse = rlk_test_poisoned(ctx, ob), *dent = rlk_test_poisoned(ctx, ob);
  int32_t zero = 0;
  void *dst = rlk_test_put(ctx, &zero, 4);
  a.logp = rlk_tensor_1d(dlp, RLK_F32, n);
  a.lse = rlk_tensor_1d(dlse, RLK_F32, n);
  a.entropy = rlk_tensor_1d(dent, RLK_F32, n);
  a.status = rlk_tensor_1d(dst, RLK_I32, 1);
  size_t wsb = 0;
  rlk_test_workspace(ctx, rlk_linear_logprob_workspace_size(ctx, &a, &wsb), &wsb, &a.workspace, &a.workspace_bytes);
  ck_assert_msg(rlk_linear_logprob(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  o->logp = malloc(ob), o->lse = malloc(ob), o->ent = malloc(ob);
  ck_assert(o->logp && o->lse && o->ent);
  rlk_test_get(ctx, o->logp, dlp, ob);
  rlk_test_get(ctx, o->lse, dlse, ob);
  rlk_test_get(ctx, o->ent, dent, ob);
  rlk_test_get(ctx, &o->status, dst, 4);
  rlk_test_drop(ctx, dlp), rlk_test_drop(ctx, dlse), rlk_test_drop(ctx, dent), rlk_test_drop(ctx, dst);
  if (a.workspace) rlk_free(ctx, a.workspace);
}

static void llr_out_free(llr_out *o) { free(o->logp), free(o->lse), free(o->ent); }

/* The selection's forward: bitwise the gathered call's, and within the fp64 bounds. */
static void llr_check_forward(rlk_context *ctx, const llr_case *c, uint64_t seed) {
  llr_inputs in;
  llr_make(ctx, c, seed, &in);
  llr_out got, want;
  llr_forward(ctx, llr_fwd_args(c, &in, 0), c->n, &got);
  llr_forward(ctx, llr_fwd_args(c, &in, 1), c->n, &want);
  const size_t ob = (size_t)c->n * 4;
  ck_assert_msg(memcmp(got.logp, want.logp, ob) == 0 && memcmp(got.lse, want.lse, ob) == 0 &&
                    memcmp(got.ent, want.ent, ob) == 0,
                "N=%lld n=%lld H=%lld: the selection's outputs differ from the gathered call's", (long long)c->N,
                (long long)c->n, (long long)c->H);
  ck_assert_int_eq(got.status, 0);
  ck_assert_int_eq(want.status, 0);
  double *x = malloc((size_t)c->V * 8), worst = 0.0;
  ck_assert(x);
  const double eps = ll_fold_eps(c->V);
  for (int64_t j = 0; j < c->n; j++) {
    lp_ref_row ref;
    ll_ref_row(in.hg, c->H, in.w, c->H, c->dt == RLK_F16, j, c->V, c->H, 1.0, in.lab[j], -100, x, &ref, NULL);
    const ll_bound b = ll_fwd_bound(&ref, eps);
    const double g[3] = {got.logp[j], got.lse[j], got.ent[j]}, w[3] = {ref.logp, ref.lse, ref.entropy},
                 tol[3] = {b.logp, b.lse, b.entropy};
    for (int q = 0; q < 3; q++) {
      const double err = fabs(g[q] - w[q]);
      worst = err / tol[q] > worst ? err / tol[q] : worst;
      ck_assert_msg(err <= tol[q], "n=%lld row %lld (hidden row %lld) output %d (logp, lse, entropy): %.7g, fp64 %.7g, "
                    "bound %.3g", (long long)c->n, (long long)j, (long long)c->sel[j], q, g[q], w[q], tol[q]);
    }
  }
  printf("linear_logprob rows %s N=%lld n=%lld V=%lld H=%lld %s %s stride %lld: the gathered call's bits, worst "
         "%.2g of the fp64 bound\n",
         rlk_context_backend(ctx) == RLK_BACKEND_HOST ? "host" : "gpu", (long long)c->N, (long long)c->n,
         (long long)c->V, (long long)c->H, rlk_dtype_name(c->dt), rlk_dtype_name(c->rdt), (long long)c->rstride,
         worst);
  free(x);
  llr_out_free(&got), llr_out_free(&want);
  llr_free(ctx, &in);
}

/* A random strictly increasing selection of n of N rows into sel. */
static void llr_select(uint64_t *rng, int64_t N, int64_t n, int64_t *sel) {
  int64_t k = 0;
  for (int64_t i = 0; i < N && k < n; i++)
    if (rlk_test_rand_u64(rng) % (uint64_t)(N - i) < (uint64_t)(n - k)) sel[k++] = i;
  ck_assert_int_eq(k, n);
}

/* ---------------------------------------------------------------------------------- */
/* The backward                                                                        */
/* ---------------------------------------------------------------------------------- */

/* The gradients' dtype and the call's: accumulate, which gradients, grad_hidden's row padding. */
typedef struct llr_grads {
  rlk_dtype gdt;
  int accumulate, want_gh, want_gw;
  int64_t gpad;
  int64_t guard; /* rows of grad_hidden's buffer before and after the call's, which it must not write */
} llr_grads;

/* One backward over the selection (gathered 0: grad_hidden [N, H + gpad]) or over the gathered
 * rows (1: [n, H]); gh and gw hold the gradients' starting values and get the results (gh with
 * g->guard rows before and after the call's). */
static void llr_backward(rlk_context *ctx, const llr_case *c, const llr_inputs *in, const llr_grads *g,
                         int gathered, void *lse, void *ent, void *glp, void *gent, void *gh, void *gw,
                         int32_t *status) {
  const size_t gs = rlk_dtype_size(g->gdt);
  const int64_t rows = gathered ? c->n : c->N, ghs = gathered ? c->H : c->H + g->gpad;
  const size_t ghb = (size_t)((rows + 2 * g->guard) * ghs) * gs, gwb = (size_t)(c->V * c->H) * gs;
  const rlk_linear_logprob_args f = llr_fwd_args(c, in, gathered);
  rlk_linear_logprob_backward_args b;
  rlk_linear_logprob_backward_args_init(&b);
  b.hidden = f.hidden;
  b.rows = f.rows;
  b.weight = f.weight;
  b.labels = f.labels;
  b.lse = rlk_tensor_1d(lse, RLK_F32, c->n);
  b.grad_logp = rlk_tensor_1d(glp, RLK_F32, c->n);
  b.grad_entropy = rlk_tensor_1d(gent, RLK_F32, c->n);
  b.entropy = rlk_tensor_1d(ent, RLK_F32, c->n);
  void *dgh = rlk_test_put(ctx, gh, ghb), *dgw = rlk_test_put(ctx, gw, gwb), *dst = rlk_test_put(ctx, status, 4);
  if (g->want_gh)
    b.grad_hidden = rlk_tensor_2d((char *)dgh + (size_t)(g->guard * ghs) * gs, g->gdt, rows, c->H, ghs);
  if (g->want_gw) b.grad_weight = rlk_tensor_2d(dgw, g->gdt, c->V, c->H, c->H);
  b.accumulate = g->accumulate;
  b.status = rlk_tensor_1d(dst, RLK_I32, 1);
  size_t wsb = 0;
  rlk_test_workspace(ctx, rlk_linear_logprob_backward_workspace_size(ctx, &b, &wsb), &wsb, &b.workspace,
                     &b.workspace_bytes);
  ck_assert_msg(rlk_linear_logprob_backward(ctx, &b, NULL) == RLK_OK, "%s", rlk_last_error());
  rlk_test_get(ctx, gh, dgh, ghb);
  rlk_test_get(ctx, gw, dgw, gwb);
  rlk_test_get(ctx, status, dst, 4);
  rlk_test_drop(ctx, dgh), rlk_test_drop(ctx, dgw), rlk_test_drop(ctx, dst);
  if (b.workspace) rlk_free(ctx, b.workspace);
}

/* The selection's backward against the gathered call's: grad_hidden by row over a sentinel (the
 * selected rows the gathered call's bits, the others 0, or untouched when accumulating; the
 * padding between rows untouched), grad_weight bitwise. */
static void llr_check_backward(rlk_context *ctx, const llr_case *c, const llr_grads *g, uint64_t seed) {
  llr_inputs in;
  llr_make(ctx, c, seed, &in);
  uint64_t rng = seed ^ 0x9e3779b97f4a7c15ull;
  const int64_t N = c->N, n = c->n, H = c->H, V = c->V, ghs = H + g->gpad;
  const size_t gs = rlk_dtype_size(g->gdt), rowb = (size_t)H * gs;
  /* the forward's lse and entropy (the gathered call's bits: checked above) */
  llr_out f;
  llr_forward(ctx, llr_fwd_args(c, &in, 0), n, &f);
  float *glp = malloc((size_t)n * 4), *gent = malloc((size_t)n * 4);
  ck_assert(glp && gent);
  for (int64_t j = 0; j < n; j++) {
    glp[j] = (float)rlk_test_rand_normal(&rng);
    gent[j] = (float)rlk_test_rand_normal(&rng);
  }
  void *dlse = rlk_test_put(ctx, f.lse, (size_t)n * 4), *dent = rlk_test_put(ctx, f.ent, (size_t)n * 4);
  void *dglp = rlk_test_put(ctx, glp, (size_t)n * 4), *dgent = rlk_test_put(ctx, gent, (size_t)n * 4);
  /* starting values: random ones to add to, else a sentinel every written element must replace */
  unsigned char *gh0 = malloc((size_t)(N * ghs) * gs), *gw0 = malloc((size_t)(V * H) * gs);
  unsigned char *gh = malloc((size_t)(N * ghs) * gs), *gw = malloc((size_t)(V * H) * gs);
  unsigned char *ghg = malloc((size_t)(n * H) * gs), *gwg = malloc((size_t)(V * H) * gs);
  ck_assert(gh0 && gw0 && gh && gw && ghg && gwg);
  memset(gh0, 0x5a, (size_t)(N * ghs) * gs);
  memset(gw0, 0x5a, (size_t)(V * H) * gs);
  if (g->accumulate) {
    for (int64_t i = 0; i < N; i++)
      for (int64_t k = 0; k < H; k++) rlk_test_store(gh0, g->gdt, i * ghs + k, rlk_test_rand_normal(&rng));
    for (int64_t i = 0; i < V * H; i++) rlk_test_store(gw0, g->gdt, i, rlk_test_rand_normal(&rng));
  }
  memcpy(gh, gh0, (size_t)(N * ghs) * gs);
  memcpy(gw, gw0, (size_t)(V * H) * gs);
  memcpy(gwg, gw0, (size_t)(V * H) * gs);
  for (int64_t j = 0; j < n; j++) memcpy(ghg + (size_t)j * rowb, gh0 + (size_t)(c->sel[j] * ghs) * gs, rowb);
  int32_t st_sel = 0, st_gat = 0;
  llr_backward(ctx, c, &in, g, 0, dlse, dent, dglp, dgent, gh, gw, &st_sel);
  llr_backward(ctx, c, &in, g, 1, dlse, dent, dglp, dgent, ghg, gwg, &st_gat);
  ck_assert_int_eq(st_sel, 0);
  ck_assert_int_eq(st_gat, 0);
  if (g->want_gh) {
    int64_t j = 0, nonzero = 0;
    for (int64_t i = 0; i < N; i++) {
      const unsigned char *row = gh + (size_t)(i * ghs) * gs, *old = gh0 + (size_t)(i * ghs) * gs;
      if (j < n && c->sel[j] == i) {
        const unsigned char *want = ghg + (size_t)j * rowb;
        ck_assert_msg(memcmp(row, want, rowb) == 0, "grad_hidden row %lld (selected %lld): not the gathered call's",
                      (long long)i, (long long)j);
        for (int64_t k = 0; k < H; k++) nonzero += rlk_test_load(row, g->gdt, k) != rlk_test_load(old, g->gdt, k);
        j++;
      } else {
        for (int64_t k = 0; k < H; k++) {
          const double v = rlk_test_load(row, g->gdt, k), was = rlk_test_load(old, g->gdt, k);
          ck_assert_msg(g->accumulate ? memcmp(row + k * (int64_t)gs, old + k * (int64_t)gs, gs) == 0 : v == 0.0,
                        "grad_hidden row %lld (not selected) element %lld: %g, held %g, accumulate %d", (long long)i,
                        (long long)k, v, was, g->accumulate);
        }
      }
      ck_assert_msg(memcmp(row + rowb, old + rowb, (size_t)g->gpad * gs) == 0, "grad_hidden row %lld: padding written",
                    (long long)i);
    }
    ck_assert_msg(nonzero > 0, "grad_hidden: the selected rows kept what they held");
  } else {
    ck_assert(memcmp(gh, gh0, (size_t)(N * ghs) * gs) == 0);
  }
  ck_assert_msg(memcmp(gw, gwg, (size_t)(V * H) * gs) == 0, "grad_weight: not the gathered call's");
  ck_assert_msg(!g->want_gw || memcmp(gw, gw0, (size_t)(V * H) * gs) != 0, "grad_weight: unwritten");
  printf("linear_logprob rows backward %s N=%lld n=%lld V=%lld H=%lld grad=%s accumulate=%d: the gathered call's "
         "bits\n",
         rlk_context_backend(ctx) == RLK_BACKEND_HOST ? "host" : "gpu", (long long)N, (long long)n, (long long)V,
         (long long)H, rlk_dtype_name(g->gdt), g->accumulate);
  rlk_test_drop(ctx, dlse), rlk_test_drop(ctx, dent), rlk_test_drop(ctx, dglp), rlk_test_drop(ctx, dgent);
  free(glp), free(gent), free(gh0), free(gw0), free(gh), free(gw), free(ghg), free(gwg);
  llr_out_free(&f);
  llr_free(ctx, &in);
}

/* ---------------------------------------------------------------------------------- */
/* Bad indices                                                                         */
/* ---------------------------------------------------------------------------------- */

/* A selection with bad indices at `bad` (n of them flagged): those rows' logp NaN and lse and
 * entropy not finite (NaN on the host; the GPU's kernels read a row of NaN logits as empty, lse
 * -inf), the others finite, RLK_LOGPROB_STATUS_BAD_ROW in status; the backward sets it too. */
static void llr_check_bad(rlk_context *ctx, const int64_t *sel, int64_t n, const int *bad, rlk_dtype rdt,
                          uint64_t seed) {
  const int64_t ok_sel[] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  llr_case c = {9, 300, 40, 0, RLK_BF16, rdt, 1, ok_sel, n, RLK_LINEAR_LOGPROB_AUTO};
  llr_inputs in;
  llr_make(ctx, &c, seed, &in); /* rows 0..n-1, then the bad selection over them */
  c.sel = sel;
  const size_t rs = rlk_dtype_size(rdt);
  void *rows = malloc((size_t)n * rs);
  for (int64_t i = 0; i < n; i++) {
    if (rdt == RLK_I32)
      ((int32_t *)rows)[i] = (int32_t)sel[i];
    else
      ((int64_t *)rows)[i] = sel[i];
  }
  rlk_test_drop(ctx, in.d_rows);
  in.d_rows = rlk_test_put(ctx, rows, (size_t)n * rs);
  free(rows);
  llr_out o;
  llr_forward(ctx, llr_fwd_args(&c, &in, 0), n, &o);
  ck_assert_int_eq(o.status, RLK_LOGPROB_STATUS_BAD_ROW);
  for (int64_t j = 0; j < n; j++) {
    const int lab_ignored = j % 5 == 3; /* logp 0 whatever the row */
    if (bad[j]) {
      ck_assert_msg(!isfinite(o.lse[j]) && !isfinite(o.ent[j]) && (lab_ignored || isnan(o.logp[j])),
                    "row %lld (index %lld): lse %g entropy %g logp %g, expected NaN logp and no finite lse or "
                    "entropy", (long long)j, (long long)sel[j], o.lse[j], o.ent[j], o.logp[j]);
    } else {
      ck_assert_msg(isfinite(o.lse[j]) && isfinite(o.logp[j]), "row %lld (index %lld): lse %g, expected finite",
                    (long long)j, (long long)sel[j], o.lse[j]);
    }
  }
  /* the backward gathers the same rows and sets the bit too; grad_hidden (between two guard rows
   * each side) gets the well-selected rows' gradients, once each, and nothing else: 0 in the rows
   * not selected when overwriting, the held values when accumulating; no write outside */
  enum { GUARD = 2, ROWS = 9 + 2 * GUARD };
  const float held = 0.25f;
  float *gh = malloc((size_t)(ROWS * 40) * 4), *gw = calloc((size_t)(300 * 40), 4), *ones = malloc((size_t)n * 4);
  for (int64_t j = 0; j < n; j++) ones[j] = 1.0f;
  void *dlse = rlk_test_put(ctx, o.lse, (size_t)n * 4), *dent = rlk_test_put(ctx, o.ent, (size_t)n * 4),
       *dg = rlk_test_put(ctx, ones, (size_t)n * 4);
  for (int acc = 0; acc < 2; acc++) {
    const llr_grads g = {RLK_F32, acc, 1, !acc, 0, GUARD};
    for (int64_t k = 0; k < ROWS * 40; k++) gh[k] = held;
    int32_t status = 0;
    llr_backward(ctx, &c, &in, &g, 0, dlse, dent, dg, dg, gh, gw, &status);
    ck_assert_int_eq(status, RLK_LOGPROB_STATUS_BAD_ROW);
    for (int64_t i = -GUARD; i < 9 + GUARD; i++) {
      /* a well-selected row's gradient is nonzero but where its label is ignored (j % 5 == 3) */
      int chosen = 0;
      for (int64_t j = 0; j < n; j++) chosen |= !bad[j] && sel[j] == i && j % 5 != 3;
      const float same = acc ? held : 0.0f;
      for (int64_t k = 0; k < 40; k++) {
        const float v = gh[(i + GUARD) * 40 + k];
        if (i < 0 || i >= 9)
          ck_assert_msg(v == held, "accumulate %d: guard row %lld element %lld written: %g", acc, (long long)i,
                        (long long)k, v);
        else if (chosen)
          ck_assert_msg(isfinite(v) && v != same, "accumulate %d: selected row %lld element %lld: %g", acc,
                        (long long)i, (long long)k, v);
        else
          ck_assert_msg(v == same, "accumulate %d: row %lld (not selected, or no gradient) element %lld: %g", acc,
                        (long long)i, (long long)k, v);
      }
    }
  }
  /* 16-bit gradients added to zeros are the overwriting call's bits (each row rounded once from
   * the same sum): a row written twice, as a repeated index could, would be added to twice */
  uint16_t *over = malloc((size_t)(ROWS * 40) * 2), *added = calloc((size_t)(ROWS * 40), 2);
  for (int64_t k = 0; k < ROWS * 40; k++) over[k] = 0x3e80; /* bf16 0.25 */
  for (int acc = 0; acc < 2; acc++) {
    const llr_grads g = {RLK_BF16, acc, 1, 0, 0, GUARD};
    int32_t status = 0;
    llr_backward(ctx, &c, &in, &g, 0, dlse, dent, dg, dg, acc ? added : over, gw, &status);
    ck_assert_int_eq(status, RLK_LOGPROB_STATUS_BAD_ROW);
  }
  for (int64_t k = 0; k < ROWS * 40; k++) {
    const int64_t i = k / 40 - GUARD;
    if (i < 0 || i >= 9)
      ck_assert_msg(over[k] == 0x3e80 && added[k] == 0, "guard row %lld element %lld written: %04x, %04x",
                    (long long)i, (long long)(k % 40), over[k], added[k]);
    else
      ck_assert_msg(over[k] == added[k], "row %lld element %lld: %04x overwritten, %04x added to zero",
                    (long long)i, (long long)(k % 40), over[k], added[k]);
  }
  free(over), free(added);
  rlk_test_drop(ctx, dlse), rlk_test_drop(ctx, dent), rlk_test_drop(ctx, dg);
  free(gh), free(gw), free(ones);
  llr_out_free(&o);
  llr_free(ctx, &in);
}

/* ---------------------------------------------------------------------------------- */
/* Cases                                                                               */
/* ---------------------------------------------------------------------------------- */

/* The selections of a head of N rows: one row, every row, random ones; each forward and, for
 * `grads`, backward. */
static void llr_cases(rlk_context *ctx, llr_case c, const llr_grads *grads, size_t ngrads, uint64_t *rng) {
  int64_t *sel = malloc((size_t)c.N * 8);
  ck_assert(sel);
  const int64_t sizes[4] = {1, c.N, c.N / 3 + 1, (2 * c.N) / 3};
  for (int s = 0; s < 4; s++) {
    c.n = sizes[s];
    llr_select(rng, c.N, c.n, sel);
    if (s == 0) sel[0] = c.N - 1; /* the last row alone */
    c.sel = sel;
    llr_check_forward(ctx, &c, rlk_test_rand_u64(rng));
    for (size_t k = 0; k < ngrads; k++) {
      /* a 16-bit gradient in hidden's dtype (the only 16-bit one the call takes) */
      llr_grads g = grads[k];
      if (g.gdt != RLK_F32) g.gdt = c.dt;
      if (s >= 2 || k == 0) llr_check_backward(ctx, &c, &g, rlk_test_rand_u64(rng));
    }
  }
  free(sel);
}

static const llr_grads llr_grad_kinds[] = {
    {RLK_F32, 0, 1, 1, 0},  /* overwritten */
    {RLK_F32, 1, 1, 1, 4},  /* f32 added to: the sum starts from the held values */
    {RLK_BF16, 1, 1, 1, 8}, /* a 16-bit one added to at the end */
    {RLK_BF16, 0, 1, 0, 0}, /* grad_hidden alone */
    {RLK_F32, 1, 0, 1, 0},  /* grad_weight alone */
};

static void llr_bad_cases(rlk_context *ctx, uint64_t *rng) {
  /* not increasing at index 2; out of range at both ends */
  const int64_t repeat[] = {0, 3, 3, 5}, outside[] = {-1, 2, 8, 9};
  const int bad_repeat[] = {0, 0, 1, 0}, bad_outside[] = {1, 0, 0, 1};
  llr_check_bad(ctx, repeat, 4, bad_repeat, RLK_I64, rlk_test_rand_u64(rng));
  llr_check_bad(ctx, outside, 4, bad_outside, RLK_I32, rlk_test_rand_u64(rng));
}

static void cases_rows(rlk_context *ctx, uint64_t *rng) {
  const int gpu = rlk_context_backend(ctx) != RLK_BACKEND_HOST;
  /* odd H and V; i32 indices 3 apart over rows of H + 3, i64 ones 2 apart */
  llr_case c = {37, 301, 45, 3, RLK_BF16, RLK_I32, 3, NULL, 0, RLK_LINEAR_LOGPROB_AUTO};
  llr_cases(ctx, c, llr_grad_kinds, sizeof llr_grad_kinds / sizeof llr_grad_kinds[0], rng);
  c = (llr_case){29, 257, 33, 0, RLK_F16, RLK_I64, 2, NULL, 0, RLK_LINEAR_LOGPROB_AUTO};
  const llr_grads f16 = {RLK_F16, 1, 1, 1, 0};
  llr_cases(ctx, c, &f16, 1, rng);
  if (gpu) {
    /* sm_90a: the wgmma kernels at an aligned H (several 128 x 256 tiles, ragged ends), and the
     * portable ones asked for; then hidden in rows of an odd H: the portable kernels */
    c = (llr_case){700, 3001, 256, 0, RLK_BF16, RLK_I64, 1, NULL, 0, RLK_LINEAR_LOGPROB_AUTO};
    llr_cases(ctx, c, llr_grad_kinds, 3, rng);
    c.variant = RLK_LINEAR_LOGPROB_TILED;
    llr_cases(ctx, c, llr_grad_kinds, 1, rng);
    /* the caller's hidden in rows of 259 elements has no tensor map; its gathered rows do, and the
     * wgmma kernels run, as on a contiguous copy */
    c.variant = RLK_LINEAR_LOGPROB_AUTO;
    c.hpad = 3;
    llr_cases(ctx, c, llr_grad_kinds, 3, rng);
    c = (llr_case){500, 3001, 45, 5, RLK_F16, RLK_I32, 2, NULL, 0, RLK_LINEAR_LOGPROB_AUTO};
    llr_cases(ctx, c, llr_grad_kinds, 3, rng);
    /* the backward in blocks of 128 selected rows (its budget at its least), the gathered call's
     * alike: grad_hidden by row and grad_weight summed block after block, the same bits */
    rlk_ll_bwd_set_budget(1);
    c = (llr_case){700, 3001, 256, 0, RLK_BF16, RLK_I64, 1, NULL, 0, RLK_LINEAR_LOGPROB_AUTO};
    llr_cases(ctx, c, llr_grad_kinds, 3, rng);
    rlk_ll_bwd_set_budget(0);
  }
  /* a call cut into launches of 128 rows (the gathered rows' budget at its least) */
  int64_t sel[300];
  rlk_ll_rows_set_budget(1);
  c = (llr_case){400, 129, 45, 0, RLK_BF16, RLK_I64, 1, sel, 300, RLK_LINEAR_LOGPROB_AUTO};
  llr_select(rng, c.N, c.n, sel);
  llr_check_forward(ctx, &c, rlk_test_rand_u64(rng));
  rlk_ll_rows_set_budget(0);
  llr_bad_cases(ctx, rng);
}

RLK_HOST_TEST(rows, cases_rows(ctx, &rng))
RLK_GPU_CASE("linear_logprob_rows", rows)

/* Argument errors name the field; an empty selection is refused as hidden with no rows is. */
START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  uint16_t h[6 * 8], w[5 * 8];
  int64_t lab[3] = {0, 1, 2}, sel[3] = {0, 2, 5}, sel2[2 * 3] = {0, 2, 5};
  float lp[3], gh[6 * 8], g[3] = {1, 1, 1}, lse[3];
  memset(h, 0, sizeof h), memset(w, 0, sizeof w);
  rlk_linear_logprob_args a;
  rlk_linear_logprob_args_init(&a);
  a.hidden = rlk_tensor_2d(h, RLK_BF16, 6, 8, 8);
  a.weight = rlk_tensor_2d(w, RLK_BF16, 5, 8, 8);
  a.labels = rlk_tensor_1d(lab, RLK_I64, 3);
  a.logp = rlk_tensor_1d(lp, RLK_F32, 3);
  a.lse = rlk_tensor_1d(lse, RLK_F32, 3);
  a.rows = rlk_tensor_1d(sel, RLK_I64, 3);
  size_t wsb = 0;
  ck_assert_int_eq(rlk_linear_logprob_workspace_size(ctx, &a, &wsb), RLK_OK);
  ck_assert_uint_gt(wsb, 0);
  void *ws = malloc(wsb + 16);
  a.workspace = (void *)(((uintptr_t)ws + 15) & ~(uintptr_t)15);
  a.workspace_bytes = wsb;
  ck_assert_msg(rlk_linear_logprob(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  static const struct {
    int what;
    const char *needle;
  } bad[] = {{0, "rows"}, {1, "rows"}, {2, "rows"}, {3, "rows"}, {4, "labels"}, {5, "logp"}, {6, "workspace"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rlk_linear_logprob_args b = a;
    switch (bad[i].what) {
    case 0: b.rows = rlk_tensor_1d(sel, RLK_F32, 3); break;        /* not an index dtype */
    case 1: b.rows = rlk_tensor_2d(sel2, RLK_I64, 2, 3, 3); break; /* 2-D */
    case 2: b.rows = rlk_tensor_1d(sel, RLK_I64, 0); break;        /* no row: as hidden [0, H] */
    case 3: b.rows = rlk_tensor_1d(sel, RLK_I64, 7); break;        /* more indices than hidden's rows */
    case 4: b.labels = rlk_tensor_1d(lab, RLK_I64, 6); break;      /* hidden's rows, not the selection's */
    case 5: b.logp = rlk_tensor_1d(lp, RLK_F32, 6); break;
    case 6: b.workspace_bytes = wsb - 1; break;
    }
    ck_assert_msg(rlk_linear_logprob(ctx, &b, NULL) == RLK_ERR_INVALID_ARGUMENT, "case %zu accepted", i);
    ck_assert_msg(strstr(rlk_last_error(), bad[i].needle) != NULL, "case %zu: '%s' lacks '%s'", i, rlk_last_error(),
                  bad[i].needle);
  }
  /* the backward: grad_hidden keeps hidden's shape, the per-row inputs the selection's */
  rlk_linear_logprob_backward_args b0;
  rlk_linear_logprob_backward_args_init(&b0);
  b0.hidden = a.hidden;
  b0.weight = a.weight;
  b0.labels = a.labels;
  b0.rows = a.rows;
  b0.lse = a.lse;
  b0.grad_logp = rlk_tensor_1d(g, RLK_F32, 3);
  b0.grad_hidden = rlk_tensor_2d(gh, RLK_F32, 6, 8, 8);
  size_t bwb = 0;
  ck_assert_int_eq(rlk_linear_logprob_backward_workspace_size(ctx, &b0, &bwb), RLK_OK);
  void *bws = malloc(bwb + 16);
  b0.workspace = (void *)(((uintptr_t)bws + 15) & ~(uintptr_t)15);
  b0.workspace_bytes = bwb;
  ck_assert_msg(rlk_linear_logprob_backward(ctx, &b0, NULL) == RLK_OK, "%s", rlk_last_error());
  rlk_linear_logprob_backward_args b = b0;
  b.grad_hidden = rlk_tensor_2d(gh, RLK_F32, 3, 8, 8);
  ck_assert_int_eq(rlk_linear_logprob_backward(ctx, &b, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "grad_hidden"), "%s", rlk_last_error());
  b = b0;
  b.rows = rlk_tensor_1d(sel, RLK_F16, 3);
  ck_assert_int_eq(rlk_linear_logprob_backward(ctx, &b, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "rows"), "%s", rlk_last_error());
  b = b0;
  b.lse = rlk_tensor_1d(lse, RLK_F32, 6);
  ck_assert_int_eq(rlk_linear_logprob_backward(ctx, &b, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "lse"), "%s", rlk_last_error());
  /* the policy loss's tokens are hidden's rows: no selection there */
  rlk_linear_policy_loss_args p;
  rlk_linear_policy_loss_args_init(&p);
  p.head = a;
  p.head.logp = p.head.lse = (rlk_tensor){0};
  ck_assert_int_eq(rlk_linear_policy_loss(ctx, &p, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "head.rows"), "%s", rlk_last_error());
  free(ws), free(bws);
  rlk_context_destroy(ctx);
}
END_TEST

/* A configuration line with rows= plans the selection's kernels beside the head's on every target:
 * the gather of hidden's rows; for the backward the scatter of grad_hidden's dtype and, for an f32
 * one (an accumulating call's sum starts from its rows) or on the host (the rows it writes), the
 * gather of its rows. The token chunks take no selection. */
START_TEST(plan_lists_the_selection_kernels) {
  static const struct {
    rlk_backend backend;
    const char *target;
  } targets[] = {{RLK_BACKEND_CUDA, "sm_90a"}, {RLK_BACKEND_CUDA, "sm_80"}, {RLK_BACKEND_HOST, NULL}};
  static const struct {
    const char *line;
    int gathers, scatters; /* host, then GPU */
    int gpu_gathers;
  } lines[] = {{"linear_logprob pass=fwd hidden=bf16 labels=i64 rows=i32", 1, 0, 1},
               {"linear_logprob pass=bwd hidden=bf16 labels=i64 grad=f32 rows=i64", 2, 1, 2},
               {"linear_logprob pass=bwd hidden=f16 labels=i32 grad=same rows=i32", 1, 1, 1},
               {"linear_logprob pass=both hidden=bf16 labels=i64 grad=same rows=i64", 1, 1, 1},
               {"linear_logprob pass=both hidden=bf16 labels=i64", 0, 0, 0}};
  for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
    rlk_context *ctx = rlk_test_compile_only_context(targets[t].backend, targets[t].target, "rows plan");
    if (!ctx) continue;
    const int host = targets[t].backend == RLK_BACKEND_HOST;
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
      rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
      size_t n = 0;
      ck_assert_msg(rlk_test_plan_line(&rlk_op_linear_logprob, ctx, lines[i].line, specs, &n) == RLK_OK, "%s: %s",
                    lines[i].line, rlk_last_error());
      int gathers = 0, scatters = 0;
      for (size_t k = 0; k < n; k++) {
        gathers += !strcmp(specs[k].tmpl->entry, "linear_logprob_gather");
        scatters += !strcmp(specs[k].tmpl->entry, "linear_logprob_scatter");
      }
      ck_assert_msg(gathers == (host ? lines[i].gathers : lines[i].gpu_gathers) && scatters == lines[i].scatters,
                    "%s on %s: %d gathers, %d scatters", lines[i].line, host ? "host" : targets[t].target, gathers,
                    scatters);
    }
    rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
    size_t n = 0;
    ck_assert_int_eq(rlk_test_plan_line(&rlk_op_linear_logprob, ctx, "linear_logprob pass=chunks rows=i32", specs, &n),
                     RLK_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(rlk_last_error(), "rows"), "%s", rlk_last_error());
    rlk_context_destroy(ctx);
  }
}
END_TEST

Suite *linear_logprob_rows_suite(void) {
  Suite *s = suite_create("linear_logprob_rows");
  rlk_test_add_case(s, "host", 300, TESTS(host_rows, bad_arguments));
  rlk_test_add_case(s, "plan", 300, TESTS(plan_lists_the_selection_kernels));
  rlk_test_add_case(s, "gpu", 600, TESTS(gpu_rows));
  return s;
}

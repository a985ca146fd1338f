/* test_invariance.c - batch invariance: a row's outputs are the same bits whatever the rows around
 * it. Each case computes a pool of rows once in one call (the base), then calls again on batches
 * of N rows drawn from the pool (a random permutation, or with repeats past the pool's size) under
 * other schedules (row strides, splits, chunks, token chunks, paths), and compares every row's
 * outputs with its base bits (memcmp, not a tolerance):
 *   - rlk_linear_logprob: logp, lse, entropy (both kernels on a GPU);
 *   - rlk_linear_logprob_backward: grad_hidden's rows (f32 and 16-bit), any chunk;
 *   - rlk_linear_policy_loss: the head's logp and grad_hidden's rows (a per-token loss with a
 *     given normalizer), by each path; the token chunks' logp equal to rlk_linear_logprob's;
 *   - rlk_logprob: logp, lse, entropy, rows at every 16-byte alignment (an odd V in 16 bits);
 *   - rlk_sample with per-row seeds and settings (every filter mix): token, logp, logp_filtered,
 *     threshold;
 *   - the fused head's plan: a row's records come from V alone, whatever N (the split count, a
 *     schedule, may follow N).
 * The host backend runs small pools; with RLK_TEST_GPU=1 the CUDA cases take N over {1, 2, 3, 7,
 * 64, 255, 256, 4096, 16384, 65536} at V 151936, H 4096 (make test-gpu); rlk_linear_logprob's also
 * 12 and 30 (small h boxes) and 420 (four row blocks, the last short: sm_90a's pairs). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "linear_logprob_check.h"
#include "ops/linear_logprob_plan.h"
#include "suites.h"
#include "test_util.h"

/* ---------------------------------------------------------------------------------- */
/* Device buffers (host memory on the host backend)                                    */
/* ---------------------------------------------------------------------------------- */

static void inv_down(rlk_context *ctx, void *dst, const void *src, size_t bytes) {
  ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, dst, src, bytes), RLK_OK);
}

/* The device block of k rows of n 4-byte values (rlk_test_block_row's) as [n][k] on the host:
 * each batch row's outputs side by side. */
static void inv_down_rows(rlk_context *ctx, float *out, const void *block, int64_t n, int k) {
  float *t = malloc((size_t)(n * k) * 4);
  inv_down(ctx, t, block, (size_t)(n * k) * 4);
  for (int64_t j = 0; j < n; j++)
    for (int q = 0; q < k; q++) out[k * j + q] = t[q * n + j];
  free(t);
}

static int inv_gpu(rlk_context *ctx) { return rlk_context_backend(ctx) != RLK_BACKEND_HOST; }

/* The rows a batch takes from the pool: a random permutation of n rows when n <= P, else each row
 * drawn at random (repeats). */
static void inv_pick(uint64_t *rng, int64_t P, int64_t n, int64_t *idx) {
  if (n <= P) {
    int64_t *all = malloc((size_t)P * sizeof *all);
    for (int64_t i = 0; i < P; i++) all[i] = i;
    for (int64_t i = 0; i < n; i++) {
      const int64_t j = i + (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)(P - i));
      const int64_t t = all[i];
      all[i] = all[j], all[j] = t;
      idx[i] = all[i];
    }
    free(all);
  } else {
    for (int64_t i = 0; i < n; i++) idx[i] = (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)P);
  }
}

/* Row j of `got` (`width` values of `esize` bytes) against row idx[j] of `base`, bit for bit. */
static void inv_same(const void *base, const void *got, const int64_t *idx, int64_t n, size_t width,
                     size_t esize, const char *what, const char *how) {
  const size_t rb = width * esize;
  for (int64_t j = 0; j < n; j++)
    ck_assert_msg(memcmp((const char *)base + (size_t)idx[j] * rb, (const char *)got + (size_t)j * rb, rb) == 0,
                  "%s: row %lld (pool row %lld) differs from its base bits (%s)", what, (long long)j,
                  (long long)idx[j], how);
  /* every output written: the outputs start as 0xff bytes (rlk_test_dev_alloc), which two runs
   * that wrote nothing would repeat bit for bit */
  for (size_t w = 0; w < (size_t)n * rb / 4; w++) {
    uint32_t x;
    memcpy(&x, (const char *)got + 4 * w, 4);
    ck_assert_msg(x != 0xffffffffu, "%s: row %zu left unwritten (%s)", what, w * 4 / rb, how);
  }
}

/* ---------------------------------------------------------------------------------- */
/* The fused head: a pool of rows                                                      */
/* ---------------------------------------------------------------------------------- */

typedef struct inv_head {
  int64_t P, H, V;
  rlk_dtype dt;
  uint16_t *h;      /* P x H, on the host */
  int64_t *lab;     /* P (some -100) */
  float *glp, *gent; /* P: upstream gradients of the backward */
  void *w;          /* V x H on the device */
} inv_head;

static void head_new(rlk_context *ctx, uint64_t *rng, int64_t P, int64_t H, int64_t V, rlk_dtype dt,
                     inv_head *hd) {
  hd->P = P, hd->H = H, hd->V = V, hd->dt = dt;
  hd->h = malloc((size_t)(P * H) * 2);
  hd->lab = malloc((size_t)P * 8);
  hd->glp = malloc((size_t)P * 4);
  hd->gent = malloc((size_t)P * 4);
  uint16_t *w = malloc((size_t)(V * H) * 2);
  ck_assert(hd->h && hd->lab && hd->glp && hd->gent && w);
  /* logits of spread about 3: h ~ N(0, 1), w ~ N(0, 3 / sqrt H) */
  const double ws = 3.0 / sqrt((double)H);
  for (int64_t i = 0; i < P * H; i++) rlk_test_store(hd->h, dt, i, rlk_test_rand_unit(rng));
  for (int64_t i = 0; i < V * H; i++) rlk_test_store(w, dt, i, ws * rlk_test_rand_unit(rng));
  for (int64_t i = 0; i < P; i++) {
    hd->lab[i] = i % 9 == 4 ? -100 : (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)V);
    hd->glp[i] = (float)rlk_test_rand_normal(rng);
    hd->gent[i] = (float)(0.1 * rlk_test_rand_normal(rng));
  }
  hd->w = rlk_test_dev_upload(ctx, w, (size_t)(V * H) * 2);
  free(w);
}

static void head_free(rlk_context *ctx, inv_head *hd) {
  free(hd->h), free(hd->lab), free(hd->glp), free(hd->gent);
  rlk_free(ctx, hd->w);
}

/* A batch of the pool's rows idx[0, n): hidden with row stride hs (>= H; the padding NaN), labels,
 * upstream gradients, on the device. */
typedef struct inv_batch {
  int64_t n, hs;
  void *h, *lab, *glp, *gent;
} inv_batch;

static inv_batch batch_of(rlk_context *ctx, const inv_head *hd, const int64_t *idx, int64_t n, int64_t hs) {
  inv_batch b = {n, hs, NULL, NULL, NULL, NULL};
  uint16_t *h = malloc((size_t)(n * hs) * 2);
  int64_t *lab = malloc((size_t)n * 8);
  float *glp = malloc((size_t)n * 4), *gent = malloc((size_t)n * 4);
  ck_assert(h && lab && glp && gent);
  memset(h, 0xff, (size_t)(n * hs) * 2);
  for (int64_t j = 0; j < n; j++) {
    memcpy(h + j * hs, hd->h + idx[j] * hd->H, (size_t)hd->H * 2);
    lab[j] = hd->lab[idx[j]];
    glp[j] = hd->glp[idx[j]];
    gent[j] = hd->gent[idx[j]];
  }
  b.h = rlk_test_dev_upload(ctx, h, (size_t)(n * hs) * 2);
  b.lab = rlk_test_dev_upload(ctx, lab, (size_t)n * 8);
  b.glp = rlk_test_dev_upload(ctx, glp, (size_t)n * 4);
  b.gent = rlk_test_dev_upload(ctx, gent, (size_t)n * 4);
  free(h), free(lab), free(glp), free(gent);
  return b;
}

static void batch_free(rlk_context *ctx, inv_batch *b) {
  rlk_free(ctx, b->h), rlk_free(ctx, b->lab), rlk_free(ctx, b->glp), rlk_free(ctx, b->gent);
}

/* The forward of a batch: logp, lse, entropy as [n][3] floats on the host (*out, malloc'ed), and
 * on the device lse and entropy for a backward (*d_lse, *d_ent, when asked). */
static void head_fwd(rlk_context *ctx, const inv_head *hd, const inv_batch *b, rlk_linear_logprob_variant variant,
                     int splits, float *out, void **d_lse, void **d_ent) {
  const int64_t n = b->n;
  void *lp = rlk_test_dev_alloc(ctx, (size_t)n * 4), *lse = rlk_test_dev_alloc(ctx, (size_t)n * 4),
       *ent = rlk_test_dev_alloc(ctx, (size_t)n * 4);
  rlk_linear_logprob_args a;
  rlk_linear_logprob_args_init(&a);
  a.hidden = rlk_tensor_2d(b->h, hd->dt, n, hd->H, b->hs);
  a.weight = rlk_tensor_2d(hd->w, hd->dt, hd->V, hd->H, hd->H);
  a.labels = rlk_tensor_1d(b->lab, RLK_I64, n);
  a.temperature = 0.9f;
  a.logp = rlk_tensor_1d(lp, RLK_F32, n);
  a.lse = rlk_tensor_1d(lse, RLK_F32, n);
  a.entropy = rlk_tensor_1d(ent, RLK_F32, n);
  a.variant = variant;
  a.splits = splits;
  rlk_test_workspace(ctx, rlk_linear_logprob_workspace_size(ctx, &a, &a.workspace_bytes),
                     &a.workspace_bytes, &a.workspace, &a.workspace_bytes);
  ck_assert_msg(rlk_linear_logprob(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  float *t = malloc((size_t)n * 12);
  inv_down(ctx, t, lp, (size_t)n * 4);
  inv_down(ctx, t + n, lse, (size_t)n * 4);
  inv_down(ctx, t + 2 * n, ent, (size_t)n * 4);
  for (int64_t j = 0; j < n; j++) out[3 * j] = t[j], out[3 * j + 1] = t[n + j], out[3 * j + 2] = t[2 * n + j];
  free(t);
  if (a.workspace) rlk_free(ctx, a.workspace);
  rlk_free(ctx, lp);
  if (d_lse) *d_lse = lse; else rlk_free(ctx, lse);
  if (d_ent) *d_ent = ent; else rlk_free(ctx, ent);
}

/* grad_hidden of a batch ([n][H] f32 on the host, from gdt) for the forward's lse and entropy. */
static void head_bwd(rlk_context *ctx, const inv_head *hd, const inv_batch *b, void *lse, void *ent, rlk_dtype gdt,
                     int chunk, float *out) {
  const int64_t n = b->n, H = hd->H, es = (int64_t)rlk_dtype_size(gdt);
  void *gh = rlk_test_dev_alloc(ctx, (size_t)(n * H * es));
  rlk_linear_logprob_backward_args a;
  rlk_linear_logprob_backward_args_init(&a);
  a.hidden = rlk_tensor_2d(b->h, hd->dt, n, H, b->hs);
  a.weight = rlk_tensor_2d(hd->w, hd->dt, hd->V, H, H);
  a.labels = rlk_tensor_1d(b->lab, RLK_I64, n);
  a.temperature = 0.9f;
  a.lse = rlk_tensor_1d(lse, RLK_F32, n);
  a.entropy = rlk_tensor_1d(ent, RLK_F32, n);
  a.grad_logp = rlk_tensor_1d(b->glp, RLK_F32, n);
  a.grad_entropy = rlk_tensor_1d(b->gent, RLK_F32, n);
  a.grad_hidden = rlk_tensor_2d(gh, gdt, n, H, H);
  a.chunk = chunk;
  rlk_test_workspace(ctx, rlk_linear_logprob_backward_workspace_size(ctx, &a, &a.workspace_bytes),
                     &a.workspace_bytes, &a.workspace, &a.workspace_bytes);
  ck_assert_msg(rlk_linear_logprob_backward(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  void *t = malloc((size_t)(n * H * es));
  inv_down(ctx, t, gh, (size_t)(n * H * es));
  for (int64_t i = 0; i < n * H; i++) out[i] = (float)rlk_test_load(t, gdt, i);
  free(t);
  if (a.workspace) rlk_free(ctx, a.workspace);
  rlk_free(ctx, gh);
}

/* The whole policy loss of a batch as one sequence [1, n] (PPO, token-mean over a given
 * normalizer, so that a token's gradient is its own): the head's logp [n] and grad_hidden [n][H]
 * on the host. */
static void head_policy(rlk_context *ctx, const inv_head *hd, const inv_batch *b, rlk_linear_policy_loss_path path,
                        float *logp, float *gh_out) {
  const int64_t n = b->n, H = hd->H;
  float *old = malloc((size_t)n * 4), *adv = malloc((size_t)n * 4);
  int64_t *lab = malloc((size_t)n * 8);
  inv_down(ctx, lab, b->lab, (size_t)n * 8);
  float *glp = malloc((size_t)n * 4);
  inv_down(ctx, glp, b->glp, (size_t)n * 4);
  for (int64_t j = 0; j < n; j++) {
    /* per row from its own values: the pool row's upstream gradient stands in for both */
    old[j] = -3.0f + 0.5f * glp[j];
    adv[j] = glp[j];
  }
  void *d_old = rlk_test_dev_upload(ctx, old, (size_t)n * 4), *d_adv = rlk_test_dev_upload(ctx, adv, (size_t)n * 4);
  void *d_lp = rlk_test_dev_alloc(ctx, (size_t)n * 4), *d_loss = rlk_test_dev_alloc(ctx, 4);
  void *d_gh = rlk_test_dev_alloc(ctx, (size_t)(n * H) * 4);
  rlk_linear_policy_loss_args a;
  rlk_linear_policy_loss_args_init(&a);
  a.head.hidden = rlk_tensor_2d(b->h, hd->dt, n, H, b->hs);
  a.head.weight = rlk_tensor_2d(hd->w, hd->dt, hd->V, H, H);
  a.head.labels = rlk_tensor_1d(b->lab, RLK_I64, n);
  a.head.temperature = 0.9f;
  a.head.logp = rlk_tensor_1d(d_lp, RLK_F32, n);
  ll_policy_over_rows(&a, d_old, d_adv, d_loss, d_gh, n, H, 1000.0, path);
  ll_run_policy_loss(ctx, &a);
  inv_down(ctx, logp, d_lp, (size_t)n * 4);
  inv_down(ctx, gh_out, d_gh, (size_t)(n * H) * 4);
  if (a.workspace) rlk_free(ctx, a.workspace);
  rlk_free(ctx, d_old), rlk_free(ctx, d_adv), rlk_free(ctx, d_lp), rlk_free(ctx, d_loss), rlk_free(ctx, d_gh);
  free(old), free(adv), free(lab), free(glp);
}

/* The schedules a batch runs under: row stride padding, splits (0: chosen), backward chunk. */
typedef struct inv_sched {
  int64_t hpad;
  int splits, chunk;
} inv_sched;

/* The forward, backward and (with `policy`) the policy loss of N rows drawn from the pool, under
 * every schedule, against the pool's base bits; `variant` as the call's. */
static void head_cases(rlk_context *ctx, uint64_t *rng, const inv_head *hd, rlk_linear_logprob_variant variant,
                       const int64_t *Ns, size_t nN, int64_t bwd_most, int policy) {
  const int64_t P = hd->P, H = hd->H;
  int64_t *all = malloc((size_t)P * 8);
  for (int64_t i = 0; i < P; i++) all[i] = i;
  /* the base: every pool row once, in order, the call's own choices */
  inv_batch b0 = batch_of(ctx, hd, all, P, H);
  float *base = malloc((size_t)P * 12), *base_gh = malloc((size_t)(P * H) * 4),
        *base_gh16 = malloc((size_t)(P * H) * 4);
  void *lse, *ent;
  head_fwd(ctx, hd, &b0, variant, 0, base, &lse, &ent);
  head_bwd(ctx, hd, &b0, lse, ent, RLK_F32, 0, base_gh);
  head_bwd(ctx, hd, &b0, lse, ent, hd->dt, 0, base_gh16);
  rlk_free(ctx, lse), rlk_free(ctx, ent);
  float *base_plp = NULL, *base_pgh = NULL;
  rlk_linear_policy_loss_path paths[2] = {RLK_LPL_RECOMPUTE, RLK_LPL_TOKEN_CHUNKS};
  const int npaths = policy > 1 ? 2 : policy;
  if (policy) {
    base_plp = malloc((size_t)(2 * P) * 4);
    base_pgh = malloc((size_t)(2 * P * H) * 4);
    for (int q = 0; q < npaths; q++) {
      head_policy(ctx, hd, &b0, paths[q], base_plp + q * P, base_pgh + q * P * H);
      /* either path's log-probs are the forward's, bit for bit */
      for (int64_t i = 0; i < P; i++)
        ck_assert_msg(memcmp(&base_plp[q * P + i], &base[3 * i], 4) == 0,
                      "linear_policy_loss path %d: logp of row %lld is not rlk_linear_logprob's", (int)paths[q],
                      (long long)i);
    }
  }
  batch_free(ctx, &b0);
  const inv_sched sched[] = {{0, 0, 0}, {24, 1, 256}, {8, 7, 768}};
  for (size_t k = 0; k < nN; k++) {
    const int64_t n = Ns[k];
    int64_t *idx = malloc((size_t)n * 8);
    float *out = malloc((size_t)n * 12), *gh = malloc((size_t)(n * H) * 4);
    inv_pick(rng, P, n, idx);
    for (size_t s = 0; s < sizeof sched / sizeof sched[0]; s++) {
      if (s > 0 && n > 4096) break; /* the large batches under the call's own choices */
      char how[96];
      snprintf(how, sizeof how, "N %lld, row pad %lld, splits %d, chunk %d, variant %d", (long long)n,
               (long long)sched[s].hpad, sched[s].splits, sched[s].chunk, (int)variant);
      inv_batch b = batch_of(ctx, hd, idx, n, H + sched[s].hpad);
      head_fwd(ctx, hd, &b, variant, sched[s].splits, out, &lse, &ent);
      inv_same(base, out, idx, n, 3, 4, "linear_logprob logp, lse, entropy", how);
      if (n <= bwd_most) {
        head_bwd(ctx, hd, &b, lse, ent, RLK_F32, sched[s].chunk, gh);
        inv_same(base_gh, gh, idx, n, (size_t)H, 4, "linear_logprob_backward grad_hidden (f32)", how);
        head_bwd(ctx, hd, &b, lse, ent, hd->dt, sched[s].chunk, gh);
        inv_same(base_gh16, gh, idx, n, (size_t)H, 4, "linear_logprob_backward grad_hidden (16-bit)", how);
      }
      rlk_free(ctx, lse), rlk_free(ctx, ent);
      if (policy && n <= bwd_most && s == 0) {
        for (int q = 0; q < npaths; q++) {
          float *plp = malloc((size_t)n * 4);
          head_policy(ctx, hd, &b, paths[q], plp, gh);
          inv_same(base_plp + q * P, plp, idx, n, 1, 4, "linear_policy_loss logp", how);
          inv_same(base_pgh + q * P * H, gh, idx, n, (size_t)H, 4, "linear_policy_loss grad_hidden", how);
          free(plp);
        }
      }
      batch_free(ctx, &b);
    }
    printf("invariance %s: linear_logprob variant %d, N %lld: every row's bits its base's\n",
           inv_gpu(ctx) ? "gpu" : "host", (int)variant, (long long)n);
    free(idx), free(out), free(gh);
  }
  free(all), free(base), free(base_gh), free(base_gh16), free(base_plp), free(base_pgh);
}

static void cases_linear_logprob(rlk_context *ctx, uint64_t *rng) {
  inv_head hd;
  if (!inv_gpu(ctx)) {
    static const int64_t Ns[] = {1, 2, 3, 7, 40, 64, 100};
    head_new(ctx, rng, 64, 40, 700, RLK_BF16, &hd);
    head_cases(ctx, rng, &hd, RLK_LINEAR_LOGPROB_AUTO, Ns, sizeof Ns / sizeof Ns[0], 100, 1);
    head_free(ctx, &hd);
    return;
  }
  static const int64_t Ns[] = {1, 2, 3, 7, 12, 30, 64, 255, 256, 420, 4096, 16384, 65536};
  rlk_device_info info;
  ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
  const int sm90 = info.compute_major == 9 && info.compute_minor == 0;
  head_new(ctx, rng, 512, 4096, 151936, RLK_BF16, &hd);
  head_cases(ctx, rng, &hd, RLK_LINEAR_LOGPROB_AUTO, Ns, sizeof Ns / sizeof Ns[0], 4096, sm90 ? 2 : 1);
  head_free(ctx, &hd);
  /* the portable kernels (every GPU), and a head no 64-column K step divides */
  static const int64_t few[] = {1, 3, 255, 4096};
  head_new(ctx, rng, 300, 1000, 50257, RLK_F16, &hd);
  head_cases(ctx, rng, &hd, RLK_LINEAR_LOGPROB_TILED, few, sizeof few / sizeof few[0], 4096, 0);
  head_cases(ctx, rng, &hd, RLK_LINEAR_LOGPROB_AUTO, few, sizeof few / sizeof few[0], 4096, 0);
  head_free(ctx, &hd);
}

RLK_HOST_CASE(linear_logprob)
RLK_GPU_CASE("invariance", linear_logprob)

/* ---------------------------------------------------------------------------------- */
/* Logits: rlk_logprob and rlk_sample                                                  */
/* ---------------------------------------------------------------------------------- */

/* A pool of P rows of V logits (dt) on the host, with a row's labels and sampling settings. */
typedef struct inv_logits {
  int64_t P, V;
  rlk_dtype dt;
  void *x;        /* P x V */
  int64_t *lab;   /* P */
  float *temp, *top_p, *min_p;
  int64_t *top_k, *seed, *offset;
} inv_logits;

static void logits_new(uint64_t *rng, int64_t P, int64_t V, rlk_dtype dt, inv_logits *L) {
  L->P = P, L->V = V, L->dt = dt;
  const size_t es = rlk_dtype_size(dt);
  L->x = malloc((size_t)(P * V) * es);
  L->lab = malloc((size_t)P * 8);
  L->temp = malloc((size_t)P * 4), L->top_p = malloc((size_t)P * 4), L->min_p = malloc((size_t)P * 4);
  L->top_k = malloc((size_t)P * 8), L->seed = malloc((size_t)P * 8), L->offset = malloc((size_t)P * 8);
  ck_assert(L->x && L->lab && L->temp && L->top_p && L->min_p && L->top_k && L->seed && L->offset);
  for (int64_t i = 0; i < P * V; i++) rlk_test_store(L->x, dt, i, 3.0 * rlk_test_rand_unit(rng));
  for (int64_t i = 0; i < P; i++) {
    L->lab[i] = i % 9 == 4 ? -100 : (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)V);
    /* every filter mix: none, top-k, top-p, min-p, all, greedy */
    const int mix = (int)(i % 6);
    L->temp[i] = mix == 5 ? 0.0f : (float)(0.5 + rlk_test_rand_uniform(rng));
    L->top_k[i] = mix == 1 || mix == 4 ? 1 + (int64_t)(rlk_test_rand_u64(rng) % 60) : 0;
    L->top_p[i] = mix == 2 || mix == 4 ? (float)(0.5 + 0.45 * rlk_test_rand_uniform(rng)) : 1.0f;
    L->min_p[i] = mix == 3 || mix == 4 ? (float)(0.02 * rlk_test_rand_uniform(rng)) : 0.0f;
    L->seed[i] = (int64_t)rlk_test_rand_u64(rng);
    L->offset[i] = (int64_t)(rlk_test_rand_u64(rng) % 1000);
  }
}

static void logits_free(inv_logits *L) {
  free(L->x), free(L->lab), free(L->temp), free(L->top_p), free(L->min_p), free(L->top_k), free(L->seed),
      free(L->offset);
}

/* The pool's rows idx[0, n) with row stride rs (>= V) on the device; a row's per-row values
 * (`per` bytes each of `src`) gathered the same way by rows_of. */
static void *logits_batch(rlk_context *ctx, const inv_logits *L, const int64_t *idx, int64_t n, int64_t rs) {
  const size_t es = rlk_dtype_size(L->dt);
  char *x = malloc((size_t)((n - 1) * rs + L->V) * es);
  ck_assert(x);
  for (int64_t j = 0; j < n; j++) memcpy(x + (size_t)(j * rs) * es, (char *)L->x + (size_t)(idx[j] * L->V) * es,
                                        (size_t)L->V * es);
  void *d = rlk_test_dev_upload(ctx, x, (size_t)((n - 1) * rs + L->V) * es);
  free(x);
  return d;
}

static void *rows_of(rlk_context *ctx, const void *src, size_t per, const int64_t *idx, int64_t n) {
  char *t = malloc((size_t)n * per);
  for (int64_t j = 0; j < n; j++) memcpy(t + (size_t)j * per, (const char *)src + (size_t)idx[j] * per, per);
  void *d = rlk_test_dev_upload(ctx, t, (size_t)n * per);
  free(t);
  return d;
}

/* rlk_logprob of a batch: logp, lse, entropy as [n][3] on the host. */
static void logits_logprob(rlk_context *ctx, const inv_logits *L, const int64_t *idx, int64_t n, int64_t rs,
                           float *out) {
  void *x = logits_batch(ctx, L, idx, n, rs), *lab = rows_of(ctx, L->lab, 8, idx, n);
  void *o = rlk_test_dev_alloc(ctx, (size_t)n * 12);
  rlk_logprob_args a;
  rlk_logprob_args_init(&a);
  a.logits = rlk_tensor_2d(x, L->dt, n, L->V, rs);
  a.labels = rlk_tensor_1d(lab, RLK_I64, n);
  a.temperature = 0.8f;
  a.logp = rlk_test_block_row(o, RLK_F32, 0, n);
  a.lse = rlk_test_block_row(o, RLK_F32, 1, n);
  a.entropy = rlk_test_block_row(o, RLK_F32, 2, n);
  ck_assert_msg(rlk_logprob(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  inv_down_rows(ctx, out, o, n, 3);
  rlk_free(ctx, x), rlk_free(ctx, lab), rlk_free(ctx, o);
}

/* rlk_sample of a batch with per-row settings: [n][4] of (the token's i32 bits, logp,
 * logp_filtered, threshold) on the host. */
static void logits_sample(rlk_context *ctx, const inv_logits *L, const int64_t *idx, int64_t n, int64_t rs,
                          float *out) {
  void *x = logits_batch(ctx, L, idx, n, rs);
  void *temp = rows_of(ctx, L->temp, 4, idx, n), *tk = rows_of(ctx, L->top_k, 8, idx, n),
       *tp = rows_of(ctx, L->top_p, 4, idx, n), *mp = rows_of(ctx, L->min_p, 4, idx, n),
       *sd = rows_of(ctx, L->seed, 8, idx, n), *of = rows_of(ctx, L->offset, 8, idx, n);
  void *o = rlk_test_dev_alloc(ctx, (size_t)n * 16);
  rlk_sample_args a;
  rlk_sample_args_init(&a);
  a.logits = rlk_tensor_2d(x, L->dt, n, L->V, rs);
  a.temperatures = rlk_tensor_1d(temp, RLK_F32, n);
  a.top_ks = rlk_tensor_1d(tk, RLK_I64, n);
  a.top_ps = rlk_tensor_1d(tp, RLK_F32, n);
  a.min_ps = rlk_tensor_1d(mp, RLK_F32, n);
  a.seeds = rlk_tensor_1d(sd, RLK_I64, n);
  a.offsets = rlk_tensor_1d(of, RLK_I64, n);
  a.tokens = rlk_test_block_row(o, RLK_I32, 0, n);
  a.logp = rlk_test_block_row(o, RLK_F32, 1, n);
  a.logp_filtered = rlk_test_block_row(o, RLK_F32, 2, n);
  a.threshold = rlk_test_block_row(o, RLK_F32, 3, n);
  ck_assert_msg(rlk_sample(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  inv_down_rows(ctx, out, o, n, 4);
  rlk_free(ctx, x), rlk_free(ctx, temp), rlk_free(ctx, tk), rlk_free(ctx, tp), rlk_free(ctx, mp);
  rlk_free(ctx, sd), rlk_free(ctx, of), rlk_free(ctx, o);
}

typedef void (*inv_logits_fn)(rlk_context *ctx, const inv_logits *L, const int64_t *idx, int64_t n, int64_t rs,
                              float *out);

/* A call on logits and the values it gives a row. */
typedef struct inv_logits_call {
  inv_logits_fn fn;
  size_t width;
  const char *what;
} inv_logits_call;

static const inv_logits_call inv_logprob = {logits_logprob, 3, "logprob logp, lse, entropy"};
static const inv_logits_call inv_sample = {logits_sample, 4, "sample token, logp, logp_filtered, threshold"};

/* A call on batches of N rows from the pool (contiguous rows of stride V, so that with an odd V in
 * 16 bits a row's address alignment follows its place; then rows 3 elements wider) against the
 * pool's base bits. */
static void logits_cases(rlk_context *ctx, uint64_t *rng, const inv_logits *L, const inv_logits_call *call,
                         const int64_t *Ns, size_t nN) {
  const int64_t P = L->P;
  const size_t width = call->width;
  const char *what = call->what;
  int64_t *all = malloc((size_t)P * 8);
  for (int64_t i = 0; i < P; i++) all[i] = i;
  float *base = malloc((size_t)P * width * 4);
  call->fn(ctx, L, all, P, L->V, base);
  for (size_t k = 0; k < nN; k++) {
    const int64_t n = Ns[k];
    int64_t *idx = malloc((size_t)n * 8);
    float *out = malloc((size_t)n * width * 4);
    inv_pick(rng, P, n, idx);
    for (int pad = 0; pad < 2; pad++) {
      char how[64];
      snprintf(how, sizeof how, "N %lld, row stride V + %d, V %lld %s", (long long)n, 3 * pad, (long long)L->V,
               rlk_dtype_name(L->dt));
      call->fn(ctx, L, idx, n, L->V + 3 * pad, out);
      inv_same(base, out, idx, n, width, 4, what, how);
    }
    printf("invariance %s: %s V %lld %s, N %lld: every row's bits its base's\n", inv_gpu(ctx) ? "gpu" : "host", what,
           (long long)L->V, rlk_dtype_name(L->dt), (long long)n);
    free(idx), free(out);
  }
  free(all), free(base);
}

static void cases_logits(rlk_context *ctx, uint64_t *rng) {
  inv_logits L;
  if (!inv_gpu(ctx)) {
    static const int64_t Ns[] = {1, 2, 3, 7, 40, 100};
    logits_new(rng, 48, 1001, RLK_BF16, &L);
    logits_cases(ctx, rng, &L, &inv_logprob, Ns, sizeof Ns / sizeof Ns[0]);
    logits_cases(ctx, rng, &L, &inv_sample, Ns, sizeof Ns / sizeof Ns[0]);
    logits_free(&L);
    return;
  }
  static const int64_t Ns[] = {1, 2, 3, 7, 64, 255, 256, 4096, 16384, 65536};
  static const int64_t few[] = {1, 3, 255, 4096};
  /* an odd V in 16 bits: rows at every alignment */
  logits_new(rng, 256, 32003, RLK_BF16, &L);
  logits_cases(ctx, rng, &L, &inv_logprob, Ns, sizeof Ns / sizeof Ns[0]);
  logits_cases(ctx, rng, &L, &inv_sample, Ns, sizeof Ns / sizeof Ns[0]);
  logits_free(&L);
  logits_new(rng, 64, 151936, RLK_F32, &L);
  logits_cases(ctx, rng, &L, &inv_logprob, few, sizeof few / sizeof few[0]);
  logits_cases(ctx, rng, &L, &inv_sample, few, sizeof few / sizeof few[0]);
  logits_free(&L);
}

RLK_HOST_CASE(logits)
RLK_GPU_CASE("invariance", logits)

/* The fused head's plan: a row's records (and with them the combine's tree) from V alone, for
 * every N; the split count, a schedule, may follow N but covers whole records; the workspace a
 * call asks for is 16 bytes a record for the rows of a launch. */
START_TEST(records_from_v_alone) {
  static const int64_t Vs[] = {1, 255, 256, 257, 32000, 50257, 151936};
  static const int64_t Ns[] = {1, 2, 3, 7, 64, 255, 256, 4096, 16384, 65536, (int64_t)1 << 20};
  for (size_t v = 0; v < sizeof Vs / sizeof Vs[0]; v++) {
    const int64_t V = Vs[v], records = rlk_ll_fwd_records(V);
    ck_assert_int_eq(records, (V + 255) / 256);
    for (size_t k = 0; k < sizeof Ns / sizeof Ns[0]; k++) {
      const int64_t rows = rlk_ll_fwd_rows(Ns[k], V, (int64_t)128 << 20);
      ck_assert_int_le(rows, Ns[k]);
      ck_assert(rows == Ns[k] || rows % 128 == 0);
      ck_assert_int_le(rows * records * 16, rows > 128 ? (int64_t)128 << 20 : rows * records * 16);
      int64_t splits, cps;
      rlk_ll_fwd_splits(V, (rows + 127) / 128, 132, 0, &splits, &cps);
      ck_assert_int_eq(cps % RLK_LL_RECORD_COLS, 0);
      ck_assert_int_ge(splits * cps, V);
    }
  }
  /* through the call on sm_90a (a compile-only context: the size query reads shapes) */
  rlk_context *ctx = rlk_test_compile_only_cuda_context("sm_90a", "invariance plan");
  if (!ctx) return;
  char *fake = (char *)(uintptr_t)0x7f0000000000ull; /* never dereferenced */
  const int64_t H = 4096, V = 151936;
  for (size_t k = 0; k < sizeof Ns / sizeof Ns[0]; k++) {
    const int64_t N = Ns[k];
    rlk_linear_logprob_args a;
    rlk_linear_logprob_args_init(&a);
    a.hidden = rlk_tensor_2d(fake, RLK_BF16, N, H, H);
    a.weight = rlk_tensor_2d(fake + ((int64_t)1 << 34), RLK_BF16, V, H, H);
    a.labels = rlk_tensor_1d(fake + ((int64_t)1 << 35), RLK_I64, N);
    a.logp = rlk_tensor_1d(fake + ((int64_t)1 << 36), RLK_F32, N);
    size_t bytes = 0;
    ck_assert_msg(rlk_linear_logprob_workspace_size(ctx, &a, &bytes) == RLK_OK, "%s", rlk_last_error());
    const int64_t rows = rlk_ll_fwd_rows(N, V, (int64_t)128 << 20);
    ck_assert_uint_eq(bytes, (size_t)(rows * rlk_ll_fwd_records(V) * 16));
  }
  rlk_context_destroy(ctx);
}
END_TEST

/* The backward's blocks of rows: every N (to 2^20) within the 288 MiB budget, f32 and bf16
 * gradients, with and without a row selection (whose gathered rows of a block come beside it);
 * one block while the rows fit, else blocks of a multiple of 128 rows. Through the call's size
 * query on sm_90a (a compile-only context). */
START_TEST(backward_workspace_any_n) {
  static const int64_t Ns[] = {1, 3, 255, 4096, 16384, 16385, 65536, 100000, (int64_t)1 << 20};
  for (size_t k = 0; k < sizeof Ns / sizeof Ns[0]; k++) {
    const int64_t N = Ns[k], per = 4 * 4096 + 2 * 1024, rows = rlk_ll_bwd_block_rows(N, per, 0, (int64_t)288 << 20);
    ck_assert(rows == N || (rows % 128 == 0 && rows >= 128 && rows < N));
    ck_assert_int_le(rows * per, (int64_t)288 << 20); /* one block only while all rows fit */
  }
  ck_assert_int_eq(rlk_ll_bwd_block_rows(16384, 4 * 4096, 2 * 1024, (int64_t)288 << 20), 16384);
  ck_assert_int_eq(rlk_ll_bwd_block_rows(1000, 1 << 20, 0, 1 << 20), 128); /* at least 128 rows */
  rlk_context *ctx = rlk_test_compile_only_cuda_context("sm_90a", "backward blocks");
  if (!ctx) return;
  char *fake = (char *)(uintptr_t)0x7f0000000000ull; /* never dereferenced */
  const int64_t H = 4096, V = 151936;
  const size_t budget = (size_t)288 << 20;
  for (size_t k = 0; k < sizeof Ns / sizeof Ns[0]; k++)
    for (int g = 0; g < 2; g++)
      for (int sel = 0; sel < 2; sel++) {
        const int64_t N = Ns[k];
        const rlk_dtype gdt = g ? RLK_BF16 : RLK_F32;
        rlk_linear_logprob_backward_args b;
        rlk_linear_logprob_backward_args_init(&b);
        b.hidden = rlk_tensor_2d(fake, RLK_BF16, sel ? N + 7 : N, H, H);
        b.weight = rlk_tensor_2d(fake + ((int64_t)1 << 34), RLK_BF16, V, H, H);
        b.labels = rlk_tensor_1d(fake + ((int64_t)1 << 35), RLK_I64, N);
        b.lse = rlk_tensor_1d(fake + ((int64_t)1 << 36), RLK_F32, N);
        b.grad_logp = rlk_tensor_1d(fake + ((int64_t)1 << 37), RLK_F32, N);
        b.grad_hidden = rlk_tensor_2d(fake + ((int64_t)1 << 38), gdt, sel ? N + 7 : N, H, H);
        b.grad_weight = rlk_tensor_2d(fake + ((int64_t)1 << 39), gdt, V, H, H);
        if (sel) b.rows = rlk_tensor_1d(fake + ((int64_t)1 << 40), RLK_I64, N);
        size_t bytes = 0;
        ck_assert_msg(rlk_linear_logprob_backward_workspace_size(ctx, &b, &bytes) == RLK_OK, "%s", rlk_last_error());
        /* a selection's gathered rows come beside the budget: a block's at most (16384 rows of H
         * at 4 H + 2048 bytes a row) */
        const size_t beside = sel ? (size_t)(N < 16384 ? N : 16384) * (size_t)H * 2u + 256u : 0;
        ck_assert_msg(bytes <= budget + beside, "N %lld grad %s rows %d: %zu bytes of workspace over the budget",
                      (long long)N, rlk_dtype_name(gdt), sel, bytes);
        ck_assert(bytes > 0);
      }
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* RLK_INVARIANT=1                                                                     */
/* ---------------------------------------------------------------------------------- */

static void inv_keys(rlk_context *ctx, const char *line, char *keys, size_t size) {
  int n = 0;
  ck_assert_msg(rlk_precompile_keys(ctx, line, keys, size, &n) == RLK_OK && n > 0, "%s: %s", line, rlk_last_error());
}

/* What RLK_INVARIANT=1 refuses: rlk_logprob's bulk and tensor-map variants; the fused head's
 * fallback to the tiled kernels where no tensor map describes hidden (a row stride of H + 1); and
 * a tuning database's logprob winner for a token bucket is not read (the plan of a line with
 * tokens= is the default's). Each goes through without it. */
START_TEST(invariant_mode_refuses) {
  /* logprob's variants, on the host (where they fall back to the vector kernel without it) */
  rlk_context *host = rlk_test_host_context();
  float x[6] = {0.5f, 1.0f, -1.0f, 2.0f, 0.0f, 1.0f}, lp[2];
  int64_t lab[2] = {1, 2};
  rlk_logprob_args a;
  rlk_logprob_args_init(&a);
  a.logits = rlk_tensor_2d(x, RLK_F32, 2, 3, 3);
  a.labels = rlk_tensor_1d(lab, RLK_I64, 2);
  a.logp = rlk_tensor_1d(lp, RLK_F32, 2);
  a.variant = RLK_LOGPROB_VARIANT_BULK;
  unsetenv("RLK_INVARIANT");
  ck_assert_int_eq(rlk_logprob(host, &a, NULL), RLK_OK);
  setenv("RLK_INVARIANT", "1", 1);
  rlk_test_expect_error(rlk_logprob(host, &a, NULL), RLK_ERR_INVALID_ARGUMENT, "RLK_INVARIANT", "rlk_logprob");
  a.variant = RLK_LOGPROB_VARIANT_AUTO;
  ck_assert_int_eq(rlk_logprob(host, &a, NULL), RLK_OK);
  rlk_context_destroy(host);

  /* the fused head's fallback, on sm_90a (compile-only: the size query reads shapes) */
  char db[1100], dir[1024];
  rlk_test_mkdtemp(dir, sizeof dir, "inv-tune");
  snprintf(db, sizeof db, "%s/tune.db", dir);
  setenv("RLK_TUNE_DB", db, 1);
  rlk_context *ctx = rlk_test_compile_only_cuda_context("sm_90a", "invariant mode");
  if (!ctx) {
    unsetenv("RLK_INVARIANT");
    return;
  }
  char *fake = (char *)(uintptr_t)0x7f0000000000ull; /* never dereferenced */
  const int64_t N = 64, H = 4096, V = 151936;
  rlk_linear_logprob_args l;
  rlk_linear_logprob_args_init(&l);
  l.hidden = rlk_tensor_2d(fake, RLK_BF16, N, H, H + 1);
  l.weight = rlk_tensor_2d(fake + ((int64_t)1 << 34), RLK_BF16, V, H, H);
  l.labels = rlk_tensor_1d(fake + ((int64_t)1 << 35), RLK_I64, N);
  l.logp = rlk_tensor_1d(fake + ((int64_t)1 << 36), RLK_F32, N);
  size_t bytes;
  rlk_test_expect_error(rlk_linear_logprob_workspace_size(ctx, &l, &bytes), RLK_ERR_INVALID_ARGUMENT, "RLK_INVARIANT",
                        "rlk_linear_logprob_workspace_size");
  l.variant = RLK_LINEAR_LOGPROB_TILED; /* asked for: the caller's fixed choice */
  ck_assert_int_eq(rlk_linear_logprob_workspace_size(ctx, &l, &bytes), RLK_OK);
  l.variant = RLK_LINEAR_LOGPROB_AUTO;
  l.hidden = rlk_tensor_2d(fake, RLK_BF16, N, H, H);
  ck_assert_int_eq(rlk_linear_logprob_workspace_size(ctx, &l, &bytes), RLK_OK);
  unsetenv("RLK_INVARIANT");
  l.hidden = rlk_tensor_2d(fake, RLK_BF16, N, H, H + 1);
  ck_assert_int_eq(rlk_linear_logprob_workspace_size(ctx, &l, &bytes), RLK_OK);

  /* a logprob winner for 16384 rows: read without RLK_INVARIANT, not with it */
  rlk_device_info info;
  ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
  rlk_context_destroy(ctx);
  const char *fwd = "logprob pass=fwd logits=bf16 labels=i64 entropy=1 vocab=151936";
  char line[512];
  snprintf(line, sizeof line, "%s tokens=16384", fwd);
  rlk_tune_record r;
  rlk_tune_record_init(&r);
  ck_assert_int_eq(rlk_tune_record_set_key(&r, line), RLK_OK);
  ck_assert_int_eq(rlk_tune_record_set_env(&r, &info), RLK_OK);
  snprintf(r.winner, sizeof r.winner, "variant=vec block=1024 unroll=2");
  r.default_ms = 1.4, r.best_ms = 1.2, r.created = 1000;
  ck_assert_int_eq(rlk_tune_db_record(db, &r, 1), RLK_OK);
  char deflt[512], tuned[512];
  for (int on = 0; on < 2; on++) {
    if (on) setenv("RLK_INVARIANT", "1", 1);
    ctx = rlk_test_compile_only_cuda_context("sm_90a", "invariant mode");
    inv_keys(ctx, fwd, deflt, sizeof deflt);
    inv_keys(ctx, line, tuned, sizeof tuned);
    if (on)
      ck_assert_str_eq(tuned, deflt);
    else
      ck_assert_str_ne(tuned, deflt);
    rlk_context_destroy(ctx);
  }
  unsetenv("RLK_INVARIANT");
  unsetenv("RLK_TUNE_DB");
}
END_TEST

Suite *invariance_suite(void) {
  Suite *s = suite_create("invariance");
  rlk_test_add_case(s, "host", 300, TESTS(host_linear_logprob, host_logits, records_from_v_alone, backward_workspace_any_n,
      invariant_mode_refuses));
  rlk_test_add_case(s, "gpu", 1800, TESTS(gpu_linear_logprob, gpu_logits));
  return s;
}

/* rlk-bench-policy-loss - device time of the fused policy loss (forward + backward, both
 * launches) and the value loss, beside the bytes floor.
 *
 *   rlk-bench-policy-loss [--backend auto|cuda|hip|host] [--iters N] [--json FILE]
 *
 * Cases (f32, PPO with clip-higher 0.2/0.28 and dual clip 3, k3 KL with verl's clamps and coef
 * 0.001, token-mean; per-token advantages; sequence lengths drawn in [T/4, T) like the PyTorch
 * baseline tools/bench/torch_policy_loss.py):
 *   padded [B, T] with an f32 mask (the baseline's exact bytes) and with a bool mask,
 *   1024 x 4096 and 256 x 2048 (the bool-mask 1024 x 4096 case also with the normalizer left to
 *   the call: its mask count pass); the packed layout [N] + i64 offsets of the same sequences;
 *   GSPO with seq-mean-token-mean (a first pass per sequence); the value loss.
 * Each call is timed with device events around it after a warm-up; median, min and max over
 * --iters calls (a call on other buffers runs first, so the host time of the timed call is
 * hidden), plus the mean of 50 calls back to back. Inputs are rotated over enough buffer sets to
 * exceed the 60 MB L2 when one set fits in it. The floor is (bytes read + written) / 4.14 TB/s,
 * the H200's measured device-to-device copy rate; the goal for 1024 x 4096 is 0.05 ms. The loss
 * of the first call is checked against an fp64 evaluation on the host. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlk.h"

static const char *prog = "rlk-bench-policy-loss";
#include "tool_util.h"
#include "bench_util.h"

#define L2_BYTES (60.0 * 1024 * 1024)

typedef struct result {
  char name[112];
  double median_ms, min_ms, max_ms, floor_ms, goal_ms;
  double b2b_ms; /* mean per call of calls enqueued back to back */
  double bytes;
} result;

static result results[32];
static int nresults;

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static double urand(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng_state >> 11) * 0x1.0p-53;
}
static double nrand(void) {
  const double u = urand() + 1e-300, v = urand();
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

enum { CASE_POLICY = 0, CASE_GSPO = 1, CASE_VALUE = 2 };

typedef struct bench_case {
  const char *label;
  int64_t B, T;
  int packed;
  rlk_dtype mask; /* RLK_F32 or RLK_BOOL */
  int kind;       /* CASE_* */
  double goal_ms;
  int count;      /* token-mean by the call's own mask count (the count pass), no number */
} bench_case;

/* One set of device buffers for a case. */
typedef struct bufset {
  void *lp, *old, *ref, *adv, *mask, *offs, *grad, *scalars, *ws;
} bufset;

/* Host data of a case (one draw shared by every buffer set). */
typedef struct hostdata {
  int64_t N, B, T;
  int64_t *len, *offs;
  float *lp, *old, *ref, *adv, *maskf;
  uint8_t *maskb;
} hostdata;

static void host_free(hostdata *h) {
  free(h->len);
  free(h->offs);
  free(h->lp);
  free(h->old);
  free(h->ref);
  free(h->adv);
  free(h->maskf);
  free(h->maskb);
}

/* Padded: B x T with masks t < len; packed: the same sequences back to back. */
static int host_make(const bench_case *c, hostdata *h) {
  memset(h, 0, sizeof *h);
  h->B = c->B;
  h->T = c->T;
  h->len = malloc((size_t)c->B * sizeof *h->len);
  h->offs = malloc((size_t)(c->B + 1) * sizeof *h->offs);
  if (!h->len || !h->offs) return 1;
  h->offs[0] = 0;
  for (int64_t b = 0; b < c->B; b++) {
    h->len[b] = c->T / 4 + (int64_t)(urand() * (double)(c->T - c->T / 4));
    h->offs[b + 1] = h->offs[b] + h->len[b];
  }
  h->N = c->packed ? h->offs[c->B] : c->B * c->T;
  const size_t n = (size_t)h->N;
  h->lp = malloc(n * 4);
  h->old = malloc(n * 4);
  h->ref = malloc(n * 4);
  h->adv = malloc(n * 4);
  h->maskf = malloc(n * 4);
  h->maskb = malloc(n);
  if (!h->lp || !h->old || !h->ref || !h->adv || !h->maskf || !h->maskb) return 1;
  for (int64_t b = 0; b < c->B; b++) {
    const int64_t cols = c->packed ? h->len[b] : c->T;
    const double a = nrand();
    for (int64_t t = 0; t < cols; t++) {
      const int64_t i = c->packed ? h->offs[b] + t : b * c->T + t;
      const double lp = -2.0 + 0.1 * nrand();
      h->lp[i] = (float)lp;
      h->old[i] = (float)(lp + 0.05 * nrand());
      h->ref[i] = (float)(lp + 0.05 * nrand());
      /* per-token advantages (the baseline's randn); the value loss reads them as returns */
      h->adv[i] = (float)(c->kind == CASE_GSPO ? a : nrand());
      const int on = c->packed ? 1 : t < h->len[b];
      h->maskf[i] = on ? 1.0f : 0.0f;
      h->maskb[i] = (uint8_t)on;
    }
  }
  return 0;
}

/* fp64 loss of the policy case on the host (token-mean over the tokens that count). */
static double host_policy_loss(const hostdata *h, const bench_case *c, double norm) {
  double s = 0;
  for (int64_t i = 0; i < h->N; i++) {
    if (!h->maskb[i]) continue;
    const double d = fmax(-20.0, fmin(20.0, (double)h->lp[i] - h->old[i]));
    const double r = exp(d), A = h->adv[i];
    double l = fmax(-A * r, -A * fmin(fmax(r, 0.8), 1.28));
    if (A < 0) l = fmin(l, -A * 3.0);
    const double e = fmax(-20.0, fmin(20.0, (double)h->ref[i] - h->lp[i]));
    const double kl = fmax(-10.0, fmin(10.0, exp(e) - e - 1.0));
    s += l + 0.001 * kl;
  }
  (void)c;
  return s / norm;
}

static void fill_policy(const bench_case *c, const hostdata *h, const bufset *s, double norm,
                        rlk_policy_loss_args *a) {
  rlk_policy_loss_args_init(a);
  const rlk_dtype md = c->mask;
  if (c->packed) {
    a->logp = rlk_tensor_1d(s->lp, RLK_F32, h->N);
    a->old_logp = rlk_tensor_1d(s->old, RLK_F32, h->N);
    a->ref_logp = rlk_tensor_1d(s->ref, RLK_F32, h->N);
    a->advantages = rlk_tensor_1d(s->adv, RLK_F32, h->N);
    a->mask = rlk_tensor_1d(s->mask, md, h->N);
    a->seq_offsets = rlk_tensor_1d(s->offs, RLK_I64, h->B + 1);
    a->grad_logp = rlk_tensor_1d(s->grad, RLK_F32, h->N);
  } else {
    a->logp = rlk_tensor_2d(s->lp, RLK_F32, h->B, h->T, h->T);
    a->old_logp = rlk_tensor_2d(s->old, RLK_F32, h->B, h->T, h->T);
    a->ref_logp = rlk_tensor_2d(s->ref, RLK_F32, h->B, h->T, h->T);
    a->advantages = rlk_tensor_2d(s->adv, RLK_F32, h->B, h->T, h->T);
    a->mask = rlk_tensor_2d(s->mask, md, h->B, h->T, h->T);
    a->grad_logp = rlk_tensor_2d(s->grad, RLK_F32, h->B, h->T, h->T);
  }
  a->clip_low = 0.2;
  a->clip_high = 0.28;
  a->dual_clip = 3.0;
  a->kl_estimator = RLK_KL_K3;
  a->kl_coef = 0.001;
  a->agg = RLK_AGG_TOKEN_MEAN;
  a->token_normalizer = c->count ? 0.0 : norm; /* the count is norm when some token counts */
  if (c->kind == CASE_GSPO) {
    a->mode = RLK_POLICY_GSPO;
    a->log_ratio_min = -INFINITY;
    a->log_ratio_max = 10;
    a->agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
    a->seq_normalizer = (double)h->B;
  }
  a->loss = rlk_tensor_1d(s->scalars, RLK_F32, 1);
  a->metrics = rlk_tensor_1d((char *)s->scalars + 16, RLK_F32, RLK_POLICY_LOSS_METRICS);
}

static void fill_value(const bench_case *c, const hostdata *h, const bufset *s, double norm,
                       rlk_value_loss_args *a) {
  rlk_value_loss_args_init(a);
  if (c->packed) {
    a->values = rlk_tensor_1d(s->lp, RLK_F32, h->N);
    a->old_values = rlk_tensor_1d(s->old, RLK_F32, h->N);
    a->returns = rlk_tensor_1d(s->adv, RLK_F32, h->N);
    a->mask = rlk_tensor_1d(s->mask, c->mask, h->N);
    a->seq_offsets = rlk_tensor_1d(s->offs, RLK_I64, h->B + 1);
    a->grad_values = rlk_tensor_1d(s->grad, RLK_F32, h->N);
  } else {
    a->values = rlk_tensor_2d(s->lp, RLK_F32, h->B, h->T, h->T);
    a->old_values = rlk_tensor_2d(s->old, RLK_F32, h->B, h->T, h->T);
    a->returns = rlk_tensor_2d(s->adv, RLK_F32, h->B, h->T, h->T);
    a->mask = rlk_tensor_2d(s->mask, c->mask, h->B, h->T, h->T);
    a->grad_values = rlk_tensor_2d(s->grad, RLK_F32, h->B, h->T, h->T);
  }
  a->token_normalizer = norm;
  a->loss = rlk_tensor_1d(s->scalars, RLK_F32, 1);
  a->metrics = rlk_tensor_1d((char *)s->scalars + 16, RLK_F32, RLK_VALUE_LOSS_METRICS);
}

/* One call of the case on buffer set s. */
static rlk_status call(rlk_context *ctx, const bench_case *c, const hostdata *h, const bufset *s,
                       double norm, size_t ws) {
  if (c->kind == CASE_VALUE) {
    rlk_value_loss_args a;
    fill_value(c, h, s, norm, &a);
    a.workspace = s->ws;
    a.workspace_bytes = ws;
    return rlk_value_loss(ctx, &a, NULL);
  }
  rlk_policy_loss_args a;
  fill_policy(c, h, s, norm, &a);
  a.workspace = s->ws;
  a.workspace_bytes = ws;
  return rlk_policy_loss(ctx, &a, NULL);
}

static int run_case(rlk_context *ctx, const bench_case *c, int iters, int host) {
  hostdata h;
  if (host_make(c, &h)) {
    fprintf(stderr, "%s: out of host memory\n", prog);
    return 1;
  }
  double norm = 0;
  for (int64_t i = 0; i < h.N; i++) norm += h.maskb[i];
  if (norm < 1) norm = 1;
  const size_t es = 4, ms = rlk_dtype_size(c->mask), n = (size_t)h.N;
  const int streams = c->kind == CASE_VALUE ? 3 : 4;
  const double set_bytes = (double)n * (double)(streams * es + ms + es);
  int nsets = 1;
  while (nsets < 16 && nsets * set_bytes < 2.0 * L2_BYTES) nsets++;

  /* workspace size from the first set's arguments (the same for every set) */
  bufset sets[16];
  memset(sets, 0, sizeof sets);
  size_t ws = 0;
  for (int k = 0; k < nsets; k++) {
    bufset *s = &sets[k];
    BENCH_CHECK(rlk_malloc(ctx, n * es, &s->lp));
    BENCH_CHECK(rlk_malloc(ctx, n * es, &s->old));
    BENCH_CHECK(rlk_malloc(ctx, n * es, &s->ref));
    BENCH_CHECK(rlk_malloc(ctx, n * es, &s->adv));
    BENCH_CHECK(rlk_malloc(ctx, n * ms, &s->mask));
    BENCH_CHECK(rlk_malloc(ctx, n * es, &s->grad));
    BENCH_CHECK(rlk_malloc(ctx, 256, &s->scalars));
    BENCH_CHECK(rlk_malloc(ctx, (size_t)(h.B + 1) * 8, &s->offs));
    BENCH_CHECK(rlk_memcpy_to_device(ctx, s->lp, h.lp, n * es));
    BENCH_CHECK(rlk_memcpy_to_device(ctx, s->old, h.old, n * es));
    BENCH_CHECK(rlk_memcpy_to_device(ctx, s->ref, h.ref, n * es));
    BENCH_CHECK(rlk_memcpy_to_device(ctx, s->adv, h.adv, n * es));
    BENCH_CHECK(rlk_memcpy_to_device(ctx, s->mask, c->mask == RLK_F32 ? (void *)h.maskf : (void *)h.maskb, n * ms));
    BENCH_CHECK(rlk_memcpy_to_device(ctx, s->offs, h.offs, (size_t)(h.B + 1) * 8));
    if (k == 0) {
      if (c->kind == CASE_VALUE) {
        rlk_value_loss_args a;
        fill_value(c, &h, s, norm, &a);
        BENCH_CHECK(rlk_value_loss_workspace_size(ctx, &a, &ws));
      } else {
        rlk_policy_loss_args a;
        fill_policy(c, &h, s, norm, &a);
        BENCH_CHECK(rlk_policy_loss_workspace_size(ctx, &a, &ws));
      }
    }
    if (ws) BENCH_CHECK(rlk_malloc(ctx, ws, &s->ws));
  }

  /* correctness of the first call (policy, token-mean) */
  BENCH_CHECK(call(ctx, c, &h, &sets[0], norm, ws));
  BENCH_CHECK(rlk_stream_synchronize(ctx, NULL));
  float got[2];
  BENCH_CHECK(rlk_memcpy_to_host(ctx, got, sets[0].scalars, sizeof got));
  if (c->kind == CASE_POLICY) {
    const double want = host_policy_loss(&h, c, norm);
    if (!(fabs(got[0] - want) <= 1e-4 * (fabs(want) + 1e-3))) {
      fprintf(stderr, "%s: %s: loss %.9g, fp64 host %.9g\n", prog, c->label, (double)got[0], want);
      return 1;
    }
  } else if (!isfinite(got[0])) {
    fprintf(stderr, "%s: %s: loss is not finite\n", prog, c->label);
    return 1;
  }

  rlk_event *e0, *e1;
  BENCH_CHECK(rlk_event_create(ctx, &e0));
  BENCH_CHECK(rlk_event_create(ctx, &e1));
  for (int i = 0; i < 20; i++) BENCH_CHECK(call(ctx, c, &h, &sets[i % nsets], norm, ws));
  BENCH_CHECK(rlk_stream_synchronize(ctx, NULL));
  double *v = malloc((size_t)iters * sizeof *v);
  if (!v) return 1;
  /* A call on another buffer set goes first and keeps the device busy while the host records
   * the start event and enqueues the timed call, so the host's own time per call (argument
   * checks, kernel lookup, launch) is not counted: the interval is the device's. */
  for (int i = 0; i < iters; i++) {
    BENCH_CHECK(call(ctx, c, &h, &sets[(i + 1) % nsets], norm, ws));
    BENCH_CHECK(rlk_event_record(e0, NULL));
    BENCH_CHECK(call(ctx, c, &h, &sets[i % nsets], norm, ws));
    BENCH_CHECK(rlk_event_record(e1, NULL));
    float ms_ = 0;
    BENCH_CHECK(rlk_event_elapsed_ms(e0, e1, &ms_));
    v[i] = ms_;
  }
  /* back to back: the mean of 50 calls enqueued in a row */
  double b2b = 0;
  {
    const int k = host ? 2 : 50;
    BENCH_CHECK(rlk_stream_synchronize(ctx, NULL));
    BENCH_CHECK(rlk_event_record(e0, NULL));
    for (int i = 0; i < k; i++) BENCH_CHECK(call(ctx, c, &h, &sets[i % nsets], norm, ws));
    BENCH_CHECK(rlk_event_record(e1, NULL));
    float ms_ = 0;
    BENCH_CHECK(rlk_event_elapsed_ms(e0, e1, &ms_));
    b2b = ms_ / k;
  }
  if (nresults < 32) {
    result *r = &results[nresults++];
    snprintf(r->name, sizeof r->name, "%s B=%lld T=%lld", c->label, (long long)c->B, (long long)c->T);
    bench_stats(v, iters, &r->median_ms, &r->min_ms, &r->max_ms);
    r->bytes = set_bytes;
    r->b2b_ms = b2b;
    r->floor_ms = bench_floor_ms(set_bytes);
    r->goal_ms = c->goal_ms;
  }
  free(v);
  rlk_event_destroy(e0);
  rlk_event_destroy(e1);
  for (int k = 0; k < nsets; k++) {
    const bufset *s = &sets[k];
    void *const all[] = {s->lp, s->old, s->ref, s->adv, s->mask, s->grad, s->scalars, s->offs, s->ws};
    bench_free_each(ctx, all, sizeof all / sizeof all[0]);
  }
  host_free(&h);
  return 0;
}

static int tool_main(int argc, char **argv) {
  bench_session session = {.backend = RLK_BACKEND_AUTO, .iters = 200};
  int rc = bench_options(argc, argv, &session.backend, &session.iters, &session.json);
  if (rc) return rc < 0 ? 0 : rc;
  if ((rc = bench_open(&session, 5, 10))) return rc;

  static const bench_case cases[] = {
      {"policy ppo+dual+k3 token-mean padded, f32 mask", 1024, 4096, 0, RLK_F32, CASE_POLICY, 0.05},
      {"policy ppo+dual+k3 token-mean padded, bool mask", 1024, 4096, 0, RLK_BOOL, CASE_POLICY, 0.05},
      {"policy ppo+dual+k3 token-mean padded, bool mask, device count", 1024, 4096, 0, RLK_BOOL,
       CASE_POLICY, 0, 1},
      {"policy ppo+dual+k3 token-mean packed, i64 offsets", 1024, 4096, 1, RLK_BOOL, CASE_POLICY, 0},
      {"policy ppo+dual+k3 token-mean padded, f32 mask", 256, 2048, 0, RLK_F32, CASE_POLICY, 0},
      {"policy ppo+dual+k3 token-mean padded, bool mask", 256, 2048, 0, RLK_BOOL, CASE_POLICY, 0},
      {"policy gspo seq-mean-token-mean padded, bool mask", 1024, 4096, 0, RLK_BOOL, CASE_GSPO, 0},
      {"value clip 0.5 token-mean padded, bool mask", 1024, 4096, 0, RLK_BOOL, CASE_VALUE, 0},
  };
  const int ncases = session.host ? 2 : (int)(sizeof cases / sizeof cases[0]);
  for (int i = 0; i < ncases; i++) {
    bench_case c = cases[i];
    if (session.host) { /* a smaller shape on the CPU, no goal */
      c.B = 64;
      c.T = 512;
      c.goal_ms = 0;
    }
    if (run_case(session.ctx, &c, session.iters, session.host)) return 1;
  }
  rlk_context_destroy(session.ctx);

  printf("\n%s %s on %s (%s, %s)\n", prog, rlk_version_string(), session.info.name, session.info.target,
         session.info.compiler);
  printf("%-64s %10s %10s %10s %10s %10s %8s %8s\n", "case (fwd+bwd, both launches)", "median ms", "min ms",
         "max ms", "b2b ms", "floor ms", "x floor", "goal ms");
  for (int i = 0; i < nresults; i++) {
    const result *r = &results[i];
    char goal[16] = "-";
    if (r->goal_ms > 0) snprintf(goal, sizeof goal, "%g", r->goal_ms);
    printf("%-64s %10.5f %10.5f %10.5f %10.5f %10.5f %8.2f %8s\n", r->name, r->median_ms, r->min_ms,
           r->max_ms, r->b2b_ms, r->floor_ms, r->median_ms / r->floor_ms, goal);
  }
  if (session.json) {
    FILE *f = tool_json_begin(session.json, &session.info);
    if (!f) return 1;
    fprintf(f, "  \"floor_tbps\": %g,\n  \"results\": [\n", BENCH_FLOOR_TBPS);
    for (int i = 0; i < nresults; i++) {
      const result *r = &results[i];
      fprintf(f, "    {\"name\": ");
      json_string(f, r->name);
      json_number_member(f, "median_ms", "%.6f", r->median_ms);
      json_number_member(f, "min_ms", "%.6f", r->min_ms);
      json_number_member(f, "max_ms", "%.6f", r->max_ms);
      json_number_member(f, "back_to_back_ms", "%.6f", r->b2b_ms);
      json_number_member(f, "bytes", "%.0f", r->bytes);
      json_number_member(f, "floor_ms", "%.6f", r->floor_ms);
      json_number_member(f, "goal_ms", "%g", r->goal_ms);
      fprintf(f, "}%s\n", i + 1 < nresults ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (close_written(f, session.json)) return 1;
  }
  return 0;
}

int main(int argc, char **argv) { return tool_exit(tool_main(argc, argv)); }

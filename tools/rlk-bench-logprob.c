/* rlk-bench-logprob - device time of rlk_logprob / rlk_logprob_backward against the floors of
 * the memory (bytes moved at the H200's 4.14 TB/s).
 *
 *   rlk-bench-logprob [--backend auto|cuda|hip|host] [--iters N] [--json FILE] [--sweep] [--tma]
 *                     [--shape NxV]...
 *
 * Cases, bf16 logits, i64 labels (the H200 goals in brackets):
 *   fwd          logp + lse                                   16384 x 151936 [<= 1.35 ms]
 *   fwd+entropy  logp + lse + entropy in the same pass                         [<= 1.1 x fwd]
 *   bwd          dlogits in bf16 (out of place) from g_lp
 *   fwd+bwd      both calls back to back                                      [<= 4.2 ms]
 * for 16384 x 151936, 4096 x 151936 and 16384 x 128256 (--shape replaces the list). --sweep also
 * times every tuning candidate the op declares (rlk_tune_candidates("logprob")) on the first shape's
 * fwd+entropy; tensor-map candidates only with --tma. Device events
 * around each call, 3 warm-up calls, median / min / max of --iters. The logits are far larger
 * than the L2, so no buffer rotation is needed. Extra device memory: the op allocates none; its
 * outputs are O(N) (12 N bytes). On the host backend the default shapes shrink to 64 rows.
 * A few rows are checked against an fp64 computation before timing. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlk.h"

static const char *prog = "rlk-bench-logprob";
#include "tool_util.h"
#include "bench_util.h"

/* One problem's device buffers. */
typedef struct bufs {
  int64_t N, V;
  void *logits, *grad;
  int64_t *labels_h;
  void *labels;
  float *logp, *lse, *ent, *glp;
  int32_t *status;
} bufs;

static void free_bufs(rlk_context *ctx, bufs *b) {
  void *const all[] = {b->logits, b->grad, b->labels, b->logp, b->lse, b->ent, b->glp, b->status};
  bench_free_each(ctx, all, sizeof all / sizeof all[0]);
  free(b->labels_h);
  memset(b, 0, sizeof *b);
}

/* Random bf16 logits (~3 N(0,1)-ish, a 32 MB pattern tiled over the buffer), labels, g_lp. */
static int setup(rlk_context *ctx, bufs *b, int64_t N, int64_t V) {
  memset(b, 0, sizeof *b);
  b->N = N;
  b->V = V;
  const size_t total = (size_t)N * (size_t)V;
  BENCH_CHECK(rlk_malloc(ctx, total * 2, &b->logits));
  BENCH_CHECK(rlk_malloc(ctx, total * 2, &b->grad));
  const size_t chunk = total < ((size_t)1 << 24) ? total : ((size_t)1 << 24) + 7; /* not a row multiple */
  uint16_t *h = malloc(chunk * 2);
  if (!h) return usage_error("out of host memory");
  uint64_t s = 0x1234567ull;
  for (size_t i = 0; i < chunk; i++) {
    /* sum of 4 uniforms: roughly normal, scaled to a logit-like spread */
    double u = 0;
    for (int k = 0; k < 4; k++) u += (double)bench_lcg(&s) * 0x1.0p-53;
    h[i] = bench_bf16_of((float)((u - 2.0) * 5.2));
  }
  for (size_t off = 0; off < total; off += chunk) {
    const size_t n = total - off < chunk ? total - off : chunk;
    BENCH_CHECK(rlk_memcpy_to_device(ctx, (uint16_t *)b->logits + off, h, n * 2));
  }
  free(h);
  b->labels_h = malloc((size_t)N * sizeof *b->labels_h);
  float *g = malloc((size_t)N * sizeof *g);
  for (int64_t i = 0; i < N; i++) {
    b->labels_h[i] = (int64_t)(bench_lcg(&s) % (uint64_t)V);
    g[i] = 1.0f / (float)N;
  }
  BENCH_CHECK(rlk_malloc(ctx, (size_t)N * 8, &b->labels));
  BENCH_CHECK(rlk_memcpy_to_device(ctx, b->labels, b->labels_h, (size_t)N * 8));
  BENCH_CHECK(rlk_malloc(ctx, (size_t)N * 4, (void **)&b->logp));
  BENCH_CHECK(rlk_malloc(ctx, (size_t)N * 4, (void **)&b->lse));
  BENCH_CHECK(rlk_malloc(ctx, (size_t)N * 4, (void **)&b->ent));
  BENCH_CHECK(rlk_malloc(ctx, (size_t)N * 4, (void **)&b->glp));
  BENCH_CHECK(rlk_memcpy_to_device(ctx, b->glp, g, (size_t)N * 4));
  free(g);
  BENCH_CHECK(rlk_malloc(ctx, 4, (void **)&b->status));
  BENCH_CHECK(rlk_memset(ctx, b->status, 0, 4));
  return 0;
}

static void fwd_args(const bufs *b, rlk_logprob_args *a, int entropy) {
  rlk_logprob_args_init(a);
  a->logits = rlk_tensor_2d(b->logits, RLK_BF16, b->N, b->V, b->V);
  a->labels = rlk_tensor_1d(b->labels, RLK_I64, b->N);
  a->logp = rlk_tensor_1d(b->logp, RLK_F32, b->N);
  a->lse = rlk_tensor_1d(b->lse, RLK_F32, b->N);
  if (entropy) a->entropy = rlk_tensor_1d(b->ent, RLK_F32, b->N);
  a->status = rlk_tensor_1d(b->status, RLK_I32, 1);
}

static void bwd_args(const bufs *b, rlk_logprob_backward_args *a) {
  rlk_logprob_backward_args_init(a);
  a->logits = rlk_tensor_2d(b->logits, RLK_BF16, b->N, b->V, b->V);
  a->labels = rlk_tensor_1d(b->labels, RLK_I64, b->N);
  a->lse = rlk_tensor_1d(b->lse, RLK_F32, b->N);
  a->grad_logp = rlk_tensor_1d(b->glp, RLK_F32, b->N);
  a->grad_logits = rlk_tensor_2d(b->grad, RLK_BF16, b->N, b->V, b->V);
  a->status = rlk_tensor_1d(b->status, RLK_I32, 1);
}

/* Checks a few rows of logp / lse / entropy against fp64; returns the largest error. */
static int spot_check(rlk_context *ctx, const bufs *b, double *max_err) {
  const int64_t N = b->N, V = b->V;
  uint16_t *row = malloc((size_t)V * 2);
  float lp, l, h;
  *max_err = 0;
  for (int k = 0; k < 6; k++) {
    const int64_t i = k == 0 ? 0 : (k == 5 ? N - 1 : (N * k) / 5);
    BENCH_CHECK(rlk_memcpy_to_host(ctx, row, (const uint16_t *)b->logits + (size_t)i * (size_t)V, (size_t)V * 2));
    BENCH_CHECK(rlk_memcpy_to_host(ctx, &lp, b->logp + i, 4));
    BENCH_CHECK(rlk_memcpy_to_host(ctx, &l, b->lse + i, 4));
    BENCH_CHECK(rlk_memcpy_to_host(ctx, &h, b->ent + i, 4));
    double m = -INFINITY, s = 0, sz = 0;
    for (int64_t j = 0; j < V; j++) m = fmax(m, bench_bf16_value(row[j]));
    for (int64_t j = 0; j < V; j++) {
      const double e = exp(bench_bf16_value(row[j]) - m);
      s += e;
      sz += e * bench_bf16_value(row[j]);
    }
    const double lse = m + log(s), ent = lse - sz / s, logp = bench_bf16_value(row[b->labels_h[i]]) - lse;
    *max_err = fmax(*max_err, fmax(fabs(lse - l), fmax(fabs(ent - h), fabs(logp - lp))));
  }
  free(row);
  return 0;
}

static int time_calls(rlk_context *ctx, int iters, int which, const rlk_logprob_args *fa,
                      const rlk_logprob_backward_args *ba, double *out) {
  rlk_event *e0, *e1;
  BENCH_CHECK(rlk_event_create(ctx, &e0));
  BENCH_CHECK(rlk_event_create(ctx, &e1));
  for (int i = -3; i < iters; i++) {
    BENCH_CHECK(rlk_event_record(e0, NULL));
    if (which & 1) BENCH_CHECK(rlk_logprob(ctx, fa, NULL));
    if (which & 2) BENCH_CHECK(rlk_logprob_backward(ctx, ba, NULL));
    BENCH_CHECK(rlk_event_record(e1, NULL));
    float ms = 0;
    BENCH_CHECK(rlk_event_elapsed_ms(e0, e1, &ms));
    if (i >= 0) out[i] = ms;
  }
  rlk_event_destroy(e0);
  rlk_event_destroy(e1);
  return 0;
}

static int bench_shape(rlk_context *ctx, int64_t N, int64_t V, int iters, int main_shape, double *fwd_ms) {
  bufs b;
  if (setup(ctx, &b, N, V)) return 1;
  rlk_logprob_args fa, fe;
  rlk_logprob_backward_args ba;
  fwd_args(&b, &fa, 0);
  fwd_args(&b, &fe, 1);
  bwd_args(&b, &ba);
  BENCH_CHECK(rlk_logprob(ctx, &fe, NULL));
  BENCH_CHECK(rlk_stream_synchronize(ctx, NULL));
  double err = 0;
  if (spot_check(ctx, &b, &err)) return 1;
  printf("%lld x %lld: spot check against fp64, largest |error| %.3g%s\n", (long long)N, (long long)V, err,
         err < 1e-3 ? "" : "  <-- WRONG");
  double *v = malloc((size_t)iters * sizeof *v);
  const double bytes = (double)N * (double)V * 2.0;
  char name[112 + 80], note[160];
  snprintf(note, sizeof note, "extra memory: none allocated; outputs %lld B (O(N))", (long long)(12 * N));

  if (time_calls(ctx, iters, 1, &fa, &ba, v)) return 1;
  snprintf(name, sizeof name, "logprob fwd %lldx%lld bf16", (long long)N, (long long)V);
  const double fwd = bench_add(name, v, iters, bytes + 16.0 * N, main_shape ? 1.35 : 0, note)->median_ms;
  if (fwd_ms) *fwd_ms = fwd;

  if (time_calls(ctx, iters, 1, &fe, &ba, v)) return 1;
  snprintf(name, sizeof name, "logprob fwd+entropy %lldx%lld bf16", (long long)N, (long long)V);
  char n2[160];
  snprintf(n2, sizeof n2, "goal <= 1.1 x fwd (%.4f ms)", 1.1 * fwd);
  bench_add(name, v, iters, bytes + 20.0 * N, main_shape ? 1.1 * fwd : 0, n2);

  if (time_calls(ctx, iters, 2, &fa, &ba, v)) return 1;
  snprintf(name, sizeof name, "logprob bwd %lldx%lld bf16 grad", (long long)N, (long long)V);
  bench_add(name, v, iters, 2 * bytes + 24.0 * N, 0, "read logits, write dlogits");

  if (time_calls(ctx, iters, 3, &fa, &ba, v)) return 1;
  snprintf(name, sizeof name, "logprob fwd+bwd %lldx%lld bf16 grad", (long long)N, (long long)V);
  bench_add(name, v, iters, 3 * bytes + 40.0 * N, main_shape ? 4.2 : 0, "read, read, write");

  int32_t status = -1;
  BENCH_CHECK(rlk_memcpy_to_host(ctx, &status, b.status, 4));
  if (status != 0) printf("warning: the status word is %d (bad labels?)\n", (int)status);
  free(v);
  free_bufs(ctx, &b);
  return 0;
}

/* Times every declared candidate (appended to the defaults) on fwd+entropy. */
static int sweep(rlk_context *ctx, int64_t N, int64_t V, int iters, int tma) {
  bufs b;
  if (setup(ctx, &b, N, V)) return 1;
  double *v = malloc((size_t)iters * sizeof *v);
  const double bytes = (double)N * (double)V * 2.0 + 20.0 * N;
  const char *all = rlk_tune_candidates("logprob");
  for (const char *next = all; *next;) {
    char cand[80];
    const size_t len = strcspn(next, "\n");
    snprintf(cand, sizeof cand, "%.*s", (int)len, next);
    next += len + (next[len] == '\n');
    if (!cand[0]) continue;
    if (strstr(cand, "variant=tma") && !tma) {
      printf("skip candidate '%s' (tensor-map variant: --tma)\n", cand);
      continue;
    }
    rlk_logprob_args a;
    fwd_args(&b, &a, 1);
    char copy[256];
    snprintf(copy, sizeof copy, "%s", cand);
    char *save = NULL;
    for (char *t = strtok_r(copy, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
      char *eq = strchr(t, '=');
      if (!eq) continue;
      *eq = '\0';
      const int val = atoi(eq + 1);
      if (!strcmp(t, "variant"))
        a.variant = !strcmp(eq + 1, "vec")    ? RLK_LOGPROB_VARIANT_VEC
                    : !strcmp(eq + 1, "bulk") ? RLK_LOGPROB_VARIANT_BULK
                    : !strcmp(eq + 1, "tma")  ? RLK_LOGPROB_VARIANT_TMA
                                              : RLK_LOGPROB_VARIANT_AUTO;
      else if (!strcmp(t, "block"))
        a.block = val;
      else if (!strcmp(t, "unroll"))
        a.unroll = val;
      else if (!strcmp(t, "stages"))
        a.stages = val;
    }
    BENCH_CHECK(rlk_logprob(ctx, &a, NULL));
    BENCH_CHECK(rlk_stream_synchronize(ctx, NULL));
    double err = 0;
    if (spot_check(ctx, &b, &err)) return 1;
    if (time_calls(ctx, iters, 1, &a, NULL, v)) return 1;
    char name[112 + 80], note[160];
    snprintf(name, sizeof name, "sweep fwd+entropy %s", cand);
    snprintf(note, sizeof note, "spot-check error %.2g%s", err, err < 1e-3 ? "" : " WRONG");
    bench_add(name, v, iters, bytes, 0, note);
  }
  free(v);
  free_bufs(ctx, &b);
  return 0;
}

static int tool_main(int argc, char **argv) {
  bench_session session = {.backend = RLK_BACKEND_AUTO, .iters = 30};
  int do_sweep = 0, tma = 0;
  int64_t shapes[8][2];
  int nshapes = 0;
  static const struct option longopts[] = {BENCH_LONGOPTS,
                                           {"sweep", no_argument, NULL, 'S'},
                                           {"tma", no_argument, NULL, 'T'},
                                           {"shape", required_argument, NULL, 's'},
                                           {NULL, 0, NULL, 0}};
  opterr = 0;
  for (int c; (c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1;) {
    int r = bench_option(c, "usage: %s [--backend auto|cuda|hip|host] [--iters N] [--json FILE] [--sweep] [--tma] "
                            "[--shape NxV]...\n", &session.backend, &session.iters, &session.json);
    if (r == 1) continue;
    if (r) return r < 0 ? 0 : r;
    switch (c) {
      case 'S': do_sweep = 1; break;
      case 'T': tma = 1; break;
      case 's': {
        long long rows = 0, v = 0;
        if (nshapes >= 8) return usage_error("at most 8 --shape");
        if (sscanf(optarg, "%lldx%lld", &rows, &v) != 2 || rows <= 0 || v <= 0)
          return usage_error("--shape: '%s' is not NxV", optarg);
        shapes[nshapes][0] = rows;
        shapes[nshapes][1] = v;
        nshapes++;
        break;
      }
      default: return getopt_error(c, argv);
    }
  }
  if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
  const int rc = bench_open(&session, 3, 5);
  if (rc) return rc;
  if (!nshapes) {
    const int64_t n = session.host ? 64 : 16384, n2 = session.host ? 16 : 4096;
    const int64_t def[3][2] = {{n, 151936}, {n2, 151936}, {n, 128256}};
    for (int k = 0; k < 3; k++) {
      shapes[k][0] = def[k][0];
      shapes[k][1] = def[k][1];
    }
    nshapes = 3;
  }
  printf("%s on %s (%s, %s); floor = bytes / %.2f TB/s\n", prog, session.info.name, session.info.target,
         session.info.compiler, BENCH_FLOOR_TBPS);
  for (int k = 0; k < nshapes; k++) {
    double fwd = 0;
    const int main_shape = k == 0 && !session.host;
    if (bench_shape(session.ctx, shapes[k][0], shapes[k][1], session.iters, main_shape, &fwd)) return 1;
  }
  if (do_sweep && sweep(session.ctx, shapes[0][0], shapes[0][1], session.iters, tma)) return 1;
  rlk_context_destroy(session.ctx);

  if (session.json) return bench_write_json(session.json, &session.info);
  return 0;
}

int main(int argc, char **argv) { return tool_exit(tool_main(argc, argv)); }

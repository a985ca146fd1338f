/* rlk-bench-sample - device time of rlk_sample against the read-once floor of
 * the memory (B x V x dtype bytes at the H200's 4.14 TB/s).
 *
 *   rlk-bench-sample [--backend auto|cuda|hip|host] [--iters N] [--json FILE] [--vocab V]
 *                    [--case NAME] [--logprob-block N] [--logprob-unroll N]
 *                    [--row-split auto|1|2|4|8] [--pdl 0|1]
 *
 * --case times one case only; --logprob-block / --logprob-unroll pass a tuned rlk_logprob row layout
 * to the sampler (its first pass follows it); --row-split sets the -split cases' row_split (auto);
 * --pdl 0 launches every call plainly (1, rlk_sample_args_init's: a programmatic dependent launch
 * on sm_90, so back-to-back calls overlap a launch with the previous call's end).
 *
 * Cases, V = 151936, f32 and bf16 logits, B = 1, 32, 256 (the H200 goals in brackets):
 *   plain      temperature 1                              [<= 1.3 x the floor]
 *   topk+topp  temperature 0.7, top-k 50, top-p 0.9       [B 256 <= 0.15 ms, B 32 <= 0.05 ms]
 *   topk       top-k 50;  topp  top-p 0.9 alone;  minp  min-p 0.05;  greedy  temperature 0
 *   plain-split, greedy-split   plain and greedy with row_split (a row over a cluster's blocks on
 *              sm_90; the same tokens as one block a row): auto, rlk_sample_args_init's default,
 *              unless --row-split; the other cases ask for one block a row
 * Logits are N(0, 1)-like (what shared/anchors/torch_baselines.py samples from), a seed per row,
 * the offset advancing every call. Several logits buffers are rotated so that the timed data is at
 * least 256 MB (never L2-resident). Two timings per case, median / min / max of --iters each after
 * 3 warm-up calls:
 *   one call   device events around a single call on an idle stream: the kernel, plus the time
 *              from the first event to the kernel's start, which includes the host's call
 *   stream     events around STREAM_CALLS calls enqueued back to back, divided by their number: a
 *              call's device time when a trainer enqueues asynchronously (the host call overlaps
 *              the previous kernel), what the floor compares with
 * Before timing, every case's tokens are checked against its filters and a few log-probs against
 * fp64. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlk.h"

static const char *prog = "rlk-bench-sample";
#include "tool_util.h"
#include "bench_util.h"


static float value_of(const void *h, rlk_dtype dt, size_t i) {
  if (dt == RLK_F32) return ((const float *)h)[i];
  const uint32_t u = (uint32_t)((const uint16_t *)h)[i] << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

typedef struct scase {
  const char *name;
  float temperature;
  int64_t top_k;
  float top_p, min_p;
  int split; /* the row_split of the case is --row-split's */
} scase;

static const scase cases[] = {
    {"plain", 1.0f, 0, 1.0f, 0.0f, 0},       {"plain-split", 1.0f, 0, 1.0f, 0.0f, 1},
    {"topk+topp", 0.7f, 50, 0.9f, 0.0f, 0},  {"topk", 1.0f, 50, 1.0f, 0.0f, 0},
    {"topp", 0.7f, 0, 0.9f, 0.0f, 0},        {"minp", 1.0f, 0, 1.0f, 0.05f, 0},
    {"greedy", 0.0f, 0, 1.0f, 0.0f, 0},      {"greedy-split", 0.0f, 0, 1.0f, 0.0f, 1},
};

/* Checks one call's tokens against the case's filters (top-k: at least the k-th largest logit;
 * min-p: p >= min_p p_max) and its log-probs against fp64, on a few rows. */
static int verify(rlk_context *ctx, const void *logits, rlk_dtype dt, int64_t B, int64_t V, const scase *c,
                  const int64_t *tok_d, const float *lp_d, int *bad) {
  const size_t es = rlk_dtype_size(dt);
  void *row = malloc((size_t)V * es);
  float *x = malloc((size_t)V * sizeof *x);
  for (int k = 0; k < 4; k++) {
    const int64_t i = k == 3 ? B - 1 : (B * k) / 4;
    int64_t y;
    float lp;
    BENCH_CHECK(rlk_memcpy_to_host(ctx, row, (const char *)logits + (size_t)i * (size_t)V * es, (size_t)V * es));
    BENCH_CHECK(rlk_memcpy_to_host(ctx, &y, tok_d + i, 8));
    BENCH_CHECK(rlk_memcpy_to_host(ctx, &lp, lp_d + i, 4));
    if (y < 0 || y >= V) {
      (*bad)++;
      continue;
    }
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; j++) m = fmax(m, x[j] = value_of(row, dt, (size_t)j));
    const double T = c->temperature > 0 ? c->temperature : 1.0;
    for (int64_t j = 0; j < V; j++) s += exp((x[j] - m) / T);
    const double want = (x[y] - m) / T - log(s);
    if (fabs(want - lp) > 1e-3) (*bad)++;
    int64_t above = 0;
    for (int64_t j = 0; j < V; j++) above += x[j] > x[y];
    if (c->top_k > 0 && above >= c->top_k) (*bad)++;
    if (c->temperature == 0.0f && above > 0) (*bad)++;
    if (c->min_p > 0 && exp((x[y] - m) / T) < c->min_p * 0.999) (*bad)++;
  }
  free(row);
  free(x);
  return 0;
}

static const char *only_case; /* --case: one case only */
static int lp_block, lp_unroll;  /* --logprob-block, --logprob-unroll: the row layout (0: default) */
static int row_split = RLK_SAMPLE_ROW_SPLIT_AUTO; /* --row-split: of the -split cases */
static int pdl = 1;                               /* --pdl */

/* Calls between the events of one "stream" sample. */
#define STREAM_CALLS 16

static int bench(rlk_context *ctx, rlk_dtype dt, int64_t B, int64_t V, int iters) {
  const size_t es = rlk_dtype_size(dt), bytes = (size_t)B * (size_t)V * es;
  int nbuf = (int)(((size_t)256 << 20) / bytes) + 1;
  if (nbuf > 512) nbuf = 512;
  void *bufs[512];
  const size_t elems = (size_t)B * (size_t)V;
  void *h = malloc(bytes);
  uint64_t s = 0x5a5a5a5ull + (uint64_t)B;
  for (int k = 0; k < nbuf; k++) {
    for (size_t i = 0; i < elems; i++) {
      double u = 0;
      for (int q = 0; q < 4; q++) u += (double)bench_lcg(&s) * 0x1.0p-53;
      const float v = (float)((u - 2.0) * 1.732); /* mean 0, variance 1 */
      if (dt == RLK_F32)
        ((float *)h)[i] = v;
      else
        ((uint16_t *)h)[i] = bench_bf16_of(v);
    }
    BENCH_CHECK(rlk_malloc(ctx, bytes, &bufs[k]));
    BENCH_CHECK(rlk_memcpy_to_device(ctx, bufs[k], h, bytes));
    if (k == 3 && nbuf > 8) { /* the rest: copies (the data's values do not change the work) */
      for (int q = 4; q < nbuf; q++) {
        BENCH_CHECK(rlk_malloc(ctx, bytes, &bufs[q]));
        BENCH_CHECK(rlk_memcpy_to_device(ctx, bufs[q], h, bytes));
      }
      break;
    }
  }
  free(h);
  uint64_t *seeds_h = malloc((size_t)B * 8);
  for (int64_t i = 0; i < B; i++) seeds_h[i] = bench_lcg(&s) * 0x9e3779b97f4a7c15ull;
  void *seeds, *tokens, *logp, *status;
  BENCH_CHECK(rlk_malloc(ctx, (size_t)B * 8, &seeds));
  BENCH_CHECK(rlk_memcpy_to_device(ctx, seeds, seeds_h, (size_t)B * 8));
  free(seeds_h);
  BENCH_CHECK(rlk_malloc(ctx, (size_t)B * 8, &tokens));
  BENCH_CHECK(rlk_malloc(ctx, (size_t)B * 4, &logp));
  BENCH_CHECK(rlk_malloc(ctx, 4, &status));
  BENCH_CHECK(rlk_memset(ctx, status, 0, 4));
  double *v = malloc((size_t)iters * sizeof *v);
  rlk_event *e0, *e1;
  BENCH_CHECK(rlk_event_create(ctx, &e0));
  BENCH_CHECK(rlk_event_create(ctx, &e1));
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const scase *c = &cases[ci];
    if (only_case && strcmp(only_case, c->name)) continue;
    rlk_sample_args a;
    rlk_sample_args_init(&a);
    a.temperature = c->temperature;
    a.top_k = c->top_k;
    a.top_p = c->top_p;
    a.min_p = c->min_p;
    a.logprob_block = lp_block;
    a.logprob_unroll = lp_unroll;
    a.row_split = c->split ? row_split : 0;
    a.pdl = pdl;
    a.seeds = rlk_tensor_1d(seeds, RLK_I64, B);
    a.tokens = rlk_tensor_1d(tokens, RLK_I64, B);
    a.logp = rlk_tensor_1d(logp, RLK_F32, B);
    a.status = rlk_tensor_1d(status, RLK_I32, 1);
    a.logits = rlk_tensor_2d(bufs[0], dt, B, V, V);
    BENCH_CHECK(rlk_sample(ctx, &a, NULL));
    BENCH_CHECK(rlk_stream_synchronize(ctx, NULL));
    int bad = 0;
    if (verify(ctx, bufs[0], dt, B, V, c, tokens, logp, &bad)) return 1;
    for (int i = -3; i < iters; i++) {
      a.logits = rlk_tensor_2d(bufs[(i + 3) % nbuf], dt, B, V, V);
      a.offset = (uint64_t)(i + 3);
      BENCH_CHECK(rlk_event_record(e0, NULL));
      BENCH_CHECK(rlk_sample(ctx, &a, NULL));
      BENCH_CHECK(rlk_event_record(e1, NULL));
      float ms = 0;
      BENCH_CHECK(rlk_event_elapsed_ms(e0, e1, &ms));
      if (i >= 0) v[i] = ms;
    }
    char name[112], note[160];
    double goal = 0;
    if (!strncmp(c->name, "plain", 5)) goal = 1.3 * bench_floor_ms((double)bytes);
    if (!strcmp(c->name, "topk+topp") && V == 151936 && B == 256) goal = 0.15;
    if (!strcmp(c->name, "topk+topp") && V == 151936 && B == 32) goal = 0.05;
    snprintf(note, sizeof note, "%s", bad ? "CHECK FAILED (tokens or logp)" : "checked");
    snprintf(name, sizeof name, "sample %s B=%lld V=%lld %s one call", c->name, (long long)B,
             (long long)V, rlk_dtype_name(dt));
    bench_add(name, v, iters, (double)bytes, goal, note);
    for (int i = -1; i < iters; i++) {
      BENCH_CHECK(rlk_event_record(e0, NULL));
      for (int k = 0; k < STREAM_CALLS; k++) {
        const int n = (i + 1) * STREAM_CALLS + k;
        a.logits = rlk_tensor_2d(bufs[n % nbuf], dt, B, V, V);
        a.offset = (uint64_t)(1000 + n);
        BENCH_CHECK(rlk_sample(ctx, &a, NULL));
      }
      BENCH_CHECK(rlk_event_record(e1, NULL));
      float ms = 0;
      BENCH_CHECK(rlk_event_elapsed_ms(e0, e1, &ms));
      if (i >= 0) v[i] = ms / STREAM_CALLS;
    }
    snprintf(name, sizeof name, "sample %s B=%lld V=%lld %s stream", c->name, (long long)B,
             (long long)V, rlk_dtype_name(dt));
    bench_add(name, v, iters, (double)bytes, goal, note);
  }
  int32_t st = 0;
  BENCH_CHECK(rlk_memcpy_to_host(ctx, &st, status, 4));
  if (st) printf("warning: status word %d\n", (int)st);
  rlk_event_destroy(e0);
  rlk_event_destroy(e1);
  free(v);
  for (int k = 0; k < nbuf; k++) rlk_free(ctx, bufs[k]);
  rlk_free(ctx, seeds);
  rlk_free(ctx, tokens);
  rlk_free(ctx, logp);
  rlk_free(ctx, status);
  return 0;
}

static int tool_main(int argc, char **argv) {
  bench_session session = {.backend = RLK_BACKEND_AUTO, .iters = 50};
  int64_t V = 151936;
  static const struct option longopts[] = {
      BENCH_LONGOPTS,
      {"vocab", required_argument, NULL, 'V'},          {"case", required_argument, NULL, 'C'},
      {"row-split", required_argument, NULL, 'r'},      {"pdl", required_argument, NULL, 'p'},
      {"logprob-block", required_argument, NULL, 'B'},  {"logprob-unroll", required_argument, NULL, 'U'},
      {NULL, 0, NULL, 0}};
  opterr = 0;
  long num = 0;
  for (int c; (c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1;) {
    const char *v = optarg;
    int r = bench_option(c, "usage: %s [--backend auto|cuda|hip|host] [--iters N] [--json FILE] [--vocab V] [--case NAME]\n"
                            "       [--logprob-block N] [--logprob-unroll N] [--row-split auto|1|2|4|8] [--pdl 0|1]\n",
                         &session.backend, &session.iters, &session.json);
    if (r == 1) continue;
    if (r) return r < 0 ? 0 : r;
    switch (c) {
      case 'V':
        if (parse_int(v, 1, 1L << 23, &num)) return usage_error("--vocab: '%s' is not a positive integer", v);
        V = num;
        break;
      case 'C': {
        only_case = v;
        int known = 0;
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) known |= !strcmp(cases[k].name, only_case);
        if (!known)
          return usage_error("--case: '%s' is not a case (plain plain-split topk+topp topk topp minp greedy "
                             "greedy-split)",
                             only_case);
        break;
      }
      case 'r':
        row_split = !strcmp(v, "auto") ? RLK_SAMPLE_ROW_SPLIT_AUTO : atoi(v);
        if (strcmp(v, "auto") && row_split != 1 && row_split != 2 && row_split != 4 && row_split != 8)
          return usage_error("--row-split: '%s' is not auto, 1, 2, 4 or 8", v);
        break;
      case 'p':
        if (strcmp(v, "0") && strcmp(v, "1")) return usage_error("--pdl: '%s' is not 0 or 1", v);
        pdl = atoi(v);
        break;
      case 'B':
        if (parse_int(v, 0, 1024, &num)) return usage_error("--logprob-block needs 0 to 1024");
        lp_block = (int)num;
        break;
      case 'U':
        if (parse_int(v, 0, 8, &num)) return usage_error("--logprob-unroll needs 0 to 8");
        lp_unroll = (int)num;
        break;
      default: return getopt_error(c, argv);
    }
  }
  if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
  const int rc = bench_open(&session, 3, 3);
  if (rc) return rc;
  printf("%s on %s (%s, %s); floor = B V bytes / %.2f TB/s\n", prog, session.info.name, session.info.target,
         session.info.compiler, BENCH_FLOOR_TBPS);
  const int64_t batches[3] = {1, 32, session.host ? 4 : 256};
  const rlk_dtype dts[2] = {RLK_F32, RLK_BF16};
  for (int d = 0; d < 2; d++)
    for (int b = 0; b < 3; b++)
      if (bench(session.ctx, dts[d], batches[b], V, session.iters)) return 1;
  rlk_context_destroy(session.ctx);
  return session.json ? bench_write_json(session.json, &session.info) : 0;
}

int main(int argc, char **argv) { return tool_exit(tool_main(argc, argv)); }

/* rlk-bench-advantage-scan - device time of GAE, discounted returns, reverse cumulative sums and
 * masked whitening, against the memory floor (bytes moved at the H200's 4.14 TB/s).
 *
 *   rlk-bench-advantage-scan [--backend auto|cuda|hip|host] [--iters N] [--json FILE]
 *
 * Each case: fresh random inputs (a response mask with multi-turn holes), a warm-up, then device
 * events around every call and the median / min / max over N calls. Inputs and outputs rotate
 * over several buffer sets when one set fits in the 60 MB L2 (so the figure is not an L2 hit).
 * floor = bytes the op must move / 4.14 TB/s (the H200's measured copy rate); the GAE goals are
 * <= 0.05 ms at 256 x 4096 and 8 x 20480. The PyTorch baselines (verl's loop and a vectorized
 * GAE) are tools/bench/torch_advantage_scan.py, run beside this on the same GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rlk.h"

static const char *prog = "rlk-bench-advantage-scan";
#include "tool_util.h"
#include "bench_util.h"

#define L2_BYTES (60.0 * 1024 * 1024)
#define MAX_SETS 8
#define MAX_RESULTS 64

typedef struct result {
  char name[96];
  double median_ms, min_ms, max_ms, floor_ms, goal_ms;
  char note[128];
} result;

static result results[MAX_RESULTS];
static int nresults;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng_state >> 11) * 0x1.0p-53;
}

/* One set of device buffers for a [B, T] problem. */
typedef struct bufs {
  void *r, *v, *m, *o0, *o1, *base, *ws, *stats;
} bufs;

typedef enum op_kind { OP_GAE, OP_RETURNS, OP_CUMSUM, OP_WHITEN } op_kind;

typedef struct bench_case {
  const char *name;
  op_kind op;
  int64_t B, T;
  rlk_scan_algo algo;
  int gae_masked;  /* rlk_gae_masked / rlk_returns_masked */
  int two_outputs; /* GAE returns / ReMax advantages */
  double goal_ms;
  const char *note;
} bench_case;

static int fill(rlk_context *ctx, void *dst, const void *src, size_t bytes) {
  rlk_status st = rlk_memcpy_to_device(ctx, dst, src, bytes);
  return st ? lib_error("rlk_memcpy_to_device", st) : 0;
}

static int setup(rlk_context *ctx, const bench_case *c, bufs *b, size_t *ws_bytes) {
  const int64_t n = c->B * c->T;
  float *h = malloc((size_t)n * sizeof *h);
  unsigned char *m = malloc((size_t)n);
  if (!h || !m) return lib_error("malloc", RLK_ERR_OUT_OF_MEMORY);
  memset(b, 0, sizeof *b);
  rlk_status st;
  void **f32s[] = {&b->r, &b->v, &b->o0, &b->o1};
  for (int i = 0; i < 4; i++)
    if ((st = rlk_malloc(ctx, (size_t)n * 4, f32s[i]))) return lib_error("rlk_malloc", st);
  if ((st = rlk_malloc(ctx, (size_t)n, &b->m))) return lib_error("rlk_malloc", st);
  if ((st = rlk_malloc(ctx, (size_t)c->B * 4, &b->base))) return lib_error("rlk_malloc", st);
  if ((st = rlk_malloc(ctx, 3 * sizeof(double), &b->stats))) return lib_error("rlk_malloc", st);
  /* a response of random length per row, with a few masked tool-output spans inside */
  for (int64_t row = 0; row < c->B; row++) {
    const int64_t len = 1 + (int64_t)(uniform() * (double)c->T);
    for (int64_t t = 0; t < c->T; t++) m[row * c->T + t] = t < len && (t % 97) >= 5;
  }
  for (int64_t i = 0; i < n; i++) h[i] = (float)(uniform() * 2.0 - 1.0);
  if (fill(ctx, b->r, h, (size_t)n * 4)) return 1;
  for (int64_t i = 0; i < n; i++) h[i] = (float)(uniform() * 4.0 - 2.0);
  if (fill(ctx, b->v, h, (size_t)n * 4) || fill(ctx, b->m, m, (size_t)n) || fill(ctx, b->base, h, (size_t)c->B * 4))
    return 1;
  if (c->op == OP_WHITEN) {
    rlk_masked_whiten_args a;
    rlk_masked_whiten_args_init(&a);
    a.x = rlk_tensor_2d(b->r, RLK_F32, c->B, c->T, c->T);
    if ((st = rlk_masked_whiten_workspace_size(ctx, &a, ws_bytes))) return lib_error("rlk_masked_whiten_workspace_size", st);
    if (*ws_bytes && (st = rlk_malloc(ctx, *ws_bytes, &b->ws))) return lib_error("rlk_malloc", st);
  }
  free(h);
  free(m);
  return 0;
}

static void release(rlk_context *ctx, bufs *b) {
  void *const all[] = {b->r, b->v, b->m, b->o0, b->o1, b->base, b->ws, b->stats};
  bench_free_each(ctx, all, sizeof all / sizeof all[0]);
}

static rlk_status call(rlk_context *ctx, const bench_case *c, const bufs *b, size_t ws_bytes) {
  const int64_t B = c->B, T = c->T;
  switch (c->op) {
  case OP_GAE: {
    rlk_gae_args a;
    rlk_gae_args_init(&a);
    a.rewards = rlk_tensor_2d(b->r, RLK_F32, B, T, T);
    a.values = rlk_tensor_2d(b->v, RLK_F32, B, T, T);
    a.mask = rlk_tensor_2d(b->m, RLK_BOOL, B, T, T);
    a.masked = (rlk_gae_masked)c->gae_masked;
    a.lambda = 0.95;
    a.advantages = rlk_tensor_2d(b->o0, RLK_F32, B, T, T);
    if (c->two_outputs) a.returns = rlk_tensor_2d(b->o1, RLK_F32, B, T, T);
    a.algo = c->algo;
    return rlk_gae(ctx, &a, NULL);
  }
  case OP_RETURNS: {
    rlk_discounted_returns_args a;
    rlk_discounted_returns_args_init(&a);
    a.rewards = rlk_tensor_2d(b->r, RLK_F32, B, T, T);
    a.mask = rlk_tensor_2d(b->m, RLK_BOOL, B, T, T);
    a.gamma = 0.99;
    a.masked = (rlk_returns_masked)c->gae_masked;
    a.returns = rlk_tensor_2d(b->o0, RLK_F32, B, T, T);
    a.algo = c->algo;
    return rlk_discounted_returns(ctx, &a, NULL);
  }
  case OP_CUMSUM: {
    rlk_reverse_cumsum_args a;
    rlk_reverse_cumsum_args_init(&a);
    a.values = rlk_tensor_2d(b->r, RLK_F32, B, T, T);
    a.mask = rlk_tensor_2d(b->m, RLK_BOOL, B, T, T);
    a.out = rlk_tensor_2d(b->o0, RLK_F32, B, T, T);
    if (c->two_outputs) {
      a.baseline = rlk_tensor_1d(b->base, RLK_F32, B);
      a.advantages = rlk_tensor_2d(b->o1, RLK_F32, B, T, T);
    }
    a.algo = c->algo;
    return rlk_reverse_cumsum(ctx, &a, NULL);
  }
  default: {
    rlk_masked_whiten_args a;
    rlk_masked_whiten_args_init(&a);
    a.x = rlk_tensor_2d(b->r, RLK_F32, B, T, T);
    a.mask = rlk_tensor_2d(b->m, RLK_BOOL, B, T, T);
    a.out = rlk_tensor_2d(b->o0, RLK_F32, B, T, T);
    a.stats = rlk_tensor_1d(b->stats, RLK_F64, 3);
    a.workspace = b->ws;
    a.workspace_bytes = ws_bytes;
    return rlk_masked_whiten(ctx, &a, NULL);
  }
  }
}

/* Bytes the op must move: every input read once, every output written once (whitening reads x
 * twice: the statistics need all of it before any output). */
static double bytes_of(const bench_case *c) {
  const double n = (double)c->B * (double)c->T;
  switch (c->op) {
  case OP_GAE:
    return n * (4 + 4 + 1 + 4 + (c->two_outputs ? 4 : 0));
  case OP_RETURNS:
    return n * (4 + 1 + 4);
  case OP_CUMSUM:
    return n * (4 + 1 + 4 + (c->two_outputs ? 4 : 0));
  default:
    return n * (4 + 1 + 4 + 1 + 4);
  }
}

static int run_case(rlk_context *ctx, const bench_case *c, int iters) {
  const double per_set = bytes_of(c);
  int sets = per_set >= L2_BYTES ? 1 : (int)(3.0 * L2_BYTES / per_set) + 1;
  if (sets > MAX_SETS) sets = MAX_SETS;
  bufs b[MAX_SETS];
  size_t ws[MAX_SETS];
  for (int s = 0; s < sets; s++)
    if (setup(ctx, c, &b[s], &ws[s])) return 1;
  rlk_event *e0, *e1;
  rlk_status st;
  if ((st = rlk_event_create(ctx, &e0)) || (st = rlk_event_create(ctx, &e1))) return lib_error("rlk_event_create", st);
  for (int i = 0; i < 10; i++)
    if ((st = call(ctx, c, &b[i % sets], ws[i % sets]))) return lib_error(c->name, st);
  if ((st = rlk_stream_synchronize(ctx, NULL))) return lib_error("rlk_stream_synchronize", st);
  double *v = malloc((size_t)iters * sizeof *v);
  for (int i = 0; i < iters; i++) {
    const int s = i % sets;
    float ms = 0;
    if ((st = rlk_event_record(e0, NULL)) || (st = call(ctx, c, &b[s], ws[s])) || (st = rlk_event_record(e1, NULL)) ||
        (st = rlk_event_elapsed_ms(e0, e1, &ms)))
      return lib_error(c->name, st);
    v[i] = ms;
  }
  if (nresults < MAX_RESULTS) {
    result *r = &results[nresults++];
    snprintf(r->name, sizeof r->name, "%s", c->name);
    bench_stats(v, iters, &r->median_ms, &r->min_ms, &r->max_ms);
    r->floor_ms = bench_floor_ms(per_set);
    r->goal_ms = c->goal_ms;
    snprintf(r->note, sizeof r->note, "%s%s%d buffer set%s", c->note ? c->note : "", c->note ? "; " : "", sets,
             sets > 1 ? "s" : "");
  }
  free(v);
  rlk_event_destroy(e0);
  rlk_event_destroy(e1);
  for (int s = 0; s < sets; s++) release(ctx, &b[s]);
  return 0;
}

static const bench_case cases[] = {
    {"gae 256x4096 skip (verl) +returns", OP_GAE, 256, 4096, RLK_SCAN_AUTO, 0, 1, 0.05, "f32, bool mask"},
    {"gae 256x4096 skip, warp per row", OP_GAE, 256, 4096, RLK_SCAN_ROW_WARP, 0, 1, 0, NULL},
    {"gae 256x4096 zero (OpenRLHF) +returns", OP_GAE, 256, 4096, RLK_SCAN_AUTO, 1, 1, 0.05, NULL},
    {"gae 256x1024 skip +returns", OP_GAE, 256, 1024, RLK_SCAN_AUTO, 0, 1, 0, NULL},
    {"gae 8x20480 skip +returns", OP_GAE, 8, 20480, RLK_SCAN_AUTO, 0, 1, 0.05, "DAPO lengths"},
    {"gae 8x20480 skip, warp per row", OP_GAE, 8, 20480, RLK_SCAN_ROW_WARP, 0, 1, 0, NULL},
    {"gae 8192x512 skip +returns", OP_GAE, 8192, 512, RLK_SCAN_AUTO, 0, 1, 0, "many short rows"},
    {"discounted_returns 256x4096 reset", OP_RETURNS, 256, 4096, RLK_SCAN_AUTO, 0, 0, 0, "REINFORCE++"},
    {"reverse_cumsum 256x4096 +baseline", OP_CUMSUM, 256, 4096, RLK_SCAN_AUTO, 1, 1, 0, "ReMax"},
    {"masked_whiten 256x4096", OP_WHITEN, 256, 4096, RLK_SCAN_AUTO, 0, 0, 0, "two launches"},
    {"masked_whiten 8x20480", OP_WHITEN, 8, 20480, RLK_SCAN_AUTO, 0, 0, 0, NULL},
};

static int tool_main(int argc, char **argv) {
  bench_session session = {.backend = RLK_BACKEND_AUTO, .iters = 0}; /* 0: by backend, below */
  int rc = bench_options(argc, argv, &session.backend, &session.iters, &session.json);
  if (rc) return rc < 0 ? 0 : rc;
  if ((rc = bench_open(&session, 0, 0))) return rc;
  if (session.iters <= 0) session.iters = session.host ? 5 : 200;
  if (session.iters < 3) session.iters = 3;
  rng_state ^= (uint64_t)getpid();

  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (run_case(session.ctx, &cases[i], session.iters)) return 1;

  printf("\n%s %s on %s (%s, %s)\n", prog, rlk_version_string(), session.info.name, session.info.target,
         session.info.compiler);
  printf("%-40s %11s %11s %11s %10s %8s %8s  %s\n", "benchmark", "median ms", "min ms", "max ms", "floor ms",
         "x floor", "goal ms", "note");
  for (int i = 0; i < nresults; i++) {
    const result *r = &results[i];
    char goal[16] = "-";
    if (r->goal_ms > 0) snprintf(goal, sizeof goal, "%g", r->goal_ms);
    printf("%-40s %11.5f %11.5f %11.5f %10.5f %8.1f %8s  %s\n", r->name, r->median_ms, r->min_ms, r->max_ms,
           r->floor_ms, r->median_ms / r->floor_ms, goal, r->note);
  }
  if (session.json) {
    FILE *f = tool_json_begin(session.json, &session.info);
    if (!f) return 1;
    fprintf(f, "  \"copy_tbps\": %g, \"iters\": %d,\n  \"results\": [\n", BENCH_FLOOR_TBPS, session.iters);
    for (int i = 0; i < nresults; i++) {
      const result *r = &results[i];
      fprintf(f, "    {\"name\": ");
      json_string(f, r->name);
      json_number_member(f, "median_ms", "%.6f", r->median_ms);
      json_number_member(f, "min_ms", "%.6f", r->min_ms);
      json_number_member(f, "max_ms", "%.6f", r->max_ms);
      json_number_member(f, "floor_ms", "%.6f", r->floor_ms);
      json_number_member(f, "x_floor", "%.3f", r->median_ms / r->floor_ms);
      json_number_member(f, "goal_ms", "%g", r->goal_ms);
      fprintf(f, ", \"note\": ");
      json_string(f, r->note);
      fprintf(f, "}%s\n", i + 1 < nresults ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (close_written(f, session.json)) return 1;
  }
  rlk_context_destroy(session.ctx);
  return 0;
}

int main(int argc, char **argv) { return tool_exit(tool_main(argc, argv)); }

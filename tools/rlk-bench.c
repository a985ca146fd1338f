/* rlk-bench - JIT overheads and op timings.
 *
 *   rlk-bench [--backend auto|cuda|hip|host] [--iters N] [--json FILE]
 *
 * Measures, on one context:
 *   jit.hit          key build + in-process table lookup per op call (rlk_jit_get on a warm spec)
 *   op.enqueue       host time of a whole rlk_group_advantage call (validate, look up, launch)
 *   jit.cold         cold compile of one kernel (a fresh, empty cache)
 *   jit.disk         disk-hit load of one kernel (a new context over that cache: read, verify, load)
 *   op.*             device time of the op (events around each call, median after warm-up)
 * Unlike the user-facing tools it reaches into the runtime (src/) to time the lookup alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/bench_hooks.h"
#include "rlk.h"

static const char *prog = "rlk-bench";

#include "tool_util.h"
#include "bench_util.h"

typedef struct result {
  char name[96];
  double median_ms, min_ms, max_ms;
  double goal_ms; /* 0: none */
  char note[160];
} result;

static result results[64];
static int nresults;

static void add(const char *name, double med, double mn, double mx, double goal, const char *note) {
  if (nresults >= 64) return;
  result *r = &results[nresults++];
  snprintf(r->name, sizeof r->name, "%s", name);
  r->median_ms = med;
  r->min_ms = mn;
  r->max_ms = mx;
  r->goal_ms = goal;
  snprintf(r->note, sizeof r->note, "%s", note ? note : "");
}

#define CHECK(call)                                                                        \
  do {                                                                                     \
    rlk_status st_ = (call);                                                               \
    if (st_ != RLK_OK) {                                                                   \
      fprintf(stderr, "rlk-bench: %s: %s: %s\n", #call, rlk_status_string(st_), rlk_last_error()); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

static double now_ms(void) { return 1e3 * now_s(); }

static rlk_status make_context(rlk_backend backend, const char *cache_dir, rlk_context **ctx) {
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = backend;
  o.cache_dir = cache_dir;
  return rlk_context_create(ctx, &o);
}

typedef struct op_bufs {
  int64_t B, T, G;
  void *scores, *adv, *mask, *tok;
} op_bufs;

static int op_setup(rlk_context *ctx, op_bufs *b, int64_t B, int64_t G, int64_t T) {
  b->B = B;
  b->G = G;
  b->T = T;
  float *h = malloc((size_t)B * sizeof(float));
  unsigned char *m = T ? malloc((size_t)(B * T)) : NULL;
  if (!h || (T && !m)) return 1;
  uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
  for (int64_t i = 0; i < B; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    h[i] = (float)((double)(s >> 11) * 0x1.0p-53 * 4.0 - 2.0);
  }
  for (int64_t i = 0; T && i < B * T; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    m[i] = (s >> 60) != 0;
  }
  CHECK(rlk_malloc(ctx, (size_t)B * 4, &b->scores));
  CHECK(rlk_malloc(ctx, (size_t)B * 4, &b->adv));
  CHECK(rlk_memcpy_to_device(ctx, b->scores, h, (size_t)B * 4));
  b->mask = b->tok = NULL;
  if (T) {
    CHECK(rlk_malloc(ctx, (size_t)(B * T), &b->mask));
    CHECK(rlk_malloc(ctx, (size_t)(B * T) * 4, &b->tok));
    CHECK(rlk_memcpy_to_device(ctx, b->mask, m, (size_t)(B * T)));
  }
  free(h);
  free(m);
  return 0;
}

static void op_args(const op_bufs *b, rlk_group_advantage_args *a) {
  rlk_group_advantage_args_init(a);
  a->scores = rlk_tensor_1d(b->scores, RLK_F32, b->B);
  a->advantages = rlk_tensor_1d(b->adv, RLK_F32, b->B);
  a->group_size = b->G;
  if (b->T) {
    a->mask = rlk_tensor_2d(b->mask, RLK_BOOL, b->B, b->T, b->T);
    a->token_advantages = rlk_tensor_2d(b->tok, RLK_F32, b->B, b->T, b->T);
  }
}

static void op_free(rlk_context *ctx, op_bufs *b) {
  rlk_free(ctx, b->scores);
  rlk_free(ctx, b->adv);
  rlk_free(ctx, b->mask);
  rlk_free(ctx, b->tok);
}

/* Device time of the op: events around each call, warm-up first, median of iters. */
static int time_op(rlk_context *ctx, const char *name, int64_t B, int64_t G, int64_t T, int iters, double goal,
                   const char *note) {
  op_bufs b;
  if (op_setup(ctx, &b, B, G, T)) return 1;
  rlk_group_advantage_args a;
  op_args(&b, &a);
  rlk_event *e0, *e1;
  CHECK(rlk_event_create(ctx, &e0));
  CHECK(rlk_event_create(ctx, &e1));
  for (int i = 0; i < 20; i++) CHECK(rlk_group_advantage(ctx, &a, NULL));
  CHECK(rlk_stream_synchronize(ctx, NULL));
  double *v = malloc((size_t)iters * sizeof *v);
  for (int i = 0; i < iters; i++) {
    CHECK(rlk_event_record(e0, NULL));
    CHECK(rlk_group_advantage(ctx, &a, NULL));
    CHECK(rlk_event_record(e1, NULL));
    float ms = 0;
    CHECK(rlk_event_elapsed_ms(e0, e1, &ms));
    v[i] = ms;
  }
  double med, mn, mx;
  bench_stats(v, iters, &med, &mn, &mx);
  add(name, med, mn, mx, goal, note);
  /* host time per call, back to back (launches are asynchronous on a GPU) */
  double t0 = now_ms();
  for (int i = 0; i < iters; i++) CHECK(rlk_group_advantage(ctx, &a, NULL));
  double per = (now_ms() - t0) / iters;
  CHECK(rlk_stream_synchronize(ctx, NULL));
  char n2[96];
  snprintf(n2, sizeof n2, "%s host enqueue", name);
  add(n2, per, per, per, 0, "whole call, host side, back to back");
  free(v);
  rlk_event_destroy(e0);
  rlk_event_destroy(e1);
  op_free(ctx, &b);
  return 0;
}

static void rmtree(const char *dir) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "rlk-bench: could not remove %s\n", dir);
}

static int tool_main(int argc, char **argv) {
  rlk_backend backend = RLK_BACKEND_AUTO;
  int iters = 200;
  const char *json = NULL;
  int rc = bench_options(argc, argv, &backend, &iters, &json);
  if (rc) return rc < 0 ? 0 : rc;
  if (iters < 5) iters = 5;

  /* a private cache so cold and disk figures are real */
  char cache[256];
  snprintf(cache, sizeof cache, "/tmp/rlk-bench-%d", (int)getpid());
  mkdir(cache, 0700);

  /* cold compile: the first call in an empty cache */
  rlk_context *ctx = NULL;
  CHECK(make_context(backend, cache, &ctx));
  rlk_device_info info;
  CHECK(rlk_context_device_info(ctx, &info));
  op_bufs b;
  if (op_setup(ctx, &b, 1024, 16, 0)) return 1;
  rlk_group_advantage_args a;
  op_args(&b, &a);
  double t0 = now_ms();
  CHECK(rlk_group_advantage(ctx, &a, NULL));
  double cold = now_ms() - t0;
  CHECK(rlk_stream_synchronize(ctx, NULL));
  rlk_counters c;
  CHECK(rlk_context_counters(ctx, &c));
  char note[160];
  snprintf(note, sizeof note, "%llu kernel(s), compiler time %.3f s each", (unsigned long long)c.compiles,
           c.compiles ? c.compile_seconds / (double)c.compiles : 0.0);
  add("jit.cold first call (compile+publish+load)", cold, cold, cold, 1500.0, note);

  /* in-process hit: key build + lookup of the op's kernel */
  const char *hit_line = "group_advantage mode=grpo group_size=16";
  CHECK(rlk_bench_jit_lookups(ctx, hit_line, 1, NULL));
  double hv[21];
  const int reps = 100000;
  for (int r = 0; r < 21; r++) {
    double sec = 0;
    CHECK(rlk_bench_jit_lookups(ctx, hit_line, reps, &sec));
    hv[r] = sec * 1e3 / reps;
  }
  double med, mn, mx;
  bench_stats(hv, 21, &med, &mn, &mx);
  add("jit.hit key+lookup per call", med, mn, mx, 0.002, "in-process table, no lock, no syscall");
  op_free(ctx, &b);
  rlk_context_destroy(ctx);

  /* disk hit: a new context over the populated cache */
  double dv[9];
  for (int r = 0; r < 9; r++) {
    CHECK(make_context(backend, cache, &ctx));
    if (op_setup(ctx, &b, 1024, 16, 0)) return 1;
    op_args(&b, &a);
    double s0 = now_ms();
    CHECK(rlk_group_advantage(ctx, &a, NULL));
    dv[r] = now_ms() - s0;
    CHECK(rlk_context_counters(ctx, &c));
    if (c.compiles != 0) fprintf(stderr, "rlk-bench: warning: a disk-hit run compiled %llu kernels\n", (unsigned long long)c.compiles);
    CHECK(rlk_stream_synchronize(ctx, NULL));
    op_free(ctx, &b);
    rlk_context_destroy(ctx);
  }
  bench_stats(dv, 9, &med, &mn, &mx);
  add("jit.disk first call (read+verify+load)", med, mn, mx, 5.0, "new context, populated cache");

  /* op timings */
  CHECK(make_context(backend, cache, &ctx));
  if (time_op(ctx, "op.group_advantage grpo B=1024 G=16", 1024, 16, 0, iters, 0.010,
              "vectorized torch 0.061 ms, verl dict loop 40.7 ms (H200)"))
    return 1;
  if (time_op(ctx, "op.group_advantage grpo B=1024 G=16 +broadcast T=4096", 1024, 16, 4096, iters, 0,
              "adv + [B,T] masked broadcast"))
    return 1;
  if (time_op(ctx, "op.group_advantage grpo B=16384 G=64", 16384, 64, 0, iters, 0, "large batch"))
    return 1;
  rlk_context_destroy(ctx);
  rmtree(cache);

  printf("\nrlk-bench %s on %s (%s, %s)\n", rlk_version_string(), info.name, info.target, info.compiler);
  printf("%-58s %12s %12s %12s %10s  %s\n", "benchmark", "median ms", "min ms", "max ms", "goal ms", "note");
  for (int i = 0; i < nresults; i++) {
    result *r = &results[i];
    char goal[16] = "-";
    if (r->goal_ms > 0) snprintf(goal, sizeof goal, "%g", r->goal_ms);
    printf("%-58s %12.5f %12.5f %12.5f %10s  %s\n", r->name, r->median_ms, r->min_ms, r->max_ms, goal, r->note);
  }
  if (json) {
    FILE *f = tool_json_begin(json, &info);
    if (!f) return 1;
    fprintf(f, "  \"results\": [\n");
    for (int i = 0; i < nresults; i++) {
      result *r = &results[i];
      fprintf(f, "    {\"name\": ");
      json_string(f, r->name);
      json_number_member(f, "median_ms", "%.6f", r->median_ms);
      json_number_member(f, "min_ms", "%.6f", r->min_ms);
      json_number_member(f, "max_ms", "%.6f", r->max_ms);
      json_number_member(f, "goal_ms", "%g", r->goal_ms);
      fprintf(f, ", \"note\": ");
      json_string(f, r->note);
      fprintf(f, "}%s\n", i + 1 < nresults ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (close_written(f, json)) return 1;
  }
  return 0;
}

int main(int argc, char **argv) { return tool_exit(tool_main(argc, argv)); }

/* bench_util.h - what the benchmark tools share: a table of timed cases (median, min, max of
 * device-event timings), their ratio to the bytes floor of shared/specs/performance.md, and the
 * JSON file they write. A tool defines `static const char *prog` and includes tool_util.h first. */
#ifndef RLK_BENCH_UTIL_H
#define RLK_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlk.h"

#define BENCH_FLOOR_TBPS 4.14 /* device-to-device copy, bytes read plus written (performance.md) */
#define BENCH_MAX_RESULTS 256

typedef struct bench_result {
  char name[112];
  double median_ms, min_ms, max_ms, bytes, goal_ms;
  char note[160];
} bench_result;

/* Returns lib_error(...) from the calling function when a library call fails. */
#define BENCH_CHECK(call)                            \
  do {                                               \
    rlk_status st_ = (call);                         \
    if (st_ != RLK_OK) return lib_error(#call, st_); \
  } while (0)

/* A 53-bit pseudo-random integer (a 64-bit LCG): data for timing, the same every run. */
TOOL_UNUSED static uint64_t bench_lcg(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 11;
}

/* float -> bf16, rounded to nearest even (finite inputs). */
TOOL_UNUSED static uint16_t bench_bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* bf16 -> double (exact). */
TOOL_UNUSED static double bench_bf16_value(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Frees each of n device buffers (NULL entries are skipped by rlk_free). */
TOOL_UNUSED static void bench_free_each(rlk_context *ctx, void *const *bufs, size_t n) {
  for (size_t i = 0; i < n; i++) rlk_free(ctx, bufs[i]);
}

static bench_result bench_results[BENCH_MAX_RESULTS];
static int bench_nresults;

TOOL_UNUSED static int bench_cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Sorts n timings in place and gives their median, minimum and maximum. */
TOOL_UNUSED static void bench_stats(double *v, int n, double *median, double *min, double *max) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  *median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  *min = v[0];
  *max = v[n - 1];
}

static double bench_floor_ms(double bytes) { return bytes / (BENCH_FLOOR_TBPS * 1e12) * 1e3; }

/* Records and prints a case from n timings (ms); goal_ms 0: none. Returns the entry. */
TOOL_UNUSED static const bench_result *bench_add(const char *name, const double *v, int n, double bytes,
                                                 double goal_ms, const char *note) {
  static bench_result overflow;
  bench_result *r = bench_nresults < BENCH_MAX_RESULTS ? &bench_results[bench_nresults++] : &overflow;
  double *s = malloc((size_t)n * sizeof *s);
  memcpy(s, v, (size_t)n * sizeof *s);
  bench_stats(s, n, &r->median_ms, &r->min_ms, &r->max_ms);
  snprintf(r->name, sizeof r->name, "%s", name);
  r->bytes = bytes;
  r->goal_ms = goal_ms;
  snprintf(r->note, sizeof r->note, "%s", note ? note : "");
  free(s);
  printf("%-50s %9.4f ms (min %.4f max %.4f)  %6.0f GB/s  x%.2f of floor %.4f ms", r->name, r->median_ms,
         r->min_ms, r->max_ms, bytes / (r->median_ms * 1e-3) / 1e9, r->median_ms / bench_floor_ms(bytes),
         bench_floor_ms(bytes));
  if (goal_ms > 0) printf("  goal %.4f ms %s", goal_ms, r->median_ms <= goal_ms ? "met" : "MISSED");
  printf("%s%s\n", *r->note ? "  " : "", r->note);
  fflush(stdout);
  return r;
}

/* What a benchmark's main works with: the shared options (bench_option) and, after bench_open,
 * the context, its device and whether that is the host backend. */
typedef struct bench_session {
  rlk_backend backend;
  int iters;
  const char *json;
  rlk_context *ctx;
  rlk_device_info info;
  int host;
} bench_session;

/* Opens the session's context (tool_context), then raises iters to min_iters and, on the host
 * backend, lowers it to host_iters (0: no limit): there the CPU path gets a functional check, not
 * a race. 0, or tool_context's status. */
TOOL_UNUSED static int bench_open(bench_session *s, int min_iters, int host_iters) {
  const int rc = tool_context(s->backend, &s->ctx, &s->info);
  if (rc) return rc;
  s->host = rlk_context_backend(s->ctx) == RLK_BACKEND_HOST;
  if (s->iters < min_iters) s->iters = min_iters;
  if (s->host && host_iters > 0 && s->iters > host_iters) s->iters = host_iters;
  return 0;
}

/* Writes every recorded case as JSON; returns 0, or 1 when the file cannot all be written. */
TOOL_UNUSED static int bench_write_json(const char *path, const rlk_device_info *info) {
  FILE *f = tool_json_begin(path, info);
  if (!f) return 1;
  fprintf(f, "  \"floor_tbps\": %.2f,\n  \"results\": [\n", BENCH_FLOOR_TBPS);
  for (int i = 0; i < bench_nresults; i++) {
    const bench_result *r = &bench_results[i];
    const double floor_ms = bench_floor_ms(r->bytes);
    fprintf(f, "    {\"name\": ");
    json_string(f, r->name);
    json_number_member(f, "median_ms", "%.6f", r->median_ms);
    json_number_member(f, "min_ms", "%.6f", r->min_ms);
    json_number_member(f, "max_ms", "%.6f", r->max_ms);
    json_number_member(f, "bytes", "%.0f", r->bytes);
    json_number_member(f, "gbps", "%.1f", r->bytes / (r->median_ms * 1e-3) / 1e9);
    json_number_member(f, "floor_ms", "%.6f", floor_ms);
    json_number_member(f, "ratio_to_floor", "%.4f", r->median_ms / floor_ms);
    json_number_member(f, "goal_ms", "%g", r->goal_ms);
    fprintf(f, ", \"note\": ");
    json_string(f, r->note);
    fprintf(f, "}%s\n", i + 1 < bench_nresults ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  return close_written(f, path);
}

#endif

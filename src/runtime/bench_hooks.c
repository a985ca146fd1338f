/* bench_hooks.c - measurements for benchmarks (runtime/bench_hooks.h; the public call is
 * op_table.c's, which hands down its catalog). */
#include <stdlib.h>

#include "core/core.h"
#include "jit/jit.h"
#include "runtime/catalog.h"
#include "runtime/op.h"

rlk_status rlk_catalog_bench_jit_lookups(rlk_op_catalog *catalog, rlk_context *ctx, const char *config, int reps,
                                         double *seconds) {
  if (seconds) *seconds = 0;
  if (!ctx || reps < 1) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_bench_jit_lookups: ctx is NULL or reps < 1");
  rlk_op_config_pair pairs[RLK_OP_CONFIG_MAX_PAIRS];
  size_t npairs = 0, nspecs = 0;
  char *line = NULL;
  const rlk_op_desc *d = NULL;
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
  rlk_status st = rlk_op_config_parse("rlk_bench_jit_lookups", catalog, config, &line, &d, pairs, &npairs);
  if (!st) st = rlk_op_plan(d, ctx, npairs, pairs, specs, &nspecs);
  free(line);
  if (st) return st;
  if (!nspecs) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_bench_jit_lookups: '%s' needs no kernel", config);
  void *fn = NULL;
  if ((st = rlk_jit_get(ctx->jit, &specs[0], &fn))) return st;
  const double t0 = rlk_now();
  for (int i = 0; i < reps; i++) st |= rlk_jit_get(ctx->jit, &specs[0], &fn);
  if (seconds) *seconds = rlk_now() - t0;
  return st ? rlk_error(RLK_ERR_INTERNAL, "rlk_bench_jit_lookups: a warm lookup failed") : RLK_OK;
}

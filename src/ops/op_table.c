/* op_table.c - every op family, in the order of runtime/op_list.h, for the runtime's precompile,
 * help and recording. The public calls that name an op by a configuration line are defined here
 * too: each hands the table down (as a catalog) to the runtime's machinery, which never reaches up
 * for it. */
#include <stddef.h>

#include "ops/ops.h"
#include "runtime/bench_hooks.h"
#include "runtime/catalog.h"

#define RLK_OP_TABLE_ROW(name) &rlk_op_##name,
const rlk_op_desc *const rlk_op_table[] = {RLK_OP_LIST(RLK_OP_TABLE_ROW, RLK_OP_LIST_SKIP, RLK_OP_LIST_SKIP) NULL};

_Static_assert(RLK_OP_COUNT <= RLK_CATALOG_MAX_OPS, "the op list outgrows the catalog's texts");

static rlk_op_catalog catalog = RLK_OP_CATALOG_INIT(rlk_op_table);

const char *rlk_precompile_ops(void) { return rlk_catalog_names(&catalog); }

const char *rlk_precompile_help(const char *op) { return rlk_catalog_help(&catalog, op); }

rlk_status rlk_precompile(rlk_context *ctx, const char *config, int *kernels) {
  return rlk_catalog_precompile(&catalog, ctx, config, kernels);
}

rlk_status rlk_precompile_keys(rlk_context *ctx, const char *config, char *buf, size_t size, int *kernels) {
  return rlk_catalog_precompile_keys(&catalog, ctx, config, buf, size, kernels);
}

rlk_status rlk_tune_record_set_key(rlk_tune_record *record, const char *config) {
  return rlk_catalog_tune_record_set_key(&catalog, record, config);
}

rlk_status rlk_tune_lookup(rlk_context *ctx, const char *config, char *settings, size_t size, int *found) {
  return rlk_catalog_tune_lookup(&catalog, ctx, config, settings, size, found);
}

const char *rlk_tune_candidates(const char *op) { return rlk_catalog_candidates(&catalog, op); }

const char *rlk_tune_runtime_settings(rlk_context *ctx, const char *config) {
  return rlk_catalog_tune_runtime_settings(&catalog, ctx, config);
}

rlk_status rlk_bench_jit_lookups(rlk_context *ctx, const char *config, int reps, double *seconds) {
  return rlk_catalog_bench_jit_lookups(&catalog, ctx, config, reps, seconds);
}

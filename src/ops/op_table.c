/* op_table.c - every op family, for the runtime's precompile, help and recording: adding an
 * op is one line here (and its extern in ops.h). The public calls that name an op by a
 * configuration line are defined here too: each hands the table down (as a catalog) to the
 * runtime's machinery, which never reaches up for it. */
#include <stddef.h>

#include "ops/ops.h"
#include "runtime/bench_hooks.h"
#include "runtime/catalog.h"

const rlk_op_desc *const rlk_op_table[] = {&rlk_op_group_advantage, &rlk_op_policy_loss, &rlk_op_value_loss, &rlk_op_gae, &rlk_op_discounted_returns, &rlk_op_reverse_cumsum,
                                           &rlk_op_masked_whiten, &rlk_op_logprob, &rlk_op_logprob_shard, &rlk_op_sample, &rlk_op_prefix_attention,
                                           &rlk_op_linear_logprob, &rlk_op_token_baseline,
                                           &rlk_op_token_kl, NULL};

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

/* tune_config.c - configuration lines and the tuning database: a line's record key (through the
 * op's own canonical spelling, the one its calls look up), what a context's database gives a
 * line, and the settings that change a line's calls but not its kernels. */
#include <stdlib.h>
#include <string.h>

#include "runtime/context.h"
#include "core/core.h"
#include "runtime/catalog.h"
#include "runtime/op.h"
#include "tune/tune_db.h"
#include "tune/tune_table.h"

/* The op, shape and bucket of a configuration line. */
static rlk_status line_key(const char *who, rlk_op_catalog *catalog, const char *config, const rlk_op_desc **op,
                           char *shape, size_t size, int64_t *tokens) {
  rlk_op_config_pair pairs[RLK_OP_CONFIG_MAX_PAIRS];
  size_t npairs = 0;
  char *line = NULL;
  rlk_status st = rlk_op_config_parse(who, catalog, config, &line, op, pairs, &npairs);
  if (!st && !(*op)->tune_key)
    st = rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: op %s has no tuning candidates", who, (*op)->name);
  if (!st) {
    rlk_op_values vals;
    st = rlk_op_values_parse(*op, npairs, pairs, &vals);
    if (!st) st = (*op)->tune_key(&vals, shape, size, tokens);
    if (st) rlk_error_wrap(st, "%s: %s", who, (*op)->name);
  }
  free(line);
  return st;
}

rlk_status rlk_catalog_tune_record_set_key(rlk_op_catalog *catalog, rlk_tune_record *record, const char *config) {
  if (!record) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_tune_record_set_key: record is NULL");
  const rlk_op_desc *op = NULL;
  char shape[sizeof record->shape];
  int64_t tokens = 0;
  rlk_status st = line_key("rlk_tune_record_set_key", catalog, config, &op, shape, sizeof shape, &tokens);
  if (st) return st;
  rlk_format(record->op, sizeof record->op, "%s", op->name);
  memcpy(record->shape, shape, sizeof record->shape);
  record->tokens = tokens;
  return RLK_OK;
}

rlk_status rlk_catalog_tune_lookup(rlk_op_catalog *catalog, rlk_context *ctx, const char *config, char *settings,
                                   size_t size, int *found) {
  if (found) *found = 0;
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_tune_lookup: ctx is NULL");
  if (!found) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_tune_lookup: found is NULL");
  if (!settings || size == 0) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_tune_lookup: settings is NULL or empty");
  settings[0] = '\0';
  const rlk_op_desc *op = NULL;
  char shape[256];
  int64_t tokens = 0;
  rlk_status st = line_key("rlk_tune_lookup", catalog, config, &op, shape, sizeof shape, &tokens);
  if (st) return st;
  if (op->reads_tuning && !op->reads_tuning()) return RLK_OK; /* the environment keeps calls off it */
  const rlk_tune_entry *e = rlk_tune_table_find(ctx->tune, op->name, shape, tokens);
  if (!e) return RLK_OK;
  if (rlk_format(settings, size, "%s", rlk_tune_entry_settings(e)) < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_tune_lookup: settings of %zu bytes is too small", size);
  *found = 1;
  return RLK_OK;
}

const char *rlk_catalog_tune_runtime_settings(rlk_op_catalog *catalog, rlk_context *ctx, const char *config) {
  if (!ctx || !config) return "";
  rlk_op_config_pair pairs[RLK_OP_CONFIG_MAX_PAIRS];
  size_t npairs = 0;
  char *line = NULL;
  const rlk_op_desc *op = NULL;
  const char *names = "";
  rlk_op_values vals;
  if (rlk_op_config_parse("rlk_tune_runtime_settings", catalog, config, &line, &op, pairs, &npairs) == RLK_OK &&
      op->runtime_tuning && rlk_op_values_parse(op, npairs, pairs, &vals) == RLK_OK) {
    const char *r = op->runtime_tuning(ctx, &vals);
    if (r) names = r;
  }
  free(line);
  rlk_error_clear();
  return names;
}

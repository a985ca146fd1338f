/* catalog.h - the op table as the runtime receives it. The ops layer defines the table and the
 * public calls that name an op by its configuration line (src/ops/op_table.c); each hands its
 * catalog down to the runtime's machinery below (precompiling, tuning lines, the bench hook), so
 * the runtime never links to the ops above it. The texts built from the table (names, help,
 * tuning candidates) are made once, at first use, and live as long as the catalog. */
#ifndef RLK_RUNTIME_CATALOG_H
#define RLK_RUNTIME_CATALOG_H

#include <pthread.h>
#include <stdatomic.h>

#include "rlk.h"
#include "runtime/op.h"

#define RLK_CATALOG_MAX_OPS 64
#define RLK_CATALOG_HELP_BYTES 4096

typedef struct rlk_op_catalog {
  const rlk_op_desc *const *ops; /* NULL-terminated, at most RLK_CATALOG_MAX_OPS */
  pthread_mutex_t lock;
  atomic_int built;
  char names[512]; /* "group_advantage policy_loss ..." */
  char help[RLK_CATALOG_MAX_OPS][RLK_CATALOG_HELP_BYTES];
  char *candidates[RLK_CATALOG_MAX_OPS]; /* malloc'd, one per line; NULL: none (or no memory) */
} rlk_op_catalog;

/* A catalog over `table`, for a static definition. */
#define RLK_OP_CATALOG_INIT(table) {.ops = (table), .lock = PTHREAD_MUTEX_INITIALIZER}

/* The op named `name`, or NULL. */
const rlk_op_desc *rlk_catalog_find(const rlk_op_catalog *c, const char *name);

/* The ops' names, space-separated (rlk_precompile_ops). */
const char *rlk_catalog_names(rlk_op_catalog *c);

/* An op's --help text (rlk_precompile_help); "" for an unknown op or NULL. */
const char *rlk_catalog_help(rlk_op_catalog *c, const char *op);

/* An op's tuning candidates, one a line (rlk_tune_candidates); "" when it has none. */
const char *rlk_catalog_candidates(rlk_op_catalog *c, const char *op);

/* Splits a configuration line ("op name=value ...") into its op (looked up in the catalog) and
 * settings. *line receives a copy of the text that the pairs point into (the caller frees it,
 * also on error). Errors are RLK_ERR_INVALID_ARGUMENT messages prefixed with `who`: an empty
 * line, an unknown op, a setting that is not name=value or is given twice. */
rlk_status rlk_op_config_parse(const char *who, rlk_op_catalog *catalog, const char *config, char **line,
                               const rlk_op_desc **op, rlk_op_config_pair *pairs, size_t *npairs);

/* The public calls over configuration lines, with the catalog their op is looked up in; each
 * behaves as the rlk.h (or bench_hooks.h) call of the same name without "catalog_". */
rlk_status rlk_catalog_precompile(rlk_op_catalog *c, rlk_context *ctx, const char *config, int *kernels);
rlk_status rlk_catalog_precompile_keys(rlk_op_catalog *c, rlk_context *ctx, const char *config, char *buf,
                                       size_t size, int *kernels);
rlk_status rlk_catalog_tune_record_set_key(rlk_op_catalog *c, rlk_tune_record *record, const char *config);
rlk_status rlk_catalog_tune_lookup(rlk_op_catalog *c, rlk_context *ctx, const char *config, char *settings,
                                   size_t size, int *found);
const char *rlk_catalog_tune_runtime_settings(rlk_op_catalog *c, rlk_context *ctx, const char *config);
rlk_status rlk_catalog_bench_jit_lookups(rlk_op_catalog *c, rlk_context *ctx, const char *config, int reps,
                                         double *seconds);

#endif

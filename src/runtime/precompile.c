/* precompile.c - rlk_precompile and its keys: a configuration line goes through the op's settings
 * table (its op found in the catalog the ops layer hands down) and the op's own variant
 * selection, and each resulting kernel is compiled or found. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "jit/jit.h"
#include "runtime/catalog.h"
#include "runtime/op.h"


rlk_status rlk_op_config_parse(const char *who, rlk_op_catalog *catalog, const char *config, char **linep,
                               const rlk_op_desc **opp, rlk_op_config_pair *pairs, size_t *npairs) {
  *linep = NULL;
  *opp = NULL;
  *npairs = 0;
  if (!config) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: config is NULL", who);
  if (strlen(config) > 4096) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: config line is too long", who);
  char *line = rlk_strdup(config);
  if (!line) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "%s: out of memory", who);
  *linep = line;
  const char *op = NULL;
  size_t n = 0;
  char *save = NULL;
  for (char *tok = strtok_r(line, " \t\r\n", &save); tok; tok = strtok_r(NULL, " \t\r\n", &save)) {
    if (!op) {
      op = tok;
      continue;
    }
    char *eq = strchr(tok, '=');
    if (!eq || eq == tok || !eq[1])
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: '%s' is not name=value", who, tok);
    if (n == RLK_OP_CONFIG_MAX_PAIRS)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: more than %d settings", who, RLK_OP_CONFIG_MAX_PAIRS);
    *eq = '\0';
    for (size_t i = 0; i < n; i++)
      if (!strcmp(pairs[i].name, tok))
        return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: '%s' is given twice", who, tok);
    pairs[n].name = tok;
    pairs[n].value = eq + 1;
    n++;
  }
  if (!op) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: empty configuration", who);
  const rlk_op_desc *d = rlk_catalog_find(catalog, op);
  if (!d)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: unknown op '%s' (known: %s)", who, op,
                     rlk_catalog_names(catalog));
  *opp = d;
  *npairs = n;
  return RLK_OK;
}

rlk_status rlk_op_plan(const rlk_op_desc *d, const rlk_context *ctx, size_t npairs, const rlk_op_config_pair *pairs,
                       rlk_kernel_spec *specs, size_t *nspecs) {
  if (nspecs) *nspecs = 0;
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", d->name);
  if (!specs || !nspecs) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: no room for the specs", d->name);
  rlk_op_values vals;
  rlk_status st = rlk_op_values_parse(d, npairs, pairs, &vals);
  if (!st) st = d->plan(ctx, &vals, specs, nspecs);
  if (!st && *nspecs > RLK_OP_MAX_KERNELS) st = rlk_error(RLK_ERR_INTERNAL, "%s planned too many kernels", d->name);
  return st;
}

/* The kernel specs of a configuration line on ctx. *line is freed by the caller. */
static rlk_status plan_line(const char *who, rlk_op_catalog *catalog, rlk_context *ctx, const char *config,
                            char **line, rlk_kernel_spec *specs, size_t *nspecs) {
  *nspecs = 0;
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", who);
  rlk_op_config_pair pairs[RLK_OP_CONFIG_MAX_PAIRS];
  size_t npairs = 0;
  const rlk_op_desc *d = NULL;
  rlk_status st = rlk_op_config_parse(who, catalog, config, line, &d, pairs, &npairs);
  if (st) return st;
  st = rlk_op_plan(d, ctx, npairs, pairs, specs, nspecs);
  if (st) return rlk_error_wrap(st, "%s: %s", who, d->name);
  return RLK_OK;
}

rlk_status rlk_catalog_precompile(rlk_op_catalog *catalog, rlk_context *ctx, const char *config, int *kernels) {
  if (kernels) *kernels = 0;
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
  size_t nspecs = 0;
  char *line = NULL;
  rlk_status st = plan_line("rlk_precompile", catalog, ctx, config, &line, specs, &nspecs);
  free(line);
  if (st) return st;
  /* A compile-only context exists to fill a cache: with nothing to write to, the work would be
   * thrown away. A context with a device loads the kernels, so they are warm in memory too. */
  if (!ctx->backend && !rlk_cache_root(ctx->cache)[0])
    return rlk_error(RLK_ERR_CACHE,
                     "rlk_precompile: the cache writes nowhere (RLK_CACHE_MODE, or an unusable root: see the "
                     "warning above), so compiled kernels would be discarded");
  for (size_t i = 0; i < nspecs; i++) {
    void *fn = NULL;
    st = ctx->backend ? rlk_jit_get_published(ctx->jit, &specs[i], &fn) : rlk_jit_prepare(ctx->jit, &specs[i]);
    if (st) return st;
  }
  if (kernels) *kernels = (int)nspecs;
  return RLK_OK;
}

rlk_status rlk_catalog_precompile_keys(rlk_op_catalog *catalog, rlk_context *ctx, const char *config, char *buf,
                                       size_t size, int *kernels) {
  if (kernels) *kernels = 0;
  if (!buf || size == 0) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_precompile_keys: buf is NULL or empty");
  buf[0] = '\0';
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
  size_t nspecs = 0, len = 0;
  char *line = NULL;
  rlk_status st = plan_line("rlk_precompile_keys", catalog, ctx, config, &line, specs, &nspecs);
  free(line);
  for (size_t i = 0; !st && i < nspecs; i++) {
    rlk_kernel_key key;
    st = rlk_jit_key(ctx->jit, &specs[i], &key);
    if (st) break;
    int w = rlk_format(buf + len, size - len, "%s%s", i ? " " : "", key.hex);
    if (w < 0) st = rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_precompile_keys: buf of %zu bytes is too small", size);
    else len += (size_t)w;
  }
  if (st) {
    buf[0] = '\0';
    return st;
  }
  if (kernels) *kernels = (int)nspecs;
  return RLK_OK;
}

/* registry.c - the op table, shared argument checks, and rlk_precompile: a configuration line
 * goes through the op's own variant selection, and each resulting kernel is compiled or found. */
#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "jit/jit.h"
#include "ops/ops.h"

const rlk_op_desc *const rlk_op_table[] = {&rlk_op_group_advantage, &rlk_op_policy_loss, &rlk_op_value_loss, &rlk_op_gae, &rlk_op_discounted_returns, &rlk_op_reverse_cumsum,
                                           &rlk_op_masked_whiten, &rlk_op_logprob, &rlk_op_sample, NULL};

static const rlk_op_desc *find_op(const char *name) {
  for (size_t i = 0; rlk_op_table[i]; i++)
    if (!strcmp(rlk_op_table[i]->name, name)) return rlk_op_table[i];
  return NULL;
}

static char op_names[512];
static pthread_once_t op_names_once = PTHREAD_ONCE_INIT;

static void fill_op_names(void) {
  size_t len = 0;
  for (size_t i = 0; rlk_op_table[i]; i++) {
    int w = rlk_format(op_names + len, sizeof op_names - len, "%s%s", i ? " " : "", rlk_op_table[i]->name);
    if (w < 0) break;
    len += (size_t)w;
  }
}

const char *rlk_precompile_ops(void) {
  pthread_once(&op_names_once, fill_op_names);
  return op_names;
}

const char *rlk_precompile_help(const char *op) {
  const rlk_op_desc *d = op ? find_op(op) : NULL;
  return d ? d->help : "";
}

rlk_status rlk_op_config_parse(const char *who, const char *config, char **linep, const rlk_op_desc **opp,
                               rlk_op_config_pair *pairs, size_t *npairs) {
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
  const rlk_op_desc *d = find_op(op);
  if (!d)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: unknown op '%s' (known: %s)", who, op, rlk_precompile_ops());
  *opp = d;
  *npairs = n;
  return RLK_OK;
}

/* The kernel specs of a configuration line on ctx. *line is freed by the caller. */
static rlk_status plan_line(const char *who, rlk_context *ctx, const char *config, char **line,
                            rlk_kernel_spec *specs, size_t *nspecs) {
  *nspecs = 0;
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", who);
  rlk_op_config_pair pairs[RLK_OP_CONFIG_MAX_PAIRS];
  size_t npairs = 0;
  const rlk_op_desc *d = NULL;
  rlk_status st = rlk_op_config_parse(who, config, line, &d, pairs, &npairs);
  if (st) return st;
  st = d->plan(ctx, npairs, pairs, specs, nspecs);
  if (st) return rlk_error_wrap(st, "%s: %s", who, d->name);
  return RLK_OK;
}

rlk_status rlk_precompile(rlk_context *ctx, const char *config, int *kernels) {
  if (kernels) *kernels = 0;
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
  size_t nspecs = 0;
  char *line = NULL;
  rlk_status st = plan_line("rlk_precompile", ctx, config, &line, specs, &nspecs);
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
    st = ctx->backend ? rlk_jit_get(ctx->jit, &specs[i], &fn) : rlk_jit_prepare(ctx->jit, &specs[i]);
    if (st) return st;
  }
  if (kernels) *kernels = (int)nspecs;
  return RLK_OK;
}

rlk_status rlk_precompile_keys(rlk_context *ctx, const char *config, char *buf, size_t size, int *kernels) {
  if (kernels) *kernels = 0;
  if (!buf || size == 0) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_precompile_keys: buf is NULL or empty");
  buf[0] = '\0';
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
  size_t nspecs = 0, len = 0;
  char *line = NULL;
  rlk_status st = plan_line("rlk_precompile_keys", ctx, config, &line, specs, &nspecs);
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

/* ---- argument checks ------------------------------------------------------------- */

rlk_status rlk_op_parse_int(const char *name, const char *value, int64_t lo, int64_t hi, int64_t *out) {
  char *end = NULL;
  long long v = strtoll(value, &end, 10);
  if (!*value || *end || v < lo || v > hi)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: '%s' is not an integer in [%lld, %lld]", name,
                     value, (long long)lo, (long long)hi);
  *out = v;
  return RLK_OK;
}

rlk_status rlk_check_tensor(const rlk_tensor *t, const char *what, int required) {
  if (!t->data) {
    if (required) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: data is NULL", what);
    return RLK_OK;
  }
  if (t->ndim < 1 || t->ndim > RLK_MAX_DIMS)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: ndim %d is outside [1, %d]", what, (int)t->ndim, RLK_MAX_DIMS);
  if (rlk_dtype_size(t->dtype) == 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: dtype %d is not an rlk_dtype", what, (int)t->dtype);
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] <= 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape[%d] = %lld is not positive", what, i,
                       (long long)t->shape[i]);
    if (t->shape[i] > ((int64_t)1 << 40))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape[%d] = %lld is too large", what, i,
                       (long long)t->shape[i]);
    if (t->strides[i] < 0 || (t->strides[i] == 0 && t->shape[i] > 1))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: stride[%d] = %lld is not positive", what, i,
                       (long long)t->strides[i]);
  }
  if ((uintptr_t)t->data % rlk_dtype_size(t->dtype) != 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: data is not aligned to its %zu-byte dtype", what,
                     rlk_dtype_size(t->dtype));
  return RLK_OK;
}

rlk_status rlk_check_dtype(const rlk_tensor *t, const char *what, uint32_t allowed) {
  if ((int)t->dtype > 0 && (int)t->dtype < 32 && (allowed & RLK_DTYPE_BIT(t->dtype))) return RLK_OK;
  char names[128] = "";
  size_t len = 0;
  for (int d = 1; d < 8; d++)
    if (allowed & RLK_DTYPE_BIT(d)) {
      int w = rlk_format(names + len, sizeof names - len, "%s%s", len ? ", " : "", rlk_dtype_name((rlk_dtype)d));
      if (w > 0) len += (size_t)w;
    }
  return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: dtype %s is not supported (expected %s)", what,
                   rlk_dtype_name(t->dtype), names);
}

rlk_status rlk_check_ndim(const rlk_tensor *t, const char *what, int lo, int hi) {
  if (t->ndim < lo || t->ndim > hi) {
    if (lo == hi) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: expected %d dimensions, got %d", what, lo, (int)t->ndim);
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: expected %d to %d dimensions, got %d", what, lo, hi, (int)t->ndim);
  }
  return RLK_OK;
}

rlk_status rlk_check_contiguous(const rlk_tensor *t, const char *what) {
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] > 1 && t->strides[i] != expect)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: must be contiguous (stride[%d] = %lld, expected %lld)", what,
                       i, (long long)t->strides[i], (long long)expect);
    expect *= t->shape[i];
  }
  return RLK_OK;
}

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

#define RLK_CONFIG_MAX_PAIRS 32

rlk_status rlk_precompile(rlk_context *ctx, const char *config, int *kernels) {
  if (kernels) *kernels = 0;
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_precompile: ctx is NULL");
  if (!config) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_precompile: config is NULL");
  size_t len = strlen(config);
  if (len > 4096) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_precompile: config line is too long");
  char *line = rlk_strdup(config);
  if (!line) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "rlk_precompile: out of memory");
  rlk_op_config_pair pairs[RLK_CONFIG_MAX_PAIRS];
  size_t npairs = 0;
  const char *op = NULL;
  rlk_status st = RLK_OK;
  char *save = NULL;
  for (char *tok = strtok_r(line, " \t\r\n", &save); tok; tok = strtok_r(NULL, " \t\r\n", &save)) {
    if (!op) {
      op = tok;
      continue;
    }
    char *eq = strchr(tok, '=');
    if (!eq || eq == tok || !eq[1]) {
      st = rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_precompile: '%s' is not name=value", tok);
      goto done;
    }
    if (npairs == RLK_CONFIG_MAX_PAIRS) {
      st = rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_precompile: more than %d settings", RLK_CONFIG_MAX_PAIRS);
      goto done;
    }
    *eq = '\0';
    for (size_t i = 0; i < npairs; i++)
      if (!strcmp(pairs[i].name, tok)) {
        st = rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_precompile: '%s' is given twice", tok);
        goto done;
      }
    pairs[npairs].name = tok;
    pairs[npairs].value = eq + 1;
    npairs++;
  }
  if (!op) {
    st = rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_precompile: empty configuration");
    goto done;
  }
  const rlk_op_desc *d = find_op(op);
  if (!d) {
    st = rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_precompile: unknown op '%s' (known: %s)", op, rlk_precompile_ops());
    goto done;
  }
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
  size_t nspecs = 0;
  st = d->plan(ctx, npairs, pairs, specs, &nspecs);
  if (st) {
    rlk_error_wrap(st, "rlk_precompile: %s", op);
    goto done;
  }
  /* A compile-only context exists to fill a cache: with nothing to write to, the work would be
   * thrown away. A context with a device loads the kernels, so they are warm in memory too. */
  if (!ctx->backend && !rlk_cache_root(ctx->cache)[0]) {
    st = rlk_error(RLK_ERR_CACHE,
                   "rlk_precompile: the cache writes nowhere (RLK_CACHE_MODE, or an unusable root: see the "
                   "warning above), so compiled kernels would be discarded");
    goto done;
  }
  for (size_t i = 0; i < nspecs; i++) {
    void *fn = NULL;
    st = ctx->backend ? rlk_jit_get(ctx->jit, &specs[i], &fn) : rlk_jit_prepare(ctx->jit, &specs[i]);
    if (st) goto done;
  }
  if (kernels) *kernels = (int)nspecs;
done:
  free(line);
  return st;
}

/* ---- argument checks ------------------------------------------------------------- */

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

/* catalog.c - the op table handed down by the ops layer, and the texts made from it once. */
#include "runtime/catalog.h"

#include <stdlib.h>
#include <string.h>

#include "core/core.h"

/* One line per candidate; NULL when out of memory. */
static char *join_lines(const char *const *lines) {
  size_t len = 1;
  for (size_t k = 0; lines && lines[k]; k++) len += strlen(lines[k]) + 1;
  char *s = malloc(len), *o = s;
  if (!s) return NULL;
  for (size_t k = 0; lines && lines[k]; k++) {
    size_t n = strlen(lines[k]);
    memcpy(o, lines[k], n);
    o[n] = '\n';
    o += n + 1;
  }
  *o = '\0';
  return s;
}

/* Builds every text once; later calls read them without a lock. */
static void build(rlk_op_catalog *c) {
  if (atomic_load_explicit(&c->built, memory_order_acquire)) return;
  pthread_mutex_lock(&c->lock);
  if (!atomic_load_explicit(&c->built, memory_order_relaxed)) {
    size_t len = 0;
    for (size_t i = 0; c->ops[i] && i < RLK_CATALOG_MAX_OPS; i++) {
      int w = rlk_format(c->names + len, sizeof c->names - len, "%s%s", i ? " " : "", c->ops[i]->name);
      if (w >= 0) len += (size_t)w;
      if (rlk_op_help_text(c->ops[i], c->help[i], RLK_CATALOG_HELP_BYTES) < 0) c->help[i][0] = '\0';
      c->candidates[i] = join_lines(c->ops[i]->candidates);
    }
    atomic_store_explicit(&c->built, 1, memory_order_release);
  }
  pthread_mutex_unlock(&c->lock);
}

const char *rlk_catalog_names(rlk_op_catalog *c) {
  build(c);
  return c->names;
}

/* The index of op `name` in the catalog, -1 if none. */
static int index_of(const rlk_op_catalog *c, const char *name) {
  for (size_t i = 0; name && c->ops[i] && i < RLK_CATALOG_MAX_OPS; i++)
    if (!strcmp(c->ops[i]->name, name)) return (int)i;
  return -1;
}

const rlk_op_desc *rlk_catalog_find(const rlk_op_catalog *c, const char *name) {
  const int i = index_of(c, name);
  return i < 0 ? NULL : c->ops[i];
}

const char *rlk_catalog_help(rlk_op_catalog *c, const char *op) {
  build(c);
  const int i = index_of(c, op);
  return i < 0 ? "" : c->help[i];
}

const char *rlk_catalog_candidates(rlk_op_catalog *c, const char *op) {
  build(c);
  const int i = index_of(c, op);
  return i < 0 || !c->candidates[i] ? "" : c->candidates[i];
}

/* tune_table.c - a context's view of the tuning database (tune_table.h).
 *
 * The records of the context's environment go into an open-addressing table of atomic entry
 * pointers, sized when the file is read; entries are immutable once published, so a lookup is a
 * hash of the key and a few pointer loads. Under RLK_TUNE=tune a miss publishes a marker entry
 * (no settings) before it writes the pending list, so every later lookup of that configuration
 * is an ordinary in-memory hit that finds the marker. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "tune/tune_db.h"
#include "tune/tune_table.h"

#define TUNE_MIN_SLOTS 512u
#define TUNE_PENDING_LOCK_WAIT_S 1.0 /* a call waits at most this for a writer's lock */

struct rlk_tune_entry {
  uint64_t hash;
  int64_t tokens;
  char *op, *shape;
  char *settings; /* the winner ("" for the default); NULL: a miss noted for the pending list */
  _Atomic int parsed; /* 0 not yet, 1 values hold the parse, -1 the settings do not parse */
  int64_t values[RLK_TUNE_VALUES];
  atomic_int warned;
  struct rlk_tune_entry *next_all;
};

struct rlk_tune_table {
  rlk_tune_mode mode;
  char path[4096];
  rlk_tune_record env; /* this context's environment (the key's other fields empty) */
  _Atomic int loaded;
  int records;         /* of this environment, once loaded */
  pthread_mutex_t lock;
  _Atomic(rlk_tune_entry *) *slots;
  size_t nslots, used; /* nslots: a power of two */
  atomic_int full; /* no room for more pending markers: misses are no longer noted */
  rlk_tune_entry *all;
  atomic_uint_fast64_t hits, misses; /* lookups made, for tests and diagnostics */
};

/* ---- creation ----------------------------------------------------------------------- */

static rlk_tune_mode mode_from_env(void) {
  static atomic_int warned;
  const char *v = rlk_env("RLK_TUNE");
  if (!v || !strcmp(v, "use")) return RLK_TUNE_MODE_USE;
  if (!strcmp(v, "off")) return RLK_TUNE_MODE_OFF;
  if (!strcmp(v, "tune")) return RLK_TUNE_MODE_TUNE;
  if (!atomic_exchange(&warned, 1)) rlk_warn("RLK_TUNE='%s' is not off, use or tune: using 'use'", v);
  return RLK_TUNE_MODE_USE;
}

rlk_status rlk_tune_table_create(const rlk_device_info *info, rlk_tune_table **out) {
  *out = NULL;
  rlk_tune_table *t = calloc(1, sizeof *t);
  if (!t) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "tuning database: out of memory");
  pthread_mutex_init(&t->lock, NULL);
  t->mode = mode_from_env();
  if (t->mode != RLK_TUNE_MODE_OFF) {
    if (rlk_tune_db_path(t->path, sizeof t->path) != RLK_OK) {
      rlk_debug("tuning database: no path (%s); not consulted", rlk_last_error());
      rlk_error_clear();
      t->mode = RLK_TUNE_MODE_OFF;
    } else if (rlk_tune_record_set_env(&t->env, info) != RLK_OK) {
      rlk_error_clear();
      t->mode = RLK_TUNE_MODE_OFF;
    }
  }
  *out = t;
  return RLK_OK;
}

void rlk_tune_table_destroy(rlk_tune_table *t) {
  if (!t) return;
  for (rlk_tune_entry *e = t->all, *next; e; e = next) {
    next = e->next_all;
    free(e->op);
    free(e->shape);
    free(e->settings);
    free(e);
  }
  free((void *)t->slots);
  pthread_mutex_destroy(&t->lock);
  free(t);
}

/* ---- the table ---------------------------------------------------------------------- */

/* FNV-1a over op, shape and tokens. */
static uint64_t key_hash(const char *op, const char *shape, int64_t tokens) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = op; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  h = (h ^ 0xffu) * 1099511628211ull;
  for (const char *p = shape; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  uint64_t n = (uint64_t)tokens;
  for (int i = 0; i < 8; i++) h = (h ^ ((n >> (8 * i)) & 0xffu)) * 1099511628211ull;
  return h ^ (h >> 31);
}

static const rlk_tune_entry *probe(const rlk_tune_table *t, uint64_t h, const char *op, const char *shape,
                                   int64_t tokens) {
  const size_t mask = t->nslots - 1;
  for (size_t i = 0; i < t->nslots; i++) {
    const rlk_tune_entry *e = atomic_load_explicit(&t->slots[(h + i) & mask], memory_order_acquire);
    if (!e) return NULL;
    if (e->hash == h && e->tokens == tokens && !strcmp(e->shape, shape) && !strcmp(e->op, op)) return e;
  }
  return NULL;
}

/* Publishes a new entry. Called with the lock held; NULL when out of memory or room. */
static rlk_tune_entry *insert(rlk_tune_table *t, uint64_t h, const char *op, const char *shape, int64_t tokens,
                              const char *settings) {
  if (2 * (t->used + 1) > t->nslots) return NULL; /* keep probes short */
  rlk_tune_entry *e = calloc(1, sizeof *e);
  if (!e) return NULL;
  e->hash = h;
  e->tokens = tokens;
  e->op = rlk_strdup(op);
  e->shape = rlk_strdup(shape);
  e->settings = settings ? rlk_strdup(settings) : NULL;
  if (!e->op || !e->shape || (settings && !e->settings)) {
    free(e->op);
    free(e->shape);
    free(e->settings);
    free(e);
    return NULL;
  }
  e->next_all = t->all;
  t->all = e;
  const size_t mask = t->nslots - 1;
  size_t i = h & mask;
  while (atomic_load_explicit(&t->slots[i], memory_order_relaxed)) i = (i + 1) & mask;
  atomic_store_explicit(&t->slots[i], e, memory_order_release);
  t->used++;
  return e;
}

static int same_env(const rlk_tune_record *r, const rlk_tune_record *env) {
  return r->multiprocessors == env->multiprocessors && !strcmp(r->target, env->target) &&
         !strcmp(r->device, env->device) && !strcmp(r->runtime, env->runtime) &&
         !strcmp(r->compiler, env->compiler);
}

/* Reads the database into the table. Called once, with the lock held. A damaged file warns once
 * per process (other contexts of the process see the same file). */
static void load(rlk_tune_table *t) {
  static atomic_int warned;
  rlk_tune_list all = {0};
  int exists = 0, damaged = 0;
  size_t bad = 0;
  char why[256];
  if (rlk_tune_file_read(t->path, RLK_TUNE_FILE_DB, &all, &exists, &bad, &damaged, why, sizeof why) != RLK_OK) {
    if (!atomic_exchange(&warned, 1)) rlk_warn("%s; the tuning database is not used", rlk_last_error());
    rlk_error_clear();
  } else if (damaged) {
    if (!atomic_exchange(&warned, 1))
      rlk_warn("tuning database %s: %s%s", t->path, why, all.n ? "" : "; it is not used");
    else
      rlk_debug("tuning database %s: %s", t->path, why);
  }
  size_t want = TUNE_MIN_SLOTS;
  while (want < 4 * all.n) want *= 2;
  t->slots = calloc(want, sizeof *t->slots);
  t->nslots = t->slots ? want : 0;
  size_t foreign = 0;
  /* the last line of a key wins: walk backwards, keep the first seen */
  for (size_t i = all.n; t->slots && i-- > 0;) {
    const rlk_tune_record *r = &all.v[i];
    if (!same_env(r, &t->env)) {
      foreign++;
      continue;
    }
    uint64_t h = key_hash(r->op, r->shape, r->tokens);
    if (probe(t, h, r->op, r->shape, r->tokens)) continue;
    if (insert(t, h, r->op, r->shape, r->tokens, r->winner)) t->records++;
  }
  if (foreign)
    rlk_info("tuning database %s: %zu record%s of other environments ignored (this context: %s, %s, %d "
             "multiprocessors, rlk %s, %s)",
             t->path, foreign, foreign == 1 ? "" : "s", t->env.target, t->env.device, t->env.multiprocessors,
             t->env.runtime, t->env.compiler);
  rlk_debug("tuning database %s: %d record%s for this context", t->path, t->records, t->records == 1 ? "" : "s");
  rlk_tune_list_free(&all);
}

int rlk_tune_table_wanted(const rlk_tune_table *t) {
  if (!t || t->mode == RLK_TUNE_MODE_OFF) return 0;
  if (!atomic_load_explicit(&t->loaded, memory_order_acquire)) return 1;
  return t->records > 0 || t->mode == RLK_TUNE_MODE_TUNE;
}

/* Notes a miss for the pending list, once per configuration. */
static void note_miss(rlk_tune_table *t, uint64_t h, const char *op, const char *shape, int64_t tokens) {
  if (atomic_load_explicit(&t->full, memory_order_relaxed)) return; /* keep misses lock-free then */
  pthread_mutex_lock(&t->lock);
  int first = !probe(t, h, op, shape, tokens) && insert(t, h, op, shape, tokens, NULL);
  if (!first && !probe(t, h, op, shape, tokens) && !atomic_exchange(&t->full, 1))
    rlk_debug("tuning database: too many configurations missing to remember; later ones are not added "
              "to the pending list");
  pthread_mutex_unlock(&t->lock);
  if (!first) return;
  /* The file access happens outside the table's lock, once: later lookups find the marker. */
  rlk_tune_record key = t->env;
  rlk_format(key.op, sizeof key.op, "%s", op);
  rlk_format(key.shape, sizeof key.shape, "%s", shape);
  key.tokens = tokens;
  if (rlk_tune_pending_add(t->path, &key, TUNE_PENDING_LOCK_WAIT_S) == RLK_OK)
    rlk_info("tuning database: no record for %s %s tokens=%lld; added to %s%s", op, shape, (long long)tokens,
             t->path, RLK_TUNE_PENDING_SUFFIX);
  else
    rlk_debug("tuning database: could not add %s %s tokens=%lld to the pending list: %s", op, shape,
              (long long)tokens, rlk_last_error());
  rlk_error_clear();
}

const rlk_tune_entry *rlk_tune_table_find(rlk_tune_table *t, const char *op, const char *shape,
                                          int64_t tokens) {
  if (!t || t->mode == RLK_TUNE_MODE_OFF) return NULL;
  if (!atomic_load_explicit(&t->loaded, memory_order_acquire)) {
    pthread_mutex_lock(&t->lock);
    if (!atomic_load_explicit(&t->loaded, memory_order_relaxed)) {
      load(t);
      atomic_store_explicit(&t->loaded, 1, memory_order_release);
    }
    pthread_mutex_unlock(&t->lock);
  }
  const uint64_t h = key_hash(op, shape, tokens);
  const rlk_tune_entry *e = t->nslots ? probe(t, h, op, shape, tokens) : NULL;
  if (e && e->settings) {
    atomic_fetch_add_explicit(&t->hits, 1, memory_order_relaxed);
    return e;
  }
  atomic_fetch_add_explicit(&t->misses, 1, memory_order_relaxed);
  if (!e && t->nslots && t->mode == RLK_TUNE_MODE_TUNE) note_miss(t, h, op, shape, tokens);
  return NULL;
}

void rlk_tune_table_counts(const rlk_tune_table *t, uint64_t *hits, uint64_t *misses) {
  rlk_tune_table *m = (rlk_tune_table *)t;
  *hits = t ? atomic_load(&m->hits) : 0;
  *misses = t ? atomic_load(&m->misses) : 0;
}

const char *rlk_tune_entry_settings(const rlk_tune_entry *e) { return e && e->settings ? e->settings : ""; }

int rlk_tune_entry_values(rlk_tune_table *t, const rlk_tune_entry *e, rlk_tune_parse_fn parse,
                          int64_t values[RLK_TUNE_VALUES]) {
  rlk_tune_entry *m = (rlk_tune_entry *)e; /* the parse is a cache the table owns */
  int state = atomic_load_explicit(&m->parsed, memory_order_acquire);
  if (state == 0) {
    pthread_mutex_lock(&t->lock);
    state = atomic_load_explicit(&m->parsed, memory_order_relaxed);
    if (state == 0) {
      state = parse(m->settings ? m->settings : "", m->values) == 0 ? 1 : -1;
      atomic_store_explicit(&m->parsed, state, memory_order_release);
    }
    pthread_mutex_unlock(&t->lock);
  }
  if (state < 0) return -1;
  memcpy(values, m->values, sizeof m->values);
  return 0;
}

int rlk_tune_entry_first_warning(const rlk_tune_entry *e) {
  return !atomic_exchange(&((rlk_tune_entry *)e)->warned, 1);
}

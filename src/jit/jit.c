/* jit.c - the way from a kernel spec to a launchable function.
 *
 *   1. in-process table: a fixed array of atomic entry pointers probed without a lock; the
 *      probe hashes the template pointer and the parameter values (the source digest, target
 *      and compiler are fixed per JIT, so they need not be hashed per call);
 *   2. on a miss, under the JIT's mutex: the full SHA-256 key, the read-only trees and the
 *      writable tree;
 *   3. on a cache miss: the per-key node-local lock, a second look, compile, publish, load.
 * Entries are immutable once published in the table and live until the JIT is destroyed. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "jit/jit.h"

#define JIT_SLOTS 1024 /* power of two; beyond it entries go to an overflow list */

typedef struct jit_entry {
  uint64_t hash;
  const rlk_template *tmpl;
  int64_t values[RLK_MAX_PARAMS];
  void *module;
  void *fn;
  int unpublished; /* compiled here, its publish failed: not in the cache */
  struct jit_entry *next_all;
} jit_entry;

struct rlk_jit {
  rlk_backend_impl *backend;
  rlk_compiler *compiler;
  rlk_cache *cache;
  rlk_target target;
  const char *source_dir;
  int jit_disabled;

  _Atomic(jit_entry *) slots[JIT_SLOTS];
  _Atomic(jit_entry *) overflow; /* entries that found no free slot, linked by next_all */
  pthread_mutex_t lock;
  jit_entry *all; /* every entry in a slot, for destroy */

  atomic_uint_fast64_t calls, memory_hits, disk_hits, misses, compiles, rebuilt;
  atomic_uint_fast64_t compile_ns, load_ns;
};

rlk_status rlk_jit_create(rlk_backend_impl *backend, rlk_compiler *compiler, rlk_cache *cache,
                          const rlk_target *target, const char *templates, rlk_jit **out) {
  *out = NULL;
  if (!compiler || !cache || !target || !templates)
    return rlk_error(RLK_ERR_INTERNAL, "jit: missing compiler, cache, target or template folder");
  rlk_jit *jit = calloc(1, sizeof *jit);
  if (!jit) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "jit: out of memory");
  jit->backend = backend;
  jit->compiler = compiler;
  jit->cache = cache;
  jit->target = *target;
  jit->source_dir = templates;
  /* RLK_JIT: 0, off, false or no turns compiling off; 1, on, true or yes (or unset) leaves it on;
   * anything else is said and leaves it on */
  const char *j = rlk_env("RLK_JIT");
  if (j) {
    static const char *const off[] = {"0", "off", "false", "no", NULL}, *const on[] = {"1", "on", "true", "yes", NULL};
    int known = 0;
    for (int i = 0; off[i]; i++) {
      if (!strcmp(j, off[i])) jit->jit_disabled = known = 1;
      if (!strcmp(j, on[i])) known = 1;
    }
    if (!known) rlk_warn("RLK_JIT='%.40s' is not 0/off/false/no or 1/on/true/yes: ignored (compiling stays on)", j);
  }
  pthread_mutex_init(&jit->lock, NULL);
  *out = jit;
  return RLK_OK;
}

void rlk_jit_destroy(rlk_jit *jit) {
  if (!jit) return;
  jit_entry *lists[2] = {jit->all, atomic_load(&jit->overflow)};
  for (int l = 0; l < 2; l++) {
    jit_entry *e = lists[l];
    while (e) {
      jit_entry *next = e->next_all;
      if (e->module && jit->backend) jit->backend->module_unload(jit->backend, e->module);
      free(e);
      e = next;
    }
  }
  pthread_mutex_destroy(&jit->lock);
  free(jit);
}

/* FNV-1a over the template pointer and the values: cheap and good enough to spread probes. */
static uint64_t spec_hash(const rlk_kernel_spec *spec) {
  uint64_t h = 1469598103934665603ull;
  uintptr_t p = (uintptr_t)spec->tmpl;
  for (size_t i = 0; i < sizeof p; i++) h = (h ^ ((p >> (8 * i)) & 0xff)) * 1099511628211ull;
  for (size_t i = 0; i < spec->tmpl->nparams; i++) {
    uint64_t v = (uint64_t)spec->values[i];
    h = (h ^ v) * 1099511628211ull;
    h ^= h >> 29;
  }
  return h;
}

static int entry_matches(const jit_entry *e, const rlk_kernel_spec *spec, uint64_t h) {
  return e->hash == h && e->tmpl == spec->tmpl &&
         memcmp(e->values, spec->values, spec->tmpl->nparams * sizeof(int64_t)) == 0;
}

static jit_entry *table_find(rlk_jit *jit, const rlk_kernel_spec *spec, uint64_t h) {
  for (size_t i = 0; i < JIT_SLOTS; i++) {
    jit_entry *e = atomic_load_explicit(&jit->slots[(h + i) & (JIT_SLOTS - 1)], memory_order_acquire);
    if (!e) break;
    if (entry_matches(e, spec, h)) return e;
  }
  for (jit_entry *e = atomic_load_explicit(&jit->overflow, memory_order_acquire); e; e = e->next_all)
    if (entry_matches(e, spec, h)) return e;
  return NULL;
}

/* Called with the lock held. */
static void table_insert(rlk_jit *jit, jit_entry *e) {
  for (size_t i = 0; i < JIT_SLOTS; i++) {
    _Atomic(jit_entry *) *slot = &jit->slots[(e->hash + i) & (JIT_SLOTS - 1)];
    if (!atomic_load_explicit(slot, memory_order_relaxed)) {
      e->next_all = jit->all;
      jit->all = e;
      atomic_store_explicit(slot, e, memory_order_release);
      return;
    }
  }
  e->next_all = atomic_load_explicit(&jit->overflow, memory_order_relaxed);
  atomic_store_explicit(&jit->overflow, e, memory_order_release);
}

static void join(char *buf, size_t size, size_t n, const char *const *items, const char *sep) {
  size_t len = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    int w = rlk_format(buf + len, size - len, "%s%s", i ? sep : "", items[i]);
    if (w < 0) return;
    len += (size_t)w;
  }
}

/* Everything a compile needs, derived from a spec; the key is computed from the same fields. */
typedef struct build_plan {
  rlk_kernel_key key;
  const rlk_source_set *sources;
  const char *source_file;
  char tu[256];
  char name[512];
  const char *names[1];
  char defines[RLK_MAX_PARAMS][96];
  const char *options[RLK_MAX_PARAMS];
  size_t noptions;
} build_plan;

static rlk_status make_plan(rlk_jit *jit, const rlk_kernel_spec *spec, build_plan *p) {
  memset(p, 0, sizeof *p);
  const rlk_template *t = spec->tmpl;
  rlk_status st = rlk_spec_validate(spec);
  if (st) return st;
  const unsigned missing = t->requires & ~jit->target.features;
  if (missing) {
    char need[64], has[64];
    rlk_target_features_text(missing, need, sizeof need);
    rlk_target_features_text(jit->target.features, has, sizeof has);
    return rlk_error(RLK_ERR_UNSUPPORTED, "%s: the kernel needs %s, which target %s does not have (it has: %s)",
                     t->entry, need, jit->target.name, has[0] ? has : "none of the optional features");
  }
  int host = strcmp(jit->source_dir, "host") == 0;
  p->source_file = host ? t->host_source : t->cuda_source;
  if (!p->source_file)
    return rlk_error(RLK_ERR_UNSUPPORTED, "%s: no %s template for target %s", t->entry, jit->source_dir,
                     jit->target.name);
  st = rlk_sources_get(jit->source_dir, &p->sources);
  if (st) return st;
  if (!rlk_sources_find(p->sources, p->source_file))
    return rlk_error(RLK_ERR_INTERNAL, "%s: template source %s is missing", t->entry, p->source_file);
  rlk_format(p->tu, sizeof p->tu, "#include \"%s\"\n", rlk_sources_basename(p->source_file));
  if (host) {
    rlk_format(p->name, sizeof p->name, "rlk_%s", t->entry);
    st = rlk_spec_host_defines(spec, p->defines, &p->noptions);
    if (st) return st;
    for (size_t i = 0; i < p->noptions; i++) p->options[i] = p->defines[i];
  } else {
    st = rlk_spec_name_expression(spec, p->name, sizeof p->name);
    if (st) return st;
  }
  p->names[0] = p->name;

  rlk_kernel_key *k = &p->key;
  k->schema = RLK_CACHE_SCHEMA;
  k->codegen = RLK_CODEGEN_VERSION;
  if (rlk_format(k->family, sizeof k->family, "%s", t->family) < 0 ||
      rlk_format(k->entry, sizeof k->entry, "%s", t->entry) < 0)
    return rlk_error(RLK_ERR_INTERNAL, "%s: family or entry name too long", t->entry);
  memcpy(k->template_digest, p->sources->digest, sizeof k->template_digest);
  st = rlk_spec_params_text(spec, k->params, sizeof k->params);
  if (st) return st;
  rlk_format(k->names, sizeof k->names, "%s", p->name);
  if (rlk_target_name(&jit->target, k->target, sizeof k->target) < 0)
    return rlk_error(RLK_ERR_INTERNAL, "%s: the target's name does not fit a key", t->entry);
  rlk_format(k->compiler, sizeof k->compiler, "%s", jit->compiler->id);
  char base[512], extra[1024];
  join(base, sizeof base, jit->compiler->nbase_options, jit->compiler->base_options, " ");
  join(extra, sizeof extra, p->noptions, p->options, " ");
  rlk_format(k->options, sizeof k->options, "%s%s%s", base, (base[0] && extra[0]) ? " " : "", extra);
  rlk_key_env(k->env, sizeof k->env);
  rlk_key_finish(k);
  return RLK_OK;
}

rlk_status rlk_jit_key(rlk_jit *jit, const rlk_kernel_spec *spec, rlk_kernel_key *key) {
  build_plan *p = malloc(sizeof *p);
  if (!p) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "jit: out of memory");
  rlk_status st = make_plan(jit, spec, p);
  if (!st) *key = p->key;
  free(p);
  return st;
}

static void add_seconds(atomic_uint_fast64_t *acc, double seconds) {
  atomic_fetch_add_explicit(acc, (uint_fast64_t)(seconds * 1e9), memory_order_relaxed);
}

/* Compiles the plan's kernel; on success the result owns binary and lowered names. */
static rlk_status compile_plan(rlk_jit *jit, build_plan *p, rlk_compile_result *res) {
  size_t nh = p->sources->count;
  const char **header_names = calloc(nh ? nh : 1, sizeof *header_names);
  const char **header_sources = calloc(nh ? nh : 1, sizeof *header_sources);
  if (!header_names || !header_sources) {
    free(header_names);
    free(header_sources);
    return rlk_error(RLK_ERR_OUT_OF_MEMORY, "jit: out of memory");
  }
  for (size_t i = 0; i < nh; i++) {
    header_names[i] = rlk_sources_basename(p->sources->files[i].name);
    header_sources[i] = p->sources->files[i].text;
  }
  char source_name[128];
  rlk_format(source_name, sizeof source_name, "%s_%.12s", p->key.entry, p->key.hex);
  rlk_compile_request req = {
      .source = p->tu,
      .source_name = source_name,
      .nheaders = nh,
      .header_names = header_names,
      .header_sources = header_sources,
      .target = &jit->target,
      .noptions = p->noptions,
      .options = p->options,
      .nnames = 1,
      .names = p->names,
  };
  memset(res, 0, sizeof *res);
  rlk_info("compiling %s %s for %s (%s)", p->key.entry, p->key.params, jit->target.name, jit->compiler->id);
  rlk_status st = jit->compiler->compile(jit->compiler, &req, res);
  free(header_names);
  free(header_sources);
  atomic_fetch_add_explicit(&jit->compiles, 1, memory_order_relaxed);
  add_seconds(&jit->compile_ns, res->seconds);
  if (st) return rlk_error_wrap(st, "compiling %s [%s] for %s", p->key.entry, p->key.params, jit->target.name);
  if (!res->binary || res->size == 0 || !res->binary_name || res->nnames != 1 || !res->lowered_names ||
      !res->lowered_names[0]) {
    rlk_compile_result_free(res);
    return rlk_error(RLK_ERR_COMPILE, "compiling %s for %s produced no binary", p->key.entry, jit->target.name);
  }
  return RLK_OK;
}

static rlk_status jit_disabled_error(rlk_jit *jit, const build_plan *p) {
  return rlk_error(RLK_ERR_JIT_DISABLED,
                   "RLK_JIT=0 and no cache holds the kernel: family=%s entry=%s params=[%s] target=%s "
                   "compiler=%s key=%s (precompile this configuration, or add its tree to RLK_CACHE_RO_DIRS)",
                   p->key.family, p->key.entry, p->key.params, jit->target.name, jit->compiler->id, p->key.hex);
}

/* Loads binary into the backend (when there is one) and finds the kernel. */
static rlk_status load_binary(rlk_jit *jit, const void *binary, size_t size, const char *lowered,
                              void **module, void **fn) {
  *module = NULL;
  *fn = NULL;
  if (!jit->backend) return RLK_OK;
  double t0 = rlk_now();
  rlk_status st = jit->backend->module_load(jit->backend, binary, size, module);
  if (st) return st;
  st = jit->backend->get_function(jit->backend, *module, lowered, fn);
  if (st) {
    jit->backend->module_unload(jit->backend, *module);
    *module = NULL;
    return st;
  }
  add_seconds(&jit->load_ns, rlk_now() - t0);
  return RLK_OK;
}

/* Tries the cache trees. Sets *found when the entry was found and, with `load`, loaded. A
 * binary the backend refuses is put out of the way (quarantined, or passed over in a read-only
 * tree) and the lookup goes on to the next tree, so a copy rebuilt into the writable tree is
 * found behind a refused read-only one; with none, the caller rebuilds it. */
static rlk_status lookup_and_load(rlk_jit *jit, const build_plan *p, int load, int *found, void **module,
                                  void **fn) {
  *found = 0;
  /* Each refusal removes one entry from view, and a key has one entry per tree. */
  for (int tries = 0; tries < 64; tries++) {
    rlk_cache_blob blob;
    memset(&blob, 0, sizeof blob);
    int hit = 0, rebuilt = 0;
    double t0 = rlk_now();
    rlk_status st = rlk_cache_lookup(jit->cache, &p->key, &blob, &hit, &rebuilt);
    if (rebuilt) atomic_fetch_add_explicit(&jit->rebuilt, (uint_fast64_t)rebuilt, memory_order_relaxed);
    if (st || !hit) return st;
    add_seconds(&jit->load_ns, rlk_now() - t0);
    if (blob.nnames < 1) {
      rlk_cache_blob_free(&blob);
      return RLK_OK;
    }
    if (load) {
      st = load_binary(jit, blob.binary, blob.size, blob.lowered_names[0], module, fn);
      if (st) {
        rlk_warn("cached kernel %s at %s was refused (%s); looking further, else rebuilding it",
                 p->key.entry, blob.path, rlk_last_error());
        rlk_status qs = rlk_cache_quarantine(jit->cache, blob.path);
        atomic_fetch_add_explicit(&jit->rebuilt, 1, memory_order_relaxed);
        rlk_cache_blob_free(&blob);
        if (qs) return RLK_OK; /* still in the way: rebuild without looking again */
        continue;
      }
    }
    rlk_cache_blob_free(&blob);
    *found = 1;
    atomic_fetch_add_explicit(&jit->disk_hits, 1, memory_order_relaxed);
    return RLK_OK;
  }
  return RLK_OK;
}

/* The miss path shared by get (load = 1) and prepare (load = 0). Called with the JIT's lock held.
 * A compiled binary that could not be published sets *unpublished and is used from memory, with
 * a warning, unless strict: then the error is the last one, for precompile to return. */
static rlk_status resolve(rlk_jit *jit, const rlk_kernel_spec *spec, int load, int strict, void **module,
                          void **fn, int *unpublished) {
  build_plan *p = malloc(sizeof *p);
  if (!p) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "jit: out of memory");
  rlk_cache_lock *lock = NULL;
  int found = 0;
  rlk_status st = make_plan(jit, spec, p);
  if (!st) st = lookup_and_load(jit, p, load, &found, module, fn);
  if (st || found) goto done;
  atomic_fetch_add_explicit(&jit->misses, 1, memory_order_relaxed);
  if (jit->jit_disabled) {
    st = jit_disabled_error(jit, p);
    goto done;
  }
  /* One compile per node per key: whoever holds the lock compiles, the others find its entry. */
  st = rlk_cache_lock_acquire(jit->cache, &p->key, &lock);
  if (!st) st = lookup_and_load(jit, p, load, &found, module, fn);
  if (st || found) goto done;
  rlk_compile_result res;
  st = compile_plan(jit, p, &res);
  if (st) goto done;
  /* Load before publishing: a binary the driver refuses is never committed to the cache. */
  if (load) {
    st = load_binary(jit, res.binary, res.size, res.lowered_names[0], module, fn);
    if (st) rlk_error_wrap(st, "loading freshly compiled %s for %s", p->key.entry, jit->target.name);
  }
  if (!st) {
    rlk_cache_publish_info info = {.binary_name = res.binary_name, .compile_seconds = res.seconds,
                                   .log = res.log};
    if (rlk_cache_publish(jit->cache, &p->key, res.binary, res.size, res.lowered_names, res.nnames, &info)) {
      *unpublished = 1;
      if (strict) {
        rlk_error_wrap(RLK_ERR_CACHE, "could not publish %s to the cache", p->key.entry);
      } else {
        rlk_warn("could not publish %s to the cache (%s); using it from memory", p->key.entry, rlk_last_error());
      }
    }
  }
  rlk_compile_result_free(&res);
done:
  if (lock) rlk_cache_lock_release(lock);
  free(p);
  return st;
}

/* The table's kernel, and with strict an error where it is one this process compiled and could
 * not publish. */
static rlk_status table_hit(const jit_entry *e, int strict, void **fn) {
  *fn = e->fn;
  if (strict && e->unpublished)
    return rlk_error(RLK_ERR_CACHE, "could not publish %s to the cache when this process compiled it",
                     e->tmpl->entry);
  return RLK_OK;
}

/* get, and with strict an error (the kernel still loaded) where it could not be published. */
static rlk_status get(rlk_jit *jit, const rlk_kernel_spec *spec, int strict, void **fn) {
  uint64_t h = spec_hash(spec);
  atomic_fetch_add_explicit(&jit->calls, 1, memory_order_relaxed);
  jit_entry *e = table_find(jit, spec, h);
  if (e) {
    atomic_fetch_add_explicit(&jit->memory_hits, 1, memory_order_relaxed);
    return table_hit(e, strict, fn);
  }
  if (!jit->backend) return rlk_error(RLK_ERR_UNSUPPORTED, "this context is compile-only: kernels cannot be launched");
  pthread_mutex_lock(&jit->lock);
  e = table_find(jit, spec, h);
  if (e) {
    pthread_mutex_unlock(&jit->lock);
    atomic_fetch_add_explicit(&jit->memory_hits, 1, memory_order_relaxed);
    return table_hit(e, strict, fn);
  }
  void *module = NULL, *f = NULL;
  int unpublished = 0;
  rlk_status st = resolve(jit, spec, 1, strict, &module, &f, &unpublished);
  if (!st) {
    e = calloc(1, sizeof *e);
    if (!e) {
      jit->backend->module_unload(jit->backend, module);
      st = rlk_error(RLK_ERR_OUT_OF_MEMORY, "jit: out of memory");
    } else {
      e->hash = h;
      e->tmpl = spec->tmpl;
      memcpy(e->values, spec->values, sizeof e->values);
      e->module = module;
      e->fn = f;
      e->unpublished = unpublished;
      table_insert(jit, e);
      *fn = f;
      if (unpublished && strict) st = RLK_ERR_CACHE; /* resolve's message */
    }
  }
  pthread_mutex_unlock(&jit->lock);
  return st;
}

rlk_status rlk_jit_get(rlk_jit *jit, const rlk_kernel_spec *spec, void **fn) { return get(jit, spec, 0, fn); }

rlk_status rlk_jit_get_published(rlk_jit *jit, const rlk_kernel_spec *spec, void **fn) {
  return get(jit, spec, 1, fn);
}

rlk_status rlk_jit_prepare(rlk_jit *jit, const rlk_kernel_spec *spec) {
  uint64_t h = spec_hash(spec);
  void *module = NULL, *fn = NULL;
  const jit_entry *e = table_find(jit, spec, h);
  if (e) return table_hit(e, 1, &fn);
  pthread_mutex_lock(&jit->lock);
  int unpublished = 0;
  rlk_status st = resolve(jit, spec, 0, 1, &module, &fn, &unpublished);
  pthread_mutex_unlock(&jit->lock);
  return st ? st : unpublished ? RLK_ERR_CACHE : RLK_OK;
}

void rlk_jit_counters(const rlk_jit *jit, rlk_counters *out) {
  rlk_jit *j = (rlk_jit *)jit;
  out->calls = atomic_load(&j->calls);
  out->memory_hits = atomic_load(&j->memory_hits);
  out->disk_hits = atomic_load(&j->disk_hits);
  out->misses = atomic_load(&j->misses);
  out->compiles = atomic_load(&j->compiles);
  out->rebuilt = atomic_load(&j->rebuilt);
  out->compile_seconds = (double)atomic_load(&j->compile_ns) * 1e-9;
  out->load_seconds = (double)atomic_load(&j->load_ns) * 1e-9;
}

void rlk_jit_reset_counters(rlk_jit *jit) {
  atomic_store(&jit->calls, 0);
  atomic_store(&jit->memory_hits, 0);
  atomic_store(&jit->disk_hits, 0);
  atomic_store(&jit->misses, 0);
  atomic_store(&jit->compiles, 0);
  atomic_store(&jit->rebuilt, 0);
  atomic_store(&jit->compile_ns, 0);
  atomic_store(&jit->load_ns, 0);
}

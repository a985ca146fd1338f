/* cache_admin.c - operating on a whole cache tree: walking, verifying, pruning, clearing and
 * creating a root (the public rlk_cache_* management calls). An administration layer over the
 * cache's store (src/jit/cache*.c), which it reaches through the store's tree operations and never
 * the other way round.
 *
 * These work on a root path, not an open cache, so tools can point them at any tree. They
 * only ever remove what has the cache's layout (v<n>/.../<hh>/<64 hex digits>, staging and
 * quarantine names), so a mistaken root loses no unrelated files. Entries leave the tree by
 * rename() before they are deleted, so concurrent readers see whole entries or none. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "jit/cache.h"
#include "jit/cache_internal.h"

static rlk_status resolve_root(const char *root, char *buf, size_t size) {
  if (root && root[0]) {
    if (rlk_format(buf, size, "%s", root) < 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache: root path too long");
    return RLK_OK;
  }
  return rlk_cache_default_root(buf, size);
}

/* Opens a root that something will be deleted from (`root`, resolved into dir[RLK_CACHE_PATH_MAX]):
 * it must be the cache's own (rlk_cache_root_is_own), so a mistaken path loses nothing. *rootfd
 * is -1 with RLK_OK when the root does not exist (nothing to do). */
static rlk_status open_own_root(const char *root, const char *who, char *dir, int *rootfd) {
  *rootfd = -1;
  rlk_status st = resolve_root(root, dir, RLK_CACHE_PATH_MAX);
  if (st != RLK_OK) return st;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return RLK_OK;
    return rlk_error(RLK_ERR_IO, "%s: %s: %s", who, dir, strerror(errno));
  }
  char why[512];
  if (!rlk_cache_root_is_own(fd, 0, why, sizeof why)) {
    close(fd);
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %s: %s", who, dir, why);
  }
  *rootfd = fd;
  return RLK_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Walking                                                                                  */
/* ---------------------------------------------------------------------------------------- */

typedef struct walk_state {
  rlk_cache_visit_fn visit;
  void *user;
  uint64_t unreadable; /* entries that could not be read: not visited */
  int err;             /* the first one's error ... */
  char path[RLK_CACHE_PATH_MAX]; /* ... and path */
} walk_state;

/* An entry directory that could not be read (not one removed meanwhile) goes to *n, the first
 * one's error and path to err and path. */
static void note_unreadable(const char *entry, uint64_t *n, int *err, char *path, size_t size) {
  if (errno == ENOENT || (*n)++) return;
  *err = errno;
  rlk_format(path, size, "%s", entry);
}

static int walk_one(const rlk_cache_scan_pos *pos, void *user) {
  walk_state *w = user;
  rlk_cache_entry e;
  uint64_t bytes = 0;
  int64_t last_used = 0;
  int committed = 0;
  if (rlk_cache_entry_stats(pos->path, &bytes, &last_used, &committed) != 0) {
    note_unreadable(pos->path, &w->unreadable, &w->err, w->path, sizeof w->path);
    return 0;
  }
  if (!committed) return 0;
  memset(&e, 0, sizeof e);
  e.path = pos->path;
  e.key = pos->part[5];
  e.bytes = bytes;
  e.last_used = last_used;
  /* Fields from the metadata; an unreadable one still lists (from its path) so that tools
   * can show and remove it. */
  rlk_cache_meta meta;
  char why[256];
  int fd = open(pos->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int ok = fd >= 0 && rlk_cache_read_meta(fd, &meta, why, sizeof why) == 0;
  char compiler[65], target[33], family[65];
  if (ok) {
    e.family = meta.key.family;
    e.target = meta.key.target;
    e.compiler = meta.key.compiler;
    e.params = meta.key.params;
    e.created = meta.created;
  } else {
    rlk_format(compiler, sizeof compiler, "%.*s", (int)(pos->part[2] - pos->part[1] - 1),
               pos->part[1]);
    rlk_format(target, sizeof target, "%.*s", (int)(pos->part[3] - pos->part[2] - 1),
               pos->part[2]);
    rlk_format(family, sizeof family, "%.*s", (int)(pos->part[4] - pos->part[3] - 1),
               pos->part[3]);
    e.family = family;
    e.target = target;
    e.compiler = compiler;
    e.params = "";
  }
  if (e.created == 0 && fd >= 0) {
    struct stat st;
    if (fstatat(fd, RLK_CACHE_META_NAME, &st, 0) == 0) e.created = (int64_t)st.st_mtime;
  }
  if (fd >= 0) close(fd);
  int stop = w->visit(&e, w->user);
  if (ok) rlk_cache_meta_free(&meta);
  return stop;
}

rlk_status rlk_cache_walk(const char *root, rlk_cache_visit_fn visit, void *user) {
  if (!visit) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_cache_walk: visit is NULL");
  char dir[RLK_CACHE_PATH_MAX];
  rlk_status st = resolve_root(root, dir, sizeof dir);
  if (st != RLK_OK) return st;
  walk_state *w = calloc(1, sizeof *w);
  if (!w) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "rlk_cache_walk: out of memory");
  w->visit = visit, w->user = user;
  st = rlk_cache_scan(dir, -1, walk_one, w);
  if (!st && w->unreadable)
    st = rlk_error(RLK_ERR_IO, "kernel cache: entry %s could not be read (%s)%s", w->path, strerror(w->err),
                   w->unreadable > 1 ? ", nor could other entries" : "");
  free(w);
  return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Verifying                                                                                */
/* ---------------------------------------------------------------------------------------- */

typedef struct verify_state {
  const char *root;
  int repair;
  uint64_t entries, bad;
} verify_state;

static int verify_one(const rlk_cache_scan_pos *pos, void *user) {
  verify_state *v = user;
  char why[512];
  v->entries++;
  int fd = open(pos->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return 0; /* removed meanwhile */
    v->bad++;
    rlk_warn("kernel cache: %s cannot be read (%s)", pos->path, strerror(errno));
    return 0;
  }
  rlk_cache_meta meta;
  int rc = rlk_cache_entry_check(fd, pos->part[5], NULL, 0, &meta, NULL, why, sizeof why);
  close(fd);
  if (rc == 0) {
    rlk_cache_meta_free(&meta);
    return 0;
  }
  v->bad++;
  if (v->repair) {
    int gone = rlk_cache_quarantine_path(v->root, pos->path) == 0;
    rlk_warn("kernel cache: %s: %s; %s", pos->path, why,
             gone ? "quarantined" : "could not move it out of the way");
  } else {
    rlk_warn("kernel cache: %s: %s", pos->path, why);
  }
  return 0;
}

rlk_status rlk_cache_verify(const char *root, int repair, uint64_t *entries, uint64_t *bad) {
  char dir[RLK_CACHE_PATH_MAX];
  rlk_status st;
  if (repair) {
    int rootfd;
    if ((st = open_own_root(root, "rlk_cache_verify", dir, &rootfd))) return st;
    if (rootfd >= 0) close(rootfd);
  } else if ((st = resolve_root(root, dir, sizeof dir))) {
    return st;
  }
  /* Only this schema's entries: older or newer layouts have their own meaning and are
   * orphaned (and eventually evicted) rather than judged by this reader. */
  verify_state v = {dir, repair, 0, 0};
  st = rlk_cache_scan(dir, RLK_CACHE_SCHEMA, verify_one, &v);
  if (entries) *entries = v.entries;
  if (bad) *bad = v.bad;
  return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Pruning                                                                                  */
/* ---------------------------------------------------------------------------------------- */

rlk_status rlk_cache_prune(const char *root, uint64_t max_bytes, int64_t max_age_seconds,
                           uint64_t *removed_entries, uint64_t *removed_bytes) {
  if (removed_entries) *removed_entries = 0;
  if (removed_bytes) *removed_bytes = 0;
  if (max_age_seconds < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_cache_prune: negative max_age_seconds");
  char dir[RLK_CACHE_PATH_MAX];
  int rootfd;
  rlk_status st = open_own_root(root, "rlk_cache_prune", dir, &rootfd);
  if (st != RLK_OK) return st;
  if (rootfd < 0) return RLK_OK;
  close(rootfd);
  rlk_cache_sweep(dir);
  /* An explicit prune is the operator's decision: no grace period. */
  uint64_t n = 0, b = 0, failed = 0;
  st = rlk_cache_evict_tree(dir, max_bytes, max_age_seconds, 0, NULL, &n, &b, &failed);
  if (removed_entries) *removed_entries = n; /* also when a folder could not be read (RLK_ERR_IO) */
  if (removed_bytes) *removed_bytes = b;
  if (st != RLK_OK) return st;
  if (failed)
    return rlk_error(RLK_ERR_IO,
                     "rlk_cache_prune: %llu entr%s under %s could not be removed (no permission to "
                     "delete there?); %llu removed",
                     (unsigned long long)failed, failed == 1 ? "y" : "ies", dir,
                     (unsigned long long)n);
  return RLK_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Clearing                                                                                 */
/* ---------------------------------------------------------------------------------------- */

typedef struct clear_state {
  const char *root;
  int failed;
} clear_state;

static int clear_one(const rlk_cache_scan_pos *pos, void *user) {
  clear_state *c = user;
  rlk_cache_retire(c->root, pos->path);
  struct stat st;
  if (lstat(pos->path, &st) == 0) c->failed = 1;
  return 0;
}

rlk_status rlk_cache_create_root(const char *root) {
  char dir[RLK_CACHE_PATH_MAX], why[512];
  rlk_status st = resolve_root(root, dir, sizeof dir);
  if (st != RLK_OK) return st;
  if (rlk_cache_prepare_root(dir, 1, why, sizeof why) != 0)
    return rlk_error(RLK_ERR_IO, "rlk_cache_create_root: %s: %s", dir, why);
  return RLK_OK;
}

rlk_status rlk_cache_clear(const char *root) {
  char dir[RLK_CACHE_PATH_MAX];
  int rootfd;
  rlk_status st = open_own_root(root, "rlk_cache_clear", dir, &rootfd);
  if (st != RLK_OK) return st;
  if (rootfd < 0) return RLK_OK;
  clear_state c = {dir, 0};
  st = rlk_cache_scan(dir, -1, clear_one, &c);
  if (st != RLK_OK) {
    close(rootfd);
    return st;
  }
  rlk_cache_remove_empty_layout(dir);
  rlk_cache_sweep_own(rootfd, dir, RLK_CACHE_QUARANTINE_DIR, -1, rlk_cache_is_quarantine_name);
  rlk_cache_sweep_own(rootfd, dir, RLK_CACHE_TMP_DIR, -1, rlk_cache_is_staging_name);
  close(rootfd);
  if (c.failed)
    return rlk_error(RLK_ERR_IO, "kernel cache: some entries under %s could not be removed",
                     dir);
  return RLK_OK;
}

/* cache_admin.c - operating on a whole cache tree: walking, verifying, evicting, pruning and
 * clearing (the public rlk_cache_* management API and the cap enforced after publishing).
 *
 * These work on a root path, not an open cache, so tools can point them at any tree. They
 * only ever remove what has the cache's layout (v<n>/.../<hh>/<64 hex digits>, staging and
 * quarantine names), so a mistaken root loses no unrelated files. Entries leave the tree by
 * rename() before they are deleted, so concurrent readers see whole entries or none. */
#include <dirent.h>
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

/* ---------------------------------------------------------------------------------------- */
/* Enumerating entries                                                                      */
/* ---------------------------------------------------------------------------------------- */

/* Where an entry directory was found: its path and the layout components leading to it. */
typedef struct scan_pos {
  char path[RLK_CACHE_PATH_MAX];
  const char *part[7]; /* v<n>, compiler, target, family, hh, hash (pointers into path) */
} scan_pos;

/* Return non-zero to stop the scan. */
typedef int (*scan_fn)(const scan_pos *pos, void *user);

static int is_dir_entry(DIR *d, const struct dirent *de) {
  if (de->d_type == DT_DIR) return 1;
  if (de->d_type != DT_UNKNOWN) return 0; /* links are never followed */
  struct stat st;
  return fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

static int is_schema_dir(const char *name, int only) {
  if (name[0] != 'v' || !name[1]) return 0;
  for (const char *p = name + 1; *p; p++)
    if (*p < '0' || *p > '9') return 0;
  return only < 0 || atoi(name + 1) == only;
}

static int is_hh(const char *name) {
  return strlen(name) == 2 && strspn(name, "0123456789abcdef") == 2;
}

/* Visits every <hash> directory of the layout, depth 0 being the root's children. */
static int scan_level(scan_pos *pos, size_t len, int depth, int schema, scan_fn fn, void *user) {
  DIR *d = opendir(pos->path);
  if (!d) return 0;
  int stop = 0;
  struct dirent *de;
  while (!stop && (de = readdir(d)) != NULL) {
    const char *name = de->d_name;
    if (name[0] == '.') continue;
    if (depth == 0 && !is_schema_dir(name, schema)) continue;
    if (depth == 4 && !is_hh(name)) continue;
    if (depth == 5 && (!rlk_cache_is_hash(name) || strncmp(name, pos->part[4], 2) != 0))
      continue;
    if (!is_dir_entry(d, de)) continue;
    size_t n = strlen(name);
    if (len + 1 + n + 1 > sizeof pos->path) continue;
    pos->path[len] = '/';
    memcpy(pos->path + len + 1, name, n + 1);
    pos->part[depth] = pos->path + len + 1;
    if (depth == 5)
      stop = fn(pos, user);
    else
      stop = scan_level(pos, len + 1 + n, depth + 1, schema, fn, user);
    pos->path[len] = '\0';
  }
  closedir(d);
  return stop;
}

/* schema < 0: every schema directory. RLK_OK also when the root does not exist. */
static rlk_status scan(const char *root, int schema, scan_fn fn, void *user) {
  scan_pos *pos = calloc(1, sizeof *pos);
  if (!pos) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "kernel cache: out of memory");
  if (rlk_format(pos->path, sizeof pos->path, "%s", root) < 0) {
    free(pos);
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache: root path too long");
  }
  struct stat st;
  if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) {
    int e = errno;
    free(pos);
    if (e == ENOENT) return RLK_OK;
    return rlk_error(RLK_ERR_IO, "kernel cache: %s is not a readable directory", root);
  }
  size_t len = strlen(pos->path);
  while (len > 1 && pos->path[len - 1] == '/') pos->path[--len] = '\0';
  scan_level(pos, len, 0, schema, fn, user);
  free(pos);
  return RLK_OK;
}

/* Size (regular files, apparent bytes), recency and commit state of an entry directory. */
static int entry_stats(const char *path, uint64_t *bytes, int64_t *last_used, int *committed) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -1;
  *last_used = rlk_cache_entry_last_used(fd);
  struct stat st;
  *committed = fstatat(fd, RLK_CACHE_META_NAME, &st, 0) == 0;
  *bytes = 0;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -1;
  }
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
      *bytes += (uint64_t)st.st_size;
  }
  closedir(d);
  return 0;
}

static rlk_status resolve_root(const char *root, char *buf, size_t size) {
  if (root && root[0]) {
    if (rlk_format(buf, size, "%s", root) < 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache: root path too long");
    return RLK_OK;
  }
  return rlk_cache_default_root(buf, size);
}

/* Opens a root that something will be deleted from: it must be the cache's own
 * (rlk_cache_root_is_own), so a mistaken path loses nothing. *rootfd is -1 with RLK_OK when
 * the root does not exist (nothing to do). */
static rlk_status open_own_root(const char *dir, const char *who, int *rootfd) {
  *rootfd = -1;
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
} walk_state;

static int walk_one(const scan_pos *pos, void *user) {
  walk_state *w = user;
  rlk_cache_entry e;
  uint64_t bytes = 0;
  int64_t last_used = 0;
  int committed = 0;
  if (entry_stats(pos->path, &bytes, &last_used, &committed) != 0 || !committed) return 0;
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
  walk_state w = {visit, user};
  return scan(dir, -1, walk_one, &w);
}

/* ---------------------------------------------------------------------------------------- */
/* Verifying                                                                                */
/* ---------------------------------------------------------------------------------------- */

typedef struct verify_state {
  const char *root;
  int repair;
  uint64_t entries, bad;
} verify_state;

static int verify_one(const scan_pos *pos, void *user) {
  verify_state *v = user;
  char why[512];
  v->entries++;
  int fd = open(pos->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 0; /* removed meanwhile */
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
  rlk_status st = resolve_root(root, dir, sizeof dir);
  if (st != RLK_OK) return st;
  /* Only this schema's entries: older or newer layouts have their own meaning and are
   * orphaned (and eventually evicted) rather than judged by this reader. */
  if (repair) {
    int rootfd;
    if ((st = open_own_root(dir, "rlk_cache_verify", &rootfd))) return st;
    if (rootfd >= 0) close(rootfd);
  }
  verify_state v = {dir, repair, 0, 0};
  st = scan(dir, RLK_CACHE_SCHEMA, verify_one, &v);
  if (entries) *entries = v.entries;
  if (bad) *bad = v.bad;
  return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Eviction and pruning                                                                     */
/* ---------------------------------------------------------------------------------------- */

typedef struct entry_rec {
  char *path;
  int64_t last_used;
  uint64_t bytes;
  int removed;
} entry_rec;

typedef struct entry_list {
  entry_rec *v;
  size_t n, cap;
  int oom;
  uint64_t total;
} entry_list;

static int collect_one(const scan_pos *pos, void *user) {
  entry_list *l = user;
  entry_rec r;
  int committed;
  r.removed = 0;
  if (entry_stats(pos->path, &r.bytes, &r.last_used, &committed) != 0) return 0;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 256;
    entry_rec *v = realloc(l->v, cap * sizeof *v);
    if (!v) {
      l->oom = 1;
      return 1;
    }
    l->v = v;
    l->cap = cap;
  }
  r.path = rlk_strdup(pos->path);
  if (!r.path) {
    l->oom = 1;
    return 1;
  }
  l->v[l->n++] = r;
  l->total += r.bytes;
  return 0;
}

static void list_free(entry_list *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i].path);
  free(l->v);
}

static int by_recency(const void *a, const void *b) {
  const entry_rec *x = a, *y = b;
  if (x->last_used != y->last_used) return x->last_used < y->last_used ? -1 : 1;
  return strcmp(x->path, y->path);
}

/* Every entry of every schema (older schemas' entries are never used again, so they age out
 * first), sorted oldest first. */
static rlk_status collect(const char *root, entry_list *l) {
  memset(l, 0, sizeof *l);
  rlk_status st = scan(root, -1, collect_one, l);
  if (st == RLK_OK && l->oom) st = rlk_error(RLK_ERR_OUT_OF_MEMORY, "kernel cache: out of memory");
  if (st != RLK_OK) {
    list_free(l);
    return st;
  }
  if (l->n) qsort(l->v, l->n, sizeof *l->v, by_recency);
  return RLK_OK;
}

static int remove_rec(const char *root, entry_rec *r, uint64_t *entries, uint64_t *bytes) {
  rlk_cache_retire(root, r->path);
  struct stat st;
  if (lstat(r->path, &st) == 0) return -1;
  r->removed = 1;
  (*entries)++;
  *bytes += r->bytes;
  return 0;
}

/* Oldest first until the total fits; entries used within `grace` seconds, and `keep`, stay.
 * Returns how many entries could not be removed. */
static uint64_t evict_list(const char *root, entry_list *l, uint64_t max_bytes, int64_t grace,
                           const char *keep, uint64_t *entries, uint64_t *bytes) {
  int64_t now = rlk_unix_time();
  uint64_t failed = 0;
  for (size_t i = 0; i < l->n && l->total > max_bytes; i++) {
    entry_rec *r = &l->v[i];
    if (r->removed) continue;
    if (keep && strcmp(r->path, keep) == 0) continue;
    if (grace > 0 && now - r->last_used < grace) continue;
    if (remove_rec(root, r, entries, bytes) == 0)
      l->total -= r->bytes;
    else
      failed++;
  }
  return failed;
}

rlk_status rlk_cache_evict_keep(const char *root, uint64_t max_bytes, int64_t grace_seconds,
                                const char *keep, uint64_t *removed_entries,
                                uint64_t *removed_bytes) {
  uint64_t n = 0, b = 0;
  if (removed_entries) *removed_entries = 0;
  if (removed_bytes) *removed_bytes = 0;
  if (!root || !root[0])
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache evict: no root");
  if (max_bytes == 0) return RLK_OK; /* no cap */
  entry_list l;
  rlk_status st = collect(root, &l);
  if (st != RLK_OK) return st;
  evict_list(root, &l, max_bytes, grace_seconds, keep, &n, &b);
  list_free(&l);
  if (removed_entries) *removed_entries = n;
  if (removed_bytes) *removed_bytes = b;
  return RLK_OK;
}

/* max_bytes 0 means no cap, as in the cache's configuration. */
rlk_status rlk_cache_evict(const char *root, uint64_t max_bytes, int64_t grace_seconds,
                           uint64_t *removed_entries, uint64_t *removed_bytes) {
  return rlk_cache_evict_keep(root, max_bytes, grace_seconds, NULL, removed_entries,
                              removed_bytes);
}

rlk_status rlk_cache_prune(const char *root, uint64_t max_bytes, int64_t max_age_seconds,
                           uint64_t *removed_entries, uint64_t *removed_bytes) {
  if (removed_entries) *removed_entries = 0;
  if (removed_bytes) *removed_bytes = 0;
  if (max_age_seconds < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_cache_prune: negative max_age_seconds");
  char dir[RLK_CACHE_PATH_MAX];
  rlk_status st = resolve_root(root, dir, sizeof dir);
  if (st != RLK_OK) return st;
  int rootfd;
  if ((st = open_own_root(dir, "rlk_cache_prune", &rootfd))) return st;
  if (rootfd < 0) return RLK_OK;
  close(rootfd);
  rlk_cache_sweep(dir);
  entry_list l;
  st = collect(dir, &l);
  if (st != RLK_OK) return st;
  uint64_t n = 0, b = 0, failed = 0;
  if (max_age_seconds > 0) {
    int64_t now = rlk_unix_time();
    for (size_t i = 0; i < l.n; i++) {
      if (now - l.v[i].last_used <= max_age_seconds) continue;
      if (remove_rec(dir, &l.v[i], &n, &b) == 0)
        l.total -= l.v[i].bytes;
      else
        failed++;
    }
  }
  /* An explicit prune is the operator's decision: no grace period. */
  if (max_bytes > 0) failed += evict_list(dir, &l, max_bytes, 0, NULL, &n, &b);
  list_free(&l);
  if (removed_entries) *removed_entries = n;
  if (removed_bytes) *removed_bytes = b;
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

static int clear_one(const scan_pos *pos, void *user) {
  clear_state *c = user;
  rlk_cache_retire(c->root, pos->path);
  struct stat st;
  if (lstat(pos->path, &st) == 0) c->failed = 1;
  return 0;
}

/* Removes the now-empty directories of the layout below `path`, bottom up; rmdir() never
 * removes anything that still holds a file. */
static void remove_empty_dirs(const char *path, int depth) {
  DIR *d = opendir(path);
  if (!d) return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
    if (depth >= 6 || !is_dir_entry(d, de)) continue;
    char sub[RLK_CACHE_PATH_MAX];
    if (rlk_format(sub, sizeof sub, "%s/%s", path, de->d_name) >= 0)
      remove_empty_dirs(sub, depth + 1);
  }
  closedir(d);
  rmdir(path);
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
  rlk_status st = resolve_root(root, dir, sizeof dir);
  if (st != RLK_OK) return st;
  int rootfd;
  if ((st = open_own_root(dir, "rlk_cache_clear", &rootfd))) return st;
  if (rootfd < 0) return RLK_OK;
  clear_state c = {dir, 0};
  st = scan(dir, -1, clear_one, &c);
  if (st != RLK_OK) {
    close(rootfd);
    return st;
  }
  /* The schema directories' now-empty skeletons. */
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
      if (!is_schema_dir(de->d_name, -1) || !is_dir_entry(d, de)) continue;
      char sub[RLK_CACHE_PATH_MAX];
      if (rlk_format(sub, sizeof sub, "%s/%s", dir, de->d_name) >= 0) remove_empty_dirs(sub, 1);
    }
    closedir(d);
  }
  rlk_cache_sweep_own(rootfd, dir, RLK_CACHE_QUARANTINE_DIR, -1, rlk_cache_is_quarantine_name);
  rlk_cache_sweep_own(rootfd, dir, RLK_CACHE_TMP_DIR, -1, rlk_cache_is_staging_name);
  close(rootfd);
  if (c.failed)
    return rlk_error(RLK_ERR_IO, "kernel cache: some entries under %s could not be removed",
                     dir);
  return RLK_OK;
}

/* cache_scan.c - the entries of a cache tree: visiting each (only the names of the layout, never
 * through a link), their sizes and recency, and eviction, oldest first (the open cache's cap after
 * publishing; rlk_cache_prune's sweep above). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "core/core.h"
#include "jit/cache_internal.h"

/* ---------------------------------------------------------------------------------------- */
/* Enumerating entries                                                                      */
/* ---------------------------------------------------------------------------------------- */

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
static int scan_level(rlk_cache_scan_pos *pos, size_t len, int depth, int schema, rlk_cache_scan_fn fn, void *user) {
  DIR *d = opendir(pos->path);
  if (!d) {
    if (errno != ENOENT && pos->unreadable++ == 0) { /* ENOENT: removed meanwhile */
      pos->unreadable_errno = errno;
      memcpy(pos->unreadable_path, pos->path, sizeof pos->path);
    }
    return 0;
  }
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

rlk_status rlk_cache_scan(const char *root, int schema, rlk_cache_scan_fn fn, void *user) {
  rlk_cache_scan_pos *pos = calloc(1, sizeof *pos);
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
  rlk_status status = RLK_OK;
  if (pos->unreadable)
    status = rlk_error(RLK_ERR_IO, "kernel cache: %s could not be read (%s)%s: what it holds was skipped",
                       pos->unreadable_path, strerror(pos->unreadable_errno),
                       pos->unreadable > 1 ? ", nor could other directories of the cache" : "");
  free(pos);
  return status;
}

int rlk_cache_entry_stats(const char *path, uint64_t *bytes, int64_t *last_used, int *committed) {
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

/* ---------------------------------------------------------------------------------------- */
/* Eviction                                                                                 */
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

static int collect_one(const rlk_cache_scan_pos *pos, void *user) {
  entry_list *l = user;
  entry_rec r;
  int committed;
  r.removed = 0;
  if (rlk_cache_entry_stats(pos->path, &r.bytes, &r.last_used, &committed) != 0) return 0;
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
 * first), sorted oldest first. RLK_ERR_IO (folders that could not be read) leaves the list of
 * what could be: the caller works on it and reports the error after. */
static rlk_status collect(const char *root, entry_list *l) {
  memset(l, 0, sizeof *l);
  rlk_status st = rlk_cache_scan(root, -1, collect_one, l);
  if ((st == RLK_OK || st == RLK_ERR_IO) && l->oom)
    st = rlk_error(RLK_ERR_OUT_OF_MEMORY, "kernel cache: out of memory");
  if (st != RLK_OK && st != RLK_ERR_IO) {
    list_free(l);
    return st;
  }
  if (l->n) qsort(l->v, l->n, sizeof *l->v, by_recency);
  return st;
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

rlk_status rlk_cache_evict_tree(const char *root, uint64_t max_bytes, int64_t max_age, int64_t grace,
                                const char *keep, uint64_t *removed_entries, uint64_t *removed_bytes,
                                uint64_t *failed) {
  uint64_t n = 0, b = 0, bad = 0;
  if (removed_entries) *removed_entries = 0;
  if (removed_bytes) *removed_bytes = 0;
  if (failed) *failed = 0;
  if (!root || !root[0]) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache evict: no root");
  if (max_bytes == 0 && max_age <= 0) return RLK_OK; /* no cap, no age limit */
  entry_list l;
  rlk_status st = collect(root, &l); /* RLK_ERR_IO: what could be read is evicted, then said */
  if (st != RLK_OK && st != RLK_ERR_IO) return st;
  char unread[512] = "";
  if (st) rlk_format(unread, sizeof unread, "%s", rlk_last_error());
  if (max_age > 0) {
    int64_t now = rlk_unix_time();
    for (size_t i = 0; i < l.n; i++) {
      if (now - l.v[i].last_used <= max_age) continue;
      if (keep && strcmp(l.v[i].path, keep) == 0) continue;
      if (remove_rec(root, &l.v[i], &n, &b) == 0)
        l.total -= l.v[i].bytes;
      else
        bad++;
    }
  }
  if (max_bytes > 0) bad += evict_list(root, &l, max_bytes, grace, keep, &n, &b);
  list_free(&l);
  if (removed_entries) *removed_entries = n;
  if (removed_bytes) *removed_bytes = b;
  if (failed) *failed = bad;
  return st ? rlk_error(st, "%s", unread) : RLK_OK;
}

/* max_bytes 0 means no cap, as in the cache's configuration. */
rlk_status rlk_cache_evict(const char *root, uint64_t max_bytes, int64_t grace_seconds,
                           uint64_t *removed_entries, uint64_t *removed_bytes) {
  return rlk_cache_evict_tree(root, max_bytes, 0, grace_seconds, NULL, removed_entries, removed_bytes, NULL);
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

void rlk_cache_remove_empty_layout(const char *root) {
  DIR *d = opendir(root);
  if (!d) return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (!is_schema_dir(de->d_name, -1) || !is_dir_entry(d, de)) continue;
    char sub[RLK_CACHE_PATH_MAX];
    if (rlk_format(sub, sizeof sub, "%s/%s", root, de->d_name) >= 0) remove_empty_dirs(sub, 1);
  }
  closedir(d);
}

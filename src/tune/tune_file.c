/* tune_file.c - the tuning database's files: reading, the advisory lock, atomic replacement,
 * and the public functions that record, merge and walk records and the pending list.
 *
 * Every change is read-merge-write under an exclusive lock on "<db>.lock" (a file beside the
 * database, never removed: removing it while another process waits would let a third lock a
 * new inode), and the new text replaces the old by rename() from a temporary file in the same
 * directory, fsynced first. So a reader (an op loading the database, which takes no lock) sees
 * the old file or the new one, never a mix, and concurrent writers never lose each other's
 * records. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "core/fs.h"
#include "tune/tune_db.h"

#define TUNE_PATH_MAX 4096
#define TUNE_FILE_MAX ((size_t)64 << 20) /* a larger file is not a tuning database */

/* ---- reading ------------------------------------------------------------------------ */

/* Reads a whole file, NUL-terminated. A missing file sets *exists = 0 and returns RLK_OK. */
static rlk_status read_text(const char *path, char **text, size_t *len, int *exists) {
  *text = NULL;
  *len = 0;
  *exists = 0;
  /* Never blocks: a FIFO in the database's place is refused, not waited on. */
  int fd = rlk_open_regular(AT_FDCWD, path, O_RDONLY, 0);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return RLK_OK;
    *exists = 1;
    return rlk_error(RLK_ERR_IO, "tuning database %s: %s", path,
                     errno == EINVAL ? "not a regular file" : strerror(errno));
  }
  *exists = 1;
  struct stat st;
  const char *problem = NULL;
  if (fstat(fd, &st) != 0)
    problem = strerror(errno);
  else if ((size_t)st.st_size > TUNE_FILE_MAX)
    problem = "too large for a tuning database";
  if (problem) {
    close(fd);
    return rlk_error(RLK_ERR_IO, "tuning database %s: %s", path, problem);
  }
  size_t cap = (size_t)st.st_size + 1, n = 0;
  char *buf = malloc(cap);
  if (!buf) {
    close(fd);
    return rlk_error(RLK_ERR_OUT_OF_MEMORY, "tuning database %s: out of memory", path);
  }
  for (;;) { /* the file may have grown since fstat: read to the end, within the limit */
    if (n + 1 == cap) {
      char *b = cap > TUNE_FILE_MAX ? NULL : realloc(buf, cap * 2);
      if (!b) break;
      buf = b;
      cap *= 2;
    }
    ssize_t k = read(fd, buf + n, cap - 1 - n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      int e = errno;
      free(buf);
      close(fd);
      return rlk_error(RLK_ERR_IO, "tuning database %s: read: %s", path, strerror(e));
    }
    if (k == 0) break;
    n += (size_t)k;
  }
  close(fd);
  buf[n] = '\0';
  *text = buf;
  *len = n;
  return RLK_OK;
}

rlk_status rlk_tune_file_read(const char *path, rlk_tune_file_kind kind, rlk_tune_list *out, int *exists,
                              size_t *bad, int *damaged, char *why, size_t whysize) {
  *bad = 0;
  *damaged = 0;
  why[0] = '\0';
  char *text = NULL;
  size_t len = 0;
  rlk_status st = read_text(path, &text, &len, exists);
  if (st || !*exists) return st;
  if (rlk_tune_parse(text, len, kind, out, bad, why, whysize) != 0 || *bad) *damaged = 1;
  free(text);
  return RLK_OK;
}

/* ---- paths, the lock and atomic replacement ---------------------------------------- */

static rlk_status with_suffix(const char *db, const char *suffix, char *buf, size_t size) {
  if (rlk_format(buf, size, "%s%s", db, suffix) < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "tuning database path %s is too long", db);
  return RLK_OK;
}

rlk_status rlk_tune_pending_path(const char *db, char *buf, size_t size) {
  return with_suffix(db, RLK_TUNE_PENDING_SUFFIX, buf, size);
}

/* The directory part of a path ("." for a bare name). */
static void dir_of(const char *path, char *buf, size_t size) {
  const char *slash = strrchr(path, '/');
  if (!slash)
    rlk_format(buf, size, ".");
  else if (slash == path)
    rlk_format(buf, size, "/");
  else
    rlk_format(buf, size, "%.*s", (int)(slash - path), path);
}

static rlk_status make_parent(const char *path) {
  char dir[TUNE_PATH_MAX];
  dir_of(path, dir, sizeof dir);
  if (rlk_mkdirs(dir, 0777) != 0)
    return rlk_error(RLK_ERR_IO, "tuning database %s: cannot create %s: %s", path, dir, strerror(errno));
  return RLK_OK;
}

rlk_status rlk_tune_lock(const char *db, double timeout_s, int *fd) {
  *fd = -1;
  char path[TUNE_PATH_MAX];
  rlk_status st = with_suffix(db, RLK_TUNE_LOCK_SUFFIX, path, sizeof path);
  if (st) return st;
  int f = rlk_open_regular(AT_FDCWD, path, O_RDWR | O_CREAT | O_NOFOLLOW, 0666);
  if (f < 0)
    return rlk_error(RLK_ERR_IO, "tuning database lock %s: cannot open: %s", path,
                     errno == EINVAL ? "not a regular file" : strerror(errno));
  int use_flock = 0;
  double start = rlk_now();
  int rc = rlk_lock_fd(f, &use_flock, timeout_s);
  if (rc != 0) {
    int e = errno;
    close(f);
    if (rc > 0)
      return rlk_error(RLK_ERR_TIMEOUT,
                       "tuning database lock %s: still held by another process after %.1f s (raise "
                       "RLK_LOCK_TIMEOUT_S if a writer is that slow)",
                       path, rlk_now() - start);
    return rlk_error(RLK_ERR_IO, "tuning database lock %s: %s", path, strerror(e));
  }
  /* flock() and OFD locks are both released by close(); the descriptor is the lock. */
  *fd = f;
  return RLK_OK;
}

void rlk_tune_unlock(int fd) {
  if (fd >= 0) close(fd);
}

/* Replaces `path` by a file of `kind` holding the records: a temporary file beside it, fsynced,
 * renamed over it, the directory fsynced. Called with the lock held. The temporary file's name
 * starts with the file's own ("tune.db.tmp-..."): one a killed writer leaves at the kernel cache's
 * root is then a tuning database name, which does not keep the cache from claiming the root. */
static rlk_status write_records(const char *path, rlk_tune_file_kind kind, const rlk_tune_record *r, size_t n) {
  static atomic_uint counter;
  char dir[TUNE_PATH_MAX], tmp[TUNE_PATH_MAX];
  dir_of(path, dir, sizeof dir);
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  if (rlk_format(tmp, sizeof tmp, "%s/%s.tmp-%ld-%u", dir, base, (long)getpid(),
                 atomic_fetch_add(&counter, 1)) < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "tuning database path %s is too long", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd < 0) return rlk_error(RLK_ERR_IO, "tuning database %s: cannot create %s: %s", path, tmp, strerror(errno));
  FILE *f = fdopen(fd, "w");
  if (!f) {
    close(fd);
    unlink(tmp);
    return rlk_error(RLK_ERR_IO, "tuning database %s: %s", path, strerror(errno));
  }
  int bad = fprintf(f, "%s\n",
                    kind == RLK_TUNE_FILE_PENDING ? RLK_TUNE_PENDING_VERSION_LINE : RLK_TUNE_DB_VERSION_LINE) < 0;
  if (kind == RLK_TUNE_FILE_DB)
    bad |= fprintf(f, "# written by rlk %s; one record per line, tab-separated name=value fields\n",
                   rlk_version_string()) < 0;
  for (size_t i = 0; i < n && !bad; i++) bad |= rlk_tune_format(f, &r[i], kind) != 0;
  bad |= fflush(f) != 0;
  bad |= fsync(fd) != 0;
  int e = errno;
  bad |= fclose(f) != 0;
  if (!bad && rename(tmp, path) != 0) {
    e = errno;
    bad = 1;
  }
  if (bad) {
    unlink(tmp);
    return rlk_error(RLK_ERR_IO, "tuning database %s: writing failed: %s", path, strerror(e ? e : EIO));
  }
  rlk_fsync_dir(dir);
  return RLK_OK;
}

/* Reads a file of `kind` for a read-merge-write, with the lock held. A file that is not of its
 * kind is moved aside (its records cannot be kept, but it is not ours to destroy), with a
 * warning; bad lines are dropped with a warning. */
static rlk_status read_for_update(const char *path, rlk_tune_file_kind kind, rlk_tune_list *out) {
  int exists = 0, damaged = 0;
  size_t bad = 0;
  char why[256];
  size_t before = out->n;
  rlk_status st = rlk_tune_file_read(path, kind, out, &exists, &bad, &damaged, why, sizeof why);
  if (st) return st;
  if (!damaged) return RLK_OK;
  if (out->n == before && bad) {
    char aside[TUNE_PATH_MAX];
    if (rlk_format(aside, sizeof aside, "%s.bad-%lld", path, (long long)rlk_unix_time()) >= 0 &&
        rename(path, aside) == 0)
      rlk_warn("tuning database %s: %s; moved it to %s and started a new one", path, why, aside);
    else
      rlk_warn("tuning database %s: %s; replacing it", path, why);
  } else {
    rlk_warn("tuning database %s: %s (dropped on rewrite)", path, why);
  }
  return RLK_OK;
}

/* ---- one record per key ------------------------------------------------------------ */

/* FNV-1a over a string and its NUL, continuing from h. */
static uint64_t hash_str(uint64_t h, const char *s) {
  do {
    h ^= (unsigned char)*s;
    h *= 1099511628211u;
  } while (*s++);
  return h;
}

static uint64_t hash_key(const rlk_tune_record *r) {
  uint64_t h = 14695981039346656037u;
  h = hash_str(h, r->op);
  h = hash_str(h, r->shape);
  h = hash_str(h, r->target);
  h = hash_str(h, r->device);
  h = hash_str(h, r->runtime);
  h = hash_str(h, r->compiler);
  h ^= (uint64_t)r->tokens;
  h *= 1099511628211u;
  h ^= (uint64_t)(uint32_t)r->multiprocessors;
  h *= 1099511628211u;
  return h;
}

typedef struct key_ref {
  uint64_t hash;
  size_t index;
} key_ref;

static int by_hash_then_index(const void *a, const void *b) {
  const key_ref *x = a, *y = b;
  if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

/* Keeps one record per key: the last of its lines, the one a reader uses (tune_table.c), where
 * it stands; drops the earlier ones (a file joined from two with cat has them). A writer does
 * this first, so the record it replaces is the one in use and no stale line of the key survives
 * to be read back. 0, or -1 when out of memory. */
static int keep_last_of_each_key(rlk_tune_list *l) {
  if (l->n < 2) return 0;
  key_ref *refs = malloc(l->n * sizeof *refs);
  unsigned char *drop = calloc(l->n, 1);
  if (!refs || !drop) {
    free(refs);
    free(drop);
    return -1;
  }
  for (size_t i = 0; i < l->n; i++) refs[i] = (key_ref){hash_key(&l->v[i]), i};
  qsort(refs, l->n, sizeof *refs, by_hash_then_index);
  for (size_t a = 0; a < l->n; a++)
    for (size_t b = a + 1; b < l->n && refs[b].hash == refs[a].hash; b++)
      if (rlk_tune_same_key(&l->v[refs[a].index], &l->v[refs[b].index])) {
        drop[refs[a].index] = 1; /* a later line of the key follows */
        break;
      }
  size_t kept = 0;
  for (size_t i = 0; i < l->n; i++)
    if (!drop[i]) {
      if (kept != i) l->v[kept] = l->v[i];
      kept++;
    }
  if (kept != l->n) rlk_debug("tuning database: %zu earlier line%s of repeated keys dropped", l->n - kept,
                               l->n - kept == 1 ? "" : "s");
  l->n = kept;
  free(refs);
  free(drop);
  return 0;
}

/* ---- public: paths, recording, merging --------------------------------------------- */

rlk_status rlk_tune_db_path(char *buf, size_t size) {
  if (!buf || size == 0) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_tune_db_path: no buffer");
  const char *env = rlk_env("RLK_TUNE_DB");
  if (env) {
    if (rlk_format(buf, size, "%s", env) < 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "RLK_TUNE_DB: longer than %zu bytes", size - 1);
    return RLK_OK;
  }
  char root[TUNE_PATH_MAX];
  rlk_status st = rlk_cache_default_root(root, sizeof root);
  if (st) return rlk_error_wrap(st, "tuning database: set RLK_TUNE_DB");
  if (rlk_format(buf, size, "%s/%s", root, RLK_TUNE_DB_NAME) < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_tune_db_path: the path is longer than %zu bytes", size - 1);
  return RLK_OK;
}

/* `db`, or the default path, into buf. */
static rlk_status db_or_default(const char *db, char *buf, size_t size) {
  if (!db) return rlk_tune_db_path(buf, size);
  if (!*db) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "db: empty path");
  if (rlk_format(buf, size, "%s", db) < 0) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "db: path too long");
  return RLK_OK;
}

static rlk_status out_of_memory(const char *what) {
  return rlk_error(RLK_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
}

/* Drops the pending lines whose keys are among `done`. Called with the lock held. */
static rlk_status settle_pending(const char *db, const rlk_tune_record *done, size_t n) {
  char path[TUNE_PATH_MAX];
  rlk_status st = rlk_tune_pending_path(db, path, sizeof path);
  if (st) return st;
  rlk_tune_list pend = {0};
  st = read_for_update(path, RLK_TUNE_FILE_PENDING, &pend);
  size_t kept = 0;
  for (size_t i = 0; !st && i < pend.n; i++) {
    int settled = 0;
    for (size_t j = 0; j < n && !settled; j++) settled = rlk_tune_same_key(&pend.v[i], &done[j]);
    if (!settled) pend.v[kept++] = pend.v[i];
  }
  if (!st && kept != pend.n) st = write_records(path, RLK_TUNE_FILE_PENDING, pend.v, kept);
  rlk_tune_list_free(&pend);
  return st;
}

rlk_status rlk_tune_db_record(const char *db, const rlk_tune_record *records, size_t n) {
  if (!records && n) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_tune_db_record: records is NULL");
  for (size_t i = 0; i < n; i++) {
    char what[48];
    rlk_format(what, sizeof what, "records[%zu]", i);
    rlk_status st = rlk_tune_check_record(&records[i], RLK_TUNE_FILE_DB, what);
    if (st) return st;
  }
  char path[TUNE_PATH_MAX];
  rlk_status st = db_or_default(db, path, sizeof path);
  double timeout = 0;
  if (!st) st = rlk_env_lock_timeout(&timeout);
  if (!st) st = make_parent(path);
  if (st) return st;
  int lock = -1;
  if ((st = rlk_tune_lock(path, timeout, &lock))) return st;
  rlk_tune_list all = {0};
  st = read_for_update(path, RLK_TUNE_FILE_DB, &all);
  if (!st && keep_last_of_each_key(&all) != 0) st = out_of_memory("rlk_tune_db_record");
  for (size_t i = 0; !st && i < n; i++) {
    size_t j = 0;
    while (j < all.n && !rlk_tune_same_key(&all.v[j], &records[i])) j++;
    if (j < all.n)
      all.v[j] = records[i];
    else if (rlk_tune_list_push(&all, &records[i]) != 0)
      st = out_of_memory("rlk_tune_db_record");
  }
  if (!st) st = write_records(path, RLK_TUNE_FILE_DB, all.v, all.n);
  if (!st) st = settle_pending(path, records, n);
  rlk_tune_list_free(&all);
  rlk_tune_unlock(lock);
  return st;
}

rlk_status rlk_tune_db_merge(const char *db, const char *from, size_t *taken) {
  if (taken) *taken = 0;
  if (!from || !*from) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_tune_db_merge: from is empty");
  char path[TUNE_PATH_MAX];
  rlk_status st = db_or_default(db, path, sizeof path);
  if (st) return st;
  rlk_tune_list src = {0}, all = {0};
  int exists = 0, damaged = 0;
  size_t bad = 0;
  char why[256];
  /* The source is replaced atomically by its writers, so it reads consistently without a lock. */
  st = rlk_tune_file_read(from, RLK_TUNE_FILE_DB, &src, &exists, &bad, &damaged, why, sizeof why);
  if (!st && !exists) st = rlk_error(RLK_ERR_IO, "rlk_tune_db_merge: %s: no such file", from);
  if (!st && damaged && src.n == 0 && bad)
    st = rlk_error(RLK_ERR_IO, "rlk_tune_db_merge: %s is not a tuning database: %s", from, why);
  else if (!st && damaged)
    rlk_warn("tuning database %s: %s", from, why);
  double timeout = 0;
  if (!st) st = rlk_env_lock_timeout(&timeout);
  if (!st) st = make_parent(path);
  int lock = -1;
  if (!st) st = rlk_tune_lock(path, timeout, &lock);
  if (!st) st = read_for_update(path, RLK_TUNE_FILE_DB, &all);
  /* each file's record of a key is its last line's, as a reader of either would take */
  if (!st && (keep_last_of_each_key(&src) != 0 || keep_last_of_each_key(&all) != 0))
    st = out_of_memory("rlk_tune_db_merge");
  size_t took = 0;
  for (size_t i = 0; !st && i < src.n; i++) {
    size_t j = 0;
    while (j < all.n && !rlk_tune_same_key(&all.v[j], &src.v[i])) j++;
    if (j == all.n) {
      if (rlk_tune_list_push(&all, &src.v[i]) != 0) st = out_of_memory("rlk_tune_db_merge");
      took++;
    } else if (src.v[i].created >= all.v[j].created) {
      all.v[j] = src.v[i];
      took++;
    }
  }
  if (!st) st = write_records(path, RLK_TUNE_FILE_DB, all.v, all.n);
  if (!st) st = settle_pending(path, src.v, src.n);
  if (lock >= 0) rlk_tune_unlock(lock);
  rlk_tune_list_free(&src);
  rlk_tune_list_free(&all);
  if (!st && taken) *taken = took;
  return st;
}

/* ---- public: walking ---------------------------------------------------------------- */

static rlk_status walk_file(const char *path, rlk_tune_file_kind kind, rlk_tune_visit_fn visit, void *user,
                            size_t *bad_lines) {
  if (bad_lines) *bad_lines = 0;
  if (!visit) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "visit is NULL");
  rlk_tune_list all = {0};
  int exists = 0, damaged = 0;
  size_t bad = 0;
  char why[256];
  rlk_status st = rlk_tune_file_read(path, kind, &all, &exists, &bad, &damaged, why, sizeof why);
  if (st) return st;
  if (damaged)
    rlk_warn("tuning %s %s: %s%s", kind == RLK_TUNE_FILE_DB ? "database" : "pending list", path, why,
             all.n ? "" : "; no record read");
  if (bad_lines) *bad_lines = bad;
  for (size_t i = 0; i < all.n; i++)
    if (visit(&all.v[i], user)) break;
  rlk_tune_list_free(&all);
  return RLK_OK;
}

rlk_status rlk_tune_db_walk(const char *db, rlk_tune_visit_fn visit, void *user, size_t *bad_lines) {
  char path[TUNE_PATH_MAX];
  rlk_status st = db_or_default(db, path, sizeof path);
  if (st) return st;
  return walk_file(path, RLK_TUNE_FILE_DB, visit, user, bad_lines);
}

rlk_status rlk_tune_pending_walk(const char *db, rlk_tune_visit_fn visit, void *user, size_t *bad_lines) {
  char path[TUNE_PATH_MAX], pending[TUNE_PATH_MAX];
  rlk_status st = db_or_default(db, path, sizeof path);
  if (!st) st = rlk_tune_pending_path(path, pending, sizeof pending);
  if (st) return st;
  return walk_file(pending, RLK_TUNE_FILE_PENDING, visit, user, bad_lines);
}

/* ---- the pending list --------------------------------------------------------------- */

rlk_status rlk_tune_pending_add(const char *db, const rlk_tune_record *key, double timeout_s) {
  char path[TUNE_PATH_MAX];
  rlk_status st = rlk_tune_pending_path(db, path, sizeof path);
  if (!st) st = rlk_tune_check_record(key, RLK_TUNE_FILE_PENDING, "pending configuration");
  if (!st) st = make_parent(db);
  if (st) return st;
  int lock = -1;
  if ((st = rlk_tune_lock(db, timeout_s, &lock))) return st;
  rlk_tune_list pend = {0};
  st = read_for_update(path, RLK_TUNE_FILE_PENDING, &pend);
  int present = 0;
  for (size_t i = 0; !st && i < pend.n && !present; i++) present = rlk_tune_same_key(&pend.v[i], key);
  if (!st && !present) {
    rlk_tune_record k;
    rlk_tune_copy_key(&k, key);
    if (rlk_tune_list_push(&pend, &k) != 0)
      st = out_of_memory("tuning pending list");
    else
      st = write_records(path, RLK_TUNE_FILE_PENDING, pend.v, pend.n);
  }
  rlk_tune_list_free(&pend);
  rlk_tune_unlock(lock);
  return st;
}

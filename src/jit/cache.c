/* cache.c - the on-disk kernel cache: configuration, opening, lookup and publishing
 * (docs/cache.md). The lock is in cache_lock.c, walking/eviction/admin in cache_admin.c.
 *
 * An entry is <root>/v<schema>/<compiler>/<target>/<family>/<hh>/<hash>/ holding
 *   kernel.<ext>  the binary, byte for byte as the compiler produced it
 *   kernel.meta   "name=value" lines, the commit marker (written last, renamed in with the rest)
 *   last_used     empty; its mtime is the entry's recency for eviction
 * Entries appear and disappear only by rename() of the whole directory, so a reader sees a
 * complete entry or none; every read is still checked, since disks, copies and people are not. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "core/fs.h"
#include "jit/cache.h"
#include "jit/cache_internal.h"
#include "jit/sha256.h"

/* ---------------------------------------------------------------------------------------- */
/* Configuration                                                                            */
/* ---------------------------------------------------------------------------------------- */

/* "123", "64K", "512M", "10G", "1T", optionally followed by "B" or "iB" (powers of 1024). */
static int parse_bytes(const char *s, uint64_t *out) {
  const char *p = s;
  uint64_t v = 0;
  if (*p < '0' || *p > '9') return -1;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (v > (UINT64_MAX - 9) / 10) return -1;
    v = v * 10 + (uint64_t)(*p - '0');
  }
  int shift = 0;
  switch (*p) {
  case 'k': case 'K': shift = 10; p++; break;
  case 'm': case 'M': shift = 20; p++; break;
  case 'g': case 'G': shift = 30; p++; break;
  case 't': case 'T': shift = 40; p++; break;
  default: break;
  }
  if (shift && (*p == 'i' || *p == 'I')) p++;
  if (*p == 'b' || *p == 'B') p++;
  if (*p != '\0') return -1;
  if (shift && v > (UINT64_MAX >> shift)) return -1;
  *out = v << shift;
  return 0;
}

static void default_lock_dir(char *buf, size_t size) {
  struct stat st;
  unsigned uid = (unsigned)geteuid();
  if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK | X_OK) == 0)
    rlk_format(buf, size, "/dev/shm/rlk-%u", uid);
  else
    rlk_format(buf, size, "/tmp/rlk-%u", uid);
}

rlk_status rlk_cache_config_from_env(rlk_cache_config *cfg, const char *root_override) {
  if (!cfg) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "cache config: NULL");
  memset(cfg, 0, sizeof *cfg);
  cfg->mode = RLK_CACHE_MODE_RW;
  cfg->lock_timeout_s = 600.0;

  const char *mode = rlk_env("RLK_CACHE_MODE");
  if (mode) {
    if (strcmp(mode, "rw") == 0)
      cfg->mode = RLK_CACHE_MODE_RW;
    else if (strcmp(mode, "ro") == 0)
      cfg->mode = RLK_CACHE_MODE_RO;
    else if (strcmp(mode, "memory") == 0)
      cfg->mode = RLK_CACHE_MODE_MEMORY;
    else if (strcmp(mode, "off") == 0)
      cfg->mode = RLK_CACHE_MODE_OFF;
    else
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "RLK_CACHE_MODE: '%.40s' is not one of rw, ro, memory, off", mode);
  }

  if (root_override && root_override[0]) {
    if (rlk_format(cfg->root, sizeof cfg->root, "%s", root_override) < 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "cache_dir: longer than %zu bytes",
                       sizeof cfg->root - 1);
  } else {
    rlk_status st = rlk_cache_default_root(cfg->root, sizeof cfg->root);
    if (st == RLK_ERR_CACHE) {
      /* No home directory: the cache still works from the read-only trees; rlk_cache_open
       * says so once. */
      cfg->root[0] = '\0';
    } else if (st != RLK_OK) {
      return st;
    }
  }

  const char *ro = rlk_env("RLK_CACHE_RO_DIRS");
  if (ro && rlk_format(cfg->ro_dirs, sizeof cfg->ro_dirs, "%s", ro) < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "RLK_CACHE_RO_DIRS: longer than %zu bytes",
                     sizeof cfg->ro_dirs - 1);

  const char *max = rlk_env("RLK_CACHE_MAX_BYTES");
  if (max && parse_bytes(max, &cfg->max_bytes) != 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "RLK_CACHE_MAX_BYTES: '%.40s' is not a size (bytes, or with K, M, G, T)",
                     max);

  const char *lock = rlk_env("RLK_LOCK_DIR");
  if (lock) {
    if (rlk_format(cfg->lock_dir, sizeof cfg->lock_dir, "%s", lock) < 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "RLK_LOCK_DIR: longer than %zu bytes",
                       sizeof cfg->lock_dir - 1);
  } else {
    default_lock_dir(cfg->lock_dir, sizeof cfg->lock_dir);
  }

  const char *timeout = rlk_env("RLK_LOCK_TIMEOUT_S");
  if (timeout) {
    char *end = NULL;
    errno = 0;
    double t = strtod(timeout, &end);
    if (end == timeout || *end != '\0' || errno != 0 || !isfinite(t) || t < 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "RLK_LOCK_TIMEOUT_S: '%.40s' is not a non-negative number of seconds",
                       timeout);
    cfg->lock_timeout_s = t;
  }
  return RLK_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* File-system helpers                                                                      */
/* ---------------------------------------------------------------------------------------- */

int rlk_cache_is_hash(const char *s) {
  size_t i = 0;
  for (; s[i]; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return i == 64;
}

/* Errors that mean "someone else removed it first" or an NFS client still holding a file:
 * none of them makes a tree removal fail. */
static int benign_remove_error(int e) {
  return e == ENOENT || e == ESTALE || e == EBUSY || e == ENOTEMPTY || e == EEXIST;
}

static int rmtree_at(int parent, const char *name, int depth) {
  if (unlinkat(parent, name, 0) == 0) return 0;
  if (errno != EISDIR && errno != EPERM) return benign_remove_error(errno) ? 0 : -1;
  if (depth > 32) return -1; /* deeper than anything the cache writes */
  int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return benign_remove_error(errno) ? 0 : -1;
  DIR *dir = fdopendir(fd);
  if (!dir) {
    close(fd);
    return -1;
  }
  int rc = 0;
  struct dirent *de;
  while ((de = readdir(dir)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
    if (rmtree_at(dirfd(dir), de->d_name, depth + 1) != 0) rc = -1;
  }
  closedir(dir);
  if (unlinkat(parent, name, AT_REMOVEDIR) != 0 && !benign_remove_error(errno)) rc = -1;
  return rc;
}

int rlk_cache_rmtree(const char *path) { return rmtree_at(AT_FDCWD, path, 0); }

int rlk_cache_rmtree_at(int dirfd, const char *name) { return rmtree_at(dirfd, name, 0); }

static void sanitize_component(char *dst, size_t size, const char *src) {
  size_t j = 0;
  for (size_t i = 0; src[i] && j + 1 < size; i++) {
    char c = src[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '-' || c == '_' || c == '+';
    dst[j++] = ok ? c : '_';
  }
  dst[j] = '\0';
  /* Never "", ".", ".." or a hidden name: the prefix is for people, the hash decides. */
  if (j == 0 || dst[0] == '.') {
    if (j == 0) dst[j++] = '_';
    dst[0] = '_';
    dst[j] = '\0';
  }
}

int rlk_cache_entry_path(const char *root, const rlk_kernel_key *key, char *buf, size_t size) {
  char compiler[65], target[33], family[65];
  sanitize_component(compiler, sizeof compiler, key->compiler);
  sanitize_component(target, sizeof target, key->target);
  sanitize_component(family, sizeof family, key->family);
  return rlk_format(buf, size, "%s/v%d/%s/%s/%s/%.2s/%s", root, key->schema, compiler, target,
                    family, key->hex, key->hex) < 0
             ? -1
             : 0;
}

/* Makes sure <root>/name is a real, trusted directory of the cache's own (a link or file in
 * its place is removed, never followed). 0 or -1 with errno. */
static int ensure_own_subdir(const char *root, const char *name) {
  int rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) return -1;
  int fd = rlk_cache_open_own_subdir(rootfd, name, 1);
  int e = errno;
  close(rootfd);
  if (fd < 0) {
    errno = e;
    return -1;
  }
  close(fd);
  return 0;
}

/* A unique staging directory (0700) under <root>/tmp; 0 or -1 with errno. */
static int make_staging(const char *root, char *buf, size_t size) {
  char tmp[RLK_CACHE_PATH_MAX], host[64] = "host";
  if (rlk_format(tmp, sizeof tmp, "%s/%s", root, RLK_CACHE_TMP_DIR) < 0) {
    errno = ENAMETOOLONG;
    return -1;
  }
  if (ensure_own_subdir(root, RLK_CACHE_TMP_DIR) != 0) return -1;
  if (gethostname(host, sizeof host) != 0) strcpy(host, "host");
  host[sizeof host - 1] = '\0';
  char clean[33];
  sanitize_component(clean, sizeof clean, host);
  if (rlk_format(buf, size, "%s/%s-%ld-XXXXXX", tmp, clean, (long)getpid()) < 0) {
    errno = ENAMETOOLONG;
    return -1;
  }
  return mkdtemp(buf) ? 0 : -1;
}

int rlk_cache_retire(const char *root, const char *entry_path) {
  char stage[RLK_CACHE_PATH_MAX], moved[RLK_CACHE_PATH_MAX];
  if (make_staging(root, stage, sizeof stage) == 0 &&
      rlk_format(moved, sizeof moved, "%s/e", stage) >= 0) {
    if (rename(entry_path, moved) == 0 || errno == ENOENT) return rlk_cache_rmtree(stage);
    rlk_cache_rmtree(stage);
  }
  return rlk_cache_rmtree(entry_path);
}

int rlk_cache_quarantine_path(const char *root, const char *entry_path) {
  char qdir[RLK_CACHE_PATH_MAX], dst[RLK_CACHE_PATH_MAX];
  const char *slash = strrchr(entry_path, '/');
  const char *hash = slash ? slash + 1 : entry_path;
  if (rlk_format(qdir, sizeof qdir, "%s/%s", root, RLK_CACHE_QUARANTINE_DIR) >= 0 &&
      ensure_own_subdir(root, RLK_CACHE_QUARANTINE_DIR) == 0 &&
      rlk_format(dst, sizeof dst, "%s/%.64s.%lld.%ld", qdir, hash, (long long)rlk_unix_time(),
                 (long)getpid()) >= 0) {
    if (rename(entry_path, dst) == 0 || errno == ENOENT) return 0;
  }
  /* No quarantine possible (name taken this second, other file system): just remove it. */
  rlk_cache_retire(root, entry_path);
  struct stat st;
  return lstat(entry_path, &st) == 0 ? -1 : 0;
}

/* Removes what is older than max_age in the cache's own directory `sub` of the root, among
 * the names `own` accepts; max_age < 0 removes all of them. Nothing is followed through a link:
 * the directory is opened without following one and every removal is relative to it. */
void rlk_cache_sweep_own(int rootfd, const char *root, const char *sub, int64_t max_age,
                         int (*own)(const char *)) {
  int fd = rlk_cache_open_own_subdir(rootfd, sub, 0);
  if (fd < 0) return;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return;
  }
  int64_t now = rlk_unix_time();
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (!own(de->d_name)) continue;
    int64_t when = -1;
    if (own == rlk_cache_is_quarantine_name) when = strtoll(de->d_name + 65, NULL, 10);
    struct stat st;
    if (when <= 0) {
      if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      when = (int64_t)st.st_mtime;
    }
    if (max_age >= 0 && now - when < max_age) continue;
    rlk_debug("kernel cache: removing %s/%s/%s", root, sub, de->d_name);
    rlk_cache_rmtree_at(dirfd(d), de->d_name);
  }
  closedir(d);
  /* Clearing takes the emptied directory too; a sweep leaves it, since another process may be
   * about to stage in it. */
  if (max_age < 0) unlinkat(rootfd, sub, AT_REMOVEDIR);
}

void rlk_cache_sweep(const char *root) {
  char why[512];
  int rootfd = rlk_cache_open_tree(root, why, sizeof why);
  if (rootfd < 0) return;
  if (rlk_cache_root_is_own(rootfd, 0, why, sizeof why)) {
    rlk_cache_sweep_own(rootfd, root, RLK_CACHE_TMP_DIR, RLK_CACHE_STAGING_MAX_AGE,
                        rlk_cache_is_staging_name);
    rlk_cache_sweep_own(rootfd, root, RLK_CACHE_QUARANTINE_DIR, RLK_CACHE_QUARANTINE_MAX_AGE,
                        rlk_cache_is_quarantine_name);
  }
  close(rootfd);
}

int64_t rlk_cache_entry_last_used(int dfd) {
  struct stat st;
  if (fstatat(dfd, RLK_CACHE_LAST_USED_NAME, &st, 0) == 0) return (int64_t)st.st_mtime;
  if (fstatat(dfd, RLK_CACHE_META_NAME, &st, 0) == 0) return (int64_t)st.st_mtime;
  if (fstat(dfd, &st) == 0) return (int64_t)st.st_mtime;
  return 0;
}

/* Writes a new file in dfd and fsyncs it. 0 or -1 with errno. */
static int write_file_at(int dfd, const char *name, const void *data, size_t size) {
  int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return -1;
  if (rlk_write_all(fd, data, size) != 0 || fsync(fd) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return close(fd);
}

/* Reads a whole file of dfd (at most `limit` bytes, else EFBIG), NUL-terminated for text. */
static int read_file_at(int dfd, const char *name, size_t limit, char **data, size_t *size,
                        struct stat *st_out) {
  int fd = rlk_open_regular(dfd, name, O_RDONLY | O_NOFOLLOW, 0);
  if (fd < 0) {
    if (errno == ELOOP) errno = EINVAL; /* a link */
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return -1;
  }
  if ((uint64_t)st.st_size > limit) {
    close(fd);
    errno = EFBIG;
    return -1;
  }
  size_t want = (size_t)st.st_size;
  char *buf = malloc(want + 1);
  if (!buf) {
    close(fd);
    errno = ENOMEM;
    return -1;
  }
  size_t got = 0;
  while (got < want) {
    ssize_t n = read(fd, buf + got, want - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  if (got < want) {
    int e = errno;
    free(buf);
    close(fd);
    errno = e ? e : EIO;
    return -1;
  }
  close(fd);
  buf[got] = '\0';
  *data = buf;
  *size = got;
  if (st_out) *st_out = st;
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Metadata                                                                                 */
/* ---------------------------------------------------------------------------------------- */

typedef struct strbuf {
  char *p;
  size_t len, cap;
  int oom;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void sb_puts(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Values are escaped so that a line is always one record: backslash, newline, carriage
 * return and other control bytes become \\, \n, \r, \xHH. */
static void sb_escaped(strbuf *b, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char e[4];
    if (c == '\\') {
      sb_put(b, "\\\\", 2);
    } else if (c == '\n') {
      sb_put(b, "\\n", 2);
    } else if (c == '\r') {
      sb_put(b, "\\r", 2);
    } else if (c < 0x20 || c == 0x7f) {
      e[0] = '\\';
      e[1] = 'x';
      e[2] = hex[c >> 4];
      e[3] = hex[c & 15];
      sb_put(b, e, 4);
    } else {
      sb_put(b, (const char *)&s[i], 1);
    }
  }
}

static void sb_field(strbuf *b, const char *name, const char *value) {
  sb_puts(b, name);
  sb_put(b, "=", 1);
  sb_escaped(b, value, strlen(value));
  sb_put(b, "\n", 1);
}

static void sb_fmt(strbuf *b, const char *name, const char *fmt, ...) RLK_PRINTF(3, 4);
static void sb_fmt(strbuf *b, const char *name, const char *fmt, ...) {
  char v[128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v, sizeof v, fmt, ap);
  va_end(ap);
  sb_field(b, name, v);
}

static int unhex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Unescapes in place; -1 on a malformed escape or an escaped NUL. */
static int unescape(char *s) {
  char *w = s;
  for (const char *r = s; *r; r++) {
    if (*r != '\\') {
      *w++ = *r;
      continue;
    }
    r++;
    if (*r == '\\')
      *w++ = '\\';
    else if (*r == 'n')
      *w++ = '\n';
    else if (*r == 'r')
      *w++ = '\r';
    else if (*r == 'x' && unhex(r[1]) >= 0 && unhex(r[2]) >= 0) {
      int v = unhex(r[1]) * 16 + unhex(r[2]);
      if (v == 0) return -1;
      *w++ = (char)v;
      r += 2;
    } else
      return -1;
  }
  *w = '\0';
  return 0;
}

void rlk_cache_meta_free(rlk_cache_meta *meta) {
  if (!meta) return;
  for (size_t i = 0; i < meta->nlowered; i++) free(meta->lowered[i]);
  free(meta->lowered);
  memset(meta, 0, sizeof *meta);
}

#define META_MAX_LOWERED 65536

int rlk_cache_meta_parse(char *text, size_t len, rlk_cache_meta *m, char *why, size_t whysize) {
  memset(m, 0, sizeof *m);
  unsigned have_fields = 0;
  int have_key = 0, have_binary = 0, have_size = 0, have_sha = 0, have_count = 0, ended = 0;
  size_t lineno = 0;
  char *p = text, *end = text + len;
  if (memchr(text, '\0', len)) {
    rlk_format(why, whysize, "kernel.meta holds a NUL byte");
    goto fail;
  }
  while (p < end) {
    char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) {
      rlk_format(why, whysize, "kernel.meta is truncated (no newline after line %zu)",
                 lineno + 1);
      goto fail;
    }
    *nl = '\0';
    char *line = p;
    p = nl + 1;
    lineno++;
    if (ended) {
      rlk_format(why, whysize, "kernel.meta has data after its end line");
      goto fail;
    }
    if (lineno == 1) {
      if (strcmp(line, "format=" RLK_CACHE_META_FORMAT) != 0) {
        rlk_format(why, whysize, "kernel.meta: first line is not format=%s",
                   RLK_CACHE_META_FORMAT);
        goto fail;
      }
      continue;
    }
    char *eq = strchr(line, '=');
    if (!eq) {
      rlk_format(why, whysize, "kernel.meta line %zu has no '='", lineno);
      goto fail;
    }
    *eq = '\0';
    char *name = line, *value = eq + 1;
    if (unescape(value) != 0) {
      rlk_format(why, whysize, "kernel.meta line %zu: bad escape", lineno);
      goto fail;
    }
    int matched = 0;
    for (int i = 0; i < RLK_KEY_NFIELDS; i++) {
      if (strcmp(name, rlk_key_field_names[i]) != 0) continue;
      if (rlk_key_set_field(&m->key, i, value) != RLK_OK) {
        rlk_format(why, whysize, "kernel.meta: field %s does not parse", name);
        goto fail;
      }
      have_fields |= 1u << i;
      matched = 1;
    }
    if (matched) continue;
    if (strcmp(name, "key") == 0) {
      have_key = rlk_format(m->recorded_hex, sizeof m->recorded_hex, "%s", value) >= 0;
    } else if (strcmp(name, "binary") == 0) {
      have_binary = rlk_format(m->binary, sizeof m->binary, "%s", value) >= 0;
    } else if (strcmp(name, "binary_size") == 0) {
      char *e = NULL;
      errno = 0;
      unsigned long long v = strtoull(value, &e, 10);
      have_size = value[0] >= '0' && value[0] <= '9' && *e == '\0' && errno == 0;
      m->binary_size = v;
    } else if (strcmp(name, "binary_sha256") == 0) {
      have_sha = rlk_format(m->binary_sha256, sizeof m->binary_sha256, "%s", value) >= 0;
    } else if (strcmp(name, "lowered.count") == 0) {
      char *e = NULL;
      unsigned long v = strtoul(value, &e, 10);
      if (have_count || *e != '\0' || value[0] < '0' || value[0] > '9' ||
          v > META_MAX_LOWERED) {
        rlk_format(why, whysize, "kernel.meta: bad lowered.count");
        goto fail;
      }
      if (v) {
        m->lowered = calloc(v, sizeof *m->lowered);
        if (!m->lowered) {
          rlk_format(why, whysize, "out of memory");
          goto fail;
        }
      }
      m->nlowered = v;
      have_count = 1;
    } else if (strncmp(name, "lowered.", 8) == 0) {
      char *e = NULL;
      unsigned long i = strtoul(name + 8, &e, 10);
      if (!have_count || *e != '\0' || i >= m->nlowered || m->lowered[i]) {
        rlk_format(why, whysize, "kernel.meta: unexpected %s", name);
        goto fail;
      }
      m->lowered[i] = rlk_strdup(value);
      if (!m->lowered[i]) {
        rlk_format(why, whysize, "out of memory");
        goto fail;
      }
    } else if (strcmp(name, "compile_seconds") == 0) {
      m->compile_seconds = strtod(value, NULL);
    } else if (strcmp(name, "created_by.time") == 0) {
      m->created = strtoll(value, NULL, 10);
    } else if (strcmp(name, "end") == 0) {
      ended = 1;
    }
    /* Other names are informative (log head, host, pid) or from a later writer: ignored. */
  }
  if (!ended) {
    rlk_format(why, whysize, "kernel.meta is truncated (no end line)");
    goto fail;
  }
  if (have_fields != (1u << RLK_KEY_NFIELDS) - 1 || !have_key || !have_binary || !have_size ||
      !have_sha || !have_count) {
    rlk_format(why, whysize, "kernel.meta lacks a required field");
    goto fail;
  }
  for (size_t i = 0; i < m->nlowered; i++)
    if (!m->lowered[i]) {
      rlk_format(why, whysize, "kernel.meta lacks lowered.%zu", i);
      goto fail;
    }
  rlk_key_finish(&m->key);
  return 0;
fail:
  rlk_cache_meta_free(m);
  return -1;
}

/* Why a file of an entry could not be read, from read_file_at's errno. */
static const char *read_problem(int e) {
  return e == EINVAL ? "it is not a regular file (a link, FIFO, device or directory)" : strerror(e);
}

int rlk_cache_read_meta(int dfd, rlk_cache_meta *meta, char *why, size_t whysize) {
  char *text = NULL;
  size_t len = 0;
  memset(meta, 0, sizeof *meta);
  if (read_file_at(dfd, RLK_CACHE_META_NAME, (size_t)16 << 20, &text, &len, NULL) != 0) {
    rlk_format(why, whysize, "cannot read %s: %s", RLK_CACHE_META_NAME, read_problem(errno));
    return -1;
  }
  int rc = rlk_cache_meta_parse(text, len, meta, why, whysize);
  free(text);
  return rc;
}

/* A binary's file name: a plain name in the entry, never one of the entry's own files. */
static int valid_binary_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n >= 64 || s[0] == '.') return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '.' || c == '-' || c == '_'))
      return 0;
  }
  return strcmp(s, RLK_CACHE_META_NAME) != 0 && strcmp(s, RLK_CACHE_LAST_USED_NAME) != 0;
}

#define BINARY_MAX ((size_t)1 << 30)

int rlk_cache_entry_check(int dfd, const char *hash, const rlk_kernel_key *expect, int trusted_only,
                          rlk_cache_meta *meta, void **binary, char *why, size_t whysize) {
  char *text = NULL, *bin = NULL, buf[160];
  const char *bad;
  size_t len = 0, size = 0;
  struct stat st;
  memset(meta, 0, sizeof *meta);
  if (binary) *binary = NULL;
  if (read_file_at(dfd, RLK_CACHE_META_NAME, (size_t)16 << 20, &text, &len, &st) != 0) {
    if (errno == ENOENT)
      rlk_format(why, whysize, "no %s (an uncommitted or damaged entry)", RLK_CACHE_META_NAME);
    else
      rlk_format(why, whysize, "cannot read %s: %s", RLK_CACHE_META_NAME, read_problem(errno));
    return -1;
  }
  if (trusted_only && (bad = rlk_fs_untrusted(&st, buf, sizeof buf)) != NULL) {
    rlk_format(why, whysize, "%s: %s", RLK_CACHE_META_NAME, bad);
    free(text);
    return -1;
  }
  int rc = rlk_cache_meta_parse(text, len, meta, why, whysize);
  free(text);
  if (rc != 0) return -1;

  if (strcmp(meta->key.hex, hash) != 0) {
    rlk_format(why, whysize, "its key fields hash to %.16s..., not to its directory name",
               meta->key.hex);
    goto fail;
  }
  if (strcmp(meta->recorded_hex, hash) != 0) {
    rlk_format(why, whysize, "its recorded key is not its directory name");
    goto fail;
  }
  if (expect) {
    char a[1100], b[1100];
    for (int i = 0; i < RLK_KEY_NFIELDS; i++) {
      rlk_key_field(&meta->key, i, a, sizeof a);
      rlk_key_field(expect, i, b, sizeof b);
      if (strcmp(a, b) != 0) {
        rlk_format(why, whysize, "field %s is '%.60s', expected '%.60s'",
                   rlk_key_field_names[i], a, b);
        goto fail;
      }
    }
  }
  if (!valid_binary_name(meta->binary)) {
    rlk_format(why, whysize, "bad binary name '%.64s'", meta->binary);
    goto fail;
  }
  if (meta->binary_size > BINARY_MAX) {
    rlk_format(why, whysize, "recorded binary size %llu is implausible",
               (unsigned long long)meta->binary_size);
    goto fail;
  }
  if (read_file_at(dfd, meta->binary, BINARY_MAX, &bin, &size, &st) != 0) {
    rlk_format(why, whysize, "cannot read %s: %s", meta->binary, read_problem(errno));
    goto fail;
  }
  if (trusted_only && (bad = rlk_fs_untrusted(&st, buf, sizeof buf)) != NULL) {
    rlk_format(why, whysize, "%s: %s", meta->binary, bad);
    goto fail;
  }
  if ((uint64_t)size != meta->binary_size) {
    rlk_format(why, whysize, "%s has %zu bytes, %llu recorded (truncated or replaced)",
               meta->binary, size, (unsigned long long)meta->binary_size);
    goto fail;
  }
  uint8_t digest[32];
  char hex[65];
  rlk_sha256_digest(bin, size, digest);
  rlk_sha256_hex(digest, hex);
  if (strcmp(hex, meta->binary_sha256) != 0) {
    rlk_format(why, whysize, "%s fails its SHA-256 check", meta->binary);
    goto fail;
  }
  if (binary)
    *binary = bin;
  else
    free(bin);
  return 0;
fail:
  free(bin);
  rlk_cache_meta_free(meta);
  return -1;
}

/* ---------------------------------------------------------------------------------------- */
/* Opening                                                                                  */
/* ---------------------------------------------------------------------------------------- */

int rlk_cache_prepare_root(const char *root, int writable, char *why, size_t whysize) {
  struct stat st;
  char buf[512];
  if (writable && rlk_mkdirs(root, 0700) != 0) {
    rlk_format(why, whysize, "it cannot be created (%s)", strerror(errno));
    return -1;
  }
  int rootfd = rlk_cache_open_tree(root, buf, sizeof buf);
  if (rootfd < 0) {
    if (!writable && errno == ENOENT) return 0; /* nothing to read yet */
    const char *colon = strstr(buf, ": ");
    rlk_format(why, whysize, "%s", colon ? colon + 2 : buf);
    return -1;
  }
  int own = 1;
  if (writable) {
    /* Only this user publishes into its writable tree. */
    if (fstat(rootfd, &st) == 0 && st.st_uid != geteuid()) {
      rlk_format(why, whysize, "it is owned by uid %ld, not by this user (uid %ld)",
                 (long)st.st_uid, (long)geteuid());
      own = 0;
    } else {
      own = rlk_cache_root_is_own(rootfd, 1, why, whysize);
    }
  }
  close(rootfd);
  if (!own) return -1;
  if (!writable) return 0;
  /* Prove it is writable the way publishing writes: a file under <root>/tmp. access() is
   * not enough (root ignores modes; read-only mounts and quotas say nothing to it). */
  char tmp[RLK_CACHE_PATH_MAX], probe[RLK_CACHE_PATH_MAX];
  if (rlk_format(tmp, sizeof tmp, "%s/%s", root, RLK_CACHE_TMP_DIR) < 0 ||
      rlk_format(probe, sizeof probe, "%s/probe-XXXXXX", tmp) < 0) {
    rlk_format(why, whysize, "its path is too long");
    return -1;
  }
  if (ensure_own_subdir(root, RLK_CACHE_TMP_DIR) != 0) {
    rlk_format(why, whysize, "it is not writable (%s)", strerror(errno));
    return -1;
  }
  int fd = mkstemp(probe);
  if (fd < 0) {
    rlk_format(why, whysize, "it is not writable (%s)", strerror(errno));
    return -1;
  }
  close(fd);
  unlink(probe);
  return 0;
}

static rlk_status split_ro_dirs(rlk_cache *c, const char *list) {
  size_t n = 1;
  for (const char *p = list; *p; p++) n += *p == ':';
  c->ro = calloc(n, sizeof *c->ro);
  if (!c->ro) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "kernel cache: out of memory");
  const char *p = list;
  while (*p) {
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    if (len) {
      char *s = malloc(len + 1);
      if (!s) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "kernel cache: out of memory");
      memcpy(s, p, len);
      s[len] = '\0';
      /* A read-only tree may belong to another user (an admin ships it), but one anybody can
       * write to could hold planted code: it is not searched. */
      struct stat st;
      if (stat(s, &st) == 0 && (st.st_mode & S_IWOTH)) {
        rlk_warn("kernel cache: not searching read-only tree %s: it is world-writable, so anyone "
                 "could plant code in it",
                 s);
        free(s);
      } else {
        c->ro[c->nro++] = s;
      }
    }
    p += len;
    if (*p == ':') p++;
  }
  return RLK_OK;
}

rlk_status rlk_cache_open(const rlk_cache_config *cfg, rlk_cache **out) {
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache: out is NULL");
  *out = NULL;
  if (!cfg) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache: config is NULL");
  if ((int)cfg->mode < RLK_CACHE_MODE_RW || (int)cfg->mode > RLK_CACHE_MODE_OFF)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache: mode %d is not a mode",
                     (int)cfg->mode);
  if (!memchr(cfg->root, '\0', sizeof cfg->root) ||
      !memchr(cfg->ro_dirs, '\0', sizeof cfg->ro_dirs) ||
      !memchr(cfg->lock_dir, '\0', sizeof cfg->lock_dir))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache: unterminated path in config");
  if (!(cfg->lock_timeout_s >= 0))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache: negative lock timeout");

  rlk_cache *c = calloc(1, sizeof *c);
  if (!c) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "kernel cache: out of memory");
  pthread_mutex_init(&c->refused_lock, NULL);
  c->cfg = *cfg;
  c->mode = cfg->mode;
  if (c->mode != RLK_CACHE_MODE_OFF) {
    rlk_status st = split_ro_dirs(c, cfg->ro_dirs);
    if (st != RLK_OK) {
      rlk_cache_close(c);
      return st;
    }
  }
  if (c->mode == RLK_CACHE_MODE_RW || c->mode == RLK_CACHE_MODE_RO) {
    int writable = c->mode == RLK_CACHE_MODE_RW;
    char why[512];
    if (!cfg->root[0]) {
      rlk_warn("kernel cache: no cache directory (HOME is not set); compiled kernels stay in "
               "memory. Set RLK_CACHE_DIR to keep them.");
      c->mode = RLK_CACHE_MODE_MEMORY;
    } else if (rlk_cache_prepare_root(cfg->root, writable, why, sizeof why) != 0) {
      rlk_warn("kernel cache: not using %s: %s; compiled kernels stay in memory. Set "
               "RLK_CACHE_DIR to a private writable directory (or RLK_CACHE_MODE=memory to "
               "silence this).",
               cfg->root, why);
      c->mode = RLK_CACHE_MODE_MEMORY;
    } else {
      rlk_format(c->read_root, sizeof c->read_root, "%s", cfg->root);
      if (writable) {
        rlk_format(c->root, sizeof c->root, "%s", cfg->root);
        rlk_cache_sweep(c->root);
      }
    }
  }
  *out = c;
  return RLK_OK;
}

void rlk_cache_close(rlk_cache *cache) {
  if (!cache) return;
  for (size_t i = 0; i < cache->nro; i++) free(cache->ro[i]);
  free(cache->ro);
  for (size_t i = 0; i < cache->nrefused; i++) free(cache->refused[i]);
  free(cache->refused);
  pthread_mutex_destroy(&cache->refused_lock);
  free(cache);
}

const char *rlk_cache_root(const rlk_cache *cache) {
  return cache && cache->mode == RLK_CACHE_MODE_RW ? cache->root : "";
}

rlk_cache_mode rlk_cache_effective_mode(const rlk_cache *cache) {
  return cache ? cache->mode : RLK_CACHE_MODE_OFF;
}

void rlk_cache_blob_free(rlk_cache_blob *blob) {
  if (!blob) return;
  free(blob->binary);
  for (size_t i = 0; i < blob->nnames; i++) free(blob->lowered_names[i]);
  free(blob->lowered_names);
  memset(blob, 0, sizeof *blob);
}

/* ---------------------------------------------------------------------------------------- */
/* Lookup                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* A finished copy of the caller's key: the hash always matches the fields. */
static void finished_key(const rlk_kernel_key *key, rlk_kernel_key *k) {
  *k = *key;
  rlk_key_finish(k);
}

static void touch_last_used(int dfd) {
  struct stat st;
  int64_t now = rlk_unix_time();
  if (fstatat(dfd, RLK_CACHE_LAST_USED_NAME, &st, 0) == 0) {
    if (now - (int64_t)st.st_mtime < RLK_CACHE_TOUCH_INTERVAL) return;
    utimensat(dfd, RLK_CACHE_LAST_USED_NAME, NULL, 0);
    return;
  }
  int fd = openat(dfd, RLK_CACHE_LAST_USED_NAME, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
                  0644);
  if (fd >= 0) close(fd);
}

static int is_refused(rlk_cache *c, const char *path) {
  int hit = 0;
  pthread_mutex_lock(&c->refused_lock);
  for (size_t i = 0; i < c->nrefused && !hit; i++) hit = strcmp(c->refused[i], path) == 0;
  pthread_mutex_unlock(&c->refused_lock);
  return hit;
}

/* Remembers a path passed over; 1 if it is new (the caller then warns), 0 if known. */
static int refuse(rlk_cache *c, const char *path) {
  int added = 0;
  pthread_mutex_lock(&c->refused_lock);
  int known = 0;
  for (size_t i = 0; i < c->nrefused && !known; i++) known = strcmp(c->refused[i], path) == 0;
  if (!known) {
    if (c->nrefused == c->refused_cap) {
      size_t cap = c->refused_cap ? 2 * c->refused_cap : 8;
      char **v = realloc(c->refused, cap * sizeof *v);
      if (v) {
        c->refused = v;
        c->refused_cap = cap;
      }
    }
    char *copy = c->nrefused < c->refused_cap ? rlk_strdup(path) : NULL;
    if (copy) c->refused[c->nrefused++] = copy;
    added = 1; /* warn even when it could not be remembered */
  }
  pthread_mutex_unlock(&c->refused_lock);
  return added;
}

/* Opens the entry directory of key k in a tree, checking every directory on the way (none a
 * link below the root, each trusted). dfd, or -1: missing (errno ENOENT), or refused with
 * the reason in why (errno EPERM for an untrusted directory, ENOTDIR for debris in the way). */
static int open_entry(const char *tree, const rlk_kernel_key *k, char *why, size_t whysize) {
  char path[RLK_CACHE_PATH_MAX];
  if (rlk_cache_entry_path("", k, path, sizeof path) != 0) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int fd = rlk_cache_open_tree(tree, why, whysize);
  if (fd < 0) return -1;
  /* path is "/v<n>/<compiler>/<target>/<family>/<hh>/<hash>" */
  char *part = path + 1;
  while (part && *part) {
    char *slash = strchr(part, '/');
    if (slash) *slash = '\0';
    int next = rlk_cache_open_dir_at(fd, part, part, why, whysize);
    int e = errno;
    close(fd);
    if (next < 0) {
      errno = e;
      return -1;
    }
    fd = next;
    part = slash ? slash + 1 : NULL;
  }
  return fd;
}

/* 1 hit, 0 miss (including a bad entry, which is then dealt with). */
static int lookup_tree(rlk_cache *c, const char *tree, int writable, const rlk_kernel_key *k,
                       rlk_cache_blob *out, int *rebuilt) {
  char path[RLK_CACHE_PATH_MAX], why[512];
  if (rlk_cache_entry_path(tree, k, path, sizeof path) != 0) return 0;
  if (!writable && is_refused(c, path)) return 0;
  int dfd = open_entry(tree, k, why, sizeof why);
  if (dfd < 0) {
    if (errno == EPERM) {
      /* Someone else could have written there: nothing below is read, in any tree. */
      if (refuse(c, path))
        rlk_warn("kernel cache: not reading %s: %s; the kernel will be %s", path, why,
                 writable ? "compiled and kept in memory" : "looked up elsewhere or rebuilt");
    } else if (errno == ENOTDIR) {
      /* A file or a link where the entry or a directory above it belongs: debris. The writable
       * tree's is replaced when the rebuilt kernel is published. */
      if (rebuilt) (*rebuilt)++;
      if (refuse(c, path))
        rlk_warn("kernel cache: %s: %s; the kernel will be %s", path, why,
                 writable ? "rebuilt and the debris replaced" : "looked up elsewhere or rebuilt");
    } else if (errno != ENOENT) {
      rlk_debug("kernel cache: cannot open %s: %s", path, why);
    }
    return 0;
  }
  struct stat seen;
  if (fstat(dfd, &seen) != 0) {
    close(dfd);
    return 0;
  }
  rlk_cache_meta meta;
  void *binary = NULL;
  if (rlk_cache_entry_check(dfd, k->hex, k, 1, &meta, &binary, why, sizeof why) != 0) {
    close(dfd);
    if (!writable) {
      if (refuse(c, path)) {
        if (rebuilt) (*rebuilt)++;
        rlk_warn("kernel cache: skipping %s in a read-only tree: %s; the kernel will be "
                 "looked up elsewhere or rebuilt",
                 path, why);
      }
      return 0;
    }
    if (rebuilt) (*rebuilt)++;
    /* Quarantine only the directory that was read: if it was replaced meanwhile (a writer
     * renamed a fresh entry in), the new one is left alone. */
    struct stat now;
    if (stat(path, &now) == 0 && now.st_dev == seen.st_dev && now.st_ino == seen.st_ino) {
      int gone = rlk_cache_quarantine_path(c->root, path) == 0;
      rlk_warn("kernel cache: %s %s: %s; the kernel will be rebuilt",
               gone ? "quarantined" : "cannot remove damaged entry", path, why);
    } else {
      rlk_debug("kernel cache: %s changed while read (%s); not quarantined", path, why);
    }
    return 0;
  }
  if (writable) touch_last_used(dfd);
  close(dfd);
  out->binary = binary;
  out->size = (size_t)meta.binary_size;
  out->lowered_names = meta.lowered;
  out->nnames = meta.nlowered;
  meta.lowered = NULL;
  meta.nlowered = 0;
  rlk_cache_meta_free(&meta);
  rlk_format(out->path, sizeof out->path, "%s", path);
  out->read_only = !writable;
  return 1;
}

rlk_status rlk_cache_lookup(rlk_cache *cache, const rlk_kernel_key *key, rlk_cache_blob *out,
                            int *found, int *rebuilt) {
  if (!cache || !key || !out || !found)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache lookup: NULL argument");
  memset(out, 0, sizeof *out);
  *found = 0;
  if (cache->mode == RLK_CACHE_MODE_OFF) return RLK_OK;
  rlk_kernel_key k;
  finished_key(key, &k);
  for (size_t i = 0; i < cache->nro; i++)
    if (lookup_tree(cache, cache->ro[i], 0, &k, out, rebuilt)) {
      *found = 1;
      return RLK_OK;
    }
  if (cache->read_root[0] && cache->mode != RLK_CACHE_MODE_MEMORY) {
    int writable = cache->mode == RLK_CACHE_MODE_RW;
    if (lookup_tree(cache, cache->read_root, writable, &k, out, rebuilt)) *found = 1;
  }
  return RLK_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Publishing                                                                               */
/* ---------------------------------------------------------------------------------------- */

static void build_meta(strbuf *b, const rlk_kernel_key *k, const char *binary_name,
                       const void *binary, size_t size, char *const *names, size_t nnames,
                       const rlk_cache_publish_info *info) {
  char text[1100];
  uint8_t digest[32];
  char hex[65], host[256] = "";
  sb_puts(b, "format=" RLK_CACHE_META_FORMAT "\n");
  for (int i = 0; i < RLK_KEY_NFIELDS; i++) {
    rlk_key_field(k, i, text, sizeof text);
    sb_field(b, rlk_key_field_names[i], text);
  }
  sb_field(b, "key", k->hex);
  sb_field(b, "binary", binary_name);
  sb_fmt(b, "binary_size", "%zu", size);
  rlk_sha256_digest(binary, size, digest);
  rlk_sha256_hex(digest, hex);
  sb_field(b, "binary_sha256", hex);
  sb_fmt(b, "lowered.count", "%zu", nnames);
  for (size_t i = 0; i < nnames; i++) {
    char name[32];
    snprintf(name, sizeof name, "lowered.%zu", i);
    sb_field(b, name, names[i] ? names[i] : "");
  }
  sb_fmt(b, "compile_seconds", "%.6f", info ? info->compile_seconds : 0.0);
  if (info && info->log && info->log[0]) {
    size_t n = strlen(info->log);
    sb_fmt(b, "log_bytes", "%zu", n);
    sb_puts(b, "log_head=");
    sb_escaped(b, info->log, n < RLK_CACHE_LOG_HEAD ? n : RLK_CACHE_LOG_HEAD);
    sb_puts(b, "\n");
  }
  if (gethostname(host, sizeof host) != 0) host[0] = '\0';
  host[sizeof host - 1] = '\0';
  sb_field(b, "created_by.host", host);
  sb_fmt(b, "created_by.pid", "%ld", (long)getpid());
  sb_fmt(b, "created_by.time", "%lld", (long long)rlk_unix_time());
  sb_puts(b, "end=1\n");
}

/* 1 if `path` is a trusted entry directory (not a link) holding its commit marker. */
static int committed_entry(const char *path) {
  char why[256];
  int fd = rlk_cache_open_dir_at(AT_FDCWD, path, path, why, sizeof why);
  if (fd < 0) return 0;
  struct stat st;
  int ok = fstatat(fd, RLK_CACHE_META_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
           !rlk_fs_untrusted(&st, why, sizeof why);
  close(fd);
  return ok;
}

/* Makes <root>/v<n>/<compiler>/<target>/<family>/<hh> a chain of trusted directories, repairing
 * what is in the way: a file or link (removed, never followed), a directory of this user that
 * others may write to (made private), or one this user does not own (moved out of the tree).
 * 0 or -1 with errno. */
static int make_parent(const char *root, const rlk_kernel_key *k) {
  char rel[RLK_CACHE_PATH_MAX], why[256];
  if (rlk_cache_entry_path("", k, rel, sizeof rel) != 0) {
    errno = ENAMETOOLONG;
    return -1;
  }
  *strrchr(rel, '/') = '\0'; /* the parent of the entry */
  int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t done = 0; /* bytes of rel walked */
  char *part = rel + 1;
  while (part && *part) {
    char *slash = strchr(part, '/');
    if (slash) *slash = '\0';
    int next = -1;
    for (int attempt = 0; attempt < 3 && next < 0; attempt++) {
      if (mkdirat(fd, part, 0755) != 0 && errno != EEXIST) break;
      next = rlk_cache_open_dir_at(fd, part, part, why, sizeof why);
      if (next >= 0) break;
      if (errno == ENOTDIR) {
        unlinkat(fd, part, 0);
        continue;
      }
      if (errno != EPERM) break;
      struct stat st;
      if (fstatat(fd, part, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_uid == geteuid()) {
        int dir = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dir >= 0) {
          fchmod(dir, st.st_mode & 07755);
          close(dir);
        }
        continue;
      }
      char path[RLK_CACHE_PATH_MAX];
      if (rlk_format(path, sizeof path, "%s%.*s/%s", root, (int)done, rel, part) < 0) break;
      rlk_warn("kernel cache: moving %s out of the tree: %s", path, why);
      rlk_cache_retire(root, path);
    }
    close(fd);
    if (next < 0) {
      if (errno == 0) errno = EPERM;
      return -1;
    }
    fd = next;
    done = (size_t)(part - rel) + strlen(part);
    if (slash) *slash = '/';
    part = slash ? slash + 1 : NULL;
  }
  close(fd);
  return 0;
}

rlk_status rlk_cache_publish(rlk_cache *cache, const rlk_kernel_key *key, const void *binary,
                             size_t size, char *const *lowered_names, size_t nnames,
                             const rlk_cache_publish_info *info) {
  if (!cache || !key || (!binary && size) || (!lowered_names && nnames))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache publish: NULL argument");
  const char *binary_name = info && info->binary_name ? info->binary_name : "kernel.bin";
  if (!valid_binary_name(binary_name))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "kernel cache publish: '%.64s' is not a valid binary file name",
                     binary_name);
  if (size > BINARY_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache publish: %zu-byte binary", size);
  if (cache->mode != RLK_CACHE_MODE_RW) return RLK_OK;

  rlk_kernel_key k;
  finished_key(key, &k);
  char final[RLK_CACHE_PATH_MAX], parent[RLK_CACHE_PATH_MAX], stage[RLK_CACHE_PATH_MAX];
  char entry[RLK_CACHE_PATH_MAX];
  if (rlk_cache_entry_path(cache->root, &k, final, sizeof final) != 0)
    return rlk_error(RLK_ERR_IO, "kernel cache publish: entry path too long under %s",
                     cache->root);
  memcpy(parent, final, sizeof parent);
  *strrchr(parent, '/') = '\0';

  strbuf meta = {0};
  build_meta(&meta, &k, binary_name, binary ? binary : "", size, lowered_names, nnames, info);
  if (meta.oom) {
    free(meta.p);
    return rlk_error(RLK_ERR_OUT_OF_MEMORY, "kernel cache publish: out of memory");
  }

  const char *step = "create staging directory";
  int dfd = -1, staged = 0;
  if (make_staging(cache->root, stage, sizeof stage) != 0) goto io_fail;
  staged = 1;
  /* The entry is built in a subdirectory: the 0700 staging dir keeps it private while it is
   * incomplete, and the entry itself gets ordinary permissions under the user's umask. */
  if (rlk_format(entry, sizeof entry, "%s/e", stage) < 0) {
    errno = ENAMETOOLONG;
    goto io_fail;
  }
  step = "create entry directory";
  if (mkdir(entry, 0755) != 0) goto io_fail;
  dfd = open(entry, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) goto io_fail;
  step = "write the binary";
  if (write_file_at(dfd, binary_name, binary ? binary : "", size) != 0) goto io_fail;
  step = "write last_used";
  if (write_file_at(dfd, RLK_CACHE_LAST_USED_NAME, "", 0) != 0) goto io_fail;
  step = "write kernel.meta";
  if (write_file_at(dfd, RLK_CACHE_META_NAME, meta.p, meta.len) != 0) goto io_fail;
  step = "sync the entry";
  if (fsync(dfd) != 0 && errno != EINVAL) goto io_fail;
  close(dfd);
  dfd = -1;
  step = "create the entry's parent";
  if (make_parent(cache->root, &k) != 0) goto io_fail;

  step = "rename the entry into place";
  for (int attempt = 0;; attempt++) {
    if (rename(entry, final) == 0) {
      rlk_fsync_dir(parent);
      rlk_debug("kernel cache: published %s", final);
      break;
    }
    int e = errno;
    if (attempt > 1 || (e != EEXIST && e != ENOTEMPTY && e != ENOTDIR && e != EISDIR)) {
      errno = e;
      goto io_fail;
    }
    if (e == ENOTDIR) {
      /* A file or a link where the entry belongs: debris (removing a link never touches what
       * it points to). */
      unlink(final);
      continue;
    }
    if (committed_entry(final)) {
      /* Another writer committed the same key first: its bytes are as good as ours. */
      rlk_debug("kernel cache: %s was published by another process", final);
      break;
    }
    /* A directory without its commit marker, or one this process must not trust, is debris;
     * move it and try again. */
    rlk_cache_quarantine_path(cache->root, final);
  }
  rlk_cache_rmtree(stage);
  free(meta.p);

  if (cache->cfg.max_bytes > 0) {
    /* Entries used or published in the last RLK_CACHE_PUBLISH_GRACE seconds are spared
     * (besides the one just published, which is never evicted here): other processes may be
     * between looking an entry up and reading it, and a cap smaller than the working set
     * would otherwise have concurrent writers evict each other's fresh kernels in turn. The
     * cap may therefore be exceeded for up to a minute; rlk-cache prune enforces it exactly. */
    uint64_t n = 0, bytes = 0;
    if (rlk_cache_evict_keep(cache->root, cache->cfg.max_bytes, RLK_CACHE_PUBLISH_GRACE, final,
                             &n, &bytes) != RLK_OK)
      rlk_warn("kernel cache: eviction under %s failed: %s", cache->root, rlk_last_error());
    else if (n)
      rlk_debug("kernel cache: evicted %llu entries (%llu bytes)", (unsigned long long)n,
                (unsigned long long)bytes);
  }
  return RLK_OK;

io_fail: {
  int e = errno;
  if (dfd >= 0) close(dfd);
  if (staged) rlk_cache_rmtree(stage);
  free(meta.p);
  return rlk_error(RLK_ERR_IO, "kernel cache: publishing %s: cannot %s: %s", final, step,
                   strerror(e));
}
}

rlk_status rlk_cache_quarantine(rlk_cache *cache, const char *entry_path) {
  if (!cache || !entry_path)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache quarantine: NULL argument");
  size_t n = strlen(cache->root);
  if (cache->mode != RLK_CACHE_MODE_RW || n == 0 || strncmp(entry_path, cache->root, n) != 0 ||
      entry_path[n] != '/') {
    /* Not in the writable tree: a read-only entry is left alone, and passed over from now on. */
    refuse(cache, entry_path);
    return RLK_OK;
  }
  const char *slash = strrchr(entry_path, '/');
  if (!slash || !rlk_cache_is_hash(slash + 1))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache quarantine: %s is not an entry",
                     entry_path);
  if (rlk_cache_quarantine_path(cache->root, entry_path) != 0)
    return rlk_error(RLK_ERR_IO, "kernel cache: cannot move %s out of the way: %s", entry_path,
                     strerror(errno));
  /* The caller knows why (the backend refused it) and says so; one warning is enough. */
  rlk_debug("kernel cache: quarantined %s", entry_path);
  return RLK_OK;
}

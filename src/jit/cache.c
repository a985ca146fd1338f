/* cache.c - the kernel cache as a context opens it (docs/cache.md): configuration, opening,
 * lookup and publishing. The store's other files: cache_entry.c (an entry's format and check),
 * cache_tree.c (changing a tree's files), cache_scan.c (its entries, eviction), cache_trust.c
 * (what it trusts), cache_lock.c (the per-key lock). The administration of a whole tree (walk,
 * verify, prune, clear) sits above the store, in runtime/cache_admin.c.
 *
 * Entries appear and disappear only by rename() of the whole directory, so a reader sees a
 * complete entry or none; every read is still checked, since disks, copies and people are not. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
  cfg->lock_timeout_s = RLK_DEFAULT_LOCK_TIMEOUT_S;

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

  return rlk_env_lock_timeout(&cfg->lock_timeout_s);
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
    if (rlk_fd_descend(&fd, rlk_cache_open_dir_at(fd, part, part, why, whysize))) return -1;
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
  if (!rlk_cache_valid_binary_name(binary_name))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "kernel cache publish: '%.64s' is not a valid binary file name",
                     binary_name);
  if (size > RLK_CACHE_BINARY_MAX)
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

  size_t meta_len = 0;
  char *meta = rlk_cache_meta_text(&k, binary_name, binary ? binary : "", size, lowered_names, nnames, info,
                                   &meta_len);
  if (!meta) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "kernel cache publish: out of memory");

  const char *step = "create staging directory";
  int dfd = -1, staged = 0;
  if (rlk_cache_make_staging(cache->root, stage, sizeof stage) != 0) goto io_fail;
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
  if (rlk_cache_write_file_at(dfd, binary_name, binary ? binary : "", size) != 0) goto io_fail;
  step = "write last_used";
  if (rlk_cache_write_file_at(dfd, RLK_CACHE_LAST_USED_NAME, "", 0) != 0) goto io_fail;
  step = "write kernel.meta";
  if (rlk_cache_write_file_at(dfd, RLK_CACHE_META_NAME, meta, meta_len) != 0) goto io_fail;
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
  free(meta);

  if (cache->cfg.max_bytes > 0) {
    /* Entries used or published in the last RLK_CACHE_PUBLISH_GRACE seconds are spared
     * (besides the one just published, which is never evicted here): other processes may be
     * between looking an entry up and reading it, and a cap smaller than the working set
     * would otherwise have concurrent writers evict each other's fresh kernels in turn. The
     * cap may therefore be exceeded for up to a minute; rlk-cache prune enforces it exactly. */
    uint64_t n = 0, bytes = 0, failed = 0;
    if (rlk_cache_evict_tree(cache->root, cache->cfg.max_bytes, 0, RLK_CACHE_PUBLISH_GRACE, final, &n, &bytes,
                             &failed) != RLK_OK)
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
  free(meta);
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

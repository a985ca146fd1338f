/* cache_tree.c - changing the files of a cache tree safely: removing without following links,
 * staging directories, taking an entry out whole (retired or quarantined), sweeping the cache's
 * own debris, and preparing a root. These take a root path, so the open cache and the admin calls
 * above it share them; nothing here removes a name the cache did not create. */
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
#include "core/fs.h"
#include "jit/cache_internal.h"

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

int rlk_cache_make_staging(const char *root, char *buf, size_t size) {
  char tmp[RLK_CACHE_PATH_MAX], host[64] = "host";
  if (rlk_format(tmp, sizeof tmp, "%s/%s", root, RLK_CACHE_TMP_DIR) < 0) {
    errno = ENAMETOOLONG;
    return -1;
  }
  if (ensure_own_subdir(root, RLK_CACHE_TMP_DIR) != 0) return -1;
  if (gethostname(host, sizeof host) != 0) strcpy(host, "host");
  host[sizeof host - 1] = '\0';
  char clean[33];
  rlk_cache_name_component(clean, sizeof clean, host);
  if (rlk_format(buf, size, "%s/%s-%ld-XXXXXX", tmp, clean, (long)getpid()) < 0) {
    errno = ENAMETOOLONG;
    return -1;
  }
  return mkdtemp(buf) ? 0 : -1;
}

int rlk_cache_retire(const char *root, const char *entry_path) {
  char stage[RLK_CACHE_PATH_MAX], moved[RLK_CACHE_PATH_MAX];
  if (rlk_cache_make_staging(root, stage, sizeof stage) == 0 &&
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

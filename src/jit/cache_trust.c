/* cache_trust.c - what the kernel cache trusts, and how it moves through a tree without being
 * led outside it.
 *
 * A cache tree holds code this process will run, so everything on the way from a tree's root
 * to an entry, and the entry's files, must be out of reach of other users: owned by this user
 * or root, writable by nobody else, and never a symbolic link below the root. A writable root
 * also carries a marker file: the runtime deletes things in its own tree (staging debris,
 * quarantined entries, evicted entries), and the marker is how it knows a directory is its own
 * and not, say, a home directory that RLK_CACHE_DIR was pointed at. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "core/fs.h"
#include "jit/cache_internal.h"

/* CACHEDIR.TAG (bford.info/cachedir): backup tools skip the tree; the second line says whose. */
#define MARKER_SIGNATURE "Signature: 8a477f597d28d172789f06886806bc55"
#define MARKER_TEXT MARKER_SIGNATURE "\n# This directory is an rlk kernel cache (" RLK_CACHE_MARKER_ID ").\n"

/* fd when the directory open as fd is trusted; else closes it, says why and returns -1 (EPERM). */
static int trusted_or_closed(int fd, const char *shown, char *why, size_t whysize) {
  struct stat st;
  char buf[160];
  const char *bad = fstat(fd, &st) != 0 ? "it cannot be read" : rlk_fs_untrusted(&st, buf, sizeof buf);
  if (!bad) return fd;
  rlk_format(why, whysize, "%s: %s", shown, bad);
  close(fd);
  errno = EPERM;
  return -1;
}

int rlk_cache_open_tree(const char *root, char *why, size_t whysize) {
  int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    rlk_format(why, whysize, "%s cannot be opened (%s)", root, strerror(e));
    errno = e;
    return -1;
  }
  return trusted_or_closed(fd, root, why, whysize);
}

int rlk_cache_open_dir_at(int parent, const char *name, const char *shown, char *why, size_t whysize) {
  int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    /* O_NOFOLLOW on a link gives ELOOP; with O_DIRECTORY some kernels say ENOTDIR. */
    if (e == ELOOP) e = ENOTDIR;
    rlk_format(why, whysize, "%s: %s", shown,
               e == ENOTDIR ? "not a directory (a file or a link is in the way)" : strerror(e));
    errno = e;
    return -1;
  }
  return trusted_or_closed(fd, shown, why, whysize);
}

/* ---- the marker ------------------------------------------------------------------------- */

/* Names the runtime itself puts at a root: v<n>, tmp, quarantine, the marker, the tuning
 * database and its companions (tune.db, tune.db.pending, tune.db.lock, tune.db.bad-<time>...). */
static int is_own_root_name(const char *s) {
  if (s[0] == 'v' && s[1]) {
    const char *p = s + 1;
    while (*p >= '0' && *p <= '9') p++;
    if (!*p) return 1;
  }
  return strcmp(s, RLK_CACHE_TMP_DIR) == 0 || strcmp(s, RLK_CACHE_QUARANTINE_DIR) == 0 ||
         strcmp(s, RLK_CACHE_MARKER_NAME) == 0 || strncmp(s, "tune.db", 7) == 0;
}

/* The first name in the directory open as rootfd, past "." and ".." and those `skip` passes,
 * goes to `name` (when given): 1 if there is one, 0 if none, -1 if the directory cannot be read. */
static int first_name_but(int rootfd, int (*skip)(const char *), char *name, size_t size) {
  int fd = dup(rootfd);
  if (fd < 0) return -1;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -1;
  }
  rewinddir(d);
  int found = 0;
  struct dirent *de;
  while (!found && (de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 || (skip && skip(de->d_name))) continue;
    if (name) rlk_format(name, size, "%s", de->d_name);
    found = 1;
  }
  closedir(d);
  return found;
}

/* The tuning database's names (tune.db and its companions): rlk-tune and the tuning table may
 * write them at a root before the first kernel does. */
static int is_tuning_name(const char *s) { return strncmp(s, "tune.db", 7) == 0; }

/* 1 if the directory open as rootfd holds no name at all but the tuning database's. */
static int is_empty(int rootfd) { return first_name_but(rootfd, is_tuning_name, NULL, 0) == 0; }

/* 1 the root carries the marker, 0 it does not, -1 a marker file made in the last seconds whose
 * text is not (yet) the marker's. */
static int read_marker(int rootfd) {
  int fd = rlk_open_regular(rootfd, RLK_CACHE_MARKER_NAME, O_RDONLY | O_NOFOLLOW, 0);
  if (fd < 0) return errno == ENOENT ? 0 : -1;
  char buf[256];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  struct stat st;
  const int fresh = fstat(fd, &st) == 0 && rlk_unix_time() - (int64_t)st.st_mtime < 2;
  close(fd);
  buf[n > 0 ? n : 0] = '\0';
  if (strncmp(buf, MARKER_SIGNATURE "\n", sizeof MARKER_SIGNATURE) == 0 &&
      strstr(buf, "(" RLK_CACHE_MARKER_ID ")") != NULL)
    return 1;
  return fresh ? -1 : 0; /* an old one with other text is another tool's, or debris */
}

/* A marker another process has just created may not hold its text yet (it is written right after
 * the create): an unfinished one is read again for a little while. */
static int has_marker(int rootfd) {
  for (int i = 0; i < 50; i++) {
    int m = read_marker(rootfd);
    if (m >= 0) return m;
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return 0;
}

/* 1 if every name in the directory is one the runtime creates (an empty directory too). The
 * first stranger's name goes to `stranger`. */
static int only_own_names(int rootfd, char *stranger, size_t size) {
  return first_name_but(rootfd, is_own_root_name, stranger, size) == 0;
}

int rlk_cache_root_is_own(int rootfd, int claim, char *why, size_t whysize) {
  if (has_marker(rootfd)) return 1;
  char stranger[256] = "";
  if (!only_own_names(rootfd, stranger, sizeof stranger)) {
    rlk_format(why, whysize,
               "it has no %s marker and holds '%.200s', which the kernel cache never creates, so "
               "it is not a kernel cache (nothing in it is deleted; point the cache at a directory "
               "of its own)",
               RLK_CACHE_MARKER_NAME, stranger);
    return 0;
  }
  /* Not empty and no marker when first looked at: another process may have marked it since. */
  if (!is_empty(rootfd) && !has_marker(rootfd)) {
    /* Names that look like the cache's are not proof: a user's own directory may hold a tmp/
     * or a v1/. Only a root the cache created (and marked then) is its own. */
    rlk_format(why, whysize,
               "it has no %s marker, so the kernel cache did not create it, although its names look "
               "like a cache's (nothing in it is deleted or written; to use it as a cache, empty it "
               "or point the cache at a new directory)",
               RLK_CACHE_MARKER_NAME);
    return 0;
  }
  /* Empty (but for a tuning database): a root the cache is about to use (it has just created
   * it, or was pointed at an empty directory). With `claim`, it is marked as the cache's own; a
   * marker that cannot be written leaves it unused (used unmarked, the entries written into it
   * would make it a stranger's to every later process). */
  if (claim) {
    int fd = openat(rootfd, RLK_CACHE_MARKER_NAME,
                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) { /* another process claimed it meanwhile */
      if (has_marker(rootfd)) return 1;
      rlk_format(why, whysize, "its %s marker is not the kernel cache's", RLK_CACHE_MARKER_NAME);
      return 0;
    }
    int rc = fd < 0 ? -1 : rlk_write_all(fd, MARKER_TEXT, sizeof MARKER_TEXT - 1);
    const int e = errno;
    if (fd >= 0) close(fd);
    if (rc != 0) {
      if (fd >= 0) unlinkat(rootfd, RLK_CACHE_MARKER_NAME, 0);
      rlk_format(why, whysize, "its %s marker could not be written (%s)", RLK_CACHE_MARKER_NAME, strerror(e));
      return 0;
    }
  }
  return 1;
}

int rlk_cache_open_own_subdir(int rootfd, const char *name, int create) {
  for (int attempt = 0; attempt < 3; attempt++) { /* remove debris, create, open */
    int fd = openat(rootfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      struct stat st;
      char buf[160];
      if (fstat(fd, &st) == 0 && !rlk_fs_untrusted(&st, buf, sizeof buf)) return fd;
      close(fd);
      errno = EPERM;
      return -1;
    }
    if (!create) return -1;
    if (errno == ENOENT) {
      if (mkdirat(rootfd, name, 0700) != 0 && errno != EEXIST) return -1;
      continue;
    }
    if (errno != ENOTDIR && errno != ELOOP) return -1;
    /* A file or a link stands where the runtime keeps its own directory: debris. Removing
     * the name never touches what a link points to. */
    if (unlinkat(rootfd, name, 0) != 0 && errno != ENOENT) return -1;
    rlk_warn("kernel cache: removed a file or link named '%s' where the cache keeps its directory "
             "of that name",
             name);
  }
  errno = ENOTDIR;
  return -1;
}

/* ---- names the runtime creates ---------------------------------------------------------- */

int rlk_cache_is_hash(const char *s) {
  size_t i = 0;
  for (; s[i]; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return i == 64;
}

static int is_digits(const char *s, size_t n) {
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return 0;
  return 1;
}

int rlk_cache_is_staging_name(const char *s) {
  size_t n = strlen(s);
  if (n == 12 && strncmp(s, "probe-", 6) == 0) return 1;
  if (n < 9 || s[n - 7] != '-') return 0;
  const char *dash = s + n - 7;
  const char *p = dash;
  while (p > s && p[-1] != '-') p--;
  return p > s && is_digits(p, (size_t)(dash - p));
}

int rlk_cache_is_quarantine_name(const char *s) {
  size_t n = strlen(s);
  if (n < 68 || s[64] != '.') return 0;
  char hash[65];
  memcpy(hash, s, 64);
  hash[64] = '\0';
  if (!rlk_cache_is_hash(hash)) return 0;
  const char *t = s + 65, *dot = strchr(t, '.');
  return dot && is_digits(t, (size_t)(dot - t)) && is_digits(dot + 1, strlen(dot + 1));
}

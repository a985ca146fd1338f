/* fs.c - file-system helpers (fs.h). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "core/fs.h"

int rlk_mkdirs(const char *path, mode_t mode) {
  char buf[4096];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(buf, path, n + 1);
  while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
  struct stat st;
  if (stat(buf, &st) == 0) {
    if (S_ISDIR(st.st_mode)) return 0;
    errno = ENOTDIR;
    return -1;
  }
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, mode) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  if (mkdir(buf, mode) != 0) {
    if (errno != EEXIST) return -1;
    /* Lost a race with another creator, or a non-directory is in the way. */
    if (stat(buf, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
      errno = ENOTDIR;
      return -1;
    }
  }
  return 0;
}

const char *rlk_fs_untrusted(const struct stat *st, char *buf, size_t size) {
  const uid_t me = geteuid();
  if (st->st_uid != me && st->st_uid != 0) {
    rlk_format(buf, size, "it is owned by uid %ld, neither this user (uid %ld) nor root",
               (long)st->st_uid, (long)me);
    return buf;
  }
  /* The sticky bit does not help: anyone could still create names in the directory. */
  if (st->st_mode & S_IWOTH) return "it is world-writable";
  /* Group write is trusted only for this user's own group (user-private groups) and root's. */
  if ((st->st_mode & S_IWGRP) && st->st_gid != getegid() && st->st_gid != 0) {
    rlk_format(buf, size, "it is writable by group %ld", (long)st->st_gid);
    return buf;
  }
  return NULL;
}

/* The directory `name` under dirfd as an O_PATH descriptor: never through a link, except one
 * that this user or root owns (a link another user owns could point anywhere). */
static int open_dir_step(int dirfd, const char *name, const char *path, char *why, size_t whysize) {
  int fd = openat(dirfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) return fd;
  int e = errno;
  struct stat st;
  if ((e == ELOOP || e == ENOTDIR) && fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISLNK(st.st_mode)) {
    if (st.st_uid != geteuid() && st.st_uid != 0) {
      rlk_format(why, whysize, "%s: the link '%s' on its way is owned by uid %ld, neither this user nor root",
                 path, name, (long)st.st_uid);
      errno = EPERM;
      return -1;
    }
    fd = openat(dirfd, name, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) return fd;
    e = errno;
  }
  rlk_format(why, whysize, "%s: %s", path, strerror(e));
  errno = e;
  return -1;
}

int rlk_open_owned_file(const char *path, mode_t mode, char *why, size_t whysize) {
  char buf[4096];
  if (!path || !path[0] || rlk_format(buf, sizeof buf, "%s", path) < 0) {
    rlk_format(why, whysize, "the path is empty or too long");
    errno = ENAMETOOLONG;
    return -1;
  }
  char *base = strrchr(buf, '/');
  int dirfd = AT_FDCWD;
  if (base) {
    *base++ = '\0';
    dirfd = open(path[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0) {
      rlk_format(why, whysize, "%s: %s", path, strerror(errno));
      return -1;
    }
    char *save = NULL;
    for (char *part = strtok_r(buf, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
      if (rlk_fd_descend(&dirfd, open_dir_step(dirfd, part, path, why, whysize))) return -1;
    }
  } else {
    base = buf;
  }
  int fd = -1, e = 0;
  struct stat st;
  const char *bad = NULL;
  char reason[160];
  if (!base[0] || strcmp(base, ".") == 0 || strcmp(base, "..") == 0) {
    bad = "it names a directory";
    e = EISDIR;
  } else if (fstatat(dirfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
    /* Refused before it is opened: opening a device or a FIFO can itself have effects. */
    bad = S_ISLNK(st.st_mode) ? "it is a symbolic link" : "it is not a regular file";
    e = S_ISLNK(st.st_mode) ? ELOOP : EINVAL;
  } else {
    fd = openat(dirfd, base, O_RDWR | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
                mode);
    if (fd < 0) {
      e = errno;
      bad = e == ELOOP ? "it is a symbolic link" : strerror(e);
    } else if (fstat(fd, &st) != 0) {
      e = errno;
      bad = strerror(e);
    } else if (!S_ISREG(st.st_mode)) {
      bad = "it is not a regular file";
      e = EINVAL;
    } else if ((bad = rlk_fs_untrusted(&st, reason, sizeof reason)) != NULL) {
      e = EPERM;
    } else if (st.st_nlink != 1) {
      rlk_format(reason, sizeof reason, "it has %lu names (a hard link could lead the writes elsewhere)",
                 (unsigned long)st.st_nlink);
      bad = reason;
      e = EPERM;
    }
  }
  if (dirfd != AT_FDCWD) close(dirfd);
  if (!bad) return fd;
  rlk_format(why, whysize, "%s: %s", path, bad);
  if (fd >= 0) close(fd);
  errno = e;
  return -1;
}

int rlk_open_regular(int dirfd, const char *name, int flags, mode_t mode) {
  int fd = openat(dirfd, name, flags | O_NONBLOCK | O_CLOEXEC, mode);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    errno = EINVAL;
    return -1;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

int rlk_fd_descend(int *dirfd, int next) {
  const int e = errno;
  close(*dirfd);
  *dirfd = next;
  errno = e;
  return next < 0 ? -1 : 0;
}

int rlk_write_all(int fd, const void *data, size_t size) {
  const char *p = data;
  while (size) {
    ssize_t n = write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += n;
    size -= (size_t)n;
  }
  return 0;
}

int rlk_fsync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  /* Some file systems refuse fsync on directories (EINVAL); the rename is still atomic. */
  int rc = fsync(fd) == 0 || errno == EINVAL || errno == EROFS ? 0 : -1;
  close(fd);
  return rc;
}

/* 0 taken, 1 held by someone else, -1 error (errno). */
static int try_lock(int fd, int *use_flock) {
  if (!*use_flock) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0) return 0;
    if (errno == EAGAIN || errno == EACCES) return 1;
    if (errno != EINVAL && errno != ENOSYS) return -1;
    *use_flock = 1; /* a kernel or file system without OFD locks */
  }
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
  return errno == EWOULDBLOCK || errno == EAGAIN ? 1 : -1;
}

static void sleep_seconds(double s) {
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int rlk_lock_fd(int fd, int *use_flock, double timeout_s) {
  double start = rlk_now(), delay = 0.001;
  for (;;) {
    int rc = try_lock(fd, use_flock);
    if (rc <= 0) return rc;
    double left = start + timeout_s - rlk_now();
    if (left <= 0) return 1;
    sleep_seconds(delay < left ? delay : left);
    if (delay < 0.05) delay *= 2;
  }
}

void rlk_unlock_fd(int fd, int use_flock) {
  if (use_flock) {
    flock(fd, LOCK_UN);
    return;
  }
  struct flock fl;
  memset(&fl, 0, sizeof fl);
  fl.l_type = F_UNLCK;
  fl.l_whence = SEEK_SET;
  fcntl(fd, F_OFD_SETLK, &fl);
}

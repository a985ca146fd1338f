/* cache_lock.c - the per-key compile lock: at most one process per node compiles a kernel
 * while the others wait for its entry.
 *
 * One file per key in a node-local directory (RLK_LOCK_DIR; /dev/shm is never on NFS, where
 * advisory locks are slow or broken). The files are never unlinked: removing a lock file
 * while another process waits on it would let a third process lock a new inode under the same
 * name and compile concurrently. Open-file-description locks (F_OFD_SETLK) belong to the open
 * file, not the process, so threads of one process exclude each other too and a fork does not
 * silently share them; flock() has the same semantics and is the fallback where OFD locks are
 * missing. Both are released by the kernel when the holder dies, so a crash never wedges a key. */
#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "core/fs.h"
#include "jit/cache.h"
#include "jit/cache_internal.h"

struct rlk_cache_lock {
  int fd;        /* -1: a no-op lock (nothing to coordinate) */
  int use_flock; /* how it was taken */
};

/* Creates and checks the lock directory once per cache. 0 usable, -1 not (warned). */
static int prepare_lock_dir(rlk_cache *c) {
  if (c->lock_state) return c->lock_state > 0 ? 0 : -1;
  const char *dir = c->cfg.lock_dir;
  const char *why = NULL;
  char buf[256];
  struct stat st;
  if (!dir[0]) {
    why = "no lock directory is configured";
  } else if (rlk_mkdirs(dir, 0700) != 0) {
    rlk_format(buf, sizeof buf, "it cannot be created (%s)", strerror(errno));
    why = buf;
  } else if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    why = "it is not a directory";
  } else if (st.st_uid != geteuid()) {
    /* Another user could hold every lock in it, or swap files under us. */
    rlk_format(buf, sizeof buf, "it is owned by uid %ld, not by this user (uid %ld)",
               (long)st.st_uid, (long)geteuid());
    why = buf;
  } else if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)) {
    why = "it is world-writable";
  }
  if (why) {
    rlk_warn("kernel cache: not using lock directory %s: %s; processes on this node may "
             "compile the same kernel concurrently (results stay correct). Set RLK_LOCK_DIR to "
             "a private directory on a local file system.",
             dir[0] ? dir : "(none)", why);
    c->lock_state = -1;
    return -1;
  }
  c->lock_state = 1;
  return 0;
}

/* The lock only saves duplicate compiles (publishing is atomic without it), so a lock that
 * cannot be taken at all (no locks on this file system, a file we may not open) turns locking
 * off for this cache with one warning instead of failing the kernel. */
static void give_up_locking(rlk_cache *c, const char *path, const char *what, int e) {
  int expected = 1;
  if (atomic_compare_exchange_strong(&c->lock_state, &expected, -1))
    rlk_warn("kernel cache: %s %s (%s); continuing without compile locks, so processes on this "
             "node may compile the same kernel concurrently. Set RLK_LOCK_DIR to a local "
             "directory that supports locks.",
             what, path, strerror(e));
}

rlk_status rlk_cache_lock_acquire(rlk_cache *cache, const rlk_kernel_key *key,
                                  rlk_cache_lock **out) {
  if (!cache || !key || !out)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache lock: NULL argument");
  *out = NULL;
  rlk_cache_lock *lock = calloc(1, sizeof *lock);
  if (!lock) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "kernel cache lock: out of memory");
  lock->fd = -1;
  /* Without a writable tree nothing is published, so a waiter would gain nothing. */
  if (rlk_cache_effective_mode(cache) != RLK_CACHE_MODE_RW || prepare_lock_dir(cache) != 0) {
    *out = lock;
    return RLK_OK;
  }

  rlk_kernel_key k = *key;
  rlk_key_finish(&k);
  char path[RLK_CACHE_PATH_MAX];
  if (rlk_format(path, sizeof path, "%s/%s.lock", cache->cfg.lock_dir, k.hex) < 0) {
    free(lock);
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache lock: RLK_LOCK_DIR is too long");
  }
  int fd = rlk_open_regular(AT_FDCWD, path, O_RDWR | O_CREAT | O_NOFOLLOW, 0600);
  if (fd < 0) {
    give_up_locking(cache, path, "cannot open", errno);
    *out = lock;
    return RLK_OK;
  }

  double timeout = cache->cfg.lock_timeout_s, start = rlk_now();
  int rc = rlk_lock_fd(fd, &lock->use_flock, timeout);
  if (rc < 0) {
    give_up_locking(cache, path, "cannot lock", errno);
    close(fd);
    *out = lock;
    return RLK_OK;
  }
  if (rc > 0) {
    close(fd);
    free(lock);
    return rlk_error(RLK_ERR_TIMEOUT,
                     "kernel cache: waited %.1f s for the lock %s: another process on this "
                     "node is compiling the same kernel (or is stuck). Raise "
                     "RLK_LOCK_TIMEOUT_S (now %.1f s) if compiles take that long",
                     rlk_now() - start, path, timeout);
  }
  lock->fd = fd;
  *out = lock;
  return RLK_OK;
}

void rlk_cache_lock_release(rlk_cache_lock *lock) {
  if (!lock) return;
  if (lock->fd >= 0) {
    rlk_unlock_fd(lock->fd, lock->use_flock);
    close(lock->fd);
  }
  free(lock);
}

/* fs.h - file-system helpers shared by the kernel cache and the tuning database: directory
 * creation, complete writes, directory fsync, and advisory file locks. Internal. */
#ifndef RLK_FS_H
#define RLK_FS_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

/* mkdir -p; new directories get `mode` (under the umask). 0, or -1 with errno (ENOTDIR when a
 * non-directory is in the way). */
int rlk_mkdirs(const char *path, mode_t mode);

/* Opens `name` (relative to dirfd, or AT_FDCWD) only if it is a regular file: the open never
 * blocks (a FIFO planted where a file belongs would otherwise hang the caller), and anything
 * else (FIFO, device, socket, directory) is closed again with errno EINVAL. `flags` are open(2)
 * flags (O_CLOEXEC is added; add O_NOFOLLOW to refuse links). The descriptor is blocking again
 * when returned. fd, or -1 with errno. */
int rlk_open_regular(int dirfd, const char *name, int flags, mode_t mode);

/* Why a file or directory described by `st` is not to be trusted with code or with what this
 * process writes: owned by neither this user nor root, world-writable, or writable by a group
 * other than this user's own or root's. NULL when it is trusted; otherwise the reason, which may
 * be formatted into buf. */
const char *rlk_fs_untrusted(const struct stat *st, char *buf, size_t size);

/* Opens the regular file at `path` for appending (O_RDWR | O_APPEND, created with `mode` when
 * missing) the way the runtime opens a file it writes on a user's say-so, so that another user
 * cannot redirect the writes: the last component is never a symbolic link, a link among the
 * directories is followed only when this user or root owns it, and the file must be a regular
 * file with one name (a hard link would redirect the writes) that passes rlk_fs_untrusted. The
 * descriptor is non-blocking. fd, or -1 with errno and the reason in why. */
int rlk_open_owned_file(const char *path, mode_t mode, char *why, size_t whysize);

/* One step of a walk down a chain of directory descriptors: closes *dirfd and puts `next` (the
 * step's result, opened relative to *dirfd) in its place. 0, or -1 when the step failed (next
 * is -1), with the step's errno, not close's. */
int rlk_fd_descend(int *dirfd, int next);

/* Writes all of data, retrying short writes and EINTR. 0, or -1 with errno. */
int rlk_write_all(int fd, const void *data, size_t size);

/* fsyncs a directory so a rename inside it is durable. File systems that refuse (EINVAL,
 * EROFS) count as done: the rename is atomic anyway. 0 or -1 with errno. */
int rlk_fsync_dir(const char *path);

/* Exclusive advisory lock on an open file: an open-file-description lock (F_OFD_SETLK: it
 * belongs to the open file, so threads and forks exclude each other too), or flock() where OFD
 * locks are missing (*use_flock is set then, and must be passed back). Both vanish when the
 * holder dies, so a crash never wedges a lock.
 * Waits at most timeout_s seconds (0: one try). 0 taken, 1 still held by another, -1 error. */
int rlk_lock_fd(int fd, int *use_flock, double timeout_s);
void rlk_unlock_fd(int fd, int use_flock);

#endif

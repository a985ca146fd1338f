/* record.c - RLK_JIT_RECORD=FILE: the canonical configuration line of every op configuration the
 * process ran, appended to FILE once each, so that one short job tells a cluster what to
 * precompile (rlk-precompile --config FILE) before it deploys read-only with RLK_JIT=0.
 *
 * Recording never fails, blocks or slows an op call beyond its first use of a configuration:
 * - FILE is opened the way the runtime opens what it writes on a user's say-so
 *   (rlk_open_owned_file: no link as its last component, a regular file of this user or root
 *   that nobody else may write, one name), created 0600; anything else is refused with one
 *   warning and nothing is recorded.
 * - New lines go to a queue. A call appends the queue only when it gets the file's lock at once:
 *   a lock another process holds (any reader can take one) leaves the lines queued for a later
 *   call (at most two tries a second), and for the process's exit, which waits at most RLK_RECORD_EXIT_WAIT_S for it.
 * - Lines another process already wrote are not written again: under the lock, the part of the
 *   file not yet read is read in blocks and its lines' hashes join the set of known lines
 *   (a file of any size; a replaced or truncated file is read again from its start). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "core/fs.h"
#include "runtime/op.h"
#include "runtime/record.h"
#include "tune/tune_db.h"

#define RLK_RECORD_EXIT_WAIT_S 1.0
#define RLK_RECORD_LINE_MAX 1024
#define RLK_RECORD_RETRY_S 0.5

/* A set of 64-bit line hashes (FNV-1a; 0 marks an empty slot, so a hash of 0 is stored as 1). */
typedef struct hash_set {
  uint64_t *slot;
  size_t cap, n; /* cap a power of two, n < cap / 2 */
} hash_set;

static uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h ? h : 1;
}

static int set_has(const hash_set *s, uint64_t h) {
  if (!s->cap) return 0;
  for (size_t i = h & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
    if (s->slot[i] == h) return 1;
    if (!s->slot[i]) return 0;
  }
}

/* 0, or -1 when out of memory (the set is unchanged then). */
static int set_add(hash_set *s, uint64_t h) {
  if (set_has(s, h)) return 0;
  if (2 * (s->n + 1) >= s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 256;
    uint64_t *slot = calloc(cap, sizeof *slot);
    if (!slot) return -1;
    for (size_t i = 0; i < s->cap; i++) {
      if (!s->slot[i]) continue;
      size_t j = s->slot[i] & (cap - 1);
      while (slot[j]) j = (j + 1) & (cap - 1);
      slot[j] = s->slot[i];
    }
    free(s->slot);
    s->slot = slot;
    s->cap = cap;
  }
  size_t i = h & (s->cap - 1);
  while (s->slot[i]) i = (i + 1) & (s->cap - 1);
  s->slot[i] = h;
  s->n++;
  return 0;
}

static void set_clear(hash_set *s) {
  if (s->slot) memset(s->slot, 0, s->cap * sizeof *s->slot);
  s->n = 0;
}

static pthread_once_t rec_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int rec_on;
static atomic_int rec_queued; /* lines waiting in rec_queue */
static char rec_path[4096];
static hash_set rec_known;       /* lines in the file, written by this process or found there */
static hash_set rec_file_lines;  /* the lines read from the file, up to rec_read */
static dev_t rec_dev;            /* the file rec_file_lines was read from */
static ino_t rec_ino;
static off_t rec_read;           /* bytes of it read: whole lines only */
static char *rec_queue;          /* queued lines, each ending in '\n' */
static size_t rec_queue_len, rec_queue_cap;
static int rec_warned, rec_refused;
static double rec_next_try; /* a busy lock is tried again from this time on */

static void rec_flush_at_exit(void);

static void rec_init(void) {
  const char *p = rlk_env("RLK_JIT_RECORD");
  if (!p) return;
  if (rlk_format(rec_path, sizeof rec_path, "%s", p) < 0) {
    rlk_warn("RLK_JIT_RECORD: the path is too long; nothing is recorded");
    return;
  }
  atomic_store(&rec_on, 1);
}

int rlk_record_enabled(void) {
  pthread_once(&rec_once, rec_init);
  return atomic_load_explicit(&rec_on, memory_order_relaxed);
}

/* Reads the file's lines from rec_read on into rec_file_lines (from 0 when the file is another
 * one than last time, or shorter). Sets *ends_in_newline, and *tail to the hash of a last line
 * without its newline (a writer that died mid-line), 0 when there is none. 0, or -1 (errno). */
static int read_new_lines(int fd, int *ends_in_newline, uint64_t *tail) {
  struct stat st;
  if (fstat(fd, &st) != 0) return -1;
  if (st.st_dev != rec_dev || st.st_ino != rec_ino || st.st_size < rec_read) {
    set_clear(&rec_file_lines);
    rec_dev = st.st_dev;
    rec_ino = st.st_ino;
    rec_read = 0;
  }
  *ends_in_newline = 1;
  *tail = 0;
  if (st.st_size == 0) return 0;
  char last;
  if (pread(fd, &last, 1, st.st_size - 1) == 1) *ends_in_newline = last == '\n';
  /* A line longer than the buffer is no line the runtime writes: it is skipped whole. */
  enum { BLOCK = 1 << 16 };
  char *buf = malloc(BLOCK);
  if (!buf) return -1;
  size_t have = 0;
  int skipping = 0;
  off_t at = rec_read;
  for (;;) {
    ssize_t got = pread(fd, buf + have, BLOCK - have, at);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      free(buf);
      return -1;
    }
    if (got == 0) break;
    at += got;
    have += (size_t)got;
    size_t start = 0;
    for (;;) {
      char *nl = memchr(buf + start, '\n', have - start);
      if (!nl) break;
      const size_t end = (size_t)(nl - buf);
      if (!skipping && set_add(&rec_file_lines, fnv1a(buf + start, end - start)) != 0) {
        free(buf);
        errno = ENOMEM;
        return -1;
      }
      skipping = 0;
      start = end + 1;
    }
    rec_read = at - (off_t)(have - start); /* up to the last whole line */
    memmove(buf, buf + start, have - start);
    have -= start;
    if (have == BLOCK) { /* no newline in a whole block */
      skipping = 1;
      have = 0;
    }
  }
  if (have && !skipping) *tail = fnv1a(buf, have);
  free(buf);
  return 0;
}

/* Appends the queued lines the file does not hold. Called with rec_lock held. With wait_s 0 it
 * takes the file's lock only if it is free at once and otherwise leaves the queue for later:
 * 0 done (or nothing to do), 1 the lock was busy, -1 failed (reason in rlk_last_error). */
static int flush_queue(double wait_s) {
  if (!rec_queue_len || rec_refused) return 0;
  char why[4400];
  int fd = rlk_open_owned_file(rec_path, 0600, why, sizeof why);
  if (fd < 0) {
    /* Another user's file, a link, a FIFO: a standing refusal, not a passing failure. */
    if (errno == EPERM || errno == ELOOP || errno == EINVAL || errno == EISDIR) rec_refused = 1;
    rlk_error(RLK_ERR_IO, "RLK_JIT_RECORD=%s", why);
    return -1;
  }
  int use_flock = 0;
  int locked = rlk_lock_fd(fd, &use_flock, wait_s);
  if (locked != 0) {
    int e = errno;
    close(fd);
    if (locked > 0) return 1;
    rlk_error(RLK_ERR_IO, "RLK_JIT_RECORD=%s: lock: %s", rec_path, strerror(e));
    return -1;
  }
  int rc = 0, ends_in_newline = 1;
  uint64_t tail = 0;
  if (read_new_lines(fd, &ends_in_newline, &tail) != 0) {
    rlk_error(RLK_ERR_IO, "RLK_JIT_RECORD=%s: read: %s", rec_path, strerror(errno));
    rc = -1;
  }
  /* The queue without the lines the file already holds, after a newline if a writer that died
   * left a partial last line (so the first new line does not join it; a partial line that is a
   * queued line whole is that line, and the newline completes it). */
  char *text = rc ? NULL : malloc(rec_queue_len + 1);
  size_t out = 0;
  if (!rc && !text) {
    rlk_error(RLK_ERR_OUT_OF_MEMORY, "RLK_JIT_RECORD: out of memory");
    rc = -1;
  }
  if (text && !ends_in_newline) text[out++] = '\n';
  const size_t lead = out;
  int completes = 0;
  for (size_t at = 0; text && at < rec_queue_len;) {
    const char *nl = memchr(rec_queue + at, '\n', rec_queue_len - at);
    const size_t n = (size_t)(nl - (rec_queue + at));
    const uint64_t h = fnv1a(rec_queue + at, n);
    if (lead && h == tail) {
      completes = 1;
    } else if (!set_has(&rec_file_lines, h)) {
      memcpy(text + out, rec_queue + at, n + 1);
      out += n + 1;
    }
    at += n + 1;
  }
  if (text && (out > lead || completes)) {
    ssize_t w = write(fd, text, out);
    if (w != (ssize_t)out) {
      /* A regular file takes the whole write or fails it (disk full, quota); a short one
       * leaves a partial line that the next writer puts a newline after. */
      rlk_error(RLK_ERR_IO, "RLK_JIT_RECORD=%s: write: %s", rec_path, w < 0 ? strerror(errno) : "short write");
      rc = -1;
    }
  }
  free(text);
  rlk_unlock_fd(fd, use_flock);
  close(fd); /* the file's lines are read again (from rec_read) by the next flush */
  if (!rc) {
    rec_queue_len = 0;
    atomic_store_explicit(&rec_queued, 0, memory_order_relaxed);
  }
  return rc;
}

/* Queues `line` (known lines are dropped by the caller). 0, or -1 when out of memory. */
static int queue_line(const char *line, size_t n) {
  if (rec_queue_len + n + 1 > rec_queue_cap) {
    size_t cap = rec_queue_cap ? 2 * rec_queue_cap : 4096;
    while (cap < rec_queue_len + n + 1) cap *= 2;
    char *grown = realloc(rec_queue, cap);
    if (!grown) return -1;
    rec_queue = grown;
    rec_queue_cap = cap;
  }
  memcpy(rec_queue + rec_queue_len, line, n);
  rec_queue[rec_queue_len + n] = '\n';
  rec_queue_len += n + 1;
  atomic_store_explicit(&rec_queued, 1, memory_order_relaxed);
  return 0;
}

static void report_once(const char *what) {
  if (rec_warned) return;
  rec_warned = 1;
  rlk_warn("%s; configurations are not recorded", what);
}

void rlk_record_op(const rlk_op_desc *d, const rlk_op_values *vals) {
  if (!rlk_record_enabled()) return;
  /* A shape hint the op reads only through its tuning bucket is recorded as the bucket: the line
   * plans what it did on any target, and a trainer's step of new rows adds no line. */
  rlk_op_values v = *vals;
  if (d->recorded) d->recorded(&v);
  for (size_t i = 0; i < d->nsettings; i++)
    if (d->settings[i].bucketed && v.v[i] >= 1) {
      const int64_t b = rlk_tune_bucket(v.v[i]);
      if (b <= d->settings[i].value->max) v.v[i] = b;
    }
  char line[RLK_RECORD_LINE_MAX];
  if (rlk_op_values_line(d, &v, line, sizeof line) < 0) return;
  const size_t n = strlen(line);
  const uint64_t h = fnv1a(line, n);
  pthread_mutex_lock(&rec_lock);
  if (set_has(&rec_known, h) && !atomic_load_explicit(&rec_queued, memory_order_relaxed)) {
    pthread_mutex_unlock(&rec_lock);
    return;
  }
  /* The error message of a failed append must not leak into the caller's call. */
  char saved[1024];
  rlk_format(saved, sizeof saved, "%s", rlk_last_error());
  if (!set_has(&rec_known, h)) {
    if (set_add(&rec_known, h) != 0 || queue_line(line, n) != 0) report_once("RLK_JIT_RECORD: out of memory");
    static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
    pthread_once(&exit_once, rec_flush_at_exit);
  }
  /* A lock another process holds, or a file that failed (a missing folder, a full disk), is
   * tried again at most every RECORD_RETRY_S, so that calls of known configurations do not each
   * pay an open and a lock attempt meanwhile. */
  const double now = rlk_now();
  if (!rec_refused && now >= rec_next_try) {
    int rc = flush_queue(0);
    if (rc < 0) report_once(rlk_last_error());
    rec_next_try = rc != 0 ? now + RLK_RECORD_RETRY_S : 0;
  }
  if (saved[0]) rlk_error(RLK_ERR_INTERNAL, "%s", saved);
  else rlk_error_clear();
  pthread_mutex_unlock(&rec_lock);
}

void rlk_record_reset(const char *path) {
  pthread_once(&rec_once, rec_init);
  pthread_mutex_lock(&rec_lock);
  set_clear(&rec_known);
  set_clear(&rec_file_lines);
  rec_dev = 0;
  rec_ino = 0;
  rec_read = 0;
  rec_queue_len = 0;
  atomic_store(&rec_queued, 0);
  rec_warned = rec_refused = 0;
  rec_next_try = 0;
  int on = path && rlk_format(rec_path, sizeof rec_path, "%s", path) >= 0;
  atomic_store(&rec_on, on);
  pthread_mutex_unlock(&rec_lock);
}

/* At exit, lines still queued (the file was locked by another process at every call) get one
 * more try, waiting a bounded time for the lock. */
static void flush_at_exit(void) {
  pthread_mutex_lock(&rec_lock);
  if (rec_queue_len && !rec_refused) {
    int rc = flush_queue(RLK_RECORD_EXIT_WAIT_S);
    if (rc > 0)
      rlk_warn("RLK_JIT_RECORD=%s: another process held the file's lock for %.0f s at exit; the "
               "configurations this process queued are not recorded",
               rec_path, RLK_RECORD_EXIT_WAIT_S);
    else if (rc < 0)
      report_once(rlk_last_error());
  }
  pthread_mutex_unlock(&rec_lock);
}

static void rec_flush_at_exit(void) { atexit(flush_at_exit); }

/* record.c - RLK_JIT_RECORD=FILE: the canonical configuration line of every op configuration the
 * process ran, appended to FILE once each, so that one short job tells a cluster what to
 * precompile (rlk-precompile --config FILE) before it deploys read-only with RLK_JIT=0.
 *
 * A process remembers the lines it wrote (a call's hot path then costs a hash and a scan of a
 * short list); across processes the append is under an exclusive lock on FILE, after checking
 * that no other process wrote the line first. Recording never fails a call: a file that cannot
 * be written is reported once. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "runtime/op.h"
#include "runtime/record.h"

static pthread_once_t rec_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int rec_on;
static char rec_path[4096];
static uint64_t *rec_seen; /* FNV-1a of the lines written or found */
static size_t rec_n, rec_cap;
static int rec_warned;

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

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* Does the open file hold `line` as a whole line? */
static int file_has_line(int fd, const char *line) {
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size > (64 << 20)) return 0;
  char *buf = malloc((size_t)st.st_size + 1);
  if (!buf) return 0;
  ssize_t got = pread(fd, buf, (size_t)st.st_size, 0);
  int found = 0;
  if (got > 0) {
    buf[got] = '\0';
    const size_t n = strlen(line);
    for (char *at = buf; !found && (at = strstr(at, line)) != NULL; at += n)
      found = (at == buf || at[-1] == '\n') && (at[n] == '\n' || at[n] == '\0');
  }
  free(buf);
  return found;
}

/* Appends line + '\n' to the record file unless it is there; RLK_OK or the reason. */
static rlk_status append_once(const char *line) {
  int fd = open(rec_path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return rlk_error(RLK_ERR_IO, "RLK_JIT_RECORD=%s: %s", rec_path, strerror(errno));
  rlk_status st = RLK_OK;
  if (flock(fd, LOCK_EX) != 0) {
    st = rlk_error(RLK_ERR_IO, "RLK_JIT_RECORD=%s: lock: %s", rec_path, strerror(errno));
  } else if (!file_has_line(fd, line)) {
    const size_t n = strlen(line);
    char *text = malloc(n + 2);
    if (!text) {
      st = rlk_error(RLK_ERR_OUT_OF_MEMORY, "RLK_JIT_RECORD: out of memory");
    } else {
      memcpy(text, line, n);
      text[n] = '\n';
      if (write(fd, text, n + 1) != (ssize_t)(n + 1))
        st = rlk_error(RLK_ERR_IO, "RLK_JIT_RECORD=%s: write: %s", rec_path, strerror(errno));
      free(text);
    }
  }
  close(fd); /* also releases the lock */
  return st;
}

void rlk_record_op(const rlk_op_desc *d, const rlk_op_values *vals) {
  if (!rlk_record_enabled()) return;
  char line[1024];
  if (rlk_op_values_line(d, vals, line, sizeof line) < 0) return;
  const uint64_t h = fnv1a(line);
  pthread_mutex_lock(&rec_lock);
  int seen = 0;
  for (size_t i = 0; i < rec_n && !seen; i++) seen = rec_seen[i] == h;
  if (!seen) {
    if (rec_n == rec_cap) {
      size_t cap = rec_cap ? 2 * rec_cap : 64;
      uint64_t *grown = realloc(rec_seen, cap * sizeof *grown);
      if (grown) {
        rec_seen = grown;
        rec_cap = cap;
      }
    }
    /* the error message of a failed append must not leak into the caller's call */
    char saved[1024];
    rlk_format(saved, sizeof saved, "%s", rlk_last_error());
    rlk_status st = append_once(line);
    if (st && !rec_warned) {
      rec_warned = 1;
      rlk_warn("%s; configurations are not recorded", rlk_last_error());
    }
    if (saved[0]) rlk_error(RLK_ERR_INTERNAL, "%s", saved);
    else rlk_error_clear();
    if (!st && rec_n < rec_cap) rec_seen[rec_n++] = h;
  }
  pthread_mutex_unlock(&rec_lock);
}

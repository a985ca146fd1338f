/* log.c - leveled logging to stderr, or to a callback the caller set. The level comes from
 * RLK_LOG, raised by contexts that ask for more detail and by the callback's own level. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"

static atomic_int log_level = -2; /* -2: not read from the environment yet */

static int level_from_env(void) {
  const char *v = rlk_env("RLK_LOG");
  if (!v) return RLK_LOG_WARN;
  if (!strcmp(v, "error")) return RLK_LOG_ERROR;
  if (!strcmp(v, "warn")) return RLK_LOG_WARN;
  if (!strcmp(v, "info")) return RLK_LOG_INFO;
  if (!strcmp(v, "debug")) return RLK_LOG_DEBUG;
  return RLK_LOG_WARN;
}

rlk_log_level rlk_log_get_level(void) {
  int l = atomic_load_explicit(&log_level, memory_order_relaxed);
  if (l == -2) {
    l = level_from_env();
    atomic_store(&log_level, l);
  }
  return (rlk_log_level)l;
}

void rlk_log_set_level(rlk_log_level level) {
  if (level == RLK_LOG_DEFAULT) level = (rlk_log_level)level_from_env();
  atomic_store(&log_level, (int)level);
}

/* The callback, its argument and its level are set together and read together (under
 * sink_lock: a pair torn between two rlk_set_log_callback calls would hand one callback the
 * other's argument); sink_level lets a message below every level return without the lock. */
typedef struct log_sink {
  rlk_log_callback callback;
  void *user;
  int level;
} log_sink;

static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static log_sink sink; /* callback NULL: stderr */
static atomic_int sink_level = -1;

void rlk_set_log_callback(rlk_log_callback callback, rlk_log_level level, void *user) {
  pthread_mutex_lock(&sink_lock);
  sink.callback = callback;
  sink.user = callback ? user : NULL;
  sink.level = callback ? (int)level : -1;
  atomic_store(&sink_level, sink.level);
  pthread_mutex_unlock(&sink_lock);
}

void rlk_log(rlk_log_level level, const char *fmt, ...) {
  int limit = (int)rlk_log_get_level();
  const int sl = atomic_load_explicit(&sink_level, memory_order_relaxed);
  if ((int)level > (sl > limit ? sl : limit)) return;
  pthread_mutex_lock(&sink_lock);
  const log_sink sk = sink;
  pthread_mutex_unlock(&sink_lock);
  if (sk.callback && sk.level > limit) limit = sk.level;
  if ((int)level > limit) return;
  const log_sink *s = sk.callback ? &sk : NULL;
  static const char *const names[] = {"error", "warn", "info", "debug"};
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (s)
    s->callback(level, msg, s->user);
  else
    fprintf(stderr, "rlk %s: %s\n", names[level < 0 ? 0 : level > 3 ? 3 : level], msg);
}

/* log.c - leveled logging to stderr, or to a callback the caller set. The level comes from
 * RLK_LOG, raised by contexts that ask for more detail and by the callback's own level. */
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

/* The callback and its argument travel together: one pointer swapped atomically. */
typedef struct log_sink {
  rlk_log_callback callback;
  void *user;
  int level;
} log_sink;

static log_sink sinks[2];
static _Atomic(log_sink *) sink = NULL;
static atomic_int sink_slot;

void rlk_set_log_callback(rlk_log_callback callback, rlk_log_level level, void *user) {
  if (!callback) {
    atomic_store(&sink, NULL);
    return;
  }
  /* Two slots: a logging thread may still read the one replaced by the previous call. */
  log_sink *s = &sinks[atomic_fetch_add(&sink_slot, 1) & 1];
  s->callback = callback;
  s->user = user;
  s->level = (int)level;
  atomic_store(&sink, s);
}

void rlk_log(rlk_log_level level, const char *fmt, ...) {
  log_sink *s = atomic_load(&sink);
  int limit = (int)rlk_log_get_level();
  if (s && s->level > limit) limit = s->level;
  if ((int)level > limit) return;
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

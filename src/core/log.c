/* log.c - leveled logging to stderr. The level comes from RLK_LOG, raised by contexts that
 * ask for more detail. */
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

void rlk_log(rlk_log_level level, const char *fmt, ...) {
  if ((int)level > (int)rlk_log_get_level()) return;
  static const char *const names[] = {"error", "warn", "info", "debug"};
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "rlk %s: %s\n", names[level < 0 ? 0 : level > 3 ? 3 : level], msg);
}

/* util.c - environment access, clocks, string helpers. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"

const char *rlk_env(const char *name) {
  const char *v = getenv(name);
  return (v && *v) ? v : NULL;
}

rlk_status rlk_env_lock_timeout(double *seconds) {
  *seconds = RLK_DEFAULT_LOCK_TIMEOUT_S;
  const char *v = rlk_env("RLK_LOCK_TIMEOUT_S");
  if (!v) return RLK_OK;
  char *end = NULL;
  errno = 0;
  double t = strtod(v, &end);
  if (end == v || *end != '\0' || errno != 0 || !isfinite(t) || t < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "RLK_LOCK_TIMEOUT_S: '%.40s' is not a non-negative number of seconds",
                     v);
  *seconds = t;
  return RLK_OK;
}

int rlk_env_choice(atomic_int *cache, const char *name, const char *const *names, int def) {
  int v = atomic_load_explicit(cache, memory_order_relaxed);
  if (v >= 0) return v;
  v = def;
  const char *e = rlk_env(name);
  if (e) {
    int found = 0;
    for (int i = 0; names[i]; i++)
      if (!strcmp(e, names[i])) {
        v = i;
        found = 1;
      }
    if (!found) {
      char list[256] = "";
      size_t len = 0;
      for (int i = 0; names[i]; i++) {
        const char *sep = i == 0 ? "" : names[i + 1] ? ", " : " or ";
        int n = snprintf(list + len, sizeof list - len, "%s%s", sep, names[i]);
        if (n < 0 || (size_t)n >= sizeof list - len) break;
        len += (size_t)n;
      }
      rlk_warn("%s='%s' is not %s: ignored", name, e, list);
    }
  }
  atomic_store_explicit(cache, v, memory_order_relaxed);
  return v;
}

double rlk_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t rlk_unix_time(void) { return (int64_t)time(NULL); }

int rlk_format(char *buf, size_t size, const char *fmt, ...) {
  if (!buf || size == 0) return -1;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, size, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= size) {
    buf[size - 1] = '\0';
    return -1;
  }
  return n;
}

char *rlk_strdup(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

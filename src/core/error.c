/* error.c - status strings and the thread-local last-error message. */
#include <stdio.h>
#include <string.h>

#include "core/core.h"

#define RLK_ERROR_CAP 8192

static _Thread_local char last_error[RLK_ERROR_CAP];

const char *rlk_status_string(rlk_status status) {
  switch (status) {
    case RLK_OK: return "ok";
    case RLK_ERR_INVALID_ARGUMENT: return "invalid argument";
    case RLK_ERR_UNSUPPORTED: return "unsupported";
    case RLK_ERR_UNAVAILABLE: return "unavailable";
    case RLK_ERR_COMPILE: return "compile error";
    case RLK_ERR_JIT_DISABLED: return "kernel not cached and JIT disabled";
    case RLK_ERR_CACHE: return "cache error";
    case RLK_ERR_BACKEND: return "backend error";
    case RLK_ERR_OUT_OF_MEMORY: return "out of memory";
    case RLK_ERR_IO: return "i/o error";
    case RLK_ERR_TIMEOUT: return "timeout";
    case RLK_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char *rlk_last_error(void) { return last_error; }

void rlk_error_clear(void) { last_error[0] = '\0'; }

rlk_status rlk_error(rlk_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  rlk_debug("error (%s): %s", rlk_status_string(status), last_error);
  return status;
}

rlk_status rlk_error_wrap(rlk_status status, const char *fmt, ...) {
  char prefix[1024];
  char old[RLK_ERROR_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, last_error, sizeof old);
  size_t np = strlen(prefix), no = strlen(old), cap = sizeof last_error - 1;
  size_t len = 0;
  memcpy(last_error, prefix, np < cap ? np : cap);
  len = np < cap ? np : cap;
  if (no && len + 2 < cap) {
    memcpy(last_error + len, ": ", 2);
    len += 2;
    size_t take = no < cap - len ? no : cap - len;
    memcpy(last_error + len, old, take);
    len += take;
  }
  last_error[len] = '\0';
  return status;
}

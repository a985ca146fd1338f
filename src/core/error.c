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

/* The length of the well-formed UTF-8 sequence at p (1 to 4), 0 where none starts (a stray
 * continuation byte, an overlong form, a surrogate, past U+10FFFF, a sequence cut short). */
static size_t utf8_length(const unsigned char *p) {
  if (p[0] < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (p[0] >= 0xC2 && p[0] <= 0xDF) {
    n = 2;
  } else if (p[0] >= 0xE0 && p[0] <= 0xEF) {
    n = 3;
    if (p[0] == 0xE0) lo = 0xA0;
    if (p[0] == 0xED) hi = 0x9F;
  } else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
    n = 4;
    if (p[0] == 0xF0) lo = 0x90;
    if (p[0] == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (p[1] < lo || p[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if (p[i] < 0x80 || p[i] > 0xBF) return 0; /* the NUL ends a cut sequence here too */
  return n;
}

/* A message is always UTF-8: a byte of no well-formed sequence (a character that a length limit
 * cut, a name in another encoding) becomes '?', so callers may decode it strictly. */
static void utf8_repair(char *s) {
  for (unsigned char *p = (unsigned char *)s; *p;) {
    const size_t n = utf8_length(p);
    if (n == 0) *p++ = '?';
    else p += n;
  }
}

const char *rlk_last_error(void) { return last_error; }

void rlk_error_clear(void) { last_error[0] = '\0'; }

rlk_status rlk_error(rlk_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  utf8_repair(last_error);
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
  utf8_repair(last_error);
  return status;
}

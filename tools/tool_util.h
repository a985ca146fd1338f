/* tool_util.h - what the command-line tools share: usage and library error reporting, memory
 * that is there or ends the tool, clocks, numbers, complete writes.
 * A tool defines `static const char *prog` (its name in messages) before including this. */
#ifndef RLK_TOOL_UTIL_H
#define RLK_TOOL_UTIL_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rlk.h"

#define TOOL_UNUSED __attribute__((unused))

/* Prints "<prog>: <message>" and a hint to stderr; returns 2, the usage exit status. */
TOOL_UNUSED static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", prog);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nTry '%s --help'.\n", prog);
  return 2;
}

/* Prints a failed library call with its status and rlk_last_error(); returns 1. */
TOOL_UNUSED static int lib_error(const char *what, rlk_status st) {
  const char *detail = rlk_last_error();
  fflush(stdout); /* keep the message after what was printed before it */
  fprintf(stderr, "%s: %s: %s%s%s\n", prog, what, rlk_status_string(st), *detail ? ": " : "", detail);
  return 1;
}

/* Allocation for tools: out of memory ends the tool (exit status 1) with a message. */
TOOL_UNUSED static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) {
    fprintf(stderr, "%s: out of memory\n", prog);
    exit(1);
  }
  return q;
}

TOOL_UNUSED static char *xstrdup(const char *s) {
  char *d = strdup(s);
  if (!d) {
    fprintf(stderr, "%s: out of memory\n", prog);
    exit(1);
  }
  return d;
}

/* Monotonic seconds. */
TOOL_UNUSED static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A decimal integer in [lo, hi]: 0, or -1 when s is not one. */
TOOL_UNUSED static int parse_int(const char *s, long lo, long hi, long *out) {
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

/* Writes all of buf, retrying short writes; 0 or -1 (errno). */
TOOL_UNUSED static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

#endif

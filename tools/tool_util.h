/* tool_util.h - what the command-line tools share: usage and library error reporting.
 * A tool defines `static const char *prog` (its name in messages) before including this. */
#ifndef RLK_TOOL_UTIL_H
#define RLK_TOOL_UTIL_H

#include <stdarg.h>
#include <stdio.h>

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

#endif

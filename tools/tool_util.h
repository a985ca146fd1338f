/* tool_util.h - what the command-line tools share: usage and library error reporting, memory
 * that is there or ends the tool, clocks, numbers, complete writes.
 * A tool defines `static const char *prog` (its name in messages) before including this. */
#ifndef RLK_TOOL_UTIL_H
#define RLK_TOOL_UTIL_H

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
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

/* The usage error for what getopt_long returned as '?' (an unknown option) or ':' (a missing
 * value), with opterr = 0 and an optstring that starts with ':'. */
TOOL_UNUSED static int getopt_error(int c, char **argv) {
  const char *a = argv[optind - 1];
  if (c == ':') return usage_error("%s needs a value", a);
  if (strncmp(a, "--", 2) == 0) {
    /* a long option: glibc sets optopt to a known one's code when it was given a value it takes
     * none of (--json=1), and to 0 when the name is unknown */
    const char *eq = strchr(a, '=');
    if (optopt && eq) return usage_error("%.*s takes no value", (int)(eq - a), a);
    return usage_error("unknown option '%s'", a);
  }
  if (optopt) return usage_error("unknown option '-%c'", optopt);
  return usage_error("unknown option '%s'", a);
}

/* An option whose value may not be empty, and the usage error that says what it needs. */
typedef struct tool_nonempty {
  int opt;           /* as getopt_long returns it */
  const char *error; /* "--config needs a file" */
} tool_nonempty;

/* The usage error (2) when option c is one of the n `rules` and its value is empty; 0 otherwise
 * (options without a value have none to check). */
TOOL_UNUSED static int empty_value_error(int c, const char *val, const tool_nonempty *rules, size_t n) {
  if (!val || *val) return 0;
  for (size_t i = 0; i < n; i++)
    if (rules[i].opt == c) return usage_error("%s", rules[i].error);
  return 0;
}

/* Copies `path`, the value of option `opt`, into buf[size]: 0, or the usage error (2), naming the
 * option, when it does not fit. A path cut short names another file or directory (a/b////...x
 * becomes a/b), so it is refused, never truncated. */
TOOL_UNUSED static int path_arg(char *buf, size_t size, const char *opt, const char *path) {
  const size_t n = strlen(path);
  if (n >= size) return usage_error("%s: the path is %zu bytes long, more than the %zu this tool takes", opt, n, size - 1);
  memcpy(buf, path, n + 1);
  return 0;
}

/* The length of the well-formed UTF-8 sequence at p (1 to 4), or 0 when p starts none: a stray
 * continuation byte, an overlong form, a surrogate, a code point past U+10FFFF, a cut sequence. */
TOOL_UNUSED static size_t utf8_length(const unsigned char *p) {
  if (p[0] < 0x80) return 1;
  /* the length from the first byte, and the second byte's range (Unicode's table 3-7) */
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (p[0] >= 0xC2 && p[0] <= 0xDF) {
    n = 2;
  } else if (p[0] >= 0xE0 && p[0] <= 0xEF) {
    n = 3;
    if (p[0] == 0xE0) lo = 0xA0; /* no overlong forms */
    if (p[0] == 0xED) hi = 0x9F; /* no surrogates */
  } else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
    n = 4;
    if (p[0] == 0xF0) lo = 0x90; /* no overlong forms */
    if (p[0] == 0xF4) hi = 0x8F; /* nothing past U+10FFFF */
  } else {
    return 0;
  }
  if (p[1] < lo || p[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if (p[i] < 0x80 || p[i] > 0xBF) return 0; /* a NUL ends the string here too */
  return n;
}

/* Writes s as a JSON string: quoted, '"' and '\\' escaped, control characters as \\uXXXX (\\n as
 * itself), well-formed UTF-8 as it is, and every byte of anything else (a name cut inside a
 * character, another encoding) as U+FFFD, so that the document always parses. */
TOOL_UNUSED static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p;) {
    const size_t n = utf8_length(p);
    if (n == 0)
      fputs("\\ufffd", f);
    else if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p == '\n')
      fputs("\\n", f);
    else if (*p < 0x20 || *p == 0x7F)
      fprintf(f, "\\u%04x", *p);
    else
      fwrite(p, 1, n, f);
    p += n ? n : 1;
  }
  fputc('"', f);
}

/* Writes v as a JSON number in the printf format fmt ("%.6f"), or null when it is infinite or NaN
 * (JSON has neither; printf would write inf or nan). */
TOOL_UNUSED static void json_number(FILE *f, const char *fmt, double v) {
  if (isfinite(v))
    fprintf(f, fmt, v);
  else
    fputs("null", f);
}

/* ", \"name\": " and then v as json_number writes it: one more member of an object. */
TOOL_UNUSED static void json_number_member(FILE *f, const char *name, const char *fmt, double v) {
  fprintf(f, ", \"%s\": ", name);
  json_number(f, fmt, v);
}

/* Opens a tool's JSON file at `path` and writes its opening line: the tool, the device,
 * target and compiler, the library's version. NULL, after saying so, when it cannot be written. */
TOOL_UNUSED static FILE *tool_json_begin(const char *path, const rlk_device_info *info) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "%s: cannot write %s: %s\n", prog, path, strerror(errno));
    return NULL;
  }
  const char *names[] = {"tool", "device", "target", "compiler", "version"};
  const char *values[] = {prog, info->name, info->target, info->compiler, rlk_version_string()};
  fprintf(f, "{\n  ");
  for (int i = 0; i < 5; i++) {
    fprintf(f, "%s\"%s\": ", i ? ", " : "", names[i]);
    json_string(f, values[i]);
  }
  fprintf(f, ",\n");
  return f;
}

/* Prints a failed library call with its status and rlk_last_error(); returns 1. */
TOOL_UNUSED static int lib_error(const char *what, rlk_status st) {
  const char *detail = rlk_last_error();
  fflush(stdout); /* keep the message after what was printed before it */
  fprintf(stderr, "%s: %s: %s%s%s\n", prog, what, rlk_status_string(st), *detail ? ": " : "", detail);
  return 1;
}

/* The tool's exit status once its standard output is flushed: rc, or, when what it printed could
 * not all be written (a full disk, /dev/full, a closed descriptor), a failure (1, or rc when rc
 * already is one) after saying so on stderr. Lost output never exits 0. Every tool's main
 * returns through it. */
TOOL_UNUSED static int tool_exit(int rc) {
  errno = 0;
  const int flushed = fflush(stdout) == 0;
  const int e = errno;
  if (flushed && !ferror(stdout)) return rc;
  fprintf(stderr, "%s: writing standard output: %s\n", prog, e ? strerror(e) : "an earlier write failed");
  return rc ? rc : 1;
}

/* Closes a file the tool wrote to `path`: 0, or 1 after saying on stderr that it was not all
 * written (a full disk, /dev/full). */
TOOL_UNUSED static int close_written(FILE *f, const char *path) {
  const int failed_before = ferror(f) != 0;
  errno = 0;
  const int closed = fclose(f) == 0;
  if (closed && !failed_before) return 0;
  fprintf(stderr, "%s: writing %s: %s\n", prog, path, errno ? strerror(errno) : "a write failed");
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

/* splitmix64: a small generator, good enough for a tool's random data. */
TOOL_UNUSED static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform on [0, 1) from rng_next's top 53 bits. */
TOOL_UNUSED static double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

/* A status line while a long run goes on: "[done/total] pct%, elapsed, about ETA left", redrawn
 * in place on stderr when stderr is a terminal (nothing otherwise, so logs and pipes stay clean).
 * Lines printed meanwhile go after progress_clear and before the next progress_show. */
typedef struct progress {
  int on;
  size_t total;
  double t0;
} progress;

TOOL_UNUSED static void progress_start(progress *p, size_t total) {
  p->on = total > 0 && isatty(STDERR_FILENO);
  p->total = total;
  p->t0 = now_s();
}

TOOL_UNUSED static void progress_clear(const progress *p) {
  if (!p->on) return;
  fputs("\r\033[K", stderr);
  fflush(stderr);
}

TOOL_UNUSED static void progress_show(const progress *p, size_t done, const char *detail) {
  if (!p->on) return;
  double el = now_s() - p->t0;
  fprintf(stderr, "\r\033[K[%zu/%zu] %3.0f%%  %.1f s", done, p->total,
          100.0 * (double)done / (double)p->total, el);
  if (done > 0 && done < p->total)
    fprintf(stderr, ", about %.0f s left", el / (double)done * (double)(p->total - done));
  if (detail && *detail) fprintf(stderr, "  %s", detail);
  fflush(stderr);
}

/* A backend by name: auto, cuda, hip, host (or cpu, its other name); 0, or -1 for another. */
TOOL_UNUSED static int parse_backend(const char *s, rlk_backend *out) {
  static const struct {
    const char *name;
    rlk_backend backend;
  } names[] = {{"auto", RLK_BACKEND_AUTO}, {"cuda", RLK_BACKEND_CUDA}, {"hip", RLK_BACKEND_HIP},
               {"host", RLK_BACKEND_HOST}, {"cpu", RLK_BACKEND_HOST}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(s, names[i].name)) {
      *out = names[i].backend;
      return 0;
    }
  return -1;
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

/* The options the benchmarks share, as getopt_long entries: --backend NAME, --iters N,
 * --json FILE and --help (values 'b', 'i', 'J', 'h'). A tool with more options lists them
 * after BENCH_LONGOPTS and hands these four to bench_option. */
#define BENCH_LONGOPTS                                                                           \
  {"backend", required_argument, NULL, 'b'}, {"iters", required_argument, NULL, 'i'},             \
      {"json", required_argument, NULL, 'J'}, {"help", no_argument, NULL, 'h'}

/* Applies one of the shared options (c from getopt_long): 1 applied, 0 not one of them, 2 a
 * usage error (printed). --help prints `usage_line` (a format taking prog) and returns -1. */
TOOL_UNUSED static int bench_option(int c, const char *usage_line, rlk_backend *backend, int *iters,
                                    const char **json) {
  long n = 0;
  switch (c) {
    case 'b':
      if (parse_backend(optarg, backend)) return usage_error("--backend: '%s' is not auto, cuda, hip or host", optarg);
      return 1;
    case 'i':
      if (parse_int(optarg, 1, 1000000, &n)) return usage_error("--iters needs a count from 1");
      *iters = (int)n;
      return 1;
    case 'J': *json = optarg; return 1;
    case 'h': printf(usage_line, prog); return -1;
    default: return 0;
  }
}

/* The whole command line of a benchmark that takes only the shared options: 0 to run, -1 after
 * --help, 2 a usage error. */
TOOL_UNUSED static int bench_options(int argc, char **argv, rlk_backend *backend, int *iters, const char **json) {
  static const struct option longopts[] = {BENCH_LONGOPTS, {NULL, 0, NULL, 0}};
  opterr = 0;
  for (int c; (c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1;) {
    const int r = bench_option(c, "usage: %s [--backend auto|cuda|hip|host] [--iters N] [--json FILE]\n", backend,
                               iters, json);
    if (r == 0) return getopt_error(c, argv);
    if (r != 1) return r;
  }
  if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
  return 0;
}

/* A context on `backend` and the device it runs on: 0, or lib_error's status after printing
 * which call failed. */
TOOL_UNUSED static int tool_context(rlk_backend backend, rlk_context **ctx, rlk_device_info *info) {
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = backend;
  *ctx = NULL;
  rlk_status st = rlk_context_create(ctx, &o);
  if (st) return lib_error("rlk_context_create", st);
  if ((st = rlk_context_device_info(*ctx, info))) return lib_error("rlk_context_device_info", st);
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

/* fuzz.h - what the fuzz targets share: reading typed values off the fuzzer's input (an
 * exhausted input reads as zeros, so every input is a valid program), a generator seeded from
 * it for bulk data, the check that every failed call explains itself, and a private scratch
 * directory. Header-only: each target is one translation unit linked with libFuzzer. */
#ifndef RLK_FUZZ_H
#define RLK_FUZZ_H

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rlk.h"

#define FUZZ_UNUSED __attribute__((unused))

typedef struct fz_input {
  const uint8_t *p;
  size_t n;
} fz_input;

FUZZ_UNUSED static uint8_t fz_u8(fz_input *in) {
  if (!in->n) return 0;
  in->n--;
  return *in->p++;
}

FUZZ_UNUSED static uint64_t fz_u64(fz_input *in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)fz_u8(in) << (8 * i);
  return v;
}

/* One of `n` table entries, chosen by the next byte. */
#define FZ_PICK(in, table) ((table)[fz_u8(in) % (sizeof(table) / sizeof((table)[0]))])

/* splitmix64: bulk data (buffer contents) from a seed taken off the input. */
typedef struct fz_rng {
  uint64_t s;
} fz_rng;

FUZZ_UNUSED static uint64_t fz_next(fz_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Dies (a crash for the fuzzer, saved as an artifact) when a library call broke its contract. */
FUZZ_UNUSED static void fz_fail(const char *what, const char *detail) {
  fprintf(stderr, "fuzz: contract broken: %s: %s\n", what, detail ? detail : "");
  abort();
}

/* Every call returns a known status, and a failed one says why (rlk.h's conventions).
 * RLK_FUZZ_VERBOSE=1 prints each call's outcome (to read what a reproducer does). */
FUZZ_UNUSED static rlk_status fz_checked(rlk_status st, const char *call) {
  static int verbose = -1;
  if (verbose < 0) verbose = getenv("RLK_FUZZ_VERBOSE") && atoi(getenv("RLK_FUZZ_VERBOSE")) > 0;
  if (verbose) fprintf(stderr, "fuzz: %s: %s%s%s\n", call, rlk_status_string(st), st ? ": " : "", st ? rlk_last_error() : "");
  if ((int)st < RLK_OK || (int)st > RLK_ERR_INTERNAL) fz_fail(call, "status out of range");
  if (st != RLK_OK && !rlk_last_error()[0]) fz_fail(call, "failed without a message");
  if (st == RLK_ERR_INTERNAL) fz_fail(call, rlk_last_error());
  return st;
}

/* Sets an environment variable unless the user already did (so a run can be steered). */
FUZZ_UNUSED static void fz_default_env(const char *name, const char *value) {
  if (!getenv(name)) setenv(name, value, 1);
}

/* What every target's LLVMFuzzerInitialize does first: only errors logged (RLK_LOG), unless the
 * user asked for more. */
FUZZ_UNUSED static void fz_init(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_default_env("RLK_LOG", "error");
}

/* `len` bytes of the input as a NUL-terminated string (malloc'd: the caller frees it). */
FUZZ_UNUSED static char *fz_text(const uint8_t *data, size_t len) {
  char *text = malloc(len + 1);
  if (!text) fz_fail("fz_text", "out of memory");
  memcpy(text, data, len);
  text[len] = '\0';
  return text;
}

static char fz_scratch_dir[1024];

static int fz_remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

/* Removes a directory tree, never following a link (best effort). */
FUZZ_UNUSED static void fz_remove_tree(const char *path) { nftw(path, fz_remove_one, 16, FTW_DEPTH | FTW_PHYS); }

static void fz_scratch_remove(void) {
  if (fz_scratch_dir[0]) fz_remove_tree(fz_scratch_dir);
}

/* A private directory for the process, made once and removed at exit: under RLK_FUZZ_TMPDIR,
 * else /dev/shm where there is one (the targets that write files run several times faster
 * in memory), else $TMPDIR or /tmp. */
FUZZ_UNUSED static const char *fz_scratch(void) {
  char *dir = fz_scratch_dir;
  if (dir[0]) return dir;
  const char *tmp = getenv("RLK_FUZZ_TMPDIR");
  if (!tmp || !*tmp) tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
  snprintf(dir, sizeof fz_scratch_dir, "%s/rlk-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    perror("fuzz: mkdtemp");
    exit(1);
  }
  atexit(fz_scratch_remove);
  return dir;
}

/* The context of the targets that plan configurations: a compile-only host context over the
 * scratch directory's cache that plans and looks kernels up but never compiles (RLK_JIT=0) nor
 * reads a tuning database (RLK_TUNE=off). Ends the process (`who` says which) without one. */
FUZZ_UNUSED static rlk_context *fz_planning_context(const char *who) {
  setenv("RLK_JIT", "0", 1);
  setenv("RLK_TUNE", "off", 1);
  setenv("RLK_CACHE_DIR", fz_scratch(), 1);
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = RLK_BACKEND_HOST;
  o.compile_only = 1;
  rlk_context *ctx = NULL;
  if (rlk_context_create(&ctx, &o) != RLK_OK) {
    fprintf(stderr, "%s: no host context: %s\n", who, rlk_last_error());
    exit(1);
  }
  return ctx;
}

/* Writes `n` bytes to `path` (replacing it); 0 or -1. */
FUZZ_UNUSED static int fz_write_file(const char *path, const uint8_t *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int rc = (n && fwrite(data, 1, n, f) != n) ? -1 : 0;
  if (fclose(f) != 0) rc = -1;
  return rc;
}

#endif

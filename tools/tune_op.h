/* tune_op.h - what rlk-tune's timing process needs of an op with tuning candidates, and what
 * the ops' implementations share: random non-zero device inputs and output comparisons.
 *
 * An op's implementation (tools/tune_<op>.h) reads its problem from a record's key, makes fresh
 * random inputs on the device, calls the op through the public API with a candidate's tuning
 * settings, and compares a candidate's outputs with the default's. rlk-tune.c includes them and
 * lists them in tune_ops[]. Header-only, like the other tool headers; a tool includes tool_util.h
 * and tool_config.h first. */
#ifndef RLK_TUNE_OP_H
#define RLK_TUNE_OP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "rlk.h"

#define MAX_ROTATE 64                  /* input sets at the most */
#define MAX_CHECK_ROWS 64              /* rows of an output compared with the default's */
#define RANDOM_CHUNK ((size_t)1 << 24) /* random values generated per set, then tiled */

typedef struct tune_op {
  const char *name;
  size_t problem_size; /* bytes of the op's problem struct */
  /* The problem of a configuration from its record's key and the line's token count: 0, or -1
   * with why. The problem arrives zeroed. */
  int (*problem_of)(const rlk_tune_record *key, int64_t tokens, void *problem, char *why, size_t size);
  /* A backward's inputs come from the op's default forward: its configuration line (allocated;
   * compiled ahead like the candidates), or NULL when the problem needs none. */
  char *(*input_line)(const void *problem);
  /* Fresh random inputs (several sets, rotated, when one fits in l2_bytes of cache). */
  rlk_status (*setup)(rlk_context *ctx, const void *problem, uint64_t seed, double l2_bytes, void **bench, char *why,
                      size_t size);
  int (*nsets)(const void *bench);
  /* One call on input set `set` with tuning settings ("" for the default). */
  rlk_status (*call)(void *bench, int set, const char *settings);
  /* Poisons set 0's outputs, calls once, and keeps the outputs compared: as the reference
   * (reference 1: the default's) or as the candidate's. */
  rlk_status (*checked_call)(void *bench, const char *settings, int reference, char *why, size_t size);
  /* The candidate's kept outputs against the reference: the largest error relative to the
   * tolerance (<= 1 agrees), described in where. */
  double (*check)(void *bench, char *where, size_t size);
  void (*destroy)(void *bench);
} tune_op;

/* ---- random non-zero inputs ---- */

static uint16_t bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static double value_at(const void *base, rlk_dtype d, size_t i) {
  if (d == RLK_F32) return ((const float *)base)[i];
  if (d == RLK_BF16) {
    uint32_t u = (uint32_t)((const uint16_t *)base)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
  }
  _Float16 h;
  memcpy(&h, (const uint16_t *)base + i, sizeof h);
  return (double)h;
}

/* Stores a non-zero value (zero becomes 0.25) at element i. */
static void store_nonzero(void *base, rlk_dtype d, size_t i, double x) {
  for (int k = 0; k < 2; k++) {
    if (d == RLK_F32) {
      ((float *)base)[i] = (float)x;
    } else if (d == RLK_BF16) {
      ((uint16_t *)base)[i] = bf16_bits((float)x);
    } else {
      _Float16 h = (_Float16)x;
      memcpy((uint16_t *)base + i, &h, sizeof h);
    }
    if (value_at(base, d, i) != 0.0) return;
    x = 0.25;
  }
}

/* ---- device memory and errors ---- */

/* Returns a failed call's status, with "<what>: <status>: <detail>" in why. */
#define TRY(what, call)                                                                        \
  do {                                                                                         \
    rlk_status st_ = (call);                                                                   \
    if (st_ != RLK_OK) {                                                                       \
      snprintf(why, whysize, "%s: %s: %s", what, rlk_status_string(st_), rlk_last_error());    \
      return st_;                                                                              \
    }                                                                                          \
  } while (0)

static rlk_status alloc_dev(rlk_context *ctx, size_t bytes, void **p, char *why, size_t whysize) {
  TRY("allocating device memory", rlk_malloc(ctx, bytes, p));
  return RLK_OK;
}

/* Replaces a workspace smaller than `need` bytes with one of `need` bytes (left empty when the
 * allocation fails). */
static rlk_status grow_workspace(rlk_context *ctx, size_t need, void **work, size_t *work_bytes, char *why,
                                 size_t whysize) {
  if (need <= *work_bytes) return RLK_OK;
  rlk_free(ctx, *work);
  *work = NULL;
  *work_bytes = 0;
  TRY("allocating the workspace", rlk_malloc(ctx, need, work));
  *work_bytes = need;
  return RLK_OK;
}

/* Random vector of n f32 values in [lo, hi), none of them zero. */
static rlk_status upload_floats(rlk_context *ctx, float **dst, size_t n, uint64_t *rng, double lo, double hi,
                                char *why, size_t whysize) {
  rlk_status st = alloc_dev(ctx, n * 4, (void **)dst, why, whysize);
  if (st) return st;
  float *h = xrealloc(NULL, n * 4);
  for (size_t i = 0; i < n; i++) store_nonzero(h, RLK_F32, i, lo + (hi - lo) * rng_uniform(rng));
  st = rlk_memcpy_to_device(ctx, *dst, h, n * 4);
  free(h);
  if (st) snprintf(why, whysize, "uploading inputs: %s", rlk_last_error());
  return st;
}

/* n random 16-bit values of dtype d, uniform in [lo, hi), none zero: a chunk of them tiled (not a
 * whole number of rows, so that rows differ). */
static rlk_status upload_random16(rlk_context *ctx, void **dst, rlk_dtype d, size_t n, uint64_t *rng, double lo,
                                  double hi, char *why, size_t whysize) {
  rlk_status st = alloc_dev(ctx, n * 2, dst, why, whysize);
  if (st) return st;
  const size_t chunk = n < RANDOM_CHUNK ? n : RANDOM_CHUNK + 7;
  uint16_t *h = xrealloc(NULL, chunk * 2);
  for (size_t i = 0; i < chunk; i++) store_nonzero(h, d, i, lo + (hi - lo) * rng_uniform(rng));
  for (size_t off = 0; off < n && !st; off += chunk) {
    const size_t m = n - off < chunk ? n - off : chunk;
    if ((st = rlk_memcpy_to_device(ctx, (uint16_t *)*dst + off, h, m * 2)))
      snprintf(why, whysize, "uploading inputs: %s", rlk_last_error());
  }
  free(h);
  return st;
}

/* ---- reading a key ---- */

static const char *setting_of(const char *line, const char *name, char *buf, size_t size) {
  size_t n = strlen(name);
  for (const char *p = strchr(line, ' '); p; p = strchr(p + 1, ' '))
    if (!strncmp(p + 1, name, n) && p[1 + n] == '=') {
      const char *v = p + 2 + n, *e = strchr(v, ' ');
      size_t len = e ? (size_t)(e - v) : strlen(v);
      if (len >= size) len = size - 1;
      memcpy(buf, v, len);
      buf[len] = '\0';
      return buf;
    }
  return NULL;
}

static rlk_dtype dtype_named(const char *s) {
  static const rlk_dtype all[] = {RLK_F32, RLK_F16, RLK_BF16, RLK_F64, RLK_I32, RLK_I64};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (!strcmp(rlk_dtype_name(all[i]), s)) return all[i];
  return RLK_DTYPE_INVALID;
}

/* The value of setting `name` in a record's key into buf: buf, or NULL when the key has none. */
static const char *key_setting(const rlk_tune_record *key, const char *name, char *buf, size_t size) {
  char line[300];
  snprintf(line, sizeof line, "%s %s", key->op, key->shape);
  return setting_of(line, name, buf, size);
}

/* Whether the key sets `name` to `value`. */
static int key_is(const rlk_tune_record *key, const char *name, const char *value) {
  char v[64];
  return key_setting(key, name, v, sizeof v) && !strcmp(v, value);
}

/* The dtype the key names for `name`: RLK_DTYPE_INVALID when it names none or none known. */
static rlk_dtype key_dtype(const rlk_tune_record *key, const char *name) {
  char v[64];
  return key_setting(key, name, v, sizeof v) ? dtype_named(v) : RLK_DTYPE_INVALID;
}

/* The integer the key sets `name` to: 0 when it sets none. */
static int64_t key_int(const rlk_tune_record *key, const char *name) {
  char v[64];
  return key_setting(key, name, v, sizeof v) ? strtoll(v, NULL, 10) : 0;
}

/* The settings logprob's and linear_logprob's keys share: the pass, entropy=1 and the labels'
 * dtype. */
static void logprob_key_settings(const rlk_tune_record *key, int *bwd, int *entropy, rlk_dtype *labels) {
  *bwd = key_is(key, "pass", "bwd");
  *entropy = key_is(key, "entropy", "1");
  *labels = key_dtype(key, "labels");
}

/* The integer value of `name` in a candidate's settings ("group=16 chunk=8192") into *dst; *dst
 * is left alone when the settings do not name it. */
static void setting_int(const char *settings, const char *name, int *dst) {
  char line[512], v[64];
  snprintf(line, sizeof line, " %s", settings);
  if (setting_of(line, name, v, sizeof v)) *dst = atoi(v);
}

/* ---- comparing outputs ---- */

/* Largest error of got against ref relative to the tolerance (<= 1 agrees), and a description. */
static double compare(const void *got, const void *ref, rlk_dtype d, size_t n, double rtol, char *where,
                      size_t size, const char *what) {
  double scale = 0, worst = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(value_at(ref, d, i)));
  for (size_t i = 0; i < n; i++) {
    const double a = value_at(got, d, i), e = value_at(ref, d, i);
    double err;
    if (isnan(a) || isnan(e))
      err = isnan(a) && isnan(e) ? 0 : INFINITY;
    else
      err = fabs(a - e) / (rtol * (fabs(e) + 1e-3 * scale) + 1e-30);
    if (err > worst) {
      worst = err;
      snprintf(where, size, "%s[%zu] = %.9g, the default's %.9g", what, i, a, e);
    }
  }
  return worst;
}

static double rtol_of(rlk_dtype d) { return d == RLK_BF16 ? 1.0 / 64 : d == RLK_F16 ? 1.0 / 256 : 1e-4; }

#endif

/* fuzz_precompile.c - configuration lines ("op name=value ...") through every public entry
 * that parses them: rlk_precompile_keys (with output buffers of every size), rlk_precompile
 * (RLK_JIT=0, so a line is planned and looked up but never compiled), rlk_tune_record_set_key,
 * rlk_tune_lookup and rlk_precompile_help.
 *
 * Input: one byte choosing the key buffer's size, then the line. Checks beyond the sanitizers:
 * a key list that is NUL-terminated inside its buffer, holds exactly the kernels counted as
 * 64-hex-digit keys and is the same on a second call; a record key with a power-of-two bucket. */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "rlk.h"

static rlk_context *ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fz_init(argc, argv);
  ctx = fz_planning_context("fuzz_precompile");
  return 0;
}

static void check_keys(const char *buf, size_t size, int kernels) {
  const char *end = memchr(buf, '\0', size);
  if (!end) fz_fail("rlk_precompile_keys", "key list not terminated inside its buffer");
  if (kernels < 0) fz_fail("rlk_precompile_keys", "negative kernel count");
  int n = 0;
  for (const char *p = buf; *p;) {
    for (int i = 0; i < 64; i++)
      if (!isxdigit((unsigned char)p[i])) fz_fail("rlk_precompile_keys", "a key is not 64 hex digits");
    p += 64;
    n++;
    if (*p == ' ') p++;
    else if (*p) fz_fail("rlk_precompile_keys", "keys are not space-separated");
  }
  if (n != kernels) fz_fail("rlk_precompile_keys", "kernel count differs from the keys written");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  static const size_t sizes[] = {0, 1, 64, 65, 66, 129, 130, 300, 4096};
  size_t cap = sizes[data[0] % (sizeof sizes / sizeof sizes[0])];
  char *line = malloc(size);
  memcpy(line, data + 1, size - 1);
  line[size - 1] = '\0';

  char *buf = cap ? malloc(cap) : NULL;
  int kernels = -1;
  rlk_status st = fz_checked(rlk_precompile_keys(ctx, line, buf, cap, &kernels), "rlk_precompile_keys");
  if (st == RLK_OK) {
    check_keys(buf, cap, kernels);
    char *again = malloc(cap);
    int k2 = -1;
    if (rlk_precompile_keys(ctx, line, again, cap, &k2) != RLK_OK || k2 != kernels || strcmp(buf, again))
      fz_fail("rlk_precompile_keys", "a second call gives other keys");
    free(again);
  }
  free(buf);

  int compiled = -1;
  st = fz_checked(rlk_precompile(ctx, line, &compiled), "rlk_precompile");
  if (st == RLK_OK && compiled != 0) fz_fail("rlk_precompile", "compiled kernels under RLK_JIT=0");

  rlk_tune_record rec;
  rlk_tune_record_init(&rec);
  st = fz_checked(rlk_tune_record_set_key(&rec, line), "rlk_tune_record_set_key");
  if (st == RLK_OK) {
    if (rec.tokens < 1 || (rec.tokens & (rec.tokens - 1)))
      fz_fail("rlk_tune_record_set_key", "token bucket is not a power of two");
    if (!memchr(rec.op, '\0', sizeof rec.op) || !memchr(rec.shape, '\0', sizeof rec.shape) || !rec.op[0])
      fz_fail("rlk_tune_record_set_key", "op or shape unterminated or empty");
  }

  char settings[128];
  int found = 0;
  fz_checked(rlk_tune_lookup(ctx, line, settings, sizeof settings, &found), "rlk_tune_lookup");
  if (found) fz_fail("rlk_tune_lookup", "found a record with RLK_TUNE=off");

  char op[64];
  size_t oplen = strcspn(line, " \t");
  if (oplen < sizeof op) {
    memcpy(op, line, oplen);
    op[oplen] = '\0';
    if (!rlk_precompile_help(op)) fz_fail("rlk_precompile_help", "returned NULL");
    if (!rlk_tune_candidates(op)) fz_fail("rlk_tune_candidates", "returned NULL");
  }
  free(line);
  return 0;
}

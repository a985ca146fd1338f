/* test_key.c - the cache key: every field matters, equal fields hash equally, fields survive
 * the text round trip used by the metadata, and the length prefixes keep field boundaries. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "jit/key.h"
#include "jit/sha256.h"
#include "suites.h"
#include "test_util.h"

/* A key with fresh random values in every field. */
static void random_key(rlk_kernel_key *k, uint64_t *rng) {
  memset(k, 0, sizeof *k);
  k->schema = RLK_CACHE_SCHEMA;
  k->codegen = RLK_CODEGEN_VERSION;
  unsigned r = (unsigned)rlk_test_rand_u64(rng);
  snprintf(k->family, sizeof k->family, "family_%u", r % 1000);
  snprintf(k->entry, sizeof k->entry, "entry_%u", r % 997);
  uint8_t d[32];
  uint64_t seed = rlk_test_rand_u64(rng);
  rlk_sha256_digest(&seed, sizeof seed, d);
  rlk_sha256_hex(d, k->template_digest);
  snprintf(k->params, sizeof k->params, "block=%u dtype=bf16 group=%u", 32u << (r % 4), r % 64);
  snprintf(k->names, sizeof k->names, "kern<%u>;kern2<%u>", r % 7, r % 11);
  snprintf(k->target, sizeof k->target, "sm_%u", 70 + r % 30);
  snprintf(k->compiler, sizeof k->compiler, "nvrtc-12.%u", r % 9);
  snprintf(k->options, sizeof k->options, "-O3 --std=c++17 -DX=%u", r);
  snprintf(k->env, sizeof k->env, "%s", "");
  rlk_key_finish(k);
}

/* Changes field i in a way that keeps it valid. */
static void perturb(rlk_kernel_key *k, int i) {
  char buf[1100];
  rlk_key_field(k, i, buf, sizeof buf);
  const char *name = rlk_key_field_names[i];
  if (strcmp(name, "schema") == 0 || strcmp(name, "codegen") == 0) {
    int v = 0;
    sscanf(buf, "%d", &v);
    snprintf(buf, sizeof buf, "%d", v + 1);
  } else {
    size_t n = strlen(buf);
    if (n == 0)
      strcpy(buf, "X=1;");
    else
      buf[n - 1] = (char)(buf[n - 1] == 'a' ? 'b' : 'a');
  }
  ck_assert_int_eq(rlk_key_set_field(k, i, buf), RLK_OK);
}

START_TEST(test_every_field_changes_hash) {
  uint64_t rng = rlk_test_seed() ^ 1;
  rlk_kernel_key base;
  random_key(&base, &rng);
  char seen[RLK_KEY_NFIELDS + 1][65];
  snprintf(seen[0], 65, "%s", base.hex);
  for (int i = 0; i < RLK_KEY_NFIELDS; i++) {
    rlk_kernel_key k = base;
    perturb(&k, i);
    rlk_key_finish(&k);
    ck_assert_msg(strcmp(k.hex, base.hex) != 0, "field %s does not change the hash",
                  rlk_key_field_names[i]);
    snprintf(seen[i + 1], 65, "%s", k.hex);
    for (int j = 0; j <= i; j++) ck_assert_str_ne(seen[j], seen[i + 1]);
  }
  ck_assert_uint_eq(strlen(base.hex), 64);
}
END_TEST

START_TEST(test_equal_fields_equal_hash) {
  uint64_t rng = rlk_test_seed() ^ 2, rng2 = rng;
  rlk_kernel_key a, b;
  random_key(&a, &rng);
  /* Same values, but different bytes after every terminator and in the hash slots. */
  memset(&b, 0xA5, sizeof b);
  rlk_kernel_key tmp;
  random_key(&tmp, &rng2);
  for (int i = 0; i < RLK_KEY_NFIELDS; i++) {
    char buf[1100];
    rlk_key_field(&tmp, i, buf, sizeof buf);
    ck_assert_int_eq(rlk_key_set_field(&b, i, buf), RLK_OK);
  }
  rlk_key_finish(&b);
  ck_assert_str_eq(a.hex, b.hex);
  ck_assert(memcmp(a.hash, b.hash, 32) == 0);
  /* Finishing twice is stable. */
  rlk_key_finish(&a);
  ck_assert_str_eq(a.hex, b.hex);
}
END_TEST

START_TEST(test_field_round_trip) {
  uint64_t rng = rlk_test_seed() ^ 3;
  rlk_kernel_key a, b;
  random_key(&a, &rng);
  /* Values with characters a metadata writer must not lose. */
  ck_assert_int_eq(rlk_key_set_field(&a, 4, "name=a b\tc\\d=e\nf"), RLK_OK);
  ck_assert_int_eq(rlk_key_set_field(&a, 0, "-3"), RLK_OK);
  rlk_key_finish(&a);
  memset(&b, 0, sizeof b);
  for (int i = 0; i < RLK_KEY_NFIELDS; i++) {
    char buf[1100];
    rlk_key_field(&a, i, buf, sizeof buf);
    ck_assert_int_eq(rlk_key_set_field(&b, i, buf), RLK_OK);
  }
  for (int i = 0; i < RLK_KEY_NFIELDS; i++) {
    char x[1100], y[1100];
    rlk_key_field(&a, i, x, sizeof x);
    rlk_key_field(&b, i, y, sizeof y);
    ck_assert_str_eq(x, y);
  }
  ck_assert_int_eq(b.schema, -3);
  rlk_key_finish(&b);
  ck_assert_str_eq(a.hex, b.hex);
  ck_assert_str_eq(rlk_key_field_names[0], "schema");
  ck_assert_str_eq(rlk_key_field_names[3], "template_digest");
  ck_assert_str_eq(rlk_key_field_names[RLK_KEY_NFIELDS - 1], "env");
}
END_TEST

START_TEST(test_set_field_rejects) {
  rlk_kernel_key k;
  memset(&k, 0, sizeof k);
  char big[2000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  for (int i = 0; i < RLK_KEY_NFIELDS; i++) {
    if (i == 0 || i == 9) continue;
    ck_assert_int_eq(rlk_key_set_field(&k, i, big), RLK_ERR_INVALID_ARGUMENT);
  }
  ck_assert_int_eq(rlk_key_set_field(&k, 0, "12x"), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_key_set_field(&k, 9, ""), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_key_set_field(&k, 9, "99999999999"), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_key_set_field(&k, RLK_KEY_NFIELDS, "a"), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_key_set_field(&k, -1, "a"), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_key_set_field(&k, 1, NULL), RLK_ERR_INVALID_ARGUMENT);
  rlk_test_expect_error(rlk_key_set_field(&k, 1, big), RLK_ERR_INVALID_ARGUMENT, "family", "rlk_key_set_field");
  /* The longest value that fits does. */
  big[sizeof k.family - 1] = '\0';
  ck_assert_int_eq(rlk_key_set_field(&k, 1, big), RLK_OK);
  ck_assert_uint_eq(strlen(k.family), sizeof k.family - 1);
}
END_TEST

START_TEST(test_length_prefixing) {
  uint64_t rng = rlk_test_seed() ^ 4;
  rlk_kernel_key a;
  random_key(&a, &rng);
  /* Move one byte across the boundary of every pair of adjacent text fields. */
  for (int i = 1; i + 1 < RLK_KEY_NFIELDS; i++) {
    if (i + 1 == 9 || i == 9) continue; /* codegen is an integer */
    rlk_kernel_key x = a, y = a;
    ck_assert_int_eq(rlk_key_set_field(&x, i, "ab"), RLK_OK);
    ck_assert_int_eq(rlk_key_set_field(&x, i + 1, "c"), RLK_OK);
    ck_assert_int_eq(rlk_key_set_field(&y, i, "a"), RLK_OK);
    ck_assert_int_eq(rlk_key_set_field(&y, i + 1, "bc"), RLK_OK);
    rlk_key_finish(&x);
    rlk_key_finish(&y);
    ck_assert_msg(strcmp(x.hex, y.hex) != 0, "moving a byte from %s to %s keeps the hash",
                  rlk_key_field_names[i], rlk_key_field_names[i + 1]);
  }
  /* An empty field is not the same as a missing one: "" then "x" vs "x" then "". */
  rlk_kernel_key p = a, q = a;
  rlk_key_set_field(&p, 5, "");
  rlk_key_set_field(&p, 6, "x");
  rlk_key_set_field(&q, 5, "x");
  rlk_key_set_field(&q, 6, "");
  rlk_key_finish(&p);
  rlk_key_finish(&q);
  ck_assert_str_ne(p.hex, q.hex);
}
END_TEST

/* The serialization spelled out independently, and the hash is SHA-256 of exactly it. */
START_TEST(test_serialization_bytes) {
  rlk_kernel_key k;
  memset(&k, 0, sizeof k);
  k.schema = 1;
  k.codegen = 7;
  strcpy(k.family, "fam");
  strcpy(k.entry, "go");
  strcpy(k.template_digest, "d");
  strcpy(k.params, "a=1 b=22");
  strcpy(k.target, "sm_90a");
  strcpy(k.compiler, "nvrtc-13.0");
  strcpy(k.options, "-O3");
  const char *parts[][2] = {{"schema", "1"},      {"family", "fam"},       {"entry", "go"},
                            {"template_digest", "d"}, {"params", "a=1 b=22"}, {"names", ""},
                            {"target", "sm_90a"}, {"compiler", "nvrtc-13.0"}, {"options", "-O3"},
                            {"codegen", "7"},     {"env", ""}};
  char want[1024];
  size_t n = 0;
  for (size_t i = 0; i < 11; i++) {
    size_t a = strlen(parts[i][0]), b = strlen(parts[i][1]);
    memcpy(want + n, parts[i][0], a + 1);
    n += a + 1;
    n += (size_t)sprintf(want + n, "%zu", b) + 1;
    memcpy(want + n, parts[i][1], b);
    n += b;
  }
  char got[1024];
  ck_assert_uint_eq(rlk_key_serialize(&k, got, sizeof got), n);
  ck_assert(memcmp(got, want, n) == 0);
  /* A short buffer gets a prefix and the full length is still reported. */
  char small[10];
  ck_assert_uint_eq(rlk_key_serialize(&k, small, sizeof small), n);
  ck_assert(memcmp(small, want, sizeof small) == 0);
  ck_assert_uint_eq(rlk_key_serialize(&k, NULL, 0), n);

  rlk_key_finish(&k);
  uint8_t d[32];
  char hex[65];
  rlk_sha256_digest(want, n, d);
  rlk_sha256_hex(d, hex);
  ck_assert_str_eq(k.hex, hex);
  ck_assert(memcmp(k.hash, d, 32) == 0);
}
END_TEST

START_TEST(test_key_env_empty_today) {
  char buf[64];
  memset(buf, 'q', sizeof buf);
  rlk_key_env(buf, sizeof buf);
  ck_assert_str_eq(buf, "");
}
END_TEST

Suite *key_suite(void) {
  Suite *s = suite_create("key");
  rlk_test_add_case(s, "key", 0, TESTS(test_every_field_changes_hash, test_equal_fields_equal_hash,
      test_field_round_trip, test_set_field_rejects, test_length_prefixing, test_serialization_bytes,
      test_key_env_empty_today));
  return s;
}

/* test_sha256.c - SHA-256 against the FIPS 180-4 / NIST example vectors, and incremental
 * hashing against one-shot hashing for every way of splitting a message. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jit/sha256.h"
#include "suites.h"
#include "test_util.h"

static void hex_of(const void *data, size_t n, char hex[65]) {
  uint8_t d[32];
  rlk_sha256_digest(data, n, d);
  rlk_sha256_hex(d, hex);
}

START_TEST(test_nist_vectors) {
  static const struct {
    const char *msg;
    const char *digest;
  } v[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      /* 448 bits: the padding no longer fits in the message's block. */
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      /* 896 bits */
      {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlm"
       "nopqrsmnopqrstnopqrstu",
       "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
  };
  char hex[65];
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    hex_of(v[i].msg, strlen(v[i].msg), hex);
    ck_assert_msg(strcmp(hex, v[i].digest) == 0, "vector %zu: %s != %s", i, hex, v[i].digest);
  }
}
END_TEST

START_TEST(test_million_a) {
  const char *want = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  size_t n = 1000000;
  char *a = malloc(n);
  ck_assert_ptr_nonnull(a);
  memset(a, 'a', n);
  char hex[65];
  hex_of(a, n, hex);
  ck_assert_str_eq(hex, want);
  /* The same through updates of an odd size that straddles every block boundary. */
  rlk_sha256 h;
  uint8_t d[32];
  rlk_sha256_init(&h);
  for (size_t off = 0; off < n; off += 997)
    rlk_sha256_update(&h, a + off, n - off < 997 ? n - off : 997);
  rlk_sha256_final(&h, d);
  rlk_sha256_hex(d, hex);
  ck_assert_str_eq(hex, want);
  free(a);
}
END_TEST

START_TEST(test_split_at_every_offset) {
  uint64_t rng = rlk_test_seed() ^ 0x5a5a;
  /* Long enough to cover several blocks and both padding cases. */
  size_t n = 130 + (size_t)(rlk_test_rand_u64(&rng) % 200);
  uint8_t *msg = malloc(n);
  ck_assert_ptr_nonnull(msg);
  for (size_t i = 0; i < n; i++) msg[i] = (uint8_t)rlk_test_rand_u64(&rng);
  uint8_t whole[32], part[32];
  rlk_sha256_digest(msg, n, whole);
  for (size_t cut = 0; cut <= n; cut++) {
    rlk_sha256 h;
    rlk_sha256_init(&h);
    rlk_sha256_update(&h, msg, cut);
    rlk_sha256_update(&h, msg + cut, n - cut);
    rlk_sha256_final(&h, part);
    ck_assert_msg(memcmp(whole, part, 32) == 0, "split at %zu of %zu differs (seed %llu)", cut, n,
                  (unsigned long long)rlk_test_seed());
  }
  /* Three pieces, and one byte at a time. */
  for (size_t a = 0; a <= n; a += 7)
    for (size_t b = a; b <= n; b += 13) {
      rlk_sha256 h;
      rlk_sha256_init(&h);
      rlk_sha256_update(&h, msg, a);
      rlk_sha256_update(&h, msg + a, b - a);
      rlk_sha256_update(&h, msg + b, n - b);
      rlk_sha256_final(&h, part);
      ck_assert_msg(memcmp(whole, part, 32) == 0, "split at %zu,%zu differs", a, b);
    }
  rlk_sha256 h;
  rlk_sha256_init(&h);
  for (size_t i = 0; i < n; i++) rlk_sha256_update(&h, msg + i, 1);
  rlk_sha256_final(&h, part);
  ck_assert(memcmp(whole, part, 32) == 0);
  free(msg);
}
END_TEST

/* Every length around the padding boundaries against the system's sha256sum, an independent
 * implementation, when one is installed. */
START_TEST(test_lengths_against_sha256sum) {
  FILE *probe = popen("sha256sum --version 2>/dev/null", "r");
  char line[256];
  int have = probe && fgets(line, sizeof line, probe) != NULL;
  if (probe) pclose(probe);
  if (!have) {
    printf("skip (sha256 lengths): no sha256sum to compare with\n");
    return;
  }
  uint64_t rng = rlk_test_seed() ^ 0xabc;
  char dir[1024], path[1200], cmd[1400];
  rlk_test_mkdtemp(dir, sizeof dir, "sha");
  snprintf(path, sizeof path, "%s/msg", dir);
  static const size_t lens[] = {1, 55, 56, 57, 63, 64, 65, 111, 119, 120, 127, 128, 129, 1000};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    uint8_t msg[1000];
    for (size_t j = 0; j < lens[i]; j++) msg[j] = (uint8_t)rlk_test_rand_u64(&rng);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(msg, 1, lens[i], f), lens[i]);
    fclose(f);
    snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(fgets(line, sizeof line, p));
    pclose(p);
    char hex[65];
    hex_of(msg, lens[i], hex);
    ck_assert_msg(strncmp(line, hex, 64) == 0, "length %zu: %s vs %.64s", lens[i], hex, line);
  }
}
END_TEST

START_TEST(test_hex) {
  uint8_t d[32];
  for (int i = 0; i < 32; i++) d[i] = (uint8_t)(i * 8 + 7);
  char hex[65];
  memset(hex, 'z', sizeof hex);
  rlk_sha256_hex(d, hex);
  ck_assert_uint_eq(strlen(hex), 64);
  ck_assert(strncmp(hex, "070f171f", 8) == 0);
  ck_assert(strcmp(hex + 56, "e7eff7ff") == 0);
}
END_TEST

Suite *sha256_suite(void) {
  Suite *s = suite_create("sha256");
  rlk_test_add_case(s, "sha256", 0, TESTS(test_nist_vectors, test_million_a, test_split_at_every_offset,
      test_lengths_against_sha256sum, test_hex));
  return s;
}

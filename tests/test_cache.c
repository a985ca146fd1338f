/* test_cache.c - the on-disk kernel cache: round trips, read-only trees, damaged entries,
 * unusable and untrusted roots, eviction, concurrent publishers, the per-key lock, and the
 * public management API (walk, verify, prune, clear). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "core/fs.h"
#include "jit/cache.h"
#include "jit/key.h"
#include "suites.h"
#include "test_util.h"

#define OTHER_UID 65534 /* "nobody": a user that is not us, for ownership cases run as root */

/* snprintf into an array, failing the test on truncation. */
#define FMT(buf, ...) ck_assert(snprintf(buf, sizeof buf, __VA_ARGS__) < (int)sizeof buf)

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static uint64_t rng_for(uint64_t salt) { return rlk_test_seed() ^ (salt * 0x9e3779b97f4a7c15ull); }

static void test_cfg(rlk_cache_config *cfg, const char *root) {
  memset(cfg, 0, sizeof *cfg);
  cfg->mode = RLK_CACHE_MODE_RW;
  FMT(cfg->root, "%s", root);
  char locks[1024];
  rlk_test_mkdtemp(locks, sizeof locks, "locks");
  FMT(cfg->lock_dir, "%s", locks);
  cfg->lock_timeout_s = 30;
}

static rlk_cache *open_cache(const rlk_cache_config *cfg) {
  rlk_cache *c = NULL;
  rlk_status st = rlk_cache_open(cfg, &c);
  ck_assert_msg(st == RLK_OK, "rlk_cache_open: %s", rlk_last_error());
  ck_assert_ptr_nonnull(c);
  return c;
}

/* A writable cache over a new empty root (its path in `root`, `cfg` what opened it). */
static rlk_cache *open_fresh_cache(char *root, size_t size, const char *stem, rlk_cache_config *cfg) {
  rlk_test_mkdtemp(root, size, stem);
  test_cfg(cfg, root);
  return open_cache(cfg);
}

static void make_key(rlk_kernel_key *k, uint64_t *rng, const char *family) {
  memset(k, 0, sizeof *k);
  k->schema = RLK_CACHE_SCHEMA;
  k->codegen = RLK_CODEGEN_VERSION;
  FMT(k->family, "%s", family);
  FMT(k->entry, "%s_kernel", family);
  FMT(k->template_digest, "%016llx",
           (unsigned long long)rlk_test_rand_u64(rng));
  FMT(k->params, "block=%u dtype=f32 tag=%llx",
           32u << (rlk_test_rand_u64(rng) % 4), (unsigned long long)rlk_test_rand_u64(rng));
  FMT(k->names, "%s_kernel<256>", family);
  FMT(k->target, "sm_90a");
  FMT(k->compiler, "nvrtc-13.0");
  FMT(k->options, "-O3 --std=c++17");
  rlk_key_finish(k);
}

static uint8_t *random_bytes(uint64_t *rng, size_t n) {
  uint8_t *p = malloc(n ? n : 1);
  ck_assert_ptr_nonnull(p);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rlk_test_rand_u64(rng);
  return p;
}

static void publish(rlk_cache *c, const rlk_kernel_key *k, const uint8_t *bin, size_t n) {
  char n0[] = "kern<256>", n1[] = "ns::kern<128, float>";
  char *names[] = {n0, n1};
  rlk_cache_publish_info info = {"kernel.cubin", 1.25, "ptxas info: 0 bytes spill\nwarning: x"};
  rlk_status st = rlk_cache_publish(c, k, bin, n, names, 2, &info);
  ck_assert_msg(st == RLK_OK, "publish: %s", rlk_last_error());
}

/* 1 on a hit (blob filled, caller frees), 0 on a miss. */
static int lookup(rlk_cache *c, const rlk_kernel_key *k, rlk_cache_blob *b, int *rebuilt) {
  int found = -1;
  rlk_status st = rlk_cache_lookup(c, k, b, &found, rebuilt);
  ck_assert_msg(st == RLK_OK, "lookup: %s", rlk_last_error());
  ck_assert(found == 0 || found == 1);
  return found;
}

static void expect_hit(rlk_cache *c, const rlk_kernel_key *k, const uint8_t *bin, size_t n) {
  rlk_cache_blob b;
  int rebuilt = 0;
  ck_assert_msg(lookup(c, k, &b, &rebuilt), "expected a hit for %s", k->hex);
  ck_assert_uint_eq(b.size, n);
  ck_assert(memcmp(b.binary, bin, n) == 0);
  ck_assert_int_eq(rebuilt, 0);
  rlk_cache_blob_free(&b);
}

/* The layout spelled out independently of the cache's code. */
static void entry_dir(const char *root, const rlk_kernel_key *k, char *buf, size_t size) {
  int n = snprintf(buf, size, "%s/v%d/%s/%s/%s/%.2s/%s", root, k->schema, k->compiler,
                   k->target, k->family, k->hex, k->hex);
  ck_assert(n > 0 && (size_t)n < size);
}

static int exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static int count_children(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL)
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
  closedir(d);
  return n;
}

static int count_visit(const rlk_cache_entry *e, void *user) {
  (void)e;
  (*(int *)user)++;
  return 0;
}

static int count_entries(const char *root) {
  int n = 0;
  ck_assert_int_eq(rlk_cache_walk(root, count_visit, &n), RLK_OK);
  return n;
}

/* Apparent size of the regular files of a directory. */
static uint64_t dir_bytes(const char *dir) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  uint64_t n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    char p[2048];
    struct stat st;
    FMT(p, "%s/%s", dir, de->d_name);
    if (lstat(p, &st) == 0 && S_ISREG(st.st_mode)) n += (uint64_t)st.st_size;
  }
  closedir(d);
  return n;
}

static void set_mtime(const char *path, int64_t t) {
  struct timespec ts[2] = {{(time_t)t, 0}, {(time_t)t, 0}};
  ck_assert_msg(utimensat(AT_FDCWD, path, ts, 0) == 0, "utimensat %s: %s", path, strerror(errno));
}

static int64_t mtime_of(const char *path) {
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  return (int64_t)st.st_mtime;
}

/* stderr capture, to count warnings. */
typedef struct capture {
  int saved;
  char path[1100];
} capture;

static void capture_begin(capture *cap) {
  char dir[1024];
  rlk_test_mkdtemp(dir, sizeof dir, "stderr");
  FMT(cap->path, "%s/err", dir);
  fflush(stderr);
  cap->saved = dup(2);
  int fd = open(cap->path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
  ck_assert_int_ge(fd, 0);
  dup2(fd, 2);
  close(fd);
}

/* Restores stderr, echoes what was captured and returns the number of warnings. */
static int capture_end(capture *cap, const char *must_contain) {
  fflush(stderr);
  dup2(cap->saved, 2);
  close(cap->saved);
  FILE *f = fopen(cap->path, "r");
  ck_assert_ptr_nonnull(f);
  char line[8192];
  int warnings = 0, found = must_contain == NULL;
  while (fgets(line, sizeof line, f)) {
    fputs(line, stderr);
    if (strstr(line, "rlk warn")) warnings++;
    if (must_contain && strstr(line, must_contain)) found = 1;
  }
  fclose(f);
  ck_assert_msg(found, "no warning mentions '%s'", must_contain);
  return warnings;
}

/* ---------------------------------------------------------------------------------------- */
/* Round trips                                                                              */
/* ---------------------------------------------------------------------------------------- */

START_TEST(test_publish_lookup_round_trip) {
  uint64_t rng = rng_for(1);
  char root[1024], dir[1200], path[1300];
  rlk_cache_config cfg;
  rlk_cache *c = open_fresh_cache(root, sizeof root, "rt", &cfg);
  ck_assert_int_eq(rlk_cache_effective_mode(c), RLK_CACHE_MODE_RW);
  ck_assert_str_eq(rlk_cache_root(c), root);

  rlk_kernel_key k;
  make_key(&k, &rng, "roundtrip");
  /* Field values that a line-based metadata file must escape to keep. */
  ck_assert_int_eq(rlk_key_set_field(&k, 4, "a=1\nb=\\x41\r\x01 end=1"), RLK_OK);
  rlk_key_finish(&k);

  rlk_cache_blob b;
  int rebuilt = 0;
  ck_assert_int_eq(lookup(c, &k, &b, &rebuilt), 0);
  size_t n = 1000 + (size_t)(rlk_test_rand_u64(&rng) % 50000);
  uint8_t *bin = random_bytes(&rng, n);

  char *log = malloc(20000);
  ck_assert_ptr_nonnull(log);
  for (int i = 0; i < 19999; i++) log[i] = (char)(i % 61 == 60 ? '\n' : 'a' + i % 26);
  log[19999] = '\0';
  char n0[] = "kern<256>", n1[] = "ns::kern<128, float>\nodd";
  char *names[] = {n0, n1};
  rlk_cache_publish_info info = {"kernel.cubin", 2.5, log};
  ck_assert_int_eq(rlk_cache_publish(c, &k, bin, n, names, 2, &info), RLK_OK);

  ck_assert_int_eq(lookup(c, &k, &b, &rebuilt), 1);
  ck_assert_int_eq(rebuilt, 0);
  ck_assert_uint_eq(b.size, n);
  ck_assert(memcmp(b.binary, bin, n) == 0);
  ck_assert_uint_eq(b.nnames, 2);
  ck_assert_str_eq(b.lowered_names[0], n0);
  ck_assert_str_eq(b.lowered_names[1], n1);
  ck_assert_int_eq(b.read_only, 0);
  entry_dir(root, &k, dir, sizeof dir);
  ck_assert_str_eq(b.path, dir);
  rlk_cache_blob_free(&b);

  /* The files of the layout. */
  FMT(path, "%s/kernel.cubin", dir);
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_uint_eq((uint64_t)st.st_size, n);
  FMT(path, "%s/last_used", dir);
  ck_assert(exists(path));
  FMT(path, "%s/kernel.meta", dir);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char line[8192];
  int lines = 0, saw_family = 0, saw_size = 0, saw_log = 0;
  while (fgets(line, sizeof line, f)) {
    if (lines++ == 0) ck_assert_str_eq(line, "format=rlk-cache-1\n");
    ck_assert_ptr_nonnull(strchr(line, '='));
    if (strcmp(line, "family=roundtrip\n") == 0) saw_family = 1;
    char want[64];
    FMT(want, "binary_size=%zu\n", n);
    if (strcmp(line, want) == 0) saw_size = 1;
    if (strncmp(line, "log_head=", 9) == 0) {
      saw_log = 1;
      ck_assert_uint_lt(strlen(line), 2 * 2048 + 16); /* only the head, escaped */
    }
  }
  fclose(f);
  ck_assert(saw_family && saw_size && saw_log);
  /* 11 key fields, the key, 3 binary lines, 3 lowered lines... but never the log's lines. */
  ck_assert_int_lt(lines, 40);

  /* A fresh handle (another process, later) finds it too. */
  rlk_cache_close(c);
  c = open_cache(&cfg);
  expect_hit(c, &k, bin, n);
  ck_assert_int_eq(count_entries(root), 1);
  rlk_cache_close(c);
  free(log);
  free(bin);
}
END_TEST

START_TEST(test_invalid_arguments) {
  uint64_t rng = rng_for(2);
  char root[1024];
  rlk_test_mkdtemp(root, sizeof root, "args");
  rlk_cache_config cfg;
  test_cfg(&cfg, root);
  rlk_cache *c = NULL;
  ck_assert_int_eq(rlk_cache_open(NULL, &c), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_cache_open(&cfg, NULL), RLK_ERR_INVALID_ARGUMENT);
  cfg.mode = (rlk_cache_mode)7;
  ck_assert_int_eq(rlk_cache_open(&cfg, &c), RLK_ERR_INVALID_ARGUMENT);
  cfg.mode = RLK_CACHE_MODE_RW;
  c = open_cache(&cfg);
  rlk_kernel_key k;
  make_key(&k, &rng, "args");
  uint8_t bin[16] = {1, 2, 3};
  rlk_cache_publish_info bad = {"../escape", 0, NULL};
  ck_assert_int_eq(rlk_cache_publish(c, &k, bin, sizeof bin, NULL, 0, &bad),
                   RLK_ERR_INVALID_ARGUMENT);
  bad.binary_name = "kernel.meta";
  ck_assert_int_eq(rlk_cache_publish(c, &k, bin, sizeof bin, NULL, 0, &bad),
                   RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_cache_publish(c, &k, NULL, 5, NULL, 0, NULL), RLK_ERR_INVALID_ARGUMENT);
  int found;
  rlk_cache_blob b;
  ck_assert_int_eq(rlk_cache_lookup(c, NULL, &b, &found, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(count_entries(root), 0);
  /* No info: a default binary name, no names; still a round trip. */
  ck_assert_int_eq(rlk_cache_publish(c, &k, bin, sizeof bin, NULL, 0, NULL), RLK_OK);
  ck_assert_int_eq(lookup(c, &k, &b, NULL), 1);
  ck_assert_uint_eq(b.nnames, 0);
  rlk_cache_blob_free(&b);
  rlk_cache_close(c);
}
END_TEST

/* The caller's key may carry a stale hash: the cache always hashes the fields itself. */
START_TEST(test_stale_hash_in_key_is_ignored) {
  uint64_t rng = rng_for(3);
  char root[1024];
  rlk_cache_config cfg;
  rlk_cache *c = open_fresh_cache(root, sizeof root, "stale", &cfg);
  rlk_kernel_key k, other;
  make_key(&k, &rng, "stale");
  make_key(&other, &rng, "stale");
  uint8_t *bin = random_bytes(&rng, 300);
  publish(c, &k, bin, 300);
  rlk_kernel_key wrong = other;
  memcpy(wrong.hex, k.hex, sizeof wrong.hex); /* fields of `other`, hash of `k` */
  rlk_cache_blob b;
  ck_assert_int_eq(lookup(c, &wrong, &b, NULL), 0);
  expect_hit(c, &k, bin, 300);
  rlk_cache_close(c);
  free(bin);
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Read-only trees and modes                                                                */
/* ---------------------------------------------------------------------------------------- */

START_TEST(test_read_only_trees_and_modes) {
  uint64_t rng = rng_for(4);
  char ro[1024], rw[1024], mem[1024], list[3000];
  rlk_test_mkdtemp(ro, sizeof ro, "rotree");
  rlk_test_mkdtemp(rw, sizeof rw, "rwtree");
  rlk_test_mkdtemp(mem, sizeof mem, "memtree");
  rlk_kernel_key k, k2;
  make_key(&k, &rng, "rotree");
  make_key(&k2, &rng, "rotree");
  size_t n = 777;
  uint8_t *bin = random_bytes(&rng, n);

  /* A prebuilt tree, made by an ordinary writable cache. */
  rlk_cache_config cfg;
  test_cfg(&cfg, ro);
  rlk_cache *maker = open_cache(&cfg);
  publish(maker, &k, bin, n);
  rlk_cache_close(maker);

  /* rw: read-only trees first (a missing one is fine), nothing copied to the writable tree. */
  test_cfg(&cfg, rw);
  FMT(list, "%s/does-not-exist::%s", ro, ro);
  FMT(cfg.ro_dirs, "%s", list);
  rlk_cache *c = open_cache(&cfg);
  rlk_cache_blob b;
  ck_assert_int_eq(lookup(c, &k, &b, NULL), 1);
  ck_assert_int_eq(b.read_only, 1);
  ck_assert_uint_eq(b.size, n);
  ck_assert(memcmp(b.binary, bin, n) == 0);
  ck_assert(strncmp(b.path, ro, strlen(ro)) == 0);
  rlk_cache_blob_free(&b);
  ck_assert_int_eq(count_entries(rw), 0);
  rlk_cache_close(c);

  /* memory: read-only trees only; publishing writes nothing anywhere. */
  test_cfg(&cfg, mem);
  cfg.mode = RLK_CACHE_MODE_MEMORY;
  FMT(cfg.ro_dirs, "%s", ro);
  c = open_cache(&cfg);
  ck_assert_int_eq(rlk_cache_effective_mode(c), RLK_CACHE_MODE_MEMORY);
  ck_assert_str_eq(rlk_cache_root(c), "");
  ck_assert_int_eq(lookup(c, &k, &b, NULL), 1);
  rlk_cache_blob_free(&b);
  publish(c, &k2, bin, n);
  ck_assert_int_eq(count_children(mem), 0);
  ck_assert_int_eq(count_entries(ro), 1);
  rlk_cache_close(c);

  /* off: not even the read-only trees. */
  cfg.mode = RLK_CACHE_MODE_OFF;
  c = open_cache(&cfg);
  ck_assert_int_eq(lookup(c, &k, &b, NULL), 0);
  publish(c, &k2, bin, n);
  ck_assert_int_eq(count_children(mem), 0);
  rlk_cache_close(c);

  /* ro: the root is read, never written. */
  test_cfg(&cfg, ro);
  cfg.mode = RLK_CACHE_MODE_RO;
  c = open_cache(&cfg);
  ck_assert_int_eq(rlk_cache_effective_mode(c), RLK_CACHE_MODE_RO);
  ck_assert_str_eq(rlk_cache_root(c), "");
  ck_assert_int_eq(lookup(c, &k, &b, NULL), 1);
  ck_assert_int_eq(b.read_only, 1);
  rlk_cache_blob_free(&b);
  publish(c, &k2, bin, n);
  ck_assert_int_eq(count_entries(ro), 1);
  rlk_cache_close(c);

  /* A damaged entry in a read-only tree is skipped with one warning and left in place. */
  char dir[1200], path[1300];
  entry_dir(ro, &k, dir, sizeof dir);
  FMT(path, "%s/kernel.cubin", dir);
  int fd = open(path, O_RDWR);
  ck_assert_int_ge(fd, 0);
  uint8_t byte;
  ck_assert_int_eq(pread(fd, &byte, 1, 10), 1);
  byte ^= 0x10;
  ck_assert_int_eq(pwrite(fd, &byte, 1, 10), 1);
  close(fd);
  for (int mode = 0; mode < 2; mode++) {
    test_cfg(&cfg, mode ? ro : rw);
    if (mode)
      cfg.mode = RLK_CACHE_MODE_RO;
    else
      FMT(cfg.ro_dirs, "%s", ro);
    c = open_cache(&cfg);
    capture cap;
    capture_begin(&cap);
    int rebuilt = 0;
    ck_assert_int_eq(lookup(c, &k, &b, &rebuilt), 0);
    ck_assert_int_eq(capture_end(&cap, "SHA-256"), 1);
    ck_assert_int_eq(rebuilt, 1);
    ck_assert(exists(path));
    rlk_cache_close(c);
  }
  free(bin);
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Damaged entries                                                                          */
/* ---------------------------------------------------------------------------------------- */

static void rewrite_file(const char *path, const char *text, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(text, 1, n, f), n);
  fclose(f);
}

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  char *buf = malloc(1 << 20);
  ck_assert_ptr_nonnull(buf);
  *n = fread(buf, 1, (1 << 20) - 1, f);
  buf[*n] = '\0';
  fclose(f);
  return buf;
}

enum { DMG_TRUNCATE, DMG_FLIP, DMG_GROW, DMG_META_FIELD, DMG_META_MISSING, DMG_META_TRUNCATED,
       DMG_META_KEY_LINE, DMG_BINARY_MISSING, DMG_COUNT };
static const char *const damage_names[DMG_COUNT] = {
    "truncated binary", "flipped byte",     "grown binary",         "mismatched meta field",
    "missing meta",     "truncated meta",   "meta key line edited", "missing binary"};
static const char *const damage_says[DMG_COUNT] = {
    "truncated", "SHA-256", "recorded", "hash to", "no kernel.meta", "truncated", "recorded key",
    "cannot read"};

static void damage(const char *dir, int kind, size_t n, uint64_t *rng) {
  char bin[1300], meta[1300];
  FMT(bin, "%s/kernel.cubin", dir);
  FMT(meta, "%s/kernel.meta", dir);
  switch (kind) {
  case DMG_TRUNCATE:
    ck_assert_int_eq(truncate(bin, (off_t)(rlk_test_rand_u64(rng) % n)), 0);
    break;
  case DMG_FLIP: {
    int fd = open(bin, O_RDWR);
    ck_assert_int_ge(fd, 0);
    off_t at = (off_t)(rlk_test_rand_u64(rng) % n);
    uint8_t byte;
    ck_assert_int_eq(pread(fd, &byte, 1, at), 1);
    byte ^= (uint8_t)(1u << (rlk_test_rand_u64(rng) % 8));
    ck_assert_int_eq(pwrite(fd, &byte, 1, at), 1);
    close(fd);
    break;
  }
  case DMG_GROW: {
    FILE *f = fopen(bin, "ab");
    ck_assert_ptr_nonnull(f);
    fputc(0, f);
    fclose(f);
    break;
  }
  case DMG_META_FIELD:
  case DMG_META_KEY_LINE: {
    size_t len;
    char *text = slurp(meta, &len);
    const char *what = kind == DMG_META_FIELD ? "\ntarget=sm_90a\n" : "\nkey=";
    char *p = strstr(text, what);
    ck_assert_ptr_nonnull(p);
    if (kind == DMG_META_FIELD)
      memcpy(p, "\ntarget=sm_80a\n", strlen(what));
    else
      p[5] = p[5] == '0' ? '1' : '0';
    rewrite_file(meta, text, len);
    free(text);
    break;
  }
  case DMG_META_MISSING:
    ck_assert_int_eq(unlink(meta), 0);
    break;
  case DMG_META_TRUNCATED: {
    size_t len;
    char *text = slurp(meta, &len);
    rewrite_file(meta, text, len / 2 + rlk_test_rand_u64(rng) % (len / 2));
    free(text);
    break;
  }
  case DMG_BINARY_MISSING:
    ck_assert_int_eq(unlink(bin), 0);
    break;
  }
}

START_TEST(test_damaged_entry_is_quarantined_and_rebuilt) {
  int kind = _i;
  uint64_t rng = rng_for(100 + (uint64_t)kind);
  char root[1024], dir[1200], qdir[1100];
  rlk_cache_config cfg;
  rlk_cache *c = open_fresh_cache(root, sizeof root, "damage", &cfg);
  rlk_kernel_key k;
  make_key(&k, &rng, "damage");
  size_t n = 64 + (size_t)(rlk_test_rand_u64(&rng) % 4000);
  uint8_t *bin = random_bytes(&rng, n);
  publish(c, &k, bin, n);
  entry_dir(root, &k, dir, sizeof dir);
  damage(dir, kind, n, &rng);

  capture cap;
  capture_begin(&cap);
  rlk_cache_blob b;
  int rebuilt = 0;
  ck_assert_msg(lookup(c, &k, &b, &rebuilt) == 0, "%s: still a hit", damage_names[kind]);
  int warnings = capture_end(&cap, damage_says[kind]);
  ck_assert_msg(warnings == 1, "%s: %d warnings", damage_names[kind], warnings);
  ck_assert_int_eq(rebuilt, 1);
  ck_assert_msg(!exists(dir), "%s: entry left in place", damage_names[kind]);
  FMT(qdir, "%s/quarantine", root);
  ck_assert_int_eq(count_children(qdir), 1);

  /* Now simply a miss, then rebuilt and published again. */
  rebuilt = 0;
  ck_assert_int_eq(lookup(c, &k, &b, &rebuilt), 0);
  ck_assert_int_eq(rebuilt, 0);
  publish(c, &k, bin, n);
  expect_hit(c, &k, bin, n);
  rlk_cache_close(c);
  free(bin);
}
END_TEST

/* A directory in the entry's place without a commit marker does not block publishing. */
START_TEST(test_publish_replaces_uncommitted_directory) {
  uint64_t rng = rng_for(5);
  char root[1024], dir[1200], junk[1300], cmd[1400];
  rlk_cache_config cfg;
  rlk_cache *c = open_fresh_cache(root, sizeof root, "debris", &cfg);
  rlk_kernel_key k;
  make_key(&k, &rng, "debris");
  entry_dir(root, &k, dir, sizeof dir);
  FMT(cmd, "mkdir -p '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
  FMT(junk, "%s/kernel.cubin", dir);
  rewrite_file(junk, "junk", 4);
  uint8_t *bin = random_bytes(&rng, 500);
  publish(c, &k, bin, 500);
  expect_hit(c, &k, bin, 500);
  rlk_cache_close(c);
  free(bin);
}
END_TEST

START_TEST(test_quarantine_api) {
  uint64_t rng = rng_for(6);
  char root[1024], ro[1024], qdir[1100];
  rlk_test_mkdtemp(root, sizeof root, "qapi");
  rlk_test_mkdtemp(ro, sizeof ro, "qapi-ro");
  rlk_cache_config cfg;
  test_cfg(&cfg, ro);
  rlk_kernel_key k, k2;
  make_key(&k, &rng, "qapi");
  make_key(&k2, &rng, "qapi");
  uint8_t *bin = random_bytes(&rng, 100);
  rlk_cache *c = open_cache(&cfg);
  publish(c, &k2, bin, 100);
  rlk_cache_close(c);

  test_cfg(&cfg, root);
  FMT(cfg.ro_dirs, "%s", ro);
  c = open_cache(&cfg);
  publish(c, &k, bin, 100);
  rlk_cache_blob b;
  ck_assert_int_eq(lookup(c, &k, &b, NULL), 1);
  ck_assert_int_eq(rlk_cache_quarantine(c, b.path), RLK_OK);
  ck_assert(!exists(b.path));
  rlk_cache_blob_free(&b);
  FMT(qdir, "%s/quarantine", root);
  ck_assert_int_eq(count_children(qdir), 1);
  ck_assert_int_eq(lookup(c, &k, &b, NULL), 0);
  /* An entry of a read-only tree is left alone. */
  ck_assert_int_eq(lookup(c, &k2, &b, NULL), 1);
  ck_assert_int_eq(b.read_only, 1);
  ck_assert_int_eq(rlk_cache_quarantine(c, b.path), RLK_OK);
  ck_assert(exists(b.path));
  rlk_cache_blob_free(&b);
  rlk_cache_close(c);
  free(bin);
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Unusable and untrusted roots                                                             */
/* ---------------------------------------------------------------------------------------- */

/* Opens a cache on `root`, expecting memory mode with exactly one warning saying `why`, and a
 * publish that does nothing. */
static void expect_memory_mode(const char *root, const char *why, uint64_t *rng) {
  rlk_cache_config cfg;
  test_cfg(&cfg, root);
  capture cap;
  capture_begin(&cap);
  rlk_cache *c = open_cache(&cfg);
  int warnings = capture_end(&cap, why);
  ck_assert_int_eq(warnings, 1);
  ck_assert_int_eq(rlk_cache_effective_mode(c), RLK_CACHE_MODE_MEMORY);
  ck_assert_str_eq(rlk_cache_root(c), "");
  rlk_kernel_key k;
  make_key(&k, rng, "memory");
  uint8_t bin[32] = {9};
  publish(c, &k, bin, sizeof bin);
  rlk_cache_blob b;
  ck_assert_int_eq(lookup(c, &k, &b, NULL), 0);
  rlk_cache_lock *lock = NULL;
  ck_assert_int_eq(rlk_cache_lock_acquire(c, &k, &lock), RLK_OK);
  rlk_cache_lock_release(lock);
  rlk_cache_close(c);
}

/* A tuning database written before the first kernel (rlk-tune --merge into the default root)
 * does not make the root a stranger's: the cache claims it, marker and all, and keeps the
 * database. */
START_TEST(test_root_with_only_a_tuning_database_is_claimed) {
  char dir[1024], db[1100], marker[1100];
  rlk_test_mkdtemp(dir, sizeof dir, "tuneonly");
  FMT(db, "%s/tune.db", dir);
  rewrite_file(db, "records\n", 8);
  rlk_cache_config cfg;
  test_cfg(&cfg, dir);
  rlk_cache *c = open_cache(&cfg);
  ck_assert_int_eq(rlk_cache_effective_mode(c), RLK_CACHE_MODE_RW);
  ck_assert_str_eq(rlk_cache_root(c), dir);
  rlk_cache_close(c);
  FMT(marker, "%s/CACHEDIR.TAG", dir);
  ck_assert(exists(marker) && exists(db));
}
END_TEST

/* A marker that cannot be written (the file size limit standing in for a full disk) leaves the
 * root unused this run, and unmarked: a later run, with room, claims it. */
static char marker_warning[2048];
static void keep_warning(rlk_log_level level, const char *message, void *user) {
  (void)user;
  if (level <= RLK_LOG_WARN && strstr(message, "marker")) FMT(marker_warning, "%s", message);
}

START_TEST(test_root_whose_marker_cannot_be_written_is_not_used) {
  char dir[1024], marker[1100];
  rlk_test_mkdtemp(dir, sizeof dir, "nomarker");
  rlk_cache_config cfg;
  test_cfg(&cfg, dir);
  struct rlimit old;
  ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit none = {0, old.rlim_max};
  signal(SIGXFSZ, SIG_IGN);
  rlk_set_log_callback(keep_warning, RLK_LOG_WARN, NULL); /* stderr's capture is a file, too */
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &none), 0);
  rlk_cache *c = open_cache(&cfg);
  const int mode = rlk_cache_effective_mode(c);
  rlk_cache_close(c);
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
  rlk_set_log_callback(NULL, RLK_LOG_WARN, NULL);
  ck_assert_int_eq(mode, RLK_CACHE_MODE_MEMORY);
  ck_assert_msg(strstr(marker_warning, "marker could not be written"), "warning: '%s'", marker_warning);
  FMT(marker, "%s/CACHEDIR.TAG", dir);
  ck_assert(!exists(marker));
  c = open_cache(&cfg);
  ck_assert_str_eq(rlk_cache_root(c), dir);
  rlk_cache_close(c);
  ck_assert(exists(marker));
}
END_TEST

START_TEST(test_root_that_cannot_be_created) {
  uint64_t rng = rng_for(7);
  char dir[1024], file[1100], root[1200];
  rlk_test_mkdtemp(dir, sizeof dir, "nocreate");
  FMT(file, "%s/a-file", dir);
  rewrite_file(file, "x", 1);
  FMT(root, "%s/cache", file); /* below a regular file: ENOTDIR, even for root */
  expect_memory_mode(root, "cannot be created", &rng);
  struct stat st;
  ck_assert_int_eq(stat(file, &st), 0);
  ck_assert(S_ISREG(st.st_mode));
}
END_TEST

/* An empty directory made the cache's own (its marker written), as the cache makes a root it
 * creates; nothing else left in it. */
static void mark_as_cache_root(const char *root) {
  ck_assert_int_eq(rlk_cache_create_root(root), RLK_OK);
  char tmp[1100];
  FMT(tmp, "%s/tmp", root);
  ck_assert_int_eq(rmdir(tmp), 0);
}

START_TEST(test_root_with_debris_at_tmp_is_repaired) {
  uint64_t rng = rng_for(8);
  char root[1024], tmp[1100];
  /* <root>/tmp of the cache's own root taken by a file: the file is debris, replaced by the
   * staging directory, and publishing works. */
  rlk_test_mkdtemp(root, sizeof root, "nowrite");
  mark_as_cache_root(root);
  FMT(tmp, "%s/tmp", root);
  rewrite_file(tmp, "x", 1);
  rlk_cache_config cfg;
  test_cfg(&cfg, root);
  capture cap;
  capture_begin(&cap);
  rlk_cache *c = open_cache(&cfg);
  ck_assert_int_eq(capture_end(&cap, "removed a file or link named 'tmp'"), 1);
  ck_assert_int_eq(rlk_cache_effective_mode(c), RLK_CACHE_MODE_RW);
  struct stat st;
  ck_assert_int_eq(lstat(tmp, &st), 0);
  ck_assert(S_ISDIR(st.st_mode));
  rlk_kernel_key k;
  make_key(&k, &rng, "debris");
  uint8_t bin[40] = {3, 1, 4};
  publish(c, &k, bin, sizeof bin);
  expect_hit(c, &k, bin, sizeof bin);
  rlk_cache_close(c);
}
END_TEST

/* chmod 0500: permissions stop writes only for an unprivileged user. Run as root, the case
 * runs in a child that drops to another uid. */
START_TEST(test_read_only_root_chmod) {
  uint64_t rng = rng_for(9);
  char root[1024];
  if (geteuid() != 0) {
    rlk_test_mkdtemp(root, sizeof root, "chmod");
    ck_assert_int_eq(chmod(root, 0500), 0);
    expect_memory_mode(root, "not writable", &rng);
    ck_assert_int_eq(count_children(root), 0);
    chmod(root, 0700);
    return;
  }
  /* A directory the other user can reach (the scratch tree is private to us). */
  FMT(root, "/tmp/rlk-test-ro-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(root));
  ck_assert_int_eq(chown(root, OTHER_UID, OTHER_UID), 0);
  ck_assert_int_eq(chmod(root, 0500), 0);
  rlk_cache_config cfg;
  memset(&cfg, 0, sizeof cfg);
  FMT(cfg.root, "%s", root);
  FMT(cfg.lock_dir, "%s/locks", root);
  cfg.lock_timeout_s = 1;
  rlk_kernel_key k;
  make_key(&k, &rng, "chmod");
  pid_t pid = rlk_test_fork();
  if (pid == 0) {
    if (setgroups(0, NULL) != 0 || setgid(OTHER_UID) != 0 || setuid(OTHER_UID) != 0) _exit(77);
    rlk_cache *c = NULL;
    if (rlk_cache_open(&cfg, &c) != RLK_OK) _exit(1);
    if (rlk_cache_effective_mode(c) != RLK_CACHE_MODE_MEMORY || rlk_cache_root(c)[0]) _exit(2);
    uint8_t bin[8] = {1};
    if (rlk_cache_publish(c, &k, bin, sizeof bin, NULL, 0, NULL) != RLK_OK) _exit(3);
    rlk_cache_close(c);
    _exit(0);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  int entries = count_children(root);
  chmod(root, 0700);
  rlk_test_rmtree(root);
  ck_assert(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) {
    printf("skip (read-only root): running as root and cannot switch to uid %d\n", OTHER_UID);
    return;
  }
  ck_assert_msg(WEXITSTATUS(status) == 0, "child failed at step %d", WEXITSTATUS(status));
  ck_assert_int_eq(entries, 0);
}
END_TEST

/* Walking and verifying under `root`, one of whose shard folders and one entry cannot be read: 0
 * when both report RLK_ERR_IO naming what could not be read, after the readable entry (and
 * verify counts the unreadable entry bad), else the step that did not hold. No ck_assert: it may
 * run in a child under another user. */
static int scan_unreadable(const char *root) {
  int n = 0;
  if (rlk_cache_walk(root, count_visit, &n) != RLK_ERR_IO || !strstr(rlk_last_error(), "could not be read"))
    return 1;
  if (n != 1) return 2;
  uint64_t entries = 0, bad = 0;
  if (rlk_cache_verify(root, 0, &entries, &bad) != RLK_ERR_IO || !strstr(rlk_last_error(), "could not be read"))
    return 3;
  if (entries != 2 || bad != 1) return 4;
  /* pruning removes what it can read (the readable entry, past a 1-byte cap), then says what not */
  uint64_t removed = 0, bytes = 0;
  if (rlk_cache_prune(root, 1, 0, &removed, &bytes) != RLK_ERR_IO || !strstr(rlk_last_error(), "could not be read"))
    return 5;
  if (removed != 1) return 6;
  return 0;
}

/* A folder of the cache that cannot be read makes list, verify and merge report it, rather than
 * count fewer entries and succeed. */
START_TEST(test_unreadable_directories_are_reported) {
  uint64_t rng = rng_for(42);
  char root[1024], dirs[3][1200];
  const int as_root = geteuid() == 0;
  if (as_root) {
    FMT(root, "/tmp/rlk-test-unreadable-XXXXXX"); /* reachable by the other user */
    ck_assert_ptr_nonnull(mkdtemp(root));
  } else {
    rlk_test_mkdtemp(root, sizeof root, "unreadable");
  }
  rlk_cache_config cfg;
  test_cfg(&cfg, root);
  rlk_cache *c = open_cache(&cfg);
  rlk_kernel_key k[3];
  for (int i = 0; i < 3; i++) { /* three shard folders (hh): a key again until it has its own */
    do make_key(&k[i], &rng, "unreadable");
    while ((i > 0 && strncmp(k[i].hex, k[0].hex, 2) == 0) || (i > 1 && strncmp(k[i].hex, k[1].hex, 2) == 0));
    uint8_t bin[16] = {(uint8_t)i};
    publish(c, &k[i], bin, sizeof bin);
    entry_dir(root, &k[i], dirs[i], sizeof dirs[i]);
  }
  rlk_cache_close(c);
  if (as_root) {
    char cmd[1300];
    FMT(cmd, "chown -R %d:%d '%s'", OTHER_UID, OTHER_UID, root);
    ck_assert_int_eq(system(cmd), 0);
  }
  char shard[1200];
  FMT(shard, "%s", dirs[1]);
  *strrchr(shard, '/') = '\0';
  ck_assert_int_eq(chmod(shard, 0), 0);   /* a shard folder */
  ck_assert_int_eq(chmod(dirs[2], 0), 0); /* an entry */
  int rc;
  if (!as_root) {
    rc = scan_unreadable(root);
  } else {
    pid_t pid = rlk_test_fork();
    if (pid == 0) {
      if (setgroups(0, NULL) != 0 || setgid(OTHER_UID) != 0 || setuid(OTHER_UID) != 0) _exit(77);
      _exit(scan_unreadable(root));
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    rc = WEXITSTATUS(status);
  }
  chmod(shard, 0755), chmod(dirs[2], 0755);
  if (as_root) rlk_test_rmtree(root);
  if (rc == 77) {
    printf("skip (unreadable directories): running as root and cannot switch to uid %d\n", OTHER_UID);
    return;
  }
  ck_assert_msg(rc == 0, "step %d did not hold (%s)", rc, rlk_last_error());
}
END_TEST

START_TEST(test_untrusted_roots_refused) {
  uint64_t rng = rng_for(10);
  char root[1024];
  rlk_test_mkdtemp(root, sizeof root, "worldw");
  ck_assert_int_eq(chmod(root, 0777), 0);
  expect_memory_mode(root, "world-writable", &rng);
  ck_assert_int_eq(count_children(root), 0);

  /* The sticky bit does not make it safe: others could still create entry directories. */
  ck_assert_int_eq(chmod(root, 01777), 0);
  expect_memory_mode(root, "world-writable", &rng);
  rlk_cache_config cfg;
  test_cfg(&cfg, root);
  rlk_cache *c = NULL;

  /* ro mode does not read an untrusted root either. */
  ck_assert_int_eq(chmod(root, 0700), 0);
  rlk_kernel_key k;
  make_key(&k, &rng, "worldw");
  uint8_t bin[40] = {3};
  c = open_cache(&cfg);
  publish(c, &k, bin, sizeof bin);
  rlk_cache_close(c);
  ck_assert_int_eq(chmod(root, 0777), 0);
  cfg.mode = RLK_CACHE_MODE_RO;
  capture cap;
  capture_begin(&cap);
  c = open_cache(&cfg);
  ck_assert_int_eq(capture_end(&cap, "world-writable"), 1);
  rlk_cache_blob b;
  ck_assert_int_eq(lookup(c, &k, &b, NULL), 0);
  rlk_cache_close(c);

  /* Nor is a world-writable tree searched as a read-only tree. */
  char rw[1024];
  rlk_test_mkdtemp(rw, sizeof rw, "rw");
  test_cfg(&cfg, rw);
  snprintf(cfg.ro_dirs, sizeof cfg.ro_dirs, "%s", root);
  capture_begin(&cap);
  c = open_cache(&cfg);
  ck_assert_int_eq(capture_end(&cap, "not searching read-only tree"), 1);
  ck_assert_int_eq(lookup(c, &k, &b, NULL), 0);
  rlk_cache_close(c);
  /* once it is private again, the same tree serves the entry */
  ck_assert_int_eq(chmod(root, 0755), 0);
  c = open_cache(&cfg);
  ck_assert_int_eq(lookup(c, &k, &b, NULL), 1);
  rlk_cache_blob_free(&b);
  rlk_cache_close(c);
  ck_assert_int_eq(chmod(root, 0700), 0);

  /* Owned by another user. */
  char other[1024];
  if (geteuid() == 0) {
    rlk_test_mkdtemp(other, sizeof other, "owner");
    ck_assert_int_eq(chown(other, OTHER_UID, OTHER_UID), 0);
  } else {
    FMT(other, "/"); /* exists, owned by root; nothing is written */
  }
  expect_memory_mode(other, "owned by uid", &rng);
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Recency and eviction                                                                     */
/* ---------------------------------------------------------------------------------------- */

START_TEST(test_last_used_refreshed_at_most_hourly) {
  uint64_t rng = rng_for(11);
  char root[1024], dir[1200], stamp[1300];
  rlk_cache_config cfg;
  rlk_cache *c = open_fresh_cache(root, sizeof root, "recency", &cfg);
  rlk_kernel_key k;
  make_key(&k, &rng, "recency");
  uint8_t *bin = random_bytes(&rng, 200);
  publish(c, &k, bin, 200);
  entry_dir(root, &k, dir, sizeof dir);
  FMT(stamp, "%s/last_used", dir);
  int64_t now = rlk_unix_time();
  set_mtime(stamp, now - 7200);
  expect_hit(c, &k, bin, 200);
  ck_assert_int_ge(mtime_of(stamp), now - 5);
  set_mtime(stamp, now - 600);
  expect_hit(c, &k, bin, 200);
  ck_assert_int_eq(mtime_of(stamp), now - 600);
  ck_assert_int_eq(unlink(stamp), 0);
  expect_hit(c, &k, bin, 200);
  ck_assert(exists(stamp));
  rlk_cache_close(c);
  free(bin);
}
END_TEST

START_TEST(test_eviction_oldest_first_with_grace) {
  uint64_t rng = rng_for(12);
  enum { N = 7 };
  char root[1024], dir[N][1200];
  rlk_cache_config cfg;
  rlk_cache *c = open_fresh_cache(root, sizeof root, "evict", &cfg);
  rlk_kernel_key k[N];
  uint8_t *bin[N];
  size_t n[N];
  uint64_t size[N];
  int64_t now = rlk_unix_time();
  for (int i = 0; i < N; i++) {
    make_key(&k[i], &rng, "evict");
    n[i] = 2000 + (size_t)(rlk_test_rand_u64(&rng) % 3000);
    bin[i] = random_bytes(&rng, n[i]);
    publish(c, &k[i], bin[i], n[i]);
    entry_dir(root, &k[i], dir[i], sizeof dir[i]);
    size[i] = dir_bytes(dir[i]);
    char stamp[1300];
    FMT(stamp, "%s/last_used", dir[i]);
    /* 0..4 long unused (0 the oldest), 5 used 30 s ago (inside the grace), 6 just now. */
    if (i < 5) set_mtime(stamp, now - 100000 + i * 1000);
    if (i == 5) set_mtime(stamp, now - 30);
  }
  rlk_cache_close(c);

  /* A cap that fits 3..6: publishing (here the same key again) evicts 0, 1, 2 in that order. */
  cfg.max_bytes = size[3] + size[4] + size[5] + size[6];
  c = open_cache(&cfg);
  publish(c, &k[6], bin[6], n[6]);
  for (int i = 0; i < N; i++)
    ck_assert_msg(exists(dir[i]) == (i >= 3), "entry %d %s", i,
                  exists(dir[i]) ? "kept" : "evicted");
  rlk_cache_close(c);

  /* A cap below what must stay: 3 and 4 go; 5 (inside the grace) and 6 (just published) stay. */
  cfg.max_bytes = 1;
  c = open_cache(&cfg);
  publish(c, &k[6], bin[6], n[6]);
  for (int i = 0; i < N; i++) ck_assert_int_eq(exists(dir[i]), i >= 5);
  expect_hit(c, &k[6], bin[6], n[6]);
  rlk_cache_close(c);

  /* rlk_cache_evict honours its own grace; with none, everything over the cap goes. */
  uint64_t removed = 99, bytes = 99;
  ck_assert_int_eq(rlk_cache_evict(root, 1, 3600, &removed, &bytes), RLK_OK);
  ck_assert_uint_eq(removed, 0);
  ck_assert_uint_eq(bytes, 0);
  ck_assert_int_eq(rlk_cache_evict(root, size[6], 0, &removed, &bytes), RLK_OK);
  ck_assert_uint_eq(removed, 1);
  ck_assert_uint_eq(bytes, size[5]);
  ck_assert(exists(dir[6]));
  char tmp[1100];
  FMT(tmp, "%s/tmp", root);
  ck_assert_int_eq(count_children(tmp), 0);
  for (int i = 0; i < N; i++) free(bin[i]);
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Concurrency                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* What the children of a race share: the cache, one key and its binary, and a file each
 * "compile" appends a byte to. */
typedef struct race_work {
  const rlk_cache_config *cfg;
  const rlk_kernel_key *k;
  const uint8_t *bin;
  size_t n;
  const char *log;
} race_work;

/* A racing publisher (rlk_test_race_children's child): publishes the binary, then finds it
 * whole. */
static int publish_and_find(int child, const void *work) {
  const race_work *w = work;
  (void)child;
  rlk_cache *cache = NULL;
  if (rlk_cache_open(w->cfg, &cache) != RLK_OK) return 1;
  if (rlk_cache_publish(cache, w->k, w->bin, w->n, NULL, 0, NULL) != RLK_OK) return 2;
  rlk_cache_blob b;
  int found = 0;
  if (rlk_cache_lookup(cache, w->k, &b, &found, NULL) != RLK_OK || !found) return 3;
  if (b.size != w->n || memcmp(b.binary, w->bin, w->n) != 0) return 4;
  rlk_cache_blob_free(&b);
  rlk_cache_close(cache);
  return 0;
}

/* A process that wants the kernel: under the key's lock, "compiles" (a byte to the log) and
 * publishes it unless it is found. */
static int compile_once_under_lock(int child, const void *work) {
  const race_work *w = work;
  (void)child;
  rlk_cache *c = NULL;
  rlk_cache_lock *lock = NULL;
  rlk_cache_blob b;
  int found = 0;
  if (rlk_cache_open(w->cfg, &c) != RLK_OK) return 1;
  if (rlk_cache_lock_acquire(c, w->k, &lock) != RLK_OK) return 2;
  if (rlk_cache_lookup(c, w->k, &b, &found, NULL) != RLK_OK) return 3;
  if (!found) {
    int fd = open(w->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd < 0 || write(fd, "c", 1) != 1) return 4;
    close(fd);
    usleep(50000); /* "compiling" */
    if (rlk_cache_publish(c, w->k, w->bin, w->n, NULL, 0, NULL) != RLK_OK) return 5;
  }
  rlk_cache_blob_free(&b);
  rlk_cache_lock_release(lock);
  rlk_cache_close(c);
  return 0;
}

START_TEST(test_racing_publishers) {
  enum { P = 8 };
  uint64_t rng = rng_for(13);
  char root[1024], tmp[1100], qdir[1100];
  rlk_test_mkdtemp(root, sizeof root, "race");
  rlk_cache_config cfg;
  test_cfg(&cfg, root);
  rlk_kernel_key k;
  make_key(&k, &rng, "race");
  size_t n = 50000;
  uint8_t *bin = random_bytes(&rng, n);
  const race_work w = {&cfg, &k, bin, n, NULL};
  rlk_test_race_children(P, publish_and_find, &w, "child");
  ck_assert_int_eq(count_entries(root), 1);
  FMT(tmp, "%s/tmp", root);
  ck_assert_int_eq(count_children(tmp), 0);
  FMT(qdir, "%s/quarantine", root);
  ck_assert_int_le(count_children(qdir), 0);
  rlk_cache *c = open_cache(&cfg);
  expect_hit(c, &k, bin, n);
  rlk_cache_close(c);
  free(bin);
}
END_TEST

/* With the lock, processes wanting the same kernel compile it once. */
START_TEST(test_lock_makes_one_compile) {
  enum { P = 4 };
  uint64_t rng = rng_for(14);
  char root[1024], log[1100];
  rlk_test_mkdtemp(root, sizeof root, "once");
  FMT(log, "%s.compiles", root);
  rlk_cache_config cfg;
  test_cfg(&cfg, root);
  rlk_kernel_key k;
  make_key(&k, &rng, "once");
  uint8_t *bin = random_bytes(&rng, 1000);
  const race_work w = {&cfg, &k, bin, 1000, log};
  rlk_test_race_children(P, compile_once_under_lock, &w, "child");
  struct stat st;
  ck_assert_int_eq(stat(log, &st), 0);
  ck_assert_int_eq((int)st.st_size, 1);
  /* The lock file stays (removing it would let a third process lock a new inode). */
  char lockfile[2200];
  FMT(lockfile, "%s/%s.lock", cfg.lock_dir, k.hex);
  ck_assert(exists(lockfile));
  free(bin);
}
END_TEST

START_TEST(test_lock_timeout) {
  uint64_t rng = rng_for(15);
  char root[1024];
  rlk_test_mkdtemp(root, sizeof root, "timeout");
  rlk_cache_config cfg;
  test_cfg(&cfg, root);
  cfg.lock_timeout_s = 0.3;
  rlk_kernel_key k, k2;
  make_key(&k, &rng, "timeout");
  make_key(&k2, &rng, "timeout");
  int ready[2], release[2];
  ck_assert_int_eq(pipe(ready), 0);
  ck_assert_int_eq(pipe(release), 0);
  pid_t pid = rlk_test_fork();
  if (pid == 0) {
    close(ready[0]);
    close(release[1]);
    rlk_cache *c = NULL;
    rlk_cache_lock *lock = NULL;
    if (rlk_cache_open(&cfg, &c) != RLK_OK || rlk_cache_lock_acquire(c, &k, &lock) != RLK_OK)
      _exit(1);
    if (write(ready[1], "r", 1) != 1) _exit(2);
    char ch;
    while (read(release[0], &ch, 1) > 0) {
    }
    rlk_cache_lock_release(lock);
    rlk_cache_close(c);
    _exit(0);
  }
  close(ready[1]);
  close(release[0]);
  char ch;
  ck_assert_int_eq(read(ready[0], &ch, 1), 1);

  rlk_cache *c = open_cache(&cfg);
  rlk_cache_lock *lock = (rlk_cache_lock *)&ch;
  double t0 = rlk_now();
  ck_assert_int_eq(rlk_cache_lock_acquire(c, &k, &lock), RLK_ERR_TIMEOUT);
  double waited = rlk_now() - t0;
  ck_assert_ptr_null(lock);
  ck_assert_msg(waited >= 0.25 && waited < 3.0, "waited %.3f s for a 0.3 s timeout", waited);
  const char *msg = rlk_last_error();
  ck_assert_ptr_nonnull(strstr(msg, "RLK_LOCK_TIMEOUT_S"));
  ck_assert_ptr_nonnull(strstr(msg, k.hex));
  ck_assert_ptr_nonnull(strstr(msg, cfg.lock_dir));

  /* Another key is independent. */
  ck_assert_int_eq(rlk_cache_lock_acquire(c, &k2, &lock), RLK_OK);
  /* Within one process a second holder waits too (threads of a process exclude each other). */
  rlk_cache_lock *again = NULL;
  ck_assert_int_eq(rlk_cache_lock_acquire(c, &k2, &again), RLK_ERR_TIMEOUT);
  rlk_cache_lock_release(lock);
  ck_assert_int_eq(rlk_cache_lock_acquire(c, &k2, &again), RLK_OK);
  rlk_cache_lock_release(again);

  /* Once the holder lets go, the key is free. */
  close(release[1]);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  t0 = rlk_now();
  ck_assert_int_eq(rlk_cache_lock_acquire(c, &k, &lock), RLK_OK);
  ck_assert(rlk_now() - t0 < 0.25);
  rlk_cache_lock_release(lock);
  rlk_cache_close(c);
  close(ready[0]);
}
END_TEST

/* A holder that dies releases the lock. */
START_TEST(test_lock_released_by_dead_holder) {
  uint64_t rng = rng_for(16);
  char root[1024];
  rlk_test_mkdtemp(root, sizeof root, "dead");
  rlk_cache_config cfg;
  test_cfg(&cfg, root);
  cfg.lock_timeout_s = 5;
  rlk_kernel_key k;
  make_key(&k, &rng, "dead");
  pid_t pid = rlk_test_fork();
  if (pid == 0) {
    rlk_cache *c = NULL;
    rlk_cache_lock *lock = NULL;
    if (rlk_cache_open(&cfg, &c) != RLK_OK || rlk_cache_lock_acquire(c, &k, &lock) != RLK_OK)
      _exit(1);
    _exit(0); /* exits holding it */
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  rlk_cache *c = open_cache(&cfg);
  rlk_cache_lock *lock = NULL;
  double t0 = rlk_now();
  ck_assert_int_eq(rlk_cache_lock_acquire(c, &k, &lock), RLK_OK);
  ck_assert(rlk_now() - t0 < 1.0);
  rlk_cache_lock_release(lock);
  rlk_cache_close(c);
}
END_TEST

/* A cache whose locks do not work hands out k's lock twice at once (no locking, correct but maybe
 * duplicate work) after one warning that says `warning`; then c is closed. */
static void expect_unlocked(rlk_cache *c, const rlk_kernel_key *k, const char *warning) {
  capture cap;
  capture_begin(&cap);
  rlk_cache_lock *a = NULL, *b = NULL;
  ck_assert_int_eq(rlk_cache_lock_acquire(c, k, &a), RLK_OK);
  ck_assert_int_eq(rlk_cache_lock_acquire(c, k, &b), RLK_OK);
  ck_assert_int_eq(capture_end(&cap, warning), 1);
  rlk_cache_lock_release(a);
  rlk_cache_lock_release(b);
  rlk_cache_close(c);
}

START_TEST(test_lock_dir_created_private_and_foreign_refused) {
  uint64_t rng = rng_for(17);
  char root[1024], base[1024];
  rlk_test_mkdtemp(root, sizeof root, "lockdir");
  rlk_test_mkdtemp(base, sizeof base, "lockbase");
  rlk_cache_config cfg;
  test_cfg(&cfg, root);
  FMT(cfg.lock_dir, "%s/new/locks", base);
  rlk_kernel_key k;
  make_key(&k, &rng, "lockdir");
  rlk_cache *c = open_cache(&cfg);
  rlk_cache_lock *lock = NULL;
  ck_assert_int_eq(rlk_cache_lock_acquire(c, &k, &lock), RLK_OK);
  rlk_cache_lock_release(lock);
  rlk_cache_close(c);
  struct stat st;
  ck_assert_int_eq(stat(cfg.lock_dir, &st), 0);
  ck_assert_int_eq((int)(st.st_mode & 0777), 0700);

  /* Another user's directory: one warning, then no locking (correct, maybe duplicate work). */
  if (geteuid() == 0) {
    rlk_test_mkdtemp(base, sizeof base, "foreign");
    ck_assert_int_eq(chown(base, OTHER_UID, OTHER_UID), 0);
    FMT(cfg.lock_dir, "%s", base);
  } else {
    FMT(cfg.lock_dir, "/");
  }
  expect_unlocked(open_cache(&cfg), &k, "owned by uid");
  char lockfile[2200];
  FMT(lockfile, "%s/%s.lock", cfg.lock_dir, k.hex);
  ck_assert(!exists(lockfile));

  /* A lock file that cannot be opened: one warning, then the cache works without locks. */
  rlk_test_mkdtemp(base, sizeof base, "badlock");
  FMT(cfg.lock_dir, "%s", base);
  FMT(lockfile, "%s/%s.lock", base, k.hex);
  ck_assert_int_eq(mkdir(lockfile, 0700), 0);
  expect_unlocked(open_cache(&cfg), &k, "without compile locks");
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Configuration and start-up housekeeping                                                  */
/* ---------------------------------------------------------------------------------------- */

START_TEST(test_config_from_env) {
  rlk_cache_config cfg;
  char want[1100];
  setenv("RLK_CACHE_DIR", "/x/y", 1);
  unsetenv("RLK_CACHE_MODE");
  unsetenv("RLK_CACHE_MAX_BYTES");
  unsetenv("RLK_CACHE_RO_DIRS");
  unsetenv("RLK_LOCK_TIMEOUT_S");
  setenv("RLK_LOCK_DIR", "/locks/here", 1);
  ck_assert_int_eq(rlk_cache_config_from_env(&cfg, NULL), RLK_OK);
  ck_assert_str_eq(cfg.root, "/x/y");
  ck_assert_int_eq(cfg.mode, RLK_CACHE_MODE_RW);
  ck_assert_uint_eq(cfg.max_bytes, 0);
  ck_assert_str_eq(cfg.ro_dirs, "");
  ck_assert_str_eq(cfg.lock_dir, "/locks/here");
  ck_assert(cfg.lock_timeout_s == 600.0);
  ck_assert_int_eq(rlk_cache_config_from_env(&cfg, "/override"), RLK_OK);
  ck_assert_str_eq(cfg.root, "/override");

  unsetenv("RLK_LOCK_DIR");
  ck_assert_int_eq(rlk_cache_config_from_env(&cfg, NULL), RLK_OK);
  if (access("/dev/shm", W_OK | X_OK) == 0)
    FMT(want, "/dev/shm/rlk-%u", (unsigned)geteuid());
  else
    FMT(want, "/tmp/rlk-%u", (unsigned)geteuid());
  ck_assert_str_eq(cfg.lock_dir, want);

  static const struct {
    const char *text;
    rlk_cache_mode mode;
  } modes[] = {{"rw", RLK_CACHE_MODE_RW},
               {"ro", RLK_CACHE_MODE_RO},
               {"memory", RLK_CACHE_MODE_MEMORY},
               {"off", RLK_CACHE_MODE_OFF}};
  for (size_t i = 0; i < 4; i++) {
    setenv("RLK_CACHE_MODE", modes[i].text, 1);
    ck_assert_int_eq(rlk_cache_config_from_env(&cfg, NULL), RLK_OK);
    ck_assert_int_eq(cfg.mode, modes[i].mode);
  }
  setenv("RLK_CACHE_MODE", "readonly", 1);
  rlk_test_expect_error(rlk_cache_config_from_env(&cfg, NULL), RLK_ERR_INVALID_ARGUMENT, "RLK_CACHE_MODE",
                        "rlk_cache_config_from_env");
  unsetenv("RLK_CACHE_MODE");

  static const struct {
    const char *text;
    uint64_t bytes;
  } sizes[] = {{"12345", 12345},        {"64K", 65536},           {"3M", 3u << 20},
               {"2G", 2ull << 30},      {"1GiB", 1ull << 30},     {"10kb", 10240},
               {"0", 0},                {"1T", 1ull << 40}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    setenv("RLK_CACHE_MAX_BYTES", sizes[i].text, 1);
    ck_assert_int_eq(rlk_cache_config_from_env(&cfg, NULL), RLK_OK);
    ck_assert_msg(cfg.max_bytes == sizes[i].bytes, "%s -> %llu", sizes[i].text,
                  (unsigned long long)cfg.max_bytes);
  }
  static const char *const bad_sizes[] = {"5x", "-1", "K", "1.5G", "99999999999999999999", "1 G"};
  for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
    setenv("RLK_CACHE_MAX_BYTES", bad_sizes[i], 1);
    ck_assert_msg(rlk_cache_config_from_env(&cfg, NULL) == RLK_ERR_INVALID_ARGUMENT, "%s accepted",
                  bad_sizes[i]);
  }
  unsetenv("RLK_CACHE_MAX_BYTES");

  setenv("RLK_LOCK_TIMEOUT_S", "2.5", 1);
  ck_assert_int_eq(rlk_cache_config_from_env(&cfg, NULL), RLK_OK);
  ck_assert(cfg.lock_timeout_s == 2.5);
  setenv("RLK_LOCK_TIMEOUT_S", "-1", 1);
  ck_assert_int_eq(rlk_cache_config_from_env(&cfg, NULL), RLK_ERR_INVALID_ARGUMENT);
  setenv("RLK_LOCK_TIMEOUT_S", "soon", 1);
  ck_assert_int_eq(rlk_cache_config_from_env(&cfg, NULL), RLK_ERR_INVALID_ARGUMENT);
  unsetenv("RLK_LOCK_TIMEOUT_S");

  setenv("RLK_CACHE_RO_DIRS", "/a:/b/c", 1);
  ck_assert_int_eq(rlk_cache_config_from_env(&cfg, NULL), RLK_OK);
  ck_assert_str_eq(cfg.ro_dirs, "/a:/b/c");

  /* Without RLK_CACHE_DIR: XDG_CACHE_HOME (absolute only), then HOME. */
  unsetenv("RLK_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  setenv("HOME", "/home/someone", 1);
  ck_assert_int_eq(rlk_cache_config_from_env(&cfg, NULL), RLK_OK);
  ck_assert_str_eq(cfg.root, "/xdg/rlk");
  setenv("XDG_CACHE_HOME", "relative", 1);
  ck_assert_int_eq(rlk_cache_config_from_env(&cfg, NULL), RLK_OK);
  ck_assert_str_eq(cfg.root, "/home/someone/.cache/rlk");
  char buf[256];
  ck_assert_int_eq(rlk_cache_default_root(buf, sizeof buf), RLK_OK);
  ck_assert_str_eq(buf, "/home/someone/.cache/rlk");
  setenv("RLK_CACHE_DIR", "/explicit", 1);
  ck_assert_int_eq(rlk_cache_default_root(buf, sizeof buf), RLK_OK);
  ck_assert_str_eq(buf, "/explicit");
  ck_assert_int_eq(rlk_cache_default_root(buf, 4), RLK_ERR_INVALID_ARGUMENT);

  /* No home at all: the cache still opens, in memory, saying so once. */
  unsetenv("RLK_CACHE_DIR");
  unsetenv("XDG_CACHE_HOME");
  unsetenv("HOME");
  ck_assert_int_eq(rlk_cache_config_from_env(&cfg, NULL), RLK_OK);
  ck_assert_str_eq(cfg.root, "");
  capture cap;
  capture_begin(&cap);
  rlk_cache *c = open_cache(&cfg);
  ck_assert_int_eq(capture_end(&cap, "RLK_CACHE_DIR"), 1);
  ck_assert_int_eq(rlk_cache_effective_mode(c), RLK_CACHE_MODE_MEMORY);
  rlk_cache_close(c);
}
END_TEST

START_TEST(test_open_sweeps_abandoned_staging_and_quarantine) {
  char root[1024], p[1300];
  rlk_test_mkdtemp(root, sizeof root, "sweep");
  mark_as_cache_root(root);
  int64_t now = rlk_unix_time();
  /* the old one as rlk-precompile merge names its staging (a host name with a dash in it) */
  const char *old_stage = "merge-host-A-123-abcdef", *new_stage = "hostA-124-abcdeg";
  char old_q[128], new_q[128];
  FMT(old_q, "%064d.%lld.77", 0, (long long)(now - 3 * 86400));
  FMT(new_q, "%064d.%lld.78", 1, (long long)now);
  const char *dirs[] = {"tmp", "quarantine"};
  for (int i = 0; i < 2; i++) {
    FMT(p, "%s/%s", root, dirs[i]);
    ck_assert_int_eq(mkdir(p, 0700), 0);
  }
  const char *made[4][2] = {{"tmp", old_stage}, {"tmp", new_stage}, {"quarantine", old_q},
                            {"quarantine", new_q}};
  for (int i = 0; i < 4; i++) {
    FMT(p, "%s/%s/%s", root, made[i][0], made[i][1]);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    char f[1400];
    FMT(f, "%s/kernel.cubin", p);
    rewrite_file(f, "x", 1);
  }
  FMT(p, "%s/tmp/%s", root, old_stage);
  set_mtime(p, now - 2 * 3600);
  rlk_cache_config cfg;
  test_cfg(&cfg, root);
  rlk_cache *c = open_cache(&cfg);
  rlk_cache_close(c);
  for (int i = 0; i < 4; i++) {
    FMT(p, "%s/%s/%s", root, made[i][0], made[i][1]);
    ck_assert_msg(exists(p) == (i % 2 == 1), "%s", p);
  }
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* The public management API                                                                */
/* ---------------------------------------------------------------------------------------- */

typedef struct seen_entries {
  int n;
  char key[4][65];
  char family[4][64];
  uint64_t bytes[4];
  int64_t created[4], last_used[4];
  int ok_fields;
} seen_entries;

static int record_visit(const rlk_cache_entry *e, void *user) {
  seen_entries *s = user;
  if (s->n < 4) {
    snprintf(s->key[s->n], 65, "%s", e->key);
    snprintf(s->family[s->n], 64, "%s", e->family);
    s->bytes[s->n] = e->bytes;
    s->created[s->n] = e->created;
    s->last_used[s->n] = e->last_used;
    s->ok_fields += strcmp(e->target, "sm_90a") == 0 && strcmp(e->compiler, "nvrtc-13.0") == 0 &&
                    strncmp(e->params, "block=", 6) == 0 && exists(e->path) &&
                    strstr(e->path, e->key) != NULL;
  }
  s->n++;
  return 0;
}

static int stop_visit(const rlk_cache_entry *e, void *user) {
  (void)e;
  (*(int *)user)++;
  return 1;
}

START_TEST(test_walk_verify_prune_clear) {
  uint64_t rng = rng_for(18);
  char root[1024], dir[3][1200];
  rlk_cache_config cfg;
  rlk_cache *c = open_fresh_cache(root, sizeof root, "admin", &cfg);
  rlk_kernel_key k[3];
  uint8_t *bin[3];
  const char *fam[3] = {"alpha", "beta", "beta"};
  int64_t now = rlk_unix_time();
  for (int i = 0; i < 3; i++) {
    make_key(&k[i], &rng, fam[i]);
    bin[i] = random_bytes(&rng, 300 + 100 * (size_t)i);
    publish(c, &k[i], bin[i], 300 + 100 * (size_t)i);
    entry_dir(root, &k[i], dir[i], sizeof dir[i]);
  }

  seen_entries s;
  memset(&s, 0, sizeof s);
  ck_assert_int_eq(rlk_cache_walk(root, record_visit, &s), RLK_OK);
  ck_assert_int_eq(s.n, 3);
  ck_assert_int_eq(s.ok_fields, 3);
  for (int i = 0; i < 3; i++) {
    int j = 0;
    while (j < 3 && strcmp(s.key[j], k[i].hex) != 0) j++;
    ck_assert_msg(j < 3, "entry %d not walked", i);
    ck_assert_str_eq(s.family[j], fam[i]);
    ck_assert_uint_eq(s.bytes[j], dir_bytes(dir[i]));
    ck_assert(s.created[j] >= now - 60 && s.created[j] <= now + 60);
    ck_assert(s.last_used[j] >= now - 60 && s.last_used[j] <= now + 60);
  }
  int calls = 0;
  ck_assert_int_eq(rlk_cache_walk(root, stop_visit, &calls), RLK_OK);
  ck_assert_int_eq(calls, 1);
  /* root NULL: the default root, which the environment points here. */
  setenv("RLK_CACHE_DIR", root, 1);
  ck_assert_int_eq(count_entries(NULL), 3);
  char missing[1200];
  FMT(missing, "%s/none", root);
  ck_assert_int_eq(count_entries(missing), 0);

  /* verify: a flipped byte is found, then repaired (quarantined). */
  uint64_t entries = 0, bad = 0;
  ck_assert_int_eq(rlk_cache_verify(root, 0, &entries, &bad), RLK_OK);
  ck_assert_uint_eq(entries, 3);
  ck_assert_uint_eq(bad, 0);
  char path[1300];
  FMT(path, "%s/kernel.cubin", dir[2]);
  int fd = open(path, O_RDWR);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(pwrite(fd, "\xff\xfe", 2, 7), 2);
  close(fd);
  ck_assert_int_eq(rlk_cache_verify(root, 0, &entries, &bad), RLK_OK);
  ck_assert_uint_eq(entries, 3);
  ck_assert_uint_eq(bad, 1);
  ck_assert(exists(dir[2]));
  ck_assert_int_eq(rlk_cache_verify(NULL, 1, &entries, &bad), RLK_OK);
  ck_assert_uint_eq(bad, 1);
  ck_assert(!exists(dir[2]));
  ck_assert_int_eq(rlk_cache_verify(root, 0, &entries, &bad), RLK_OK);
  ck_assert_uint_eq(entries, 2);
  ck_assert_uint_eq(bad, 0);

  /* prune by age, then by size. */
  char stamp[1300];
  FMT(stamp, "%s/last_used", dir[0]);
  set_mtime(stamp, now - 5000);
  uint64_t removed = 0, bytes = 0, size0 = dir_bytes(dir[0]), size1 = dir_bytes(dir[1]);
  ck_assert_int_eq(rlk_cache_prune(root, 0, 0, &removed, &bytes), RLK_OK);
  ck_assert_uint_eq(removed, 0);
  ck_assert_int_eq(rlk_cache_prune(root, 0, 1000, &removed, &bytes), RLK_OK);
  ck_assert_uint_eq(removed, 1);
  ck_assert_uint_eq(bytes, size0);
  ck_assert(!exists(dir[0]) && exists(dir[1]));
  ck_assert_int_eq(rlk_cache_prune(root, size1, 0, &removed, &bytes), RLK_OK);
  ck_assert_uint_eq(removed, 0);
  ck_assert_int_eq(rlk_cache_prune(root, size1 - 1, 0, &removed, &bytes), RLK_OK);
  ck_assert_uint_eq(removed, 1);
  ck_assert_uint_eq(bytes, size1);
  ck_assert_int_eq(count_entries(root), 0);
  ck_assert_int_eq(rlk_cache_prune(root, 0, -1, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);

  /* clear: entries, staging and quarantine go; the root and unrelated files stay. */
  for (int i = 0; i < 3; i++) publish(c, &k[i], bin[i], 300 + 100 * (size_t)i);
  char notes[1300], other[1300], tmpkeep[1300];
  FMT(notes, "%s/notes.txt", root);
  rewrite_file(notes, "mine", 4);
  FMT(other, "%s/other", root);
  ck_assert_int_eq(mkdir(other, 0700), 0);
  FMT(other, "%s/other/file", root);
  rewrite_file(other, "mine", 4);
  FMT(tmpkeep, "%s/tmp/unrelated.txt", root);
  rewrite_file(tmpkeep, "mine", 4);
  ck_assert_int_eq(count_entries(root), 3);
  ck_assert_int_eq(rlk_cache_clear(root), RLK_OK);
  ck_assert_int_eq(count_entries(root), 0);
  FMT(path, "%s/v%d", root, RLK_CACHE_SCHEMA);
  ck_assert(!exists(path));
  FMT(path, "%s/quarantine", root);
  ck_assert(!exists(path));
  ck_assert(exists(root) && exists(notes) && exists(other) && exists(tmpkeep));
  /* The open handle keeps working after a clear. */
  publish(c, &k[0], bin[0], 300);
  expect_hit(c, &k[0], bin[0], 300);
  rlk_cache_close(c);
  for (int i = 0; i < 3; i++) free(bin[i]);
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Trust, links, debris and FIFOs                                                          */
/* ---------------------------------------------------------------------------------------- */

/* A tree with one entry of k, published by an ordinary writable cache. */
static void make_tree(const char *root, const rlk_kernel_key *k, const uint8_t *bin, size_t n) {
  rlk_cache_config cfg;
  test_cfg(&cfg, root);
  rlk_cache *maker = open_cache(&cfg);
  publish(maker, k, bin, n);
  rlk_cache_close(maker);
}

/* A cache that reads `ro` as its only read-only tree and writes `rw`. */
static rlk_cache *open_with_ro(const char *rw, const char *ro) {
  rlk_cache_config cfg;
  test_cfg(&cfg, rw);
  FMT(cfg.ro_dirs, "%s", ro);
  return open_cache(&cfg);
}

/* Every directory on the way to an entry counts, in read-only trees as in the writable one:
 * one that other users may write to lets them plant code, and is never read. */
START_TEST(test_untrusted_directory_below_a_tree_is_refused) {
  uint64_t rng = rng_for(30);
  static const char *const levels[] = {"v", "compiler", "target", "family", "hh", "entry"};
  for (int level = 0; level < 6; level++) {
    for (int mode = 0; mode < 2; mode++) { /* 0777, 01777 */
      char ro[1024], rw[1024], dir[1300];
      rlk_test_mkdtemp(ro, sizeof ro, "rotrust");
      rlk_test_mkdtemp(rw, sizeof rw, "rwtrust");
      rlk_kernel_key k;
      make_key(&k, &rng, "trust");
      uint8_t bin[64] = {7, 7, levels[level][0]};
      make_tree(ro, &k, bin, sizeof bin);
      entry_dir(ro, &k, dir, sizeof dir);
      for (int up = 5; up > level; up--) *strrchr(dir, '/') = '\0';
      ck_assert_int_eq(chmod(dir, mode ? 01777 : 0777), 0);
      rlk_cache *c = open_with_ro(rw, ro);
      rlk_cache_blob b;
      capture cap;
      capture_begin(&cap);
      int hit = lookup(c, &k, &b, NULL);
      int again = lookup(c, &k, &b, NULL);
      int warnings = capture_end(&cap, "world-writable");
      ck_assert_msg(!hit && !again, "an entry below a world-writable %s directory was read",
                    levels[level]);
      ck_assert_int_eq(warnings, 1); /* once per process */
      rlk_cache_close(c);

      /* The same damage in the writable tree: not read; publishing repairs the tree. */
      rlk_cache_config cfg;
      test_cfg(&cfg, ro);
      c = open_cache(&cfg);
      capture_begin(&cap);
      ck_assert_int_eq(lookup(c, &k, &b, NULL), 0);
      capture_end(&cap, "world-writable");
      publish(c, &k, bin, sizeof bin);
      expect_hit(c, &k, bin, sizeof bin);
      rlk_cache_close(c);
    }
  }
}
END_TEST

/* Run as root, the tree may belong to root while another user owns what lies below. */
START_TEST(test_foreign_owner_below_a_tree_is_refused) {
  if (geteuid() != 0) {
    printf("skip (foreign owner): changing a file's owner needs root\n");
    return;
  }
  uint64_t rng = rng_for(31);
  for (int what = 0; what < 4; what++) { /* v dir, entry dir, binary, group-writable dir */
    char ro[1024], rw[1024], dir[1300], file[1400];
    rlk_test_mkdtemp(ro, sizeof ro, "roown");
    rlk_test_mkdtemp(rw, sizeof rw, "rwown");
    rlk_kernel_key k;
    make_key(&k, &rng, "owner");
    uint8_t bin[48] = {5, (uint8_t)what};
    make_tree(ro, &k, bin, sizeof bin);
    entry_dir(ro, &k, dir, sizeof dir);
    if (what == 1) {
      ck_assert_int_eq(chown(dir, OTHER_UID, OTHER_UID), 0);
    } else if (what == 2) {
      FMT(file, "%s/kernel.cubin", dir);
      ck_assert_int_eq(chown(file, OTHER_UID, OTHER_UID), 0);
    } else {
      FMT(file, "%s/v%d", ro, RLK_CACHE_SCHEMA);
      if (what == 0) {
        ck_assert_int_eq(chown(file, OTHER_UID, OTHER_UID), 0);
      } else {
        ck_assert_int_eq(chown(file, 0, OTHER_UID), 0);
        ck_assert_int_eq(chmod(file, 0775), 0);
      }
    }
    rlk_cache *c = open_with_ro(rw, ro);
    rlk_cache_blob b;
    capture cap;
    capture_begin(&cap);
    int hit = lookup(c, &k, &b, NULL);
    capture_end(&cap, what == 3 ? "writable by group" : "owned by uid");
    ck_assert_msg(!hit, "case %d: code owned or writable by another user was read", what);
    rlk_cache_close(c);
  }
}
END_TEST

/* A user's directory holding only names that look like the cache's (tmp/<host>-<pid>-<6>,
 * quarantine/<64 hex>.<time>.<pid>) is not the cache's: no marker says the cache made it. Opening
 * a cache there, pruning and clearing it delete nothing. */
START_TEST(test_lookalike_names_are_no_proof) {
  int64_t now = rlk_unix_time();
  char dir[1024], p[1300], staged[1300], quarantined[1300];
  rlk_test_mkdtemp(dir, sizeof dir, "lookalike");
  FMT(p, "%s/tmp", dir);
  ck_assert_int_eq(mkdir(p, 0700), 0);
  FMT(p, "%s/quarantine", dir);
  ck_assert_int_eq(mkdir(p, 0700), 0);
  FMT(staged, "%s/tmp/host-123-abcdef", dir);
  rewrite_file(staged, "keep", 4);
  set_mtime(staged, now - 5 * 86400);
  FMT(quarantined, "%s/quarantine/%064d.1.2", dir, 0);
  rewrite_file(quarantined, "keep", 4);
  uint64_t rng = rng_for(40);
  expect_memory_mode(dir, "no CACHEDIR.TAG marker", &rng);
  ck_assert_int_eq(rlk_cache_prune(dir, 1, 1, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);
  rlk_test_expect_error(rlk_cache_clear(dir), RLK_ERR_INVALID_ARGUMENT, "marker", "rlk_cache_clear");
  ck_assert(exists(staged) && exists(quarantined));
  /* nor is it made the cache's by rlk_cache_create_root */
  ck_assert_int_eq(rlk_cache_create_root(dir), RLK_ERR_IO);
  ck_assert(exists(staged) && exists(quarantined));
}
END_TEST

/* A root that is not the cache's (no marker, other files in it, as RLK_CACHE_DIR=$HOME would
 * be) is never written or swept; the cache's own tmp/ and quarantine/ lose only names the
 * cache creates, and never through a link. */
START_TEST(test_sweeping_deletes_only_own_names_never_through_links) {
  int64_t now = rlk_unix_time();
  char home[1024], p[1300], outside[1024], victim[1300], stranger[1300];
  /* $HOME-like: a user's own tmp/ with old files. */
  rlk_test_mkdtemp(home, sizeof home, "home");
  FMT(p, "%s/tmp", home);
  ck_assert_int_eq(mkdir(p, 0700), 0);
  FMT(victim, "%s/tmp/hostA-123-abcdef", home); /* even a name like a staging dir's */
  rewrite_file(victim, "keep", 4);
  set_mtime(victim, now - 5 * 86400);
  FMT(stranger, "%s/notes.txt", home);
  rewrite_file(stranger, "keep", 4);
  uint64_t rng = rng_for(41);
  expect_memory_mode(home, "not a kernel cache", &rng);
  ck_assert(exists(victim) && exists(stranger));
  uint64_t n = 9;
  ck_assert_int_eq(rlk_cache_prune(home, 1, 1, &n, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_uint_eq(n, 0);
  ck_assert_int_eq(rlk_cache_clear(home), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_cache_verify(home, 1, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert(exists(victim) && exists(stranger));

  /* The cache's own root with tmp/ and quarantine/ as links to another directory. */
  char root[1024];
  rlk_test_mkdtemp(root, sizeof root, "linked");
  mark_as_cache_root(root);
  rlk_test_mkdtemp(outside, sizeof outside, "outside");
  const char *names[] = {"hostA-1-abcdef", "0000000000000000000000000000000000000000000000000000000000000000.1.2",
                         "unrelated"};
  for (int i = 0; i < 3; i++) {
    FMT(p, "%s/%s", outside, names[i]);
    rewrite_file(p, "keep", 4);
    set_mtime(p, now - 5 * 86400);
  }
  FMT(p, "%s/tmp", root);
  ck_assert_int_eq(symlink(outside, p), 0);
  FMT(p, "%s/quarantine", root);
  ck_assert_int_eq(symlink(outside, p), 0);
  rlk_cache_config cfg;
  test_cfg(&cfg, root);
  rlk_cache *c = open_cache(&cfg);
  ck_assert_int_eq(rlk_cache_effective_mode(c), RLK_CACHE_MODE_RW);
  rlk_cache_close(c);
  ck_assert_int_eq(rlk_cache_prune(root, 1, 1, NULL, NULL), RLK_OK);
  FMT(p, "%s/quarantine", root);
  struct stat st;
  if (lstat(p, &st) != 0 || !S_ISLNK(st.st_mode)) ck_assert_int_eq(symlink(outside, p), 0);
  ck_assert_int_eq(rlk_cache_clear(root), RLK_OK);
  ck_assert_int_eq(count_children(outside), 3);

  /* In a real tmp/, an old file of another name stays; an old staging directory goes. */
  FMT(p, "%s/tmp", root);
  ck_assert_int_eq(lstat(p, &st) == 0 ? 0 : mkdir(p, 0700), 0);
  ck_assert_int_eq(lstat(p, &st), 0);
  ck_assert(S_ISDIR(st.st_mode)); /* the link was replaced, never followed */
  FMT(victim, "%s/tmp/my-notes", root);
  rewrite_file(victim, "keep", 4);
  set_mtime(victim, now - 5 * 86400);
  FMT(p, "%s/tmp/hostB-77-zzzzzz", root);
  ck_assert_int_eq(mkdir(p, 0700), 0);
  set_mtime(p, now - 5 * 86400);
  c = open_cache(&cfg);
  rlk_cache_close(c);
  ck_assert(exists(victim));
  ck_assert(!exists(p));
}
END_TEST

/* A FIFO where a file belongs is refused at once: nothing ever blocks on it. */
START_TEST(test_fifo_in_an_entry_never_blocks) {
  uint64_t rng = rng_for(32);
  for (int which = 0; which < 2; which++) {
    char root[1024], dir[1300], file[1400];
    rlk_test_mkdtemp(root, sizeof root, "fifo");
    rlk_kernel_key k;
    make_key(&k, &rng, "fifo");
    uint8_t bin[32] = {1, 2, 3};
    make_tree(root, &k, bin, sizeof bin);
    entry_dir(root, &k, dir, sizeof dir);
    FMT(file, "%s/%s", dir, which ? "kernel.cubin" : "kernel.meta");
    ck_assert_int_eq(unlink(file), 0);
    ck_assert_int_eq(mkfifo(file, 0600), 0);
    alarm(20); /* a hang fails the case instead of the suite */
    rlk_cache_config cfg;
    test_cfg(&cfg, root);
    FMT(cfg.ro_dirs, "%s", root);
    cfg.mode = RLK_CACHE_MODE_MEMORY; /* read it as a read-only tree */
    rlk_cache *c = open_cache(&cfg);
    rlk_cache_blob b;
    capture cap;
    capture_begin(&cap);
    ck_assert_int_eq(lookup(c, &k, &b, NULL), 0);
    capture_end(&cap, "not a regular file");
    rlk_cache_close(c);
    uint64_t entries = 0, bad = 0;
    capture_begin(&cap);
    ck_assert_int_eq(rlk_cache_verify(root, 0, &entries, &bad), RLK_OK);
    capture_end(&cap, NULL);
    ck_assert_uint_eq(bad, 1);
    ck_assert_int_eq(count_entries(root), which ? 1 : 1);
    alarm(0);
  }
}
END_TEST

/* Debris where the layout has directories: every kind is counted as a rebuilt kernel with one
 * warning, and repaired by the next publish. */
START_TEST(test_debris_in_the_layout_is_repaired) {
  uint64_t rng = rng_for(33);
  for (int kind = 0; kind < 5; kind++) {
    char root[1024], dir[1300], p[1400];
    rlk_test_mkdtemp(root, sizeof root, "debris");
    rlk_kernel_key k;
    make_key(&k, &rng, "debris");
    rlk_cache_config cfg;
    test_cfg(&cfg, root);
    rlk_cache *c = open_cache(&cfg);
    entry_dir(root, &k, dir, sizeof dir);
    FMT(p, "%s", dir);
    char *hh = strrchr(p, '/');
    *hh = '\0';
    char *family = strrchr(p, '/');
    *family = '\0';
    ck_assert_int_eq(rlk_mkdirs(p, 0755), 0); /* .../<target> */
    *family = '/';
    switch (kind) {
    case 0: /* a dangling link where the entry belongs */
      ck_assert_int_eq(rlk_mkdirs(p, 0755), 0);
      ck_assert_int_eq(symlink("/nonexistent/rlk", dir), 0);
      break;
    case 1: /* a file where the entry belongs */
      ck_assert_int_eq(rlk_mkdirs(p, 0755), 0);
      rewrite_file(dir, "x", 1);
      break;
    case 2: /* a file at <hh> */
      rewrite_file(p, "x", 1);
      break;
    case 3: /* a dangling link at <family> */
      *hh = '\0';
      ck_assert_int_eq(symlink("/nonexistent/rlk", p), 0);
      break;
    case 4: /* a link at <family> to a real directory elsewhere: never followed */
      *hh = '\0';
      {
        char elsewhere[1024];
        rlk_test_mkdtemp(elsewhere, sizeof elsewhere, "elsewhere");
        ck_assert_int_eq(symlink(elsewhere, p), 0);
      }
      break;
    }
    uint8_t bin[24] = {9, (uint8_t)kind};
    capture cap;
    capture_begin(&cap);
    rlk_cache_blob b;
    int rebuilt = 0;
    ck_assert_int_eq(lookup(c, &k, &b, &rebuilt), 0);
    publish(c, &k, bin, sizeof bin);
    /* repaired, and said so once: a warning and a rebuilt kernel */
    int warnings = capture_end(&cap, "debris replaced");
    ck_assert_int_eq(warnings, 1);
    ck_assert_int_eq(rebuilt, 1);
    expect_hit(c, &k, bin, sizeof bin);
    struct stat st;
    ck_assert_int_eq(lstat(dir, &st), 0);
    ck_assert(S_ISDIR(st.st_mode));
    rlk_cache_close(c);
  }
}
END_TEST

/* A read-only entry the backend refuses steps aside for this process's lookups, so the copy
 * rebuilt into the writable tree is found; a damaged read-only entry warns and counts once. */
START_TEST(test_refused_read_only_entry_does_not_shadow_the_rebuilt_copy) {
  uint64_t rng = rng_for(34);
  char ro[1024], rw[1024], dir[1300], meta[1400];
  rlk_test_mkdtemp(ro, sizeof ro, "roshadow");
  rlk_test_mkdtemp(rw, sizeof rw, "rwshadow");
  rlk_kernel_key k;
  make_key(&k, &rng, "shadow");
  uint8_t old_bin[32] = {1}, new_bin[40] = {2};
  make_tree(ro, &k, old_bin, sizeof old_bin);
  make_tree(rw, &k, new_bin, sizeof new_bin);
  rlk_cache *c = open_with_ro(rw, ro);
  rlk_cache_blob b;
  ck_assert_int_eq(lookup(c, &k, &b, NULL), 1);
  ck_assert(b.read_only);
  ck_assert_int_eq(rlk_cache_quarantine(c, b.path), RLK_OK);
  rlk_cache_blob_free(&b);
  expect_hit(c, &k, new_bin, sizeof new_bin);
  entry_dir(ro, &k, dir, sizeof dir);
  ck_assert(exists(dir)); /* a read-only tree is never written */
  rlk_cache_close(c);

  /* Damaged: one warning and one rebuild count, however often it is looked up. */
  FMT(meta, "%s/kernel.meta", dir);
  rewrite_file(meta, "format=rlk-cache-1\nend=1\n", 25);
  c = open_with_ro(rw, ro);
  int rebuilt = 0;
  capture cap;
  capture_begin(&cap);
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(lookup(c, &k, &b, &rebuilt), 1);
    ck_assert(!b.read_only);
    rlk_cache_blob_free(&b);
  }
  int warnings = capture_end(&cap, "skipping");
  ck_assert_int_eq(warnings, 1);
  ck_assert_int_eq(rebuilt, 1);
  rlk_cache_close(c);
}
END_TEST

Suite *cache_suite(void) {
  Suite *s = suite_create("cache");
  TCase *tc = tcase_create("cache");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_publish_lookup_round_trip);
  tcase_add_test(tc, test_invalid_arguments);
  tcase_add_test(tc, test_stale_hash_in_key_is_ignored);
  tcase_add_test(tc, test_read_only_trees_and_modes);
  tcase_add_loop_test(tc, test_damaged_entry_is_quarantined_and_rebuilt, 0, DMG_COUNT);
  tcase_add_test(tc, test_publish_replaces_uncommitted_directory);
  tcase_add_test(tc, test_quarantine_api);
  tcase_add_test(tc, test_root_that_cannot_be_created);
  tcase_add_test(tc, test_root_with_only_a_tuning_database_is_claimed);
  tcase_add_test(tc, test_root_whose_marker_cannot_be_written_is_not_used);
  tcase_add_test(tc, test_unreadable_directories_are_reported);
  tcase_add_test(tc, test_root_with_debris_at_tmp_is_repaired);
  tcase_add_test(tc, test_read_only_root_chmod);
  tcase_add_test(tc, test_untrusted_roots_refused);
  tcase_add_test(tc, test_last_used_refreshed_at_most_hourly);
  tcase_add_test(tc, test_eviction_oldest_first_with_grace);
  tcase_add_test(tc, test_racing_publishers);
  tcase_add_test(tc, test_lock_makes_one_compile);
  tcase_add_test(tc, test_lock_timeout);
  tcase_add_test(tc, test_lock_released_by_dead_holder);
  tcase_add_test(tc, test_lock_dir_created_private_and_foreign_refused);
  tcase_add_test(tc, test_config_from_env);
  tcase_add_test(tc, test_open_sweeps_abandoned_staging_and_quarantine);
  tcase_add_test(tc, test_walk_verify_prune_clear);
  suite_add_tcase(s, tc);
  rlk_test_add_case(s, "trust", 60, TESTS(test_untrusted_directory_below_a_tree_is_refused,
      test_foreign_owner_below_a_tree_is_refused, test_sweeping_deletes_only_own_names_never_through_links,
      test_lookalike_names_are_no_proof, test_fifo_in_an_entry_never_blocks,
      test_debris_in_the_layout_is_repaired, test_refused_read_only_entry_does_not_shadow_the_rebuilt_copy));
  return s;
}

/* fuzz_cache_meta.c - a cache entry's metadata (kernel.meta) as the cache reads it:
 * rlk_cache_meta_parse on the bytes, then the bytes as the kernel.meta of an entry in a scratch
 * tree (where its key says the entry lives, when it parses) beside a small binary, through
 * rlk_cache_entry_check, rlk_cache_walk and rlk_cache_verify (repairing on odd flags), and on one
 * input in four rlk_cache_prune.
 *
 * Input: one byte of flags, then the file. Checks beyond the sanitizers: a parsed entry's key
 * fields, written out and read back, give the same key; walk and verify find the one entry
 * when it passes its check (and is of this schema), and verify counts it bad exactly when the
 * check fails. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"
#include "jit/cache_internal.h"
#include "jit/key.h"
#include "rlk.h"

/* The binary every entry holds; the seeds' binary_size and binary_sha256 describe it. */
static const char binary[] = "rlk fuzz binary\n";

static char root[1100];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fz_init(argc, argv);
  snprintf(root, sizeof root, "%s/tree", fz_scratch());
  return 0;
}

static void check_key_round_trip(const rlk_kernel_key *key) {
  rlk_kernel_key again;
  memset(&again, 0, sizeof again);
  char field[1100];
  for (int i = 0; i < RLK_KEY_NFIELDS; i++) {
    rlk_key_field(key, i, field, sizeof field);
    if (rlk_key_set_field(&again, i, field) != RLK_OK) fz_fail("rlk_key_field", "a field does not read back");
  }
  rlk_key_finish(&again);
  if (strcmp(again.hex, key->hex)) fz_fail("rlk_key_field", "a key read back from its fields hashes differently");
}

static int mkdirs(const char *path) {
  char buf[RLK_CACHE_PATH_MAX];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      mkdir(buf, 0755);
      *p = '/';
    }
  return mkdir(buf, 0755) == 0 ? 0 : -1;
}

static int visit(const rlk_cache_entry *e, void *user) {
  (void)e;
  ++*(int *)user;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0], *body = data + 1;
  const size_t len = size - 1;
  char why[512];

  char *text = fz_text(body, len);
  rlk_cache_meta meta;
  const int parsed = rlk_cache_meta_parse(text, len, &meta, why, sizeof why) == 0;
  free(text);

  char entry[RLK_CACHE_PATH_MAX];
  const char *hash = "0000000000000000000000000000000000000000000000000000000000000000";
  if (parsed) {
    check_key_round_trip(&meta.key);
    for (size_t i = 0; i < meta.nlowered; i++)
      if (!meta.lowered[i]) fz_fail("rlk_cache_meta_parse", "a lowered name is missing");
    if (rlk_cache_entry_path(root, &meta.key, entry, sizeof entry) != 0) {
      rlk_cache_meta_free(&meta);
      return 0;
    }
    hash = strrchr(entry, '/') + 1;
  } else {
    snprintf(entry, sizeof entry, "%s/v1/clang-14.0.6/host-x86_64/fuzz/00/%s", root, hash);
  }

  rlk_cache_rmtree(root);
  char path[RLK_CACHE_PATH_MAX + 32];
  if (mkdirs(entry) != 0) fz_fail("fuzz_cache_meta", "cannot make the entry directory");
  snprintf(path, sizeof path, "%s/" RLK_CACHE_META_NAME, entry);
  if (fz_write_file(path, body, len) != 0) fz_fail("fuzz_cache_meta", "cannot write kernel.meta");
  const char *bin_name = parsed && meta.binary[0] && !strchr(meta.binary, '/') ? meta.binary : "kernel.so";
  snprintf(path, sizeof path, "%s/%s", entry, bin_name);
  fz_write_file(path, (const uint8_t *)binary, sizeof binary - 1);

  int good = 0, current = parsed && meta.key.schema == RLK_CACHE_SCHEMA;
  int dfd = open(entry, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fz_fail("fuzz_cache_meta", "cannot open the entry directory");
  char hash_copy[65];
  snprintf(hash_copy, sizeof hash_copy, "%s", hash);
  rlk_cache_meta checked;
  void *bytes = NULL;
  if (rlk_cache_entry_check(dfd, hash_copy, NULL, -1, &checked, &bytes, why, sizeof why) == 0) {
    good = 1;
    if (!parsed) fz_fail("rlk_cache_entry_check", "passed an entry whose metadata does not parse");
    if (checked.binary_size != sizeof binary - 1 || memcmp(bytes, binary, sizeof binary - 1))
      fz_fail("rlk_cache_entry_check", "handed over other bytes than the binary");
    free(bytes);
    rlk_cache_meta_free(&checked);
  }
  close(dfd);
  if (parsed) rlk_cache_meta_free(&meta);

  int visited = 0;
  fz_checked(rlk_cache_walk(root, visit, &visited), "rlk_cache_walk");
  if (visited > 1 || (good && current && visited != 1))
    fz_fail("rlk_cache_walk", "visits another number of entries than the tree holds");
  uint64_t entries = 0, bad = 0;
  if (fz_checked(rlk_cache_verify(root, flags & 1, &entries, &bad), "rlk_cache_verify") == RLK_OK) {
    if (entries > 1 || (good && current && entries != 1)) fz_fail("rlk_cache_verify", "miscounts the entries");
    if (bad != (good ? 0 : entries)) fz_fail("rlk_cache_verify", "counts a bad entry good or a good one bad");
  }
  if ((flags & 6) == 0) {
    uint64_t removed = 0, removed_bytes = 0;
    fz_checked(rlk_cache_prune(root, 1, 0, &removed, &removed_bytes), "rlk_cache_prune");
  }
  return 0;
}

/* fuzz_cache_tree.c - the cache's sweeps over a tree it may not own: a directory built from the
 * input (files, directories and links, under names the cache creates and names it never does,
 * with or without the cache's marker, a real one or a forged one), then what deletes things in a
 * tree: opening the cache there (its sweep of old staging and quarantined entries), prune,
 * clear and verify --repair.
 *
 * Input: a byte of flags (the marker; which action), then three bytes per thing made (what, where,
 * which name). Checks beyond the sanitizers: nothing outside the tree is ever removed or changed
 * (links lead there); in a tree without the cache's marker nothing is removed at all; and a
 * name the cache never creates, at the root or in its tmp/ and quarantine/, is never removed. */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "fuzz.h"
#include "jit/cache.h"
#include "rlk.h"

#define MAX_THINGS 24

static char root[1100], outside[1100], locks[1100];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fz_init(argc, argv);
  snprintf(root, sizeof root, "%s/tree", fz_scratch());
  snprintf(outside, sizeof outside, "%s/outside", fz_scratch());
  snprintf(locks, sizeof locks, "%s/locks", fz_scratch());
  mkdir(locks, 0700);
  return 0;
}

/* Where things go, relative to the root. */
static const char *const places[] = {"", "tmp", "quarantine", "v1", "v1/host", "v1/host/x86_64", "tmp/host-1-abcdef"};
/* Names: the cache's own shapes and strangers. */
static const char *const names[] = {
    "tmp", "quarantine", "v1", "CACHEDIR.TAG", "host-1-abcdef", "host-99999999-zzzzzz", "probe-abcdef",
    "0000000000000000000000000000000000000000000000000000000000000000.1.2",
    "0000000000000000000000000000000000000000000000000000000000000000", "kernel.meta", "last_used",
    "notes.txt", "tune.db", ".hidden", "v2"};

static int own_name(const char *n) {
  for (size_t i = 0; i < 11; i++)
    if (!strcmp(n, names[i])) return 1;
  return !strcmp(n, "tune.db") || !strcmp(n, "v2");
}

/* Every path under dir (links not followed), with a stranger flag: a name the cache never
 * creates, directly in the root, tmp/ or quarantine/. */
typedef struct listing {
  char path[64][512];
  int stranger[64];
  int n;
} listing;

static void list_into(const char *dir, const char *rel, int depth, listing *l) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL && l->n < 64) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    char p[1024], r[600];
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    snprintf(r, sizeof r, "%s%s%s", rel, rel[0] ? "/" : "", de->d_name);
    snprintf(l->path[l->n], sizeof l->path[l->n], "%s", r);
    l->stranger[l->n] = (depth == 0 || (depth == 1 && (!strncmp(rel, "tmp", 4) || !strcmp(rel, "quarantine")))) &&
                        !own_name(de->d_name);
    l->n++;
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode) && depth < 4) list_into(p, r, depth + 1, l);
  }
  closedir(d);
}

static int listed(const listing *l, const char *p) {
  for (int i = 0; i < l->n; i++)
    if (!strcmp(l->path[i], p)) return 1;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_input in = {data, size};
  const uint8_t flags = fz_u8(&in);
  fz_remove_tree(root);
  fz_remove_tree(outside);
  mkdir(outside, 0700);
  char p[1200];
  snprintf(p, sizeof p, "%s/keep", outside);
  static const uint8_t keep[] = "keep";
  fz_write_file(p, keep, 4);
  snprintf(p, sizeof p, "%s/host-1-abcdef", outside);
  fz_write_file(p, keep, 4);
  mkdir(root, 0700);
  const int marker = flags & 3; /* 0 none, 1 the cache's own, 2 forged, 3 empty */
  if (marker == 1 && rlk_cache_create_root(root) != RLK_OK) fz_fail("rlk_cache_create_root", rlk_last_error());
  if (marker == 2 || marker == 3) {
    snprintf(p, sizeof p, "%s/CACHEDIR.TAG", root);
    static const uint8_t forged[] = "Signature: 8a477f597d28d172789f06886806bc55\n# not rlk's\n";
    fz_write_file(p, forged, marker == 2 ? sizeof forged - 1 : 0);
    /* another tool's file, long there (a marker still being written is read again a while) */
    struct timeval old[2] = {{1000000, 0}, {1000000, 0}};
    lutimes(p, old);
  }
  const int nthings = fz_u8(&in) % (MAX_THINGS + 1);
  for (int i = 0; i < nthings && in.n >= 3; i++) {
    const uint8_t what = fz_u8(&in), where = fz_u8(&in), which = fz_u8(&in);
    snprintf(p, sizeof p, "%s/%s%s%s", root, places[where % 7], places[where % 7][0] ? "/" : "", names[which % 15]);
    switch (what % 5) {
    case 0: fz_write_file(p, keep, 4); break;
    case 1: mkdir(p, 0700); break;
    case 2: symlink(outside, p); break;
    case 3: {
      char target[1200];
      snprintf(target, sizeof target, "%s/keep", outside);
      symlink(target, p);
      break;
    }
    default: { /* an old file or directory: a sweep takes only what is old enough */
      fz_write_file(p, keep, 4);
      struct timeval tv[2] = {{1000000, 0}, {1000000, 0}};
      lutimes(p, tv);
    }
    }
  }
  listing before = {0};
  list_into(root, "", 0, &before);
  /* a marker made by rlk_cache_create_root counts as the cache's only when it was made so */
  const int own = marker == 1;

  switch ((flags >> 2) % 4) {
  case 0: {
    rlk_cache_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.mode = RLK_CACHE_MODE_RW;
    snprintf(cfg.root, sizeof cfg.root, "%s", root);
    snprintf(cfg.lock_dir, sizeof cfg.lock_dir, "%s", locks);
    cfg.lock_timeout_s = 1;
    rlk_cache *c = NULL;
    if (fz_checked(rlk_cache_open(&cfg, &c), "rlk_cache_open") == RLK_OK) rlk_cache_close(c);
    break;
  }
  case 1: fz_checked(rlk_cache_prune(root, (flags >> 4) & 1, (flags >> 5) & 1, NULL, NULL), "rlk_cache_prune"); break;
  case 2: fz_checked(rlk_cache_clear(root), "rlk_cache_clear"); break;
  default: fz_checked(rlk_cache_verify(root, 1, NULL, NULL), "rlk_cache_verify"); break;
  }

  listing after = {0};
  list_into(root, "", 0, &after);
  for (int i = 0; i < before.n; i++) {
    if (listed(&after, before.path[i])) continue;
    if (!own) {
      char why[700];
      snprintf(why, sizeof why, "%s removed from a tree without the cache's marker", before.path[i]);
      fz_fail("sweep", why);
    }
    if (before.stranger[i]) {
      char why[700];
      snprintf(why, sizeof why, "%s removed, a name the cache never creates", before.path[i]);
      fz_fail("sweep", why);
    }
  }
  static const char *const kept[] = {"keep", "host-1-abcdef"};
  for (int i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s/%s", outside, kept[i]);
    size_t n = 0;
    FILE *f = fopen(p, "rb");
    char buf[8] = {0};
    if (f) {
      n = fread(buf, 1, sizeof buf, f);
      fclose(f);
    }
    if (n != 4 || memcmp(buf, keep, 4)) fz_fail("sweep", "a file outside the tree was removed or changed");
  }
  return 0;
}

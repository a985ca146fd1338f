/* sources_digest.c - what a template source set is (its files, its digest). Linked into the
 * library and into the build-time embedder, so the sets and digests baked into the library and
 * those read from RLK_TEMPLATE_DIR come from the same functions. No dependency beyond sha256.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/sha256.h"
#include "jit/template.h"

/* Is file a before file b in the digest's order (by name, then by index)? */
static int digest_before(const rlk_source_file *files, size_t a, size_t b) {
  const int c = strcmp(files[a].name, files[b].name);
  return c < 0 || (c == 0 && a < b);
}

void rlk_sources_digest(const rlk_source_file *files, size_t count, char hex[65]) {
  /* Files in name order, so the digest does not depend on directory order: each step takes the
   * first file after the previous one (no table: a set may hold any number of files). */
  rlk_sha256 h;
  rlk_sha256_init(&h);
  size_t prev = count;
  for (size_t k = 0; k < count; k++) {
    size_t next = count;
    for (size_t i = 0; i < count; i++)
      if ((prev == count || digest_before(files, prev, i)) && (next == count || digest_before(files, i, next)))
        next = i;
    const rlk_source_file *f = &files[next];
    char len[32];
    int m = snprintf(len, sizeof len, "%zu", f->size);
    rlk_sha256_update(&h, f->name, strlen(f->name) + 1);
    rlk_sha256_update(&h, len, (size_t)m + 1);
    rlk_sha256_update(&h, f->text, f->size);
    prev = next;
  }
  uint8_t d[32];
  rlk_sha256_final(&h, d);
  rlk_sha256_hex(d, hex);
}

int rlk_sources_in_set(const char *name, const char *dir) {
  const char *const folders[2] = {dir, RLK_SOURCES_SHARED};
  for (int i = 0; i < 2; i++) {
    const size_t n = strlen(folders[i]);
    if (!strncmp(name, folders[i], n) && name[n] == '/') return 1;
  }
  return 0;
}

const char *rlk_sources_basename(const char *name) {
  const char *s = strrchr(name, '/');
  return s ? s + 1 : name;
}

/* sources_digest.c - the digest of a template source set. Linked into the library and into
 * the build-time embedder, so the digest baked into the library and the one computed for
 * RLK_TEMPLATE_DIR are the same function. No dependency beyond sha256.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/sha256.h"
#include "jit/template.h"

void rlk_sources_digest(const rlk_source_file *files, size_t count, char hex[65]) {
  /* Sort indices by name so the digest does not depend on directory order. */
  size_t order[256];
  size_t n = count < 256 ? count : 256;
  for (size_t i = 0; i < n; i++) order[i] = i;
  for (size_t i = 1; i < n; i++)
    for (size_t j = i; j > 0 && strcmp(files[order[j - 1]].name, files[order[j]].name) > 0; j--) {
      size_t x = order[j];
      order[j] = order[j - 1];
      order[j - 1] = x;
    }
  rlk_sha256 h;
  rlk_sha256_init(&h);
  for (size_t k = 0; k < n; k++) {
    const rlk_source_file *f = &files[order[k]];
    char len[32];
    int m = snprintf(len, sizeof len, "%zu", f->size);
    rlk_sha256_update(&h, f->name, strlen(f->name) + 1);
    rlk_sha256_update(&h, len, (size_t)m + 1);
    rlk_sha256_update(&h, f->text, f->size);
  }
  uint8_t d[32];
  rlk_sha256_final(&h, d);
  rlk_sha256_hex(d, hex);
}

/* sources.c - the template sources a compiler sees: the copies embedded at build time, or,
 * for template development, the files under RLK_TEMPLATE_DIR (read once per process; the
 * digest is then computed from what was read, so edited templates get new cache keys). */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "jit/template.h"

extern const rlk_source_file rlk_embedded_sources[];
extern const size_t rlk_embedded_source_count;
extern const char rlk_embedded_digest_cuda[65];
extern const char rlk_embedded_digest_host[65];

#define RLK_MAX_SOURCES 128

typedef struct source_slot {
  rlk_source_set set;
  rlk_source_file files[RLK_MAX_SOURCES];
  rlk_status status;
  char error[512];
} source_slot;

static source_slot slots[2]; /* cuda, host */
static pthread_once_t slots_once = PTHREAD_ONCE_INIT;

static char *read_whole(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  size_t cap = 0, len = 0;
  for (;;) {
    if (len + 4096 + 1 > cap) {
      size_t ncap = cap ? cap * 2 : 16384;
      char *nb = realloc(buf, ncap);
      if (!nb) { free(buf); fclose(f); return NULL; }
      buf = nb;
      cap = ncap;
    }
    size_t got = fread(buf + len, 1, cap - len - 1, f);
    len += got;
    if (got == 0) break;
  }
  fclose(f);
  buf[len] = '\0';
  *size = len;
  return buf;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const rlk_source_file *)a)->name, ((const rlk_source_file *)b)->name);
}

static void load_from_dir(source_slot *slot, const char *root, const char *dir) {
  char path[2048];
  rlk_format(path, sizeof path, "%s/%s", root, dir);
  DIR *d = opendir(path);
  if (!d) {
    slot->status = RLK_ERR_IO;
    rlk_format(slot->error, sizeof slot->error, "RLK_TEMPLATE_DIR: cannot open %s", path);
    return;
  }
  struct dirent *e;
  size_t n = 0;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (n >= RLK_MAX_SOURCES) break;
    char file[4096], name[512];
    rlk_format(file, sizeof file, "%s/%s", path, e->d_name);
    if (rlk_format(name, sizeof name, "%s/%s", dir, e->d_name) < 0) continue;
    size_t size = 0;
    char *text = read_whole(file, &size);
    if (!text) continue; /* a subdirectory or an unreadable file: templates are flat */
    slot->files[n].name = rlk_strdup(name);
    slot->files[n].text = text;
    slot->files[n].size = size;
    if (!slot->files[n].name) { free(text); continue; }
    n++;
  }
  closedir(d);
  qsort(slot->files, n, sizeof slot->files[0], by_name);
  slot->set.count = n;
  rlk_sources_digest(slot->files, n, slot->set.digest);
}

static void load_all(void) {
  static const char *const dirs[] = {"cuda", "host"};
  const char *override = rlk_env("RLK_TEMPLATE_DIR");
  for (size_t s = 0; s < 2; s++) {
    source_slot *slot = &slots[s];
    slot->set.dir = dirs[s];
    slot->set.files = slot->files;
    slot->status = RLK_OK;
    if (override) {
      load_from_dir(slot, override, dirs[s]);
      if (slot->status == RLK_OK)
        rlk_info("templates for %s read from %s (digest %.12s)", dirs[s], override, slot->set.digest);
      continue;
    }
    size_t n = 0, dl = strlen(dirs[s]);
    for (size_t i = 0; i < rlk_embedded_source_count && n < RLK_MAX_SOURCES; i++) {
      const rlk_source_file *f = &rlk_embedded_sources[i];
      if (f->name && !strncmp(f->name, dirs[s], dl) && f->name[dl] == '/') slot->files[n++] = *f;
    }
    slot->set.count = n;
    memcpy(slot->set.digest, s == 0 ? rlk_embedded_digest_cuda : rlk_embedded_digest_host, 65);
  }
}

rlk_status rlk_sources_get(const char *dir, const rlk_source_set **out) {
  pthread_once(&slots_once, load_all);
  size_t s;
  if (!strcmp(dir, "cuda"))
    s = 0;
  else if (!strcmp(dir, "host"))
    s = 1;
  else
    return rlk_error(RLK_ERR_INTERNAL, "no template directory named '%s'", dir);
  if (slots[s].status) return rlk_error(slots[s].status, "%s", slots[s].error);
  *out = &slots[s].set;
  return RLK_OK;
}

const rlk_source_file *rlk_sources_find(const rlk_source_set *set, const char *name) {
  for (size_t i = 0; i < set->count; i++)
    if (!strcmp(set->files[i].name, name)) return &set->files[i];
  return NULL;
}

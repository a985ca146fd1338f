/* sources.c - the template sources a compiler sees: the sets embedded at build time, or, for
 * template development, the files under RLK_TEMPLATE_DIR (a set's folder and common/, read once
 * per process; the digest is then computed from what was read, so edited templates get new cache
 * keys). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "core/fs.h"
#include "jit/template.h"

extern const rlk_source_set rlk_embedded_source_sets[2]; /* cuda, host */

typedef struct source_slot {
  rlk_source_set set;
  rlk_source_file *files; /* malloc'd; as many as the directories hold */
  size_t nfiles, cap;
  rlk_status status;
  char error[512];
} source_slot;

static source_slot slots[2]; /* as rlk_embedded_source_sets */
static pthread_once_t slots_once = PTHREAD_ONCE_INIT;

#define SOURCE_MAX_BYTES ((size_t)16 << 20) /* no template is near this */

/* Reads a regular file whole (never blocking on a FIFO). NULL with errno; EINVAL: not a
 * regular file. */
static char *read_whole(int dirfd, const char *name, size_t *size) {
  int fd = rlk_open_regular(dirfd, name, O_RDONLY, 0);
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size > SOURCE_MAX_BYTES) {
    close(fd);
    errno = EFBIG;
    return NULL;
  }
  size_t want = (size_t)st.st_size, len = 0;
  char *buf = malloc(want + 1);
  if (!buf) {
    close(fd);
    errno = ENOMEM;
    return NULL;
  }
  while (len < want) {
    ssize_t n = read(fd, buf + len, want - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
  }
  int e = errno;
  close(fd);
  if (len != want) {
    free(buf);
    errno = e ? e : EIO;
    return NULL;
  }
  buf[len] = '\0';
  *size = len;
  return buf;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const rlk_source_file *)a)->name, ((const rlk_source_file *)b)->name);
}

static void load_failed(source_slot *slot, rlk_status st, const char *fmt, const char *a,
                        const char *b) {
  slot->status = st;
  rlk_format(slot->error, sizeof slot->error, fmt, a, b);
}

/* Every regular file of <root>/<dir> joins the slot's sources; subdirectories are not part of
 * a template set (templates are flat) and are passed over; anything else that cannot be read (a
 * FIFO, a device, an unreadable file) is an error, never a silently different key. */
static void load_from_dir(source_slot *slot, const char *root, const char *dir) {
  char path[2048];
  rlk_format(path, sizeof path, "%s/%s", root, dir);
  DIR *d = opendir(path);
  if (!d) {
    load_failed(slot, RLK_ERR_IO, "RLK_TEMPLATE_DIR: cannot open %s: %s", path, strerror(errno));
    return;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, 0) == 0 && S_ISDIR(st.st_mode)) {
      rlk_debug("RLK_TEMPLATE_DIR: passing over the subdirectory %s/%s", path, e->d_name);
      continue;
    }
    if (slot->nfiles == slot->cap) {
      size_t ncap = slot->cap ? 2 * slot->cap : 64;
      rlk_source_file *f = realloc(slot->files, ncap * sizeof *f);
      if (!f) {
        load_failed(slot, RLK_ERR_OUT_OF_MEMORY, "RLK_TEMPLATE_DIR: %s%s: out of memory", path, "");
        break;
      }
      slot->files = f;
      slot->cap = ncap;
    }
    char name[512];
    if (rlk_format(name, sizeof name, "%s/%s", dir, e->d_name) < 0) {
      load_failed(slot, RLK_ERR_IO, "RLK_TEMPLATE_DIR: %s/%s: the name is too long", path, e->d_name);
      break;
    }
    size_t size = 0;
    char *text = read_whole(dirfd(d), e->d_name, &size);
    if (!text) {
      char file[2600];
      rlk_format(file, sizeof file, "%s/%s", path, e->d_name);
      load_failed(slot, RLK_ERR_IO, "RLK_TEMPLATE_DIR: cannot read %s: %s", file,
                  errno == EINVAL ? "not a regular file" : strerror(errno));
      break;
    }
    rlk_source_file *f = &slot->files[slot->nfiles];
    f->name = rlk_strdup(name);
    f->text = text;
    f->size = size;
    if (!f->name) {
      free(text);
      load_failed(slot, RLK_ERR_OUT_OF_MEMORY, "RLK_TEMPLATE_DIR: %s%s: out of memory", path, "");
      break;
    }
    slot->nfiles++;
  }
  closedir(d);
}

/* The set of `dir` under root: its folder and the shared one, in name order, no two files of one
 * name (a compiler sees them by name). */
static void load_set(source_slot *slot, const char *root, const char *dir) {
  load_from_dir(slot, root, dir);
  if (!slot->status) load_from_dir(slot, root, RLK_SOURCES_SHARED);
  if (slot->status) return;
  const size_t n = slot->nfiles;
  if (n) qsort(slot->files, n, sizeof slot->files[0], by_name);
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < i; k++)
      if (!strcmp(rlk_sources_basename(slot->files[i].name), rlk_sources_basename(slot->files[k].name))) {
        load_failed(slot, RLK_ERR_IO, "RLK_TEMPLATE_DIR: %s and %s share a name (a compiler sees them by name)",
                    slot->files[k].name, slot->files[i].name);
        return;
      }
  slot->set.files = slot->files;
  slot->set.count = n;
  rlk_sources_digest(slot->files, n, slot->set.digest);
}

static void load_all(void) {
  const char *override = rlk_env("RLK_TEMPLATE_DIR");
  for (size_t s = 0; s < 2; s++) {
    source_slot *slot = &slots[s];
    slot->set = rlk_embedded_source_sets[s];
    slot->status = RLK_OK;
    if (!override) continue;
    load_set(slot, override, rlk_embedded_source_sets[s].dir);
    if (slot->status == RLK_OK)
      rlk_info("templates for %s read from %s (digest %.12s)", slot->set.dir, override, slot->set.digest);
  }
}

rlk_status rlk_sources_get(const char *dir, const rlk_source_set **out) {
  pthread_once(&slots_once, load_all);
  size_t s = 0;
  while (s < 2 && strcmp(dir, slots[s].set.dir)) s++;
  if (s == 2) return rlk_error(RLK_ERR_INTERNAL, "no template directory named '%s'", dir);
  if (slots[s].status) return rlk_error(slots[s].status, "%s", slots[s].error);
  *out = &slots[s].set;
  return RLK_OK;
}

const rlk_source_file *rlk_sources_find(const rlk_source_set *set, const char *name) {
  for (size_t i = 0; i < set->count; i++)
    if (!strcmp(set->files[i].name, name)) return &set->files[i];
  return NULL;
}

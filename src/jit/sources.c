/* sources.c - the template sources a compiler sees: the copies embedded at build time, or,
 * for template development, the files under RLK_TEMPLATE_DIR (read once per process; the
 * digest is then computed from what was read, so edited templates get new cache keys). */
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

extern const rlk_source_file rlk_embedded_sources[];
extern const size_t rlk_embedded_source_count;
extern const char rlk_embedded_digest_cuda[65];
extern const char rlk_embedded_digest_host[65];

typedef struct source_slot {
  rlk_source_set set;
  rlk_source_file *files; /* malloc'd; as many as the directory holds */
  rlk_status status;
  char error[512];
} source_slot;

static source_slot slots[2]; /* cuda, host */
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

/* Every regular file of <root>/<dir> becomes a source; subdirectories are not part of a
 * template set (templates are flat) and are passed over; anything else that cannot be read
 * (a FIFO, a device, an unreadable file) is an error, never a silently different key. */
static void load_from_dir(source_slot *slot, const char *root, const char *dir) {
  char path[2048];
  rlk_format(path, sizeof path, "%s/%s", root, dir);
  DIR *d = opendir(path);
  if (!d) {
    load_failed(slot, RLK_ERR_IO, "RLK_TEMPLATE_DIR: cannot open %s: %s", path, strerror(errno));
    return;
  }
  struct dirent *e;
  size_t n = 0, cap = 0;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, 0) == 0 && S_ISDIR(st.st_mode)) {
      rlk_debug("RLK_TEMPLATE_DIR: passing over the subdirectory %s/%s", path, e->d_name);
      continue;
    }
    if (n == cap) {
      size_t ncap = cap ? 2 * cap : 64;
      rlk_source_file *f = realloc(slot->files, ncap * sizeof *f);
      if (!f) {
        load_failed(slot, RLK_ERR_OUT_OF_MEMORY, "RLK_TEMPLATE_DIR: %s%s: out of memory", path, "");
        break;
      }
      slot->files = f;
      cap = ncap;
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
    slot->files[n].name = rlk_strdup(name);
    slot->files[n].text = text;
    slot->files[n].size = size;
    if (!slot->files[n].name) {
      free(text);
      load_failed(slot, RLK_ERR_OUT_OF_MEMORY, "RLK_TEMPLATE_DIR: %s%s: out of memory", path, "");
      break;
    }
    n++;
  }
  closedir(d);
  if (slot->status) return;
  if (n) qsort(slot->files, n, sizeof slot->files[0], by_name);
  slot->set.files = slot->files;
  slot->set.count = n;
  rlk_sources_digest(slot->files, n, slot->set.digest);
}

static void load_all(void) {
  static const char *const dirs[] = {"cuda", "host"};
  const char *override = rlk_env("RLK_TEMPLATE_DIR");
  for (size_t s = 0; s < 2; s++) {
    source_slot *slot = &slots[s];
    slot->set.dir = dirs[s];
    slot->status = RLK_OK;
    if (override) {
      load_from_dir(slot, override, dirs[s]);
      if (slot->status == RLK_OK)
        rlk_info("templates for %s read from %s (digest %.12s)", dirs[s], override, slot->set.digest);
      continue;
    }
    /* The embedder writes each directory's files together, in name order. */
    size_t first = rlk_embedded_source_count, n = 0, dl = strlen(dirs[s]);
    for (size_t i = 0; i < rlk_embedded_source_count; i++) {
      const rlk_source_file *f = &rlk_embedded_sources[i];
      if (f->name && !strncmp(f->name, dirs[s], dl) && f->name[dl] == '/') {
        if (first == rlk_embedded_source_count) first = i;
        n++;
      }
    }
    slot->set.files = n ? &rlk_embedded_sources[first] : NULL;
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

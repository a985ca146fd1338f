/* cache_entry.c - one entry of the kernel cache on disk: its place in the layout, its kernel.meta
 * (written and parsed here: one format, both ways) and the check every read of an entry passes.
 *
 * An entry is <root>/v<schema>/<compiler>/<target>/<family>/<hh>/<hash>/ holding
 *   kernel.<ext>  the binary, byte for byte as the compiler produced it
 *   kernel.meta   "name=value" lines, the commit marker (written last, renamed in with the rest)
 *   last_used     empty; its mtime is the entry's recency for eviction */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "core/core.h"
#include "core/fs.h"
#include "jit/cache_internal.h"
#include "jit/sha256.h"

void rlk_cache_name_component(char *dst, size_t size, const char *src) {
  size_t j = 0;
  for (size_t i = 0; src[i] && j + 1 < size; i++) {
    char c = src[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '-' || c == '_' || c == '+';
    dst[j++] = ok ? c : '_';
  }
  dst[j] = '\0';
  /* Never "", ".", ".." or a hidden name: the prefix is for people, the hash decides. */
  if (j == 0 || dst[0] == '.') {
    if (j == 0) dst[j++] = '_';
    dst[0] = '_';
    dst[j] = '\0';
  }
}

int rlk_cache_entry_path(const char *root, const rlk_kernel_key *key, char *buf, size_t size) {
  char compiler[65], target[33], family[65];
  rlk_cache_name_component(compiler, sizeof compiler, key->compiler);
  rlk_cache_name_component(target, sizeof target, key->target);
  rlk_cache_name_component(family, sizeof family, key->family);
  return rlk_format(buf, size, "%s/v%d/%s/%s/%s/%.2s/%s", root, key->schema, compiler, target,
                    family, key->hex, key->hex) < 0
             ? -1
             : 0;
}

int64_t rlk_cache_entry_last_used(int dfd) {
  struct stat st;
  if (fstatat(dfd, RLK_CACHE_LAST_USED_NAME, &st, 0) == 0) return (int64_t)st.st_mtime;
  if (fstatat(dfd, RLK_CACHE_META_NAME, &st, 0) == 0) return (int64_t)st.st_mtime;
  if (fstat(dfd, &st) == 0) return (int64_t)st.st_mtime;
  return 0;
}

int rlk_cache_write_file_at(int dfd, const char *name, const void *data, size_t size) {
  int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return -1;
  if (rlk_write_all(fd, data, size) != 0 || fsync(fd) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return close(fd);
}

/* Reads a whole file of dfd (at most `limit` bytes, else EFBIG), NUL-terminated for text. */
static int read_file_at(int dfd, const char *name, size_t limit, char **data, size_t *size,
                        struct stat *st_out) {
  int fd = rlk_open_regular(dfd, name, O_RDONLY | O_NOFOLLOW, 0);
  if (fd < 0) {
    if (errno == ELOOP) errno = EINVAL; /* a link */
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return -1;
  }
  if ((uint64_t)st.st_size > limit) {
    close(fd);
    errno = EFBIG;
    return -1;
  }
  size_t want = (size_t)st.st_size;
  char *buf = malloc(want + 1);
  if (!buf) {
    close(fd);
    errno = ENOMEM;
    return -1;
  }
  size_t got = 0;
  while (got < want) {
    ssize_t n = read(fd, buf + got, want - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  if (got < want) {
    int e = errno;
    free(buf);
    close(fd);
    errno = e ? e : EIO;
    return -1;
  }
  close(fd);
  buf[got] = '\0';
  *data = buf;
  *size = got;
  if (st_out) *st_out = st;
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Metadata                                                                                 */
/* ---------------------------------------------------------------------------------------- */

typedef struct strbuf {
  char *p;
  size_t len, cap;
  int oom;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void sb_puts(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Values are escaped so that a line is always one record: backslash, newline, carriage
 * return and other control bytes become \\, \n, \r, \xHH. */
static void sb_escaped(strbuf *b, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char e[4];
    if (c == '\\') {
      sb_put(b, "\\\\", 2);
    } else if (c == '\n') {
      sb_put(b, "\\n", 2);
    } else if (c == '\r') {
      sb_put(b, "\\r", 2);
    } else if (c < 0x20 || c == 0x7f) {
      e[0] = '\\';
      e[1] = 'x';
      e[2] = hex[c >> 4];
      e[3] = hex[c & 15];
      sb_put(b, e, 4);
    } else {
      sb_put(b, (const char *)&s[i], 1);
    }
  }
}

static void sb_field(strbuf *b, const char *name, const char *value) {
  sb_puts(b, name);
  sb_put(b, "=", 1);
  sb_escaped(b, value, strlen(value));
  sb_put(b, "\n", 1);
}

static void sb_fmt(strbuf *b, const char *name, const char *fmt, ...) RLK_PRINTF(3, 4);
static void sb_fmt(strbuf *b, const char *name, const char *fmt, ...) {
  char v[128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v, sizeof v, fmt, ap);
  va_end(ap);
  sb_field(b, name, v);
}

static int unhex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Unescapes in place; -1 on a malformed escape or an escaped NUL. */
static int unescape(char *s) {
  char *w = s;
  for (const char *r = s; *r; r++) {
    if (*r != '\\') {
      *w++ = *r;
      continue;
    }
    r++;
    if (*r == '\\')
      *w++ = '\\';
    else if (*r == 'n')
      *w++ = '\n';
    else if (*r == 'r')
      *w++ = '\r';
    else if (*r == 'x' && unhex(r[1]) >= 0 && unhex(r[2]) >= 0) {
      int v = unhex(r[1]) * 16 + unhex(r[2]);
      if (v == 0) return -1;
      *w++ = (char)v;
      r += 2;
    } else
      return -1;
  }
  *w = '\0';
  return 0;
}

void rlk_cache_meta_free(rlk_cache_meta *meta) {
  if (!meta) return;
  for (size_t i = 0; i < meta->nlowered; i++) free(meta->lowered[i]);
  free(meta->lowered);
  memset(meta, 0, sizeof *meta);
}

#define META_MAX_LOWERED 65536

int rlk_cache_meta_parse(char *text, size_t len, rlk_cache_meta *m, char *why, size_t whysize) {
  memset(m, 0, sizeof *m);
  unsigned have_fields = 0;
  int have_key = 0, have_binary = 0, have_size = 0, have_sha = 0, have_count = 0, ended = 0;
  size_t lineno = 0;
  char *p = text, *end = text + len;
  if (memchr(text, '\0', len)) {
    rlk_format(why, whysize, "kernel.meta holds a NUL byte");
    goto fail;
  }
  while (p < end) {
    char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) {
      rlk_format(why, whysize, "kernel.meta is truncated (no newline after line %zu)",
                 lineno + 1);
      goto fail;
    }
    *nl = '\0';
    char *line = p;
    p = nl + 1;
    lineno++;
    if (ended) {
      rlk_format(why, whysize, "kernel.meta has data after its end line");
      goto fail;
    }
    if (lineno == 1) {
      if (strcmp(line, "format=" RLK_CACHE_META_FORMAT) != 0) {
        rlk_format(why, whysize, "kernel.meta: first line is not format=%s",
                   RLK_CACHE_META_FORMAT);
        goto fail;
      }
      continue;
    }
    char *eq = strchr(line, '=');
    if (!eq) {
      rlk_format(why, whysize, "kernel.meta line %zu has no '='", lineno);
      goto fail;
    }
    *eq = '\0';
    char *name = line, *value = eq + 1;
    if (unescape(value) != 0) {
      rlk_format(why, whysize, "kernel.meta line %zu: bad escape", lineno);
      goto fail;
    }
    int matched = 0;
    for (int i = 0; i < RLK_KEY_NFIELDS; i++) {
      if (strcmp(name, rlk_key_field_names[i]) != 0) continue;
      if (rlk_key_set_field(&m->key, i, value) != RLK_OK) {
        rlk_format(why, whysize, "kernel.meta: field %s does not parse", name);
        goto fail;
      }
      have_fields |= 1u << i;
      matched = 1;
    }
    if (matched) continue;
    if (strcmp(name, "key") == 0) {
      have_key = rlk_format(m->recorded_hex, sizeof m->recorded_hex, "%s", value) >= 0;
    } else if (strcmp(name, "binary") == 0) {
      have_binary = rlk_format(m->binary, sizeof m->binary, "%s", value) >= 0;
    } else if (strcmp(name, "binary_size") == 0) {
      char *e = NULL;
      errno = 0;
      unsigned long long v = strtoull(value, &e, 10);
      have_size = value[0] >= '0' && value[0] <= '9' && *e == '\0' && errno == 0;
      m->binary_size = v;
    } else if (strcmp(name, "binary_sha256") == 0) {
      have_sha = rlk_format(m->binary_sha256, sizeof m->binary_sha256, "%s", value) >= 0;
    } else if (strcmp(name, "lowered.count") == 0) {
      char *e = NULL;
      unsigned long v = strtoul(value, &e, 10);
      if (have_count || *e != '\0' || value[0] < '0' || value[0] > '9' ||
          v > META_MAX_LOWERED) {
        rlk_format(why, whysize, "kernel.meta: bad lowered.count");
        goto fail;
      }
      if (v) {
        m->lowered = calloc(v, sizeof *m->lowered);
        if (!m->lowered) {
          rlk_format(why, whysize, "out of memory");
          goto fail;
        }
      }
      m->nlowered = v;
      have_count = 1;
    } else if (strncmp(name, "lowered.", 8) == 0) {
      char *e = NULL;
      unsigned long i = strtoul(name + 8, &e, 10);
      if (!have_count || *e != '\0' || i >= m->nlowered || m->lowered[i]) {
        rlk_format(why, whysize, "kernel.meta: unexpected %s", name);
        goto fail;
      }
      m->lowered[i] = rlk_strdup(value);
      if (!m->lowered[i]) {
        rlk_format(why, whysize, "out of memory");
        goto fail;
      }
    } else if (strcmp(name, "compile_seconds") == 0) {
      m->compile_seconds = strtod(value, NULL);
    } else if (strcmp(name, "created_by.time") == 0) {
      m->created = strtoll(value, NULL, 10);
    } else if (strcmp(name, "end") == 0) {
      ended = 1;
    }
    /* Other names are informative (log head, host, pid) or from a later writer: ignored. */
  }
  if (!ended) {
    rlk_format(why, whysize, "kernel.meta is truncated (no end line)");
    goto fail;
  }
  if (have_fields != (1u << RLK_KEY_NFIELDS) - 1 || !have_key || !have_binary || !have_size ||
      !have_sha || !have_count) {
    rlk_format(why, whysize, "kernel.meta lacks a required field");
    goto fail;
  }
  for (size_t i = 0; i < m->nlowered; i++)
    if (!m->lowered[i]) {
      rlk_format(why, whysize, "kernel.meta lacks lowered.%zu", i);
      goto fail;
    }
  rlk_key_finish(&m->key);
  return 0;
fail:
  rlk_cache_meta_free(m);
  return -1;
}

/* Why a file of an entry could not be read, from read_file_at's errno. */
static const char *read_problem(int e) {
  return e == EINVAL ? "it is not a regular file (a link, FIFO, device or directory)" : strerror(e);
}

int rlk_cache_read_meta(int dfd, rlk_cache_meta *meta, char *why, size_t whysize) {
  char *text = NULL;
  size_t len = 0;
  memset(meta, 0, sizeof *meta);
  if (read_file_at(dfd, RLK_CACHE_META_NAME, (size_t)16 << 20, &text, &len, NULL) != 0) {
    rlk_format(why, whysize, "cannot read %s: %s", RLK_CACHE_META_NAME, read_problem(errno));
    return -1;
  }
  int rc = rlk_cache_meta_parse(text, len, meta, why, whysize);
  free(text);
  return rc;
}

int rlk_cache_valid_binary_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n >= 64 || s[0] == '.') return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '.' || c == '-' || c == '_'))
      return 0;
  }
  return strcmp(s, RLK_CACHE_META_NAME) != 0 && strcmp(s, RLK_CACHE_LAST_USED_NAME) != 0;
}

int rlk_cache_entry_check(int dfd, const char *hash, const rlk_kernel_key *expect, int trusted_only,
                          rlk_cache_meta *meta, void **binary, char *why, size_t whysize) {
  char *text = NULL, *bin = NULL, buf[160];
  const char *bad;
  size_t len = 0, size = 0;
  struct stat st;
  memset(meta, 0, sizeof *meta);
  if (binary) *binary = NULL;
  if (read_file_at(dfd, RLK_CACHE_META_NAME, (size_t)16 << 20, &text, &len, &st) != 0) {
    if (errno == ENOENT)
      rlk_format(why, whysize, "no %s (an uncommitted or damaged entry)", RLK_CACHE_META_NAME);
    else
      rlk_format(why, whysize, "cannot read %s: %s", RLK_CACHE_META_NAME, read_problem(errno));
    return -1;
  }
  if (trusted_only && (bad = rlk_fs_untrusted(&st, buf, sizeof buf)) != NULL) {
    rlk_format(why, whysize, "%s: %s", RLK_CACHE_META_NAME, bad);
    free(text);
    return -1;
  }
  int rc = rlk_cache_meta_parse(text, len, meta, why, whysize);
  free(text);
  if (rc != 0) return -1;

  if (strcmp(meta->key.hex, hash) != 0) {
    rlk_format(why, whysize, "its key fields hash to %.16s..., not to its directory name",
               meta->key.hex);
    goto fail;
  }
  if (strcmp(meta->recorded_hex, hash) != 0) {
    rlk_format(why, whysize, "its recorded key is not its directory name");
    goto fail;
  }
  if (expect) {
    char a[1100], b[1100];
    for (int i = 0; i < RLK_KEY_NFIELDS; i++) {
      rlk_key_field(&meta->key, i, a, sizeof a);
      rlk_key_field(expect, i, b, sizeof b);
      if (strcmp(a, b) != 0) {
        rlk_format(why, whysize, "field %s is '%.60s', expected '%.60s'",
                   rlk_key_field_names[i], a, b);
        goto fail;
      }
    }
  }
  if (!rlk_cache_valid_binary_name(meta->binary)) {
    rlk_format(why, whysize, "bad binary name '%.64s'", meta->binary);
    goto fail;
  }
  if (meta->binary_size > RLK_CACHE_BINARY_MAX) {
    rlk_format(why, whysize, "recorded binary size %llu is implausible",
               (unsigned long long)meta->binary_size);
    goto fail;
  }
  if (read_file_at(dfd, meta->binary, RLK_CACHE_BINARY_MAX, &bin, &size, &st) != 0) {
    rlk_format(why, whysize, "cannot read %s: %s", meta->binary, read_problem(errno));
    goto fail;
  }
  if (trusted_only && (bad = rlk_fs_untrusted(&st, buf, sizeof buf)) != NULL) {
    rlk_format(why, whysize, "%s: %s", meta->binary, bad);
    goto fail;
  }
  if ((uint64_t)size != meta->binary_size) {
    rlk_format(why, whysize, "%s has %zu bytes, %llu recorded (truncated or replaced)",
               meta->binary, size, (unsigned long long)meta->binary_size);
    goto fail;
  }
  uint8_t digest[32];
  char hex[65];
  rlk_sha256_digest(bin, size, digest);
  rlk_sha256_hex(digest, hex);
  if (strcmp(hex, meta->binary_sha256) != 0) {
    rlk_format(why, whysize, "%s fails its SHA-256 check", meta->binary);
    goto fail;
  }
  if (binary)
    *binary = bin;
  else
    free(bin);
  return 0;
fail:
  free(bin);
  rlk_cache_meta_free(meta);
  return -1;
}

static void build_meta(strbuf *b, const rlk_kernel_key *k, const char *binary_name,
                       const void *binary, size_t size, char *const *names, size_t nnames,
                       const rlk_cache_publish_info *info) {
  char text[1100];
  uint8_t digest[32];
  char hex[65], host[256] = "";
  sb_puts(b, "format=" RLK_CACHE_META_FORMAT "\n");
  for (int i = 0; i < RLK_KEY_NFIELDS; i++) {
    rlk_key_field(k, i, text, sizeof text);
    sb_field(b, rlk_key_field_names[i], text);
  }
  sb_field(b, "key", k->hex);
  sb_field(b, "binary", binary_name);
  sb_fmt(b, "binary_size", "%zu", size);
  rlk_sha256_digest(binary, size, digest);
  rlk_sha256_hex(digest, hex);
  sb_field(b, "binary_sha256", hex);
  sb_fmt(b, "lowered.count", "%zu", nnames);
  for (size_t i = 0; i < nnames; i++) {
    char name[32];
    snprintf(name, sizeof name, "lowered.%zu", i);
    sb_field(b, name, names[i] ? names[i] : "");
  }
  sb_fmt(b, "compile_seconds", "%.6f", info ? info->compile_seconds : 0.0);
  if (info && info->log && info->log[0]) {
    size_t n = strlen(info->log);
    sb_fmt(b, "log_bytes", "%zu", n);
    sb_puts(b, "log_head=");
    sb_escaped(b, info->log, n < RLK_CACHE_LOG_HEAD ? n : RLK_CACHE_LOG_HEAD);
    sb_puts(b, "\n");
  }
  if (gethostname(host, sizeof host) != 0) host[0] = '\0';
  host[sizeof host - 1] = '\0';
  sb_field(b, "created_by.host", host);
  sb_fmt(b, "created_by.pid", "%ld", (long)getpid());
  sb_fmt(b, "created_by.time", "%lld", (long long)rlk_unix_time());
  sb_puts(b, "end=1\n");
}

char *rlk_cache_meta_text(const rlk_kernel_key *key, const char *binary_name, const void *binary, size_t size,
                          char *const *names, size_t nnames, const rlk_cache_publish_info *info, size_t *len) {
  strbuf b = {0};
  build_meta(&b, key, binary_name, binary, size, names, nnames, info);
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  *len = b.len;
  return b.p;
}

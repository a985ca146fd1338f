/* key.c - the canonical serialization and hash of a kernel cache key.
 *
 * Each field is written as "<name>\0<decimal length>\0<bytes>" in the fixed order of
 * rlk_key_field_names. The name and the length prefix make the encoding injective: no
 * two different keys serialize to the same bytes, whatever the fields contain. */
#include "jit/key.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "jit/sha256.h"

const char *const rlk_key_field_names[RLK_KEY_NFIELDS] = {
    "schema", "family",  "entry",    "template_digest", "params", "names",
    "target", "compiler", "options", "codegen",         "env"};

enum { F_SCHEMA, F_FAMILY, F_ENTRY, F_DIGEST, F_PARAMS, F_NAMES, F_TARGET, F_COMPILER, F_OPTIONS,
       F_CODEGEN, F_ENV };

/* The string storage of a text field (NULL for the integer fields). */
static char *text_field(rlk_kernel_key *key, int i, size_t *cap) {
  switch (i) {
#define T(id, member)                                                                         \
  case id:                                                                                    \
    *cap = sizeof key->member;                                                                \
    return key->member;
    T(F_FAMILY, family)
    T(F_ENTRY, entry)
    T(F_DIGEST, template_digest)
    T(F_PARAMS, params)
    T(F_NAMES, names)
    T(F_TARGET, target)
    T(F_COMPILER, compiler)
    T(F_OPTIONS, options)
    T(F_ENV, env)
#undef T
  default:
    *cap = 0;
    return NULL;
  }
}

void rlk_key_field(const rlk_kernel_key *key, int i, char *buf, size_t size) {
  if (!buf || size == 0) return;
  buf[0] = '\0';
  if (!key || i < 0 || i >= RLK_KEY_NFIELDS) return;
  if (i == F_SCHEMA || i == F_CODEGEN) {
    snprintf(buf, size, "%d", i == F_SCHEMA ? key->schema : key->codegen);
    return;
  }
  size_t cap;
  const char *s = text_field((rlk_kernel_key *)key, i, &cap);
  snprintf(buf, size, "%.*s", (int)strnlen(s, cap), s);
}

rlk_status rlk_key_set_field(rlk_kernel_key *key, int i, const char *text) {
  if (!key || !text) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "key field: NULL argument");
  if (i < 0 || i >= RLK_KEY_NFIELDS)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "key field: index %d out of range", i);
  if (i == F_SCHEMA || i == F_CODEGEN) {
    /* Strict decimal: the text came from rlk_key_field, anything else is corruption. */
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (text[0] == '\0' || text[0] == ' ' || text[0] == '+' || *end != '\0' || errno != 0 ||
        v < -2147483647L || v > 2147483647L)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "key field %s: '%.40s' is not an integer",
                       rlk_key_field_names[i], text);
    if (i == F_SCHEMA)
      key->schema = (int)v;
    else
      key->codegen = (int)v;
    return RLK_OK;
  }
  size_t cap;
  char *dst = text_field(key, i, &cap);
  size_t n = strlen(text);
  if (n >= cap)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "key field %s: %zu bytes, at most %zu fit",
                     rlk_key_field_names[i], n, cap - 1);
  memcpy(dst, text, n + 1);
  return RLK_OK;
}

/* Where serialized bytes go: a bounded buffer (counting everything), a hash, or both. */
typedef struct sink {
  char *buf;
  size_t size;
  size_t len;
  rlk_sha256 *hash;
} sink;

static void sink_put(sink *s, const void *data, size_t n) {
  if (s->buf && s->len < s->size) {
    size_t room = s->size - s->len;
    memcpy(s->buf + s->len, data, n < room ? n : room);
  }
  if (s->hash) rlk_sha256_update(s->hash, data, n);
  s->len += n;
}

static void serialize(const rlk_kernel_key *key, sink *s) {
  char text[1100]; /* the longest field (options) plus slack */
  char len[32];
  for (int i = 0; i < RLK_KEY_NFIELDS; i++) {
    rlk_key_field(key, i, text, sizeof text);
    size_t n = strlen(text);
    int m = snprintf(len, sizeof len, "%zu", n);
    sink_put(s, rlk_key_field_names[i], strlen(rlk_key_field_names[i]) + 1);
    sink_put(s, len, (size_t)m + 1);
    sink_put(s, text, n);
  }
}

size_t rlk_key_serialize(const rlk_kernel_key *key, char *buf, size_t size) {
  sink s = {buf, buf ? size : 0, 0, NULL};
  serialize(key, &s);
  return s.len;
}

void rlk_key_finish(rlk_kernel_key *key) {
  rlk_sha256 h;
  rlk_sha256_init(&h);
  sink s = {NULL, 0, 0, &h};
  serialize(key, &s);
  rlk_sha256_final(&h, key->hash);
  rlk_sha256_hex(key->hash, key->hex);
}

/* Environment variables whose values change generated code. None do today; a variable
 * added here must also be marked key-affecting in the README's table. */
static const char *const key_env_names[] = {NULL};

void rlk_key_env(char *buf, size_t size) {
  if (!buf || size == 0) return;
  buf[0] = '\0';
  size_t len = 0;
  for (size_t i = 0; key_env_names[i]; i++) {
    const char *v = rlk_env(key_env_names[i]);
    if (!v) continue;
    int n = snprintf(buf + len, size - len, "%s=%s;", key_env_names[i], v);
    if (n < 0 || (size_t)n >= size - len) {
      /* Never hand back a silently cut value as if it were whole. */
      rlk_warn("key environment: %s does not fit the key; ignoring it", key_env_names[i]);
      buf[len] = '\0';
      continue;
    }
    len += (size_t)n;
  }
}

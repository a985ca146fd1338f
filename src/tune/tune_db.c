/* tune_db.c - tuning records as text: the line format of tune_db.h, parsing that skips what it
 * cannot read instead of failing, and the checks a record passes before it is written. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "tune/tune_db.h"

/* ---- lists and keys ---------------------------------------------------------------- */

int rlk_tune_list_push(rlk_tune_list *list, const rlk_tune_record *r) {
  if (list->n == list->cap) {
    size_t cap = list->cap ? list->cap * 2 : 16;
    rlk_tune_record *v = realloc(list->v, cap * sizeof *v);
    if (!v) return -1;
    list->v = v;
    list->cap = cap;
  }
  list->v[list->n++] = *r;
  return 0;
}

void rlk_tune_list_free(rlk_tune_list *list) {
  free(list->v);
  memset(list, 0, sizeof *list);
}

int rlk_tune_same_key(const rlk_tune_record *a, const rlk_tune_record *b) {
  return a->tokens == b->tokens && a->multiprocessors == b->multiprocessors && !strcmp(a->op, b->op) &&
         !strcmp(a->shape, b->shape) && !strcmp(a->target, b->target) &&
         !strcmp(a->device, b->device) && !strcmp(a->runtime, b->runtime) &&
         !strcmp(a->compiler, b->compiler);
}

void rlk_tune_copy_key(rlk_tune_record *dst, const rlk_tune_record *src) {
  rlk_tune_record_init(dst);
  memcpy(dst->op, src->op, sizeof dst->op);
  memcpy(dst->shape, src->shape, sizeof dst->shape);
  dst->tokens = src->tokens;
  memcpy(dst->target, src->target, sizeof dst->target);
  memcpy(dst->device, src->device, sizeof dst->device);
  dst->multiprocessors = src->multiprocessors;
  memcpy(dst->runtime, src->runtime, sizeof dst->runtime);
  memcpy(dst->compiler, src->compiler, sizeof dst->compiler);
}

int64_t rlk_tune_bucket(int64_t n) {
  if (n <= 1) return 1;
  int64_t p = 1;
  while (p <= n / 2) p <<= 1; /* the largest power of two <= n */
  /* nearest on a log scale: up from p * sqrt(2) */
  return (double)n >= (double)p * 1.4142135623730951 ? p * 2 : p;
}

/* ---- public record helpers --------------------------------------------------------- */

void rlk_tune_record_init(rlk_tune_record *record) {
  if (record) memset(record, 0, sizeof *record);
}

/* Copies a string into a field, tabs and line breaks turned into spaces (the line format's
 * separators), truncating to the field. */
static void copy_field(char *dst, size_t size, const char *src) {
  size_t i = 0;
  for (; src[i] && i + 1 < size; i++) dst[i] = (src[i] == '\t' || src[i] == '\n' || src[i] == '\r') ? ' ' : src[i];
  dst[i] = '\0';
}

rlk_status rlk_tune_record_set_env(rlk_tune_record *record, const rlk_device_info *info) {
  if (!record) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_tune_record_set_env: record is NULL");
  if (!info) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_tune_record_set_env: info is NULL");
  if (!info->target[0] || !info->name[0] || !info->compiler[0])
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "rlk_tune_record_set_env: info has an empty target, name or compiler");
  copy_field(record->target, sizeof record->target, info->target);
  copy_field(record->device, sizeof record->device, info->name);
  copy_field(record->compiler, sizeof record->compiler, info->compiler);
  copy_field(record->runtime, sizeof record->runtime, rlk_version_string());
  record->multiprocessors = info->multiprocessors;
  return RLK_OK;
}

/* ---- checks ------------------------------------------------------------------------- */

/* 0 when s is a NUL-terminated string of at most size - 1 bytes with no tab or line break. */
static int bad_text(const char *s, size_t size, int may_be_empty) {
  const char *end = memchr(s, '\0', size);
  if (!end) return 1;
  if (end == s && !may_be_empty) return 1;
  return strpbrk(s, "\t\r\n") != NULL;
}

/* A time the file can hold: finite, >= 0, and 0 or at least 1e-300 ms (printed with %.6g, a
 * subnormal one would read back out of range). */
static int bad_ms(double ms) { return !isfinite(ms) || ms < 0 || (ms > 0 && ms < 1e-300); }

rlk_status rlk_tune_check_record(const rlk_tune_record *r, rlk_tune_file_kind kind, const char *what) {
  const struct {
    const char *name;
    const char *s;
    size_t size;
  } keys[] = {{"op", r->op, sizeof r->op},
              {"shape", r->shape, sizeof r->shape},
              {"target", r->target, sizeof r->target},
              {"device", r->device, sizeof r->device},
              {"runtime", r->runtime, sizeof r->runtime},
              {"compiler", r->compiler, sizeof r->compiler}};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (bad_text(keys[i].s, keys[i].size, 0))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %s is empty, unterminated or holds a tab or newline",
                       what, keys[i].name);
  if (r->tokens < 1)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: tokens %lld is not positive", what, (long long)r->tokens);
  /* the limits the reader holds a line to (parse_line): a record outside them would be written
   * and then skipped as unreadable */
  if (r->multiprocessors < 0 || r->multiprocessors > (1 << 20))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: multiprocessors %d is outside [0, 2^20]", what,
                     r->multiprocessors);
  if (kind == RLK_TUNE_FILE_PENDING) return RLK_OK;
  if (r->created < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: created %lld is negative", what, (long long)r->created);
  if (bad_text(r->winner, sizeof r->winner, 1))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: winner is unterminated or holds a tab or newline", what);
  if (bad_ms(r->default_ms) || bad_ms(r->best_ms))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "%s: default_ms %g / best_ms %g must be finite, 0 or at least 1e-300", what,
                     r->default_ms, r->best_ms);
  if (r->ntimings < 0 || r->ntimings > RLK_TUNE_MAX_TIMINGS)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: ntimings %d is outside [0, %d]", what, r->ntimings,
                     RLK_TUNE_MAX_TIMINGS);
  for (int i = 0; i < r->ntimings; i++) {
    const rlk_tune_timing *t = &r->timings[i];
    if (bad_text(t->settings, sizeof t->settings, 0))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "%s: timings[%d].settings is empty, unterminated or holds a tab or newline", what, i);
    if ((int)t->result < RLK_TUNE_TIMED || (int)t->result > RLK_TUNE_FAILED)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: timings[%d].result %d is not an rlk_tune_result", what, i,
                       (int)t->result);
    if (bad_ms(t->median_ms))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "%s: timings[%d].median_ms %g must be finite, 0 or at least 1e-300", what, i,
                       t->median_ms);
  }
  return RLK_OK;
}

/* ---- parsing ------------------------------------------------------------------------ */

/* A text field; a line break inside one (a carriage return that is not the line's last byte)
 * makes the line damaged: kept, it would move to a line's end on rewriting and be stripped there. */
static int set_text(char *dst, size_t size, const char *v) {
  size_t n = strlen(v);
  if (n >= size || strpbrk(v, "\r\n")) return -1;
  memcpy(dst, v, n + 1);
  return 0;
}

static int parse_i64(const char *v, int64_t lo, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end || x < lo) return -1;
  *out = x;
  return 0;
}

static int parse_ms(const char *v, double *out) {
  char *end = NULL;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end || bad_ms(x)) return -1;
  *out = x;
  return 0;
}

/* "cand" values: "<median ms>|rejected|failed <settings>". */
static int parse_timing(const char *v, rlk_tune_timing *t) {
  const char *sp = strchr(v, ' ');
  if (!sp || !sp[1]) return -1;
  char word[32];
  if ((size_t)(sp - v) >= sizeof word) return -1;
  memcpy(word, v, (size_t)(sp - v));
  word[sp - v] = '\0';
  memset(t, 0, sizeof *t);
  if (!strcmp(word, "rejected"))
    t->result = RLK_TUNE_REJECTED;
  else if (!strcmp(word, "failed"))
    t->result = RLK_TUNE_FAILED;
  else if (parse_ms(word, &t->median_ms))
    return -1;
  return set_text(t->settings, sizeof t->settings, sp + 1);
}

/* Parses one record line (modified in place). 0 or -1. */
static int parse_line(char *line, rlk_tune_file_kind kind, rlk_tune_record *r) {
  rlk_tune_record_init(r);
  enum { F_OP = 1, F_SHAPE = 2, F_TOKENS = 4, F_TARGET = 8, F_DEVICE = 16, F_SMS = 32, F_RUNTIME = 64,
         F_COMPILER = 128, F_WINNER = 256, F_DEFAULT = 512, F_BEST = 1024, F_CREATED = 2048 };
  const unsigned key_fields = 255, db_fields = key_fields | F_WINNER | F_DEFAULT | F_BEST;
  const struct {
    const char *name;
    char *dst;
    size_t size;
    unsigned bit;
  } texts[] = {{"op", r->op, sizeof r->op, F_OP},
               {"shape", r->shape, sizeof r->shape, F_SHAPE},
               {"target", r->target, sizeof r->target, F_TARGET},
               {"device", r->device, sizeof r->device, F_DEVICE},
               {"runtime", r->runtime, sizeof r->runtime, F_RUNTIME},
               {"compiler", r->compiler, sizeof r->compiler, F_COMPILER},
               {"winner", r->winner, sizeof r->winner, F_WINNER}};
  unsigned seen = 0;
  char *save = NULL;
  for (char *f = strtok_r(line, "\t", &save); f; f = strtok_r(NULL, "\t", &save)) {
    char *eq = strchr(f, '=');
    if (!eq) return -1;
    *eq = '\0';
    const char *v = eq + 1;
    int rc = 0, known = 0;
    unsigned bit = 0; /* the field's (none for cand, which repeats): one given twice damages its line */
    for (size_t i = 0; i < sizeof texts / sizeof texts[0] && !known; i++)
      if (!strcmp(f, texts[i].name)) {
        known = 1;
        rc = set_text(texts[i].dst, texts[i].size, v);
        bit = texts[i].bit;
      }
    int64_t x = 0;
    if (known) {
    } else if (!strcmp(f, "tokens")) {
      rc = parse_i64(v, 1, &r->tokens);
      bit = F_TOKENS;
    } else if (!strcmp(f, "sms")) {
      rc = parse_i64(v, 0, &x) || x > (1 << 20);
      r->multiprocessors = (int)x;
      bit = F_SMS;
    } else if (!strcmp(f, "default_ms")) {
      rc = parse_ms(v, &r->default_ms);
      bit = F_DEFAULT;
    } else if (!strcmp(f, "best_ms")) {
      rc = parse_ms(v, &r->best_ms);
      bit = F_BEST;
    } else if (!strcmp(f, "created")) {
      rc = parse_i64(v, 0, &r->created);
      bit = F_CREATED;
    } else if (!strcmp(f, "cand")) {
      rc = r->ntimings >= RLK_TUNE_MAX_TIMINGS || parse_timing(v, &r->timings[r->ntimings]);
      if (!rc) r->ntimings++;
    } /* other names: a later writer's fields, ignored */
    if (rc || (seen & bit)) return -1;
    seen |= bit;
  }
  const unsigned need = kind == RLK_TUNE_FILE_PENDING ? key_fields : db_fields;
  if ((seen & need) != need) return -1;
  if (!r->op[0] || !r->shape[0] || !r->target[0] || !r->device[0] || !r->runtime[0] || !r->compiler[0]) return -1;
  if (kind == RLK_TUNE_FILE_PENDING) { /* key fields only */
    rlk_tune_record key;
    rlk_tune_copy_key(&key, r);
    *r = key;
  }
  return 0;
}

static const char *version_line(rlk_tune_file_kind kind) {
  return kind == RLK_TUNE_FILE_PENDING ? RLK_TUNE_PENDING_VERSION_LINE : RLK_TUNE_DB_VERSION_LINE;
}

int rlk_tune_parse(char *text, size_t len, rlk_tune_file_kind kind, rlk_tune_list *out, size_t *bad,
                   char *why, size_t whysize) {
  *bad = 0;
  const char *want = version_line(kind);
  const size_t wl = strlen(want);
  /* the version line ends in LF, CRLF or the end of the text; a carriage return alone ends no
   * line (the rest of the file would pass for the version line: no record, no damage) */
  const int versioned = len >= wl && memcmp(text, want, wl) == 0 &&
                        (len == wl || text[wl] == '\n' ||
                         (text[wl] == '\r' && (len == wl + 1 || text[wl + 1] == '\n')));
  const int binary = memchr(text, '\0', len) != NULL;
  if (!versioned || binary) {
    size_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    lines += len && text[len - 1] != '\n';
    *bad = lines ? lines : 1; /* an empty file is damaged too: a writer always puts the version line */
    if (versioned)
      rlk_format(why, whysize, "it holds NUL bytes, so it is not text");
    else if (len > wl && memcmp(text, want, wl) == 0 && text[wl] == '\r')
      rlk_format(why, whysize, "its lines end in a carriage return alone, not LF or CRLF");
    else
      rlk_format(why, whysize, "it does not start with \"%s\"%s", want,
                 len > wl && !strncmp(text, "# rlk-tune", 10) ? " (another format or version)" : "");
    return -1;
  }
  size_t pos = 0;
  int first = 1;
  while (pos < len) {
    char *line = text + pos;
    char *nl = memchr(line, '\n', len - pos);
    const int truncated = nl == NULL;
    size_t n = truncated ? len - pos : (size_t)(nl - line);
    pos += n + !truncated;
    line[n] = '\0';
    if (n && line[n - 1] == '\r') line[--n] = '\0';
    if (first) { /* the version line */
      first = 0;
      continue;
    }
    if (n == 0 || line[0] == '#') continue;
    rlk_tune_record r;
    if (truncated || parse_line(line, kind, &r) != 0) {
      (*bad)++;
      continue;
    }
    if (rlk_tune_list_push(out, &r) != 0) {
      rlk_format(why, whysize, "out of memory");
      return -1;
    }
  }
  if (*bad) rlk_format(why, whysize, "%zu line%s could not be read and %s skipped", *bad, *bad == 1 ? "" : "s",
                       *bad == 1 ? "was" : "were");
  return 0;
}

/* ---- formatting --------------------------------------------------------------------- */

int rlk_tune_format(FILE *out, const rlk_tune_record *r, rlk_tune_file_kind kind) {
  int rc = fprintf(out, "op=%s\tshape=%s\ttokens=%lld\ttarget=%s\tdevice=%s\tsms=%d\truntime=%s\tcompiler=%s",
                   r->op, r->shape, (long long)r->tokens, r->target, r->device, r->multiprocessors, r->runtime,
                   r->compiler) < 0;
  if (kind == RLK_TUNE_FILE_DB) {
    rc |= fprintf(out, "\twinner=%s\tdefault_ms=%.6g\tbest_ms=%.6g\tcreated=%lld", r->winner, r->default_ms,
                  r->best_ms, (long long)r->created) < 0;
    for (int i = 0; i < r->ntimings; i++) {
      const rlk_tune_timing *t = &r->timings[i];
      if (t->result == RLK_TUNE_TIMED)
        rc |= fprintf(out, "\tcand=%.6g %s", t->median_ms, t->settings) < 0;
      else
        rc |= fprintf(out, "\tcand=%s %s", t->result == RLK_TUNE_REJECTED ? "rejected" : "failed", t->settings) < 0;
    }
  }
  rc |= fputc('\n', out) == EOF;
  return rc ? -1 : 0;
}

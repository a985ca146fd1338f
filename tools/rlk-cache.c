/*
 * rlk-cache - inspect and maintain an rlk kernel cache tree.
 *
 *   rlk-cache [--root DIR] list [--keys]
 *   rlk-cache [--root DIR] sizes
 *   rlk-cache [--root DIR] verify [--repair]
 *   rlk-cache [--root DIR] prune [--max-size SIZE] [--max-age AGE]
 *   rlk-cache [--root DIR] clear --yes
 *
 * --json writes one JSON document to standard output instead of the tables and lines.
 *
 * Built only on the public API (include/rlk.h). Exit status: 0 success, 1 a library
 * failure (or bad entries left by verify), 2 a usage error.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "rlk.h"

static const char *prog = "rlk-cache";

#include "tool_util.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: %s [--root DIR] COMMAND [OPTIONS]\n"
          "\n"
          "Inspects and maintains an rlk kernel cache tree.\n"
          "\n"
          "commands:\n"
          "  list [--keys]        one line per entry: key prefix, family, target, compiler,\n"
          "                       size, last use, parameters (--keys: full keys only)\n"
          "  sizes                totals by family, by target, and the grand total\n"
          "  verify [--repair]    checks every entry (metadata, key fields, binary checksum);\n"
          "                       --repair quarantines bad entries. Exit 1 if bad entries remain\n"
          "  prune [--max-size SIZE] [--max-age AGE]\n"
          "                       removes entries, least recently used first, until the tree\n"
          "                       holds at most SIZE bytes (suffix K, M, G, T: powers of 1024),\n"
          "                       and every entry unused for AGE (days; suffix s, m, h, d)\n"
          "  clear --yes          removes every entry and the staging area\n"
          "\n"
          "options:\n"
          "  --root DIR           the cache tree (default: RLK_CACHE_DIR, $XDG_CACHE_HOME/rlk,\n"
          "                       ~/.cache/rlk)\n"
          "  --json               one JSON document on standard output instead of the text\n"
          "  -h, --help           this help\n"
          "\n"
          "exit status: 0 success, 1 failure, 2 usage error\n",
          prog);
}

/* "12.3 MiB" */
static void human_bytes(uint64_t bytes, char *buf, size_t size) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  if (u == 0)
    snprintf(buf, size, "%" PRIu64 " B", bytes);
  else
    snprintf(buf, size, "%.1f %s", v, units[u]);
}

/* The non-negative number a SIZE or an AGE starts with into *v: where its unit begins, or NULL. */
static const char *parse_amount(const char *s, double *v) {
  char *end = NULL;
  errno = 0;
  /* decimal digits only: strtod also takes nan, inf and hexadecimal */
  if (!isdigit((unsigned char)s[0]) && !(s[0] == '.' && isdigit((unsigned char)s[1]))) return NULL;
  if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) return NULL;
  *v = strtod(s, &end);
  if (errno || end == s || !isfinite(*v) || *v < 0) return NULL;
  return end;
}

/* SIZE: a byte count with an optional K/M/G/T suffix (powers of 1024; "KB", "KiB" accepted). */
static int parse_size(const char *s, uint64_t *out) {
  double v, mult = 1;
  const char *end = parse_amount(s, &v);
  if (!end) return -1;
  switch (*end) {
    case 'k': case 'K': mult = 1024.0; end++; break;
    case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
  }
  if (mult > 1 && (*end == 'i' || *end == 'I')) end++;
  if (*end == 'b' || *end == 'B') end++;
  if (*end != '\0') return -1;
  double bytes = v * mult;
  if (bytes > 1.8e19) return -1;
  *out = (uint64_t)bytes;
  return 0;
}

/* AGE: days by default; suffix s, m, h or d. */
static int parse_age(const char *s, int64_t *out) {
  double v, mult = 86400.0;
  const char *end = parse_amount(s, &v);
  if (!end) return -1;
  if (*end) {
    switch (*end) {
      case 's': mult = 1; break;
      case 'm': mult = 60; break;
      case 'h': mult = 3600; break;
      case 'd': mult = 86400; break;
      default: return -1;
    }
    end++;
    if (*end) return -1;
  }
  double secs = v * mult;
  if (secs > 9.0e18) return -1;
  *out = (int64_t)secs;
  if (*out == 0 && v > 0) *out = 1;
  return 0;
}

/* ---- collecting entries ------------------------------------------------------------ */

typedef struct entry {
  char *key, *family, *target, *compiler, *params, *path;
  uint64_t bytes;
  int64_t created, last_used;
} entry;

typedef struct entry_list {
  entry *v;
  size_t n, cap;
  int oom;
} entry_list;

static char *dup_or_empty(const char *s) {
  return strdup(s ? s : "");
}

static int collect(const rlk_cache_entry *e, void *user) {
  entry_list *l = user;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    entry *v = realloc(l->v, cap * sizeof *v);
    if (!v) {
      l->oom = 1;
      return 1;
    }
    l->v = v;
    l->cap = cap;
  }
  entry *d = &l->v[l->n];
  d->key = dup_or_empty(e->key);
  d->family = dup_or_empty(e->family);
  d->target = dup_or_empty(e->target);
  d->compiler = dup_or_empty(e->compiler);
  d->params = dup_or_empty(e->params);
  d->path = dup_or_empty(e->path);
  if (!d->key || !d->family || !d->target || !d->compiler || !d->params || !d->path) {
    free(d->key), free(d->family), free(d->target), free(d->compiler), free(d->params), free(d->path);
    l->oom = 1;
    return 1;
  }
  d->bytes = e->bytes;
  d->created = e->created;
  d->last_used = e->last_used;
  l->n++;
  return 0;
}

static void entries_free(entry_list *l) {
  for (size_t i = 0; i < l->n; i++) {
    entry *d = &l->v[i];
    free(d->key), free(d->family), free(d->target), free(d->compiler), free(d->params), free(d->path);
  }
  free(l->v);
  memset(l, 0, sizeof *l);
}

static int by_family_target_key(const void *a, const void *b) {
  const entry *x = a, *y = b;
  int c = strcmp(x->family, y->family);
  if (!c) c = strcmp(x->target, y->target);
  if (!c) c = strcmp(x->key, y->key);
  return c;
}

static int load_entries(const char *root, entry_list *l) {
  rlk_status st = rlk_cache_walk(root, collect, l);
  if (st != RLK_OK) {
    entries_free(l);
    return lib_error("walking the cache", st);
  }
  if (l->oom) {
    entries_free(l);
    fprintf(stderr, "%s: out of memory while listing the cache\n", prog);
    return 1;
  }
  if (l->n > 1) qsort(l->v, l->n, sizeof *l->v, by_family_target_key);
  return 0;
}

static void format_time(int64_t t, char *buf, size_t size) {
  if (t <= 0) {
    snprintf(buf, size, "-");
    return;
  }
  time_t tt = (time_t)t;
  struct tm tm;
  if (!localtime_r(&tt, &tm) || strftime(buf, size, "%Y-%m-%d %H:%M", &tm) == 0)
    snprintf(buf, size, "%" PRId64, t);
}

/* ---- commands ---------------------------------------------------------------------- */

static int cmd_list(const char *root, int keys_only, int json) {
  entry_list l = {0};
  int rc = load_entries(root, &l);
  if (rc) return rc;
  if (json) {
    uint64_t bytes = 0;
    printf("{\"root\": ");
    json_string(stdout, root);
    printf(", \"entries\": [");
    for (size_t i = 0; i < l.n; i++) {
      const entry *e = &l.v[i];
      printf("%s\n  {\"key\": ", i ? "," : "");
      json_string(stdout, e->key);
      if (!keys_only) {
        const char *names[] = {"family", "target", "compiler", "params", "path"};
        const char *values[] = {e->family, e->target, e->compiler, e->params, e->path};
        for (int k = 0; k < 5; k++) {
          printf(", \"%s\": ", names[k]);
          json_string(stdout, values[k]);
        }
        printf(", \"bytes\": %" PRIu64 ", \"created\": %" PRId64 ", \"last_used\": %" PRId64,
               e->bytes, e->created, e->last_used);
      }
      printf("}");
      bytes += e->bytes;
    }
    printf("%s], \"count\": %zu, \"bytes\": %" PRIu64 "}\n", l.n ? "\n" : "", l.n, bytes);
    entries_free(&l);
    return 0;
  }
  if (keys_only) {
    for (size_t i = 0; i < l.n; i++) printf("%s\n", l.v[i].key);
    entries_free(&l);
    return 0;
  }
  size_t wf = 6, wt = 6, wc = 8;
  uint64_t total = 0;
  for (size_t i = 0; i < l.n; i++) {
    size_t a = strlen(l.v[i].family), b = strlen(l.v[i].target), c = strlen(l.v[i].compiler);
    if (a > wf) wf = a;
    if (b > wt) wt = b;
    if (c > wc) wc = c;
  }
  printf("%-12s  %-*s  %-*s  %-*s  %10s  %-16s  %s\n", "KEY", (int)wf, "FAMILY", (int)wt, "TARGET",
         (int)wc, "COMPILER", "SIZE", "LAST USED", "PARAMS");
  for (size_t i = 0; i < l.n; i++) {
    const entry *e = &l.v[i];
    char size[32], used[32];
    human_bytes(e->bytes, size, sizeof size);
    format_time(e->last_used, used, sizeof used);
    printf("%-12.12s  %-*s  %-*s  %-*s  %10s  %-16s  %s\n", e->key, (int)wf, e->family, (int)wt,
           e->target, (int)wc, e->compiler, size, used, e->params);
    total += e->bytes;
  }
  char tot[32];
  human_bytes(total, tot, sizeof tot);
  printf("%zu entr%s, %s\n", l.n, l.n == 1 ? "y" : "ies", tot);
  entries_free(&l);
  return 0;
}

typedef struct total {
  const char *name;
  uint64_t entries, bytes;
} total;

static int add_total(total **v, size_t *n, const char *name, uint64_t bytes) {
  for (size_t i = 0; i < *n; i++) {
    if (strcmp((*v)[i].name, name) == 0) {
      (*v)[i].entries++;
      (*v)[i].bytes += bytes;
      return 0;
    }
  }
  total *nv = realloc(*v, (*n + 1) * sizeof *nv);
  if (!nv) return -1;
  *v = nv;
  nv[*n] = (total){name, 1, bytes};
  (*n)++;
  return 0;
}

static int by_bytes_desc(const void *a, const void *b) {
  const total *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
  return strcmp(x->name, y->name);
}

static void print_totals(const char *title, total *v, size_t n, int json) {
  if (n > 1) qsort(v, n, sizeof *v, by_bytes_desc);
  if (json) {
    printf(", \"by_%s\": {", title);
    for (size_t i = 0; i < n; i++) {
      printf("%s", i ? ", " : "");
      json_string(stdout, v[i].name);
      printf(": {\"entries\": %" PRIu64 ", \"bytes\": %" PRIu64 "}", v[i].entries, v[i].bytes);
    }
    printf("}");
    return;
  }
  printf("by %s:\n", title);
  for (size_t i = 0; i < n; i++) {
    char h[32];
    human_bytes(v[i].bytes, h, sizeof h);
    printf("  %-24s %8" PRIu64 " entries  %12" PRIu64 " bytes  (%s)\n", v[i].name, v[i].entries,
           v[i].bytes, h);
  }
}

static int cmd_sizes(const char *root, int json) {
  entry_list l = {0};
  int rc = load_entries(root, &l);
  if (rc) return rc;
  total *fam = NULL, *tgt = NULL;
  size_t nfam = 0, ntgt = 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i < l.n; i++) {
    if (add_total(&fam, &nfam, l.v[i].family, l.v[i].bytes) ||
        add_total(&tgt, &ntgt, l.v[i].target, l.v[i].bytes)) {
      fprintf(stderr, "%s: out of memory\n", prog);
      rc = 1;
      goto done;
    }
    bytes += l.v[i].bytes;
  }
  if (json) {
    printf("{\"root\": ");
    json_string(stdout, root);
  } else {
    printf("cache: %s\n", root);
  }
  print_totals("family", fam, nfam, json);
  print_totals("target", tgt, ntgt, json);
  char h[32];
  human_bytes(bytes, h, sizeof h);
  if (json)
    printf(", \"entries\": %zu, \"bytes\": %" PRIu64 "}\n", l.n, bytes);
  else
    printf("total: %zu entries, %" PRIu64 " bytes (%s)\n", l.n, bytes, h);
done:
  free(fam);
  free(tgt);
  entries_free(&l);
  return rc;
}

static int cmd_verify(const char *root, int repair, int json) {
  uint64_t entries = 0, bad = 0;
  rlk_status st = rlk_cache_verify(root, repair, &entries, &bad);
  if (st != RLK_OK) return lib_error("verifying the cache", st);
  uint64_t left = bad;
  if (repair && bad) {
    uint64_t entries2 = 0;
    st = rlk_cache_verify(root, 0, &entries2, &left);
    if (st != RLK_OK) return lib_error("re-verifying the cache", st);
  }
  uint64_t quarantined = repair ? bad - (left < bad ? left : bad) : 0;
  if (json) {
    printf("{\"root\": ");
    json_string(stdout, root);
    printf(", \"entries\": %" PRIu64 ", \"bad\": %" PRIu64 ", \"quarantined\": %" PRIu64
           ", \"bad_left\": %" PRIu64 "}\n", entries, bad, quarantined, left);
  } else if (repair && bad) {
    printf("verify: %" PRIu64 " entries, %" PRIu64 " bad, %" PRIu64 " quarantined, %" PRIu64
           " bad left\n",
           entries, bad, quarantined, left);
  } else {
    printf("verify: %" PRIu64 " entries, %" PRIu64 " bad\n", entries, bad);
  }
  if (left) {
    fprintf(stderr, "%s: %" PRIu64 " bad entr%s remain%s%s\n", prog, left, left == 1 ? "y" : "ies",
            left == 1 ? "s" : "", repair ? "" : " (run 'verify --repair' to quarantine them)");
    return 1;
  }
  return 0;
}

static int cmd_prune(const char *root, uint64_t max_bytes, int64_t max_age, int json) {
  uint64_t n = 0, bytes = 0;
  rlk_status st = rlk_cache_prune(root, max_bytes, max_age, &n, &bytes);
  if (st != RLK_OK) return lib_error("pruning the cache", st);
  if (json) {
    printf("{\"root\": ");
    json_string(stdout, root);
    printf(", \"removed\": %" PRIu64 ", \"bytes\": %" PRIu64 "}\n", n, bytes);
    return 0;
  }
  char h[32];
  human_bytes(bytes, h, sizeof h);
  printf("prune: removed %" PRIu64 " entr%s, %" PRIu64 " bytes (%s)\n", n, n == 1 ? "y" : "ies",
         bytes, h);
  return 0;
}

static int cmd_clear(const char *root, int json) {
  rlk_status st = rlk_cache_clear(root);
  if (st != RLK_OK) return lib_error("clearing the cache", st);
  if (json) {
    printf("{\"root\": ");
    json_string(stdout, root);
    printf(", \"cleared\": true}\n");
  } else {
    printf("clear: removed every entry of %s\n", root);
  }
  return 0;
}

static int tool_main(int argc, char **argv) {
  const char *root_arg = NULL, *command = NULL;
  char root[4096];
  const char *max_size = NULL, *max_age = NULL;
  int keys_only = 0, repair = 0, yes = 0, json = 0;
  static const struct option longopts[] = {
      {"help", no_argument, NULL, 'h'},           {"root", required_argument, NULL, 'r'},
      {"keys", no_argument, NULL, 'k'},           {"repair", no_argument, NULL, 'R'},
      {"yes", no_argument, NULL, 'y'},            {"max-size", required_argument, NULL, 'S'},
      {"max-age", required_argument, NULL, 'A'},  {"json", no_argument, NULL, 'J'},
      {NULL, 0, NULL, 0}};

  /* Options may come before or after the command (getopt_long permutes); each command accepts
   * only its own. */
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":hy", longopts, NULL)) != -1) {
    switch (c) {
      case 'h': usage(stdout); return 0;
      case 'r': {
        if (!*optarg) return usage_error("--root needs a directory", NULL);
        const int rc = path_arg(root, sizeof root, "--root", optarg);
        if (rc) return rc;
        root_arg = optarg;
        break;
      }
      case 'k': keys_only = 1; break;
      case 'R': repair = 1; break;
      case 'y': yes = 1; break;
      case 'S': max_size = optarg; break;
      case 'A': max_age = optarg; break;
      case 'J': json = 1; break;
      default: return getopt_error(c, argv);
    }
  }
  for (int i = optind; i < argc; i++) {
    if (command) return usage_error("unexpected argument '%s'", argv[i]);
    command = argv[i];
  }
  if (!command) return usage_error("a command is required (list, sizes, verify, prune, clear)", NULL);

  int is_list = !strcmp(command, "list"), is_sizes = !strcmp(command, "sizes");
  int is_verify = !strcmp(command, "verify"), is_prune = !strcmp(command, "prune");
  int is_clear = !strcmp(command, "clear");
  if (!is_list && !is_sizes && !is_verify && !is_prune && !is_clear)
    return usage_error("unknown command '%s' (list, sizes, verify, prune, clear)", command);
  if (keys_only && !is_list) return usage_error("--keys belongs to 'list'", NULL);
  if (repair && !is_verify) return usage_error("--repair belongs to 'verify'", NULL);
  if (yes && !is_clear) return usage_error("--yes belongs to 'clear'", NULL);
  if ((max_size || max_age) && !is_prune)
    return usage_error("--max-size and --max-age belong to 'prune'", NULL);

  uint64_t max_bytes = 0;
  int64_t max_age_s = 0;
  if (is_prune) {
    if (!max_size && !max_age) return usage_error("prune needs --max-size and/or --max-age", NULL);
    if (max_size && (parse_size(max_size, &max_bytes) || max_bytes == 0))
      return usage_error("bad --max-size '%s' (a positive byte count, suffix K, M, G or T)",
                         max_size);
    if (max_age && (parse_age(max_age, &max_age_s) || max_age_s == 0))
      return usage_error("bad --max-age '%s' (a positive number of days, or suffix s, m, h, d)",
                         max_age);
  }
  if (is_clear && !yes) {
    fprintf(stderr, "%s: 'clear' removes every entry; run it again with --yes to confirm\n", prog);
    return 2;
  }

  if (!root_arg) {
    rlk_status st = rlk_cache_default_root(root, sizeof root);
    if (st != RLK_OK) return lib_error("finding the default cache root", st);
  }

  /* A mistyped root reads as an empty cache; say so rather than report silence. */
  struct stat sb;
  if (stat(root, &sb) != 0)
    fprintf(stderr, "%s: note: %s does not exist (an empty cache)\n", prog, root);
  else if (!S_ISDIR(sb.st_mode))
    return usage_error("'%s' is not a directory", root);

  if (is_list) return cmd_list(root, keys_only, json);
  if (is_sizes) return cmd_sizes(root, json);
  if (is_verify) return cmd_verify(root, repair, json);
  if (is_prune) return cmd_prune(root, max_bytes, max_age_s, json);
  return cmd_clear(root, json);
}

int main(int argc, char **argv) { return tool_exit(tool_main(argc, argv)); }

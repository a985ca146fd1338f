/* tool_config.h - configuration lines as the tools read them: string lists, and the expansion of a
 * line whose values may be comma lists into the cross product of its lists
 * ("group_advantage mode=grpo,rloo group_size=4,8" is four configurations), from the command line
 * or from files of one line each with '#' comments. Include after tool_util.h. */
#ifndef RLK_TOOL_CONFIG_H
#define RLK_TOOL_CONFIG_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The most configurations the tools expand their lines to, all lines together: far more than
 * any cluster compiles, few enough to hold and deduplicate in memory. */
#define TOOL_MAX_CONFIGS 200000

/* A list of strings with a hash index, so that membership tests stay cheap on long lists. */
typedef struct strlist {
  char **v;
  size_t n, cap;
  size_t *slots; /* index + 1 of the string in v, 0 for an empty slot; nslots a power of two */
  size_t nslots;
} strlist;

TOOL_UNUSED static size_t strlist_hash(const char *s) {
  size_t h = 1469598103934665603u; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211u;
  return h;
}

TOOL_UNUSED static void strlist_index(strlist *l, size_t i) {
  size_t mask = l->nslots - 1, h = strlist_hash(l->v[i]) & mask;
  while (l->slots[h]) h = (h + 1) & mask;
  l->slots[h] = i + 1;
}

TOOL_UNUSED static void strlist_push(strlist *l, char *s) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 16;
    l->v = xrealloc(l->v, l->cap * sizeof *l->v);
  }
  l->v[l->n++] = s;
  if (2 * l->n > l->nslots) { /* grow and rebuild the index */
    free(l->slots);
    l->nslots = l->nslots ? 2 * l->nslots : 64;
    l->slots = xrealloc(NULL, l->nslots * sizeof *l->slots);
    memset(l->slots, 0, l->nslots * sizeof *l->slots);
    for (size_t i = 0; i < l->n; i++) strlist_index(l, i);
  } else {
    strlist_index(l, l->n - 1);
  }
}

TOOL_UNUSED static int strlist_has(const strlist *l, const char *s) {
  if (!l->nslots) return 0;
  size_t mask = l->nslots - 1;
  for (size_t h = strlist_hash(s) & mask; l->slots[h]; h = (h + 1) & mask)
    if (!strcmp(l->v[l->slots[h] - 1], s)) return 1;
  return 0;
}

TOOL_UNUSED static void strlist_free(strlist *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  free(l->slots);
  memset(l, 0, sizeof *l);
}

/* Splits on spaces, tabs and (when `commas`) commas; empty pieces are dropped. */
TOOL_UNUSED static void split_words(const char *s, int commas, strlist *out) {
  const char *p = s;
  while (*p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || (commas && *p == ',')) p++;
    if (!*p) break;
    const char *b = p;
    while (*p && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && !(commas && *p == ','))
      p++;
    char *w = xrealloc(NULL, (size_t)(p - b) + 1);
    memcpy(w, b, (size_t)(p - b));
    w[p - b] = '\0';
    strlist_push(out, w);
  }
}

typedef struct sweep_param {
  char *name;
  strlist values;
} sweep_param;

/* Expands one configuration line into `configs` (skipping duplicates). On a malformed line
 * writes the reason to `why` and returns -1. */
TOOL_UNUSED static int expand_line(const char *line, const strlist *ops, strlist *configs, char *why,
                       size_t whylen) {
  strlist words = {0};
  split_words(line, 0, &words);
  int rc = -1;
  sweep_param *params = NULL;
  size_t np = 0;
  if (words.n == 0) {
    rc = 0;
    goto done;
  }
  if (strchr(words.v[0], '=')) {
    snprintf(why, whylen, "a configuration starts with the op name (one of: %s)",
             rlk_precompile_ops());
    goto done;
  }
  if (!strlist_has(ops, words.v[0])) {
    snprintf(why, whylen, "unknown op '%s' (ops: %s)", words.v[0], rlk_precompile_ops());
    goto done;
  }
  params = xrealloc(NULL, words.n * sizeof *params);
  for (size_t i = 1; i < words.n; i++) {
    char *eq = strchr(words.v[i], '=');
    if (!eq || eq == words.v[i]) {
      snprintf(why, whylen, "'%s' is not name=value", words.v[i]);
      goto done;
    }
    *eq = '\0';
    for (size_t j = 0; j < np; j++) {
      if (!strcmp(params[j].name, words.v[i])) {
        snprintf(why, whylen, "'%s' is given twice", words.v[i]);
        goto done;
      }
    }
    sweep_param *p = &params[np++];
    p->name = words.v[i];
    memset(&p->values, 0, sizeof p->values);
    /* Empty pieces of a comma list ("a,,b" or a trailing comma) are a mistake, not a value. */
    const char *v = eq + 1;
    if (!*v || v[0] == ',' || v[strlen(v) - 1] == ',' || strstr(v, ",,")) {
      snprintf(why, whylen, "'%s' has an empty value", words.v[i]);
      goto done;
    }
    split_words(v, 1, &p->values);
  }
  /* The cross product's size first: a line must not expand without bound. */
  size_t total = 1;
  for (size_t j = 0; j < np; j++) {
    if (params[j].values.n && total > (TOOL_MAX_CONFIGS - configs->n) / params[j].values.n) {
      snprintf(why, whylen,
               "the line expands to more than the %d configurations a run takes (%zu already)",
               TOOL_MAX_CONFIGS, configs->n);
      goto done;
    }
    total *= params[j].values.n;
  }
  /* Odometer over the value lists: the last parameter varies fastest. */
  size_t *idx = xrealloc(NULL, (np ? np : 1) * sizeof *idx);
  memset(idx, 0, (np ? np : 1) * sizeof *idx);
  for (;;) {
    size_t len = strlen(words.v[0]) + 1;
    for (size_t j = 0; j < np; j++)
      len += strlen(params[j].name) + strlen(params[j].values.v[idx[j]]) + 2;
    char *cfg = xrealloc(NULL, len);
    char *o = cfg;
    o += sprintf(o, "%s", words.v[0]);
    for (size_t j = 0; j < np; j++)
      o += sprintf(o, " %s=%s", params[j].name, params[j].values.v[idx[j]]);
    if (strlist_has(configs, cfg))
      free(cfg);
    else
      strlist_push(configs, cfg);
    size_t j = np;
    while (j > 0) {
      if (++idx[j - 1] < params[j - 1].values.n) break;
      idx[j - 1] = 0;
      j--;
    }
    if (j == 0) break; /* every list wrapped around: done */
  }
  free(idx);
  rc = 0;
done:
  for (size_t j = 0; j < np; j++) {
    /* names point into `words`; only the value lists are owned here */
    strlist_free(&params[j].values);
  }
  free(params);
  strlist_free(&words);
  return rc;
}

/* Reads a configuration file: one line each, '#' comments, blank lines ignored. */
TOOL_UNUSED static int read_config_file(const char *path, const strlist *ops, strlist *configs) {
  FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
  if (!f) {
    fprintf(stderr, "%s: cannot open %s: %s\n", prog, path, strerror(errno));
    return 2;
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  int lineno = 0, rc = 0;
  while ((n = getline(&line, &cap, f)) >= 0) {
    lineno++;
    char why[512];
    if (memchr(line, '\0', (size_t)n)) {
      /* Everything after it would silently vanish from the line. */
      fprintf(stderr, "%s: %s:%d: the line holds a NUL byte; is this a text file?\n", prog, path,
              lineno);
      rc = 2;
      break;
    }
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    if (expand_line(line, ops, configs, why, sizeof why) != 0) {
      fprintf(stderr, "%s: %s:%d: %s\n", prog, path, lineno, why);
      rc = 2;
      break;
    }
  }
  if (!rc && ferror(f)) {
    fprintf(stderr, "%s: reading %s: %s\n", prog, path, strerror(errno));
    rc = 2;
  }
  free(line);
  if (f != stdin) fclose(f);
  return rc;
}

#endif

/* test_ops.c - the contract every op of the table keeps, checked once over the table: its
 * settings parse, spell and document themselves one way; wrong lines are refused naming the
 * setting; samples plan, and plan to the same kernels through their canonical spelling; the
 * samples reach every value of every setting that shapes a kernel; the op list counts every op. */
#include <check.h>
#include <dirent.h>
#include <fnmatch.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "ops/ops.h"
#include "suites.h"
#include "test_util.h"

/* Parses a line's settings (after the op name) into values. */
static rlk_status values_of(const rlk_op_desc *d, const char *line, rlk_op_values *vals) {
  char copy[1024];
  rlk_op_config_pair pairs[16];
  size_t np = rlk_test_split_line(line, copy, sizeof copy, pairs);
  return rlk_op_values_parse(d, np, pairs, vals);
}

START_TEST(settings_are_well_formed) {
  for (size_t i = 0; rlk_op_table[i]; i++) {
    const rlk_op_desc *d = rlk_op_table[i];
    ck_assert_msg(d->nsettings > 0 && d->nsettings <= RLK_OP_MAX_SETTINGS, "%s: %zu settings", d->name, d->nsettings);
    ck_assert_msg(d->plan && d->samples && d->samples[0], "%s: no plan or samples", d->name);
    ck_assert_msg(!d->candidates == !d->tune_key, "%s: candidates and tune_key go together", d->name);
    const char *help = rlk_precompile_help(d->name);
    for (size_t k = 0; k < d->nsettings; k++) {
      const rlk_op_setting *s = &d->settings[k];
      const rlk_value_decl *sv = s->value;
      ck_assert_msg(sv && sv->name && s->doc && s->doc[0] && s->feeds, "%s: setting %zu is incomplete", d->name, k);
      ck_assert_msg(rlk_op_setting_index(d, sv->name) == (int)k, "%s: %s is declared twice", d->name, sv->name);
      char want[96];
      snprintf(want, sizeof want, "%s: ", sv->name);
      ck_assert_msg(strstr(help, want) != NULL, "%s: help lacks %s", d->name, sv->name);
      if (sv->kind == RLK_VALUE_CHOICE)
        for (int64_t c = sv->min; c <= sv->max; c++) {
          int64_t v = -1;
          ck_assert_int_eq(rlk_op_setting_parse(s, sv->choices[c], &v), RLK_OK);
          ck_assert_int_eq(v, c);
        }
    }
  }
}
END_TEST

/* The defaults spell out canonically, and the canonical line parses back to the same values. */
START_TEST(canonical_lines_round_trip) {
  for (size_t i = 0; rlk_op_table[i]; i++) {
    const rlk_op_desc *d = rlk_op_table[i];
    for (size_t j = 0; d->samples[j]; j++) {
      rlk_op_values a, b;
      ck_assert_msg(values_of(d, d->samples[j], &a) == RLK_OK, "%s: %s", d->samples[j], rlk_last_error());
      char line[1024], again[1024];
      ck_assert_int_gt(rlk_op_values_line(d, &a, line, sizeof line), 0);
      ck_assert_msg(values_of(d, line, &b) == RLK_OK, "%s: %s", line, rlk_last_error());
      ck_assert_int_gt(rlk_op_values_line(d, &b, again, sizeof again), 0);
      ck_assert_str_eq(line, again);
      for (size_t k = 0; k < d->nsettings; k++)
        ck_assert_msg(a.v[k] == b.v[k], "%s: %s changed through '%s'", d->name, d->settings[k].value->name, line);
      ck_assert_msg(a.given == b.given, "%s: the given settings changed through '%s'", d->name, line);
    }
  }
}
END_TEST

/* A sample and its canonical line plan the same kernels (the line a recording writes is enough
 * to rebuild what a call ran). */
START_TEST(canonical_lines_plan_alike) {
  rlk_context *ctx = rlk_test_host_context();
  for (size_t i = 0; rlk_op_table[i]; i++) {
    const rlk_op_desc *d = rlk_op_table[i];
    for (size_t j = 0; d->samples[j]; j++) {
      rlk_op_values a;
      ck_assert_int_eq(values_of(d, d->samples[j], &a), RLK_OK);
      char line[1024];
      ck_assert_int_gt(rlk_op_values_line(d, &a, line, sizeof line), 0);
      char k1[4096], k2[4096];
      int n1 = 0, n2 = 0;
      ck_assert_msg(rlk_precompile_keys(ctx, d->samples[j], k1, sizeof k1, &n1) == RLK_OK, "%s: %s", d->samples[j],
                    rlk_last_error());
      ck_assert_msg(rlk_precompile_keys(ctx, line, k2, sizeof k2, &n2) == RLK_OK, "%s: %s", line, rlk_last_error());
      ck_assert_int_gt(n1, 0);
      ck_assert_int_eq(n1, n2);
      ck_assert_str_eq(k1, k2);
    }
  }
  rlk_context_destroy(ctx);
}
END_TEST

/* Wrong lines are refused, naming what is wrong. */
START_TEST(bad_settings_are_named) {
  rlk_context *ctx = rlk_test_compile_only_host_context();
  for (size_t i = 0; rlk_op_table[i]; i++) {
    const rlk_op_desc *d = rlk_op_table[i];
    char line[256];
    for (size_t k = 0; k < d->nsettings; k++) {
      const rlk_op_setting *s = &d->settings[k];
      snprintf(line, sizeof line, "%s %s=%s", d->name, s->value->name, "x!");
      ck_assert_msg(rlk_precompile(ctx, line, NULL) == RLK_ERR_INVALID_ARGUMENT, "%s accepted", line);
      ck_assert_msg(strstr(rlk_last_error(), s->value->name) != NULL, "%s: '%s'", line, rlk_last_error());
      snprintf(line, sizeof line, "%s %s=%s %s=%s", d->name, s->value->name, "1", s->value->name, "1");
      ck_assert_msg(rlk_precompile(ctx, line, NULL) == RLK_ERR_INVALID_ARGUMENT, "%s accepted", line);
      if (s->value->kind == RLK_VALUE_INT && s->value->max < INT64_MAX) {
        snprintf(line, sizeof line, "%s %s=%lld", d->name, s->value->name, (long long)s->value->max + 1);
        ck_assert_msg(rlk_precompile(ctx, line, NULL) == RLK_ERR_INVALID_ARGUMENT, "%s accepted", line);
      }
    }
    snprintf(line, sizeof line, "%s no_such_setting=1", d->name);
    rlk_test_expect_error(rlk_precompile(ctx, line, NULL), RLK_ERR_INVALID_ARGUMENT, "no_such_setting",
                          "rlk_precompile");
  }
  rlk_context_destroy(ctx);
}
END_TEST

/* The kernel parameter values (entry, parameter, value) a set of specs uses. */
typedef struct param_seen {
  const char *entry[256];
  int param[256];
  int64_t value[256];
  size_t n;
} param_seen;

static int seen_has(const param_seen *s, const char *entry, int param, int64_t value) {
  for (size_t i = 0; i < s->n; i++)
    if (s->param[i] == param && s->value[i] == value && !strcmp(s->entry[i], entry)) return 1;
  return 0;
}

static void seen_add(param_seen *s, const rlk_kernel_spec *spec) {
  for (size_t p = 0; p < spec->tmpl->nparams; p++)
    if (!seen_has(s, spec->tmpl->entry, (int)p, spec->values[p]) && s->n < 256) {
      s->entry[s->n] = spec->tmpl->entry;
      s->param[s->n] = (int)p;
      s->value[s->n] = spec->values[p];
      s->n++;
    }
}

/* A line's kernels on ctx; 0 when the combination is not a valid one. */
static size_t plan_line(const rlk_context *ctx, const rlk_op_desc *d, const char *line, rlk_kernel_spec *specs) {
  size_t ns = 0;
  return rlk_test_plan_line(d, ctx, line, specs, &ns) == RLK_OK ? ns : 0;
}

/* Setting k of vals at a trial value x: given, or not given for an integer's out-of-range default. */
static void set_trial(const rlk_op_desc *d, rlk_op_values *vals, int k, int64_t x) {
  const rlk_op_setting *s = &d->settings[k];
  rlk_op_values_set(vals, k, x);
  if (s->value->kind == RLK_VALUE_INT && (x < s->value->min || x > s->value->max)) vals->given &= ~(1u << k);
}

/* The values a setting is tried at: every value of a flag, choice or dtype; an integer's default
 * (an integer whose default is outside its range: not given), bounds and a few between. */
static size_t setting_trials(const rlk_op_setting *s, int64_t *xs) {
  const rlk_value_decl *v = s->value;
  size_t n = 0;
  if (v->kind == RLK_VALUE_INT) {
    const int64_t hi = v->max < 1 << 20 ? v->max : 1 << 20;
    const int64_t cand[] = {v->min, v->min + 1, 2, 4, 8, 16, 64, 128, 256, hi};
    xs[n++] = s->def;
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++)
      if (cand[i] >= v->min && cand[i] <= hi && cand[i] != s->def) xs[n++] = cand[i];
    return n;
  }
  for (int64_t x = 0; x < 32; x++) {
    if (v->kind == RLK_VALUE_FLAG && x > 1) break;
    if (v->kind == RLK_VALUE_CHOICE && x > v->max) break;
    if (v->kind == RLK_VALUE_CHOICE && x < v->min) continue;
    if (v->kind == RLK_VALUE_DTYPE && !(v->dtypes & RLK_DTYPE_BIT(x))) continue;
    xs[n++] = x;
  }
  return n;
}

/* Every value of every setting that shapes a kernel (a flag, choice or dtype that feeds a
 * template parameter), put into some sample, plans kernels each of whose parameter values some
 * sample's kernel of that entry also has (on sm_90a, where the most variants exist): compiling
 * the samples compiles every code path each value selects. */
START_TEST(samples_reach_every_kernel_setting) {
  rlk_context *ctx = rlk_test_compile_only_cuda_context("sm_90a", "ops: samples reach every setting");
  if (!ctx) return;
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
  for (size_t i = 0; rlk_op_table[i]; i++) {
    const rlk_op_desc *d = rlk_op_table[i];
    static param_seen all;
    memset(&all, 0, sizeof all);
    for (size_t j = 0; d->samples[j]; j++) {
      size_t ns = plan_line(ctx, d, d->samples[j], specs);
      ck_assert_msg(ns > 0, "%s: %s", d->samples[j], rlk_last_error());
      for (size_t k = 0; k < ns; k++) seen_add(&all, &specs[k]);
    }
    for (size_t k = 0; k < d->nsettings; k++) {
      const rlk_op_setting *s = &d->settings[k];
      if (!s->feeds[0] || s->value->kind == RLK_VALUE_INT) continue;
      int64_t xs[32];
      const size_t nx = setting_trials(s, xs);
      for (size_t a = 0; a < nx; a++) {
        const int64_t x = xs[a];
        int reached = 0, planned = 0;
        for (size_t j = 0; d->samples[j] && !reached; j++) {
          rlk_op_values v;
          ck_assert_int_eq(values_of(d, d->samples[j], &v), RLK_OK);
          rlk_op_values_set(&v, (int)k, x);
          char line[1024];
          ck_assert_int_gt(rlk_op_values_line(d, &v, line, sizeof line), 0);
          size_t ns = plan_line(ctx, d, line, specs);
          if (!ns) continue; /* not a valid combination */
          planned = reached = 1;
          for (size_t q = 0; q < ns && reached; q++)
            for (size_t p = 0; p < specs[q].tmpl->nparams && reached; p++)
              reached = seen_has(&all, specs[q].tmpl->entry, (int)p, specs[q].values[p]);
        }
        ck_assert_msg(planned && reached, "%s: %s=%lld selects a code path no sample builds", d->name, s->value->name,
                      (long long)x);
      }
    }
  }
  rlk_context_destroy(ctx);
}
END_TEST

/* What one value of a setting plans for one word of its `feeds` over one sample line: the
 * kernels whose entries match the word's entry glob, and (for "entry.param") the value of that
 * parameter in the first of them that has it. */
typedef struct feed_outcome {
  int planned; /* the line with the value plans */
  size_t n;    /* kernels matching the entry glob */
  rlk_kernel_spec match[RLK_OP_MAX_KERNELS];
  int has_value;
  int64_t value;
} feed_outcome;

static void feed_at(const rlk_context *ctx, const rlk_op_desc *d, const char *sample, int k, int64_t x,
                    const char *entry, const char *param, feed_outcome *o) {
  memset(o, 0, sizeof *o);
  rlk_op_values v;
  ck_assert_int_eq(values_of(d, sample, &v), RLK_OK);
  set_trial(d, &v, k, x);
  char line[1024];
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
  if (rlk_op_values_line(d, &v, line, sizeof line) <= 0) return;
  const size_t ns = plan_line(ctx, d, line, specs);
  if (!ns) return;
  o->planned = 1;
  for (size_t q = 0; q < ns; q++) {
    const rlk_template *t = specs[q].tmpl;
    if (fnmatch(entry, t->entry, 0)) continue;
    o->match[o->n++] = specs[q];
    for (size_t p = 0; param && !o->has_value && p < t->nparams; p++)
      if (!strcmp(t->params[p]->name, param)) {
        o->has_value = 1;
        o->value = specs[q].values[p];
      }
  }
}

/* Whether two outcomes differ in what the word names: the parameter's value, or the kernels. */
static int feed_differs(const feed_outcome *a, const feed_outcome *b, int param) {
  if (param) return a->has_value && b->has_value && a->value != b->value;
  if (a->n != b->n) return 1;
  for (size_t q = 0; q < a->n; q++) {
    if (a->match[q].tmpl != b->match[q].tmpl) return 1;
    for (size_t p = 0; p < a->match[q].tmpl->nparams; p++)
      if (a->match[q].values[p] != b->match[q].values[p]) return 1;
  }
  return 0;
}

/* A setting's `feeds` says what it shapes (entries as globs): each "entry.param" is a parameter of
 * a kernel the op plans, and two values of the setting give it two values over some sample; each
 * bare "entry" names kernels that two values of the setting plan differently (present or not, or
 * another template or parameter). A word that went stale (a renamed kernel or parameter, one the
 * setting no longer reaches) fails here. */
START_TEST(feeds_name_what_settings_shape) {
  rlk_context *ctx = rlk_test_compile_only_cuda_context("sm_90a", "ops: feeds name what settings shape");
  if (!ctx) return;
  static feed_outcome first, out;
  for (size_t i = 0; rlk_op_table[i]; i++) {
    const rlk_op_desc *d = rlk_op_table[i];
    for (size_t k = 0; k < d->nsettings; k++) {
      const rlk_op_setting *s = &d->settings[k];
      int64_t xs[32];
      const size_t nx = setting_trials(s, xs);
      for (const char *f = s->feeds; *f;) {
        const size_t len = strcspn(f, " ");
        const char *dot = memchr(f, '.', len);
        const size_t elen = dot ? (size_t)(dot - f) : len;
        char entry[64], param[64];
        snprintf(entry, sizeof entry, "%.*s", (int)elen, f);
        snprintf(param, sizeof param, "%.*s", dot ? (int)(len - elen - 1) : 0, dot ? dot + 1 : "");
        int shaped = 0;
        for (size_t j = 0; d->samples[j] && !shaped; j++) {
          first.planned = 0;
          for (size_t a = 0; a < nx && !shaped; a++) {
            feed_at(ctx, d, d->samples[j], (int)k, xs[a], entry, dot ? param : NULL, &out);
            /* a parameter compares values where some kernel has it */
            if (!out.planned || (dot && !out.has_value)) continue;
            if (first.planned)
              shaped = feed_differs(&first, &out, dot != NULL);
            else
              first = out;
          }
        }
        ck_assert_msg(shaped, "%s: %s feeds '%.*s', which none of its values changes over the samples (or no "
                      "kernel it plans has)", d->name, s->value->name, (int)len, f);
        f += len;
        while (*f == ' ') f++;
      }
    }
  }
  rlk_context_destroy(ctx);
}
END_TEST

/* Whether two declarations allow the same values (names aside). */
static int same_values(const rlk_value_decl *a, const rlk_value_decl *b) {
  if (a->kind != b->kind || a->min != b->min || a->max != b->max || a->pow2 != b->pow2 || a->dtypes != b->dtypes)
    return 0;
  if (a->kind != RLK_VALUE_CHOICE) return 1;
  for (int64_t c = a->min; c <= a->max; c++)
    if (strcmp(a->choices[c], b->choices[c])) return 0;
  return 1;
}

/* Whether a setting's `feeds` has the word "entry.param" for template t's parameter p (an entry glob
 * matching t's entry). */
static int feeds_param(const rlk_op_setting *s, const rlk_template *t, const rlk_value_decl *p) {
  for (const char *f = s->feeds; *f;) {
    const size_t len = strcspn(f, " ");
    const char *dot = memchr(f, '.', len);
    char entry[64];
    snprintf(entry, sizeof entry, "%.*s", dot ? (int)(dot - f) : 0, f);
    if (dot && !fnmatch(entry, t->entry, 0) && strlen(p->name) == len - (size_t)(dot + 1 - f) &&
        !strncmp(dot + 1, p->name, strlen(p->name)))
      return 1;
    f += len;
    while (*f == ' ') f++;
  }
  return 0;
}

/* A setting that feeds a template parameter unchanged (the same name and values) is that
 * parameter's declaration, not a copy of it, and a setting that is a parameter's declaration says
 * it feeds that parameter. What stays a declaration of its own is a translation (a dtype made a
 * dtype code, a choice made a flag), which feeds_name_what_settings_shape checks by its values.
 * Over the kernels the samples plan on sm_90a, sm_80 and the host. */
START_TEST(settings_share_the_parameters_they_feed) {
  static const char *const targets[] = {"sm_90a", "sm_80", NULL};
  rlk_context *ctxs[3] = {NULL, NULL, NULL};
  for (int c = 0; c < 3; c++) {
    ctxs[c] = rlk_test_compile_only_context(c < 2 ? RLK_BACKEND_CUDA : RLK_BACKEND_HOST, targets[c],
                                            "ops: settings share the parameters they feed");
    if (!ctxs[c]) goto done;
  }
  size_t shared = 0;
  for (size_t i = 0; rlk_op_table[i]; i++) {
    const rlk_op_desc *d = rlk_op_table[i];
    const rlk_template *tmpls[64];
    size_t nt = 0;
    for (int c = 0; c < 3; c++)
      for (size_t j = 0; d->samples[j]; j++) {
        rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
        const size_t ns = plan_line(ctxs[c], d, d->samples[j], specs);
        ck_assert_msg(ns > 0, "%s: %s", d->samples[j], rlk_last_error());
        for (size_t q = 0; q < ns; q++) {
          size_t t = 0;
          while (t < nt && tmpls[t] != specs[q].tmpl) t++;
          if (t == nt && nt < sizeof tmpls / sizeof tmpls[0]) tmpls[nt++] = specs[q].tmpl;
        }
      }
    for (size_t k = 0; k < d->nsettings; k++) {
      const rlk_op_setting *s = &d->settings[k];
      for (size_t t = 0; t < nt; t++)
        for (size_t p = 0; p < tmpls[t]->nparams; p++) {
          const rlk_value_decl *pd = tmpls[t]->params[p];
          if (pd == s->value) {
            ck_assert_msg(feeds_param(s, tmpls[t], pd), "%s: %s is %s's declaration but does not feed it", d->name,
                          s->value->name, tmpls[t]->entry);
            shared++;
          } else if (feeds_param(s, tmpls[t], pd)) {
            ck_assert_msg(strcmp(pd->name, s->value->name) || !same_values(pd, s->value),
                          "%s: %s declares %s.%s's values again: RLK_SET the parameter's declaration", d->name,
                          s->value->name, tmpls[t]->entry, pd->name);
          }
        }
    }
  }
  ck_assert_uint_gt(shared, 0);
done:
  for (int c = 0; c < 3; c++)
    if (ctxs[c]) rlk_context_destroy(ctxs[c]);
}
END_TEST

/* A setting declared as a power of two (a parameter's declaration it shares) takes only powers of
 * two in its range, and says so in its error and its help line. */
START_TEST(power_of_two_settings) {
  static const rlk_value_decl block = RLK_DECL_POW2("block", 32, 1024);
  static const rlk_op_setting settings[] = {RLK_SET(block, 256, "", "threads per block")};
  const rlk_op_desc d = {.name = "pow2", .settings = settings, .nsettings = 1};
  int64_t v = 0;
  ck_assert_int_eq(rlk_op_setting_parse(&settings[0], "64", &v), RLK_OK);
  ck_assert_int_eq(v, 64);
  rlk_test_expect_error(rlk_op_setting_parse(&settings[0], "96", &v), RLK_ERR_INVALID_ARGUMENT,
                        "a power of two in [32, 1024]", "rlk_op_setting_parse");
  ck_assert_int_eq(rlk_op_setting_parse(&settings[0], "2048", &v), RLK_ERR_INVALID_ARGUMENT);
  char help[256];
  ck_assert_int_gt(rlk_op_help_text(&d, help, sizeof help), 0);
  ck_assert_str_eq(help, "block: 32..1024 (powers of two), threads per block (256); no kernel parameter of its own\n");
}
END_TEST

/* The file `rel` of the source tree opened for reading (its path in `path`); fails the test when
 * it cannot be. */
static FILE *open_source(const char *rel, char *path, size_t size) {
  snprintf(path, size, "%s/../../%s", rlk_test_bin_dir(), rel);
  FILE *f = fopen(path, "r");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  return f;
}

/* The file `rel` of the source tree into text (at most size - 1 bytes, then a NUL). */
static void read_source(const char *rel, char *text, size_t size) {
  char path[4096];
  FILE *f = open_source(rel, path, sizeof path);
  text[fread(text, 1, size - 1, f)] = '\0';
  fclose(f);
}

/* tools/precompile.conf, what `make precompile` ships, has a line for every op. */
START_TEST(precompile_conf_covers_every_op) {
  static char text[1 << 16];
  read_source("tools/precompile.conf", text, sizeof text);
  for (size_t i = 0; rlk_op_table[i]; i++) {
    char want[96];
    snprintf(want, sizeof want, "\n%s ", rlk_op_table[i]->name);
    ck_assert_msg(strstr(text, want) != NULL, "tools/precompile.conf has no %s line", rlk_op_table[i]->name);
  }
}
END_TEST

/* tests/gpu-kernels.conf, what make test-gpu precompiles first, still parses: every line names an
 * op and settings it has (a line that stopped parsing would fail make test-gpu's first step). */
START_TEST(gpu_kernel_list_parses) {
  char path[4096];
  FILE *f = open_source("tests/gpu-kernels.conf", path, sizeof path);
  char line[1024];
  int lines = 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    if (!line[0] || line[0] == '#') continue;
    const rlk_op_desc *d = NULL;
    for (size_t i = 0; rlk_op_table[i] && !d; i++) {
      const size_t n = strlen(rlk_op_table[i]->name);
      if (!strncmp(line, rlk_op_table[i]->name, n) && line[n] == ' ') d = rlk_op_table[i];
    }
    ck_assert_msg(d != NULL, "%s: no op for '%s'", path, line);
    rlk_op_values v;
    ck_assert_msg(values_of(d, line, &v) == RLK_OK, "%s: '%s': %s", path, line, rlk_last_error());
    lines++;
  }
  fclose(f);
  ck_assert_int_gt(lines, 100);
}
END_TEST

/* ---- the op list ---------------------------------------------------------------------- */

/* The identifiers that stand between `before` and `after` in the source files under `dir` (of
 * the source tree) whose names start with `stem` and end with `ext`, each followed by a space. */
static void names_in(const char *dir, const char *stem, const char *ext, const char *before, const char *after,
                     char *out, size_t size) {
  char path[4096];
  snprintf(path, sizeof path, "%s/../../%s", rlk_test_bin_dir(), dir);
  DIR *d = opendir(path);
  ck_assert_msg(d != NULL, "cannot open %s", path);
  size_t len = 0;
  out[0] = '\0';
  static char text[1 << 20];
  for (struct dirent *e; (e = readdir(d));) {
    const size_t n = strlen(e->d_name);
    if (strncmp(e->d_name, stem, strlen(stem)) || n < strlen(ext) || strcmp(e->d_name + n - strlen(ext), ext)) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    read_source(path, text, sizeof text);
    for (const char *p = strstr(text, before); p; p = strstr(p + 1, before)) {
      const char *id = p + strlen(before), *q = id;
      while (*q == '_' || (*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9')) q++;
      if (q == id || strncmp(q, after, strlen(after))) continue;
      const int w = snprintf(out + len, size - len, "%.*s ", (int)(q - id), id);
      ck_assert_int_lt(w, (int)(size - len));
      len += (size_t)w;
    }
  }
  closedir(d);
}

static size_t words(const char *s) {
  size_t n = 0;
  for (; *s; s++) n += *s == ' ';
  return n;
}

/* runtime/op_list.h is complete: the tree defines as many op descriptors and op suites as it lists
 * (a file whose row is missing would be neither precompiled nor tested), each one listed, and
 * every public struct has an ABI row. */
START_TEST(op_list_counts_what_the_tree_defines) {
  static char descs[4096], suites[4096], structs[8192];
  names_in("src/ops", "", ".c", "const rlk_op_desc rlk_op_", " = {", descs, sizeof descs);
  ck_assert_msg(words(descs) == RLK_OP_COUNT, "src/ops defines %zu op descriptors (%s), the op list has %d",
                words(descs), descs, (int)RLK_OP_COUNT);
  for (size_t i = 0; rlk_op_table[i]; i++) {
    char want[96];
    snprintf(want, sizeof want, "%s ", rlk_op_table[i]->name);
    ck_assert_msg(strstr(descs, want) != NULL, "%s: listed, but src/ops defines no rlk_op_%s", want,
                  rlk_op_table[i]->name);
  }
  names_in("tests", "test_", ".c", "Suite *", "(void) {", suites, sizeof suites);
#define LISTED(name) " " #name "_suite"
  static const char listed[] = RLK_TEST_SUITES(LISTED) " ";
#undef LISTED
  size_t n = 0;
  for (const char *p = suites; *p; p = strchr(p, ' ') + 1, n++) {
    const int len = (int)(strchr(p, ' ') - p);
    char want[96];
    snprintf(want, sizeof want, " %.*s ", len, p);
    ck_assert_msg(strstr(listed, want) != NULL, "%.*s: defined in tests/, registered nowhere (suites.h)", len, p);
  }
  ck_assert_msg(n == words(listed) - 1, "tests/ defines %zu suites, suites.h registers %zu", n, words(listed) - 1);
  names_in("include", "rlk", ".h", "typedef struct ", " {", structs, sizeof structs);
  ck_assert_int_gt(words(structs), 20);
  for (const char *p = structs; *p; p = strchr(p, ' ') + 1) {
    char name[96];
    snprintf(name, sizeof name, "%.*s", (int)(strchr(p, ' ') - p), p);
    ck_assert_msg(rlk_abi_struct_size(name) > 0, "%s: a public struct without an ABI row", name);
  }
}
END_TEST

/* The enum table: rows in the header's order, each constant's own value, NULL past the end. */
START_TEST(enum_table_rows) {
  size_t n = 0, grpo = 0, rloo = 0, metric = 0;
  const char *type;
  int value;
  for (const char *name; (name = rlk_abi_enum_constant(n, &type, &value)); n++) {
    if (!strcmp(name, "RLK_ADV_GRPO")) {
      ck_assert_str_eq(type, "rlk_advantage_mode");
      ck_assert_int_eq(value, RLK_ADV_GRPO);
      grpo = n + 1;
    } else if (!strcmp(name, "RLK_ADV_RLOO")) {
      ck_assert_int_eq(value, RLK_ADV_RLOO);
      rloo = n + 1;
    } else if (!strcmp(name, "RLK_PL_METRIC_KL_MEAN")) {
      ck_assert_ptr_null(type); /* an unnamed enum */
      ck_assert_int_eq(value, RLK_PL_METRIC_KL_MEAN);
      metric = n + 1;
    } else if (!strcmp(name, "RLK_LOG_DEFAULT")) {
      ck_assert_int_eq(value, -1);
    }
  }
  ck_assert_uint_gt(n, 100);
  ck_assert_uint_gt(grpo, 0);
  ck_assert_uint_eq(rloo, grpo + 2); /* RLK_ADV_MEAN_ONLY between them */
  ck_assert_uint_gt(metric, 0);
  ck_assert_ptr_null(rlk_abi_enum_constant(n, &type, &value));
  ck_assert_ptr_nonnull(rlk_abi_enum_constant(0, NULL, NULL));
}
END_TEST

/* ---- argument overlap ---------------------------------------------------------------- */

/* The bytes a tensor covers, marked in a map of the buffer it lies in (the reference). */
static void mark_bytes(const rlk_tensor *t, const uint8_t *buf, uint8_t *map) {
  const size_t es = rlk_dtype_size(t->dtype);
  int64_t idx[RLK_MAX_DIMS] = {0};
  for (;;) {
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) off += idx[i] * t->strides[i];
    memset(map + ((const uint8_t *)t->data - buf) + off * (int64_t)es, 1, es);
    int i = t->ndim - 1;
    while (i >= 0 && ++idx[i] == t->shape[i]) idx[i--] = 0;
    if (i < 0) break;
  }
}

static int64_t rand_in(uint64_t *rng, int64_t lo, int64_t hi) {
  return lo + (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)(hi - lo + 1));
}

/* A random tensor inside buf (offset, dtype, 1 to 3 dimensions, strides from 0 up, in any
 * order), that fits. */
static rlk_tensor random_view(uint64_t *rng, uint8_t *buf, size_t size) {
  static const rlk_dtype dts[] = {RLK_BOOL, RLK_BF16, RLK_F32, RLK_F64};
  for (;;) {
    rlk_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dts[rlk_test_rand_u64(rng) % 4];
    t.ndim = (int32_t)rand_in(rng, 1, 3);
    int64_t last = 0;
    for (int i = 0; i < t.ndim; i++) {
      t.shape[i] = rand_in(rng, 1, 6);
      t.strides[i] = rlk_test_rand_u64(rng) % 5 == 0 ? 0 : rand_in(rng, 1, 24);
      last += (t.shape[i] - 1) * t.strides[i];
    }
    const size_t es = rlk_dtype_size(t.dtype);
    const size_t span = (size_t)(last + 1) * es;
    if (span > size) continue;
    const size_t at = (size_t)rand_in(rng, 0, (int64_t)((size - span) / es)) * es;
    t.data = buf + at;
    return t;
  }
}

/* rlk_tensors_overlap says what the byte maps of the two tensors say, for any strides; two columns
 * of one matrix, or a matrix and a vector in its padding, share no byte. */
START_TEST(overlap_is_exact) {
  static uint8_t buf[512] __attribute__((aligned(16)));
  static uint8_t ma[512], mb[512];
  uint64_t rng = rlk_test_seed();
  int met = 0;
  for (int trial = 0; trial < 20000; trial++) {
    rlk_tensor a = random_view(&rng, buf, sizeof buf), b = random_view(&rng, buf, sizeof buf);
    memset(ma, 0, sizeof ma);
    memset(mb, 0, sizeof mb);
    mark_bytes(&a, buf, ma);
    mark_bytes(&b, buf, mb);
    int want = 0;
    for (size_t i = 0; i < sizeof buf && !want; i++) want = ma[i] && mb[i];
    met += want;
    ck_assert_msg(rlk_tensors_overlap(&a, &b) == want && rlk_tensors_overlap(&b, &a) == want,
                  "trial %d: overlap %d, the bytes say %d", trial, rlk_tensors_overlap(&a, &b), want);
  }
  ck_assert_int_gt(met, 1000);
  ck_assert_int_lt(met, 19000);
  /* columns 0 and 1 of a [4, 2] f32 matrix; a [3, 4] matrix of row stride 6 and a vector in
   * the padding after each row */
  float m[4 * 6];
  rlk_tensor c0 = rlk_tensor_2d(m, RLK_F32, 4, 1, 2), c1 = rlk_tensor_2d(m + 1, RLK_F32, 4, 1, 2);
  ck_assert_int_eq(rlk_tensors_overlap(&c0, &c1), 0);
  rlk_tensor rows = rlk_tensor_2d(m, RLK_F32, 3, 4, 6), pad = rlk_tensor_2d(m + 4, RLK_F32, 3, 2, 6);
  ck_assert_int_eq(rlk_tensors_overlap(&rows, &pad), 0);
  pad.data = m + 3;
  ck_assert_int_eq(rlk_tensors_overlap(&rows, &pad), 1);
  /* a written tensor needs its own place per element; inputs may repeat (a broadcast view) */
  rlk_tensor bc = rlk_tensor_2d(m, RLK_F32, 4, 3, 0);
  rlk_arg_ref in = {&bc, "in", 0, NULL}, out = {&c1, "out", 1, NULL};
  rlk_arg_ref ok[] = {in, out};
  ck_assert_int_eq(rlk_check_no_overlap(ok, 1), RLK_OK);
  ck_assert_int_eq(rlk_check_no_overlap(ok, 2), RLK_ERR_INVALID_ARGUMENT); /* c1 is in bc's bytes */
  ck_assert_ptr_nonnull(strstr(rlk_last_error(), "out: overlaps in"));
  rlk_arg_ref self[] = {{&bc, "bcast", 1, NULL}};
  rlk_test_expect_error(rlk_check_no_overlap(self, 1), RLK_ERR_INVALID_ARGUMENT, "bcast", "rlk_check_no_overlap");
  /* a documented in-place pair passes only as the very same tensor */
  rlk_arg_ref same[] = {{&rows, "x", 0, NULL}, {&rows, "out", 1, &rows}};
  ck_assert_int_eq(rlk_check_no_overlap(same, 2), RLK_OK);
  rlk_tensor shifted = rows;
  shifted.data = m + 1;
  rlk_arg_ref moved[] = {{&rows, "x", 0, NULL}, {&shifted, "out", 1, &rows}};
  ck_assert_int_eq(rlk_check_no_overlap(moved, 2), RLK_ERR_INVALID_ARGUMENT);
}
END_TEST

/* The shared tensor check: present, one of the allowed dtypes, a dimension count in range; each
 * message names the tensor and what is wrong. */
START_TEST(tensor_of_checks_in_order) {
  float m[6];
  const uint32_t f32 = RLK_DTYPE_BIT(RLK_F32);
  rlk_tensor t = rlk_tensor_2d(m, RLK_F32, 2, 3, 3);
  ck_assert_int_eq(rlk_check_tensor_of(&t, "x", f32, 2, 2), RLK_OK);
  ck_assert_int_eq(rlk_check_tensor_of(&t, "x", f32, 1, 3), RLK_OK);
  ck_assert_int_eq(rlk_check_tensor_of(&t, "x", f32, 1, 1), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(rlk_last_error(), "x: expected 1 dimensions, got 2");
  ck_assert_int_eq(rlk_check_tensor_of(&t, "x", f32, 3, 4), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(rlk_last_error(), "x: expected 3 to 4 dimensions, got 2");
  /* the dtype is checked before the dimensions */
  ck_assert_int_eq(rlk_check_tensor_of(&t, "x", RLK_DTYPE_BIT(RLK_F64), 1, 1), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(rlk_last_error(), "x: dtype f32 is not supported (expected f64)");
  /* and presence before both: an absent tensor is refused, not passed */
  rlk_tensor absent = t;
  absent.data = NULL;
  ck_assert_int_eq(rlk_check_tensor_of(&absent, "y", RLK_DTYPE_BIT(RLK_F64), 1, 1), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(rlk_last_error(), "y: data is NULL");
}
END_TEST

/* The shared row layout check: rows of contiguous elements that do not overlap (one repeated row,
 * stride 0, is a broadcast), and the row stride a kernel takes (the row length for one row). */
START_TEST(contiguous_rows_and_their_stride) {
  float m[4 * 6];
  int64_t stride = -1;
  rlk_tensor t = rlk_tensor_2d(m, RLK_F32, 4, 4, 6);
  ck_assert_int_eq(rlk_check_contiguous_rows(&t, "x", &stride), RLK_OK);
  ck_assert_int_eq(stride, 6);
  t.strides[0] = 0; /* one row broadcast */
  ck_assert_int_eq(rlk_check_contiguous_rows(&t, "x", &stride), RLK_OK);
  ck_assert_int_eq(stride, 0);
  rlk_tensor one = rlk_tensor_2d(m, RLK_F32, 1, 5, 2); /* one row: its stride is never read */
  ck_assert_int_eq(rlk_check_contiguous_rows(&one, "x", &stride), RLK_OK);
  ck_assert_int_eq(stride, 5);
  t.strides[0] = 3;
  ck_assert_int_eq(rlk_check_contiguous_rows(&t, "x", NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(rlk_last_error(),
                   "x: row stride 3 is less than the row length 4 (and not 0, one row broadcast)");
  t.strides[0] = 8;
  t.strides[1] = 2;
  stride = -1;
  ck_assert_int_eq(rlk_check_contiguous_rows(&t, "x", &stride), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(rlk_last_error(), "x: stride[1] = 2, rows must be contiguous");
  ck_assert_int_eq(stride, -1);
}
END_TEST

/* The shared enum check: both ends of the range pass, one past either end is refused by name. */
START_TEST(enum_values_in_range) {
  ck_assert_int_eq(rlk_check_enum(0, "mode", 0, 3, "rlk_mode"), RLK_OK);
  ck_assert_int_eq(rlk_check_enum(3, "mode", 0, 3, "rlk_mode"), RLK_OK);
  ck_assert_int_eq(rlk_check_enum(4, "mode", 0, 3, "rlk_mode"), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(rlk_last_error(), "mode: 4 is not an rlk_mode");
  ck_assert_int_eq(rlk_check_enum(0, "variant", 1, 2, "rlk_variant"), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(rlk_last_error(), "variant: 0 is not an rlk_variant");
}
END_TEST

/* The shared number checks: finite and > 0, or finite and >= 0; NaN and the infinities never pass. */
START_TEST(positive_and_nonnegative_numbers) {
  ck_assert_int_eq(rlk_check_positive(1e-30, "t"), RLK_OK);
  ck_assert_int_eq(rlk_check_nonnegative(0.0, "e"), RLK_OK);
  ck_assert_int_eq(rlk_check_positive(0.0, "t"), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(rlk_last_error(), "t: 0 must be finite and > 0");
  ck_assert_int_eq(rlk_check_nonnegative(-0.5, "e"), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(rlk_last_error(), "e: -0.5 must be finite and >= 0");
  const double bad[] = {NAN, INFINITY, -INFINITY};
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(rlk_check_positive(bad[i], "t"), RLK_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(rlk_check_nonnegative(bad[i], "e"), RLK_ERR_INVALID_ARGUMENT);
  }
}
END_TEST

Suite *ops_suite(void) {
  Suite *s = suite_create("ops");
  rlk_test_add_case(s, "contract", 120, TESTS(settings_are_well_formed, canonical_lines_round_trip,
      canonical_lines_plan_alike, bad_settings_are_named, samples_reach_every_kernel_setting,
      feeds_name_what_settings_shape, settings_share_the_parameters_they_feed, power_of_two_settings,
      precompile_conf_covers_every_op, gpu_kernel_list_parses, op_list_counts_what_the_tree_defines,
      enum_table_rows, overlap_is_exact, tensor_of_checks_in_order, contiguous_rows_and_their_stride,
      enum_values_in_range, positive_and_nonnegative_numbers));
  return s;
}

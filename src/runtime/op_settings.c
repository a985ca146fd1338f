/* settings.c - an op's configuration line from its settings table: parsing, checks, the
 * canonical spelling and the --help text. No op parses its own line. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "runtime/op.h"
#include "tune/tune_db.h"
#include "tune/tune_table.h"

int rlk_op_setting_index(const rlk_op_desc *d, const char *name) {
  for (size_t i = 0; i < d->nsettings; i++)
    if (!strcmp(d->settings[i].value->name, name)) return (int)i;
  return -1;
}

/* "a|b|c" for a setting's allowed values, into buf. */
static void allowed_text(const rlk_value_decl *s, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  switch (s->kind) {
    case RLK_VALUE_INT:
      rlk_format(buf, size, "%s in [%lld, %lld]", s->pow2 ? "a power of two" : "an integer", (long long)s->min,
                 (long long)s->max);
      return;
    case RLK_VALUE_FLAG: rlk_format(buf, size, "0|1"); return;
    case RLK_VALUE_CHOICE:
      for (int64_t i = s->min; i <= s->max; i++) {
        int w = rlk_format(buf + len, size - len, "%s%s", i > s->min ? "|" : "", s->choices[i]);
        if (w < 0) return;
        len += (size_t)w;
      }
      return;
    case RLK_VALUE_DTYPE:
      /* low precision first, as trainers list them */
      for (int pass = 0; pass < 2; pass++)
        for (int dt = 1; dt < 32; dt++) {
          if (!(s->dtypes & RLK_DTYPE_BIT(dt))) continue;
          size_t bytes = rlk_dtype_size((rlk_dtype)dt);
          if ((pass == 0) != (bytes == 2)) continue;
          int w = rlk_format(buf + len, size - len, "%s%s", len ? "|" : "", rlk_dtype_name((rlk_dtype)dt));
          if (w < 0) return;
          len += (size_t)w;
        }
      return;
  }
}

rlk_status rlk_op_setting_parse(const rlk_op_setting *setting, const char *text, int64_t *value) {
  const rlk_value_decl *s = setting->value;
  char allowed[256];
  if (text && *text) switch (s->kind) {
      case RLK_VALUE_INT: {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(text, &end, 10);
        if (!errno && !*end && v >= s->min && v <= s->max && (!s->pow2 || (v > 0 && !(v & (v - 1))))) {
          *value = v;
          return RLK_OK;
        }
        break;
      }
      case RLK_VALUE_FLAG:
        if ((text[0] == '0' || text[0] == '1') && !text[1]) {
          *value = text[0] - '0';
          return RLK_OK;
        }
        break;
      case RLK_VALUE_CHOICE:
        for (int64_t i = s->min; i <= s->max; i++)
          if (!strcmp(text, s->choices[i])) {
            *value = i;
            return RLK_OK;
          }
        break;
      case RLK_VALUE_DTYPE:
        for (int dt = 1; dt < 32; dt++)
          if ((s->dtypes & RLK_DTYPE_BIT(dt)) && !strcmp(text, rlk_dtype_name((rlk_dtype)dt))) {
            *value = dt;
            return RLK_OK;
          }
        break;
    }
  allowed_text(s, allowed, sizeof allowed);
  return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: '%s' is not %s", s->name, text ? text : "(null)", allowed);
}

void rlk_op_values_init(const rlk_op_desc *d, rlk_op_values *vals) {
  memset(vals, 0, sizeof *vals);
  for (size_t i = 0; i < d->nsettings && i < RLK_OP_MAX_SETTINGS; i++) vals->v[i] = d->settings[i].def;
}

rlk_status rlk_op_values_parse(const rlk_op_desc *d, size_t npairs, const rlk_op_config_pair *pairs,
                               rlk_op_values *out) {
  if (d->nsettings > RLK_OP_MAX_SETTINGS)
    return rlk_error(RLK_ERR_INTERNAL, "%s: more than %d settings", d->name, RLK_OP_MAX_SETTINGS);
  rlk_op_values_init(d, out);
  for (size_t p = 0; p < npairs; p++) {
    const char *n = pairs[p].name, *v = pairs[p].value;
    if (!n || !v) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: NULL setting", d->name);
    int i = rlk_op_setting_index(d, n);
    if (i < 0) {
      char known[512];
      size_t len = 0;
      known[0] = '\0';
      for (size_t k = 0; k < d->nsettings; k++) {
        int w = rlk_format(known + len, sizeof known - len, "%s%s", k ? " " : "", d->settings[k].value->name);
        if (w < 0) break;
        len += (size_t)w;
      }
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: unknown setting '%s' (known: %s)", d->name, n, known);
    }
    if (RLK_OP_GIVEN(out, i)) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: given twice", n);
    rlk_status st = rlk_op_setting_parse(&d->settings[i], v, &out->v[i]);
    if (st) return st;
    out->given |= 1u << i;
  }
  return RLK_OK;
}

/* The canonical text of one value into buf; 0 when the value is an unset INT default. */
static int value_text(const rlk_value_decl *s, int64_t v, char *buf, size_t size) {
  switch (s->kind) {
    case RLK_VALUE_INT:
      if (v < s->min || v > s->max) return 0;
      rlk_format(buf, size, "%lld", (long long)v);
      return 1;
    case RLK_VALUE_FLAG: rlk_format(buf, size, "%d", v ? 1 : 0); return 1;
    case RLK_VALUE_CHOICE: rlk_format(buf, size, "%s", s->choices[v]); return 1;
    case RLK_VALUE_DTYPE: rlk_format(buf, size, "%s", rlk_dtype_name((rlk_dtype)v)); return 1;
  }
  return 0;
}

int rlk_op_values_line(const rlk_op_desc *d, const rlk_op_values *vals, char *buf, size_t size) {
  int len = rlk_format(buf, size, "%s", d->name);
  if (len < 0) return -1;
  for (size_t i = 0; i < d->nsettings; i++) {
    char v[64];
    const int given = RLK_OP_GIVEN(vals, i);
    if ((!given && vals->v[i] == d->settings[i].def) || !value_text(d->settings[i].value, vals->v[i], v, sizeof v))
      continue;
    int w = rlk_format(buf + len, size - (size_t)len, " %s=%s", d->settings[i].value->name, v);
    if (w < 0) return -1;
    len += w;
  }
  return len;
}

int rlk_op_help_text(const rlk_op_desc *d, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < d->nsettings; i++) {
    const rlk_op_setting *s = &d->settings[i];
    const rlk_value_decl *v = s->value;
    char allowed[256], def[64];
    if (v->kind == RLK_VALUE_INT)
      rlk_format(allowed, sizeof allowed, "%lld..%lld%s", (long long)v->min, (long long)v->max,
                 v->pow2 ? " (powers of two)" : "");
    else
      allowed_text(v, allowed, sizeof allowed);
    if (!value_text(v, s->def, def, sizeof def)) rlk_format(def, sizeof def, "unset");
    int w = rlk_format(buf + len, size - len, "%s: %s, %s (%s)%s\n", v->name, allowed, s->doc, def,
                       s->feeds[0] ? "" : "; no kernel parameter of its own");
    if (w < 0) return -1;
    len += (size_t)w;
  }
  if (d->note) {
    int w = rlk_format(buf + len, size - len, "%s\n", d->note);
    if (w < 0) return -1;
    len += (size_t)w;
  }
  return (int)len;
}

int rlk_op_tuning_values(const rlk_op_desc *d, const int *tuning, size_t n, const char *settings,
                         int64_t values[RLK_TUNE_VALUES]) {
  char buf[256];
  if (n > RLK_TUNE_VALUES || rlk_format(buf, sizeof buf, "%s", settings ? settings : "") < 0) return -1;
  memset(values, 0, RLK_TUNE_VALUES * sizeof *values);
  for (size_t i = 0; i < n; i++) values[i] = d->settings[tuning[i]].def;
  int rc = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, " ", &save); tok && !rc; tok = strtok_r(NULL, " ", &save)) {
    char *eq = strchr(tok, '=');
    if (!eq) {
      rc = -1;
      break;
    }
    *eq = '\0';
    size_t k = n;
    for (size_t i = 0; i < n && k == n; i++)
      if (!strcmp(tok, d->settings[tuning[i]].value->name)) k = i;
    rc = k == n || rlk_op_setting_parse(&d->settings[tuning[k]], eq + 1, &values[k]) != RLK_OK ? -1 : 0;
  }
  rlk_error_clear();
  return rc;
}

rlk_status rlk_op_planned(const rlk_kernel_spec *specs, size_t n, size_t *nspecs) {
  *nspecs = n;
  for (size_t i = 0; i < n; i++) {
    rlk_status st = rlk_spec_validate(&specs[i]);
    if (st) return st;
  }
  return RLK_OK;
}

const rlk_tune_entry *rlk_op_tuned(const rlk_context *ctx, const rlk_op_desc *d, const char *shape, int64_t tokens,
                                   rlk_tune_parse_fn parse, int64_t values[RLK_TUNE_VALUES]) {
  if (!rlk_tune_table_wanted(ctx->tune)) return NULL;
  const rlk_tune_entry *e = rlk_tune_table_find(ctx->tune, d->name, shape, rlk_tune_bucket(tokens));
  if (!e) return NULL;
  if (rlk_tune_entry_values(ctx->tune, e, parse, values) != 0) {
    if (rlk_tune_entry_first_warning(e))
      rlk_warn("%s: the tuning database's winner '%s' for %s is not %s tuning; running the default", d->name,
               rlk_tune_entry_settings(e), shape, d->name);
    return NULL;
  }
  return e;
}

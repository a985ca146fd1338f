/* template.c - parameter schemas: validation, canonical text, name expressions, defines.
 * These functions are the only way a value reaches generated code, so each one checks the
 * value against its declaration before spelling it. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "jit/template.h"

const char *rlk_dtype_cuda_type(rlk_dtype dtype) {
  switch (dtype) {
    case RLK_F32: return "float";
    case RLK_F64: return "double";
    case RLK_F16: return "rlk::f16";
    case RLK_BF16: return "rlk::bf16";
    case RLK_I32: return "int";
    case RLK_I64: return "long long";
    case RLK_BOOL: return "unsigned char";
    default: return NULL;
  }
}

const char *rlk_dtype_host_type(rlk_dtype dtype) {
  switch (dtype) {
    case RLK_F32: return "float";
    case RLK_F64: return "double";
    case RLK_F16: return "uint16_t";
    case RLK_BF16: return "uint16_t";
    case RLK_I32: return "int32_t";
    case RLK_I64: return "int64_t";
    case RLK_BOOL: return "uint8_t";
    default: return NULL;
  }
}

static size_t choice_count(const rlk_value_decl *d) {
  size_t n = 0;
  if (d->choices)
    while (d->choices[n]) n++;
  return n;
}

static rlk_status check_value(const rlk_template *t, const rlk_value_decl *d, int64_t v) {
  switch (d->kind) {
    case RLK_VALUE_INT:
      if (v < d->min || v > d->max)
        return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: parameter %s=%lld outside [%lld, %lld]",
                         t->entry, d->name, (long long)v, (long long)d->min, (long long)d->max);
      if (d->pow2 && (v <= 0 || (v & (v - 1))))
        return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: parameter %s=%lld is not a power of two",
                         t->entry, d->name, (long long)v);
      return RLK_OK;
    case RLK_VALUE_FLAG:
      if (v != 0 && v != 1)
        return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: parameter %s=%lld is not 0 or 1", t->entry,
                         d->name, (long long)v);
      return RLK_OK;
    case RLK_VALUE_DTYPE:
      if (v <= 0 || v >= 32 || !(d->dtypes & (1u << v)) || !rlk_dtype_cuda_type((rlk_dtype)v))
        return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: parameter %s: dtype %s not allowed", t->entry,
                         d->name, (v > 0 && v < 32) ? rlk_dtype_name((rlk_dtype)v) : "invalid");
      return RLK_OK;
    case RLK_VALUE_CHOICE:
      /* the declared range is a schema's own: a decl past its choices is the library's error */
      if (d->min < 0 || d->max < d->min || (size_t)d->max >= choice_count(d))
        return rlk_error(RLK_ERR_INTERNAL, "%s: parameter %s declares choices %lld to %lld of %zu", t->entry,
                         d->name, (long long)d->min, (long long)d->max, choice_count(d));
      if (v < d->min || v > d->max)
        return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: parameter %s=%lld is not a valid choice (%s to %s)",
                         t->entry, d->name, (long long)v, d->choices[d->min], d->choices[d->max]);
      return RLK_OK;
  }
  return rlk_error(RLK_ERR_INTERNAL, "%s: parameter %s has an unknown kind", t->entry, d->name);
}

rlk_status rlk_spec_validate(const rlk_kernel_spec *spec) {
  if (!spec || !spec->tmpl) return rlk_error(RLK_ERR_INTERNAL, "kernel spec without a template");
  const rlk_template *t = spec->tmpl;
  if (t->nparams > RLK_MAX_PARAMS)
    return rlk_error(RLK_ERR_INTERNAL, "%s: too many parameters", t->entry);
  for (size_t i = 0; i < t->nparams; i++) {
    if (!t->params[i]) return rlk_error(RLK_ERR_INTERNAL, "%s: parameter %zu is not declared", t->entry, i);
    rlk_status st = check_value(t, t->params[i], spec->values[i]);
    if (st) return st;
  }
  return RLK_OK;
}

/* Canonical text of one value (used in keys, metadata and tool output). */
static void value_text(const rlk_value_decl *d, int64_t v, char *buf, size_t size) {
  switch (d->kind) {
    case RLK_VALUE_DTYPE: rlk_format(buf, size, "%s", rlk_dtype_name((rlk_dtype)v)); break;
    case RLK_VALUE_CHOICE: rlk_format(buf, size, "%s", d->choices[v]); break;
    default: rlk_format(buf, size, "%lld", (long long)v); break;
  }
}

/* Indices of a template's parameters sorted by name. */
static void sorted_order(const rlk_template *t, size_t order[RLK_MAX_PARAMS]) {
  for (size_t i = 0; i < t->nparams; i++) order[i] = i;
  for (size_t i = 1; i < t->nparams; i++)
    for (size_t j = i; j > 0 && strcmp(t->params[order[j - 1]]->name, t->params[order[j]]->name) > 0; j--) {
      size_t x = order[j];
      order[j] = order[j - 1];
      order[j - 1] = x;
    }
}

/* Appends to buf at *len; returns -1 when it does not fit. */
static int append(char *buf, size_t size, size_t *len, const char *s) {
  size_t n = strlen(s);
  if (*len + n + 1 > size) return -1;
  memcpy(buf + *len, s, n + 1);
  *len += n;
  return 0;
}

rlk_status rlk_spec_params_text(const rlk_kernel_spec *spec, char *buf, size_t size) {
  rlk_status st = rlk_spec_validate(spec);
  if (st) return st;
  const rlk_template *t = spec->tmpl;
  size_t order[RLK_MAX_PARAMS];
  sorted_order(t, order);
  size_t len = 0;
  buf[0] = '\0';
  for (size_t k = 0; k < t->nparams; k++) {
    const rlk_value_decl *d = t->params[order[k]];
    char v[64], item[160];
    value_text(d, spec->values[order[k]], v, sizeof v);
    rlk_format(item, sizeof item, "%s%s=%s", k ? " " : "", d->name, v);
    if (append(buf, size, &len, item))
      return rlk_error(RLK_ERR_INTERNAL, "%s: parameter text too long", t->entry);
  }
  return RLK_OK;
}

rlk_status rlk_spec_name_expression(const rlk_kernel_spec *spec, char *buf, size_t size) {
  rlk_status st = rlk_spec_validate(spec);
  if (st) return st;
  const rlk_template *t = spec->tmpl;
  size_t len = 0;
  buf[0] = '\0';
  if (append(buf, size, &len, "rlk::") || append(buf, size, &len, t->entry))
    return rlk_error(RLK_ERR_INTERNAL, "%s: name expression too long", t->entry);
  if (t->nparams == 0) return RLK_OK;
  for (size_t i = 0; i < t->nparams; i++) {
    const rlk_value_decl *d = t->params[i];
    int64_t v = spec->values[i];
    char item[64];
    const char *sep = i ? ", " : "<";
    switch (d->kind) {
      case RLK_VALUE_DTYPE: rlk_format(item, sizeof item, "%s%s", sep, rlk_dtype_cuda_type((rlk_dtype)v)); break;
      case RLK_VALUE_FLAG: rlk_format(item, sizeof item, "%s%s", sep, v ? "true" : "false"); break;
      default: rlk_format(item, sizeof item, "%s%lld", sep, (long long)v); break;
    }
    if (append(buf, size, &len, item))
      return rlk_error(RLK_ERR_INTERNAL, "%s: name expression too long", t->entry);
  }
  if (append(buf, size, &len, ">"))
    return rlk_error(RLK_ERR_INTERNAL, "%s: name expression too long", t->entry);
  return RLK_OK;
}

rlk_status rlk_spec_host_defines(const rlk_kernel_spec *spec, char defines[][96], size_t *count) {
  rlk_status st = rlk_spec_validate(spec);
  if (st) return st;
  const rlk_template *t = spec->tmpl;
  size_t order[RLK_MAX_PARAMS];
  sorted_order(t, order);
  for (size_t k = 0; k < t->nparams; k++) {
    const rlk_value_decl *d = t->params[order[k]];
    int64_t v = spec->values[order[k]];
    char upper[64];
    size_t n = strlen(d->name);
    if (n >= sizeof upper) return rlk_error(RLK_ERR_INTERNAL, "%s: parameter name too long", t->entry);
    for (size_t i = 0; i <= n; i++) upper[i] = (char)toupper((unsigned char)d->name[i]);
    int w;
    if (d->kind == RLK_VALUE_DTYPE)
      w = rlk_format(defines[k], 96, "-DRLK_P_%s=%s", upper, rlk_dtype_host_type((rlk_dtype)v));
    else
      w = rlk_format(defines[k], 96, "-DRLK_P_%s=%lld", upper, (long long)v);
    if (w < 0) return rlk_error(RLK_ERR_INTERNAL, "%s: define too long", t->entry);
  }
  *count = t->nparams;
  return RLK_OK;
}

rlk_status rlk_param_parse(const rlk_value_decl *d, const char *text, int64_t *value) {
  if (!text || !*text) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: empty value", d->name);
  if (d->kind == RLK_VALUE_DTYPE) {
    for (int x = 1; x < 8; x++)
      if (!strcmp(text, rlk_dtype_name((rlk_dtype)x)) && (d->dtypes & (1u << x))) {
        *value = x;
        return RLK_OK;
      }
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: '%s' is not an allowed dtype", d->name, text);
  }
  if (d->kind == RLK_VALUE_CHOICE) {
    for (size_t i = 0; d->choices && d->choices[i]; i++)
      if (!strcmp(text, d->choices[i]) && (int64_t)i >= d->min && (int64_t)i <= d->max) {
        *value = (int64_t)i;
        return RLK_OK;
      }
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: '%s' is not a valid choice", d->name, text);
  }
  if (d->kind == RLK_VALUE_FLAG) {
    if (!strcmp(text, "1") || !strcmp(text, "true")) { *value = 1; return RLK_OK; }
    if (!strcmp(text, "0") || !strcmp(text, "false")) { *value = 0; return RLK_OK; }
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: '%s' is not 0 or 1", d->name, text);
  }
  char *end = NULL;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno || *end || v < d->min || v > d->max)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: '%s' is not an integer in [%lld, %lld]", d->name,
                     text, (long long)d->min, (long long)d->max);
  *value = v;
  return RLK_OK;
}

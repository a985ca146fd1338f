/* compiler.c - what the compiler implementations share: freeing results, opening, starting a
 * compile, checking requests, target lists, compile-error messages (see compiler.h and
 * compiler_impl.h). */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "jit/compiler.h"
#include "jit/compiler_impl.h"

void rlk_compile_result_free(rlk_compile_result *result) {
  if (!result) return;
  free(result->binary);
  rlk_string_list_free(result->lowered_names, result->nnames);
  free(result->log);
  memset(result, 0, sizeof *result);
}

int rlk_target_list_has(const char *list, const char *target) {
  if (!list || !target || !*target) return 0;
  size_t len = strlen(target);
  const char *p = list;
  while (*p) {
    while (*p == ' ') p++;
    const char *end = p;
    while (*end && *end != ' ') end++;
    if ((size_t)(end - p) == len && memcmp(p, target, len) == 0) return 1;
    p = end;
  }
  return 0;
}

/* Checks that an array of `n` strings is present and holds no NULL. */
static rlk_status check_strings(const char *kind, const char *what, const char *const *strings,
                                size_t n) {
  if (n && !strings) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %s is NULL", kind, what);
  for (size_t i = 0; i < n; i++)
    if (!strings[i])
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %s[%zu] is NULL", kind, what, i);
  return RLK_OK;
}

rlk_status rlk_compile_request_check(const rlk_compiler *compiler, const rlk_compile_request *req) {
  const char *kind = compiler && compiler->kind ? compiler->kind : "compiler";
  if (!compiler || !req) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: NULL argument", kind);
  if (!req->source) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: request has no source", kind);
  if (!req->target || !req->target->name[0])
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: request has no target", kind);
  rlk_status st;
  if ((st = check_strings(kind, "header_names", req->header_names, req->nheaders)) != RLK_OK ||
      (st = check_strings(kind, "header_sources", req->header_sources, req->nheaders)) != RLK_OK ||
      (st = check_strings(kind, "options", req->options, req->noptions)) != RLK_OK ||
      (st = check_strings(kind, "names", req->names, req->nnames)) != RLK_OK)
    return st;
  if (!compiler->supports_target || !compiler->supports_target(compiler, req->target))
    return rlk_error(RLK_ERR_UNSUPPORTED, "%s: cannot compile for target '%s' (it builds for: %s)",
                     compiler->id, req->target->name, compiler->targets);
  return RLK_OK;
}

rlk_status rlk_compiler_new(const char *who, const char *oom, size_t impl_size, rlk_compiler **out,
                            rlk_compiler **made) {
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: NULL output", who);
  *out = NULL;
  void *impl = calloc(1, impl_size);
  rlk_compiler *c = calloc(1, sizeof *c);
  if (!impl || !c) {
    free(impl);
    free(c);
    return rlk_error(RLK_ERR_OUT_OF_MEMORY, "%s", oom);
  }
  c->impl = impl;
  *made = c;
  return RLK_OK;
}

rlk_status rlk_compile_begin(const rlk_compiler *compiler, const char *who, const rlk_compile_request *req,
                             rlk_compile_result *out) {
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: NULL result", who);
  memset(out, 0, sizeof *out);
  return rlk_compile_request_check(compiler, req);
}

rlk_status rlk_compile_error(const rlk_compiler *compiler, const rlk_compile_request *req,
                             const char *detail, const char *log) {
  const char *kind = compiler && compiler->kind ? compiler->kind : "compiler";
  const char *source = req && req->source_name ? req->source_name : "<source>";
  const char *target = req && req->target ? req->target->name : "?";
  size_t len = log ? strlen(log) : 0;
  while (len && (log[len - 1] == '\n' || log[len - 1] == ' ' || log[len - 1] == '\r')) len--;
  int shown = len > RLK_COMPILE_LOG_EXCERPT ? RLK_COMPILE_LOG_EXCERPT : (int)len;
  char more[64] = "";
  if (len > RLK_COMPILE_LOG_EXCERPT)
    rlk_format(more, sizeof more, "\n[... %zu more bytes of log]", len - RLK_COMPILE_LOG_EXCERPT);
  int has_detail = detail && *detail;
  return rlk_error(RLK_ERR_COMPILE, "%s: %s for %s: %s%s%.*s%s", kind, source, target,
                   has_detail ? detail : "", has_detail && shown ? "\n" : "", shown,
                   log ? log : "", more);
}

char **rlk_string_list_copy(const char *const *strings, size_t n) {
  char **copy = calloc(n ? n : 1, sizeof *copy);
  if (!copy) return NULL;
  for (size_t i = 0; i < n; i++) {
    copy[i] = rlk_strdup(strings[i]);
    if (!copy[i]) {
      rlk_string_list_free(copy, i);
      return NULL;
    }
  }
  return copy;
}

void rlk_string_list_free(char **strings, size_t n) {
  if (!strings) return;
  for (size_t i = 0; i < n; i++) free(strings[i]);
  free(strings);
}

char *rlk_log_trim(char *log) {
  if (!log) return NULL;
  size_t len = strlen(log);
  while (len && (log[len - 1] == '\n' || log[len - 1] == ' ' || log[len - 1] == '\r' ||
                 log[len - 1] == '\t'))
    log[--len] = '\0';
  return log;
}

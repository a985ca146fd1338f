/* rtc.c - the compile NVRTC and hiprtc share (see rtc.h). */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "jit/compiler_impl.h"
#include "jit/rtc.h"

static rlk_rtc *rtc_of(const rlk_compiler *self) { return self->impl; }

const char *rlk_rtc_errstr(const rlk_rtc *rtc, rlk_rtc_result r) {
  const char *s = rtc->api.GetErrorString ? rtc->api.GetErrorString(r) : NULL;
  return s ? s : rtc->kind->error;
}

/* The program log as a malloc'd string (empty when there is none); NULL on allocation
 * failure. */
static char *rtc_read_log(const rlk_rtc *rtc, rlk_rtc_program prog) {
  size_t size = 0;
  if (rtc->api.GetProgramLogSize(prog, &size) != RLK_RTC_SUCCESS) size = 0;
  char *log = malloc(size + 1);
  if (!log) return NULL;
  log[0] = '\0';
  if (size && rtc->api.GetProgramLog(prog, log) != RLK_RTC_SUCCESS) log[0] = '\0';
  log[size] = '\0';
  return rlk_log_trim(log);
}

/* Everything after the program was compiled successfully: binary and lowered names. */
static rlk_status rtc_collect(rlk_compiler *self, const rlk_compile_request *req, rlk_rtc_program prog,
                              rlk_compile_result *out, const char *log) {
  const rlk_rtc *rtc = rtc_of(self);
  const char *name = rtc->kind->name;
  rlk_status st = rtc->kind->binary(self, req, prog, out, log);
  if (st != RLK_OK) return st;
  out->lowered_names = calloc(req->nnames ? req->nnames : 1, sizeof *out->lowered_names);
  if (!out->lowered_names) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "%s: lowered names", name);
  out->nnames = req->nnames;
  for (size_t i = 0; i < req->nnames; i++) {
    const char *lowered = NULL;
    rlk_rtc_result r = rtc->api.GetLoweredName(prog, req->names[i], &lowered);
    if (r != RLK_RTC_SUCCESS || !lowered || !*lowered) {
      char detail[600];
      rlk_format(detail, sizeof detail, "no lowered name for '%s' (%s)", req->names[i], rlk_rtc_errstr(rtc, r));
      return rlk_compile_error(self, req, detail, log);
    }
    /* The string belongs to the program, which is destroyed next. */
    if (!(out->lowered_names[i] = rlk_strdup(lowered)))
      return rlk_error(RLK_ERR_OUT_OF_MEMORY, "%s: lowered name", name);
  }
  return RLK_OK;
}

static rlk_status rtc_compile_locked(rlk_compiler *self, const rlk_compile_request *req,
                                     rlk_compile_result *out) {
  const rlk_rtc *rtc = rtc_of(self);
  const rlk_rtc_kind *kind = rtc->kind;
  const char *name = req->source_name ? req->source_name : kind->source_name;
  rlk_rtc_program prog = NULL;
  rlk_rtc_result r = rtc->api.CreateProgram(&prog, req->source, name, (int)req->nheaders, req->header_sources,
                                            req->header_names);
  if (r != RLK_RTC_SUCCESS) {
    char detail[64];
    rlk_format(detail, sizeof detail, "%sCreateProgram failed", kind->name);
    return rlk_compile_error(self, req, detail, rlk_rtc_errstr(rtc, r));
  }

  rlk_status st = RLK_OK;
  const char **opts = NULL;
  char *log = NULL;
  for (size_t i = 0; i < req->nnames && st == RLK_OK; i++) {
    if ((r = rtc->api.AddNameExpression(prog, req->names[i])) != RLK_RTC_SUCCESS) {
      char detail[600];
      rlk_format(detail, sizeof detail, "name expression '%s' rejected (%s)", req->names[i],
                 rlk_rtc_errstr(rtc, r));
      st = rlk_compile_error(self, req, detail, NULL);
    }
  }
  char arch[64];
  size_t nopts = self->nbase_options + req->noptions + 1;
  if (st == RLK_OK && !(opts = malloc(nopts * sizeof *opts)))
    st = rlk_error(RLK_ERR_OUT_OF_MEMORY, "%s: options", kind->name);
  if (st == RLK_OK) {
    size_t k = 0;
    for (size_t i = 0; i < self->nbase_options; i++) opts[k++] = self->base_options[i];
    for (size_t i = 0; i < req->noptions; i++) opts[k++] = req->options[i];
    rlk_format(arch, sizeof arch, "%s%s", kind->arch_option, req->target->name);
    opts[k++] = arch;
    r = rtc->api.CompileProgram(prog, (int)k, opts);
    /* The log is read whatever the outcome: warnings matter on success too. */
    log = rtc_read_log(rtc, prog);
    if (!log) {
      st = rlk_error(RLK_ERR_OUT_OF_MEMORY, "%s: program log", kind->name);
    } else if (r != RLK_RTC_SUCCESS) {
      /* A compilation error speaks through its log; anything else (a bad option) names
       * the compiler's status as well. */
      st = rlk_compile_error(self, req, r == RLK_RTC_ERROR_COMPILATION && *log ? NULL : rlk_rtc_errstr(rtc, r),
                             log);
    } else {
      st = rtc_collect(self, req, prog, out, log);
    }
  }
  rtc->api.DestroyProgram(&prog);
  free(opts);
  if (st == RLK_OK) {
    out->log = log;
  } else {
    free(log);
  }
  return st;
}

static rlk_status rtc_compile(rlk_compiler *self, const rlk_compile_request *req, rlk_compile_result *out) {
  const char *name = self && self->impl ? rtc_of(self)->kind->name : "compiler";
  /* The target check comes first, before the library is called at all (hiprtc.c says why). */
  rlk_status st = rlk_compile_begin(self, name, req, out);
  if (st != RLK_OK) return st;
  rlk_rtc *rtc = rtc_of(self);
  if (req->nheaders > (size_t)1 << 20 || req->nnames > (size_t)1 << 20)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: too many headers or names", name);
  double start = rlk_now();
  pthread_mutex_lock(&rtc->lock);
  st = rtc_compile_locked(self, req, out);
  pthread_mutex_unlock(&rtc->lock);
  if (st != RLK_OK) {
    rlk_compile_result_free(out);
    return st;
  }
  out->seconds = rlk_now() - start;
  rlk_debug("%s: %s for %s: %zu-byte %s in %.3f s", name, req->source_name ? req->source_name : rtc->kind->source_name,
            req->target->name, out->size, rtc->kind->binary_noun, out->seconds);
  return RLK_OK;
}

rlk_status rlk_rtc_new(const rlk_rtc_kind *kind, size_t impl_size, rlk_compiler **out, rlk_compiler **made) {
  char what[32];
  rlk_format(what, sizeof what, "%s: compiler", kind->name);
  rlk_compiler *c = NULL;
  rlk_status st = rlk_compiler_new(kind->name, what, impl_size, out, &c);
  if (st != RLK_OK) return st;
  rlk_rtc *rtc = c->impl;
  if (pthread_mutex_init(&rtc->lock, NULL) != 0) {
    free(rtc);
    free(c);
    return rlk_error(RLK_ERR_INTERNAL, "%s: mutex", kind->name);
  }
  rtc->kind = kind;
  c->destroy = rlk_rtc_destroy;
  c->compile = rtc_compile;
  *made = c;
  return RLK_OK;
}

void rlk_rtc_set_version(rlk_compiler *c) {
  const rlk_rtc *rtc = rtc_of(c);
  c->kind = rtc->kind->name;
  rlk_format(c->version, sizeof c->version, "%d.%d", rtc->major, rtc->minor);
  rlk_format(c->id, sizeof c->id, "%s-%d.%d", rtc->kind->name, rtc->major, rtc->minor);
}

rlk_status rlk_rtc_ready(rlk_compiler *c, rlk_compiler **out) {
  const rlk_rtc *rtc = rtc_of(c);
  rlk_info("%s: %s from %s; targets %s", rtc->kind->name, c->id, rtc->lib.path, c->targets);
  *out = c;
  return RLK_OK;
}

void rlk_rtc_destroy(rlk_compiler *self) {
  if (!self) return;
  rlk_rtc *rtc = self->impl;
  if (rtc) {
    pthread_mutex_destroy(&rtc->lock);
    rlk_dynlib_close(&rtc->lib);
    free(rtc);
  }
  free(self);
}

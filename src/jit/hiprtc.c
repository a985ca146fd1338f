/* hiprtc.c - the HIP compiler: hiprtc from ROCm, opened with dlopen. On ROCm 5.x it lives in
 * libamdhip64, later releases also ship it as libhiprtc. Targets are limited to a list known
 * to compile with the loaded major version: asking ROCm 5.2 for gfx942 crashes the process,
 * so an unknown target is refused before the compiler ever sees it. */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "jit/compiler.h"
#include "jit/compiler_impl.h"
#include "core/dynlib.h"

/* The part of the hiprtc API used here, declared locally (no ROCm headers needed). */
typedef int hr_result;
typedef struct hr_program_s *hr_program;
#define HR_SUCCESS 0
#define HR_ERROR_COMPILATION 6

typedef struct hr_api {
  const char *(*GetErrorString)(hr_result); /* optional */
  hr_result (*Version)(int *, int *);
  hr_result (*CreateProgram)(hr_program *, const char *, const char *, int, const char *const *,
                             const char *const *);
  hr_result (*DestroyProgram)(hr_program *);
  hr_result (*CompileProgram)(hr_program, int, const char *const *);
  hr_result (*GetCodeSize)(hr_program, size_t *);
  hr_result (*GetCode)(hr_program, char *);
  hr_result (*GetProgramLogSize)(hr_program, size_t *);
  hr_result (*GetProgramLog)(hr_program, char *);
  hr_result (*AddNameExpression)(hr_program, const char *);
  hr_result (*GetLoweredName)(hr_program, const char *, const char **);
  int (*RuntimeGetVersion)(int *); /* optional: hipRuntimeGetVersion, libamdhip64 only */
} hr_api;

typedef struct hr_impl {
  rlk_dynlib lib;
  hr_api api;
  int major, minor;
  pthread_mutex_t lock; /* one compile at a time: hiprtc's thread safety varies by release */
} hr_impl;

/* Targets known to compile with each ROCm major version. The newest list also serves later
 * majors (with a warning). */
static const struct {
  int major;
  const char *targets;
} hr_known[] = {
    {5, "gfx900 gfx906 gfx908 gfx90a gfx1030"},
    {6, "gfx900 gfx906 gfx908 gfx90a gfx940 gfx941 gfx942 gfx1030 gfx1100 gfx1101 gfx1102"},
    {7, "gfx906 gfx908 gfx90a gfx942 gfx950 gfx1030 gfx1100 gfx1101 gfx1102 gfx1200 gfx1201"},
};

static const char *hr_errstr(const hr_impl *impl, hr_result r) {
  const char *s = impl->api.GetErrorString ? impl->api.GetErrorString(r) : NULL;
  return s ? s : "hiprtc error";
}

/* A known architecture of this ROCm (the parser has dropped the features a device reports). */
static int hr_supports_target(const rlk_compiler *self, const rlk_target *target) {
  return target && target->kind == RLK_BACKEND_HIP && rlk_target_list_has(self->targets, target->name);
}

static void hr_destroy(rlk_compiler *self) {
  if (!self) return;
  hr_impl *impl = self->impl;
  if (impl) {
    pthread_mutex_destroy(&impl->lock);
    rlk_dynlib_close(&impl->lib);
    free(impl);
  }
  free(self);
}

static char *hr_read_log(const hr_impl *impl, hr_program prog) {
  size_t size = 0;
  if (impl->api.GetProgramLogSize(prog, &size) != HR_SUCCESS) size = 0;
  char *log = malloc(size + 1);
  if (!log) return NULL;
  log[0] = '\0';
  if (size && impl->api.GetProgramLog(prog, log) != HR_SUCCESS) log[0] = '\0';
  log[size] = '\0';
  return rlk_log_trim(log);
}

static rlk_status hr_collect(rlk_compiler *self, const rlk_compile_request *req, hr_program prog,
                             rlk_compile_result *out, const char *log) {
  hr_impl *impl = self->impl;
  size_t size = 0;
  hr_result r = impl->api.GetCodeSize(prog, &size);
  if (r != HR_SUCCESS) return rlk_compile_error(self, req, hr_errstr(impl, r), log);
  if (size == 0) return rlk_compile_error(self, req, "hiprtc produced no code object", log);
  out->binary = malloc(size);
  if (!out->binary) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "hiprtc: %zu-byte code object", size);
  if ((r = impl->api.GetCode(prog, out->binary)) != HR_SUCCESS)
    return rlk_compile_error(self, req, hr_errstr(impl, r), log);
  out->size = size;
  out->binary_name = "kernel.hsaco";
  out->lowered_names = calloc(req->nnames ? req->nnames : 1, sizeof *out->lowered_names);
  if (!out->lowered_names) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "hiprtc: lowered names");
  out->nnames = req->nnames;
  for (size_t i = 0; i < req->nnames; i++) {
    const char *lowered = NULL;
    r = impl->api.GetLoweredName(prog, req->names[i], &lowered);
    if (r != HR_SUCCESS || !lowered || !*lowered) {
      char detail[600];
      rlk_format(detail, sizeof detail, "no lowered name for '%s' (%s)", req->names[i],
                 hr_errstr(impl, r));
      return rlk_compile_error(self, req, detail, log);
    }
    if (!(out->lowered_names[i] = rlk_strdup(lowered)))
      return rlk_error(RLK_ERR_OUT_OF_MEMORY, "hiprtc: lowered name");
  }
  return RLK_OK;
}

static rlk_status hr_compile_locked(rlk_compiler *self, const rlk_compile_request *req,
                                    rlk_compile_result *out) {
  hr_impl *impl = self->impl;
  const char *name = req->source_name ? req->source_name : "kernel.hip";
  hr_program prog = NULL;
  hr_result r = impl->api.CreateProgram(&prog, req->source, name, (int)req->nheaders,
                                        req->header_sources, req->header_names);
  if (r != HR_SUCCESS)
    return rlk_compile_error(self, req, "hiprtcCreateProgram failed", hr_errstr(impl, r));
  rlk_status st = RLK_OK;
  const char **opts = NULL;
  char *log = NULL;
  for (size_t i = 0; i < req->nnames && st == RLK_OK; i++) {
    if ((r = impl->api.AddNameExpression(prog, req->names[i])) != HR_SUCCESS) {
      char detail[600];
      rlk_format(detail, sizeof detail, "name expression '%s' rejected (%s)", req->names[i],
                 hr_errstr(impl, r));
      st = rlk_compile_error(self, req, detail, NULL);
    }
  }
  char arch[64];
  size_t nopts = self->nbase_options + req->noptions + 1;
  if (st == RLK_OK && !(opts = malloc(nopts * sizeof *opts)))
    st = rlk_error(RLK_ERR_OUT_OF_MEMORY, "hiprtc: options");
  if (st == RLK_OK) {
    size_t k = 0;
    for (size_t i = 0; i < self->nbase_options; i++) opts[k++] = self->base_options[i];
    for (size_t i = 0; i < req->noptions; i++) opts[k++] = req->options[i];
    /* Compulsory: without it hiprtc asks the (absent) device for its architecture. */
    rlk_format(arch, sizeof arch, "--gpu-architecture=%s", req->target->name);
    opts[k++] = arch;
    r = impl->api.CompileProgram(prog, (int)k, opts);
    log = hr_read_log(impl, prog);
    if (!log)
      st = rlk_error(RLK_ERR_OUT_OF_MEMORY, "hiprtc: program log");
    else if (r != HR_SUCCESS)
      st = rlk_compile_error(self, req, r == HR_ERROR_COMPILATION && *log ? NULL : hr_errstr(impl, r),
                             log);
    else
      st = hr_collect(self, req, prog, out, log);
  }
  impl->api.DestroyProgram(&prog);
  free(opts);
  if (st == RLK_OK)
    out->log = log;
  else
    free(log);
  return st;
}

static rlk_status hr_compile(rlk_compiler *self, const rlk_compile_request *req,
                             rlk_compile_result *out) {
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hiprtc: NULL result");
  memset(out, 0, sizeof *out);
  /* The target check comes first, before hiprtc is called at all (see the file comment). */
  rlk_status st = rlk_compile_request_check(self, req);
  if (st != RLK_OK) return st;
  if (req->nheaders > (size_t)1 << 20 || req->nnames > (size_t)1 << 20)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hiprtc: too many headers or names");
  hr_impl *impl = self->impl;
  double start = rlk_now();
  pthread_mutex_lock(&impl->lock);
  st = hr_compile_locked(self, req, out);
  pthread_mutex_unlock(&impl->lock);
  if (st != RLK_OK) {
    rlk_compile_result_free(out);
    return st;
  }
  out->seconds = rlk_now() - start;
  rlk_debug("hiprtc: %s for %s: %zu-byte code object in %.3f s",
            req->source_name ? req->source_name : "kernel.hip", req->target->name, out->size, out->seconds);
  return RLK_OK;
}

/* "libamdhip64.so.5.2.21153" -> 5, 2 from the file the loader actually opened (symlinks
 * resolved). Returns 0 when the name carries no version. */
static int hr_version_from_file(void *handle, int *major, int *minor) {
  struct link_map *map = NULL;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || !map || !map->l_name || !*map->l_name) return 0;
  char real[PATH_MAX];
  if (!realpath(map->l_name, real)) return 0;
  const char *so = strstr(real, ".so.");
  if (!so) return 0;
  char *end = NULL;
  long a = strtol(so + 4, &end, 10);
  if (end == so + 4 || a <= 0 || a > 99) return 0;
  long b = 0;
  if (*end == '.') b = strtol(end + 1, NULL, 10);
  if (b < 0 || b > 99) b = 0;
  *major = (int)a;
  *minor = (int)b;
  return 1;
}

/* The ROCm release of the loaded library. hiprtcVersion is not it on every release (ROCm 5.2
 * answers 9.0), so the versioned file name comes first (no side effects), then the runtime's
 * own version where the library has one, then hiprtcVersion when it looks like a release. */
static rlk_status hr_version(hr_impl *impl) {
  if (hr_version_from_file(impl->lib.handle, &impl->major, &impl->minor)) return RLK_OK;
  int v = 0;
  if (impl->api.RuntimeGetVersion && impl->api.RuntimeGetVersion(&v) == 0 && v >= 10000000) {
    impl->major = v / 10000000;
    impl->minor = v / 100000 % 100;
    return RLK_OK;
  }
  int a = 0, b = 0;
  if (impl->api.Version(&a, &b) == HR_SUCCESS && a >= 5 && a <= 8) {
    impl->major = a;
    impl->minor = b;
    return RLK_OK;
  }
  return rlk_error(RLK_ERR_UNAVAILABLE, "hiprtc: cannot tell the ROCm version of %s", impl->lib.path);
}

rlk_status rlk_hiprtc_open(rlk_compiler **out) {
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hiprtc: NULL output");
  *out = NULL;
  hr_impl *impl = calloc(1, sizeof *impl);
  rlk_compiler *c = calloc(1, sizeof *c);
  if (!impl || !c) {
    free(impl);
    free(c);
    return rlk_error(RLK_ERR_OUT_OF_MEMORY, "hiprtc: compiler");
  }
  if (pthread_mutex_init(&impl->lock, NULL) != 0) {
    free(impl);
    free(c);
    return rlk_error(RLK_ERR_INTERNAL, "hiprtc: mutex");
  }
  c->impl = impl;
  c->destroy = hr_destroy;

  hr_api *a = &impl->api;
  const rlk_dynlib_symbol symbols[] = {
      {"hiprtcGetErrorString", &a->GetErrorString, 1},
      {"hiprtcVersion", &a->Version, 0},
      {"hiprtcCreateProgram", &a->CreateProgram, 0},
      {"hiprtcDestroyProgram", &a->DestroyProgram, 0},
      {"hiprtcCompileProgram", &a->CompileProgram, 0},
      {"hiprtcGetCodeSize", &a->GetCodeSize, 0},
      {"hiprtcGetCode", &a->GetCode, 0},
      {"hiprtcGetProgramLogSize", &a->GetProgramLogSize, 0},
      {"hiprtcGetProgramLog", &a->GetProgramLog, 0},
      {"hiprtcAddNameExpression", &a->AddNameExpression, 0},
      {"hiprtcGetLoweredName", &a->GetLoweredName, 0},
      {"hipRuntimeGetVersion", &a->RuntimeGetVersion, 1},
  };
  /* RLK_HIP_LIB alone when set; else newest release first. Within a release the runtime
   * comes first (it carries hiprtc up to ROCm 5.x), then hiprtc's own library; a library
   * without the hiprtc symbols is skipped. */
  static const char *const defaults[] = {
      "libamdhip64.so.7", "libhiprtc.so.7", "libamdhip64.so.6", "libhiprtc.so.6",
      "libamdhip64.so.5", "libhiprtc.so.5", "libamdhip64.so",   "libhiprtc.so",
      "/opt/rocm/lib/libamdhip64.so", "/opt/rocm/lib/libhiprtc.so",
  };
  const char *explicit_lib = rlk_env("RLK_HIP_LIB");
  const char *const *list = explicit_lib ? &explicit_lib : defaults;
  size_t n = explicit_lib ? 1 : sizeof defaults / sizeof defaults[0];
  rlk_status st = rlk_dynlib_open(&impl->lib, "hiprtc", list, n, symbols,
                                  sizeof symbols / sizeof symbols[0]);
  if (st != RLK_OK) {
    hr_destroy(c);
    return rlk_error_wrap(st, "hiprtc unavailable (set RLK_HIP_LIB)");
  }
  if ((st = hr_version(impl)) != RLK_OK) {
    hr_destroy(c);
    return st;
  }
  if (impl->major < 5) {
    st = rlk_error(RLK_ERR_UNAVAILABLE, "hiprtc: %s is ROCm %d.%d; rlk needs ROCm 5 or later",
                   impl->lib.path, impl->major, impl->minor);
    hr_destroy(c);
    return st;
  }
  size_t pick = 0;
  for (size_t i = 0; i < sizeof hr_known / sizeof hr_known[0]; i++)
    if (hr_known[i].major <= impl->major) pick = i;
  if (impl->major > hr_known[pick].major)
    rlk_warn("hiprtc: ROCm %d.%d is newer than rlk knows; using the ROCm %d target list",
             impl->major, impl->minor, hr_known[pick].major);

  c->kind = "hiprtc";
  rlk_format(c->version, sizeof c->version, "%d.%d", impl->major, impl->minor);
  rlk_format(c->id, sizeof c->id, "hiprtc-%d.%d", impl->major, impl->minor);
  rlk_format(c->targets, sizeof c->targets, "%s", hr_known[pick].targets);
  c->compile = hr_compile;
  c->supports_target = hr_supports_target;
  /* Base options, part of every key: the dialect, full optimization (hiprtc's default
   * differs across releases), and the macro the prelude uses to select its HIP side. */
  c->base_options[0] = "-std=c++17";
  c->base_options[1] = "-O3";
  c->base_options[2] = "-DRLK_HIPRTC=1";
  /* The templates assume 64-lane wavefronts on AMD (RLK_WARP_SIZE); RDNA targets default to
   * 32, so every target is compiled in wave64 mode (the prelude checks it at compile time). */
  c->base_options[3] = "-mwavefrontsize64";
  c->nbase_options = 4;
  rlk_info("hiprtc: %s from %s; targets %s", c->id, impl->lib.path, c->targets);
  *out = c;
  return RLK_OK;
}

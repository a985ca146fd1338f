/* hiprtc.c - the HIP compiler: hiprtc from ROCm, opened with dlopen. On ROCm 5.x it lives in
 * libamdhip64, later releases also ship it as libhiprtc. Targets are limited to a list known
 * to compile with the loaded major version: asking ROCm 5.2 for gfx942 crashes the process,
 * so an unknown target is refused before the compiler ever sees it. */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "jit/compiler.h"
#include "jit/compiler_impl.h"
#include "jit/rtc.h"

/* The part of the hiprtc API used here beyond what NVRTC shares (rtc.h), declared locally (no
 * ROCm headers needed). */
typedef rlk_rtc_result hr_result;
typedef rlk_rtc_program hr_program;
#define HR_SUCCESS RLK_RTC_SUCCESS

typedef struct hr_api {
  hr_result (*Version)(int *, int *);
  hr_result (*GetCodeSize)(hr_program, size_t *);
  hr_result (*GetCode)(hr_program, char *);
  int (*RuntimeGetVersion)(int *); /* optional: hipRuntimeGetVersion, libamdhip64 only */
} hr_api;

typedef struct hr_impl {
  rlk_rtc rtc; /* the library, the shared functions (GetErrorString optional), the version, the lock */
  hr_api api;
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

static const char *hr_errstr(const hr_impl *impl, hr_result r) { return rlk_rtc_errstr(&impl->rtc, r); }

/* A known architecture of this ROCm (the parser has dropped the features a device reports). */
static int hr_supports_target(const rlk_compiler *self, const rlk_target *target) {
  return target && target->kind == RLK_BACKEND_HIP && rlk_target_list_has(self->targets, target->name);
}

/* A compiled program's code object. */
static rlk_status hr_binary(rlk_compiler *self, const rlk_compile_request *req, hr_program prog,
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
  return RLK_OK;
}

/* The target option is compulsory: without it hiprtc asks the (absent) device for its
 * architecture. */
static const rlk_rtc_kind hr_kind = {.name = "hiprtc", .error = "hiprtc error", .source_name = "kernel.hip",
                                     .arch_option = "--gpu-architecture=", .binary_noun = "code object",
                                     .binary = hr_binary};

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
  rlk_rtc *rtc = &impl->rtc;
  if (hr_version_from_file(rtc->lib.handle, &rtc->major, &rtc->minor)) return RLK_OK;
  int v = 0;
  if (impl->api.RuntimeGetVersion && impl->api.RuntimeGetVersion(&v) == 0 && v >= 10000000) {
    rtc->major = v / 10000000;
    rtc->minor = v / 100000 % 100;
    return RLK_OK;
  }
  int a = 0, b = 0;
  if (impl->api.Version(&a, &b) == HR_SUCCESS && a >= 5 && a <= 8) {
    rtc->major = a;
    rtc->minor = b;
    return RLK_OK;
  }
  return rlk_error(RLK_ERR_UNAVAILABLE, "hiprtc: cannot tell the ROCm version of %s", rtc->lib.path);
}

rlk_status rlk_hiprtc_open(rlk_compiler **out) {
  rlk_compiler *c = NULL;
  rlk_status st = rlk_rtc_new(&hr_kind, sizeof(hr_impl), out, &c);
  if (st != RLK_OK) return st;
  hr_impl *impl = c->impl;
  rlk_rtc *rtc = &impl->rtc;
  rlk_rtc_api *s = &rtc->api;
  hr_api *a = &impl->api;
  const rlk_dynlib_symbol symbols[] = {
      {"hiprtcGetErrorString", &s->GetErrorString, 1},
      {"hiprtcVersion", &a->Version, 0},
      {"hiprtcCreateProgram", &s->CreateProgram, 0},
      {"hiprtcDestroyProgram", &s->DestroyProgram, 0},
      {"hiprtcCompileProgram", &s->CompileProgram, 0},
      {"hiprtcGetCodeSize", &a->GetCodeSize, 0},
      {"hiprtcGetCode", &a->GetCode, 0},
      {"hiprtcGetProgramLogSize", &s->GetProgramLogSize, 0},
      {"hiprtcGetProgramLog", &s->GetProgramLog, 0},
      {"hiprtcAddNameExpression", &s->AddNameExpression, 0},
      {"hiprtcGetLoweredName", &s->GetLoweredName, 0},
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
  st = rlk_dynlib_open(&rtc->lib, "hiprtc", list, n, symbols, sizeof symbols / sizeof symbols[0]);
  if (st != RLK_OK) {
    rlk_rtc_destroy(c);
    return rlk_error_wrap(st, "hiprtc unavailable (set RLK_HIP_LIB)");
  }
  if ((st = hr_version(impl)) != RLK_OK) {
    rlk_rtc_destroy(c);
    return st;
  }
  if (rtc->major < 5) {
    st = rlk_error(RLK_ERR_UNAVAILABLE, "hiprtc: %s is ROCm %d.%d; rlk needs ROCm 5 or later",
                   rtc->lib.path, rtc->major, rtc->minor);
    rlk_rtc_destroy(c);
    return st;
  }
  size_t pick = 0;
  for (size_t i = 0; i < sizeof hr_known / sizeof hr_known[0]; i++)
    if (hr_known[i].major <= rtc->major) pick = i;
  if (rtc->major > hr_known[pick].major)
    rlk_warn("hiprtc: ROCm %d.%d is newer than rlk knows; using the ROCm %d target list",
             rtc->major, rtc->minor, hr_known[pick].major);

  rlk_rtc_set_version(c);
  rlk_format(c->targets, sizeof c->targets, "%s", hr_known[pick].targets);
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
  return rlk_rtc_ready(c, out);
}

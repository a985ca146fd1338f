/* nvrtc.c - the CUDA compiler: NVRTC 12 or 13, opened with dlopen so the library builds and
 * runs without the CUDA toolkit. Templates are instantiated through name expressions and
 * compiled straight to a CUBIN for one real architecture (sm_XX, sm_XXa, sm_XXf), or to PTX for
 * a virtual one (compute_XX[a|f]), which the driver compiles when it loads it. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/target.h"
#include "jit/compiler.h"
#include "jit/compiler_impl.h"
#include "jit/rtc.h"

/* The part of the NVRTC API used here beyond what hiprtc shares (rtc.h), declared locally
 * (nvrtc.h is not needed to build). */
typedef rlk_rtc_result nv_result;
typedef rlk_rtc_program nv_program;
#define NV_SUCCESS RLK_RTC_SUCCESS

typedef struct nv_api {
  nv_result (*Version)(int *, int *);
  nv_result (*GetNumSupportedArchs)(int *);
  nv_result (*GetSupportedArchs)(int *);
  nv_result (*GetCUBINSize)(nv_program, size_t *);
  nv_result (*GetCUBIN)(nv_program, char *);
  nv_result (*GetPTXSize)(nv_program, size_t *);
  nv_result (*GetPTX)(nv_program, char *);
} nv_api;

typedef struct nv_impl {
  rlk_rtc rtc; /* the library, the shared functions, the version, the lock */
  nv_api api;
  int archs[256]; /* the compute capabilities x 10 it compiles for */
  int narchs;
  int family;     /* it knows the family forms (sm_100f: NVRTC 12.9 and later) */
} nv_impl;

static const char *nv_errstr(const nv_impl *impl, nv_result r) { return rlk_rtc_errstr(&impl->rtc, r); }

/* Does this NVRTC accept `option`? Older 12.x releases lack some options; compiling an
 * empty program with it answers without guessing from version numbers. */
static int nv_accepts_option(const nv_impl *impl, const char *option) {
  nv_program prog = NULL;
  if (impl->rtc.api.CreateProgram(&prog, "\n", "rlk_probe.cu", 0, NULL, NULL) != NV_SUCCESS)
    return 0;
  const char *opts[1] = {option};
  nv_result r = impl->rtc.api.CompileProgram(prog, 1, opts);
  impl->rtc.api.DestroyProgram(&prog);
  if (r != NV_SUCCESS) rlk_debug("nvrtc: option %s is not available (%s)", option, nv_errstr(impl, r));
  return r == NV_SUCCESS;
}

/* Appends " word" to the targets list; fails when the list is full. */
static rlk_status nv_add_target(rlk_compiler *c, const char *word) {
  size_t len = strlen(c->targets);
  if (rlk_format(c->targets + len, sizeof c->targets - len, "%s%s", len ? " " : "", word) < 0)
    return rlk_error(RLK_ERR_INTERNAL, "nvrtc: target list too long");
  return RLK_OK;
}

static int nv_supports_target(const rlk_compiler *self, const rlk_target *t) {
  const nv_impl *impl = self->impl;
  if (!t || t->kind != RLK_BACKEND_CUDA) return 0;
  const int sm = rlk_target_cuda_sm(t);
  int listed = 0;
  for (int i = 0; i < impl->narchs; i++) listed |= impl->archs[i] == sm;
  return listed && rlk_target_cuda_has_variant(sm, t->variant) && (t->variant != 'f' || impl->family);
}

/* The archs NVRTC lists, and every target of them it takes (named by rlk_target_name). */
static rlk_status nv_fill_targets(rlk_compiler *c, nv_impl *impl) {
  int n = 0;
  nv_result r = impl->api.GetNumSupportedArchs(&n);
  if (r != NV_SUCCESS || n <= 0 || n > 256)
    return rlk_error(RLK_ERR_UNAVAILABLE, "nvrtc: cannot list supported architectures (%s)",
                     nv_errstr(impl, r));
  r = impl->api.GetSupportedArchs(impl->archs);
  if (r != NV_SUCCESS)
    return rlk_error(RLK_ERR_UNAVAILABLE, "nvrtc: cannot list supported architectures (%s)",
                     nv_errstr(impl, r));
  impl->narchs = n;
  impl->family = impl->rtc.major > 12 || (impl->rtc.major == 12 && impl->rtc.minor >= 9);
  c->targets[0] = '\0';
  static const char variants[] = {0, 'a', 'f'};
  for (int i = 0; i < n; i++)
    for (int ptx = 0; ptx < 2; ptx++)
      for (size_t v = 0; v < sizeof variants; v++) {
        rlk_target t;
        memset(&t, 0, sizeof t);
        t.kind = RLK_BACKEND_CUDA;
        t.major = impl->archs[i] / 10;
        t.minor = impl->archs[i] % 10;
        t.variant = variants[v];
        t.ptx = ptx;
        char word[32];
        if (!nv_supports_target(c, &t) || rlk_target_name(&t, word, sizeof word) < 0) continue;
        rlk_status st = nv_add_target(c, word);
        if (st != RLK_OK) return st;
      }
  return RLK_OK;
}

/* A compiled program's binary: a virtual target's code is PTX (NUL-terminated text, as the
 * driver reads it); a real one's a CUBIN. */
static rlk_status nv_binary(rlk_compiler *self, const rlk_compile_request *req, nv_program prog,
                            rlk_compile_result *out, const char *log) {
  nv_impl *impl = self->impl;
  const int ptx = req->target->ptx;
  size_t size = 0;
  nv_result r = ptx ? impl->api.GetPTXSize(prog, &size) : impl->api.GetCUBINSize(prog, &size);
  if (r != NV_SUCCESS) return rlk_compile_error(self, req, nv_errstr(impl, r), log);
  if (size == 0) return rlk_compile_error(self, req, ptx ? "NVRTC produced no PTX" : "NVRTC produced no CUBIN", log);
  out->binary = malloc(size);
  if (!out->binary) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "nvrtc: %zu-byte %s", size, ptx ? "PTX" : "cubin");
  if ((r = ptx ? impl->api.GetPTX(prog, out->binary) : impl->api.GetCUBIN(prog, out->binary)) != NV_SUCCESS)
    return rlk_compile_error(self, req, nv_errstr(impl, r), log);
  out->size = size;
  out->binary_name = ptx ? "kernel.ptx" : "kernel.cubin";
  return RLK_OK;
}

static const rlk_rtc_kind nv_kind = {.name = "nvrtc", .error = "NVRTC error", .source_name = "kernel.cu",
                                     .arch_option = "-arch=", .binary_noun = "cubin", .binary = nv_binary};

/* Fills the candidate list: RLK_NVRTC_LIB alone when set (an explicit choice that fails
 * must not fall back silently), else the toolkit directories, then the loader path. */
static size_t nv_candidates(char paths[][512], size_t max, const char **list) {
  size_t n = 0;
  const char *explicit_lib = rlk_env("RLK_NVRTC_LIB");
  if (explicit_lib) {
    list[n] = explicit_lib; /* as given: a copy cut to paths[]' size would name another file */
    return 1;
  }
  const char *homes[3] = {rlk_env("RLK_CUDA_HOME"), rlk_env("CUDA_HOME"), "/usr/local/cuda"};
  static const char *const sonames[] = {"libnvrtc.so.13", "libnvrtc.so.12"};
  static const char *const libdirs[] = {"lib64", "lib"};
  for (size_t h = 0; h < 3; h++) {
    if (!homes[h]) continue;
    for (size_t d = 0; d < 2; d++)
      for (size_t s = 0; s < 2 && n + 2 < max; s++) {
        if (rlk_format(paths[n], 512, "%s/%s/%s", homes[h], libdirs[d], sonames[s]) < 0) continue;
        list[n] = paths[n];
        n++;
      }
  }
  for (size_t s = 0; s < 2 && n < max; s++) list[n++] = sonames[s];
  return n;
}

rlk_status rlk_nvrtc_open(rlk_compiler **out) {
  rlk_compiler *c = NULL;
  rlk_status st = rlk_rtc_new(&nv_kind, sizeof(nv_impl), out, &c);
  if (st != RLK_OK) return st;
  nv_impl *impl = c->impl;
  rlk_rtc_api *s = &impl->rtc.api;
  nv_api *a = &impl->api;
  const rlk_dynlib_symbol symbols[] = {
      {"nvrtcGetErrorString", &s->GetErrorString, 0},
      {"nvrtcVersion", &a->Version, 0},
      {"nvrtcGetNumSupportedArchs", &a->GetNumSupportedArchs, 0},
      {"nvrtcGetSupportedArchs", &a->GetSupportedArchs, 0},
      {"nvrtcCreateProgram", &s->CreateProgram, 0},
      {"nvrtcDestroyProgram", &s->DestroyProgram, 0},
      {"nvrtcCompileProgram", &s->CompileProgram, 0},
      {"nvrtcGetCUBINSize", &a->GetCUBINSize, 0},
      {"nvrtcGetCUBIN", &a->GetCUBIN, 0},
      {"nvrtcGetPTXSize", &a->GetPTXSize, 0},
      {"nvrtcGetPTX", &a->GetPTX, 0},
      {"nvrtcGetProgramLogSize", &s->GetProgramLogSize, 0},
      {"nvrtcGetProgramLog", &s->GetProgramLog, 0},
      {"nvrtcAddNameExpression", &s->AddNameExpression, 0},
      {"nvrtcGetLoweredName", &s->GetLoweredName, 0},
  };
  char paths[16][512];
  const char *list[16];
  size_t n = nv_candidates(paths, 16, list);
  st = rlk_dynlib_open(&impl->rtc.lib, "nvrtc", list, n, symbols, sizeof symbols / sizeof symbols[0]);
  if (st != RLK_OK) {
    rlk_rtc_destroy(c);
    return rlk_error_wrap(st, "nvrtc unavailable (set RLK_NVRTC_LIB or RLK_CUDA_HOME)");
  }
  nv_result r = a->Version(&impl->rtc.major, &impl->rtc.minor);
  if (r != NV_SUCCESS) {
    st = rlk_error(RLK_ERR_UNAVAILABLE, "nvrtc: %s: nvrtcVersion failed (%s)", impl->rtc.lib.path,
                   nv_errstr(impl, r));
    rlk_rtc_destroy(c);
    return st;
  }
  if (impl->rtc.major != 12 && impl->rtc.major != 13) {
    st = rlk_error(RLK_ERR_UNAVAILABLE, "nvrtc: %s is version %d.%d; rlk needs NVRTC 12 or 13",
                   impl->rtc.lib.path, impl->rtc.major, impl->rtc.minor);
    rlk_rtc_destroy(c);
    return st;
  }
  rlk_rtc_set_version(c);
  c->supports_target = nv_supports_target;
  if ((st = nv_fill_targets(c, impl)) != RLK_OK) {
    rlk_rtc_destroy(c);
    return st;
  }

  /* Base options, part of every key:
   *   --std=c++17            the dialect the templates are written in (not left to a default)
   *   -default-device        unannotated functions are device functions (prelude helpers)
   *   --no-source-include    only the in-memory headers can be included, never a file that
   *                          happens to sit in the working directory
   *   --no-cache             NVRTC 12.9+ keeps its own cache; rlk's cache is the only one
   *   -DRLK_NVRTC=1          lets the prelude tell NVRTC from hiprtc
   * NVRTC 13 has all of them; older 12.x releases are asked. */
  size_t k = 0;
  c->base_options[k++] = "--std=c++17";
  c->base_options[k++] = "-default-device";
  if (impl->rtc.major >= 13 || nv_accepts_option(impl, "--no-source-include"))
    c->base_options[k++] = "--no-source-include";
  if (impl->rtc.major >= 13 || (impl->rtc.minor >= 9 && nv_accepts_option(impl, "--no-cache")))
    c->base_options[k++] = "--no-cache";
  c->base_options[k++] = "-DRLK_NVRTC=1";
  c->nbase_options = k;

  return rlk_rtc_ready(c, out);
}

/* nvrtc.c - the CUDA compiler: NVRTC 12 or 13, opened with dlopen so the library builds and
 * runs without the CUDA toolkit. Templates are instantiated through name expressions and
 * compiled straight to a CUBIN for one real architecture (sm_XX, sm_XXa, sm_XXf), or to PTX for
 * a virtual one (compute_XX[a|f]), which the driver compiles when it loads it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/target.h"
#include "jit/compiler.h"
#include "jit/compiler_impl.h"
#include "core/dynlib.h"

/* The part of the NVRTC API used here, declared locally (nvrtc.h is not needed to build).
 * nvrtcResult is a C enum, passed as int; a program is an opaque pointer. */
typedef int nv_result;
typedef struct nv_program_s *nv_program;
#define NV_SUCCESS 0
#define NV_ERROR_INVALID_OPTION 5
#define NV_ERROR_COMPILATION 6

typedef struct nv_api {
  const char *(*GetErrorString)(nv_result);
  nv_result (*Version)(int *, int *);
  nv_result (*GetNumSupportedArchs)(int *);
  nv_result (*GetSupportedArchs)(int *);
  nv_result (*CreateProgram)(nv_program *, const char *, const char *, int, const char *const *,
                             const char *const *);
  nv_result (*DestroyProgram)(nv_program *);
  nv_result (*CompileProgram)(nv_program, int, const char *const *);
  nv_result (*GetCUBINSize)(nv_program, size_t *);
  nv_result (*GetCUBIN)(nv_program, char *);
  nv_result (*GetPTXSize)(nv_program, size_t *);
  nv_result (*GetPTX)(nv_program, char *);
  nv_result (*GetProgramLogSize)(nv_program, size_t *);
  nv_result (*GetProgramLog)(nv_program, char *);
  nv_result (*AddNameExpression)(nv_program, const char *);
  nv_result (*GetLoweredName)(nv_program, const char *, const char **);
} nv_api;

typedef struct nv_impl {
  rlk_dynlib lib;
  nv_api api;
  int major, minor;
  int archs[256]; /* the compute capabilities x 10 it compiles for */
  int narchs;
  int family;     /* it knows the family forms (sm_100f: NVRTC 12.9 and later) */
  /* NVRTC serializes compiles inside a process anyway; the lock keeps each program's
   * create/compile/read/destroy sequence in one piece and the log ordering readable. */
  pthread_mutex_t lock;
} nv_impl;

static const char *nv_errstr(const nv_impl *impl, nv_result r) {
  const char *s = impl->api.GetErrorString ? impl->api.GetErrorString(r) : NULL;
  return s ? s : "NVRTC error";
}

/* The program log as a malloc'd string (empty when there is none); NULL on allocation
 * failure. */
static char *nv_read_log(const nv_impl *impl, nv_program prog) {
  size_t size = 0;
  if (impl->api.GetProgramLogSize(prog, &size) != NV_SUCCESS) size = 0;
  char *log = malloc(size + 1);
  if (!log) return NULL;
  log[0] = '\0';
  if (size && impl->api.GetProgramLog(prog, log) != NV_SUCCESS) log[0] = '\0';
  log[size] = '\0';
  return rlk_log_trim(log);
}

/* Does this NVRTC accept `option`? Older 12.x releases lack some options; compiling an
 * empty program with it answers without guessing from version numbers. */
static int nv_accepts_option(const nv_impl *impl, const char *option) {
  nv_program prog = NULL;
  if (impl->api.CreateProgram(&prog, "\n", "rlk_probe.cu", 0, NULL, NULL) != NV_SUCCESS)
    return 0;
  const char *opts[1] = {option};
  nv_result r = impl->api.CompileProgram(prog, 1, opts);
  impl->api.DestroyProgram(&prog);
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
  impl->family = impl->major > 12 || (impl->major == 12 && impl->minor >= 9);
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

static void nv_destroy(rlk_compiler *self) {
  if (!self) return;
  nv_impl *impl = self->impl;
  if (impl) {
    pthread_mutex_destroy(&impl->lock);
    rlk_dynlib_close(&impl->lib);
    free(impl);
  }
  free(self);
}

/* Everything after the program was compiled successfully: binary and lowered names. */
static rlk_status nv_collect(rlk_compiler *self, const rlk_compile_request *req, nv_program prog,
                             rlk_compile_result *out, const char *log) {
  nv_impl *impl = self->impl;
  /* A virtual target's code is PTX (NUL-terminated text, as the driver reads it); a real one's
   * a CUBIN. */
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
  out->lowered_names = calloc(req->nnames ? req->nnames : 1, sizeof *out->lowered_names);
  if (!out->lowered_names) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "nvrtc: lowered names");
  out->nnames = req->nnames;
  for (size_t i = 0; i < req->nnames; i++) {
    const char *lowered = NULL;
    r = impl->api.GetLoweredName(prog, req->names[i], &lowered);
    if (r != NV_SUCCESS || !lowered) {
      char detail[600];
      rlk_format(detail, sizeof detail, "no lowered name for '%s' (%s)", req->names[i],
                 nv_errstr(impl, r));
      return rlk_compile_error(self, req, detail, log);
    }
    /* The string belongs to the program, which is destroyed next. */
    if (!(out->lowered_names[i] = rlk_strdup(lowered)))
      return rlk_error(RLK_ERR_OUT_OF_MEMORY, "nvrtc: lowered name");
  }
  return RLK_OK;
}

static rlk_status nv_compile_locked(rlk_compiler *self, const rlk_compile_request *req,
                                    rlk_compile_result *out) {
  nv_impl *impl = self->impl;
  const char *name = req->source_name ? req->source_name : "kernel.cu";
  nv_program prog = NULL;
  nv_result r = impl->api.CreateProgram(&prog, req->source, name, (int)req->nheaders,
                                        req->header_sources, req->header_names);
  if (r != NV_SUCCESS)
    return rlk_compile_error(self, req, "nvrtcCreateProgram failed", nv_errstr(impl, r));

  rlk_status st = RLK_OK;
  const char **opts = NULL;
  char *log = NULL;
  for (size_t i = 0; i < req->nnames && st == RLK_OK; i++) {
    if ((r = impl->api.AddNameExpression(prog, req->names[i])) != NV_SUCCESS) {
      char detail[600];
      rlk_format(detail, sizeof detail, "name expression '%s' rejected (%s)", req->names[i],
                 nv_errstr(impl, r));
      st = rlk_compile_error(self, req, detail, NULL);
    }
  }
  char arch[48];
  size_t nopts = self->nbase_options + req->noptions + 1;
  if (st == RLK_OK && !(opts = malloc(nopts * sizeof *opts)))
    st = rlk_error(RLK_ERR_OUT_OF_MEMORY, "nvrtc: options");
  if (st == RLK_OK) {
    size_t k = 0;
    for (size_t i = 0; i < self->nbase_options; i++) opts[k++] = self->base_options[i];
    for (size_t i = 0; i < req->noptions; i++) opts[k++] = req->options[i];
    rlk_format(arch, sizeof arch, "-arch=%s", req->target->name);
    opts[k++] = arch;
    r = impl->api.CompileProgram(prog, (int)k, opts);
    /* The log is read whatever the outcome: warnings matter on success too. */
    log = nv_read_log(impl, prog);
    if (!log) {
      st = rlk_error(RLK_ERR_OUT_OF_MEMORY, "nvrtc: program log");
    } else if (r != NV_SUCCESS) {
      /* A compilation error speaks through its log; anything else (a bad option) names
       * the NVRTC status as well. */
      st = rlk_compile_error(self, req, r == NV_ERROR_COMPILATION && *log ? NULL : nv_errstr(impl, r),
                             log);
    } else {
      st = nv_collect(self, req, prog, out, log);
    }
  }
  impl->api.DestroyProgram(&prog);
  free(opts);
  if (st == RLK_OK) {
    out->log = log;
  } else {
    free(log);
  }
  return st;
}

static rlk_status nv_compile(rlk_compiler *self, const rlk_compile_request *req,
                             rlk_compile_result *out) {
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "nvrtc: NULL result");
  memset(out, 0, sizeof *out);
  rlk_status st = rlk_compile_request_check(self, req);
  if (st != RLK_OK) return st;
  if (req->nheaders > (size_t)1 << 20 || req->nnames > (size_t)1 << 20)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "nvrtc: too many headers or names");
  nv_impl *impl = self->impl;
  double start = rlk_now();
  pthread_mutex_lock(&impl->lock);
  st = nv_compile_locked(self, req, out);
  pthread_mutex_unlock(&impl->lock);
  if (st != RLK_OK) {
    rlk_compile_result_free(out);
    return st;
  }
  out->seconds = rlk_now() - start;
  rlk_debug("nvrtc: %s for %s: %zu-byte cubin in %.3f s", req->source_name ? req->source_name : "kernel.cu",
            req->target->name, out->size, out->seconds);
  return RLK_OK;
}

/* Fills the candidate list: RLK_NVRTC_LIB alone when set (an explicit choice that fails
 * must not fall back silently), else the toolkit directories, then the loader path. */
static size_t nv_candidates(char paths[][512], size_t max, const char **list) {
  size_t n = 0;
  const char *explicit_lib = rlk_env("RLK_NVRTC_LIB");
  if (explicit_lib) {
    rlk_format(paths[n], 512, "%s", explicit_lib);
    list[n] = paths[n];
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
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "nvrtc: NULL output");
  *out = NULL;
  nv_impl *impl = calloc(1, sizeof *impl);
  rlk_compiler *c = calloc(1, sizeof *c);
  if (!impl || !c) {
    free(impl);
    free(c);
    return rlk_error(RLK_ERR_OUT_OF_MEMORY, "nvrtc: compiler");
  }
  if (pthread_mutex_init(&impl->lock, NULL) != 0) {
    free(impl);
    free(c);
    return rlk_error(RLK_ERR_INTERNAL, "nvrtc: mutex");
  }
  c->impl = impl;
  c->destroy = nv_destroy;

  nv_api *a = &impl->api;
  const rlk_dynlib_symbol symbols[] = {
      {"nvrtcGetErrorString", &a->GetErrorString, 0},
      {"nvrtcVersion", &a->Version, 0},
      {"nvrtcGetNumSupportedArchs", &a->GetNumSupportedArchs, 0},
      {"nvrtcGetSupportedArchs", &a->GetSupportedArchs, 0},
      {"nvrtcCreateProgram", &a->CreateProgram, 0},
      {"nvrtcDestroyProgram", &a->DestroyProgram, 0},
      {"nvrtcCompileProgram", &a->CompileProgram, 0},
      {"nvrtcGetCUBINSize", &a->GetCUBINSize, 0},
      {"nvrtcGetCUBIN", &a->GetCUBIN, 0},
      {"nvrtcGetPTXSize", &a->GetPTXSize, 0},
      {"nvrtcGetPTX", &a->GetPTX, 0},
      {"nvrtcGetProgramLogSize", &a->GetProgramLogSize, 0},
      {"nvrtcGetProgramLog", &a->GetProgramLog, 0},
      {"nvrtcAddNameExpression", &a->AddNameExpression, 0},
      {"nvrtcGetLoweredName", &a->GetLoweredName, 0},
  };
  char paths[16][512];
  const char *list[16];
  size_t n = nv_candidates(paths, 16, list);
  rlk_status st = rlk_dynlib_open(&impl->lib, "nvrtc", list, n, symbols,
                                  sizeof symbols / sizeof symbols[0]);
  if (st != RLK_OK) {
    nv_destroy(c);
    return rlk_error_wrap(st, "nvrtc unavailable (set RLK_NVRTC_LIB or RLK_CUDA_HOME)");
  }
  nv_result r = a->Version(&impl->major, &impl->minor);
  if (r != NV_SUCCESS) {
    st = rlk_error(RLK_ERR_UNAVAILABLE, "nvrtc: %s: nvrtcVersion failed (%s)", impl->lib.path,
                   nv_errstr(impl, r));
    nv_destroy(c);
    return st;
  }
  if (impl->major != 12 && impl->major != 13) {
    st = rlk_error(RLK_ERR_UNAVAILABLE, "nvrtc: %s is version %d.%d; rlk needs NVRTC 12 or 13",
                   impl->lib.path, impl->major, impl->minor);
    nv_destroy(c);
    return st;
  }
  c->kind = "nvrtc";
  rlk_format(c->version, sizeof c->version, "%d.%d", impl->major, impl->minor);
  rlk_format(c->id, sizeof c->id, "nvrtc-%d.%d", impl->major, impl->minor);
  c->compile = nv_compile;
  c->supports_target = nv_supports_target;
  if ((st = nv_fill_targets(c, impl)) != RLK_OK) {
    nv_destroy(c);
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
  if (impl->major >= 13 || nv_accepts_option(impl, "--no-source-include"))
    c->base_options[k++] = "--no-source-include";
  if (impl->major >= 13 || (impl->minor >= 9 && nv_accepts_option(impl, "--no-cache")))
    c->base_options[k++] = "--no-cache";
  c->base_options[k++] = "-DRLK_NVRTC=1";
  c->nbase_options = k;

  rlk_info("nvrtc: %s from %s; targets %s", c->id, impl->lib.path, c->targets);
  *out = c;
  return RLK_OK;
}

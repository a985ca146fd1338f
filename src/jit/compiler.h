/* compiler.h - one interface over the three kernel compilers: NVRTC (CUDA), hiprtc (HIP)
 * and the host C compiler from LLVM (clang). Each is a struct of function pointers so
 * the JIT never names a compiler. The libraries are opened with dlopen. */
#ifndef RLK_COMPILER_H
#define RLK_COMPILER_H

#include <stddef.h>

#include "core/target.h"
#include "rlk.h"

typedef struct rlk_compile_request {
  const char *source;      /* the translation unit */
  const char *source_name; /* its name in logs: "group_advantage.cu" */
  size_t nheaders;         /* in-memory headers, included by exactly these names */
  const char *const *header_names;
  const char *const *header_sources;
  const rlk_target *target; /* typed; its name ("sm_90a", "gfx90a", "host-x86_64") is what the
                            * compiler's architecture option gets */
  size_t noptions;         /* extra options, already normalized (sorted -D defines, ...) */
  const char *const *options;
  size_t nnames;           /* CUDA/HIP: name expressions to instantiate; host: symbols */
  const char *const *names;
} rlk_compile_request;

typedef struct rlk_compile_result {
  void *binary;           /* cubin, PTX, code object or shared object; malloc'd */
  size_t size;
  const char *binary_name; /* its file name in a cache entry ("kernel.cubin", "kernel.ptx",
                            * "kernel.hsaco", "kernel.so"): a static string */
  char **lowered_names;   /* one per request name; malloc'd */
  size_t nnames;
  char *log;              /* compiler log, possibly empty; malloc'd */
  double seconds;
} rlk_compile_result;

void rlk_compile_result_free(rlk_compile_result *result);

typedef struct rlk_compiler rlk_compiler;

struct rlk_compiler {
  const char *kind;        /* "nvrtc", "hiprtc", "clang" */
  char id[64];             /* kind-version, goes into the key and the cache path: "nvrtc-13.0" */
  char version[32];        /* "13.0" */
  char targets[1024];      /* space-separated names of the targets it accepts (for messages) */
  /* The options every compile passes (normalized, in the key). */
  size_t nbase_options;
  const char *base_options[16];

  /* Compiles; on failure returns RLK_ERR_COMPILE with the log in rlk_last_error(). */
  rlk_status (*compile)(rlk_compiler *self, const rlk_compile_request *req,
                        rlk_compile_result *out);
  /* Is `target` one this compiler can build for? */
  int (*supports_target)(const rlk_compiler *self, const rlk_target *target);
  void (*destroy)(rlk_compiler *self);
  void *impl;
};

/* Opens NVRTC: RLK_NVRTC_LIB, else libnvrtc.so.13 / .12 from RLK_CUDA_HOME, CUDA_HOME,
 * /usr/local/cuda and the loader path. RLK_ERR_UNAVAILABLE if none loads. */
rlk_status rlk_nvrtc_open(rlk_compiler **out);

/* Opens hiprtc from libamdhip64 (RLK_HIP_LIB overrides). Targets are limited to a known-good
 * list for the loaded version (ROCm 5.x crashes compiling gfx942). */
rlk_status rlk_hiprtc_open(rlk_compiler **out);

/* Finds the host compiler: RLK_HOST_CC, else clang-14, clang. It compiles C11 to a shared
 * object for the host CPU. */
rlk_status rlk_hostcc_open(rlk_compiler **out);

#endif

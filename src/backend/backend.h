/* backend.h - a device runtime behind a struct of function pointers (cuda, hip, host).
 * A backend knows modules, functions, memory and launches; nothing of keys or files. */
#ifndef RLK_BACKEND_H
#define RLK_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/target.h"
#include "core/tma.h"
#include "rlk.h"

typedef struct rlk_backend_impl rlk_backend_impl;

typedef struct rlk_launch_dims {
  unsigned grid[3];
  unsigned block[3];
  size_t shared_bytes;
  unsigned flags;   /* RLK_LAUNCH_* */
  unsigned cluster; /* blocks a cluster along x, grid[0] a multiple of it (CUDA, sm_90 or later);
                     * 0 or 1: none */
} rlk_launch_dims;

/* rlk_launch_dims.flags: the grid may start while the stream's previous kernel is finishing
 * (CUDA programmatic dependent launch on an sm_90 or later device; elsewhere a plain launch).
 * Only for kernels that call grid_dependency_wait() (rlk_prelude.cuh) before touching global
 * memory, and built for sm_90 or later: for an older target that call compiles to nothing,
 * and a newer device may still run such code (PTX it compiles at load). */
#define RLK_LAUNCH_OVERLAP 1u

struct rlk_backend_impl {
  rlk_backend kind;
  const char *name;     /* "cuda", "hip", "host" */
  rlk_device_info info; /* name, target, compute capability, multiprocessors, memory */
  rlk_target target;    /* the device's target, typed (RLK_ARCH applied); info.target is its name */

  /* Loads a binary (cubin, code object, shared object) from memory. RLK_ERR_BACKEND with
   * the driver's message if it refuses the image (the JIT then rebuilds the entry). */
  rlk_status (*module_load)(rlk_backend_impl *self, const void *image, size_t size, void **module);
  /* module_unload and event_destroy return nothing: a failure is logged as a warning and leaves
   * this thread's last error alone (they run on error paths, after the failure being reported). */
  void (*module_unload)(rlk_backend_impl *self, void *module);
  /* Finds a kernel by its lowered name. */
  rlk_status (*get_function)(rlk_backend_impl *self, void *module, const char *name, void **fn);
  /* Launches on `stream` without synchronizing. `args` as CUDA's kernelParams: one pointer per
   * kernel argument. The host backend calls fn(args) on the calling thread. */
  rlk_status (*launch)(rlk_backend_impl *self, void *fn, const rlk_launch_dims *dims, void *stream,
                       void **args);

  rlk_status (*mem_alloc)(rlk_backend_impl *self, size_t bytes, void **out);
  rlk_status (*mem_free)(rlk_backend_impl *self, void *ptr);
  rlk_status (*copy_to_device)(rlk_backend_impl *self, void *dst, const void *src, size_t bytes);
  rlk_status (*copy_to_host)(rlk_backend_impl *self, void *dst, const void *src, size_t bytes);
  rlk_status (*mem_set)(rlk_backend_impl *self, void *dst, int value, size_t bytes);
  rlk_status (*synchronize)(rlk_backend_impl *self, void *stream);

  rlk_status (*event_create)(rlk_backend_impl *self, void **event);
  rlk_status (*event_record)(rlk_backend_impl *self, void *event, void *stream);
  rlk_status (*event_elapsed_ms)(rlk_backend_impl *self, void *start, void *end, float *ms);
  void (*event_destroy)(rlk_backend_impl *self, void *event);

  /* Encodes a 2-D tensor map (TMA) for `req` into out128 (128 bytes); NULL where the device has
   * no tensor maps. RLK_ERR_UNSUPPORTED with the reason when it refuses the request. */
  rlk_status (*tensor_map_encode)(rlk_backend_impl *self, const rlk_tma_desc_request *req, void *out128);

  void (*destroy)(rlk_backend_impl *self);
  void *impl;
};

/* The start of a device backend's open: out checked and cleared, the ordinal checked, then the
 * backend and its zeroed state (state_size bytes, at (*backend)->impl) allocated; the messages
 * begin with `name`. The caller frees both (its destroy) when a later step fails. */
rlk_status rlk_backend_alloc(const char *name, int ordinal, size_t state_size, rlk_backend_impl **out,
                             rlk_backend_impl **backend);

/* Opens the CUDA driver (libcuda.so.1 by dlopen) on device `ordinal` and retains its primary
 * context. Every entry point makes that context current only for its own duration: the calling
 * thread keeps the context it had (possibly none). RLK_ERR_UNAVAILABLE only when there is no
 * CUDA here (no driver, cuInit fails, no device); RLK_ERR_INVALID_ARGUMENT for an ordinal past
 * the last device; RLK_ERR_BACKEND when the device itself fails. */
rlk_status rlk_cuda_backend_open(int ordinal, rlk_backend_impl **out);

/* Opens the HIP runtime (libamdhip64 by dlopen) on device `ordinal`. Like CUDA: the calling
 * thread keeps its current device; the same statuses. */
rlk_status rlk_hip_backend_open(int ordinal, rlk_backend_impl **out);

/* The host CPU: kernels are shared objects loaded with dlopen; memory is malloc. */
rlk_status rlk_host_backend_open(rlk_backend_impl **out);

/* Encodes a CUtensorMap (128 bytes, 64-byte aligned) into `out` with cuTensorMapEncodeTiled,
 * after rlk_tma_check (core/tma.h). Only on a CUDA backend: the CUDA backend's tensor_map_encode. */
rlk_status rlk_cuda_tma_encode(rlk_backend_impl *cuda, const rlk_tma_desc_request *req, void *out128);

#endif

/* cuda_backend.c - the CUDA backend over the driver API, loaded from libcuda.so.1 with
 * dlopen so the library builds and runs (host-only) on machines without NVIDIA software.
 *
 * One backend is one device's primary context: the context CUDA runtime users (PyTorch,
 * CuPy) share, so pointers and streams from a framework work here unchanged. The driver
 * keeps a current context per thread, and the CUDA runtime adopts whatever context it finds
 * current. So every entry point makes ours current only for its own duration (ctx_enter /
 * ctx_leave) and hands the thread back as it found it: a caller working on another device
 * keeps that device. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/binary_image.h"
#include "backend/cuda/cuda_driver.h"
#include "core/core.h"
#include "core/dynlib.h"

/* ---- the driver table, loaded once per process ------------------------------------ */

static rlk_cuda_driver g_driver;
static int g_driver_loaded;
static pthread_mutex_t g_driver_lock = PTHREAD_MUTEX_INITIALIZER;

/* Loads libcuda.so.1 and fills g_driver; the caller holds g_driver_lock. */
static rlk_status driver_load_locked(void) {
  rlk_cuda_driver d;
  memset(&d, 0, sizeof d);
  /* Newer drivers keep the old symbols for old binaries; asking for both and taking the
   * "_v2" one when present gives the current behaviour on every driver. */
  CUresult (*event_elapsed_v1)(float *, CUevent, CUevent) = NULL;
  CUresult (*event_destroy_v1)(CUevent) = NULL;
  CUresult (*ctx_release_v1)(CUdevice) = NULL;
  const rlk_dynlib_symbol symbols[] = {
      {"cuInit", &d.cuInit, 0},
      {"cuGetErrorName", &d.cuGetErrorName, 0},
      {"cuGetErrorString", &d.cuGetErrorString, 0},
      {"cuDeviceGetCount", &d.cuDeviceGetCount, 0},
      {"cuDeviceGet", &d.cuDeviceGet, 0},
      {"cuDeviceGetName", &d.cuDeviceGetName, 0},
      {"cuDeviceGetAttribute", &d.cuDeviceGetAttribute, 0},
      {"cuDeviceTotalMem_v2", &d.cuDeviceTotalMem, 0},
      {"cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain, 0},
      {"cuDevicePrimaryCtxRelease_v2", &d.cuDevicePrimaryCtxRelease, 1},
      {"cuDevicePrimaryCtxRelease", &ctx_release_v1, 1},
      {"cuCtxGetCurrent", &d.cuCtxGetCurrent, 0},
      {"cuCtxSetCurrent", &d.cuCtxSetCurrent, 0},
      {"cuCtxSynchronize", &d.cuCtxSynchronize, 0},
      {"cuModuleLoadData", &d.cuModuleLoadData, 0},
      {"cuModuleUnload", &d.cuModuleUnload, 0},
      {"cuModuleGetFunction", &d.cuModuleGetFunction, 0},
      {"cuFuncSetAttribute", &d.cuFuncSetAttribute, 0},
      {"cuFuncGetAttribute", &d.cuFuncGetAttribute, 0},
      {"cuLaunchKernel", &d.cuLaunchKernel, 0},
      {"cuLaunchKernelEx", &d.cuLaunchKernelEx, 1},
      {"cuOccupancyMaxActiveClusters", &d.cuOccupancyMaxActiveClusters, 1},
      {"cuMemAlloc_v2", &d.cuMemAlloc, 0},
      {"cuMemFree_v2", &d.cuMemFree, 0},
      {"cuMemcpyHtoD_v2", &d.cuMemcpyHtoD, 0},
      {"cuMemcpyDtoH_v2", &d.cuMemcpyDtoH, 0},
      {"cuMemsetD8_v2", &d.cuMemsetD8, 0},
      {"cuStreamSynchronize", &d.cuStreamSynchronize, 0},
      {"cuEventCreate", &d.cuEventCreate, 0},
      {"cuEventRecord", &d.cuEventRecord, 0},
      {"cuEventSynchronize", &d.cuEventSynchronize, 0},
      {"cuEventElapsedTime_v2", &d.cuEventElapsedTime, 1},
      {"cuEventElapsedTime", &event_elapsed_v1, 1},
      {"cuEventDestroy_v2", &d.cuEventDestroy, 1},
      {"cuEventDestroy", &event_destroy_v1, 1},
      {"cuTensorMapEncodeTiled", &d.cuTensorMapEncodeTiled, 1},
  };
  static const char *const candidates[] = {"libcuda.so.1"};
  rlk_dynlib lib;
  rlk_status st = rlk_dynlib_open(&lib, "cuda", candidates, 1, symbols,
                                  sizeof symbols / sizeof symbols[0]);
  if (st != RLK_OK) return st;
  if (!d.cuEventElapsedTime) d.cuEventElapsedTime = event_elapsed_v1;
  if (!d.cuEventDestroy) d.cuEventDestroy = event_destroy_v1;
  if (!d.cuDevicePrimaryCtxRelease) d.cuDevicePrimaryCtxRelease = ctx_release_v1;
  if (!d.cuEventElapsedTime || !d.cuEventDestroy || !d.cuDevicePrimaryCtxRelease) {
    st = rlk_error(RLK_ERR_UNAVAILABLE,
                   "cuda: %s lacks cuEventElapsedTime, cuEventDestroy or "
                   "cuDevicePrimaryCtxRelease",
                   lib.path);
    rlk_dynlib_close(&lib);
    return st;
  }
  /* lib.handle stays open for the life of the process. */
  g_driver = d;
  g_driver_loaded = 1;
  return RLK_OK;
}

rlk_status rlk_cuda_driver_load(const rlk_cuda_driver **out) {
  /* Success is kept; a failure is retried on the next call (cheap, and a driver can appear
   * after a container's devices are mounted). */
  pthread_mutex_lock(&g_driver_lock);
  rlk_status st = g_driver_loaded ? RLK_OK : driver_load_locked();
  pthread_mutex_unlock(&g_driver_lock);
  if (out) *out = st == RLK_OK ? &g_driver : NULL;
  return st;
}

rlk_status rlk_cuda_fail(rlk_status status, const char *what, CUresult result) {
  const char *name = NULL, *text = NULL;
  if (g_driver.cuGetErrorName && g_driver.cuGetErrorName(result, &name) != CUDA_SUCCESS)
    name = NULL;
  if (g_driver.cuGetErrorString && g_driver.cuGetErrorString(result, &text) != CUDA_SUCCESS)
    text = NULL;
  if (!name) return rlk_error(status, "cuda: %s: CUresult %d", what, result);
  return rlk_error(status, "cuda: %s: %s: %s", what, name, text ? text : "no description");
}

/* ---- the backend ------------------------------------------------------------------ */

typedef struct cuda_state {
  const rlk_cuda_driver *drv;
  CUdevice device;
  CUcontext ctx;
  int ordinal;
  int max_shared_optin; /* bytes of dynamic shared memory a block may opt in to */
} cuda_state;

static cuda_state *state_of(rlk_backend_impl *self) { return self->impl; }

/* The caller's current context, noted by ctx_enter and put back by ctx_leave. */
typedef struct ctx_scope {
  CUcontext prev; /* possibly NULL: no context was current */
  int switched;   /* ctx_enter replaced prev with ours */
} ctx_scope;

/* Makes the device's context current on this thread; the driver's result of the switch. */
static inline CUresult ctx_switch(cuda_state *s, ctx_scope *scope) {
  scope->prev = NULL;
  scope->switched = 0;
  CUresult r = s->drv->cuCtxGetCurrent(&scope->prev);
  if (r != CUDA_SUCCESS) scope->prev = NULL; /* unknown: leave the thread with none */
  else if (scope->prev == s->ctx) return CUDA_SUCCESS;
  r = s->drv->cuCtxSetCurrent(s->ctx);
  if (r != CUDA_SUCCESS) return r;
  scope->switched = 1;
  return CUDA_SUCCESS;
}

/* Makes the device's context current on this thread for one entry point. The common case,
 * a caller that already has our primary context current (a framework on the same device),
 * costs one cuCtxGetCurrent and no switch. */
static inline rlk_status ctx_enter(cuda_state *s, ctx_scope *scope) {
  CUresult r = ctx_switch(s, scope);
  return r == CUDA_SUCCESS ? RLK_OK : rlk_cuda_fail(RLK_ERR_BACKEND, "cuCtxSetCurrent", r);
}

/* Logs a failed driver call of an entry point that returns nothing (an unload, a destroy) as a
 * warning, leaving this thread's last error alone: such calls run on error paths too, where the
 * message is the failure being reported. */
static void cuda_warn(cuda_state *s, const char *what, CUresult r) {
  const char *name = NULL, *text = NULL;
  if (s->drv->cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
  if (s->drv->cuGetErrorString(r, &text) != CUDA_SUCCESS) text = NULL;
  if (name) rlk_warn("cuda: %s: %s: %s", what, name, text ? text : "no description");
  else rlk_warn("cuda: %s: CUresult %d", what, r);
}

/* Puts back the context ctx_enter found and returns `status` unchanged, so an entry point
 * ends with `return ctx_leave(s, &scope, status)`. A failure to restore is only logged: the
 * entry point's own outcome (and its error message) is what the caller needs. */
static inline rlk_status ctx_leave(cuda_state *s, const ctx_scope *scope, rlk_status status) {
  if (!scope->switched) return status;
  CUresult r = s->drv->cuCtxSetCurrent(scope->prev);
  if (r != CUDA_SUCCESS) {
    const char *name = NULL;
    if (s->drv->cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
    rlk_warn("cuda: cannot restore the caller's current context: %s",
             name ? name : "unknown error");
  }
  return status;
}

/* ctx_leave for an entry point whose last driver call `what` returned r: RLK_OK, or that call's
 * RLK_ERR_BACKEND. */
static inline rlk_status ctx_leave_call(cuda_state *s, const ctx_scope *scope, CUresult r, const char *what) {
  return ctx_leave(s, scope, r == CUDA_SUCCESS ? RLK_OK : rlk_cuda_fail(RLK_ERR_BACKEND, what, r));
}

rlk_status rlk_cuda_enter(rlk_backend_impl *cuda, rlk_cuda_scope *scope) {
  ctx_scope sc;
  rlk_status st = ctx_enter(state_of(cuda), &sc);
  scope->prev = sc.prev;
  scope->switched = sc.switched;
  return st;
}

rlk_status rlk_cuda_leave(rlk_backend_impl *cuda, const rlk_cuda_scope *scope, rlk_status status) {
  ctx_scope sc = {scope->prev, scope->switched};
  return ctx_leave(state_of(cuda), &sc, status);
}

/* PTX is text the driver reads as a C string: it must be NUL-terminated inside the buffer
 * and start (after blank lines) with a comment or a directive such as ".version". */
static int looks_like_ptx(const void *image, size_t size) {
  const char *text = image;
  if (size == 0 || !memchr(text, '\0', size)) return 0;
  while (*text == ' ' || *text == '\t' || *text == '\r' || *text == '\n') text++;
  return text[0] == '.' || (text[0] == '/' && text[1] == '/');
}

static rlk_status cuda_module_load(rlk_backend_impl *self, const void *image, size_t size,
                                   void **module) {
  cuda_state *s = state_of(self);
  if (!module) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "cuda: module_load: module is NULL");
  *module = NULL;
  if (!image || size == 0)
    return rlk_error(RLK_ERR_BACKEND, "cuda: module_load: empty image");
  static const unsigned char fatbin_magic[4] = {0x50, 0xed, 0x55, 0xba};
  if (rlk_image_is_elf(image, size)) {
    rlk_status st = rlk_elf_image_check(image, size, 190 /* EM_CUDA */, "cuda");
    if (st != RLK_OK) return st;
  } else if (size >= 4 && memcmp(image, fatbin_magic, 4) == 0) {
    /* A fatbinary: the driver picks the member for this device. */
  } else if (!looks_like_ptx(image, size)) {
    return rlk_error(RLK_ERR_BACKEND,
                     "cuda: module_load: image is neither a cubin, a fatbinary nor PTX text");
  }
  ctx_scope scope;
  rlk_status st = ctx_enter(s, &scope);
  if (st != RLK_OK) return st;
  CUmodule mod = NULL;
  CUresult r = s->drv->cuModuleLoadData(&mod, image);
  if (r != CUDA_SUCCESS) {
    /* An image for another architecture or from a newer toolkit lands here too
     * (NO_BINARY_FOR_GPU, INVALID_IMAGE, UNSUPPORTED_PTX_VERSION): the JIT rebuilds it. */
    return ctx_leave(s, &scope, rlk_cuda_fail(RLK_ERR_BACKEND, "cuModuleLoadData", r));
  }
  *module = mod;
  return ctx_leave(s, &scope, RLK_OK);
}

static void cuda_module_unload(rlk_backend_impl *self, void *module) {
  cuda_state *s = state_of(self);
  if (!module) return;
  ctx_scope scope;
  CUresult r = ctx_switch(s, &scope);
  if (r != CUDA_SUCCESS) {
    cuda_warn(s, "module_unload: cuCtxSetCurrent", r);
    return;
  }
  r = s->drv->cuModuleUnload((CUmodule)module);
  if (r != CUDA_SUCCESS) cuda_warn(s, "cuModuleUnload", r);
  ctx_leave(s, &scope, RLK_OK);
}

static rlk_status cuda_get_function(rlk_backend_impl *self, void *module, const char *name,
                                    void **fn) {
  cuda_state *s = state_of(self);
  if (!module || !name || !fn)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "cuda: get_function: NULL argument");
  *fn = NULL;
  ctx_scope scope;
  rlk_status st = ctx_enter(s, &scope);
  if (st != RLK_OK) return st;
  CUfunction f = NULL;
  CUresult r = s->drv->cuModuleGetFunction(&f, (CUmodule)module, name);
  if (r != CUDA_SUCCESS) {
    char what[320];
    rlk_format(what, sizeof what, "cuModuleGetFunction(\"%s\")", name);
    return ctx_leave(s, &scope, rlk_cuda_fail(RLK_ERR_BACKEND, what, r));
  }
  /* Opt in once, here, to all the dynamic shared memory the device allows beside the kernel's
   * static shared memory: the 48 KiB default counts static and dynamic together, so a launch
   * just under 48 KiB of dynamic memory would otherwise fail. The attribute only raises a
   * limit; occupancy follows what each launch asks for. */
  int static_bytes = 0;
  r = s->drv->cuFuncGetAttribute(&static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f);
  if (r != CUDA_SUCCESS)
    return ctx_leave(s, &scope, rlk_cuda_fail(RLK_ERR_BACKEND, "cuFuncGetAttribute", r));
  if (s->max_shared_optin > static_bytes) {
    r = s->drv->cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   s->max_shared_optin - static_bytes);
    if (r != CUDA_SUCCESS)
      return ctx_leave(s, &scope, rlk_cuda_fail(RLK_ERR_BACKEND, "cuFuncSetAttribute", r));
  }
  *fn = f;
  return ctx_leave(s, &scope, RLK_OK);
}

static rlk_status cuda_launch(rlk_backend_impl *self, void *fn, const rlk_launch_dims *dims,
                              void *stream, void **args) {
  cuda_state *s = state_of(self);
  if (!fn || !dims)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "cuda: launch: NULL function or dims");
  if (dims->shared_bytes > RLK_CUDA_DEFAULT_SHARED_LIMIT &&
      dims->shared_bytes > (size_t)s->max_shared_optin)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "cuda: launch: %zu bytes of dynamic shared memory exceed the device's "
                     "limit of %d",
                     dims->shared_bytes, s->max_shared_optin);
  ctx_scope scope;
  rlk_status st = ctx_enter(s, &scope);
  if (st != RLK_OK) return st;
  CUfunction f = fn; /* its shared-memory opt-in was made by get_function */
  const int overlap = (dims->flags & RLK_LAUNCH_OVERLAP) && s->drv->cuLaunchKernelEx && self->info.compute_major >= 9;
  const int cluster = dims->cluster > 1;
  if (cluster && (!s->drv->cuLaunchKernelEx || self->info.compute_major < 9 || dims->grid[0] % dims->cluster))
    return ctx_leave(s, &scope,
                     rlk_error(RLK_ERR_INVALID_ARGUMENT,
                               "cuda: launch: clusters of %u blocks need sm_90 or later, cuLaunchKernelEx and a "
                               "grid of whole clusters (%u blocks)",
                               dims->cluster, dims->grid[0]));
  if (overlap || cluster) {
    CUlaunchAttribute attr[2];
    memset(attr, 0, sizeof attr);
    unsigned n = 0;
    if (overlap) {
      /* programmatic stream serialization: the grid may start as the previous kernel's blocks
       * trigger or exit; the kernel itself waits for that kernel's results */
      attr[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attr[n++].value.value = 1;
    }
    if (cluster) {
      attr[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attr[n].value.dim[0] = dims->cluster, attr[n].value.dim[1] = 1, attr[n++].value.dim[2] = 1;
    }
    const CUlaunchConfig cfg = {dims->grid[0],  dims->grid[1],  dims->grid[2],
                                dims->block[0], dims->block[1], dims->block[2],
                                (unsigned int)dims->shared_bytes, (CUstream)stream, attr, n};
    CUresult r = s->drv->cuLaunchKernelEx(&cfg, f, args, NULL);
    return ctx_leave_call(s, &scope, r, "cuLaunchKernelEx");
  }
  CUresult r = s->drv->cuLaunchKernel(f, dims->grid[0], dims->grid[1], dims->grid[2],
                                      dims->block[0], dims->block[1], dims->block[2],
                                      (unsigned int)dims->shared_bytes, (CUstream)stream, args,
                                      NULL);
  return ctx_leave_call(s, &scope, r, "cuLaunchKernel");
}

static rlk_status cuda_mem_alloc(rlk_backend_impl *self, size_t bytes, void **out) {
  cuda_state *s = state_of(self);
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "cuda: mem_alloc: out is NULL");
  *out = NULL;
  if (bytes == 0) return RLK_OK; /* the driver rejects 0; NULL frees as a no-op */
  ctx_scope scope;
  rlk_status st = ctx_enter(s, &scope);
  if (st != RLK_OK) return st;
  CUdeviceptr p = 0;
  CUresult r = s->drv->cuMemAlloc(&p, bytes);
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    return ctx_leave(s, &scope, rlk_cuda_fail(RLK_ERR_OUT_OF_MEMORY, "cuMemAlloc", r));
  if (r != CUDA_SUCCESS)
    return ctx_leave(s, &scope, rlk_cuda_fail(RLK_ERR_BACKEND, "cuMemAlloc", r));
  *out = (void *)(uintptr_t)p;
  return ctx_leave(s, &scope, RLK_OK);
}

static rlk_status cuda_mem_free(rlk_backend_impl *self, void *ptr) {
  cuda_state *s = state_of(self);
  if (!ptr) return RLK_OK;
  ctx_scope scope;
  rlk_status st = ctx_enter(s, &scope);
  if (st != RLK_OK) return st;
  CUresult r = s->drv->cuMemFree((CUdeviceptr)(uintptr_t)ptr);
  return ctx_leave_call(s, &scope, r, "cuMemFree");
}

/* A copy between host and device (to_device: host to device) for the entry point `what`. */
static rlk_status cuda_copy(cuda_state *s, void *dst, const void *src, size_t bytes, int to_device,
                            const char *what) {
  if (bytes == 0) return RLK_OK;
  if (!dst || !src) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "cuda: %s: NULL pointer", what);
  ctx_scope scope;
  rlk_status st = ctx_enter(s, &scope);
  if (st != RLK_OK) return st;
  CUresult r = to_device ? s->drv->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, bytes)
                         : s->drv->cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, bytes);
  if (r != CUDA_SUCCESS || !to_device)
    return ctx_leave_call(s, &scope, r, to_device ? "cuMemcpyHtoD" : "cuMemcpyDtoH");
  /* From pageable memory the copy may return once the bytes are staged, before they land (the
   * driver's synchronization rules); callers are promised a synchronous copy, which a launch on
   * a non-blocking stream reads at once. */
  r = s->drv->cuStreamSynchronize(NULL);
  return ctx_leave_call(s, &scope, r, "cuStreamSynchronize");
}

static rlk_status cuda_copy_to_device(rlk_backend_impl *self, void *dst, const void *src,
                                      size_t bytes) {
  return cuda_copy(state_of(self), dst, src, bytes, 1, "copy_to_device");
}

static rlk_status cuda_copy_to_host(rlk_backend_impl *self, void *dst, const void *src,
                                    size_t bytes) {
  return cuda_copy(state_of(self), dst, src, bytes, 0, "copy_to_host");
}

static rlk_status cuda_mem_set(rlk_backend_impl *self, void *dst, int value, size_t bytes) {
  cuda_state *s = state_of(self);
  if (bytes == 0) return RLK_OK;
  if (!dst) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "cuda: mem_set: NULL pointer");
  ctx_scope scope;
  rlk_status st = ctx_enter(s, &scope);
  if (st != RLK_OK) return st;
  CUresult r = s->drv->cuMemsetD8((CUdeviceptr)(uintptr_t)dst, (unsigned char)value, bytes);
  if (r != CUDA_SUCCESS)
    return ctx_leave(s, &scope, rlk_cuda_fail(RLK_ERR_BACKEND, "cuMemsetD8", r));
  /* cuMemsetD8 may return before the fill lands; callers are promised a synchronous fill. */
  r = s->drv->cuStreamSynchronize(NULL);
  return ctx_leave_call(s, &scope, r, "cuStreamSynchronize");
}

static rlk_status cuda_synchronize(rlk_backend_impl *self, void *stream) {
  cuda_state *s = state_of(self);
  ctx_scope scope;
  rlk_status st = ctx_enter(s, &scope);
  if (st != RLK_OK) return st;
  CUresult r = s->drv->cuStreamSynchronize((CUstream)stream);
  return ctx_leave_call(s, &scope, r, "cuStreamSynchronize");
}

static rlk_status cuda_event_create(rlk_backend_impl *self, void **event) {
  cuda_state *s = state_of(self);
  if (!event) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "cuda: event_create: event is NULL");
  *event = NULL;
  ctx_scope scope;
  rlk_status st = ctx_enter(s, &scope);
  if (st != RLK_OK) return st;
  CUevent e = NULL;
  CUresult r = s->drv->cuEventCreate(&e, CU_EVENT_DEFAULT);
  if (r != CUDA_SUCCESS)
    return ctx_leave(s, &scope, rlk_cuda_fail(RLK_ERR_BACKEND, "cuEventCreate", r));
  *event = e;
  return ctx_leave(s, &scope, RLK_OK);
}

static rlk_status cuda_event_record(rlk_backend_impl *self, void *event, void *stream) {
  cuda_state *s = state_of(self);
  if (!event) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "cuda: event_record: event is NULL");
  ctx_scope scope;
  rlk_status st = ctx_enter(s, &scope);
  if (st != RLK_OK) return st;
  CUresult r = s->drv->cuEventRecord((CUevent)event, (CUstream)stream);
  return ctx_leave_call(s, &scope, r, "cuEventRecord");
}

static rlk_status cuda_event_elapsed_ms(rlk_backend_impl *self, void *start, void *end,
                                        float *ms) {
  cuda_state *s = state_of(self);
  if (!start || !end || !ms)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "cuda: event_elapsed_ms: NULL argument");
  ctx_scope scope;
  rlk_status st = ctx_enter(s, &scope);
  if (st != RLK_OK) return st;
  CUresult r = s->drv->cuEventSynchronize((CUevent)end);
  if (r != CUDA_SUCCESS)
    return ctx_leave(s, &scope, rlk_cuda_fail(RLK_ERR_BACKEND, "cuEventSynchronize", r));
  r = s->drv->cuEventElapsedTime(ms, (CUevent)start, (CUevent)end);
  return ctx_leave_call(s, &scope, r, "cuEventElapsedTime");
}

static void cuda_event_destroy(rlk_backend_impl *self, void *event) {
  cuda_state *s = state_of(self);
  if (!event) return;
  ctx_scope scope;
  CUresult r = ctx_switch(s, &scope);
  if (r != CUDA_SUCCESS) {
    cuda_warn(s, "event_destroy: cuCtxSetCurrent", r);
    return;
  }
  r = s->drv->cuEventDestroy((CUevent)event);
  if (r != CUDA_SUCCESS) cuda_warn(s, "cuEventDestroy", r);
  ctx_leave(s, &scope, RLK_OK);
}

static void cuda_destroy(rlk_backend_impl *self) {
  if (!self) return;
  cuda_state *s = state_of(self);
  if (s) {
    /* The primary context is reference counted: other users in the process keep theirs.
     * Releasing needs no current context, so the thread's is left alone. */
    if (s->ctx) s->drv->cuDevicePrimaryCtxRelease(s->device);
    free(s);
  }
  free(self);
}

/* ---- opening ---------------------------------------------------------------------- */

/* The SMs that clusters of 2, 4 and 8 blocks, one block a multiprocessor, keep busy at once
 * (target->cluster_sms): a cluster's blocks share one GPC, and the GPCs' SM counts differ from
 * chip to chip (the disabled SMs), so a GPC of 18 SMs holds four quads and leaves two idle. Asked
 * of the driver for an empty kernel (PTX, built by the driver) that takes all the shared memory
 * a block may; left 0 where the driver cannot say. Needs the device's context current. */
static void probe_cluster_sms(cuda_state *s, rlk_target *target) {
  static const char ptx[] = ".version 7.8\n.target sm_90\n.address_size 64\n"
                            ".visible .entry rlk_cluster_probe()\n{\n  ret;\n}\n";
  const rlk_cuda_driver *d = s->drv;
  if (target->major < 9 || !d->cuOccupancyMaxActiveClusters) return;
  CUmodule m = NULL;
  CUfunction f = NULL;
  if (d->cuModuleLoadData(&m, ptx) != CUDA_SUCCESS) return;
  if (d->cuModuleGetFunction(&f, m, "rlk_cluster_probe") == CUDA_SUCCESS &&
      d->cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, s->max_shared_optin) ==
          CUDA_SUCCESS) {
    for (int i = 1; i < RLK_TARGET_CLUSTER_SIZES; i++) {
      const unsigned c = 1u << i;
      CUlaunchAttribute attr;
      memset(&attr, 0, sizeof attr);
      attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attr.value.dim[0] = c, attr.value.dim[1] = 1, attr.value.dim[2] = 1;
      const CUlaunchConfig cfg = {c * (unsigned)target->multiprocessors, 1, 1, 128, 1, 1,
                                  (unsigned)s->max_shared_optin, NULL, &attr, 1};
      int n = 0;
      if (d->cuOccupancyMaxActiveClusters(&n, f, &cfg) == CUDA_SUCCESS && n > 0) target->cluster_sms[i] = (int)c * n;
    }
  }
  d->cuModuleUnload(m);
}

/* Reads the device description into info (device queries: no context needs to be current). */
static rlk_status describe_device(cuda_state *s, rlk_target *target, rlk_device_info *info) {
  const rlk_cuda_driver *d = s->drv;
  CUresult r;
  char name[sizeof info->name];
  if ((r = d->cuDeviceGetName(name, (int)sizeof name, s->device)) != CUDA_SUCCESS)
    return rlk_cuda_fail(RLK_ERR_BACKEND, "cuDeviceGetName", r);
  name[sizeof name - 1] = '\0';
  rlk_format(info->name, sizeof info->name, "%s", name);
  int major = 0, minor = 0, sms = 0, optin = 0;
  if ((r = d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                   s->device)) != CUDA_SUCCESS ||
      (r = d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                   s->device)) != CUDA_SUCCESS ||
      (r = d->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, s->device)) !=
          CUDA_SUCCESS)
    return rlk_cuda_fail(RLK_ERR_BACKEND, "cuDeviceGetAttribute", r);
  if (d->cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                              s->device) != CUDA_SUCCESS ||
      optin < (int)RLK_CUDA_DEFAULT_SHARED_LIMIT)
    optin = (int)RLK_CUDA_DEFAULT_SHARED_LIMIT;
  s->max_shared_optin = optin;
  int per_sm = 0;
  if (d->cuDeviceGetAttribute(&per_sm, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, s->device) !=
      CUDA_SUCCESS)
    per_sm = 0;
  size_t total = 0;
  if ((r = d->cuDeviceTotalMem(&total, s->device)) != CUDA_SUCCESS)
    return rlk_cuda_fail(RLK_ERR_BACKEND, "cuDeviceTotalMem", r);
  info->compute_major = major;
  info->compute_minor = minor;
  info->multiprocessors = sms;
  info->total_memory = total;
  info->compile_only = 0;
  rlk_target_for_cuda_device(major, minor, sms, (size_t)optin, per_sm > 0 ? (size_t)per_sm : 0, target);
  ctx_scope scope;
  if (ctx_switch(s, &scope) == CUDA_SUCCESS) {
    probe_cluster_sms(s, target);
    ctx_leave(s, &scope, RLK_OK);
  }
  rlk_status st = rlk_target_apply_env(RLK_BACKEND_CUDA, target);
  rlk_format(info->target, sizeof info->target, "%s", target->name);
  return st;
}

/* Retains the device's primary context. RLK_ERR_UNAVAILABLE only when there is no CUDA
 * here at all (no driver, cuInit refused, no device), the one status that lets an automatic
 * backend choice move on to the next backend. */
static rlk_status open_device(int ordinal, cuda_state *s) {
  rlk_status st = rlk_cuda_driver_load(&s->drv);
  if (st != RLK_OK) return st;
  const rlk_cuda_driver *d = s->drv;
  CUresult r = d->cuInit(0);
  if (r != CUDA_SUCCESS) {
    /* No device, a stub library, a driver/kernel-module mismatch: all mean "no CUDA here". */
    return rlk_cuda_fail(RLK_ERR_UNAVAILABLE, "cuInit", r);
  }
  int count = 0;
  r = d->cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) return rlk_cuda_fail(RLK_ERR_UNAVAILABLE, "cuDeviceGetCount", r);
  if (count <= 0) return rlk_error(RLK_ERR_UNAVAILABLE, "cuda: no CUDA device is present");
  /* From here CUDA is present: a failure is the request's or the device's, not a reason to
   * look for another backend. */
  if (ordinal >= count)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "cuda: device %d requested, but only %d present",
                     ordinal, count);
  if ((r = d->cuDeviceGet(&s->device, ordinal)) != CUDA_SUCCESS)
    return rlk_cuda_fail(RLK_ERR_BACKEND, "cuDeviceGet", r);
  if ((r = d->cuDevicePrimaryCtxRetain(&s->ctx, s->device)) != CUDA_SUCCESS) {
    s->ctx = NULL;
    return rlk_cuda_fail(RLK_ERR_BACKEND, "cuDevicePrimaryCtxRetain", r);
  }
  s->ordinal = ordinal;
  /* Checks that the context can be made current, then hands the thread back as it found it:
   * opening leaves no context current that was not current before. */
  ctx_scope scope;
  st = ctx_enter(s, &scope);
  return st == RLK_OK ? ctx_leave(s, &scope, RLK_OK) : st;
}

rlk_status rlk_cuda_backend_open(int ordinal, rlk_backend_impl **out) {
  rlk_backend_impl *b;
  rlk_status st = rlk_backend_alloc("cuda", ordinal, sizeof(cuda_state), out, &b);
  if (st != RLK_OK) return st;
  cuda_state *s = state_of(b);
  st = open_device(ordinal, s);
  if (st == RLK_OK) st = describe_device(s, &b->target, &b->info);
  if (st != RLK_OK) {
    cuda_destroy(b);
    return st;
  }
  b->kind = RLK_BACKEND_CUDA;
  b->name = "cuda";
  b->module_load = cuda_module_load;
  b->module_unload = cuda_module_unload;
  b->get_function = cuda_get_function;
  b->launch = cuda_launch;
  b->mem_alloc = cuda_mem_alloc;
  b->mem_free = cuda_mem_free;
  b->copy_to_device = cuda_copy_to_device;
  b->copy_to_host = cuda_copy_to_host;
  b->mem_set = cuda_mem_set;
  b->synchronize = cuda_synchronize;
  b->event_create = cuda_event_create;
  b->event_record = cuda_event_record;
  b->event_elapsed_ms = cuda_event_elapsed_ms;
  b->event_destroy = cuda_event_destroy;
  b->tensor_map_encode = rlk_cuda_tma_encode;
  b->destroy = cuda_destroy;
  rlk_debug("cuda: device %d: %s, cc %d.%d, %d SMs (in clusters of 2 / 4 / 8: %d / %d / %d), target %s",
            ordinal, b->info.name, b->info.compute_major, b->info.compute_minor, b->info.multiprocessors,
            b->target.cluster_sms[1], b->target.cluster_sms[2], b->target.cluster_sms[3], b->info.target);
  *out = b;
  return RLK_OK;
}

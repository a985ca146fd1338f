/* hip_backend.c - the AMD GPU backend over the HIP runtime (libamdhip64, opened with
 * dlopen). The HIP runtime keeps a current device per thread, shared with every other HIP
 * user in the process (PyTorch included). The backend may be called from any thread, so
 * every entry point selects the backend's device for its own duration only (device_enter /
 * device_leave) and hands the thread back on the device it found. */
#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/binary_image.h"
#include "backend/hip/hip_runtime.h"
#include "core/core.h"
#include "core/dynlib.h"

#define EM_AMDGPU_MACHINE 224

/* ---- the runtime table, loaded once per process ----------------------------------- */

static rlk_hip_runtime g_hip;
static int g_hip_loaded;
static pthread_mutex_t g_hip_lock = PTHREAD_MUTEX_INITIALIZER;

/* Loads the runtime and fills g_hip; the caller holds g_hip_lock. */
static rlk_status hip_load_locked(void) {
  rlk_hip_runtime h;
  memset(&h, 0, sizeof h);
  hipError_t (*props_r0600)(void *, int) = NULL;
  hipError_t (*props_old)(void *, int) = NULL;
  const rlk_dynlib_symbol symbols[] = {
      {"hipInit", &h.hipInit, 0},
      {"hipGetErrorName", &h.hipGetErrorName, 0},
      {"hipGetErrorString", &h.hipGetErrorString, 0},
      {"hipGetDeviceCount", &h.hipGetDeviceCount, 0},
      {"hipGetDevice", &h.hipGetDevice, 0},
      {"hipSetDevice", &h.hipSetDevice, 0},
      {"hipDeviceGet", &h.hipDeviceGet, 0},
      {"hipDeviceGetName", &h.hipDeviceGetName, 0},
      {"hipDeviceGetAttribute", &h.hipDeviceGetAttribute, 0},
      {"hipDeviceTotalMem", &h.hipDeviceTotalMem, 0},
      {"hipGetDevicePropertiesR0600", &props_r0600, 1},
      {"hipGetDeviceProperties", &props_old, 1},
      {"hipModuleLoadData", &h.hipModuleLoadData, 0},
      {"hipModuleUnload", &h.hipModuleUnload, 0},
      {"hipModuleGetFunction", &h.hipModuleGetFunction, 0},
      {"hipModuleLaunchKernel", &h.hipModuleLaunchKernel, 0},
      {"hipMalloc", &h.hipMalloc, 0},
      {"hipFree", &h.hipFree, 0},
      {"hipMemcpy", &h.hipMemcpy, 0},
      {"hipMemset", &h.hipMemset, 0},
      {"hipStreamSynchronize", &h.hipStreamSynchronize, 0},
      {"hipEventCreate", &h.hipEventCreate, 0},
      {"hipEventRecord", &h.hipEventRecord, 0},
      {"hipEventSynchronize", &h.hipEventSynchronize, 0},
      {"hipEventElapsedTime", &h.hipEventElapsedTime, 0},
      {"hipEventDestroy", &h.hipEventDestroy, 0},
  };
  const char *override = rlk_env("RLK_HIP_LIB");
  const char *const defaults[] = {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5",
                                  "libamdhip64.so", "/opt/rocm/lib/libamdhip64.so"};
  const char *const *candidates = override ? &override : defaults;
  size_t ncandidates = override ? 1 : sizeof defaults / sizeof defaults[0];
  rlk_dynlib lib;
  rlk_status st = rlk_dynlib_open(&lib, "hip", candidates, ncandidates, symbols,
                                  sizeof symbols / sizeof symbols[0]);
  if (st != RLK_OK) return st;
  h.hipGetDeviceProperties = props_r0600 ? props_r0600 : props_old;
  /* The library stays open for the life of the process, like the CUDA driver. */
  g_hip = h;
  g_hip_loaded = 1;
  return RLK_OK;
}

/* Loads libamdhip64 on first success and keeps it; a failure is retried on the next open
 * (the library may have been installed, or RLK_HIP_LIB changed, in between). */
static rlk_status hip_runtime_load(const rlk_hip_runtime **out) {
  pthread_mutex_lock(&g_hip_lock);
  rlk_status st = g_hip_loaded ? RLK_OK : hip_load_locked();
  pthread_mutex_unlock(&g_hip_lock);
  *out = st == RLK_OK ? &g_hip : NULL;
  return st;
}

/* "hip: <what>: <hipErrorName>: <description>". */
static rlk_status hip_fail(rlk_status status, const char *what, hipError_t e) {
  const char *name = g_hip.hipGetErrorName ? g_hip.hipGetErrorName(e) : NULL;
  const char *text = g_hip.hipGetErrorString ? g_hip.hipGetErrorString(e) : NULL;
  if (!name) return rlk_error(status, "hip: %s: hipError_t %d", what, e);
  return rlk_error(status, "hip: %s: %s: %s", what, name, text ? text : "no description");
}

/* ---- the backend ------------------------------------------------------------------ */

typedef struct hip_state {
  const rlk_hip_runtime *rt;
  int ordinal;
} hip_state;

static hip_state *state_of(rlk_backend_impl *self) { return self->impl; }

/* The caller's current device, noted by device_enter and put back by device_leave. */
typedef struct device_scope {
  int prev; /* -1 when it could not be read: then nothing is restored */
  int switched;
} device_scope;

/* Selects the backend's device on this thread; the runtime's result of the switch. */
static inline hipError_t device_switch(hip_state *s, device_scope *scope) {
  scope->prev = -1;
  scope->switched = 0;
  int cur = -1;
  if (s->rt->hipGetDevice(&cur) == hipSuccess) {
    if (cur == s->ordinal) return hipSuccess;
    scope->prev = cur;
  }
  hipError_t e = s->rt->hipSetDevice(s->ordinal);
  if (e != hipSuccess) return e;
  scope->switched = scope->prev >= 0;
  return hipSuccess;
}

/* Selects the backend's device on this thread for one entry point; one hipGetDevice and no
 * switch when the caller is already on it. */
static inline rlk_status device_enter(hip_state *s, device_scope *scope) {
  hipError_t e = device_switch(s, scope);
  return e == hipSuccess ? RLK_OK : hip_fail(RLK_ERR_BACKEND, "hipSetDevice", e);
}

/* Logs a failed runtime call of an entry point that returns nothing (an unload, a destroy) as a
 * warning, leaving this thread's last error alone: such calls run on error paths too, where the
 * message is the failure being reported. */
static void hip_warn(hip_state *s, const char *what, hipError_t e) {
  const char *name = s->rt->hipGetErrorName ? s->rt->hipGetErrorName(e) : NULL;
  const char *text = s->rt->hipGetErrorString ? s->rt->hipGetErrorString(e) : NULL;
  if (name) rlk_warn("hip: %s: %s: %s", what, name, text ? text : "no description");
  else rlk_warn("hip: %s: hipError_t %d", what, e);
}

/* Puts back the device device_enter found and returns `status` unchanged. A failure to
 * restore is only logged: the entry point's own outcome is what the caller needs. */
static inline rlk_status device_leave(hip_state *s, const device_scope *scope,
                                      rlk_status status) {
  if (!scope->switched) return status;
  hipError_t e = s->rt->hipSetDevice(scope->prev);
  if (e != hipSuccess) {
    const char *name = s->rt->hipGetErrorName ? s->rt->hipGetErrorName(e) : NULL;
    rlk_warn("hip: cannot restore the caller's device %d: %s", scope->prev,
             name ? name : "unknown error");
  }
  return status;
}

/* device_leave for an entry point whose last runtime call `what` returned e: RLK_OK, or that
 * call's RLK_ERR_BACKEND. */
static inline rlk_status device_leave_call(hip_state *s, const device_scope *scope, hipError_t e, const char *what) {
  return device_leave(s, scope, e == hipSuccess ? RLK_OK : hip_fail(RLK_ERR_BACKEND, what, e));
}

static rlk_status hip_module_load(rlk_backend_impl *self, const void *image, size_t size,
                                  void **module) {
  hip_state *s = state_of(self);
  if (!module) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hip: module_load: module is NULL");
  *module = NULL;
  if (!image || size == 0) return rlk_error(RLK_ERR_BACKEND, "hip: module_load: empty image");
  static const char bundle_magic[] = "__CLANG_OFFLOAD_BUNDLE__";
  if (size >= sizeof bundle_magic - 1 && memcmp(image, bundle_magic, sizeof bundle_magic - 1) == 0) {
    /* An offload bundle: the runtime picks the code object for this device. */
  } else {
    rlk_status st = rlk_elf_image_check(image, size, EM_AMDGPU_MACHINE, "hip");
    if (st != RLK_OK) return st;
  }
  device_scope scope;
  rlk_status st = device_enter(s, &scope);
  if (st != RLK_OK) return st;
  hipModule_t mod = NULL;
  hipError_t e = s->rt->hipModuleLoadData(&mod, image);
  if (e != hipSuccess)
    return device_leave(s, &scope, hip_fail(RLK_ERR_BACKEND, "hipModuleLoadData", e));
  *module = mod;
  return device_leave(s, &scope, RLK_OK);
}

static void hip_module_unload(rlk_backend_impl *self, void *module) {
  hip_state *s = state_of(self);
  if (!module) return;
  device_scope scope;
  hipError_t e = device_switch(s, &scope);
  if (e != hipSuccess) {
    hip_warn(s, "module_unload: hipSetDevice", e);
    return;
  }
  e = s->rt->hipModuleUnload((hipModule_t)module);
  if (e != hipSuccess) hip_warn(s, "hipModuleUnload", e);
  device_leave(s, &scope, RLK_OK);
}

static rlk_status hip_get_function(rlk_backend_impl *self, void *module, const char *name,
                                   void **fn) {
  hip_state *s = state_of(self);
  if (!module || !name || !fn)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hip: get_function: NULL argument");
  *fn = NULL;
  device_scope scope;
  rlk_status st = device_enter(s, &scope);
  if (st != RLK_OK) return st;
  hipFunction_t f = NULL;
  hipError_t e = s->rt->hipModuleGetFunction(&f, (hipModule_t)module, name);
  if (e != hipSuccess) {
    char what[320];
    rlk_format(what, sizeof what, "hipModuleGetFunction(\"%s\")", name);
    return device_leave(s, &scope, hip_fail(RLK_ERR_BACKEND, what, e));
  }
  *fn = f;
  return device_leave(s, &scope, RLK_OK);
}

static rlk_status hip_launch(rlk_backend_impl *self, void *fn, const rlk_launch_dims *dims,
                             void *stream, void **args) {
  hip_state *s = state_of(self);
  if (!fn || !dims)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hip: launch: NULL function or dims");
  if (dims->shared_bytes > 0xffffffffu)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hip: launch: %zu bytes of shared memory",
                     dims->shared_bytes);
  if (dims->cluster > 1)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hip: launch: clusters of blocks are CUDA's (sm_90 or later)");
  device_scope scope;
  rlk_status st = device_enter(s, &scope);
  if (st != RLK_OK) return st;
  /* No opt-in step: AMD GPUs give a block all of its LDS without one. */
  hipError_t e = s->rt->hipModuleLaunchKernel(
      (hipFunction_t)fn, dims->grid[0], dims->grid[1], dims->grid[2], dims->block[0],
      dims->block[1], dims->block[2], (unsigned int)dims->shared_bytes, (hipStream_t)stream,
      args, NULL);
  return device_leave_call(s, &scope, e, "hipModuleLaunchKernel");
}

static rlk_status hip_mem_alloc(rlk_backend_impl *self, size_t bytes, void **out) {
  hip_state *s = state_of(self);
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hip: mem_alloc: out is NULL");
  *out = NULL;
  if (bytes == 0) return RLK_OK;
  device_scope scope;
  rlk_status st = device_enter(s, &scope);
  if (st != RLK_OK) return st;
  void *p = NULL;
  hipError_t e = s->rt->hipMalloc(&p, bytes);
  if (e == hipErrorOutOfMemory)
    return device_leave(s, &scope, hip_fail(RLK_ERR_OUT_OF_MEMORY, "hipMalloc", e));
  if (e != hipSuccess) return device_leave(s, &scope, hip_fail(RLK_ERR_BACKEND, "hipMalloc", e));
  *out = p;
  return device_leave(s, &scope, RLK_OK);
}

static rlk_status hip_mem_free(rlk_backend_impl *self, void *ptr) {
  hip_state *s = state_of(self);
  if (!ptr) return RLK_OK;
  device_scope scope;
  rlk_status st = device_enter(s, &scope);
  if (st != RLK_OK) return st;
  hipError_t e = s->rt->hipFree(ptr);
  return device_leave_call(s, &scope, e, "hipFree");
}

static rlk_status hip_copy(hip_state *s, void *dst, const void *src, size_t bytes, int kind,
                           const char *what) {
  if (bytes == 0) return RLK_OK;
  if (!dst || !src) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hip: %s: NULL pointer", what);
  device_scope scope;
  rlk_status st = device_enter(s, &scope);
  if (st != RLK_OK) return st;
  hipError_t e = s->rt->hipMemcpy(dst, src, bytes, kind);
  return device_leave_call(s, &scope, e, "hipMemcpy");
}

static rlk_status hip_copy_to_device(rlk_backend_impl *self, void *dst, const void *src,
                                     size_t bytes) {
  return hip_copy(state_of(self), dst, src, bytes, hipMemcpyHostToDevice, "copy_to_device");
}

static rlk_status hip_copy_to_host(rlk_backend_impl *self, void *dst, const void *src,
                                   size_t bytes) {
  return hip_copy(state_of(self), dst, src, bytes, hipMemcpyDeviceToHost, "copy_to_host");
}

static rlk_status hip_mem_set(rlk_backend_impl *self, void *dst, int value, size_t bytes) {
  hip_state *s = state_of(self);
  if (bytes == 0) return RLK_OK;
  if (!dst) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hip: mem_set: NULL pointer");
  device_scope scope;
  rlk_status st = device_enter(s, &scope);
  if (st != RLK_OK) return st;
  hipError_t e = s->rt->hipMemset(dst, value, bytes);
  if (e != hipSuccess) return device_leave(s, &scope, hip_fail(RLK_ERR_BACKEND, "hipMemset", e));
  /* hipMemset may return before the fill lands; callers are promised a synchronous fill. */
  e = s->rt->hipStreamSynchronize(NULL);
  return device_leave_call(s, &scope, e, "hipStreamSynchronize");
}

static rlk_status hip_synchronize(rlk_backend_impl *self, void *stream) {
  hip_state *s = state_of(self);
  device_scope scope;
  rlk_status st = device_enter(s, &scope);
  if (st != RLK_OK) return st;
  hipError_t e = s->rt->hipStreamSynchronize((hipStream_t)stream);
  return device_leave_call(s, &scope, e, "hipStreamSynchronize");
}

static rlk_status hip_event_create(rlk_backend_impl *self, void **event) {
  hip_state *s = state_of(self);
  if (!event) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hip: event_create: event is NULL");
  *event = NULL;
  device_scope scope;
  rlk_status st = device_enter(s, &scope);
  if (st != RLK_OK) return st;
  hipEvent_t ev = NULL;
  hipError_t e = s->rt->hipEventCreate(&ev);
  if (e != hipSuccess)
    return device_leave(s, &scope, hip_fail(RLK_ERR_BACKEND, "hipEventCreate", e));
  *event = ev;
  return device_leave(s, &scope, RLK_OK);
}

static rlk_status hip_event_record(rlk_backend_impl *self, void *event, void *stream) {
  hip_state *s = state_of(self);
  if (!event) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hip: event_record: event is NULL");
  device_scope scope;
  rlk_status st = device_enter(s, &scope);
  if (st != RLK_OK) return st;
  hipError_t e = s->rt->hipEventRecord((hipEvent_t)event, (hipStream_t)stream);
  return device_leave_call(s, &scope, e, "hipEventRecord");
}

static rlk_status hip_event_elapsed_ms(rlk_backend_impl *self, void *start, void *end,
                                       float *ms) {
  hip_state *s = state_of(self);
  if (!start || !end || !ms)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hip: event_elapsed_ms: NULL argument");
  device_scope scope;
  rlk_status st = device_enter(s, &scope);
  if (st != RLK_OK) return st;
  hipError_t e = s->rt->hipEventSynchronize((hipEvent_t)end);
  if (e != hipSuccess)
    return device_leave(s, &scope, hip_fail(RLK_ERR_BACKEND, "hipEventSynchronize", e));
  e = s->rt->hipEventElapsedTime(ms, (hipEvent_t)start, (hipEvent_t)end);
  return device_leave_call(s, &scope, e, "hipEventElapsedTime");
}

static void hip_event_destroy(rlk_backend_impl *self, void *event) {
  hip_state *s = state_of(self);
  if (!event) return;
  device_scope scope;
  hipError_t e = device_switch(s, &scope);
  if (e != hipSuccess) {
    hip_warn(s, "event_destroy: hipSetDevice", e);
    return;
  }
  e = s->rt->hipEventDestroy((hipEvent_t)event);
  if (e != hipSuccess) hip_warn(s, "hipEventDestroy", e);
  device_leave(s, &scope, RLK_OK);
}

static void hip_destroy(rlk_backend_impl *self) {
  if (!self) return;
  free(self->impl);
  free(self);
}

/* ---- the target ------------------------------------------------------------------- */

/* Finds the gfx architecture name in a device-properties buffer whose layout depends on the
 * ROCm version: the first "gfx<alnum>" string ended by NUL or ':' after the 256-byte name
 * field (gcnArchName, "gfx90a:sramecc+:xnack-"), written into `out` without its feature
 * flags. Returns 0 when none is found. */
static int find_gfx_arch(const unsigned char *props, size_t size, char *out, size_t out_size) {
  for (size_t i = 256; i + 4 < size; i++) {
    if (memcmp(props + i, "gfx", 3) != 0) continue;
    size_t n = 3;
    while (i + n < size && isalnum(props[i + n])) n++;
    if (n == 3 || i + n >= size) continue;
    if (props[i + n] != '\0' && props[i + n] != ':') continue;
    if (n >= out_size) continue;
    memcpy(out, props + i, n);
    out[n] = '\0';
    return 1;
  }
  return 0;
}

/* ---- opening ---------------------------------------------------------------------- */

static rlk_status describe_device(hip_state *s, rlk_target *target, rlk_device_info *info) {
  const rlk_hip_runtime *rt = s->rt;
  hipDevice_t dev = 0;
  hipError_t e = rt->hipDeviceGet(&dev, s->ordinal);
  if (e != hipSuccess) return hip_fail(RLK_ERR_BACKEND, "hipDeviceGet", e);
  char name[sizeof info->name];
  if ((e = rt->hipDeviceGetName(name, (int)sizeof name, dev)) != hipSuccess)
    return hip_fail(RLK_ERR_BACKEND, "hipDeviceGetName", e);
  name[sizeof name - 1] = '\0';
  rlk_format(info->name, sizeof info->name, "%s", name);
  int cus = 0;
  if ((e = rt->hipDeviceGetAttribute(&cus, hipDeviceAttributeMultiprocessorCount, s->ordinal)) !=
      hipSuccess)
    return hip_fail(RLK_ERR_BACKEND, "hipDeviceGetAttribute", e);
  info->multiprocessors = cus;
  size_t total = 0;
  if ((e = rt->hipDeviceTotalMem(&total, dev)) != hipSuccess)
    return hip_fail(RLK_ERR_BACKEND, "hipDeviceTotalMem", e);
  info->total_memory = total;
  info->compute_major = 0; /* CUDA compute capability only */
  info->compute_minor = 0;
  info->compile_only = 0;

  info->target[0] = '\0';
  if (rt->hipGetDeviceProperties) {
    unsigned char *props = calloc(1, RLK_HIP_PROPS_BYTES);
    if (!props) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "hip: out of memory");
    e = rt->hipGetDeviceProperties(props, s->ordinal);
    if (e == hipSuccess)
      find_gfx_arch(props, RLK_HIP_PROPS_BYTES, info->target, sizeof info->target);
    free(props);
  }
  memset(target, 0, sizeof *target);
  if (info->target[0]) {
    rlk_status st = rlk_target_parse(info->target, target);
    if (st != RLK_OK) return rlk_error_wrap(st, "hip: device %d", s->ordinal);
  }
  target->multiprocessors = cus;
  rlk_status st = rlk_target_apply_env(RLK_BACKEND_HIP, target);
  if (st != RLK_OK) return st;
  rlk_format(info->target, sizeof info->target, "%s", target->name);
  if (!info->target[0])
    return rlk_error(RLK_ERR_UNSUPPORTED,
                     "hip: cannot read the gfx architecture of device %d; set RLK_ARCH (e.g. "
                     "RLK_ARCH=gfx90a)",
                     s->ordinal);
  return RLK_OK;
}

/* Finds the device. RLK_ERR_UNAVAILABLE only when there is no HIP here at all (no runtime,
 * hipInit refused, no device), the one status that lets an automatic backend choice move on
 * to the next backend. */
static rlk_status open_device(int ordinal, hip_state *s) {
  rlk_status st = hip_runtime_load(&s->rt);
  if (st != RLK_OK) return st;
  const rlk_hip_runtime *rt = s->rt;
  hipError_t e = rt->hipInit(0);
  if (e != hipSuccess) {
    /* ROCm answers hipInit with an error when it finds no GPU it can drive. */
    const char *name = rt->hipGetErrorName(e);
    return rlk_error(RLK_ERR_UNAVAILABLE, "hip: no usable AMD GPU (hipInit: %s)",
                     name ? name : "error");
  }
  int count = 0;
  e = rt->hipGetDeviceCount(&count);
  if (e == hipErrorNoDevice || (e == hipSuccess && count <= 0))
    return rlk_error(RLK_ERR_UNAVAILABLE, "hip: no AMD GPU is present");
  if (e != hipSuccess) return hip_fail(RLK_ERR_UNAVAILABLE, "hipGetDeviceCount", e);
  /* From here HIP is present: a failure is the request's or the device's, not a reason to
   * look for another backend. */
  if (ordinal >= count)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hip: device %d requested, but only %d present",
                     ordinal, count);
  s->ordinal = ordinal;
  /* Checks that the device can be selected, then hands the thread back on the device it
   * was on. */
  device_scope scope;
  st = device_enter(s, &scope);
  return st == RLK_OK ? device_leave(s, &scope, RLK_OK) : st;
}

rlk_status rlk_hip_backend_open(int ordinal, rlk_backend_impl **out) {
  rlk_backend_impl *b;
  rlk_status st = rlk_backend_alloc("hip", ordinal, sizeof(hip_state), out, &b);
  if (st != RLK_OK) return st;
  hip_state *s = state_of(b);
  st = open_device(ordinal, s);
  if (st == RLK_OK) st = describe_device(s, &b->target, &b->info);
  if (st != RLK_OK) {
    hip_destroy(b);
    return st;
  }
  b->kind = RLK_BACKEND_HIP;
  b->name = "hip";
  b->module_load = hip_module_load;
  b->module_unload = hip_module_unload;
  b->get_function = hip_get_function;
  b->launch = hip_launch;
  b->mem_alloc = hip_mem_alloc;
  b->mem_free = hip_mem_free;
  b->copy_to_device = hip_copy_to_device;
  b->copy_to_host = hip_copy_to_host;
  b->mem_set = hip_mem_set;
  b->synchronize = hip_synchronize;
  b->event_create = hip_event_create;
  b->event_record = hip_event_record;
  b->event_elapsed_ms = hip_event_elapsed_ms;
  b->event_destroy = hip_event_destroy;
  b->destroy = hip_destroy;
  rlk_debug("hip: device %d: %s, %d CUs, target %s", ordinal, b->info.name,
            b->info.multiprocessors, b->info.target);
  *out = b;
  return RLK_OK;
}

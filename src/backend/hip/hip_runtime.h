/* hip_runtime.h - the slice of the HIP runtime API this library uses, declared here so the
 * library builds without ROCm; the entry points are resolved from libamdhip64 at run time.
 * Only types and values that have kept their ABI across ROCm 5.x to 7.x are named. The
 * device-properties struct has not (its layout changed in ROCm 6), so it is never declared:
 * the backend reads the one field it needs from an oversized buffer. Internal. */
#ifndef RLK_HIP_RUNTIME_H
#define RLK_HIP_RUNTIME_H

#include <stddef.h>

typedef int hipError_t; /* hipSuccess or a hipError* code */
typedef int hipDevice_t;
typedef struct ihipModule_t *hipModule_t;
typedef struct ihipModuleSymbol_t *hipFunction_t;
typedef struct ihipStream_t *hipStream_t;
typedef struct ihipEvent_t *hipEvent_t;

enum {
  hipSuccess = 0,
  hipErrorOutOfMemory = 2,
  hipErrorNoDevice = 100,
  hipErrorInvalidDevice = 101
};

/* hipDeviceAttribute_t values (unchanged from ROCm 5.0 on). */
enum {
  hipDeviceAttributeComputeCapabilityMajor = 23,
  hipDeviceAttributeComputeCapabilityMinor = 61,
  hipDeviceAttributeMultiprocessorCount = 63
};

/* hipMemcpyKind values. */
enum { hipMemcpyHostToDevice = 1, hipMemcpyDeviceToHost = 2 };

/* Large enough for any hipDeviceProp_t so far (about 1.5 KiB in ROCm 6) with room to grow. */
#define RLK_HIP_PROPS_BYTES 16384

typedef struct rlk_hip_runtime {
  hipError_t (*hipInit)(unsigned int flags);
  const char *(*hipGetErrorName)(hipError_t error);
  const char *(*hipGetErrorString)(hipError_t error);
  hipError_t (*hipGetDeviceCount)(int *count);
  hipError_t (*hipGetDevice)(int *device);
  hipError_t (*hipSetDevice)(int device);
  hipError_t (*hipDeviceGet)(hipDevice_t *device, int ordinal);
  hipError_t (*hipDeviceGetName)(char *name, int length, hipDevice_t device);
  hipError_t (*hipDeviceGetAttribute)(int *value, int attribute, int device);
  hipError_t (*hipDeviceTotalMem)(size_t *bytes, hipDevice_t device);
  /* hipGetDevicePropertiesR0600 where present (ROCm 6+), else the older layout's entry. */
  hipError_t (*hipGetDeviceProperties)(void *props, int device);
  hipError_t (*hipModuleLoadData)(hipModule_t *module, const void *image);
  hipError_t (*hipModuleUnload)(hipModule_t module);
  hipError_t (*hipModuleGetFunction)(hipFunction_t *fn, hipModule_t module, const char *name);
  hipError_t (*hipModuleLaunchKernel)(hipFunction_t fn, unsigned int grid_x, unsigned int grid_y,
                                      unsigned int grid_z, unsigned int block_x,
                                      unsigned int block_y, unsigned int block_z,
                                      unsigned int shared_bytes, hipStream_t stream,
                                      void **params, void **extra);
  hipError_t (*hipMalloc)(void **ptr, size_t bytes);
  hipError_t (*hipFree)(void *ptr);
  hipError_t (*hipMemcpy)(void *dst, const void *src, size_t bytes, int kind);
  hipError_t (*hipMemset)(void *dst, int value, size_t bytes);
  hipError_t (*hipStreamSynchronize)(hipStream_t stream);
  hipError_t (*hipEventCreate)(hipEvent_t *event);
  hipError_t (*hipEventRecord)(hipEvent_t event, hipStream_t stream);
  hipError_t (*hipEventSynchronize)(hipEvent_t event);
  hipError_t (*hipEventElapsedTime)(float *ms, hipEvent_t start, hipEvent_t end);
  hipError_t (*hipEventDestroy)(hipEvent_t event);
} rlk_hip_runtime;

#endif

/* cuda_driver.h - the slice of the CUDA driver API this library uses, declared here so the
 * library builds without the toolkit, plus the table of entry points resolved from
 * libcuda.so.1 at run time. The types and values mirror the driver's ABI, which is stable
 * across driver versions for everything named here. Internal to src/backend/cuda. */
#ifndef RLK_CUDA_DRIVER_H
#define RLK_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "rlk.h"

/* ---- types ------------------------------------------------------------------------ */

typedef int CUresult;                  /* CUDA_SUCCESS or a CUDA_ERROR_* code */
typedef int CUdevice;                  /* device ordinal handle */
typedef unsigned long long CUdeviceptr; /* device address (the 64-bit "_v2" form) */
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

/* An encoded tensor map: 128 opaque bytes, 64-byte aligned (what cp.async.bulk.tensor reads). */
typedef struct CUtensorMap {
  _Alignas(64) uint64_t opaque[16];
} CUtensorMap;

/* ---- values ----------------------------------------------------------------------- */

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_STUB_LIBRARY = 34,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
  CUDA_ERROR_INVALID_PTX = 218,
  CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
  CUDA_ERROR_NOT_FOUND = 500
};

/* CUdevice_attribute values. */
enum {
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
};

/* CUfunction_attribute values. */
enum { CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 };

/* CUevent_flags. */
enum { CU_EVENT_DEFAULT = 0 };

/* CUtensorMapDataType values (only those rlk dtypes map to). */
enum {
  CU_TENSOR_MAP_DATA_TYPE_INT32 = 3,
  CU_TENSOR_MAP_DATA_TYPE_INT64 = 5,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT64 = 8,
  CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9
};
enum { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 };
enum { CU_TENSOR_MAP_SWIZZLE_NONE = 0, CU_TENSOR_MAP_SWIZZLE_128B = 3 };
enum { CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3 };
enum { CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2 };
enum { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 };

/* cuLaunchKernelEx's configuration and attributes (CUDA 12). Only the attributes used here are
 * named; the value is the driver's 64-byte union, of which they read the leading int (or, the
 * cluster's, the leading three). */
enum { CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6 };
typedef struct CUlaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int value;
    unsigned int dim[3];
    unsigned long long align;
  } value;
} CUlaunchAttribute;
typedef struct CUlaunchConfig {
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute *attrs;
  unsigned int numAttrs;
} CUlaunchConfig;

/* Kernels may use up to this much dynamic shared memory without opting in per function. */
#define RLK_CUDA_DEFAULT_SHARED_LIMIT (48u * 1024u)

/* ---- entry points ----------------------------------------------------------------- */

/* Every function the backend calls, resolved by name from libcuda.so.1 ("_v2" symbols where
 * the driver has them). Enum-typed parameters are passed as int, which is their ABI. */
typedef struct rlk_cuda_driver {
  CUresult (*cuInit)(unsigned int flags);
  CUresult (*cuGetErrorName)(CUresult error, const char **name);
  CUresult (*cuGetErrorString)(CUresult error, const char **text);
  CUresult (*cuDeviceGetCount)(int *count);
  CUresult (*cuDeviceGet)(CUdevice *device, int ordinal);
  CUresult (*cuDeviceGetName)(char *name, int length, CUdevice device);
  CUresult (*cuDeviceGetAttribute)(int *value, int attribute, CUdevice device);
  CUresult (*cuDeviceTotalMem)(size_t *bytes, CUdevice device);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice device);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice device);
  CUresult (*cuCtxGetCurrent)(CUcontext *ctx);
  CUresult (*cuCtxSetCurrent)(CUcontext ctx);
  CUresult (*cuCtxSynchronize)(void);
  CUresult (*cuModuleLoadData)(CUmodule *module, const void *image);
  CUresult (*cuModuleUnload)(CUmodule module);
  CUresult (*cuModuleGetFunction)(CUfunction *fn, CUmodule module, const char *name);
  CUresult (*cuFuncSetAttribute)(CUfunction fn, int attribute, int value);
  CUresult (*cuFuncGetAttribute)(int *value, int attribute, CUfunction fn);
  CUresult (*cuLaunchKernel)(CUfunction fn, unsigned int grid_x, unsigned int grid_y,
                             unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                             unsigned int block_z, unsigned int shared_bytes, CUstream stream,
                             void **params, void **extra);
  /* NULL on drivers older than CUDA 12 (launches then never overlap). */
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig *config, CUfunction fn, void **params,
                               void **extra);
  /* optional (CUDA 12): how many clusters of a launch's shape the device holds at once */
  CUresult (*cuOccupancyMaxActiveClusters)(int *clusters, CUfunction fn, const CUlaunchConfig *config);
  CUresult (*cuMemAlloc)(CUdeviceptr *ptr, size_t bytes);
  CUresult (*cuMemFree)(CUdeviceptr ptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void *src, size_t bytes);
  CUresult (*cuMemcpyDtoH)(void *dst, CUdeviceptr src, size_t bytes);
  CUresult (*cuMemsetD8)(CUdeviceptr dst, unsigned char value, size_t count);
  CUresult (*cuStreamSynchronize)(CUstream stream);
  CUresult (*cuEventCreate)(CUevent *event, unsigned int flags);
  CUresult (*cuEventRecord)(CUevent event, CUstream stream);
  CUresult (*cuEventSynchronize)(CUevent event);
  CUresult (*cuEventElapsedTime)(float *ms, CUevent start, CUevent end);
  CUresult (*cuEventDestroy)(CUevent event);
  /* NULL on drivers older than CUDA 12 (no tensor maps). */
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap *map, int dtype, uint32_t rank, void *base,
                                     const uint64_t *dims, const uint64_t *strides,
                                     const uint32_t *box, const uint32_t *element_strides,
                                     int interleave, int swizzle, int l2_promotion,
                                     int oob_fill);
} rlk_cuda_driver;

/* Loads libcuda.so.1 and resolves the table; after the first success the same table is
 * returned (the library is never closed: unloading a driver that may hold contexts is
 * unsafe). RLK_ERR_UNAVAILABLE with the loader's reason when there is no usable driver. */
rlk_status rlk_cuda_driver_load(const rlk_cuda_driver **out);

/* Sets the last error to "cuda: <what>: <CUDA_ERROR_NAME>: <description>" and returns
 * `status`. `what` is usually the driver function that failed. */
rlk_status rlk_cuda_fail(rlk_status status, const char *what, CUresult result);

/* Makes a CUDA backend's context current for a call made outside the backend's own entry
 * points (tensor-map encoding) and puts the caller's back; use as
 *   rlk_cuda_scope sc; st = rlk_cuda_enter(cuda, &sc); ...; return rlk_cuda_leave(cuda, &sc, st); */
typedef struct rlk_cuda_scope {
  CUcontext prev;
  int switched;
} rlk_cuda_scope;
struct rlk_backend_impl;
rlk_status rlk_cuda_enter(struct rlk_backend_impl *cuda, rlk_cuda_scope *scope);
rlk_status rlk_cuda_leave(struct rlk_backend_impl *cuda, const rlk_cuda_scope *scope, rlk_status status);

#endif

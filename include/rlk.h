/*
 * rlk.h - the public C API of rlk, a runtime that JIT-specializes GPU kernels for
 * RLHF post-training (GRPO, PPO) and caches the compiled code keyed by configuration.
 *
 * Conventions
 *   - Every call returns an rlk_status. On failure, rlk_last_error() returns a
 *     thread-local message with the detail (the compiler log on a compile error,
 *     the offending argument on a bad call). The library never exits or aborts.
 *   - Opaque handles with create/destroy pairs. Nothing here names a CUDA or HIP type:
 *     streams are passed as `void *` (a CUstream or hipStream_t; NULL is the default
 *     stream; ignored on the host backend).
 *   - Launches never synchronize and allocate no device memory.
 *   - One context may be used from several threads at once.
 *
 * C11. The ABI is versioned by the library soname (librlk.so.RLK_VERSION_MAJOR).
 */
#ifndef RLK_H
#define RLK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define RLK_API __attribute__((visibility("default")))
#else
#define RLK_API
#endif

#define RLK_VERSION_MAJOR 0
#define RLK_VERSION_MINOR 1
#define RLK_VERSION_PATCH 0

/* ------------------------------------------------------------------------ */
/* Status codes and errors                                                  */
/* ------------------------------------------------------------------------ */

typedef enum rlk_status {
  RLK_OK = 0,
  RLK_ERR_INVALID_ARGUMENT = 1, /* a bad argument; the message names it */
  RLK_ERR_UNSUPPORTED = 2,      /* valid, but not supported here (dtype, target, feature) */
  RLK_ERR_UNAVAILABLE = 3,      /* a backend, compiler or device library is not present */
  RLK_ERR_COMPILE = 4,          /* the kernel compiler failed; the message holds its log */
  RLK_ERR_JIT_DISABLED = 5,     /* RLK_JIT=0 and the kernel is in no cache; the message names it */
  RLK_ERR_CACHE = 6,            /* the kernel cache could not be used as configured */
  RLK_ERR_BACKEND = 7,          /* the device runtime reported an error */
  RLK_ERR_OUT_OF_MEMORY = 8,
  RLK_ERR_IO = 9,               /* a file could not be read or written */
  RLK_ERR_TIMEOUT = 10,         /* a lock wait ran past RLK_LOCK_TIMEOUT_S */
  RLK_ERR_INTERNAL = 11
} rlk_status;

/* A short, static description of a status code ("invalid argument"). Never NULL. */
RLK_API const char *rlk_status_string(rlk_status status);

/* The detail of the last failed call on this thread, or "" if none failed yet.
 * Valid until the next rlk call on the same thread. */
RLK_API const char *rlk_last_error(void);

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

/* The runtime's version as "MAJOR.MINOR.PATCH". */
RLK_API const char *rlk_version_string(void);

/* The runtime's version as MAJOR * 10000 + MINOR * 100 + PATCH. */
RLK_API int rlk_version(void);

/* ------------------------------------------------------------------------ */
/* Context                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum rlk_backend {
  RLK_BACKEND_AUTO = 0, /* CUDA if a device is present, else HIP, else the host */
  RLK_BACKEND_CUDA = 1,
  RLK_BACKEND_HIP = 2,
  RLK_BACKEND_HOST = 3
} rlk_backend;

typedef enum rlk_log_level {
  RLK_LOG_DEFAULT = -1, /* from RLK_LOG, else warn */
  RLK_LOG_ERROR = 0,
  RLK_LOG_WARN = 1,
  RLK_LOG_INFO = 2,
  RLK_LOG_DEBUG = 3
} rlk_log_level;

typedef struct rlk_context rlk_context;

typedef struct rlk_context_options {
  rlk_backend backend;     /* default RLK_BACKEND_AUTO */
  int device;              /* device ordinal, default 0 */
  const char *cache_dir;   /* writable cache root; NULL: RLK_CACHE_DIR, XDG, ~/.cache/rlk */
  /* Logging goes to stderr and its level is process-wide: a context may raise it (more detail)
   * but never lowers what RLK_LOG or another context asked for. Default RLK_LOG_DEFAULT. */
  rlk_log_level log_level;
  /* Compile-only contexts need no device: kernels are compiled and published to the
   * cache but cannot be launched. Used to precompile for a target on a CPU-only host. */
  int compile_only;
  /* Target to compile for ("sm_90a", "sm_80", "gfx90a", "host"); NULL: from the device
   * (or RLK_ARCH). Required for compile-only CUDA and HIP contexts. */
  const char *target;
} rlk_context_options;

/* Fills `options` with the defaults above. */
RLK_API void rlk_context_options_init(rlk_context_options *options);

/* Creates a context: opens the backend, the compiler for its target and the cache.
 * `options` may be NULL for the defaults. On failure *out is NULL. */
RLK_API rlk_status rlk_context_create(rlk_context **out, const rlk_context_options *options);

/* Destroys a context and unloads its kernels. NULL is a no-op. The caller ensures no
 * launch through it is still running. */
RLK_API void rlk_context_destroy(rlk_context *ctx);

/* The backend a context runs on (never RLK_BACKEND_AUTO). */
RLK_API rlk_backend rlk_context_backend(const rlk_context *ctx);

/* "cuda", "hip" or "host". */
RLK_API const char *rlk_backend_name(rlk_backend backend);

typedef struct rlk_device_info {
  char name[128];          /* "NVIDIA H200", or the CPU model on the host */
  char target[32];         /* the compile target: "sm_90a", "gfx90a", "host-x86_64" */
  char compiler[64];       /* "nvrtc 13.0", "hiprtc 5.2", "clang 14.0.6" */
  int compute_major;       /* CUDA compute capability (0 elsewhere) */
  int compute_minor;
  int multiprocessors;     /* SMs, CUs or CPU cores */
  int compile_only;
  size_t total_memory;     /* bytes of device memory, 0 where unknown */
} rlk_device_info;

/* Describes the device and compiler a context uses. */
RLK_API rlk_status rlk_context_device_info(const rlk_context *ctx, rlk_device_info *info);

/* The list of targets the context's compiler can build for, as a space-separated string
 * ("sm_75 sm_80 ... sm_90a ..."). The string lives as long as the context. */
RLK_API const char *rlk_context_supported_targets(const rlk_context *ctx);

typedef struct rlk_counters {
  uint64_t calls;           /* kernel lookups made by op calls */
  uint64_t memory_hits;     /* served from the in-process table */
  uint64_t disk_hits;       /* loaded from a cache tree */
  uint64_t misses;          /* not in any cache */
  uint64_t compiles;        /* compiler invocations made by this process */
  uint64_t rebuilt;         /* corrupt or mismatched entries quarantined and rebuilt */
  double compile_seconds;   /* wall time spent compiling */
  double load_seconds;      /* wall time spent reading, verifying and loading entries */
} rlk_counters;

/* Reads the context's counters. */
RLK_API rlk_status rlk_context_counters(const rlk_context *ctx, rlk_counters *out);

/* Zeroes the context's counters. */
RLK_API void rlk_context_reset_counters(rlk_context *ctx);

/* The writable cache root in use, or "" when the cache runs in memory only. */
RLK_API const char *rlk_context_cache_dir(const rlk_context *ctx);

/* ------------------------------------------------------------------------ */
/* Tensors                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum rlk_dtype {
  RLK_DTYPE_INVALID = 0,
  RLK_F32 = 1,
  RLK_F16 = 2,
  RLK_BF16 = 3,
  RLK_F64 = 4,
  RLK_I32 = 5,
  RLK_I64 = 6,
  RLK_BOOL = 7 /* one byte, 0 or 1 */
} rlk_dtype;

#define RLK_MAX_DIMS 4

/* A tensor descriptor, like DLPack's: the data pointer (device memory on the CUDA and
 * HIP backends, host memory on the host backend), element type, shape and strides in
 * elements. A tensor with data == NULL is "absent" where an argument is optional. */
typedef struct rlk_tensor {
  void *data;
  rlk_dtype dtype;
  int32_t ndim;
  int64_t shape[RLK_MAX_DIMS];
  int64_t strides[RLK_MAX_DIMS];
} rlk_tensor;

/* A contiguous 1-D tensor descriptor. */
RLK_API rlk_tensor rlk_tensor_1d(void *data, rlk_dtype dtype, int64_t n);

/* A 2-D tensor descriptor with the given row stride (in elements; >= cols). */
RLK_API rlk_tensor rlk_tensor_2d(void *data, rlk_dtype dtype, int64_t rows, int64_t cols,
                                 int64_t row_stride);

/* Bytes per element of a dtype (0 for RLK_DTYPE_INVALID). */
RLK_API size_t rlk_dtype_size(rlk_dtype dtype);

/* "f32", "f16", "bf16", "f64", "i32", "i64", "bool". */
RLK_API const char *rlk_dtype_name(rlk_dtype dtype);

/* ------------------------------------------------------------------------ */
/* Memory, streams and events (for tools, tests and callers without a framework) */
/* ------------------------------------------------------------------------ */

/* Allocates `bytes` of device memory (host memory on the host backend). */
RLK_API rlk_status rlk_malloc(rlk_context *ctx, size_t bytes, void **out);

/* Frees memory from rlk_malloc. NULL is a no-op. */
RLK_API rlk_status rlk_free(rlk_context *ctx, void *ptr);

/* Copies host -> device. Synchronous. */
RLK_API rlk_status rlk_memcpy_to_device(rlk_context *ctx, void *dst, const void *src, size_t bytes);

/* Copies device -> host. Synchronous. */
RLK_API rlk_status rlk_memcpy_to_host(rlk_context *ctx, void *dst, const void *src, size_t bytes);

/* Fills device memory with a byte value (to poison outputs in tests). Synchronous. */
RLK_API rlk_status rlk_memset(rlk_context *ctx, void *dst, int value, size_t bytes);

/* Waits for all work on `stream` (NULL: the default stream). */
RLK_API rlk_status rlk_stream_synchronize(rlk_context *ctx, void *stream);

typedef struct rlk_event rlk_event;

/* Device events for timing (host-clock events on the host backend). */
RLK_API rlk_status rlk_event_create(rlk_context *ctx, rlk_event **out);
RLK_API rlk_status rlk_event_record(rlk_event *event, void *stream);
/* Milliseconds between two recorded events; waits for `end` to complete. */
RLK_API rlk_status rlk_event_elapsed_ms(rlk_event *start, rlk_event *end, float *ms);
RLK_API void rlk_event_destroy(rlk_event *event);

/* ------------------------------------------------------------------------ */
/* Ops: group advantages (GRPO family)                                      */
/* ------------------------------------------------------------------------ */

typedef enum rlk_advantage_mode {
  RLK_ADV_GRPO = 0,      /* (s - mean_g) / (std_g + eps) */
  RLK_ADV_MEAN_ONLY = 1, /* s - mean_g (Dr. GRPO, REINFORCE++-baseline before whitening) */
  RLK_ADV_RLOO = 2,      /* s - mean of the other members of the group */
  RLK_ADV_BATCH_STD = 3  /* (s - mean_g) / (std over the whole batch + eps) */
} rlk_advantage_mode;

typedef enum rlk_singleton_policy {
  /* A one-member group uses mean 0 and std 1 (verl): grpo and batch-std give s / (1 + eps),
   * mean-only and rloo give s. */
  RLK_SINGLETON_MEAN0_STD1 = 0,
  /* A one-member group gets advantage 0. */
  RLK_SINGLETON_ZERO = 1
} rlk_singleton_policy;

typedef struct rlk_group_advantage_args {
  /* Scores: [B] per-sequence scores, or [B, T] token rewards summed under `mask`
   * (summed over all T when mask is absent). f32 or f64; rows may be strided. */
  rlk_tensor scores;
  /* Groups: either a fixed group_size G (B % G == 0, consecutive members), or
   * group_offsets [num_groups + 1] (i32 or i64, non-decreasing, first 0, last B, each
   * group non-empty) with group_size 0. */
  int64_t group_size;
  rlk_tensor group_offsets;
  rlk_advantage_mode mode;
  float eps;                   /* verl 1e-6, TRL 1e-4, OpenRLHF 1e-9; >= 0 */
  int unbiased;                /* 1: std with N - 1 (torch.std); 0: with N */
  rlk_singleton_policy singleton;
  /* Output: [B] f32 per-sequence advantages (contiguous). */
  rlk_tensor advantages;
  /* Optional: mask [B, T] (bool, i32 or f32) and token_advantages [B, T] f32 output,
   * token_advantages[b, t] = advantages[b] * mask[b, t] (advantages[b] where mask is absent).
   * Where the mask is 0 the token is left out of the row sum and its output is exactly 0.
   * Rows of scores, mask and token_advantages are contiguous; their row strides may exceed T. */
  rlk_tensor mask;
  rlk_tensor token_advantages;
} rlk_group_advantage_args;

/* Fills `args` with verl's defaults: mode grpo, eps 1e-6, unbiased, singleton mean 0 / std 1,
 * every tensor absent. */
RLK_API void rlk_group_advantage_args_init(rlk_group_advantage_args *args);

/* Computes group-normalized advantages (GRPO, Dr. GRPO, RLOO, batch-std) on `stream`.
 * Deterministic: the same inputs give bitwise the same outputs on the same device.
 * group_offsets values are checked in full on the host backend; on a GPU they are device
 * memory and only their shape is checked (reading them would synchronize): bad values never
 * cause an out-of-bounds access, but the advantages are then unspecified. */
RLK_API rlk_status rlk_group_advantage(rlk_context *ctx, const rlk_group_advantage_args *args,
                                       void *stream);

/* ------------------------------------------------------------------------ */
/* Precompiling                                                             */
/* ------------------------------------------------------------------------ */

/* Compiles (or finds in the cache) every kernel that an op configuration needs, without
 * running anything. `config` is one line: the op name followed by name=value pairs, e.g.
 *   "group_advantage mode=grpo group_size=16 scores=f32 unbiased=1 broadcast=1"
 * Unknown names or values are an RLK_ERR_INVALID_ARGUMENT naming them. Writes the number of
 * kernels the configuration needs to *kernels (may be NULL). Works on compile-only contexts. */
RLK_API rlk_status rlk_precompile(rlk_context *ctx, const char *config, int *kernels);

/* Writes the op names that rlk_precompile accepts, space-separated, e.g. "group_advantage". */
RLK_API const char *rlk_precompile_ops(void);

/* Describes the parameters an op configuration accepts, one "name: values (default)" per line. */
RLK_API const char *rlk_precompile_help(const char *op);

/* ------------------------------------------------------------------------ */
/* Cache management (what tools/rlk-cache uses)                             */
/* ------------------------------------------------------------------------ */

typedef struct rlk_cache_entry {
  const char *path;       /* the entry directory */
  const char *key;        /* 64 hex digits */
  const char *family;     /* template family */
  const char *target;     /* "sm_90a", ... */
  const char *compiler;   /* "nvrtc-13.0", ... */
  const char *params;     /* the specialization, "name=value ..." */
  uint64_t bytes;         /* size of the entry on disk */
  int64_t created;        /* unix seconds */
  int64_t last_used;      /* unix seconds */
} rlk_cache_entry;

/* Called once per entry; return non-zero to stop the walk. */
typedef int (*rlk_cache_visit_fn)(const rlk_cache_entry *entry, void *user);

/* Walks the committed entries of a cache tree (`root` NULL: the default writable root). */
RLK_API rlk_status rlk_cache_walk(const char *root, rlk_cache_visit_fn visit, void *user);

/* Verifies every entry of a tree (metadata, key fields, binary checksum). Writes the number of
 * entries and of bad ones; bad entries are quarantined when `repair` is non-zero. */
RLK_API rlk_status rlk_cache_verify(const char *root, int repair, uint64_t *entries,
                                    uint64_t *bad);

/* Removes entries, oldest last-use first, until the tree is at most `max_bytes` (0: no size
 * limit), and every entry not used for `max_age_seconds` (0: no age limit). Writes the
 * number of entries and bytes removed (either may be NULL). */
RLK_API rlk_status rlk_cache_prune(const char *root, uint64_t max_bytes, int64_t max_age_seconds,
                                   uint64_t *removed_entries, uint64_t *removed_bytes);

/* Removes every entry and the staging area of a tree. */
RLK_API rlk_status rlk_cache_clear(const char *root);

/* The default writable cache root (RLK_CACHE_DIR, $XDG_CACHE_HOME/rlk, ~/.cache/rlk),
 * written into buf. */
RLK_API rlk_status rlk_cache_default_root(char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* RLK_H */

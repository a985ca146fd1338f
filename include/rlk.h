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
 *   - Op calls (rlk_group_advantage ... rlk_sample) only queue launches on `stream`: they never
 *     synchronize, never allocate device memory and never read device data back to the host,
 *     so they can be captured in a CUDA graph. A capture cannot compile or load a kernel: call
 *     each configuration once (or rlk_precompile it and call it once) before capturing; scratch
 *     memory is the caller's workspace argument. An op's rlk_<op>_workspace_size() makes the
 *     call's checks (unless it documents fewer) and sets *bytes to 0 when it fails.
 *   - One context may be used from several threads at once.
 *   - What a call writes (its outputs and its workspace) shares no byte with any other argument
 *     of the call, element by element (two interleaved views of one buffer that share no byte
 *     are fine), except in the in-place forms an op documents (rlk_masked_whiten's out = x,
 *     rlk_logprob_backward's grad_logits = logits, rlk_group_advantage's advantages = scores:
 *     the very same tensor); an output needs a place of its own for each element. Anything else
 *     is RLK_ERR_INVALID_ARGUMENT naming both arguments.
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

/* sizeof of a public struct of this header as the library was built, by its name
 * ("rlk_tensor", "rlk_group_advantage_args", ...), or 0 for a name it does not know.
 * Lets bindings in other languages (the Python package) check that their mirrors of the
 * structs match the library they load before passing one in. */
RLK_API size_t rlk_abi_struct_size(const char *name);

/* Row i (from 0) of the table of every enum constant of this header, as the library was built:
 * returns the constant's name ("RLK_ADV_RLOO") and sets *type to its enum's typedef name
 * ("rlk_advantage_mode"; NULL for the unnamed enums, the metric slots) and *value to its value
 * (either pointer may be NULL); returns NULL past the last row. Lets bindings check their
 * mirrors of the enums against the library they load. */
RLK_API const char *rlk_abi_enum_constant(size_t i, const char **type, int *value);

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

/* Where log messages go. By default each is one line on stderr, "rlk <level>: <message>", for the
 * levels the process asked for (RLK_LOG, else warn; a context may raise it). With a callback set,
 * every message goes to it instead (none to stderr): those up to that level or `level`, whichever
 * is higher (so a binding can forward info messages, e.g. each kernel compile, to its own
 * logging without RLK_LOG). The callback runs on the thread that logs, possibly several at
 * once, and must not call rlk; `message` lives until it returns. NULL restores stderr. A callback
 * always gets the `user` it was set with; one replaced may still be running a message that
 * another thread began before the replacement returned. */
typedef void (*rlk_log_callback)(rlk_log_level level, const char *message, void *user);
RLK_API void rlk_set_log_callback(rlk_log_callback callback, rlk_log_level level, void *user);

typedef struct rlk_context rlk_context;

typedef struct rlk_context_options {
  rlk_backend backend;     /* default RLK_BACKEND_AUTO */
  int device;              /* device ordinal, default 0 (the host backend has only 0) */
  const char *cache_dir;   /* writable cache root; NULL: RLK_CACHE_DIR, XDG, ~/.cache/rlk */
  /* Logging goes to stderr and its level is process-wide: a context may raise it (more detail)
   * but never lowers what RLK_LOG or another context asked for. Default RLK_LOG_DEFAULT. */
  rlk_log_level log_level;
  /* Compile-only contexts need no device: kernels are compiled and published to the
   * cache but cannot be launched. Used to precompile for a target on a CPU-only host. */
  int compile_only;
  /* Target to compile for; NULL: from the device (or RLK_ARCH). Required for compile-only CUDA
   * and HIP contexts, whose backend (with RLK_BACKEND_AUTO) it names. Spellings: sm_<cc> (a cubin
   * for compute capability cc/10), sm_<cc>a and sm_<cc>f where the arch has them (its
   * arch-specific and family features: sm_90a, sm_100a, sm_100f, sm_103a, sm_120a, sm_121a),
   * compute_<cc>[a|f] (PTX the driver compiles at load time, for that compute capability or
   * newer), gfx<id>[:sramecc+/-][:xnack+/-] (AMD; the features are dropped), host-<machine> and
   * host (this CPU). */
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

/* The backend a target name belongs to, from the table a context parses targets with:
 * RLK_BACKEND_CUDA for sm_<cc>[a|f] and compute_<cc>[a|f], RLK_BACKEND_HIP for gfx<id>[:features],
 * RLK_BACKEND_HOST for host and host-<machine>; RLK_BACKEND_AUTO when it names no target (then
 * rlk_last_error() says why). */
RLK_API rlk_backend rlk_target_backend(const char *target);

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
 * elements. A tensor with data == NULL is "absent" where an argument is optional.
 * Strides are >= 0. What a call reads may repeat elements with a stride of 0 (a broadcast
 * view): a row shared by every row (row stride 0) is accepted wherever rows are; within a row,
 * elements must be contiguous where an op says so (rlk_policy_loss also takes advantages of one
 * value per sequence broadcast over its tokens, [B, T] with strides {1, 0}). */
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
  RLK_ADV_BATCH_STD = 3, /* (s - mean_g) / (std over the whole batch + eps) */
  /* s - sum_g(w s) / sum_g(w) with per-member weights w (`weights`; OPO weighs each response by
   * its length, verl's "opo") */
  RLK_ADV_OPO = 4,
  /* Pass@k: the group's best member (the first of equal maxima) gets (max - second max) /
   * (std_g + eps), every other member 0 (verl's "grpo_passk"); with NaN scores arithmetic a NaN
   * ranks above every score (torch.topk's order): the first NaN member gets NaN */
  RLK_ADV_PASSK = 5,
  /* the same without the division by std_g + eps (grpo_passk without norm_adv_by_std_in_grpo) */
  RLK_ADV_PASSK_UNSCALED = 6
} rlk_advantage_mode;

typedef enum rlk_singleton_policy {
  /* A one-member group uses mean 0 and std 1 (verl): grpo and batch-std give s / (1 + eps),
   * mean-only and rloo give s. */
  RLK_SINGLETON_MEAN0_STD1 = 0,
  /* A one-member group gets advantage 0. */
  RLK_SINGLETON_ZERO = 1
} rlk_singleton_policy;
/* (opo gives a one-member group s under mean0-std1, as verl does; passk gives it 0 under either
 * policy: there is no second member to compare with.) */

typedef enum rlk_nan_scores {
  /* NaN scores are arithmetic: a group with one gets NaN statistics. */
  RLK_NAN_SCORES_PROPAGATE = 0,
  /* A NaN score marks an unscorable member (TRL: every reward function returned None): it is
   * left out of its group's statistics (and the batch's, for batch-std) and its advantage is
   * 0; the one-member rule applies to groups with one scorable member; an advantage that comes
   * out NaN is 0. */
  RLK_NAN_SCORES_UNSCORABLE = 1
} rlk_nan_scores;

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
  /* Output: [B] f32 per-sequence advantages (contiguous); may be f32 [B] scores itself (in
   * place). */
  rlk_tensor advantages;
  /* Optional: mask [B, T] (bool, i32 or f32) and token_advantages [B, T] f32 output,
   * token_advantages[b, t] = advantages[b] * mask[b, t] (advantages[b] where mask is absent).
   * Where the mask is 0 the token is left out of the row sum and its output is exactly 0.
   * Rows of scores, mask and token_advantages are contiguous; their row strides may exceed T. */
  rlk_tensor mask;
  rlk_tensor token_advantages;
  /* Scratch for the row sums of f64 [B, T] scores (they stay f64 through the group statistics):
   * device memory of at least rlk_group_advantage_workspace_size() bytes, 8-byte aligned; NULL
   * when that size is 0 (every other call). */
  void *workspace;
  size_t workspace_bytes;
  /* opo only: weights [B] of the scores' dtype (verl: each response's token count), rows may be
   * strided; a group whose weights sum to 0 gets NaN advantages. Absent for other modes. */
  rlk_tensor weights;
  rlk_nan_scores nan_scores; /* default RLK_NAN_SCORES_PROPAGATE */
} rlk_group_advantage_args;

/* Fills `args` with verl's defaults: mode grpo, eps 1e-6, unbiased, singleton mean 0 / std 1,
 * every tensor absent. */
RLK_API void rlk_group_advantage_args_init(rlk_group_advantage_args *args);

/* Bytes of workspace a call with these arguments needs: B * 8 for f64 [B, T] scores, else 0
 * (the same checks as the call; data pointers are not read). */
RLK_API rlk_status rlk_group_advantage_workspace_size(rlk_context *ctx,
                                                      const rlk_group_advantage_args *args,
                                                      size_t *bytes);

/* Computes group-normalized advantages (GRPO, Dr. GRPO, RLOO, batch-std) on `stream`.
 * Deterministic: the same inputs give bitwise the same outputs on the same device.
 * group_offsets values are checked in full on the host backend; on a GPU they are device
 * memory and only their shape is checked (reading them would synchronize): bad values never
 * cause an out-of-bounds access, but the advantages are then unspecified.
 * Never synchronizes, never allocates device memory, capturable (see Conventions). */
RLK_API rlk_status rlk_group_advantage(rlk_context *ctx, const rlk_group_advantage_args *args,
                                       void *stream);

/* ------------------------------------------------------------------------ */
/* Ops: optimal token baseline (per-timestep group baselines)               */
/* ------------------------------------------------------------------------ */

/* Advantages with a baseline per group and timestep, weighted by each member's cumulative path
 * variance (verl's "optimal_token_baseline", and "tir_optimal_token_baseline" with compact = 1).
 * With m the mask and G, W per row:
 *   returns[b, t] = sum_{u >= t} rewards[b, u] m[b, u]           (every column)
 *   w[b, t] = 1 - 2 exp(old_logp[b, t]) + sum_pi_squared[b, t]   (x rollout_is_weights[b, t]^2)
 *   W[b, t] = sum_{u <= t} w[b, u] m[b, u]
 *   baseline[g, t] = sum_i G W m / (sum_i W m + epsilon) over the members i of group g
 *   advantages[b, t] = (returns[b, t] - baseline[g, t]) m[b, t], exactly 0 where m is 0.
 * compact = 1: timestep k is each row's k-th valid token (m != 0): the baseline at k sums over
 * the members that have a k-th valid token, with their G and W there (m = 1 in the sums), and a
 * row's advantage at its k-th valid token uses the baseline at k; rows with no valid token are
 * left out of their group. A group of one member (compact: one with a valid token) has baseline
 * 0. handle_zero_tail: when a group's longest member (length: its valid-token count, the row sum
 * of a 0/1 mask) is the only one of that length, its baseline is 0 from the second-longest
 * length on (a column index, compact: a valid-token index). Masked elements count as exactly 0
 * whatever their values. */
typedef struct rlk_token_baseline_args {
  /* Inputs [B, T], f32 or f64, all of one dtype; rows contiguous, row strides >= T. */
  rlk_tensor rewards;
  rlk_tensor old_logp;
  rlk_tensor sum_pi_squared;     /* sum over the vocabulary of pi^2 at each token */
  rlk_tensor rollout_is_weights; /* optional: w is scaled by its square */
  rlk_tensor mask;               /* optional [B, T] bool, i32 or f32: absent = all valid */
  /* Groups: a fixed group_size G (B % G == 0, consecutive members), or group_offsets
   * [num_groups + 1] (i32 or i64, first 0, last B, each group non-empty) with group_size 0. */
  int64_t group_size;
  rlk_tensor group_offsets;
  double epsilon;       /* default 1e-8; >= 0; used in the inputs' dtype */
  int handle_zero_tail; /* default 1 */
  int compact;          /* 0 (default): timesteps are columns; 1: valid-token indices */
  /* Outputs [B, T] of the inputs' dtype, row strides >= T, overlapping neither each other nor
   * an input. */
  rlk_tensor advantages;
  rlk_tensor returns;
  /* Scratch: device memory of at least rlk_token_baseline_workspace_size() bytes, 8-byte
   * aligned. */
  void *workspace;
  size_t workspace_bytes;
} rlk_token_baseline_args;

/* Fills `args` with verl's defaults: epsilon 1e-8, handle_zero_tail 1, compact 0, every tensor
 * absent. */
RLK_API void rlk_token_baseline_args_init(rlk_token_baseline_args *args);

/* Bytes of workspace a call with these arguments needs (the same checks as the call; data
 * pointers are not read, but for the host backend's group_offsets, which the call's checks read
 * there, so they must be filled first): B T (size of the dtype) + 4 B, and compact mode B T (size
 * of the dtype + 4) more. */
RLK_API rlk_status rlk_token_baseline_workspace_size(rlk_context *ctx, const rlk_token_baseline_args *args,
                                                     size_t *bytes);

/* Computes the advantages and returns on `stream`. Deterministic: sums over a group's members
 * run in member order, scans in fixed 32-element chunks; the same inputs give bitwise the same
 * outputs on the same device. group_offsets values are checked in full on the host backend; on
 * a GPU only their shape (bad values never cause an out-of-bounds access; rows no group covers
 * are then left unwritten). Never synchronizes, never allocates device memory, capturable. */
RLK_API rlk_status rlk_token_baseline(rlk_context *ctx, const rlk_token_baseline_args *args, void *stream);

/* ------------------------------------------------------------------------ */
/* Ops: policy loss and value loss (PPO / GRPO family), fused fwd + bwd      */
/* ------------------------------------------------------------------------ */

/* Token layouts shared by rlk_policy_loss and rlk_value_loss.
 *   padded: every per-token tensor is [B, T] (rows contiguous, row stride >= T, each tensor its
 *           own stride), the optional mask [B, T] says which tokens count; sequence b is row b.
 *   packed: every per-token tensor is [N] (contiguous) and seq_offsets [S + 1] (i32 or i64,
 *           first 0, last N, non-decreasing) delimits the S sequences; the optional mask [N] says
 *           which tokens count (tokens outside every sequence never do).
 * The layout is told by logp's (values') number of dimensions: 2 padded, 1 packed.
 * Mask: bool, i32 or f32. A token counts with weight m = mask value; m == 0 removes it entirely
 * (its inputs may be anything, NaN included; its gradients are exactly 0). Without a mask every
 * token counts with weight 1. */

/* How per-token losses l_t become the scalar loss. n_b = sum of the mask over sequence b.
 * Every mode divides by a normalizer passed in, so data-parallel ranks that pass the same
 * global normalizers agree exactly:
 *   TOKEN_MEAN               loss_scale * sum_t m_t l_t / token_normalizer
 *   TOKEN_SUM                loss_scale * sum_t m_t l_t
 *   SEQ_MEAN_TOKEN_SUM       loss_scale * sum_b sum_t m_t l_t / seq_normalizer
 *   SEQ_MEAN_TOKEN_MEAN      loss_scale * sum_b (sum_t m_t l_t / n_b) / seq_normalizer
 *                            (a sequence with n_b == 0 adds 0)
 *   SEQ_MEAN_TOKEN_SUM_NORM  loss_scale * sum_b sum_t m_t l_t / (seq_normalizer * norm_scale)
 *                            (Dr. GRPO: norm_scale = the maximum response length. verl
 *                            0.9.1's agg_loss divides by global_batch_size, scales by dp_size,
 *                            then divides by loss_scale_factor: seq_normalizer =
 *                            global_batch_size, loss_scale = dp_size, norm_scale =
 *                            loss_scale_factor. verl releases whose agg_loss divides the sum by
 *                            loss_scale_factor alone: seq_normalizer = 1, loss_scale = 1.)
 * token_normalizer: the global count of tokens that count (verl batch_num_tokens; TRL dapo
 * num_items_in_batch / num_processes, bnpo max(sum(mask), 1)); seq_normalizer: the global
 * sequence count (verl global_batch_size; TRL: the local B); loss_scale: verl's dp_size, or
 * 1 / gradient_accumulation_steps.
 * A normalizer is given one of three ways, none of which reads anything back to the host:
 *   - a number (token_normalizer, seq_normalizer > 0): folded into the kernels' constant;
 *   - a device scalar (token_normalizer_tensor, seq_normalizer_tensor: f32 or f64, [1] or 0-d,
 *     in device memory on a GPU; the number left 0): read by the kernels, e.g. a global token
 *     count all-reduced across data-parallel ranks on the device. Its value is not checked (it
 *     is never read by the host): <= 0 or non-finite gives non-finite results;
 *   - neither (the number 0): token-mean divides by this call's mask count sum_t m_t, counted on
 *     the device by a pre-pass (per-block partials in the workspace, added up in a fixed order:
 *     deterministic) when there is a mask, known from the shape without one (B * T, or N); a
 *     count of 0 gives a loss of 0 and zero gradients. The SEQ_MEAN_* modes divide by this
 *     call's sequence count (B, or S). */
typedef enum rlk_loss_agg {
  RLK_AGG_TOKEN_MEAN = 0,
  RLK_AGG_TOKEN_SUM = 1,
  RLK_AGG_SEQ_MEAN_TOKEN_SUM = 2,
  RLK_AGG_SEQ_MEAN_TOKEN_MEAN = 3,
  RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM = 4
} rlk_loss_agg;

/* Policy-loss modes. d_t = logp_t - old_logp_t, r_t = exp(clamp(d_t, log_ratio_min,
 * log_ratio_max)), lo = 1 - clip_low, hi = 1 + clip_high, A = advantage, sg = no gradient. */
typedef enum rlk_policy_loss_mode {
  /* l = max(-A r, -A clamp(r, lo, hi)); for A < 0 with dual_clip c > 1: min(l, -c A)
   * (verl vanilla with clip-higher and dual-clip; TRL grpo/bnpo/dr_grpo/dapo; OpenRLHF ppo). */
  RLK_POLICY_PPO = 0,
  /* Sequence ratio s_b = exp(clamp(sum_t m d / n_b, log_ratio_min, log_ratio_max)) shared by the
   * sequence's tokens, l = max(-A s, -A clamp(s, lo, hi)), and for A < 0 with dual_clip c > 1
   * min(l, -c A) as in ppo (OpenRLHF gspo; verl's gspo has no dual clip: pass 0). How the
   * gradient reaches the tokens is seq_ratio_grad's choice. */
  RLK_POLICY_GSPO = 1,
  /* l = -sg(clamp(r, lo, hi)) A logp (verl cispo; TRL cispo: clip_low = INFINITY,
   * clip_high = its epsilon_high - 1). */
  RLK_POLICY_CISPO = 2,
  /* l = -sigmoid(tau (r - 1)) 4 / tau A, tau = sapo_tau_pos if A > 0 else sapo_tau_neg. */
  RLK_POLICY_SAPO = 3,
  /* l = -A logp (no ratio; verl gpg). */
  RLK_POLICY_REINFORCE = 4,
  /* GMPO (verl geo_mean): per token dc_t = clamp(d_t, -clip_low, clip_high) (log-space bounds),
   * kept on the side the advantage's sign selects, sign(A) min(sign(A) d, sign(A) dc); per
   * sequence s_b = exp(sum_t m dc_t / n_b), Abar_b = sum_t m A_t / n_b, and every token of the
   * sequence carries the sequence's term l = -Abar_b s_b (seq-mean-token-mean with
   * seq_normalizer = B is verl's mean over sequences). No log-ratio clamp, dual clip or
   * importance weights. Metrics: clipfrac [d clipped, A > 0], clipfrac_lower [d clipped,
   * A < 0]. */
  RLK_POLICY_GEO_MEAN = 5
} rlk_policy_loss_mode;

/* How GSPO's sequence ratio passes its gradient to the tokens of sequence b.
 *   STRAIGHT_THROUGH  d l_t / d logp_t = l_t'(s) s: each token's own term, straight through
 *                     (verl gspo).
 *   THROUGH_MEAN      the sequence mean is differentiated: every token of the sequence gets
 *                     m_t / n_b * s * sum_j w_j l_j'(s) (w_j the aggregation weights): OpenRLHF
 *                     gspo and TRL's importance_sampling_level="sequence".
 * The two agree when the advantage is constant along the sequence and the aggregation is
 * seq-mean-token-mean; with per-token advantages (GAE, KL-shaped returns) they differ. */
typedef enum rlk_seq_ratio_grad {
  RLK_SEQ_RATIO_STRAIGHT_THROUGH = 0,
  RLK_SEQ_RATIO_THROUGH_MEAN = 1
} rlk_seq_ratio_grad;

/* KL estimators of the penalty against a reference policy, on e = logp - ref_logp:
 * with ec = clamp(e, -kl_input_clamp, kl_input_clamp), the value is clamp(f(ec), -kl_output_clamp,
 * kl_output_clamp). */
typedef enum rlk_kl_estimator {
  RLK_KL_K1 = 0,  /* f = e                  (verl "kl"/"k1") */
  RLK_KL_ABS = 1, /* f = |e|                (verl "abs") */
  RLK_KL_K2 = 2,  /* f = e^2 / 2            (verl "mse"/"k2") */
  RLK_KL_K3 = 3   /* f = exp(-e) + e - 1    (verl "low_var_kl"/"k3", TRL's KL, OpenRLHF k3) */
} rlk_kl_estimator;

/* Indices of rlk_policy_loss_args.metrics. "Mean" is the mask-weighted mean over this call's
 * tokens (sum m x / sum m; 0 when no token counts). r is the ratio of the mode (s_b for gspo). */
enum {
  RLK_PL_METRIC_CLIPFRAC = 0,       /* mean of [the clip is active]: ppo/gspo -A clamp(r) > -A r
                                     * (verl pg_clipfrac), cispo r outside [lo, hi], geo_mean
                                     * (see it) d clipped with A > 0; else 0 */
  RLK_PL_METRIC_CLIPFRAC_LOWER = 1, /* mean of [A < 0 and the dual clip is active] (verl
                                     * pg_clipfrac_lower): ppo and gspo (dual_clip > 1), geo_mean
                                     * d clipped with A < 0; else 0 */
  RLK_PL_METRIC_CLIP_LOW = 2,       /* mean of [r < lo and A < 0] (TRL clip_ratio/low_mean);
                                     * ppo, gspo, cispo; else 0 */
  RLK_PL_METRIC_CLIP_HIGH = 3,      /* mean of [r > hi and A > 0] (TRL clip_ratio/high_mean);
                                     * ppo, gspo, cispo; else 0 */
  RLK_PL_METRIC_APPROX_KL = 4,      /* mean of -clamp(d) (verl ppo_kl of vanilla, cispo, sapo) */
  RLK_PL_METRIC_KL_MEAN = 5,        /* mean of the KL estimator's value; 0 without ref_logp */
  RLK_PL_METRIC_ENTROPY_MEAN = 6,   /* mean of the entropy; 0 without it */
  RLK_PL_METRIC_RATIO_MAX = 7,      /* max of r over the tokens that count; 0 when none does */
  RLK_PL_METRIC_RATIO_MIN = 8,      /* min of r likewise */
  RLK_PL_METRIC_PG_LOSS = 9,        /* the aggregated policy term (with loss_scale) */
  RLK_PL_METRIC_KL_LOSS = 10,       /* the aggregated KL value, before kl_coef */
  RLK_PL_METRIC_ENTROPY_LOSS = 11,  /* the aggregated entropy, before entropy_coef */
  RLK_PL_METRIC_MASK_SUM = 12,      /* sum of m: the weight of the means above, to combine ranks */
  RLK_PL_METRIC_APPROX_KL_RAW = 13, /* mean of -d, d not clamped (verl gspo ppo_kl, OpenRLHF
                                     * ppo_kl) */
  RLK_PL_METRIC_SEQ_CLIP_LOW = 14,  /* gspo with per-sequence advantages: the fraction of the
                                     * sequences (every one, empty ones included) with s_b < lo
                                     * and A_b < 0 (TRL clip_ratio/low_mean at sequence level);
                                     * otherwise CLIP_LOW */
  RLK_PL_METRIC_SEQ_CLIP_HIGH = 15, /* likewise s_b > hi and A_b > 0; otherwise CLIP_HIGH */
  RLK_POLICY_LOSS_METRICS = 16
};

typedef struct rlk_policy_loss_args {
  /* Inputs. logp: [B, T] (padded) or [N] (packed); f32 or f64: the differentiable input.
   * old_logp, advantages and the optional tensors have logp's layout and dtype. */
  rlk_tensor logp;
  rlk_tensor old_logp;
  rlk_tensor advantages;  /* per token; or per sequence [B] / [S] when seq_advantages = 1; or a
                           * [B] broadcast over the tokens ([B, T], strides {1, 0}), which is the
                           * per-sequence form */
  int seq_advantages;     /* 1: one advantage per sequence, broadcast over its tokens */
  rlk_tensor mask;        /* optional: bool, i32 or f32, logp's layout */
  rlk_tensor seq_offsets; /* packed layout only: [S + 1] i32 or i64 */
  rlk_tensor ref_logp;    /* optional: adds the KL term (required when kl_coef != 0) */
  rlk_tensor entropy;     /* optional: the entropy bonus and its metric (required when
                           * entropy_coef != 0) */
  rlk_tensor rollout_is_weights; /* optional: multiplies each token's policy term (no gradient) */

  rlk_policy_loss_mode mode;
  double clip_low, clip_high; /* ratio clamp [1 - clip_low, 1 + clip_high]; >= 0, INFINITY
                               * allowed (no bound on that side), except in geo_mean, whose
                               * log-space bounds must be finite */
  double dual_clip;           /* c > 1 enables the dual clip (ppo); <= 1 (e.g. 0) disables */
  double log_ratio_min, log_ratio_max; /* clamp of the log-ratio before exp; +-INFINITY: none */
  double sapo_tau_pos, sapo_tau_neg;   /* > 0 and finite; read (and checked) by sapo only */
  rlk_seq_ratio_grad seq_ratio_grad;   /* gspo: how the sequence ratio's gradient reaches tokens */
  /* The gradient a clamp passes where its input equals a bound exactly (the log-ratio clamp,
   * the ratio clip, GSPO's clamp, the KL clamps), in [0, 1]: 1 passes it (a closed range, as
   * older torch releases did), 0 stops it (torch.clamp with number bounds in torch 2.15), 0.5
   * splits it (torch.clamp with tensor bounds, torch.maximum/minimum). Elsewhere a clamp passes
   * 1 inside and 0 outside. */
  double clamp_bound_grad;

  rlk_kl_estimator kl_estimator;
  double kl_coef;                      /* loss += kl_coef * agg(kl) */
  double kl_input_clamp;               /* > 0; INFINITY: off */
  double kl_output_clamp;              /* > 0; INFINITY: off */
  int kl_straight_through;             /* 1: the estimator's value with k2's gradient e
                                        * (verl's "k3+"), clamps do not gate that gradient */
  double entropy_coef;                 /* loss -= entropy_coef * agg(entropy) */

  rlk_loss_agg agg;         /* one aggregation for every term */
  double token_normalizer;  /* > 0, TOKEN_MEAN; 0: the tensor below, or this call's mask count */
  double seq_normalizer;    /* > 0, SEQ_MEAN_*; 0: the tensor below, or this call's sequence count */
  double norm_scale;        /* > 0, SEQ_MEAN_TOKEN_SUM_NORM */
  double loss_scale;        /* finite; multiplies the loss and every gradient */
  rlk_tensor token_normalizer_tensor; /* optional device scalar replacing token_normalizer */
  rlk_tensor seq_normalizer_tensor;   /* optional device scalar replacing seq_normalizer */

  /* Outputs. loss [1] and metrics [>= RLK_POLICY_LOSS_METRICS] in logp's dtype (contiguous);
   * grad_logp (d loss / d logp) and grad_entropy (d loss / d entropy) with logp's layout and
   * dtype, rows contiguous (their own row strides in the padded layout). Padding between rows
   * is never written. grad_entropy is required when entropy_coef != 0, else ignored; metrics is
   * optional. */
  rlk_tensor loss;
  rlk_tensor grad_logp;
  rlk_tensor grad_entropy;
  rlk_tensor metrics;

  /* Scratch for the deterministic cross-block reduction, device memory of at least
   * rlk_policy_loss_workspace_size() bytes, 16-byte aligned; NULL when that size is 0. */
  void *workspace;
  size_t workspace_bytes;
} rlk_policy_loss_args;

/* Fills `args` with verl's actor defaults: ppo, clip_low = clip_high = 0.2, dual_clip 3,
 * log ratio clamped to [-20, 20], SAPO taus 1.0 / 1.05, straight-through sequence ratio,
 * clamp_bound_grad 1, KL k3 with verl's clamps (input 20,
 * output 10) and kl_coef 0 (no KL term), no straight-through, entropy_coef 0, token-mean,
 * loss_scale 1; the normalizers 0 (this call's counts, see rlk_loss_agg), every tensor absent. */
RLK_API void rlk_policy_loss_args_init(rlk_policy_loss_args *args);

/* Bytes of workspace a call with these arguments needs (the same checks as the call; data
 * pointers are not read, but for the host backend's seq_offsets, which the call's checks read
 * there, so they must be filled first). 0 on the host backend. Depends only on the shapes, dtypes, the mode,
 * the aggregation, how the normalizer is given and the device: at most
 * (2 * multiprocessors) * 18 * 8 + 16 bytes (17 f64 partials and a count per block; a
 * compile-only context, whose multiprocessors is 0, counts 1). */
RLK_API rlk_status rlk_policy_loss_workspace_size(rlk_context *ctx, const rlk_policy_loss_args *args,
                                                  size_t *bytes);

/* The policy loss forward and backward in one pass on `stream`: loss, grad_logp (and
 * grad_entropy), metrics. Two launches on a GPU (the token pass writing per-block partials, then
 * a one-block reduction in a fixed order), one on the host. Deterministic: bitwise the same
 * outputs for the same inputs on the same device. Per-token terms and per-block sums in the
 * inputs' precision (f32 or f64), the blocks' partials combined in f64 (the host sums in f64).
 * Gradients follow torch's autograd conventions: a clamp passes the gradient inside its range
 * and clamp_bound_grad of it on a bound, max/min split it equally on a tie. On a GPU,
 * seq_offsets values are device memory and only their shape is checked (bad values are clamped into [0, N], never read out of bounds;
 * tokens then outside every sequence are left unwritten).
 * Never synchronizes the stream or the device, never allocates device memory, never reads
 * device data on the host: every launch is queued on `stream`, so a call can be captured in a
 * CUDA graph (the caller's buffers, workspace and normalizer tensors included, are then the
 * graph's). Before a capture, one call with the same configuration must have run (or
 * rlk_precompile): it compiles or loads the kernels, which a capture cannot. */
RLK_API rlk_status rlk_policy_loss(rlk_context *ctx, const rlk_policy_loss_args *args, void *stream);

/* Indices of rlk_value_loss_args.metrics (means as for the policy loss). */
enum {
  RLK_VL_METRIC_CLIPFRAC = 0,  /* mean of [(v_clip - R)^2 > (v - R)^2] (verl vf_clipfrac) */
  RLK_VL_METRIC_VALUE_MEAN = 1, /* mean of v */
  RLK_VL_METRIC_ERROR_MEAN = 2, /* mean of (v - R)^2 */
  RLK_VL_METRIC_MASK_SUM = 3,   /* sum of m */
  RLK_VALUE_LOSS_METRICS = 4
};

typedef struct rlk_value_loss_args {
  /* values (the differentiable input): [B, T] padded or [N] packed, f32 or f64; old_values and
   * returns alike; mask and seq_offsets as for the policy loss. */
  rlk_tensor values;
  rlk_tensor old_values;
  rlk_tensor returns;
  rlk_tensor mask;
  rlk_tensor seq_offsets;
  /* v_clip = clamp(v, v_old - clip, v_old + clip) (= v_old + clamp(v - v_old, -clip, clip),
   * exactly v where not clipped); l = 0.5 max((v - R)^2, (v_clip - R)^2). > 0; INFINITY: no
   * clipping (l = 0.5 (v - R)^2). verl cliprange_value 0.5. */
  double clip;
  /* The gradient the clip passes where v - v_old is exactly +-clip, in [0, 1] (as the policy
   * loss's clamp_bound_grad): 0.5 for verl (clip_by_value: torch.max/min of tensors), 0 for
   * OpenRLHF under torch 2.15 (torch.clamp with number bounds), 1 for a closed range. */
  double clamp_bound_grad;
  rlk_loss_agg agg; /* and the normalizers, exactly as rlk_policy_loss_args */
  double token_normalizer, seq_normalizer, norm_scale, loss_scale;
  rlk_tensor token_normalizer_tensor, seq_normalizer_tensor;
  /* Outputs: loss [1] and metrics [>= RLK_VALUE_LOSS_METRICS] (optional) in the values' dtype;
   * grad_values with their layout and dtype. */
  rlk_tensor loss;
  rlk_tensor grad_values;
  rlk_tensor metrics;
  void *workspace;
  size_t workspace_bytes;
} rlk_value_loss_args;

/* Fills `args` with verl's critic defaults: clip 0.5, clamp_bound_grad 0.5, token-mean,
 * loss_scale 1, normalizers 0 (this call's counts, see rlk_loss_agg), every tensor absent. */
RLK_API void rlk_value_loss_args_init(rlk_value_loss_args *args);

/* Bytes of workspace rlk_value_loss needs for these arguments (0 on the host backend); at
 * most (2 * multiprocessors) * 6 * 8 + 16 bytes (multiprocessors 0, a compile-only context's,
 * counts 1). */
RLK_API rlk_status rlk_value_loss_workspace_size(rlk_context *ctx, const rlk_value_loss_args *args,
                                                 size_t *bytes);

/* The clipped value loss forward and backward (loss, grad_values, metrics) on `stream`,
 * with the same passes, layouts, aggregation and determinism as rlk_policy_loss; like it, never
 * synchronizes, never allocates device memory, and is capturable once its kernels are loaded. */
RLK_API rlk_status rlk_value_loss(rlk_context *ctx, const rlk_value_loss_args *args, void *stream);

/* ------------------------------------------------------------------------ */
/* Ops: token KL estimates (a reference KL per token, and its gradient)     */
/* ------------------------------------------------------------------------ */

/* Per token, with e = logp - ref_logp and ec = clamp(e, input_min, input_max):
 *   kl = m * clamp(f(ec), output_min, output_max)        f of rlk_kl_estimator
 *   grad_logp = m * g * (d kl / d logp)                  g = grad_kl, or 1 without it
 * d kl / d logp is, without straight_through, f'(ec) passed by both clamps (1 inside, 0
 * outside or NaN, clamp_bound_grad on a bound; an infinite bound is no clamp, so e or f of
 * +-inf passes it, and NaN passes a clamp with both bounds infinite, as torch's autograd of the
 * same formula: k1's gradient is 1 there, k2's and k3's NaN); with straight_through it is w e,
 * k2's gradient of the unclamped e whatever the estimator (verl's "k3+", OpenRLHF's unbiased_gradient), with
 * w = min(exp(logp - old_logp), is_weight_max) taken as a constant (1 without old_logp).
 * d kl / d ref_logp is the negation of d kl / d logp. m is the mask's value (1 without a mask);
 * where it is 0 both outputs are exactly 0, whatever the inputs hold there.
 * verl kl_penalty: "kl"/"k1", "abs", "mse"/"k2" with no clamps; "low_var_kl"/"k3" with the
 * input clamped to [-20, 20] and the output to [-10, 10]; a "+" suffix sets straight_through.
 * OpenRLHF compute_approx_kl: the output clamped to [-10, 10] for every estimator, k3's input
 * to [-10, INFINITY); unbiased_gradient sets straight_through, old_logp and is_weight_max 10. */
typedef struct rlk_token_kl_args {
  /* logp (the differentiable input) and ref_logp: [B, T] with contiguous rows (each tensor its
   * own row stride >= T) or [N] contiguous; f32 or f64. old_logp and grad_kl (optional) alike;
   * every float tensor of a call, the outputs included, has one dtype. */
  rlk_tensor logp;
  rlk_tensor ref_logp;
  rlk_tensor old_logp;
  rlk_tensor grad_kl;
  rlk_tensor mask; /* optional: bool, i32 or f32, logp's shape */
  rlk_kl_estimator estimator;
  double input_min, input_max;   /* input_min <= input_max; +-INFINITY: no bound */
  double output_min, output_max; /* likewise */
  int straight_through;          /* 0 or 1 */
  double is_weight_max;          /* > 0; INFINITY: no bound; with straight_through and old_logp */
  double clamp_bound_grad;       /* in [0, 1], as rlk_policy_loss_args's */
  /* Outputs, logp's shape and dtype (their own row strides), at least one of them; they must
   * not overlap the inputs. */
  rlk_tensor kl;
  rlk_tensor grad_logp;
} rlk_token_kl_args;

/* Fills `args` with verl's low_var_kl: k3, input clamped to [-20, 20], output to [-10, 10], no
 * straight-through, is_weight_max INFINITY, clamp_bound_grad 1, every tensor absent. */
RLK_API void rlk_token_kl_args_init(rlk_token_kl_args *args);

/* The KL estimates and/or their gradient in one elementwise pass on `stream`: one launch, no
 * workspace; per-token arithmetic in the inputs' dtype, so results are bitwise reproducible.
 * Never synchronizes, never allocates device memory, never reads device data on the host: a
 * call can be captured in a CUDA graph once one call of the same configuration (or
 * rlk_precompile) has loaded its kernel. */
RLK_API rlk_status rlk_token_kl(rlk_context *ctx, const rlk_token_kl_args *args, void *stream);

/* ------------------------------------------------------------------------ */
/* Ops: advantages and returns over time (GAE, discounted returns, reverse  */
/* cumulative sums) and masked whitening                                    */
/* ------------------------------------------------------------------------ */

/* Shapes shared by rlk_gae, rlk_discounted_returns, rlk_reverse_cumsum and rlk_masked_whiten:
 * every per-token tensor is [B, T] with contiguous rows (stride[1] == 1) and a row stride >= T
 * (any when B == 1); each tensor has its own row stride. Values are f32 or f64; the outputs have
 * the inputs' dtype, and inputs and outputs of one call share it. The mask is bool, i32 or f32
 * and selects positions: (b, t) is valid where mask[b, t] != 0 (-0.0 counts as 0, NaN as valid);
 * the trainers' 0/1 masks mean the same thing. An absent mask makes every position valid.
 * Outputs must not overlap the inputs (except rlk_masked_whiten, which may run in place).
 * Masked positions' rewards and values never enter a recurrence: they may hold anything, NaN
 * included; where a formula below reads one at its own position, it says so. */

/* How the scans over time run. Only speed depends on the choice, and the rounding of f32
 * results (the association order of the recurrence); each choice is deterministic. */
typedef enum rlk_scan_algo {
  RLK_SCAN_AUTO = 0,      /* by shape: a warp per row for short rows, a block per row for long */
  RLK_SCAN_ROW_WARP = 1,  /* GPU: one warp per row, tiles of warp-size x 8 (f64: 4) steps;
                           * host: a plain sequential loop */
  RLK_SCAN_ROW_BLOCK = 2  /* GPU: one block per row, a block-wide scan of each tile, carried;
                           * host: the same chunked scan (lane aggregates, carries), sequentially */
} rlk_scan_algo;

/* What GAE does at masked positions (multi-turn tool outputs, padding). */
typedef enum rlk_gae_masked {
  /* verl: masked steps are skipped. Backwards over t, from V_next = A_next = 0:
   *   valid t:  A_t = r_t + gamma V_next - V_t + gamma lambda A_next; then V_next = V_t, A_next = A_t
   *   masked t: A_t = A_next (the running values pass through unchanged)
   * returns_t = A_t + V_t at every position (a masked position reads its own V_t). */
  RLK_GAE_MASKED_SKIP = 0,
  /* OpenRLHF and TRL: rewards and values are zeroed at masked positions (r' = r m, V' = V m),
   * then the plain recurrence A_t = r'_t + gamma V'_{t+1} - V'_t + gamma lambda A_{t+1}
   * (V'_T = A_T = 0); returns_t = A_t + V'_t. A masked position inside a row gets
   * gamma V'_{t+1} + gamma lambda A_{t+1}; trailing padding gets 0. */
  RLK_GAE_MASKED_ZERO = 1
} rlk_gae_masked;

typedef struct rlk_gae_args {
  rlk_tensor rewards; /* [B, T] f32 or f64: token-level rewards */
  rlk_tensor values;  /* [B, T] same dtype: the critic's values */
  rlk_tensor mask;    /* optional [B, T] bool, i32 or f32: the response (action) mask */
  /* gamma, lambda and gamma * lambda are finite and, with f32 data, within f32's range. */
  double gamma;       /* discount (verl 1.0, OpenRLHF 1.0, TRL 1.0) */
  double lambda;      /* GAE lambda (verl 1.0, OpenRLHF 0.95, TRL 0.95) */
  rlk_gae_masked masked;
  rlk_tensor advantages; /* output [B, T], same dtype: A, before any whitening */
  rlk_tensor returns;    /* optional output [B, T], same dtype: A + V as described above */
  rlk_scan_algo algo;
} rlk_gae_args;

/* Fills `args` with verl's defaults: gamma 1, lambda 1, RLK_GAE_MASKED_SKIP, RLK_SCAN_AUTO,
 * every tensor absent. */
RLK_API void rlk_gae_args_init(rlk_gae_args *args);

/* Generalized advantage estimation (and returns) over every row on `stream`: one launch.
 * Deterministic: the same inputs and shape give bitwise the same outputs on the same device.
 * Never synchronizes, never allocates device memory, capturable (see Conventions). */
RLK_API rlk_status rlk_gae(rlk_context *ctx, const rlk_gae_args *args, void *stream);

/* What discounted returns do at masked positions. */
typedef enum rlk_returns_masked {
  /* verl REINFORCE++: the running return is reset after a masked position:
   *   R_t = r_t + gamma m_{t+1} R_{t+1}  (R_T = 0), at every position (a masked position reads
   * its own r_t; what it gets there does not flow into earlier positions). */
  RLK_RETURNS_MASKED_RESET = 0,
  /* OpenRLHF: rewards are zeroed at masked positions, R_t = r_t m_t + gamma R_{t+1}. */
  RLK_RETURNS_MASKED_ZERO = 1,
  /* verl REINFORCE++ since multi-turn rollouts (observation tokens masked): the running return
   * is carried through masked positions unchanged, C_t = r_t + gamma C_{t+1} where valid and
   * C_t = C_{t+1} where masked; R_t = C_t where valid, 0 where masked. */
  RLK_RETURNS_MASKED_CARRY = 2
} rlk_returns_masked;

typedef struct rlk_discounted_returns_args {
  rlk_tensor rewards; /* [B, T] f32 or f64 */
  rlk_tensor mask;    /* optional [B, T] bool, i32 or f32 */
  double gamma;       /* finite, and within f32's range with f32 data (verl 1.0, OpenRLHF 1.0) */
  rlk_returns_masked masked;
  rlk_tensor returns; /* output [B, T], same dtype */
  rlk_scan_algo algo;
} rlk_discounted_returns_args;

/* Fills `args` with gamma 1, RLK_RETURNS_MASKED_RESET (verl's REINFORCE++ before multi-turn
 * rollouts; verl 0.9.1's is RLK_RETURNS_MASKED_CARRY), RLK_SCAN_AUTO, every tensor absent. */
RLK_API void rlk_discounted_returns_args_init(rlk_discounted_returns_args *args);

/* Discounted returns R_t = r_t + gamma R_{t+1} per row, with the mask as chosen above, on
 * `stream`: one launch, deterministic like rlk_gae.
 * Never synchronizes, never allocates device memory, capturable (see Conventions). */
RLK_API rlk_status rlk_discounted_returns(rlk_context *ctx, const rlk_discounted_returns_args *args,
                                          void *stream);

typedef struct rlk_reverse_cumsum_args {
  rlk_tensor values; /* [B, T] f32 or f64 (ReMax: token-level rewards) */
  rlk_tensor mask;   /* optional [B, T] bool, i32 or f32 */
  rlk_tensor out;    /* output [B, T], same dtype: out_t = sum over valid s >= t of values_s */
  /* Optional, ReMax: baseline [B] (same dtype, contiguous; the greedy rollout's reward) and the
   * output advantages [B, T] = out_t - baseline_b where valid, out_t elsewhere (out_t - baseline_b
   * m_t for a 0/1 mask). Both or neither. */
  rlk_tensor baseline;
  rlk_tensor advantages;
  rlk_scan_algo algo;
} rlk_reverse_cumsum_args;

/* Fills `args` with RLK_SCAN_AUTO and every tensor absent. */
RLK_API void rlk_reverse_cumsum_args_init(rlk_reverse_cumsum_args *args);

/* Reverse cumulative sums of the valid values per row (flip, cumsum, flip of values * mask for a 0/1
 * mask: the mask selects, see the shapes above),
 * and the ReMax advantages when a baseline is given, on `stream`: one launch, deterministic.
 * Never synchronizes, never allocates device memory, capturable (see Conventions). */
RLK_API rlk_status rlk_reverse_cumsum(rlk_context *ctx, const rlk_reverse_cumsum_args *args,
                                      void *stream);

/* How the whitening variance is floored. */
typedef enum rlk_whiten_eps {
  RLK_WHITEN_EPS_ADD = 0,  /* rsqrt(var + eps): verl, TRL */
  RLK_WHITEN_EPS_CLAMP = 1 /* rsqrt(max(var, eps)): OpenRLHF */
} rlk_whiten_eps;

/* What whitening writes at masked positions. */
typedef enum rlk_whiten_masked {
  RLK_WHITEN_MASKED_APPLY = 0, /* the same transform as valid ones (verl GAE, OpenRLHF) */
  RLK_WHITEN_MASKED_ZERO = 1   /* 0 (verl REINFORCE++ multiplies by the mask, TRL fills 0) */
} rlk_whiten_masked;

typedef struct rlk_masked_whiten_args {
  rlk_tensor x;    /* [B, T] (or [N]) f32 or f64 */
  rlk_tensor mask; /* optional, x's shape, bool, i32 or f32: the elements the statistics cover */
  rlk_tensor out;  /* output, x's shape and dtype; may be x itself (same data and strides) */
  /* Statistics over the N valid elements of the whole batch, in fp64:
   *   mean = sum(x) / (N + count_eps)
   *   var  = sum((x - mean)^2) / (N + count_eps), times N / (N - 1) when unbiased
   *   out  = (x - mean) * rstd, plus mean when shift_mean is 0,
   *   rstd = rsqrt(var + eps) or rsqrt(max(var, eps)) (eps_mode), or 1 when normalize_std is 0.
   * count_eps is verl's 1e-8 in the mean's denominator (0: TRL, OpenRLHF).
   * Undefined statistics (N == 0, or N == 1 with unbiased and normalize_std) are not an error
   * (they cannot be seen without synchronizing): every valid output, and every masked one under
   * RLK_WHITEN_MASKED_APPLY, is NaN, and `stats` reports N. verl raises in that case. */
  double eps;       /* >= 0, finite: verl and TRL 1e-8 added, OpenRLHF 1e-8 as a floor */
  rlk_whiten_eps eps_mode;
  int unbiased;     /* 1: Bessel's N / (N - 1) (verl, TRL); 0: biased (OpenRLHF) */
  double count_eps; /* >= 0, finite */
  int shift_mean;   /* 1: centre (default); 0: add the mean back (verl and TRL shift_mean=False) */
  int normalize_std;/* 1: divide by the std (default); 0: only centre (OpenRLHF no std norm) */
  rlk_whiten_masked masked;
  /* Optional output: f64 [3] device memory, {mean, var, N} as used (var after Bessel; NaN when
   * undefined). Lets a caller check N later, off the hot path. */
  rlk_tensor stats;
  /* Scratch for the deterministic cross-block reduction on a GPU, rlk_masked_whiten_workspace_size
   * bytes of device memory (8-byte aligned); may be NULL when that size is 0 (the host backend). */
  void *workspace;
  size_t workspace_bytes;
} rlk_masked_whiten_args;

/* Fills `args` with verl's masked_whiten: eps 1e-8 added, unbiased, count_eps 1e-8, shift_mean 1,
 * normalize_std 1, RLK_WHITEN_MASKED_APPLY, every tensor and the workspace absent. */
RLK_API void rlk_masked_whiten_args_init(rlk_masked_whiten_args *args);

/* Bytes of workspace rlk_masked_whiten needs for these arguments' shape (0 on the host backend).
 * Depends only on x's shape and dtype and the device (a block's chunk holds 32 bytes per thread,
 * so f64 may need more than f32), so it can be queried once and reused. */
RLK_API rlk_status rlk_masked_whiten_workspace_size(rlk_context *ctx,
                                                    const rlk_masked_whiten_args *args,
                                                    size_t *bytes);

/* Whitens x over all valid elements of the batch on `stream`: two launches on a GPU (partial
 * statistics per block, then a fixed-order merge and the transform), one on the host. No float
 * atomics: bitwise repeatable on the same device for the same shape.
 * Never synchronizes, never allocates device memory, capturable (see Conventions). */
RLK_API rlk_status rlk_masked_whiten(rlk_context *ctx, const rlk_masked_whiten_args *args,
                                     void *stream);

/* ------------------------------------------------------------------------ */
/* Ops: token log-probs and entropy from logits                             */
/* ------------------------------------------------------------------------ */

/* Which kernel streams the logits. Every variant computes the same math (fp32 online max /
 * sum-exp / sum p z, one pass over the logits); they differ in how bytes reach the SMs. A variant
 * a device cannot run falls back to the default of its arch, as does a tensor the variant cannot
 * describe (RLK_LOGPROB_VARIANT_TMA on a row stride that is not a multiple of 16 bytes). */
typedef enum rlk_logprob_variant {
  RLK_LOGPROB_VARIANT_AUTO = 0, /* the arch's default; RLK_LOGPROB_VARIANT=vec|bulk|tma overrides */
  RLK_LOGPROB_VARIANT_VEC = 1,  /* 16-byte vector loads, several in flight (every backend) */
  RLK_LOGPROB_VARIANT_BULK = 2, /* sm_90+: 1-D bulk copies (cp.async.bulk) into a shared-memory
                                 * ring, mbarrier pipeline; forward only */
  RLK_LOGPROB_VARIANT_TMA = 3   /* sm_90+: tensor-map copies (cp.async.bulk.tensor) of 512-byte x
                                 * row boxes into a shared-memory ring; forward only */
} rlk_logprob_variant;

/* Bits that rlk_logprob, rlk_logprob_backward and rlk_logprob_combine OR into the caller's status
 * word. */
#define RLK_LOGPROB_STATUS_BAD_LABEL 1 /* a label outside [0, V) that is not ignore_index (sharded:
                                        * a label no shard owns) */
#define RLK_LOGPROB_STATUS_LABEL_OWNERS 2 /* sharded: a label owned by two or more shards (their
                                           * vocabulary ranges overlap) */
#define RLK_LOGPROB_STATUS_BAD_ROW 4 /* rlk_linear_logprob's row selection: an index outside hidden's
                                      * rows or not greater than the one before it */

/* Forward: z = logits / temperature in fp32 per row i, lse[i] = log sum_j exp(z[i, j]),
 *   logp[i] = z[i, y_i] - lse[i],   entropy[i] = lse[i] - sum_j p[i, j] z[i, j],  p = softmax(z).
 * A row whose label is ignore_index gets logp 0 (lse and entropy are computed as usual; its
 * gradient in rlk_logprob_backward is 0). A label outside [0, V) that is not ignore_index is an
 * error reported without synchronizing: the row's logp, lse and entropy are NaN and the
 * RLK_LOGPROB_STATUS_BAD_LABEL bit is OR-ed into *status (when given). A -inf logit contributes
 * nothing; a row of -inf has lse -inf and NaN logp and entropy, like log_softmax; a NaN logit
 * makes its row NaN. */
typedef struct rlk_logprob_args {
  /* [N, V] bf16, f16 or f32; rows contiguous, row stride >= V (any, e.g. a slice of a wider
   * buffer). Never written. */
  rlk_tensor logits;
  /* [N] i32 or i64, any positive stride. */
  rlk_tensor labels;
  float temperature;    /* finite, at least 2^-60; the logits are divided by it in fp32 */
  int64_t ignore_index; /* a label equal to it marks a row that is not scored */
  /* Outputs, f32 [N], contiguous. logp is required; lse (what rlk_logprob_backward needs) and
   * entropy are written when present. Computing the entropy costs no second pass. */
  rlk_tensor logp;
  rlk_tensor lse;
  rlk_tensor entropy;
  /* Optional i32 [1] (device memory): the call ORs RLK_LOGPROB_STATUS_* bits into it and never
   * clears it. Zero it once, pass it to any number of calls, read it whenever a sync is cheap. */
  rlk_tensor status;
  /* Tuning (what rlk_precompile's variant=, block=, unroll= and stages= settings name; 0 or AUTO:
   * the arch's default). block: threads per block (vec: a power of two from the warp size to
   * 1024; bulk and tma: the consumer threads, a multiple of 32 up to 992; tma: one warp per row
   * of a box). unroll: 16-byte vectors in flight per thread (1, 2, 4, 8; tma: boxes per stage).
   * stages: depth of the shared-memory ring of bulk and tma (2..8). A variant that falls back
   * takes the fallback's defaults. Results agree across choices up to the order in which
   * partial sums are combined. */
  rlk_logprob_variant variant;
  int block;
  int unroll;
  int stages;
  /* Shard form (vocab-parallel, see "Vocab-parallel log-probs" below): when `partials` is given,
   * the logits are the columns [vocab_start, vocab_start + V) of a larger vocabulary, labels are
   * indices into that vocabulary, and the call writes the shard's records, f32 [N, 4] contiguous
   * and 16-byte aligned, instead of logp, lse and entropy (which must then be absent; status is
   * not touched: a label outside the shard is no error here). partial_entropy 1 fills the
   * records' entropy field (u), else it is 0. The shard form always runs the vector variant
   * (with block and unroll as asked). */
  rlk_tensor partials;
  int64_t vocab_start;
  int partial_entropy;
  /* Kept-set replay (optional): f32 [N] contiguous, a logit threshold per row (rlk_sample's
   * `threshold` output, or any): the row's softmax, logp, lse and entropy are over its kept set,
   * the logits at or above the threshold (as given, before the temperature) and the label, which
   * stays whatever its logit:
   *   lse' = log sum_{kept} exp z,  logp = z_y - lse',  entropy = lse' - sum_{kept} p' z,
   * p' = exp(z - lse') on the kept set and 0 elsewhere. A threshold of -inf or NaN (a row the
   * sampler gave no token) keeps every logit: the plain call's bits. The vector kernel runs it
   * (bulk and tensor-map requests take it; the tuning database is not read); no shard form. */
  rlk_tensor threshold;
} rlk_logprob_args;

/* Fills `args` with the defaults of TRL, verl and OpenRLHF: temperature 1, ignore_index -100
 * (PyTorch's cross-entropy default), variant auto, tuning 0 (the defaults), every tensor absent. */
RLK_API void rlk_logprob_args_init(rlk_logprob_args *args);

/* Token log-probs (and lse, entropy) on `stream`, one pass over the logits; no device memory
 * beyond the outputs. Deterministic: the same inputs and launch give bitwise the same outputs.
 * Each term is taken relative to the row's maximum ((z - max z) / T), so the maximum's log-prob
 * is exact at any temperature and any logit size; lse is z / T rounded to f32.
 * Never synchronizes, never allocates device memory, capturable (see Conventions). */
RLK_API rlk_status rlk_logprob(rlk_context *ctx, const rlk_logprob_args *args, void *stream);

/* Backward of rlk_logprob: with p = softmax(z) and E = E_p[z] = lse - entropy,
 *   grad_logits[i, j] = (g_lp[i] (onehot(y_i)_j - p[i, j]) - g_H[i] p[i, j] (z[i, j] - E[i])) / T.
 * Rows whose label is ignore_index get 0; a bad label gives a NaN row and the status bit. */
typedef struct rlk_logprob_backward_args {
  rlk_tensor logits;    /* the forward's logits [N, V] */
  rlk_tensor labels;    /* the forward's labels [N] */
  float temperature;    /* the forward's temperature */
  int64_t ignore_index; /* the forward's ignore_index */
  rlk_tensor lse;       /* f32 [N] from the forward; required */
  /* f32 [N] upstream gradients, any positive stride: grad_logp (g_lp) and grad_entropy (g_H)
   * are each optional (absent: 0), at least one present; grad_entropy needs entropy. */
  rlk_tensor grad_logp;
  rlk_tensor grad_entropy;
  rlk_tensor entropy;   /* f32 [N] from the forward; required with grad_entropy */
  /* Output [N, V]: the logits' dtype or f32, rows contiguous, row stride >= V. It may be the
   * logits tensor itself (same data, dtype and row stride: computed in place); any other overlap
   * with the logits is refused. */
  rlk_tensor grad_logits;
  rlk_tensor status;    /* as in rlk_logprob_args */
  /* Tuning as in rlk_logprob_args: only the vector variant has a backward (the others fall
   * back to it); stages is unused. */
  rlk_logprob_variant variant;
  int block;
  int unroll;
  int stages;
  /* Shard form: shard 1 says the logits are the columns [vocab_start, vocab_start + V) of a
   * larger vocabulary and lse / entropy are rlk_logprob_combine's (the whole vocabulary's). A
   * label outside the shard gives no one-hot term and is no error (a label no shard owns already
   * made the combined lse NaN, so its row's gradient is NaN). No communication: every shard
   * computes its own columns' gradient. */
  int shard;
  int64_t vocab_start;
  /* Kept-set replay: the forward's threshold (f32 [N] contiguous) with its lse and entropy:
   * p' in place of p, 0 off the kept set (the label's one-hot term and its p' stay). */
  rlk_tensor threshold;
} rlk_logprob_backward_args;

/* Fills `args` like rlk_logprob_args_init. */
RLK_API void rlk_logprob_backward_args_init(rlk_logprob_backward_args *args);

/* Writes grad_logits on `stream`: re-reads the logits once, writes each gradient once. The
 * probabilities are formed from the forward's f32 lse, whose rounding (2^-24 |lse|) each
 * exponent carries: past |lse| of about 2^16 (a row's largest |logit| / T) the gradients lose
 * f32's precision accordingly.
 * Never synchronizes, never allocates device memory, capturable (see Conventions). */
RLK_API rlk_status rlk_logprob_backward(rlk_context *ctx, const rlk_logprob_backward_args *args,
                                        void *stream);

/* ------------------------------------------------------------------------ */
/* Ops: vocab-parallel log-probs and entropy (tensor-parallel LM heads)     */
/* ------------------------------------------------------------------------ */

/* The vocabulary is split into P shards [v0_r, v1_r), one per tensor-parallel rank, of any widths.
 * A shard's forward (rlk_logprob with `partials`; any other producer may write the same records,
 * e.g. a fused LM head over a weight shard) writes one record of RLK_LOGPROB_PARTIAL_FIELDS f32 per
 * row, in natural-log units of z = logits / temperature over the shard's columns:
 *   [0] m  the shard's largest z (-inf when every z is -inf)
 *   [1] s  sum_j exp(z_j - m)              (0 when m is -inf; NaN when a logit is NaN or +inf)
 *   [2] u  sum_j exp(z_j - m) (z_j - m)    (the entropy's part; 0 when not asked for)
 *   [3] t  z_y when the shard owns the row's label (v0 <= y < v1, y not ignore_index), else
 *          +inf, the "absent" marker; an owned z_y of +inf (a +inf logit, or one whose z passes
 *          f32's range) is written as NaN, never +inf: the label stays owned, its row is NaN
 * The caller gathers the P shards' [N, 4] records into [P, N, 4] in rank order (one all-gather of
 * 16 N bytes per rank; rlk_logprob_vocab_parallel does it through NCCL), and rlk_logprob_combine
 * merges each row's records in that order:
 *   M = max_r m_r,  S = sum_r s_r e^(m_r - M),  U = sum_r e^(m_r - M) (u_r + (m_r - M) s_r),
 *   lse = M + ln S,  entropy = ln S - U / S,  logp = (t_owner - M) - ln S.
 * Every rank combining the same gathered bytes gets bitwise the same results (the order is
 * rlk's, not the collective's). The backward needs no communication: rlk_logprob_backward with
 * shard 1, the shard's logits and the combined lse (and entropy). */
#define RLK_LOGPROB_PARTIAL_FIELDS 4

typedef struct rlk_logprob_combine_args {
  /* f32 [P, N, 4] contiguous and 16-byte aligned: the shards' records in rank order (P >= 1). */
  rlk_tensor partials;
  /* [N] i32 or i64, any positive stride: only compared with ignore_index (ownership is in the
   * records). */
  rlk_tensor labels;
  int64_t ignore_index;
  /* Outputs as rlk_logprob's: f32 [N] contiguous, logp required, lse and entropy optional
   * (entropy needs records written with partial_entropy 1). An ignored row gets logp 0; a row
   * whose label no record owns, or two records own, gets NaN logp, lse and entropy and raises
   * RLK_LOGPROB_STATUS_BAD_LABEL or RLK_LOGPROB_STATUS_LABEL_OWNERS in *status. */
  rlk_tensor logp;
  rlk_tensor lse;
  rlk_tensor entropy;
  rlk_tensor status; /* optional i32 [1], as in rlk_logprob_args */
} rlk_logprob_combine_args;

/* Fills `args` with ignore_index -100 and every tensor absent. */
RLK_API void rlk_logprob_combine_args_init(rlk_logprob_combine_args *args);

/* Merges gathered shard records into logp, lse and entropy on `stream`: one small launch (a
 * thread per row, the P records in order), reads 16 P N bytes. */
RLK_API rlk_status rlk_logprob_combine(rlk_context *ctx, const rlk_logprob_combine_args *args,
                                       void *stream);

/* The shard forward, one NCCL all-gather of the records and the combine, in one call on the
 * caller's stream (CUDA backend). libnccl is opened at run time, never linked: first a copy the
 * process already loaded (PyTorch's: dlopen of libnccl.so.2 / libnccl.so with RTLD_NOLOAD), else
 * the path in RLK_NCCL_LIB (when set, the only other candidate), else the system's libnccl.so.2.
 * The communicator must come from that same library. Its ranks must hold the shards in rank
 * order; every rank makes the same calls in the same order (NCCL's rule). No synchronization, no
 * allocation: the records live in the caller's workspace. */
typedef struct rlk_logprob_vocab_parallel_args {
  /* The shard forward's arguments: logits (this rank's shard), labels, temperature, ignore_index,
   * vocab_start and tuning as in rlk_logprob's shard form; logp, lse, entropy and status are the
   * combined outputs (as in rlk_logprob_combine_args); partials must be absent and
   * partial_entropy is implied by entropy. */
  rlk_logprob_args fwd;
  void *nccl_comm; /* the caller's ncclComm_t */
  /* Device memory of rlk_logprob_vocab_parallel_workspace_size() bytes (16 P N), 16-byte aligned:
   * the gathered records, left there for inspection. */
  void *workspace;
  size_t workspace_bytes;
} rlk_logprob_vocab_parallel_args;

/* Fills `args` with rlk_logprob_args_init's defaults, no communicator and no workspace. */
RLK_API void rlk_logprob_vocab_parallel_args_init(rlk_logprob_vocab_parallel_args *args);

/* Bytes of workspace (16 P N, P = the communicator's rank count, asked of NCCL). CUDA backend
 * only (RLK_ERR_UNSUPPORTED elsewhere, before NCCL is asked anything). */
RLK_API rlk_status rlk_logprob_vocab_parallel_workspace_size(rlk_context *ctx,
                                                             const rlk_logprob_vocab_parallel_args *args,
                                                             size_t *bytes);

/* Three launches on `stream`: the shard's records into its rank's slot of the workspace, an
 * in-place ncclAllGather, the combine. RLK_ERR_UNAVAILABLE when no libnccl can be opened (the
 * message lists what was tried), RLK_ERR_UNSUPPORTED off the CUDA backend, RLK_ERR_BACKEND when
 * NCCL refuses the collective. */
RLK_API rlk_status rlk_logprob_vocab_parallel(rlk_context *ctx,
                                              const rlk_logprob_vocab_parallel_args *args,
                                              void *stream);

/* Opens libnccl as rlk_logprob_vocab_parallel does and writes its ncclGetVersion code (e.g.
 * 22809) and the file it came from (into path, when given, cut to `size`). RLK_ERR_UNAVAILABLE
 * lists every candidate tried. */
RLK_API rlk_status rlk_nccl_version(int *version, char *path, size_t size);

/* ------------------------------------------------------------------------ */
/* Ops: fused LM head + token log-probs (and entropy)                       */
/* ------------------------------------------------------------------------ */

/* Kernels of rlk_linear_logprob: AUTO picks WGMMA on sm_90a where the tensors allow tensor maps
 * (16-byte aligned, row strides a multiple of 8 elements), TILED elsewhere (every CUDA target and
 * HIP). The host backend computes in fp64 whatever is asked. */
typedef enum rlk_linear_logprob_variant {
  RLK_LINEAR_LOGPROB_AUTO = 0,
  RLK_LINEAR_LOGPROB_WGMMA = 1, /* sm_90a: TMA + wgmma, warp-specialized */
  RLK_LINEAR_LOGPROB_TILED = 2  /* portable f32 tiles from shared memory */
} rlk_linear_logprob_variant;

/* rlk_logprob's outputs from z = hidden weight^T / T without ever storing the [N, V] logits:
 *   logp[i] = z[i, y_i] - lse[i],  lse[i] = log sum_v exp z[i, v],  entropy[i] = lse[i] - E_p[z],
 * with the same label rules (ignore_index: logp 0; a label outside [0, V): NaN row and
 * RLK_LOGPROB_STATUS_BAD_LABEL in *status). The dot products accumulate in f32 on a GPU (fp64 on
 * the host). A GPU call runs a GEMM kernel per (row block, vocabulary split) that leaves a record
 * per row and 256 columns (max, sum of exp, sum of p z, the label's logit) in the workspace, then
 * a kernel that merges each row's records in a tree fixed by V: bitwise repeatable, no float
 * atomics.
 * Batch invariance: a row's logp, lse and entropy (and in rlk_linear_logprob_backward its
 * grad_hidden row) are bitwise the same whatever the other rows: any N, the row's place, packing,
 * the token chunks of rlk_linear_policy_loss, splits, the workspace and the tuning database. The
 * contract's boundary: given equal hidden states, weight, label and temperature, on
 * the same kernel (sm_90a's wgmma kernels where tensor maps describe hidden and weight, else the
 * tiled ones: the two differ in bits) and target, equal bits. How the hidden states came to be
 * (the model's own batch shapes) is outside it. With RLK_INVARIANT=1 in the environment the
 * calls refuse the choices made from more than a row: this op's fallback from the wgmma kernels
 * to the tiled ones where no tensor map describes hidden or weight (an error; variant TILED asks
 * for them), rlk_logprob's bulk and tensor-map variants (an error) and its tuning database
 * winners (not read). Checked on an H200 (tests/test_invariance.c) and on the host backend. */
typedef struct rlk_linear_logprob_args {
  rlk_tensor hidden;    /* [N, H] bf16 or f16, rows contiguous, row stride >= H */
  rlk_tensor weight;    /* [V, H] the LM head (hidden's dtype), rows contiguous, row stride >= H */
  rlk_tensor labels;    /* [N] i32 or i64, any positive stride */
  float temperature;    /* finite, at least 2^-60 */
  int64_t ignore_index;
  rlk_tensor logp;      /* f32 [N] contiguous, required */
  rlk_tensor lse;       /* f32 [N] contiguous, optional */
  rlk_tensor entropy;   /* f32 [N] contiguous, optional (computed in the same pass) */
  rlk_tensor status;    /* optional i32 [1], as in rlk_logprob_args */
  /* Device scratch of rlk_linear_logprob_workspace_size() bytes, 16-byte aligned (NULL when 0). */
  void *workspace;
  size_t workspace_bytes;
  rlk_linear_logprob_variant variant;
  /* Vocabulary splits a row block's work is cut into (0: chosen from N, V and the GPU); each split
   * covers a multiple of 256 columns. A schedule only: the bits are the same for every value. */
  int splits;
  /* sm_90a kernel's ring of operand stages, 48 KB each: 2 to 4 (0: 4, or the tuning database's
   * winner for the call's key when splits is 0 as well). */
  int stages;
  /* Shard form (a tensor-parallel LM head, see "Vocab-parallel log-probs"): when `partials` is
   * given, weight holds the rows [vocab_start, vocab_start + V) of a larger head, labels index
   * that vocabulary, and the call writes this shard's records, f32 [N, 4] contiguous and
   * 16-byte aligned (the format rlk_logprob_combine merges), instead of logp, lse and entropy
   * (which must then be absent; status is not touched: a label outside the shard is no error).
   * partial_entropy 1 fills the records' entropy field. */
  rlk_tensor partials;
  int64_t vocab_start;
  int partial_entropy;
  /* Kept-set replay (optional): f32 [N] contiguous, a threshold per row on the raw logits
   * hidden . weight_v (before the temperature; rlk_linear_sample's and rlk_sample's `threshold`):
   * the softmax, logp, lse and entropy over the logits at or above it and the label, as in
   * rlk_logprob_args. -inf or NaN keeps every logit (the plain call's bits). No shard form. */
  rlk_tensor threshold;
  /* Row selection (optional): i32 or i64 [n], any positive stride, indices into hidden's rows,
   * strictly increasing and in [0, N_all) (a mask's nonzero positions). hidden is then
   * [N_all, H] and the call's rows are hidden's rows rows[0], ..., rows[n - 1]: labels, logp,
   * lse, entropy, threshold and partials are [n], and only those rows go through the head. A
   * kernel copies each launch's selected rows into the workspace (rows of H rounded up to 8
   * elements, at most 64 MiB of them a launch) and the call runs on them: a row's bits are those
   * of the call on hidden[rows] laid out so (for H a multiple of 8, a contiguous copy). An index
   * out of range or not above the one before it makes its row's hidden states NaN (its logp
   * NaN, its lse and entropy not finite: the GPU's kernels read a row of NaN logits as empty,
   * lse -inf) and sets RLK_LOGPROB_STATUS_BAD_ROW in *status (in the shard form too); n is at least 1
   * (as hidden's N). Not taken by rlk_linear_policy_loss. */
  rlk_tensor rows;
} rlk_linear_logprob_args;

/* Defaults: temperature 1, ignore_index -100, variant auto, splits 0, stages 0, every tensor
 * absent. */
RLK_API void rlk_linear_logprob_args_init(rlk_linear_logprob_args *args);

/* Bytes of workspace a call with these arguments needs (on a GPU 16 bytes per row and 256
 * vocabulary columns for at most 128 MiB of rows at a time, the call launching more rows after
 * them; 0 on the host backend; with a row selection, on either, the gathered rows of a launch
 * besides). Checks the arguments like the call. */
RLK_API rlk_status rlk_linear_logprob_workspace_size(rlk_context *ctx,
                                                     const rlk_linear_logprob_args *args,
                                                     size_t *bytes);

/* The fused forward on `stream`: two launches per 128 MiB of records (one at N 14080, V 151936),
 * no device memory beyond the workspace. On a GPU each exponent is formed against the row's
 * maximum of z / T rounded to f32, whose rounding (2^-24 max |z| / T) the log-probs carry; a row
 * whose max |z| / T passes 2^31 overflows (rlk_logprob from stored logits has no such limit). */
RLK_API rlk_status rlk_linear_logprob(rlk_context *ctx, const rlk_linear_logprob_args *args,
                                      void *stream);

/* Backward of rlk_linear_logprob. With z = hidden weight^T / T, p = softmax(z), E = lse - entropy:
 *   dz[i, v] = (g_lp[i] (onehot(y_i)_v - p[i, v]) - g_H[i] p[i, v] (z[i, v] - E[i])) / T,
 *   grad_hidden = dz weight,  grad_weight = dz^T hidden.
 * The logits are recomputed chunk by chunk (`chunk` vocabulary columns at a time, in order); a
 * chunk's dz lives in the workspace, never the whole [N, V]. On a GPU the rows go in blocks, in
 * order, each over the whole vocabulary: one block while every row's share of the workspace (the
 * f32 sum of a 16-bit or a selection's grad_hidden row, and a row of dz 1024 columns wide) fits
 * 288 MiB (on sm_90a, 16384 rows at H 4096 with 16-bit gradients), else blocks of a multiple of
 * 128 rows that do, so that no N is too many (2^20 rows and more) and the workspace stays within
 * the budget. A row's grad_hidden has the same bits in any block; grad_weight is summed block after
 * block (a 16-bit grad_weight rounded after each). Rows whose label is ignore_index contribute
 * nothing; a bad label makes the gradients NaN and sets the status bit. Deterministic: a fixed
 * order of blocks and chunks, every output element written by one thread, no atomics. */
typedef struct rlk_linear_logprob_backward_args {
  rlk_tensor hidden;    /* the forward's [N, H] */
  rlk_tensor weight;    /* the forward's [V, H] */
  rlk_tensor labels;    /* the forward's [N] */
  float temperature;
  int64_t ignore_index;
  rlk_tensor lse;       /* f32 [N] from the forward, required */
  /* f32 [N] upstream gradients, any positive stride, each optional (absent: 0), at least one;
   * grad_entropy needs the forward's entropy. */
  rlk_tensor grad_logp;
  rlk_tensor grad_entropy;
  rlk_tensor entropy;
  /* Outputs, each optional (at least one): [N, H] and [V, H], f32 or the inputs' dtype, rows
   * contiguous, row stride >= H. Overwritten, or added to when `accumulate` is 1. grad_hidden's
   * sum over the vocabulary is one chain of additions whatever the chunk width (so a row's
   * gradient has the same bits in any batch); accumulating, the chain starts from the value the
   * output held, so its additions round at that value's magnitude too (at most about V times
   * |held value| times f32's unit roundoff more; an overwrite is not affected). */
  rlk_tensor grad_hidden;
  rlk_tensor grad_weight;
  int accumulate;
  rlk_tensor status;    /* as in rlk_logprob_args */
  void *workspace;      /* rlk_linear_logprob_backward_workspace_size() bytes, 16-byte aligned */
  size_t workspace_bytes;
  int chunk;            /* vocabulary columns per chunk, a multiple of 64, rounded up to 256 on
                         * sm_90a (0: chosen with the workspace within 288 MiB: on sm_90a the
                         * width whose tiles best fill the multiprocessors, elsewhere the fewest
                         * chunks, of even widths) */
  /* sm_90a kernels' tile order: output tiles go in groups of `group` rows of tiles, column by
   * column inside a group, so that the blocks running together share operands in L2: 1 to 64
   * (0: 8). With chunk and group both 0, the tuning database's winner for the call's key. */
  int group;
  /* Shard form: shard 1 says weight holds the rows [vocab_start, vocab_start + V) of a larger
   * head whose vocabulary labels index; lse (and entropy) are then the combined ones
   * (rlk_logprob_combine). The gradients are this shard's: grad_hidden its part of the sum over
   * shards, grad_weight its rows. No communication; a label outside the shard is no error. */
  int shard;
  int64_t vocab_start;
  /* Kept-set replay: the forward's threshold (f32 [N] contiguous) with its lse and entropy: p' in
   * place of p, 0 off the kept set (the label's terms stay). */
  rlk_tensor threshold;
  /* Row selection, as the forward's: hidden [N_all, H]; labels, lse, grad_logp, entropy,
   * grad_entropy and threshold are [n]; the products run on the selected rows gathered into the
   * workspace (a bad index as in the forward). grad_hidden keeps hidden's shape [N_all, H]: a
   * selected row gets the gathered call's gradient row (bitwise; added to when accumulating), a
   * row not selected is written 0, or left as it is when accumulating. grad_weight is the
   * gathered call's wherever both run their rows in one block; with an f32 grad_hidden the
   * selection's sum takes workspace that the gathered call's does not (it is its own), so past
   * 16384 rows at H 4096 the two may sum grad_weight in other groupings of rows. */
  rlk_tensor rows;
} rlk_linear_logprob_backward_args;

/* Defaults: temperature 1, ignore_index -100, overwrite, chunk 0, group 0, every tensor absent. */
RLK_API void rlk_linear_logprob_backward_args_init(rlk_linear_logprob_backward_args *args);

/* Bytes of workspace the backward needs (for a block of rows: dz of one chunk, f32 or on sm_90a the
 * inputs' 16-bit dtype, and for a 16-bit grad_hidden its f32 sum, on a GPU, within 288 MiB unless
 * `chunk` asks for more; an f32 grad_hidden holds its own sum; on the host backend the fp64 sums,
 * 8 (N H + H) bytes with grad_hidden, else 8 H). A row selection adds, on a GPU, the f32 sum of its
 * grad_hidden rows whatever their dtype (within the budget) and a block's gathered rows (beside
 * it); on the host its gathered rows and its grad_hidden rows in their dtype. */
RLK_API rlk_status rlk_linear_logprob_backward_workspace_size(rlk_context *ctx,
                                                              const rlk_linear_logprob_backward_args *args,
                                                              size_t *bytes);

/* The backward on `stream`: for each block of rows, three launches per chunk, then one for a
 * 16-bit or a selection's grad_hidden (a selection's gathers before them: its rows, and for an f32
 * grad_hidden added to, the rows' held values). */
RLK_API rlk_status rlk_linear_logprob_backward(rlk_context *ctx,
                                               const rlk_linear_logprob_backward_args *args,
                                               void *stream);

/* The policy loss from the LM head's inputs, forward and backward in one call, by one of two
 * paths (rlk_linear_policy_loss_path):
 *   RECOMPUTE     rlk_linear_logprob (the log-probs, and the entropy when the loss has an entropy
 *                 bonus), rlk_policy_loss on them, and rlk_linear_logprob_backward of the loss's
 *                 gradients, which recomputes the logits a vocabulary chunk at a time: four
 *                 products of the head's size.
 *   TOKEN_CHUNKS  (sm_90a) token chunks of chunk_tokens rows, in order: the chunk's logits over
 *                 the whole vocabulary stored once in the inputs' 16-bit dtype (chosen rows: the
 *                 call's whole workspace within 0.3 GiB), its log-probs, its tokens' loss gradients
 *                 (rlk_policy_loss on the chunk with the call's normalizers), the logits turned
 *                 into their gradient in place, then the chunk's grad_hidden rows and its part of
 *                 grad_weight: three products. loss and metrics come from one rlk_policy_loss
 *                 over all tokens at the end (and, for token-mean with a mask and no normalizer,
 *                 one before the chunks for the mask count). With chunk_tokens 0, an f32
 *                 grad_weight that is overwritten (accumulate 0), N <= 2 H and rows 16-byte
 *                 aligned: one chunk of all N tokens, its logits stored transposed, the first
 *                 vocabulary lines in the workspace and the rest in grad_weight's own memory
 *                 (free until the call writes it; never the padding between its rows), then
 *                 grad_weight written once in slices from the last: no read-modify-write passes
 *                 over it. Otherwise grad_weight takes a pass per chunk. It takes: grad_weight
 *                 absent or f32; a per-token loss (ppo, cispo, sapo, reinforce; not
 *                 seq-mean-token-mean, not per-sequence advantages); the loss's per-token tensors
 *                 contiguous over the N tokens; tensor maps for hidden and weight.
 *   AUTO          TOKEN_CHUNKS where it runs and H >= 4096 (narrower heads leave multiprocessors
 *                 idle in a chunk's dh), else RECOMPUTE.
 * The log-probs, the entropy and their gradients live in the workspace unless the caller asks for
 * the forward's outputs. Token i of the loss's layout is row i of hidden: [B, T] tensors (B T = N)
 * are read in row-major order, packed [N] ones as they are. No call synchronizes or allocates;
 * the launches are capturable in a CUDA graph. */
typedef enum rlk_linear_policy_loss_path {
  RLK_LPL_AUTO = 0,
  RLK_LPL_RECOMPUTE = 1,
  RLK_LPL_TOKEN_CHUNKS = 2
} rlk_linear_policy_loss_path;

typedef struct rlk_linear_policy_loss_args {
  /* hidden [N, H], weight [V, H], labels [N], temperature, ignore_index, variant, splits and
   * threshold (kept-set replay: the log-probs, entropy and gradients over each token's kept set,
   * by either path) as in rlk_linear_logprob_args. Its logp, lse and entropy are optional outputs
   * (absent: kept in the workspace); partials must be absent (no shard form). status as in
   * rlk_logprob_args. */
  rlk_linear_logprob_args head;
  /* Every input and setting of rlk_policy_loss, f32, with N tokens: old_logp, advantages, mask,
   * seq_offsets, ref_logp, rollout_is_weights, the mode, clipping, KL, entropy_coef, aggregation
   * and normalizers; its outputs loss and metrics. logp, entropy, grad_logp and grad_entropy
   * must be absent: the head gives the first two, the gradients stay in the workspace. logp
   * takes old_logp's shape (contiguous). Rows whose label is ignore_index get logp 0 and no
   * gradient: the mask should leave them out of the loss. */
  rlk_policy_loss_args loss;
  /* As in rlk_linear_logprob_backward_args: each optional, at least one; overwritten or added
   * to (accumulate 1); chunk and group 0 choose (chunk: the recompute path's vocabulary chunk;
   * group: both paths' tile order). */
  rlk_tensor grad_hidden;
  rlk_tensor grad_weight;
  int accumulate;
  int chunk;
  int group;
  /* The path (AUTO chooses; TOKEN_CHUNKS where it cannot run is an error saying why) and the
   * token chunks' rows (0 chooses them with the whole workspace within 0.3 GiB, all N over
   * grad_weight where it can take them; else a multiple of 64, the stored logits taking about
   * 2.06 V bytes a row). */
  rlk_linear_policy_loss_path path;
  int chunk_tokens;
  /* Device scratch of rlk_linear_policy_loss_workspace_size() bytes, 16-byte aligned. */
  void *workspace;
  size_t workspace_bytes;
} rlk_linear_policy_loss_args;

/* The head's, the loss's and the backward's defaults (each _args_init), every tensor absent. */
RLK_API void rlk_linear_policy_loss_args_init(rlk_linear_policy_loss_args *args);

/* Bytes of workspace a call needs: the three calls' own and the per-token buffers they share.
 * Checks the arguments like the call. */
RLK_API rlk_status rlk_linear_policy_loss_workspace_size(rlk_context *ctx,
                                                         const rlk_linear_policy_loss_args *args,
                                                         size_t *bytes);

/* The forward, the loss and the backward on `stream`, in that order. */
RLK_API rlk_status rlk_linear_policy_loss(rlk_context *ctx, const rlk_linear_policy_loss_args *args,
                                          void *stream);

/* Sampling from the LM head, for a rollout whose log-probs the trainer's fused head reproduces bit
 * for bit: one token per row of hidden [M, H] (a decode step's last hidden states) from
 * z = hidden weight^T / T, with rlk_sample's filters and seeds, and the token's log-prob (lse,
 * entropy) under the temperature-scaled head, bitwise what rlk_linear_logprob gives that row,
 * label and temperature on the same kernel (its records and their merge: the dot products
 * accumulate in f32 in one K order whatever the batch). A GPU call runs the fused head's GEMM over
 * the rows, keeping their raw f32 logits in the workspace beside their records; rlk_sample over
 * those logits (tokens, the kept set's threshold); then the head's combine of the drawn tokens
 * from the same records. The host computes the logits in fp64 (drawn from as f32) and the
 * log-probs with rlk_linear_logprob's fp64 kernel. */
typedef struct rlk_linear_sample_args {
  rlk_tensor hidden;   /* [M, H] bf16 or f16, rows contiguous, row stride >= H */
  rlk_tensor weight;   /* [V, H] of hidden's dtype, rows contiguous; V < 2^23 */
  /* The head's temperature, finite and at least 2^-60, or 0: greedy draws, its log-probs at
   * temperature 1 (as rlk_sample's greedy rows; the trainer then scores with temperature 1). One
   * for the call: the head folds each row's logits at it. */
  float temperature;
  /* The filters and draws as in rlk_sample_args: a per-row tensor or the scalar for every row. */
  rlk_tensor top_ks;   /* i32 or i64 */
  int64_t top_k;
  rlk_tensor top_ps;   /* f32 */
  float top_p;
  rlk_tensor min_ps;   /* f32 */
  float min_p;
  rlk_tensor seeds;    /* i64: one per row makes a row's token independent of the batch */
  uint64_t seed;
  rlk_tensor offsets;  /* i64 */
  uint64_t offset;
  /* Outputs, [M] contiguous: tokens i32 or i64 (required); logp, lse, entropy and threshold f32
   * (optional; threshold: rlk_sample's, the smallest raw logit h . w_v of the row's kept set, for
   * kept-set replay). A row rlk_sample gives no token (token -1, a status bit) has NaN logp, lse
   * and entropy. */
  rlk_tensor tokens;
  rlk_tensor logp;
  rlk_tensor lse;
  rlk_tensor entropy;
  rlk_tensor threshold;
  rlk_tensor status;   /* optional i32 [1]: rlk_sample's RLK_SAMPLE_STATUS_* bits */
  /* Device scratch of rlk_linear_sample_workspace_size() bytes, 16-byte aligned: the rows' f32
   * logits (4 M V bytes, V rounded up to 4) and, on a GPU, their records (16 bytes a row and 256
   * columns). */
  void *workspace;
  size_t workspace_bytes;
  /* The head's kernel as in rlk_linear_logprob_args (the trainer's call must run the same one for
   * equal bits: AUTO picks alike for tensors alike). */
  rlk_linear_logprob_variant variant;
} rlk_linear_sample_args;

/* Defaults: temperature 1, no filter (top_p 1), seed 0, variant auto, every tensor absent. */
RLK_API void rlk_linear_sample_args_init(rlk_linear_sample_args *args);

/* Bytes of workspace a call with these arguments needs; checks them like the call. */
RLK_API rlk_status rlk_linear_sample_workspace_size(rlk_context *ctx, const rlk_linear_sample_args *args,
                                                    size_t *bytes);

/* The draw on `stream`: the head's GEMM, rlk_sample, the head's combine (three launches on a GPU).
 * Never synchronizes, allocates or reads back: capturable. */
RLK_API rlk_status rlk_linear_sample(rlk_context *ctx, const rlk_linear_sample_args *args, void *stream);

/* ------------------------------------------------------------------------ */
/* Ops: divergences between two LM heads (on-policy distillation)          */
/* ------------------------------------------------------------------------ */

/* The divergence of a student's next-token distribution from a teacher's, per token, from both
 * models' hidden states and LM heads, neither head's [N, V] logits ever stored. Per row i, with
 *   z_s = student_hidden[i] student_weight^T / T_s,   z_t = teacher_hidden[i] teacher_weight^T / T_t,
 *   lse = log sum_v exp z,  log p = z - lse  (each side over the same V columns):
 *   FORWARD_KL  D = KL(p_t || p_s) = sum_v p_t (log p_t - log p_s)
 *   REVERSE_KL  D = KL(p_s || p_t) = sum_v p_s (log p_s - log p_t)
 *   JSD         D = beta KL(p_t || m) + (1 - beta) KL(p_s || m),  m = (1 - beta) p_s + beta p_t,
 *               0 < beta < 1 (TRL's generalized JSD: its beta 0 and 1 are the two KLs above)
 * and, with top_k = k > 0 (FORWARD_KL only), the teacher's top-k approximation over the set K of
 * the k columns of largest z_t (ties: the lower column first), with both distributions over the
 * whole vocabulary (verl's top-k forward KL): D = sum_{v in K} p_t (log p_t - log p_s). K holds
 * only columns of nonzero teacher probability (z_t > -inf; a NaN z_t never enters): a row with
 * fewer than k finite teacher logits has all of them in K and no more (a -inf one adds nothing
 * to D or P, and none is a member in the backward), and a row with none has no teacher
 * distribution: K is empty, D and P are NaN and the boundary ([4], [5]) is (+inf, -1). Likewise
 * a -inf teacher logit adds nothing to the whole vocabulary's FORWARD_KL (p_t log p_t = 0), and a
 * row whose teacher logits are all -inf has lse_t -inf and D NaN.
 *
 * What one pass over the vocabulary must gather (each side's running maximum m and sum of
 * exp(z - m), merged across column splits by rescaling to the larger maximum):
 *   FORWARD_KL  D = sum_v p_t (z_t - z_s) - lse_t + lse_s, where sum_v p_t (z_t - z_s) =
 *               G_t / S_t with G_t = sum_v e^(z_t - m_t) (z_t - z_s): one pass.
 *   REVERSE_KL  the mirror image, G_s = sum_v e^(z_s - m_s) (z_s - z_t): one pass.
 *   JSD         log m = log((1 - beta) e^(z_s - lse_s) + beta e^(z_t - lse_t)) weighs the two sides
 *               by their normalizers inside a logarithm, per column: no set of per-side sums
 *               gives it, so a first pass finds lse_s and lse_t and a second pass over the
 *               vocabulary (the logits recomputed) sums D, A = KL(p_s || m) and B = KL(p_t || m).
 *   top-k       each split keeps its k largest teacher logits (value, column); the splits' lists
 *               merge into K, where the student's logits are taken once more (k dot products a
 *               row): D = sum_K p_t (z_t - z_s) - P (lse_t - lse_s), P = sum_K p_t. One pass.
 * The student's entropy lse_s - sum_v p_s z_s comes from the same first pass.
 *
 * The gradients (g = the upstream gradient of D[i]; dD / dz per column, recomputed in the
 * backward from the logits and the saved per-row stats, as the fused head's backward does):
 *   FORWARD_KL  dz_s = p_s - p_t                       dz_t = p_t (log p_t - log p_s - D)
 *   REVERSE_KL  dz_s = p_s (log p_s - log p_t - D)     dz_t = p_t - p_s
 *   JSD         dz_s = (1 - beta) p_s (log p_s - log m - A)   dz_t = beta p_t (log p_t - log m - B)
 *   top-k       dz_s = P p_s - [v in K] p_t            dz_t = p_t ([v in K] (log p_t - log p_s + 1) - D - P)
 * then grad_hidden = (g dz / T) weight and grad_weight = (g dz / T)^T hidden on each side.
 *
 * The per-row stats the forward saves for the backward, f32 [N, RLK_LINEAR_DIVERGENCE_STATS]:
 *   [0] lse_s  [1] lse_t  [2] D
 *   [3] JSD: A = KL(p_s || m); top-k: P = sum_K p_t; else 0
 *   [4] JSD: B = KL(p_t || m); top-k: the k-th largest z_t (of fewer finite ones, the
 *       smallest); else 0
 *   [5] top-k: the column of that z_t (the set's last member; the backward tells membership by
 *       comparing each column's recomputed teacher logit with that column's; -1: none); else 0
 * A row whose label is ignore_index gets D = 0 and stats [2] to [5] 0 (its lse's and entropy are
 * still computed) and no gradient. Dot products accumulate in f32 on a GPU (fp64 on the host); no [N, V] buffer exists;
 * results are bitwise repeatable (splits merged in order, no float atomics). */
typedef enum rlk_divergence_mode {
  RLK_DIVERGENCE_FORWARD_KL = 0, /* KL(teacher || student) */
  RLK_DIVERGENCE_REVERSE_KL = 1, /* KL(student || teacher) */
  RLK_DIVERGENCE_JSD = 2         /* generalized Jensen-Shannon, mixture weight beta */
} rlk_divergence_mode;

#define RLK_LINEAR_DIVERGENCE_STATS 6
#define RLK_LINEAR_DIVERGENCE_TOP_K_MAX 32

/* The vocab-parallel record of one shard (FORWARD_KL and REVERSE_KL), f32 per row, in natural-log
 * units of z over the shard's columns: [0] m_s, [1] sum e^(z_s - m_s), [2] sum e^(z_s - m_s)
 * (z_s - m_s) (the entropy's part), [3] m_t, [4] sum e^(z_t - m_t), [5] G_t = sum e^(z_t - m_t)
 * (z_t - z_s), [6] G_s = sum e^(z_s - m_s) (z_s - z_t), [7] 0. A shard with no column has m = -inf
 * and zero sums. rlk_linear_divergence_combine merges the gathered records of the P shards in rank
 * order: M = max_r m_r, every sum rescaled by e^(m_r - M) (the entropy's part plus (m_r - M) times
 * the shard's sum), then lse = M + ln S and D as above. */
#define RLK_LINEAR_DIVERGENCE_PARTIAL_FIELDS 8

typedef struct rlk_linear_divergence_args {
  /* The two heads: [N, H_s] / [V, H_s] and [N, H_t] / [V, H_t], bf16 or f16 (a head's hidden and
   * weight share a dtype; the two heads need not), rows contiguous, row strides >= H. */
  rlk_tensor student_hidden;
  rlk_tensor student_weight;
  rlk_tensor teacher_hidden;
  rlk_tensor teacher_weight;
  float student_temperature;   /* T_s finite, at least 2^-60 */
  float teacher_temperature;   /* T_t finite, at least 2^-60 */
  rlk_divergence_mode mode;
  double beta;                 /* JSD: in (0, 1) */
  int top_k;                   /* 0: the whole vocabulary; 1 to RLK_LINEAR_DIVERGENCE_TOP_K_MAX
                                * (and <= V, V + vocab_start <= 2^24): FORWARD_KL over the
                                * teacher's top k */
  rlk_tensor labels;           /* optional [N] i32 or i64, any positive stride: only compared
                                * with ignore_index (the student's sampled tokens, -100 where no
                                * token counts) */
  int64_t ignore_index;
  /* Outputs: f32 [N] contiguous D (required), f32 [N, RLK_LINEAR_DIVERGENCE_STATS] contiguous
   * (required: the backward's input), the student's entropy f32 [N] contiguous (optional). */
  rlk_tensor divergence;
  rlk_tensor stats;
  rlk_tensor entropy;
  /* Optional: the loss over the tokens, loss = loss_scale agg(D) as rlk_policy_loss aggregates a
   * term (each mode, normalizer and layout of rlk_loss_agg; the call runs rlk_policy_loss on D),
   * f32 [1], and grad_divergence = d loss / d D, f32 [N] contiguous (the backward's input).
   * Token i of the loss's layout is row i: mask [B, T] (B T = N, bool, i32 or f32, rows
   * contiguous) reads the tokens as B rows of T; else they are packed [N], one sequence or
   * seq_offsets' [S + 1] (i32 or i64). Ignored rows should be masked out (their D is 0). */
  rlk_tensor loss;
  rlk_tensor grad_divergence;
  rlk_tensor mask;
  rlk_tensor seq_offsets;
  rlk_loss_agg agg;
  double token_normalizer, seq_normalizer, norm_scale, loss_scale; /* as in rlk_policy_loss_args */
  rlk_tensor token_normalizer_tensor;
  rlk_tensor seq_normalizer_tensor;
  /* Device scratch of rlk_linear_divergence_workspace_size() bytes, 16-byte aligned. */
  void *workspace;
  size_t workspace_bytes;
  rlk_linear_logprob_variant variant; /* AUTO: on sm_90a the wgmma kernels where tensor maps describe
                                       * both heads; TILED: the portable ones; WGMMA: as AUTO. The
                                       * backward runs the kernels AUTO would: top-k's set there is
                                       * the forward's to the bit after an AUTO forward (after a
                                       * TILED one on sm_90a, a column within rounding of the set's
                                       * boundary may count differently) */
  int splits;                  /* vocabulary splits of a GPU call (0: chosen; top-k: at most
                                * 2048 / top_k, the candidates a row's set is ranked from) */
  /* Shard form (FORWARD_KL, REVERSE_KL): when `partials` is given, the weights hold the rows
   * [vocab_start, vocab_start + V) of both heads, and the call writes this shard's records, f32
   * [N, RLK_LINEAR_DIVERGENCE_PARTIAL_FIELDS] contiguous and 16-byte aligned, instead of its
   * outputs (divergence, stats, entropy and the loss must then be absent). */
  rlk_tensor partials;
  int64_t vocab_start;
} rlk_linear_divergence_args;

/* Defaults: forward KL, both temperatures 1, beta 0.5 (used by JSD only), top_k 0, ignore_index
 * -100, token-mean, loss_scale 1, the normalizers 0 (this call's counts), variant auto, splits 0,
 * every tensor absent. */
RLK_API void rlk_linear_divergence_args_init(rlk_linear_divergence_args *args);

/* Bytes of workspace a call needs (the split records, top-k lists, the loss's workspace; on the
 * host backend a row's two heads' fp64 logits, 16 V bytes, and the loss's). Checks the arguments
 * like the call. */
RLK_API rlk_status rlk_linear_divergence_workspace_size(rlk_context *ctx,
                                                        const rlk_linear_divergence_args *args,
                                                        size_t *bytes);

/* The forward on `stream`: a GEMM launch over (row blocks, vocabulary splits) and a merge of the
 * splits (JSD: twice; top-k: then a launch a row for the set), then the loss's launches. */
RLK_API rlk_status rlk_linear_divergence(rlk_context *ctx, const rlk_linear_divergence_args *args,
                                         void *stream);

typedef struct rlk_linear_divergence_backward_args {
  /* As in the forward's arguments (the same tensors and settings). */
  rlk_tensor student_hidden;
  rlk_tensor student_weight;
  rlk_tensor teacher_hidden;
  rlk_tensor teacher_weight;
  float student_temperature;
  float teacher_temperature;
  rlk_divergence_mode mode;
  double beta;
  int top_k;
  rlk_tensor labels;
  int64_t ignore_index;
  rlk_tensor stats;            /* the forward's f32 [N, 6] (any row stride >= 6) */
  rlk_tensor grad_divergence;  /* f32 [N], any positive stride: the upstream gradient of D */
  /* Outputs, each optional (at least one): the student's [N, H_s] and [V, H_s], the teacher's
   * [N, H_t] and [V, H_t]; f32 or that head's dtype, rows contiguous, row stride >= H.
   * Overwritten, or added to when `accumulate` is 1. */
  rlk_tensor grad_student_hidden;
  rlk_tensor grad_student_weight;
  rlk_tensor grad_teacher_hidden;
  rlk_tensor grad_teacher_weight;
  int accumulate;
  void *workspace;             /* rlk_linear_divergence_backward_workspace_size() bytes */
  size_t workspace_bytes;
  int chunk;                   /* vocabulary columns a chunk, a multiple of 64 (sm_90a: rounded up
                                * to 256; 0: chosen with the workspace within 288 MiB) */
  /* Shard form: shard 1, the weights the rows [vocab_start, vocab_start + V) of both heads and
   * stats the combined ones (rlk_linear_divergence_combine): this shard's gradients (its part of
   * the hidden states' sums, its rows of the weights). No communication. */
  int shard;
  int64_t vocab_start;
} rlk_linear_divergence_backward_args;

/* Defaults as rlk_linear_divergence_args_init's, overwrite, chunk 0, every tensor absent. */
RLK_API void rlk_linear_divergence_backward_args_init(rlk_linear_divergence_backward_args *args);

/* Bytes of workspace the backward needs: on a GPU each chunk's dz (both sides' when a teacher
 * gradient is asked for; f32, or on sm_90a each head's 16-bit dtype) and, for a 16-bit
 * grad_hidden, its f32 sum (an f32 one is its own); on the host backend the fp64 sums of the
 * gradients asked for and N more (8 bytes each). */
RLK_API rlk_status rlk_linear_divergence_backward_workspace_size(rlk_context *ctx,
                                                                 const rlk_linear_divergence_backward_args *args,
                                                                 size_t *bytes);

/* The backward on `stream`: per vocabulary chunk, in order, a launch that recomputes both heads'
 * logits into dz, then the products into the gradients asked for; every output element written by
 * one thread (on sm_90a by one block, the grad_hidden sum's chunks added by TMA reduce-adds in
 * chunk order), no float atomics: bitwise repeatable. */
RLK_API rlk_status rlk_linear_divergence_backward(rlk_context *ctx,
                                                  const rlk_linear_divergence_backward_args *args,
                                                  void *stream);

/* Merges gathered shard records (rlk_linear_divergence's shard form) in rank order. */
typedef struct rlk_linear_divergence_combine_args {
  /* f32 [P, N, RLK_LINEAR_DIVERGENCE_PARTIAL_FIELDS] contiguous, 16-byte aligned, rank order */
  rlk_tensor partials;
  rlk_divergence_mode mode;    /* FORWARD_KL or REVERSE_KL */
  rlk_tensor labels;           /* optional, as in the forward */
  int64_t ignore_index;
  rlk_tensor divergence;       /* as in the forward: required */
  rlk_tensor stats;            /* required */
  rlk_tensor entropy;          /* optional */
} rlk_linear_divergence_combine_args;

/* Defaults: forward KL, ignore_index -100, every tensor absent. */
RLK_API void rlk_linear_divergence_combine_args_init(rlk_linear_divergence_combine_args *args);

/* One launch, a thread a row; every rank combining the same bytes gets the same bits. */
RLK_API rlk_status rlk_linear_divergence_combine(rlk_context *ctx, const rlk_linear_divergence_combine_args *args,
                                                 void *stream);

/* ------------------------------------------------------------------------ */
/* Ops: prefix-shared attention for GRPO groups                             */
/* ------------------------------------------------------------------------ */

/* The packed layout. A batch of P prompts, each stored once as [prefix | r_1 | ... | r_G] in one
 * token stream of T tokens, described by segments in token order: segment s covers tokens
 * [seq_offsets[s], seq_offsets[s + 1]), seq_offsets[0] = 0, seq_offsets[S] = T. Prompt p owns the
 * segments [group_offsets[p], group_offsets[p + 1]): the first is its prefix (length >= 0), the
 * others its G_p >= 0 responses (length >= 1 each); group_offsets[0] = 0, group_offsets[P] = S.
 * A prefix token attends causally within its prefix; a response token attends to its whole
 * prefix and causally within its own response, never to another response or prompt. This equals
 * causal attention over each [prefix; r_g] on its own, the prefix stored (and its K/V read) once.
 *
 * The layout is given twice: as i32 device tensors that the kernels read, and as host arrays with
 * the same values that the call validates (every error names the offending entry) and sizes its
 * grid from; the call never reads the device copies back. On the host backend the tensors may be
 * absent (the host arrays are used). */
typedef struct rlk_prefix_attention_layout {
  rlk_tensor seq_offsets;   /* i32 [S + 1], device memory, contiguous */
  rlk_tensor group_offsets; /* i32 [P + 1], device memory, contiguous */
  const int32_t *host_seq_offsets;   /* [num_segments + 1], host memory */
  const int32_t *host_group_offsets; /* [num_prompts + 1], host memory */
  int64_t num_segments; /* S = P + total responses */
  int64_t num_prompts;  /* P >= 1 */
} rlk_prefix_attention_layout;

/* The kernels of a call. Every field 0 (the default) lets the call choose: the tuning database's
 * winner for its shape (see "Tuning database"), else the guaranteed default. A choice the device
 * cannot honour falls back: wgmma needs CUDA sm_90a, mma sm_80+ (each falls back to the next one
 * down), and a ring depth whose stages do not fit in shared memory runs the default depth. The
 * depths apply to the sm_90a (wgmma) kernels only. */
typedef enum rlk_prefix_attention_variant {
  RLK_PREFIX_ATTENTION_VARIANT_AUTO = 0,     /* wgmma, else mma, else portable;
                                              * RLK_PREFIX_ATTENTION_VARIANT overrides */
  RLK_PREFIX_ATTENTION_VARIANT_PORTABLE = 1, /* a warp per row (every GPU) */
  RLK_PREFIX_ATTENTION_VARIANT_MMA = 2,      /* mma.sync tiles, CUDA sm_80+ */
  RLK_PREFIX_ATTENTION_VARIANT_WGMMA = 3     /* TMA + wgmma tiles, CUDA sm_90a */
} rlk_prefix_attention_variant;

typedef struct rlk_prefix_attention_tuning {
  rlk_prefix_attention_variant variant;
  int fwd_stages;  /* the forward's K/V ring: 2 to 4 stages (0: 2) */
  int dkdv_stages; /* the backward's dk/dv kernel's Q/dO ring: 2 to 4 (0: 4) */
  int dq_stages;   /* the backward's dq kernel's K/V ring: 2 to 4 (0: 3) */
} rlk_prefix_attention_tuning;

/* Forward: per query head h (key/value head h / (Hq / Hkv)) and query token i,
 *   o[i, h] = sum_j softmax_j(scale q[i, h] . k[j, h']) v[j, h'],  lse[i, h] = log sum_j exp(.)
 * over the keys j that i sees (natural log). */
typedef struct rlk_prefix_attention_args {
  /* q [T, Hq, D], k and v [T, Hkv, D]: bf16 or f16 (one dtype), contiguous, D 64 or 128, Hq a
   * multiple of Hkv. Never written. */
  rlk_tensor q;
  rlk_tensor k;
  rlk_tensor v;
  rlk_prefix_attention_layout layout;
  float scale; /* softmax scale, finite and > 0; 0 means 1 / sqrt(D) */
  /* Outputs: out [T, Hq, D] in q's dtype, contiguous; lse f32 [T, Hq], contiguous (optional in
   * the forward, what the backward needs). */
  rlk_tensor out;
  rlk_tensor lse;
  rlk_prefix_attention_tuning tuning; /* all 0: the call chooses */
} rlk_prefix_attention_args;

/* Fills `args`: scale 0 (1 / sqrt(D)), every tensor and array absent, tuning all 0. */
RLK_API void rlk_prefix_attention_args_init(rlk_prefix_attention_args *args);

/* Prefix-shared attention on `stream`: one launch, no device memory beyond the outputs; the
 * prefix K/V tiles of a prompt are read once per tile of stacked response queries (all the
 * group's response rows see the same prefix keys). fp32 accumulation on a GPU, fp64 on the host.
 * Deterministic: bitwise the same outputs for the same inputs on the same device.
 * Never synchronizes, never allocates device memory, capturable (see Conventions). */
RLK_API rlk_status rlk_prefix_attention(rlk_context *ctx, const rlk_prefix_attention_args *args,
                                        void *stream);

/* Backward of rlk_prefix_attention given grad_out = dL/d out: dq, dk, dv. A prefix key's dk and
 * dv sum the contributions of its own prefix queries and of every response of its group, in a
 * fixed order, without atomics: bitwise repeatable. */
typedef struct rlk_prefix_attention_backward_args {
  rlk_tensor q, k, v;  /* the forward's inputs */
  rlk_prefix_attention_layout layout;
  float scale;         /* the forward's scale (0: 1 / sqrt(D)) */
  rlk_tensor out;      /* the forward's out [T, Hq, D] */
  rlk_tensor lse;      /* the forward's lse, f32 [T, Hq]; required */
  rlk_tensor grad_out; /* [T, Hq, D] in q's dtype, contiguous */
  /* Outputs with q's, k's and v's shapes and dtype, contiguous, distinct from the inputs. */
  rlk_tensor grad_q;
  rlk_tensor grad_k;
  rlk_tensor grad_v;
  /* Scratch of at least rlk_prefix_attention_backward_workspace_size() bytes, 16-byte aligned
   * (device memory; host memory on the host backend, where it holds fp64 accumulators). */
  void *workspace;
  size_t workspace_bytes;
  rlk_prefix_attention_tuning tuning; /* all 0: the call chooses (the workspace size follows it) */
} rlk_prefix_attention_backward_args;

/* Fills `args` like rlk_prefix_attention_args_init. */
RLK_API void rlk_prefix_attention_backward_args_init(rlk_prefix_attention_backward_args *args);

/* Bytes of workspace rlk_prefix_attention_backward needs for these arguments (the same checks
 * as the call; data pointers are only tested for 16-byte alignment, which picks the kernels). On
 * a GPU: T x Hq x 4 (the rows' sum dO . O), plus with GQA (Hq > Hkv) on the sm_80 kernels
 * 8 x T x Hq x D for the f32 partial dk, dv of each query head, summed in head order (the sm_90a
 * kernels sum a group's heads in registers and need none); on the host, the fp64 gradient
 * accumulators. */
RLK_API rlk_status rlk_prefix_attention_backward_workspace_size(
    rlk_context *ctx, const rlk_prefix_attention_backward_args *args, size_t *bytes);

/* dq, dk, dv on `stream`: on a GPU three or four launches (the rows' dO . O; dk and dv with a
 * block per key tile and query head looping over every query that sees it, then with GQA the sum
 * over the group's heads; on sm_90a a block per key tile and key head loops over the group's
 * query heads itself; dq with a block per query tile), no atomics.
 * Never synchronizes, never allocates device memory, capturable (see Conventions). */
RLK_API rlk_status rlk_prefix_attention_backward(rlk_context *ctx,
                                                 const rlk_prefix_attention_backward_args *args,
                                                 void *stream);

/* ------------------------------------------------------------------------ */
/* Ops: sampling one token per row                                          */
/* ------------------------------------------------------------------------ */

/* Bits that rlk_sample ORs into the caller's status word. A row that raises one gets token -1. */
#define RLK_SAMPLE_STATUS_NAN 1       /* a NaN or +inf logit (logp and logp_filtered NaN) */
#define RLK_SAMPLE_STATUS_NO_TOKEN 2  /* every logit -inf (logp and logp_filtered -inf) */
#define RLK_SAMPLE_STATUS_BAD_PARAM 4 /* a per-row setting out of range (outputs NaN) */

/* Samples one token per row of logits [B, V] with z = logits / temperature in fp32, p = softmax(z).
 *
 * Filters, per row, each an upper set of logit values (ties at a threshold are kept together,
 * like vLLM's masked_fill of logits below the threshold):
 *   min_p > 0:  keep p_j >= min_p * p_max, computed as (x_j - x_max) log2(e) / T >= log2(min_p);
 *   top_k > 0:  keep x_j >= the k-th largest logit (k >= V keeps every token);
 *   top_p < 1:  over the renormalized distribution of what min-p and top-k kept, keep token j when
 *               the mass of the kept tokens with a strictly larger logit is below top_p (so the
 *               largest logit always stays) - vLLM's order: min-p, then top-k, then top-p. top_p
 *               is taken in steps of 2^-32, rounded down, at least one: below 2^-32 the largest
 *               logit and its ties alone.
 * The token is drawn from the kept tokens' renormalized probabilities. temperature 0 is greedy: the
 * argmax (the lowest index among equal maxima), filters ignored.
 *
 * Randomness: one Philox4x32-10 block per row, key = the row's seed, counter = (offset, row index
 * when the seed is the scalar shared by the batch, else 0). A per-row seed makes a row's draw a
 * function of its own seed, offset, logits and settings alone (not of B or its place in the batch);
 * advance the offset between decoding steps. Seeds and offsets may live in device memory, so a CUDA
 * graph can capture the call and replay it with new values. (On a GPU a row's split into 16-byte
 * vectors follows its address: a row moved to another 16-byte alignment can draw another token.
 * Rows keep their alignment wherever V times the logits' size is a multiple of 16 bytes, as for
 * 151936, 152064, 128256 or 32000 in bf16 and f32.)
 *
 * Exactness: probabilities are fixed-point masses 2^((x - x_max) / T log2 e) scaled by 2^40 (their
 * sums exact integers), and the draw picks the token whose mass interval holds umulhi(draw, total):
 * a token's probability is its mass over the kept total to within 2^-40 of the largest, up to the
 * fp32 rounding of the exponentials. No full sort of the vocabulary: see templates/cuda/sample.cuh.
 *
 * logp is the sampled token's log-prob under the temperature-scaled full distribution, bitwise
 * equal to what rlk_logprob returns on this context for the same logits row (the same memory, or
 * a copy at the same 16-byte alignment), temperature and label (its vector kernel, the default,
 * with block logprob_block and unroll logprob_unroll); greedy rows use temperature 1 there. logp_filtered is its log-prob under the kept, renormalized distribution
 * (logp where nothing is filtered out, 0 for greedy rows).
 *
 * Per-row settings out of range in device memory cannot be refused without synchronizing: those
 * rows get token -1 and RLK_SAMPLE_STATUS_BAD_PARAM. */
typedef struct rlk_sample_args {
  /* [B, V] f32, bf16 or f16; rows contiguous, row stride >= V; 1 <= V < 2^23. Never written. */
  rlk_tensor logits;
  /* Settings: the tensor, [B] contiguous, one value per row; absent, the scalar for every row. */
  rlk_tensor temperatures; /* f32 */
  float temperature;       /* finite, at least 2^-60, or 0: greedy */
  rlk_tensor top_ks;       /* i32 or i64 */
  int64_t top_k;           /* >= 0; 0 or >= V: off */
  rlk_tensor top_ps;       /* f32 */
  float top_p;             /* in (0, 1]; 1: off */
  rlk_tensor min_ps;       /* f32 */
  float min_p;             /* in [0, 1]; 0: off */
  rlk_tensor seeds;        /* i64 (read as unsigned bit patterns) */
  uint64_t seed;
  rlk_tensor offsets;      /* i64 (read as unsigned bit patterns) */
  uint64_t offset;
  /* Outputs, [B] contiguous: tokens i32 or i64 (required); logp and logp_filtered f32 (optional). */
  rlk_tensor tokens;
  rlk_tensor logp;
  rlk_tensor logp_filtered;
  /* Optional i32 [1] (device memory): RLK_SAMPLE_STATUS_* bits are OR-ed into it, never cleared. */
  rlk_tensor status;
  /* The rlk_logprob tuning (its block and unroll; 0: its defaults) whose rounding logp reproduces.
   * The sampler never reads the tuning database: where rlk_logprob's calls run a database winner
   * of the vector variant (rlk-tune --list), give its block and unroll here to keep the bits; a
   * bulk or tensor-map winner sums in another order, which no setting here reproduces. */
  int logprob_block;
  int logprob_unroll;
  /* Blocks that share each row: 0 or 1, one block a row; 2, 4 or 8, the blocks of a thread-block
   * cluster (more of the GPU for a small batch); RLK_SAMPLE_ROW_SPLIT_AUTO (what
   * rlk_sample_args_init sets), by the batch: as many as leave one block a multiprocessor, so one
   * block a row from about a row per multiprocessor up. It applies on CUDA sm_90 and later to
   * calls whose filters are all off (no top_ks, top_ps or min_ps tensor, top_k, top_p and min_p
   * off), at most one block per warp of the row layout; elsewhere a row takes one block. The
   * tokens and log-probs are the same, bit for bit, for every value. */
  int row_split;
  /* 1 (what rlk_sample_args_init sets): a programmatic dependent launch on CUDA sm_90 and later.
   * The kernel may start while the stream's previous kernel is finishing, and reads and writes
   * nothing before that kernel is done, so only the time changes; back-to-back calls overlap a
   * launch with the previous call's end. 0: a plain launch. Other devices ignore it. */
  int pdl;
  /* Optional output, f32 [B] contiguous: the smallest logit (as given: before the temperature) of
   * the row's kept set, which is every logit >= it (the filters keep upper sets, ties together):
   * -inf where no filter was on (a filter on that cut nothing gives the row's smallest logit,
   * which keeps the same set), the maximum for a greedy row, NaN for a row without a token. Kept-set replay: rlk_logprob's, rlk_linear_logprob's and rlk_linear_policy_loss's
   * `threshold` renormalize over the same set. */
  rlk_tensor threshold;
} rlk_sample_args;

/* rlk_sample_args.row_split: choose by the batch size. */
#define RLK_SAMPLE_ROW_SPLIT_AUTO (-1)

/* Fills `args` with vLLM's neutral defaults: temperature 1, top_k 0, top_p 1, min_p 0, seed and
 * offset 0, logprob tuning 0, row_split RLK_SAMPLE_ROW_SPLIT_AUTO, pdl 1, every tensor absent. */
RLK_API void rlk_sample_args_init(rlk_sample_args *args);

/* Samples a token per row on `stream`: one launch, no device memory allocated, no
 * synchronization. Deterministic: the same inputs, seeds and offsets give the same tokens and
 * log-probs on the same device, whatever the batch around a row with its own seed. Without
 * filters the logits are read once; filters add a pass or more over rows that use them.
 * Never synchronizes, never allocates device memory, capturable (see Conventions). */
RLK_API rlk_status rlk_sample(rlk_context *ctx, const rlk_sample_args *args, void *stream);

/* ------------------------------------------------------------------------ */
/* Precompiling                                                             */
/* ------------------------------------------------------------------------ */

/* Compiles (or finds in the cache) every kernel that an op configuration needs, without
 * running anything. `config` is one line: the op name followed by name=value pairs, e.g.
 *   "group_advantage mode=grpo group_size=16 scores=f32 unbiased=1 broadcast=1"
 * Unknown names or values are an RLK_ERR_INVALID_ARGUMENT naming them. A kernel compiled here
 * that could not be written to the context's cache is an RLK_ERR_CACHE (on a context with a
 * device it is loaded all the same); a context whose cache is memory only warms its own table.
 * Writes the number of kernels the configuration needs to *kernels (may be NULL). Works on
 * compile-only contexts. */
RLK_API rlk_status rlk_precompile(rlk_context *ctx, const char *config, int *kernels);

/* Writes the op names that rlk_precompile accepts, space-separated, e.g. "group_advantage". */
RLK_API const char *rlk_precompile_ops(void);

/* Describes the parameters an op configuration accepts, one "name: values (default)" per line. */
RLK_API const char *rlk_precompile_help(const char *op);

/* Writes the cache keys of the kernels an op configuration needs on `ctx` into buf: 64 hex
 * digits each, space-separated, in the order the op uses them. Nothing is compiled, loaded or
 * read from a cache, so it is cheap and works on every context. Two configurations with the
 * same keys run the same kernels (a tuning setting the target cannot honour falls back, and
 * then gives the default's keys). Writes the number of kernels to *kernels (may be NULL).
 * Errors as rlk_precompile's; RLK_ERR_INVALID_ARGUMENT when buf is too small (65 bytes per
 * kernel always suffice). */
RLK_API rlk_status rlk_precompile_keys(rlk_context *ctx, const char *config, char *buf, size_t size,
                                       int *kernels);

/* ------------------------------------------------------------------------ */
/* Tuning database (what tools/rlk-tune writes and the ops consult)          */
/* ------------------------------------------------------------------------ */

/* Ops with tuning candidates (logprob, prefix_attention, linear_logprob) take their tuning
 * settings from a database of measured winners when a call leaves every tuning field at 0 / AUTO (and
 * RLK_LOGPROB_VARIANT, RLK_PREFIX_ATTENTION_VARIANT are unset); without a record they run their
 * guaranteed default.
 *
 * A record is keyed by
 *   op        the op family: "logprob"
 *   shape     the settings that shape its kernels, spelled canonically with every default filled
 *             in: "pass=fwd logits=bf16 labels=i64 entropy=1 vocab=151936" (precompile syntax);
 *             prefix_attention's also holds the call's heads and its layout's means, the means
 *             bucketed like tokens: "pass=fwd dtype=bf16 head_dim=128 q_heads=32 kv_heads=8
 *             group=16 prefix=4096 response=512" (responses per prompt, prefix tokens per
 *             prompt, tokens per response)
 *   tokens    the token-count bucket: N rows fall into the power of two nearest N on a log scale,
 *             2^round(log2 N), so N in [2^(k - 1/2), 2^(k + 1/2)) shares 2^k
 *             (11586..23170 rows -> 16384)
 * and the environment it was measured in: target, GPU name, multiprocessor count, runtime
 * version (rlk_version_string()) and compiler ("nvrtc 13.0"). A call uses only records of its
 * own context's environment; the others are ignored with one note at info level.
 *
 * The file (RLK_TUNE_DB, default <cache root>/tune.db) is text: the line "# rlk-tune-db 1",
 * then one record per line of tab-separated name=value fields ('#' lines are comments). Writers
 * hold an advisory lock on "<db>.lock" while they read, merge and atomically replace the file
 * (a temporary file in the same directory, fsynced, renamed over it), so concurrent tuners never
 * lose each other's records; readers need no lock. A key on several lines (two files joined
 * with cat) is read from its last line; a writer keeps only that line's record, so a file it
 * wrote holds one record per key. A damaged file is ignored with one warning, bad lines are
 * skipped; nothing in it can make a call fail.
 *
 * RLK_TUNE, read when a context is created:
 *   off   calls never read the database
 *   use   (default) calls consult it; a context reads the file once, at its first tuned call,
 *         and later calls look it up in memory (no file access, no lock)
 *   tune  as use, and a call that finds no record appends its configuration, once, to the
 *         pending list "<db>.pending" (deduplicated), which `rlk-tune --pending` sweeps
 * No op call ever synchronizes, times or compiles anything for the database. */

#define RLK_TUNE_MAX_TIMINGS 32 /* candidates one record keeps */

/* What became of one candidate in a sweep. */
typedef enum rlk_tune_result {
  RLK_TUNE_TIMED = 0,    /* it ran, agreed with the default's outputs, and was timed */
  RLK_TUNE_REJECTED = 1, /* its outputs disagreed with the default's: never a winner */
  RLK_TUNE_FAILED = 2    /* it could not be compiled or run here: never a winner */
} rlk_tune_result;

typedef struct rlk_tune_timing {
  char settings[96];      /* the candidate's tuning settings: "variant=vec block=512 unroll=4" */
  rlk_tune_result result;
  double median_ms;       /* the median time when RLK_TUNE_TIMED, else 0 */
} rlk_tune_timing;

/* One configuration's measurement. The strings are NUL-terminated and hold no tab or newline. */
typedef struct rlk_tune_record {
  /* The key: a record replaces another only when every one of these is equal. */
  char op[32];
  char shape[256];
  int64_t tokens;         /* the bucket, a power of two */
  char target[32];        /* "sm_90a", "host-x86_64" */
  char device[128];       /* rlk_device_info.name: "NVIDIA H200" */
  int multiprocessors;    /* rlk_device_info.multiprocessors */
  char runtime[32];       /* rlk_version_string() of the library that measured it */
  char compiler[64];      /* rlk_device_info.compiler: "nvrtc 13.0" */
  /* The measurement. */
  char winner[96];        /* the fastest accepted candidate's settings; "": the default won */
  double default_ms;      /* the default's median */
  double best_ms;         /* the winner's median (default_ms when the default won) */
  int64_t created;        /* unix seconds */
  int ntimings;           /* entries of timings[] in use */
  rlk_tune_timing timings[RLK_TUNE_MAX_TIMINGS];
} rlk_tune_record;

/* Zeroes a record (every string empty, no timings). NULL is a no-op. */
RLK_API void rlk_tune_record_init(rlk_tune_record *record);

/* Sets the key's op, shape and tokens from a configuration line in rlk_precompile's syntax that
 * names one pass and the token count, e.g.
 *   "logprob pass=fwd logits=bf16 labels=i64 entropy=1 vocab=151936 tokens=16384"
 * Settings left out take the op's defaults; tokens is rounded to its bucket. An op without
 * tuning candidates, a missing tokens=, a line that names several passes (pass=both) or tuning
 * settings (variant=, block=, ...) is an RLK_ERR_INVALID_ARGUMENT naming the problem. */
RLK_API rlk_status rlk_tune_record_set_key(rlk_tune_record *record, const char *config);

/* Sets the key's environment from a context's device info (rlk_context_device_info): target,
 * device name, multiprocessors and compiler; runtime is this library's version. */
RLK_API rlk_status rlk_tune_record_set_env(rlk_tune_record *record, const rlk_device_info *info);

/* Writes the database path in effect into buf: RLK_TUNE_DB, else <rlk_cache_default_root>/tune.db. */
RLK_API rlk_status rlk_tune_db_path(char *buf, size_t size);

/* Merges `n` records into the database at `db` (NULL: rlk_tune_db_path): each replaces the
 * record of the same key (the key's last line, the one read; its earlier lines are dropped),
 * every other record is kept, and the keys recorded leave the pending list. Under the database's lock; the file and its directory are created as needed. Lines that
 * do not parse are dropped with a warning; a file of which no line can be read (not a tuning
 * database, or damaged throughout) is moved aside to "<db>.bad-<time>" with a warning. Records are
 * checked first: an empty key field, a tab or newline in a string, tokens < 1, multiprocessors
 * outside [0, 2^20], a negative created time, a negative, non-finite or below-1e-300 (non-zero)
 * time or ntimings outside [0, RLK_TUNE_MAX_TIMINGS] is an RLK_ERR_INVALID_ARGUMENT naming the
 * record and field, and nothing is written: every record written is one the reader takes back.
 * The lock is waited for at most RLK_LOCK_TIMEOUT_S seconds (as the kernel cache reads it: default
 * 600, fractions count), then RLK_ERR_TIMEOUT; a value of it that is not a non-negative number is
 * RLK_ERR_INVALID_ARGUMENT naming it, and nothing is written. */
RLK_API rlk_status rlk_tune_db_record(const char *db, const rlk_tune_record *records, size_t n);

/* Called once per record; return non-zero to stop the walk. */
typedef int (*rlk_tune_visit_fn)(const rlk_tune_record *record, void *user);

/* Visits every record of the database at `db` (NULL: rlk_tune_db_path), of every environment, in
 * file order. A missing file has no records. Lines that do not parse are skipped, and a file
 * that is not a tuning database is skipped whole, with one warning; *bad_lines (may be NULL)
 * gets the number of lines skipped. RLK_ERR_IO only when the file exists but cannot be read. */
RLK_API rlk_status rlk_tune_db_walk(const char *db, rlk_tune_visit_fn visit, void *user,
                                    size_t *bad_lines);

/* Merges the records of the database file `from` into `db` (NULL: rlk_tune_db_path) under db's
 * lock: for a key in both, the record created later wins (`from`'s on a tie), each file's record
 * of a key being its last line's, and db keeps one record per key; `from`'s keys leave
 * db's pending list. Writes the number of records taken from `from` to *taken (may be NULL).
 * RLK_ERR_IO when `from` is missing or is not a tuning database; the lock as rlk_tune_db_record. */
RLK_API rlk_status rlk_tune_db_merge(const char *db, const char *from, size_t *taken);

/* Visits the pending configurations of the database `db` (NULL: rlk_tune_db_path), i.e. the
 * lines of "<db>.pending": key fields only (the measurement fields are zero), like
 * rlk_tune_db_walk otherwise. */
RLK_API rlk_status rlk_tune_pending_walk(const char *db, rlk_tune_visit_fn visit, void *user,
                                         size_t *bad_lines);

/* What an op call on `ctx` would take from the database for a configuration line in
 * rlk_tune_record_set_key's syntax: *found is 1 when the context's in-memory database holds a
 * record of its environment (loading the file at the first use, as a call does), and its winner
 * ("" when the default won) is written into settings. Under RLK_TUNE=off *found is always 0, and
 * so it is where the environment keeps the op's calls off the database (a variable forcing a
 * variant, such as RLK_LOGPROB_VARIANT; RLK_INVARIANT=1 for rlk_logprob); under RLK_TUNE=tune a
 * miss joins the pending list, as a call's would. */
RLK_API rlk_status rlk_tune_lookup(rlk_context *ctx, const char *config, char *settings, size_t size,
                                   int *found);

/* The tuning candidates an op declares, one settings line each ("variant=vec block=256 unroll=4\n
 * ..."), appended to a configuration line by a sweep; "" for an op without candidates or an
 * unknown one. Valid on every target: a setting a target cannot honour falls back there. */
RLK_API const char *rlk_tune_candidates(const char *op);

/* The tuning settings that change the calls of a configuration line on ctx without changing its
 * kernels (linear_logprob's backward on sm_90a: "chunk group"), space-separated; "" when there
 * are none (the host backend ignores them all), ctx is NULL or the line does not parse. Two
 * candidates with the same kernels (rlk_precompile_keys) time alike only when they agree on
 * these. The string is static. */
RLK_API const char *rlk_tune_runtime_settings(rlk_context *ctx, const char *config);

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

/* Walks the committed entries of a cache tree (`root` NULL: the default writable root). A folder
 * or entry of the tree that cannot be read is an RLK_ERR_IO naming it, after the rest is walked. */
RLK_API rlk_status rlk_cache_walk(const char *root, rlk_cache_visit_fn visit, void *user);

/* Verifies every entry of a tree (metadata, key fields, binary checksum). Writes the number of
 * entries and of bad ones (an entry that cannot be read is bad); bad entries are quarantined when
 * `repair` is non-zero (only in a tree that is the cache's own: see rlk_cache_prune). A folder of
 * the tree that cannot be read is an RLK_ERR_IO naming it, after the rest is verified. */
RLK_API rlk_status rlk_cache_verify(const char *root, int repair, uint64_t *entries,
                                    uint64_t *bad);

/* Creates a cache tree at `root` (NULL: the default writable root) for a tool that writes
 * entries into it without a context, e.g. a merge of precompiled shards: the directory is made
 * (0700) when missing and, when empty, marked as the cache's own (CACHEDIR.TAG). A root that
 * already carries the marker is fine as it is. RLK_ERR_IO, naming why, for a root that cannot be
 * made, is not trusted (another user's, writable by others), or is not empty and unmarked. */
RLK_API rlk_status rlk_cache_create_root(const char *root);

/* Removes entries, oldest last-use first, until the tree is at most `max_bytes` (0: no size
 * limit), and every entry not used for `max_age_seconds` (0: no age limit). Writes the
 * number of entries and bytes removed (either may be NULL). Only a tree that is the cache's
 * own is touched: it carries the CACHEDIR.TAG marker the cache writes when it creates a root
 * (or first uses an empty one); names that merely look like the cache's are no proof. Any
 * other is RLK_ERR_INVALID_ARGUMENT and loses nothing. Only names the cache creates are
 * removed, and never through a link. RLK_ERR_IO when some entries could not be removed, or a
 * folder of the tree could not be read (what could be read is pruned first; the counts say what
 * was removed). */
RLK_API rlk_status rlk_cache_prune(const char *root, uint64_t max_bytes, int64_t max_age_seconds,
                                   uint64_t *removed_entries, uint64_t *removed_bytes);

/* Removes every entry, the staging area and the quarantine of a tree that is the cache's own
 * (as rlk_cache_prune); other files in it stay. */
RLK_API rlk_status rlk_cache_clear(const char *root);

/* The default writable cache root (RLK_CACHE_DIR, $XDG_CACHE_HOME/rlk, ~/.cache/rlk),
 * written into buf. */
RLK_API rlk_status rlk_cache_default_root(char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* RLK_H */

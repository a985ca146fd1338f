/* test_util.h - helpers shared by the suites: private cache roots, random data, GPU gating. */
#ifndef RLK_TEST_UTIL_H
#define RLK_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <check.h>

#include "rlk.h"

/* Check's ck_assert_msg (and every ck_assert_* built on it) records the line of each passing
 * assertion for crash reports: about 1 us a call, which made the element-by-element comparisons of
 * the GPU cases (hundreds of millions of them) take minutes. Here a passing assertion records
 * nothing; a failure reports as Check's does (file, line, expression, message). */
#undef ck_assert_msg
#define ck_assert_msg(expr, ...) \
  ((expr) ? (void)0 : _ck_assert_failed(__FILE__, __LINE__, "Assertion '" #expr "' failed", ##__VA_ARGS__))

/* Points RLK_CACHE_DIR and RLK_LOCK_DIR at a fresh temporary directory for the run. */
int rlk_test_setup_env(void);
void rlk_test_teardown_env(void);

/* The run's temporary directory. */
const char *rlk_test_tmpdir(void);

/* A new empty directory under the run's temporary directory, written into buf. */
void rlk_test_mkdtemp(char *buf, size_t size, const char *stem);

/* Removes a directory tree (best effort). */
void rlk_test_rmtree(const char *path);
/* rlk_test_rmtree for each path of a NULL-terminated list (ARGS(a, b) builds one). */
void rlk_test_rmtrees(const char *const *paths);

/* Non-zero when GPU cases should run (RLK_TEST_GPU=1: make test-gpu). When it returns 0 it
 * prints why the case is skipped. GPU cases live in test cases named "gpu", so
 * CK_RUN_CASE=gpu selects them alone. */
int rlk_test_gpu_enabled(const char *what);

/* A deterministic-per-call but fresh-per-run random generator (seeded from time and pid,
 * the seed printed on failure through rlk_test_seed()). */
uint64_t rlk_test_seed(void);
uint64_t rlk_test_rand_u64(uint64_t *state);
double rlk_test_rand_uniform(uint64_t *state);           /* [0, 1) */
double rlk_test_rand_normal(uint64_t *state);
/* Uniform on [-sqrt 3, sqrt 3]: mean 0, variance 1, a tenth of rlk_test_rand_normal's cost (for
 * tensors of hundreds of millions of elements). */
double rlk_test_rand_unit(uint64_t *s);
/* Seconds on a monotonic clock (phase timings in test output). */
double rlk_test_now(void);

/* Directory of the built tools (RLK_TEST_BIN_DIR). */
const char *rlk_test_bin_dir(void);

struct rlk_op_desc;

/* Compiles every sample configuration of `ops` for the host and sm_90a (or another set, as
 * RLK_TEST_TARGETS says: "all" or a comma list of host, sm_80, sm_90a, sm_100a, sm_120a, gfx90a, gfx1030), one child process
 * per target (each compiler serializes inside a process); a target whose compiler is missing is
 * skipped with a printed reason, the host never. Fails the test on any compile error. `label`
 * names the ops in messages. */
void rlk_test_compile_samples(const char *label, const struct rlk_op_desc *const *ops, size_t nops);

/* The case every op suite has: `label`'s ops (the rlk_op_desc pointers that follow) compile every
 * sample configuration for every target whose compiler is here (rlk_test_compile_samples says
 * which: make test and make test-targets share the case). */
#define RLK_SAMPLES_CASE(label, ...)                                                  \
  START_TEST(samples_compile_every_target) {                                          \
    static const struct rlk_op_desc *const samples_ops_[] = {__VA_ARGS__};            \
    rlk_test_compile_samples(label, samples_ops_, sizeof samples_ops_ / sizeof samples_ops_[0]); \
  }                                                                                   \
  END_TEST

/* A host context whose process records its configurations (RLK_JIT_RECORD, for the rest of this
 * test's process) to a fresh file under the scratch root. NULL (after printing why) when the test
 * shares its process with others (CK_FORK=no), since a process reads RLK_JIT_RECORD once. */
rlk_context *rlk_test_recording_host_context(void);

/* The record rlk_test_recording_host_context started has a line starting with each of `prefixes`
 * (NULL-terminated), and every line it holds precompiles on ctx. */
void rlk_test_record_expect(rlk_context *ctx, const char *const *prefixes);

struct rlk_op_config_pair;

/* Splits a configuration line "op a=b c=d" into its settings, pointing into `copy` (`size` bytes);
 * returns their number (at most 16). */
size_t rlk_test_split_line(const char *line, char *copy, size_t size, struct rlk_op_config_pair *pairs);

struct rlk_kernel_spec;

/* Plans the configuration line `line` of `op` on ctx: its kernels into specs (room for
 * RLK_OP_MAX_KERNELS), their number into *n; returns rlk_op_plan's status. */
rlk_status rlk_test_plan_line(const struct rlk_op_desc *op, const rlk_context *ctx, const char *line,
                              struct rlk_kernel_spec *specs, size_t *n);

/* Kernels a context has compiled so far (its compiles counter). */
uint64_t rlk_test_compiles(rlk_context *ctx);

/* A compile-only host context (checks arguments and compiles, never launches); fails the test
 * on error. */
rlk_context *rlk_test_compile_only_host_context(void);
/* A compile-only context of `backend` for `target` (NULL: the host's; plans and compiles without
 * a GPU), or NULL after printing why `what` is skipped (no such compiler here). */
rlk_context *rlk_test_compile_only_context(rlk_backend backend, const char *target, const char *what);
/* rlk_test_compile_only_context for CUDA's `target`. */
rlk_context *rlk_test_compile_only_cuda_context(const char *target, const char *what);

/* Stores v at element i of a buffer of dtype d (f64, f32, bf16 or f16, rounded to nearest even,
 * NaN stays NaN; i32 and i64 truncated; bool: v != 0) and returns the value as stored. */
double rlk_test_store(void *base, rlk_dtype d, int64_t i, double v);
/* Element i of a buffer of dtype d (those rlk_test_store writes) as a double. */
double rlk_test_load(const void *base, rlk_dtype d, int64_t i);
/* Every byte of element i of a buffer of dtype d is still 0xff (the poison written before a call
 * that must overwrite it). */
int rlk_test_is_poison(const void *base, rlk_dtype d, int64_t i);
/* Elements [0, n) of a buffer of dtype d are all still poison: what a refused call leaves alone
 * (`what` names the buffer, `label` the case, in the failure message). */
void rlk_test_expect_untouched(const void *base, rlk_dtype d, int64_t n, const char *what, const char *label);

/* The workspace a call asked for: its workspace_size query's status (size_status, which must be
 * RLK_OK) and *bytes; that many bytes of ctx's memory (rlk_test_dev_alloc; NULL for 0) into *ws,
 * the count into *ws_bytes. Free *ws with rlk_free. */
void rlk_test_workspace(rlk_context *ctx, rlk_status size_status, const size_t *bytes, void **ws, size_t *ws_bytes);

/* Device memory of a context for a test (at least 16 bytes, so that a 0-byte request still gets a
 * distinct, aligned pointer), every byte 0xff (NaN in a float, -1 in an integer: an output left
 * unwritten never shows an earlier buffer's values); fails the test on error. */
void *rlk_test_dev_alloc(rlk_context *ctx, size_t bytes);

/* rlk_test_dev_alloc, then a copy of `bytes` from the host. */
void *rlk_test_dev_upload(rlk_context *ctx, const void *src, size_t bytes);

/* A copy of `bytes` of src in ctx's memory: malloc'd for a host context (whose calls read host
 * memory), rlk_test_dev_upload's on a device; free it with rlk_test_drop. */
void *rlk_test_put(rlk_context *ctx, const void *src, size_t bytes);
/* `bytes` of 0xff (NaN in every float) in ctx's memory, as rlk_test_put: what a call must
 * overwrite. */
void *rlk_test_poisoned(rlk_context *ctx, size_t bytes);
/* Copies `bytes` at src in ctx's memory to dst on the host; fails the test on error. */
void rlk_test_get(rlk_context *ctx, void *dst, const void *src, size_t bytes);
/* Frees what rlk_test_put or rlk_test_poisoned returned. */
void rlk_test_drop(rlk_context *ctx, void *p);

/* The n int64 values of offs in device memory as dtype d (RLK_I32 or RLK_I64): group or sequence
 * offsets for the ops that take either. */
void *rlk_test_upload_offsets(rlk_context *ctx, rlk_dtype d, const int64_t *offs, int64_t n);

/* Random group sizes in [1, max] (some singletons) summing to B, into sizes; returns how many. */
int64_t rlk_test_random_group_sizes(uint64_t *rng, int64_t B, int64_t max, int64_t *sizes);

/* Row i of `block`, rows of n values of the 4-byte dtype d (RLK_F32, RLK_I32) back to back, as an
 * [n] tensor: several outputs of a call in one buffer, read back in one copy. */
rlk_tensor rlk_test_block_row(void *block, rlk_dtype d, int64_t i, int64_t n);

/* A dense [a, b, c] tensor descriptor (the 3-D sibling of rlk_tensor_2d). */
rlk_tensor rlk_test_tensor_3d(void *data, rlk_dtype dt, int64_t a, int64_t b, int64_t c);

/* A [B, T] tensor of dtype d with rows S apart, filled with `fill` (padding included), uploaded
 * with dense[b * T + t] at its place; dense is then replaced by what the dtype stored. */
void *rlk_test_upload_rows(rlk_context *ctx, rlk_dtype d, int64_t B, int64_t T, int64_t S, double fill,
                           double *dense);

/* A CUDA context for a GPU case. Without RLK_TEST_GPU=1 it prints why the case is skipped and
 * returns NULL; with it, a context that cannot be created fails the test. */
rlk_context *rlk_test_cuda_context(const char *what);

/* A context of `backend` over the cache at cache_dir (NULL: the run's); fails the test on error. */
rlk_context *rlk_test_context_at(rlk_backend backend, const char *cache_dir);

/* A host-backend context over the cache at cache_dir (NULL: the run's) for a forked child, where
 * Check's assertions cannot be used: NULL on failure. */
rlk_context *rlk_test_child_host_context(const char *cache_dir);

/* A host-backend context with the run's cache; fails the test on error. */
rlk_context *rlk_test_host_context(void);

/* Check tests (check.h included first) that run a file's case set `cases_<name>(ctx, &rng)` with
 * a fresh seed: host_<name> on a host context; gpu_<name> on CUDA when RLK_TEST_GPU=1, skipped
 * with the reason otherwise (`suite` names it). */
#define RLK_HOST_CASE(name) RLK_HOST_TEST(name, cases_##name(ctx, &rng))
#define RLK_GPU_CASE(suite, name) RLK_GPU_TEST(suite, name, cases_##name(ctx, &rng))

/* The Check test `test`: `body` (statements that see `ctx` and a freshly seeded `rng`) on the
 * context `make_ctx` gives; none (NULL, after saying why) skips it. */
#define RLK_CONTEXT_TEST(test, make_ctx, body)           \
  START_TEST(test) {                                     \
    rlk_context *ctx = (make_ctx);                       \
    if (!ctx) return;                                    \
    uint64_t rng = rlk_test_seed() ^ (__LINE__ * 7919u); \
    (void)rng; /* not every body draws */                \
    body;                                                \
    rlk_context_destroy(ctx);                            \
  }                                                      \
  END_TEST
/* host_<name> on a host context; gpu_<name> on CUDA (rlk_test_cuda_context's: skipped with the
 * reason without RLK_TEST_GPU=1). */
#define RLK_HOST_TEST(name, body) RLK_CONTEXT_TEST(host_##name, rlk_test_host_context(), body)
#define RLK_GPU_TEST(suite, name, body) RLK_CONTEXT_TEST(gpu_##name, rlk_test_cuda_context(suite), body)

/* A host-backend context over a fresh empty cache (to count what a precompile compiles). */
rlk_context *rlk_test_fresh_host_context(void);

/* A fresh host-backend context that has precompiled `line`: `kernels` kernels, each compiled. */
rlk_context *rlk_test_precompiled_host_context(const char *line, int kernels);

/* Fails when ctx compiled more than `before` kernels in all (what: the calls that should have
 * found every kernel their precompiled line built; a context from
 * rlk_test_precompiled_host_context has compiled exactly that line's kernels), then destroys ctx. */
void rlk_test_expect_compiled_none(rlk_context *ctx, uint64_t before, const char *what);

/* fork() with stdio flushed first (a child never repeats the parent's buffered output); fails
 * the test when fork fails. */
pid_t rlk_test_fork(void);

/* Forks n children held at a gate, opens it so that they all start at once, and waits for each:
 * every one must exit 0 (child i exits with run(i, arg)); `what` names a child in the failure. */
void rlk_test_race_children(int n, int (*run)(int i, const void *arg), const void *arg, const char *what);

/* An op's call on ctx returned st: fails with `what`, the status and rlk_last_error() unless it
 * is RLK_OK, then waits for ctx's stream. */
void rlk_test_expect_call_done(rlk_context *ctx, rlk_status st, const char *what);

/* A call returned `want` (st) and rlk_last_error() names `arg`; `label` names the case in the
 * failure messages. */
void rlk_test_expect_error(rlk_status st, rlk_status want, const char *arg, const char *label);

/* Each bad[i][0] precompile line is refused with an error that names bad[i][1]. */
void rlk_test_expect_bad_lines(const char *const (*bad)[2], size_t n);

/* Adds to s a test case `name` running `tests` (NULL-terminated, TESTS() builds the list) in
 * order, with a timeout of `timeout` seconds (0: Check's default); returns it. */
TCase *rlk_test_add_case(Suite *s, const char *name, double timeout, const TTest *const *tests);
#define TESTS(...) ((const TTest *const[]){__VA_ARGS__, NULL})

/* ---- running the built tools ---------------------------------------------------------- */

typedef struct rlk_test_tool_run {
  int status; /* exit status, or 128 + signal */
  char *out;  /* stdout and stderr together */
} rlk_test_tool_run;

/* Runs bin_dir/tool with argv (NULL-terminated) and the environment changes in `env`
 * ("NAME=value" sets, "!NAME" unsets; NULL-terminated, may be NULL). Every run starts
 * without RLK_CACHE_RO_DIRS, RLK_JIT, RLK_CACHE_MODE, RLK_CACHE_MAX_BYTES and RLK_TUNE unless
 * `env` sets them. Fails the test when the tool is not built. */
rlk_test_tool_run rlk_test_run_tool(const char *const *env, const char *tool, const char *const *args);
/* rlk_test_run_tool with the tool's standard output opened on `stdout_path` (/dev/full: every
 * write fails); out then holds its stderr alone. */
rlk_test_tool_run rlk_test_run_tool_to(const char *stdout_path, const char *const *env, const char *tool,
                                       const char *const *args);
void rlk_test_tool_free(rlk_test_tool_run *r);

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define ENV(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Fails the test with the tool's output when the exit status is not `want`. */
#define expect_status(r, want, what)                                                          \
  ck_assert_msg((r).status == (want), "%s: exit status %d, expected %d; output:\n%s", (what), \
                (r).status, (want), (r).out)

/* The number of lines of `out` that contain `needle`. */
int rlk_test_count_lines(const char *out, const char *needle);

/* A needle and the number of lines of a tool's output that must contain it. */
typedef struct rlk_test_line_count {
  const char *needle;
  int lines;
} rlk_test_line_count;

/* Each of the n `counts` holds for out (rlk_test_count_lines); a failure names the needle, both
 * counts and `what`, and shows out. */
void rlk_test_expect_line_counts(const char *out, const rlk_test_line_count *counts, size_t n, const char *what);

/* The integer after the last occurrence of `name` ("compiles=") in out, or -1. */
long rlk_test_last_value(const char *out, const char *name);

#endif

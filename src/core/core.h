/* core.h - what every layer of the runtime shares: error reporting, logging,
 * environment access, clocks. Internal; not installed. */
#ifndef RLK_CORE_H
#define RLK_CORE_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "rlk.h"

#if defined(__GNUC__)
#define RLK_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define RLK_PRINTF(a, b)
#endif

/* Sets this thread's last-error message and returns `status`. Use as
 *   return rlk_error(RLK_ERR_INVALID_ARGUMENT, "scores: expected f32, got %s", ...); */
rlk_status rlk_error(rlk_status status, const char *fmt, ...) RLK_PRINTF(2, 3);

/* Prefixes this thread's last-error message with `fmt` (": " joins them) and returns
 * `status`; for adding context on the way up. */
rlk_status rlk_error_wrap(rlk_status status, const char *fmt, ...) RLK_PRINTF(2, 3);

/* Clears this thread's last-error message. */
void rlk_error_clear(void);

/* Logging to stderr, filtered by the process log level (RLK_LOG, or a context's option:
 * the most verbose wins). */
void rlk_log(rlk_log_level level, const char *fmt, ...) RLK_PRINTF(2, 3);
void rlk_log_set_level(rlk_log_level level);
rlk_log_level rlk_log_get_level(void);
#define rlk_warn(...) rlk_log(RLK_LOG_WARN, __VA_ARGS__)
#define rlk_info(...) rlk_log(RLK_LOG_INFO, __VA_ARGS__)
#define rlk_debug(...) rlk_log(RLK_LOG_DEBUG, __VA_ARGS__)

/* Environment variables the runtime reads. Every RLK_ variable goes through these so the
 * README's table can be checked against one list (util.c). */
const char *rlk_env(const char *name);             /* NULL if unset or empty */
/* RLK_LOCK_TIMEOUT_S, the most seconds a lock wait takes (a compile's per-key lock, a tuning
 * database writer's): RLK_DEFAULT_LOCK_TIMEOUT_S when unset; fractions count (1.5). A value that
 * is not a finite non-negative number is RLK_ERR_INVALID_ARGUMENT naming it. The kernel cache and
 * the tuning database read it only through this. */
#define RLK_DEFAULT_LOCK_TIMEOUT_S 600.0
rlk_status rlk_env_lock_timeout(double *seconds);
/* The index in `names` (NULL-terminated) of `name`'s value, read once per process into *cache
 * (-1: not read yet): `def` when it is unset, and (with a warning that lists the names) when it
 * is none of them. */
int rlk_env_choice(atomic_int *cache, const char *name, const char *const *names, int def);

/* Monotonic seconds. */
double rlk_now(void);

/* Wall-clock unix seconds. */
int64_t rlk_unix_time(void);

/* snprintf that always terminates and reports truncation as -1. */
int rlk_format(char *buf, size_t size, const char *fmt, ...) RLK_PRINTF(3, 4);

/* strdup that returns NULL on allocation failure. */
char *rlk_strdup(const char *s);

/* A tensor argument's structure (what every check of an op starts from): NULL data is RLK_OK
 * unless `required`; else ndim in [1, RLK_MAX_DIMS], a known dtype, shapes in [1, 2^40],
 * strides >= 0 (0: a broadcast view), data aligned to its dtype and a span that can be
 * addressed. RLK_ERR_INVALID_ARGUMENT with "<what>: <problem>" otherwise. */
rlk_status rlk_check_tensor(const rlk_tensor *t, const char *what, int required);

/* The largest byte span rlk_check_tensor accepts: far beyond any device's memory, small enough
 * that every signed 64-bit offset a kernel forms inside a tensor (row * stride + column, times
 * the element size) stays exact. */
#define RLK_TENSOR_MAX_BYTES_LOG2 56
#define RLK_TENSOR_MAX_BYTES ((uint64_t)1 << RLK_TENSOR_MAX_BYTES_LOG2)

/* Bytes from t->data to one past its last element (1 + sum (shape - 1) * stride elements);
 * 0, or -1 when a shape or stride is negative or the span overflows 64 bits. */
int rlk_tensor_span_bytes(const rlk_tensor *t, uint64_t *bytes);

#endif

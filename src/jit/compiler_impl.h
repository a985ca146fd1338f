/* compiler_impl.h - helpers the three compiler implementations share (nvrtc.c, hiprtc.c,
 * hostcc.c; NVRTC and hiprtc share more in rtc.h): the open's allocation, a compile's start and
 * request checks, target lists, result building and compile-error messages. Internal to src/jit;
 * the JIT itself only sees compiler.h. */
#ifndef RLK_COMPILER_IMPL_H
#define RLK_COMPILER_IMPL_H

#include <stddef.h>

#include "jit/compiler.h"
#include "rlk.h"

/* The most log text a compile-error message carries; the rest is summarized by its size
 * (the log's head holds the first error, which is the one that matters). */
#define RLK_COMPILE_LOG_EXCERPT 3000

/* Non-zero when `target` is one of the space-separated words of `list`. */
int rlk_target_list_has(const char *list, const char *target);

/* Checks the parts of a request every compiler needs (source, target, arrays present for
 * their counts, a target the compiler supports). RLK_ERR_INVALID_ARGUMENT or
 * RLK_ERR_UNSUPPORTED naming what is wrong. */
rlk_status rlk_compile_request_check(const rlk_compiler *compiler, const rlk_compile_request *req);

/* A compiler's open: *out (NULL: "<who>: NULL output") set to NULL, then a zeroed compiler with a
 * zeroed impl of impl_size bytes in *made (RLK_ERR_OUT_OF_MEMORY saying `oom` when either fails). */
rlk_status rlk_compiler_new(const char *who, const char *oom, size_t impl_size, rlk_compiler **out,
                            rlk_compiler **made);

/* The start of every compile: a result to fill (NULL: "<who>: NULL result"), zeroed here, and a
 * request the compiler takes (rlk_compile_request_check). */
rlk_status rlk_compile_begin(const rlk_compiler *compiler, const char *who, const rlk_compile_request *req,
                             rlk_compile_result *out);

/* Sets RLK_ERR_COMPILE with "<kind>: <source> for <target>: <detail>" followed by an excerpt
 * of `log` (either may be NULL or empty) and returns it. */
rlk_status rlk_compile_error(const rlk_compiler *compiler, const rlk_compile_request *req,
                             const char *detail, const char *log);

/* Copies `n` strings into a new malloc'd array of malloc'd strings; NULL on allocation
 * failure (nothing leaks). */
char **rlk_string_list_copy(const char *const *strings, size_t n);

/* Frees a list from rlk_string_list_copy (or one built the same way); NULL is a no-op. */
void rlk_string_list_free(char **strings, size_t n);

/* Removes trailing white space from a malloc'd log in place and returns it. */
char *rlk_log_trim(char *log);

#endif

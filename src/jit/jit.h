/* jit.h - from a kernel spec to a launchable function:
 *   spec -> in-process table -> read-only trees -> writable tree -> compile -> publish -> load
 * Ops call rlk_jit_get; the table's hit path takes no lock and makes no syscall. */
#ifndef RLK_JIT_H
#define RLK_JIT_H

#include "backend/backend.h"
#include "jit/cache.h"
#include "jit/compiler.h"
#include "jit/key.h"
#include "jit/template.h"
#include "rlk.h"

typedef struct rlk_jit rlk_jit;

/* `backend` may be NULL (compile-only: kernels are compiled and published, never loaded).
 * The JIT keeps a copy of the typed target: its features decide which templates it builds, its
 * name (rlk_target_name) goes into every key, and the compiler gets it as it is. `templates` is
 * the folder of templates/ the compiler reads ("cuda" for NVRTC and hiprtc, "host" for clang: a
 * static string). The JIT borrows backend, compiler and cache; the caller keeps them alive
 * longer. */
rlk_status rlk_jit_create(rlk_backend_impl *backend, rlk_compiler *compiler, rlk_cache *cache,
                          const rlk_target *target, const char *templates, rlk_jit **out);
void rlk_jit_destroy(rlk_jit *jit);

/* The launchable function for a spec (compiling, publishing and loading on a miss). */
rlk_status rlk_jit_get(rlk_jit *jit, const rlk_kernel_spec *spec, void **fn);

/* rlk_jit_get, and RLK_ERR_CACHE (the kernel loaded all the same) where a binary it compiled
 * could not be published to the cache. Used by precompile with a device. */
rlk_status rlk_jit_get_published(rlk_jit *jit, const rlk_kernel_spec *spec, void **fn);

/* Makes sure the spec's binary is in a cache (compiling and publishing on a miss) without
 * loading it: RLK_ERR_CACHE where it could not be published. Used by precompile; works without a
 * backend. */
rlk_status rlk_jit_prepare(rlk_jit *jit, const rlk_kernel_spec *spec);

/* Builds the full key of a spec for this JIT's compiler and target. */
rlk_status rlk_jit_key(rlk_jit *jit, const rlk_kernel_spec *spec, rlk_kernel_key *key);

void rlk_jit_counters(const rlk_jit *jit, rlk_counters *out);
void rlk_jit_reset_counters(rlk_jit *jit);

#endif

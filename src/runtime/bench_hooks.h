/* bench_hooks.h - the one internal header benchmarks may include besides rlk.h: measurements
 * of the runtime's own paths that no public call isolates. Not installed; tools/ otherwise use
 * only include/rlk.h (a CI check enforces it). */
#ifndef RLK_BENCH_HOOKS_H
#define RLK_BENCH_HOOKS_H

#include "rlk.h"

/* Plans `config` on ctx once, then looks its first kernel up `reps` times through the JIT's
 * in-process path (key build + table lookup: what every op call does before launching),
 * compiling or loading it first if needed. *seconds (if not NULL) receives the wall time of
 * the lookups alone. */
rlk_status rlk_bench_jit_lookups(rlk_context *ctx, const char *config, int reps, double *seconds);

#endif

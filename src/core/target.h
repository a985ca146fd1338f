/* target.h - what a compile target is, typed: made once (by the backend from its device, or by
 * rlk_target_parse for a compile-only context) and read by the compilers, the keys and the ops,
 * so no layer re-parses "sm_90a" or guesses a warp size. Internal; not installed. */
#ifndef RLK_TARGET_H
#define RLK_TARGET_H

#include <stddef.h>

#include "rlk.h"

/* rlk_target.features */
#define RLK_TARGET_CLUSTERS 1u /* thread block clusters, distributed shared memory (sm_90+) */
#define RLK_TARGET_PDL 2u      /* programmatic dependent launch, griddepcontrol (sm_90+) */
#define RLK_TARGET_TMA 4u      /* cp.async.bulk(.tensor), mbarrier tx counts (sm_90+) */
#define RLK_TARGET_WGMMA 8u    /* warpgroup MMA (sm_90a only) */

typedef struct rlk_target {
  rlk_backend kind;      /* RLK_BACKEND_CUDA, _HIP or _HOST */
  char name[32];         /* the canonical spelling, as keys hold it: "sm_90a", "gfx90a", "host-x86_64" */
  int major, minor;      /* CUDA compute capability; gfx major and minor digit (gfx90a: 9, 0); 0 on the host */
  int arch_specific;     /* CUDA "a" targets: code that runs only on this exact major.minor */
  unsigned features;     /* RLK_TARGET_* */
  int warp_size;         /* lanes the templates' warp has: 32 on CUDA, 64 on AMD (-mwavefrontsize64),
                          * 32 on the host (its kernels lay rows out like CUDA's, for equal rounding) */
  size_t smem_per_block; /* the most dynamic shared memory a block may opt in to */
  size_t smem_per_sm;    /* shared memory of one multiprocessor */
  int multiprocessors;   /* SMs, CUs or CPU cores; 0 where unknown (compile-only) */
} rlk_target;

/* Parses a target name into *out with the arch's documented limits (multiprocessors 0).
 * Accepts sm_<cc>[a], compute_<cc>, gfx<id>[:features] (features dropped) and host-<machine>;
 * RLK_ERR_INVALID_ARGUMENT naming the text otherwise. */
rlk_status rlk_target_parse(const char *text, rlk_target *out);

/* The target of a CUDA device of compute capability major.minor ("sm_90a" for 9.0, see the
 * arch table in target.c), with the device's own multiprocessor count and shared memory limits
 * (0: the arch's documented ones). */
void rlk_target_for_cuda_device(int major, int minor, int multiprocessors, size_t smem_per_block,
                                size_t smem_per_sm, rlk_target *out);

/* Does sm_<sm> (compute capability x 10) have an arch-specific "a" variant? For a compiler's
 * target list; from the same table as rlk_target_for_cuda_device. */
int rlk_target_cuda_has_arch_specific(int sm);

/* The compute capability x 10 of a CUDA target (sm_90a -> 90), 0 for other backends. */
int rlk_target_cuda_sm(const rlk_target *t);

/* Applies the RLK_ARCH override to a device's target of backend `kind`: the one place that
 * variable is read. A value naming another backend's target is ignored with a warning; the
 * device's multiprocessors and shared memory are kept. */
rlk_status rlk_target_apply_env(rlk_backend kind, rlk_target *t);

/* The host's target name, "host-<machine>" from uname: "host-x86_64". */
const char *rlk_host_target(void);

/* RLK_ARCH, for a compile-only context given no target (NULL if unset). */
const char *rlk_target_env(void);

#endif

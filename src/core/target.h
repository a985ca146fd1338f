/* target.h - what a compile target is, typed: made once (by the backend from its device, or by
 * rlk_target_parse for a compile-only context or RLK_ARCH) and carried as it is through the
 * context, the JIT and the compilers to the ops, so no layer re-parses "sm_90a" or guesses a warp
 * size. Its name is derived from the typed fields by one function (rlk_target_name), and that
 * name is what keys, cache paths and a compiler's architecture option hold. The one table of
 * target names (which spellings mean which backend and arch) is target.c's. Internal; not
 * installed. */
#ifndef RLK_TARGET_H
#define RLK_TARGET_H

#include <stddef.h>

#include "rlk.h"

/* rlk_target.features: what the code of a target may use. Ops and the JIT test these bits, never
 * an arch number: a newer arch is not a superset (datacenter Blackwell has no wgmma, consumer
 * Blackwell neither wgmma nor tcgen05). */
#define RLK_TARGET_CLUSTERS 1u /* thread block clusters, distributed shared memory (sm_90+) */
#define RLK_TARGET_PDL 2u      /* programmatic dependent launch, griddepcontrol (sm_90+) */
#define RLK_TARGET_TMA 4u      /* cp.async.bulk(.tensor), mbarrier tx counts (sm_90+) */
#define RLK_TARGET_WGMMA 8u    /* warpgroup MMA, setmaxnreg: sm_90a only (Hopper) */
#define RLK_TARGET_TCGEN05 16u /* 5th-generation tensor cores and tensor memory: sm_100a, sm_103a,
                                * sm_110a and their "f" family forms (datacenter Blackwell) */

enum { RLK_TARGET_CLUSTER_SIZES = 4 }; /* clusters of 1, 2, 4 and 8 blocks */

typedef struct rlk_target {
  rlk_backend kind;      /* RLK_BACKEND_CUDA, _HIP or _HOST */
  char name[32];         /* rlk_target_name of the fields below: "sm_90a", "compute_90", "gfx90a",
                          * "host-x86_64" (set by the functions that make a target, never by hand) */
  int major, minor;      /* CUDA compute capability; gfx major and minor digit (gfx90a: 9, 0); 0 on the host */
  int stepping;          /* gfx: the last digit, hexadecimal (gfx90a: 10); 0 elsewhere */
  char variant;          /* CUDA: 0, 'a' (arch-specific: runs only on this exact major.minor) or 'f'
                          * (family-specific: runs on this major's family, this minor and up) */
  int ptx;               /* CUDA compute_<cc>: PTX the driver compiles when it loads it, on any device
                          * of this compute capability or newer; 0: SASS (a cubin) for sm_<cc> */
  char machine[24];      /* host: the CPU architecture from uname ("x86_64") */
  unsigned features;     /* RLK_TARGET_* */
  int warp_size;         /* lanes the templates' warp has: 32 on CUDA, 64 on AMD (-mwavefrontsize64),
                          * 32 on the host (its kernels lay rows out like CUDA's, for equal rounding) */
  size_t smem_per_block; /* the most dynamic shared memory a block may opt in to */
  size_t smem_per_sm;    /* shared memory of one multiprocessor */
  int multiprocessors;   /* SMs, CUs or CPU cores; 0 where unknown (compile-only) */
  int cluster_sms[RLK_TARGET_CLUSTER_SIZES]; /* CUDA sm_90+ devices: [i] the SMs that clusters of
                          * 2^i blocks, one block a multiprocessor, keep busy at once (the GPCs'
                          * shapes decide); [0] and unknown ones 0 */
} rlk_target;

/* Parses a target name into *out with the arch's documented limits (multiprocessors 0). The
 * spellings: sm_<cc>[a|f] and compute_<cc>[a|f] (CUDA SASS or PTX; <cc> the compute capability x
 * 10 without a leading zero; "a" and "f" only where the arch has that form), gfx<id> with
 * optional :sramecc+/- and :xnack+/- features (accepted and dropped: the code is the same),
 * host-<machine>, and "host" (this machine's). out->name is the canonical spelling (the features
 * dropped, "host" spelled out). RLK_ERR_INVALID_ARGUMENT naming the text otherwise. */
rlk_status rlk_target_parse(const char *text, rlk_target *out);

/* The canonical spelling of a target from its typed fields (kind, major, minor, stepping,
 * variant, ptx, machine) into buf: the one place a target's name is made. -1 if it does not fit. */
int rlk_target_name(const rlk_target *t, char *buf, size_t size);

/* The target of a CUDA device of compute capability major.minor ("sm_90a" for 9.0: a device
 * compiles for the "a" form where its arch has one that a JIT wants, see the arch table in
 * target.c), with the device's own multiprocessor count and shared memory limits (0: the arch's
 * documented ones). */
void rlk_target_for_cuda_device(int major, int minor, int multiprocessors, size_t smem_per_block,
                                size_t smem_per_sm, rlk_target *out);

/* Does sm_<sm> (compute capability x 10) have the arch-specific ("a") or the family-specific
 * ("f") form? For a compiler's target list; from the same table as the parser. */
int rlk_target_cuda_has_variant(int sm, char variant);

/* The compute capability x 10 of a CUDA target (sm_90a -> 90), 0 for other backends. */
int rlk_target_cuda_sm(const rlk_target *t);

/* The names of the features in `features`, space-separated ("wgmma tcgen05"), into buf. */
void rlk_target_features_text(unsigned features, char *buf, size_t size);

/* Applies the RLK_ARCH override to a device's target of backend `kind`: the one place that
 * variable is read. A value naming another backend's target is ignored with a warning; the
 * device's multiprocessors, cluster occupancy (cluster_sms) and shared memory are kept. */
rlk_status rlk_target_apply_env(rlk_backend kind, rlk_target *t);

/* The host's target name, "host-<machine>" from uname: "host-x86_64". */
const char *rlk_host_target(void);

/* RLK_ARCH, for a compile-only context given no target (NULL if unset). */
const char *rlk_target_env(void);

#endif

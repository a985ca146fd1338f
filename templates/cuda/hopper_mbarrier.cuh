/* hopper_mbarrier.cuh - sm_90 mbarriers and proxy fences, as inline PTX (namespace rlk::sm90).
 *
 * An mbarrier is a 64-bit word in shared memory that completes a phase when its pending arrival
 * count reaches zero and its transaction count (bytes that asynchronous copies announced with
 * expect_tx) has been delivered. Waiters name the phase by its parity (0, 1, 0, ...): a
 * pipeline stage used for the k-th time waits for parity (k & 1).
 *
 * Usage of a copy pipeline (one producer thread, consumers that release stages):
 *   init:      ring_init<STAGES>(full, empty, consumers) (thread 0 of the block), then __syncthreads
 *   producer:  mbar_wait(&empty[s], phase ^ 1) (not on the first round), mbar_arrive_expect_tx(
 *              &full[s], bytes), then the copies that complete on &full[s]
 *   consumer:  mbar_wait(&full[s], phase); read; mbar_arrive(&empty[s])
 *
 * Everything here needs sm_90 (the body compiles to nothing elsewhere, so a header including this
 * one still builds for older targets; the kernels using it must only be launched on sm_90+).
 * Shared with the other Hopper headers: hopper_tma.cuh, hopper_wgmma.cuh, hopper_warpgroup.cuh. */
#ifndef RLK_HOPPER_MBARRIER_CUH
#define RLK_HOPPER_MBARRIER_CUH

#include "rlk_prelude.cuh"

#if defined(RLK_CUDA)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RLK_SM90_ASM 1
#endif

namespace rlk {
namespace sm90 {

/* The shared-window address of a pointer to shared memory. */
RLK_DEVICE u32 smem_addr(const void *p) { return (u32)__cvta_generic_to_shared(p); }

/* Sets the barrier's expected arrival count for every phase; phase 0 starts. */
RLK_DEVICE void mbar_init(u64 *bar, u32 count) {
#if defined(RLK_SM90_ASM)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#endif
}

/* Makes mbar_init visible to the copy engine and the cluster; follow with a block (or cluster)
 * barrier before anyone uses the barriers. */
RLK_DEVICE void mbar_init_fence() {
#if defined(RLK_SM90_ASM)
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

/* A copy ring of STAGES stages: full[s] completes when the producer's copies land (one arrival
 * and their bytes), empty[s] when `consumers` arrivals release the stage. Called by one thread;
 * a block barrier must follow before the ring is used. */
template <int STAGES> RLK_DEVICE void ring_init(u64 *full, u64 *empty, u32 consumers) {
#pragma unroll
  for (int s = 0; s < STAGES; ++s) {
    mbar_init(&full[s], 1);
    mbar_init(&empty[s], consumers);
  }
  mbar_init_fence();
}

/* One arrival (release semantics: the caller's earlier shared-memory accesses happen before the
 * phase completes). */
RLK_DEVICE void mbar_arrive(u64 *bar) {
#if defined(RLK_SM90_ASM)
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
#endif
}

/* One arrival on the barrier at the same offset in block `cta` of the cluster (releasing a stage
 * that a multicast copy of another block fills). The default semantics (release at CTA scope),
 * as CUTLASS's cluster barrier arrives: .release.cluster compiles to a MEMBAR.ALL.GPU before each
 * arrival, which made a pipeline that hands every stage back this way 2.2x slower. */
RLK_DEVICE void mbar_arrive_cluster(u64 *bar, u32 cta) {
#if defined(RLK_SM90_ASM)
  asm volatile(
      "{\n\t.reg .b32 remote;\n\t"
      "mapa.shared::cluster.u32 remote, %0, %1;\n\t"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n\t}" ::"r"(smem_addr(bar)),
      "r"(cta)
      : "memory");
#endif
}

/* One arrival that also announces `bytes` of transactions (the copies completing on the barrier
 * in this phase). */
RLK_DEVICE void mbar_arrive_expect_tx(u64 *bar, u32 bytes) {
#if defined(RLK_SM90_ASM)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#endif
}

/* Announces `bytes` more of transactions without arriving. */
RLK_DEVICE void mbar_expect_tx(u64 *bar, u32 bytes) {
#if defined(RLK_SM90_ASM)
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#endif
}

/* Has the phase of this parity completed? (one bounded hardware wait; acquire on success) */
RLK_DEVICE bool mbar_try_wait(u64 *bar, u32 parity) {
  u32 done = 1;
#if defined(RLK_SM90_ASM)
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
#endif
  return done != 0;
}

/* Waits until the phase of this parity has completed. */
RLK_DEVICE void mbar_wait(u64 *bar, u32 parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

/* Orders the caller's generic-proxy shared-memory writes before later async-proxy accesses
 * (a TMA store or a wgmma reading what threads wrote). */
RLK_DEVICE void fence_proxy_async() {
#if defined(RLK_SM90_ASM)
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads, a multiple of 32. */
RLK_DEVICE void bar_sync(u32 id, u32 threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
RLK_DEVICE void bar_arrive(u32 id, u32 threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

} /* namespace sm90 */
} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_HOPPER_MBARRIER_CUH */

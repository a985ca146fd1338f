/* hopper_tma.cuh - sm_90 tensor-map (TMA) copies, as inline PTX (namespace rlk::sm90).
 *
 * A tensor map (rlk::tensor_map, 128 opaque bytes) is encoded on the host per launch
 * (src/backend/cuda/tensor_map.c: rlk_cuda_tma_encode, with an optional 128-byte swizzle) into a
 * field of the kernel's `const __grid_constant__` argument struct. Coordinates are in elements,
 * innermost (contiguous) dimension first: (column, row). Parts of a box outside the tensor are
 * zero-filled on loads and not written on stores; a load always delivers the full box's bytes to
 * its mbarrier's transaction count.
 *
 * With the 128-byte swizzle, a box's inner dimension must be 128 bytes at most (64 bf16), and
 * the shared destination 1024-byte aligned: row r of the box lands at byte 128 r with its 16-byte
 * chunks permuted by XOR with (r % 8), the layout wgmma's 128-byte-swizzle descriptors read
 * (hopper_wgmma.cuh). */
#ifndef RLK_HOPPER_TMA_CUH
#define RLK_HOPPER_TMA_CUH

#include "hopper_mbarrier.cuh"

#if defined(RLK_CUDA)
namespace rlk {
namespace sm90 {

/* Cache policies for the L2 (createpolicy.fractional): keep data that other blocks read again,
 * let streamed data go first. */
RLK_DEVICE u64 l2_policy_evict_last() {
  u64 p = 0;
#if defined(RLK_SM90_ASM)
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}
RLK_DEVICE u64 l2_policy_evict_first() {
  u64 p = 0;
#if defined(RLK_SM90_ASM)
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}

/* Fetches the tensor map into the copy engine's descriptor cache (once per block, early). */
RLK_DEVICE void tma_prefetch_map(const tensor_map *map) {
#if defined(RLK_SM90_ASM)
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
#endif
}

/* Loads the box at (c0, c1) into `dst` (shared), completing as transaction bytes on `bar`. c0 times
 * the element's bytes must be a multiple of 16 (a box off that grid faulted on an H200 with an
 * illegal instruction: tests/test_hopper.c's box copy). */
RLK_DEVICE void tma_load_2d(void *dst, const tensor_map *map, i32 c0, i32 c1, u64 *bar) {
#if defined(RLK_SM90_ASM)
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
#endif
}

/* The same with an L2 cache policy (l2_policy_*). */
RLK_DEVICE void tma_load_2d_hint(void *dst, const tensor_map *map, i32 c0, i32 c1, u64 *bar,
                                 u64 policy) {
#if defined(RLK_SM90_ASM)
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
#endif
}

/* Loads the box once and writes it to `dst` in every block of the cluster whose bit is set in
 * `cta_mask`, completing on the barrier at `bar`'s offset in each of them (each expects the
 * box's bytes). */
RLK_DEVICE void tma_load_2d_multicast(void *dst, const tensor_map *map, i32 c0, i32 c1, u64 *bar,
                                      u16 cta_mask) {
#if defined(RLK_SM90_ASM)
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar)), "h"(cta_mask)
      : "memory");
#endif
}

/* Stores the box at (c0, c1) from `src` (shared; written by threads: fence_proxy_async() and a
 * barrier first). Completes with tma_store_commit() + tma_store_wait<0>(). */
RLK_DEVICE void tma_store_2d(const tensor_map *map, const void *src, i32 c0, i32 c1) {
#if defined(RLK_SM90_ASM)
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                   map),
               "r"(c0), "r"(c1), "r"(smem_addr(src))
               : "memory");
#endif
}
/* Adds the box at `src` (f32, f16 or bf16 as the map says) to global memory at (c0, c1), the sum
 * done in L2; otherwise as tma_store_2d (same commit and wait). */
RLK_DEVICE void tma_reduce_add_2d(const tensor_map *map, const void *src, i32 c0, i32 c1) {
#if defined(RLK_SM90_ASM)
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                   map),
               "r"(c0), "r"(c1), "r"(smem_addr(src))
               : "memory");
#endif
}
RLK_DEVICE void tma_store_commit() {
#if defined(RLK_SM90_ASM)
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}
/* Waits until at most N committed store groups are still reading their shared source. */
template <int N> RLK_DEVICE void tma_store_wait() {
#if defined(RLK_SM90_ASM)
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
#endif
}
/* Waits until at most N committed store groups are still incomplete (their writes to global
 * memory done, not only their reads of shared memory): before the block's shared memory goes. */
template <int N> RLK_DEVICE void tma_store_drain() {
#if defined(RLK_SM90_ASM)
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
#endif
}

} /* namespace sm90 */
} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_HOPPER_TMA_CUH */

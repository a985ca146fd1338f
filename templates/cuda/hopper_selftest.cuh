/* hopper_selftest.cuh - small kernels that exercise the Hopper building blocks one at a time, for
 * the tests (tests/test_hopper.c): one output tile of D = A B^T through TMA (128-byte swizzle),
 * mbarriers and wgmma, with A in shared memory or in registers.
 *
 *   hopper_tile_ss<AB, N, K>  A [64 x K], B [N x K] (both K-major, 16-bit) by tensor maps;
 *                             D [64 x N] f32 row-major: one warpgroup, K / 64 stages
 *   hopper_tile_rs<AB, N, K>  the same with A read from shared memory into registers first
 *                             (the register-A form: a[i + 2 h] pairs, as hopper_wgmma.cuh says)
 *   hopper_tile_mn<AB, N, K>  D [64 x N] = A^T B with A stored [K][64] and B [K][N] (MN-major
 *                             operands: wgmma's transposed forms), by boxes of 64 x 64
 *   hopper_tma_box<R, C>      one R x C box of f32 through a tensor map (no swizzle) to out,
 *                             row-major: the map's encoding checked element by element, a box
 *                             hanging over the tensor's edge arriving zero-filled
 *   hopper_ptx_check<N>       compiled, never launched: calls every wrapper of the Hopper headers
 *                             once, so that ptxas checks each instruction's spelling (an inline
 *                             function nobody calls is never assembled) */
#ifndef RLK_HOPPER_SELFTEST_CUH
#define RLK_HOPPER_SELFTEST_CUH

#include "hopper_selftest_params.h"
#include "hopper_tma.cuh"
#include "hopper_wgmma.cuh"

#if defined(RLK_CUDA)
namespace rlk {

/* One 128-byte-swizzled K-major tile row r, 16-bit column c: its byte offset (what TMA wrote). */
RLK_DEVICE u32 sw128_offset(u32 r, u32 c) {
  const u32 chunk = (c * 2u) / 16u, within = (c * 2u) % 16u;
  return r * 128u + ((chunk ^ (r % 8u)) * 16u) + within;
}

/* The accumulators of a 64 x N tile to D, row-major (hopper_wgmma.cuh's layout). */
template <int N> RLK_DEVICE void tile_store(const float (&d)[N / 2], float *D) {
  const int t = (int)threadIdx.x, w = t / 32, l = t % 32;
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        D[(16 * w + l / 4 + 8 * i) * N + 8 * j + 2 * (l % 4) + e] = d[4 * j + 2 * i + e];
}

/* Thread 0 sets up the block's barrier for one arrival; every thread returns after that. */
RLK_DEVICE void one_arrival_barrier(u64 *full) {
  if (threadIdx.x == 0) {
    sm90::mbar_init(full, 1);
    sm90::mbar_init_fence();
  }
  __syncthreads();
}

/* Zero accumulators of a 64 x N tile, fenced for the first wgmma. */
template <int N> RLK_DEVICE void tile_begin(float (&d)[N / 2]) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
  sm90::wgmma_fence_operands(d);
  sm90::wgmma_fence();
}

/* Waits for the tile's committed wgmma group, then stores it to D. */
template <int N> RLK_DEVICE void tile_end(float (&d)[N / 2], float *D) {
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::wgmma_fence_operands(d);
  tile_store<N>(d, D);
}

template <int AB, int N, int K, bool RS>
RLK_DEVICE void hopper_tile(const tensor_map *map_a, const tensor_map *map_b, float *D) {
#if defined(RLK_SM90A_ASM)
  static_assert(K % 64 == 0 && K <= 256, "K: 64..256 by 64");
  constexpr int KB = K / 64;
  constexpr u32 ABYTES = 64u * 128u, BBYTES = (u32)N * 128u;
  extern __shared__ __align__(1024) u8 smem_raw[];
  u8 *smem = (u8 *)(((u64)smem_raw + 1023u) & ~(u64)1023u);
  __shared__ alignas(8) u64 full;
  one_arrival_barrier(&full);
  if (threadIdx.x == 0) {
    sm90::mbar_arrive_expect_tx(&full, (u32)KB * (ABYTES + BBYTES));
    for (int kb = 0; kb < KB; ++kb) {
      sm90::tma_load_2d(smem + kb * (ABYTES + BBYTES), map_a, kb * 64, 0, &full);
      sm90::tma_load_2d(smem + kb * (ABYTES + BBYTES) + ABYTES, map_b, kb * 64, 0, &full);
    }
  }
  sm90::mbar_wait(&full, 0);
  const int t = (int)threadIdx.x, w = t / 32, l = t % 32;
  float d[N / 2];
  tile_begin<N>(d);
#pragma unroll
  for (int kb = 0; kb < KB; ++kb) {
    const u8 *a_tile = smem + kb * (ABYTES + BBYTES);
    const u64 db = sm90::smem_desc(a_tile + ABYTES, sm90::SWIZZLE_128B, 0, 1024);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const u32 scale = (kb > 0 || s > 0) ? 1u : 0u;
      if (RS) {
        u32 a[4];
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const u32 r = (u32)(16 * w + l / 4 + 8 * i), c = (u32)(16 * s + 8 * h + 2 * (l % 4));
            a[i + 2 * h] = *(const u32 *)(a_tile + sw128_offset(r, c));
          }
        sm90::wgmma<N>::template rs<AB, 0>(d, a, sm90::desc_advance(db, 32u * s), scale);
      } else {
        const u64 da = sm90::smem_desc(a_tile, sm90::SWIZZLE_128B, 0, 1024);
        sm90::wgmma<N>::template ss<AB, 0, 0>(d, sm90::desc_advance(da, 32u * s), sm90::desc_advance(db, 32u * s), scale);
      }
    }
  }
  tile_end<N>(d, D);
#else
  (void)map_a, (void)map_b, (void)D;
#endif
}

template <int AB, int N, int K>
__global__ void __launch_bounds__(128) hopper_tile_ss(RLK_PARAMS_ARG ht_tile_args p_) {
  hopper_tile<AB, N, K, false>(&p_.map_a, &p_.map_b, p_.D);
}

template <int AB, int N, int K>
__global__ void __launch_bounds__(128) hopper_tile_rs(RLK_PARAMS_ARG ht_tile_args p_) {
  hopper_tile<AB, N, K, true>(&p_.map_a, &p_.map_b, p_.D);
}

template <int AB, int N, int K>
__global__ void __launch_bounds__(128) hopper_tile_mn(RLK_PARAMS_ARG ht_tile_args p_) {
  const tensor_map *map_a = &p_.map_a, *map_b = &p_.map_b;
  float *D = p_.D;
#if defined(RLK_SM90A_ASM)
  static_assert(K % 64 == 0 && K <= 128 && N % 64 == 0, "K: 64 or 128; N: a multiple of 64");
  constexpr int KB = K / 64;
  constexpr u32 BOX = 64u * 128u, STAGE = BOX * (1u + (u32)N / 64u);
  extern __shared__ __align__(1024) u8 smem_raw[];
  u8 *smem = (u8 *)(((u64)smem_raw + 1023u) & ~(u64)1023u);
  __shared__ alignas(8) u64 full;
  one_arrival_barrier(&full);
  if (threadIdx.x == 0) {
    sm90::mbar_arrive_expect_tx(&full, (u32)KB * STAGE);
    for (int kb = 0; kb < KB; ++kb) {
      sm90::tma_load_2d(smem + kb * STAGE, map_a, 0, kb * 64, &full);
      for (int j = 0; j < N / 64; ++j)
        sm90::tma_load_2d(smem + kb * STAGE + BOX * (1u + (u32)j), map_b, 64 * j, kb * 64, &full);
    }
  }
  sm90::mbar_wait(&full, 0);
  float d[N / 2];
  tile_begin<N>(d);
#pragma unroll
  for (int kb = 0; kb < KB; ++kb) {
    const u64 da = sm90::smem_desc_mn(smem + kb * STAGE, BOX);
    const u64 db = sm90::smem_desc_mn(smem + kb * STAGE + BOX, BOX);
#pragma unroll
    for (int s = 0; s < 4; ++s)
      sm90::wgmma<N>::template ss<AB, 1, 1>(d, sm90::desc_advance(da, 2048u * s),
                                            sm90::desc_advance(db, 2048u * s), (kb > 0 || s > 0) ? 1u : 0u);
  }
  tile_end<N>(d, D);
#else
  (void)map_a, (void)map_b, (void)D;
#endif
}

template <int R, int C>
__global__ void __launch_bounds__(128) hopper_tma_box(RLK_PARAMS_ARG ht_box_args p_) {
#if defined(RLK_SM90_ASM)
  extern __shared__ __align__(128) u8 box_raw[];
  float *box = (float *)(((u64)box_raw + 127u) & ~(u64)127u);
  __shared__ alignas(8) u64 full;
  one_arrival_barrier(&full);
  if (threadIdx.x == 0) {
    sm90::mbar_arrive_expect_tx(&full, (u32)(R * C * 4));
    sm90::tma_load_2d(box, &p_.map, p_.col0, p_.row0, &full);
  }
  sm90::mbar_wait(&full, 0);
  for (int i = (int)threadIdx.x; i < R * C; i += (int)blockDim.x) p_.out[i] = box[i];
#else
  (void)p_;
#endif
}

/* Every wrapper once (N: the wgmma width whose SS and RS forms are assembled). Launching it would
 * do nothing useful; the tests only compile it. */
template <int N>
__global__ void __launch_bounds__(128, 1) hopper_ptx_check(RLK_PARAMS_ARG ht_check_args p_) {
  const tensor_map *map = &p_.map;
  float *out = p_.out;
  __shared__ alignas(1024) u8 tile[2048];
  __shared__ alignas(8) u64 bar;
  sm90::mbar_init(&bar, 1);
  sm90::mbar_init_fence();
  sm90::mbar_expect_tx(&bar, 16);
  sm90::mbar_arrive_expect_tx(&bar, 16);
  sm90::mbar_arrive(&bar);
  sm90::mbar_arrive_cluster(&bar, 0);
  const bool done = sm90::mbar_try_wait(&bar, 0);
  sm90::mbar_wait(&bar, 1);
  sm90::fence_proxy_async();
  sm90::bar_arrive(1, 128);
  sm90::bar_sync(1, 128);
  sm90::tma_prefetch_map(map);
  sm90::tma_load_2d(tile, map, 0, 0, &bar);
  sm90::tma_load_2d_hint(tile, map, 0, 0, &bar, sm90::l2_policy_evict_last());
  sm90::tma_load_2d_hint(tile, map, 0, 0, &bar, sm90::l2_policy_evict_first());
  sm90::tma_load_2d_multicast(tile, map, 0, 0, &bar, (u16)3);
  sm90::tma_store_2d(map, tile, 0, 0);
  sm90::tma_store_commit();
  sm90::tma_store_wait<0>();
  sm90::tma_store_drain<0>();
  if (threadIdx.x < 32) sm90::setmaxnreg_dec<40>();
  else sm90::setmaxnreg_inc<232>();
  const bool one = sm90::elect_one();
  sm90::stmatrix_x4<false>(tile + (threadIdx.x % 32) * 16, 1u, 2u, 3u, 4u);
  sm90::stmatrix_x4<true>(tile + (threadIdx.x % 32) * 16, sm90::pack_half2<true>(1.0f, 2.0f),
                          sm90::pack_half2<false>(1.0f, 2.0f), 3u, 4u);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
  const u64 desc = sm90::smem_desc(tile, sm90::SWIZZLE_128B, 0, 1024);
  const u32 a[4] = {1u, 2u, 3u, 4u};
  sm90::wgmma_fence();
  sm90::wgmma<N>::template ss<sm90::WGMMA_BF16, 0, 1>(d, desc, sm90::desc_advance(desc, 32), 1u);
  sm90::wgmma<N>::template ss<sm90::WGMMA_F16, 1, 0>(d, desc, desc, 1u);
  sm90::wgmma<N>::template rs<sm90::WGMMA_BF16, 1>(d, a, desc, 1u);
  sm90::wgmma<N>::template rs<sm90::WGMMA_F16, 0>(d, a, desc, 1u);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::wgmma_fence_operands(d);
  float s = (done ? 1.0f : 0.0f) + (one ? 1.0f : 0.0f);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) s += d[i];
  out[threadIdx.x] = s;
}

} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_HOPPER_SELFTEST_CUH */

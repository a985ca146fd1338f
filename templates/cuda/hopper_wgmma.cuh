/* hopper_wgmma.cuh - sm_90a warpgroup matrix multiply-accumulate (wgmma.mma_async), as inline
 * PTX (namespace rlk::sm90). Needs the "a" target (sm_90a); elsewhere the calls compile to
 * nothing.
 *
 * One call D[64 x N] (+)= A[64 x 16] * B[16 x N] is issued by a whole warpgroup (128 threads,
 * hopper_warpgroup.cuh), bf16 or f16 inputs, f32 accumulators in registers:
 *   wgmma<N>::ss<AB, TA, TB>(d, desc_a, desc_b, scale_d)   A and B in shared memory
 *   wgmma<N>::rs<AB, TB>(d, a, desc_b, scale_d)            A in registers (4 x u32 per thread)
 * AB is WGMMA_BF16 or WGMMA_F16; scale_d 0 gives D = A B (the first k-step), 1 gives D += A B.
 * TA / TB = 0: the operand is K-major (A [64 x K] and B [N x K] with K contiguous, as h and W of
 * `h W^T`); 1: MN-major (transposed; 16-bit types only). N is 16, 32, 64, 128, 192 or 256.
 *
 * Accumulator layout (d[N / 2] per thread): thread t of the warpgroup, warp w = t / 32, lane l:
 *   d[4 j + 2 i + e] = D[16 w + l / 4 + 8 i][8 j + 2 (l % 4) + e],  j < N / 8, i, e in {0, 1}.
 * Register A (rs), a 64 x 16 tile in the same pattern: a[i + 2 h] holds the bf16/f16 pair
 *   A[16 w + l / 4 + 8 i][8 h + 2 (l % 4) + {0, 1}]   (low half first; pack_half2),
 * so an accumulator converted to 16 bits feeds the next product directly (FlashAttention's P).
 *
 * The sequence around a batch of calls:
 *   wgmma_fence();                       registers/shared memory written before are seen
 *   wgmma<N>::ss<...>(...) x k-steps;   asynchronous
 *   wgmma_commit();                      closes a group
 *   wgmma_wait<G>();                     at most G groups still running; only then read d or
 *                                        release the shared operands of the finished groups
 * Between issue and wait the compiler must not touch d: wgmma_fence_operands(d) pins it.
 *
 * Shared-memory matrix descriptors (smem_desc): start address, leading and stride byte offsets,
 * swizzle mode. The tested layout is K-major with the 128-byte swizzle, which a TMA box of 64
 * 16-bit columns with CU_TENSOR_MAP_SWIZZLE_128B writes (hopper_tma.cuh): rows of 128 bytes,
 * 8-row groups 1024 bytes apart, the tile 1024-byte aligned:
 *   desc = smem_desc(tile, SWIZZLE_128B, 0, 1024);   rows 64 r.. of the tile: tile + 8192 r
 *   k-slice s (columns 16 s .. 16 s + 15): desc_advance(desc, 32 * s)
 * MN-major (TA / TB = 1: A stored [K][M], B stored [K][N], MN contiguous), the 128-byte
 * swizzle: TMA boxes of 64 MN columns x BK K rows (box_cols 64, box_rows BK), one box per 64-wide
 * MN block, `box_bytes` (= 128 BK) apart. A swizzle atom is 8 K rows x 64 MN elements (1024
 * bytes); the leading offset steps between MN blocks (box_bytes), the stride offset between
 * 8-row K groups (1024):
 *   desc = smem_desc_mn(tile, box_bytes);   k-slice s (K rows 16 s ..): desc_advance(desc, 2048 s)
 * For other layouts pass the offsets of the PTX ISA's canonical layouts ("Matrix Descriptor
 * Format", "Strides"): leading = between core matrices along the leading dimension, stride =
 * between 8-row groups along the strided one. */
#ifndef RLK_HOPPER_WGMMA_CUH
#define RLK_HOPPER_WGMMA_CUH

#include "hopper_warpgroup.cuh"

#if defined(RLK_CUDA)
/* sm_90a exactly: Blackwell's "a" targets set __CUDA_ARCH_SPECIFIC__ too (1000, 1200) and have no
 * wgmma (the JIT refuses the templates that need it there: rlk_template.requires). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && \
    (defined(__CUDA_ARCH_FEAT_SM90_ALL) || (defined(__CUDA_ARCH_SPECIFIC__) && __CUDA_ARCH_SPECIFIC__ == 900))
#define RLK_SM90A_ASM 1
#endif

namespace rlk {
namespace sm90 {

enum { WGMMA_BF16 = 0, WGMMA_F16 = 1 };
enum { SWIZZLE_NONE = 0, SWIZZLE_128B = 1, SWIZZLE_64B = 2, SWIZZLE_32B = 3 };

/* The 64-bit descriptor of a matrix in shared memory. */
RLK_DEVICE u64 smem_desc(const void *start, u32 swizzle, u32 leading_bytes, u32 stride_bytes) {
  u64 d = (u64)((smem_addr(start) & 0x3FFFFu) >> 4);
  d |= (u64)((leading_bytes >> 4) & 0x3FFFu) << 16;
  d |= (u64)((stride_bytes >> 4) & 0x3FFFu) << 32;
  d |= (u64)(swizzle & 3u) << 62;
  return d;
}

/* An MN-major 128-byte-swizzled operand of TMA boxes 64 MN wide, box_bytes apart (above). */
RLK_DEVICE u64 smem_desc_mn(const void *tile, u32 box_bytes) {
  return smem_desc(tile, SWIZZLE_128B, box_bytes, 1024);
}

/* The descriptor of the matrix `bytes` further on (a multiple of 16; within 256 KB). */
RLK_DEVICE u64 desc_advance(u64 desc, u32 bytes) { return desc + (u64)(bytes >> 4); }

RLK_DEVICE void wgmma_fence() {
#if defined(RLK_SM90A_ASM)
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
RLK_DEVICE void wgmma_commit() {
#if defined(RLK_SM90A_ASM)
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int G> RLK_DEVICE void wgmma_wait() {
  static_assert(G >= 0 && G <= 7, "wgmma_wait: 0..7 groups");
#if defined(RLK_SM90A_ASM)
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(G) : "memory");
#endif
}

/* Keeps the compiler from moving accesses of these registers across an asynchronous wgmma. */
template <int R> RLK_DEVICE void wgmma_fence_operands(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
/* The same for A fragments in registers (rs): kept intact until the products reading them end. */
template <int R, int C> RLK_DEVICE void wgmma_fence_operands(u32 (&a)[R][C]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < C; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}

/* The register lists of the instructions: d's N / 2 accumulators first, then the operands (the
 * strings are spelled out: PTX names registers by position). */
#define RLK_WGMMA_D8(d, b)                                                                    \
  "+f"(d[b + 0]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), \
      "+f"(d[b + 6]), "+f"(d[b + 7])
#define RLK_WGMMA_D16 \
  "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define RLK_WGMMA_SS16 ", %8, %9, p, 1, 1, %11, %12;"
#define RLK_WGMMA_SS16_P "setp.ne.b32 p, %10, 0;\n"
#define RLK_WGMMA_RS16 ", {%8, %9, %10, %11}, %12, p, 1, 1, %14;"
#define RLK_WGMMA_RS16_P "setp.ne.b32 p, %13, 0;\n"
#define RLK_WGMMA_OPS16(d) RLK_WGMMA_D8(d, 0)
#define RLK_WGMMA_D32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define RLK_WGMMA_SS32 ", %16, %17, p, 1, 1, %19, %20;"
#define RLK_WGMMA_SS32_P "setp.ne.b32 p, %18, 0;\n"
#define RLK_WGMMA_RS32 ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;"
#define RLK_WGMMA_RS32_P "setp.ne.b32 p, %21, 0;\n"
#define RLK_WGMMA_OPS32(d) RLK_WGMMA_D8(d, 0), RLK_WGMMA_D8(d, 8)
#define RLK_WGMMA_D64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "\
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define RLK_WGMMA_SS64 ", %32, %33, p, 1, 1, %35, %36;"
#define RLK_WGMMA_SS64_P "setp.ne.b32 p, %34, 0;\n"
#define RLK_WGMMA_RS64 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;"
#define RLK_WGMMA_RS64_P "setp.ne.b32 p, %37, 0;\n"
#define RLK_WGMMA_OPS64(d) RLK_WGMMA_D8(d, 0), RLK_WGMMA_D8(d, 8), RLK_WGMMA_D8(d, 16), RLK_WGMMA_D8(d, 24)
#define RLK_WGMMA_D128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "\
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "\
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "\
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define RLK_WGMMA_SS128 ", %64, %65, p, 1, 1, %67, %68;"
#define RLK_WGMMA_SS128_P "setp.ne.b32 p, %66, 0;\n"
#define RLK_WGMMA_RS128 ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;"
#define RLK_WGMMA_RS128_P "setp.ne.b32 p, %69, 0;\n"
#define RLK_WGMMA_OPS128(d) RLK_WGMMA_D8(d, 0), RLK_WGMMA_D8(d, 8), RLK_WGMMA_D8(d, 16), RLK_WGMMA_D8(d, 24), RLK_WGMMA_D8(d, 32), RLK_WGMMA_D8(d, 40), RLK_WGMMA_D8(d, 48), RLK_WGMMA_D8(d, 56)
#define RLK_WGMMA_D192 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "\
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "\
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "\
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "\
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "\
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"
#define RLK_WGMMA_SS192 ", %96, %97, p, 1, 1, %99, %100;"
#define RLK_WGMMA_SS192_P "setp.ne.b32 p, %98, 0;\n"
#define RLK_WGMMA_RS192 ", {%96, %97, %98, %99}, %100, p, 1, 1, %102;"
#define RLK_WGMMA_RS192_P "setp.ne.b32 p, %101, 0;\n"
#define RLK_WGMMA_OPS192(d) RLK_WGMMA_D8(d, 0), RLK_WGMMA_D8(d, 8), RLK_WGMMA_D8(d, 16), RLK_WGMMA_D8(d, 24), RLK_WGMMA_D8(d, 32), RLK_WGMMA_D8(d, 40), RLK_WGMMA_D8(d, 48), RLK_WGMMA_D8(d, 56), RLK_WGMMA_D8(d, 64), RLK_WGMMA_D8(d, 72), RLK_WGMMA_D8(d, 80), RLK_WGMMA_D8(d, 88)
#define RLK_WGMMA_D256 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "\
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "\
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "\
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "\
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "\
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "\
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "\
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define RLK_WGMMA_SS256 ", %128, %129, p, 1, 1, %131, %132;"
#define RLK_WGMMA_SS256_P "setp.ne.b32 p, %130, 0;\n"
#define RLK_WGMMA_RS256 ", {%128, %129, %130, %131}, %132, p, 1, 1, %134;"
#define RLK_WGMMA_RS256_P "setp.ne.b32 p, %133, 0;\n"
#define RLK_WGMMA_OPS256(d) RLK_WGMMA_D8(d, 0), RLK_WGMMA_D8(d, 8), RLK_WGMMA_D8(d, 16), RLK_WGMMA_D8(d, 24), RLK_WGMMA_D8(d, 32), RLK_WGMMA_D8(d, 40), RLK_WGMMA_D8(d, 48), RLK_WGMMA_D8(d, 56), RLK_WGMMA_D8(d, 64), RLK_WGMMA_D8(d, 72), RLK_WGMMA_D8(d, 80), RLK_WGMMA_D8(d, 88), RLK_WGMMA_D8(d, 96), RLK_WGMMA_D8(d, 104), RLK_WGMMA_D8(d, 112), RLK_WGMMA_D8(d, 120)

template <int N> struct wgmma;

#if defined(RLK_SM90A_ASM)
#define RLK_WGMMA_ASM_SS(N, T)                                                                   \
  asm volatile("{\n\t.reg .pred p;\n\t" RLK_WGMMA_SS##N##_P                                      \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " " RLK_WGMMA_D##N       \
                   RLK_WGMMA_SS##N "\n\t}"                                                        \
               : RLK_WGMMA_OPS##N(d)                                                              \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB))
#define RLK_WGMMA_ASM_RS(N, T)                                                                   \
  asm volatile("{\n\t.reg .pred p;\n\t" RLK_WGMMA_RS##N##_P                                      \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " " RLK_WGMMA_D##N       \
                   RLK_WGMMA_RS##N "\n\t}"                                                        \
               : RLK_WGMMA_OPS##N(d)                                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB))
#else
#define RLK_WGMMA_ASM_SS(N, T) ((void)d, (void)desc_a, (void)desc_b, (void)scale_d)
#define RLK_WGMMA_ASM_RS(N, T) ((void)d, (void)a, (void)desc_b, (void)scale_d)
#endif

#define RLK_WGMMA_DEFINE(N)                                                                      \
  template <> struct wgmma<N> {                                                                  \
    template <int AB, int TA, int TB>                                                            \
    static RLK_DEVICE void ss(float (&d)[N / 2], u64 desc_a, u64 desc_b, u32 scale_d) {          \
      static_assert((AB == WGMMA_BF16 || AB == WGMMA_F16) && (TA == 0 || TA == 1) &&             \
                        (TB == 0 || TB == 1),                                                    \
                    "wgmma: AB bf16/f16, TA/TB 0/1");                                            \
      if (AB == WGMMA_BF16)                                                                      \
        RLK_WGMMA_ASM_SS(N, "bf16");                                                             \
      else                                                                                       \
        RLK_WGMMA_ASM_SS(N, "f16");                                                              \
    }                                                                                            \
    template <int AB, int TB>                                                                    \
    static RLK_DEVICE void rs(float (&d)[N / 2], const u32 (&a)[4], u64 desc_b, u32 scale_d) {   \
      static_assert((AB == WGMMA_BF16 || AB == WGMMA_F16) && (TB == 0 || TB == 1),               \
                    "wgmma: AB bf16/f16, TB 0/1");                                               \
      if (AB == WGMMA_BF16)                                                                      \
        RLK_WGMMA_ASM_RS(N, "bf16");                                                             \
      else                                                                                       \
        RLK_WGMMA_ASM_RS(N, "f16");                                                              \
    }                                                                                            \
  };

RLK_WGMMA_DEFINE(16)
RLK_WGMMA_DEFINE(32)
RLK_WGMMA_DEFINE(64)
RLK_WGMMA_DEFINE(128)
RLK_WGMMA_DEFINE(192)
RLK_WGMMA_DEFINE(256)

} /* namespace sm90 */
} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_HOPPER_WGMMA_CUH */

/* rlk_prelude.cuh - the device prelude every CUDA/HIP template includes.
 *
 * Templates are compiled by NVRTC and by hiprtc with no toolkit headers, so everything a
 * kernel needs beyond the compilers' built-ins lives here: fixed-width integer names,
 * 16-bit float storage types, numeric limits, math wrappers, and reductions whose
 * summation order is fixed (bitwise reproducible run to run).
 *
 * Portability: under hiprtc (__HIPCC_RTC__, or RLK_HIPRTC) a wavefront is 64 lanes,
 * shuffles take no mask, and there is no inline PTX. */
#ifndef RLK_PRELUDE_CUH
#define RLK_PRELUDE_CUH

#if defined(__HIPCC_RTC__) || defined(__HIPCC__) || defined(RLK_HIPRTC)
#define RLK_HIP 1
#define RLK_WARP_SIZE 64
#else
#define RLK_CUDA 1
#define RLK_WARP_SIZE 32
#endif

/* Largest block the templates launch, and so the most warps a block reduction combines. */
#if defined(RLK_HIP) && defined(__AMDGCN_WAVEFRONT_SIZE) && __AMDGCN_WAVEFRONT_SIZE != RLK_WARP_SIZE
#error "rlk templates need 64-lane wavefronts on AMD: compile with -mwavefrontsize64"
#endif

#define RLK_MAX_BLOCK 1024
#define RLK_MAX_WARPS (RLK_MAX_BLOCK / RLK_WARP_SIZE)

#define RLK_DEVICE __device__ __forceinline__

#include "rlk_params.h"

/* A kernel's argument struct (templates/common/<op>_params.h): `RLK_PARAMS_ARG Params p_`. On
 * CUDA it is __grid_constant__, so the fields are read from parameter space where they are used,
 * as separate parameters are; a plain by-value struct has NVVM load them all on entry and keep
 * them live (linear_logprob_fwd_tiled on sm_80: 80 registers became 128 and spilled). */
#if defined(RLK_CUDA)
#define RLK_PARAMS_ARG const __grid_constant__
#else
#define RLK_PARAMS_ARG const
#endif

namespace rlk {

typedef signed char i8;
typedef unsigned char u8;
typedef short i16;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

/* 16-byte vectors: one load or store instruction where the address is 16-byte aligned. */
struct alignas(16) f32x4 {
  float x, y, z, w;
};
struct alignas(8) f32x2 { /* 8 bytes: one load or store where 8-byte aligned */
  float x, y;
};
struct alignas(16) i32x4 {
  i32 x, y, z, w;
};
struct alignas(16) f64x2 {
  double x, y;
};

/* A load of memory that no thread of the kernel writes, through the read-only (non-coherent)
 * path: what a `const T *__restrict__` kernel parameter gets from the compiler, which a pointer
 * read out of an argument struct does not (the promise is lost with the parameter). T is 1, 4,
 * 8 or 16 bytes, naturally aligned. HIP: a plain load. */
template <typename T> RLK_DEVICE T ld_ro(const T *p) {
#if defined(RLK_CUDA)
  static_assert(sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 16, "ld_ro: size");
  union {
    T v;
    u32 w[sizeof(T) >= 4 ? sizeof(T) / 4 : 1];
    u64 d;
    u8 b;
  } u;
  if constexpr (sizeof(T) == 16) {
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(u.w[0]), "=r"(u.w[1]), "=r"(u.w[2]), "=r"(u.w[3])
        : "l"(p));
  } else if constexpr (sizeof(T) == 8) {
    asm("ld.global.nc.u64 %0, [%1];" : "=l"(u.d) : "l"(p));
  } else if constexpr (sizeof(T) == 4) {
    asm("ld.global.nc.u32 %0, [%1];" : "=r"(u.w[0]) : "l"(p));
  } else {
    u32 w;
    asm("ld.global.nc.u8 %0, [%1];" : "=r"(w) : "l"(p));
    u.b = (u8)w;
  }
  return u.v;
#else
  return *p;
#endif
}

/* One 16-byte store of four floats to a 16-byte aligned global address. */
RLK_DEVICE void store4(float *p, float a, float b, float c, float d) {
#if defined(RLK_CUDA)
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
#else
  typedef float v4 __attribute__((ext_vector_type(4)));
  v4 q = {a, b, c, d};
  *(v4 *)p = q;
#endif
}

template <int ALIGN> RLK_DEVICE bool is_aligned(const void *p) {
  return ((u64)p & (u64)(ALIGN - 1)) == 0;
}

/* Programmatic dependent launch (CUDA sm_90 and later). A kernel launched with
 * RLK_LAUNCH_OVERLAP may start while the stream's previous kernel is still running:
 * grid_dependency_wait() returns once that kernel has finished and its writes are visible, so
 * such a kernel calls it before it reads or writes global memory. grid_dependents_launch()
 * lets the stream's next overlapping launch start its blocks, which wait in turn. Both do
 * nothing in a plain launch, before sm_90 and on HIP. */
RLK_DEVICE void grid_dependency_wait() {
#if defined(RLK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
RLK_DEVICE void grid_dependents_launch() {
#if defined(RLK_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* ---------------------------------------------------------------------------------- */
/* 16-bit float storage types: plain bits, converted to float for arithmetic           */
/* ---------------------------------------------------------------------------------- */

struct f16 {
  u16 bits;
};

struct bf16 {
  u16 bits;
};

RLK_DEVICE float bits_as_float(u32 b) { return __uint_as_float(b); }
RLK_DEVICE u32 float_as_bits(float f) { return __float_as_uint(f); }

/* bf16 is the top half of an fp32. */
RLK_DEVICE float to_float(bf16 x) { return bits_as_float((u32)x.bits << 16); }

/* Round to nearest even; NaN stays a (quiet) NaN of the same sign. */
RLK_DEVICE bf16 to_bf16(float f) {
  u32 u = float_as_bits(f);
  bf16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.bits = (u16)((u >> 16) | 0x0040u);
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    r.bits = (u16)(u >> 16);
  }
  return r;
}

#if defined(RLK_CUDA)
RLK_DEVICE float to_float(f16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}
RLK_DEVICE f16 to_f16(float f) {
  f16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
  return r;
}
#else
RLK_DEVICE float to_float(f16 x) { return (float)__builtin_bit_cast(_Float16, x.bits); }
RLK_DEVICE f16 to_f16(float f) {
  f16 r;
  r.bits = __builtin_bit_cast(u16, (_Float16)f);
  return r;
}
#endif

RLK_DEVICE float to_float(float x) { return x; }
RLK_DEVICE double to_double(double x) { return x; }
RLK_DEVICE double to_double(float x) { return (double)x; }

/* Converts a float to storage type T (identity for float and double). */
template <typename T> struct store_as;
template <> struct store_as<float> {
  static RLK_DEVICE float from(float f) { return f; }
};
template <> struct store_as<double> {
  static RLK_DEVICE double from(float f) { return (double)f; }
};
template <> struct store_as<bf16> {
  static RLK_DEVICE bf16 from(float f) { return to_bf16(f); }
};
template <> struct store_as<f16> {
  static RLK_DEVICE f16 from(float f) { return to_f16(f); }
};

/* ---------------------------------------------------------------------------------- */
/* Numeric limits and math                                                             */
/* ---------------------------------------------------------------------------------- */

template <typename T> struct limits;
template <> struct limits<float> {
  static RLK_DEVICE float infinity() { return __uint_as_float(0x7f800000u); }
  static RLK_DEVICE float quiet_nan() { return __uint_as_float(0x7fc00000u); }
  static RLK_DEVICE float max() { return 3.40282346638528859812e+38f; }
  static RLK_DEVICE float lowest() { return -3.40282346638528859812e+38f; }
  static RLK_DEVICE float epsilon() { return 1.1920928955078125e-07f; }
};
template <> struct limits<double> {
  static RLK_DEVICE double infinity() { return __longlong_as_double(0x7ff0000000000000ll); }
  static RLK_DEVICE double quiet_nan() { return __longlong_as_double(0x7ff8000000000000ll); }
  static RLK_DEVICE double max() { return 1.79769313486231570815e+308; }
  static RLK_DEVICE double lowest() { return -1.79769313486231570815e+308; }
  static RLK_DEVICE double epsilon() { return 2.220446049250313080847e-16; }
};

RLK_DEVICE float exp_(float x) { return expf(x); }
RLK_DEVICE double exp_(double x) { return exp(x); }
RLK_DEVICE float sqrt_(float x) { return sqrtf(x); }
RLK_DEVICE double sqrt_(double x) { return sqrt(x); }
RLK_DEVICE float rsqrt_(float x) { return rsqrtf(x); }
RLK_DEVICE double rsqrt_(double x) { return rsqrt(x); }
RLK_DEVICE float fmin_(float a, float b) { return fminf(a, b); }
RLK_DEVICE double fmin_(double a, double b) { return fmin(a, b); }
RLK_DEVICE float fmax_(float a, float b) { return fmaxf(a, b); }
RLK_DEVICE double fmax_(double a, double b) { return fmax(a, b); }

template <typename T> RLK_DEVICE T min_(T a, T b) { return b < a ? b : a; }
template <typename T> RLK_DEVICE T max_(T a, T b) { return a < b ? b : a; }

/* ---------------------------------------------------------------------------------- */
/* Deterministic reductions                                                            */
/* ---------------------------------------------------------------------------------- */

template <typename T> RLK_DEVICE T shfl_xor(T v, int lane_mask) {
#if defined(RLK_HIP)
  return __shfl_xor(v, lane_mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
#endif
}

/* The value of lane `lane` of the warp; of the lane `delta` below, or above (a lane past either
 * end keeps its own). */
template <typename T> RLK_DEVICE T shfl_from(T v, int lane) {
#if defined(RLK_HIP)
  return __shfl(v, lane);
#else
  return __shfl_sync(0xffffffffu, v, lane);
#endif
}

template <typename T> RLK_DEVICE T shfl_up(T v, int delta) {
#if defined(RLK_HIP)
  return __shfl_up(v, (unsigned)delta);
#else
  return __shfl_up_sync(0xffffffffu, v, (unsigned)delta);
#endif
}

template <typename T> RLK_DEVICE T shfl_down(T v, int delta) {
#if defined(RLK_HIP)
  return __shfl_down(v, delta);
#else
  return __shfl_down_sync(0xffffffffu, v, delta);
#endif
}

/* Sum over aligned segments of W lanes (W a power of two, at most a warp), as a butterfly:
 * every lane of a segment ends with the same, bitwise identical total (each step adds the
 * same two values, and float addition is commutative). Every lane of the warp must call it. */
template <int W, typename T> RLK_DEVICE T segment_sum(T v) {
  static_assert(W >= 1 && W <= RLK_WARP_SIZE && (W & (W - 1)) == 0, "segment width");
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v += shfl_xor(v, o);
  return v;
}

template <typename T> RLK_DEVICE T warp_sum(T v) { return segment_sum<RLK_WARP_SIZE>(v); }

/* Sum over the whole block, returned to every thread. `scratch` holds RLK_MAX_WARPS values
 * in shared memory. Warps are combined in index order, so the result depends only on the
 * inputs and the block size. blockDim.x must be a multiple of the warp size; every thread
 * of the block must call it (it synchronizes). */
template <typename T> RLK_DEVICE T block_sum(T v, T *scratch) {
  v = warp_sum(v);
  const int warp = (int)(threadIdx.x / RLK_WARP_SIZE);
  const int nwarps = (int)(blockDim.x / RLK_WARP_SIZE);
  if (threadIdx.x % RLK_WARP_SIZE == 0) scratch[warp] = v;
  __syncthreads();
  T total = scratch[0];
  for (int w = 1; w < nwarps; ++w) total += scratch[w];
  __syncthreads(); /* scratch may be reused as soon as this returns */
  return total;
}

} /* namespace rlk */

/* ---------------------------------------------------------------------------------- */
/* Fast base-2 exponential; sm_90 bulk copies, tensor maps and mbarriers               */
/* ---------------------------------------------------------------------------------- */
namespace rlk {

/* 2^x with the hardware approximation (CUDA: ex2.approx.ftz, about 2 ulp, results below
 * 2^-126 flush to 0; HIP: exp2f). 2^-inf = 0, NaN stays NaN. */
RLK_DEVICE float exp2_approx(float x) {
#if defined(RLK_CUDA)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

#if defined(RLK_CUDA)
/* A CUtensorMap as the kernel sees it (rlk_params.h: rlk_tensor_map, 128 opaque bytes, 64-byte
 * aligned). The host encodes it per launch (src/backend/cuda/tensor_map.c) into the kernel's
 * argument struct, which the kernel takes `const __grid_constant__`, so the copy engine reads it
 * from parameter space. */
typedef ::rlk_tensor_map tensor_map;

/* The shared-window address of a pointer into shared memory. */
RLK_DEVICE u32 smem_u32(const void *p) { return (u32)__cvta_generic_to_shared(p); }

/* mbarrier and bulk-copy wrappers: sm_90 and later only (the templates that use them are only
 * instantiated for those targets; elsewhere they compile to nothing). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RLK_HAS_BULK_COPY 1
RLK_DEVICE void mbar_init(u64 *bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
/* Makes initialized mbarriers visible to the copy engine and the other threads (then sync). */
RLK_DEVICE void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
/* One arrival that also expects `bytes` more of transaction (the copies that complete on it). */
RLK_DEVICE void mbar_arrive_expect_tx(u64 *bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
RLK_DEVICE void mbar_arrive(u64 *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
/* Waits until the phase of parity `parity` has completed. */
RLK_DEVICE void mbar_wait(u64 *bar, u32 parity) {
  const u32 a = smem_u32(bar);
  u32 done = 0;
  while (!done) {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(a), "r"(parity)
        : "memory");
  }
}
/* 1-D bulk copy global -> shared of `bytes` (a multiple of 16; both addresses 16-byte aligned),
 * completing as transaction bytes on `bar`. */
RLK_DEVICE void bulk_copy_g2s(void *dst, const void *src, u32 bytes, u64 *bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
/* 2-D tensor-map copy of the box at (column c0, row c1) into shared memory, completing on `bar`.
 * Parts of the box outside the tensor are zero-filled; the full box counts as transaction. */
RLK_DEVICE void tma_load_2d(void *dst, const tensor_map *map, i32 c0, i32 c1, u64 *bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];" ::"r"(smem_u32(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}
/* Named barrier `id` (1..15) over `threads` threads (a multiple of the warp size). */
RLK_DEVICE void named_barrier(u32 id, u32 threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/* Thread-block clusters. A cluster barrier is split in two: every thread of the cluster arrives
 * (release: its earlier memory accesses, shared memory of other blocks included, are ordered
 * before it), then waits (acquire) until all have; a thread alternates the two. */
RLK_DEVICE u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
RLK_DEVICE void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
RLK_DEVICE void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
/* The address in the cluster's shared window of `p` (this block's shared memory) in block `rank`. */
RLK_DEVICE u32 cluster_map(const void *p, u32 rank) {
  u32 a;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_u32(p)), "r"(rank));
  return a;
}
RLK_DEVICE float cluster_load_f32(u32 addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
RLK_DEVICE void cluster_atomic_min_u32(u32 addr, u32 v) {
  asm volatile("red.shared::cluster.min.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
#endif /* sm_90 */
#endif /* RLK_CUDA */

} /* namespace rlk */

#endif /* RLK_PRELUDE_CUH */

// w_stream.cu - how fast the multiprocessors pull an LM head's weight [V, K] (bf16, 151936 x 4096)
// into shared memory, by copy method and shape alone (no math): TMA boxes of several shapes and
// stage counts (with and without a zero-filled A box as the fused head's small-M forward loads,
// with an evict-first policy), 1D bulk copies of contiguous chunks, cp.async by 128 threads, and
// plain 16-byte loads; 119 blocks (the head's grid at one row), one a multiprocessor, two.
// Bandwidth = W's bytes / median of 15 launches (CUDA events, after 3).
//   nvcc -std=c++17 -O3 -arch=sm_90a -o w_stream tools/bench/w_stream.cu -lcuda
// (standalone: the driver's cuTensorMapEncodeTiled through the runtime's entry point query)
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cstdint>
typedef unsigned long long u64; typedef unsigned u32;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("cuda %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)
static const long V = 151936, K = 4096;
__device__ __forceinline__ u32 sa(const void *p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bar_init(u64 *b, u32 n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(n)); }
__device__ __forceinline__ void bar_expect(u64 *b, u32 n) { asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(u64 *b) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(b)) : "memory"); }
__device__ __forceinline__ void bar_wait(u64 *b, u32 ph) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(sa(b)), "r"(ph) : "memory");
}
__device__ __forceinline__ void tma2d(void *dst, const CUtensorMap *m, int c0, int c1, u64 *b) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               ::"r"(sa(dst)), "l"(m), "r"(c0), "r"(c1), "r"(sa(b)) : "memory");
}
__device__ __forceinline__ void tma2d_hint(void *dst, const CUtensorMap *m, int c0, int c1, u64 *b, u64 pol) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;"
               ::"r"(sa(dst)), "l"(m), "r"(c0), "r"(c1), "r"(sa(b)), "l"(pol) : "memory");
}
__device__ __forceinline__ void bulk1d(void *dst, const void *src, u32 n, u64 *b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(sa(dst)), "l"(src), "r"(n), "r"(sa(b)) : "memory");
}
extern __shared__ __align__(1024) unsigned char smem_raw[];
__device__ unsigned sink;

// The ring's barriers (by thread 0, before the block's barrier): `full` completes a phase on
// `arrivals` arrivals (and the copies' bytes), `empty` on the consumer's one.
template <int STAGES> __device__ void ring_init(u64 *full, u64 *empty, u32 arrivals) {
  if (threadIdx.x != 0) return;
  for (int s = 0; s < STAGES; ++s) { bar_init(&full[s], arrivals); bar_init(&empty[s], 1); }
  asm volatile("fence.mbarrier_init.release.cluster;");
}

// The consumer (one thread): waits for each of `total` stages of `stage` bytes, reads a byte of
// it (so that the wait is not idle), hands it back.
template <int STAGES> __device__ void ring_consume(u64 *full, u64 *empty, const unsigned char *smem, u32 stage, u32 total) {
  unsigned acc = 0;
  for (u32 it = 0; it < total; ++it) {
    const u32 s = it % STAGES;
    bar_wait(&full[s], (it / STAGES) & 1);
    acc += smem[s * stage + (it & 1023)];
    bar_arrive(&empty[s]);
  }
  if (acc == 0xdeadbeef) sink = acc;
}

// TMA: tiles of BR*RB rows; per stage RB boxes along rows x KB boxes along K (each box BR x 64).
// HBOX: an extra 128 x 64 box of an [N=1, K] tensor per stage (zero-filled rows, as the fused
// head's A operand at M 1). HINT: evict-first policy on W.
template <int BR, int RB, int KB, int STAGES, bool HBOX, bool HINT>
__global__ void __launch_bounds__(256, 1) k_tma(const __grid_constant__ CUtensorMap mw, const __grid_constant__ CUtensorMap mh, int tiles) {
  constexpr u32 BOX = BR * 128, WST = BOX * RB * KB, HB = HBOX ? 16384 : 0, ST = WST + HB;
  constexpr int TR = BR * RB;
  unsigned char *smem = (unsigned char *)(((u64)smem_raw + 1023) & ~(u64)1023);
  __shared__ alignas(8) u64 full[STAGES], empty[STAGES];
  ring_init<STAGES>(full, empty, 1);
  __syncthreads();
  const int t0 = (int)((long)blockIdx.x * tiles / gridDim.x), t1 = (int)((long)(blockIdx.x + 1) * tiles / gridDim.x);
  const int ksteps = (int)(K / (64 * KB));
  const int total = (t1 - t0) * ksteps;
  if (threadIdx.x == 0) {
    u64 pol = 0;
    if (HINT) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    u32 it = 0;
    for (int t = t0; t < t1; ++t)
      for (int ks = 0; ks < ksteps; ++ks, ++it) {
        const u32 s = it % STAGES;
        if (it >= (u32)STAGES) bar_wait(&empty[s], ((it / STAGES) - 1) & 1);
        bar_expect(&full[s], ST);
        unsigned char *d = smem + s * ST;
        if (HBOX) tma2d(d + WST, &mh, ks * 64 * KB, 0, &full[s]);
        for (int kk = 0; kk < KB; ++kk)
          for (int r = 0; r < RB; ++r) {
            if (HINT) tma2d_hint(d + (kk * RB + r) * BOX, &mw, (ks * KB + kk) * 64, t * TR + r * BR, &full[s], pol);
            else tma2d(d + (kk * RB + r) * BOX, &mw, (ks * KB + kk) * 64, t * TR + r * BR, &full[s]);
          }
      }
  } else if (threadIdx.x == 128) {
    ring_consume<STAGES>(full, empty, smem, ST, (u32)total);
  }
}

// 1D bulk copies of contiguous chunks: stage = CH bytes (a block's rows are one contiguous range).
template <int CH, int STAGES>
__global__ void __launch_bounds__(256, 1) k_bulk(const unsigned char *w, long bytes) {
  unsigned char *smem = (unsigned char *)(((u64)smem_raw + 1023) & ~(u64)1023);
  __shared__ alignas(8) u64 full[STAGES], empty[STAGES];
  ring_init<STAGES>(full, empty, 1);
  __syncthreads();
  const long nch = bytes / CH;
  const long c0 = blockIdx.x * nch / gridDim.x, c1 = (blockIdx.x + 1) * nch / gridDim.x;
  if (threadIdx.x == 0) {
    u32 it = 0;
    for (long c = c0; c < c1; ++c, ++it) {
      const u32 s = it % STAGES;
      if (it >= (u32)STAGES) bar_wait(&empty[s], ((it / STAGES) - 1) & 1);
      bar_expect(&full[s], CH);
      bulk1d(smem + s * CH, w + c * CH, CH, &full[s]);
    }
  } else if (threadIdx.x == 128) {
    ring_consume<STAGES>(full, empty, smem, CH, (u32)(c1 - c0));
  }
}

// cp.async 16 B by 128 producer threads into a ring of 256-row x 128-byte stages (row-tile order
// as the TMA kernel's), completion through cp.async.mbarrier.arrive.noinc.
template <int STAGES>
__global__ void __launch_bounds__(256, 1) k_cpasync(const unsigned char *w, int tiles) {
  constexpr u32 ST = 256 * 128;
  unsigned char *smem = (unsigned char *)(((u64)smem_raw + 1023) & ~(u64)1023);
  __shared__ alignas(8) u64 full[STAGES], empty[STAGES];
  ring_init<STAGES>(full, empty, 128);
  __syncthreads();
  const int t0 = (int)((long)blockIdx.x * tiles / gridDim.x), t1 = (int)((long)(blockIdx.x + 1) * tiles / gridDim.x);
  const int ksteps = (int)(K / 64);
  const int total = (t1 - t0) * ksteps;
  if (threadIdx.x < 128) {
    const int tid = threadIdx.x;
    u32 it = 0;
    for (int t = t0; t < t1; ++t)
      for (int ks = 0; ks < ksteps; ++ks, ++it) {
        const u32 s = it % STAGES;
        if (it >= (u32)STAGES) bar_wait(&empty[s], ((it / STAGES) - 1) & 1);
        unsigned char *d = smem + s * ST;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int idx = j * 128 + tid, row = idx / 8, ch = idx % 8;
          long grow = (long)t * 256 + row; if (grow >= V) grow = V - 1;
          const unsigned char *src = w + (grow * K + ks * 64) * 2 + ch * 16;
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa(d + row * 128 + ((ch ^ (row & 7)) * 16))), "l"(src) : "memory");
        }
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(sa(&full[s])) : "memory");
      }
  } else if (threadIdx.x == 128) {
    ring_consume<STAGES>(full, empty, smem, ST, (u32)total);
  }
}

// plain 16-byte loads into registers, a contiguous range per block, UNROLL in flight a thread.
template <int UNROLL>
__global__ void __launch_bounds__(512, 1) k_ldg(const uint4 *w, long n16) {
  const long c0 = blockIdx.x * n16 / gridDim.x, c1 = (blockIdx.x + 1) * n16 / gridDim.x;
  unsigned acc = 0;
  for (long i = c0 + threadIdx.x; i < c1; i += (long)blockDim.x * UNROLL) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) { long j = i + (long)u * blockDim.x; v[u] = j < c1 ? __ldcs(w + j) : make_uint4(0,0,0,0); }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].w;
  }
  if (acc == 0xdeadbeef) sink = acc;
}

typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *, const cuuint64_t *,
                              const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static encode_fn enc;
static CUtensorMap mapw(void *w, long rows, int br) {
  CUtensorMap m; cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows}, str[1] = {(cuuint64_t)K * 2};
  cuuint32_t box[2] = {64, (cuuint32_t)br}, es[2] = {1, 1};
  CUresult r = enc(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, w, dims, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r) { printf("encode %d\n", (int)r); exit(1); }
  return m;
}
static double wbytes = (double)V * K * 2;
template <typename F> static double timeit(F launch) {
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch();
  CK(cudaDeviceSynchronize());
  std::vector<float> ts;
  for (int i = 0; i < 15; ++i) { CK(cudaEventRecord(a)); launch(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b)); float ms; CK(cudaEventElapsedTime(&ms, a, b)); ts.push_back(ms); }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end()); return ts[ts.size() / 2];
}
static void report(const char *name, int grid, double ms) { printf("%-44s grid %4d  %8.1f us  %6.2f TB/s  %5.1f GB/s/block\n", name, grid, ms * 1e3, wbytes / ms / 1e9, wbytes / ms / 1e6 / grid); }

template <int BR, int RB, int KB, int ST, bool HB, bool HINT>
static void run_tma(const char *name, void *w, void *h, int grid) {
  CUtensorMap mw = mapw(w, V, BR), mh = mapw(h, 1, 128);
  constexpr int TR = BR * RB; const int tiles = (int)((V + TR - 1) / TR);
  const size_t sm = (size_t)(BR * 128 * RB * KB + (HB ? 16384 : 0)) * ST + 1024;
  auto kf = k_tma<BR, RB, KB, ST, HB, HINT>;
  CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
  double ms = timeit([&] { kf<<<grid, 256, sm>>>(mw, mh, tiles); });
  report(name, grid, ms);
}
int main(int argc, char **argv) {
  int nsm; CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
  cudaDriverEntryPointQueryResult q; CK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", (void **)&enc, cudaEnableDefault, &q));
  void *w, *h; CK(cudaMalloc(&w, (size_t)wbytes + (1 << 20))); CK(cudaMalloc(&h, K * 2));
  CK(cudaMemset(w, 1, (size_t)wbytes)); CK(cudaMemset(h, 1, K * 2));
  char dev[256]; cudaDeviceProp pr; CK(cudaGetDeviceProperties(&pr, 0)); snprintf(dev, sizeof dev, "%s", pr.name);
  printf("%s, %d SMs, W %ld x %ld bf16 = %.3f GB\n", dev, nsm, V, K, wbytes / 1e9);
  int grids[3] = {119, nsm, 2 * nsm};
  for (int gi = 0; gi < 2; ++gi) {
    int g = grids[gi];
    run_tma<256, 1, 1, 4, true, false>("tma 256x64 s4 +hbox (as the head)", w, h, g);
    run_tma<256, 1, 1, 4, false, false>("tma 256x64 s4", w, h, g);
    run_tma<256, 1, 1, 2, false, false>("tma 256x64 s2", w, h, g);
    run_tma<256, 1, 1, 6, false, false>("tma 256x64 s6", w, h, g);
    run_tma<256, 1, 1, 4, false, true>("tma 256x64 s4 evict_first", w, h, g);
    run_tma<256, 1, 2, 3, false, false>("tma 256x64 x2 along K s3", w, h, g);
    run_tma<128, 1, 1, 8, false, false>("tma 128x64 s8", w, h, g);
    run_tma<64, 1, 4, 6, false, false>("tma 64x64 x4 along K s6 (512B/row)", w, h, g);
    run_tma<64, 1, 8, 3, false, false>("tma 64x64 x8 along K s3 (1KB/row)", w, h, g);
    run_tma<64, 4, 1, 4, false, false>("tma 64x64 x4 rows s4", w, h, g);
    run_tma<32, 1, 4, 12, false, false>("tma 32x64 x4 along K s12", w, h, g);
    { size_t sm = 32768 * 4 + 1024; auto kf = k_bulk<32768, 4>; CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
      report("bulk1d 32KB s4", g, timeit([&] { kf<<<g, 256, sm>>>((const unsigned char *)w, (long)wbytes); })); }
    { size_t sm = 16384 * 8 + 1024; auto kf = k_bulk<16384, 8>; CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
      report("bulk1d 16KB s8", g, timeit([&] { kf<<<g, 256, sm>>>((const unsigned char *)w, (long)wbytes); })); }
    { size_t sm = 32768 * 4 + 1024; auto kf = k_cpasync<4>; CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
      report("cp.async 256x128B s4", g, timeit([&] { kf<<<g, 256, sm>>>((const unsigned char *)w, (int)((V + 255) / 256)); })); }
    { size_t sm = 32768 * 6 + 1024; auto kf = k_cpasync<6>; CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
      report("cp.async 256x128B s6", g, timeit([&] { kf<<<g, 256, sm>>>((const unsigned char *)w, (int)((V + 255) / 256)); })); }
    report("ldg 512 thr x8", g, timeit([&] { k_ldg<8><<<g, 512>>>((const uint4 *)w, (long)(wbytes / 16)); }));
  }
  report("ldg 512 thr x8", 4 * nsm, timeit([&] { k_ldg<8><<<4 * nsm, 512>>>((const uint4 *)w, (long)(wbytes / 16)); }));
  run_tma<256, 1, 1, 3, false, false>("tma 256x64 s3 (2 blocks/SM)", w, h, 2 * nsm);
  run_tma<64, 1, 4, 3, false, false>("tma 64x64 x4 along K s3 (2 blocks/SM)", w, h, 2 * nsm);
  return 0;
}

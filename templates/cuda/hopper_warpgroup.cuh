/* hopper_warpgroup.cuh - sm_90 warp and warpgroup helpers, as inline PTX (namespace rlk::sm90):
 * register reallocation between warpgroups, electing one lane, and stmatrix.
 *
 * A warpgroup is 4 consecutive warps (128 threads, the first warp's index a multiple of 4): the
 * unit that issues wgmma (hopper_wgmma.cuh) and that setmaxnreg applies to. */
#ifndef RLK_HOPPER_WARPGROUP_CUH
#define RLK_HOPPER_WARPGROUP_CUH

#include "hopper_mbarrier.cuh"

#if defined(RLK_CUDA)
namespace rlk {
namespace sm90 {

/* The calling thread's warpgroup and its index inside it. */
RLK_DEVICE int warpgroup_index() { return (int)(threadIdx.x / 128); }
RLK_DEVICE int warpgroup_thread() { return (int)(threadIdx.x % 128); }

/* Register reallocation: every thread of the warpgroup calls it with the same REGS (24..256, a
 * multiple of 8). A producer warpgroup gives registers back (dec) so that consumer warpgroups can
 * take them (inc); the kernel's launch bounds fix the per-thread count the block starts with. */
template <int REGS> RLK_DEVICE void setmaxnreg_dec() {
  static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg: 24..256, multiple of 8");
#if defined(RLK_SM90_ASM)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
#endif
}
template <int REGS> RLK_DEVICE void setmaxnreg_inc() {
  static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg: 24..256, multiple of 8");
#if defined(RLK_SM90_ASM)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
#endif
}

/* True in exactly one lane of the (fully active) warp: the same lane in every call. */
RLK_DEVICE bool elect_one() {
#if defined(RLK_SM90_ASM)
  u32 pred = 0;
  asm volatile(
      "{\n\t.reg .b32 lane;\n\t.reg .pred p;\n\t"
      "elect.sync lane|p, 0xffffffff;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(pred));
  return pred != 0;
#else
  return (threadIdx.x % 32) == 0;
#endif
}

/* stmatrix .x4: the warp stores four 8x8 matrices of 16-bit elements. Lane l gives row address
 * `row` for row (l % 8) of matrix (l / 8); r0..r3 are the lane's fragment of matrices 0..3 (two
 * 16-bit elements each: row l / 4, columns 2 (l % 4) and +1 - the layout of an mma / wgmma
 * accumulator converted to 16 bits). TRANS stores each matrix transposed. */
template <bool TRANS = false>
RLK_DEVICE void stmatrix_x4(void *row, u32 r0, u32 r1, u32 r2, u32 r3) {
#if defined(RLK_SM90_ASM)
  if (TRANS)
    asm volatile("stmatrix.sync.aligned.x4.trans.m8n8.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                     smem_addr(row)),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
  else
    asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                     smem_addr(row)),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
#endif
}

/* Two floats as a pair of bf16 (BF16) or f16 (the first in the low half): a 32-bit stmatrix or
 * wgmma register-A element. */
template <bool BF16> RLK_DEVICE u32 pack_half2(float lo, float hi) {
#if defined(RLK_SM90_ASM)
  u32 r;
  if (BF16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  if (BF16) return (u32)to_bf16(lo).bits | ((u32)to_bf16(hi).bits << 16);
  return (u32)to_f16(lo).bits | ((u32)to_f16(hi).bits << 16);
#endif
}

} /* namespace sm90 */
} /* namespace rlk */
#endif /* RLK_CUDA */

#endif /* RLK_HOPPER_WARPGROUP_CUH */

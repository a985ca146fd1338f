/* token_kl.cuh - per-token KL estimates against a reference policy and their gradient
 * (rlk_token_kl): one elementwise pass, grid-stride loops over rows (the grid's and block's y
 * dimension: short rows share a block) and over each row's tokens (x).
 *
 * Per token (kl_estimator.cuh): the estimate of e = logp - ref and its derivative in logp
 * (straight-through: e times w = min(exp(logp - old), w_max), a constant), times the upstream
 * gradient when given and the mask's weight; where the mask is 0 both outputs are 0 whatever
 * the inputs hold. Arithmetic in the inputs' dtype. Template values, in the op's schema order:
 * the dtype, the estimator (rlk_kl_estimator), the mask kind (RLK_SEQ_MASK_*), straight-through,
 * old_logp present, grad_kl present, and which outputs are written (TK_OUT_*). Inputs are never
 * written by the kernel (outputs overlap none): read-only loads. */
#ifndef RLK_TOKEN_KL_CUH
#define RLK_TOKEN_KL_CUH

#include "kl_estimator.cuh"
#include "seq_mask.cuh"
#include "token_kl_params.h"

namespace rlk {

template <typename T, int EST, int MASK, bool ST, bool OLD, bool GIN, int OUT>
__global__ void token_kl(RLK_PARAMS_ARG tk_args p_) {
  const T *logp = (const T *)p_.logp, *ref = (const T *)p_.ref, *old = (const T *)p_.old;
  const T *gin = (const T *)p_.grad_kl;
  T *kl = (T *)p_.kl, *grad = (T *)p_.grad;
  const T in_lo = (T)p_.in_lo, in_hi = (T)p_.in_hi, out_lo = (T)p_.out_lo, out_hi = (T)p_.out_hi;
  const T w_max = (T)p_.w_max, bg = (T)p_.bound_g;
  const i64 B = p_.B, T_ = p_.T;
  const i64 stride = (i64)gridDim.x * blockDim.x, row_stride = (i64)gridDim.y * blockDim.y;
  for (i64 b = (i64)blockIdx.y * blockDim.y + threadIdx.y; b < B; b += row_stride) {
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < T_; t += stride) {
      const float m = seq_mask_weight<MASK, true>(p_.mask, b * p_.mask_stride + t);
      T v = T(0), g = T(0);
      if (m != 0.0f) {
        const T lp = ld_ro(logp + b * p_.logp_stride + t);
        v = kl::estimate<EST, ST>(lp - ld_ro(ref + b * p_.ref_stride + t), in_lo, in_hi, out_lo, out_hi,
                                  bg, &g);
        if (ST && OLD) {
          const T w = exp_(lp - ld_ro(old + b * p_.old_stride + t));
          g = g * (w < w_max ? w : w_max);
        }
        if (GIN) g = g * ld_ro(gin + b * p_.grad_kl_stride + t);
        if (MASK != RLK_SEQ_MASK_NONE) {
          v = v * (T)m;
          g = g * (T)m;
        }
      }
      if (OUT != TK_OUT_GRAD) kl[b * p_.kl_stride + t] = v;
      if (OUT != TK_OUT_KL) grad[b * p_.grad_stride + t] = g;
    }
  }
}

} /* namespace rlk */

#endif /* RLK_TOKEN_KL_CUH */

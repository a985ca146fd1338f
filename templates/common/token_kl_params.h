/* token_kl_params.h - the argument of the token_kl kernel (templates/cuda/token_kl.cuh,
 * templates/host/token_kl.c), filled by src/ops/token_kl.c. Every per-token tensor is [B, T]
 * with its own row stride (a 1-D [N] call is B = 1, T = N); inputs have the spec's dtype and
 * the optional ones (old_logp, grad_kl, mask, kl, grad) are NULL where the spec says absent.
 * The clamps and is_weight_max are run-time values (+-INFINITY: no bound); bound_g is the
 * gradient a clamp passes on its bound. */
#ifndef RLK_TOKEN_KL_PARAMS_H
#define RLK_TOKEN_KL_PARAMS_H

#include "rlk_kl_estimator.h"
#include "rlk_params.h"
#include "rlk_seq_mask.h"

/* The outputs a call writes ("out"): the estimates, their gradient, or both. */
#define RLK_TK_OUTPUTS(X) \
  X(TK_OUT_KL, "kl")      \
  X(TK_OUT_GRAD, "grad")  \
  X(TK_OUT_BOTH, "both")
RLK_PARAMS_ENUM(RLK_TK_OUTPUTS);

#define RLK_TK_PARAMS(F, S_)                                           \
  RLK_PARAMS_STRIDED(F, S_, const void *, logp, logp_stride, 0)        \
  RLK_PARAMS_STRIDED(F, S_, const void *, ref, ref_stride, 16)         \
  RLK_PARAMS_STRIDED(F, S_, const void *, old, old_stride, 32)         \
  RLK_PARAMS_STRIDED(F, S_, const void *, grad_kl, grad_kl_stride, 48) \
  RLK_PARAMS_STRIDED(F, S_, const void *, mask, mask_stride, 64)       \
  RLK_PARAMS_STRIDED(F, S_, void *, kl, kl_stride, 80)                 \
  RLK_PARAMS_STRIDED(F, S_, void *, grad, grad_stride, 96)             \
  F(S_, long long, B, 112)                                             \
  F(S_, long long, T, 120)                                             \
  F(S_, double, in_lo, 128)                                            \
  F(S_, double, in_hi, 136)                                            \
  F(S_, double, out_lo, 144)                                           \
  F(S_, double, out_hi, 152)                                           \
  F(S_, double, w_max, 160)                                            \
  F(S_, double, bound_g, 168)
RLK_PARAMS_DECLARE(tk_args, RLK_TK_PARAMS, 176);

#endif

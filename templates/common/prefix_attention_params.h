/* prefix_attention_params.h - the arguments of the prefix_attention kernels (templates/cuda/
 * prefix_attention.cuh, templates/host/prefix_attention_*.c), filled by src/ops/prefix_attention.c.
 * One struct per pass, shared by every kernel of the pass (portable, mma and host; the sm_90a
 * kernels' holds it after their tensor maps). q, out, dout,
 * dq [T, Hq, D]; k, v, dk, dv [T, Hkv, D] in the spec's 16-bit dtype; lse [T, Hq] f32 (NULL: not
 * written by the forward); seq [S + 1] and grp [P + 1] the packed layout's offsets; scale already
 * resolved (never 0); work the backward's workspace; 4-byte scalars last. */
#ifndef RLK_PREFIX_ATTENTION_PARAMS_H
#define RLK_PREFIX_ATTENTION_PARAMS_H

#include "rlk_params.h"

/* The kernels' tiles and blocks: the templates are written for these, and the op's grids, launch
 * shapes, tensor-map boxes and shared memory follow them. The sm_90a kernels, 384 threads each:
 * the forward's 128-row query tiles over 128-key tiles (pa_sm90), the dk, dv kernel's 128-key tiles
 * over 64-row query tiles (pa_sm90_bwd), the dq kernel's 128-row query tiles over 64-key tiles
 * (pa_sm90_dq); their dynamic shared memory aligned to 1024 bytes, all of it within an SM's
 * 232448 bytes. The mma kernels: 64-row tiles, 128 threads; the portable kernels: 4 warps a
 * block; the backward's prep and reduce passes: 256 threads. */
enum {
  PA_SM90_BM = 128,
  PA_SM90_BN = 128,
  PA_SM90_BQ = 64,
  PA_SM90_DQ_BN = 64,
  PA_SM90_THREADS = 384,
  PA_SM90_ALIGN = 1024,
  PA_SM90_SMEM_LIMIT = 232448,
  PA_TILE = 64,
  PA_MMA_THREADS = 128,
  PA_PORTABLE_WARPS = 4,
  PA_PASS_THREADS = 256
};

/* The elements' dtype ("dtype") of q, k, v and the outputs. */
#define RLK_PA_DTYPES(X)    \
  X(PA_DT_F16, "f16")       \
  X(PA_DT_BF16, "bf16")
RLK_PARAMS_ENUM(RLK_PA_DTYPES);

#define RLK_PA_FWD_PARAMS(F, S_) \
  F(S_, const void *, q, 0)      \
  F(S_, const void *, k, 8)      \
  F(S_, const void *, v, 16)     \
  F(S_, const int *, seq, 24)    \
  F(S_, const int *, grp, 32)    \
  F(S_, long long, P, 40)        \
  F(S_, long long, T, 48)        \
  F(S_, void *, out, 56)         \
  F(S_, float *, lse, 64)        \
  F(S_, int, Hq, 72)             \
  F(S_, int, Hkv, 76)            \
  F(S_, float, scale, 80)
RLK_PARAMS_DECLARE(pa_fwd_args, RLK_PA_FWD_PARAMS, 88);

#define RLK_PA_BWD_PARAMS(F, S_)  \
  F(S_, const void *, q, 0)       \
  F(S_, const void *, k, 8)       \
  F(S_, const void *, v, 16)      \
  F(S_, const void *, o, 24)      \
  F(S_, const void *, dout, 32)   \
  F(S_, const float *, lse, 40)   \
  F(S_, void *, work, 48)         \
  F(S_, const int *, seq, 56)     \
  F(S_, const int *, grp, 64)     \
  F(S_, long long, P, 72)         \
  F(S_, long long, T, 80)         \
  F(S_, void *, dq, 88)           \
  F(S_, void *, dk, 96)           \
  F(S_, void *, dv, 104)          \
  F(S_, int, Hq, 112)             \
  F(S_, int, Hkv, 116)            \
  F(S_, float, scale, 120)
RLK_PARAMS_DECLARE(pa_bwd_args, RLK_PA_BWD_PARAMS, 128);

/* The sm_90a kernels': the tensor maps of q, k, v (and grad_out in the backward) over [T, H * D],
 * boxes of 64 head-dim columns (q and grad_out 64 rows, k and v the kernel's key tile), 128-byte
 * swizzle; then the pass's struct, at the offset the other kernels' parameters start after theirs
 * would. */
#define RLK_PA_SM90_MAPS(F, S_)     \
  F(S_, rlk_tensor_map, map_q, 0)   \
  F(S_, rlk_tensor_map, map_k, 128) \
  F(S_, rlk_tensor_map, map_v, 256)

#define RLK_PA_FWD_SM90_PARAMS(F, S_) \
  RLK_PA_SM90_MAPS(F, S_)             \
  F(S_, pa_fwd_args, pass, 384)
RLK_PARAMS_DECLARE(pa_fwd_sm90_args, RLK_PA_FWD_SM90_PARAMS, 512);

#define RLK_PA_BWD_SM90_PARAMS(F, S_) \
  RLK_PA_SM90_MAPS(F, S_)             \
  F(S_, rlk_tensor_map, map_do, 384)  \
  F(S_, pa_bwd_args, pass, 512)
RLK_PARAMS_DECLARE(pa_bwd_sm90_args, RLK_PA_BWD_SM90_PARAMS, 640);

#endif

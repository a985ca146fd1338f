/* linear_logprob_params.h - the arguments of the linear_logprob kernels (templates/cuda/
 * linear_logprob*.cuh, templates/host/linear_logprob_*.c), filled by src/ops/linear_logprob_fwd.c,
 * _bwd.c, _stored.c and _rows.c.
 * hidden [N, H] and weight [V, H] in the spec's 16-bit dtype with row strides h_stride and
 * w_stride; labels of the spec's label dtype; status NULL or an i32 of bits; 4-byte scalars last.
 * vocab_start: the weight's rows are the columns [vocab_start, vocab_start + V) of a larger
 * vocabulary that labels index (0 unsharded); records: the shard form's output, f32 [N][4]
 * (rlk.h's vocab-parallel record), written instead of logp, lse and entropy when not NULL.
 *   fwd_host   the host forward: logp, lse, entropy per row (any may be NULL)
 *   fwd_tiled  the portable GEMM over (row block, split): a record per (256 columns, row) into
 *              partials [ceil(V / 256)][N]
 *   fwd_sm90   the sm_90a GEMM: as fwd_tiled, hidden and weight reached through tensor maps (the
 *              struct's first fields)
 *   combine    partials [S][N] (S records a row, record_cols columns each) -> logp, lse, entropy;
 *              logits: NULL, or raw f32 logits [N][logits_pitch] the label's logit is read from
 *   bwd_host   the host backward: grad_hidden, grad_weight (either NULL) in their spec dtypes;
 *              scratch: the workspace's fp64 sums (N H doubles with grad_hidden, then H)
 *   bwd_dz     dz [N][Vc] of columns [c0, c0 + Vc): g_lp, g_ent the logp and entropy gradients,
 *              lse and entropy the forward's (entropy only with g_ent), each with its stride
 *   bwd_dh     dh [N][H] (f32) = beta dh + dz [:, :nv] W[c0 : c0 + nv]
 *   bwd_dw     grad_weight[c0 + v] (+)= dz[:, v]^T h for v < nv
 *   bwd_dh_out grad_hidden (+)= dh
 *   bwd_sm90   the sm_90a backward GEMMs (templates/cuda/linear_logprob_bwd_sm90.cuh): an output
 *              of M x Nn over K, tiles_m x tiles_n tiles of 128 x 256; out with row pitch
 *              out_stride is dz (16-bit), dh (f32) or grad_weight (rows from c0), by kind;
 *              accumulate: add to what out holds; out_aux: the logits kind's records
 *              [tiles_n][M]; the rest as bwd_dz; its tensor maps last (the kernel says which
 *              operand each describes)
 *   stored_dz  u [M][V] (16-bit, row pitch u_stride, the logits kind's) to dz in place, with the
 *              records partials [ceil(V / 256)][M]; M rows from a chunk's first (labels, lse,
 *              g_lp, entropy, g_ent contiguous from there)
 *   gather     a row selection's rows (rlk_linear_logprob's `rows`): out [n][pitch] = src's rows
 *              rows[first + j] (j < n), of the spec's dtype; a row index outside [0, src_rows) or
 *              not greater than the one before it gives a row of NaN and LP_STATUS_BAD_ROW
 *   scatter    grad_hidden [N][H] by row: a selected row (found in rows [n], increasing) gets its
 *              row of dh [n][dh_pitch] (f32 on a GPU, grad_hidden's dtype on the host), plus the
 *              value it held when `add`; a row not selected gets 0 when `zero`, else stays
 * The forwards' logits (NULL: none): the raw logits h . w_v as f32 [N][logits_pitch], what
 * rlk_linear_sample draws from; labels may then be NULL (no label's logit in the records).
 * threshold (every kernel that folds or differentiates logits): NULL, or kept-set replay's f32
 * [N] from the kernel's first row: a logit below its row's threshold leaves the softmax, the
 * label stays. */
#ifndef RLK_LINEAR_LOGPROB_PARAMS_H
#define RLK_LINEAR_LOGPROB_PARAMS_H

#include "rlk_float_dtype.h"
#include "rlk_logprob_status.h"
#include "rlk_params.h"

/* The columns of a row's record (a forward split's statistics over them). */
#define RLK_LL_RECORD_COLS 256

/* The stored-logits dz pass: columns of a tile record (the logits kind's tile), 8 columns (16
 * bytes) a vector and RLK_LL_STORED_VECS vectors a thread; the op sizes its grid and the chunks
 * of V from them. */
#define RLK_LL_STORED_TILE 256
#define RLK_LL_STORED_VEC 8
#define RLK_LL_STORED_VECS 4
/* ... and over u^T: blocks of RLK_LL_STORED_T_ROWS rows x RLK_LL_STORED_T_COLS columns */
#define RLK_LL_STORED_T_ROWS 256
#define RLK_LL_STORED_T_COLS 64

/* The kernels' tiles and blocks: the templates are written for these, and the op's grids, launch
 * shapes, tensor-map boxes and shared memory follow them. ll_sm90 (TMA + wgmma, forward and
 * backward): 128 x 256 tiles over K steps of 64, 384 threads, a ring of up to 4 stages of 16-bit A
 * and B, loaded in boxes of 64 rows of 128 bytes; the backward stages its TMA-stored outputs in two
 * such boxes a consumer warpgroup; dynamic shared memory is aligned to 1024 bytes (the 128-byte
 * swizzle's period). The portable kernels: 64 x 64 tiles, 256 threads. */
enum {
  LL_SM90_BM = 128,
  LL_SM90_BN = 256,
  LL_SM90_BK = 64,
  LL_SM90_THREADS = 384,
  LL_SM90_STAGES = 4,
  LL_SM90_STAGE_BYTES = (LL_SM90_BM + LL_SM90_BN) * LL_SM90_BK * 2,
  LL_SM90_BOX_BYTES = 64 * 128,
  LL_SM90_STAGING_BYTES = 2 * 2 * LL_SM90_BOX_BYTES,
  LL_SM90_ALIGN = 1024,
  /* the backward's dynamic shared memory: the ring, the alignment, and the staging where an output
   * leaves by TMA */
  LL_BWD_SM90_SMEM = LL_SM90_STAGES * LL_SM90_STAGE_BYTES + LL_SM90_ALIGN,
  LL_BWD_SM90_SMEM_STAGED = LL_BWD_SM90_SMEM + LL_SM90_STAGING_BYTES,
  LL_TILE = 64,
  LL_THREADS = 256
};

/* The head and the rows it scores, first in every list that reads the head (bytes 0 to 71). */
#define RLK_LL_HEAD(F, S_)                                          \
  RLK_PARAMS_STRIDED(F, S_, const void *, hidden, h_stride, 0)      \
  RLK_PARAMS_STRIDED(F, S_, const void *, weight, w_stride, 16)     \
  RLK_PARAMS_STRIDED(F, S_, const void *, labels, label_stride, 32) \
  F(S_, long long, N, 48)                                           \
  F(S_, long long, V, 56)                                           \
  F(S_, long long, H, 64)

/* A forward's per-row outputs and what shapes them, in both lists that write them (bytes 72 to
 * 143). */
#define RLK_LL_FWD_OUTPUTS(F, S_)    \
  F(S_, long long, ignore_index, 72) \
  F(S_, float *, logp, 80)           \
  F(S_, float *, lse, 88)            \
  F(S_, float *, entropy, 96)        \
  F(S_, int *, status, 104)          \
  F(S_, float *, records, 112)       \
  F(S_, long long, vocab_start, 120) \
  F(S_, float, temperature, 128)     \
  F(S_, const float *, threshold, 136)

/* What a backward reads per row (the forward's lse and entropy, the gradients of logp and
 * entropy, each with its stride), in the three lists that differentiate logits (bytes 72 to
 * 143). */
#define RLK_LL_GRAD_ROWS(F, S_)                                 \
  F(S_, long long, ignore_index, 72)                            \
  RLK_PARAMS_STRIDED(F, S_, const float *, lse, lse_s, 80)      \
  RLK_PARAMS_STRIDED(F, S_, const float *, g_lp, glp_s, 96)     \
  RLK_PARAMS_STRIDED(F, S_, const float *, entropy, ent_s, 112) \
  RLK_PARAMS_STRIDED(F, S_, const float *, g_ent, gent_s, 128)

#define RLK_LL_FWD_HOST_PARAMS(F, S_) \
  RLK_LL_HEAD(F, S_)                  \
  RLK_LL_FWD_OUTPUTS(F, S_)           \
  RLK_PARAMS_STRIDED(F, S_, float *, logits, logits_pitch, 144)
#define RLK_LL_FWD_HOST_PARAMS_SIZE 160

#define RLK_LL_FWD_TILED_PARAMS(F, S_) \
  RLK_LL_HEAD(F, S_)                   \
  F(S_, long long, cols_per_split, 72) \
  F(S_, void *, partials, 80)          \
  F(S_, long long, vocab_start, 88)    \
  F(S_, float, temperature, 96)        \
  F(S_, const float *, threshold, 104) \
  RLK_PARAMS_STRIDED(F, S_, float *, logits, logits_pitch, 112)
RLK_PARAMS_DECLARE(ll_fwd_tiled_args, RLK_LL_FWD_TILED_PARAMS, 128);

/* The sm_90a forward's: the tensor maps of hidden (boxes of h_box_rows rows) and weight, then
 * fwd_tiled's struct (its pointers to hidden and weight unread). h_box_rows is LL_SM90_BM, or
 * for a launch of fewer rows 8, 16, 32 or 64, enough for them: the copies of a K step then land
 * no box of mostly zeros, which at decode sizes is a third of the bytes a stage lands (the rows
 * past it, read by the consumer that holds rows, stay zero from the block's start). cluster: 1, or
 * 2 for a launch in pairs of row blocks (the W map's boxes then 128 rows high). */
#define RLK_LL_FWD_SM90_PARAMS(F, S_) \
  F(S_, rlk_tensor_map, map_h, 0)     \
  F(S_, rlk_tensor_map, map_w, 128)   \
  F(S_, ll_fwd_tiled_args, pass, 256) \
  F(S_, long long, h_box_rows, 384)   \
  F(S_, long long, cluster, 392)
RLK_PARAMS_DECLARE(ll_fwd_sm90_args, RLK_LL_FWD_SM90_PARAMS, 448);

#define RLK_LL_COMBINE_PARAMS(F, S_)                                 \
  F(S_, const void *, partials, 0)                                   \
  F(S_, long long, S, 8)                                             \
  F(S_, long long, record_cols, 16)                                  \
  RLK_PARAMS_STRIDED(F, S_, const float *, logits, logits_pitch, 24) \
  RLK_PARAMS_STRIDED(F, S_, const void *, labels, label_stride, 40)  \
  F(S_, long long, N, 56)                                            \
  F(S_, long long, V, 64)                                            \
  RLK_LL_FWD_OUTPUTS(F, S_)
#define RLK_LL_COMBINE_PARAMS_SIZE 144

#define RLK_LL_BWD_HOST_PARAMS(F, S_)                            \
  RLK_LL_HEAD(F, S_)                                             \
  RLK_LL_GRAD_ROWS(F, S_)                                        \
  RLK_PARAMS_STRIDED(F, S_, void *, grad_hidden, gh_stride, 144) \
  RLK_PARAMS_STRIDED(F, S_, void *, grad_weight, gw_stride, 160) \
  F(S_, int *, status, 176)                                      \
  F(S_, long long, vocab_start, 184)                             \
  F(S_, float, temperature, 192)                                 \
  F(S_, int, accumulate, 196)                                    \
  F(S_, int, shard, 200)                                         \
  F(S_, const float *, threshold, 208)                           \
  F(S_, double *, scratch, 216)
#define RLK_LL_BWD_HOST_PARAMS_SIZE 224

#define RLK_LL_BWD_DZ_PARAMS(F, S_)  \
  RLK_LL_HEAD(F, S_)                 \
  RLK_LL_GRAD_ROWS(F, S_)            \
  F(S_, long long, c0, 144)          \
  F(S_, long long, Vc, 152)          \
  F(S_, float *, dz, 160)            \
  F(S_, int *, status, 168)          \
  F(S_, long long, vocab_start, 176) \
  F(S_, float, temperature, 184)     \
  F(S_, int, shard, 188)             \
  F(S_, const float *, threshold, 192)
#define RLK_LL_BWD_DZ_PARAMS_SIZE 200

/* A portable backward product over a chunk: dz [N][Vc] (f32) of columns [c0, c0 + nv), first
 * in the lists of both products (bytes 0 to 47). */
#define RLK_LL_CHUNK_PRODUCT(F, S_) \
  F(S_, const float *, dz, 0)       \
  F(S_, long long, Vc, 8)           \
  F(S_, long long, nv, 16)          \
  F(S_, long long, c0, 24)          \
  F(S_, long long, N, 32)           \
  F(S_, long long, H, 40)

#define RLK_LL_BWD_DH_PARAMS(F, S_)                             \
  RLK_LL_CHUNK_PRODUCT(F, S_)                                   \
  RLK_PARAMS_STRIDED(F, S_, const void *, weight, w_stride, 48) \
  F(S_, float *, dh, 64)                                        \
  F(S_, float, beta, 72)                                        \
  F(S_, long long, dh_stride, 80)
#define RLK_LL_BWD_DH_PARAMS_SIZE 88

#define RLK_LL_BWD_DW_PARAMS(F, S_)                             \
  RLK_LL_CHUNK_PRODUCT(F, S_)                                   \
  RLK_PARAMS_STRIDED(F, S_, const void *, hidden, h_stride, 48) \
  RLK_PARAMS_STRIDED(F, S_, void *, grad_weight, gw_stride, 64) \
  F(S_, int, accumulate, 80)
#define RLK_LL_BWD_DW_PARAMS_SIZE 88

#define RLK_LL_BWD_DH_OUT_PARAMS(F, S_)                         \
  F(S_, const float *, dh, 0)                                   \
  F(S_, long long, N, 8)                                        \
  F(S_, long long, H, 16)                                       \
  RLK_PARAMS_STRIDED(F, S_, void *, grad_hidden, gh_stride, 24) \
  F(S_, int, accumulate, 40)
#define RLK_LL_BWD_DH_OUT_PARAMS_SIZE 48

#define RLK_LL_BWD_SM90_PARAMS(F, S_)                              \
  RLK_PARAMS_STRIDED(F, S_, const void *, labels, label_stride, 0) \
  F(S_, long long, M, 16)                                          \
  F(S_, long long, Nn, 24)                                         \
  F(S_, long long, K, 32)                                          \
  F(S_, long long, V, 40)                                          \
  F(S_, long long, c0, 48)                                         \
  RLK_PARAMS_STRIDED(F, S_, void *, out, out_stride, 56)           \
  RLK_LL_GRAD_ROWS(F, S_)                                          \
  F(S_, int *, status, 144)                                        \
  F(S_, long long, vocab_start, 152)                               \
  F(S_, float, temperature, 160)                                   \
  F(S_, int, shard, 164)                                           \
  F(S_, int, accumulate, 168)                                      \
  F(S_, int, tiles_m, 172)                                         \
  F(S_, int, tiles_n, 176)                                         \
  F(S_, int, group, 180)                                           \
  F(S_, int, staged, 184)                                          \
  F(S_, void *, out_aux, 192)                                      \
  F(S_, long long, ksplit, 200)                                    \
  F(S_, const float *, threshold, 208)                             \
  F(S_, rlk_tensor_map, map_a, 256)                                \
  F(S_, rlk_tensor_map, map_b, 384)                                \
  F(S_, rlk_tensor_map, map_c, 512)                                \
  F(S_, rlk_tensor_map, map_d, 640)
RLK_PARAMS_DECLARE(ll_bwd_sm90_args, RLK_LL_BWD_SM90_PARAMS, 768);

/* u: row-major [M][V] (u_stride between rows); or, for linear_logprob_stored_dz_t, u^T [V][M]
 * whose lines [0, ksplit) are in u and the rest in u2 at line v - ksplit (strides in elements) */
#define RLK_LL_STORED_DZ_PARAMS(F, S_)                              \
  RLK_PARAMS_STRIDED(F, S_, void *, u, u_stride, 0)                 \
  F(S_, const void *, partials, 16)                                 \
  F(S_, long long, M, 24)                                           \
  F(S_, long long, V, 32)                                           \
  RLK_PARAMS_STRIDED(F, S_, const void *, labels, label_stride, 40) \
  F(S_, long long, ignore_index, 56)                                \
  F(S_, const float *, lse, 64)                                     \
  F(S_, const float *, g_lp, 72)                                    \
  F(S_, const float *, entropy, 80)                                 \
  F(S_, const float *, g_ent, 88)                                   \
  F(S_, float, temperature, 96)                                     \
  RLK_PARAMS_STRIDED(F, S_, void *, u2, u2_stride, 104)             \
  F(S_, long long, ksplit, 120)                                     \
  F(S_, const float *, threshold, 128)
#define RLK_LL_STORED_DZ_PARAMS_SIZE 136

#define RLK_LL_GATHER_PARAMS(F, S_)                              \
  RLK_PARAMS_STRIDED(F, S_, const void *, src, src_stride, 0)    \
  F(S_, long long, src_rows, 16)                                 \
  F(S_, long long, H, 24)                                        \
  RLK_PARAMS_STRIDED(F, S_, const void *, rows, rows_stride, 32) \
  F(S_, long long, first, 48)                                    \
  F(S_, long long, n, 56)                                        \
  RLK_PARAMS_STRIDED(F, S_, void *, out, pitch, 64)              \
  F(S_, int *, status, 80)
#define RLK_LL_GATHER_PARAMS_SIZE 88

#define RLK_LL_SCATTER_PARAMS(F, S_)                             \
  RLK_PARAMS_STRIDED(F, S_, const void *, dh, dh_pitch, 0)       \
  RLK_PARAMS_STRIDED(F, S_, const void *, rows, rows_stride, 16) \
  F(S_, long long, n, 32)                                        \
  F(S_, long long, N, 40)                                        \
  F(S_, long long, H, 48)                                        \
  RLK_PARAMS_STRIDED(F, S_, void *, grad_hidden, gh_stride, 56)  \
  F(S_, int, add, 72)                                            \
  F(S_, int, zero, 76)
#define RLK_LL_SCATTER_PARAMS_SIZE 80

#endif

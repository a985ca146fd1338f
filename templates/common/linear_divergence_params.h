/* linear_divergence_params.h - the arguments of the linear_divergence kernels (templates/cuda/
 * linear_divergence*.cuh, templates/host/linear_divergence_*.c), filled by
 * src/ops/linear_divergence.c. Each head: hidden [N, H] and weight [V, H] in its spec dtype with
 * row strides; s_* the student's, t_* the teacher's. labels NULL or of the spec's label dtype
 * (compared with ignore_index only); stats f32 [N][6] of row stride stats_stride (rlk.h's layout);
 * records f32 [.][N][8] in rlk.h's vocab-parallel units (natural log of z). vocab_start: the
 * weights' rows are the columns [vocab_start, vocab_start + V). zeros: NULL, or N f32 the call
 * sets to 0 (the zero advantages of the loss's rlk_policy_loss call). 8-byte fields first.
 *   fwd_host   the host forward: divergence, stats, entropy per row, or (records) the shard's
 *              record per row; scratch: 2 V doubles of the workspace (a row's two heads' logits)
 *   fwd_tiled  the portable GEMM over (64-row blocks, splits): kind 0 a record per (split, row)
 *              into partials [splits][N]; kind 1 also each split's top_k largest teacher logits
 *              (value, column) into lists [splits][N][top_k]; kind 2 (JSD's second pass, the
 *              lse's from stats) sums {A, B} per (split, row) into partials [splits][N] (16 bytes)
 *   fwd_sm90   the sm_90a GEMM (fwd_tiled's kinds and records; kind 1's lists hold z_t = x_t / T_t),
 *              the heads reached
 *              through tensor maps: the fwd_tiled list (its pointers to the heads unread), the
 *              launch's cut, tiles_m row blocks x tiles_n splits in groups of `group` row blocks,
 *              and the heads' maps
 *   combine    records [S][N] -> the outputs (mode's: JSD and top-k leave D, [3..5] to the next
 *              launch), or (merged not NULL) one merged record per row; S = the shards in
 *              rlk_linear_divergence_combine
 *   jsd_combine  the second pass's records [S][N] {A, B} -> D, stats [3], [4]
 *   topk       a block a row: the splits' lists merged into the top_k set, the student's logits
 *              there, D and stats [3..5]; scaled: the lists hold z_t = x_t / T_t (the sm_90a
 *              forward's), else the raw x_t (the tiled one's)
 *   bwd_host   the host backward: the four gradients (each NULL or of its dtype code, 0 f32,
 *              1 f16, 2 bf16); scratch: the workspace's fp64 sums of the gradients asked for (N Hs,
 *              V Hs, N Ht, V Ht doubles, in that order, those asked for only) and N doubles
 *   bwd_dz     the chunk [c0, c0 + Vc): dz_s and dz_t (either NULL) f32 [N][Vc], each g dD/dz / T
 *   bwd_dz_sm90  the same on sm_90a into 16-bit dz (each head's dtype) through tensor maps (the
 *              list's pointers to the heads and dz unread; the heads' maps, then dz_s's and
 *              dz_t's, last): tiles_m x tiles_n tiles of 128 x 128 walked by persistent blocks,
 *              in groups of `group` rows of tiles */
#ifndef RLK_LINEAR_DIVERGENCE_PARAMS_H
#define RLK_LINEAR_DIVERGENCE_PARAMS_H

#include "rlk_params.h"

/* The divergence ("mode"): forward KL, reverse KL and JSD in rlk_divergence_mode order (the op's
 * setting), then the teacher's top-k (forward KL over its K largest logits), the kernels' fourth. */
#define RLK_LD_DIVERGENCES(X) \
  X(LD_FKL, "forward-kl")     \
  X(LD_RKL, "reverse-kl")     \
  X(LD_JSD, "jsd")
#define RLK_LD_MODES(X) \
  RLK_LD_DIVERGENCES(X) \
  X(LD_TOPK, "topk")
RLK_PARAMS_ENUM(RLK_LD_MODES);

/* The labels ("labels"): none (no ignored rows), i32 or i64. */
#define RLK_LD_LABELS(X) \
  X(LD_LAB_NONE, "none") \
  X(LD_LAB_I32, "i32")   \
  X(LD_LAB_I64, "i64")
RLK_PARAMS_ENUM(RLK_LD_LABELS);

/* The tiled and sm_90a forwards' product ("kind"): a row's statistics over a split, those and the
 * split's list of the teacher's largest logits, or JSD's second pass. */
enum { LD_KIND_STATS, LD_KIND_TOPK, LD_KIND_JSD };

/* The longest top-k list, RLK_LINEAR_DIVERGENCE_TOP_K_MAX (the op checks they agree), and the most
candidates the set's block ranks (splits x top_k: the op keeps the splits within it). */
enum { LD_TOPK_MAX = 32, LD_TOPK_CANDS = 2048 };

/* Floats a row's record (a split's state) and a row's statistics: rlk.h's
 * RLK_LINEAR_DIVERGENCE_PARTIAL_FIELDS and RLK_LINEAR_DIVERGENCE_STATS (the op checks they agree). */
enum { LD_RECORD = 8, LD_STATS = 6 };

/* The kernels' tiles and blocks: the templates are written for these, and the op's grids, launch
 * shapes, tensor-map boxes and shared memory follow them. The sm_90a kernels (ld_sm90): 128 rows x
 * 128 columns a head over K steps of 64, 384 threads, a ring of 6 stages of 16-bit A and B, dz
 * staged for its TMA stores in two boxes of 64 rows of 128 bytes a consumer warpgroup, dynamic
 * shared memory aligned to 1024 bytes. The portable kernels: 64 x 64 tiles, 256 threads. */
enum { LD_SM90_BM = 128, LD_SM90_BN = 128, LD_SM90_BK = 64, LD_SM90_THREADS = 384, LD_SM90_STAGES = 6 };
enum { LD_SM90_STAGE_BYTES = (LD_SM90_BM + LD_SM90_BN) * LD_SM90_BK * 2, LD_SM90_STAGING_BYTES = 2 * 2 * 64 * 128 };
enum { LD_SM90_ALIGN = 1024, LD_SM90_FWD_SMEM = LD_SM90_STAGES * LD_SM90_STAGE_BYTES + LD_SM90_ALIGN };
enum { LD_SM90_DZ_SMEM = LD_SM90_FWD_SMEM + LD_SM90_STAGING_BYTES, LD_TILE = 64, LD_THREADS = 256 };
/* The sm_90a kernels run as clusters of blocks that share each W box: row blocks of one split (the
 * forward) or of one column tile (dz), each block copying its part of every W box into all of them
 * (multicast), so that a cluster reads W from L2 once where its blocks apart would read it once each
 * (at 64 FLOP a byte the two-head tile is bound by L2's bandwidth). A kernel value: the forward's
 * 1, 2 or LD_SM90_FWD_CLUSTER_MAX, dz's 1 or LD_SM90_DZ_CLUSTER (its persistent blocks all
 * resident: quads would leave multiprocessors idle); the op picks them by the row blocks
 * (linear_divergence.c). Launches hold whole clusters of row blocks, the last with blocks of no
 * rows. */
enum { LD_SM90_FWD_CLUSTER_MAX = 4, LD_SM90_DZ_CLUSTER = 2 };

/* The two heads, first in every list that reads them (bytes 0 to 63). */
#define RLK_LD_HEADS(F, S_)                                         \
  RLK_PARAMS_STRIDED(F, S_, const void *, s_hidden, s_h_stride, 0)  \
  RLK_PARAMS_STRIDED(F, S_, const void *, s_weight, s_w_stride, 16) \
  RLK_PARAMS_STRIDED(F, S_, const void *, t_hidden, t_h_stride, 32) \
  RLK_PARAMS_STRIDED(F, S_, const void *, t_weight, t_w_stride, 48)

/* The rows and the heads' shapes, after the heads in the lists that read labels (bytes 64 to
 * 119). */
#define RLK_LD_ROWS(F, S_)                                          \
  RLK_PARAMS_STRIDED(F, S_, const void *, labels, label_stride, 64) \
  F(S_, long long, N, 80)                                           \
  F(S_, long long, V, 88)                                           \
  F(S_, long long, Hs, 96)                                          \
  F(S_, long long, Ht, 104)                                         \
  F(S_, long long, ignore_index, 112)

/* What the backward reads per row, after the heads in both backward lists (bytes 64 to 151). */
#define RLK_LD_BWD_ROWS(F, S_)                                       \
  RLK_LD_ROWS(F, S_)                                                 \
  RLK_PARAMS_STRIDED(F, S_, const float *, stats, stats_stride, 120) \
  RLK_PARAMS_STRIDED(F, S_, const float *, g, g_stride, 136)

/* The vocabulary's offset and the divergence's constants, from byte o (a multiple of 8): the
 * last fields of the lists that fold logits over the vocabulary. */
#define RLK_LD_TEMPERATURES(F, S_, o)   \
  F(S_, long long, vocab_start, (o))    \
  F(S_, double, beta, (o) + 8)          \
  F(S_, float, s_temperature, (o) + 16) \
  F(S_, float, t_temperature, (o) + 20)

#define RLK_LD_FWD_HOST_PARAMS(F, S_) \
  RLK_LD_HEADS(F, S_)                 \
  RLK_LD_ROWS(F, S_)                  \
  F(S_, float *, divergence, 120)     \
  F(S_, float *, stats, 128)          \
  F(S_, float *, entropy, 136)        \
  F(S_, float *, zeros, 144)          \
  F(S_, float *, records, 152)        \
  RLK_LD_TEMPERATURES(F, S_, 160)     \
  F(S_, long long, top_k, 184)        \
  F(S_, double *, scratch, 192)
RLK_PARAMS_DECLARE(ld_fwd_host_args, RLK_LD_FWD_HOST_PARAMS, 200);

#define RLK_LD_FWD_TILED_PARAMS(F, S_) \
  RLK_LD_HEADS(F, S_)                  \
  F(S_, long long, N, 64)              \
  F(S_, long long, V, 72)              \
  F(S_, long long, Hs, 80)             \
  F(S_, long long, Ht, 88)             \
  F(S_, long long, cols_per_split, 96) \
  F(S_, void *, partials, 104)         \
  F(S_, void *, lists, 112)            \
  F(S_, long long, top_k, 120)         \
  F(S_, const float *, stats, 128)     \
  RLK_LD_TEMPERATURES(F, S_, 136)
RLK_PARAMS_DECLARE(ld_fwd_tiled_args, RLK_LD_FWD_TILED_PARAMS, 160);

/* The sm_90a kernels' walk over tiles_m x tiles_n (the forward: row blocks x splits), in groups of
 * `group` rows of them, from byte o. */
#define RLK_LD_SM90_TILES(F, S_, o) \
  F(S_, int, tiles_m, (o))          \
  F(S_, int, tiles_n, (o) + 4)      \
  F(S_, int, group, (o) + 8)

/* The tensor maps of the heads (s_hidden, s_weight, t_hidden, t_weight, 64 x 128 boxes), from
 * byte o (a multiple of 64). */
#define RLK_LD_SM90_HEAD_MAPS(F, S_, o)    \
  F(S_, rlk_tensor_map, map_hs, (o))       \
  F(S_, rlk_tensor_map, map_ws, (o) + 128) \
  F(S_, rlk_tensor_map, map_ht, (o) + 256) \
  F(S_, rlk_tensor_map, map_wt, (o) + 384)

#define RLK_LD_FWD_SM90_PARAMS(F, S_) \
  RLK_LD_FWD_TILED_PARAMS(F, S_)      \
  RLK_LD_SM90_TILES(F, S_, 160)       \
  RLK_LD_SM90_HEAD_MAPS(F, S_, 192)
RLK_PARAMS_DECLARE(ld_fwd_sm90_args, RLK_LD_FWD_SM90_PARAMS, 704);

/* A merge of S per-row partials ([S][N]) into the outputs: what both combines start with (bytes 0
 * to 63). */
#define RLK_LD_MERGE(F, S_)                                         \
  F(S_, const void *, records, 0)                                   \
  F(S_, long long, S, 8)                                            \
  F(S_, long long, N, 16)                                           \
  RLK_PARAMS_STRIDED(F, S_, const void *, labels, label_stride, 24) \
  F(S_, long long, ignore_index, 40)                                \
  F(S_, float *, divergence, 48)                                    \
  F(S_, float *, stats, 56)

#define RLK_LD_COMBINE_PARAMS(F, S_) \
  RLK_LD_MERGE(F, S_)                \
  F(S_, float *, entropy, 64)        \
  F(S_, float *, zeros, 72)          \
  F(S_, float *, merged, 80)
RLK_PARAMS_DECLARE(ld_combine_args, RLK_LD_COMBINE_PARAMS, 88);

#define RLK_LD_JSD_COMBINE_PARAMS(F, S_) \
  RLK_LD_MERGE(F, S_)                    \
  F(S_, double, beta, 64)
RLK_PARAMS_DECLARE(ld_jsd_combine_args, RLK_LD_JSD_COMBINE_PARAMS, 72);

#define RLK_LD_TOPK_PARAMS(F, S_)                                   \
  F(S_, const void *, lists, 0)                                     \
  F(S_, long long, S, 8)                                            \
  F(S_, long long, N, 16)                                           \
  F(S_, long long, top_k, 24)                                       \
  RLK_PARAMS_STRIDED(F, S_, const void *, s_hidden, s_h_stride, 32) \
  RLK_PARAMS_STRIDED(F, S_, const void *, s_weight, s_w_stride, 48) \
  F(S_, long long, Hs, 64)                                          \
  RLK_PARAMS_STRIDED(F, S_, const void *, labels, label_stride, 72) \
  F(S_, long long, ignore_index, 88)                                \
  F(S_, float *, divergence, 96)                                    \
  F(S_, float *, stats, 104)                                        \
  F(S_, float, s_temperature, 112)                                  \
  F(S_, float, t_temperature, 116)                                  \
  F(S_, long long, scaled, 120)
RLK_PARAMS_DECLARE(ld_topk_args, RLK_LD_TOPK_PARAMS, 128);

#define RLK_LD_BWD_HOST_PARAMS(F, S_)                     \
  RLK_LD_HEADS(F, S_)                                     \
  RLK_LD_BWD_ROWS(F, S_)                                  \
  RLK_PARAMS_STRIDED(F, S_, void *, gsh, gsh_stride, 152) \
  RLK_PARAMS_STRIDED(F, S_, void *, gsw, gsw_stride, 168) \
  RLK_PARAMS_STRIDED(F, S_, void *, gth, gth_stride, 184) \
  RLK_PARAMS_STRIDED(F, S_, void *, gtw, gtw_stride, 200) \
  F(S_, long long, gsh_dt, 216)                           \
  F(S_, long long, gsw_dt, 224)                           \
  F(S_, long long, gth_dt, 232)                           \
  F(S_, long long, gtw_dt, 240)                           \
  F(S_, long long, accumulate, 248)                       \
  RLK_LD_TEMPERATURES(F, S_, 256)                         \
  F(S_, double *, scratch, 280)
RLK_PARAMS_DECLARE(ld_bwd_host_args, RLK_LD_BWD_HOST_PARAMS, 288);

#define RLK_LD_BWD_DZ_PARAMS(F, S_) \
  RLK_LD_HEADS(F, S_)               \
  RLK_LD_BWD_ROWS(F, S_)            \
  F(S_, long long, c0, 152)         \
  F(S_, long long, Vc, 160)         \
  F(S_, float *, dz_s, 168)         \
  F(S_, float *, dz_t, 176)         \
  RLK_LD_TEMPERATURES(F, S_, 184)
RLK_PARAMS_DECLARE(ld_bwd_dz_args, RLK_LD_BWD_DZ_PARAMS, 208);

#define RLK_LD_BWD_DZ_SM90_PARAMS(F, S_) \
  RLK_LD_BWD_DZ_PARAMS(F, S_)            \
  RLK_LD_SM90_TILES(F, S_, 208)          \
  RLK_LD_SM90_HEAD_MAPS(F, S_, 256)      \
  F(S_, rlk_tensor_map, map_zs, 768)     \
  F(S_, rlk_tensor_map, map_zt, 896)
RLK_PARAMS_DECLARE(ld_bwd_dz_sm90_args, RLK_LD_BWD_DZ_SM90_PARAMS, 1024);

#endif

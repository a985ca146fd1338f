/* token_baseline_params.h - the arguments of the two token_baseline kernels (templates/cuda/
 * token_baseline.cuh, templates/host/token_baseline_*.c), filled by src/ops/token_baseline.c.
 *   scan:     per row: returns (reverse cumsum of rewards x mask, into `returns`, row stride
 *             returns_stride), the cumulative path weights W (into w_buf) and the valid-token
 *             count (into len); compact mode also packs each row's valid tokens: their column
 *             (pos), W (w_buf) and return (g_buf) at index k, and writes 0 to masked advantages.
 *             Inputs have the dtype of the spec; isw may be NULL (the spec says whether it is read).
 *   baseline: per group and column (or valid-token index): the baseline over the group's members
 *             and the advantages; groups fixed (group_size) or by offsets (i32 or i64, as the spec
 *             says); eps in the inputs' dtype; zero_tail: the unique longest member's baseline is 0
 *             from the second-longest length on.
 * Workspace arrays are [B, T] with row stride T (w_buf, g_buf, pos) and [B] (len). */
#ifndef RLK_TOKEN_BASELINE_PARAMS_H
#define RLK_TOKEN_BASELINE_PARAMS_H

#include "rlk_params.h"
#include "rlk_seq_mask.h"

/* How rows form groups ("offsets"): group_size consecutive rows, or offsets of i32 or i64. */
#define RLK_TB_OFFSETS(X)      \
  X(TB_OFFSETS_FIXED, "fixed") \
  X(TB_OFFSETS_I32, "i32")     \
  X(TB_OFFSETS_I64, "i64")
RLK_PARAMS_ENUM(RLK_TB_OFFSETS);

/* Lanes of a row's team in the GPU scan (the op launches blocks of whole teams); the host scans
 * in chunks of as many elements, so that it sums in the GPU's order. */
enum { TB_TEAM = 32 };

#define RLK_TB_SCAN_PARAMS(F, S_)                                    \
  RLK_PARAMS_STRIDED(F, S_, const void *, rewards, reward_stride, 0) \
  RLK_PARAMS_STRIDED(F, S_, const void *, mask, mask_stride, 16)     \
  RLK_PARAMS_STRIDED(F, S_, const void *, old_logp, logp_stride, 32) \
  RLK_PARAMS_STRIDED(F, S_, const void *, sum_pi_sq, sps_stride, 48) \
  RLK_PARAMS_STRIDED(F, S_, const void *, isw, isw_stride, 64)       \
  RLK_PARAMS_STRIDED(F, S_, void *, returns, returns_stride, 80)     \
  RLK_PARAMS_STRIDED(F, S_, void *, adv, adv_stride, 96)             \
  F(S_, void *, w_buf, 112)                                          \
  F(S_, void *, g_buf, 120)                                          \
  F(S_, int *, pos, 128)                                             \
  F(S_, int *, len, 136)                                             \
  F(S_, long long, B, 144)                                           \
  F(S_, long long, T, 152)
RLK_PARAMS_DECLARE(tb_scan_args, RLK_TB_SCAN_PARAMS, 160);

#define RLK_TB_BASELINE_PARAMS(F, S_)                                 \
  RLK_PARAMS_STRIDED(F, S_, const void *, returns, returns_stride, 0) \
  RLK_PARAMS_STRIDED(F, S_, const void *, mask, mask_stride, 16)      \
  F(S_, const void *, w_buf, 32)                                      \
  F(S_, const void *, g_buf, 40)                                      \
  F(S_, const int *, pos, 48)                                         \
  F(S_, const int *, len, 56)                                         \
  RLK_PARAMS_STRIDED(F, S_, void *, adv, adv_stride, 64)              \
  F(S_, long long, B, 80)                                             \
  F(S_, long long, T, 88)                                             \
  F(S_, long long, group_size, 96)                                    \
  F(S_, long long, num_groups, 104)                                   \
  F(S_, const void *, offsets, 112)                                   \
  F(S_, double, eps, 120)                                             \
  F(S_, int, zero_tail, 128)
RLK_PARAMS_DECLARE(tb_baseline_args, RLK_TB_BASELINE_PARAMS, 136);

#endif

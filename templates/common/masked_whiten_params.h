/* masked_whiten_params.h - the arguments of the masked_whiten kernels (templates/cuda/
 * masked_whiten.cuh, templates/host/masked_whiten.c), filled by src/ops/masked_whiten.c.
 *   stats: x [B, T] (row stride xs), mask of kind mask_kind (RLK_SEQ_MASK_*; NULL with none, row
 *          stride ms) -> partials, (count, mean, M2) per block of the launch
 *   apply: the same inputs and the nparts partials -> out (row stride os); eps, count_eps and
 *          flags (MW_FLAG_*); stats (mean, var, count) or NULL. The host
 *          kernel takes this one too and ignores the partials. */
#ifndef RLK_MASKED_WHITEN_PARAMS_H
#define RLK_MASKED_WHITEN_PARAMS_H

#include "rlk_params.h"
#include "rlk_seq_mask.h"

/* The apply kernel's run-time flags, bits of its `flags` field. */
enum {
  MW_FLAG_UNBIASED = 1,    /* Bessel's N / (N - 1) */
  MW_FLAG_EPS_CLAMP = 2,   /* rsqrt(max(var, eps)) instead of rsqrt(var + eps) */
  MW_FLAG_KEEP_MEAN = 4,   /* add the mean back (shift_mean = 0) */
  MW_FLAG_NO_STD = 8,      /* centre only */
  MW_FLAG_MASKED_ZERO = 16 /* masked positions get 0 */
};

#define RLK_MW_STATS_PARAMS(F, S_) \
  F(S_, const void *, x, 0)        \
  F(S_, long long, xs, 8)          \
  F(S_, const void *, mask, 16)    \
  F(S_, long long, ms, 24)         \
  F(S_, long long, B, 32)          \
  F(S_, long long, T, 40)          \
  F(S_, double *, partials, 48)    \
  F(S_, int, mask_kind, 56)
RLK_PARAMS_DECLARE(mw_stats_args, RLK_MW_STATS_PARAMS, 64);

#define RLK_MW_APPLY_PARAMS(F, S_)    \
  F(S_, const void *, x, 0)           \
  F(S_, long long, xs, 8)             \
  F(S_, const void *, mask, 16)       \
  F(S_, long long, ms, 24)            \
  F(S_, void *, out, 32)              \
  F(S_, long long, os, 40)            \
  F(S_, long long, B, 48)             \
  F(S_, long long, T, 56)             \
  F(S_, const double *, partials, 64) \
  F(S_, double, eps, 72)              \
  F(S_, double, count_eps, 80)        \
  F(S_, double *, stats, 88)          \
  F(S_, int, mask_kind, 96)           \
  F(S_, int, nparts, 100)             \
  F(S_, int, flags, 104)
RLK_PARAMS_DECLARE(mw_apply_args, RLK_MW_APPLY_PARAMS, 112);

#endif

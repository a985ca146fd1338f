/* advantage_scan_params.h - the argument of the advantage_scan kernel (templates/cuda/
 * advantage_scan.cuh, templates/host/advantage_scan.c), filled by src/ops/advantage_scan.c:
 * x0, x1 rewards and values (x1 unused for returns), o0, o1 the outputs, each with its row
 * stride in elements; mask of kind mask_kind (RLK_SEQ_MASK_*; NULL with none); baseline per row
 * (ReMax) or NULL; gamma and gamma * lambda formed in double; masked: the masked-position
 * semantics of the family. */
#ifndef RLK_ADVANTAGE_SCAN_PARAMS_H
#define RLK_ADVANTAGE_SCAN_PARAMS_H

#include "rlk_params.h"
#include "rlk_seq_mask.h"

/* The scan ("family"): GAE, or discounted returns. */
#define RLK_AS_FAMILIES(X)          \
  X(AS_FAMILY_GAE, "gae")           \
  X(AS_FAMILY_RETURNS, "returns")
RLK_PARAMS_ENUM(RLK_AS_FAMILIES);

/* The kernel ("algo"): a warp per row, or a block per row. */
#define RLK_AS_ALGOS(X)       \
  X(AS_ALGO_WARP, "warp")     \
  X(AS_ALGO_BLOCK, "block")
RLK_PARAMS_ENUM(RLK_AS_ALGOS);

/* The masked-position semantics (the run-time field masked), in rlk_gae_masked and
 * rlk_returns_masked order: GAE skip (verl) or zero (OpenRLHF); returns reset (verl
 * REINFORCE++), zero (OpenRLHF, reverse cumulative sums) or carry. */
#define RLK_AS_GAE_MASKED(X)  \
  X(AS_GAE_SKIP, "skip")      \
  X(AS_GAE_ZERO, "zero")
RLK_PARAMS_ENUM(RLK_AS_GAE_MASKED);
#define RLK_AS_RETURNS_MASKED(X)    \
  X(AS_RETURNS_RESET, "reset")      \
  X(AS_RETURNS_ZERO, "zero")        \
  X(AS_RETURNS_CARRY, "carry")
RLK_PARAMS_ENUM(RLK_AS_RETURNS_MASKED);

#define RLK_ADVANTAGE_SCAN_PARAMS(F, S_) \
  F(S_, const void *, x0, 0)             \
  F(S_, long long, s0, 8)                \
  F(S_, const void *, x1, 16)            \
  F(S_, long long, s1, 24)               \
  F(S_, const void *, mask, 32)          \
  F(S_, long long, ms, 40)               \
  F(S_, void *, o0, 48)                  \
  F(S_, long long, os0, 56)              \
  F(S_, void *, o1, 64)                  \
  F(S_, long long, os1, 72)              \
  F(S_, const void *, baseline, 80)      \
  F(S_, long long, B, 88)                \
  F(S_, long long, T, 96)                \
  F(S_, double, gamma, 104)              \
  F(S_, double, gamma_lambda, 112)       \
  F(S_, int, mask_kind, 120)             \
  F(S_, int, masked, 124)
RLK_PARAMS_DECLARE(as_args, RLK_ADVANTAGE_SCAN_PARAMS, 128);

#endif

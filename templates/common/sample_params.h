/* sample_params.h - the argument of the sample kernels (templates/cuda/sample.cuh and
 * sample_split.cuh, templates/host/sample.c), filled by src/ops/sample.c. Pointers to per-row
 * settings are NULL where the scalar applies to every row; top_ks32 / top_ks64 is the one of
 * rlk_sample_args.top_ks's dtype; tokens are of the spec's token dtype. */
#ifndef RLK_SAMPLE_PARAMS_H
#define RLK_SAMPLE_PARAMS_H

#include "rlk_params.h"

#define RLK_SAMPLE_PARAMS(F, T)                     \
  F(T, const void *, logits, 0)                     \
  F(T, long long, row_stride, 8)                    \
  F(T, long long, B, 16)                            \
  F(T, long long, V, 24)                            \
  F(T, const float *, temperatures, 32)             \
  F(T, const int *, top_ks32, 40)                   \
  F(T, const long long *, top_ks64, 48)             \
  F(T, long long, top_k, 56)                        \
  F(T, const float *, top_ps, 64)                   \
  F(T, const float *, min_ps, 72)                   \
  F(T, const unsigned long long *, seeds, 80)       \
  F(T, unsigned long long, seed, 88)                \
  F(T, const unsigned long long *, offsets, 96)     \
  F(T, unsigned long long, offset, 104)             \
  F(T, void *, tokens, 112)                         \
  F(T, float *, logp, 120)                          \
  F(T, float *, logp_filtered, 128)                 \
  F(T, int *, status, 136)                          \
  F(T, float, temperature, 144)                     \
  F(T, float, top_p, 148)                           \
  F(T, float, min_p, 152)
#define RLK_SAMPLE_PARAMS_SIZE 160

#endif

/* sample_params.h - the argument of the sample kernels (templates/cuda/sample.cuh and
 * sample_split.cuh, templates/host/sample.c), filled by src/ops/sample.c. Pointers to per-row
 * settings are NULL where the scalar applies to every row; top_ks32 / top_ks64 is the one of
 * rlk_sample_args.top_ks's dtype; tokens are of the spec's token dtype; threshold (NULL: not
 * asked) the smallest logit of a row's kept set. */
#ifndef RLK_SAMPLE_PARAMS_H
#define RLK_SAMPLE_PARAMS_H

#include "rlk_float_dtype.h"
#include "rlk_params.h"

/* The bits the kernels OR into the caller's status word: include/rlk.h's RLK_SAMPLE_STATUS_* (the
 * op checks they agree). */
enum { SMP_STATUS_NAN = 1, SMP_STATUS_NO_TOKEN = 2, SMP_STATUS_BAD_PARAM = 4 };

#define RLK_SAMPLE_PARAMS(F, S_)                                 \
  RLK_PARAMS_STRIDED(F, S_, const void *, logits, row_stride, 0) \
  F(S_, long long, B, 16)                                        \
  F(S_, long long, V, 24)                                        \
  F(S_, const float *, temperatures, 32)                         \
  F(S_, const int *, top_ks32, 40)                               \
  F(S_, const long long *, top_ks64, 48)                         \
  F(S_, long long, top_k, 56)                                    \
  F(S_, const float *, top_ps, 64)                               \
  F(S_, const float *, min_ps, 72)                               \
  F(S_, const unsigned long long *, seeds, 80)                   \
  F(S_, unsigned long long, seed, 88)                            \
  F(S_, const unsigned long long *, offsets, 96)                 \
  F(S_, unsigned long long, offset, 104)                         \
  F(S_, void *, tokens, 112)                                     \
  F(S_, float *, logp, 120)                                      \
  F(S_, float *, logp_filtered, 128)                             \
  F(S_, int *, status, 136)                                      \
  F(S_, float *, threshold, 144)                                 \
  F(S_, float, temperature, 152)                                 \
  F(S_, float, top_p, 156)                                       \
  F(S_, float, min_p, 160)
#define RLK_SAMPLE_PARAMS_SIZE 168

/* top_p in the kernels' fixed point: floor(top_p 2^32) steps of 2^-32, at least one. A top_p below
 * 2^-32 keeps what 2^-32 keeps, the largest logit and its ties (0 steps would ask for a mass of 0,
 * which no boundary bin holds: the select then kept every token). */
#define RLK_SAMPLE_TOP_P_STEPS(p) ((p) * 4294967296.0f >= 1.0f ? (unsigned long long)((p) * 4294967296.0f) : 1ull)

#endif

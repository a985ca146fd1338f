/* prefix_attention_common.h - what the host prefix-attention kernels share: element loads and
 * stores, and which keys a query sees in the packed [prefix | r_1 | ... | r_G] layout (see
 * include/rlk.h). The host computes in fp64 and rounds once per output element: it is the
 * reference path that the GPU kernels are held to. */
#ifndef RLK_PREFIX_ATTENTION_COMMON_H
#define RLK_PREFIX_ATTENTION_COMMON_H

#include <math.h>

#include "rlk_host_prelude.h"
#include "prefix_attention_params.h"

static inline double pa_load(const uint16_t *p, rlk_i64 i) {
  return RLK_P_DTYPE == PA_DT_BF16 ? (double)rlk_bf16_to_float(p[i]) : (double)rlk_f16_to_float(p[i]);
}

static inline void pa_store(uint16_t *p, rlk_i64 i, double x) {
  /* fp64 -> fp32 -> 16 bits rounds twice; the fp32 step is exact to 2^-24, far below the
   * 16-bit format's half ulp except at exact ties, which random data does not hit. */
  p[i] = RLK_P_DTYPE == PA_DT_BF16 ? rlk_float_to_bf16((float)x) : rlk_float_to_f16((float)x);
}

/* One more score x into a row's running maximum m and sum l of exp(score - m). */
static inline void pa_online_add(double *m, double *l, double x) {
  if (x > *m) {
    *l = *l * exp(*m - x) + 1.0;
    *m = x;
  } else {
    *l += exp(x - *m);
  }
}

/* x . the n elements at p */
static inline double pa_dot(const double *x, const uint16_t *p, int n) {
  double s = 0.0;
  for (int d = 0; d < n; d++) s += x[d] * pa_load(p, d);
  return s;
}

/* The keys of query token i: [a0, a1) then [b0, b1) (either may be empty). */
typedef struct pa_keys {
  rlk_i64 a0, a1, b0, b1;
} pa_keys;

/* Keys of token i of segment s of a prompt whose prefix is segment g. */
static inline pa_keys pa_keys_of(const int32_t *seq, rlk_i64 g, rlk_i64 s, rlk_i64 i) {
  pa_keys r;
  r.a0 = seq[g];
  if (s == g) {
    r.a1 = i + 1;
    r.b0 = r.b1 = 0;
  } else {
    r.a1 = seq[g + 1];
    r.b0 = seq[s];
    r.b1 = i + 1;
  }
  return r;
}

/* Calls visit(args, i, keys of i) for each query token i in the order both passes take them
 * (the backward's sums depend on it): the prompts, each prompt's segments from its prefix on,
 * each segment's tokens. */
static inline void pa_each_query(const int32_t *seq, const int32_t *grp, rlk_i64 P,
                                 void (*visit)(const void *args, rlk_i64 i, pa_keys ks), const void *args) {
  for (rlk_i64 p = 0; p < P; p++) {
    const rlk_i64 g = grp[p];
    for (rlk_i64 s = g; s < grp[p + 1]; s++)
      for (rlk_i64 i = seq[s]; i < seq[s + 1]; i++) visit(args, i, pa_keys_of(seq, g, s, i));
  }
}

#endif

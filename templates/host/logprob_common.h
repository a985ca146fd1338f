/* logprob_common.h - what the host logprob kernels share (see templates/cuda/logprob_common.cuh
 * for the math): loads and stores of one element (of an RLK_DT_* code), and the f32 online
 * state. The host runs the GPU's algorithm with the same f32 accumulation; its exponentials are libm's exp2f where the GPU uses the hardware approximation. */
#ifndef RLK_LOGPROB_COMMON_H
#define RLK_LOGPROB_COMMON_H

#include <math.h>

#include "rlk_float_dtype.h"
#include "rlk_host_prelude.h"


#define LP_LOG2E 1.4426950408889634f
#define LP_LN2 0.69314718055994531f
#define LP_BIG 3.0e38f
/* Elements per chunk: what one GPU thread folds in at once (4 vectors of 16-bit logits). */
#define LP_CHUNK 32

static inline size_t lp_dt_bytes(int dt) { return dt == RLK_DT_F32 ? 4 : 2; }

static inline float lp_load(const void *row, int dt, rlk_i64 j) {
  switch (dt) {
  case RLK_DT_F32:
    return ((const float *)row)[j];
  case RLK_DT_F16:
    return rlk_f16_to_float(((const uint16_t *)row)[j]);
  default:
    return rlk_bf16_to_float(((const uint16_t *)row)[j]);
  }
}

static inline void lp_store(void *row, int dt, rlk_i64 j, float g) {
  switch (dt) {
  case RLK_DT_F32:
    ((float *)row)[j] = g;
    break;
  case RLK_DT_F16:
    ((uint16_t *)row)[j] = rlk_float_to_f16(g);
    break;
  default:
    ((uint16_t *)row)[j] = rlk_float_to_bf16(g);
    break;
  }
}

/* The running maximum m of the raw logits, s = sum 2^((x - m) c), q = sum 2^((x - m) c) (x - m) c. */
typedef struct lp_state {
  float m, s, q;
} lp_state;

/* Moves the maximum up to cm (> st->m). Terms that the move takes to 0 take their part of q with
 * them: d s may overflow there (a logit at -FLT_MAX below a larger one), and 0 * -inf is NaN. A
 * NaN s stays NaN. */
static inline void lp_raise_max(lp_state *st, float cm, float c, int entropy) {
  if (st->s != 0.0f) {
    const float d = (st->m - cm) * c;
    const float f = exp2f(d);
    if (entropy) st->q = f == 0.0f ? 0.0f : f * (st->q + d * st->s);
    st->s *= f;
  }
  st->m = cm;
}

/* Folds n consecutive logits into the state: their maximum first, then each element. */
static inline void lp_add_chunk(lp_state *st, const float *x, int n, float c, int entropy) {
  float cm = x[0];
  for (int k = 1; k < n; k++) cm = fmaxf(cm, x[k]);
  if (cm > st->m) lp_raise_max(st, cm, c, entropy);
  const float m0 = st->m == -INFINITY ? 0.0f : st->m;
  float s = 0.0f, q = 0.0f;
  for (int k = 0; k < n; k++) {
    const float t = (x[k] - m0) * c; /* exactly 0 at the maximum (the GPU's add_logit) */
    const float p = exp2f(t);
    s += p;
    if (entropy) q = fmaf(p, fmaxf(t, -LP_BIG), q);
  }
  st->s += s;
  if (entropy) st->q += q;
}

/* Row i of a logits matrix of the dtype code dt with a row stride of `stride` elements. */
static inline const char *lp_row(const void *logits, rlk_i64 stride, int dt, rlk_i64 i) {
  return (const char *)logits + (size_t)(i * stride) * lp_dt_bytes(dt);
}

/* The state of a row of V logits, chunk by chunk in the GPU's order; logits below thr count as
 * -inf (the kept-set replay; -INFINITY keeps them all). */
static inline lp_state lp_fold_row(const char *row, int dt, rlk_i64 V, float c, int entropy, float thr) {
  lp_state st = {-INFINITY, 0.0f, 0.0f};
  float x[LP_CHUNK];
  for (rlk_i64 j0 = 0; j0 < V; j0 += LP_CHUNK) {
    const int n = V - j0 < LP_CHUNK ? (int)(V - j0) : LP_CHUNK;
    for (int k = 0; k < n; k++) {
      x[k] = lp_load(row, dt, j0 + k);
      if (x[k] < thr) x[k] = -INFINITY;
    }
    lp_add_chunk(&st, x, n, c, entropy);
  }
  return st;
}

#endif

/* advantage_scan.c - host form of rlk::advantage_scan (templates/cuda/advantage_scan.cuh): GAE or
 * discounted returns over B rows of T steps, the same affine step maps and the same outputs.
 * Parameters: RLK_P_DTYPE (float or double), RLK_P_FAMILY (AS_FAMILY_*), RLK_P_ALGO:
 *   AS_ALGO_WARP   a plain loop backwards over t, the state carried step to step;
 *   AS_ALGO_BLOCK  the device's chunked scan, sequentially: rows in chunks of 32 lanes x K steps;
 *                  each lane's K steps composed into one map, the lanes' exclusive suffix
 *                  compositions applied to the chunk's entering state, each lane walked from
 *                  its own entering state, and the chunk's whole map carried into the next chunk.
 * Both give the recurrence's result; they differ in f32 rounding only. */
#include "advantage_scan_common.h"
#include "advantage_scan_params.h"

typedef RLK_P_DTYPE ts;

#define AS_LANES 32
#define AS_K ((int)(32 / sizeof(ts)))

/* Per-call constants of a step. */
typedef struct as_ctx {
  ts g, gl, base;
  int masked;
} as_ctx;

/* The family picks the map and state types below, so the preprocessor tests it; it reads an enum
 * constant as 0, so GAE's value is spelled as a number here and checked against the enum. */
#define AS_FAMILY_GAE_VALUE 0
RLK_PARAMS_ASSERT(AS_FAMILY_GAE_VALUE == AS_FAMILY_GAE, "advantage_scan: AS_FAMILY_GAE_VALUE is AS_FAMILY_GAE");

#if RLK_P_FAMILY == AS_FAMILY_GAE_VALUE

/* A' = p A + q N + u, N' = s N + v */
typedef struct as_map {
  ts p, q, u, s, v;
} as_map;
typedef struct as_state {
  ts a, n;
} as_state;

static inline as_map as_identity(void) {
  as_map m = {1, 0, 0, 1, 0};
  return m;
}
static inline as_state as_zero(void) {
  as_state x = {0, 0};
  return x;
}
/* L o R, R the later steps. */
static inline as_map as_compose(as_map L, as_map R) {
  as_map m;
  m.p = L.p * R.p;
  m.q = L.p * R.q + L.q * R.s;
  m.u = L.p * R.u + L.q * R.v + L.u;
  m.s = L.s * R.s;
  m.v = L.s * R.v + L.v;
  return m;
}
static inline as_state as_apply(as_map M, as_state x) {
  as_state y;
  y.a = M.p * x.a + M.q * x.n + M.u;
  y.n = M.s * x.n + M.v;
  return y;
}
static inline as_map as_push(as_map F, int valid, ts r, ts v, const as_ctx *c) {
  if (!valid && c->masked == AS_GAE_SKIP) return F;
  as_map m;
  m.p = c->gl * F.p;
  m.q = c->gl * F.q + c->g * F.s;
  m.u = c->gl * F.u + c->g * F.v + (valid ? r - v : 0);
  m.s = 0;
  m.v = valid ? v : 0;
  return m;
}
static inline as_state as_step(as_state x, int valid, ts r, ts v, const as_ctx *c, ts *o0, ts *o1) {
  as_state y;
  if (valid) {
    y.a = c->gl * x.a + c->g * x.n + (r - v);
    y.n = v;
  } else if (c->masked == AS_GAE_SKIP) {
    y = x;
  } else {
    y.a = c->gl * x.a + c->g * x.n;
    y.n = 0;
  }
  *o0 = y.a;
  *o1 = y.a + ((valid || c->masked == AS_GAE_SKIP) ? v : 0);
  return y;
}

#else

/* x' = a x + b, or x' = b where the steps pass a reset (k): a reset discards what is carried into
 * it, NaN and inf included, where 0 x would carry a NaN across it */
typedef struct as_map {
  ts a, b;
  int k;
} as_map;
typedef struct as_state {
  ts x;
} as_state;

static inline as_map as_identity(void) {
  as_map m = {1, 0, 0};
  return m;
}
static inline as_state as_zero(void) {
  as_state x = {0};
  return x;
}
static inline as_map as_compose(as_map L, as_map R) {
  if (L.k) return L;
  as_map m;
  m.a = L.a * R.a;
  m.b = L.a * R.b + L.b;
  m.k = R.k;
  return m;
}
static inline as_state as_apply(as_map M, as_state x) {
  as_state y;
  y.x = M.k ? M.b : M.a * x.x + M.b;
  return y;
}
static inline as_map as_push(as_map F, int valid, ts r, ts v, const as_ctx *c) {
  (void)v;
  as_map m;
  if (!valid && c->masked == AS_RETURNS_RESET) {
    m.a = 0;
    m.b = 0;
    m.k = 1;
  } else if (!valid && c->masked == AS_RETURNS_CARRY) {
    m = F;
  } else {
    m.a = c->g * F.a;
    m.b = c->g * F.b + (valid ? r : 0);
    m.k = F.k;
  }
  return m;
}
static inline as_state as_step(as_state x, int valid, ts r, ts v, const as_ctx *c, ts *o0, ts *o1) {
  (void)v;
  as_state y;
  ts out;
  if (c->masked == AS_RETURNS_RESET) {
    out = c->g * x.x + r;
    y.x = valid ? out : 0;
  } else if (c->masked == AS_RETURNS_CARRY) {
    out = valid ? c->g * x.x + r : 0;
    y.x = valid ? out : x.x;
  } else {
    out = c->g * x.x + (valid ? r : 0);
    y.x = out;
  }
  *o0 = out;
  *o1 = valid ? out - c->base : out;
  return y;
}

#endif

/* One step at column t of the current row: reads the inputs (masked ones only where the
 * formula reads them), writes the outputs. */
typedef struct as_row {
  const ts *r, *v;
  const void *mask;
  rlk_i64 m0;
  int kind;
  ts *o0, *o1;
} as_row;

static inline as_state as_row_step(const as_row *w, rlk_i64 t, as_state x, const as_ctx *c) {
  const int valid = seq_valid_at(w->mask, w->kind, w->m0 + t);
  ts o0, o1;
  const ts rv = w->r[t];
  const ts vv = RLK_P_FAMILY == AS_FAMILY_GAE ? w->v[t] : 0;
  x = as_step(x, valid, rv, vv, c, &o0, &o1);
  w->o0[t] = o0;
  if (w->o1) w->o1[t] = o1;
  return x;
}

static inline as_map as_row_push(const as_row *w, rlk_i64 t, as_map F, const as_ctx *c) {
  const int valid = seq_valid_at(w->mask, w->kind, w->m0 + t);
  const ts vv = RLK_P_FAMILY == AS_FAMILY_GAE ? w->v[t] : 0;
  return as_push(F, valid, w->r[t], vv, c);
}

RLK_HOST_KERNEL rlk_advantage_scan(void **args) {
  const as_args *p_ = (const as_args *)args[0];
  const ts *x0 = (const ts *)p_->x0;
  const rlk_i64 s0 = p_->s0;
  const ts *x1 = (const ts *)p_->x1;
  const rlk_i64 s1 = p_->s1;
  const void *mask = p_->mask;
  const rlk_i64 ms = p_->ms;
  const int kind = p_->mask_kind;
  ts *o0 = (ts *)p_->o0;
  const rlk_i64 os0 = p_->os0;
  ts *o1 = (ts *)p_->o1;
  const rlk_i64 os1 = p_->os1;
  const ts *baseline = (const ts *)p_->baseline;
  const rlk_i64 B = p_->B, T = p_->T;
  as_ctx c;
  c.g = (ts)p_->gamma;
  c.gl = (ts)p_->gamma_lambda;
  c.masked = p_->masked;

  for (rlk_i64 b = 0; b < B; b++) {
    as_row w;
    w.r = x0 + b * s0;
    w.v = RLK_P_FAMILY == AS_FAMILY_GAE ? x1 + b * s1 : NULL;
    w.mask = mask;
    w.m0 = b * ms;
    w.kind = kind;
    w.o0 = o0 + b * os0;
    w.o1 = o1 ? o1 + b * os1 : NULL;
    c.base = baseline ? baseline[b] : 0;

    if (RLK_P_ALGO == AS_ALGO_WARP) {
      as_state x = as_zero();
      for (rlk_i64 t = T - 1; t >= 0; t--) x = as_row_step(&w, t, x, &c);
      continue;
    }

    const rlk_i64 chunk = (rlk_i64)AS_LANES * AS_K;
    as_state carry = as_zero();
    for (rlk_i64 c0 = ((T - 1) / chunk) * chunk; c0 >= 0; c0 -= chunk) {
      as_map lane_map[AS_LANES], excl[AS_LANES];
      for (int l = 0; l < AS_LANES; l++) {
        as_map F = as_identity();
        for (int j = AS_K - 1; j >= 0; j--) {
          const rlk_i64 t = c0 + (rlk_i64)l * AS_K + j;
          if (t < T) F = as_row_push(&w, t, F, &c);
        }
        lane_map[l] = F;
      }
      excl[AS_LANES - 1] = as_identity();
      for (int l = AS_LANES - 2; l >= 0; l--) excl[l] = as_compose(lane_map[l + 1], excl[l + 1]);
      for (int l = AS_LANES - 1; l >= 0; l--) {
        as_state x = as_apply(excl[l], carry);
        for (int j = AS_K - 1; j >= 0; j--) {
          const rlk_i64 t = c0 + (rlk_i64)l * AS_K + j;
          if (t < T) x = as_row_step(&w, t, x, &c);
        }
      }
      carry = as_apply(as_compose(lane_map[0], excl[0]), carry);
    }
  }
}

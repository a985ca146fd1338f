/* policy_loss.c - host form of the fused policy loss (templates/cuda/policy_loss.cuh): the
 * whole call in one function. Sequences in order; a sequence's sums first when it needs them
 * (GSPO, or seq-mean-token-mean under a mask); then each token's terms in RLK_P_DTYPE, exactly as
 * the CUDA Op::token writes them, its gradients stored, its terms summed in f64; last the loss
 * and the metrics. Parameter: RLK_P_DTYPE (float or double); every other choice is a run-time
 * field of pl_args. */
#include <math.h>

#include "kl_estimator.h"
#include "policy_loss_params.h"
#include "token_loss_host.h"

typedef RLK_P_DTYPE T;

#define T_EXP(x) _Generic((x), float: expf, default: exp)(x)

static inline T clampv(T x, T lo, T hi) { return x < lo ? lo : (x > hi ? hi : x); }
static inline T gate(T x, T lo, T hi, T bg) {
  return (x > lo && x < hi) ? (T)1 : ((x == lo || x == hi) ? bg : (T)0);
}

/* The numbers of a call, in T, and the current sequence's values. */
typedef struct pl_ctx {
  const pl_args *a;
  T lo, hi, dual, lr_min, lr_max, tau_pos, tau_neg, kl_in, kl_out, cg, ckl, cent, bg;
  T adv_row, rowfac, s_ratio, s_gate, row_g, adv_mean, clip_l, clip_h;
} pl_ctx;

/* GMPO's clipped log-ratio and its derivative in d (mirrors rlk::pl::geo_clip). */
static T geo_clip(T A, T d, T lo, T hi, T bg, T *g) {
  const T dc = clampv(d, lo, hi);
  const T cg = gate(d, lo, hi, bg);
  if (A == 0) {
    *g = 0;
    return 0;
  }
  const int take_d = A > 0 ? d < dc : d > dc;
  const int take_c = A > 0 ? dc < d : dc > d;
  *g = take_d ? (T)1 : (take_c ? cg : (T)0.5 * ((T)1 + cg));
  return take_d ? d : dc;
}

/* The PPO clip and dual clip at ratio r (mirrors rlk::pl::ppo_clip): term, d term / d r. */
static void ppo_clip(const pl_ctx *c, T A, T r, T *l, T *g, int *clip, int *dualc) {
  const T nA = -A;
  const T l1 = nA * r, l2 = nA * clampv(r, c->lo, c->hi);
  const T cgate = gate(r, c->lo, c->hi, c->bg);
  T lc, gg;
  *clip = 0;
  *dualc = 0;
  if (l1 > l2) {
    lc = l1;
    gg = nA;
  } else if (l2 > l1) {
    lc = l2;
    gg = nA * cgate;
    *clip = 1;
  } else {
    lc = l1;
    gg = nA * (T)0.5 * ((T)1 + cgate);
  }
  if (A < 0 && c->dual > 1) {
    const T l3 = nA * c->dual;
    if (l3 < lc) {
      lc = l3;
      gg = 0;
      *dualc = 1;
    } else if (!(lc < l3)) {
      gg = gg * (T)0.5;
    }
  }
  *l = lc;
  *g = gg;
}

static int meangrad(const pl_args *a) { return a->mode == PL_MODE_GSPO && a->seq_grad; }

/* One token; mirrors rlk::pl::Op::token. */
static void pl_token(const pl_ctx *c, const T *x, float mf, double *acc, T *y) {
  const pl_args *a = c->a;
  y[PL_OUT_GLOGP] = 0;
  y[PL_OUT_GENT] = 0;
  if (mf == 0.0f) return;
  const T m = (T)mf;
  const T lp = x[PL_IN_LOGP];
  const T A = a->adv_per_seq ? c->adv_row : x[PL_IN_ADV];
  const T d = lp - x[PL_IN_OLD];
  const T dc = clampv(d, c->lr_min, c->lr_max);
  const T dpass = gate(d, c->lr_min, c->lr_max, c->bg);

  T r, l, dl;
  int clip = 0, dualc = 0, low = 0, high = 0;
  if (a->mode == PL_MODE_PPO || a->mode == PL_MODE_GSPO) {
    r = a->mode == PL_MODE_GSPO ? c->s_ratio : T_EXP(dc);
    T g;
    ppo_clip(c, A, r, &l, &g, &clip, &dualc);
    dl = a->mode == PL_MODE_GSPO ? g * c->s_gate : (dpass != 0 ? g * dpass * r : (T)0);
    low = r < c->lo && A < 0;
    high = r > c->hi && A > 0;
  } else if (a->mode == PL_MODE_CISPO) {
    r = T_EXP(dc);
    const T w = clampv(r, c->lo, c->hi);
    l = -w * A * lp;
    dl = -w * A;
    clip = r < c->lo || r > c->hi;
    low = r < c->lo && A < 0;
    high = r > c->hi && A > 0;
  } else if (a->mode == PL_MODE_SAPO) {
    r = T_EXP(dc);
    const T tau = A > 0 ? c->tau_pos : c->tau_neg;
    const T z = tau * (r - 1);
    const T sp = (T)1 / ((T)1 + T_EXP(-z));
    const T sn = (T)1 / ((T)1 + T_EXP(z));
    l = -sp * ((T)4 / tau) * A;
    dl = dpass != 0 ? -A * (T)4 * sp * sn * r * dpass : (T)0;
  } else if (a->mode == PL_MODE_GEO_MEAN) {
    T g;
    geo_clip(A, d, -c->clip_l, c->clip_h, c->bg, &g);
    r = c->s_ratio;
    l = -c->adv_mean * c->s_ratio;
    dl = l * g;
    const int cl = d < -c->clip_l || d > c->clip_h;
    clip = cl && A > 0;
    dualc = cl && A < 0;
  } else {
    r = T_EXP(dc);
    l = -A * lp;
    dl = -A;
  }
  if (a->isw) {
    const T w = x[PL_IN_ISW];
    l = l * w;
    dl = dl * w;
  }

  T kv = 0, gk = 0;
  if (a->kl != PL_KL_NONE) {
    kv = kl_estimate(a->kl - 1, a->kl_st != 0, lp - x[PL_IN_REF], -c->kl_in, c->kl_in, -c->kl_out,
                     c->kl_out, c->bg, &gk);
  }
  const T ent = a->ent != PL_ENT_NONE ? x[PL_IN_ENT] : (T)0;

  const T w = a->seqmean ? m * c->rowfac : m;
  acc[PL_A_PG] += (double)(w * l);
  if (a->kl != PL_KL_NONE) {
    acc[PL_A_KL] += (double)(w * kv);
    acc[PL_A_KLMEAN] += (double)(m * kv);
  }
  if (a->ent != PL_ENT_NONE) {
    acc[PL_A_ENT] += (double)(w * ent);
    acc[PL_A_ENTMEAN] += (double)(m * ent);
  }
  acc[PL_A_MASK] += (double)m;
  if (clip) acc[PL_A_CLIP] += (double)m;
  if (dualc) acc[PL_A_DUAL] += (double)m;
  if (low) acc[PL_A_LOW] += (double)m;
  if (high) acc[PL_A_HIGH] += (double)m;
  acc[PL_A_APPROX] -= (double)(m * dc);
  acc[PL_A_APPROX_RAW] -= (double)(m * d);
  if ((double)r > acc[PL_A_RMAX]) acc[PL_A_RMAX] = (double)r;
  if ((double)r < acc[PL_A_RMIN]) acc[PL_A_RMIN] = (double)r;

  const T pg = meangrad(a) ? m * (c->cg * c->row_g) : w * (c->cg * dl);
  y[PL_OUT_GLOGP] = a->kl != PL_KL_NONE ? pg + w * (c->ckl * gk) : pg;
  if (a->ent == PL_ENT_GRAD) y[PL_OUT_GENT] = w * c->cent;
}

RLK_HOST_KERNEL rlk_policy_loss_host(void **args) {
  const pl_args a = RLK_ARG(pl_args, 0);
  const tl_count_view cv = {a.layout, a.mask_kind, a.s.rows, a.s.cols, a.s.mask_stride, a.s.mask,
                            a.s.offsets};
  const double k = tl_grad_scale(&a.norm, a.c_grad, &cv);
  pl_ctx c;
  c.a = &a;
  c.lo = (T)a.clip_lo;
  c.hi = (T)a.clip_hi;
  c.dual = (T)a.dual_clip;
  c.lr_min = (T)a.lr_min;
  c.lr_max = (T)a.lr_max;
  c.tau_pos = (T)a.tau_pos;
  c.tau_neg = (T)a.tau_neg;
  c.kl_in = (T)a.kl_in;
  c.kl_out = (T)a.kl_out;
  c.cg = (T)k;
  c.ckl = (T)(k * a.kl_coef);
  c.cent = (T)(-k * a.ent_coef);
  c.bg = (T)a.bound_g;
  c.row_g = 0;
  c.adv_mean = 0;
  c.clip_l = (T)a.clip_lo; /* geo_mean's log-space bounds, as given (policy_loss_params.h) */
  c.clip_h = (T)a.clip_hi;
  c.adv_row = 0;
  c.rowfac = 1;
  c.s_ratio = 1;
  c.s_gate = 1;

  const int has_mask = a.mask_kind != RLK_SEQ_MASK_NONE;
  int present[PL_NIN];
  for (int k = 0; k < PL_NIN; k++) present[k] = a.s.in[k] != NULL;
  if (a.adv_per_seq) present[PL_IN_ADV] = 0;
  if (a.kl == PL_KL_NONE) present[PL_IN_REF] = 0;
  if (a.ent == PL_ENT_NONE) present[PL_IN_ENT] = 0;
  if (!a.isw) present[PL_IN_ISW] = 0;
  const int write_gent = a.ent == PL_ENT_GRAD;

  double acc[PL_NACC];
  for (int k = 0; k < PL_NACC; k++) acc[k] = 0.0;
  acc[PL_A_RMAX] = -INFINITY;
  acc[PL_A_RMIN] = INFINITY;

  for (rlk_i64 row = 0; row < a.s.rows; row++) {
    rlk_i64 first, len;
    tl_row(a.layout, a.s.offsets, row, a.s.cols, &first, &len);
    const T *in[PL_NIN];
    for (int k = 0; k < PL_NIN; k++)
      in[k] = present[k] ? (const T *)a.s.in[k] + tl_base(a.layout, row, a.s.in_stride[k], first)
                         : NULL;
    T *gl = (T *)a.s.out[PL_OUT_GLOGP] + tl_base(a.layout, row, a.s.out_stride[PL_OUT_GLOGP], first);
    T *ge = write_gent
                ? (T *)a.s.out[PL_OUT_GENT] + tl_base(a.layout, row, a.s.out_stride[PL_OUT_GENT], first)
                : NULL;
    const rlk_i64 m0 = has_mask ? tl_base(a.layout, row, a.s.mask_stride, first) : 0;

    if (a.adv_per_seq) c.adv_row = ((const T *)a.adv_seq)[row];
    c.rowfac = 1;
    if (a.seqmean && !has_mask) c.rowfac = len > 0 ? (T)1 / (T)len : (T)0;
    if (a.mode == PL_MODE_GSPO || a.mode == PL_MODE_GEO_MEAN || (a.seqmean && has_mask)) {
      double n = 0.0, sd = 0.0, sp = 0.0, sn = 0.0, sa = 0.0;
      for (rlk_i64 j = 0; j < len; j++) {
        const float m = rlk_mask_weight(a.mask_kind, a.s.mask, m0 + j);
        if (m == 0.0f) continue;
        n += (double)m;
        if (a.mode == PL_MODE_GSPO) sd += (double)((T)m * (in[PL_IN_LOGP][j] - in[PL_IN_OLD][j]));
        if (a.mode == PL_MODE_GEO_MEAN) {
          const T A = a.adv_per_seq ? c.adv_row : in[PL_IN_ADV][j];
          T g;
          sd += (double)((T)m * geo_clip(A, in[PL_IN_LOGP][j] - in[PL_IN_OLD][j], -c.clip_l, c.clip_h,
                                         c.bg, &g));
          sa += (double)((T)m * A);
        }
        if (meangrad(&a)) {
          const T A = a.adv_per_seq ? c.adv_row : in[PL_IN_ADV][j];
          const T wa = (T)m * (a.isw ? in[PL_IN_ISW][j] : (T)1) * A;
          if (A > 0) sp += (double)wa;
          if (A < 0) sn += (double)wa;
        }
      }
      if (a.seqmean && has_mask) c.rowfac = n > 0.0 ? (T)1 / (T)n : (T)0;
      if (a.mode == PL_MODE_GEO_MEAN) {
        c.s_ratio = T_EXP(n > 0.0 ? (T)(sd / n) : (T)0);
        c.adv_mean = n > 0.0 ? (T)(sa / n) : (T)0;
      }
      if (a.mode == PL_MODE_GSPO) {
        const T xm = n > 0.0 ? (T)(sd / n) : (T)0;
        c.s_ratio = T_EXP(clampv(xm, c.lr_min, c.lr_max));
        c.s_gate = gate(xm, c.lr_min, c.lr_max, c.bg) * c.s_ratio;
        if (a.adv_per_seq) {
          if (c.s_ratio < c.lo && c.adv_row < 0) acc[PL_A_SEQ_LOW] += 1.0;
          if (c.s_ratio > c.hi && c.adv_row > 0) acc[PL_A_SEQ_HIGH] += 1.0;
          acc[PL_A_ROWS] += 1.0;
        }
        if (meangrad(&a)) {
          T l, gp, gn;
          int f1, f2;
          ppo_clip(&c, (T)1, c.s_ratio, &l, &gp, &f1, &f2);
          ppo_clip(&c, (T)-1, c.s_ratio, &l, &gn, &f1, &f2);
          const T sum = c.rowfac * (gp * (T)sp - gn * (T)sn);
          c.row_g = n > 0.0 ? c.s_gate * sum / (T)n : (T)0;
        }
      }
    }

    for (rlk_i64 j = 0; j < len; j++) {
      T x[PL_NIN], y[PL_NOUT];
      for (int k = 0; k < PL_NIN; k++) x[k] = present[k] ? in[k][j] : (T)0;
      const float m = rlk_mask_weight(a.mask_kind, a.s.mask, m0 + j);
      pl_token(&c, x, m, acc, y);
      gl[j] = y[PL_OUT_GLOGP];
      if (ge) ge[j] = y[PL_OUT_GENT];
    }
  }

  const double pg = k * acc[PL_A_PG], kl = k * acc[PL_A_KL], ent = k * acc[PL_A_ENT];
  ((T *)a.loss)[0] = (T)(pg + a.kl_coef * kl - a.ent_coef * ent);
  if (a.metrics) {
    T *mt = (T *)a.metrics;
    const double n = acc[PL_A_MASK];
    const double inv = n != 0.0 ? 1.0 / n : 0.0;
    mt[0] = (T)(acc[PL_A_CLIP] * inv);
    mt[1] = (T)(acc[PL_A_DUAL] * inv);
    mt[2] = (T)(acc[PL_A_LOW] * inv);
    mt[3] = (T)(acc[PL_A_HIGH] * inv);
    mt[4] = (T)(acc[PL_A_APPROX] * inv);
    mt[5] = (T)(acc[PL_A_KLMEAN] * inv);
    mt[6] = (T)(acc[PL_A_ENTMEAN] * inv);
    mt[7] = (T)(n != 0.0 ? acc[PL_A_RMAX] : 0.0);
    mt[8] = (T)(n != 0.0 ? acc[PL_A_RMIN] : 0.0);
    mt[9] = (T)pg;
    mt[10] = (T)kl;
    mt[11] = (T)ent;
    mt[12] = (T)n;
    mt[13] = (T)(acc[PL_A_APPROX_RAW] * inv);
    const double rows = acc[PL_A_ROWS];
    mt[14] = (T)(rows != 0.0 ? acc[PL_A_SEQ_LOW] / rows : acc[PL_A_LOW] * inv);
    mt[15] = (T)(rows != 0.0 ? acc[PL_A_SEQ_HIGH] / rows : acc[PL_A_HIGH] * inv);
  }
}

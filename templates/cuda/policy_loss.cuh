/* policy_loss.cuh - the fused policy loss (PPO clip + dual-clip, GSPO, CISPO, SAPO, REINFORCE),
 * with a KL penalty, an entropy bonus and rollout importance weights: forward and backward in
 * one pass over the tokens (token_loss.cuh), then a one-block reduction.
 *
 * Entries, launched in this order by src/ops/policy_loss.c:
 *   policy_loss_count   (token-mean by this call's mask count only) the count's partials
 *   policy_loss_main    grad_logp (and grad_entropy) per token, per-block partial sums
 *   policy_loss_reduce  the partials combined in a fixed order -> loss [1] and metrics
 *
 * Everything that changes the code path is a template parameter (mode, KL estimator,
 * straight-through, per-sequence normalization, layout, mask, which optional streams exist);
 * the numbers (clip bounds, clamps, coefficients, normalizers) are run-time values. The math per
 * token is written out in include/rlk.h; gradients follow torch's autograd conventions (a clamp
 * passes the gradient inside its range and the caller's clamp_bound_grad on a bound; max/min
 * split it equally on a tie). */
#ifndef RLK_POLICY_LOSS_CUH
#define RLK_POLICY_LOSS_CUH

#include "kl_estimator.cuh"
#include "policy_loss_params.h"
#include "token_loss.cuh"

namespace rlk {
namespace pl {

/* The PPO clip (and dual clip) at ratio r: the term and its derivative in r. */
template <typename T> struct Clip {
  T l, g;
  bool clip, dual;
};
template <typename T, bool DUAL>
RLK_DEVICE Clip<T> ppo_clip(T A, T r, T lo, T hi, T dual, T bg) {
  Clip<T> c;
  const T nA = -A;
  const T l1 = nA * r, l2 = nA * tl::clampv(r, lo, hi);
  const T cg = tl::gate(r, lo, hi, bg);
  const bool gt = l1 > l2, lt = l1 < l2;
  /* max(l1, l2): d/dr is -A from l1, -A * cg from l2, their mean on a tie */
  c.l = lt ? l2 : l1;
  c.g = gt ? nA : (lt ? nA * cg : nA * T(0.5) * (T(1) + cg));
  c.clip = lt;
  c.dual = false;
  if (DUAL) {
    /* min(l, -c A) for A < 0 when c > 1 (c = dual is <= 1 when off) */
    const bool on = A < T(0) && dual > T(1);
    const T l3 = nA * dual;
    const bool above = c.l > l3, below = c.l < l3;
    c.dual = on && above;
    c.g = on ? (above ? T(0) : (below ? c.g : c.g * T(0.5))) : c.g;
    c.l = c.dual ? l3 : c.l;
  }
  return c;
}

/* GMPO's per-token log-ratio, clipped on the side the advantage's sign selects:
 * sign(A) min(sign(A) d, sign(A) clamp(d, -clip_low, clip_high)), and its derivative in d. */
template <typename T> RLK_DEVICE T geo_clip(T A, T d, T lo, T hi, T bg, T *g) {
  const T dc = tl::clampv(d, lo, hi);
  const T cg = tl::gate(d, lo, hi, bg);
  if (A == T(0)) {
    *g = T(0);
    return T(0);
  }
  /* A > 0: min(d, dc); A < 0: max(d, dc); a tie splits between d and the clamp */
  const bool take_d = A > T(0) ? d < dc : d > dc;
  const bool take_c = A > T(0) ? dc < d : dc > d;
  *g = take_d ? T(1) : (take_c ? cg : T(0.5) * (T(1) + cg));
  return take_d ? d : dc;
}

template <typename T, int MODE, int KL, bool ST, bool SEQMEAN, bool HAS_MASK, bool ADVSEQ, int ENT,
          bool ISW, bool SEQGRAD>
struct Op {
  static constexpr int NIN = PL_NIN, NOUT = PL_NOUT, NACC = PL_NACC;
  static constexpr unsigned IN_BITS = (1u << PL_IN_LOGP) | (1u << PL_IN_OLD) | (ADVSEQ ? 0u : 1u << PL_IN_ADV) |
                                      (KL != PL_KL_NONE ? 1u << PL_IN_REF : 0u) |
                                      (ENT != PL_ENT_NONE ? 1u << PL_IN_ENT : 0u) | (ISW ? 1u << PL_IN_ISW : 0u);
  static constexpr unsigned OUT_BITS = (1u << PL_OUT_GLOGP) | (ENT == PL_ENT_GRAD ? 1u << PL_OUT_GENT : 0u);
  /* GSPO needs each sequence's mean log-ratio (and, differentiated through the mean, the sums
   * of the weighted advantages by sign); seq-mean-token-mean its token count (known without a
   * pass when there is no mask). */
  static constexpr bool GEO = MODE == PL_MODE_GEO_MEAN;
  static constexpr bool ROWSTAT = MODE == PL_MODE_GSPO || GEO || (SEQMEAN && HAS_MASK);
  static constexpr bool MEANGRAD = MODE == PL_MODE_GSPO && SEQGRAD;
  static constexpr unsigned PRE_BITS =
      (MODE == PL_MODE_GSPO || GEO ? (1u << PL_IN_LOGP) | (1u << PL_IN_OLD) : 0u) |
      (MEANGRAD || GEO ? (ADVSEQ ? 0u : 1u << PL_IN_ADV) : 0u) |
      (MEANGRAD && ISW ? 1u << PL_IN_ISW : 0u);
  static constexpr int NPRE = MEANGRAD || GEO ? 4 : 2;
  static constexpr int reduce_kind(int k) {
    return k == PL_A_RMAX ? tl::RED_MAX : (k == PL_A_RMIN ? tl::RED_MIN : tl::RED_SUM);
  }

  /* run-time numbers */
  const T *adv_seq;
  T lo, hi, dual, lr_min, lr_max, tau_pos, tau_neg, kl_in, kl_out, cg, ckl, cent, bg;
  /* the current sequence: its advantage, aggregation factor, ratio, d s / d (mean log-ratio),
   * the mean-differentiated gradient per unit of mask, and its clip flags */
  T adv_row, rowfac, s_ratio, s_gate, row_g, adv_mean, clip_l, clip_h;
  bool s_low, s_high;

  /* c: the gradient constant (tl::grad_scale) */
  RLK_DEVICE Op(const pl_args &a, double c) {
    adv_seq = (const T *)a.adv_seq;
    lo = (T)a.clip_lo;
    hi = (T)a.clip_hi;
    dual = (T)a.dual_clip;
    lr_min = (T)a.lr_min;
    lr_max = (T)a.lr_max;
    tau_pos = (T)a.tau_pos;
    tau_neg = (T)a.tau_neg;
    kl_in = (T)a.kl_in;
    kl_out = (T)a.kl_out;
    cg = (T)c;
    ckl = (T)(c * a.kl_coef);
    cent = (T)(-c * a.ent_coef);
    bg = (T)a.bound_g;
    adv_row = T(0);
    rowfac = T(1);
    s_ratio = T(1);
    s_gate = T(1);
    row_g = T(0);
    adv_mean = T(0);
    clip_l = (T)a.clip_lo; /* geo_mean's log-space bounds, as given (policy_loss_params.h) */
    clip_h = (T)a.clip_hi;
    s_low = s_high = false;
  }

  RLK_DEVICE void acc_init(T *acc) const {
#pragma unroll
    for (int k = 0; k < NACC; ++k) acc[k] = T(0);
    acc[PL_A_RMAX] = -limits<T>::infinity();
    acc[PL_A_RMIN] = limits<T>::infinity();
  }

  RLK_DEVICE void row_begin(i64 row, i64 len) {
    if (ADVSEQ) adv_row = adv_seq[row];
    if (SEQMEAN && !HAS_MASK) rowfac = len > 0 ? T(1) / (T)len : T(0);
  }

  RLK_DEVICE void pre(const T *x, float m, T *pre) const {
    if (m == 0.0f) return;
    pre[0] += (T)m;
    if (MODE == PL_MODE_GSPO) pre[1] += (T)m * (x[PL_IN_LOGP] - x[PL_IN_OLD]);
    if (GEO) {
      /* the clipped log-ratios and the advantages, for the sequence's means */
      const T A = ADVSEQ ? adv_row : x[PL_IN_ADV];
      T g;
      pre[1] += (T)m * geo_clip(A, x[PL_IN_LOGP] - x[PL_IN_OLD], -clip_l, clip_h, bg, &g);
      pre[2] += (T)m * A;
    }
    if (MEANGRAD) {
      /* the weighted advantages by sign: the term's derivative in s is linear in A per sign */
      const T A = ADVSEQ ? adv_row : x[PL_IN_ADV];
      const T wa = (T)m * (ISW ? x[PL_IN_ISW] : T(1)) * A;
      pre[2] += A > T(0) ? wa : T(0);
      pre[3] += A < T(0) ? wa : T(0);
    }
  }

  RLK_DEVICE void row_stats(const T *pre) {
    const T n = pre[0];
    if (SEQMEAN && HAS_MASK) rowfac = n > T(0) ? T(1) / n : T(0);
    if (GEO) {
      /* the sequence's ratio exp(mean clipped log-ratio) and mean advantage */
      s_ratio = exp_(n > T(0) ? pre[1] / n : T(0));
      adv_mean = n > T(0) ? pre[2] / n : T(0);
    }
    if (MODE == PL_MODE_GSPO) {
      const T x = n > T(0) ? pre[1] / n : T(0);
      s_ratio = exp_(tl::clampv(x, lr_min, lr_max));
      s_gate = tl::gate(x, lr_min, lr_max, bg) * s_ratio;
      s_low = ADVSEQ && s_ratio < lo && adv_row < T(0);
      s_high = ADVSEQ && s_ratio > hi && adv_row > T(0);
      if (MEANGRAD) {
        /* d loss / d logp_t = cg * m_t / n * s' * sum_j w_j l_j'(s); l_j'(s) = |A_j| g(sign) */
        const T gp = ppo_clip<T, true>(T(1), s_ratio, lo, hi, dual, bg).g;
        const T gn = ppo_clip<T, true>(T(-1), s_ratio, lo, hi, dual, bg).g;
        const T sum = rowfac * (gp * pre[2] - gn * pre[3]);
        row_g = n > T(0) ? s_gate * sum / n : T(0);
      }
    }
  }

  RLK_DEVICE void row_done(T *acc) const {
    if (MODE == PL_MODE_GSPO && ADVSEQ) {
      acc[PL_A_SEQ_LOW] += s_low ? T(1) : T(0);
      acc[PL_A_SEQ_HIGH] += s_high ? T(1) : T(0);
      acc[PL_A_ROWS] += T(1);
    }
  }

  /* One token. Written with selects rather than branches (the lanes of a warp take different
   * sides of the clip), except the masked-token exit: masked tokens come in runs. */
  RLK_DEVICE void token(const T *x, float mf, T *acc, T *y) const {
    y[PL_OUT_GLOGP] = T(0);
    y[PL_OUT_GENT] = T(0);
    if (mf == 0.0f) return;
    const T m = (T)mf;
    const T lp = x[PL_IN_LOGP];
    const T A = ADVSEQ ? adv_row : x[PL_IN_ADV];
    const T d = lp - x[PL_IN_OLD];
    const T dc = tl::clampv(d, lr_min, lr_max);
    const T dpass = tl::gate(d, lr_min, lr_max, bg);

    T r, l, dl; /* ratio, policy term, d term / d logp */
    bool clip = false, dualc = false, low = false, high = false;
    if (MODE == PL_MODE_PPO || MODE == PL_MODE_GSPO) {
      r = MODE == PL_MODE_GSPO ? s_ratio : exp_(dc);
      const Clip<T> c = ppo_clip<T, true>(A, r, lo, hi, dual, bg);
      l = c.l;
      clip = c.clip;
      dualc = c.dual;
      /* a stopped gradient stays 0 even where r overflowed */
      dl = MODE == PL_MODE_GSPO ? c.g * s_gate : (dpass != T(0) ? c.g * dpass * r : T(0));
      low = r < lo && A < T(0);
      high = r > hi && A > T(0);
    } else if (MODE == PL_MODE_CISPO) {
      r = exp_(dc);
      const T w = tl::clampv(r, lo, hi);
      l = -w * A * lp;
      dl = -w * A;
      clip = r < lo || r > hi;
      low = r < lo && A < T(0);
      high = r > hi && A > T(0);
    } else if (MODE == PL_MODE_SAPO) {
      r = exp_(dc);
      const T tau = A > T(0) ? tau_pos : tau_neg;
      const T z = tau * (r - T(1));
      const T sp = T(1) / (T(1) + exp_(-z)); /* sigmoid(z) */
      const T sn = T(1) / (T(1) + exp_(z));  /* 1 - sigmoid(z), without cancellation */
      l = -sp * (T(4) / tau) * A;
      dl = dpass != T(0) ? -A * T(4) * sp * sn * r * dpass : T(0);
    } else if (MODE == PL_MODE_GEO_MEAN) {
      /* the sequence's term L = -mean(A) s, the same for each of its tokens: the aggregation
       * gives it the weight W = sum_t w_t = n rowfac, and d L / d logp_t = L g_t m_t / n, so
       * token t's gradient is w_t L g_t, a per-token term's form */
      T g;
      geo_clip(A, d, -clip_l, clip_h, bg, &g);
      r = s_ratio;
      l = -adv_mean * s_ratio;
      dl = l * g;
      const bool cl = d < -clip_l || d > clip_h;
      clip = cl && A > T(0);
      dualc = cl && A < T(0);
    } else { /* REINFORCE */
      r = exp_(dc);
      l = -A * lp;
      dl = -A;
    }
    if (ISW) {
      const T w = x[PL_IN_ISW];
      l = l * w;
      dl = dl * w;
    }

    T kv = T(0), gk = T(0);
    if (KL != PL_KL_NONE) {
      kv = kl::estimate<KL - 1, ST>(lp - x[PL_IN_REF], -kl_in, kl_in, -kl_out, kl_out, bg, &gk);
    }
    const T ent = ENT != PL_ENT_NONE ? x[PL_IN_ENT] : T(0);

    const T w = SEQMEAN ? m * rowfac : m;
    acc[PL_A_PG] += w * l;
    if (KL != PL_KL_NONE) {
      acc[PL_A_KL] += w * kv;
      acc[PL_A_KLMEAN] += m * kv;
    }
    if (ENT != PL_ENT_NONE) {
      acc[PL_A_ENT] += w * ent;
      acc[PL_A_ENTMEAN] += m * ent;
    }
    acc[PL_A_MASK] += m;
    if (MODE != PL_MODE_SAPO && MODE != PL_MODE_REINFORCE) {
      acc[PL_A_CLIP] += clip ? m : T(0);
      acc[PL_A_LOW] += low ? m : T(0);
      acc[PL_A_HIGH] += high ? m : T(0);
    }
    if (MODE == PL_MODE_PPO || MODE == PL_MODE_GSPO || MODE == PL_MODE_GEO_MEAN)
      acc[PL_A_DUAL] += dualc ? m : T(0);
    acc[PL_A_APPROX] -= m * dc;
    acc[PL_A_APPROX_RAW] -= m * d;
    acc[PL_A_RMAX] = fmax_(acc[PL_A_RMAX], r);
    acc[PL_A_RMIN] = fmin_(acc[PL_A_RMIN], r);

    /* through the mean, every token of the sequence gets the same policy gradient per unit
     * of mask (row_g); its KL term stays its own */
    const T pg = MEANGRAD ? m * (cg * row_g) : w * (cg * dl);
    y[PL_OUT_GLOGP] = KL != PL_KL_NONE ? pg + w * (ckl * gk) : pg;
    if (ENT == PL_ENT_GRAD) y[PL_OUT_GENT] = w * cent;
  }
};

} /* namespace pl */

/* The token pass. One block of RLK_TL_BLOCK threads per item at a time; the grid (at most the
 * number of items) is sized by the host from the device's multiprocessors. */
template <typename T, int MODE, int KL, bool ST, bool SEQMEAN, int LAYOUT, int MASK, bool ADVSEQ,
          int ENT, bool ISW, bool SEQGRAD>
__global__ void __launch_bounds__(RLK_TL_BLOCK, RLK_TL_BLOCKS_PER_SM) policy_loss_main(RLK_PARAMS_ARG pl_args a) {
  typedef pl::Op<T, MODE, KL, ST, SEQMEAN, MASK != RLK_SEQ_MASK_NONE, ADVSEQ, ENT, ISW, SEQGRAD> O;
  __shared__ T sh_acc[PL_NACC * RLK_MAX_WARPS];
  __shared__ T sh2[O::NPRE * RLK_MAX_WARPS];
  __shared__ double sh_c[RLK_MAX_WARPS];
  O op(a, tl::grad_scale(a.norm, a.c_grad, sh_c));
  tl::token_pass<T, LAYOUT, MASK>(op, a.s, a.partials, sh_acc, sh2);
}

/* The mask count pass (token-mean without a normalizer): per-block counts. */
template <int LAYOUT, int MASK>
__global__ void __launch_bounds__(RLK_TL_BLOCK) policy_loss_count(RLK_PARAMS_ARG pl_args a) {
  __shared__ double sh[RLK_MAX_WARPS];
  tl::count_pass<LAYOUT, MASK>(a.s, a.norm.counts, sh);
}

/* Loss and metrics from the partials, one block. Outputs in T. */
struct PolicyReduceKinds {
  static constexpr int reduce_kind(int k) {
    return k == PL_A_RMAX ? tl::RED_MAX : (k == PL_A_RMIN ? tl::RED_MIN : tl::RED_SUM);
  }
};

template <typename T> __global__ void policy_loss_reduce(RLK_PARAMS_ARG pl_args a) {
  __shared__ double sh[PL_NACC * RLK_MAX_WARPS];
  double s[PL_NACC];
  const double c = tl::grad_scale(a.norm, a.c_grad, sh);
  tl::reduce_partials<PolicyReduceKinds>(a.partials, a.num_partials, sh, s);
  if (threadIdx.x != 0) return;
  const double pg = c * s[PL_A_PG], kl = c * s[PL_A_KL], ent = c * s[PL_A_ENT];
  ((T *)a.loss)[0] = (T)(pg + a.kl_coef * kl - a.ent_coef * ent);
  if (a.metrics) {
    T *m = (T *)a.metrics;
    const double n = s[PL_A_MASK];
    const double inv = n != 0.0 ? 1.0 / n : 0.0;
    m[0] = (T)(s[PL_A_CLIP] * inv);
    m[1] = (T)(s[PL_A_DUAL] * inv);
    m[2] = (T)(s[PL_A_LOW] * inv);
    m[3] = (T)(s[PL_A_HIGH] * inv);
    m[4] = (T)(s[PL_A_APPROX] * inv);
    m[5] = (T)(s[PL_A_KLMEAN] * inv);
    m[6] = (T)(s[PL_A_ENTMEAN] * inv);
    m[7] = (T)(n != 0.0 ? s[PL_A_RMAX] : 0.0);
    m[8] = (T)(n != 0.0 ? s[PL_A_RMIN] : 0.0);
    m[9] = (T)pg;
    m[10] = (T)kl;
    m[11] = (T)ent;
    m[12] = (T)n;
    m[13] = (T)(s[PL_A_APPROX_RAW] * inv);
    /* per sequence where the ratio is one per sequence (counted rows), else per token */
    const double rows = s[PL_A_ROWS];
    m[14] = (T)(rows != 0.0 ? s[PL_A_SEQ_LOW] / rows : s[PL_A_LOW] * inv);
    m[15] = (T)(rows != 0.0 ? s[PL_A_SEQ_HIGH] / rows : s[PL_A_HIGH] * inv);
  }
}

} /* namespace rlk */

#endif /* RLK_POLICY_LOSS_CUH */

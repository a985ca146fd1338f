/* policy_loss_params.h - the argument of the policy loss kernels (templates/cuda/policy_loss.cuh,
 * templates/host/policy_loss.c), filled by src/ops/policy_loss.c, and the choices its template
 * values name. On a GPU the code path (mode, kl, kl_st, seqmean, layout, mask_kind, adv_per_seq,
 * ent, isw, seq_grad) is template parameters and those fields are unread; the host kernel reads
 * them. clip_lo and clip_hi are the ratio bounds 1 - clip_low and 1 + clip_high (geo_mean: its
 * log-space bounds clip_low and clip_high themselves, the ratio bounds unused); c_grad the
 * gradient constant (or its numerator: see tl_norm); bound_g a clamp's gradient on its bounds. */
#ifndef RLK_POLICY_LOSS_PARAMS_H
#define RLK_POLICY_LOSS_PARAMS_H

#include "rlk_kl_estimator.h"
#include "rlk_params.h"
#include "token_loss_params.h"

/* The objective ("mode"), in rlk_policy_loss_mode order. */
#define RLK_PL_MODES(X)              \
  X(PL_MODE_PPO, "ppo")              \
  X(PL_MODE_GSPO, "gspo")            \
  X(PL_MODE_CISPO, "cispo")          \
  X(PL_MODE_SAPO, "sapo")            \
  X(PL_MODE_REINFORCE, "reinforce")  \
  X(PL_MODE_GEO_MEAN, "geo_mean")
RLK_PARAMS_ENUM(RLK_PL_MODES);

/* The KL term ("kl"): none (no ref_logp), else 1 + the estimator (rlk_kl_estimator.h). */
#define RLK_PL_KLS(X)       \
  X(PL_KL_NONE, "none")     \
  X(PL_KL_K1, "k1")         \
  X(PL_KL_ABS, "abs")       \
  X(PL_KL_K2, "k2")         \
  X(PL_KL_K3, "k3")
RLK_PARAMS_ENUM(RLK_PL_KLS);
RLK_PARAMS_ASSERT(PL_KL_K1 == 1 + RLK_KL_EST_K1 && PL_KL_ABS == 1 + RLK_KL_EST_ABS && PL_KL_K2 == 1 + RLK_KL_EST_K2 &&
                      PL_KL_K3 == 1 + RLK_KL_EST_K3,
                  "policy_loss kl: 1 + the estimator");

/* The entropy input ("entropy"): absent, read for its metric and term, read and its gradient
 * written (an entropy bonus). */
#define RLK_PL_ENTROPIES(X)   \
  X(PL_ENT_NONE, "none")      \
  X(PL_ENT_READ, "metric")    \
  X(PL_ENT_GRAD, "bonus")
RLK_PARAMS_ENUM(RLK_PL_ENTROPIES);

/* The streams: inputs and outputs by index. */
enum { PL_IN_LOGP, PL_IN_OLD, PL_IN_ADV, PL_IN_REF, PL_IN_ENT, PL_IN_ISW, PL_NIN };
enum { PL_OUT_GLOGP, PL_OUT_GENT, PL_NOUT };

/* The accumulators, in the order of a block's partials [NACC] f64 (the main pass writes them,
 * the reduce reads them). */
enum {
  PL_A_PG,         /* sum w l         (w = m, or m / n_b for seq-mean-token-mean) */
  PL_A_KL,         /* sum w kl */
  PL_A_ENT,        /* sum w entropy */
  PL_A_MASK,       /* sum m */
  PL_A_CLIP,       /* sum m [clip active] */
  PL_A_DUAL,       /* sum m [dual clip active] */
  PL_A_LOW,        /* sum m [r < lo, A < 0] */
  PL_A_HIGH,       /* sum m [r > hi, A > 0] */
  PL_A_APPROX,     /* sum m (-clamped log-ratio) */
  PL_A_KLMEAN,     /* sum m kl */
  PL_A_ENTMEAN,    /* sum m entropy */
  PL_A_RMAX,       /* max r */
  PL_A_RMIN,       /* min r */
  PL_A_APPROX_RAW, /* sum m (-log-ratio, not clamped) */
  PL_A_SEQ_LOW,    /* sequences with [s < lo, A < 0] (gspo, per-sequence advantages) */
  PL_A_SEQ_HIGH,   /* sequences with [s > hi, A > 0] */
  PL_A_ROWS,       /* sequences */
  PL_NACC
};

#define RLK_PL_STREAMS(F, S_) RLK_TL_STREAMS(F, S_, PL_NIN, PL_NOUT)
RLK_PARAMS_DECLARE(pl_streams, RLK_PL_STREAMS, RLK_TL_STREAMS_SIZE(PL_NIN, PL_NOUT));

#define RLK_PL_PARAMS(F, S_)              \
  F(S_, pl_streams, s, 0)                 \
  F(S_, const void *, adv_seq, 184)       \
  RLK_TL_RESULTS(F, S_, 192)              \
  F(S_, long long, mode, 224)             \
  F(S_, long long, kl, 232)               \
  F(S_, long long, kl_st, 240)            \
  RLK_TL_ROW_SHAPE(F, S_, 248)            \
  F(S_, long long, adv_per_seq, 272)      \
  F(S_, long long, ent, 280)              \
  F(S_, long long, isw, 288)              \
  F(S_, long long, seq_grad, 296)         \
  F(S_, double, clip_lo, 304)             \
  F(S_, double, clip_hi, 312)             \
  F(S_, double, dual_clip, 320)           \
  F(S_, double, lr_min, 328)              \
  F(S_, double, lr_max, 336)              \
  F(S_, double, tau_pos, 344)             \
  F(S_, double, tau_neg, 352)             \
  F(S_, double, kl_in, 360)               \
  F(S_, double, kl_out, 368)              \
  F(S_, double, c_grad, 376)              \
  F(S_, double, kl_coef, 384)             \
  F(S_, double, ent_coef, 392)            \
  F(S_, double, bound_g, 400)             \
  F(S_, tl_norm, norm, 408)
RLK_PARAMS_DECLARE(pl_args, RLK_PL_PARAMS, 440);

#endif

/* policy_loss_ref.h - fp64 references for rlk_policy_loss and rlk_value_loss, independent of the
 * kernels. Two kinds:
 *   plref_rlk / vlref_rlk      the contract as include/rlk.h states it, for every option;
 *   plref_verl, plref_trl,     each trainer's loss written the way that trainer writes it
 *   plref_openrlhf, vlref_*    (verl core_algos, TRL GRPOTrainer, OpenRLHF PolicyLoss and
 *                              ValueLoss), gradients as autograd would give them, so the tests
 *                              can show which rlk arguments reproduce each.
 * Data is dense row-major [B, T] with a mask of weights; a packed layout is given to the
 * references as rows padded with mask 0. Every function returns 0, or -1 on a bad problem. */
#ifndef RLK_POLICY_LOSS_REF_H
#define RLK_POLICY_LOSS_REF_H

#include <stdint.h>

typedef struct plref_batch {
  int64_t B, T;
  const double *lp, *old;  /* [B, T] */
  const double *adv;       /* [B, T], or [B] when adv_seq */
  int adv_seq;
  const double *mask;      /* [B, T] weights (required; 1 and 0 for a plain mask) */
  const double *ref;       /* [B, T] or NULL */
  const double *ent;       /* [B, T] or NULL */
  const double *isw;       /* [B, T] or NULL */
} plref_batch;

/* Outputs: loss, d loss / d lp [B, T], d loss / d entropy [B, T] (when not NULL), and metrics
 * (trainer references fill the ones their trainer reports, see each function). */
typedef struct plref_out {
  double loss;
  double *grad_lp;
  double *grad_ent;
  double metrics[16];
  /* plref_rlk only: the loss and each metric with every term replaced by its magnitude (the
   * scale that rounding errors of the sums are relative to) */
  double loss_abs;
  double metrics_abs[16];
  double *grad_abs; /* [B, T] or NULL: |policy part| + |KL part| of each token's gradient */
} plref_out;

/* ---- the rlk contract ------------------------------------------------------------------ */

typedef struct plref_params {
  int mode;                 /* rlk_policy_loss_mode */
  double clip_low, clip_high, dual_clip, lr_min, lr_max, tau_pos, tau_neg;
  int kl;                   /* rlk_kl_estimator; used when batch->ref */
  double kl_coef, kl_in, kl_out;
  int kl_st;
  double ent_coef;
  int agg;                  /* rlk_loss_agg */
  double token_norm, seq_norm, norm_scale, loss_scale;
  int seq_grad;   /* rlk_seq_ratio_grad (gspo) */
  double bound_g; /* a clamp's gradient on its bounds */
} plref_params;

/* Fills every metric RLK_PL_METRIC_* (16 of them). */
int plref_rlk(const plref_batch *b, const plref_params *p, plref_out *o);

/* ---- verl (core_algos compute_policy_loss_*, agg_loss, kl_penalty; dp_actor) ----------- */

typedef struct plref_verl_cfg {
  const char *loss_mode;    /* "vanilla", "gspo", "cispo", "sapo", "gpg" */
  double clip_ratio_low, clip_ratio_high, clip_ratio_c;
  double tau_pos, tau_neg;
  const char *loss_agg_mode; /* "token-mean", "token-sum", "seq-mean-token-sum",
                              * "seq-mean-token-mean", "seq-mean-token-sum-norm" */
  double dp_size, batch_num_tokens, global_batch_size, loss_scale_factor;
  int use_kl_loss;
  double kl_loss_coef;
  const char *kl_loss_type;  /* "kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", any + "+" */
  double entropy_coeff;      /* used when batch->ent */
} plref_verl_cfg;

/* metrics[0] pg_clipfrac, [1] pg_clipfrac_lower, [4] ppo_kl (rlk's indices). */
int plref_verl(const plref_batch *b, const plref_verl_cfg *c, plref_out *o);

/* ---- TRL GRPOTrainer._compute_loss ------------------------------------------------------ */

typedef struct plref_trl_cfg {
  const char *loss_type;     /* "grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo" */
  double epsilon_low, epsilon_high;
  double beta;               /* KL (k3, no clamps) when batch->ref */
  int sequence_level;        /* importance_sampling_level = "sequence" (GSPO) */
  double sapo_temperature_pos, sapo_temperature_neg;
  double num_items_in_batch, num_processes, max_completion_length, gradient_accumulation_steps;
} plref_trl_cfg;

/* metrics[2] clip_ratio/low_mean, [3] high_mean, [0] region_mean (rlk's indices). */
int plref_trl(const plref_batch *b, const plref_trl_cfg *c, plref_out *o);

/* ---- OpenRLHF PolicyLoss + compute_approx_kl ----------------------------------------------- */

typedef struct plref_openrlhf_cfg {
  const char *policy_loss_type; /* "ppo", "gspo" */
  double clip_eps_low, clip_eps_high, dual_clip; /* dual_clip <= 1: off */
  int token_level_loss;         /* 1: masked mean over every token; 0: per-sequence means */
  double global_tokens;         /* the token count token-level loss divides by */
  int use_kl_loss;
  double kl_coef;
  const char *kl_estimator;     /* "k1", "k2", "k3" */
  double entropy_loss_coef;     /* used when batch->ent */
} plref_openrlhf_cfg;

int plref_openrlhf(const plref_batch *b, const plref_openrlhf_cfg *c, plref_out *o);

/* ---- value loss ----------------------------------------------------------------------------- */

typedef struct vlref_batch {
  int64_t B, T;
  const double *v, *old, *ret, *mask; /* [B, T] */
} vlref_batch;

typedef struct vlref_out {
  double loss;
  double *grad_v; /* [B, T] */
  double metrics[4];
} vlref_out;

/* The rlk contract: v_clip = clamp(v, v_old - clip, v_old + clip) (clip INFINITY: none). */
int vlref_rlk(const vlref_batch *b, double clip, int agg, double token_norm, double seq_norm,
              double norm_scale, double loss_scale, vlref_out *o);

/* verl compute_value_loss: v_clip = clamp(v, v_old - c, v_old + c), 0.5 * agg_loss(max(...)),
 * agg as plref_verl's; metrics[0] vf_clipfrac. */
int vlref_verl(const vlref_batch *b, double cliprange_value, const char *loss_agg_mode,
               double dp_size, double batch_num_tokens, double global_batch_size,
               double loss_scale_factor, vlref_out *o);

/* OpenRLHF ValueLoss: v_clip = v_old + clamp(v - v_old, -eps, eps), 0.5 * masked mean of
 * max((v_clip - R)^2, (v - R)^2) over every token. */
int vlref_openrlhf(const vlref_batch *b, double clip_eps, vlref_out *o);

#endif

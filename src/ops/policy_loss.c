/* policy_loss.c - the fused policy loss: validation, variant selection, launches.
 *
 * On a GPU a call is two launches (templates/cuda/policy_loss.cuh), three when token-mean
 * divides by this call's mask count (no normalizer given):
 *   0. policy_loss_count   per-block counts of the mask into the workspace;
 *   1. policy_loss_main    one pass over the tokens: grad_logp (and grad_entropy) written, and
 *                          per-block partial sums of the loss terms and metrics into the
 *                          workspace ([grid][17] f64);
 *   2. policy_loss_reduce  one block combines the partials in a fixed order and writes the loss
 *                          and the metrics.
 * Every code path (mode, KL estimator, straight-through, seq-mean-token-mean, layout, mask kind,
 * per-sequence advantages, entropy use, importance weights, GSPO's gradient through the
 * sequence mean) is a template parameter of the main
 * kernel; the numbers are run-time values. On the host backend one kernel
 * (templates/host/policy_loss.c) does the whole call with those choices as run-time values, so
 * the host needs one compiled kernel per dtype.
 *
 * The gradient of every aggregation is elementwise once a sequence's statistics are known:
 * grad_t = c * w_t * (d l_t / d logp_t + kl_coef * d kl_t / d logp_t), with c = loss_scale /
 * (the mode's normalizer) and w_t = m_t (or m_t / n_b for seq-mean-token-mean). GSPO and a
 * masked seq-mean-token-mean need each sequence's sums first: the work item is then a whole
 * sequence and the block makes a first pass over it (token_loss.cuh).
 *
 * The variant selection (pl_select) is the one function both a call and rlk_precompile go
 * through, so precompiling a configuration builds exactly what the call looks up. */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "ops/ops.h"
#include "ops/token_loss.h"
#include "common/policy_loss_params.h"

/* ---------------------------------------------------------------------------------- */
/* Templates                                                                           */
/* ---------------------------------------------------------------------------------- */

static const char *const pl_mode_names[] = RLK_PARAMS_ENUM_NAMES(RLK_PL_MODES);
static const char *const pl_kl_names[] = RLK_PARAMS_ENUM_NAMES(RLK_PL_KLS);
static const char *const pl_ent_names[] = RLK_PARAMS_ENUM_NAMES(RLK_PL_ENTROPIES);

/* The kernels' modes are the API's. */
_Static_assert(PL_MODE_PPO == (int)RLK_POLICY_PPO && PL_MODE_GSPO == (int)RLK_POLICY_GSPO &&
                   PL_MODE_CISPO == (int)RLK_POLICY_CISPO && PL_MODE_SAPO == (int)RLK_POLICY_SAPO &&
                   PL_MODE_REINFORCE == (int)RLK_POLICY_REINFORCE && PL_MODE_GEO_MEAN == (int)RLK_POLICY_GEO_MEAN,
               "policy_loss modes: rlk_policy_loss_mode order");

/* The main kernel's parameters that a setting of the same name feeds unchanged. */
static const rlk_value_decl pl_mode = RLK_DECL_CHOICES("mode", pl_mode_names);
static const rlk_value_decl pl_kl = RLK_DECL_CHOICES("kl", pl_kl_names);
static const rlk_value_decl pl_kl_st = RLK_DECL_FLAG("kl_st");
static const rlk_value_decl pl_entropy = RLK_DECL_CHOICES("entropy", pl_ent_names);

static const rlk_value_decl *const pl_main_params[] = {
    &tl_dtype,
    &pl_mode,
    &pl_kl,
    &pl_kl_st,
    RLK_PARAM_FLAG("seqmean"),
    RLK_PARAM_CHOICE("layout", tl_layout_names, 0, 2),
    &rlk_seq_mask_decl,
    RLK_PARAM_FLAG("adv_seq"),
    &pl_entropy,
    RLK_PARAM_FLAG("is_weights"),
    RLK_PARAM_FLAG("seq_grad"),
};

static const rlk_template pl_main_tmpl = {
    "policy_loss", "policy_loss_main", "cuda/policy_loss.cuh", NULL,
    sizeof pl_main_params / sizeof pl_main_params[0], pl_main_params};

static const rlk_template pl_count_tmpl = {"policy_loss", "policy_loss_count",
                                           "cuda/policy_loss.cuh", NULL, 2, tl_count_params};

static const rlk_template pl_reduce_tmpl = {"policy_loss", "policy_loss_reduce",
                                            "cuda/policy_loss.cuh", NULL, 1, tl_dtype_params};

static const rlk_template pl_host_tmpl = {"policy_loss", "policy_loss_host", NULL,
                                          "host/policy_loss.c", 1, tl_dtype_params};

/* ---------------------------------------------------------------------------------- */
/* The settings and the plan (shared by calls and precompiling)                        */
/* ---------------------------------------------------------------------------------- */

static const char *const pl_adv_names[] = {"token", "seq", NULL};
static const char *const pl_seq_grad_names[] = {"straight-through", "through-mean", NULL};

enum {
  PL_S_DTYPE, PL_S_MODE, PL_S_KL, PL_S_KL_ST, PL_S_AGG, PL_S_LAYOUT, PL_S_OFFSETS, PL_S_MASK, PL_S_ADV,
  PL_S_ENTROPY, PL_S_IS, PL_S_SEQ_GRAD, PL_S_NORMALIZER, PL_NSETTINGS
};

static const tl_line pl_line = {PL_S_DTYPE, PL_S_AGG, PL_S_LAYOUT, PL_S_OFFSETS, PL_S_MASK, PL_S_NORMALIZER};
static const tl_templates pl_templates = {&pl_count_tmpl, &pl_main_tmpl, &pl_reduce_tmpl, &pl_host_tmpl};

static const rlk_op_setting pl_settings[PL_NSETTINGS] = {
    [PL_S_DTYPE] = RLK_SET(tl_dtype, RLK_F32, "policy_loss_*.dtype", "the dtype of logp and the other float inputs"),
    [PL_S_MODE] = RLK_SET(pl_mode, RLK_POLICY_PPO, "policy_loss_main.mode", "the objective"),
    [PL_S_KL] = RLK_SET(pl_kl, PL_KL_NONE, "policy_loss_main.kl", "the KL estimator; none when there is no ref_logp"),
    [PL_S_KL_ST] = RLK_SET(pl_kl_st, 0, "policy_loss_main.kl_st",
                           "straight-through KL (the estimator's value, k2's gradient)"),
    [PL_S_AGG] = RLK_SET_CHOICE("agg", tl_agg_names, RLK_AGG_TOKEN_MEAN, "policy_loss_main.seqmean",
                                "the loss aggregation"),
    [PL_S_LAYOUT] = RLK_SET_CHOICE("layout", tl_packed_names, 0, "policy_loss_main.layout",
                                   "[B, T] + mask or [N] + seq_offsets"),
    [PL_S_OFFSETS] = RLK_SET_DTYPE("offsets", RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64), RLK_I64,
                                   "policy_loss_main.layout", "the seq_offsets dtype; with layout=packed"),
    [PL_S_MASK] = RLK_SET(rlk_seq_mask_decl, RLK_SEQ_MASK_BOOL, "policy_loss_main.mask", "the mask's dtype"),
    [PL_S_ADV] = RLK_SET_CHOICE("adv", pl_adv_names, 0, "policy_loss_main.adv_seq",
                                "advantages per token or one per sequence"),
    [PL_S_ENTROPY] = RLK_SET(pl_entropy, PL_ENT_NONE, "policy_loss_main.entropy",
                             "no entropy input, read for its metric, or an entropy bonus with its gradient"),
    [PL_S_IS] = RLK_SET_FLAG("is", 0, "policy_loss_main.is_weights", "rollout importance weights"),
    [PL_S_SEQ_GRAD] = RLK_SET_CHOICE("seq_grad", pl_seq_grad_names, 0, "policy_loss_main.seq_grad",
                                     "how gspo's sequence ratio passes its gradient"),
    [PL_S_NORMALIZER] = RLK_SET_CHOICE("normalizer", tl_normalizer_names, TL_LINE_NORM_VALUE, "policy_loss_count",
                                       "the token-mean divisor: a number or a device scalar (the same "
                                       "kernels), or this call's mask count (a count pass first)"),
};

/* Whether the work item is a whole sequence (per-row sums first). */
static int pl_whole_rows(int64_t mode, int64_t agg, int64_t mask) {
  return mode == RLK_POLICY_GSPO || mode == RLK_POLICY_GEO_MEAN ||
         (agg == RLK_AGG_SEQ_MEAN_TOKEN_MEAN && mask != RLK_SEQ_MASK_NONE);
}

/* The kernels: the token-loss passes (tl_plan), every code path of the main pass a parameter. */
static rlk_status pl_plan(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs, size_t *nspecs) {
  const int64_t *v = s->v;
  int layout = TL_LAYOUT_PADDED;
  rlk_status st = tl_line_layout(s, &pl_line, &layout);
  if (st) return st;
  const rlk_kernel_spec main_pass = {&pl_main_tmpl,
                                     {v[PL_S_DTYPE], v[PL_S_MODE], v[PL_S_KL],
                                      v[PL_S_KL] != PL_KL_NONE && v[PL_S_KL_ST], /* meaningless without a KL term */
                                      v[PL_S_AGG] == RLK_AGG_SEQ_MEAN_TOKEN_MEAN, layout, v[PL_S_MASK], v[PL_S_ADV],
                                      v[PL_S_ENTROPY], v[PL_S_IS],
                                      v[PL_S_MODE] == RLK_POLICY_GSPO && v[PL_S_SEQ_GRAD]}}; /* gspo's choice only */
  return tl_plan(ctx, &pl_templates, &pl_line, s, &main_pass, specs, nspecs);
}

static const char *const pl_samples[] = {
    /* the benchmark: PPO with dual clip and a k3 KL, token-mean, padded with a bool mask; the
     * normalizer left to the call (its mask count pass) */
    "policy_loss mode=ppo kl=k3 agg=token-mean mask=bool normalizer=count",
    /* GSPO: per-sequence sums first, differentiated through the sequence mean; packed, f32
     * weights, per-sequence advantages */
    "policy_loss mode=gspo seq_grad=through-mean agg=seq-mean-token-mean layout=packed "
    "offsets=i64 mask=f32 adv=seq",
    /* f64, CISPO, a straight-through k1, entropy bonus, importance weights, i32 mask */
    "policy_loss dtype=f64 mode=cispo kl=k1 kl_st=1 agg=token-sum mask=i32 entropy=bonus is=1",
    /* SAPO, abs KL, packed with i32 offsets and no mask, entropy metric only */
    "policy_loss mode=sapo kl=abs agg=seq-mean-token-mean layout=packed offsets=i32 mask=none "
    "entropy=metric",
    /* GMPO: the sequences' clipped geometric means, per-token advantages, i32 mask */
    "policy_loss mode=geo_mean agg=seq-mean-token-mean mask=i32",
    /* f64 REINFORCE, k2 KL, Dr. GRPO normalization, per-sequence advantages */
    "policy_loss dtype=f64 mode=reinforce kl=k2 agg=seq-mean-token-sum-norm adv=seq",
    NULL};

const rlk_op_desc rlk_op_policy_loss = {
    .name = "policy_loss", .settings = pl_settings, .nsettings = PL_NSETTINGS, .plan = pl_plan, .samples = pl_samples,
    .note = "numbers (clip bounds, dual clip, clamps, coefficients, taus, normalizers) are run-time values: the "
            "same kernels"};

/* ---------------------------------------------------------------------------------- */
/* The call                                                                            */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_policy_loss_args_init(rlk_policy_loss_args *args) {
  static const rlk_policy_loss_args defaults = {
      .mode = RLK_POLICY_PPO, .clip_low = 0.2, .clip_high = 0.2, .dual_clip = 3.0, .log_ratio_min = -20.0,
      .log_ratio_max = 20.0, .sapo_tau_pos = 1.0, .sapo_tau_neg = 1.05,
      .seq_ratio_grad = RLK_SEQ_RATIO_STRAIGHT_THROUGH, .clamp_bound_grad = 1.0, .kl_estimator = RLK_KL_K3,
      .kl_coef = 0.0, .kl_input_clamp = 20.0, .kl_output_clamp = 10.0, .kl_straight_through = 0, .entropy_coef = 0.0,
      .agg = RLK_AGG_TOKEN_MEAN, .loss_scale = 1.0};
  if (args) *args = defaults;
}

/* A call: the token-loss state, then the kernels' argument. */
typedef struct pl_call {
  tl_call tl;
  pl_args k;
} pl_call;

static rlk_status pl_check_nonneg(double x, const char *what) {
  if (!(x >= 0.0))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %g must be >= 0 (INFINITY: no bound)", what, x);
  return RLK_OK;
}

static rlk_status pl_check_clamp(double x, const char *what) {
  if (!(x > 0.0))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %g must be > 0 (INFINITY: off)", what, x);
  return RLK_OK;
}

static rlk_status pl_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_policy_loss_args *a = args;
  pl_call *k = (pl_call *)call;
  tl_layout *L = &k->tl.L;
  pl_args *p = &k->k;
  rlk_op_values *v = &call->vals;
  rlk_status st;
  if ((st = rlk_check_flag(a->kl_straight_through, "kl_straight_through")) ||
      (st = rlk_check_flag(a->seq_advantages, "seq_advantages")))
    return st;
  int64_t stride;

  /* layout, from logp */
  if ((st = tl_layout_check(ctx, &a->logp, "logp", &a->seq_offsets, &a->mask, L, &stride))) return st;
  p->s.in[PL_IN_LOGP] = a->logp.data;
  p->s.in_stride[PL_IN_LOGP] = stride;
  p->s.mask = a->mask.data;
  p->s.mask_stride = L->mask_stride;
  p->s.offsets = a->seq_offsets.data;
  p->s.rows = L->rows;
  p->s.cols = L->cols;

  /* streams */
  if ((st = tl_stream_in(L, &a->old_logp, "old_logp", 1, &p->s.in[PL_IN_OLD], &p->s.in_stride[PL_IN_OLD]))) return st;
  int adv_seq = a->seq_advantages != 0;
  rlk_tensor adv = a->advantages;
  if (!adv_seq && adv.data && adv.ndim == 2 && adv.shape[1] > 1 && adv.strides[1] == 0 &&
      adv.shape[1] == L->cols && L->layout == TL_LAYOUT_PADDED) {
    /* one value per sequence broadcast over its tokens (A[:, None].expand(B, T), as verl passes
     * them): the per-sequence form, which reads each value once */
    adv = rlk_tensor_1d(adv.data, adv.dtype, adv.shape[0]);
    if (adv.shape[0] > 1 && a->advantages.strides[0] != 1)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "advantages: a per-sequence value broadcast over the tokens (stride[1] 0) needs the "
                       "values 1 apart (stride[0] is %lld)",
                       (long long)a->advantages.strides[0]);
    adv_seq = 1;
  }
  if (adv_seq) {
    if ((st = tl_seq_check(L, &adv, "advantages"))) return st;
    p->adv_seq = adv.data;
  } else {
    if ((st = tl_stream_in(L, &a->advantages, "advantages", 1, &p->s.in[PL_IN_ADV],
                           &p->s.in_stride[PL_IN_ADV])))
      return st;
  }
  if ((st = tl_stream_in(L, &a->ref_logp, "ref_logp", 0, &p->s.in[PL_IN_REF], &p->s.in_stride[PL_IN_REF]))) return st;
  if ((st = tl_stream_in(L, &a->entropy, "entropy", 0, &p->s.in[PL_IN_ENT], &p->s.in_stride[PL_IN_ENT]))) return st;
  if ((st = tl_stream_in(L, &a->rollout_is_weights, "rollout_is_weights", 0, &p->s.in[PL_IN_ISW],
                         &p->s.in_stride[PL_IN_ISW])))
    return st;

  /* mode and its numbers */
  if ((st = rlk_check_enum((int)a->mode, "mode", RLK_POLICY_PPO, RLK_POLICY_GEO_MEAN, "rlk_policy_loss_mode")))
    return st;
  if ((st = pl_check_nonneg(a->clip_low, "clip_low"))) return st;
  if ((st = pl_check_nonneg(a->clip_high, "clip_high"))) return st;
  if (isnan(a->dual_clip))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "dual_clip: NaN (> 1 enables, <= 1 disables)");
  if (isnan(a->log_ratio_min) || isnan(a->log_ratio_max) || a->log_ratio_min > a->log_ratio_max)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "log_ratio_min/log_ratio_max: [%g, %g] is not a range (+-INFINITY: no clamp)",
                     a->log_ratio_min, a->log_ratio_max);
  const int mode = (int)a->mode;
  if (mode == RLK_POLICY_GEO_MEAN && a->rollout_is_weights.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "rollout_is_weights: geo_mean does not take importance weights");
  if (mode == RLK_POLICY_GEO_MEAN && !(isfinite(a->clip_low) && isfinite(a->clip_high)))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "clip_low/clip_high: geo_mean's log-space bounds must be finite");
  if ((st = rlk_check_enum((int)a->seq_ratio_grad, "seq_ratio_grad", RLK_SEQ_RATIO_STRAIGHT_THROUGH,
                           RLK_SEQ_RATIO_THROUGH_MEAN, "rlk_seq_ratio_grad")))
    return st;
  const int seq_grad = mode == RLK_POLICY_GSPO && a->seq_ratio_grad == RLK_SEQ_RATIO_THROUGH_MEAN;
  if ((st = rlk_check_unit_interval(a->clamp_bound_grad, "clamp_bound_grad"))) return st;
  if (mode == RLK_POLICY_SAPO) {
    if (!(a->sapo_tau_pos > 0.0) || !isfinite(a->sapo_tau_pos))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "sapo_tau_pos: %g must be > 0 and finite",
                       a->sapo_tau_pos);
    if (!(a->sapo_tau_neg > 0.0) || !isfinite(a->sapo_tau_neg))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "sapo_tau_neg: %g must be > 0 and finite",
                       a->sapo_tau_neg);
  }

  /* KL */
  if ((st = rlk_check_enum((int)a->kl_estimator, "kl_estimator", RLK_KL_K1, RLK_KL_K3, "rlk_kl_estimator"))) return st;
  if ((st = rlk_check_finite(a->kl_coef, "kl_coef"))) return st;
  if ((st = pl_check_clamp(a->kl_input_clamp, "kl_input_clamp"))) return st;
  if ((st = pl_check_clamp(a->kl_output_clamp, "kl_output_clamp"))) return st;
  if (a->kl_coef != 0.0 && !a->ref_logp.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "ref_logp: required when kl_coef (%g) != 0",
                     a->kl_coef);
  const int kl = a->ref_logp.data ? (int)a->kl_estimator + 1 : PL_KL_NONE;

  /* entropy */
  if ((st = rlk_check_finite(a->entropy_coef, "entropy_coef"))) return st;
  if (a->entropy_coef != 0.0) {
    if (!a->entropy.data)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "entropy: required when entropy_coef (%g) != 0",
                       a->entropy_coef);
    if ((st = tl_stream_out(L, &a->grad_entropy, "grad_entropy", 1, &p->s.out[PL_OUT_GENT],
                            &p->s.out_stride[PL_OUT_GENT])))
      return st;
  }
  const int ent = a->entropy_coef != 0.0 ? PL_ENT_GRAD : a->entropy.data ? PL_ENT_READ : PL_ENT_NONE;

  /* aggregation, the configuration, the geometry */
  const tl_norm_args na = {(int)a->agg, a->token_normalizer, a->seq_normalizer, a->norm_scale,
                           a->loss_scale, &a->token_normalizer_tensor, &a->seq_normalizer_tensor};
  if ((st = tl_call_finish(ctx, &k->tl, &pl_line, &na, pl_whole_rows(mode, a->agg, L->mask), PL_NACC, &p->c_grad,
                           &p->norm)))
    return st;
  rlk_op_values_set(v, PL_S_MODE, mode);
  rlk_op_values_set(v, PL_S_KL, kl);
  rlk_op_values_set(v, PL_S_KL_ST, a->kl_straight_through != 0);
  rlk_op_values_set(v, PL_S_ADV, adv_seq);
  rlk_op_values_set(v, PL_S_ENTROPY, ent);
  rlk_op_values_set(v, PL_S_IS, a->rollout_is_weights.data != NULL);
  rlk_op_values_set(v, PL_S_SEQ_GRAD, seq_grad);

  /* outputs */
  if ((st = tl_vector_check(&a->loss, "loss", L->dtype, 1, 1))) return st;
  if ((st = tl_stream_out(L, &a->grad_logp, "grad_logp", 1, &p->s.out[PL_OUT_GLOGP],
                          &p->s.out_stride[PL_OUT_GLOGP])))
    return st;
  if ((st = tl_vector_check(&a->metrics, "metrics", L->dtype, RLK_POLICY_LOSS_METRICS, 0))) return st;
  p->loss = a->loss.data;
  p->metrics = a->metrics.data;

  /* numbers */
  p->mode = mode;
  p->kl = kl;
  p->kl_st = a->kl_straight_through != 0;
  p->seqmean = a->agg == RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
  p->layout = L->layout;
  p->mask_kind = L->mask;
  p->adv_per_seq = adv_seq;
  p->ent = ent;
  p->isw = a->rollout_is_weights.data != NULL;
  p->seq_grad = seq_grad;
  p->bound_g = a->clamp_bound_grad;
  /* geo_mean's bounds are log-space ones, passed as given: 1 - (1 - x) and (1 + x) - 1 need not
   * be x (0.4 gives 0.3999999999999999; 1e-17 gives 0) */
  p->clip_lo = mode == RLK_POLICY_GEO_MEAN ? a->clip_low : 1.0 - a->clip_low;
  p->clip_hi = mode == RLK_POLICY_GEO_MEAN ? a->clip_high : 1.0 + a->clip_high;
  p->dual_clip = a->dual_clip;
  p->lr_min = a->log_ratio_min;
  p->lr_max = a->log_ratio_max;
  p->tau_pos = a->sapo_tau_pos;
  p->tau_neg = a->sapo_tau_neg;
  p->kl_in = a->kl_input_clamp;
  p->kl_out = a->kl_output_clamp;
  p->kl_coef = a->kl_coef;
  p->ent_coef = a->entropy_coef;
  p->s.tiles_per_row = k->tl.g.tiles_per_row;
  p->s.tile = k->tl.g.tile;
  p->num_partials = k->tl.g.grid;
  return RLK_OK;
}

/* Every kernel takes the one argument; the partials and the count pass's counts are in the
 * workspace. */
static const void *pl_launch_params(const rlk_context *ctx, const void *args, rlk_op_call *call, size_t i) {
  (void)ctx, (void)i;
  const rlk_policy_loss_args *a = args;
  pl_call *k = (pl_call *)call;
  k->k.partials = a->workspace;
  k->k.norm.counts = tl_counts(&k->tl, a->workspace, PL_NACC);
  return &k->k;
}

static const rlk_arg_field pl_fields[] = {
    RLK_ARG_IN(rlk_policy_loss_args, logp),
    RLK_ARG_IN(rlk_policy_loss_args, old_logp),
    RLK_ARG_IN(rlk_policy_loss_args, advantages),
    RLK_ARG_IN(rlk_policy_loss_args, mask),
    RLK_ARG_IN(rlk_policy_loss_args, seq_offsets),
    RLK_ARG_IN(rlk_policy_loss_args, ref_logp),
    RLK_ARG_IN(rlk_policy_loss_args, entropy),
    RLK_ARG_IN(rlk_policy_loss_args, rollout_is_weights),
    RLK_ARG_IN(rlk_policy_loss_args, token_normalizer_tensor),
    RLK_ARG_IN(rlk_policy_loss_args, seq_normalizer_tensor),
    RLK_ARG_OUT(rlk_policy_loss_args, loss),
    RLK_ARG_OUT(rlk_policy_loss_args, grad_logp),
    RLK_ARG_OUT(rlk_policy_loss_args, grad_entropy),
    RLK_ARG_OUT(rlk_policy_loss_args, metrics)};

static const rlk_op_entry pl_entry = {
    .name = "rlk_policy_loss", .op = &rlk_op_policy_loss, .call_size = sizeof(pl_call), RLK_OP_FIELDS(pl_fields),
    .workspace = RLK_OP_WORKSPACE(rlk_policy_loss_args, 16), .validate = pl_validate, .params = pl_launch_params,
    .dims = tl_dims};

RLK_OP_DEFINE_CALL_AND_SIZE(rlk_policy_loss, rlk_policy_loss_args, pl_entry)

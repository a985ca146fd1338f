"""verl (verl.trainer.ppo.core_algos) on rlk: the registered policy losses, agg_loss,
compute_value_loss and the outcome advantage estimators with verl's signatures and semantics
(tested against verl 0.9.1).

    from rlk.integrations import verl as rlk_verl
    handle = rlk_verl.patch()       # verl's registry and module functions now run on rlk
    ...
    handle.undo()

Conventions reproduced: the log-ratio clamp [-20, 20] (gspo: at most 10 on the sequence's mean),
dual clip (clip_ratio_c) in vanilla only, straight-through GSPO gradients, the clamp gradient of
the installed torch on a bound and clip_by_value's split for the value clip, agg_loss's
normalizers (the local counts when the global ones are not given; sequences with no token left
out of the sequence count), the metrics verl logs (ppo_kl of gspo unclamped). One difference is
left: verl divides a sequence's sum by (n + 1e-8) in seq-mean-token-mean, rlk by n (relative
1e-8 / n).
"""
import collections
import functools
import math

import numpy as np
import torch

from .. import autograd as _ag
from ..ops import group_advantage as _ga
from ..ops import returns as _ret
from ..ops import token_baseline as _tb
from . import _head, _prefix
from ._common import (Patch, all_or_nothing, as_float, check_version, dense, float_pair,
                      mask_arg, mask_total, nonempty_rows, stand_in, torch_clamp_bound_grad,
                      trainer_own)

__all__ = ["POLICY_LOSSES", "ADV_ESTIMATORS", "agg_args", "agg_loss", "compute_policy_loss",
           "compute_value_loss", "compute_gae_advantage_return", "masked_whiten",
           "logprobs_from_logits", "entropy_from_logits", "kl_penalty", "FusedLinearForPPO",
           "prefix_calls", "TESTED", "patch"]


def _normalizer(given, name, dp_size, local_count, loss_mask):
    """The global normalizer when given, else local_count(loss_mask), this rank's own (refused
    with more than one rank: each would divide by a different count)."""
    if given is None:
        if dp_size > 1:
            raise ValueError("%s is required when dp_size > 1" % name)
        given = local_count(loss_mask)
    return as_float(given)


def agg_args(loss_agg_mode, loss_mask, dp_size=1, batch_num_tokens=None, global_batch_size=None,
             loss_scale_factor=None):
    """rlk's aggregation arguments for verl's agg_loss settings."""
    out = {"agg": loss_agg_mode, "loss_scale": float(dp_size)}
    if loss_agg_mode == "token-mean":
        out["token_normalizer"] = _normalizer(batch_num_tokens, "(global) batch_num_tokens",
                                              dp_size, mask_total, loss_mask)
    elif loss_agg_mode == "token-sum":
        pass
    elif loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        out["seq_normalizer"] = _normalizer(global_batch_size, "global_batch_size", dp_size,
                                            nonempty_rows, loss_mask)
        if loss_agg_mode == "seq-mean-token-sum-norm":
            out["norm_scale"] = float(loss_mask.shape[-1] if loss_scale_factor is None
                                      else loss_scale_factor)
    else:
        raise ValueError("Invalid loss_agg_mode: %s" % loss_agg_mode)
    return out


def _global_info(config):
    info = dict(getattr(config, "global_batch_info", None) or {})
    return {k: info[k] for k in ("dp_size", "batch_num_tokens", "global_batch_size",
                                 "loss_scale_factor") if k in info}


def _clip(config):
    c = config.clip_ratio
    lo = config.clip_ratio_low if config.clip_ratio_low is not None else c
    hi = config.clip_ratio_high if config.clip_ratio_high is not None else c
    return lo, hi


def _run(mode, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
         rollout_is_weights, **kw):
    if config is None:
        raise ValueError("config is required")
    mask = mask_arg(response_mask)
    agg = agg_args(loss_agg_mode, response_mask, **_global_info(config))
    kw.setdefault("clamp_bound_grad", torch_clamp_bound_grad())
    kw.update(agg)
    return _ag.policy_loss(log_prob, dense(old_log_prob), dense(advantages, per_sequence=True), mask,
                           mode=mode,
                           rollout_is_weights=dense(rollout_is_weights), **kw)


def _m(metrics, i):
    return metrics[i].item()


def compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask,
                                loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
    """verl "vanilla": PPO clip with clip-higher and dual clip (clip_ratio_c)."""
    lo, hi = _clip(config)
    c = config.get("clip_ratio_c", 3.0)
    assert c > 1.0, "The lower bound of the clip_ratio_c for dual-clip PPO should be greater than 1.0"
    loss, m = _run("ppo", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                   rollout_is_weights, clip_low=lo, clip_high=hi, dual_clip=c, log_ratio_min=-20.0,
                   log_ratio_max=20.0)
    return loss, {"actor/pg_clipfrac": _m(m, 0), "actor/ppo_kl": _m(m, 4),
                  "actor/pg_clipfrac_lower": _m(m, 1)}


def compute_policy_loss_gspo(old_log_prob, log_prob, advantages, response_mask,
                             loss_agg_mode="seq-mean-token-mean", config=None,
                             rollout_is_weights=None):
    """verl "gspo": the sequence ratio, clamped at 10 in log space, straight-through."""
    lo, hi = _clip(config)
    loss, m = _run("gspo", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                   rollout_is_weights, clip_low=lo, clip_high=hi, dual_clip=0.0,
                   log_ratio_min=-math.inf, log_ratio_max=10.0,
                   seq_ratio_grad="straight_through")
    return loss, {"actor/pg_clipfrac": _m(m, 0), "actor/ppo_kl": _m(m, 13),
                  "actor/pg_clipfrac_lower": 0.0}


def compute_policy_loss_sapo(old_log_prob, log_prob, advantages, response_mask,
                             loss_agg_mode="seq-mean-token-mean", config=None,
                             rollout_is_weights=None):
    """verl "sapo": the soft gate, always aggregated seq-mean-token-mean (as verl does)."""
    loss, m = _run("sapo", old_log_prob, log_prob, advantages, response_mask, "seq-mean-token-mean",
                   config, rollout_is_weights, sapo_tau_pos=float(config.tau_pos),
                   sapo_tau_neg=float(config.tau_neg), log_ratio_min=-20.0, log_ratio_max=20.0)
    return loss, {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": _m(m, 4),
                  "actor/pg_clipfrac_lower": 0.0}


def compute_policy_loss_cispo(old_log_prob, log_prob, advantages, response_mask,
                              loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
    """verl "cispo": -sg(clamp(r)) A logp."""
    lo, hi = _clip(config)
    loss, m = _run("cispo", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                   config, rollout_is_weights, clip_low=lo, clip_high=hi, log_ratio_min=-20.0,
                   log_ratio_max=20.0)
    return loss, {"actor/pg_clipfrac": _m(m, 0), "actor/ppo_kl": _m(m, 4),
                  "actor/pg_clipfrac_lower": 0.0}


def compute_policy_loss_gpg(old_log_prob, log_prob, advantages, response_mask,
                            loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
    """verl "gpg": -A logp."""
    loss, _ = _run("reinforce", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                   config, rollout_is_weights)
    return loss, {}


def compute_policy_loss_geo_mean(old_log_prob, log_prob, advantages, response_mask,
                                 loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
    """verl "geo_mean" (GMPO): the mean over the sequences of -mean(A) exp(mean clipped
    log-ratio); loss_agg_mode and the global batch settings are ignored, as verl does. Rollout
    weights: verl multiplies each sequence's term by the geometric mean of its tokens' weights, a
    positive constant: the sequence's advantages scaled by it (their signs, which choose the clip
    side, unchanged)."""
    lo, hi = _clip(config)
    if rollout_is_weights is not None:
        valid = response_mask.bool()
        logw = torch.where(valid, torch.log(rollout_is_weights.detach() + 1e-10), 0.0)
        seq_w = torch.exp((logw * response_mask).sum(-1) / (response_mask.sum(-1) + 1e-8))
        advantages = advantages * seq_w.unsqueeze(-1).to(advantages.dtype)
    loss, m = _ag.policy_loss(
        log_prob, dense(old_log_prob), dense(advantages, per_sequence=True), mask_arg(response_mask),
        mode="geo_mean",
        clip_low=lo, clip_high=hi, log_ratio_min=-math.inf, log_ratio_max=math.inf,
        clamp_bound_grad=torch_clamp_bound_grad(), agg="seq-mean-token-mean",
        seq_normalizer=float(response_mask.shape[0]))
    return loss, {"actor/pg_clipfrac": _m(m, 0), "actor/ppo_kl": _m(m, 13),
                  "actor/pg_clipfrac_lower": _m(m, 1)}


def _masked_mean(values, mask):
    """verl_F.masked_mean: the mask-weighted mean, 1e-8 added to the divisor."""
    return (torch.where(mask.bool(), values, 0.0) * mask).sum() / (mask.sum() + 1e-8)


def _policy_settings(config, name, default):
    v = getattr(config.policy_loss, name, None)
    return default if v is None else v


def compute_policy_loss_clip_cov(old_log_prob, log_prob, advantages, response_mask,
                                 loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
    """verl "clip_cov": PPO clip (no dual clip, no log-ratio clamp) in which some unclipped tokens
    whose covariance (A - mean A)(logp - mean logp) lies in (clip_cov_lb, clip_cov_ub) lose their
    term and its gradient: at most clip_cov_ratio of the valid tokens, drawn with torch.randperm as
    verl draws them (the same generator state gives the same tokens). The selection runs in torch
    and reads the valid-token count back, as verl's does; the loss and its gradient are rlk's,
    with the dropped tokens given weight 0."""
    if config is None:
        raise ValueError("config is required")
    ratio_c = _policy_settings(config, "clip_cov_ratio", 0.0002)
    ub = _policy_settings(config, "clip_cov_ub", 5.0)
    lb = _policy_settings(config, "clip_cov_lb", 1.0)
    if not ratio_c > 0:
        raise ValueError("clip_cov_ratio should be larger than 0")
    lo, hi = _clip(config)
    with torch.no_grad():
        mask = response_mask
        lp = log_prob.detach()
        r = torch.exp(lp - old_log_prob)
        l1 = -advantages * r
        l2 = -advantages * torch.clamp(r, 1 - lo, 1 + hi)
        clipped = (l2 > l1) & (mask > 0)
        cov = (advantages - _masked_mean(advantages, mask)) * (lp - _masked_mean(lp, mask))
        cov[mask == 0] = -torch.inf
        cov[clipped] = -torch.inf
        n = max(int(ratio_c * mask.sum().item()), 1)
        idx = torch.nonzero((cov < ub) & (cov > lb) & (mask > 0))
        if len(idx) > 0:
            idx = idx[torch.randperm(len(idx))[:min(n, len(idx))]]
        corr = torch.ones_like(advantages)
        corr[idx[:, 0], idx[:, 1]] = 0
        weights = corr if rollout_is_weights is None else corr * rollout_is_weights
    loss, m = _run("ppo", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                   weights, clip_low=lo, clip_high=hi, dual_clip=0.0, log_ratio_min=-math.inf,
                   log_ratio_max=math.inf)
    return loss, {"actor/pg_clipfrac": _masked_mean((corr == 0).float(), mask).item(),
                  "actor/ppo_kl": _m(m, 13)}


def compute_policy_loss_kl_cov(old_log_prob, log_prob, advantages, response_mask,
                               loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
    """verl "kl_cov": the unclipped ratio objective -A r, plus ppo_kl_coef |log r| on the
    kl_cov_ratio share of the valid tokens with the largest covariance (A - mean A)(logp - mean
    logp) (at least one; chosen in torch on the host, as verl does). rlk's k-abs KL term against
    a reference that is the old log-prob on the chosen tokens and the current one (|0|, gradient
    0) elsewhere. With rollout weights verl weights the KL part too: the policy term takes them
    as rlk's weights, and the weighted KL part (rlk_token_kl's abs times the coefficient and the
    weights) is aggregated alike."""
    if config is None:
        raise ValueError("config is required")
    ratio_k = _policy_settings(config, "kl_cov_ratio", 0.0002)
    coef = _policy_settings(config, "ppo_kl_coef", 1.0)
    if not ratio_k > 0:
        raise ValueError("kl_cov_ratio should be larger than 0")
    with torch.no_grad():
        lp = log_prob.detach()
        valid = response_mask > 0
        chosen = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
        where = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
        a = advantages[valid].detach().reshape(-1).cpu()
        x = lp[valid].reshape(-1).cpu()
        if min(ratio_k, len(a)) != 0:
            cov = (a - a.mean()) * (x - x.mean())
            k = max(1, int(len(cov) * ratio_k))
            top = torch.topk(cov, k, largest=True).indices
            if len(top) != 0:
                chosen[where[top.to(where.device)]] = True
        ref = torch.where(chosen.view(valid.shape), old_log_prob, lp)
    unclipped = dict(clip_low=math.inf, clip_high=math.inf, dual_clip=0.0, log_ratio_min=-math.inf,
                     log_ratio_max=math.inf)
    if rollout_is_weights is None:
        loss, _ = _run("ppo", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                       config, None, ref_logp=ref, kl_estimator="abs", kl_coef=float(coef),
                       kl_input_clamp=math.inf, kl_output_clamp=math.inf, **unclipped)
    else:
        loss, _ = _run("ppo", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                       config, rollout_is_weights, **unclipped)
        # coef w |logp - ref| per token, a REINFORCE term of advantage -1 aggregated like the first
        pen = _ag.token_kl(log_prob, ref, "abs", mask=mask_arg(response_mask), input_clamp=None,
                           output_clamp=None, clamp_bound_grad=torch_clamp_bound_grad())
        pen = pen * (float(coef) * rollout_is_weights.detach().to(pen.dtype))
        loss_kl, _ = _run("reinforce", pen.detach(), pen, torch.full_like(pen, -1.0), response_mask,
                          loss_agg_mode, config, None, log_ratio_min=-math.inf, log_ratio_max=math.inf)
        loss = loss + loss_kl
    with torch.no_grad():
        ppo_kl = _masked_mean((lp - old_log_prob).abs(), response_mask)
    return loss, {"actor/ppo_kl": ppo_kl.item()}


def _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
          rollout_is_weights, kl):
    """verl's DPPO losses: -A sg(min(r, clip_ratio_c)) logp on the tokens inside the trust region
    (by the probabilities' difference, or their binary KL), as rlk's REINFORCE term weighted per
    token (the weights computed here, elementwise, detached as verl detaches them)."""
    if config is None:
        raise ValueError("config is required")
    lo, hi = _clip(config)
    c = config.get("clip_ratio_c", 20.0)
    with torch.no_grad():
        lp = log_prob.detach()
        d = torch.clamp(lp - old_log_prob, min=-20.0, max=20.0)
        r = torch.exp(d)
        prob, old_prob = torch.exp(lp), torch.exp(old_log_prob)
        if kl:
            bkl = old_prob * (old_log_prob - lp) + (1 - old_prob) * torch.log(
                (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
            pos, neg = (bkl <= hi) | (prob <= old_prob), (bkl <= lo) | (prob >= old_prob)
        else:
            pos, neg = (prob - old_prob) <= hi, (prob - old_prob) >= -lo
        valid = torch.where(advantages > 0, pos, neg).float()
        w = torch.clamp(r, max=c) * valid
        if rollout_is_weights is not None:
            w = w * rollout_is_weights
    loss, m = _run("reinforce", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                   config, w, log_ratio_min=-20.0, log_ratio_max=20.0)
    with torch.no_grad():
        clipfrac = _masked_mean(1.0 - valid, response_mask)
        lower = _masked_mean((r > c).float() * valid, response_mask)
    return loss, {"actor/pg_clipfrac": clipfrac.item(), "actor/ppo_kl": _m(m, 4),
                  "actor/pg_clipfrac_lower": lower.item()}


def compute_policy_loss_dppo_tv(old_log_prob, log_prob, advantages, response_mask,
                                loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
    """verl "dppo_tv": DPPO with the trust region on p - p_old (clip_ratio_low / high)."""
    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                 rollout_is_weights, kl=False)


def compute_policy_loss_dppo_kl(old_log_prob, log_prob, advantages, response_mask,
                                loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
    """verl "dppo_kl": DPPO with the trust region on the binary KL of p_old and p."""
    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                 rollout_is_weights, kl=True)


def compute_policy_loss_dro(old_log_prob, log_prob, advantages, response_mask,
                            loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
    """verl "dro": -(A logp - dro_beta / 2 (logp - logp_old)^2): rlk's REINFORCE term plus the k2
    KL term against the old log-probs (kl_coef = dro_beta, no clamps). With rollout weights verl
    weights the penalty too: the REINFORCE term takes them as rlk's (policy-term) weights, and the
    weighted penalty (rlk_token_kl's k2 times dro_beta and the weights) is aggregated alike."""
    if config is None:
        raise ValueError("config is required")
    beta = config.policy_loss.dro_beta
    if beta is None or beta <= 0:
        raise ValueError("policy_loss.dro_beta must be a positive value when using DRO")
    unbounded = dict(log_ratio_min=-math.inf, log_ratio_max=math.inf)
    if rollout_is_weights is None:
        loss, m = _run("reinforce", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                       config, None, ref_logp=old_log_prob, kl_estimator="k2", kl_coef=float(beta),
                       kl_input_clamp=math.inf, kl_output_clamp=math.inf, **unbounded)
        return loss, {"actor/ppo_kl": _m(m, 13)}
    loss, m = _run("reinforce", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                   config, rollout_is_weights, **unbounded)
    # beta w (logp - old)^2 / 2 per token, a REINFORCE term of advantage -1 aggregated like the first
    pen = _ag.token_kl(log_prob, old_log_prob.detach(), "k2", mask=mask_arg(response_mask),
                       input_clamp=None, output_clamp=None)
    pen = pen * (float(beta) * rollout_is_weights.detach().to(pen.dtype))
    loss_kl, _ = _run("reinforce", pen.detach(), pen, torch.full_like(pen, -1.0), response_mask,
                      loss_agg_mode, config, None, **unbounded)
    return loss + loss_kl, {"actor/ppo_kl": _m(m, 13)}


def compute_policy_loss_bypass_mode(old_log_prob, log_prob, advantages, response_mask,
                                    loss_agg_mode="token-mean", config=None,
                                    rollout_is_weights=None):
    """verl "bypass_mode" (old log-probs are the rollout's): verl's own rollout correction (its
    IS weights and rejection mask, host logic in verl.trainer.ppo.rollout_corr_helper) around
    rlk's loss: REINFORCE weighted by the IS weights over the kept tokens, or the vanilla PPO clip
    (no IS weights: the ratio already is one)."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
    if config is None:
        raise ValueError("config is required for bypass_mode loss")
    rc = config.policy_loss.get("rollout_correction", None) if hasattr(config, "policy_loss") else None
    if rc is None:
        raise ValueError("rollout_correction config not found in policy_loss")
    loss_type = rc.get("loss_type", "ppo_clip")
    with torch.no_grad():
        proto, mask, metrics = compute_rollout_correction_and_rejection_mask(
            old_log_prob=log_prob, rollout_log_prob=old_log_prob, response_mask=response_mask,
            rollout_is=rc.get("rollout_is", None),
            rollout_is_threshold=rc.get("rollout_is_threshold", 2.0),
            rollout_is_batch_normalize=rc.get("rollout_is_batch_normalize", False),
            rollout_rs=rc.get("rollout_rs", None),
            rollout_rs_threshold=rc.get("rollout_rs_threshold", None))
    w = proto.batch["rollout_is_weights"] if proto else None
    if loss_type == "reinforce":
        loss, m = _run("reinforce", old_log_prob, log_prob, advantages, mask, loss_agg_mode, config,
                       w)
        out = {"actor/ppo_kl": _m(m, 13)}
    elif loss_type == "ppo_clip":
        loss, out = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, mask,
                                                loss_agg_mode, config, None)
    else:
        raise ValueError("Invalid loss_type: %s. Must be 'reinforce' or 'ppo_clip'." % loss_type)
    out.update(metrics)
    return loss, out


POLICY_LOSSES = {
    "vanilla": compute_policy_loss_vanilla,
    "gspo": compute_policy_loss_gspo,
    "sapo": compute_policy_loss_sapo,
    "cispo": compute_policy_loss_cispo,
    "gpg": compute_policy_loss_gpg,
    "geo_mean": compute_policy_loss_geo_mean,
    "clip_cov": compute_policy_loss_clip_cov,
    "kl_cov": compute_policy_loss_kl_cov,
    "dppo_tv": compute_policy_loss_dppo_tv,
    "dppo_kl": compute_policy_loss_dppo_kl,
    "dro": compute_policy_loss_dro,
    "bypass_mode": compute_policy_loss_bypass_mode,
}


def compute_policy_loss(name):
    """The adapter for a verl loss_mode name (KeyError for the ones rlk does not express)."""
    return POLICY_LOSSES[name]


def agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None,
             global_batch_size=None, loss_scale_factor=None):
    """verl agg_loss: the aggregated loss, differentiable in loss_mat (its gradient is each
    element's aggregation weight)."""
    agg = agg_args(loss_agg_mode, loss_mask, dp_size, batch_num_tokens, global_batch_size,
                   loss_scale_factor)
    minus_one = torch.full_like(loss_mat.detach(), -1.0)
    loss, _ = _ag.policy_loss(loss_mat, loss_mat.detach(), minus_one, mask_arg(loss_mask),
                              mode="reinforce", **agg)
    return loss


def compute_value_loss(vpreds, returns, values, response_mask, cliprange_value,
                       loss_agg_mode="token-mean", dp_size=1, batch_num_tokens=None,
                       global_batch_size=None, loss_scale_factor=None):
    """verl compute_value_loss: (vf_loss, vf_clipfrac), clip_by_value's split gradient."""
    agg = agg_args(loss_agg_mode, response_mask, dp_size, batch_num_tokens, global_batch_size,
                   loss_scale_factor)
    loss, m = _ag.value_loss(vpreds, values, returns, mask_arg(response_mask),
                             clip=float(cliprange_value), clamp_bound_grad=0.5, **agg)
    return loss, m[0]


def masked_whiten(values, mask, shift_mean=True):
    """verl_F.masked_whiten: (x - mean) * rsqrt(var + 1e-8) over the mask, unbiased variance
    (rlk_masked_whiten's defaults are verl's)."""
    return _ret.masked_whiten(values, mask_arg(mask), shift_mean=shift_mean)


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam):
    """verl's "gae" estimator: masked steps carry the running values through, returns =
    advantages + values before whitening, advantages whitened over the batch."""
    mask = mask_arg(response_mask)
    with torch.no_grad():
        adv, ret = _ret.gae(token_level_rewards, values, mask, gamma=float(gamma), lam=float(lam),
                            masked="skip")
        return masked_whiten(adv, mask), ret


# ---- KL penalty ------------------------------------------------------------------------

_KL_ESTIMATORS = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3",
                  "k3": "k3"}


def kl_penalty(logprob, ref_logprob, kl_penalty):
    """core_algos.kl_penalty on rlk_token_kl: "kl"/"k1", "abs", "mse"/"k2", "low_var_kl"/"k3"
    (its log-ratio clamped to [-20, 20], its value to [-10, 10]), a "+" suffix for k2's
    straight-through gradient; differentiable in both log-probs, in their dtype (bf16 and f16
    computed in f32). "full" raises NotImplementedError as verl does."""
    st = kl_penalty.endswith("+")
    est = _KL_ESTIMATORS.get(kl_penalty[:-1] if st else kl_penalty)
    if est is None:
        raise NotImplementedError("rlk: kl_penalty %r is not expressed (verl has no such estimator "
                                  "either, or needs the full logits)" % (kl_penalty,))
    dtype = torch.promote_types(logprob.dtype, ref_logprob.dtype)
    work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    lp, ref = float_pair(logprob, ref_logprob, work)
    clamps = ((-20.0, 20.0), (-10.0, 10.0)) if est == "k3" else (None, None)
    kl = _ag.token_kl(lp, ref, est, input_clamp=clamps[0], output_clamp=clamps[1],
                      straight_through=st and est != "k2", clamp_bound_grad=torch_clamp_bound_grad())
    return kl if kl.dtype is dtype else kl.to(dtype)


# ---- log-probs and entropy from logits -------------------------------------------------

def logprobs_from_logits(logits, labels, inplace_backward=True):
    """verl_F.logprobs_from_logits: log_softmax(logits)[labels] over the last dimension,
    differentiable; f32 (for bf16 / f16 logits too: rlk computes in fp32). inplace_backward as
    verl's flash-attn path: the gradient is written over the logits."""
    return _ag.token_logprob(logits, labels, inplace_backward=bool(inplace_backward))


def entropy_from_logits(logits):
    """verl_F.entropy_from_logits: the entropy of softmax(logits) per row, differentiable; f32."""
    labels = torch.zeros(logits.shape[:-1], dtype=torch.int64, device=logits.device)
    return _ag.token_logprob(logits, labels, entropy=True)[1]


# ---- outcome advantage estimators ------------------------------------------------------

def _groups(index, device):
    """verl's `index` (a group id per sample, in any order) as rlk's contiguous groups: the
    stable order that puts each group's members together (None when they already are), and a
    fixed group size or the group offsets on `device`. Host work on a host array: no sync."""
    ids = np.asarray(index)
    _, first, inv = np.unique(ids, return_index=True, return_inverse=True)
    # groups numbered by first appearance, members in their order
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    key = rank[inv.reshape(-1)]
    order = np.argsort(key, kind="stable")
    counts = np.bincount(key, minlength=len(first))
    perm = None if np.array_equal(order, np.arange(len(order))) else order
    if counts.size and np.all(counts == counts[0]):
        return perm, {"group_size": int(counts[0])}
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return perm, {"group_offsets": torch.as_tensor(offs, device=device)}


def _outcome(token_level_rewards, response_mask, index, mode, epsilon, singleton="mean0-std1",
             weights=None):
    """advantages [B, T] = per-sequence group advantages of the rows' reward sums x the mask."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        perm, grouping = _groups(index, scores.device)
        if perm is not None:
            p = torch.as_tensor(perm, device=scores.device)
            scores = scores[p]
            weights = weights[p] if weights is not None else None
        adv = _ga.group_advantage(scores, mode=mode, eps=float(epsilon), unbiased=True,
                                  singleton=singleton, weights=weights, **grouping)
        if perm is not None:
            adv = torch.empty_like(adv).index_copy_(0, p, adv)
        out = adv.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask
    return out, out


def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                   norm_adv_by_std_in_grpo=True, config=None):
    """verl "grpo": (s - mean_g) / (std_g + epsilon), or s - mean_g (Dr. GRPO); a one-member
    group uses mean 0 and std 1."""
    mode = "grpo" if norm_adv_by_std_in_grpo else "mean-only"
    return _outcome(token_level_rewards, response_mask, index, mode, epsilon)


def compute_grpo_vectorized_outcome_advantage(token_level_rewards, response_mask, index,
                                              epsilon=1e-6, norm_adv_by_std_in_grpo=True,
                                              config=None):
    """verl "grpo_vectorized": the same advantages as "grpo" (its variance floor is 0)."""
    mode = "grpo" if norm_adv_by_std_in_grpo else "mean-only"
    return _outcome(token_level_rewards, response_mask, index, mode, epsilon)


def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                   config=None, **kwargs):
    """verl "rloo": s - mean of the other members; a one-member group keeps its score."""
    return _outcome(token_level_rewards, response_mask, index, "rloo", epsilon)


def compute_rloo_vectorized_outcome_advantage(token_level_rewards, response_mask, index,
                                              epsilon=1e-6, config=None, **kwargs):
    """verl "rloo_vectorized": as "rloo", but a one-member group gets 0."""
    return _outcome(token_level_rewards, response_mask, index, "rloo", epsilon, singleton="zero")


def compute_opo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                  config=None, **kwargs):
    """verl "opo": s - the group's length-weighted mean score (lengths: the mask's row sums)."""
    lengths = response_mask.sum(dim=-1).to(token_level_rewards.dtype)
    return _outcome(token_level_rewards, response_mask, index, "opo", epsilon, weights=lengths)


def compute_grpo_passk_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                         norm_adv_by_std_in_grpo=True, config=None, **kwargs):
    """verl "grpo_passk": the best member gets max - second max (over std + epsilon when
    config's norm_adv_by_std_in_grpo, default True), the others 0. verl refuses a group of one
    member (ValueError); rlk gives it 0."""
    if config is None:
        raise ValueError("grpo_passk: config is required (verl asserts it)")
    scaled = config.get("norm_adv_by_std_in_grpo", True)
    return _outcome(token_level_rewards, response_mask, index,
                    "passk" if scaled else "passk-unscaled", epsilon)


def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards, response_mask,
                                                           index, epsilon=1e-6, config=None,
                                                           **kwargs):
    """verl "reinforce_plus_plus_baseline": s - mean_g over the tokens, whitened over the mask."""
    adv, _ = _outcome(token_level_rewards, response_mask, index, "mean-only", epsilon)
    with torch.no_grad():
        out = masked_whiten(adv, response_mask) * response_mask
    return out, out


def _token_baseline(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared,
                    rollout_is_weights, handle_zero_tail, epsilon, compact):
    """(advantages, returns) of rlk.token_baseline on verl's groups: rows gathered into
    contiguous groups (members in batch order) when `index` does not already give them, the
    results scattered back. Computes in the rewards' dtype (f32 for other float dtypes)."""
    with torch.no_grad():
        out_dt = token_level_rewards.dtype
        dt = out_dt if out_dt in (torch.float32, torch.float64) else torch.float32
        xs = [None if x is None else x.to(dt)
              for x in (token_level_rewards, old_log_probs, sum_pi_squared, rollout_is_weights)]
        mask = mask_arg(response_mask)
        perm, grouping = _groups(index, token_level_rewards.device)
        if perm is not None:
            p = torch.as_tensor(perm, device=token_level_rewards.device)
            xs = [None if x is None else x[p] for x in xs]
            mask = mask[p]
        adv, ret = _tb.token_baseline(xs[0], xs[1], xs[2], mask=mask, rollout_is_weights=xs[3],
                                      epsilon=float(epsilon), compact=compact,
                                      handle_zero_tail=bool(handle_zero_tail), **grouping)
        if perm is not None:
            adv = torch.empty_like(adv).index_copy_(0, p, adv)
            ret = torch.empty_like(ret).index_copy_(0, p, ret)
    return adv.to(out_dt), ret.to(out_dt)


def compute_optimal_token_baseline_advantage(token_level_rewards, response_mask, index,
                                             old_log_probs, sum_pi_squared,
                                             rollout_is_weights=None, handle_zero_tail=True,
                                             epsilon=1e-8, **kwargs):
    """verl "optimal_token_baseline": per group and column t, the baseline
    sum(G W m) / (sum(W m) + epsilon) with W the cumulative 1 - 2 pi + sum pi^2 (x the rollout
    weights squared) under the mask; a one-member group has none; handle_zero_tail zeroes the
    unique longest member's baseline past the second-longest length. Masked rewards count as 0."""
    return _token_baseline(token_level_rewards, response_mask, index, old_log_probs,
                           sum_pi_squared, rollout_is_weights, handle_zero_tail, epsilon, False)


def compute_multi_turn_optimal_token_baseline_advantage(token_level_rewards, response_mask, index,
                                                        old_log_probs, sum_pi_squared,
                                                        rollout_is_weights=None,
                                                        handle_zero_tail=True, epsilon=1e-8,
                                                        **kwargs):
    """verl "tir_optimal_token_baseline": the same over each row's valid tokens in order (the
    k-th valid token of every member shares a baseline); rows with no valid token are left out
    of their group."""
    return _token_baseline(token_level_rewards, response_mask, index, old_log_probs,
                           sum_pi_squared, rollout_is_weights, handle_zero_tail, epsilon, True)


def compute_gdpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                   norm_adv_by_std_in_grpo=True, config=None, non_tensor_batch=None,
                                   batch=None, **kwargs):
    """verl "gdpo": each reward component (config's gdpo_reward_keys, read from non_tensor_batch and
    placed on each response's last token) normalized within its group as "grpo" does, the weighted
    sum (gdpo_reward_weights, as f32 like verl's) whitened over the mask; without the batches, the
    token rewards as the one component."""
    components, weights = [token_level_rewards], None
    if config is not None and non_tensor_batch is not None and batch is not None:
        keys = config.get("gdpo_reward_keys", None)
        if not keys:
            raise ValueError("gdpo: config's gdpo_reward_keys must list the reward components")
        device = token_level_rewards.device
        last = batch["attention_mask"][:, batch["prompts"].size(1):].sum(dim=1) - 1
        rows = torch.arange(response_mask.size(0), device=device)
        components = []
        for key in keys:
            if key not in non_tensor_batch:
                raise KeyError("gdpo: reward key %r is not in non_tensor_batch" % (key,))
            r = torch.zeros_like(response_mask, dtype=torch.float32)
            r[rows, last] = torch.tensor(np.asarray(non_tensor_batch[key], dtype=np.float32),
                                         device=device)
            components.append(r)
        w = config.get("gdpo_reward_weights", None)
        if w is not None:
            weights = [float(x) for x in torch.tensor(list(w), dtype=torch.float32)]
    total = None
    for i, r in enumerate(components):
        adv, _ = compute_grpo_outcome_advantage(r, response_mask, index, epsilon,
                                                norm_adv_by_std_in_grpo, config)
        term = adv * (weights[i] if weights else 1.0)
        total = term if total is None else total + term
    with torch.no_grad():
        out = masked_whiten(total, response_mask) * response_mask
    return out, out


def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, config=None,
                                                  **kwargs):
    """verl "reinforce_plus_plus": discounted returns (config.gamma) carried through masked
    observation tokens (RLK_RETURNS_MASKED_CARRY), whitened over the mask."""
    if config is None:
        raise ValueError("reinforce_plus_plus: config is required")
    with torch.no_grad():
        returns = _ret.discounted_returns(token_level_rewards, mask_arg(response_mask),
                                          gamma=float(config.gamma), masked="carry")
        adv = masked_whiten(returns, response_mask) * response_mask
    return adv, returns


def compute_remax_outcome_advantage(token_level_rewards, reward_baselines, response_mask,
                                    config=None, **kwargs):
    """verl "remax": returns = the reverse cumulative sums of rewards x mask, advantages =
    returns - the greedy rollout's reward x mask (rlk_reverse_cumsum with a baseline)."""
    with torch.no_grad():
        returns, adv = _ret.reverse_cumsum(token_level_rewards, mask_arg(response_mask),
                                           baseline=reward_baselines.to(token_level_rewards.dtype))
    return adv, returns


def compute_gpg_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                  f_norm=1.0, alpha=1.0, config=None, **kwargs):
    """verl "gpg": (s - mean_g) x B / (the count of non-zero scores) / f_norm; a one-member group
    keeps its score (mean-only group advantages, the factor formed on the device)."""
    adv, _ = _outcome(token_level_rewards, response_mask, index, "mean-only", epsilon)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        factor = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1) / f_norm
        out = adv * factor.to(adv.dtype)
    return out, out


ADV_ESTIMATORS = {
    "grpo": compute_grpo_outcome_advantage,
    "grpo_vectorized": compute_grpo_vectorized_outcome_advantage,
    "rloo": compute_rloo_outcome_advantage,
    "rloo_vectorized": compute_rloo_vectorized_outcome_advantage,
    "opo": compute_opo_outcome_advantage,
    "grpo_passk": compute_grpo_passk_outcome_advantage,
    "reinforce_plus_plus_baseline": compute_reinforce_plus_plus_baseline_outcome_advantage,
    "reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage,
    "remax": compute_remax_outcome_advantage,
    "gdpo": compute_gdpo_outcome_advantage,
    "gpg": compute_gpg_outcome_advantage,
    "gae": compute_gae_advantage_return,
    "optimal_token_baseline": compute_optimal_token_baseline_advantage,
    "tir_optimal_token_baseline": compute_multi_turn_optimal_token_baseline_advantage,
}


TESTED = ("0.9.1",)


class FusedLinearForPPO(torch.nn.Module):
    """verl.utils.experimental.torch_functional.FusedLinearForPPO on rlk's fused head: the
    log-probs and entropy of logits = hidden_states @ vocab_weights.T / temperature for every
    row (verl's rolled labels), the logits never stored, differentiable in both. verl's
    signature and output dtypes (log-probs f32, entropy in the hidden states' dtype); the
    kernels accumulate in f32. impl_backend: "rlk", or verl's "torch" / "liger" as the model's
    patched forward asks for (computed by rlk all the same once patched). f32 operands without
    autocast are computed by verl's own torch backend."""

    def __init__(self, chunk_size=512, impl_backend="rlk"):
        super().__init__()
        if impl_backend not in ("rlk", "torch", "liger"):
            raise ValueError("Unsupported FusedLinearForPPO backend: %s. Choose 'rlk', 'torch' "
                             "or 'liger'." % impl_backend)
        self.chunk_size = chunk_size
        self.impl_backend = impl_backend

    def forward(self, hidden_states, vocab_weights, input_ids, temperature=1.0):
        if _head.operand_dtype(hidden_states, vocab_weights) is None:
            from verl.utils.experimental.torch_functional import FusedLinearForPPOFunction
            return FusedLinearForPPOFunction.apply(hidden_states, vocab_weights,
                                                   input_ids.to(torch.int64), temperature,
                                                   self.chunk_size)
        if input_ids.shape != hidden_states.shape[:-1]:
            raise ValueError("input_ids shape %s must match hidden_states shape %s"
                             % (tuple(input_ids.shape), tuple(hidden_states.shape[:-1])))
        logp, ent = _head.head_logprobs(hidden_states, vocab_weights, input_ids,
                                        temperature=float(temperature), entropy=True)
        return logp, ent.to(hidden_states.dtype)


# backbone calls of patch(prefix=True), by who ran them ("packed", or "verl: <why>")
prefix_calls = collections.Counter()

def _sequences(ids, pos):
    """The sequences of verl's remove-padding row (host copies of input_ids [nnz] and
    position_ids [nnz]): where the positions stop counting up by one a sequence starts, as
    transformers' packed-sequence mask and flash-attention's varlen split them. Returns (the
    token tensors, their first positions). The positions' steps in numpy: a row of tens of
    thousands of tokens is past the size where torch's CPU kernels go to their thread pool,
    which on a GPU host's busy CPU cost milliseconds an operation (trl._prompt_groups)."""
    p = pos.numpy()
    starts = [0] + (np.flatnonzero(np.diff(p) != 1) + 1).tolist() + [len(ids)]
    return ([ids[a:b] for a, b in zip(starts, starts[1:])],
            [int(p[a]) for a in starts[:-1]])


def _unshared(model, input_ids, attention_mask, position_ids, extra):
    """Why a backbone call stays verl's (None: it is packed)."""
    if input_ids is None or extra.get("inputs_embeds") is not None:
        return "inputs_embeds"
    if attention_mask is not None or input_ids.shape[0] != 1:
        return "a padded batch (use_remove_padding off)"
    if position_ids is None or position_ids.dim() != 2:
        return "position ids other than one row (multimodal rotary positions)"
    if extra.get("past_key_values") is not None or extra.get("use_cache"):
        return "a cache"
    if extra.get("output_attentions") or extra.get("output_hidden_states"):
        return "attention or hidden-state outputs"
    try:
        from verl.utils.ulysses import get_ulysses_sequence_parallel_world_size
        if get_ulysses_sequence_parallel_world_size() > 1:
            return "Ulysses sequence parallelism (a rank holds a slice of the sequences)"
    except ImportError:
        pass
    from . import transformers as rtf
    why = rtf.share(model)
    if why is not None:
        return why
    emb = model.get_input_embeddings().weight.dtype
    kind = input_ids.device.type
    if emb not in _head.LOW and not (torch.is_autocast_enabled(kind)
                                     and torch.get_autocast_dtype(kind) in _head.LOW):
        return "%s attention without 16-bit autocast" % emb
    return None


def _shared_backbone(own):
    """verl.models.transformers.dense_common.forward_base_model (the backbone call of verl's
    use_fused_kernels forward) computing a remove-padding row's sequences with their shared
    prefixes once: consecutive sequences that start alike (a GRPO group: one prompt, its
    responses) are packed as [common prefix | rest_1 | ... | rest_G] (_prefix.consecutive_groups)
    and run with the prefix-shared attention; each token's hidden state is gathered back to its
    place in the row, so verl's head and everything after see the row they asked for."""
    @functools.wraps(own)
    def forward_base_model(self, input_ids=None, attention_mask=None, position_ids=None, **extra):
        why = _unshared(self, input_ids, attention_mask, position_ids, extra)
        if why is None:
            seqs, firsts = _sequences(input_ids[0].cpu(), position_ids[0].cpu())
            groups = _prefix.consecutive_groups(seqs, firsts)
            if all(L == 0 or len(m) == 1 for m, L in groups):
                why = "no sequences share a prefix"
        if why is not None:
            prefix_calls["verl: " + why] += 1
            return own(self, input_ids=input_ids, attention_mask=attention_mask,
                       position_ids=position_ids, **extra)
        packed = _prefix.pack(seqs, firsts, groups)
        dev = input_ids.device
        from . import transformers as rtf
        out = self.model(input_ids=packed.ids.to(dev)[None],
                         position_ids=packed.positions.to(dev)[None], attention_mask=rtf.packed_mask(dev),
                         use_cache=False, rlk_layout=packed.layout)
        rows = torch.cat(packed.rows).to(dev)
        prefix_calls["packed"] += 1
        from transformers.modeling_outputs import BaseModelOutputWithPast
        hidden = out.last_hidden_state[0].index_select(0, rows)[None]
        return BaseModelOutputWithPast(last_hidden_state=hidden)
    return stand_in(forward_base_model, own)


# The modules of verl's PPO path that imported agg_loss, compute_value_loss or kl_penalty by
# name: patched there (core_algos' own functions keep verl's).
_IMPORTERS = ("verl.workers.utils.losses", "verl.trainer.ppo.ray_trainer",
              "verl.trainer.ppo.v1.trainer_base")
# ... and those that imported logprobs_from_logits or entropy_from_logits by name (the engines'
# log-prob paths without fused kernels, the rollout's)
_TF_IMPORTERS = ("verl.workers.engine.fsdp.transformer_impl", "verl.workers.engine.automodel.transformer_impl",
                 "verl.workers.engine.torchtitan.transformer_impl", "verl.workers.rollout.naive.naive_rollout",
                 "verl.trainer.ppo.prefix_grouper_utils")


def _by_name(h, modules, own, mine):
    """Sets mine[name] in each of `modules` that holds verl's own[name] by name (a module that
    does not import here is reported as left)."""
    import importlib
    for modname in modules:
        try:
            mod = importlib.import_module(modname)
        except Exception as e:  # a module whose own imports are missing here
            h.left(modname, "not importable: %s" % type(e).__name__)
            continue
        for name, fn in mine.items():
            if getattr(mod, name, None) is own[name]:
                h.set(mod, name, fn)
                h.swapped("%s.%s" % (modname, name))


def patch(*, force=False, fused_head=True, prefix=False):
    """Swaps the adapters into verl: the policy-loss and advantage-estimator registries (and
    core_algos' estimator functions, which verl's trainer also calls by module attribute),
    agg_loss / compute_value_loss / kl_penalty where verl's PPO path imported them, the
    log-probs and entropy from logits (verl.utils.torch_functional), and with fused_head the
    fused LM head of use_fused_kernels (FusedLinearForPPO). Refuses a verl other than TESTED
    unless force. prefix (opt-in): the backbone of the use_fused_kernels forward computes a
    remove-padding row's shared prefixes once (_shared_backbone; the model gets the shared
    attention on its first packed call and keeps it); calls it does not fit stay verl's
    (prefix_calls counts both). Returns a handle: undo() restores verl's own; .report says what
    was swapped and what was left. Code that imported a function by name before patch() keeps
    verl's, except in the modules listed in _IMPORTERS and _TF_IMPORTERS."""
    import verl.trainer.ppo.core_algos as ca
    h = Patch()
    with all_or_nothing(h):
        h.report["version"] = check_version("verl", TESTED, force)
        for name, fn in POLICY_LOSSES.items():
            if name in ca.POLICY_LOSS_REGISTRY:
                h.set_item(ca.POLICY_LOSS_REGISTRY, name, fn)
                h.swapped("policy loss %r" % name)
        for name in ca.POLICY_LOSS_REGISTRY:
            if name not in POLICY_LOSSES:
                h.left("policy loss %r" % name, "not expressed by rlk")
        for name, fn in ADV_ESTIMATORS.items():
            if name in ca.ADV_ESTIMATOR_REGISTRY:
                h.set_item(ca.ADV_ESTIMATOR_REGISTRY, name, fn)
            h.set(ca, fn.__name__, fn)
            h.swapped("advantage estimator %r" % name)
        own = {"agg_loss": ca.agg_loss, "compute_value_loss": ca.compute_value_loss,
               "kl_penalty": ca.kl_penalty}
        mine = {"agg_loss": agg_loss, "compute_value_loss": compute_value_loss,
                "kl_penalty": kl_penalty}
        _by_name(h, _IMPORTERS, own, mine)
        h.left("core_algos.agg_loss", "verl's own functions keep verl's aggregation")
        import verl.utils.torch_functional as vf
        own = {"logprobs_from_logits": vf.logprobs_from_logits,
               "entropy_from_logits": vf.entropy_from_logits}
        mine = {"logprobs_from_logits": logprobs_from_logits,
                "entropy_from_logits": entropy_from_logits}
        # the importers first: one that first loads here takes verl's by name, and is patched (and
        # restored) as the others are
        _by_name(h, _TF_IMPORTERS, own, mine)
        for name, fn in mine.items():
            h.set(vf, name, fn)
        h.swapped("torch_functional.logprobs_from_logits / entropy_from_logits")
        if fused_head:
            import verl.utils.experimental.torch_functional as xf
            h.set(xf, "FusedLinearForPPO", FusedLinearForPPO)
            h.swapped("FusedLinearForPPO (use_fused_kernels, torch and liger backends)")
            h.left("use_fused_kernels with the triton backend", "verl's own kernels")
        else:
            h.left("FusedLinearForPPO", "fused_head=False")
        if prefix:
            import verl.models.transformers.dense_common as dc
            h.set(dc, "forward_base_model", _shared_backbone(trainer_own(dc.forward_base_model)))
            h.swapped("use_fused_kernels backbone: remove-padding rows' shared prefixes once "
                      "(prefix-shared attention)")
            h.left("padded batches, Ulysses sequence parallelism, multimodal positions",
                   "verl's own backbone call (prefix_calls counts them)")
        else:
            h.left("use_fused_kernels backbone, every sequence whole", "prefix=False")
    return h

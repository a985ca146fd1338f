"""verl (verl.trainer.ppo.core_algos) on rlk: the registered policy losses, agg_loss and
compute_value_loss with verl's signatures and semantics (tested against verl 0.9.1).

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
import math

import torch

from .. import autograd as _ag
from ..ops import returns as _ret
from ._common import Patch, as_float, mask_arg, mask_total, nonempty_rows, torch_clamp_bound_grad

__all__ = ["POLICY_LOSSES", "agg_args", "agg_loss", "compute_policy_loss", "compute_value_loss",
           "compute_gae_advantage_return", "masked_whiten", "patch"]


def agg_args(loss_agg_mode, loss_mask, dp_size=1, batch_num_tokens=None, global_batch_size=None,
             loss_scale_factor=None):
    """rlk's aggregation arguments for verl's agg_loss settings."""
    out = {"agg": loss_agg_mode, "loss_scale": float(dp_size)}
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = mask_total(loss_mask)
        out["token_normalizer"] = as_float(batch_num_tokens)
    elif loss_agg_mode == "token-sum":
        pass
    elif loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = nonempty_rows(loss_mask)
        out["seq_normalizer"] = as_float(global_batch_size)
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
    return _ag.policy_loss(log_prob, old_log_prob, advantages, mask, mode=mode,
                           rollout_is_weights=rollout_is_weights, **kw)


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
    log-ratio); loss_agg_mode and the global batch settings are ignored, as verl does."""
    if rollout_is_weights is not None:
        raise NotImplementedError("rlk: geo_mean with rollout_is_weights is not expressed")
    lo, hi = _clip(config)
    loss, m = _ag.policy_loss(
        log_prob, old_log_prob, advantages, mask_arg(response_mask), mode="geo_mean",
        clip_low=lo, clip_high=hi, log_ratio_min=-math.inf, log_ratio_max=math.inf,
        clamp_bound_grad=torch_clamp_bound_grad(), agg="seq-mean-token-mean",
        seq_normalizer=float(response_mask.shape[0]))
    return loss, {"actor/pg_clipfrac": _m(m, 0), "actor/ppo_kl": _m(m, 13),
                  "actor/pg_clipfrac_lower": _m(m, 1)}


POLICY_LOSSES = {
    "vanilla": compute_policy_loss_vanilla,
    "gspo": compute_policy_loss_gspo,
    "sapo": compute_policy_loss_sapo,
    "cispo": compute_policy_loss_cispo,
    "gpg": compute_policy_loss_gpg,
    "geo_mean": compute_policy_loss_geo_mean,
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


def patch():
    """Swaps the adapters into verl.trainer.ppo.core_algos (its policy-loss registry and module
    functions). Returns a handle whose undo() restores verl's own. Code that imported a function
    by name before patch() keeps verl's."""
    import verl.trainer.ppo.core_algos as ca
    h = Patch()
    for name, fn in POLICY_LOSSES.items():
        if name in ca.POLICY_LOSS_REGISTRY:
            h.set_item(ca.POLICY_LOSS_REGISTRY, name, fn)
        h.set(ca, "compute_policy_loss_" + name, fn)
    h.set(ca, "agg_loss", agg_loss)
    h.set(ca, "compute_gae_advantage_return", compute_gae_advantage_return)
    h.set(ca, "compute_value_loss", compute_value_loss)
    return h

"""OpenRLHF (openrlhf.models.loss, openrlhf.models.utils, openrlhf.trainer.ppo_utils) on rlk:
PolicyLoss, ValueLoss, compute_approx_kl and GAE with OpenRLHF's signatures and semantics
(tested against OpenRLHF 0.11.2).

    from rlk.integrations import openrlhf as rlk_openrlhf
    with rlk_openrlhf.patch():      # openrlhf.models.loss.PolicyLoss / ValueLoss are rlk's
        ...

Conventions reproduced: ppo's log-ratio clamp [-20, 20]; gspo without one, its gradient through
the sequence's masked mean and dual clip applied; token-level loss over the global token count
(or the local mask sum) times dp_size; sequence-level over the non-empty sequences (or the
global count); ppo_kl of the unclamped log-ratio; torch.clamp's gradient on a bound as the
installed torch gives it; the train/rollout mismatch correction (is_correction_*): for ppo the
gate's per-token weights as rlk's rollout weights, for gspo the sequence ratio against the
rollout log-probs.
"""
import math

import torch
from torch import nn

from .. import autograd as _ag
from ..ops import returns as _ret
from ._common import (Patch, as_float, dense, float_pair, mask_arg, mask_total, nonempty_rows,
                      torch_clamp_bound_grad)

__all__ = ["PolicyLoss", "ValueLoss", "compute_approx_kl", "get_advantages_and_returns", "patch"]

# openrlhf.models.utils.KL_IS_WEIGHT_CLIP: the bound of the unbiased KL gradient's weight
KL_IS_WEIGHT_CLIP = 10.0


def _masked_mean(x, mask, dim=None):
    """openrlhf.models.utils.masked_mean (masked entries may hold anything, NaN included: they
    count as 0, as in rlk's kernels)."""
    return (torch.where(mask.bool(), x, 0.0) * mask).sum(dim=dim) / mask.sum(dim=dim)


def _agg(token_level_loss, action_mask, dp_size, batch_num_tokens, global_batch_size):
    if token_level_loss:
        if batch_num_tokens is None:
            return {"agg": "token-mean", "token_normalizer": mask_total(action_mask)}
        return {"agg": "token-mean", "token_normalizer": as_float(batch_num_tokens),
                "loss_scale": float(dp_size)}
    if global_batch_size is None:
        return {"agg": "seq-mean-token-mean", "seq_normalizer": nonempty_rows(action_mask)}
    return {"agg": "seq-mean-token-mean", "seq_normalizer": as_float(global_batch_size),
            "loss_scale": float(dp_size)}


class PolicyLoss(nn.Module):
    """openrlhf.models.loss.PolicyLoss on rlk (ppo and gspo)."""

    def __init__(self, clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=None, token_level_loss=True,
                 policy_loss_type="ppo", is_correction_level="off", is_correction_mode="mask",
                 is_correction_gating="ratio", is_correction_threshold=(0.5, 5.0)):
        super().__init__()
        if is_correction_level not in {"off", "token", "seq"}:
            raise ValueError(f"is_correction_level must be off/token/seq, got {is_correction_level}")
        if is_correction_mode not in {"mask", "clip"}:
            raise ValueError(f"is_correction_mode must be mask/clip, got {is_correction_mode}")
        if is_correction_gating not in {"ratio", "binary_kl", "tv"}:
            raise ValueError(f"is_correction_gating must be ratio/binary_kl/tv, got {is_correction_gating}")
        if is_correction_mode == "clip" and (is_correction_level == "seq" or is_correction_gating != "ratio"):
            raise ValueError("is_correction_mode=clip requires is_correction_level=token and "
                             "is_correction_gating=ratio")
        if is_correction_gating != "ratio" and is_correction_level != "off" and is_correction_threshold[0] > 0:
            raise ValueError(f"is_correction_gating={is_correction_gating} takes an upper bound only (a single delta)")
        if policy_loss_type not in ("ppo", "gspo"):
            raise ValueError("Invalid policy loss type: %s" % policy_loss_type)
        if dual_clip is not None:
            assert dual_clip > 1.0, f"dual_clip must be > 1.0, got {dual_clip}"
        self.clip_eps_low = clip_eps_low
        self.clip_eps_high = clip_eps_high
        self.dual_clip = dual_clip
        self.policy_loss_type = policy_loss_type
        self.token_level_loss = token_level_loss and policy_loss_type != "gspo"
        self.is_correction_level = is_correction_level
        self.is_correction_mode = is_correction_mode
        self.is_correction_gating = is_correction_gating
        self.is_correction_threshold = is_correction_threshold

    def _is_correction(self, old_log_probs, rollout_log_probs, action_mask):
        """OpenRLHF's train/rollout correction of a ppo loss: the per-token weights (detached)
        and its metrics (vllm_kl, is_filter_ratio)."""
        low, high = self.is_correction_threshold
        seq = self.is_correction_level == "seq"
        with torch.no_grad():
            lr = (old_log_probs - rollout_log_probs).detach()
            token_is = lr.exp()
            if self.is_correction_gating == "ratio":
                stat = (_masked_mean(lr, action_mask, -1).unsqueeze(-1) if seq else lr).exp()
            else:
                p = rollout_log_probs.exp().clamp(1e-6, 1 - 1e-6)
                q = old_log_probs.exp().clamp(1e-6, 1 - 1e-6)
                if self.is_correction_gating == "binary_kl":
                    stat = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
                else:
                    stat = (p - q).abs()
                if seq:
                    stat = _masked_mean(stat, action_mask, -1).unsqueeze(-1)
            if self.is_correction_mode == "clip":
                coef = stat.clamp(min=low, max=high)
                filtered = (stat < low) | (stat > high)
            else:
                keep = (stat >= low) & (stat <= high)
                coef = torch.where(keep, token_is, 0.0)
                filtered = ~keep
            ratio = filtered.float().mean() if seq else _masked_mean(filtered.float(), action_mask)
            vllm_kl = _masked_mean(rollout_log_probs - old_log_probs, action_mask)
        return coef.expand_as(old_log_probs).contiguous(), vllm_kl, ratio

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None,
                rollout_log_probs=None, dp_size=1, batch_num_tokens=None, global_batch_size=None):
        gspo = self.policy_loss_type == "gspo"
        if action_mask is None:
            action_mask = torch.ones_like(log_probs, dtype=torch.float32)
        kw = _agg(self.token_level_loss, action_mask, dp_size, batch_num_tokens,
                  global_batch_size)
        lr = math.inf if gspo else 20.0
        correct = self.is_correction_level != "off"
        isw = vllm_kl = is_filter_ratio = None
        ref = old_log_probs
        if correct and gspo:
            ref = rollout_log_probs  # the sequence ratio against the rollout policy
        elif correct:
            isw, vllm_kl, is_filter_ratio = self._is_correction(old_log_probs, rollout_log_probs,
                                                                action_mask)
        loss, m = _ag.policy_loss(
            log_probs, dense(ref), dense(advantages), mask_arg(action_mask),
            rollout_is_weights=dense(isw),
            mode="gspo" if gspo else "ppo", clip_low=self.clip_eps_low,
            clip_high=self.clip_eps_high,
            dual_clip=0.0 if self.dual_clip is None else float(self.dual_clip),
            log_ratio_min=-lr, log_ratio_max=lr, seq_ratio_grad="through_mean",
            clamp_bound_grad=torch_clamp_bound_grad(), **kw)
        ppo_kl = m[13]
        if correct and gspo:
            with torch.no_grad():
                ppo_kl = _masked_mean(-(log_probs - old_log_probs).detach(), action_mask)
        return loss, m[0], ppo_kl, vllm_kl, is_filter_ratio


class ValueLoss(nn.Module):
    """openrlhf.models.loss.ValueLoss on rlk."""

    def __init__(self, clip_eps=None, token_level_loss=True):
        super().__init__()
        self.clip_eps = clip_eps
        self.token_level_loss = token_level_loss

    def forward(self, values, old_values, returns, action_mask=None, dp_size=1,
                batch_num_tokens=None, global_batch_size=None):
        if action_mask is None:
            action_mask = torch.ones_like(values, dtype=torch.float32)
        kw = _agg(self.token_level_loss, action_mask, dp_size, batch_num_tokens,
                  global_batch_size)
        clip = math.inf if self.clip_eps is None else float(self.clip_eps)
        loss, _ = _ag.value_loss(values, old_values, returns, mask_arg(action_mask), clip=clip,
                                 clamp_bound_grad=torch_clamp_bound_grad(), **kw)
        return loss


def compute_approx_kl(log_probs, log_probs_base, log_probs_old=None, kl_estimator="k1",
                      unbiased_gradient=False):
    """openrlhf.models.utils.compute_approx_kl on rlk_token_kl: k1, k2 or k3 of the f32
    log-ratio (k3's clamped below at -10), every value clamped to [-10, 10]; unbiased_gradient:
    the value with the straight-through gradient w (log_probs - log_probs_base), w =
    min(exp(log_probs - log_probs_old), KL_IS_WEIGHT_CLIP) (1 without log_probs_old).
    Differentiable in log_probs and log_probs_base; f32 as OpenRLHF's."""
    if kl_estimator not in ("k1", "k2", "k3"):
        raise ValueError(f"Unknown kl_estimator: {kl_estimator}")
    lp, base = float_pair(log_probs, log_probs_base, torch.float32)
    kw = {}
    if unbiased_gradient:
        kw = dict(straight_through=True, is_weight_max=KL_IS_WEIGHT_CLIP)
        if log_probs_old is not None:
            kw["old_logp"] = log_probs_old.detach().float().contiguous()
    return _ag.token_kl(lp, base, kl_estimator, input_clamp=(-10.0, None) if kl_estimator == "k3" else None,
                        output_clamp=(-10.0, 10.0), clamp_bound_grad=torch_clamp_bound_grad(), **kw)


def get_advantages_and_returns(values, rewards, action_mask, gamma, lambd):
    """OpenRLHF's GAE (rewards and values zeroed where the mask is 0, no masked carry):
    (advantages, returns)."""
    mask = mask_arg(action_mask) if action_mask is not None else None
    adv, ret = _ret.gae(rewards, values, mask, gamma=gamma, lam=lambd, masked="zero")
    return adv, ret


def patch():
    """Swaps PolicyLoss and ValueLoss into openrlhf.models.loss (and openrlhf.models), and
    compute_approx_kl into openrlhf.models.utils and the trainer modules that imported it by
    name (the actor and the experience maker). Returns a handle whose undo() restores
    OpenRLHF's own."""
    import openrlhf.models.loss as L
    import openrlhf.models.utils as U
    h = Patch()
    h.set(L, "PolicyLoss", PolicyLoss)
    h.set(L, "ValueLoss", ValueLoss)
    own_kl = U.compute_approx_kl
    h.set(U, "compute_approx_kl", compute_approx_kl)
    try:
        import openrlhf.models as M
        h.set(M, "PolicyLoss", PolicyLoss)
        h.set(M, "ValueLoss", ValueLoss)
    except Exception:
        pass
    for name in ("openrlhf.trainer.ray.ppo_actor", "openrlhf.trainer.ppo_utils.experience_maker"):
        try:
            mod = __import__(name, fromlist=["compute_approx_kl"])
        except Exception:  # a trainer module whose own imports (ray, deepspeed) are missing here
            continue
        if getattr(mod, "compute_approx_kl", None) is own_kl:
            h.set(mod, "compute_approx_kl", compute_approx_kl)
    return h

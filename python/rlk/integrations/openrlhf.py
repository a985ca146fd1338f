"""OpenRLHF (openrlhf.models.loss, openrlhf.trainer.ppo_utils) on rlk: PolicyLoss, ValueLoss and
GAE with OpenRLHF's signatures and semantics (tested against OpenRLHF 0.11.2).

    from rlk.integrations import openrlhf as rlk_openrlhf
    with rlk_openrlhf.patch():      # openrlhf.models.loss.PolicyLoss / ValueLoss are rlk's
        ...

Conventions reproduced: ppo's log-ratio clamp [-20, 20]; gspo without one, its gradient through
the sequence's masked mean and dual clip applied; token-level loss over the global token count
(or the local mask sum) times dp_size; sequence-level over the non-empty sequences (or the
global count); ppo_kl of the unclamped log-ratio; torch.clamp's gradient on a bound as the
installed torch gives it. Not expressed: the train/rollout mismatch correction
(is_correction_level != "off") raises NotImplementedError.
"""
import math

import torch
from torch import nn

from .. import autograd as _ag
from ..ops import returns as _ret
from ._common import Patch, as_float, mask_arg, mask_total, nonempty_rows, torch_clamp_bound_grad

__all__ = ["PolicyLoss", "ValueLoss", "get_advantages_and_returns", "patch"]


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
        if is_correction_level != "off":
            raise NotImplementedError("rlk: is_correction_level=%r is not expressed"
                                      % is_correction_level)
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

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None,
                rollout_log_probs=None, dp_size=1, batch_num_tokens=None, global_batch_size=None):
        gspo = self.policy_loss_type == "gspo"
        if action_mask is None:
            action_mask = torch.ones_like(log_probs, dtype=torch.float32)
        kw = _agg(self.token_level_loss, action_mask, dp_size, batch_num_tokens,
                  global_batch_size)
        lr = math.inf if gspo else 20.0
        loss, m = _ag.policy_loss(
            log_probs, old_log_probs, advantages, mask_arg(action_mask),
            mode="gspo" if gspo else "ppo", clip_low=self.clip_eps_low,
            clip_high=self.clip_eps_high,
            dual_clip=0.0 if self.dual_clip is None else float(self.dual_clip),
            log_ratio_min=-lr, log_ratio_max=lr, seq_ratio_grad="through_mean",
            clamp_bound_grad=torch_clamp_bound_grad(), **kw)
        return loss, m[0], m[13], None, None


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


def get_advantages_and_returns(values, rewards, action_mask, gamma, lambd):
    """OpenRLHF's GAE (rewards and values zeroed where the mask is 0, no masked carry):
    (advantages, returns)."""
    mask = mask_arg(action_mask) if action_mask is not None else None
    adv, ret = _ret.gae(rewards, values, mask, gamma=gamma, lam=lambd, masked="zero")
    return adv, ret


def patch():
    """Swaps PolicyLoss and ValueLoss into openrlhf.models.loss (and openrlhf.models). Returns a
    handle whose undo() restores OpenRLHF's own."""
    import openrlhf.models.loss as L
    h = Patch()
    h.set(L, "PolicyLoss", PolicyLoss)
    h.set(L, "ValueLoss", ValueLoss)
    try:
        import openrlhf.models as M
        h.set(M, "PolicyLoss", PolicyLoss)
        h.set(M, "ValueLoss", ValueLoss)
    except Exception:
        pass
    return h

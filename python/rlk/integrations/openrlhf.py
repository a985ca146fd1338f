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

The fused head (patch(head=True)): openrlhf.models.actor.Actor.forward = actor_forward. Where the
actor is asked for its action log-probs (the policy update, the old policy's and the reference's
passes), the model's body gives the hidden states (padded, or packed by OpenRLHF's own
unpad_and_slice_tensor with packing_samples) and only the rows that score an action (action_mask
1) go through rlk's fused head (_head), the logits never formed; with return_entropy the
entropy of those rows comes from the same pass. The output it returns holds no logits: its
entropy is the actions' (0 elsewhere, where OpenRLHF's PPO actor never reads it). Every other
call (no action mask, return_logprobs over all tokens, ring attention, multimodal inputs, a MoE
router loss, an LM head with a bias or a softcap, f32 without autocast, DeepSpeed ZeRO-3, which
keeps the head's weight partitioned outside its own forward) is OpenRLHF's own forward;
head_calls counts both.
"""
import collections
import math

import torch
from torch import nn

from .. import autograd as _ag
from ..ops import returns as _ret
from . import _head
from ._common import (Patch, all_or_nothing, as_float, check_version, dense, float_pair,
                      mask_arg, mask_total, nonempty_rows, stand_in, torch_clamp_bound_grad,
                      trainer_own)

__all__ = ["PolicyLoss", "ValueLoss", "compute_approx_kl", "get_advantages_and_returns",
           "actor_forward", "head_calls", "TESTED", "patch"]

TESTED = ("0.11.2",)

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
            log_probs, dense(ref), dense(advantages, per_sequence=True), mask_arg(action_mask),
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


# Actor.forward calls of the patched actor, by who computed them ("rlk", or "openrlhf: <why>")
head_calls = collections.Counter()
_own = {}


def _unfused(actor, action_mask, return_logprobs, allgather_logits, ring_attn_group, mm_inputs):
    """Why an Actor.forward call stays OpenRLHF's (None: rlk's head computes it)."""
    if action_mask is None or return_logprobs:
        return "log-probs of every token or the logits asked for"
    if allgather_logits:
        return "allgather_logits"
    if ring_attn_group is not None:
        return "ring attention"
    if mm_inputs or getattr(actor, "is_vlm", False):
        return "multimodal inputs"
    hf = _causal_lm(actor.model)
    cfg = hf.config.get_text_config()
    if getattr(cfg, "output_router_logits", False):
        return "a MoE router loss"
    why = _head.unfused_head(hf)
    if why is not None:
        return why
    head = hf.get_output_embeddings()
    if _head.partitioned(head.weight):
        return "DeepSpeed ZeRO-3 (the head's weight partitioned)"
    if _head.operand_dtype(head.weight, head.weight) is None:
        return "an f32 head without autocast"
    return None


def _causal_lm(model):
    """The transformers causal LM inside OpenRLHF's actor model (under a PEFT wrapper)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def actor_forward(self, sequences, action_mask=None, attention_mask=None, return_output=False,
                  allgather_logits=False, return_logprobs=False, ring_attn_group=None,
                  packed_seq_lens=None, return_entropy=False, **mm_inputs):
    """openrlhf.models.actor.Actor.forward with the action log-probs (and entropy) from the
    model's hidden states through rlk's fused head, only the action rows: OpenRLHF's signature,
    positions (padded: the mask's cumulative sum; packed: OpenRLHF's unpad_and_slice_tensor) and
    outputs (action log-probs [B, A] in f32, 0 where action_mask is 0; with return_output, an
    output whose entropy [B, S - 1] holds the action rows' entropy)."""
    why = _unfused(self, action_mask, return_logprobs, allgather_logits, ring_attn_group, mm_inputs)
    if why is not None:
        head_calls["openrlhf: " + why] += 1
        return _own["forward"](self, sequences, action_mask, attention_mask, return_output,
                               allgather_logits, return_logprobs, ring_attn_group, packed_seq_lens,
                               return_entropy, **mm_inputs)
    B, S = sequences.shape
    A = action_mask.shape[1]
    hf = _causal_lm(self.model)
    body = hf.get_decoder()
    b, j = action_mask.bool().nonzero(as_tuple=True)
    cols = S - 1 - A + j  # the row that predicts action j: OpenRLHF's log_probs[:, :-1][:, -A:]
    labels = sequences[b, cols + 1]
    if self.packing_samples:
        from openrlhf.models.ring_attn_utils import unpad_and_slice_tensor
        packed, position_ids, _, _, indices = unpad_and_slice_tensor(sequences, attention_mask, None)
        hidden = body(input_ids=packed, attention_mask=None, position_ids=position_ids,
                      use_cache=False).last_hidden_state[0]
        where = torch.full((B * S,), -1, dtype=torch.long, device=sequences.device)
        where[indices] = torch.arange(len(indices), device=sequences.device)
        rows = hidden.index_select(0, where[b * S + cols])
    else:
        position_ids = attention_mask.long().cumsum(-1) - 1
        position_ids.masked_fill_(attention_mask == 0, 1)
        hidden = body(input_ids=sequences, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False).last_hidden_state
        rows = hidden[b, cols]
    head_calls["rlk"] += 1
    logp, ent = _head.head_logprobs(rows, hf.get_output_embeddings().weight, labels,
                                    temperature=float(self.temperature), entropy=return_entropy)
    action_log_probs = logp.new_zeros(B, A).index_put((b, j), logp)
    if not return_output:
        return action_log_probs
    from transformers.modeling_outputs import CausalLMOutputWithPast
    output = CausalLMOutputWithPast()
    if return_entropy:
        setattr(output, "entropy", ent.new_zeros(B, S - 1).index_put((b, cols), ent))
    return action_log_probs, output


# The modules of OpenRLHF's PPO path that imported PolicyLoss, ValueLoss or compute_approx_kl by
# name (openrlhf.models re-exports the losses; the actor, the critic and the experience maker take
# them from there and from openrlhf.models.utils)
_IMPORTERS = ("openrlhf.models", "openrlhf.trainer.ray.ppo_actor",
              "openrlhf.trainer.ray.ppo_critic", "openrlhf.trainer.ppo_utils.experience_maker")


def patch(*, head=True, force=False):
    """Swaps PolicyLoss and ValueLoss into openrlhf.models.loss, compute_approx_kl into
    openrlhf.models.utils, and each of them into the modules of _IMPORTERS that imported
    OpenRLHF's by name (openrlhf.models, the actor, the critic, the experience maker; those are
    imported first, so that one loaded here takes OpenRLHF's by name and is patched and restored
    as the others); with head, Actor.forward = actor_forward (the action log-probs and entropy
    through rlk's fused head). Refuses an OpenRLHF other than TESTED unless force. Returns a
    handle whose undo() restores OpenRLHF's own; .report says what was swapped (module by module)
    and what was left."""
    import importlib

    import openrlhf.models.loss as L
    import openrlhf.models.utils as U
    h = Patch()
    with all_or_nothing(h):
        h.report["version"] = check_version("openrlhf", TESTED, force)
        own = {"PolicyLoss": L.PolicyLoss, "ValueLoss": L.ValueLoss,
               "compute_approx_kl": U.compute_approx_kl}
        mine = {"PolicyLoss": PolicyLoss, "ValueLoss": ValueLoss,
                "compute_approx_kl": compute_approx_kl}
        modules = [L, U]
        for name in _IMPORTERS:
            try:
                modules.append(importlib.import_module(name))
            except Exception as e:  # a module whose own imports (ray, deepspeed) are missing
                h.left(name, "not importable: %s" % type(e).__name__)
        for mod in modules:
            for name, fn in mine.items():
                if name in mod.__dict__ and mod.__dict__[name] is own[name]:
                    h.set(mod, name, fn)
                    h.swapped("%s.%s" % (mod.__name__, name))
        if head:
            try:
                import openrlhf.models.actor as actor
            except Exception as e:
                h.left("Actor.forward",
                       "openrlhf.models.actor not importable: %s" % type(e).__name__)
            else:
                _own["forward"] = trainer_own(actor.Actor.__dict__["forward"])
                h.set(actor.Actor, "forward", stand_in(actor_forward, _own["forward"]))
                h.swapped("Actor.forward action log-probs and entropy (fused LM head)")
                h.left("Actor.forward without an action mask, ring attention, multimodal, MoE",
                       "OpenRLHF's own forward (head_calls counts them)")
        else:
            h.left("Actor.forward", "head=False")
    return h

"""TRL (trl.trainer.grpo_trainer.GRPOTrainer) on rlk: the GRPO loss for each loss_type with
TRL's semantics (tested against TRL 1.16.0).

    grpo_loss(per_token_logps, old_per_token_logps, advantages, mask, loss_type="dapo", ...)
        -> (loss, metrics)              # the loss term of GRPOTrainer._compute_loss
    group_advantages(rewards, num_generations, scale_rewards="group")
        -> advantages                   # the advantages of GRPOTrainer's scoring step
    selective_log_softmax(logits, index, temperature=1.0, row_mask=None)
    compute_loss(trainer, model, inputs)  # GRPOTrainer._compute_loss on rlk
    patch()         # GRPOTrainer's loss and its log-prob passes' LM head on rlk; undo(), .report

Conventions reproduced: no log-ratio clamp, k3 KL without clamps, each loss_type's normalizer
(grpo/sapo: mean over sequences of the per-sequence token means, empty ones counted; bnpo: the
local mask sum; dr_grpo: B * max_completion_length; dapo/cispo: num_items_in_batch per process
and accumulation window; luspo: mean over sequences of the token sums), the division by the
gradient accumulation steps in training, sequence-level importance sampling differentiated
through the masked mean, the clip metrics (per sequence at sequence level), torch.clamp's
gradient on a bound as the installed torch gives it; delta above the clip range as the dual clip,
inside it as the upper clip bound with the dual clip at 1 + epsilon_high (one tie differs: a ratio
exactly 1 + epsilon_high under a negative advantage splits its gradient where TRL's clamp passes
clamp_bound_grad); vespo as REINFORCE weighted by TRL's gamma weights of the sequence; the
off-policy sequence mask, the high-entropy token mask and the vLLM importance ratio as detached
weights of the policy term (the masks from TRL's own get_off_policy_mask / get_high_entropy_mask).
Where a setting is not expressed (delta below 1, the adaptive entropy bonus, auxiliary router
losses), compute_loss runs TRL's own code.

The fused head (patch(head=True)): GRPOTrainer's log-prob passes run the model as TRL does
(PEFT, checkpointing, DDP wrapper and all); TRL's fused forward hands the rows with a label to
ChunkedHead, which calls rlk's fused head (_head). With cast_lm_head_to_fp32 the f32 head is
rounded for the kernels to the model's dtype (bf16 or f16), or on an f32 model to the 16-bit
dtype of the trainer's mixed precision (bf16=True, fp16=True): a log-prob then differs from
TRL's f32 head's by at most 2u max_v sum_k |h_k W_vk| (u = 2^-8); measured 1.8e-3 at most, 5e-4
on average, at H 896, V 16384, |z| <= 3, a head 1e-3 off the bf16 grid. An f32 model without
16-bit mixed precision (no 16-bit dtype in play) keeps TRL's f32 head, as without the flag.
"""
import collections
import functools
import math
import threading

import numpy as np
import torch

from .. import autograd as _ag
from .._status import check_status as rlk_check_status
from ..ops import group_advantage as _ga
from . import _head, _prefix
from .trl_distill import patch as patch_distillation  # noqa: F401  (DistillationTrainer)
from ._common import (Patch, all_or_nothing, as_float, check_version, dense, mask_arg,
                      mask_total, stand_in, torch_clamp_bound_grad, trainer_own)

__all__ = ["grpo_loss", "group_advantages", "selective_log_softmax", "supported", "compute_loss",
           "ChunkedHead", "head_calls", "prefix_calls", "TESTED",
           "patch"]

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")


def group_advantages(rewards, num_generations, scale_rewards="group"):
    """The advantages GRPOTrainer computes from summed rewards [B] (multi_objective_aggregation
    "sum_then_normalize"): consecutive groups of num_generations, the group's mean subtracted and,
    for scale_rewards "group" / "batch", divided by the group's / the batch's std + 1e-4 ("none":
    not divided). A NaN reward (every reward function returned None) is unscorable: left out of
    the means and stds, advantage 0; a group with fewer than two scorable members gets 0.
    Returns f32 advantages on the rewards' device."""
    modes = {"group": "grpo", "batch": "batch-std", "none": "mean-only"}
    if scale_rewards not in modes:
        raise ValueError("scale_rewards: %r is not 'batch', 'group' or 'none'" % (scale_rewards,))
    return _ga.group_advantage(rewards, int(num_generations), mode=modes[scale_rewards], eps=1e-4,
                               unbiased=True, singleton="zero", nan_scores="unscorable")


def selective_log_softmax(logits, index, temperature=1.0, row_mask=None):
    """trl.trainer.utils.selective_log_softmax: log_softmax(logits / temperature) gathered at
    index (the logits' shape without the last dimension, or with K columns: K gathers), 0 where
    row_mask is 0; differentiable, f32."""
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    squeeze = index.ndim == logits.ndim - 1
    idx = index.unsqueeze(-1) if squeeze else index
    if row_mask is not None:
        # rows left out: ignore_index gives logp 0 and no gradient
        idx = idx.masked_fill((row_mask == 0).reshape(idx.shape), -100)
    cols = [_ag.token_logprob(logits, idx[..., k], temperature=float(temperature),
                              ignore_index=-100) for k in range(idx.shape[-1])]
    out = torch.stack(cols, dim=-1)
    return out.squeeze(-1) if squeeze else out


# The loss types whose clipped term TRL's delta caps (two-sided clipping).
DELTA_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


def supported(loss_type, importance_sampling_level="token", delta=None,
              use_bias_correction_kl=False, epsilon_high=None):
    """Whether grpo_loss expresses these settings. delta (two-sided clipping, >= 1) is rlk's dual
    clip when it lies above the clip range, 1 + epsilon_high (what TRL recommends); at or below
    it, the upper clip bound with the dual clip at 1 + epsilon_high."""
    if loss_type not in LOSS_TYPES or importance_sampling_level not in ("token", "sequence"):
        return False
    if delta is None:
        return True
    return loss_type in DELTA_TYPES and epsilon_high is not None and float(delta) >= 1.0


def grpo_loss(per_token_logps, old_per_token_logps, advantages, mask, *, loss_type="dapo",
              epsilon_low=0.2, epsilon_high=0.2, beta=0.0, ref_per_token_logps=None,
              importance_sampling_level="token", sapo_temperature_pos=1.0,
              sapo_temperature_neg=1.05, num_items_in_batch=None, num_processes=1,
              gradient_accumulation_steps=1, steps_per_generation=1, max_completion_length=None,
              training=True, entropies=None, use_bias_correction_kl=False, delta=None,
              policy_weights=None, vespo_weights=None):
    """The policy (+ beta KL) loss of GRPOTrainer._compute_loss and its local metrics
    ({name: (mean, count)}: TRL reduces sum and count across processes; "entropy" when
    entropies are given). use_bias_correction_kl: TRL's KL term times the importance ratio
    (token or sequence), its gradient included: a torch term aggregated by rlk with the policy
    term's normalizers. policy_weights ([B, T] or [B, 1], no gradient): what multiplies the
    policy term and not the KL term (TRL's off-policy mask, entropy mask and vLLM importance
    ratio, multiplied). vespo_weights ([B, 1]): vespo's gamma weights of the sequences
    (GRPOTrainer.get_gamma_weights), required with loss_type "vespo"."""
    if not supported(loss_type, importance_sampling_level, delta, epsilon_high=epsilon_high):
        raise NotImplementedError("rlk: loss_type=%r at importance_sampling_level=%r, delta=%r"
                                  % (loss_type, importance_sampling_level, delta))
    B = per_token_logps.shape[0]
    ga = float(gradient_accumulation_steps) if training else 1.0
    seq = importance_sampling_level == "sequence"
    # delta caps the ratio of the unclipped term. Above the clip range that is the dual clip at
    # delta for negative advantages and changes nothing for positive ones. At or below 1 +
    # epsilon_high it is the upper clip bound for positive advantages, while negative ones keep
    # min(r, 1 + epsilon_high): the dual clip there (-min(min(r, delta) A, clamp(r) A) written out
    # per sign of A).
    delta_inside = delta is not None and float(delta) <= 1.0 + float(epsilon_high)
    kw = {"clip_low": float(epsilon_low),
          "clip_high": float(delta) - 1.0 if delta_inside else float(epsilon_high),
          "dual_clip": (1.0 + float(epsilon_high) if delta_inside
                        else float(delta) if delta is not None else 0.0),
          "log_ratio_min": -math.inf, "log_ratio_max": math.inf,
          "clamp_bound_grad": torch_clamp_bound_grad(),
          "mode": "gspo" if seq else "ppo", "seq_ratio_grad": "through_mean"}
    if loss_type in ("grpo", "sapo"):
        kw.update(agg="seq-mean-token-mean", seq_normalizer=float(B), loss_scale=1.0 / ga)
    elif loss_type == "bnpo":
        kw.update(agg="token-mean", token_normalizer=max(mask_total(mask), 1.0), loss_scale=1.0 / ga)
    elif loss_type == "dr_grpo":
        kw.update(agg="seq-mean-token-sum-norm", seq_normalizer=float(B),
                  norm_scale=float(max_completion_length), loss_scale=1.0 / ga)
    elif loss_type == "luspo":
        kw.update(agg="seq-mean-token-sum", seq_normalizer=float(B), loss_scale=1.0 / ga)
    else:  # dapo, cispo, vespo
        n = max(as_float(num_items_in_batch), 1.0) / num_processes
        if training:
            n = n * gradient_accumulation_steps / steps_per_generation
        kw.update(agg="token-mean", token_normalizer=n)
    weights = None if policy_weights is None else policy_weights.detach().to(per_token_logps.dtype)
    if loss_type == "vespo":
        # -phi A logp with phi detached: REINFORCE weighted per token by its sequence's phi
        if vespo_weights is None:
            raise ValueError("rlk: loss_type 'vespo' needs vespo_weights (GRPOTrainer.get_gamma_weights)")
        phi = vespo_weights.detach().to(per_token_logps.dtype)
        weights = phi if weights is None else phi * weights
        kw.update(mode="reinforce")
    if loss_type == "cispo":
        kw.update(mode="cispo", clip_low=math.inf, clip_high=float(epsilon_high) - 1.0)
    elif loss_type == "sapo":
        # TRL picks the temperature with torch.where of two Python numbers: a tensor of torch's
        # default dtype (f32), so the taus are f32 values even for f64 log-probs
        f32 = torch.get_default_dtype()
        kw.update(mode="sapo",
                  sapo_tau_pos=float(torch.tensor(float(sapo_temperature_pos), dtype=f32)),
                  sapo_tau_neg=float(torch.tensor(float(sapo_temperature_neg), dtype=f32)))
    agg_kw = {k: kw[k] for k in ("agg", "seq_normalizer", "token_normalizer", "norm_scale",
                                 "loss_scale") if k in kw}
    corrected = beta != 0.0 and use_bias_correction_kl
    if beta != 0.0 and not corrected:
        kw.update(ref_logp=ref_per_token_logps, kl_estimator="k3", kl_coef=float(beta),
                  kl_input_clamp=math.inf, kl_output_clamp=math.inf)
    adv = advantages
    if adv.dim() == 2 and adv.shape[1] == 1:
        adv = adv[:, 0]
    if entropies is not None:
        kw["entropy"] = entropies.detach()
    seq_clipped = None
    if seq and loss_type in ("cispo", "sapo"):
        # the sequence's ratio: exp of the masked mean log-ratio (the mean over max(n, 1) tokens)
        valid = mask.bool()
        lr = torch.where(valid, per_token_logps - old_per_token_logps, 0.0)
        s_ratio = torch.exp((lr * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        A = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)
        if loss_type == "cispo":
            # -sg(min(s, epsilon_high)) A logp: REINFORCE weighted per token by the clamped ratio
            w = torch.clamp(s_ratio.detach(), max=float(epsilon_high))
            weights = w if weights is None else w * weights
            kw.update(mode="reinforce")
            seq_clipped = ((s_ratio.detach() > float(epsilon_high)) & (A > 0)).float()
        else:
            # SAPO's soft gate of the sequence ratio, differentiated through its mean: the term is
            # formed in torch and aggregated by rlk (a REINFORCE term of advantage -1 is its input)
            f32 = torch.get_default_dtype()
            tau = torch.where(A > 0, torch.tensor(float(sapo_temperature_pos), dtype=f32),
                              torch.tensor(float(sapo_temperature_neg), dtype=f32)).to(A.dtype)
            term = (-(torch.sigmoid(tau * (s_ratio - 1)) * 4 / tau) * A).expand_as(per_token_logps)
            if weights is not None:
                term = term * weights
                weights = None
            term = term.contiguous()
            for k in ("mode", "clip_low", "clip_high", "dual_clip", "sapo_tau_pos", "sapo_tau_neg",
                      "seq_ratio_grad"):
                kw.pop(k, None)
            kw.update(mode="reinforce")
            loss_pg, m = _ag.policy_loss(term, term.detach(), torch.full_like(term, -1.0),
                                         mask_arg(mask), **{k: v for k, v in kw.items()
                                                            if k not in ("ref_logp", "kl_estimator",
                                                                         "kl_coef", "kl_input_clamp",
                                                                         "kl_output_clamp")})
    if weights is not None:
        kw["rollout_is_weights"] = weights.expand_as(per_token_logps).contiguous()
    if seq and loss_type == "sapo":
        loss = loss_pg
        if beta != 0.0 and not corrected:
            # the KL term rlk's own (k3 against the reference, beta), aggregated alike
            loss_kl, mk = _ag.policy_loss(per_token_logps, per_token_logps.detach(),
                                          torch.zeros_like(per_token_logps), mask_arg(mask),
                                          mode="reinforce", ref_logp=ref_per_token_logps,
                                          kl_estimator="k3", kl_coef=float(beta),
                                          kl_input_clamp=math.inf, kl_output_clamp=math.inf,
                                          **agg_kw)
            loss = loss + loss_kl
    else:
        loss, m = _ag.policy_loss(per_token_logps, dense(old_per_token_logps),
                                  dense(adv, per_sequence=True),
                                  mask_arg(mask), **kw)
    n_tok = m[12].item()
    rlk_check_status()  # the loop has just synchronized: bad labels seen on the device raise here
    metrics = {}
    if corrected:
        # k3 times the importance ratio of the token (or its sequence), differentiated through
        # both; aggregated like the policy term (a REINFORCE term of advantage -1 is its input)
        valid = mask.bool()
        d = torch.where(valid, ref_per_token_logps - per_token_logps, 0.0)
        kl = torch.exp(d) - d - 1
        lr = torch.where(valid, per_token_logps - old_per_token_logps, 0.0)
        if seq:
            lr = ((lr * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        kl = kl * torch.exp(lr)
        term = float(beta) * kl
        loss_kl, _ = _ag.policy_loss(term, term.detach(), torch.full_like(term, -1.0),
                                     mask_arg(mask), mode="reinforce", **agg_kw)
        loss = loss + loss_kl
        metrics["kl"] = (((kl * mask).sum() / mask.sum().clamp(min=1.0)).item(), n_tok)
    elif beta != 0.0:
        metrics["kl"] = ((mk if seq and loss_type == "sapo" else m)[5].item(), n_tok)
    if entropies is not None:
        metrics["entropy"] = (m[6].item(), n_tok)
    if loss_type == "vespo":
        metrics["vespo/phi_seq_mean"] = (phi.mean().item(), float(B))
    elif loss_type == "cispo" and seq_clipped is not None:
        metrics["cispo_clip_ratio"] = (seq_clipped.mean().item(), float(B))
    elif loss_type == "cispo":
        metrics["cispo_clip_ratio"] = (m[3].item(), n_tok)
    elif loss_type not in ("sapo", "vespo"):
        if seq:
            low, high, count = m[14].item(), m[15].item(), float(B)
        else:
            low, high, count = m[2].item(), m[3].item(), n_tok
        if delta_inside:  # TRL flags the capped ratio, never above 1 + epsilon_high
            high = 0.0
        metrics["clip_ratio/low_mean"] = (low, count)
        metrics["clip_ratio/high_mean"] = (high, count)
        metrics["clip_ratio/region_mean"] = (low + high, count)
    return loss, metrics


def _nan_extreme(x, fn):
    """trl's nanmin / nanmax: NaN when every value is NaN."""
    keep = ~torch.isnan(x)
    return fn(x[keep]) if bool(keep.any()) else torch.tensor(float("nan"))


def _clip_extremes(self, mode, logp, old, advantages, mask):
    """TRL's clip_ratio/low_min and high_max: the sequences' (masked) means of the clip flags of
    the ratio (the sequence's at sequence level, capped at delta), gathered, then their smallest
    low and largest high fraction."""
    with torch.no_grad():
        lr = torch.where(mask.bool(), logp.detach() - old, 0.0)
        if self.importance_sampling_level == "sequence":
            coef = torch.exp((lr * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        else:
            coef = torch.exp(lr)
        delta = getattr(self.args, "delta", None)
        if delta is not None:
            coef = torch.clamp(coef, max=delta)
        A = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        low = ((coef < 1 - self.epsilon_low) & (A < 0)).float()
        high = ((coef > 1 + self.epsilon_high) & (A > 0)).float()

        def seq_mean(x):
            return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)

        lo = self.accelerator.gather(seq_mean(low))
        hi = self.accelerator.gather(seq_mean(high))
    self._metrics[mode]["clip_ratio/low_min"].append(_nan_extreme(lo, torch.min).item())
    self._metrics[mode]["clip_ratio/high_max"].append(_nan_extreme(hi, torch.max).item())


def _reduce(accelerator, mean, count):
    t = torch.tensor([mean * count, count], dtype=torch.float64)
    tot = accelerator.reduce(t, reduction="sum")
    return (tot[0] / tot[1].clamp(min=1.0)).item()


_original = {}


# The batch's model inputs beside the tokens that TRL's _compute_loss hands its policy pass (TESTED's
# list: images and their layouts, token types).
_MODEL_INPUTS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                 "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


def compute_loss(self, model, inputs):
    """GRPOTrainer._compute_loss with the loss term on rlk (TRL's own code where a setting is
    not expressed)."""
    args = self.args
    plain = (supported(self.loss_type, self.importance_sampling_level, getattr(args, "delta", None),
                       getattr(args, "use_bias_correction_kl", False), self.epsilon_high)
             and not (getattr(self, "_entropy_bonus_enabled", False)
                      and getattr(self, "use_adaptive_entropy", False))
             and not getattr(self, "aux_loss_enabled", False))
    if not plain:
        own = _original.get("_compute_loss")
        if own is None:  # not patched: the class still has TRL's
            from trl.trainer import grpo_trainer as G
            own = G.GRPOTrainer.__dict__["_compute_loss"]
        return own(self, model, inputs)
    prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
    completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
    per_token_logps, entropies, _ = self._get_per_token_logps_and_entropies(
        model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
        compute_aux_loss=False, **{k: inputs.get(k) for k in _MODEL_INPUTS})
    old = inputs.get("old_per_token_logps")
    old = per_token_logps.detach() if old is None else old
    mode = "train" if self.model.training else "eval"
    advantages = inputs["advantages"]
    adv2 = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    # the policy term's weights, from TRL's own helpers
    weights, entropy_mask = None, None
    q = getattr(self, "top_entropy_quantile", 1.0)
    if q < 1.0:
        entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - q)
        weights = entropy_mask.to(per_token_logps.dtype)
    threshold = getattr(self, "off_policy_mask_threshold", None)
    if threshold is not None:
        off = self.get_off_policy_mask(advantages=adv2, per_token_logps=per_token_logps,
                                       sampling_per_token_logps=inputs.get("sampling_per_token_logps", old),
                                       mask=mask, off_policy_threshold=threshold)
        weights = off if weights is None else weights * off
    is_ratio = inputs.get("importance_sampling_ratio")
    if (getattr(self, "use_vllm", False) and getattr(self, "vllm_importance_sampling_correction", False)
            and self.loss_type != "vespo"):
        weights = is_ratio if weights is None else weights * is_ratio
    phi = None
    if self.loss_type == "vespo":
        # (masked tokens may hold anything, NaN included: their log-ratio enters as 0, as TRL's
        # product with the mask makes it for finite values)
        log_ratio = torch.where(mask.bool(), per_token_logps - old, 0.0)
        phi = self.get_gamma_weights(advantages=adv2, log_ratio_per_token=log_ratio, mask=mask,
                                     importance_sampling_ratio=is_ratio, k_pos=args.vespo_k_pos,
                                     lambda_pos=args.vespo_lambda_pos, k_neg=args.vespo_k_neg,
                                     lambda_neg=args.vespo_lambda_neg)
    loss, metrics = grpo_loss(
        per_token_logps, old, inputs["advantages"], mask, loss_type=self.loss_type,
        epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high, beta=self.beta,
        ref_per_token_logps=inputs.get("ref_per_token_logps"),
        importance_sampling_level=self.importance_sampling_level,
        sapo_temperature_pos=getattr(args, "sapo_temperature_pos", 1.0),
        sapo_temperature_neg=getattr(args, "sapo_temperature_neg", 1.05),
        num_items_in_batch=inputs.get("num_items_in_batch"),
        num_processes=self.accelerator.num_processes,
        gradient_accumulation_steps=self.current_gradient_accumulation_steps,
        steps_per_generation=getattr(args, "steps_per_generation", 1),
        max_completion_length=self.max_completion_length, training=mode == "train",
        entropies=entropies, use_bias_correction_kl=getattr(args, "use_bias_correction_kl", False),
        delta=getattr(args, "delta", None), policy_weights=weights, vespo_weights=phi)
    for name, (mean, count) in metrics.items():
        self._metrics[mode][name].append(_reduce(self.accelerator, mean, count))
    if self.loss_type in DELTA_TYPES:
        _clip_extremes(self, mode, per_token_logps, old, inputs["advantages"], mask)
    if getattr(self, "_entropy_bonus_enabled", False):
        # TRL's static entropy bonus: the mean entropy over the scored tokens, divided only by the
        # accumulation steps whatever the loss type's normalizer (a torch term beside rlk's loss;
        # the entropies carry the model's gradient). "policy_loss" is the loss before that division
        # (dapo and cispo divide inside their normalizer).
        acc = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        # (masked tokens may hold anything, NaN included: they count as 0, as in rlk's kernels)
        eff = mask if entropy_mask is None else mask * entropy_mask
        bonus = (torch.where(eff.bool(), entropies, 0.0) * eff).sum() / eff.sum().clamp(min=1.0) / acc
        policy_loss = loss.detach() * (1.0 if self.loss_type in ("dapo", "cispo", "vespo") else acc)
        loss = loss - self.entropy_coef * bonus
        self._metrics[mode]["policy_loss"].append(
            self.accelerator.gather(policy_loss).nanmean().item())
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
    return loss


TESTED = ("1.16.0",)

# TRL's per-token fields other than log_probs and entropy: computed by TRL's own function
_RLK_OUTPUTS = ("log_probs", "entropy")

# log-prob calls of the patched head, by who computed them ("rlk", or "trl: <why>")
head_calls = collections.Counter()
_scope = threading.local()


def _head_in_scope():
    """The GRPOTrainer whose log-prob pass is running (None outside one)."""
    return getattr(_scope, "trainer", None)


def _unfused(trainer, hidden, weight, bias, softcap, logit_scale, outputs):
    """Why the head's call stays TRL's (None: rlk computes it), and else the operands' dtype."""
    if trainer is None:
        return "not a GRPOTrainer log-prob pass", None
    if bias is not None or softcap is not None:
        return "an LM head with a bias or a logit softcap", None
    if not logit_scale > 0:
        return "logit_scale %r" % (logit_scale,), None
    if any(o not in _RLK_OUTPUTS for o in outputs):
        return "outputs %r" % (tuple(outputs),), None
    if hidden.shape[0] == 0:
        return "no scored token", None
    if _head.partitioned(weight):
        # TRL gathers it for its own head's forward; rlk's backward would read it partitioned
        return "DeepSpeed ZeRO-3 (the head's weight partitioned)", None
    dt = _head.operand_dtype(hidden, weight)
    if dt is None and getattr(trainer.args, "cast_lm_head_to_fp32", False):
        # TRL's f32 head (its autocast off) over a 16-bit model, or an f32 model trained in
        # 16-bit mixed precision: that dtype for the kernels' operands
        emb = trainer.model.get_input_embeddings().weight.dtype
        dt = emb if emb in _head.LOW else _mixed_precision(trainer, hidden.device)
        if dt is None:  # an f32 model in f32: no 16-bit dtype to round the head to
            return "cast_lm_head_to_fp32 on an f32 model without 16-bit autocast", None
    if dt is None:
        return "an f32 head without autocast", None
    return None, dt


def _mixed_precision(trainer, device):
    """The 16-bit dtype of the trainer's mixed precision (the autocast its accelerator runs the
    model's forward in: bf16=True, fp16=True), None without one."""
    acc = getattr(trainer, "accelerator", None)
    if acc is None:
        return None
    with acc.autocast():
        on = torch.is_autocast_enabled(device.type)
        dt = torch.get_autocast_dtype(device.type)
    return dt if on and dt in _head.LOW else None


class ChunkedHead:
    """Stands where trl.trainer.utils imported TRL's ChunkedLogProbFunction: inside a
    GRPOTrainer log-prob pass, the log-probs and entropy of the scored rows come from rlk's fused
    head (logit_scale folded into the temperature); every other call is TRL's own."""
    own = None

    @classmethod
    def apply(cls, hidden, weight, bias, targets, temperature, chunk_size,
              final_logit_softcapping=None, logit_scale=1.0, outputs=("log_probs",)):
        why, dt = _unfused(_head_in_scope(), hidden, weight, bias, final_logit_softcapping,
                           logit_scale, outputs)
        if why is not None:
            head_calls["trl: " + why] += 1
            return cls.own.apply(hidden, weight, bias, targets, temperature, chunk_size,
                                 final_logit_softcapping, logit_scale, outputs)
        head_calls["rlk"] += 1
        logp, ent = _head.head_logprobs(hidden, weight, targets,
                                        temperature=float(temperature) / float(logit_scale),
                                        entropy="entropy" in outputs, dtype=dt)
        return logp, ent, None, None, None


def _compact(own):
    """trl.trainer.utils._use_triton while patched: True inside a GRPOTrainer log-prob pass, so
    only the rows with a label (the completion tokens) reach the head on every device."""
    def use_compact(device):
        return True if _head_in_scope() is not None else own(device)
    return stand_in(use_compact, own)


def _in_scope(own):
    """GRPOTrainer._get_per_token_logps_and_entropies marking its pass for ChunkedHead (the
    policy's, the old policy's and the reference model's passes all run through it)."""
    @functools.wraps(own)
    def logps_and_entropies(self, *args, **kwargs):
        prev = getattr(_scope, "trainer", None)
        _scope.trainer = self
        try:
            return own(self, *args, **kwargs)
        finally:
            _scope.trainer = prev
    return stand_in(logps_and_entropies, own)


# log-prob passes of patch(prefix=True), by who ran them ("packed", or "trl: <why>")
prefix_calls = collections.Counter()

def _prompt_groups(ids, mask, P):
    """The rows of a [B, P + C] batch (host copies) as prompt groups: rows whose prompts (the
    first P columns, left-padded) hold the same tokens. Returns (groups [(rows, prompt_len)],
    the completion lengths [B], None) or (None, None, why): a prompt or completion mask that is
    not TRL's (left-padded prompt, right-padded completion), or an empty prompt. In numpy: each
    whole-batch operation costs microseconds there, where torch's CPU kernels took about 8 ms
    apiece on a GPU host between the passes' launches (the device idle meanwhile)."""
    m, tokens = mask.numpy(), ids.numpy()
    lens = m[:, P:].sum(-1, dtype=np.int64)
    plen = m[:, :P].sum(-1, dtype=np.int64)
    cols = np.arange(m.shape[1])
    want = (cols >= P - plen[:, None]) & (cols < P + lens[:, None])
    if not np.array_equal(m, want.astype(m.dtype)):
        return None, None, "a mask other than a left-padded prompt and a right-padded completion"
    if int(plen.min()) == 0:
        return None, None, "an empty prompt"
    groups = {}
    for i in range(tokens.shape[0]):
        if lens[i] > 0:
            key = tokens[i, P - int(plen[i]):P].tobytes()
            groups.setdefault(key, ([], int(plen[i])))[0].append(i)
    return list(groups.values()), [int(n) for n in lens], None


def _unpacked(self, model, kwargs):
    """Why a log-prob pass stays TRL's replicated one (None: it is packed)."""
    if kwargs.get("compute_aux_loss"):
        return "a MoE auxiliary loss"
    for k, v in kwargs.items():
        # token types of text alone (all 0, e.g. a tokenizer's token_type_ids) say nothing
        if v is None or k == "compute_aux_loss" or (
                k in ("token_type_ids", "mm_token_type_ids") and not bool(v.any())):
            continue
        return "multimodal inputs (%s)" % k
    from . import transformers as rtf
    why = rtf.share(model)
    if why is not None:
        return why
    dev = self.accelerator.device.type
    emb = self.accelerator.unwrap_model(model).get_input_embeddings().weight.dtype
    with self.accelerator.autocast():
        if emb not in _head.LOW and not (torch.is_autocast_enabled(dev)
                                         and torch.get_autocast_dtype(dev) in _head.LOW):
            return "%s attention without 16-bit autocast" % emb
    return None


def _packed(own):
    """GRPOTrainer._get_per_token_logps_and_entropies with each prompt group packed: per chunk
    of batch_size rows, the rows sharing a prompt run as one sequence [prompt[:-1] | p r_1 |
    ... | p r_G] (p the prompt's last token, r_i the completion without its last token: what
    scores the completion's tokens) through the model's own fused forward (shift_labels) with
    the "rlk_prefix" attention, every token at its column's position (the replicated forward's
    arange). The log-probs and entropy go back to TRL's [B, C] layout."""
    @functools.wraps(own)
    def logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                            batch_size=None, compute_entropy=False, **kwargs):
        why = _unpacked(self, model, kwargs)
        ids = input_ids.cpu()
        mask = attention_mask.cpu()
        C = int(logits_to_keep)
        P = ids.shape[1] - C
        if why is None:
            groups, lens, why = _prompt_groups(ids, mask, P)
        if why is None and not groups:
            why = "no completion token"
        if why is not None:
            prefix_calls["trl: " + why] += 1
            return own(self, model, input_ids, attention_mask, logits_to_keep,
                       batch_size=batch_size, compute_entropy=compute_entropy, **kwargs)
        B = ids.shape[0]
        batch_size = batch_size or B
        logps, ents = [], []
        for start in range(0, B, batch_size):
            end = min(start + batch_size, B)
            lp, ent = _packed_chunk(self, model, ids, lens, groups, P, C, start, end,
                                    compute_entropy, input_ids.device)
            logps.append(lp)
            ents.append(ent)
        prefix_calls["packed"] += 1
        return (torch.cat(logps), torch.cat(ents) if compute_entropy else None, None)
    return stand_in(logps_and_entropies, own)


def _packed_chunk(self, model, ids, lens, groups, P, C, start, end, compute_entropy, device):
    """The [end - start, C] log-probs (and entropy) of rows start..end-1, their groups packed."""
    chunk = []
    for rows, plen in groups:
        rows = [i for i in rows if start <= i < end]
        if rows:
            chunk.append((rows, plen))
    n = end - start
    if not chunk:  # no completion token here: zeros as TRL's masked_scatter gives
        z = torch.zeros(n, C, device=device)
        return z, z if compute_entropy else None
    seqs, firsts, spec = {}, {}, []
    for rows, plen in chunk:
        for i in rows:
            seqs[i] = ids[i, P - plen:P + lens[i] - 1]
            firsts[i] = P - plen
        spec.append((rows, plen - 1))
    order = [i for rows, _ in chunk for i in rows]
    index = {i: k for k, i in enumerate(order)}
    packed = _prefix.pack([seqs[i] for i in order], [firsts[i] for i in order],
                          [([index[i] for i in rows], L) for rows, L in spec])
    labels = torch.full_like(packed.ids, -100)
    src, dest = [], []
    for (rows, L) in spec:
        for i in rows:
            own = packed.rows[index[i]][L:]  # p, r_1 .. r_{n-1}: they score r_1 .. r_n
            labels[own] = ids[i, P:P + lens[i]]
            src.append(own)
            dest.append((i - start) * C + torch.arange(lens[i]))
    src, dest = torch.cat(src).to(device), torch.cat(dest).to(device)
    from . import transformers as rtf
    with self.accelerator.autocast():
        out = model(input_ids=packed.ids.to(device)[None],
                    position_ids=packed.positions.to(device)[None], attention_mask=rtf.packed_mask(device),
                    shift_labels=labels.to(device)[None], fused_lm_head=True,
                    rlk_layout=packed.layout)

    def unpack(x):
        x = x[0].index_select(0, src)
        return x.new_zeros(n * C).index_copy(0, dest, x).view(n, C)
    return unpack(out.log_probs), unpack(out.entropy) if compute_entropy else None


def patch(*, loss=True, head=True, prefix=False, force=False):
    """Swaps rlk into TRL's GRPOTrainer. head: the per-token log-probs and entropy of its
    log-prob passes (policy, old policy, reference) through rlk's fused LM head, behind TRL's own
    fused-head seam (trl.trainer.utils' ChunkedLogProbFunction, within GRPOTrainer's passes
    only). loss: GRPOTrainer._compute_loss = compute_loss (TRL's own where a setting is not
    expressed). prefix (opt-in): the log-prob passes run each prompt group packed once with
    rlk's prefix-shared attention (_packed; the model gets share()'s attention on its first
    packed pass and keeps it); a pass it does not fit stays TRL's (prefix_calls counts both).
    Refuses a TRL other than TESTED unless force. Returns a handle: undo() restores TRL's;
    .report says what was swapped and what was left, and why."""
    from trl.trainer import grpo_trainer as G
    from trl.trainer import utils as U
    h = Patch()
    with all_or_nothing(h):
        h.report["version"] = check_version("trl", TESTED, force)
        if loss:
            _original["_compute_loss"] = trainer_own(G.GRPOTrainer.__dict__["_compute_loss"])
            h.set(G.GRPOTrainer, "_compute_loss",
                  stand_in(compute_loss, _original["_compute_loss"]))
            h.swapped("GRPOTrainer._compute_loss")
        else:
            h.left("GRPOTrainer._compute_loss", "loss=False")
        if head:
            ChunkedHead.own = trainer_own(U._ChunkedLogProbFunction)
            h.set(U, "_ChunkedLogProbFunction", stand_in(ChunkedHead, ChunkedHead.own))
            h.set(U, "_use_triton", _compact(trainer_own(U._use_triton)))
            h.swapped("GRPOTrainer log-probs and entropy (fused LM head)")
            h.left("fused LM head of other trainers (SFT, DPO, KTO, RLOO)", "not GRPOTrainer")
            h.left("fused LM head with a bias, a softcap or outputs beyond log_probs and entropy",
                   "not fused by rlk: TRL's ChunkedLogProbFunction (head_calls counts them)")
            h.left("an f32 model's head outside 16-bit mixed precision (cast_lm_head_to_fp32 or not)",
                   "no 16-bit dtype to round it to: TRL's ChunkedLogProbFunction (head_calls "
                   "counts them)")
        else:
            h.left("GRPOTrainer log-probs and entropy", "head=False")
        own = trainer_own(G.GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"])
        if prefix:
            own = _packed(own)
            h.swapped("GRPOTrainer log-prob passes packed per prompt (prefix-shared attention)")
            h.left("log-prob passes with multimodal inputs, a MoE auxiliary loss, or a model the "
                   "attention does not fit", "TRL's replicated pass (prefix_calls counts them)")
        else:
            h.left("GRPOTrainer log-prob passes, one row per completion", "prefix=False")
        if head or prefix:
            h.set(G.GRPOTrainer, "_get_per_token_logps_and_entropies",
                  _in_scope(own) if head else own)
        h.left("generation", "the model's own forward and lm_head")
    return h

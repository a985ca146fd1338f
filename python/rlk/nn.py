"""torch.nn.Module front-ends, shaped like the fused-loss modules trainers already use
(Liger-Kernel's LigerFusedLinearCrossEntropyLoss takes (lin_weight, _input, target); these take
(weight, hidden, labels) in that order), on rlk's fused LM head: the logits never stored.

    head_loss = rlk.nn.FusedLinearCrossEntropyLoss()        # in place of Liger's module
    loss = head_loss(model.lm_head.weight, hidden, labels)   # hidden [..., H], labels [...]

    pg = rlk.nn.FusedLinearPolicyLoss(clip_high=0.28, kl_coef=1e-3)
    loss, metrics = pg(model.lm_head.weight, hidden, labels, old_logp, advantages, mask,
                       ref_logp=ref_logp)

Each is differentiable in weight and hidden (rlk.autograd.linear_token_logprob), traces into
torch.compile without a graph break, and holds no parameter of its own.
"""
import torch

from . import autograd as _ag
from .errors import InvalidArgument

__all__ = ["FusedLinearCrossEntropyLoss", "FusedLinearLogprob", "FusedLinearPolicyLoss",
           "PolicyLoss"]

_REDUCTIONS = ("mean", "sum", "none")


def _no_bias(name, bias):
    if bias is not None:
        raise InvalidArgument("%s: an LM head bias is not supported" % name)


class FusedLinearLogprob(torch.nn.Module):
    """(weight [V, H], hidden [..., H], labels [...]) -> the labels' log-probs [...] (f32) under
    logits = hidden @ weight.T / temperature, or (logp, entropy) with entropy=True. Rows whose
    label is ignore_index get logp 0."""

    def __init__(self, temperature=1.0, ignore_index=-100, entropy=False):
        super().__init__()
        self.temperature = float(temperature)
        self.ignore_index = int(ignore_index)
        self.entropy = bool(entropy)

    def forward(self, weight, hidden, labels, bias=None):
        _no_bias("FusedLinearLogprob", bias)
        return _ag.linear_token_logprob(hidden, weight, labels, entropy=self.entropy,
                                        temperature=self.temperature,
                                        ignore_index=self.ignore_index)

    def extra_repr(self):
        return "temperature=%g, ignore_index=%d, entropy=%s" % (
            self.temperature, self.ignore_index, self.entropy)


class FusedLinearCrossEntropyLoss(torch.nn.Module):
    """torch.nn.CrossEntropyLoss of logits = hidden @ weight.T (/ temperature), the logits never
    stored: (weight [V, H], hidden [..., H], target [...]) -> the loss. reduction "mean" (over
    the tokens whose target is not ignore_index; 0 when every token is ignored, as Liger's, where
    torch's would be 0 / 0), "sum" or "none" (per token, 0 where ignored)."""

    def __init__(self, ignore_index=-100, reduction="mean", temperature=1.0):
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise InvalidArgument("FusedLinearCrossEntropyLoss: reduction must be one of %s, got %r"
                                  % (", ".join(_REDUCTIONS), reduction))
        self.ignore_index = int(ignore_index)
        self.reduction = reduction
        self.temperature = float(temperature)

    def forward(self, weight, hidden, target, bias=None):
        _no_bias("FusedLinearCrossEntropyLoss", bias)
        nll = -_ag.linear_token_logprob(hidden, weight, target, temperature=self.temperature,
                                        ignore_index=self.ignore_index)
        if self.reduction == "none":
            return nll
        total = nll.sum()
        if self.reduction == "sum":
            return total
        # a batch of ignored tokens only (a micro-batch of prompt tokens) has loss 0 and no
        # gradient, not 0 / 0
        return total / (target != self.ignore_index).sum().clamp(min=1)

    def extra_repr(self):
        return "ignore_index=%d, reduction=%s, temperature=%g" % (
            self.ignore_index, self.reduction, self.temperature)


class PolicyLoss(torch.nn.Module):
    """rlk.autograd.policy_loss as a module: the keywords of rlk.policy_loss fixed at
    construction (mode, clip_low, clip_high, kl_coef, agg, ...); forward(logp, old_logp,
    advantages, mask=None, ref_logp=None, entropy=None, **more) -> (loss, metrics)."""

    def __init__(self, **settings):
        super().__init__()
        for k in ("metrics", "scalar_loss", "stream"):
            if k in settings:
                raise InvalidArgument("PolicyLoss: %s is not a setting" % k)
        self.settings = settings

    def forward(self, logp, old_logp, advantages, mask=None, ref_logp=None, entropy=None, **more):
        kw = dict(self.settings, **more)
        if ref_logp is not None:
            kw["ref_logp"] = ref_logp
        return _ag.policy_loss(logp, old_logp, advantages, mask, entropy=entropy, **kw)

    def extra_repr(self):
        return ", ".join("%s=%r" % kv for kv in sorted(self.settings.items()))


class FusedLinearPolicyLoss(PolicyLoss):
    """The policy loss of the log-probs of logits = hidden @ weight.T / temperature, from the LM
    head's weight and hidden states (the logits never stored): forward(weight, hidden [B, T, H],
    labels [B, T], old_logp, advantages, mask=None, ref_logp=None) -> (loss, metrics);
    differentiable in weight and hidden. With entropy_coef the entropy bonus is computed in the
    same pass."""

    def __init__(self, temperature=1.0, ignore_index=-100, **settings):
        super().__init__(**settings)
        self.head = FusedLinearLogprob(temperature, ignore_index,
                                       entropy=bool(settings.get("entropy_coef")))

    def forward(self, weight, hidden, labels, old_logp, advantages, mask=None, ref_logp=None,
                bias=None, **more):
        _no_bias("FusedLinearPolicyLoss", bias)
        # the entropy where the call's entropy_coef (its own, else the module's) asks for it
        want = bool(more["entropy_coef"]) if "entropy_coef" in more else self.head.entropy
        out = _ag.linear_token_logprob(hidden, weight, labels, entropy=want, temperature=self.head.temperature,
                                       ignore_index=self.head.ignore_index)
        logp, entropy = out if want else (out, None)
        return super().forward(logp, old_logp, advantages, mask, ref_logp=ref_logp,
                               entropy=entropy, **more)

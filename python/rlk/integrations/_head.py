"""The fused LM head the trainer adapters route their log-probs through: rlk.linear_logprob and
its backward on hidden [N, H] and an LM head's weight [V, H], for any N (the logits never
stored), with the trainers' operand dtypes.

The kernels read bf16 or f16 operands and accumulate in f32 (fp64 on the host backend). A
trainer's head in f32 (autocast, or TRL's cast_lm_head_to_fp32) is given to them rounded to
`compute_dtype`; the gradients then come back in f32 (the kernels' accumulators, not rounded to
the operands' dtype) and flow to the f32 tensors through the rounding as through a cast.
"""
import torch

from ..ops import linear_logprob as _linear

LOW = (torch.bfloat16, torch.float16)


def operand_dtype(hidden, weight):
    """The dtype the kernels read hidden and weight in: theirs when both are the same 16-bit
    type, else the autocast dtype of their device when autocast is on, else None (not fused)."""
    if hidden.dtype is weight.dtype and hidden.dtype in LOW:
        return hidden.dtype
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) in LOW:
        return torch.get_autocast_dtype(kind)
    return None


def partitioned(weight):
    """Whether weight is a DeepSpeed ZeRO-3 parameter: partitioned outside its own module's
    forward, so the fused head, which reads it directly in the forward and again in the backward,
    cannot take it."""
    return hasattr(weight, "ds_id")


# The text configuration's scalings of the logits (their meaning varies by model: a multiplier, a
# divisor): a model that sets one to other than 1 is not fused.
LOGIT_SCALES = ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


def unfused_head(model):
    """Why the LM head of the transformers causal LM `model` is not logits = hidden @ weight.T
    (None: it is, with weight = model.get_output_embeddings().weight): a bias, an adapter on the
    head (PEFT's wrapper: .weight is the base layer's alone), a scale or a softcap of the logits."""
    head = model.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
        return "no LM head weight"
    if type(head).__module__.split(".")[0] == "peft" or hasattr(head, "base_layer"):
        return "an adapter on the LM head (%s)" % type(head).__name__
    if getattr(head, "bias", None) is not None:
        return "an LM head with a bias"
    cfg = model.config.get_text_config()
    if getattr(cfg, "final_logit_softcapping", None) is not None:
        return "a logit softcap"
    for k in LOGIT_SCALES:
        v = getattr(cfg, k, None)
        if v is not None and float(v) != 1.0:
            return "a logit scale (%s %g)" % (k, float(v))
    return None


class HeadLogprob(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], labels [N], compute dtype, temperature, entropy?) ->
    (logp [N], entropy [N] or None), f32, differentiable in hidden, weight and (with entropy) in
    the entropy. Saves the inputs, not a rounded copy: the backward rounds them again."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, dtype, temperature, want_entropy):
        h, w = hidden.detach().to(dtype).contiguous(), weight.detach().to(dtype)
        out = _linear.linear_logprob(h, w, labels, entropy=want_entropy, lse=True,
                                     temperature=temperature, ignore_index=-100)
        ctx.save_for_backward(hidden, weight, labels, out.lse, out.entropy)
        ctx.dtype, ctx.temperature = dtype, temperature
        ctx.set_materialize_grads(False)
        if want_entropy:
            return out.logp, out.entropy
        return out.logp, None

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, labels, lse, entropy = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (grad_logp is None and grad_entropy is None) or not (want_h or want_w):
            return None, None, None, None, None, None
        g_h = None if entropy is None else _f32(grad_entropy)
        dt = ctx.dtype
        # gradients of 16-bit inputs in their dtype; of f32 ones (rounded for the kernels) in f32
        same = hidden.dtype is dt and weight.dtype is dt
        gh, gw = _linear.linear_logprob_backward(
            hidden.detach().to(dt).contiguous(), weight.detach().to(dt), labels, lse,
            _f32(grad_logp), g_h, entropy if g_h is not None else None,
            temperature=ctx.temperature, ignore_index=-100, want_hidden=want_h,
            want_weight=want_w, grad_dtype="same" if same else "f32")
        gh = None if gh is None else gh.to(hidden.dtype)
        gw = None if gw is None else gw.to(weight.dtype)
        return gh, gw, None, None, None, None


def _f32(g):
    """An upstream gradient as the contiguous f32 [N] the kernels read (None stays None)."""
    return None if g is None else g.float().contiguous()


def head_logprobs(hidden, weight, labels, *, temperature=1.0, entropy=False, dtype=None):
    """Token log-probs (and the entropy) of logits = hidden @ weight.T / temperature over the
    rows of hidden [..., H] (labels [...]; -100: log-prob and entropy 0, no gradient), rounded to `dtype`
    (default: operand_dtype) for the kernels. Returns (logp, entropy or None), f32, the labels'
    shape; differentiable when grad mode is on and hidden or weight requires grad, else computed
    forward only (no lse, no saved state)."""
    dt = dtype or operand_dtype(hidden, weight)
    if dt is None:
        raise ValueError("rlk fused head: %s hidden and %s weight without autocast; pass dtype"
                         % (hidden.dtype, weight.dtype))
    shape = tuple(labels.shape)
    flat = hidden.reshape(-1, hidden.shape[-1])
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        logp, ent = HeadLogprob.apply(flat, weight, labels.reshape(-1), dt, float(temperature),
                                      bool(entropy))
    else:
        # forward only (the old policy's and the reference's passes): no lse, nothing kept
        out = _linear.linear_logprob(flat.detach().to(dt).contiguous(), weight.detach().to(dt),
                                     labels.reshape(-1), entropy=bool(entropy), lse=False,
                                     temperature=float(temperature), ignore_index=-100)
        logp, ent = out.logp, out.entropy
    if ent is not None:  # the kernels' entropy of an ignored row has no gradient: 0, as its log-prob
        ent = ent.masked_fill(labels.reshape(-1) == -100, 0.0)
    return logp.view(shape), None if ent is None else ent.view(shape)

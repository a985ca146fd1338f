"""Sampling from the LM head: rlk_linear_sample.

hidden [M, H] and weight [V, H] (bf16 or f16, an LM head's layout): one token per row from
logits = hidden @ weight.T / temperature, with rlk.sample's filters and seeds, and the token's
log-prob bitwise what rlk.linear_logprob gives that row and token (the rollout's log-probs are the
trainer's). The head's raw logits live in the call's workspace, never in an output.
"""
import collections

from .. import _types as T
from .._tensor import Binder, Op, dim, f32, plan_call, use_plans
from .linear_logprob import LinearLogprobVariant
from .sample import (_filters, _flag, _is_scalar, _optional_out, _tokens, keep_draw_plan, plan_fields, plan_parts,
                     token_dtype_of)

__all__ = ["LinearSampleArgs", "LinearSampleResult", "linear_sample"]


LinearSampleArgs = T.c_struct("rlk_linear_sample_args")


OP = Op("linear_sample", LinearSampleArgs, workspace=True, shared=("weight",))

LinearSampleResult = collections.namedtuple("LinearSampleResult", "tokens logp lse entropy threshold")

_HIDDEN = (T.DType.BF16, T.DType.F16)


def linear_sample(hidden, weight, *, temperature=None, top_k=None, top_p=None, min_p=None, seed=None,
                  offset=None, tokens=None, token_dtype="i64", logp=True, lse=False, entropy=False,
                  threshold=False, status=None, variant=None, stream=None):
    """One token per row of hidden [M, H] from the head hidden @ weight.T (rlk_linear_sample).

    temperature: one for the call (default 1; 0: greedy, the log-probs at temperature 1). top_k,
    top_p, min_p, seed, offset: as rlk.sample's, a Python number or an array [M] on hidden's device
    (a seed per row makes a row's token independent of the batch). logp=True returns the token's
    log-prob under the temperature-scaled head, bitwise rlk.linear_logprob's for that row, token
    and temperature (on the same kernel: variant as the trainer's call, "auto" on both sides
    picks alike); lse and entropy likewise; threshold=True the smallest raw logit of the row's
    kept set (kept-set replay: give it to rlk.linear_logprob's threshold=). status: an optional
    zeroed i32 [1] that collects rlk.sample's bits. Returns LinearSampleResult(tokens, logp or
    None, lse or None, entropy or None, threshold or None); nothing is read back."""
    # a repeated draw: through its plan (rlk/_entry.py) when one was kept and the arrays fit it
    fast = (tokens is None and status is None and _flag(logp) and _flag(lse) and _flag(entropy)
            and _flag(threshold) and (temperature is None or _is_scalar(temperature)) and use_plans(stream, hidden))
    if fast:
        part, arrays, numbers = plan_parts((temperature, top_k, top_p, min_p), (seed, offset))
        key = part + (token_dtype, logp, lse, entropy, threshold, variant, hidden.shape)
        # the temperature is a number here: the key's, not an input
        out = plan_call("linear_sample", key, (hidden, weight, *arrays[1:]), numbers)
        if out is not None:
            rest = iter(out[1:])
            return LinearSampleResult(out[0], *(next(rest) if on else None for on in (logp, lse, entropy, threshold)))
    b = Binder(OP)
    a = b.args
    b.set("hidden", hidden, _HIDDEN)
    b.set("weight", weight, _HIDDEN)
    if temperature is not None:
        a.temperature = f32("temperature", temperature)
    _filters(b, top_k, top_p, min_p, seed, offset)
    shape = (dim(hidden, 0),)
    tokens = _tokens(b, tokens, token_dtype, shape)
    lp = _optional_out(b, "logp", logp, shape)
    ls = _optional_out(b, "lse", lse, shape)
    ent = _optional_out(b, "entropy", entropy, shape)
    thr = _optional_out(b, "threshold", threshold, shape)
    b.set("status", status, (T.DType.I32,), optional=True, output=True)
    if variant is not None:
        a.variant = T.enum_value(LinearLogprobVariant, variant, "linear_sample: variant")
    b.bind_workspace()
    ctx = b.run(stream)
    if fast:
        inputs, written = plan_fields(arrays, part)
        keep_draw_plan("linear_sample", key, b, ctx, [("hidden", hidden), ("weight", weight)] + inputs[1:], written,
                       token_dtype_of(token_dtype), shape,
                       [f for f, on in (("logp", logp), ("lse", lse), ("entropy", entropy), ("threshold", threshold))
                        if on])
    return LinearSampleResult(tokens, lp, ls, ent, thr)

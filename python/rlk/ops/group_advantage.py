"""Group advantages (GRPO family): rlk_group_advantage. No backward (advantages are constants
of the loss)."""

from .. import _types as T
from .._tensor import Binder, Op, contiguous_strides, dim, compiling, keep_plan, plan_call, traced, use_plans

__all__ = ["AdvantageMode", "SingletonPolicy", "NanScores", "GroupAdvantageArgs", "group_advantage"]


AdvantageMode = T.c_enum("AdvantageMode", "rlk_advantage_mode", "RLK_ADV_")
SingletonPolicy = T.c_enum("SingletonPolicy", "rlk_singleton_policy", "RLK_SINGLETON_")
NanScores = T.c_enum("NanScores", "rlk_nan_scores", "RLK_NAN_SCORES_")


GroupAdvantageArgs = T.c_struct("rlk_group_advantage_args")


OP = Op("group_advantage", GroupAdvantageArgs, workspace=True, shared=("group_offsets",))

_F = (T.DType.F32, T.DType.F64)
_I = (T.DType.I32, T.DType.I64)
_F32 = T.DType.F32
_F32S = (_F32,)


def group_advantage(scores, group_size=None, *, group_offsets=None, mode=None, eps=None,
                    unbiased=None, singleton=None, mask=None, broadcast=False, advantages=None,
                    token_advantages=None, weights=None, nan_scores=None, stream=None):
    """Group-normalized advantages (rlk_group_advantage), on the scores' device and stream.

    scores: [B] per-sequence scores, or [B, T] token rewards summed per row under `mask`
        (f32 or f64). group_size: a fixed group size G dividing B (consecutive members), or
        group_offsets: [num_groups + 1] i32/i64 offsets for uneven groups (give one of them).
    mode: "grpo" (default), "mean-only", "rloo", "batch-std", "opo", "passk", "passk-unscaled"
        (or AdvantageMode). opo needs weights: [B] of the scores' dtype (response lengths).
    nan_scores: "propagate" (default) or "unscorable" (NaN scores are members with no score:
        left out of the group statistics, advantage 0; TRL).
    eps (default 1e-6), unbiased (default True: std with N - 1), singleton: "mean0-std1"
        (default, verl) or "zero". None keeps the library's default (rlk_group_advantage_args_init).
    mask: [B, T] bool, i32 or f32. broadcast: also return token_advantages [B, T] =
        advantages * mask (implied when `token_advantages` is given).
    advantages / token_advantages: optional preallocated f32 outputs.
    Returns advantages [B] f32, or (advantages, token_advantages) when broadcasting.
    """
    if compiling():
        return traced("group_advantage", dict(
            scores=scores, group_size=group_size, group_offsets=group_offsets, mode=mode, eps=eps,
            unbiased=unbiased, singleton=singleton, mask=mask, broadcast=broadcast,
            advantages=advantages, token_advantages=token_advantages, weights=weights,
            nan_scores=nan_scores, stream=stream))
    # a repeated call: through its plan (rlk/_entry.py) when one was kept and the tensors fit it
    fast = advantages is None and token_advantages is None and use_plans(stream, scores)
    if fast:
        key = (group_size, mode, eps, unbiased, singleton, bool(broadcast), nan_scores,
               group_offsets is None, mask is None, weights is None, scores.shape)
        out = plan_call("group_advantage", key, (scores, group_offsets, mask, weights), ())
        if out is not None:
            return (out[0], out[1]) if broadcast else out[0]
    b = Binder(OP)
    a = b.args
    dt = b.set("scores", scores, _F)
    if group_size is not None:
        T.set_int(a, "group_size", group_size)
    if group_offsets is not None:
        b.set("group_offsets", group_offsets, _I, optional=True)
    if mode is not None:
        a.mode = T.enum_value(AdvantageMode, mode, "group_advantage: mode")
    if eps is not None:
        a.eps = float(eps)
    if unbiased is not None:
        a.unbiased = 1 if unbiased else 0
    if singleton is not None:
        a.singleton = T.enum_value(SingletonPolicy, singleton, "group_advantage: singleton")
    if mask is not None:
        b.set("mask", mask, optional=True)
    if weights is not None:
        b.set("weights", weights, _F, optional=True)
    if nan_scores is not None:
        a.nan_scores = T.enum_value(NanScores, nan_scores, "group_advantage: nan_scores")
    B = dim(scores, 0)
    if advantages is None:
        advantages = b.output("advantages", _F32, (B,))
    else:
        b.set("advantages", advantages, _F32S, output=True)
    broadcast = broadcast or token_advantages is not None
    if broadcast:
        if token_advantages is None:
            if mask is not None:
                cols = dim(mask, 1) if mask.ndim == 2 else 0
            elif scores.ndim == 2:
                cols = dim(scores, 1)
            else:
                raise b._fail("broadcast", "needs a [B, T] mask or [B, T] scores to know T")
            token_advantages = b.output("token_advantages", _F32, (B, cols))
        else:
            b.set("token_advantages", token_advantages, _F32S, output=True)
    # scratch: f64 [B, T] scores' f64 row sums
    b.scratch((b.place, scores.shape, dt, a.mode, group_offsets is None, mask is None,
               weights is None, broadcast))
    ctx = b.run(stream)
    if fast:
        outs = [(-1, (B,), (1,), ("advantages",))]
        if broadcast:
            shape = tuple(token_advantages.shape)
            outs.append((-1, shape, contiguous_strides(shape), ("token_advantages",)))
        keep_plan("group_advantage", key, b, ctx, (
            ("scores", scores), ("group_offsets", group_offsets), ("mask", mask), ("weights", weights)),
            (), _F32, outs, ws=(a.workspace_bytes, 0, "workspace"))
    return (advantages, token_advantages) if broadcast else advantages

"""Optimal token baseline advantages: rlk_token_baseline. No backward (advantages are constants
of the loss)."""

from .. import _types as T
from .._tensor import Binder, Op, dim, compiling, traced

__all__ = ["TokenBaselineArgs", "token_baseline"]


TokenBaselineArgs = T.c_struct("rlk_token_baseline_args")


OP = Op("token_baseline", TokenBaselineArgs, workspace=True, shared=("group_offsets",))

_F = (T.DType.F32, T.DType.F64)


def token_baseline(rewards, old_logp, sum_pi_squared, group_size=None, *, group_offsets=None,
                   mask=None, rollout_is_weights=None, epsilon=None, handle_zero_tail=None,
                   compact=False, advantages=None, returns=None, stream=None):
    """Optimal token baseline advantages (rlk_token_baseline), on the inputs' device and stream.

    rewards, old_logp, sum_pi_squared, rollout_is_weights (optional): [B, T], f32 or f64, one
        dtype. mask: [B, T] bool, i32 or f32 (None: every token valid).
    group_size: a fixed group size dividing B (consecutive members), or group_offsets:
        [num_groups + 1] i32/i64 offsets for uneven groups (give one of them).
    epsilon (default 1e-8), handle_zero_tail (default True): the unique longest member of a
        group gets baseline 0 from the second-longest length on. compact: timesteps are each
        row's k-th valid token (verl's tir_optimal_token_baseline) instead of the columns.
    advantages / returns: optional preallocated [B, T] outputs of the inputs' dtype.
    Returns (advantages, returns).
    """
    if compiling():
        return traced("token_baseline", dict(
            rewards=rewards, old_logp=old_logp, sum_pi_squared=sum_pi_squared,
            group_size=group_size, group_offsets=group_offsets, mask=mask,
            rollout_is_weights=rollout_is_weights, epsilon=epsilon,
            handle_zero_tail=handle_zero_tail, compact=compact, advantages=advantages,
            returns=returns, stream=stream))
    b = Binder(OP)
    a = b.args
    dt = b.set("rewards", rewards, _F)
    b.set("old_logp", old_logp, (dt,))
    b.set("sum_pi_squared", sum_pi_squared, (dt,))
    b.set("rollout_is_weights", rollout_is_weights, (dt,), optional=True)
    b.set("mask", mask, optional=True)
    if group_size is not None:
        T.set_int(a, "group_size", group_size)
    b.set("group_offsets", group_offsets, (T.DType.I32, T.DType.I64), optional=True)
    if epsilon is not None:
        a.epsilon = float(epsilon)
    if handle_zero_tail is not None:
        a.handle_zero_tail = 1 if handle_zero_tail else 0
    a.compact = 1 if compact else 0
    shape = (dim(rewards, 0), dim(rewards, 1))
    for name, out in (("advantages", advantages), ("returns", returns)):
        if out is None:
            out = b.output(name, dt, shape)
        else:
            b.set(name, out, (dt,), output=True)
        if name == "advantages":
            advantages = out
        else:
            returns = out
    b.bind_workspace()
    b.run(stream)
    return advantages, returns

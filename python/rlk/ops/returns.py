"""Advantages and returns over time: rlk_gae, rlk_discounted_returns, rlk_reverse_cumsum and
rlk_masked_whiten. No backward (they make the constants of the loss).

Per-token tensors are [B, T] with contiguous rows (each its own row stride), f32 or f64, one
dtype per call; outputs are allocated in that dtype when not given. Masks are bool, i32 or f32.
"""

from .. import _types as T
from ..errors import InvalidArgument
from .._tensor import Binder, Op, compiling, contiguous_strides, keep_plan, plan_call, traced, use_plans

__all__ = ["ScanAlgo", "GaeMasked", "ReturnsMasked", "WhitenEps", "WhitenMasked", "GaeArgs",
           "DiscountedReturnsArgs", "ReverseCumsumArgs", "MaskedWhitenArgs", "gae",
           "discounted_returns", "reverse_cumsum", "masked_whiten"]


ScanAlgo = T.c_enum("ScanAlgo", "rlk_scan_algo", "RLK_SCAN_")
GaeMasked = T.c_enum("GaeMasked", "rlk_gae_masked", "RLK_GAE_MASKED_")
ReturnsMasked = T.c_enum("ReturnsMasked", "rlk_returns_masked", "RLK_RETURNS_MASKED_")
WhitenEps = T.c_enum("WhitenEps", "rlk_whiten_eps", "RLK_WHITEN_EPS_")
WhitenMasked = T.c_enum("WhitenMasked", "rlk_whiten_masked", "RLK_WHITEN_MASKED_")


GaeArgs = T.c_struct("rlk_gae_args")
DiscountedReturnsArgs = T.c_struct("rlk_discounted_returns_args")
ReverseCumsumArgs = T.c_struct("rlk_reverse_cumsum_args")
MaskedWhitenArgs = T.c_struct("rlk_masked_whiten_args")


GAE_OP = Op("gae", GaeArgs)
RETURNS_OP = Op("discounted_returns", DiscountedReturnsArgs)
CUMSUM_OP = Op("reverse_cumsum", ReverseCumsumArgs)
WHITEN_OP = Op("masked_whiten", MaskedWhitenArgs, workspace=True, shared=("stats",))

_F = (T.DType.F32, T.DType.F64)


def _algo(b, algo):
    b.args.algo = T.enum_value(ScanAlgo, algo, "%s: algo" % b.name)


def _keep(name, key, b, ctx, inputs, dtype, outputs, shape, ws=(0, 0, None)):
    """Keeps the call b just made as the plan of (name, key) (rlk/_entry.py): its outputs, the
    fields `outputs`, each an allocation of its own of `shape` and the input's dtype."""
    shape = tuple(shape)
    strides = contiguous_strides(shape)
    keep_plan(name, key, b, ctx, inputs, (), dtype, [(-1, shape, strides, (f,)) for f in outputs],
              ws=ws)


def _out(b, name, given, dtype, shape):
    """The output `name`: the caller's array, or a new one of the input's dtype and shape."""
    if given is None:
        return b.output(name, dtype, shape)
    b.set(name, given, _F, output=True)
    return given


def gae(rewards, values, mask=None, *, gamma=None, lam=None, masked=None, algo=None,
        advantages=None, returns=None, compute_returns=True, stream=None):
    """Generalized advantage estimation per row (rlk_gae).

    rewards, values: [B, T] f32 or f64; mask: the response mask. gamma (default 1), lam (the
    GAE lambda, default 1), masked: "skip" (verl, default) or "zero" (OpenRLHF, TRL).
    Returns (advantages, returns), or advantages alone with compute_returns=False.
    advantages / returns: optional preallocated outputs."""
    if compiling():
        return traced("gae", dict(
            rewards=rewards, values=values, mask=mask, gamma=gamma, lam=lam, masked=masked,
            algo=algo, advantages=advantages, returns=returns, compute_returns=compute_returns,
            stream=stream))
    # a repeated call: through its plan (rlk/_entry.py) when one was kept and the tensors fit it
    fast = advantages is None and returns is None and use_plans(stream, rewards)
    if fast:
        key = (gamma, lam, masked, algo, bool(compute_returns), mask is None, rewards.shape)
        out = plan_call("gae", key, (rewards, values, mask), ())
        if out is not None:
            return tuple(out) if compute_returns else out[0]
    b = Binder(GAE_OP)
    a = b.args
    dt = b.set("rewards", rewards, _F)
    b.set("values", values, _F)
    if mask is not None:
        b.set("mask", mask, optional=True)
    if gamma is not None:
        a.gamma = float(gamma)
    if lam is not None:
        setattr(a, "lambda", float(lam))
    if masked is not None:
        a.masked = T.enum_value(GaeMasked, masked, "gae: masked")
    if algo is not None:
        _algo(b, algo)
    advantages = _out(b, "advantages", advantages, dt, rewards.shape)
    want_returns = compute_returns or returns is not None
    if want_returns:
        returns = _out(b, "returns", returns, dt, rewards.shape)
    ctx = b.run(stream)
    if fast:
        _keep("gae", key, b, ctx, (("rewards", rewards), ("values", values), ("mask", mask)), dt,
              ("advantages", "returns") if want_returns else ("advantages",), rewards.shape)
    return (advantages, returns) if want_returns else advantages


def discounted_returns(rewards, mask=None, *, gamma=None, masked=None, algo=None, returns=None,
                       stream=None):
    """Discounted returns R_t = r_t + gamma R_{t+1} per row (rlk_discounted_returns).
    masked: "reset" (the default: verl's REINFORCE++ before multi-turn rollouts), "zero"
    (OpenRLHF) or "carry" (verl 0.9.1's REINFORCE++: carried through masked observation tokens).
    Returns [B, T]."""
    if compiling():
        return traced("discounted_returns", dict(
            rewards=rewards, mask=mask, gamma=gamma, masked=masked, algo=algo, returns=returns,
            stream=stream))
    fast = returns is None and use_plans(stream, rewards)
    if fast:
        key = (gamma, masked, algo, mask is None, rewards.shape)
        out = plan_call("discounted_returns", key, (rewards, mask), ())
        if out is not None:
            return out[0]
    b = Binder(RETURNS_OP)
    a = b.args
    dt = b.set("rewards", rewards, _F)
    if mask is not None:
        b.set("mask", mask, optional=True)
    if gamma is not None:
        a.gamma = float(gamma)
    if masked is not None:
        a.masked = T.enum_value(ReturnsMasked, masked, "discounted_returns: masked")
    if algo is not None:
        _algo(b, algo)
    returns = _out(b, "returns", returns, dt, rewards.shape)
    ctx = b.run(stream)
    if fast:
        _keep("discounted_returns", key, b, ctx, (("rewards", rewards), ("mask", mask)), dt,
              ("returns",), rewards.shape)
    return returns


def reverse_cumsum(values, mask=None, *, baseline=None, algo=None, out=None, advantages=None,
                   stream=None):
    """Reverse cumulative sums of the valid values per row (rlk_reverse_cumsum; values * mask for a
    0/1 mask: the mask selects positions). With a baseline [B] (ReMax: the greedy rollout's
    reward) also the advantages, out_t - baseline_b where valid and out_t elsewhere.
    Returns out, or (out, advantages) with a baseline."""
    if compiling():
        return traced("reverse_cumsum", dict(
            values=values, mask=mask, baseline=baseline, algo=algo, out=out, advantages=advantages,
            stream=stream))
    fast = out is None and advantages is None and use_plans(stream, values)
    if fast:
        key = (algo, mask is None, baseline is None, values.shape)
        got = plan_call("reverse_cumsum", key, (values, mask, baseline), ())
        if got is not None:
            return tuple(got) if baseline is not None else got[0]
    b = Binder(CUMSUM_OP)
    dt = b.set("values", values, _F)
    if mask is not None:
        b.set("mask", mask, optional=True)
    if algo is not None:
        _algo(b, algo)
    out = _out(b, "out", out, dt, values.shape)
    if baseline is not None or advantages is not None:
        b.set("baseline", baseline, _F)
        advantages = _out(b, "advantages", advantages, dt, values.shape)
    ctx = b.run(stream)
    if fast:
        _keep("reverse_cumsum", key, b, ctx, (("values", values), ("mask", mask),
              ("baseline", baseline)), dt, ("out",) if baseline is None else ("out", "advantages"),
              values.shape)
    return (out, advantages) if baseline is not None else out


def masked_whiten(x, mask=None, *, eps=None, eps_mode=None, unbiased=None, count_eps=None,
                  shift_mean=None, normalize_std=None, masked=None, out=None, inplace=False,
                  stats=False, stream=None):
    """Whitens x over the valid elements of the whole batch (rlk_masked_whiten).

    Defaults are verl's masked_whiten (eps 1e-8 added, unbiased, count_eps 1e-8). eps_mode
    "add" or "clamp" (OpenRLHF); masked "apply" or "zero". inplace=True writes over x (out, if
    given, must then be x).
    Returns out, or (out, stats) with stats=True: f64 [3] {mean, var, N}."""
    if inplace and out is not None and out is not x:
        raise InvalidArgument("rlk.masked_whiten: out and inplace=True name two outputs; give one")
    if compiling():
        return traced("masked_whiten", dict(
            x=x, mask=mask, eps=eps, eps_mode=eps_mode, unbiased=unbiased, count_eps=count_eps,
            shift_mean=shift_mean, normalize_std=normalize_std, masked=masked, out=out,
            inplace=inplace, stats=stats, stream=stream))
    fast = out is None and not inplace and not stats and use_plans(stream, x)
    if fast:
        key = (eps, eps_mode, unbiased, count_eps, shift_mean, normalize_std, masked, mask is None,
               x.shape)
        got = plan_call("masked_whiten", key, (x, mask), ())
        if got is not None:
            return got[0]
    b = Binder(WHITEN_OP)
    a = b.args
    dt = b.set("x", x, _F)
    if mask is not None:
        b.set("mask", mask, optional=True)
    if eps is not None:
        a.eps = float(eps)
    if count_eps is not None:
        a.count_eps = float(count_eps)
    if unbiased is not None:
        a.unbiased = 1 if unbiased else 0
    if shift_mean is not None:
        a.shift_mean = 1 if shift_mean else 0
    if normalize_std is not None:
        a.normalize_std = 1 if normalize_std else 0
    if eps_mode is not None:
        a.eps_mode = T.enum_value(WhitenEps, eps_mode, "masked_whiten: eps_mode")
    if masked is not None:
        a.masked = T.enum_value(WhitenMasked, masked, "masked_whiten: masked")
    if inplace:
        out = x
    out = _out(b, "out", out, dt, x.shape)
    st = None
    if stats:
        st = b.output("stats", T.DType.F64, (3,))
    b.scratch((b.place, x.shape, mask is None, dt))
    ctx = b.run(stream)
    if stats and b.no_rows:  # an empty batch launched nothing: N 0, mean and var undefined (rlk.h)
        st[:2] = float("nan")
    if fast:
        _keep("masked_whiten", key, b, ctx, (("x", x), ("mask", mask)), dt, ("out",), x.shape,
              ws=(a.workspace_bytes, 0, "workspace"))
    return (out, st) if stats else out

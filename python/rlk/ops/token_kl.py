"""Per-token KL estimates against a reference policy and their gradient: rlk_token_kl."""
import math

from .. import _types as T
from .._tensor import Binder, Op, compiling, traced
from ..errors import InvalidArgument
from .losses import KLEstimator

__all__ = ["TokenKLArgs", "token_kl"]


TokenKLArgs = T.c_struct("rlk_token_kl_args")


OP = Op("token_kl", TokenKLArgs)

_F = (T.DType.F32, T.DType.F64)
_OUTPUTS = ("kl", "grad", "both")


def _range(r):
    """(min, max) of a clamp; None, or None for a side, is no bound."""
    lo, hi = (None, None) if r is None else r
    return (-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi))


def token_kl(logp, ref_logp, estimator="k3", *, mask=None, input_clamp=(-20.0, 20.0),
             output_clamp=(-10.0, 10.0), outputs="kl", grad_kl=None, straight_through=False,
             old_logp=None, is_weight_max=None, clamp_bound_grad=None, kl=None, grad_logp=None,
             stream=None):
    """Per-token KL estimates of logp against ref_logp (rlk_token_kl), on the inputs' device and
    stream.

    logp, ref_logp (and old_logp, grad_kl when given): [B, T] (rows contiguous) or [N], f32 or
        f64, one dtype. mask: bool, i32 or f32 of that shape (both outputs 0 where it is 0).
    estimator: "k1", "abs", "k2" or "k3" (default). input_clamp / output_clamp: (min, max) of
        the log-ratio before the estimator and of its value, None for no bound (defaults: verl's
        low_var_kl, (-20, 20) and (-10, 10)).
    outputs: "kl" (default), "grad" (d kl / d logp, times grad_kl when given) or "both".
    straight_through: the gradient is w (logp - ref_logp), k2's (verl "k3+", OpenRLHF
        unbiased_gradient), w = min(exp(logp - old_logp), is_weight_max) with old_logp, else 1.
    clamp_bound_grad: the gradient a clamp passes on its bound (default 1).
    kl / grad_logp: optional preallocated outputs of the inputs' shape and dtype.
    Returns kl, grad_logp or (kl, grad_logp) as `outputs` says.
    """
    if compiling():
        return traced("token_kl", dict(
            logp=logp, ref_logp=ref_logp, estimator=estimator, mask=mask, input_clamp=input_clamp,
            output_clamp=output_clamp, outputs=outputs, grad_kl=grad_kl,
            straight_through=straight_through, old_logp=old_logp, is_weight_max=is_weight_max,
            clamp_bound_grad=clamp_bound_grad, kl=kl, grad_logp=grad_logp, stream=stream))
    if outputs not in _OUTPUTS:
        raise InvalidArgument("token_kl: outputs must be one of %s, got %r" % (", ".join(_OUTPUTS), outputs))
    b = Binder(OP)
    a = b.args
    dt = b.set("logp", logp, _F)
    b.set("ref_logp", ref_logp, (dt,))
    b.set("old_logp", old_logp, (dt,), optional=True)
    b.set("grad_kl", grad_kl, (dt,), optional=True)
    b.set("mask", mask, optional=True)
    a.estimator = T.enum_value(KLEstimator, estimator, "token_kl: estimator")
    a.input_min, a.input_max = _range(input_clamp)
    a.output_min, a.output_max = _range(output_clamp)
    a.straight_through = 1 if straight_through else 0
    if is_weight_max is not None:
        a.is_weight_max = float(is_weight_max)
    if clamp_bound_grad is not None:
        a.clamp_bound_grad = float(clamp_bound_grad)
    shape = tuple(logp.shape)
    res = []
    for name, want, out in (("kl", outputs != "grad", kl), ("grad_logp", outputs != "kl", grad_logp)):
        if not want:
            continue
        if out is None:
            out = b.output(name, dt, shape)
        else:
            b.set(name, out, (dt,), output=True)
        res.append(out)
    b.run(stream)
    return res[0] if len(res) == 1 else tuple(res)

"""Token log-probs and entropy from logits: rlk_logprob and rlk_logprob_backward.

logits are [N, V] (bf16, f16 or f32; rows contiguous, any row stride) and labels [N] (i32 or
i64); logp, lse and entropy come back f32 [N]. rlk.autograd.token_logprob wraps both calls in
a torch.autograd.Function (and accepts [..., V] logits).
"""
import collections

from .. import _types as T
from .._tensor import (Binder, Op, contiguous_strides, dim, compiling, f32, keep_plan, plan_call, traced,
                       use_plans)
from ..errors import InvalidArgument

__all__ = ["LogprobVariant", "LogprobArgs", "LogprobBackwardArgs", "LogprobResult",
           "STATUS_BAD_LABEL", "logprob", "logprob_backward"]

STATUS_BAD_LABEL = T.c_constant("RLK_LOGPROB_STATUS_BAD_LABEL")


LogprobVariant = T.c_enum("LogprobVariant", "rlk_logprob_variant", "RLK_LOGPROB_VARIANT_")


LogprobArgs = T.c_struct("rlk_logprob_args")
LogprobBackwardArgs = T.c_struct("rlk_logprob_backward_args")


FORWARD_OP = Op("logprob", LogprobArgs)
BACKWARD_OP = Op("logprob_backward", LogprobBackwardArgs)

LogprobResult = collections.namedtuple("LogprobResult", "logp lse entropy")

_LOGITS = (T.DType.BF16, T.DType.F16, T.DType.F32)
_LABELS = (T.DType.I32, T.DType.I64)
_F32 = (T.DType.F32,)
_F32D = T.DType.F32
_I32 = (T.DType.I32,)


def _common(b, logits, labels, temperature, ignore_index, status, variant, block, unroll, stages,
            into=None):
    """Sets what the forward and the backward share; returns the logits' rlk dtype. into: the
    name of the args field holding a forward's struct (vocab_parallel_logprob_nccl's "fwd")."""
    a, at = (b.args, "") if into is None else (getattr(b.args, into), into + ".")
    dt = b.set(at + "logits", logits, _LOGITS)
    b.set(at + "labels", labels, _LABELS)
    if temperature is not None:
        a.temperature = f32("temperature", temperature)
    if ignore_index is not None:
        T.set_int(a, "ignore_index", ignore_index)
    if status is not None:
        b.set(at + "status", status, _I32, optional=True, output=True)
    if variant is not None:
        a.variant = T.enum_value(LogprobVariant, variant, "%s: variant" % b.name)
    if block is not None:
        T.set_int(a, "block", block)
    if unroll is not None:
        T.set_int(a, "unroll", unroll)
    if stages is not None:
        T.set_int(a, "stages", stages)
    return dt


def logprob(logits, labels, *, temperature=None, ignore_index=None, entropy=False, lse=True,
            logp=None, status=None, variant=None, block=None, unroll=None, stages=None,
            threshold=None, stream=None):
    """logp[i] = z[i, y_i] - lse[i] with z = logits / temperature in fp32 (rlk_logprob).

    temperature (default 1), ignore_index (default -100: the row gets logp 0). entropy=True
    also computes the entropy (same pass); lse=True keeps lse (what the backward needs).
    status: an optional zeroed i32 [1] the call ORs STATUS_BAD_LABEL into for a label outside
    [0, V). threshold: kept-set replay, f32 [N] (rlk.sample's threshold=True output): each row's
    softmax over its logits at or above the threshold and its label. Returns LogprobResult(logp,
    lse or None, entropy or None), f32 [N]."""
    if compiling():
        return traced("logprob", dict(
            logits=logits, labels=labels, temperature=temperature, ignore_index=ignore_index,
            entropy=entropy, lse=lse, logp=logp, status=status, variant=variant, block=block,
            unroll=unroll, stages=stages, threshold=threshold, stream=stream))
    # a repeated call: through its plan (rlk/_entry.py) when one was kept and the tensors fit it
    fast = logp is None and status is None and use_plans(stream, logits)
    if fast:
        pkey = (temperature, ignore_index, bool(entropy), bool(lse), variant, block, unroll, stages,
                threshold is None, logits.shape)
        out = plan_call("logprob", pkey, (logits, labels, threshold), ())
        if out is not None:
            return LogprobResult(out[0], out[1] if lse else None, out[-1] if entropy else None)
    b = Binder(FORWARD_OP)
    _common(b, logits, labels, temperature, ignore_index, status, variant, block, unroll, stages)
    if threshold is not None:
        b.set("threshold", threshold, _F32)
    n = dim(logits, 0)
    made = logp is None
    if not made:
        b.set("logp", logp, _F32, output=True)
    key = (n, made, bool(lse), bool(entropy))
    spec = _OUTPUTS.get(key) or _outputs(key)
    out = iter(b.outputs(_F32D, spec))
    if made:
        logp = next(out)
    lse_out = next(out) if lse else None
    ent_out = next(out) if entropy else None
    ctx = b.run(stream)
    if fast:
        keep_plan("logprob", pkey, b, ctx, (("logits", logits), ("labels", labels), ("threshold", threshold)),
                  (), _F32D, [(-1, (n,), (1,), (f,)) for f in ("logp",) + ("lse",) * bool(lse) +
                              ("entropy",) * bool(entropy)])
    return LogprobResult(logp, lse_out, ent_out)


_OUTPUTS = {}  # (rows, logp made, lse, entropy) -> the Binder.outputs spec of the forward's outputs


def _outputs(key):
    n, made, lse, entropy = key
    names = ("logp",) * made + ("lse",) * lse + ("entropy",) * entropy
    if len(_OUTPUTS) >= 4096:  # a bound on what a run of ever-new shapes can keep
        _OUTPUTS.clear()
    spec = _OUTPUTS[key] = FORWARD_OP.outputs(*[(name, (n,)) for name in names])
    return spec


def logprob_backward(logits, labels, lse, grad_logp=None, grad_entropy=None, entropy=None, *,
                     temperature=None, ignore_index=None, grad_logits=None, grad_dtype=None,
                     inplace=False, status=None, variant=None, block=None, unroll=None,
                     stages=None, vocab_start=None, threshold=None, stream=None):
    """grad_logits = (g_lp (onehot(y) - p) - g_H p (z - E_p[z])) / temperature
    (rlk_logprob_backward). lse (and entropy, with grad_entropy) from the forward; grad_logp and
    grad_entropy are f32 [N] upstream gradients, at least one given. The output is in the
    logits' dtype unless grad_dtype="f32"; inplace=True writes it over the logits.
    vocab_start (shard form): the logits are the vocabulary columns [vocab_start, vocab_start +
    V) and lse / entropy the combined ones (rlk.logprob_combine); labels outside the shard are
    other shards'. threshold: the kept-set forward's (p over the kept set). Returns grad_logits
    [N, V]."""
    if compiling():
        return traced("logprob_backward", dict(
            logits=logits, labels=labels, lse=lse, grad_logp=grad_logp, grad_entropy=grad_entropy,
            entropy=entropy, temperature=temperature, ignore_index=ignore_index,
            grad_logits=grad_logits, grad_dtype=grad_dtype, inplace=inplace, status=status,
            variant=variant, block=block, unroll=unroll, stages=stages, vocab_start=vocab_start,
            threshold=threshold, stream=stream))
    fast = grad_logits is None and not inplace and status is None and use_plans(stream, logits)
    if fast:
        key = (temperature, ignore_index, grad_dtype, variant, block, unroll, stages, vocab_start,
               threshold is None, grad_logp is None, grad_entropy is None, entropy is None,
               logits.shape)
        out = plan_call("logprob_backward", key,
                        (logits, labels, lse, grad_logp, grad_entropy, entropy, threshold), ())
        if out is not None:
            return out[0]
    b = Binder(BACKWARD_OP)
    dt = _common(b, logits, labels, temperature, ignore_index, status, variant, block, unroll, stages)
    if threshold is not None:
        b.set("threshold", threshold, _F32)
    if vocab_start is not None:
        b.args.shard = 1
        T.set_int(b.args, "vocab_start", vocab_start)
    b.set("lse", lse, _F32)
    if grad_logp is not None:
        b.set("grad_logp", grad_logp, _F32, optional=True)
    if grad_entropy is not None:
        b.set("grad_entropy", grad_entropy, _F32, optional=True)
    if entropy is not None:
        b.set("entropy", entropy, _F32, optional=True)
    if inplace:
        grad_logits = logits
    if grad_logits is None:
        if grad_dtype is not None:
            if isinstance(grad_dtype, str) and grad_dtype not in T.DTYPE_BY_NAME:
                raise InvalidArgument("rlk.logprob_backward: grad_dtype %r is not one of %s"
                                      % (grad_dtype, ", ".join(sorted(T.DTYPE_BY_NAME))))
            dt = T.DTYPE_BY_NAME[grad_dtype] if isinstance(grad_dtype, str) else T.DType(grad_dtype)
        shape = (dim(logits, 0), dim(logits, 1))
        grad_logits = b.output("grad_logits", dt, shape)
    else:
        b.set("grad_logits", grad_logits, output=True)
    ctx = b.run(stream)
    if fast:
        keep_plan("logprob_backward", key, b, ctx, (
            ("logits", logits), ("labels", labels), ("lse", lse), ("grad_logp", grad_logp),
            ("grad_entropy", grad_entropy), ("entropy", entropy), ("threshold", threshold)), (),
            dt, [(-1, shape, contiguous_strides(shape), ("grad_logits",))])
    return grad_logits

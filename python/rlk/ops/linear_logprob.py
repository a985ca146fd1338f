"""The fused LM head + token log-probs and entropy: rlk_linear_logprob.

hidden [N, H] and weight [V, H] (bf16 or f16, the same dtype; rows contiguous, any row stride),
labels [N] (i32 or i64). Returns rlk.logprob's result for logits = hidden @ weight.T without ever
storing those logits: logp, lse and entropy f32 [N].
"""
import ctypes
import enum

from .. import _types as T
from .._tensor import Binder, Op, dim
from .logprob import LogprobResult

__all__ = ["LinearLogprobVariant", "LinearLogprobArgs", "linear_logprob"]


class LinearLogprobVariant(enum.IntEnum):
    AUTO = 0
    WGMMA = 1
    TILED = 2


@T.abi_struct("rlk_linear_logprob_args")
class LinearLogprobArgs(ctypes.Structure):
    _fields_ = [
        ("hidden", T.Tensor),
        ("weight", T.Tensor),
        ("labels", T.Tensor),
        ("temperature", ctypes.c_float),
        ("ignore_index", ctypes.c_int64),
        ("logp", T.Tensor),
        ("lse", T.Tensor),
        ("entropy", T.Tensor),
        ("status", T.Tensor),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("variant", ctypes.c_int),
        ("splits", ctypes.c_int),
    ]


OP = Op("linear_logprob", LinearLogprobArgs, workspace=True)

_HIDDEN = (T.DType.BF16, T.DType.F16)
_LABELS = (T.DType.I32, T.DType.I64)
_F32 = (T.DType.F32,)


def linear_logprob(hidden, weight, labels, *, entropy=False, temperature=None, ignore_index=None,
                   lse=True, status=None, variant=None, splits=None, stream=None):
    """logp[i] = z[i, y_i] - lse[i] with z = hidden @ weight.T / temperature, accumulated in f32 on
    a GPU (fp64 on the host), never materialized (rlk_linear_logprob).

    temperature (default 1), ignore_index (default -100: logp 0). entropy=True also computes the
    entropy in the same pass. status: an optional zeroed i32 [1] that gets STATUS_BAD_LABEL for a
    label outside [0, V). variant: "auto", "wgmma" (sm_90a) or "tiled"; splits: vocabulary splits
    (0: chosen). Returns LogprobResult(logp, lse or None, entropy or None)."""
    b = Binder(OP)
    a = b.args
    b.set("hidden", hidden, _HIDDEN)
    b.set("weight", weight, _HIDDEN)
    b.set("labels", labels, _LABELS)
    if temperature is not None:
        a.temperature = float(temperature)
    if ignore_index is not None:
        a.ignore_index = int(ignore_index)
    b.set("status", status, (T.DType.I32,), optional=True, output=True)
    if variant is not None:
        a.variant = T.enum_value(LinearLogprobVariant, variant, "linear_logprob: variant")
    if splits is not None:
        a.splits = int(splits)
    n = dim(hidden, 0)
    logp = b.empty((n,), T.DType.F32)
    b.set("logp", logp, _F32, output=True)
    lse_out = b.empty((n,), T.DType.F32) if lse else None
    ent_out = b.empty((n,), T.DType.F32) if entropy else None
    b.set("lse", lse_out, _F32, optional=True, output=True)
    b.set("entropy", ent_out, _F32, optional=True, output=True)
    nbytes = OP.workspace_size(b.context(), a)
    if nbytes:
        _, ptr = b.workspace(nbytes)
        a.workspace = ptr
        a.workspace_bytes = nbytes
    b.run(stream)
    return LogprobResult(logp, lse_out, ent_out)

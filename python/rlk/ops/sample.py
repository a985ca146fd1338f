"""Sampling one token per row: rlk_sample.

logits are [B, V] (f32, bf16 or f16; rows contiguous, any row stride). Every setting is a scalar
for the whole batch or an array [B] (temperature, top_k, top_p, min_p, seed, offset; seeds and
offsets are int64 bit patterns). tokens come back int64 (or int32 with token_dtype="i32"), logp and
logp_filtered f32 [B]; logp is bitwise what rlk.logprob gives for that row, temperature (1 for
greedy rows) and token.
"""
import collections

from .. import _types as T
from ..errors import InvalidArgument
from .._tensor import Binder, Op, dim, compiling, f32, keep_plan, plan_call, traced, use_plans

__all__ = ["SampleArgs", "SampleResult", "SAMPLE_STATUS_NAN", "SAMPLE_STATUS_NO_TOKEN",
           "SAMPLE_STATUS_BAD_PARAM", "SAMPLE_ROW_SPLIT_AUTO", "sample"]

SAMPLE_STATUS_NAN = T.c_constant("RLK_SAMPLE_STATUS_NAN")
SAMPLE_STATUS_NO_TOKEN = T.c_constant("RLK_SAMPLE_STATUS_NO_TOKEN")
SAMPLE_STATUS_BAD_PARAM = T.c_constant("RLK_SAMPLE_STATUS_BAD_PARAM")
SAMPLE_ROW_SPLIT_AUTO = T.c_constant("RLK_SAMPLE_ROW_SPLIT_AUTO")


SampleArgs = T.c_struct("rlk_sample_args")


OP = Op("sample", SampleArgs)

SampleResult = collections.namedtuple("SampleResult", "tokens logp logp_filtered threshold",
                                      defaults=(None,))

_LOGITS = (T.DType.F32, T.DType.BF16, T.DType.F16)
_F32 = (T.DType.F32,)
_I64 = (T.DType.I64,)
_TOKENS = (T.DType.I32, T.DType.I64)


def _is_scalar(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _setting(b, name, tensor_field, value, dtypes, convert):
    """A scalar goes into the struct's scalar field, an array into its per-row tensor."""
    if value is None:
        return
    if _is_scalar(value):
        setattr(b.args, name, convert(name, value))
    else:
        b.set(tensor_field, value, dtypes)


def _int(name, x):
    """An int64 setting (top_k): an integer, refused where int64_t cannot hold it, whose low bits
    the library would read as another setting (2^64 + 1 as a top_k of 1)."""
    if isinstance(x, float) and not x.is_integer():
        raise InvalidArgument("%s: %r is not an integer" % (name, x))
    v = int(x)
    if not -(1 << 63) <= v < (1 << 63):
        raise InvalidArgument("%s: %d is outside int64 (the library's type for it)" % (name, v))
    return v


def _u64(name, x):
    """A 64-bit bit pattern (seed, offset): an integer in [-2^63, 2^64), negative ones as their
    two's complement; wider ones are refused (their low bits would draw as another seed)."""
    if isinstance(x, float) and not x.is_integer():
        raise InvalidArgument("%s: %r is not an integer" % (name, x))
    v = int(x)
    if not -(1 << 63) <= v < (1 << 64):
        raise InvalidArgument("%s: %d is outside 64 bits (int64 or uint64)" % (name, v))
    return v & 0xFFFFFFFFFFFFFFFF


def _filters(b, top_k, top_p, min_p, seed, offset):
    """The filters' and the draws' settings (the fields top_k(s) to offset(s) of rlk_sample_args and rlk_linear_sample_args), each a number or an array [B]."""
    _setting(b, "top_k", "top_ks", top_k, _TOKENS, _int)
    _setting(b, "top_p", "top_ps", top_p, _F32, f32)
    _setting(b, "min_p", "min_ps", min_p, _F32, f32)
    _setting(b, "seed", "seeds", seed, _I64, _u64)
    _setting(b, "offset", "offsets", offset, _I64, _u64)


# The settings a call gives as a number (a plan's key holds it) or an array [B] (a plan's input),
# then the draws' seed and offset, whose numbers a plan writes into each call's struct.
_SETTINGS = (("temperature", "temperatures"), ("top_k", "top_ks"), ("top_p", "top_ps"), ("min_p", "min_ps"))
_DRAWS = (("seed", "seeds"), ("offset", "offsets"))


def _flag(x):
    return x is True or x is False


def plan_parts(settings, draws):
    """A repeated draw's plan: (key part, the arrays in _SETTINGS' then _DRAWS' order (None where
    a number or absent), the seed and offset numbers). settings: the values of _SETTINGS' fields
    (those a call leaves out are absent), draws: seed and offset."""
    key, arrays, numbers = [], [], []
    for v in settings:
        if v is None or v.__class__ is float or v.__class__ is int or _is_scalar(v):
            key.append(v)
            arrays.append(None)
        else:
            key.append("array")
            arrays.append(v)
    for v in draws:
        if v is None:
            key.append(None)
            arrays.append(None)
        elif v.__class__ is int or _is_scalar(v):
            key.append("number")
            arrays.append(None)
            numbers.append(v)
        else:
            key.append("array")
            arrays.append(v)
    return tuple(key), arrays, numbers


def plan_fields(arrays, key):
    """What keep_draw_plan takes from plan_parts' arrays and key: the inputs as (field, array or
    None) and the draw numbers' fields as (field, whether written per call)."""
    fields = [f for _, f in _SETTINGS + _DRAWS]
    return list(zip(fields, arrays)), [(name, k == "number") for (name, _), k in zip(_DRAWS, key[len(_SETTINGS):])]


def keep_draw_plan(name, key, b, ctx, inputs, written, tokens, shape, outputs):
    """Keeps a draw just made (rlk_sample or rlk_linear_sample) as the plan of (name, key): its
    tokens (rlk dtype `tokens`), then the f32 outputs named in `outputs` (each of shape [B]), and
    the workspace when the op has one."""
    outs = [(-1, shape, (1,), ("tokens",), tokens)]
    outs += [(-1, shape, (1,), (f,)) for f in outputs]
    ws = (b.args.workspace_bytes, 0, "workspace") if b.op.has_workspace else (0, 0, None)
    keep_plan(name, key, b, ctx, inputs, written, T.DType.F32, outs, ws=ws)


def token_dtype_of(token_dtype):
    return T.DTYPE_BY_NAME[token_dtype] if isinstance(token_dtype, str) else T.DType(token_dtype)


def _tokens(b, tokens, token_dtype, shape):
    """The tokens output: the given array, else a new one of token_dtype ("i64" or "i32")."""
    if tokens is not None:
        b.set("tokens", tokens, _TOKENS, output=True)
        return tokens
    dt = token_dtype_of(token_dtype)
    tokens = b.empty(shape, dt)
    if dt not in _TOKENS:
        b.set("tokens", tokens, _TOKENS, output=True)  # names the bad dtype
    return b.set_new("tokens", tokens, dt, shape)


def _optional_out(b, name, want, shape):
    """An optional f32 output: True allocates it, an array is written, False leaves it out."""
    if want is True:
        return b.output(name, T.DType.F32, shape)
    x = None if want is False else want
    b.set(name, x, _F32, optional=True, output=True)
    return x


def sample(logits, *, temperature=None, top_k=None, top_p=None, min_p=None, seed=None, offset=None,
           tokens=None, token_dtype="i64", logp=True, logp_filtered=False, threshold=False, status=None,
           logprob_block=None, logprob_unroll=None, row_split=None, pdl=None, stream=None):
    """One token per row of logits [B, V] (rlk_sample): temperature (0: greedy), then min-p,
    top-k and top-p (vLLM's order, ties at a threshold kept), Philox4x32-10 draws from seed and
    offset (a per-row seed makes a row's token independent of the batch around it).

    Each setting is a Python number (every row) or an array [B] on the logits' device:
    temperature, top_p, min_p f32; top_k i32 or i64; seed and offset i64. logp=True returns the
    sampled token's log-prob under the temperature-scaled distribution (rlk.logprob's bits),
    logp_filtered=True its log-prob under the filtered one, threshold=True the smallest logit of
    the row's kept set (every logit >= it was kept; -inf unfiltered, the maximum greedy, NaN
    without a token): what kept-set replay takes. status: an optional zeroed i32 [1]
    that collects SAMPLE_STATUS_* bits (rows with NaN logits, no finite logit, or a bad per-row
    setting get token -1). row_split: the blocks that share a row (1, 2, 4, 8 or "auto", the
    default; CUDA sm_90+ without filters, else one), the same tokens and log-probs whatever its
    value. pdl: True (the default) lets the kernel start while the stream's previous kernel ends
    (CUDA sm_90+; it waits for that kernel's results), False launches it plainly.
    Returns SampleResult(tokens, logp or None, logp_filtered or None, threshold or None)."""
    if compiling():
        return traced("sample", dict(
            logits=logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            seed=seed, offset=offset, tokens=tokens, token_dtype=token_dtype, logp=logp,
            logp_filtered=logp_filtered, threshold=threshold, status=status,
            logprob_block=logprob_block, logprob_unroll=logprob_unroll, row_split=row_split,
            pdl=pdl, stream=stream))
    # a repeated draw: through its plan (rlk/_entry.py) when one was kept and the arrays fit it
    fast = (tokens is None and status is None and _flag(logp) and _flag(logp_filtered) and _flag(threshold)
            and use_plans(stream, logits))
    if fast:
        part, arrays, numbers = plan_parts((temperature, top_k, top_p, min_p), (seed, offset))
        key = part + (token_dtype, logp, logp_filtered, threshold, logprob_block, logprob_unroll, row_split,
                      pdl, logits.shape)
        out = plan_call("sample", key, (logits, *arrays), numbers)
        if out is not None:
            rest = iter(out[1:])
            return SampleResult(out[0], next(rest) if logp else None, next(rest) if logp_filtered else None,
                                next(rest) if threshold else None)
    b = Binder(OP)
    b.set("logits", logits, _LOGITS)
    _setting(b, "temperature", "temperatures", temperature, _F32, f32)
    _filters(b, top_k, top_p, min_p, seed, offset)
    shape = (dim(logits, 0),)
    tokens = _tokens(b, tokens, token_dtype, shape)
    lp = _optional_out(b, "logp", logp, shape)
    lpf = _optional_out(b, "logp_filtered", logp_filtered, shape)
    thr = _optional_out(b, "threshold", threshold, shape)
    b.set("status", status, (T.DType.I32,), optional=True, output=True)
    if logprob_block is not None:
        T.set_int(b.args, "logprob_block", logprob_block)
    if logprob_unroll is not None:
        T.set_int(b.args, "logprob_unroll", logprob_unroll)
    if row_split is not None:
        b.args.row_split = SAMPLE_ROW_SPLIT_AUTO if row_split == "auto" else int(row_split)
    if pdl is not None:
        b.args.pdl = 1 if pdl else 0
    ctx = b.run(stream)
    if fast:
        inputs, written = plan_fields(arrays, part)
        keep_draw_plan("sample", key, b, ctx, [("logits", logits)] + inputs, written, token_dtype_of(token_dtype),
                       shape, [f for f, on in (("logp", logp), ("logp_filtered", logp_filtered),
                                               ("threshold", threshold)) if on])
    return SampleResult(tokens, lp, lpf, thr)

"""Prefix-shared attention for GRPO groups: rlk_prefix_attention and its backward.

A batch of prompts is packed once as [prefix | r_1 | ... | r_G] per prompt (PrefixLayout, built
by prefix_layout or pack_grpo): a prefix token attends causally within its prefix, a response
token to its whole prefix and causally within its own response. q [T, Hq, D], k and v
[T, Hkv, D] (bf16 or f16, D 64 or 128, Hq a multiple of Hkv). rlk.autograd.prefix_attention
(and rlk.prefix_attention with a tensor that requires grad) is differentiable in q, k and v.
"""
import collections
import ctypes
import sys

from .. import _types as T
from .._tensor import Binder, Op, f32, is_torch, compiling, traced
from ..errors import InvalidArgument

__all__ = ["PrefixAttentionLayout", "PrefixAttentionTuning", "PrefixAttentionArgs",
           "PrefixAttentionBackwardArgs",
           "PrefixLayout", "prefix_layout", "pack_grpo", "unpack_responses", "prefix_attention",
           "prefix_attention_backward", "PrefixAttentionResult"]


PrefixAttentionLayout = T.c_struct("rlk_prefix_attention_layout")
PrefixAttentionTuning = T.c_struct("rlk_prefix_attention_tuning")
PrefixAttentionArgs = T.c_struct("rlk_prefix_attention_args")
PrefixAttentionBackwardArgs = T.c_struct("rlk_prefix_attention_backward_args")


FORWARD_OP = Op("prefix_attention", PrefixAttentionArgs,
                shared=("layout.seq_offsets", "layout.group_offsets"))
BACKWARD_OP = Op("prefix_attention_backward", PrefixAttentionBackwardArgs, workspace=True,
                 shared=("layout.seq_offsets", "layout.group_offsets"))
# (the layout's device tensors bind as "layout.seq_offsets" / "layout.group_offsets": Op
# flattens embedded structs)

PrefixAttentionResult = collections.namedtuple("PrefixAttentionResult", "out lse")

_QKV = (T.DType.BF16, T.DType.F16)


class PrefixLayout:
    """The packed layout of a batch (see include/rlk.h): segment offsets (prefix, then responses,
    per prompt, in token order) and each prompt's first segment. Host copies are kept for the
    library's checks; device copies are made once per device and reused by every call."""

    def __init__(self, seq_offsets, group_offsets):
        self.seq = [int(x) for x in seq_offsets]
        self.grp = [int(x) for x in group_offsets]
        for name, xs in (("seq_offsets", self.seq), ("group_offsets", self.grp)):
            bad = [x for x in xs if not -(1 << 31) <= x < (1 << 31)]
            if bad:  # the library's offsets are i32: a wider value would wrap into another layout
                raise InvalidArgument("PrefixLayout: %s: %d is not an i32" % (name, bad[0]))
        self._host_seq = (ctypes.c_int32 * len(self.seq))(*self.seq)
        self._host_grp = (ctypes.c_int32 * len(self.grp))(*self.grp)
        self._device = {}
        # the offsets as host i32 tensors where torch is loaded: what torch.compile's operator
        # takes, so that a new layout is new data, not a new graph (made here, outside any trace)
        torch = sys.modules.get("torch")
        self.host_tensors = None
        if torch is not None:
            self.host_tensors = (torch.tensor(self.seq, dtype=torch.int32),
                                 torch.tensor(self.grp, dtype=torch.int32))

    @property
    def tokens(self):
        return self.seq[-1]

    @property
    def num_prompts(self):
        return len(self.grp) - 1

    def prefix_range(self, p):
        g = self.grp[p]
        return self.seq[g], self.seq[g + 1]

    def response_ranges(self, p):
        return [(self.seq[s], self.seq[s + 1]) for s in range(self.grp[p] + 1, self.grp[p + 1])]

    def device_tensors(self, like):
        """(seq_offsets, group_offsets) as i32 tensors where `like` lives (None on the host)."""
        if not is_torch(like) or not like.is_cuda:
            return None, None
        key = like.device
        t = self._device.get(key)
        if t is None:
            import torch
            # from pinned host memory, asynchronously: a copy from pageable memory would wait
            # for the host (torch's pinned allocator keeps the source alive until it is read)
            t = tuple(torch.tensor(x, dtype=torch.int32).pin_memory().to(key, non_blocking=True)
                      for x in (self.seq, self.grp))
            self._device[key] = t
        return t

    def bind(self, b, like):
        a = b.args.layout
        seq, grp = self.device_tensors(like)
        if seq is not None:
            b.set("layout.seq_offsets", seq, (T.DType.I32,))
            b.set("layout.group_offsets", grp, (T.DType.I32,))
        a.host_seq_offsets = ctypes.cast(self._host_seq, ctypes.POINTER(ctypes.c_int32))
        a.host_group_offsets = ctypes.cast(self._host_grp, ctypes.POINTER(ctypes.c_int32))
        a.num_segments = len(self.seq) - 1
        a.num_prompts = len(self.grp) - 1
        b.keep.append(self)

    def __repr__(self):
        return "PrefixLayout(tokens=%d, prompts=%d, segments=%d)" % (
            self.tokens, self.num_prompts, len(self.seq) - 1)


def prefix_layout(prefix_lens, response_lens):
    """The layout of prompts with prefix_lens[p] tokens and responses of response_lens[p] (a list
    of lengths per prompt), packed in order."""
    if len(prefix_lens) != len(response_lens):
        raise ValueError("prefix_layout: %d prefix lengths, %d response lists" % (
            len(prefix_lens), len(response_lens)))
    seq, grp, t = [0], [], 0
    for lp, rs in zip(prefix_lens, response_lens):
        grp.append(len(seq) - 1)
        t += int(lp)
        seq.append(t)
        for lr in rs:
            t += int(lr)
            seq.append(t)
    grp.append(len(seq) - 1)
    return PrefixLayout(seq, grp)


def pack_grpo(prompts, responses):
    """Packs a GRPO batch: prompts[p] a tensor [Lp, ...] and responses[p] a list of tensors
    [Lr, ...] (the same trailing shape). Returns (packed [T, ...], PrefixLayout)."""
    import torch
    parts = []
    for pr, rs in zip(prompts, responses):
        parts.append(pr)
        parts.extend(rs)
    layout = prefix_layout([pr.shape[0] for pr in prompts], [[r.shape[0] for r in rs] for rs in responses])
    return torch.cat(parts, 0), layout


def unpack_responses(x, layout, with_prefix=False):
    """Per prompt, the list of its responses' rows of a packed [T, ...] tensor (views); with
    with_prefix=True each entry is [prefix; response] (a copy), as the replicated layout has it."""
    out = []
    for p in range(layout.num_prompts):
        a, b = layout.prefix_range(p)
        rows = []
        for s, e in layout.response_ranges(p):
            r = x[s:e]
            if with_prefix:
                import torch
                r = torch.cat([x[a:b], r], 0)
            rows.append(r)
        out.append(rows)
    return out


def _bind_inputs(b, q, k, v, layout, scale):
    """q, k, v, the layout and the scale (None: 1/sqrt(D)), which the forward and the backward
    take alike; returns q's rlk dtype."""
    dt = b.set("q", q, _QKV)
    b.set("k", k, _QKV)
    b.set("v", v, _QKV)
    layout.bind(b, q)
    b.args.scale = 0.0 if scale is None else f32("scale", scale)
    return dt


def prefix_attention(q, k, v, layout, *, scale=None, lse=True, out=None, stream=None):
    """Forward (rlk_prefix_attention): out [T, Hq, D] in q's dtype and lse f32 [T, Hq] (natural
    log; what the backward needs). scale defaults to 1/sqrt(D). When torch autograd would track
    q, k or v, this goes through rlk.autograd.prefix_attention instead and returns (out, None).
    Returns PrefixAttentionResult(out, lse or None)."""
    if compiling():
        return traced("prefix_attention", dict(
            q=q, k=k, v=v, layout=layout, scale=scale, lse=lse, out=out, stream=stream))
    if is_torch(q) and any(getattr(x, "requires_grad", False) for x in (q, k, v)):
        import torch
        if torch.is_grad_enabled():
            if out is not None:  # the autograd call allocates its output
                raise InvalidArgument("prefix_attention: out= with q, k or v requiring grad (autograd "
                                      "makes the output); pass out=None, or call under torch.no_grad()")
            from ..autograd import prefix_attention as diff
            return PrefixAttentionResult(diff(q, k, v, layout, scale=scale), None)
    b = Binder(FORWARD_OP)
    dt = _bind_inputs(b, q, k, v, layout, scale)
    if out is None:
        out = b.empty(tuple(q.shape), dt)
    b.set("out", out, _QKV, output=True)
    lse_out = b.empty((q.shape[0], q.shape[1]), T.DType.F32) if lse else None
    b.set("lse", lse_out, (T.DType.F32,), optional=True, output=True)
    b.run(stream)
    return PrefixAttentionResult(out, lse_out)


def prefix_attention_backward(q, k, v, layout, out, lse, grad_out, *, scale=None, stream=None):
    """Backward (rlk_prefix_attention_backward): (dq, dk, dv) with q's, k's and v's shapes; a
    prefix key's dk, dv sum its prefix queries and every response of the group, in a fixed order."""
    if compiling():
        return traced("prefix_attention_backward", dict(
            q=q, k=k, v=v, layout=layout, out=out, lse=lse, grad_out=grad_out, scale=scale,
            stream=stream))
    b = Binder(BACKWARD_OP)
    dt = _bind_inputs(b, q, k, v, layout, scale)
    b.set("out", out, _QKV)
    b.set("lse", lse, (T.DType.F32,))
    b.set("grad_out", grad_out, _QKV)
    dq = b.empty(tuple(q.shape), dt)
    dk = b.empty(tuple(k.shape), dt)
    dv = b.empty(tuple(v.shape), dt)
    b.set("grad_q", dq, _QKV, output=True)
    b.set("grad_k", dk, _QKV, output=True)
    b.set("grad_v", dv, _QKV, output=True)
    b.bind_workspace()
    b.run(stream)
    return dq, dk, dv

"""The fused LM head + token log-probs and entropy: rlk_linear_logprob.

hidden [N, H] and weight [V, H] (bf16 or f16, the same dtype; rows contiguous, any row stride),
labels [N] (i32 or i64). Returns rlk.logprob's result for logits = hidden @ weight.T without ever
storing those logits: logp, lse and entropy f32 [N].
"""
import collections
import ctypes

from .. import _types as T
from .._tensor import (Binder, Op, contiguous_strides, dim, compiling, f32, keep_plan, plan_call, traced,
                       use_plans)
from ..errors import InvalidArgument
from . import losses as _losses
from .logprob import LogprobResult

__all__ = ["STATUS_BAD_ROW", "LinearLogprobVariant", "LinearLogprobArgs", "LinearLogprobBackwardArgs", "linear_logprob",
           "linear_logprob_backward", "linear_logprob_partials", "LinearPolicyLossArgs",
           "LinearPolicyLossResult", "linear_policy_loss"]

STATUS_BAD_ROW = 4  # RLK_LOGPROB_STATUS_BAD_ROW: a selected row outside hidden or not after the one before


LinearLogprobVariant = T.c_enum("LinearLogprobVariant", "rlk_linear_logprob_variant",
                                "RLK_LINEAR_LOGPROB_")


LinearLogprobArgs = T.c_struct("rlk_linear_logprob_args")
LinearLogprobBackwardArgs = T.c_struct("rlk_linear_logprob_backward_args")


OP = Op("linear_logprob", LinearLogprobArgs, workspace=True, shared=("weight",),
        selection=("rows", ("hidden",)))
BACKWARD_OP = Op("linear_logprob_backward", LinearLogprobBackwardArgs, workspace=True,
                 shared=("weight", "grad_weight"), selection=("rows", ("hidden", "grad_hidden")))

_HIDDEN = (T.DType.BF16, T.DType.F16)
_LABELS = (T.DType.I32, T.DType.I64)
_F32 = (T.DType.F32,)


def _head(b, a, prefix, hidden, weight, labels, temperature, ignore_index, variant, splits, stages=None,
          rows=None):
    """The head's inputs and settings into a (the rlk_linear_logprob_args at args field `prefix`,
    "" for the call's own, or the backward's args: variant, splits and stages None); rows: the
    row selection (None: every row of hidden). Returns hidden's rlk dtype."""
    dt = b.set(prefix + "hidden", hidden, _HIDDEN)
    b.set(prefix + "rows", rows, _LABELS, optional=True)
    b.set(prefix + "weight", weight, _HIDDEN)
    b.set(prefix + "labels", labels, _LABELS)
    if temperature is not None:
        a.temperature = f32("temperature", temperature)
    if ignore_index is not None:
        T.set_int(a, "ignore_index", ignore_index)
    if variant is not None:
        a.variant = T.enum_value(LinearLogprobVariant, variant, "%s: variant" % b.name)
    if splits is not None:
        T.set_int(a, "splits", splits)
    if stages is not None:
        T.set_int(a, "stages", stages)
    return dt


def linear_logprob(hidden, weight, labels, *, entropy=False, temperature=None, ignore_index=None,
                   lse=True, status=None, variant=None, splits=None, stages=None, threshold=None,
                   rows=None, stream=None):
    """logp[i] = z[i, y_i] - lse[i] with z = hidden @ weight.T / temperature, accumulated in f32 on
    a GPU (fp64 on the host), never materialized (rlk_linear_logprob).

    temperature (default 1), ignore_index (default -100: logp 0). entropy=True also computes the
    entropy in the same pass. status: an optional zeroed i32 [1] that gets STATUS_BAD_LABEL for a
    label outside [0, V). variant: "auto", "wgmma" (sm_90a) or "tiled"; splits: vocabulary splits
    (0: chosen); stages: the sm_90a kernel's operand stages, 2 to 4 (0: 4; with splits 0 too, the
    tuning database's winner). threshold: kept-set replay, f32 [N] (rlk.linear_sample's or
    rlk.sample's): each row's softmax over the raw logits at or above it and the label.
    rows: a row selection, i32 or i64 [n] strictly increasing indices into hidden's rows (a mask's
    nonzero positions): only those rows go through the head, labels (and threshold) are [n] and
    so are the outputs, each the bits of the call on hidden[rows]; a bad index makes its row's
    logp NaN and sets STATUS_BAD_ROW in status.
    Returns LogprobResult(logp, lse or None, entropy or None)."""
    if compiling():
        return traced("linear_logprob", dict(
            hidden=hidden, weight=weight, labels=labels, entropy=entropy, temperature=temperature,
            ignore_index=ignore_index, lse=lse, status=status, variant=variant, splits=splits,
            stages=stages, threshold=threshold, rows=rows, stream=stream))
    # a repeated call: through its plan (rlk/_entry.py) when one was kept and the tensors fit it
    fast = status is None and use_plans(stream, hidden)
    if fast:
        key = (bool(entropy), temperature, ignore_index, bool(lse), variant, splits, stages,
               threshold is None, rows is None, hidden.shape)
        out = plan_call("linear_logprob", key, (hidden, weight, labels, threshold, rows), ())
        if out is not None:
            return LogprobResult(out[0], out[1] if lse else None, out[-1] if entropy else None)
    b = Binder(OP)
    a = b.args
    _head(b, a, "", hidden, weight, labels, temperature, ignore_index, variant, splits, stages, rows)
    b.set("threshold", threshold, _F32, optional=True)
    b.set("status", status, (T.DType.I32,), optional=True, output=True)
    n = dim(hidden if rows is None else rows, 0)
    logp = b.empty((n,), T.DType.F32)
    b.set("logp", logp, _F32, output=True)
    lse_out = b.empty((n,), T.DType.F32) if lse else None
    ent_out = b.empty((n,), T.DType.F32) if entropy else None
    b.set("lse", lse_out, _F32, optional=True, output=True)
    b.set("entropy", ent_out, _F32, optional=True, output=True)
    b.bind_workspace()
    ctx = b.run(stream)
    if fast:
        keep_plan("linear_logprob", key, b, ctx, (
            ("hidden", hidden), ("weight", weight), ("labels", labels), ("threshold", threshold),
            ("rows", rows)), (), T.DType.F32,
            [(-1, (n,), (1,), (f,)) for f in ("logp",) + ("lse",) * bool(lse) + ("entropy",) * bool(entropy)],
            ws=(a.workspace_bytes, 0, "workspace"))
    return LogprobResult(logp, lse_out, ent_out)


def linear_logprob_partials(hidden, weight, labels, vocab_start, *, entropy=False, temperature=None,
                            ignore_index=None, partials=None, variant=None, splits=None, rows=None,
                            stream=None):
    """This shard's records (rlk_linear_logprob's shard form): weight [V_shard, H] holds the rows
    [vocab_start, vocab_start + V_shard) of a tensor-parallel LM head, labels [N] index the whole
    vocabulary. entropy=True fills the records' entropy part. partials: an optional f32 [N, 4]
    output (contiguous, 16-byte aligned), e.g. this rank's slice of an all-gather buffer. The
    records merge with rlk.logprob_combine (in rank order) into logp, lse and entropy; the
    backward is linear_logprob_backward(..., vocab_start=..., shard=True) with the combined lse.
    rows: a row selection as in linear_logprob (labels and the records [n]).
    Returns the f32 [N, 4] records."""
    if compiling():
        return traced("linear_logprob_partials", dict(
            hidden=hidden, weight=weight, labels=labels, vocab_start=vocab_start, entropy=entropy,
            temperature=temperature, ignore_index=ignore_index, partials=partials, variant=variant,
            splits=splits, rows=rows, stream=stream))
    b = Binder(OP)
    a = b.args
    _head(b, a, "", hidden, weight, labels, temperature, ignore_index, variant, splits, rows=rows)
    T.set_int(a, "vocab_start", vocab_start)
    a.partial_entropy = 1 if entropy else 0
    if partials is None:
        partials = b.empty((dim(hidden if rows is None else rows, 0), 4), T.DType.F32)
    b.set("partials", partials, _F32, output=True)
    b.bind_workspace()
    b.run(stream)
    return partials


def linear_logprob_backward(hidden, weight, labels, lse, grad_logp=None, grad_entropy=None,
                            entropy=None, *, temperature=None, ignore_index=None, grad_hidden=None,
                            grad_weight=None, want_hidden=True, want_weight=True, accumulate=False,
                            grad_dtype="f32", status=None, chunk=None, group=None, shard=False,
                            vocab_start=0, threshold=None, rows=None, stream=None):
    """grad_hidden = dz @ weight and grad_weight = dz.T @ hidden with
    dz = (g_lp (onehot(y) - p) - g_H p (z - E)) / temperature, the logits recomputed chunk by chunk
    (rlk_linear_logprob_backward). lse (and entropy, with grad_entropy) from the forward.
    grad_hidden / grad_weight: given tensors (written, or added to with accumulate=True), else new
    ones of grad_dtype ("f32" or "same"). shard=True: weight is the rows [vocab_start, ...) of a
    tensor-parallel head and lse / entropy the combined ones; the gradients are this shard's.
    chunk (vocabulary columns at a time) and group (the sm_90a tile order's rows of tiles, 1 to
    64): 0 or None choose (with both unset, the tuning database's winner). threshold: the
    kept-set forward's (p over each row's kept set). rows: the forward's row selection (labels,
    lse and the upstream gradients [n]); grad_hidden keeps hidden's shape, the rows not selected
    0 (or left as they are with accumulate=True).
    Returns (grad_hidden or None, grad_weight or None)."""
    if compiling():
        return traced("linear_logprob_backward", dict(
            hidden=hidden, weight=weight, labels=labels, lse=lse, grad_logp=grad_logp,
            grad_entropy=grad_entropy, entropy=entropy, temperature=temperature,
            ignore_index=ignore_index, grad_hidden=grad_hidden, grad_weight=grad_weight,
            want_hidden=want_hidden, want_weight=want_weight, accumulate=accumulate,
            grad_dtype=grad_dtype, status=status, chunk=chunk, group=group, shard=shard,
            vocab_start=vocab_start, threshold=threshold, rows=rows, stream=stream))
    # a repeated call: through its plan (rlk/_entry.py) when one was kept and the tensors fit it
    fast = (grad_hidden is None and grad_weight is None and not accumulate and status is None
            and use_plans(stream, hidden))
    if fast:
        key = (temperature, ignore_index, bool(want_hidden), bool(want_weight), grad_dtype, chunk, group,
               bool(shard), vocab_start, grad_logp is None, grad_entropy is None, entropy is None,
               threshold is None, rows is None, hidden.shape)
        ins = (hidden, weight, labels, lse, grad_logp, grad_entropy, entropy, threshold, rows)
        out = plan_call("linear_logprob_backward", key, ins, ())
        if out is not None:
            it = iter(out)
            return (next(it) if want_hidden else None), (next(it) if want_weight else None)
    b = Binder(BACKWARD_OP)
    a = b.args
    dt = _head(b, a, "", hidden, weight, labels, temperature, ignore_index, None, None, rows=rows)
    b.set("lse", lse, _F32)
    b.set("grad_logp", grad_logp, _F32, optional=True)
    b.set("grad_entropy", grad_entropy, _F32, optional=True)
    b.set("entropy", entropy, _F32, optional=True)
    b.set("threshold", threshold, _F32, optional=True)
    if grad_dtype not in ("f32", "same"):
        raise InvalidArgument("rlk.linear_logprob_backward: grad_dtype %r is not 'f32' or 'same'"
                              % (grad_dtype,))
    gdt = dt if grad_dtype == "same" else T.DType.F32
    new = b.zeros if accumulate else b.empty  # a gradient added to one made here starts at 0
    if grad_hidden is None and want_hidden:
        grad_hidden = new((dim(hidden, 0), dim(hidden, 1)), gdt)
    if grad_weight is None and want_weight:
        grad_weight = new((dim(weight, 0), dim(weight, 1)), gdt)
    b.set("grad_hidden", grad_hidden, optional=True, output=True)
    b.set("grad_weight", grad_weight, optional=True, output=True)
    a.accumulate = 1 if accumulate else 0
    b.set("status", status, (T.DType.I32,), optional=True, output=True)
    if chunk is not None:
        T.set_int(a, "chunk", chunk)
    if group is not None:
        T.set_int(a, "group", group)
    a.shard = 1 if shard else 0
    T.set_int(a, "vocab_start", vocab_start)
    b.bind_workspace()
    ctx = b.run(stream)
    if fast:
        outs = [(-1, tuple(g.shape), contiguous_strides(tuple(g.shape)), (f,))
                for g, f in ((grad_hidden, "grad_hidden"), (grad_weight, "grad_weight")) if g is not None]
        keep_plan("linear_logprob_backward", key, b, ctx, tuple(zip(
            ("hidden", "weight", "labels", "lse", "grad_logp", "grad_entropy", "entropy", "threshold",
             "rows"), ins)), (), gdt, outs, ws=(a.workspace_bytes, 0, "workspace"))
    return grad_hidden, grad_weight


LinearPolicyLossArgs = T.c_struct("rlk_linear_policy_loss_args")


# rlk_linear_policy_loss_path
POLICY_PATHS = {"auto": 0, "recompute": 1, "token_chunks": 2}

POLICY_OP = Op("linear_policy_loss", LinearPolicyLossArgs, workspace=True,
               shared=("head.weight", "grad_weight", "loss.seq_offsets", "loss.metrics", "loss.loss",
                       "loss.token_normalizer_tensor", "loss.seq_normalizer_tensor"),
               selection=("head.rows", ("head.hidden", "grad_hidden")))

LinearPolicyLossResult = collections.namedtuple(
    "LinearPolicyLossResult", "loss grad_hidden grad_weight metrics logp")


def linear_policy_loss(hidden, weight, labels, old_logp, advantages, mask=None, *, temperature=None,
                       ignore_index=None, variant=None, splits=None, grad_hidden=None,
                       grad_weight=None, want_hidden=True, want_weight=True, accumulate=False,
                       grad_dtype="f32", chunk=None, group=None, logp=False, status=None, metrics=True,
                       seq_offsets=None, ref_logp=None, rollout_is_weights=None,
                       seq_advantages=None, mode=None, clip_low=None, clip_high=None,
                       dual_clip=None, log_ratio_min=None, log_ratio_max=None, sapo_tau_pos=None,
                       sapo_tau_neg=None, seq_ratio_grad=None, clamp_bound_grad=None,
                       kl_estimator=None, kl_coef=None, kl_input_clamp=None, kl_output_clamp=None,
                       kl_straight_through=None, entropy_coef=None, agg=None, token_normalizer=None,
                       seq_normalizer=None, norm_scale=None, loss_scale=None, path=None,
                       chunk_tokens=None, threshold=None, stream=None):
    """The policy loss of the log-probs of logits = hidden @ weight.T / temperature and its
    gradients with respect to hidden and weight, in one call (rlk_linear_policy_loss): the head's
    forward, rlk.policy_loss on its log-probs (and entropy, with entropy_coef), the head's backward.
    path: "recompute" (the backward recomputes the logits a vocabulary chunk at a time),
    "token_chunks" (sm_90a: each chunk of chunk_tokens rows stores its logits once, three products
    instead of four; see rlk.h for what it takes) or "auto" (None). hidden [N, H], weight [V, H] (bf16 or f16), labels [N]; the loss
    tensors (old_logp, advantages, mask, ref_logp, ...) are f32 with N tokens, [B, T] (row-major
    over hidden's rows) or [N] packed; every loss keyword is rlk.policy_loss's. grad_hidden /
    grad_weight: given tensors (written, or added to with accumulate=True), else new ones of
    grad_dtype ("f32" or "same") unless want_hidden / want_weight is False. A given grad_weight is
    scratch while the call runs: on sm_90a the token chunks store the logits in its memory before
    writing the gradient over them, so no other stream may read it (weight.grad) until the call is
    done, and it may share memory with no other argument (refused). logp=True also returns
    the head's f32 [N] log-probs. threshold: kept-set replay (rlk.linear_logprob's), by either
    path. Returns LinearPolicyLossResult(loss [1], grad_hidden or None,
    grad_weight or None, metrics or None, logp or None); nothing is read back."""
    if compiling():
        return traced("linear_policy_loss", dict(
            hidden=hidden, weight=weight, labels=labels, old_logp=old_logp, advantages=advantages,
            mask=mask, temperature=temperature, ignore_index=ignore_index, variant=variant,
            splits=splits, grad_hidden=grad_hidden, grad_weight=grad_weight,
            want_hidden=want_hidden, want_weight=want_weight, accumulate=accumulate,
            grad_dtype=grad_dtype, chunk=chunk, group=group, logp=logp, status=status,
            metrics=metrics, seq_offsets=seq_offsets, ref_logp=ref_logp,
            rollout_is_weights=rollout_is_weights, seq_advantages=seq_advantages, mode=mode,
            clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
            log_ratio_min=log_ratio_min, log_ratio_max=log_ratio_max, sapo_tau_pos=sapo_tau_pos,
            sapo_tau_neg=sapo_tau_neg, seq_ratio_grad=seq_ratio_grad,
            clamp_bound_grad=clamp_bound_grad, kl_estimator=kl_estimator, kl_coef=kl_coef,
            kl_input_clamp=kl_input_clamp, kl_output_clamp=kl_output_clamp,
            kl_straight_through=kl_straight_through, entropy_coef=entropy_coef, agg=agg,
            token_normalizer=token_normalizer, seq_normalizer=seq_normalizer,
            norm_scale=norm_scale, loss_scale=loss_scale, path=path, chunk_tokens=chunk_tokens,
            threshold=threshold, stream=stream))
    b = Binder(POLICY_OP)
    a = b.args
    loss = a.loss
    dt = _head(b, a.head, "head.", hidden, weight, labels, temperature, ignore_index, variant, splits)
    b.set("head.status", status, (T.DType.I32,), optional=True, output=True)
    b.set("head.threshold", threshold, _F32, optional=True)
    n, h = dim(hidden, 0), dim(hidden, 1)
    logp_out = b.empty((n,), T.DType.F32) if logp else None
    b.set("head.logp", logp_out, _F32, optional=True, output=True)
    _losses.policy_settings(b, loss, "loss.", old_logp.ndim, dim(old_logp, 0), old_logp, advantages,
                            mask, seq_offsets, ref_logp, rollout_is_weights, seq_advantages, mode,
                            clip_low, clip_high, dual_clip, log_ratio_min, log_ratio_max,
                            sapo_tau_pos, sapo_tau_neg, seq_ratio_grad, clamp_bound_grad,
                            kl_estimator, kl_coef, kl_input_clamp, kl_output_clamp,
                            kl_straight_through, entropy_coef, agg, token_normalizer,
                            seq_normalizer, norm_scale, loss_scale)
    out = b.empty((1 + (len(_losses.POLICY_LOSS_METRICS) if metrics else 0),), T.DType.F32)
    b.set_at("loss.loss", out.data_ptr() if b.place.framework == "torch" else out.ctypes.data,
             T.DType.F32, (1,))
    out_metrics = None
    if metrics:
        out_metrics = out[1:]
        b.set("loss.metrics", out_metrics, _F32, output=True)
    if grad_dtype not in ("f32", "same"):
        raise InvalidArgument("rlk.linear_policy_loss: grad_dtype %r is not 'f32' or 'same'" % (grad_dtype,))
    gdt = T.DType.F32 if grad_dtype == "f32" else dt
    new = b.zeros if accumulate else b.empty  # a gradient added to one made here starts at 0
    if grad_hidden is None and want_hidden:
        grad_hidden = new((n, h), gdt)
    if grad_weight is None and want_weight:
        grad_weight = new((dim(weight, 0), h), gdt)
    b.set("grad_hidden", grad_hidden, optional=True, output=True)
    b.set("grad_weight", grad_weight, optional=True, output=True)
    a.accumulate = 1 if accumulate else 0
    if chunk is not None:
        T.set_int(a, "chunk", chunk)
    if group is not None:
        T.set_int(a, "group", group)
    if path is not None:
        if path not in POLICY_PATHS:
            raise ValueError(f"path: {path!r} is not one of {sorted(POLICY_PATHS)}")
        a.path = POLICY_PATHS[path]
    if chunk_tokens is not None:
        T.set_int(a, "chunk_tokens", chunk_tokens)
    b.bind_workspace()
    b.run(stream)
    return LinearPolicyLossResult(out[0:1], grad_hidden, grad_weight, out_metrics, logp_out)

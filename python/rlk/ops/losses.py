"""Policy loss and value loss (PPO / GRPO family): rlk_policy_loss, rlk_value_loss.

Both are fused forward + backward: one call returns the scalar loss, the gradient with respect
to the differentiable input and metrics. These functions mirror the C calls; rlk.autograd wraps
them in torch.autograd.Functions whose backward scales the fused gradient.

Layouts: per-token tensors are [B, T] (padded, an optional mask says which tokens count) or [N]
(packed, with seq_offsets [S + 1]). Normalizers: token_normalizer and seq_normalizer are each a
number, or a device scalar (an f32 / f64 tensor of one element on the inputs' device: a global
count all-reduced across data-parallel ranks stays there), or None: token-mean then divides by
this call's mask count and seq-mean by its sequence count, both counted by the library (on the
device: nothing is read back). No call synchronizes its stream; the outputs, metrics included,
stay on the device until the caller reads them (metrics_dict does).
"""
import collections
import ctypes

from .. import _types as T
from .._tensor import (_KIND, Binder, Op, _kind, contiguous_strides, dim, compiling, keep_plan,
                       plan_call, traced, use_plans)

__all__ = ["LossAgg", "PolicyLossMode", "SeqRatioGrad", "KLEstimator", "PolicyLossArgs", "ValueLossArgs",
           "PolicyLossResult", "ValueLossResult", "POLICY_LOSS_METRICS", "VALUE_LOSS_METRICS",
           "policy_loss", "value_loss", "metrics_dict"]


LossAgg = T.c_enum("LossAgg", "rlk_loss_agg", "RLK_AGG_")
PolicyLossMode = T.c_enum("PolicyLossMode", "rlk_policy_loss_mode", "RLK_POLICY_")
SeqRatioGrad = T.c_enum("SeqRatioGrad", "rlk_seq_ratio_grad", "RLK_SEQ_RATIO_")
KLEstimator = T.c_enum("KLEstimator", "rlk_kl_estimator", "RLK_KL_")


# The metric slots, in the order of RLK_PL_METRIC_* / RLK_VL_METRIC_*.
POLICY_LOSS_METRICS = ("clipfrac", "clipfrac_lower", "clip_low", "clip_high", "approx_kl",
                       "kl_mean", "entropy_mean", "ratio_max", "ratio_min", "pg_loss", "kl_loss",
                       "entropy_loss", "mask_sum", "approx_kl_raw", "seq_clip_low",
                       "seq_clip_high")
VALUE_LOSS_METRICS = ("clipfrac", "value_mean", "error_mean", "mask_sum")


PolicyLossArgs = T.c_struct("rlk_policy_loss_args")
ValueLossArgs = T.c_struct("rlk_value_loss_args")


_PL_NMETRICS = len(POLICY_LOSS_METRICS)
_VL_NMETRICS = len(VALUE_LOSS_METRICS)

# what is not indexed by the batch's rows: the loss, its metrics, the normalizers, the offsets
_LOSS_SHARED = ("loss", "metrics", "token_normalizer_tensor", "seq_normalizer_tensor", "seq_offsets")
POLICY_OP = Op("policy_loss", PolicyLossArgs, workspace=True, shared=_LOSS_SHARED)
VALUE_OP = Op("value_loss", ValueLossArgs, workspace=True, shared=_LOSS_SHARED)

PolicyLossResult = collections.namedtuple("PolicyLossResult",
                                          "loss grad_logp grad_entropy metrics")
ValueLossResult = collections.namedtuple("ValueLossResult", "loss grad_values metrics")

_F = (T.DType.F32, T.DType.F64)
_I = (T.DType.I32, T.DType.I64)


def metrics_dict(metrics, names=POLICY_LOSS_METRICS):
    """A metrics output as {name: float} (reads it back: synchronizes a CUDA stream)."""
    vals = metrics.tolist()
    return {n: float(v) for n, v in zip(names, vals)}


def _normalizer(b, a, prefix, name, v):
    """A normalizer: a number into the field `name` of a (the struct at args field `prefix`), an
    array into `name`_tensor."""
    cls = v.__class__
    if cls is float or cls is int:
        setattr(a, name, float(v))
    elif (_KIND.get(cls) or _kind(v)) is not None:
        b.set(prefix + name + "_tensor", v, _F)
    else:
        setattr(a, name, float(v))


def _set_agg(b, agg, token_normalizer, seq_normalizer, norm_scale, loss_scale, a=None, prefix=""):
    a = b.args if a is None else a
    if agg is not None:
        a.agg = T.enum_value(LossAgg, agg, "%s: agg" % b.name)
    if token_normalizer is not None:
        _normalizer(b, a, prefix, "token_normalizer", token_normalizer)
    if seq_normalizer is not None:
        _normalizer(b, a, prefix, "seq_normalizer", seq_normalizer)
    if norm_scale is not None:
        a.norm_scale = float(norm_scale)
    if loss_scale is not None:
        a.loss_scale = float(loss_scale)


_ESIZE = {T.DType.F32: 4, T.DType.F64: 8}
_SCALAR, _ONE = (), (1,)


class _Layout:
    """Where a loss call's outputs lie in its one allocation, and the workspace bytes the library
    asked for: worked out once per key (see _outputs)."""

    __slots__ = ("ws", "total", "n", "grad_offsets", "head", "ws_offset", "strides", "es",
                 "apart")

    def __init__(self, op, dt, grads, shape, nmetrics, ws):
        es = _ESIZE[dt]
        n = 1
        for d in shape:
            n *= d
        k = 16 // es
        stride = (n + k - 1) // k * k  # elements from one gradient to the next: 16-byte aligned
        self.es = es
        self.n = n
        self.ws = ws
        ngrads = len(grads)
        self.grad_offsets = tuple(i * stride for i in range(ngrads))
        # the outputs each its own array (_outputs_apart): the Binder.outputs specs with the
        # loss as [1] and as 0-d
        fields = [(name, shape) for name in grads]
        metrics = [("metrics", (nmetrics,))] if nmetrics else []
        self.apart = (op.outputs(*fields, ("loss", _ONE), *metrics),
                      op.outputs(*fields, ("loss", _SCALAR, _ONE), *metrics))
        self.strides = contiguous_strides(shape)
        self.head = ngrads * stride  # the loss's element, the metrics after it
        total = self.head + 1 + nmetrics
        self.ws_offset = 0
        if ws:
            self.ws_offset = (total * es + 15) & ~15  # bytes
            total = (self.ws_offset + ws + es - 1) // es
        self.total = total


def _layout(b, dt, grads, shape, nmetrics, key):
    """The _Layout of key: everything the workspace size depends on (place, shapes, mode,
    aggregation, how the normalizer is given) and the outputs' (dtype, gradients, metrics);
    the library is asked for the size the first time a key is seen."""
    # the size query reads no data pointer: the outputs are bound once allocated
    for name in grads:
        b.set_at(name, 16, dt, shape)
    b.set_at("loss", 16, dt, (1,))
    lay = _Layout(b.op, dt, grads, shape, nmetrics, b.workspace_size())
    sizes = b.op.sizes
    if len(sizes) >= 4096:  # a bound on what a run of ever-new shapes can keep
        sizes.clear()
    sizes[key] = lay
    return lay


def _outputs(b, dt, grads, shape, nmetrics, key, scalar_loss, apart=False):
    """Every output of a loss call in one allocation (one allocator call instead of two or
    three: on CUDA each costs about 5 us): the gradients `grads` (args field names, each of
    `shape`) first, then the loss [1] (or 0-d with scalar_loss), the metrics (nmetrics > 0) and
    the workspace, each 16-byte aligned. The workspace size is asked of the library once per
    key (see _layout). apart=True: each output its own array and the workspace another (what a
    torch operator returns: outputs that share no memory). Returns (the gradients' arrays,
    loss, metrics)."""
    lay = b.op.sizes.get(key) or _layout(b, dt, grads, shape, nmetrics, key)
    if apart or b.place.host:
        # host memory: an allocation costs less than a view there (about 1 us against 1.5)
        return _outputs_apart(b, dt, len(grads), nmetrics, lay, scalar_loss)
    buf = b.empty((lay.total,), dt)
    # Not an output itself: its padding is never written and its workspace is the library's
    # (RLK_CHECK would read both for NaN); the views below are what the call made.
    del b.made[-1]
    b.keep.append(buf)  # told to the allocator with the other scratch when stream= is given
    torch_out = b.place.torch
    ptr = buf.data_ptr() if torch_out else buf.ctypes.data
    es, head, a = lay.es, lay.head, b.args
    if lay.ws:
        a.workspace = ptr + lay.ws_offset
        a.workspace_bytes = lay.ws
    outs = []
    for name, off in zip(grads, lay.grad_offsets):
        b.set_at(name, ptr + off * es, dt, shape)
        if torch_out:
            outs.append(buf.as_strided(shape, lay.strides, off))
        else:
            outs.append(buf[off:off + lay.n].reshape(shape))
    b.set_at("loss", ptr + head * es, dt, (1,))
    if scalar_loss:  # torch: a 0-d view; numpy: buf[head] would be a copy
        loss = buf[head] if torch_out else buf[head:head + 1].reshape(())
    else:
        loss = buf[head:head + 1]
    metrics = None
    if nmetrics:
        metrics = buf[head + 1:head + 1 + nmetrics]
        b.set_at("metrics", ptr + (head + 1) * es, dt, (nmetrics,))
    b.made.extend(outs)
    b.made.append(loss)
    if metrics is not None:
        b.made.append(metrics)
    return outs, loss, metrics


def _outputs_apart(b, dt, ngrads, nmetrics, lay, scalar_loss):
    ws = lay.ws
    if ws:
        a = b.args
        _, a.workspace = b.workspace(ws)
        a.workspace_bytes = ws
    arrays = b.outputs(dt, lay.apart[1 if scalar_loss else 0])
    return arrays[:ngrads], arrays[ngrads], arrays[ngrads + 1] if nmetrics else None


def _norm_kind(v):
    """How a normalizer is given, for a plan's key: 0 a number other than 0 (written into each
    call's struct), 1 an array, 2 none, 3 zero (its own key: what 0 means is the library's). Any
    other object is a number as _normalizer takes it (float(v): a numpy scalar)."""
    if v is None:
        return 2
    cls = v.__class__
    if cls is float or cls is int:
        return 0 if v else 3
    if (_KIND.get(cls) or _kind(v)) is not None:
        return 1
    return 0 if float(v) else 3


def _split(out, metrics):
    """A plan's outputs as (the gradients, the loss, the metrics or None): _keep_plan's order."""
    if metrics:
        return out[:-2], out[-2], out[-1]
    return out[:-1], out[-1], None


def _norm_scalars(tn_kind, tn, sn_kind, sn):
    """The numbers a plan writes into each call's struct (see _keep_plan's scalars)."""
    if tn_kind == 0:
        return [float(tn), float(sn)] if sn_kind == 0 else [float(tn)]
    return [float(sn)] if sn_kind == 0 else []


def _keep_loss_plan(name, key, b, ctx, inputs, scalars, dt, grads, shape, nmetrics, scalar_loss,
                    apart, lay):
    """Keeps a loss call just made as a plan (_tensor.keep_plan): its outputs as _outputs laid
    them out (the gradients, the loss, the metrics: _split's order)."""
    loss_shape = _SCALAR if scalar_loss else _ONE
    sizes = [shape] * len(grads) + [loss_shape] + ([(nmetrics,)] if nmetrics else [])
    fields = list(grads) + ["loss"] + (["metrics"] if nmetrics else [])
    if apart or b.place.host:  # _outputs_apart: each output and the workspace their own
        outs = [(-1, sz, contiguous_strides(sz), (f,)) for f, sz in zip(fields, sizes)]
        total, ws = 0, (lay.ws, 0, "workspace")
    else:
        elems = list(lay.grad_offsets) + [lay.head] + ([lay.head + 1] if nmetrics else [])
        strides = [lay.strides] * len(grads) + [contiguous_strides(loss_shape)] + \
            ([(1,)] if nmetrics else [])
        outs = [(e, sz, st, (f,)) for e, sz, st, f in zip(elems, sizes, strides, fields)]
        total, ws = lay.total, (lay.ws, lay.ws_offset, "workspace")
    keep_plan(name, key, b, ctx, inputs, scalars, dt, outs, total, ws)


def _norm_key(a, tn):
    """How the token normalizer is given, for the workspace sizes' key: 0 a number other than 0,
    1 a tensor, 2 none or the number 0 (this call's count: a count pass and its workspace)."""
    if tn is None:
        return 2
    kind = _norm_kind(tn)
    return 1 if kind == 1 else 2 if kind == 3 or a.token_normalizer == 0.0 else 0


_PL_GRADS = (("grad_logp",), ("grad_logp", "grad_entropy"))  # without / with the entropy's gradient
_VL_GRADS = ("grad_values",)
_VL_INPUTS = VALUE_OP.inputs(("values", _F, True), ("old_values", _F, True),
                             ("returns", _F, True), ("mask", None, False),
                             ("seq_offsets", _I, False))


_PL_INPUTS = {}  # Op -> the Binder.bind spec of policy_settings' inputs in its args struct


def _policy_inputs(op, prefix):
    inputs = _PL_INPUTS[op] = op.inputs(
        (prefix + "old_logp", _F, True), (prefix + "advantages", _F, True),
        (prefix + "mask", None, False), (prefix + "seq_offsets", _I, False),
        (prefix + "ref_logp", _F, False), (prefix + "rollout_is_weights", _F, False))
    return inputs


def policy_settings(b, a, prefix, ndim, rows, old_logp, advantages, mask, seq_offsets, ref_logp,
                    rollout_is_weights, seq_advantages, mode, clip_low, clip_high, dual_clip,
                    log_ratio_min, log_ratio_max, sapo_tau_pos, sapo_tau_neg, seq_ratio_grad,
                    clamp_bound_grad, kl_estimator, kl_coef, kl_input_clamp, kl_output_clamp,
                    kl_straight_through, entropy_coef, agg, token_normalizer, seq_normalizer,
                    norm_scale, loss_scale):
    """Every input and setting of rlk_policy_loss_args but logp, entropy and the outputs, into a
    (the struct at args field `prefix`, "" for the call's own) of Binder b; ndim and rows are
    logp's (its layout, [B, T] or [N])."""
    inputs = _PL_INPUTS.get(b.op) or _policy_inputs(b.op, prefix)
    b.bind(inputs, (old_logp, advantages, mask, seq_offsets, ref_logp, rollout_is_weights))
    if seq_advantages is None:
        # per sequence when the shape says so: [B] beside [B, T], or [S] beside [N] with S != N
        if ndim == 2:
            seq_advantages = advantages.ndim == 1
        else:
            seq_advantages = seq_offsets is not None and dim(advantages, 0) != rows
    a.seq_advantages = 1 if seq_advantages else 0
    if mode is not None:
        a.mode = T.enum_value(PolicyLossMode, mode, "%s: mode" % b.name)
    if seq_ratio_grad is not None:
        a.seq_ratio_grad = T.enum_value(SeqRatioGrad, seq_ratio_grad, "%s: seq_ratio_grad" % b.name)
    if kl_estimator is not None:
        a.kl_estimator = T.enum_value(KLEstimator, kl_estimator, "%s: kl_estimator" % b.name)
    # one test per setting: a loop over the twelve costs four times as much
    if clip_low is not None:
        a.clip_low = float(clip_low)
    if clip_high is not None:
        a.clip_high = float(clip_high)
    if dual_clip is not None:
        a.dual_clip = float(dual_clip)
    if log_ratio_min is not None:
        a.log_ratio_min = float(log_ratio_min)
    if log_ratio_max is not None:
        a.log_ratio_max = float(log_ratio_max)
    if sapo_tau_pos is not None:
        a.sapo_tau_pos = float(sapo_tau_pos)
    if sapo_tau_neg is not None:
        a.sapo_tau_neg = float(sapo_tau_neg)
    if clamp_bound_grad is not None:
        a.clamp_bound_grad = float(clamp_bound_grad)
    if kl_coef is not None:
        a.kl_coef = float(kl_coef)
    if kl_input_clamp is not None:
        a.kl_input_clamp = float(kl_input_clamp)
    if kl_output_clamp is not None:
        a.kl_output_clamp = float(kl_output_clamp)
    if entropy_coef is not None:
        a.entropy_coef = float(entropy_coef)
    if kl_straight_through is not None:
        a.kl_straight_through = 1 if kl_straight_through else 0
    if agg is not None or token_normalizer is not None or seq_normalizer is not None \
            or norm_scale is not None or loss_scale is not None:
        _set_agg(b, agg, token_normalizer, seq_normalizer, norm_scale, loss_scale, a, prefix)


def policy_loss(logp, old_logp, advantages, mask=None, *, seq_offsets=None, ref_logp=None,
                entropy=None, rollout_is_weights=None, seq_advantages=None, mode=None,
                clip_low=None, clip_high=None, dual_clip=None, log_ratio_min=None,
                log_ratio_max=None, sapo_tau_pos=None, sapo_tau_neg=None, seq_ratio_grad=None,
                clamp_bound_grad=None, kl_estimator=None,
                kl_coef=None, kl_input_clamp=None, kl_output_clamp=None, kl_straight_through=None,
                entropy_coef=None, agg=None, token_normalizer=None, seq_normalizer=None,
                norm_scale=None, loss_scale=None, metrics=True, stream=None, scalar_loss=False,
                apart=False):
    """The policy loss forward and backward in one pass (rlk_policy_loss).

    logp, old_logp, advantages: [B, T] (padded) or [N] (packed, with seq_offsets), f32 or f64,
    one dtype. advantages may be per sequence ([B] / [S]): seq_advantages (default: inferred
    from its shape: packed, [S] with S == N reads as per token, so with empty sequences among
    them pass seq_advantages=True). mask: bool, i32 or f32. Optional ref_logp (KL term, with kl_coef),
    entropy (with entropy_coef), rollout_is_weights. mode: "ppo" (default), "gspo", "cispo",
    "sapo", "reinforce"; seq_ratio_grad "straight_through" (default) or "through_mean" (gspo);
    kl_estimator "k1", "abs", "k2", "k3"; agg "token-mean" (default),
    "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm".
    Every other keyword is the C field of that name; None keeps rlk_policy_loss_args_init's
    value (verl's actor defaults). token_normalizer / seq_normalizer: a number, a device
    scalar tensor, or None (this call's counts; see the module's doc).
    Returns PolicyLossResult(loss [1] (0-d with scalar_loss=True), grad_logp (logp's shape),
    grad_entropy (or None), metrics [16] or None): metrics_dict() names them. Nothing is read
    back: the call never synchronizes its stream. The outputs are views of one allocation unless
    apart=True.
    """
    if compiling():
        return traced("policy_loss", dict(
            logp=logp, old_logp=old_logp, advantages=advantages, mask=mask,
            seq_offsets=seq_offsets, ref_logp=ref_logp, entropy=entropy,
            rollout_is_weights=rollout_is_weights, seq_advantages=seq_advantages, mode=mode,
            clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
            log_ratio_min=log_ratio_min, log_ratio_max=log_ratio_max, sapo_tau_pos=sapo_tau_pos,
            sapo_tau_neg=sapo_tau_neg, seq_ratio_grad=seq_ratio_grad,
            clamp_bound_grad=clamp_bound_grad, kl_estimator=kl_estimator, kl_coef=kl_coef,
            kl_input_clamp=kl_input_clamp, kl_output_clamp=kl_output_clamp,
            kl_straight_through=kl_straight_through, entropy_coef=entropy_coef, agg=agg,
            token_normalizer=token_normalizer, seq_normalizer=seq_normalizer,
            norm_scale=norm_scale, loss_scale=loss_scale, metrics=metrics, stream=stream,
            scalar_loss=scalar_loss, apart=apart))
    # a repeated call: through its plan (rlk/_entry.py) when one was kept and the tensors fit it
    tn_num, sn_num = _norm_kind(token_normalizer), _norm_kind(seq_normalizer)
    fast = use_plans(stream, logp)
    if fast:
        key = (mode, clip_low, clip_high, dual_clip, log_ratio_min, log_ratio_max, sapo_tau_pos,
               sapo_tau_neg, seq_ratio_grad, clamp_bound_grad, kl_estimator, kl_coef,
               kl_input_clamp, kl_output_clamp, kl_straight_through, entropy_coef, agg,
               tn_num, sn_num, norm_scale, loss_scale, seq_advantages, bool(metrics),
               scalar_loss, apart, logp.shape)  # (shapes that alternate: a plan each)
        out = plan_call("policy_loss", key, (
            logp, old_logp, advantages, mask, seq_offsets, ref_logp, entropy, rollout_is_weights,
            None if tn_num != 1 else token_normalizer, None if sn_num != 1 else seq_normalizer),
            _norm_scalars(tn_num, token_normalizer, sn_num, seq_normalizer))
        if out is not None:
            grads, loss, out_metrics = _split(out, metrics)
            return PolicyLossResult(loss, grads[0], grads[1] if len(grads) > 1 else None, out_metrics)
    b = Binder(POLICY_OP)
    a = b.args
    dt = b.set("logp", logp, _F)
    if entropy is not None:
        b.set("entropy", entropy, _F)
    policy_settings(b, a, "", logp.ndim, dim(logp, 0), old_logp, advantages, mask, seq_offsets,
                    ref_logp, rollout_is_weights, seq_advantages, mode, clip_low, clip_high,
                    dual_clip, log_ratio_min, log_ratio_max, sapo_tau_pos, sapo_tau_neg,
                    seq_ratio_grad, clamp_bound_grad, kl_estimator, kl_coef, kl_input_clamp,
                    kl_output_clamp, kl_straight_through, entropy_coef, agg, token_normalizer,
                    seq_normalizer, norm_scale, loss_scale)
    shape = logp.shape
    grads = _PL_GRADS[entropy is not None and a.entropy_coef != 0]
    nmetrics = _PL_NMETRICS if metrics else 0
    sizes_key = (b.place, shape, None if seq_offsets is None else seq_offsets.shape, mask is None,
                 a.mode, a.agg, _norm_key(a, token_normalizer), dt, grads, nmetrics)
    outs, loss, out_metrics = _outputs(b, dt, grads, shape, nmetrics, sizes_key, scalar_loss, apart)
    ctx = b.run(stream)
    if fast:
        _keep_loss_plan("policy_loss", key, b, ctx, (
            ("logp", logp), ("old_logp", old_logp), ("advantages", advantages), ("mask", mask),
            ("seq_offsets", seq_offsets), ("ref_logp", ref_logp), ("entropy", entropy),
            ("rollout_is_weights", rollout_is_weights),
            ("token_normalizer_tensor", token_normalizer if tn_num == 1 else None),
            ("seq_normalizer_tensor", seq_normalizer if sn_num == 1 else None)),
            (("token_normalizer", tn_num == 0), ("seq_normalizer", sn_num == 0)),
            dt, grads, shape, nmetrics, scalar_loss, apart, b.op.sizes.get(sizes_key))
    return PolicyLossResult(loss, outs[0], outs[1] if len(outs) > 1 else None, out_metrics)


def value_loss(values, old_values, returns, mask=None, *, seq_offsets=None, clip=None,
               clamp_bound_grad=None, agg=None, token_normalizer=None, seq_normalizer=None,
               norm_scale=None, loss_scale=None, metrics=True, stream=None, scalar_loss=False,
               apart=False):
    """The clipped value loss forward and backward in one pass (rlk_value_loss).

    values, old_values, returns: [B, T] or [N] (with seq_offsets), f32 or f64. clip: the value
    clip range (default 0.5; float("inf") turns clipping off). agg and the normalizers as for
    policy_loss; clamp_bound_grad: the clip's gradient where v - v_old is exactly +-clip
    (default 0.5, verl's). Returns ValueLossResult(loss [1], grad_values, metrics [4] or None);
    the outputs are views of one allocation unless apart=True."""
    if compiling():
        return traced("value_loss", dict(
            values=values, old_values=old_values, returns=returns, mask=mask,
            seq_offsets=seq_offsets, clip=clip, clamp_bound_grad=clamp_bound_grad, agg=agg,
            token_normalizer=token_normalizer, seq_normalizer=seq_normalizer,
            norm_scale=norm_scale, loss_scale=loss_scale, metrics=metrics, stream=stream,
            scalar_loss=scalar_loss, apart=apart))
    tn_num, sn_num = _norm_kind(token_normalizer), _norm_kind(seq_normalizer)
    fast = use_plans(stream, values)
    if fast:
        key = (clip, clamp_bound_grad, agg, tn_num, sn_num, norm_scale, loss_scale,
               bool(metrics), scalar_loss, apart, values.shape)
        out = plan_call("value_loss", key, (
            values, old_values, returns, mask, seq_offsets,
            None if tn_num != 1 else token_normalizer, None if sn_num != 1 else seq_normalizer),
            _norm_scalars(tn_num, token_normalizer, sn_num, seq_normalizer))
        if out is not None:
            grads, loss, out_metrics = _split(out, metrics)
            return ValueLossResult(loss, grads[0], out_metrics)
    b = Binder(VALUE_OP)
    a = b.args
    dt = b.bind(_VL_INPUTS, (values, old_values, returns, mask, seq_offsets))
    if clip is not None:
        a.clip = float(clip)
    if clamp_bound_grad is not None:
        a.clamp_bound_grad = float(clamp_bound_grad)
    if agg is not None or token_normalizer is not None or seq_normalizer is not None \
            or norm_scale is not None or loss_scale is not None:
        _set_agg(b, agg, token_normalizer, seq_normalizer, norm_scale, loss_scale)
    shape = values.shape
    nmetrics = _VL_NMETRICS if metrics else 0
    sizes_key = (b.place, shape, None if seq_offsets is None else seq_offsets.shape, mask is None, 0,
                 a.agg, _norm_key(a, token_normalizer), dt, nmetrics)
    outs, loss, out_metrics = _outputs(b, dt, _VL_GRADS, shape, nmetrics, sizes_key, scalar_loss, apart)
    ctx = b.run(stream)
    if fast:
        _keep_loss_plan("value_loss", key, b, ctx, (
            ("values", values), ("old_values", old_values), ("returns", returns), ("mask", mask),
            ("seq_offsets", seq_offsets),
            ("token_normalizer_tensor", token_normalizer if tn_num == 1 else None),
            ("seq_normalizer_tensor", seq_normalizer if sn_num == 1 else None)),
            (("token_normalizer", tn_num == 0), ("seq_normalizer", sn_num == 0)),
            dt, _VL_GRADS, shape, nmetrics, scalar_loss, apart, b.op.sizes.get(sizes_key))
    return ValueLossResult(loss, outs[0], out_metrics)

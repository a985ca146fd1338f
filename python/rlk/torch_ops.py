"""rlk's ops as torch operators: torch.ops.rlk.<name>, registered with torch.library on import.

Each operator has a schema, its kernel (the library call, on the caller's current stream, with
outputs that share no memory), a fake kernel (the outputs' shapes and dtypes from the inputs',
so torch.compile and torch.export trace it without running it) and, for the differentiable ones,
its gradient (register_autograd; the backward of a log-prob or attention op is the backward
operator, so a compiled backward holds no Python either).

rlk's functions (rlk.policy_loss, rlk.autograd.policy_loss, ...) call these operators when
torch.compile traces them, through the functions of the same name here, which take the same
arguments and return the same results; eager calls go straight to the library (no dispatcher
on the hot path). So a compiled training step that calls rlk has no graph break:

    step = torch.compile(grpo_loss_step, fullgraph=True)

Under torch.compile an op runs on the current stream (stream= is refused) and allocates its
outputs; the status=, inplace and preallocated-output keywords are eager-only. Enum keywords
travel as their integer values and normalizers as a number or a tensor (two schema arguments).
Differentiable: policy_loss (logp, entropy), value_loss (values), logprob (logits),
linear_logprob (hidden, weight), linear_policy_loss (hidden, weight), token_kl (logp,
ref_logp), prefix_attention (q, k, v). The vocabulary-parallel pieces are operators too
(logprob_partials, linear_logprob_partials, logprob_combine); the all-gather between them is the
caller's collective (rlk.vocab_parallel_logprob and its NCCL form stay eager).
"""
import collections
import torch

from . import _types as T
from .errors import InvalidArgument
from .ops import group_advantage as _ga
from .ops import linear_logprob as _linear
from .ops import logprob as _lp
from .ops import losses as _losses
from .ops import prefix_attention as _pa
from .ops import returns as _ret
from .ops import sample as _sample
from .ops import token_baseline as _tb
from .ops import token_kl as _kl
from .ops import vocab_parallel as _vp

# The functional calls the kernels below make (they run outside any trace, so each call's look at
# torch.compiler.is_compiling() says no).
_raw = {name: getattr(mod, name) for mod, name in (
    (_ga, "group_advantage"), (_losses, "policy_loss"), (_losses, "value_loss"),
    (_ret, "gae"), (_ret, "discounted_returns"), (_ret, "reverse_cumsum"),
    (_ret, "masked_whiten"), (_lp, "logprob"), (_lp, "logprob_backward"),
    (_linear, "linear_logprob"), (_linear, "linear_logprob_backward"),
    (_linear, "linear_policy_loss"), (_sample, "sample"), (_pa, "prefix_attention"),
    (_pa, "prefix_attention_backward"), (_tb, "token_baseline"), (_kl, "token_kl"),
    (_vp, "logprob_partials"), (_vp, "logprob_combine"),
    (_linear, "linear_logprob_partials"))}

_F32 = torch.float32
_EMPTY = (0,)


def _define(name, schema, fake):
    """torch.ops.rlk.<name>: schema, the decorated kernel, the fake kernel. A custom op takes no
    keyword-only tensor, so the schema's `*` is dropped; the kernel and the fake kernel are still
    called with every argument by name."""
    schema = schema.replace("*, ", "")
    names = [a.name for a in torch._C.parse_schema("rlk::%s%s" % (name, schema)).arguments]

    def by_name(fn):
        def call(*args, **kwargs):
            kwargs.update(zip(names, args))
            return fn(**kwargs)
        return call

    def register(kernel):
        op = torch.library.custom_op("rlk::" + name, by_name(kernel), mutates_args=(),
                                     schema=schema)
        op.register_fake(by_name(fake))
        return op
    return register


def _none(n):
    return (None,) * n


def _nargs(op):
    return len(op._opoverload._schema.arguments)


def _or_empty(x, like, dtype=None):
    """An output that was not asked for travels as an empty tensor (an op returns tensors), of
    `like`'s dtype or `dtype` (the one the fake kernel gives it)."""
    return x if x is not None else like.new_empty(_EMPTY, dtype=dtype or like.dtype)


def _no_stream(name, stream):
    if stream is not None:
        raise InvalidArgument("%s: stream= is not supported under torch.compile (the op runs on "
                              "the current stream)" % name)


def _enum(kw, name, cls):
    v = kw.get(name)
    if v is not None:
        kw[name] = T.enum_value(cls, v, name)


def _number_or_tensor(kw, name):
    """A normalizer given as a tensor goes to `name`_tensor."""
    v = kw.get(name)
    if isinstance(v, torch.Tensor):
        kw[name] = None
        kw[name + "_tensor"] = v


def _normalizers(kw):
    _number_or_tensor(kw, "token_normalizer")
    _number_or_tensor(kw, "seq_normalizer")
    _enum(kw, "agg", _losses.LossAgg)


def _from_tensor(kw, name):
    """A normalizer back in the functional call's single keyword."""
    t = kw.pop(name + "_tensor", None)
    if t is not None:
        kw[name] = t


def _eager_only(name, kw, keys):
    for k in keys:
        if kw.pop(k, None) not in (None, False):
            raise InvalidArgument("%s: %s= is eager-only (not supported under torch.compile)" % (
                name, k))


# ---- group advantages ----------------------------------------------------------------------

def _group_advantage_fake(scores, group_size=None, *, group_offsets=None, mode=None, eps=None,
                          unbiased=None, singleton=None, mask=None, broadcast=False,
                          weights=None, nan_scores=None):
    b = scores.shape[0]
    cols = 0
    if broadcast:
        cols = mask.shape[1] if mask is not None and mask.dim() == 2 else scores.shape[1]
    return scores.new_empty((b,), dtype=_F32), scores.new_empty((b, cols), dtype=_F32)


@_define("group_advantage",
         "(Tensor scores, int? group_size=None, *, Tensor? group_offsets=None, int? mode=None, "
         "float? eps=None, bool? unbiased=None, int? singleton=None, Tensor? mask=None, "
         "bool broadcast=False, Tensor? weights=None, int? nan_scores=None) -> (Tensor, Tensor)",
         _group_advantage_fake)
def _group_advantage_op(scores, group_size=None, *, broadcast=False, **kw):
    out = _raw["group_advantage"](scores, group_size, broadcast=broadcast, **kw)
    if broadcast:
        return out
    return out, scores.new_empty((scores.shape[0], 0), dtype=_F32)


def group_advantage(scores, group_size=None, *, advantages=None, token_advantages=None,
                    stream=None, **kw):
    """rlk.group_advantage under torch.compile."""
    _no_stream("group_advantage", stream)
    if advantages is not None or token_advantages is not None:
        raise InvalidArgument("group_advantage: preallocated outputs are eager-only")
    _enum(kw, "mode", _ga.AdvantageMode)
    _enum(kw, "singleton", _ga.SingletonPolicy)
    _enum(kw, "nan_scores", _ga.NanScores)
    broadcast = bool(kw.pop("broadcast", False))
    adv, tok = _group_advantage_op(scores, group_size, broadcast=broadcast, **kw)
    return (adv, tok) if broadcast else adv


# ---- policy and value losses ---------------------------------------------------------------

_NORMALIZERS = ("int? agg=None, float? token_normalizer=None, Tensor? token_normalizer_tensor=None, "
                "float? seq_normalizer=None, Tensor? seq_normalizer_tensor=None, "
                "float? norm_scale=None, float? loss_scale=None")
_POLICY = ("Tensor? mask=None, *, Tensor? seq_offsets=None, Tensor? ref_logp=None, "
           "Tensor? rollout_is_weights=None, bool? seq_advantages=None, int? mode=None, "
           "float? clip_low=None, float? clip_high=None, float? dual_clip=None, "
           "float? log_ratio_min=None, float? log_ratio_max=None, float? sapo_tau_pos=None, "
           "float? sapo_tau_neg=None, int? seq_ratio_grad=None, float? clamp_bound_grad=None, "
           "int? kl_estimator=None, float? kl_coef=None, float? kl_input_clamp=None, "
           "float? kl_output_clamp=None, bool? kl_straight_through=None, "
           "float? entropy_coef=None, " + _NORMALIZERS + ", bool metrics=True")
_PL_METRICS = len(_losses.POLICY_LOSS_METRICS)
_VL_METRICS = len(_losses.VALUE_LOSS_METRICS)


def _policy_enums(kw):
    _enum(kw, "mode", _losses.PolicyLossMode)
    _enum(kw, "seq_ratio_grad", _losses.SeqRatioGrad)
    _enum(kw, "kl_estimator", _losses.KLEstimator)
    _normalizers(kw)


def _policy_loss_fake(logp, old_logp, advantages, entropy=None, mask=None, *, metrics=True, **_):
    shape = logp.shape
    return (logp.new_empty(()), logp.new_empty(shape),
            logp.new_empty(shape if entropy is not None else _EMPTY),
            logp.new_empty((_PL_METRICS if metrics else 0,)))


@_define("policy_loss",
         "(Tensor logp, Tensor old_logp, Tensor advantages, Tensor? entropy=None, " + _POLICY
         + ") -> (Tensor, Tensor, Tensor, Tensor)", _policy_loss_fake)
def _policy_loss_op(logp, old_logp, advantages, entropy=None, mask=None, *, metrics=True, **kw):
    _from_tensor(kw, "token_normalizer")
    _from_tensor(kw, "seq_normalizer")
    out = _raw["policy_loss"](logp, old_logp, advantages, mask, entropy=entropy, metrics=metrics,
                              scalar_loss=True, apart=True, **kw)
    ge = out.grad_entropy
    if entropy is not None and ge is None:  # entropy_coef 0: the loss does not depend on it
        ge = torch.zeros_like(logp)
    return (out.loss, out.grad_logp, _or_empty(ge, logp),
            out.metrics if metrics else logp.new_empty(_EMPTY))


def _keep_grads(ctx, op, inputs, wanted, grads):
    """A fused loss's setup: it keeps the gradients it computed (`grads`) of the inputs at
    positions `wanted`, and their dtypes."""
    ctx.nargs = _nargs(op)
    ctx.wanted = [(pos, None if inputs[pos] is None else inputs[pos].dtype) for pos in wanted]
    ctx.save_for_backward(*grads)


def _scaled_grads(ctx, grad_loss):
    """grad_loss times the gradients the forward kept, in their inputs' dtypes."""
    grads = [None] * ctx.nargs
    if grad_loss is None:
        return tuple(grads)
    for (pos, dtype), g in zip(ctx.wanted, ctx.saved_tensors):
        if ctx.needs_input_grad[pos]:
            grads[pos] = (g * grad_loss).to(dtype)
    return tuple(grads)


def _policy_loss_setup(ctx, inputs, output):
    loss, g_logp, g_ent, metrics = output
    _keep_grads(ctx, _policy_loss_op, inputs, (0, 3), (g_logp, g_ent))
    ctx.mark_non_differentiable(g_logp, g_ent, metrics)


def _policy_loss_backward(ctx, grad_loss, *_):
    return _scaled_grads(ctx, grad_loss)


_policy_loss_op.register_autograd(_policy_loss_backward, setup_context=_policy_loss_setup)


def policy_loss(logp, old_logp, advantages, mask=None, *, entropy=None, metrics=True,
                stream=None, scalar_loss=False, apart=False, **kw):
    """rlk.policy_loss under torch.compile (differentiable in logp and entropy: the autograd
    wrapper is this op)."""
    _no_stream("policy_loss", stream)
    _policy_enums(kw)
    loss, g_logp, g_ent, m = _policy_loss_op(logp, old_logp, advantages, entropy, mask,
                                             metrics=bool(metrics), **kw)
    return _losses.PolicyLossResult(loss if scalar_loss else loss.reshape(1), g_logp,
                                    g_ent if entropy is not None else None,
                                    m if metrics else None)


def _value_loss_fake(values, old_values, returns, mask=None, *, metrics=True, **_):
    return (values.new_empty(()), values.new_empty(values.shape),
            values.new_empty((_VL_METRICS if metrics else 0,)))


@_define("value_loss",
         "(Tensor values, Tensor old_values, Tensor returns, Tensor? mask=None, *, "
         "Tensor? seq_offsets=None, float? clip=None, float? clamp_bound_grad=None, "
         + _NORMALIZERS + ", bool metrics=True) -> (Tensor, Tensor, Tensor)", _value_loss_fake)
def _value_loss_op(values, old_values, returns, mask=None, *, metrics=True, **kw):
    _from_tensor(kw, "token_normalizer")
    _from_tensor(kw, "seq_normalizer")
    out = _raw["value_loss"](values, old_values, returns, mask, metrics=metrics, scalar_loss=True,
                             apart=True, **kw)
    return out.loss, out.grad_values, out.metrics if metrics else values.new_empty(_EMPTY)


def _value_loss_setup(ctx, inputs, output):
    loss, g_values, metrics = output
    _keep_grads(ctx, _value_loss_op, inputs, (0,), (g_values,))
    ctx.mark_non_differentiable(g_values, metrics)


def _value_loss_backward(ctx, grad_loss, *_):
    return _scaled_grads(ctx, grad_loss)


_value_loss_op.register_autograd(_value_loss_backward, setup_context=_value_loss_setup)


def value_loss(values, old_values, returns, mask=None, *, metrics=True, stream=None,
               scalar_loss=False, apart=False, **kw):
    """rlk.value_loss under torch.compile (differentiable in values)."""
    _no_stream("value_loss", stream)
    _normalizers(kw)
    loss, g, m = _value_loss_op(values, old_values, returns, mask, metrics=bool(metrics), **kw)
    return _losses.ValueLossResult(loss if scalar_loss else loss.reshape(1), g,
                                   m if metrics else None)


# ---- token log-probs -----------------------------------------------------------------------

_TUNING = "int? variant=None, int? block=None, int? unroll=None, int? stages=None"


def _logprob_fake(logits, labels, *, entropy=False, **_):
    n = logits.shape[0]
    return (logits.new_empty((n,), dtype=_F32), logits.new_empty((n,), dtype=_F32),
            logits.new_empty((n if entropy else 0,), dtype=_F32))


@_define("logprob",
         "(Tensor logits, Tensor labels, *, float? temperature=None, int? ignore_index=None, "
         "bool entropy=False, " + _TUNING + ", Tensor? threshold=None) -> (Tensor, Tensor, Tensor)",
         _logprob_fake)
def _logprob_op(logits, labels, *, entropy=False, **kw):
    out = _raw["logprob"](logits, labels, entropy=entropy, lse=True, **kw)
    return out.logp, out.lse, _or_empty(out.entropy, out.logp)


def _upstream(g):
    """An upstream gradient as the f32 [N] with a positive stride the library reads."""
    if g is None:
        return None
    return g.float().contiguous()


def _logprob_setup(ctx, inputs, output):
    logits, labels = inputs[0], inputs[1]
    logp, lse, entropy = output
    ctx.entropy = bool(inputs[4])
    ctx.kw = {"temperature": inputs[2], "ignore_index": inputs[3], "threshold": inputs[9]}
    ctx.nargs = _nargs(_logprob_op)
    ctx.save_for_backward(logits, labels, lse, entropy)
    ctx.mark_non_differentiable(lse)


def _logprob_backward(ctx, grad_logp, grad_lse, grad_entropy):
    logits, labels, lse, entropy = ctx.saved_tensors
    grads = [None] * ctx.nargs
    if not ctx.needs_input_grad[0] or (grad_logp is None and grad_entropy is None):
        return tuple(grads)
    g_h = _upstream(grad_entropy) if ctx.entropy else None
    grads[0] = _logprob_backward_op(logits, labels, lse, _upstream(grad_logp), g_h,
                                    entropy if g_h is not None else None, **ctx.kw)
    return tuple(grads)


def _logprob_backward_fake(logits, labels, lse, grad_logp=None, grad_entropy=None, entropy=None,
                           *, grad_f32=False, **_):
    return logits.new_empty(logits.shape, dtype=_F32 if grad_f32 else logits.dtype)


@_define("logprob_backward",
         "(Tensor logits, Tensor labels, Tensor lse, Tensor? grad_logp=None, "
         "Tensor? grad_entropy=None, Tensor? entropy=None, *, float? temperature=None, "
         "int? ignore_index=None, int? vocab_start=None, bool grad_f32=False, " + _TUNING
         + ", Tensor? threshold=None) -> Tensor", _logprob_backward_fake)
def _logprob_backward_op(logits, labels, lse, grad_logp=None, grad_entropy=None, entropy=None, *,
                         grad_f32=False, **kw):
    return _raw["logprob_backward"](logits, labels, lse, grad_logp, grad_entropy, entropy,
                                    grad_dtype="f32" if grad_f32 else None, **kw)


_logprob_op.register_autograd(_logprob_backward, setup_context=_logprob_setup)


def logprob(logits, labels, *, entropy=False, lse=True, logp=None, status=None, stream=None,
            **kw):
    """rlk.logprob under torch.compile (differentiable in the logits)."""
    _no_stream("logprob", stream)
    _eager_only("logprob", {"logp": logp, "status": status}, ("logp", "status"))
    _enum(kw, "variant", _lp.LogprobVariant)
    out_logp, out_lse, out_ent = _logprob_op(logits, labels, entropy=bool(entropy), **kw)
    return _lp.LogprobResult(out_logp, out_lse if lse else None, out_ent if entropy else None)


def logprob_backward(logits, labels, lse, grad_logp=None, grad_entropy=None, entropy=None, *,
                     grad_dtype=None, grad_logits=None, inplace=False, status=None, stream=None,
                     **kw):
    """rlk.logprob_backward under torch.compile."""
    _no_stream("logprob_backward", stream)
    _eager_only("logprob_backward", {"grad_logits": grad_logits, "inplace": inplace,
                                     "status": status}, ("grad_logits", "inplace", "status"))
    _enum(kw, "variant", _lp.LogprobVariant)
    return _logprob_backward_op(logits, labels, lse, grad_logp, grad_entropy, entropy,
                                grad_f32=grad_dtype in ("f32", T.DType.F32), **kw)


# ---- vocabulary shards (tensor-parallel heads): records and their combine ---------------------

def _partials(rows_of):
    """The fake kernel of a shard's records: f32 [N, 4], N the rows of argument `rows_of`."""
    def fake(**kw):
        x = kw[rows_of]
        return x.new_empty((x.shape[0], _vp.PARTIAL_FIELDS), dtype=_F32)
    return fake


@_define("logprob_partials",
         "(Tensor logits, Tensor labels, int vocab_start, *, float? temperature=None, "
         "int? ignore_index=None, bool entropy=False, int? block=None, int? unroll=None) -> Tensor",
         _partials("logits"))
def _logprob_partials_op(logits, labels, vocab_start, **kw):
    return _raw["logprob_partials"](logits, labels, vocab_start, **kw)


def logprob_partials(logits, labels, vocab_start, *, partials=None, stream=None, **kw):
    """rlk.logprob_partials under torch.compile."""
    _no_stream("logprob_partials", stream)
    _eager_only("logprob_partials", {"partials": partials}, ("partials",))
    return _logprob_partials_op(logits, labels, int(vocab_start), **kw)


def _combine_fake(partials, labels, *, entropy=False, **_):
    n = labels.shape[0]
    return (partials.new_empty((n,)), partials.new_empty((n,)),
            partials.new_empty((n if entropy else 0,)))


@_define("logprob_combine",
         "(Tensor partials, Tensor labels, *, int? ignore_index=None, bool entropy=False) "
         "-> (Tensor, Tensor, Tensor)", _combine_fake)
def _logprob_combine_op(partials, labels, *, entropy=False, **kw):
    out = _raw["logprob_combine"](partials, labels, entropy=entropy, lse=True, **kw)
    return out.logp, out.lse, _or_empty(out.entropy, out.logp)


def logprob_combine(partials, labels, *, entropy=False, lse=True, logp=None, status=None,
                    stream=None, **kw):
    """rlk.logprob_combine under torch.compile."""
    _no_stream("logprob_combine", stream)
    _eager_only("logprob_combine", {"logp": logp, "status": status}, ("logp", "status"))
    lp, out_lse, ent = _logprob_combine_op(partials, labels, entropy=bool(entropy), **kw)
    return _lp.LogprobResult(lp, out_lse if lse else None, ent if entropy else None)


@_define("linear_logprob_partials",
         "(Tensor hidden, Tensor weight, Tensor labels, int vocab_start, *, bool entropy=False, "
         "float? temperature=None, int? ignore_index=None, int? variant=None, int? splits=None, "
         "Tensor? rows=None) -> Tensor", _partials("labels"))
def _linear_logprob_partials_op(hidden, weight, labels, vocab_start, **kw):
    return _raw["linear_logprob_partials"](hidden, weight, labels, vocab_start, **kw)


def linear_logprob_partials(hidden, weight, labels, vocab_start, *, partials=None, stream=None,
                            **kw):
    """rlk.linear_logprob_partials under torch.compile."""
    _no_stream("linear_logprob_partials", stream)
    _eager_only("linear_logprob_partials", {"partials": partials}, ("partials",))
    _enum(kw, "variant", _linear.LinearLogprobVariant)
    return _linear_logprob_partials_op(hidden, weight, labels, int(vocab_start), **kw)


# ---- the fused LM head ---------------------------------------------------------------------

_HEAD = ("float? temperature=None, int? ignore_index=None, int? variant=None, int? splits=None")


def _linear_logprob_fake(hidden, weight, labels, *, entropy=False, rows=None, **_):
    n = hidden.shape[0] if rows is None else rows.shape[0]
    return (hidden.new_empty((n,), dtype=_F32), hidden.new_empty((n,), dtype=_F32),
            hidden.new_empty((n if entropy else 0,), dtype=_F32))


@_define("linear_logprob",
         "(Tensor hidden, Tensor weight, Tensor labels, *, bool entropy=False, " + _HEAD
         + ", int? stages=None, Tensor? threshold=None, Tensor? rows=None) -> (Tensor, Tensor, Tensor)",
         _linear_logprob_fake)
def _linear_logprob_op(hidden, weight, labels, *, entropy=False, **kw):
    out = _raw["linear_logprob"](hidden, weight, labels, entropy=entropy, lse=True, **kw)
    return out.logp, out.lse, _or_empty(out.entropy, out.logp)


def _linear_logprob_setup(ctx, inputs, output):
    hidden, weight, labels, entropy_wanted = inputs[0], inputs[1], inputs[2], inputs[3]
    logp, lse, entropy = output
    ctx.entropy = bool(entropy_wanted)
    ctx.kw = {"temperature": inputs[4], "ignore_index": inputs[5], "threshold": inputs[9], "rows": inputs[10]}
    ctx.nargs = _nargs(_linear_logprob_op)
    ctx.save_for_backward(hidden, weight, labels, lse, entropy)
    ctx.mark_non_differentiable(lse)


def _linear_logprob_backward(ctx, grad_logp, grad_lse, grad_entropy):
    hidden, weight, labels, lse, entropy = ctx.saved_tensors
    grads = [None] * ctx.nargs
    want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if not (want_h or want_w) or (grad_logp is None and grad_entropy is None):
        return tuple(grads)
    g_h = _upstream(grad_entropy) if ctx.entropy else None
    gh, gw = _linear_logprob_backward_op(
        hidden, weight, labels, lse, _upstream(grad_logp), g_h,
        entropy if g_h is not None else None, want_hidden=want_h, want_weight=want_w,
        grad_f32=False, **ctx.kw)
    grads[0] = gh if want_h else None
    grads[1] = gw if want_w else None
    return tuple(grads)


def _linear_logprob_backward_fake(hidden, weight, labels, lse, grad_logp=None, grad_entropy=None,
                                  entropy=None, *, want_hidden=True, want_weight=True,
                                  grad_f32=True, **_):
    dt = _F32 if grad_f32 else hidden.dtype
    return (hidden.new_empty(hidden.shape if want_hidden else _EMPTY, dtype=dt),
            hidden.new_empty(weight.shape if want_weight else _EMPTY, dtype=dt))


@_define("linear_logprob_backward",
         "(Tensor hidden, Tensor weight, Tensor labels, Tensor lse, Tensor? grad_logp=None, "
         "Tensor? grad_entropy=None, Tensor? entropy=None, *, float? temperature=None, "
         "int? ignore_index=None, bool want_hidden=True, bool want_weight=True, "
         "bool grad_f32=True, int? chunk=None, int? group=None, bool shard=False, "
         "int vocab_start=0, Tensor? threshold=None, Tensor? rows=None) -> (Tensor, Tensor)",
         _linear_logprob_backward_fake)
def _linear_logprob_backward_op(hidden, weight, labels, lse, grad_logp=None, grad_entropy=None,
                                entropy=None, *, grad_f32=True, **kw):
    gh, gw = _raw["linear_logprob_backward"](hidden, weight, labels, lse, grad_logp, grad_entropy,
                                             entropy, grad_dtype="f32" if grad_f32 else "same",
                                             **kw)
    dt = _F32 if grad_f32 else hidden.dtype
    return _or_empty(gh, hidden, dt), _or_empty(gw, hidden, dt)


_linear_logprob_op.register_autograd(_linear_logprob_backward,
                                     setup_context=_linear_logprob_setup)


def linear_logprob(hidden, weight, labels, *, entropy=False, lse=True, status=None, stream=None,
                   **kw):
    """rlk.linear_logprob under torch.compile (differentiable in hidden and weight)."""
    _no_stream("linear_logprob", stream)
    _eager_only("linear_logprob", {"status": status}, ("status",))
    _enum(kw, "variant", _linear.LinearLogprobVariant)
    logp, out_lse, ent = _linear_logprob_op(hidden, weight, labels, entropy=bool(entropy), **kw)
    return _lp.LogprobResult(logp, out_lse if lse else None, ent if entropy else None)


def linear_logprob_backward(hidden, weight, labels, lse, grad_logp=None, grad_entropy=None,
                            entropy=None, *, grad_hidden=None, grad_weight=None, accumulate=False,
                            grad_dtype="f32", status=None, stream=None, want_hidden=True,
                            want_weight=True, **kw):
    """rlk.linear_logprob_backward under torch.compile."""
    _no_stream("linear_logprob_backward", stream)
    _eager_only("linear_logprob_backward", {"grad_hidden": grad_hidden, "grad_weight": grad_weight,
                                            "accumulate": accumulate, "status": status},
                ("grad_hidden", "grad_weight", "accumulate", "status"))
    gh, gw = _linear_logprob_backward_op(hidden, weight, labels, lse, grad_logp, grad_entropy,
                                         entropy, want_hidden=bool(want_hidden),
                                         want_weight=bool(want_weight),
                                         grad_f32=grad_dtype != "same", **kw)
    return (gh if want_hidden else None), (gw if want_weight else None)


def _linear_policy_loss_fake(hidden, weight, labels, old_logp, advantages, mask=None, *,
                             want_hidden=True, want_weight=True, grad_f32=True, logp=False,
                             metrics=True, **_):
    dt = _F32 if grad_f32 else hidden.dtype
    n = hidden.shape[0]
    return (hidden.new_empty((), dtype=_F32),
            hidden.new_empty(hidden.shape if want_hidden else _EMPTY, dtype=dt),
            hidden.new_empty(weight.shape if want_weight else _EMPTY, dtype=dt),
            hidden.new_empty((_PL_METRICS if metrics else 0,), dtype=_F32),
            hidden.new_empty((n if logp else 0,), dtype=_F32))


@_define("linear_policy_loss",
         "(Tensor hidden, Tensor weight, Tensor labels, Tensor old_logp, Tensor advantages, "
         + _POLICY + ", " + _HEAD + ", bool want_hidden=True, bool want_weight=True, "
         "bool grad_f32=True, int? chunk=None, int? group=None, bool logp=False, int? path=None, "
         "int? chunk_tokens=None, Tensor? threshold=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
         _linear_policy_loss_fake)
def _linear_policy_loss_op(hidden, weight, labels, old_logp, advantages, mask=None, *,
                           grad_f32=True, logp=False, metrics=True, path=None, **kw):
    _from_tensor(kw, "token_normalizer")
    _from_tensor(kw, "seq_normalizer")
    if path is not None:
        path = {v: k for k, v in _linear.POLICY_PATHS.items()}[path]
    out = _raw["linear_policy_loss"](hidden, weight, labels, old_logp, advantages, mask,
                                     grad_dtype="f32" if grad_f32 else "same", logp=logp,
                                     metrics=metrics, path=path, **kw)
    dt = _F32 if grad_f32 else hidden.dtype
    return (out.loss.reshape(()).clone(), _or_empty(out.grad_hidden, hidden, dt),
            _or_empty(out.grad_weight, hidden, dt),
            out.metrics.clone() if metrics else hidden.new_empty(_EMPTY, dtype=_F32),
            _or_empty(out.logp, out.loss))


def _linear_policy_loss_setup(ctx, inputs, output):
    loss, gh, gw, metrics, logp = output
    # a gradient the call was told not to compute (want_hidden / want_weight false) is an empty
    # placeholder: that input gets none, whether or not it requires grad
    wanted = [(pos, g) for pos, g, flag in ((0, gh, _LPL_WANT_HIDDEN), (1, gw, _LPL_WANT_WEIGHT))
              if inputs[flag]]
    _keep_grads(ctx, _linear_policy_loss_op, inputs, [pos for pos, _ in wanted],
                [g for _, g in wanted])
    ctx.mark_non_differentiable(gh, gw, metrics, logp)


def _linear_policy_loss_backward(ctx, grad_loss, *_):
    return _scaled_grads(ctx, grad_loss)


_LPL_ARGS = [a.name for a in _linear_policy_loss_op._opoverload._schema.arguments]
_LPL_WANT_HIDDEN = _LPL_ARGS.index("want_hidden")
_LPL_WANT_WEIGHT = _LPL_ARGS.index("want_weight")
_linear_policy_loss_op.register_autograd(_linear_policy_loss_backward,
                                         setup_context=_linear_policy_loss_setup)


def linear_policy_loss(hidden, weight, labels, old_logp, advantages, mask=None, *,
                       grad_hidden=None, grad_weight=None, accumulate=False, grad_dtype="f32",
                       logp=False, status=None, metrics=True, path=None, stream=None, **kw):
    """rlk.linear_policy_loss under torch.compile (its loss differentiable in hidden and weight,
    with the gradients this call computes)."""
    _no_stream("linear_policy_loss", stream)
    _eager_only("linear_policy_loss", {"grad_hidden": grad_hidden, "grad_weight": grad_weight,
                                       "accumulate": accumulate, "status": status},
                ("grad_hidden", "grad_weight", "accumulate", "status"))
    _policy_enums(kw)
    _enum(kw, "variant", _linear.LinearLogprobVariant)
    if path is not None:
        path = _linear.POLICY_PATHS[path]
    loss, gh, gw, m, lp = _linear_policy_loss_op(
        hidden, weight, labels, old_logp, advantages, mask, grad_f32=grad_dtype != "same",
        logp=bool(logp), metrics=bool(metrics), path=path, **kw)
    return _linear.LinearPolicyLossResult(
        loss.reshape(1), gh if kw.get("want_hidden", True) else None,
        gw if kw.get("want_weight", True) else None, m if metrics else None, lp if logp else None)


# ---- advantages and returns over time --------------------------------------------------------

def _gae_fake(rewards, values, mask=None, *, compute_returns=True, **_):
    return rewards.new_empty(rewards.shape), rewards.new_empty(
        rewards.shape if compute_returns else _EMPTY)


@_define("gae",
         "(Tensor rewards, Tensor values, Tensor? mask=None, *, float? gamma=None, "
         "float? lam=None, int? masked=None, int? algo=None, bool compute_returns=True) "
         "-> (Tensor, Tensor)", _gae_fake)
def _gae_op(rewards, values, mask=None, *, compute_returns=True, **kw):
    out = _raw["gae"](rewards, values, mask, compute_returns=compute_returns, **kw)
    return out if compute_returns else (out, rewards.new_empty(_EMPTY))


def gae(rewards, values, mask=None, *, advantages=None, returns=None, compute_returns=True,
        stream=None, **kw):
    """rlk.gae under torch.compile."""
    _no_stream("gae", stream)
    _eager_only("gae", {"advantages": advantages, "returns": returns}, ("advantages", "returns"))
    _enum(kw, "masked", _ret.GaeMasked)
    _enum(kw, "algo", _ret.ScanAlgo)
    adv, ret = _gae_op(rewards, values, mask, compute_returns=bool(compute_returns), **kw)
    return (adv, ret) if compute_returns else adv


@_define("discounted_returns",
         "(Tensor rewards, Tensor? mask=None, *, float? gamma=None, int? masked=None, "
         "int? algo=None) -> Tensor", lambda rewards, mask=None, **_: rewards.new_empty(rewards.shape))
def _discounted_returns_op(rewards, mask=None, **kw):
    return _raw["discounted_returns"](rewards, mask, **kw)


def discounted_returns(rewards, mask=None, *, returns=None, stream=None, **kw):
    """rlk.discounted_returns under torch.compile."""
    _no_stream("discounted_returns", stream)
    _eager_only("discounted_returns", {"returns": returns}, ("returns",))
    _enum(kw, "masked", _ret.ReturnsMasked)
    _enum(kw, "algo", _ret.ScanAlgo)
    return _discounted_returns_op(rewards, mask, **kw)


def _reverse_cumsum_fake(values, mask=None, *, baseline=None, algo=None):
    return values.new_empty(values.shape), values.new_empty(
        values.shape if baseline is not None else _EMPTY)


@_define("reverse_cumsum",
         "(Tensor values, Tensor? mask=None, *, Tensor? baseline=None, int? algo=None) "
         "-> (Tensor, Tensor)", _reverse_cumsum_fake)
def _reverse_cumsum_op(values, mask=None, *, baseline=None, algo=None):
    out = _raw["reverse_cumsum"](values, mask, baseline=baseline, algo=algo)
    return out if baseline is not None else (out, values.new_empty(_EMPTY))


def reverse_cumsum(values, mask=None, *, baseline=None, algo=None, out=None, advantages=None,
                   stream=None):
    """rlk.reverse_cumsum under torch.compile."""
    _no_stream("reverse_cumsum", stream)
    _eager_only("reverse_cumsum", {"out": out, "advantages": advantages}, ("out", "advantages"))
    kw = {"algo": algo}
    _enum(kw, "algo", _ret.ScanAlgo)
    res, adv = _reverse_cumsum_op(values, mask, baseline=baseline, algo=kw["algo"])
    return (res, adv) if baseline is not None else res


def _masked_whiten_fake(x, mask=None, *, stats=False, **_):
    return x.new_empty(x.shape), x.new_empty((3 if stats else 0,), dtype=torch.float64)


@_define("masked_whiten",
         "(Tensor x, Tensor? mask=None, *, float? eps=None, int? eps_mode=None, "
         "bool? unbiased=None, float? count_eps=None, bool? shift_mean=None, "
         "bool? normalize_std=None, int? masked=None, bool stats=False) -> (Tensor, Tensor)",
         _masked_whiten_fake)
def _masked_whiten_op(x, mask=None, *, stats=False, **kw):
    out = _raw["masked_whiten"](x, mask, stats=stats, **kw)
    return out if stats else (out, x.new_empty(_EMPTY, dtype=torch.float64))


def masked_whiten(x, mask=None, *, out=None, inplace=False, stats=False, stream=None, **kw):
    """rlk.masked_whiten under torch.compile."""
    _no_stream("masked_whiten", stream)
    _eager_only("masked_whiten", {"out": out, "inplace": inplace}, ("out", "inplace"))
    _enum(kw, "eps_mode", _ret.WhitenEps)
    _enum(kw, "masked", _ret.WhitenMasked)
    res, st = _masked_whiten_op(x, mask, stats=bool(stats), **kw)
    return (res, st) if stats else res


def _token_baseline_fake(rewards, old_logp, sum_pi_squared, group_size=None, **_):
    return rewards.new_empty(rewards.shape), rewards.new_empty(rewards.shape)


@_define("token_baseline",
         "(Tensor rewards, Tensor old_logp, Tensor sum_pi_squared, int? group_size=None, *, "
         "Tensor? group_offsets=None, Tensor? mask=None, Tensor? rollout_is_weights=None, "
         "float? epsilon=None, bool? handle_zero_tail=None, bool compact=False) "
         "-> (Tensor, Tensor)", _token_baseline_fake)
def _token_baseline_op(rewards, old_logp, sum_pi_squared, group_size=None, **kw):
    return _raw["token_baseline"](rewards, old_logp, sum_pi_squared, group_size, **kw)


def token_baseline(rewards, old_logp, sum_pi_squared, group_size=None, *, advantages=None,
                   returns=None, stream=None, **kw):
    """rlk.token_baseline under torch.compile."""
    _no_stream("token_baseline", stream)
    _eager_only("token_baseline", {"advantages": advantages, "returns": returns},
                ("advantages", "returns"))
    return _token_baseline_op(rewards, old_logp, sum_pi_squared, group_size, **kw)


# ---- token KL --------------------------------------------------------------------------------

def _token_kl_fake(logp, ref_logp, estimator=3, *, want_kl=True, want_grad=False, **_):
    return (logp.new_empty(logp.shape if want_kl else _EMPTY),
            logp.new_empty(logp.shape if want_grad else _EMPTY))


@_define("token_kl",
         "(Tensor logp, Tensor ref_logp, int estimator=3, *, Tensor? mask=None, "
         "float input_min=-20.0, float input_max=20.0, float output_min=-10.0, "
         "float output_max=10.0, "
         "bool want_kl=True, bool want_grad=False, Tensor? grad_kl=None, "
         "bool straight_through=False, Tensor? old_logp=None, float? is_weight_max=None, "
         "float? clamp_bound_grad=None) -> (Tensor, Tensor)", _token_kl_fake)
def _token_kl_op(logp, ref_logp, estimator=3, *, input_min=-20.0, input_max=20.0,
                 output_min=-10.0, output_max=10.0, want_kl=True, want_grad=False, **kw):
    outputs = "both" if want_kl and want_grad else ("grad" if want_grad else "kl")
    if not want_grad:  # the gradient's settings: the setup keeps them for the backward's call
        for k in ("straight_through", "old_logp", "is_weight_max"):
            kw.pop(k, None)
    out = _raw["token_kl"](logp, ref_logp, estimator, outputs=outputs,
                           input_clamp=(input_min, input_max),
                           output_clamp=(output_min, output_max), **kw)
    if outputs == "both":
        return out
    return (out, logp.new_empty(_EMPTY)) if want_kl else (logp.new_empty(_EMPTY), out)


def _token_kl_setup(ctx, inputs, output):
    ctx.nargs = _nargs(_token_kl_op)
    ctx.estimator = inputs[2]
    ctx.kw = dict(zip(("mask", "input_min", "input_max", "output_min", "output_max"), inputs[3:8]))
    ctx.kw.update(zip(("straight_through", "old_logp", "is_weight_max", "clamp_bound_grad"),
                      inputs[11:15]))
    ctx.save_for_backward(inputs[0], inputs[1])


def _token_kl_backward(ctx, grad_kl, grad_grad):
    logp, ref_logp = ctx.saved_tensors
    grads = [None] * ctx.nargs
    if grad_kl is None or not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
        return tuple(grads)
    g = grad_kl.to(logp.dtype).contiguous()
    _, grad = _token_kl_op(logp, ref_logp, ctx.estimator, want_kl=False, want_grad=True, grad_kl=g,
                           **ctx.kw)
    grads[0] = grad if ctx.needs_input_grad[0] else None
    grads[1] = -grad if ctx.needs_input_grad[1] else None
    return tuple(grads)


_token_kl_op.register_autograd(_token_kl_backward, setup_context=_token_kl_setup)


def token_kl(logp, ref_logp, estimator="k3", *, input_clamp=(-20.0, 20.0),
             output_clamp=(-10.0, 10.0), outputs="kl", kl=None, grad_logp=None, stream=None, **kw):
    """rlk.token_kl under torch.compile (its kl differentiable in logp and ref_logp)."""
    _no_stream("token_kl", stream)
    _eager_only("token_kl", {"kl": kl, "grad_logp": grad_logp}, ("kl", "grad_logp"))
    if outputs not in ("kl", "grad", "both"):
        raise InvalidArgument("token_kl: outputs must be one of kl, grad, both, got %r" % (outputs,))
    in_min, in_max = _kl._range(input_clamp)
    out_min, out_max = _kl._range(output_clamp)
    value, grad = _token_kl_op(logp, ref_logp, T.enum_value(_losses.KLEstimator, estimator,
                                                            "token_kl: estimator"),
                               input_min=in_min, input_max=in_max, output_min=out_min,
                               output_max=out_max, want_kl=outputs != "grad",
                               want_grad=outputs != "kl", **kw)
    if outputs == "both":
        return value, grad
    return value if outputs == "kl" else grad


# ---- sampling --------------------------------------------------------------------------------

_SETTINGS = (("temperature", "temperatures"), ("top_k", "top_ks"), ("top_p", "top_ps"),
             ("min_p", "min_ps"), ("seed", "seeds"), ("offset", "offsets"))


def _sample_fake(logits, *, tokens_i32=False, logp=True, logp_filtered=False, threshold=False, **_):
    b = logits.shape[0]
    return (logits.new_empty((b,), dtype=torch.int32 if tokens_i32 else torch.int64),
            logits.new_empty((b if logp else 0,), dtype=_F32),
            logits.new_empty((b if logp_filtered else 0,), dtype=_F32),
            logits.new_empty((b if threshold else 0,), dtype=_F32))


@_define("sample",
         "(Tensor logits, *, float? temperature=None, Tensor? temperatures=None, int? top_k=None, "
         "Tensor? top_ks=None, float? top_p=None, Tensor? top_ps=None, float? min_p=None, "
         "Tensor? min_ps=None, int? seed=None, Tensor? seeds=None, int? offset=None, "
         "Tensor? offsets=None, bool tokens_i32=False, bool logp=True, bool logp_filtered=False, "
         "bool threshold=False, int? logprob_block=None, int? logprob_unroll=None, int? row_split=None, "
         "bool? pdl=None) -> (Tensor, Tensor, Tensor, Tensor)", _sample_fake)
def _sample_op(logits, *, tokens_i32=False, logp=True, logp_filtered=False, threshold=False, **kw):
    for scalar, tensor in _SETTINGS:
        t = kw.pop(tensor, None)
        if t is not None:
            kw[scalar] = t
    out = _raw["sample"](logits, token_dtype="i32" if tokens_i32 else "i64", logp=logp,
                         logp_filtered=logp_filtered, threshold=threshold, **kw)
    return out.tokens, _or_empty(out.logp, logits.new_empty(_EMPTY, dtype=_F32)), \
        _or_empty(out.logp_filtered, logits.new_empty(_EMPTY, dtype=_F32)), \
        _or_empty(out.threshold, logits.new_empty(_EMPTY, dtype=_F32))


def _signed64(name, v):
    """A 64-bit seed or offset as the schema's signed int (the library reads the same bits);
    refused as rlk.sample refuses it where wider than 64 bits."""
    v = _sample._u64(name, v)
    return v - (1 << 64) if v >= 1 << 63 else v


def sample(logits, *, tokens=None, token_dtype="i64", logp=True, logp_filtered=False, threshold=False,
           status=None, stream=None, **kw):
    """rlk.sample under torch.compile."""
    _no_stream("sample", stream)
    _eager_only("sample", {"tokens": tokens, "status": status}, ("tokens", "status"))
    if logp not in (True, False) or logp_filtered not in (True, False) or threshold not in (True, False):
        raise InvalidArgument("sample: preallocated logp and threshold outputs are eager-only")
    for scalar, tensor in _SETTINGS:
        v = kw.get(scalar)
        if isinstance(v, torch.Tensor):
            kw[scalar] = None
            kw[tensor] = v
        elif v is not None and scalar in ("seed", "offset"):
            kw[scalar] = _signed64(scalar, v)
    if kw.get("row_split") == "auto":
        kw["row_split"] = _sample.SAMPLE_ROW_SPLIT_AUTO
    toks, lp, lpf, thr = _sample_op(logits, tokens_i32=token_dtype in ("i32", T.DType.I32),
                                    logp=logp, logp_filtered=logp_filtered, threshold=threshold, **kw)
    return _sample.SampleResult(toks, lp if logp else None, lpf if logp_filtered else None,
                                thr if threshold else None)


# ---- prefix-shared attention -----------------------------------------------------------------

# (seq_offsets, group_offsets) -> PrefixLayout: its device copies made once for the forward and
# the backward of a step; a few recent ones kept (each step's batch has its own layout)
_LAYOUTS = collections.OrderedDict()
_KEPT_LAYOUTS = 16


def _layout(seq, grp):
    """The PrefixLayout of host i32 offset tensors (the operators' arguments)."""
    key = (tuple(seq.tolist()), tuple(grp.tolist()))
    layout = _LAYOUTS.get(key)
    try:  # each step atomic; another thread's trim may have dropped the key between them
        if layout is None:
            layout = _LAYOUTS[key] = _pa.PrefixLayout(*key)
            while len(_LAYOUTS) > _KEPT_LAYOUTS:
                _LAYOUTS.popitem(last=False)
        else:
            _LAYOUTS.move_to_end(key)
    except KeyError:
        pass
    return layout


def _offsets(layout):
    """A layout's offsets as the operators take them: host i32 tensors, values that a compiled
    graph reads as data (a list of ints would be guarded on, a new graph per layout)."""
    t = layout.host_tensors
    if t is None:
        t = layout.host_tensors = (torch.tensor(layout.seq, dtype=torch.int32),
                                   torch.tensor(layout.grp, dtype=torch.int32))
    return t


def _prefix_attention_fake(q, k, v, seq_offsets, group_offsets, *, scale=None):
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[1]), dtype=_F32)


@_define("prefix_attention",
         "(Tensor q, Tensor k, Tensor v, Tensor seq_offsets, Tensor group_offsets, *, "
         "float? scale=None) -> (Tensor, Tensor)", _prefix_attention_fake)
def _prefix_attention_op(q, k, v, seq_offsets, group_offsets, *, scale=None):
    out = _raw["prefix_attention"](q, k, v, _layout(seq_offsets, group_offsets), scale=scale)
    return out.out, out.lse


def _prefix_attention_setup(ctx, inputs, output):
    q, k, v, seq, grp, scale = inputs
    out, lse = output
    ctx.layout, ctx.scale = (seq, grp), scale
    ctx.nargs = _nargs(_prefix_attention_op)
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.mark_non_differentiable(lse)


def _prefix_attention_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _prefix_attention_backward_op(q, k, v, ctx.layout[0], ctx.layout[1], out, lse,
                                               grad_out.contiguous(), scale=ctx.scale)
    return (dq, dk, dv) + _none(ctx.nargs - 3)


def _prefix_attention_backward_fake(q, k, v, seq_offsets, group_offsets, out, lse, grad_out, *,
                                    scale=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@_define("prefix_attention_backward",
         "(Tensor q, Tensor k, Tensor v, Tensor seq_offsets, Tensor group_offsets, Tensor out, "
         "Tensor lse, Tensor grad_out, *, float? scale=None) -> (Tensor, Tensor, Tensor)",
         _prefix_attention_backward_fake)
def _prefix_attention_backward_op(q, k, v, seq_offsets, group_offsets, out, lse, grad_out, *,
                                  scale=None):
    return _raw["prefix_attention_backward"](q, k, v, _layout(seq_offsets, group_offsets), out,
                                             lse, grad_out, scale=scale)


_prefix_attention_op.register_autograd(_prefix_attention_backward,
                                       setup_context=_prefix_attention_setup)


def prefix_attention(q, k, v, layout, *, scale=None, lse=True, out=None, stream=None):
    """rlk.prefix_attention under torch.compile (differentiable in q, k and v)."""
    _no_stream("prefix_attention", stream)
    _eager_only("prefix_attention", {"out": out}, ("out",))
    seq, grp = _offsets(layout)
    o, l = _prefix_attention_op(q, k, v, seq, grp, scale=None if scale is None else float(scale))
    return _pa.PrefixAttentionResult(o, l if lse else None)


def prefix_attention_backward(q, k, v, layout, out, lse, grad_out, *, scale=None, stream=None):
    """rlk.prefix_attention_backward under torch.compile."""
    _no_stream("prefix_attention_backward", stream)
    seq, grp = _offsets(layout)
    return _prefix_attention_backward_op(q, k, v, seq, grp, out, lse, grad_out,
                                         scale=None if scale is None else float(scale))


OPS = {name: getattr(torch.ops.rlk, name) for name in _raw}
"""Every registered operator by name (torch.ops.rlk.<name>)."""

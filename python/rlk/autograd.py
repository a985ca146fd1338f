"""torch.autograd wrappers for the ops that have a backward (imports torch).

A trainer swaps its torch loss for rlk's by changing the call:

    from rlk.autograd import policy_loss
    loss, metrics = policy_loss(logp, old_logp, advantages, mask, clip_low=0.2, clip_high=0.28)
    loss.backward()          # logp.grad = the fused gradient times the incoming gradient

The forward runs the fused forward + backward kernel once and keeps the gradient; backward only
scales it by the incoming gradient (one elementwise multiply, no second pass over the inputs).
Keyword arguments are those of rlk.policy_loss / rlk.value_loss. Tensors other than the
differentiable ones are constants of the loss (as the advantages and old log-probs are).

Under torch.compile each wrapper calls its torch.library operator instead (rlk.torch_ops: the
same kernels, their gradients registered with torch.library), so a compiled step has no graph
break; eager calls go through the autograd.Functions below, which cost less per call.
"""
import functools

import torch

from . import torch_ops as _traced
from ._tensor import is_torch
from .errors import InvalidArgument
from .ops import linear_divergence as _divergence
from .ops import linear_logprob as _linear
from .ops import logprob as _logprob
from .ops import vocab_parallel as _vocab_parallel
from .ops import losses
from .ops import prefix_attention as _pattn
from .ops import token_kl as _token_kl

__all__ = ["PolicyLoss", "ValueLoss", "TokenLogprob", "LinearTokenLogprob",
           "VocabParallelTokenLogprob", "PrefixAttention", "TokenKL", "policy_loss", "value_loss",
           "token_logprob", "linear_token_logprob", "vocab_parallel_token_logprob",
           "prefix_attention", "token_kl", "LinearDivergence", "linear_divergence",
           "linear_divergence_loss"]


def _first_order(backward):
    """A Function's backward whose gradients are not themselves differentiable (the kernels run
    outside autograd): under create_graph it raises rather than hand back gradients whose own
    gradient would silently be 0."""
    @functools.wraps(backward)
    def first_order(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError("rlk.autograd: %s has no double backward (its gradient is not "
                               "differentiable); call backward without create_graph"
                               % backward.__qualname__.split(".")[0])
        return backward(ctx, *grads)
    return first_order


# The functional calls a Function's forward and backward make (eagerly: torch.compile traces the
# operators of rlk.torch_ops instead, see the wrappers below).
_policy_loss = losses.policy_loss
_value_loss = losses.value_loss
_logprob_fwd = _logprob.logprob
_logprob_bwd = _logprob.logprob_backward
_linear_fwd = _linear.linear_logprob
_linear_bwd = _linear.linear_logprob_backward


# Whether the running backward keeps its graph (retain_graph): where it does not, no later
# backward reads a Function's kept gradients, which may then be scaled in place (an allocation
# less a step). Torch's own query where it has one; else always out of place.
_keeps_graph = getattr(getattr(torch._C, "_autograd", None), "_get_current_graph_task_keep_graph",
                       lambda: True)


def _scaled(g, grad, last=False):
    """The kept gradient `grad` times the incoming one `g` (None: no gradient reached the loss);
    in place where `last` (nothing reads `grad` after this backward)."""
    if grad is None or g is None:
        return None
    g = g if g.dtype is grad.dtype else g.to(grad.dtype)
    return grad.mul_(g) if last else grad * g


class PolicyLoss(torch.autograd.Function):
    """(logp, entropy or None, keyword dict) -> (loss [], metrics [16]); differentiable in
    logp and in entropy (when entropy_coef != 0). Given a list as a fourth argument, the
    metrics (which have no gradient) are appended to it and the loss alone is returned: one
    output costs autograd less bookkeeping per call (what policy_loss below does)."""

    @staticmethod
    def forward(ctx, logp, entropy, kwargs, metrics=None):
        # kwargs: the caller's keywords, "metrics" and "scalar_loss" already taken out. Outputs
        # apart: autograd's bookkeeping for outputs that are views of one buffer costs more
        # than the allocations saved. (forward runs without grad: the inputs need no detach)
        ctx.set_materialize_grads(False)
        out = _policy_loss(logp, entropy=entropy, metrics=True, scalar_loss=True, apart=True,
                           **kwargs)
        # the fused gradients are neither inputs nor outputs: kept on ctx, not packed as saved
        # variables (backward lets go of them)
        ctx.grad_logp, ctx.grad_entropy = out.grad_logp, out.grad_entropy
        return _one_or_both(ctx, out.loss, out.metrics, metrics)

    @staticmethod
    @_first_order
    def backward(ctx, grad_loss, *grad_metrics):
        last = not _keeps_graph()
        gl, ge = ctx.grad_logp, ctx.grad_entropy
        if last:  # the returned gradients are then the only references (none kept on ctx)
            ctx.grad_logp = ctx.grad_entropy = None
        return _scaled(grad_loss, gl, last), _scaled(grad_loss, ge, last), None, None


class ValueLoss(torch.autograd.Function):
    """(values, keyword dict) -> (loss [], metrics [4]); differentiable in values. Given a list
    as a third argument, the metrics are appended to it and the loss alone is returned."""

    @staticmethod
    def forward(ctx, values, kwargs, metrics=None):
        ctx.set_materialize_grads(False)
        out = _value_loss(values, metrics=True, scalar_loss=True, apart=True, **kwargs)
        ctx.grad = out.grad_values
        return _one_or_both(ctx, out.loss, out.metrics, metrics)

    @staticmethod
    @_first_order
    def backward(ctx, grad_loss, *grad_metrics):
        last = not _keeps_graph()
        g = ctx.grad
        if last:
            ctx.grad = None
        return _scaled(grad_loss, g, last), None, None


def _one_or_both(ctx, loss, metrics, box):
    """A fused loss's outputs: the loss alone with the metrics put in `box`, or both."""
    if box is not None:
        box.append(metrics)
        return loss
    ctx.mark_non_differentiable(metrics)
    return loss, metrics


class TokenLogprob(torch.autograd.Function):
    """(logits [N, V], labels [N], keyword dict) -> (logp [N], entropy [N] or None), f32;
    differentiable in the logits through rlk_logprob_backward (one more read of the logits)."""

    @staticmethod
    def forward(ctx, logits, labels, kwargs):
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
        want_entropy = kwargs.get("entropy", False)
        ctx.inplace = kwargs.get("inplace_backward", False)
        ctx.upstream = _f32
        if len(kwargs) == ("entropy" in kwargs) + ("inplace_backward" in kwargs):
            ctx.kw = _NO_KEYWORDS  # no keyword of rlk.logprob's: the common case
            out = _logprob_fwd(logits, labels, entropy=want_entropy, lse=True)
        else:
            kw = dict(kwargs)
            kw.pop("entropy", None)
            kw.pop("inplace_backward", None)
            own = [k for k in ("lse", "logp") if k in kw]
            if own:  # the function keeps the lse for the backward and makes logp itself
                raise InvalidArgument("rlk.autograd.token_logprob: %s= is the function's own" % own[0])
            ctx.kw = {k: kw[k] for k in _LOGPROB_SETTINGS if k in kw}
            out = _logprob_fwd(logits, labels, entropy=want_entropy, lse=True, **kw)
        return _logprob_outputs(ctx, out, want_entropy, logits, labels)

    @staticmethod
    @_first_order
    def backward(ctx, grad_logp, grad_entropy):
        g = _logprob_grads(ctx, grad_logp, grad_entropy, ctx.upstream)
        if g is None:
            return None, None, None
        (logits, labels), lse, g_lp, g_h, entropy = g
        grad = _logprob_bwd(logits, labels, lse, grad_logp=g_lp, grad_entropy=g_h, entropy=entropy,
                            inplace=ctx.inplace, **ctx.kw)
        return grad, None, None


# the keywords of rlk.logprob that its backward takes too
_LOGPROB_SETTINGS = ("temperature", "ignore_index", "status", "variant", "block", "unroll", "stages",
                     "threshold")
_NO_KEYWORDS = {}  # read only


def _logprob_outputs(ctx, out, want_entropy, *inputs):
    """A token log-prob forward's end: the inputs, lse and entropy saved for the backward;
    returns (logp, entropy or None)."""
    ctx.save_for_backward(*inputs, out.lse, out.entropy)
    return out.logp, out.entropy if want_entropy else None


def _logprob_grads(ctx, grad_logp, grad_entropy, upstream):
    """A token log-prob backward's inputs: None when neither output has a gradient, else (the
    forward's inputs, lse, the upstream gradients of logp and of the entropy (upstream() of each;
    that of the entropy only where the forward kept it), the entropy the backward reads (None
    without its gradient))."""
    *inputs, lse, entropy = ctx.saved_tensors
    if grad_logp is None and grad_entropy is None:
        return None
    g_lp = upstream(grad_logp)
    g_h = upstream(grad_entropy) if entropy is not None else None
    return inputs, lse, g_lp, g_h, entropy if g_h is not None else None


def _f32(g):
    """An upstream gradient as f32 (None stays None), any stride: rlk_logprob_backward reads a
    broadcast one (the expanded ones of logp.sum().backward()) as it is, with no copy."""
    if g is None or g.dtype is _float32:
        return g
    return g.float()


class LinearTokenLogprob(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], labels [N], keyword dict) -> (logp [N], entropy [N] or None),
    f32, for logits = hidden @ weight.T never stored (rlk_linear_logprob); differentiable in hidden
    and weight through rlk_linear_logprob_backward (the logits recomputed chunk by chunk).
    Gradients come in the inputs' dtype, accumulated in f32 inside the kernels."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, kwargs):
        ctx.set_materialize_grads(False)
        kw = dict(kwargs)
        want_entropy = kw.pop("entropy", False)
        ctx.kw = {k: kw[k] for k in ("temperature", "ignore_index", "threshold", "rows") if k in kw}
        ctx.chunk = kw.pop("chunk", None)
        out = _linear_fwd(hidden, weight, labels, entropy=want_entropy, lse=True, **kw)
        return _logprob_outputs(ctx, out, want_entropy, hidden, weight, labels)

    @staticmethod
    @_first_order
    def backward(ctx, grad_logp, grad_entropy):
        g = _logprob_grads(ctx, grad_logp, grad_entropy, _upstream)
        if g is None:
            return None, None, None, None
        (hidden, weight, labels), lse, g_lp, g_h, entropy = g
        gh, gw = _linear_bwd(
            hidden, weight, labels, lse, g_lp, g_h, entropy, want_hidden=ctx.needs_input_grad[0],
            want_weight=ctx.needs_input_grad[1], grad_dtype="same", chunk=ctx.chunk, **ctx.kw)
        return gh, gw, None, None


class VocabParallelTokenLogprob(TokenLogprob):
    """(logits shard [N, V_shard], labels [N], keyword dict) -> (logp [N], entropy [N] or None) of
    the whole vocabulary (rlk.vocab_parallel_logprob); the backward is this shard's own
    (TokenLogprob's with vocab_start: rlk_logprob_backward's shard form), with no communication."""

    @staticmethod
    def forward(ctx, logits, labels, kwargs):
        kw = dict(kwargs)
        want_entropy = kw.pop("entropy", False)
        vocab_start = kw.pop("vocab_start", None)
        if vocab_start is None:
            import torch.distributed as dist
            vocab_start = dist.get_rank(kw.get("group")) * logits.shape[1]
        ctx.kw = {k: kw[k] for k in ("temperature", "ignore_index", "block", "unroll") if k in kw}
        ctx.kw["vocab_start"] = int(vocab_start)
        ctx.inplace = False
        ctx.upstream = _upstream
        out = _vocab_parallel.vocab_parallel_logprob(logits.detach(), labels, vocab_start,
                                                     entropy=want_entropy, lse=True, **kw)
        return _logprob_outputs(ctx, out, want_entropy, logits, labels)


def vocab_parallel_token_logprob(logits, labels, *, entropy=False, **kwargs):
    """Token log-probs (and the entropy) of the whole vocabulary from this rank's logits shard
    [..., V_shard], differentiable in the shard. Keywords: those of rlk.vocab_parallel_logprob
    (group or all_gather, vocab_start, temperature, ignore_index, ...). Returns logp, or (logp,
    entropy) with entropy=True, in the labels' shape. A row whose label is ignore_index has
    log-prob and entropy 0, neither with a gradient."""
    _require_torch("vocab_parallel_token_logprob", logits)
    shape = tuple(labels.shape)
    flat = _rows(logits)
    kwargs.update(entropy=entropy)
    logp, ent = VocabParallelTokenLogprob.apply(flat, _flat(labels), kwargs)
    if entropy:
        return _shaped(logp, shape), _shaped(_unscored(ent, labels, kwargs), shape)
    return _shaped(logp, shape)


class PrefixAttention(torch.autograd.Function):
    """(q, k, v, layout, scale) -> out; differentiable in q, k and v (rlk_prefix_attention and
    its backward; lse is saved, not the attention matrix)."""

    @staticmethod
    def forward(ctx, q, k, v, layout, scale):
        out, lse = _pattn.prefix_attention(q.detach(), k.detach(), v.detach(), layout, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.scale = layout, scale
        return out

    @staticmethod
    @_first_order
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _pattn.prefix_attention_backward(q.detach(), k.detach(), v.detach(), ctx.layout, out,
                                                      lse, grad_out.contiguous(), scale=ctx.scale)
        return dq, dk, dv, None, None


class TokenKL(torch.autograd.Function):
    """(logp, ref_logp, keyword dict) -> kl; differentiable in logp and ref_logp (the negated
    gradient) through a second rlk_token_kl call with the incoming gradient (nothing of the
    forward is kept but its inputs)."""

    @staticmethod
    def forward(ctx, logp, ref_logp, kwargs):
        ctx.kw = kwargs
        ctx.save_for_backward(logp, ref_logp)
        # the value alone: what shapes only the gradient waits for the backward
        value_kw = {k: v for k, v in kwargs.items() if k not in ("straight_through", "old_logp", "is_weight_max")}
        return _token_kl.token_kl(logp.detach(), ref_logp.detach(), outputs="kl", **value_kw)

    @staticmethod
    @_first_order
    def backward(ctx, grad_kl):
        logp, ref_logp = ctx.saved_tensors
        if grad_kl is None or not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
            return None, None, None
        g = grad_kl if grad_kl.dtype is logp.dtype else grad_kl.to(logp.dtype)
        if not g.is_contiguous():  # e.g. the expanded ones of kl.sum().backward()
            g = g.contiguous()
        grad = _token_kl.token_kl(logp.detach(), ref_logp.detach(), outputs="grad", grad_kl=g, **ctx.kw)
        return (grad if ctx.needs_input_grad[0] else None,
                -grad if ctx.needs_input_grad[1] else None, None)


_compiling = torch.compiler.is_compiling
_Tensor = torch.Tensor
_float32 = torch.float32


# Reshapes only where the shape changes: each view is one more node the backward walks.
def _rows(x):
    """x [..., C] as [N, C]."""
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _flat(x):
    return x if x.dim() == 1 else x.reshape(-1)


def _shaped(x, shape):
    return x if x.shape == shape else x.view(shape)


def _upstream(g):
    """An upstream gradient as the f32 [N] with a positive stride the library reads."""
    if g is None:
        return None
    g = g.float()
    return g if g.stride(0) > 0 else g.contiguous()


def _require_torch(op, x):
    if not isinstance(x, _Tensor) and not is_torch(x):
        raise InvalidArgument("rlk.autograd.%s: expects torch tensors (use rlk.%s for numpy)" % (
            op, op))


def policy_loss(logp, old_logp, advantages, mask=None, *, entropy=None, **kwargs):
    """The policy loss as a differentiable torch scalar. Returns (loss, metrics): metrics is a
    tensor in the order of rlk.POLICY_LOSS_METRICS (rlk.metrics_dict names them)."""
    kwargs.pop("metrics", None)
    kwargs.pop("scalar_loss", None)
    if _compiling():
        out = _traced.policy_loss(logp, old_logp, advantages, mask, entropy=entropy,
                                  scalar_loss=True, **kwargs)
        return out.loss, out.metrics
    _require_torch("policy_loss", logp)
    kwargs.update(old_logp=old_logp, advantages=advantages, mask=mask)
    metrics = []
    loss = PolicyLoss.apply(logp, entropy, kwargs, metrics)
    return loss, metrics[0]


def value_loss(values, old_values, returns, mask=None, **kwargs):
    """The clipped value loss as a differentiable torch scalar. Returns (loss, metrics), metrics
    in the order of rlk.VALUE_LOSS_METRICS."""
    kwargs.pop("metrics", None)
    kwargs.pop("scalar_loss", None)
    if _compiling():
        out = _traced.value_loss(values, old_values, returns, mask, scalar_loss=True, **kwargs)
        return out.loss, out.metrics
    _require_torch("value_loss", values)
    kwargs.update(old_values=old_values, returns=returns, mask=mask)
    metrics = []
    loss = ValueLoss.apply(values, kwargs, metrics)
    return loss, metrics[0]


def token_logprob(logits, labels, *, entropy=False, inplace_backward=False, **kwargs):
    """Token log-probs (and the entropy) from logits [..., V] and labels [...], differentiable in
    the logits. Returns logp (labels' shape, f32), or (logp, entropy) with entropy=True.
    inplace_backward=True writes the gradient over the logits (saves [N, V] of memory; the
    logits must not be needed afterwards). Keywords: those of rlk.logprob. A row whose label is
    ignore_index has log-prob and entropy 0, neither with a gradient."""
    if not _compiling():
        _require_torch("token_logprob", logits)
    shape = tuple(labels.shape)
    flat = _rows(logits)
    if _compiling():  # the gradient is written apart from the logits there
        out = _traced.logprob(flat, _flat(labels), entropy=entropy, **kwargs)
        logp, ent = out.logp, out.entropy
    else:
        kwargs.update(entropy=entropy, inplace_backward=inplace_backward)
        logp, ent = TokenLogprob.apply(flat, _flat(labels), kwargs)
    if entropy:
        return _shaped(logp, shape), _shaped(_unscored(ent, labels, kwargs), shape)
    return _shaped(logp, shape)


def _unscored(ent, labels, kwargs):
    """The entropy with an ignored row's 0: the ops compute it there, but their backward gives
    ignored rows no gradient, so the value would have none."""
    ignore = kwargs.get("ignore_index")  # None (or absent): the ops' default, -100
    return ent.masked_fill(_flat(labels) == (-100 if ignore is None else int(ignore)), 0.0)


def linear_token_logprob(hidden, weight, labels, *, entropy=False, **kwargs):
    """Token log-probs (and the entropy) of logits = hidden @ weight.T without storing them:
    hidden [..., H] and weight [V, H] (bf16 or f16, an LM head's layout), labels [...];
    differentiable in hidden and weight. Returns logp (labels' shape, f32), or (logp, entropy)
    with entropy=True. Keywords: temperature, ignore_index, variant, splits, threshold
    (rlk.linear_logprob: kept-set replay), rows (rlk.linear_logprob's row selection: labels are
    then the selected rows', hidden's gradient has hidden's shape, 0 in the rows not selected) and
    chunk (the backward's vocabulary chunk). A row whose label is ignore_index has log-prob and
    entropy 0, neither with a gradient."""
    if not _compiling():
        _require_torch("linear_token_logprob", hidden)
    shape = tuple(labels.shape)
    flat = _rows(hidden)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    if _compiling():
        chunk = kwargs.pop("chunk", None)
        if chunk is not None:
            raise InvalidArgument("rlk.autograd.linear_token_logprob: chunk= is eager-only")
        out = _traced.linear_logprob(flat, weight, _flat(labels), entropy=entropy, **kwargs)
        logp, ent = out.logp, out.entropy
    else:
        kwargs.update(entropy=entropy)
        logp, ent = LinearTokenLogprob.apply(flat, weight, _flat(labels), kwargs)
    if entropy:
        return _shaped(logp, shape), _shaped(_unscored(ent, labels, kwargs), shape)
    return _shaped(logp, shape)


def prefix_attention(q, k, v, layout, *, scale=None):
    """Prefix-shared attention over a packed GRPO batch (rlk.prefix_layout / rlk.pack_grpo),
    differentiable in q [T, Hq, D], k and v [T, Hkv, D]. Returns out [T, Hq, D]."""
    if _compiling():
        return _traced.prefix_attention(q, k, v, layout, scale=scale).out
    _require_torch("prefix_attention", q)
    return PrefixAttention.apply(q, k, v, layout, scale)


def token_kl(logp, ref_logp, estimator="k3", **kwargs):
    """Per-token KL estimates (rlk.token_kl's keywords, outputs aside) as a differentiable torch
    tensor of logp's shape: the gradient in logp is the op's (straight-through when asked), in
    ref_logp its negation; mask, old_logp and the importance weight are constants."""
    for k in ("outputs", "grad_kl", "kl", "grad_logp"):
        if k in kwargs:
            raise InvalidArgument("rlk.autograd.token_kl: %s is not a keyword here" % k)
    if _compiling():
        return _traced.token_kl(logp, ref_logp, estimator, **kwargs)
    _require_torch("token_kl", logp)
    kwargs["estimator"] = estimator
    return TokenKL.apply(logp, ref_logp, kwargs)


# ---- two heads: on-policy distillation ----

_div_fwd = _divergence.linear_divergence
_div_bwd = _divergence.linear_divergence_backward
# the forward's keywords that the backward takes too (the divergence's settings)
_DIV_SETTINGS = ("mode", "beta", "top_k", "temperature", "student_temperature",
                 "teacher_temperature", "labels", "ignore_index")


def _div_grads(ctx, heads, stats, g):
    """The backward of sum_i g_i D_i into new gradients of the heads that need them, each in its
    own dtype (accumulated in f32 inside the kernels)."""
    need = ctx.needs_input_grad[:4]
    if g is None or not any(need):
        return (None,) * 4
    grads = [torch.empty(x.shape[0], x.shape[1], dtype=x.dtype, device=x.device) if n else None
             for x, n in zip(heads, need)]
    _div_bwd(*heads, stats, g, student=False, teacher=False, grad_student_hidden=grads[0],
             grad_student_weight=grads[1], grad_teacher_hidden=grads[2],
             grad_teacher_weight=grads[3], chunk=ctx.chunk, **ctx.kw)
    return tuple(grads)


def _div_labels(kwargs, shape):
    """labels of the rows' leading shape as the [N] the library reads (one row a token)."""
    labels = kwargs.get("labels")
    if labels is not None and is_torch(labels) and tuple(labels.shape) == shape:
        kwargs["labels"] = _flat(labels)


class LinearDivergence(torch.autograd.Function):
    """(student_hidden [N, H_s], student_weight [V, H_s], teacher_hidden [N, H_t], teacher_weight
    [V, H_t], keyword dict) -> (divergence [N], entropy [N] or None), f32, neither head's logits
    stored (rlk_linear_divergence); differentiable in each head's tensors that require grad
    (a frozen teacher's get none), through rlk_linear_divergence_backward. The entropy (the
    student's) has no gradient. With the dict's "loss" true, the first output is instead the
    aggregated loss [] (rlk.linear_divergence's loss keywords)."""

    @staticmethod
    def forward(ctx, student_hidden, student_weight, teacher_hidden, teacher_weight, kwargs):
        ctx.set_materialize_grads(False)
        kw = dict(kwargs)
        ctx.chunk = kw.pop("chunk", None)
        want_loss = bool(kw.get("loss", False))
        ctx.kw = {k: kw[k] for k in _DIV_SETTINGS if k in kw}
        out = _div_fwd(student_hidden, student_weight, teacher_hidden, teacher_weight, **kw)
        ctx.save_for_backward(student_hidden, student_weight, teacher_hidden, teacher_weight,
                              out.stats, out.grad_divergence)
        if out.entropy is not None:
            ctx.mark_non_differentiable(out.entropy)
        return (out.loss.view(()) if want_loss else out.divergence), out.entropy

    @staticmethod
    @_first_order
    def backward(ctx, grad_out, grad_entropy):
        sh, sw, th, tw, stats, weights = ctx.saved_tensors
        if grad_out is None:
            return (None,) * 5
        # the loss's gradient per token is its aggregation weight times the incoming gradient
        g = _upstream(grad_out) if weights is None else weights * grad_out.float()
        return (*_div_grads(ctx, (sh, sw, th, tw), stats, g), None)


@torch.compiler.disable
def linear_divergence(student_hidden, student_weight, teacher_hidden, teacher_weight, *,
                      entropy=False, **kwargs):
    """The per-token divergence of the student's next-token distribution from the teacher's
    (rlk.linear_divergence's keywords: mode, beta, top_k, temperature, student_temperature,
    teacher_temperature, labels, ignore_index, variant, splits; and chunk, the backward's
    vocabulary chunk), from student_hidden [..., H_s] / student_weight [V, H_s] and
    teacher_hidden [..., H_t] / teacher_weight [V, H_t] (labels [N] or of the rows' leading
    shape), differentiable in the tensors that require grad (a frozen teacher: none of its).
    Returns the divergence (the rows' leading shape, f32), or (divergence, the student's entropy)
    with entropy=True. torch.compile runs it eagerly (a graph break)."""
    _require_torch("linear_divergence", student_hidden)
    shape = tuple(student_hidden.shape[:-1])
    sh, th = _rows(student_hidden), _rows(teacher_hidden)
    _div_labels(kwargs, shape)
    kwargs.update(entropy=entropy, loss=False)
    div, ent = LinearDivergence.apply(sh, student_weight, th, teacher_weight, kwargs)
    if entropy:
        return _shaped(div, shape), _shaped(ent, shape)
    return _shaped(div, shape)


@torch.compiler.disable
def linear_divergence_loss(student_hidden, student_weight, teacher_hidden, teacher_weight,
                           mask=None, *, entropy=False, **kwargs):
    """The loss over the tokens, loss_scale * agg(divergence), as a differentiable scalar: the
    divergence as rlk.autograd.linear_divergence computes it (its keywords), aggregated as
    rlk.policy_loss aggregates a term (agg, mask [B, T] over the rows or [N], seq_offsets,
    token_normalizer, seq_normalizer, norm_scale, loss_scale; default token-mean). Returns the
    loss, or (loss, the student's entropy [N]) with entropy=True."""
    _require_torch("linear_divergence_loss", student_hidden)
    sh, th = _rows(student_hidden), _rows(teacher_hidden)
    _div_labels(kwargs, tuple(student_hidden.shape[:-1]))
    kwargs.update(entropy=entropy, loss=True, mask=mask)
    loss, ent = LinearDivergence.apply(sh, student_weight, th, teacher_weight, kwargs)
    return (loss, ent) if entropy else loss

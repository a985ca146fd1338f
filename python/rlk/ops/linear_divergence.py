"""Divergences between a student's and a teacher's LM heads from their hidden states (on-policy
distillation): rlk_linear_divergence, its backward and the vocab-parallel combine.

student_hidden [N, H_s] and student_weight [V, H_s], teacher_hidden [N, H_t] and teacher_weight
[V, H_t] (bf16 or f16; a head's two in one dtype; rows contiguous, any row stride). Per token,
without ever storing either head's logits: the forward KL(p_t || p_s), the reverse KL(p_s || p_t),
the generalized JSD with mixture (1 - beta) p_s + beta p_t, or the forward KL over the teacher's
top k; the student's entropy; and the loss over the tokens with rlk's aggregations. rlk.h has the
formulas, the stats the backward reads and the record of the shard form.
"""
import collections

from .. import _types as T
from .._tensor import Binder, Op, dim, f32
from ..errors import InvalidArgument
from . import losses as _losses

__all__ = ["DivergenceMode", "LinearDivergenceArgs", "LinearDivergenceBackwardArgs",
           "LinearDivergenceCombineArgs", "LinearDivergenceResult", "STATS", "TOP_K_MAX",
           "PARTIAL_FIELDS", "linear_divergence", "linear_divergence_backward",
           "linear_divergence_partials", "linear_divergence_combine"]

STATS = T.c_constant("RLK_LINEAR_DIVERGENCE_STATS")
TOP_K_MAX = T.c_constant("RLK_LINEAR_DIVERGENCE_TOP_K_MAX")
PARTIAL_FIELDS = T.c_constant("RLK_LINEAR_DIVERGENCE_PARTIAL_FIELDS")


DivergenceMode = T.c_enum("DivergenceMode", "rlk_divergence_mode", "RLK_DIVERGENCE_")


LinearDivergenceArgs = T.c_struct("rlk_linear_divergence_args")
LinearDivergenceBackwardArgs = T.c_struct("rlk_linear_divergence_backward_args")
LinearDivergenceCombineArgs = T.c_struct("rlk_linear_divergence_combine_args")


OP = Op("linear_divergence", LinearDivergenceArgs, workspace=True,
         shared=("student_weight", "teacher_weight", "seq_offsets", "loss", "token_normalizer_tensor",
                 "seq_normalizer_tensor"))
BACKWARD_OP = Op("linear_divergence_backward", LinearDivergenceBackwardArgs, workspace=True,
                 shared=("student_weight", "teacher_weight", "grad_student_weight", "grad_teacher_weight"))
COMBINE_OP = Op("linear_divergence_combine", LinearDivergenceCombineArgs, rows_at={"partials": 1})

_HEADS = (T.DType.BF16, T.DType.F16)
_LABELS = (T.DType.I32, T.DType.I64)
_F32 = (T.DType.F32,)

LinearDivergenceResult = collections.namedtuple(
    "LinearDivergenceResult", "divergence stats entropy loss grad_divergence")


def _heads(b, a, student_hidden, student_weight, teacher_hidden, teacher_weight, mode, beta,
           top_k, temperature, student_temperature, teacher_temperature, labels, ignore_index):
    """The two heads and the divergence's settings into a; returns the two heads' rlk dtypes.
    temperature sets both sides' (student_temperature / teacher_temperature override it)."""
    sdt = b.set("student_hidden", student_hidden, _HEADS)
    b.set("student_weight", student_weight, _HEADS)
    tdt = b.set("teacher_hidden", teacher_hidden, _HEADS)
    b.set("teacher_weight", teacher_weight, _HEADS)
    b.set("labels", labels, _LABELS, optional=True)
    if temperature is not None:
        a.student_temperature = a.teacher_temperature = f32("temperature", temperature)
    if student_temperature is not None:
        a.student_temperature = f32("student_temperature", student_temperature)
    if teacher_temperature is not None:
        a.teacher_temperature = f32("teacher_temperature", teacher_temperature)
    if mode is not None:
        a.mode = T.enum_value(DivergenceMode, mode, "%s: mode" % b.name)
    if beta is not None:
        a.beta = float(beta)
    if top_k is not None:
        T.set_int(a, "top_k", top_k)
    if ignore_index is not None:
        T.set_int(a, "ignore_index", ignore_index)
    return sdt, tdt


def _outputs(b, n, entropy):
    """The per-token outputs for n tokens: divergence, stats and (entropy=True) entropy."""
    div = b.set_new("divergence", b.empty((n,), T.DType.F32), T.DType.F32, (n,))
    stats = b.set_new("stats", b.empty((n, STATS), T.DType.F32), T.DType.F32, (n, STATS))
    ent = b.set_new("entropy", b.empty((n,), T.DType.F32), T.DType.F32, (n,)) if entropy else None
    return div, stats, ent


def _launch(b, variant, splits, stream):
    """The forward's kernel choices (None: the library's), its workspace and the launch."""
    if variant is not None:
        T.set_int(b.args, "variant", variant)
    if splits is not None:
        T.set_int(b.args, "splits", splits)
    b.bind_workspace()
    b.run(stream)


def linear_divergence(student_hidden, student_weight, teacher_hidden, teacher_weight, *,
                      mode="forward_kl", beta=None, top_k=None, temperature=None,
                      student_temperature=None, teacher_temperature=None, labels=None,
                      ignore_index=None, entropy=False, loss=False, mask=None, seq_offsets=None,
                      agg=None, token_normalizer=None, seq_normalizer=None, norm_scale=None,
                      loss_scale=None, variant=None, splits=None, stream=None):
    """The per-token divergence of the student's next-token distribution from the teacher's
    (rlk_linear_divergence), with z = hidden @ weight.T / temperature on each side, accumulated in
    f32 on a GPU (fp64 on the host), neither head's logits stored.

    mode: "forward_kl" (KL(p_t || p_s), default), "reverse_kl" or "jsd" (beta in (0, 1), default
    0.5); top_k: the forward KL over the teacher's top k tokens (1 to 32). temperature: both sides'
    (student_temperature / teacher_temperature: each its own; default 1). labels [N] (i32 or i64)
    with ignore_index (default -100): those rows get 0 and no gradient. entropy=True: the student's
    entropy too. loss=True: also loss_scale * agg(divergence) [1] and its gradient d loss / d
    divergence [N] (rlk.policy_loss's aggregation: agg, mask [B, T] with B T = N or [N],
    seq_offsets for packed sequences, token_normalizer, seq_normalizer, norm_scale). Returns
    LinearDivergenceResult(divergence [N], stats [N, 6] (the backward's input), entropy or None,
    loss or None, grad_divergence or None), f32."""
    b = Binder(OP)
    a = b.args
    _heads(b, a, student_hidden, student_weight, teacher_hidden, teacher_weight, mode, beta,
           top_k, temperature, student_temperature, teacher_temperature, labels, ignore_index)
    n = dim(student_hidden, 0)
    div, stats, ent = _outputs(b, n, entropy)
    out_loss = grad = None
    if loss:
        out_loss = b.set_new("loss", b.empty((1,), T.DType.F32), T.DType.F32, (1,))
        grad = b.set_new("grad_divergence", b.empty((n,), T.DType.F32), T.DType.F32, (n,))
        b.set("mask", mask, optional=True)
        b.set("seq_offsets", seq_offsets, _LABELS, optional=True)
        _losses._set_agg(b, agg, token_normalizer, seq_normalizer, norm_scale, loss_scale)
    _launch(b, variant, splits, stream)
    return LinearDivergenceResult(div, stats, ent, out_loss, grad)


def linear_divergence_backward(student_hidden, student_weight, teacher_hidden, teacher_weight,
                               stats, grad_divergence, *, mode="forward_kl", beta=None,
                               top_k=None, temperature=None, student_temperature=None,
                               teacher_temperature=None, labels=None, ignore_index=None,
                               student=True, teacher=False, grad_student_hidden=None,
                               grad_student_weight=None, grad_teacher_hidden=None,
                               grad_teacher_weight=None, want_hidden=True, want_weight=True,
                               accumulate=False, grad_dtype="f32", chunk=None, shard=False,
                               vocab_start=0, stream=None):
    """The gradients of sum_i g_i D_i (g = grad_divergence, f32 [N]) with respect to the student's
    hidden states and head (student=True) and the teacher's (teacher=True), from the forward's
    stats, the logits recomputed chunk by chunk (rlk_linear_divergence_backward). The settings
    must be the forward's. Given gradient tensors are written (or added to with accumulate=True);
    missing ones are made in grad_dtype ("f32" or "same": the head's dtype) where asked for
    (want_hidden, want_weight). shard=True: the weights are the rows [vocab_start, ...) of both
    heads and stats the combined ones. Returns (grad_student_hidden, grad_student_weight,
    grad_teacher_hidden, grad_teacher_weight), None where not asked."""
    b = Binder(BACKWARD_OP)
    a = b.args
    sdt, tdt = _heads(b, a, student_hidden, student_weight, teacher_hidden, teacher_weight, mode,
                      beta, top_k, temperature, student_temperature, teacher_temperature, labels,
                      ignore_index)
    b.set("stats", stats, _F32)
    b.set("grad_divergence", grad_divergence, _F32)
    grads = [grad_student_hidden, grad_student_weight, grad_teacher_hidden, grad_teacher_weight]
    shapes = [(student_hidden, 0, student_hidden), (student_weight, 0, student_hidden),
              (teacher_hidden, 0, teacher_hidden), (teacher_weight, 0, teacher_hidden)]
    names = ("grad_student_hidden", "grad_student_weight", "grad_teacher_hidden",
             "grad_teacher_weight")
    if grad_dtype not in ("f32", "same"):
        raise InvalidArgument("rlk.linear_divergence_backward: grad_dtype %r is not 'f32' or 'same'"
                              % (grad_dtype,))
    for q in range(4):
        side = student if q < 2 else teacher
        want = want_hidden if q % 2 == 0 else want_weight
        if grads[q] is None and side and want:
            rows, _, cols = shapes[q]
            dt = (sdt if q < 2 else tdt) if grad_dtype == "same" else T.DType.F32
            # a gradient added to one made here starts at 0
            grads[q] = (b.zeros if accumulate else b.empty)((dim(rows, 0), dim(cols, 1)), dt)
        b.set(names[q], grads[q], optional=True, output=True)
    a.accumulate = 1 if accumulate else 0
    if chunk is not None:
        T.set_int(a, "chunk", chunk)
    a.shard = 1 if shard else 0
    T.set_int(a, "vocab_start", vocab_start)
    b.bind_workspace()
    b.run(stream)
    return tuple(grads)


def linear_divergence_partials(student_hidden, student_weight, teacher_hidden, teacher_weight,
                               vocab_start, *, mode="forward_kl", temperature=None,
                               student_temperature=None, teacher_temperature=None,
                               partials=None, variant=None, splits=None, stream=None):
    """This shard's records (rlk_linear_divergence's shard form, forward or reverse KL): the
    weights hold the rows [vocab_start, vocab_start + V_shard) of both heads. partials: an optional
    f32 [N, 8] output (contiguous, 16-byte aligned), e.g. this rank's slice of an all-gather
    buffer. The gathered records merge with linear_divergence_combine (in rank order). Returns the
    f32 [N, 8] records."""
    b = Binder(OP)
    a = b.args
    _heads(b, a, student_hidden, student_weight, teacher_hidden, teacher_weight, mode, None, None,
           temperature, student_temperature, teacher_temperature, None, None)
    T.set_int(a, "vocab_start", vocab_start)
    if partials is None:
        partials = b.empty((dim(student_hidden, 0), PARTIAL_FIELDS), T.DType.F32)
    b.set("partials", partials, _F32, output=True)
    _launch(b, variant, splits, stream)
    return partials


def linear_divergence_combine(partials, *, mode="forward_kl", labels=None, ignore_index=None,
                              entropy=False, stream=None):
    """The shards' records [P, N, 8] (rank order) merged into the whole vocabulary's
    (rlk_linear_divergence_combine). Returns LinearDivergenceResult(divergence, stats, entropy or
    None, None, None); the backward is linear_divergence_backward(..., shard=True) with these
    stats."""
    b = Binder(COMBINE_OP)
    a = b.args
    b.set("partials", partials, _F32)
    b.set("labels", labels, _LABELS, optional=True)
    a.mode = T.enum_value(DivergenceMode, mode, "%s: mode" % b.name)
    if ignore_index is not None:
        T.set_int(a, "ignore_index", ignore_index)
    div, stats, ent = _outputs(b, dim(partials, 1), entropy)
    b.run(stream)
    return LinearDivergenceResult(div, stats, ent, None, None)

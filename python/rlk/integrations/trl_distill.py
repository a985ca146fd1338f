"""TRL's on-policy distillation (trl.trainer.distillation_trainer.DistillationTrainer) on rlk: its
per-token divergence and the student's entropy from both models' hidden states through rlk's
two-head kernels (rlk.linear_divergence), behind TRL's own seam, the ChunkedDivergenceFunction
that the trainer's _chunked_divergence_loss calls. Tested against TRL 1.16.0.

    ChunkedDivergence.apply(...)   # ChunkedDivergenceFunction's signature and results
    patch()                        # DistillationTrainer's divergence on rlk; undo(), .report

TRL's beta 0 is the forward KL(p_t || p_s), 1 the reverse KL(p_s || p_t), anything between the
generalized JSD with mixture (1 - beta) p_s + beta p_t: rlk's three modes. One temperature for
both sides, each side's logit_scale folded into its own temperature (T / scale). The operands are
each head's 16-bit dtype, or under autocast the autocast dtype (as TRL's own projections round
them); the gradients flow to the student only (TRL's), in its tensors' dtypes, accumulated in f32
inside the kernels. A head with a bias or a logit softcap, or f32 heads without autocast, stay
TRL's (divergence_calls counts both).
"""
import collections

import torch

from ..ops import linear_divergence as _ld
from . import _head
from ._common import Patch, all_or_nothing, check_version, stand_in, trainer_own

__all__ = ["ChunkedDivergence", "divergence_calls", "TESTED", "patch"]

TESTED = ("1.16.0",)

# divergence calls of the patched seam, by who computed them ("rlk", or "trl: <why>")
divergence_calls = collections.Counter()


def _mode(beta):
    beta = float(beta)
    if beta == 0.0:
        return "forward_kl", 0.5
    if beta == 1.0:
        return "reverse_kl", 0.5
    return "jsd", beta


class _TwoHeads(torch.autograd.Function):
    """(student hidden [N, H_s], weight, teacher hidden [N, H_t], weight, the two compute dtypes,
    settings) -> (divergence [N], entropy [N]), f32; differentiable in the student's hidden states
    and weight. Saves the inputs, not rounded copies: the backward rounds them again."""

    @staticmethod
    def forward(ctx, sh, sw, th, tw, sdt, tdt, kw):
        ctx.set_materialize_grads(False)
        heads = _TwoHeads._rounded(sh, sw, th, tw, sdt, tdt)
        out = _ld.linear_divergence(*heads, entropy=True, **kw)
        ctx.save_for_backward(sh, sw, th, tw, out.stats)
        ctx.dtypes, ctx.kw = (sdt, tdt), kw
        ctx.mark_non_differentiable(out.entropy)
        return out.divergence, out.entropy

    @staticmethod
    def _rounded(sh, sw, th, tw, sdt, tdt):
        return (sh.detach().to(sdt).contiguous(), sw.detach().to(sdt), th.detach().to(tdt).contiguous(),
                tw.detach().to(tdt))

    @staticmethod
    def backward(ctx, grad_divergence, _):
        sh, sw, th, tw, stats = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if grad_divergence is None or not (want_h or want_w):
            return (None,) * 7
        sdt, tdt = ctx.dtypes
        # gradients of 16-bit inputs in their dtype; of f32 ones (rounded for the kernels) in f32
        same = sh.dtype is sdt and sw.dtype is sdt
        gh, gw, _, _ = _ld.linear_divergence_backward(
            *_TwoHeads._rounded(sh, sw, th, tw, sdt, tdt), stats,
            grad_divergence.float().contiguous(), want_hidden=want_h, want_weight=want_w,
            grad_dtype="same" if same else "f32", **ctx.kw)
        return (None if gh is None else gh.to(sh.dtype), None if gw is None else gw.to(sw.dtype),
                None, None, None, None, None)


def _unfused(sh, sw, sb, th, tw, tb, s_scale, s_softcap, t_scale, t_softcap):
    """Why a call stays TRL's (None: rlk computes it), and else the two compute dtypes."""
    if sb is not None or tb is not None:
        return "an LM head with a bias", None, None
    if s_softcap is not None or t_softcap is not None:
        return "a logit softcap", None, None
    if not (float(s_scale) > 0 and float(t_scale) > 0):
        return "logit_scale %r / %r" % (s_scale, t_scale), None, None
    if sh.shape[0] == 0:
        return "no token", None, None
    if sh.device.type not in ("cpu", "cuda"):
        return "tensors on %s" % sh.device.type, None, None
    sdt, tdt = _head.operand_dtype(sh, sw), _head.operand_dtype(th, tw)
    if sdt is None or tdt is None:
        return "an f32 head without autocast", None, None
    return None, sdt, tdt


class ChunkedDivergence:
    """Stands where trl.trainer.distillation_trainer imported TRL's ChunkedDivergenceFunction:
    the same arguments and results (per-token divergence, differentiable in the student; the
    student's entropy, without gradient), computed by rlk where it expresses the call, by TRL's
    own function otherwise."""
    own = None

    @classmethod
    def apply(cls, student_hidden, student_weight, student_bias, teacher_hidden, teacher_weight,
              teacher_bias, beta, temperature=1.0, student_logit_scale=1.0,
              student_final_logit_softcapping=None, teacher_logit_scale=1.0,
              teacher_final_logit_softcapping=None):
        why, sdt, tdt = _unfused(student_hidden, student_weight, student_bias, teacher_hidden,
                                 teacher_weight, teacher_bias, student_logit_scale,
                                 student_final_logit_softcapping, teacher_logit_scale,
                                 teacher_final_logit_softcapping)
        if why is not None:
            divergence_calls["trl: " + why] += 1
            return cls.own.apply(student_hidden, student_weight, student_bias, teacher_hidden,
                                 teacher_weight, teacher_bias, beta, temperature,
                                 student_logit_scale, student_final_logit_softcapping,
                                 teacher_logit_scale, teacher_final_logit_softcapping)
        divergence_calls["rlk"] += 1
        mode, b = _mode(beta)
        kw = dict(mode=mode, beta=b,
                  student_temperature=float(temperature) / float(student_logit_scale),
                  teacher_temperature=float(temperature) / float(teacher_logit_scale))
        # a frozen teacher: nothing of the teacher's reaches the graph
        return _TwoHeads.apply(student_hidden, student_weight, teacher_hidden.detach(),
                               teacher_weight.detach(), sdt, tdt, kw)


def patch(*, force=False):
    """Swaps rlk's two-head divergence into TRL's DistillationTrainer, behind its seam (the
    ChunkedDivergenceFunction of trl.trainer.distillation_trainer). Refuses a TRL other than
    TESTED unless force. Returns a handle: undo() restores TRL's; .report says what was swapped
    and what was left, and why."""
    from trl.trainer import distillation_trainer as D
    h = Patch()
    with all_or_nothing(h):
        h.report["version"] = check_version("trl", TESTED, force)
        ChunkedDivergence.own = trainer_own(D.ChunkedDivergenceFunction)
        h.set(D, "ChunkedDivergenceFunction", stand_in(ChunkedDivergence, ChunkedDivergence.own))
        h.swapped("DistillationTrainer per-token divergence and student entropy (two-head fused)")
        h.left("a head with a bias or a logit softcap, f32 heads without autocast",
               "not fused by rlk: TRL's ChunkedDivergenceFunction (divergence_calls counts them)")
        h.left("which rows reach the heads",
               "TRL's _chunked_divergence_loss (all rows off Triton devices)")
        h.left("GKDTrainer (trl.experimental.gkd)", "its generalized_jsd_loss takes logits the model "
               "already materialized, not hidden states")
        h.left("teacher gradients", "TRL's teacher is frozen")
    return h

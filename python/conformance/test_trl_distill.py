"""rlk.integrations.trl_distill beside TRL's own ChunkedDivergenceFunction (the installed package,
unchanged) on the same inputs: each beta (forward KL, reverse KL, generalized JSD), temperatures,
logit scales, heads of different widths, bf16 heads and f32 ones under autocast; the per-token
divergence, the student's entropy and the student's gradients. Then TRL's own
_chunked_divergence_loss with the seam patched against it unpatched, the calls rlk leaves to TRL,
and the version check.

TRL's chunked path on the CPU projects in f32 and folds its statistics in f32; rlk's host backend
computes in fp64 and rounds once. Each comparison's bound is TRL's arithmetic (see _bounds), with
the magnitudes taken from an fp64 evaluation of the divergence's definition."""
import math

import numpy as np
import pytest
import torch

import trainers  # noqa: F401

CD = pytest.importorskip("trl.kernels.chunked_divergence")
D = pytest.importorskip("trl.trainer.distillation_trainer")

from rlk.integrations import trl_distill as rd  # noqa: E402
from rlk.integrations._common import UntestedVersion  # noqa: E402

U = 2.0 ** -24    # f32's unit roundoff
U16 = 2.0 ** -8   # bf16's


def gamma(n):
    return n * U / (1 - n * U)


@pytest.fixture
def rng():
    return np.random.default_rng(int.from_bytes(__import__("os").urandom(4), "little"))


def heads(rng, N=6, V=509, Hs=24, Ht=32, dtype=torch.bfloat16, scale=2.0):
    """Student and teacher hidden states [N, H] ~ N(0, 1) and heads [V, H] with logits of spread
    `scale`, in `dtype`; the student's require grad."""
    def t(shape, sd):
        return torch.from_numpy(rng.standard_normal(shape) * sd).to(dtype)
    sh, sw = t((N, Hs), 1.0), t((V, Hs), scale / math.sqrt(Hs))
    th, tw = t((N, Ht), 1.0), t((V, Ht), scale / math.sqrt(Ht))
    return sh.requires_grad_(True), sw.requires_grad_(True), th, tw


def reference(sh, sw, th, tw, beta, Ts, Tt, g):
    """fp64 from the definitions, with what the bounds need: D and the entropy; dD/dz_s per column
    times g; each row's sensitivities S = sum_v |dD/dz_v| (student's and teacher's logits) and
    the entropy's; the logits' absolute dot-product sums; the log-probabilities."""
    h, w = sh.detach().double(), sw.detach().double()
    zs = (h @ w.T / Ts).requires_grad_(True)
    zt = (th.detach().double() @ tw.detach().double().T / Tt).requires_grad_(True)
    ls, lt = zs.log_softmax(-1), zt.log_softmax(-1)
    if beta == 0.0:
        Dv = (lt.exp() * (lt - ls)).sum(-1)
    elif beta == 1.0:
        Dv = (ls.exp() * (ls - lt)).sum(-1)
    else:
        lm = torch.logaddexp(ls + math.log(1 - beta), lt + math.log(beta))
        Dv = beta * (lt.exp() * (lt - lm)).sum(-1) + (1 - beta) * (ls.exp() * (ls - lm)).sum(-1)
    ent = -(ls.exp() * ls).sum(-1)
    dzs, dzt = torch.autograd.grad(Dv.sum(), (zs, zt), retain_graph=True)
    (dhs,) = torch.autograd.grad(ent.sum(), zs)
    ps, pt = ls.detach().exp(), lt.detach().exp()
    lb = 0.0 if beta in (0.0, 1.0) else abs(math.log(beta)) + abs(math.log(1 - beta))
    return dict(
        D=Dv.detach(), ent=ent.detach(), dz=dzs * g.double()[:, None], ps=ps, pt=pt,
        S_s=dzs.abs().sum(-1), S_t=dzt.abs().sum(-1), S_H=dhs.abs().sum(-1),
        abs_s=h.abs() @ w.abs().T / Ts, abs_t=th.detach().double().abs() @ tw.detach().double().abs().T / Tt,
        lse_s=torch.logsumexp(zs.detach(), -1), lse_t=torch.logsumexp(zt.detach(), -1),
        gap=(ls - lt).detach().abs() + lb, zs=zs.detach())


def _bounds(ref, V, Hs, Ht, g, dz_rounded):
    """TRL's errors, per row and per column, from its f32 arithmetic (rlk's fp64 adds only its
    final rounding, counted by the callers):
      a logit: an f32 mm (gamma_H sum |h w| / T) and two scalings (2 u |z|): e, the largest a side;
      D (or the entropy) from logits within e: at most S_s e_s + S_t e_t to first order (S the
        fp64 sum of |dD/dz|; x1.5 holds the higher orders of an e near 1e-5);
      its sums over V columns in f32: gamma_(V+8) of their terms' absolute sum, at most
        sum_v (p_s + p_t) (|log p_s - log p_t| + |log beta| + |log(1 - beta)|) + 2 (the
        normalizers), and the last few operations' roundings, 4 u (|lse_s| + |lse_t| + |D| + 1);
      a column's gradient dz: its probabilities move with the logits and normalizers (relative
        2 (e_s + e_t) + 2 gamma_(V+8) + 4 u (|lse_s| + |lse_t|)), times (p_s + p_t) and a factor
        that holds the rest of each mode's form (1 + |log p_s - log p_t| + |D|), x2.2 for the JSD's
        log m and second orders, times the row's incoming gradient g; then TRL rounds dz (which
        holds g already) to the operands' 16-bit dtype (dz_rounded).
    Returns (D's bound, the entropy's, the columns' [N, V])."""
    zmax = ref["zs"].abs()
    e_s = (gamma(Hs) * ref["abs_s"]).amax(-1) + 2 * U * zmax.amax(-1)
    e_t = (gamma(Ht) * ref["abs_t"]).amax(-1) + 2 * U * zmax.amax(-1)
    gV = gamma(V + 8)
    terms = ((ref["ps"] + ref["pt"]) * ref["gap"]).sum(-1) + 2
    last = 4 * U * (ref["lse_s"].abs() + ref["lse_t"].abs() + ref["D"].abs() + 1)
    row_D = 1.5 * (ref["S_s"] * e_s + ref["S_t"] * e_t) + gV * terms + last
    ez = (ref["ps"] * ref["zs"].abs()).sum(-1)
    row_H = 1.5 * ref["S_H"] * e_s + gV * (ez + 2) + 4 * U * (ref["lse_s"].abs() + ez + ref["ent"].abs() + 1)
    rel = 2 * (e_s + e_t) + 2 * gV + 4 * U * (ref["lse_s"].abs() + ref["lse_t"].abs())
    col = 2.2 * rel[:, None] * (ref["ps"] + ref["pt"]) * (1 + ref["gap"] + ref["D"].abs()[:, None])
    col = col * g.double().abs()[:, None] + (U16 if dz_rounded else U) * ref["dz"].abs()
    return row_D, row_H, col


def trl_and_rlk(sh, sw, th, tw, beta, T, s_scale, t_scale, g, autocast=False):
    outs = []
    for fn in (CD.ChunkedDivergenceFunction, rd.ChunkedDivergence):
        a, b = sh.detach().clone().requires_grad_(True), sw.detach().clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            div, ent = fn.apply(a, b, None, th, tw, None, beta, T, s_scale, None, t_scale, None)
        (div * g).sum().backward()
        outs.append((div.detach().double(), ent.detach().double(), a.grad.double(), b.grad.double()))
    return outs


@pytest.mark.parametrize("beta", (0.0, 1.0, 0.5, 0.2))
@pytest.mark.parametrize("T,s_scale,t_scale", ((1.0, 1.0, 1.0), (0.7, 1.5, 0.8)))
@pytest.mark.parametrize("autocast", (False, True))
def test_chunked_divergence(beta, T, s_scale, t_scale, autocast, rng):
    dtype = torch.float32 if autocast else torch.bfloat16
    sh, sw, th, tw = heads(rng, dtype=dtype)
    N, V, Hs, Ht = sh.shape[0], sw.shape[0], sh.shape[1], th.shape[1]
    g = torch.from_numpy(rng.uniform(0.5, 1.5, N)).float()
    # the operands both compute with (under autocast: the inputs rounded to bf16)
    r16 = [x.detach().to(torch.bfloat16) for x in (sh, sw, th, tw)]
    ref = reference(*r16, beta, T / s_scale, T / t_scale, g)
    (tD, tH, tgh, tgw), (rD, rH, rgh, rgw) = trl_and_rlk(sh, sw, th, tw, beta, T, s_scale, t_scale, g,
                                                          autocast)
    assert rd.divergence_calls["rlk"] > 0
    row_D, row_H, col = _bounds(ref, V, Hs, Ht, g, dz_rounded=True)
    what = "beta %s T %s scales %s/%s autocast %s" % (beta, T, s_scale, t_scale, autocast)
    assert ((rD - tD).abs() <= U * ref["D"].abs() + row_D).all(), (what, rD, tD, row_D)
    assert ((rH - tH).abs() <= U * ref["ent"].abs() + row_H).all(), (what, rH, tH, row_H)
    # the student's gradients: both round their output to the inputs' dtype (bf16: U16 each)
    uo = U if autocast else U16
    h16, w16 = r16[0].double(), r16[1].double()
    Ts = T / s_scale
    bh = col @ w16.abs() / Ts + uo * (tgh.abs() + rgh.abs())
    bw = col.T @ h16.abs() / Ts + uo * (tgw.abs() + rgw.abs())
    assert ((rgh - tgh).abs() <= bh * 1.01 + 1e-30).all(), (what, (rgh - tgh).abs().max(), bh.max())
    assert ((rgw - tgw).abs() <= bw * 1.01 + 1e-30).all(), (what, (rgw - tgw).abs().max(), bw.max())


@pytest.mark.parametrize("beta", (0.0, 0.5, 1.0))
def test_chunked_divergence_loss_patched(beta, rng):
    """TRL's own _chunked_divergence_loss (its masking, reduction and num_items_in_batch) with the
    seam patched, against the same function unpatched."""
    B, K = 2, 5
    sh, sw, th, tw = heads(rng, N=B * K, V=257, Hs=16, Ht=20)
    mask = torch.from_numpy(rng.random((B, K)) < 0.7)
    mask[0, 0] = True
    res = []
    for patched in (False, True):
        a, b = sh.detach().clone().requires_grad_(True), sw.detach().clone().requires_grad_(True)
        h = rd.patch() if patched else None
        try:
            calls = rd.divergence_calls["rlk"]
            loss, ent_sum, n = D._chunked_divergence_loss(a.view(B, K, -1), th.view(B, K, -1), b, tw, mask,
                                                          beta, num_items_in_batch=7, temperature=0.9)
            if patched:
                assert rd.divergence_calls["rlk"] == calls + 1
        finally:
            if h is not None:
                h.undo()
        loss.backward()
        res.append((loss.detach().double(), ent_sum.double(), int(n), a.grad.double(), b.grad.double()))
    assert D.ChunkedDivergenceFunction is CD.ChunkedDivergenceFunction
    (tl, te, tn, tgh, tgw), (rl, re, rn, rgh, rgw) = res
    assert tn == rn == int(mask.sum())
    g = mask.reshape(-1).float() / 7
    ref = reference(sh, sw, th, tw, beta, 0.9, 0.9, g)
    row_D, row_H, col = _bounds(ref, sw.shape[0], sh.shape[1], th.shape[1], g, dz_rounded=True)
    m = mask.reshape(-1).double()
    # the sums over the rows: f32 additions of at most N terms, gamma_N of their absolute sum
    assert abs(rl - tl) <= (m * (U * ref["D"].abs() + row_D)).sum() / 7 + gamma(B * K + 2) * (m * ref["D"].abs()).sum() / 7
    assert abs(re - te) <= (U * ref["ent"].abs() + row_H).sum() + gamma(B * K + 2) * ref["ent"].abs().sum()
    bh = col @ sw.detach().double().abs() / 0.9 + U16 * (tgh.abs() + rgh.abs())
    assert ((rgh - tgh).abs() <= bh * 1.01 + 1e-30).all()


def test_left_to_trl(rng):
    """A biased head and a softcap stay TRL's: the very same results, counted."""
    sh, sw, th, tw = heads(rng, N=3, V=65, Hs=8, Ht=8)
    bias = torch.zeros(65, dtype=torch.bfloat16)
    before = dict(rd.divergence_calls)
    h = rd.patch()
    try:
        for kw, why in (({"student_bias": bias}, "trl: an LM head with a bias"),
                        ({"softcap": 30.0}, "trl: a logit softcap")):
            sb = kw.get("student_bias")
            sc = kw.get("softcap")
            got = D.ChunkedDivergenceFunction.apply(sh, sw, sb, th, tw, None, 0.5, 1.0, 1.0, sc, 1.0, None)
            want = CD.ChunkedDivergenceFunction.apply(sh, sw, sb, th, tw, None, 0.5, 1.0, 1.0, sc, 1.0, None)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            assert rd.divergence_calls[why] == before.get(why, 0) + 1
    finally:
        h.undo()


def test_patch_version_and_report(monkeypatch):
    h = rd.patch()
    try:
        assert D.ChunkedDivergenceFunction is rd.ChunkedDivergence
        assert h.report["version"] in rd.TESTED
        assert any("divergence" in s for s in h.report["swapped"])
        assert any("GKDTrainer" in k for k in h.report["left"])
    finally:
        h.undo()
    assert D.ChunkedDivergenceFunction is CD.ChunkedDivergenceFunction
    monkeypatch.setattr(rd, "TESTED", ("0.0.1",))
    with pytest.raises(UntestedVersion):
        rd.patch()
    rd.patch(force=True).undo()

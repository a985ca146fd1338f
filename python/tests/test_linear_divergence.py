"""rlk.linear_divergence (forward, backward, shards) against an fp64 numpy reference from the
definitions, on every place; rlk.autograd.linear_divergence against torch autograd of the same
definitions in fp64.

Bounds: the host backend computes in fp64 and rounds each output to f32 once (u |y|, u = 2^-24),
beside fp64's own error over sums of V + H terms of at most the row's magnitude M
((V + H + 16) 2^-53 M x 2^8 for the spread of a dot product's terms, as the C suite derives). A
CUDA place computes in f32: each logit within gamma_H sum |h w| / T of its exact value, its sums
over V columns within gamma_V, the exponentials within 2^-21 relative: the outputs within
8 (e + gamma_V + 2^-21) M^2, e the largest logit error (a looser, first-order bound)."""
import math

import numpy as np
import pytest

import rlk
from conftest import HAVE_TORCH

pytestmark = pytest.mark.skipif(not rlk.OPS["linear_divergence"].available(),
                                reason="the loaded librlk has no rlk_linear_divergence")

U = 2.0 ** -24


def make(rng, N, V, Hs, Ht, scale=2.0):
    f = np.float16
    sh = rng.standard_normal((N, Hs)).astype(f)
    sw = (rng.standard_normal((V, Hs)) * (scale / np.sqrt(Hs))).astype(f)
    th = rng.standard_normal((N, Ht)).astype(f)
    tw = (rng.standard_normal((V, Ht)) * (scale / np.sqrt(Ht))).astype(f)
    return sh, sw, th, tw


def log_softmax(z):
    m = z.max(-1, keepdims=True)
    return z - (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))


def reference(sh, sw, th, tw, mode, beta=0.5, top_k=0, Ts=1.0, Tt=1.0):
    """(D, entropy, lse_s, lse_t, M, e) per row, fp64, from the definitions; e the f32 logits'
    error bound (gamma_H sum |h w| / T, the larger side)."""
    zs = sh.astype(np.float64) @ sw.astype(np.float64).T / Ts
    zt = th.astype(np.float64) @ tw.astype(np.float64).T / Tt
    ls, lt = log_softmax(zs), log_softmax(zt)
    ps, pt = np.exp(ls), np.exp(lt)
    if top_k:
        order = np.lexsort((np.broadcast_to(np.arange(zt.shape[1]), zt.shape), -zt), axis=-1)
        inside = np.zeros_like(zt, bool)
        np.put_along_axis(inside, order[:, :top_k], True, axis=-1)
        D = np.where(inside, pt * (lt - ls), 0.0).sum(-1)
    elif mode == "forward_kl":
        D = (pt * (lt - ls)).sum(-1)
    elif mode == "reverse_kl":
        D = (ps * (ls - lt)).sum(-1)
    else:
        lm = np.logaddexp(ls + np.log1p(-beta), lt + np.log(beta))
        D = beta * (pt * (lt - lm)).sum(-1) + (1 - beta) * (ps * (ls - lm)).sum(-1)
    ent = -(ps * ls).sum(-1)
    lse_s, lse_t = (zs - ls)[:, 0], (zt - lt)[:, 0]
    M = 1 + 2 * np.maximum(np.abs(zs).max(-1), np.abs(zt).max(-1)) + np.abs(lse_s) + np.abs(lse_t) + \
        np.abs(D) + np.abs(ent)
    g = lambda n: n * U / (1 - n * U)  # noqa: E731
    e = np.maximum(g(sh.shape[1]) * (np.abs(sh.astype(np.float64)) @ np.abs(sw.astype(np.float64)).T).max(-1) / Ts,
                   g(th.shape[1]) * (np.abs(th.astype(np.float64)) @ np.abs(tw.astype(np.float64)).T).max(-1) / Tt)
    return D, ent, lse_s, lse_t, M, e


def bound(place, want, M, e, V, H):
    if place.cuda:
        g = V * U / (1 - V * U)
        return U * np.abs(want) + 8 * (e + g + 2.0 ** -21) * M * M
    return U * np.abs(want) + (V + H + 16) * 2.0 ** -53 * M * 2.0 ** 8


CASES = [("forward_kl", 0.5, 0), ("reverse_kl", 0.5, 0), ("jsd", 0.3, 0), ("jsd", 0.9, 0),
         ("forward_kl", 0.5, 7)]


@pytest.mark.parametrize("mode,beta,top_k", CASES)
def test_forward(place, rng, mode, beta, top_k):
    N, V, Hs, Ht = 6, 301, 24, 40
    sh, sw, th, tw = make(rng, N, V, Hs, Ht)
    labels = np.arange(N, dtype=np.int64)
    labels[2] = -100
    out = rlk.linear_divergence(*(place.to(a) for a in (sh, sw, th, tw)), mode=mode, beta=beta,
                                top_k=top_k, student_temperature=0.8, teacher_temperature=1.3,
                                labels=place.to(labels), entropy=True)
    # the temperatures as the library holds them (f32)
    D, ent, ls, lt, M, e = reference(sh, sw, th, tw, mode, beta, top_k, float(np.float32(0.8)),
                                     float(np.float32(1.3)))
    D[2] = 0.0
    stats = np.asarray(place.back(out.stats), np.float64)
    div, entropy = (np.asarray(place.back(x), np.float64) for x in (out.divergence, out.entropy))
    for got, want in ((div, D), (entropy, ent), (stats[:, 0], ls), (stats[:, 1], lt), (stats[:, 2], D)):
        assert (np.abs(got - want) <= bound(place, want, M, e, V, max(Hs, Ht))).all(), (got, want)


def test_loss(place, rng):
    """The loss: token-mean of D over a [B, T] mask (rlk.policy_loss's aggregation): an f32 of f64
    sums of f32 products, within 4 u of sum |w D| of the call's own D; d loss / d D = the weights."""
    B, T = 2, 4
    sh, sw, th, tw = make(rng, B * T, 65, 8, 12)
    mask = np.array([[1, 1, 0, 1], [0, 1, 1, 1]], bool)
    out = rlk.linear_divergence(*(place.to(a) for a in (sh, sw, th, tw)), mode="reverse_kl",
                                loss=True, mask=place.to(mask))
    D = np.asarray(place.back(out.divergence), np.float64)
    w = mask.reshape(-1) / mask.sum()
    want = (w * D).sum()
    assert abs(float(place.back(out.loss)[0]) - want) <= 4 * U * np.abs(w * D).sum() + U * abs(want)
    assert np.allclose(np.asarray(place.back(out.grad_divergence), np.float64), w, rtol=2 * U, atol=0)


def test_shards(place, rng):
    """Two shards' records combined: the whole vocabulary's outputs. The records round each field
    to f32, which the combine carries into lse and D within 16 u M^2 (the C suite's derivation)."""
    N, V, H = 5, 97, 16
    sh, sw, th, tw = make(rng, N, V, H, H)
    cut = 40
    recs = [rlk.linear_divergence_partials(place.to(sh), place.to(w0), place.to(th), place.to(w1), v0,
                                           mode="reverse_kl")
            for w0, w1, v0 in ((sw[:cut], tw[:cut], 0), (sw[cut:], tw[cut:], cut))]
    parts = np.stack([np.asarray(place.back(r)) for r in recs])
    out = rlk.linear_divergence_combine(place.to(parts), mode="reverse_kl", entropy=True)
    D, ent, ls, lt, M, e = reference(sh, sw, th, tw, "reverse_kl")
    tol = 16 * U * M * M + bound(place, D, M, e, V, H)
    assert (np.abs(np.asarray(place.back(out.divergence), np.float64) - D) <= tol).all()
    assert (np.abs(np.asarray(place.back(out.entropy), np.float64) - ent) <= tol).all()


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("mode,beta,top_k", CASES)
def test_autograd(host, rng, mode, beta, top_k):
    """rlk.autograd.linear_divergence beside torch autograd of the definitions in fp64 on the same
    bf16 values (host backend). The gradients come back in bf16: half an ulp (2^-8 relative) of
    their value, beside what the f32 stats the backward reads move (each within u of its value:
    a column's dz by at most 2.1 u (p_s + p_t) L (2 + |log p_s| + |log p_t| + L), L the row's
    1 + |lse_s| + |lse_t| + |D| + |log beta| + |log(1 - beta)| + its auxiliaries (< 2 + 2 |D|),
    as the C suite derives), summed with |w| / T into grad_hidden and with |h| / T into
    grad_weight. D itself: the host's fp64 rounded to f32 (bound())."""
    import torch
    import rlk.autograd as ag
    N, V, Hs, Ht, T = 5, 129, 16, 24, float(np.float32(0.9))  # T as the library holds it
    arrays = make(rng, N, V, Hs, Ht)
    sh, sw, th, tw = (torch.from_numpy(a.astype(np.float32)).bfloat16() for a in arrays)
    sh.requires_grad_(True)
    sw.requires_grad_(True)
    g = torch.from_numpy(rng.uniform(0.5, 1.5, N)).float()
    div = ag.linear_divergence(sh, sw, th, tw, mode=mode, beta=beta, top_k=top_k, temperature=T)
    (div * g).sum().backward()
    h, w = sh.detach().double().requires_grad_(True), sw.detach().double().requires_grad_(True)
    zs = (h @ w.T / T).log_softmax(-1)
    zt = (th.double() @ tw.double().T / T).log_softmax(-1)
    if top_k:
        inside = torch.zeros_like(zt, dtype=torch.bool)
        inside.scatter_(-1, zt.topk(top_k, -1).indices, True)
        D = torch.where(inside, zt.exp() * (zt - zs), torch.zeros_like(zt)).sum(-1)
    elif mode == "forward_kl":
        D = (zt.exp() * (zt - zs)).sum(-1)
    elif mode == "reverse_kl":
        D = (zs.exp() * (zs - zt)).sum(-1)
    else:
        lm = torch.logaddexp(zs + math.log(1 - beta), zt + math.log(beta))
        D = beta * (zt.exp() * (zt - lm)).sum(-1) + (1 - beta) * (zs.exp() * (zs - lm)).sum(-1)
    (D * g.double()).sum().backward()
    want_D = D.detach().numpy()
    assert (np.abs(div.detach().double().numpy() - want_D) <= U * np.abs(want_D) + 2.0 ** -30).all()
    with torch.no_grad():
        zsd, ztd = zs.detach(), zt.detach()
        lse_s = torch.logsumexp(h @ w.T / T, -1)
        lse_t = torch.logsumexp(th.double() @ tw.double().T / T, -1)
        lb = 0.0 if mode != "jsd" else abs(math.log(beta)) + abs(math.log(1 - beta))
        L = (1 + lse_s.abs() + lse_t.abs() + 3 * D.abs() + 2 + lb)[:, None]
        e = 2.1 * U * (zsd.exp() + ztd.exp()) * L * (2 + zsd.abs() + ztd.abs() + L) * g.double()[:, None]
        b_h = 2.0 ** -8 * h.grad.abs() + e @ w.detach().abs() / T
        b_w = 2.0 ** -8 * w.grad.abs() + e.T @ h.detach().abs() / T
    assert ((sh.grad.double() - h.grad).abs() <= b_h).all(), (sh.grad, h.grad)
    assert ((sw.grad.double() - w.grad).abs() <= b_w).all(), (sw.grad, w.grad)
    assert th.grad is None and tw.grad is None


def test_backward_accumulate_without_buffers(place, rng):
    """accumulate=True with no gradient buffers given: those made for the call start at 0, so the
    result is the plain call's (not whatever the reused memory held)."""
    N, V, Hs, Ht = 5, 211, 24, 16
    sh, sw, th, tw = (place.to(a) for a in make(rng, N, V, Hs, Ht))
    out = rlk.linear_divergence(sh, sw, th, tw)
    g = place.to(rng.standard_normal(N).astype(np.float32))
    plain = rlk.linear_divergence_backward(sh, sw, th, tw, out.stats, g)
    for shape in ((N, Hs), (V, Hs)):  # freed memory of the gradients' sizes, full of large values
        x = place.to(np.full(shape, 1e6, np.float32))
        del x
    acc = rlk.linear_divergence_backward(sh, sw, th, tw, out.stats, g, accumulate=True)
    for x, want in zip(acc, plain):
        if want is None:
            assert x is None
            continue
        assert np.array_equal(np.asarray(place.back(x)), np.asarray(place.back(want)))


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_autograd_labels_of_the_rows_shape(host, rng):
    """Hidden states [B, T, H] with labels [B, T]: the labels are the rows' (flattened as the rows
    are), the same bits as the flat call, ignored rows 0 with no gradient."""
    import torch
    import rlk.autograd as ag
    B, T, V, Hs, Ht = 2, 3, 37, 8, 12
    arrays = make(rng, B * T, V, Hs, Ht)
    sh, sw, th, tw = (torch.from_numpy(a.astype(np.float32)).bfloat16() for a in arrays)
    labels = torch.tensor([[1, -100, 2], [3, 4, -100]])
    grads = []
    for shaped in (True, False):
        h = (sh.view(B, T, Hs) if shaped else sh).detach().requires_grad_(True)
        lab = labels if shaped else labels.reshape(-1)
        div = ag.linear_divergence(h, sw, th.view(B, T, Ht) if shaped else th, tw, labels=lab)
        loss = ag.linear_divergence_loss(h, sw, th.view(B, T, Ht) if shaped else th, tw, labels=lab)
        (div.sum() + loss).backward()
        grads.append((div.reshape(-1).detach(), loss.detach(), h.grad.reshape(B * T, Hs)))
    for x, y in zip(*grads):
        assert torch.equal(x, y)
    assert (grads[0][0][labels.reshape(-1) == -100] == 0).all()
    assert (grads[0][2][labels.reshape(-1) == -100] == 0).all()

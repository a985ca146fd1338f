"""Kept-set replay through the package: rlk.sample's threshold=True output fed to rlk.logprob and
rlk.linear_logprob (threshold=), and rlk.autograd's gradients over the kept set, against float64
references of the documented semantics (a row's kept set: its logits at or above its threshold,
and its label). The C suite (tests/test_kept_set.c) checks the kernels' arithmetic more closely;
here the bounds are the same derivations, coarser."""
import numpy as np
import pytest

import rlk
from conftest import HAVE_TORCH

if HAVE_TORCH:
    import torch

U = 2.0 ** -24  # f32's unit roundoff


def kept_reference(x, labels, thr, T):
    """logp, lse, entropy (float64) over each row's kept set, and the kept mask."""
    x = np.asarray(x, np.float64)
    n = np.arange(x.shape[0])
    kept = (x.astype(np.float32) >= np.asarray(thr, np.float32)[:, None]) | np.isnan(thr)[:, None]
    kept[n, labels] = True
    z = np.where(kept, x / T, -np.inf)
    m = z.max(1)
    e = np.exp(z - m[:, None])
    s = e.sum(1)
    lse = m + np.log(s)
    p = e / s[:, None]
    ent = lse - (np.where(kept, p * (x / T), 0.0)).sum(1)
    return x[n, labels] / T - lse, lse, ent, kept


def fold_bound(V, *values):
    """The f32 fold of V exponentials: at most 2 V + 64 roundings of the sum relative to it (the
    kernels' chains of additions and rescalings), and 16 roundings of the row's magnitudes in the
    last operations (test_kept_set.c's ks_bounds)."""
    mag = sum(np.abs(v) for v in values) + 1.0
    return (2 * V + 64) * U + 16 * U * mag


def test_sample_threshold_replays(place, rng):
    B, V, T = 24, 3000, 0.8
    x = (2.5 * rng.standard_normal((B, V))).astype(np.float32)
    seeds = rng.integers(0, 2 ** 62, B).astype(np.int64)
    out = rlk.sample(place.to(x), temperature=T, top_k=100, top_p=0.85, seed=place.to(seeds),
                     logp_filtered=True, threshold=True)
    toks, thr = place.back(out.tokens), place.back(out.threshold)
    assert np.all(x[np.arange(B), toks] >= thr)  # the token is in its kept set
    lp = rlk.logprob(place.to(x), out.tokens, temperature=T, threshold=out.threshold, entropy=True)
    want, lse, ent, kept = kept_reference(x, toks, thr, T)
    got = place.back(lp.logp)
    assert np.all(np.abs(got - want) <= fold_bound(V, want, lse, x.max(1) / T))
    # the sampler's own log-prob over its kept set: its fixed-point masses add at most V 2^-40
    assert np.all(np.abs(place.back(out.logp_filtered) - got)
                  <= 2 * fold_bound(V, want, lse, x.max(1) / T) + V * 2.0 ** -40)
    # -inf keeps every logit: the plain call's bits
    plain = rlk.logprob(place.to(x), out.tokens, temperature=T)
    every = rlk.logprob(place.to(x), out.tokens, temperature=T,
                        threshold=place.to(np.full(B, -np.inf, np.float32)))
    assert np.array_equal(place.back(plain.logp).view(np.int32), place.back(every.logp).view(np.int32))


def test_linear_logprob_threshold(place, rng):
    N, V, H, T = 20, 700, 32, 1.1
    h = (rng.standard_normal((N, H))).astype(np.float32)
    w = (rng.standard_normal((V, H)) / np.sqrt(H) * 3).astype(np.float32)
    labels = rng.integers(0, V, N).astype(np.int64)
    if place.torch:
        hb, wb = place.to(h).to(torch.bfloat16), place.to(w).to(torch.bfloat16)
        h64 = hb.float().cpu().numpy().astype(np.float64)
        w64 = wb.float().cpu().numpy().astype(np.float64)
    else:
        pytest.skip("the fused head's 16-bit inputs come from torch here")
    x = h64 @ w64.T
    # the dot products: f32 sums of H products on a GPU (3 H u of the sum of |terms|), fp64 on
    # the host
    dot_x = 3 * H * U * (np.abs(h64) @ np.abs(w64).T).max(1)
    xs = np.sort(x, 1)
    thr = ((xs[:, -60] + xs[:, -61]) / 2).astype(np.float32)  # the top 60 kept, in the gap below
    thr[::5] = np.float32(x.max() + 1.0)                       # only the label
    # which logits a kernel keeps is its own f32 logits' compare: a row is compared where no logit
    # lies within their error (and the threshold's rounding) of the threshold
    clear = np.abs(x - thr[:, None].astype(np.float64)).min(1) > 2 * dot_x + 2 * U * np.abs(thr)
    clear[::5] = True
    assert clear.sum() >= N // 2, clear
    out = rlk.linear_logprob(hb, wb, place.to(labels), temperature=T, entropy=True,
                             threshold=place.to(thr))
    want, lse, ent, _ = kept_reference(x, labels, thr, T)
    # then the fold (the fused head's records: the logprob kernels' bound holds it)
    tol = fold_bound(V, want, lse, x.max(1) / T) + 2 * dot_x / T
    assert np.all((np.abs(place.back(out.logp) - want) <= tol)[clear])
    assert np.all((np.abs(place.back(out.lse) - lse) <= tol)[clear])


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_autograd_over_the_kept_set(place, rng):
    if not place.torch:
        pytest.skip("autograd needs torch tensors")
    from rlk.autograd import token_logprob
    N, V, T = 9, 400, 0.9
    x = (2 * rng.standard_normal((N, V))).astype(np.float32)
    labels = rng.integers(0, V, N).astype(np.int64)
    thr = np.sort(x, 1)[:, -50].astype(np.float32)
    x1 = place.to(x).requires_grad_(True)
    lp, ent = token_logprob(x1, place.to(labels), entropy=True, temperature=T, threshold=place.to(thr))
    wl, we = rng.standard_normal(N), rng.standard_normal(N)
    ((lp * place.to(wl).float()).sum() + (ent * place.to(we).float()).sum()).backward()

    x2 = torch.from_numpy(x.astype(np.float64)).requires_grad_(True)
    _, lse, _, kept = kept_reference(x, labels, thr, T)
    # off the kept set the logits sit 10^4 below (their exp is exactly 0 in float64): the same
    # softmax, with no -inf for the entropy's p log p to turn into NaN gradients
    z = torch.where(torch.from_numpy(kept), x2 / T, x2 / T - 1e4)
    ls = torch.log_softmax(z, -1)
    want_lp = ls.gather(-1, torch.from_numpy(labels)[:, None])[:, 0]
    want_ent = -(ls.exp() * ls).sum(-1)
    ((want_lp * torch.from_numpy(wl)).sum() + (want_ent * torch.from_numpy(we)).sum()).backward()
    g, want = place.back(x1.grad).astype(np.float64), x2.grad.numpy()
    assert np.all(g[~kept] == 0.0)  # off the kept set: exactly 0
    # per element: p's exponent and ex2 (2 |z - lse| / ln 2 + 8 roundings), the factor's products
    # (4 more), and the forward's lse and entropy it reads (the fold's bound), each of the terms'
    # magnitudes |g_lp| (onehot + p) + |g_H| p (|z| + |E|)
    zz = x / T
    p = np.where(kept, np.exp(zz - lse[:, None]), 0.0)
    onehot = np.zeros_like(p)
    onehot[np.arange(N), labels] = 1.0
    terms = (np.abs(wl)[:, None] * (p + onehot) + np.abs(we)[:, None] * p * (np.abs(zz) + np.abs(lse)[:, None])) / T
    tol = ((16 + 2 * np.abs(zz - lse[:, None]) / np.log(2)) * U
           + fold_bound(V, lse, zz.max(1))[:, None]) * terms
    assert np.all(np.abs(g - want) <= tol)

"""rlk.token_baseline against a numpy fp64 reference, on every place available (numpy and torch
CPU on the host backend, torch CUDA), and its error paths."""
import numpy as np
import pytest

import refs
import rlk


def reference(r, m, lp, sps, isw, offs, eps=1e-8, zero_tail=True, compact=False):
    """advantages and returns [B, T] in fp64, one group at a time."""
    r, lp, sps = (np.asarray(x, np.float64) for x in (r, lp, sps))
    mm = np.ones_like(r) if m is None else np.asarray(m, np.float64)
    ret = np.flip(np.cumsum(np.flip(r * mm, -1), -1), -1)
    w = 1.0 - 2.0 * np.exp(lp) + sps
    if isw is not None:
        w = w * np.asarray(isw, np.float64) ** 2
    W = np.cumsum(w * mm, -1)
    valid = mm != 0
    lens = valid.sum(-1)
    adv = np.zeros_like(r)
    for g in range(len(offs) - 1):
        rows = [b for b in range(offs[g], offs[g + 1]) if not compact or lens[b] > 0]
        n = len(rows)
        if n == 0:
            continue
        if compact:
            K = int(lens[rows].max())
            Gc, Wc = np.zeros((n, K)), np.zeros((n, K))
            for j, b in enumerate(rows):
                Gc[j, :lens[b]] = ret[b, valid[b]]
                Wc[j, :lens[b]] = W[b, valid[b]]
            base = (Gc * Wc).sum(0) / (Wc.sum(0) + eps) if n > 1 else np.zeros(K)
        else:
            base = ((ret[rows] * W[rows] * mm[rows]).sum(0) / ((W[rows] * mm[rows]).sum(0) + eps)
                    if n > 1 else np.zeros(r.shape[1]))
        tail = None
        if zero_tail and n > 1:
            ls = np.sort(lens[rows])
            if (lens[rows] == ls[-1]).sum() == 1 and ls[-1] > ls[-2]:
                tail = (rows[int(np.argmax(lens[rows]))], int(ls[-2]))
        for j, b in enumerate(rows):
            bb = base.copy()
            if tail is not None and tail[0] == b:
                bb[tail[1]:] = 0.0
            if compact:
                L = lens[b]
                adv[b, valid[b]] = (Gc[j, :L] - bb[:L]) * mm[b, valid[b]]
            else:
                adv[b] = (ret[b] - bb) * mm[b]
    return adv, ret


def inputs(rng, B, T, dtype, mask_kind="bool"):
    """Rewards, a mask with holes, empty rows and tied rows, old log-probs and sum pi^2 with
    w = 1 - 2 pi + sum pi^2 > 0, rollout weights."""
    r = (0.3 + rng.standard_normal((B, T))).astype(dtype)
    pi = 0.02 + 0.96 * rng.random((B, T))
    lp = np.log(pi).astype(dtype)
    sps = (pi * pi + rng.random((B, T)) * (1 - pi) ** 2).astype(dtype)
    isw = (0.5 + rng.random((B, T))).astype(dtype)
    lens = rng.integers(1, T + 1, B)
    m = (np.arange(T)[None, :] < lens[:, None]) & (rng.random((B, T)) > 0.2)
    m[rng.random(B) < 0.1] = False
    for b in range(1, B):
        if rng.random() < 0.25:
            m[b] = m[b - 1]
    if mask_kind == "bool":
        mask = m
    elif mask_kind == "i32":
        mask = m.astype(np.int32)
    elif mask_kind == "f32":
        mask = (m * (0.25 + 1.5 * rng.random((B, T)))).astype(np.float32)
    else:
        mask = None
    return r, mask, lp, sps, isw


def close(got, want, scale, tol):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    assert np.all(np.isfinite(got)), "non-finite outputs"
    err = np.abs(got - want) / (1.0 + scale)
    assert err.max() <= tol, "max scaled error %g at %s" % (err.max(), np.unravel_index(err.argmax(), err.shape))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("mask_kind", ["bool", "i32", "f32", None])
@pytest.mark.parametrize("groups", ["fixed", "i32", "i64"])
def test_matches_reference(place, rng, dtype, compact, mask_kind, groups):
    T = int(rng.integers(1, 120))
    if groups == "fixed":
        G = int(rng.integers(1, 9))
        B = G * int(rng.integers(1, 6))
        offs, kw = refs.fixed_offsets(B, G), {"group_size": G}
    else:
        B = int(rng.integers(2, 60))
        offs = refs.random_offsets(rng, B)
        kw = {"group_offsets": place.to(np.array(offs, np.int32 if groups == "i32" else np.int64))}
    r, mask, lp, sps, isw = inputs(rng, B, T, dtype, mask_kind)
    with_isw = groups != "i32"
    zero_tail = mask_kind != "i32"
    adv, ret = rlk.token_baseline(place.to(r), place.to(lp), place.to(sps),
                                  mask=None if mask is None else place.to(mask),
                                  rollout_is_weights=place.to(isw) if with_isw else None,
                                  handle_zero_tail=zero_tail, compact=compact, **kw)
    want_a, want_r = reference(r, mask, lp, sps, isw if with_isw else None, offs,
                               zero_tail=zero_tail, compact=compact)
    scale = np.abs(r).sum(-1, keepdims=True)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    close(place.back(ret), want_r, scale, tol)
    close(place.back(adv), want_a, scale * (1 + np.abs(want_a)), 10 * tol)
    got_a = place.back(adv)
    masked = (np.ones_like(r) if mask is None else np.asarray(mask)) == 0
    assert np.all(got_a[masked] == 0)


def test_preallocated_strided_outputs(host, rng):
    B, T = 12, 37
    r, mask, lp, sps, isw = inputs(rng, B, T, np.float32)
    wide_a = np.full((B, T + 5), 7.0, np.float32)
    wide_r = np.full((B, T + 5), 7.0, np.float32)
    adv, ret = rlk.token_baseline(r, lp, sps, 4, mask=mask, advantages=wide_a[:, :T],
                                  returns=wide_r[:, :T])
    want_a, want_r = reference(r, mask, lp, sps, None, refs.fixed_offsets(B, 4))
    scale = np.abs(r).sum(-1, keepdims=True)
    close(adv, want_a, scale * (1 + np.abs(want_a)), 1e-4)
    close(ret, want_r, scale, 1e-5)
    assert np.all(wide_a[:, T:] == 7.0) and np.all(wide_r[:, T:] == 7.0)


def test_errors(host, rng):
    r, mask, lp, sps, isw = inputs(rng, 8, 5, np.float32)
    with pytest.raises(rlk.InvalidArgument, match="old_logp"):
        rlk.token_baseline(r, lp.astype(np.float64), sps, 4)
    with pytest.raises(rlk.InvalidArgument, match="does not divide"):
        rlk.token_baseline(r, lp, sps, 3)
    with pytest.raises(rlk.InvalidArgument, match="exactly one"):
        rlk.token_baseline(r, lp, sps)
    with pytest.raises(rlk.InvalidArgument, match="epsilon"):
        rlk.token_baseline(r, lp, sps, 4, epsilon=-1.0)
    with pytest.raises(rlk.InvalidArgument, match="mask"):
        rlk.token_baseline(r, lp, sps, 4, mask=mask[:, :4])

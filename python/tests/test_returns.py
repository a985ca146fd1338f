"""rlk.gae, rlk.discounted_returns, rlk.reverse_cumsum, rlk.masked_whiten against fp64
references on every place."""
import numpy as np
import pytest

import refs
import rlk


def need(op):
    return pytest.mark.skipif(not rlk.OPS[op].available(),
                              reason="the loaded librlk has no rlk_%s" % op)


def batch(rng, B, T, dtype=np.float32, ragged=True):
    r = rng.standard_normal((B, T)).astype(dtype)
    v = rng.standard_normal((B, T)).astype(dtype)
    lens = rng.integers(1, T + 1, B)
    mask = np.arange(T)[None, :] < lens[:, None]
    if ragged:  # holes inside the rows too (multi-turn tool outputs)
        mask &= rng.random((B, T)) < 0.85
    return r, v, mask


def close(got, want, tol=1e-4):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape
    err = np.abs(got - want) / (1.0 + np.abs(want))
    assert np.all(np.isfinite(got)) and err.max() <= tol, "max scaled error %g" % err.max()


@need("gae")
@pytest.mark.parametrize("masked,gamma,lam", [("skip", 1.0, 1.0), ("zero", 0.99, 0.95)])
def test_gae(place, rng, masked, gamma, lam):
    r, v, mask = batch(rng, 6, 75)
    adv, ret = rlk.gae(place.to(r), place.to(v), place.to(mask), gamma=gamma, lam=lam,
                       masked=masked)
    want_adv, want_ret = refs.gae(r, v, mask, gamma, lam, masked)
    close(place.back(adv), want_adv)
    close(place.back(ret), want_ret)


@need("gae")
def test_gae_f64_no_mask_advantages_only(place, rng):
    r, v, _ = batch(rng, 3, 40, np.float64)
    adv = rlk.gae(place.to(r), place.to(v), gamma=0.9, lam=0.8, compute_returns=False,
                  algo="row-block")
    close(place.back(adv), refs.gae(r, v, None, 0.9, 0.8)[0], tol=1e-12)


@need("discounted_returns")
@pytest.mark.parametrize("masked", ["reset", "zero"])
def test_discounted_returns(place, rng, masked):
    r, _, mask = batch(rng, 5, 64)
    got = rlk.discounted_returns(place.to(r), place.to(mask), gamma=0.97, masked=masked)
    close(place.back(got), refs.discounted_returns(r, mask, 0.97, masked))


@need("reverse_cumsum")
def test_reverse_cumsum_and_remax(place, rng):
    x, _, mask = batch(rng, 4, 50)
    base = rng.standard_normal(4).astype(np.float32)
    out = rlk.reverse_cumsum(place.to(x), place.to(mask))
    close(place.back(out), refs.reverse_cumsum(x, mask))
    out, adv = rlk.reverse_cumsum(place.to(x), place.to(mask), baseline=place.to(base))
    want_out, want_adv = refs.reverse_cumsum(x, mask, base)
    close(place.back(out), want_out)
    close(place.back(adv), want_adv)


@need("masked_whiten")
@pytest.mark.parametrize("cfg", [
    dict(),                                                          # verl
    dict(eps_mode="clamp", unbiased=False, count_eps=0.0),          # OpenRLHF
    dict(shift_mean=False, masked="zero", eps=1e-5),                # TRL shift_mean=False
    dict(normalize_std=False, count_eps=0.0),
], ids=["verl", "openrlhf", "no-shift-zero", "centre-only"])
def test_masked_whiten(place, rng, cfg):
    x, _, mask = batch(rng, 8, 33)
    x = x * 3 + 1
    out, stats = rlk.masked_whiten(place.to(x), place.to(mask), stats=True, **cfg)
    want, (mean, var, n) = refs.masked_whiten(x, mask, **cfg)
    close(place.back(out), want)
    s = place.back(stats)
    assert s.dtype == np.float64 and s[2] == n
    close(s[:2], np.array([mean, var]), tol=1e-9)


@need("masked_whiten")
def test_masked_whiten_in_place(place, rng):
    x, _, mask = batch(rng, 4, 20, np.float64)
    xx = place.to(x.copy())
    out = rlk.masked_whiten(xx, place.to(mask), inplace=True)
    assert out is xx
    close(place.back(xx), refs.masked_whiten(x, mask)[0], tol=1e-12)
    assert rlk.masked_whiten(xx, place.to(mask), out=xx, inplace=True) is xx
    other = place.to(np.zeros_like(x))
    with pytest.raises(rlk.InvalidArgument, match="out and inplace"):
        rlk.masked_whiten(xx, place.to(mask), out=other, inplace=True)
    assert not place.back(other).any()  # nothing written where the call was refused


@need("masked_whiten")
def test_masked_whiten_empty_batch_stats(place):
    """No element at all, as no valid element: N 0 and mean, var NaN (rlk.h), not zeros."""
    for x, m in ((np.zeros((0, 5)), np.zeros((0, 5), bool)), (np.ones((2, 5)), np.zeros((2, 5), bool))):
        _, s = rlk.masked_whiten(place.to(x), place.to(m), stats=True)
        s = place.back(s)
        assert np.isnan(s[0]) and np.isnan(s[1]) and s[2] == 0, s


@need("gae")
def test_errors(place, rng):
    r, v, mask = batch(rng, 4, 8)
    with pytest.raises(rlk.InvalidArgument):  # dtypes differ
        rlk.gae(place.to(r), place.to(v.astype(np.float64)))
    with pytest.raises(rlk.InvalidArgument):  # shapes differ
        rlk.gae(place.to(r), place.to(v[:, :5].copy()))
    with pytest.raises(rlk.InvalidArgument, match="contiguous"):  # column-major rows
        rlk.gae(place.to(r.T.copy()).T, place.to(v))
    with pytest.raises(rlk.InvalidArgument, match="masked"):
        rlk.gae(place.to(r), place.to(v), masked="carry")

"""rlk.token_kl and rlk.autograd.token_kl against a numpy fp64 reference, on every place
available (numpy and torch CPU on the host backend, torch CUDA): every estimator, both gradient
forms, each mask kind and the clamps; torch autograd of the same formulas for the autograd
wrapper; the error paths."""
import math

import numpy as np
import pytest

import rlk

try:
    import torch

    import rlk.autograd
except ImportError:  # the autograd cases skip
    torch = None

ESTIMATORS = ("k1", "abs", "k2", "k3")


def reference(lp, ref, est, in_clamp, out_clamp, st=False, old=None, w_max=math.inf, bg=1.0):
    """(kl, d kl / d logp) in fp64; e formed in the inputs' dtype (the kernel's rounding)."""
    e = np.asarray(lp - ref, np.float64)
    lp = np.asarray(lp, np.float64)
    lo, hi = in_clamp
    ec = np.clip(e, lo, hi)
    f = {"k1": ec, "abs": np.abs(ec), "k2": 0.5 * ec * ec, "k3": np.expm1(-ec) + ec}[est]
    df = {"k1": np.ones_like(ec), "abs": np.sign(ec), "k2": ec, "k3": -np.expm1(-ec)}[est]
    olo, ohi = out_clamp
    v = np.clip(f, olo, ohi)
    if st:
        w = np.ones_like(e) if old is None else np.minimum(np.exp(lp - np.asarray(old, np.float64)), w_max)
        return v, w * e

    def gate(x, a, b):
        return np.where((x == a) | (x == b), bg, np.where((x > a) & (x < b), 1.0, 0.0))

    g = gate(e, lo, hi) * gate(f, olo, ohi)
    return v, np.where(g == 0, 0.0, g * df)


def inputs(rng, shape, dtype):
    lp = (-6.0 * rng.random(shape)).astype(dtype)
    e = np.where(rng.random(shape) < 0.6, 0.5 * rng.standard_normal(shape), rng.uniform(-25, 25, shape))
    ref = (lp - e).astype(dtype)
    old = (lp + 1.5 * rng.standard_normal(shape)).astype(dtype)
    return lp, ref, old


def make_mask(rng, shape, kind):
    m = rng.random(shape) > 0.15
    if kind == "bool":
        return m, m.astype(np.float64)
    if kind == "i32":
        v = m * rng.integers(1, 3, shape)
        return v.astype(np.int32), v.astype(np.float64)
    w = (m * (0.25 + 1.5 * rng.random(shape))).astype(np.float32)
    return w, w.astype(np.float64)


def close(got, want, dtype, scale, what):
    tol = 64 * (1e-7 if dtype == np.float32 else 2e-16)
    got = np.asarray(got, np.float64)
    err = np.abs(got - want) / (1.0 + scale)
    assert np.all(np.isfinite(got)), what + ": non-finite"
    assert err.max() <= tol, "%s: max scaled error %g at %s" % (what, err.max(), np.unravel_index(err.argmax(), err.shape))


# every estimator and gradient form; the dtypes and mask kinds in turn (the C tests cross them all)
VARIANTS = [(est, form, (np.float32, np.float64)[k % 2], (None, "bool", "i32", "f32")[k % 4])
            for k, (est, form) in enumerate((e, f) for e in ESTIMATORS
                                            for f in ("pathwise", "straight-through", "weighted"))]


@pytest.mark.parametrize("est,form,dtype,mask_kind", VARIANTS)
def test_matches_reference(place, rng, dtype, est, mask_kind, form):
    shape = (int(rng.integers(1, 9)), int(rng.integers(1, 150))) if rng.random() < 0.8 else (int(rng.integers(1, 500)),)
    lp, ref, old = inputs(rng, shape, dtype)
    clamps = [((-20, 20), (-10, 10)), ((-10, None), (-10, 10)), (None, None)][int(rng.integers(0, 3))]
    st, weighted = form != "pathwise", form == "weighted"
    g_in = rng.standard_normal(shape).astype(dtype)
    mask, mw = (None, np.ones(shape)) if mask_kind is None else make_mask(rng, shape, mask_kind)
    kl, grad = rlk.token_kl(place.to(lp), place.to(ref), est, mask=None if mask is None else place.to(mask),
                            input_clamp=clamps[0], output_clamp=clamps[1], outputs="both",
                            grad_kl=place.to(g_in), straight_through=st,
                            old_logp=place.to(old) if weighted else None, is_weight_max=10.0)

    def bounds(c):
        return (-math.inf, math.inf) if c is None else (-math.inf if c[0] is None else c[0],
                                                       math.inf if c[1] is None else c[1])
    v, d = reference(lp, ref, est, bounds(clamps[0]), bounds(clamps[1]), st=st,
                     old=old if weighted else None, w_max=10.0)
    e = np.asarray(lp, np.float64) - ref
    size = 1 + np.abs(e) + (np.exp(np.minimum(-e, 700.0)) if est == "k3" else 0.0)
    scale = size * (1 + np.abs(lp) + np.abs(ref))
    got_v, got_g = place.back(kl), place.back(grad)
    close(got_v, v * mw, dtype, scale, "kl")
    # the value's own rounding may cross an output bound and flip the gradient's gate there
    ok = np.ones(shape, bool)
    if clamps[1] is not None:
        free = reference(lp, ref, est, bounds(clamps[0]), (-math.inf, math.inf))[0]
        ok = (np.abs(free - 10) > 1e-4 * 11) & (np.abs(free + 10) > 1e-4 * 11)
    w = np.exp(np.minimum(np.asarray(lp, np.float64) - old, 10.0)) if weighted else 1.0
    close(np.where(ok, got_g, 0.0), np.where(ok, d * g_in * mw, 0.0), dtype, scale * w * (1 + np.abs(g_in)), "grad")
    assert np.all(got_v[mw == 0] == 0) and np.all(got_g[mw == 0] == 0)


def test_outputs_and_preallocated(host, rng):
    lp, ref, _ = inputs(rng, (6, 40), np.float32)
    kl = rlk.token_kl(lp, ref)  # verl's low_var_kl
    v, d = reference(lp, ref, "k3", (-20, 20), (-10, 10))
    close(kl, v, np.float32, 1 + np.abs(v), "kl")
    g = rlk.token_kl(lp, ref, outputs="grad")
    close(g, d, np.float32, 1 + np.abs(v), "grad")
    wide = np.full((6, 45), 7.0, np.float32)
    out = rlk.token_kl(lp, ref, "k1", input_clamp=None, output_clamp=None, kl=wide[:, :40])
    assert out.base is wide or np.shares_memory(out, wide)
    assert np.array_equal(wide[:, :40], lp - ref) and np.all(wide[:, 40:] == 7.0)


def test_errors(host):
    lp = np.zeros((2, 3), np.float32)
    with pytest.raises(rlk.InvalidArgument, match="outputs"):
        rlk.token_kl(lp, lp, outputs="all")
    with pytest.raises(rlk.InvalidArgument, match="estimator"):
        rlk.token_kl(lp, lp, "k4")
    with pytest.raises(rlk.InvalidArgument, match="old_logp"):
        rlk.token_kl(lp, lp, old_logp=lp, outputs="grad")
    with pytest.raises(rlk.InvalidArgument, match="ref_logp"):
        rlk.token_kl(lp, np.zeros((2, 3), np.float64))
    with pytest.raises(rlk.InvalidArgument, match="input_min"):
        rlk.token_kl(lp, lp, input_clamp=(1, -1))


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("est", ESTIMATORS)
@pytest.mark.parametrize("st", [False, True])
def test_autograd_matches_torch(place, rng, est, st):
    if not place.torch:
        pytest.skip("rlk.autograd takes torch tensors")
    B, T = 5, 33
    lp, ref, _ = inputs(rng, (B, T), np.float64)
    mask = rng.random((B, T)) > 0.2
    x, r = place.to(lp).requires_grad_(), place.to(ref).requires_grad_()
    kl = rlk.autograd.token_kl(x, r, est, mask=place.to(mask), input_clamp=(-20, 20),
                               output_clamp=(-10, 10), straight_through=st, clamp_bound_grad=0.0)
    w = torch.from_numpy(rng.standard_normal((B, T))).to(x.device)
    (kl * w).sum().backward()
    # torch's own formulas (clamp's gradient 0 on a bound in torch >= 2.x, as clamp_bound_grad)
    x2, r2 = place.to(lp).requires_grad_(), place.to(ref).requires_grad_()
    ec = torch.clamp(x2 - r2, -20, 20)
    f = {"k1": ec, "abs": ec.abs(), "k2": 0.5 * ec * ec, "k3": torch.expm1(-ec) + ec}[est]
    v = torch.clamp(f, -10, 10)
    if st:
        k2 = 0.5 * (x2 - r2) ** 2
        v = v.detach() + k2 - k2.detach()
    m = place.to(mask)
    (v * m * w).sum().backward()
    np.testing.assert_allclose(place.back(kl), place.back(v * m), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(place.back(x.grad), place.back(x2.grad), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(place.back(r.grad), place.back(r2.grad), rtol=1e-12, atol=1e-12)

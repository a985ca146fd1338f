"""Inputs for the conformance tests: fresh random batches with the edge cases the trainers must
agree on. Every case is a dict of numpy arrays plus the loss settings it needs (ties are exact:
the clip bounds are set to values the data reaches exactly)."""
import math

import numpy as np
import torch

CASES = ("holes", "empty_row", "len1", "big_ratio", "nan_masked", "ties")
B, T = 6, 9


def make(name, dtype, rng):
    dt = np.float64 if dtype == "f64" else np.float32
    lens = rng.integers(2, T + 1, B)
    mask = np.arange(T)[None, :] < lens[:, None]
    holes = rng.random((B, T)) < 0.15
    holes[:, 0] = False
    mask &= ~holes
    lp = rng.standard_normal((B, T)) * 0.5 - 2.0
    old = lp + rng.standard_normal((B, T)) * 0.3
    ref = lp + rng.standard_normal((B, T)) * 0.3
    adv_seq = rng.standard_normal(B)
    adv = adv_seq[:, None] + 0.5 * rng.standard_normal((B, T))
    ent = rng.random((B, T)) * 3
    values = rng.standard_normal((B, T))
    old_values = values + rng.standard_normal((B, T)) * 0.4
    returns = rng.standard_normal((B, T))
    rewards = rng.standard_normal((B, T)) * 0.5
    over = {}
    if name == "empty_row":
        mask[2] = False
    elif name == "len1":
        mask[0] = False
        mask[0, 0] = True
        mask[3] = False
        mask[3, 4] = True
    elif name == "big_ratio":
        for (b, t, d) in ((0, 0, 25.0), (1, 1, -30.0), (2, 0, 21.5), (4, 0, -22.0)):
            mask[b, t] = True
            old[b, t] = lp[b, t] - d
    elif name == "ties":
        mask[0, :3] = True
        mask[1, :2] = True
        # a log-ratio exactly at the clamp bound 20
        lp[0, 0], old[0, 0] = -5.0, -25.0
        # a ratio exactly at 1 + clip_high (A > 0), and one exactly at the dual clip (A < 0)
        lp[0, 1], old[0, 1] = -1.0, -1.125
        adv[0, 1] = 0.75
        lp[1, 0], old[1, 0] = -0.5, -2.0
        adv[1, 0] = -1.5
        # (exp of 0.125 and 1.5 round alike in torch and the C library, in f32 and f64)
        r_hi = float(np.exp(dt(0.125)))
        r_dual = float(np.exp(dt(1.5)))
        over = {"clip_high": r_hi - 1.0, "dual_clip": r_dual}
        # a value exactly at old + clip and one at old - clip (clip 0.5)
        values[0, 0], old_values[0, 0], returns[0, 0] = 0.75, 0.25, 2.0
        values[1, 0], old_values[1, 0], returns[1, 0] = -0.25, 0.25, -1.5
    out = {"lp": lp, "old": old, "ref": ref, "adv": adv, "adv_seq": adv_seq, "ent": ent,
           "values": values, "old_values": old_values, "returns": returns, "rewards": rewards}
    out = {k: v.astype(dt) for k, v in out.items()}
    out["mask"] = mask
    if name == "nan_masked":
        # what rlk sees: NaN where the mask is 0; the trainers see the same batch with 0 there
        # (their masked sums multiply by the mask, so a NaN there would poison them)
        out["nan"] = True
    out["over"] = over
    return out


def torch_inputs(case, keys, nan=False, requires_grad=()):
    """Torch tensors of the case's arrays (NaN at masked positions when nan), the ones named
    in requires_grad as leaves that require grad."""
    out = {}
    for k in keys:
        a = case[k].copy()
        if a.ndim == 2 and k != "mask":
            a[~case["mask"]] = np.nan if nan else 0.0
        t = torch.from_numpy(a)
        if k in requires_grad:
            t.requires_grad_(True)
        out[k] = t
    return out


def close(got, want, dtype, what, rtol=None, extra=0.0):
    """got ~ want relative to want's scale (f64: 1e-7, the trainers' 1e-8 epsilons; f32: 2e-5),
    plus extra: a bound per element (or one for all) on rounding that scale does not cover, where
    an element is a small difference of large terms."""
    rtol = rtol if rtol is not None else (1e-7 if dtype == "f64" else 2e-5)
    g = torch.as_tensor(got).detach().double()
    w = torch.as_tensor(want).detach().double()
    assert g.shape == w.shape, "%s: shape %s vs %s" % (what, tuple(g.shape), tuple(w.shape))
    assert bool(torch.isfinite(g).all()), "%s: non-finite %s" % (what, g)
    # A floor for sums that cancel: the rounding of a sum of terms of order 1 is absolute (about
    # sqrt(n) eps of the terms, 1e-6 in f32 for a few hundred tokens), however small the sum.
    scale = max(float(w.abs().max()) if w.numel() else 0.0, 1e-3 if dtype == "f64" else 1.0)
    bound = rtol * scale + torch.as_tensor(extra, dtype=torch.float64)
    excess = (g - w).abs() - bound
    if w.numel() and float(excess.max()) > 0:
        i = int(excess.flatten().argmax())
        err, lim = float((g - w).abs().flatten()[i]), float(bound.expand_as(w).flatten()[i])
        raise AssertionError("%s: error %.3g at element %d over its bound %.3g (scale %.3g)\n"
                             " rlk   %s\n train %s" % (what, err, i, lim, scale, g, w))


def close_loss(got, want, dtype, what, extra=None):
    """(loss, gradient, {metric: value}) of an adapter against the trainer's: each value, and the
    same metric names; extra: close's extra bound by name ("loss", "grad" or a metric's)."""
    extra = extra or {}
    close(got[0], want[0], dtype, what + " loss", extra=extra.get("loss", 0.0))
    close(got[1], want[1], dtype, what + " grad", extra=extra.get("grad", 0.0))
    assert set(got[2]) == set(want[2]), "%s: metrics %s vs %s" % (what, sorted(got[2]), sorted(want[2]))
    for k in want[2]:
        close(got[2][k], want[2][k], dtype, what + " " + k, extra=extra.get(k, 0.0))

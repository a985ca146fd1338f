"""rlk.linear_logprob's row selection (rows=): the selected rows' outputs bitwise those of the
call on hidden[rows] and against the fp64 reference; the backward's grad_hidden in hidden's shape
(the selected rows the gathered call's, the others 0, or untouched with accumulate=True) and
grad_weight the gathered call's; a bad index's NaN row and status bit; rlk.autograd's
linear_token_logprob with rows= against torch's index_select of hidden (values and gradients)."""
import numpy as np
import pytest

import refs
import rlk
from conftest import HAVE_TORCH

pytestmark = pytest.mark.skipif(not rlk.OPS["linear_logprob_backward"].available(),
                                reason="the loaded librlk has no rlk_linear_logprob_backward")

N, V, H = 23, 301, 45  # odd H and V


def make(rng, index_dtype, n):
    hidden = rng.standard_normal((N, H)).astype(np.float16)
    weight = (rng.standard_normal((V, H)) * (3.0 / np.sqrt(H))).astype(np.float16)
    rows = np.sort(rng.choice(N, n, replace=False)).astype(index_dtype)
    labels = rng.integers(0, V, n).astype(np.int64)
    labels[1::4] = -100
    return hidden, weight, rows, labels


def strided(place, a):
    """a in the place's memory as a view of every other element of a larger array."""
    wide = np.zeros(2 * a.shape[0], a.dtype)
    wide[::2] = a
    return place.to(wide)[::2]


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n", [1, 9, N])
def test_forward_is_the_gathered_call(place, rng, index_dtype, n):
    hidden, weight, rows, labels = make(rng, index_dtype, n)
    h, w, y = place.to(hidden), place.to(weight), place.to(labels)
    got = rlk.linear_logprob(h, w, y, entropy=True, rows=strided(place, rows))
    want = rlk.linear_logprob(place.to(np.ascontiguousarray(hidden[rows])), w, y, entropy=True)
    for a, b in zip(got, want):
        assert np.array_equal(place.back(a), place.back(b))
    z = hidden[rows].astype(np.float64) @ weight.astype(np.float64).T
    logp, lse, ent, _, _ = refs.logprob(z, labels, 1.0)
    for a, b in ((got.logp, logp), (got.lse, lse), (got.entropy, ent)):
        a = np.asarray(place.back(a), np.float64)
        assert np.abs(a - b).max() <= 2e-3 + 2e-4 * np.abs(b).max()


def test_partials_are_the_gathered_calls(place, rng):
    """The shard form with rows=: the records of the call on hidden[rows], bitwise, over two
    vocabulary shards."""
    hidden, weight, rows, labels = make(rng, np.int32, 9)
    h, r, y = place.to(hidden), place.to(rows), place.to(labels)
    gathered = place.to(np.ascontiguousarray(hidden[rows]))
    for start, stop in ((0, 150), (150, V)):
        w = place.to(np.ascontiguousarray(weight[start:stop]))
        got = rlk.linear_logprob_partials(h, w, y, start, entropy=True, rows=r)
        want = rlk.linear_logprob_partials(gathered, w, y, start, entropy=True)
        assert place.back(got).shape == (9, 4)
        assert np.array_equal(place.back(got), place.back(want))


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("grad_dtype", ["f32", "same"])
def test_backward_writes_grad_hidden_by_row(place, rng, accumulate, grad_dtype):
    hidden, weight, rows, labels = make(rng, np.int64, 11)
    h, w, y, r = place.to(hidden), place.to(weight), place.to(labels), place.to(rows)
    out = rlk.linear_logprob(h, w, y, entropy=True, rows=r)
    g_lp = place.to(rng.standard_normal(11).astype(np.float32))
    g_h = place.to(rng.standard_normal(11).astype(np.float32))
    gdt = np.float32 if grad_dtype == "f32" else np.float16
    held = rng.standard_normal((N, H)).astype(gdt) if accumulate else np.full((N, H), 7.0, gdt)
    held_w = rng.standard_normal((V, H)).astype(gdt)
    # the calls write into their gradients (a numpy place's are these arrays): each its own copy
    gh, gw = rlk.linear_logprob_backward(h, w, y, out.lse, g_lp, g_h, out.entropy, rows=r,
                                         grad_hidden=place.to(held.copy()),
                                         grad_weight=place.to(held_w.copy()), accumulate=accumulate)
    gathered = place.to(np.ascontiguousarray(hidden[rows]))
    want_h, want_w = rlk.linear_logprob_backward(
        gathered, w, y, out.lse, g_lp, g_h, out.entropy, grad_hidden=place.to(held[rows]),
        grad_weight=place.to(held_w.copy()), accumulate=accumulate)
    gh, want_h = place.back(gh), place.back(want_h)
    assert gh.shape == (N, H)
    assert np.array_equal(gh[rows], want_h)
    others = np.setdiff1d(np.arange(N), rows)
    assert np.array_equal(gh[others], held[others] if accumulate else np.zeros_like(held[others]))
    assert np.array_equal(place.back(gw), place.back(want_w))
    assert not np.array_equal(gh[rows], held[rows])


def test_bad_index_sets_the_status_bit(place, rng):
    hidden, weight, _, labels = make(rng, np.int64, 4)
    labels[:] = 5
    status = place.to(np.zeros(1, np.int32))
    out = rlk.linear_logprob(place.to(hidden), place.to(weight), place.to(labels), status=status,
                             rows=place.to(np.array([0, 4, 4, N], np.int64)))
    assert place.back(status)[0] == rlk.STATUS_BAD_ROW
    logp = place.back(out.logp)
    assert np.isfinite(logp[:2]).all() and np.isnan(logp[2:]).all()


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("entropy", [False, True])
def test_autograd_rows_is_index_select(host, rng, entropy):
    import torch
    from rlk import autograd as A
    hidden, weight, rows, labels = make(rng, np.int64, 9)
    rows_t = torch.from_numpy(rows)

    def run(select):
        h = torch.from_numpy(hidden).bfloat16().requires_grad_(True)
        w = torch.from_numpy(weight).bfloat16().requires_grad_(True)
        y = torch.from_numpy(labels)
        if select:
            out = A.linear_token_logprob(h, w, y, entropy=entropy, rows=rows_t)
        else:
            out = A.linear_token_logprob(h.index_select(0, rows_t), w, y, entropy=entropy)
        outs = out if entropy else (out,)
        loss = sum((o * torch.linspace(-1.0, 1.0, o.numel())).sum() for o in outs)
        loss.backward()
        return [o.detach() for o in outs], h.grad, w.grad

    got, got_h, got_w = run(True)
    want, want_h, want_w = run(False)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert got_h.shape == (N, H) and torch.equal(got_h, want_h)
    assert torch.equal(got_w, want_w)
    assert got_h[rows_t].abs().sum() > 0

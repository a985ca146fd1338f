"""rlk.logprob / rlk.logprob_backward against fp64 references, rlk.autograd.token_logprob
against torch's log_softmax + gather (and entropy) with autograd."""
import numpy as np
import pytest

import refs
import rlk
from conftest import HAVE_TORCH

if HAVE_TORCH:
    import torch

pytestmark = pytest.mark.skipif(not rlk.OPS["logprob"].available(),
                                reason="the loaded librlk has no rlk_logprob")
need_bwd = pytest.mark.skipif(not rlk.OPS["logprob_backward"].available(),
                              reason="the loaded librlk has no rlk_logprob_backward")


def make(rng, N=37, V=1000, ignore=True):
    logits = (rng.standard_normal((N, V)) * 2).astype(np.float32)
    labels = rng.integers(0, V, N).astype(np.int64)
    if ignore:
        labels[::7] = -100
    return logits, labels


def close(got, want, tol=1e-5):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape
    err = np.abs(got - want).max() if want.size else 0.0
    assert np.all(np.isfinite(got)) and err <= tol * max(1.0, np.abs(want).max()), "err %g" % err


def test_forward(place, rng):
    logits, labels = make(rng)
    out = rlk.logprob(place.to(logits), place.to(labels), temperature=0.7, entropy=True)
    logp, lse, ent, _, _ = refs.logprob(logits, labels, 0.7)
    close(place.back(out.logp), logp)
    close(place.back(out.lse), lse)
    close(place.back(out.entropy), ent)
    assert np.all(place.back(out.logp)[::7] == 0.0)


def test_forward_strided_rows_i32_labels(place, rng):
    wide, labels = make(rng, N=20, V=512 + 64, ignore=False)
    out = rlk.logprob(place.to(wide)[:, :512], place.to((labels % 512).astype(np.int32)),
                      lse=False)
    assert out.lse is None and out.entropy is None
    close(place.back(out.logp), refs.logprob(wide[:, :512], labels % 512)[0])


@need_bwd
def test_backward(place, rng):
    logits, labels = make(rng, N=19, V=300)
    fwd = rlk.logprob(place.to(logits), place.to(labels), temperature=1.3, entropy=True)
    g_lp = rng.standard_normal(19).astype(np.float32)
    g_h = rng.standard_normal(19).astype(np.float32)
    grad = rlk.logprob_backward(place.to(logits), place.to(labels), fwd.lse, place.to(g_lp),
                                place.to(g_h), fwd.entropy, temperature=1.3)
    close(place.back(grad), refs.logprob_grad(logits, labels, g_lp, g_h, 1.3))


def test_bad_label_sets_the_status_bit(place, rng):
    logits, labels = make(rng, N=8, V=64, ignore=False)
    labels[3] = 64
    status = place.to(np.zeros(1, np.int32))
    out = rlk.logprob(place.to(logits), place.to(labels), status=status)
    assert place.back(status)[0] & rlk.STATUS_BAD_LABEL
    logp = place.back(out.logp)
    assert np.isnan(logp[3]) and np.all(np.isfinite(np.delete(logp, 3)))


def test_errors(place, rng):
    logits, labels = make(rng, N=4, V=16)
    with pytest.raises(rlk.InvalidArgument, match="labels: dtype f32"):
        rlk.logprob(place.to(logits), place.to(labels.astype(np.float32)))
    with pytest.raises(rlk.InvalidArgument, match="logits: dtype f64"):
        rlk.logprob(place.to(logits.astype(np.float64)), place.to(labels))
    with pytest.raises(rlk.InvalidArgument):  # labels of another length
        rlk.logprob(place.to(logits), place.to(labels[:3].copy()))
    cols = np.asfortranarray(logits) if not place.torch else place.to(logits.T.copy()).T
    with pytest.raises(rlk.InvalidArgument):  # columns not contiguous
        rlk.logprob(cols, place.to(labels))
    with pytest.raises(rlk.InvalidArgument, match="temperature"):
        rlk.logprob(place.to(logits), place.to(labels), temperature=0.0)
    # the status word is one i32: the call ORs into its element 0 (an empty one would be
    # written past its end)
    for words in (0, 2):
        status = place.to(np.zeros(words, np.int32))
        with pytest.raises(rlk.InvalidArgument, match="status"):
            rlk.logprob(place.to(logits), place.to(labels), status=status)


@need_bwd
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_autograd_matches_torch(place, rng, dtype):
    if not place.torch:
        pytest.skip("autograd needs torch tensors")
    from rlk.autograd import token_logprob
    B, T, V = 3, 11, 777
    dt = getattr(torch, dtype)
    logits = place.to(rng.standard_normal((B, T, V)).astype(np.float32)).to(dt)
    labels = place.to(rng.integers(0, V, (B, T)))
    labels[0, :3] = -100
    x1 = logits.clone().requires_grad_(True)
    x2 = logits.clone().requires_grad_(True)
    lp, ent = token_logprob(x1, labels, entropy=True, temperature=0.9)
    w1 = torch.randn(B, T, device=logits.device)
    w2 = torch.randn(B, T, device=logits.device)
    ((lp * w1).sum() + (ent * w2).sum()).backward()

    z = x2.float() / 0.9
    ls = torch.log_softmax(z, -1)
    ok = labels != -100
    want_lp = torch.where(ok, ls.gather(-1, labels.clamp(min=0)[..., None])[..., 0], 0.0)
    want_ent = -(ls.exp() * ls).sum(-1)
    ((want_lp * w1).sum() + (torch.where(ok, want_ent, 0.0) * w2).sum()).backward()

    assert lp.shape == (B, T) and lp.dtype == torch.float32
    close(place.back(lp), place.back(want_lp), tol=1e-5)
    close(place.back(ent)[place.back(ok)], place.back(want_ent)[place.back(ok)], tol=1e-4)
    tol = 1e-5 if dtype == "float32" else 1e-2
    assert x1.grad.dtype == dt
    close(place.back(x1.grad.float()), place.back(x2.grad.float()), tol=tol)


@need_bwd
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_autograd_reads_a_broadcast_upstream_gradient(place, rng):
    # lp.sum().backward() hands the backward an expanded gradient (stride 0), which the library
    # reads as it is: the same gradient, bit for bit, as the same ones given contiguous
    if not place.torch:
        pytest.skip("autograd needs torch tensors")
    from rlk.autograd import token_logprob
    N, V = 9, 301
    logits = place.to(rng.standard_normal((N, V)).astype(np.float32))
    labels = place.to(rng.integers(0, V, N))
    grads = []
    for weight in (None, torch.ones(N, device=logits.device)):
        x = logits.clone().requires_grad_(True)
        lp, ent = token_logprob(x, labels, entropy=True)
        if weight is None:
            (lp.sum() + ent.sum()).backward()
        else:
            ((lp * weight).sum() + (ent * weight).sum()).backward()
        grads.append(place.back(x.grad))
    assert np.array_equal(grads[0], grads[1])
    assert np.abs(grads[0]).max() > 0


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
def test_autograd_ignored_rows_have_no_entropy_and_no_double_backward(host):
    """rlk.autograd.token_logprob and linear_token_logprob: a row whose label is ignore_index has
    log-prob and entropy 0 (the op gives it no gradient, so a value there would have none), the
    others the fp64 entropy; a backward under create_graph raises instead of handing back
    gradients whose own gradient would be 0."""
    import rlk.autograd as ag
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 11, generator=g, dtype=torch.float32, requires_grad=True)
    labels = torch.tensor([4, -100, 7])
    lp, ent = ag.token_logprob(logits, labels, entropy=True)
    p = torch.log_softmax(logits.detach().double(), -1)
    want = -(p.exp() * p).sum(-1)
    assert lp[1] == 0 and ent[1] == 0
    # the host path's entropy is fp64's rounded to f32 once (u of it; fp64's own error far below)
    err = (ent[[0, 2]].double() - want[[0, 2]]).abs()
    assert bool((err <= 2.0 ** -23 * want[[0, 2]].abs() + 1e-12).all()), err
    hidden = torch.randn(3, 16, generator=g).to(torch.bfloat16).requires_grad_(True)
    weight = (torch.randn(11, 16, generator=g) * 0.3).to(torch.bfloat16)
    lp2, ent2 = ag.linear_token_logprob(hidden, weight, labels, entropy=True)
    assert lp2[1] == 0 and ent2[1] == 0 and bool((ent2[[0, 2]] > 0).all())
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(lp.sum() + ent.sum(), logits, create_graph=True)

"""rlk.linear_logprob against an fp64 reference (the product hidden @ weight.T of the stored 16-bit
values, then refs.logprob), on every place; on CUDA both kernels, and agreement with
rlk.logprob over the same logits computed by torch."""
import numpy as np
import pytest

import refs
import rlk
from conftest import HAVE_CUDA

pytestmark = pytest.mark.skipif(not rlk.OPS["linear_logprob"].available(),
                                reason="the loaded librlk has no rlk_linear_logprob")


def torch_capability():
    import torch
    return torch.cuda.get_device_capability()


def make(rng, N, V, H, scale=3.0):
    hidden = rng.standard_normal((N, H)).astype(np.float16)
    weight = (rng.standard_normal((V, H)) * (scale / np.sqrt(H))).astype(np.float16)
    labels = rng.integers(0, V, N).astype(np.int64)
    labels[1::5] = -100
    return hidden, weight, labels


def reference(hidden, weight, labels, temperature):
    z = hidden.astype(np.float64) @ weight.astype(np.float64).T
    return refs.logprob(z, labels, temperature)


@pytest.mark.parametrize("shape", [(1, 257, 64), (37, 1000, 96), (5, 3001, 200)])
def test_forward(place, rng, shape):
    N, V, H = shape
    hidden, weight, labels = make(rng, N, V, H)
    out = rlk.linear_logprob(place.to(hidden), place.to(weight), place.to(labels), entropy=True,
                             temperature=0.8)
    logp, lse, ent, _, _ = reference(hidden, weight, labels, 0.8)
    for got, want in ((out.logp, logp), (out.lse, lse), (out.entropy, ent)):
        got = np.asarray(place.back(got), np.float64)
        assert np.abs(got - want).max() <= 2e-3 + 2e-4 * np.abs(want).max()


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device (or no torch)")
@pytest.mark.parametrize("variant", ["auto", "tiled"])
def test_cuda_matches_logprob(rng, variant):
    import torch
    N, V, H = 300, 32003, 512
    hidden, weight, labels = make(rng, N, V, H)
    h, w, y = (torch.from_numpy(a).cuda() for a in (hidden, weight, labels))
    h, w = h.bfloat16(), w.bfloat16()
    out = rlk.linear_logprob(h, w, y, entropy=True, variant=variant)
    ref = rlk.logprob((h.float() @ w.float().t()).contiguous(), y, entropy=True)
    torch.cuda.synchronize()
    for a, b in zip(out, ref):
        assert torch.allclose(a, b, atol=2e-3, rtol=2e-4)
    again = rlk.linear_logprob(h, w, y, entropy=True, variant=variant)
    assert all(torch.equal(a, b) for a, b in zip(out, again))


@pytest.mark.skipif(not rlk.OPS["linear_logprob_backward"].available(),
                    reason="the loaded librlk has no rlk_linear_logprob_backward")
@pytest.mark.parametrize("chunk, group", [(0, None), (128, 3)])
def test_backward(place, rng, chunk, group):
    """Gradients against fp64: dz = (g_lp (onehot - p) - g_H p (z - E)) / T on rows that are not
    ignored (an ignored row gets no gradient at all, as in rlk.logprob_backward)."""
    N, V, H = 9, 500, 48
    hidden, weight, labels = make(rng, N, V, H)
    T = 0.9
    g_lp = rng.standard_normal(N).astype(np.float32)
    g_h = rng.standard_normal(N).astype(np.float32)
    h, w, y = place.to(hidden), place.to(weight), place.to(labels)
    out = rlk.linear_logprob(h, w, y, entropy=True, temperature=T)
    gh, gw = rlk.linear_logprob_backward(h, w, y, out.lse, place.to(g_lp), place.to(g_h), out.entropy,
                                         temperature=T, chunk=chunk, group=group)
    z = hidden.astype(np.float64) @ weight.astype(np.float64).T
    dz = refs.logprob_grad(z, labels, g_lp, g_h, T)
    for got, want in ((gh, dz @ weight.astype(np.float64)), (gw, dz.T @ hidden.astype(np.float64))):
        got = np.asarray(place.back(got), np.float64)
        assert np.abs(got - want).max() <= 2e-3 * np.abs(want).max() + 1e-7


def test_tuning_keywords_are_checked(place, rng):
    """stages (the forward's) and group (the backward's) reach the call, which refuses values
    out of range and runs those in it."""
    hidden, weight, labels = make(rng, 5, 300, 32)
    h, w, y = place.to(hidden), place.to(weight), place.to(labels)
    out = rlk.linear_logprob(h, w, y, stages=3)
    with pytest.raises(rlk.InvalidArgument, match="stages"):
        rlk.linear_logprob(h, w, y, stages=5)
    g = place.to(np.ones(5, np.float32))
    with pytest.raises(rlk.InvalidArgument, match="group"):
        rlk.linear_logprob_backward(h, w, y, out.lse, g, group=65)
    rlk.linear_logprob_backward(h, w, y, out.lse, g, group=64, want_weight=False)


@pytest.mark.parametrize("cuts", [(0, 400, 1000), (0, 1, 300, 301, 777)])
def test_shards_combine_to_the_whole_head(place, rng, cuts):
    """A tensor-parallel head: each shard's records (weight rows [v0, v1)) merged in rank order
    by rlk.logprob_combine equal the whole head's fp64 log-probs; each shard's backward (the
    combined lse and entropy) gives its weight rows, and the shards' grad_hidden sum to the
    whole head's."""
    N, H, V = 9, 64, cuts[-1]
    hidden, weight, labels = make(rng, N, V, H)
    labels[0], labels[2] = cuts[1], cuts[1] - 1  # the first shard edge, both sides
    xp = place
    h, y = xp.to(hidden), xp.to(labels)
    recs = [np.asarray(xp.back(rlk.linear_logprob_partials(h, xp.to(weight[a:b]), y, a,
                                                            entropy=True, temperature=0.9)))
            for a, b in zip(cuts[:-1], cuts[1:])]
    out = rlk.logprob_combine(xp.to(np.stack(recs)), y, entropy=True)
    logp, lse, ent, _, _ = reference(hidden, weight, labels, 0.9)
    for got, want in ((out.logp, logp), (out.lse, lse), (out.entropy, ent)):
        got = np.asarray(xp.back(got), np.float64)
        assert np.abs(got - want).max() <= 2e-3 + 2e-4 * np.abs(want).max()
    g_lp = rng.standard_normal(N).astype(np.float32)
    g_h = rng.standard_normal(N).astype(np.float32)
    whole = rlk.linear_logprob_backward(h, xp.to(weight), y, out.lse, xp.to(g_lp), xp.to(g_h),
                                        out.entropy, temperature=0.9)
    gh_sum = np.zeros((N, H))
    for a, b in zip(cuts[:-1], cuts[1:]):
        gh, gw = rlk.linear_logprob_backward(h, xp.to(weight[a:b]), y, out.lse, xp.to(g_lp),
                                             xp.to(g_h), out.entropy, temperature=0.9,
                                             shard=True, vocab_start=a)
        gh_sum += np.asarray(xp.back(gh), np.float64)
        want_w = np.asarray(xp.back(whole[1]), np.float64)[a:b]
        assert np.abs(np.asarray(xp.back(gw), np.float64) - want_w).max() <= 1e-4 * (np.abs(want_w).max() + 1e-6)
    want_h = np.asarray(xp.back(whole[0]), np.float64)
    assert np.abs(gh_sum - want_h).max() <= 1e-4 * np.abs(want_h).max()


@pytest.mark.skipif(not rlk.OPS["linear_policy_loss"].available(),
                    reason="the loaded librlk has no rlk_linear_policy_loss")
@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_policy_loss_is_the_three_calls(place, rng, entropy_coef):
    """rlk.linear_policy_loss equals rlk.linear_logprob, rlk.policy_loss and
    rlk.linear_logprob_backward run one after the other (the C op is checked against fp64 in
    tests/test_linear_logprob.c): the same kernels, so bitwise on one device."""
    B, T, V, H = 3, 7, 1000, 96
    hidden, weight, labels = make(rng, B * T, V, H)
    old = (rng.standard_normal((B, T)) * 0.3 - 6.5).astype(np.float32)
    adv = rng.standard_normal((B, T)).astype(np.float32)
    ref = (rng.standard_normal((B, T)) * 0.3 - 6.5).astype(np.float32)
    mask = (labels.reshape(B, T) != -100) & (rng.random((B, T)) > 0.2)
    h, w, y, o, a, r, m = (place.to(x) for x in (hidden, weight, labels, old, adv, ref, mask))
    kw = dict(ref_logp=r, kl_coef=0.05, kl_estimator="k3", clip_high=0.28, entropy_coef=entropy_coef)
    got = rlk.linear_policy_loss(h, w, y, o, a, m, temperature=0.9, logp=True, **kw)
    lp = rlk.linear_logprob(h, w, y, entropy=entropy_coef != 0, temperature=0.9)
    pl = rlk.policy_loss(lp.logp.reshape(B, T), o, a, m,
                         entropy=lp.entropy.reshape(B, T) if entropy_coef else None, **kw)
    gh, gw = rlk.linear_logprob_backward(
        h, w, y, lp.lse, pl.grad_logp.reshape(-1),
        pl.grad_entropy.reshape(-1) if entropy_coef else None,
        lp.entropy if entropy_coef else None, temperature=0.9)
    for x, want in ((got.loss, pl.loss), (got.metrics, pl.metrics), (got.logp, lp.logp),
                    (got.grad_hidden, gh), (got.grad_weight, gw)):
        assert np.array_equal(np.asarray(place.back(x)), np.asarray(place.back(want)))
    with pytest.raises(rlk.InvalidArgument, match="tokens"):
        rlk.linear_policy_loss(h, w, y, o[:2], a[:2], m[:2])


@pytest.mark.skipif(not rlk.OPS["linear_policy_loss"].available(),
                    reason="the loaded librlk has no rlk_linear_policy_loss")
def test_policy_loss_token_chunks(place, rng):
    """The token chunks (sm_90a) give the recompute path's loss, log-probs and gradients within
    16-bit rounding of the logits' gradient; elsewhere (the host, a device that is not sm_90)
    asking for them is refused with the reason. On sm_90 a refusal fails."""
    B, T, V, H = 2, 100, 1500, 128
    hidden, weight, labels = make(rng, B * T, V, H)
    old = (rng.standard_normal((B, T)) * 0.3 - 6.5).astype(np.float32)
    adv = rng.standard_normal((B, T)).astype(np.float32)
    mask = (labels.reshape(B, T) != -100) & (rng.random((B, T)) > 0.2)
    h, w, y, o, a, m = (place.to(x) for x in (hidden, weight, labels, old, adv, mask))
    with pytest.raises(ValueError, match="path"):
        rlk.linear_policy_loss(h, w, y, o, a, m, path="stored")
    want = rlk.linear_policy_loss(h, w, y, o, a, m, logp=True, path="recompute")
    sm90 = place.cuda and torch_capability() == (9, 0)
    if not sm90:
        with pytest.raises(rlk.InvalidArgument, match="token chunks"):
            rlk.linear_policy_loss(h, w, y, o, a, m, logp=True, path="token_chunks", chunk_tokens=64)
        if place.cuda:
            pytest.skip("the token chunks need sm_90; this device is sm_%d%d" % torch_capability())
        return
    got = rlk.linear_policy_loss(h, w, y, o, a, m, logp=True, path="token_chunks", chunk_tokens=64)
    for x, ref, tol in ((got.loss, want.loss, 1e-5), (got.logp, want.logp, 1e-5),
                        (got.grad_hidden, want.grad_hidden, 1e-2), (got.grad_weight, want.grad_weight, 1e-2)):
        g = np.asarray(place.back(x), np.float64)
        r = np.asarray(place.back(ref), np.float64)
        assert np.abs(g - r).max() <= tol * (np.abs(r).max() + 1e-12)

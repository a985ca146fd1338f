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


def test_accumulate_without_buffers_starts_at_zero(place, rng):
    """accumulate=True with no gradient buffers given: the buffers made for the call start at 0
    (not whatever memory they reuse), so the result is the plain call's; a grad_dtype that is not
    'f32' or 'same' is refused."""
    B, T, V, H = 2, 5, 300, 32
    hidden, weight, labels = make(rng, B * T, V, H)
    old = (rng.standard_normal((B, T)) * 0.3 - 5.5).astype(np.float32)
    adv = rng.standard_normal((B, T)).astype(np.float32)
    mask = labels.reshape(B, T) != -100
    h, w, y, o, a, m = (place.to(x) for x in (hidden, weight, labels, old, adv, mask))
    out = rlk.linear_logprob(h, w, y)
    g = place.to(rng.standard_normal(B * T).astype(np.float32))

    def garbage():  # freed memory of the gradients' sizes, full of large values
        for shape in ((B * T, H), (V, H)):
            x = place.to(np.full(shape, 1e6, np.float32))
            del x

    plain = rlk.linear_logprob_backward(h, w, y, out.lse, g)
    garbage()
    acc = rlk.linear_logprob_backward(h, w, y, out.lse, g, accumulate=True)
    for x, want in zip(acc, plain):
        assert np.array_equal(np.asarray(place.back(x)), np.asarray(place.back(want)))
    plain = rlk.linear_policy_loss(h, w, y, o, a, m)
    garbage()
    acc = rlk.linear_policy_loss(h, w, y, o, a, m, accumulate=True)
    for x, want in ((acc.grad_hidden, plain.grad_hidden), (acc.grad_weight, plain.grad_weight)):
        assert np.array_equal(np.asarray(place.back(x)), np.asarray(place.back(want)))
    with pytest.raises(rlk.InvalidArgument, match="grad_dtype"):
        rlk.linear_policy_loss(h, w, y, o, a, m, grad_dtype="bogus")


def test_kept_set_of_an_ignored_row(place, rng):
    """With a threshold, an ignored row's kept set is its columns at or above it: the label column
    stays in only for a scored row, so an ignore_index inside [0, V) cuts like -100 does."""
    N, V, H = 4, 97, 16
    hidden, weight, _ = make(rng, N, V, H)
    z = hidden.astype(np.float32) @ weight.astype(np.float32).T
    thr = np.sort(z, axis=1)[:, -2].astype(np.float32)  # each row's two largest logits kept
    labels = np.argsort(z, axis=1)[:, -3].astype(np.int64)  # the third largest: just below it
    h, w, t = place.to(hidden), place.to(weight), place.to(thr)
    scored = rlk.linear_logprob(h, w, place.to(labels), threshold=t, entropy=True)
    ign = int(labels[0])
    lab = labels.copy()
    lab[0] = ign  # row 0 ignored through an ignore_index that is a column
    cut = rlk.linear_logprob(h, w, place.to(lab), threshold=t, entropy=True, ignore_index=ign)
    none = rlk.linear_logprob(h, w, place.to(np.full(N, -100, np.int64)), threshold=t, entropy=True)
    for f in ("lse", "entropy"):
        got, want = (np.asarray(place.back(getattr(o, f)))[0] for o in (cut, none))
        assert got == want, (f, got, want)
        assert np.asarray(place.back(getattr(scored, f)))[0] != want  # the label column kept there
    assert np.asarray(place.back(cut.logp))[0] == 0.0


def test_minus_inf_logit_contributes_nothing(host):
    """On the host backend a column whose logit is -inf leaves the sum, as in rlk.logprob: the
    row's log-prob, lse and entropy are those of the other columns (not NaN), and its weight
    gradient 0."""
    hidden = np.ones((1, 1), np.float16)
    for weight in (np.array([[-np.inf], [1], [2]], np.float16), np.array([[1], [-np.inf], [2]], np.float16)):
        labels = np.array([2], np.int64)
        got = rlk.linear_logprob(hidden, weight, labels, entropy=True)
        z = (hidden.astype(np.float32) @ weight.astype(np.float32).T)
        want = rlk.logprob(np.ascontiguousarray(z), labels, entropy=True)
        for f in ("logp", "lse", "entropy"):
            g, e = np.asarray(getattr(got, f)), np.asarray(getattr(want, f))
            assert np.isfinite(g).all() and np.allclose(g, e, rtol=1e-6, atol=1e-7), (f, g, e)
        # the backward: the -inf column's weight gradient is dz h = 0 (dz 0 there, as
        # rlk.logprob_backward's), the others' dz h
        one = np.ones(1, np.float32)
        _, gw = rlk.linear_logprob_backward(hidden, weight, labels, got.lse, one, one, got.entropy)
        dz = np.asarray(rlk.logprob_backward(z, labels, want.lse, one, one, want.entropy)).ravel()
        assert np.allclose(np.asarray(gw).ravel(), dz, rtol=1e-5, atol=1e-7), (gw, dz)


# What the arithmetic allows: the model of tests/test_linear_logprob.c (ll_grid_step, ll_fold_eps,
# ll_fwd_bound, ll_check_grads), where each step is derived.
U = 2.0 ** -24  # f32's unit roundoff


def make_grid(rng, N, V, H, scale=3.0):
    """make()'s f16 inputs on a grid whose logits the kernels compute exactly: h = a / 4 (|a| <= 7),
    w = b step (|b| <= 63, step a power of two), so every product and partial sum of a logit is
    a multiple of step / 4 below 441 H step / 4, which f32 holds exactly while 441 H < 2^20, in
    any order and under any truncation; step puts the logits' spread near scale."""
    assert 441 * H < 2 ** 20
    step = 2.0 ** np.round(np.log2(scale / (np.sqrt(H) * 1.08 * 36.7)))
    hidden = (rng.integers(-7, 8, (N, H)) / 4.0).astype(np.float16)
    weight = (rng.integers(-63, 64, (V, H)) * step).astype(np.float16)
    labels = rng.integers(0, V, N).astype(np.int64)
    labels[1::5] = -100
    return hidden, weight, labels


def fold_eps(V):
    """The relative error of a row's sum of exponentials over V columns cut into any number of
    splits (ll_fold_eps_any): per 256 columns a thread folds 56 u, per merge of two records 11 u
    (five lane levels and the splits), once per term 44 u."""
    tiles = -(-V // 256)

    def eps(S):
        return (56 * -(-tiles // S) + 11 * (S + 5) + 44) * U
    return max(eps(1), eps(tiles))


def sum_eps(K):
    """f32 sums of K products on any path (wgmma's truncations and the chunks' additions):
    4 (K + 64) u of the sum of |terms| (ll_sum_eps)."""
    return 4.0 * (K + 64) * U


def head_grad_bounds(hidden, weight, z, labels, g_lp, dg_lp, lse_tol, dz16, stored):
    """The head's gradients from upstream g_lp (within dg_lp) against fp64, and each element's
    bound (ll_check_grads, no entropy term, temperature 1): dz = g_lp (onehot - p) from
    p = 2^(x c - lse log2 e) with exact x within p (lse_tol + 8 u (|z| + |lse| + 1)) (stored:
    u kept in 16 bits, half an ulp more and 2^-25 absolute for f16), g_lp within dg_lp, dz's own
    operations 4 u |dz| (a p below 2^-120 may flush to 0: all of its dz); dz rounded to 16 bits
    where dz16 (half an ulp, 2^-11 for f16, or below f16's normals at most 2^-25 and at most
    itself); times the other operand's |value|, summed in f32 (sum_eps of the sum of |terms|),
    stored in f32 (u of it; twice the subnormals' half spacing). Returns (ref_h, tol_h, ref_w,
    tol_w)."""
    h, w = hidden.astype(np.float64), weight.astype(np.float64)
    _, lse, _, p, _ = refs.logprob(z, labels)
    dz = refs.logprob_grad(z, labels, g_lp, None)
    ok = (labels != -100)[:, None]
    onehot = np.zeros_like(p)
    onehot[np.arange(len(labels))[labels != -100], labels[labels != -100]] = 1.0
    u_dz = 2.0 ** -11 if dz16 else 0.0
    ep = lse_tol[:, None] + 8 * U * (np.abs(z) + np.abs(lse)[:, None] + 1)
    ep = ep + (u_dz if stored else 0.0)
    pabs = 2.0 ** -25 if stored else 0.0
    gl, dgl = np.abs(g_lp)[:, None], dg_lp[:, None]
    e = (gl + dgl) * (p * ep + pabs) + dgl * np.abs(onehot - p) + 4 * U * np.abs(dz)
    e = e + np.where(p < 2.0 ** -120, np.abs(dz), 0.0)
    before = np.abs(dz) + e  # dz's size before its rounding
    bz = np.where(ok, e + u_dz * before + (np.minimum(2.0 ** -25, before) if dz16 else 0.0), 0.0)
    out = []
    size = np.abs(dz) + bz
    for ref, prop, mag, K in ((dz @ w, bz @ np.abs(w), size @ np.abs(w), z.shape[1]),
                              (dz.T @ h, bz.T @ np.abs(h), size.T @ np.abs(h), z.shape[0])):
        tol = prop + sum_eps(K) * mag
        out += [ref, tol + U * (np.abs(ref) + tol) + 2.0 ** -149]
    return out


@pytest.mark.skipif(not rlk.OPS["linear_policy_loss"].available(),
                    reason="the loaded librlk has no rlk_linear_policy_loss")
def test_policy_loss_token_chunks(place, rng):
    """The token chunks (sm_90a) and the recompute path each give the loss, log-probs and
    gradients of the fp64 chain (refs.logprob, refs.policy_loss, refs.logprob_grad) within bounds
    of their arithmetic (above), so they agree within the sum of the two: the chunks keep the
    logits as u = 2^(x c - m) in 16 bits, and on sm_90 both keep dz in 16 bits. Elsewhere (the
    host, a device that is not sm_90) asking for the chunks is refused with the reason; the host's
    recompute path is held to its bounds. On sm_90 a refusal fails."""
    B, T, V, H = 2, 100, 1500, 128
    N = B * T
    hidden, weight, labels = make_grid(rng, N, V, H)
    z = hidden.astype(np.float64) @ weight.astype(np.float64).T
    lp, lse, ent, _, _ = refs.logprob(z, labels)
    # each row's logp and lse within eps + a of the fold (ll_fwd_bound); an ignored row's logp is 0
    ops = 16 * U * (np.abs(z).max(1) + np.abs(lse) + np.abs(lp) + np.abs(ent) + 1)
    lse_tol = fold_eps(V) + ops
    lp_tol = np.where(labels != -100, lse_tol, 0.0)
    # old log-probs that put ratios on both sides of the clip range, never within 1e-3 of a kink
    # (0.8, 1.28, 3: the f32 and fp64 branches would differ there; lp_tol is far below)
    assert lp_tol.max() < 1e-4
    old = np.empty(N)
    for i in range(N):
        while True:
            old[i] = np.float32(lp[i] + 0.4 * rng.standard_normal())
            if min(abs(np.exp(lp[i] - old[i]) - x) for x in (0.8, 1.28, 3.0)) >= 1e-3:
                break
    old = old.astype(np.float32).reshape(B, T)
    adv = rng.standard_normal((B, T)).astype(np.float32)
    mask = (labels.reshape(B, T) != -100) & (rng.random((B, T)) > 0.2)
    kw = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    loss, g, _, _ = refs.policy_loss(lp.reshape(B, T), old, adv, mask, **kw)
    g = g.reshape(-1)
    # The call's loss gradient comes from its own log-probs: the policy part scales with the
    # ratio, twice the first order of lp_tol, and 16 u of its f32 evaluation. The loss moves by
    # at most |g| lp_tol twice over, and its f32 sum over the tokens (sum_eps) and their
    # evaluation (16 u) of the sum of |c_t l_t|, each l_t within 3 |A_t| (the dual clip caps it).
    dg = 2 * lp_tol * np.abs(g) + 16 * U * np.abs(g)
    c = mask.reshape(-1) / mask.sum()
    loss_tol = (sum_eps(N) + 16 * U) * (c * 3 * np.abs(adv.reshape(-1))).sum()
    loss_tol += 2 * (np.abs(g) * lp_tol).sum()
    h, w, y, o, a, m = (place.to(x) for x in (hidden, weight, labels, old, adv, mask))
    with pytest.raises(ValueError, match="path"):
        rlk.linear_policy_loss(h, w, y, o, a, m, path="stored")
    sm90 = place.cuda and torch_capability() == (9, 0)

    def check(res, stored):
        got_loss = float(np.asarray(place.back(res.loss), np.float64)[0])
        assert abs(got_loss - loss) <= loss_tol, (got_loss, loss, loss_tol)
        got_lp = np.asarray(place.back(res.logp), np.float64)
        assert np.all(np.abs(got_lp - lp) <= lp_tol), np.abs(got_lp - lp).max()
        ref_h, tol_h, ref_w, tol_w = head_grad_bounds(hidden, weight, z, labels, g, dg, lse_tol,
                                                      stored or sm90, stored)
        for name, x, ref, tol in (("grad_hidden", res.grad_hidden, ref_h, tol_h),
                                  ("grad_weight", res.grad_weight, ref_w, tol_w)):
            err = np.abs(np.asarray(place.back(x), np.float64) - ref)
            at = np.unravel_index(np.argmax(err / tol), err.shape)
            assert np.all(err <= tol), "%s%s: off by %.3g, bound %.3g" % (
                name, at, err[at], tol[at])

    check(rlk.linear_policy_loss(h, w, y, o, a, m, logp=True, path="recompute", **kw), False)
    if not sm90:
        with pytest.raises(rlk.InvalidArgument, match="token chunks"):
            rlk.linear_policy_loss(h, w, y, o, a, m, logp=True, path="token_chunks",
                                   chunk_tokens=64, **kw)
        if place.cuda:
            pytest.skip("the token chunks need sm_90; this device is sm_%d%d" % torch_capability())
        return
    check(rlk.linear_policy_loss(h, w, y, o, a, m, logp=True, path="token_chunks", chunk_tokens=64,
                                 **kw), True)

"""rlk.prefix_attention and its backward against an fp64 numpy reference on the replicated layout
(each [prefix; r_g] as its own causal sequence, the prefix's gradients summed over the group);
on a GPU, rlk.autograd.prefix_attention against torch SDPA on the replicated layout."""
import numpy as np
import pytest

import rlk
from conftest import HAVE_CUDA

pytestmark = pytest.mark.skipif(not rlk.OPS["prefix_attention"].available(),
                                reason="the loaded librlk has no rlk_prefix_attention")


def causal_ref(q, k, v, do, scale):
    """fp64 causal attention over one sequence: q [L, Hq, D], k, v [L, Hkv, D]; out, lse, dq, dk, dv."""
    L, Hq, D = q.shape
    Hkv = k.shape[1]
    r = Hq // Hkv
    kk = np.repeat(k, r, axis=1)
    vv = np.repeat(v, r, axis=1)
    s = np.einsum("ihd,jhd->hij", q, kk) * scale
    s = np.where(np.tril(np.ones((L, L), bool))[None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    den = p.sum(-1, keepdims=True)
    p /= den
    lse = (m + np.log(den))[..., 0].T
    out = np.einsum("hij,jhd->ihd", p, vv)
    dp = np.einsum("ihd,jhd->hij", do, vv)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    dq = np.einsum("hij,jhd->ihd", ds, kk) * scale
    dk = np.einsum("hij,ihd->jhd", ds, q) * scale
    dv = np.einsum("hij,ihd->jhd", p, do)
    dk = dk.reshape(L, Hkv, r, D).sum(2)
    dv = dv.reshape(L, Hkv, r, D).sum(2)
    return out, lse, dq, dk, dv


def replicated_ref(layout, q, k, v, do, scale):
    out, lse, dq = np.zeros_like(q), np.zeros(q.shape[:2]), np.zeros_like(q)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    for p in range(layout.num_prompts):
        a, b = layout.prefix_range(p)
        resp = layout.response_ranges(p) or [(b, b)]
        for g, (s, e) in enumerate(resp):
            idx = np.r_[a:b, s:e]
            d = do[idx].copy()
            if g > 0:
                d[: b - a] = 0  # the prefix's upstream gradient counts once
            o, l, gq, gk, gv = causal_ref(q[idx], k[idx], v[idx], d, scale)
            keep = np.ones(len(idx), bool) if g == 0 else np.r_[np.zeros(b - a, bool), np.ones(e - s, bool)]
            out[idx[keep]] = o[keep]
            lse[idx[keep]] = l[keep]
            dq[idx] += gq
            dk[idx] += gk
            dv[idx] += gv
    return out, lse, dq, dk, dv


def test_layout_helpers():
    lay = rlk.prefix_layout([17, 0], [[1, 5, 129], [3]])
    assert lay.seq == [0, 17, 18, 23, 152, 152, 155]
    assert lay.grp == [0, 4, 6]
    assert lay.tokens == 155 and lay.num_prompts == 2
    assert lay.response_ranges(0) == [(17, 18), (18, 23), (23, 152)]
    x = np.arange(155)
    r = rlk.unpack_responses(x, lay)
    assert [list(t) for t in r[1]] == [[152, 153, 154]]


@pytest.mark.parametrize("Hq,Hkv,D", [(4, 1, 64), (2, 2, 128)])
def test_host_forward_backward(host, rng, Hq, Hkv, D):
    lay = rlk.prefix_layout([17, 1], [[1, 5, 29], [7]])
    T = lay.tokens
    q, k, v, do = (rng.standard_normal((T, h, D)).astype(np.float16) for h in (Hq, Hkv, Hkv, Hq))
    scale = 0.2
    out, lse = rlk.prefix_attention(q, k, v, lay, scale=scale)
    dq, dk, dv = rlk.prefix_attention_backward(q, k, v, lay, out, lse, do, scale=scale)
    ref = replicated_ref(lay, *(x.astype(np.float64) for x in (q, k, v, do)), scale)
    for got, want in zip((out, lse, dq, dk, dv), ref):
        got = np.asarray(got, np.float64)
        assert np.abs(got - want).max() <= 2e-3 * max(1.0, np.abs(want).max())


def test_bad_layout(host):
    lay = rlk.PrefixLayout([0, 4, 4, 12], [0, 3])  # a response of length 0
    x = np.zeros((12, 1, 64), np.float16)
    with pytest.raises(rlk.InvalidArgument, match="seq_offsets"):
        rlk.prefix_attention(x, x, x, lay)


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device (or no torch)")
def test_cuda_autograd_vs_sdpa_replicated():
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    Hq, Hkv, D, dev = 8, 2, 128, "cuda"
    prompts = [torch.randn(77, 3, device=dev)]
    responses = [[torch.randn(n, 3, device=dev) for n in (1, 33, 70)]]
    _, lay = rlk.pack_grpo(prompts, responses)
    T = lay.tokens
    q, k, v = (torch.randn(T, h, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for h in (Hq, Hkv, Hkv))
    do = torch.randn(T, Hq, D, device=dev, dtype=torch.bfloat16)
    from rlk.autograd import prefix_attention as pa_autograd
    out = pa_autograd(q, k, v, lay)
    out.backward(do)
    # replicated: each [prefix; r_g] through SDPA in fp32, the prefix's grads summed
    qf, kf, vf = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    a, b = lay.prefix_range(0)
    loss = 0
    outs = []
    for g, (s, e) in enumerate(lay.response_ranges(0)):
        idx = torch.cat([torch.arange(a, b), torch.arange(s, e)]).to(dev)
        o = F.scaled_dot_product_attention(qf[idx].transpose(0, 1)[None], kf[idx].transpose(0, 1)[None],
                                           vf[idx].transpose(0, 1)[None], is_causal=True,
                                           enable_gqa=True)[0].transpose(0, 1)
        w = do[idx].float().clone()
        if g:
            w[: b - a] = 0
        loss = loss + (o * w).sum()
        outs.append(o)
    loss.backward()
    torch.testing.assert_close(out[a:b].float(), outs[0][: b - a], atol=2e-2, rtol=2e-2)
    for (s, e), o in zip(lay.response_ranges(0), outs):
        torch.testing.assert_close(out[s:e].float(), o[b - a:], atol=2e-2, rtol=2e-2)
    for got, want in ((q.grad, qf.grad), (k.grad, kf.grad), (v.grad, vf.grad)):
        torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)

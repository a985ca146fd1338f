"""rlk.prefix_attention and its backward against an fp64 numpy reference on the replicated layout
(each [prefix; r_g] as its own causal sequence, the prefix's gradients summed over the group),
every element within a bound derived from the arithmetic of the kernels that made it (the model
of tests/ref/prefix_attention_ref.c, where each step is derived); on a GPU,
rlk.autograd.prefix_attention the same way. The inputs lie on a grid (a / 4, a an integer in
-7..7): every product is a multiple of 1/16 and every partial sum of a dot product over D < 21399
one below 2^16, 20 significant bits, which f32 holds exactly in any order and under any
truncation (four bits to spare), so the GPU's q . k and dO . v are exact."""
from dataclasses import dataclass

import numpy as np
import pytest

import rlk
from conftest import HAVE_CUDA, HAVE_TORCH

pytestmark = pytest.mark.skipif(not rlk.OPS["prefix_attention"].available(),
                                reason="the loaded librlk has no rlk_prefix_attention")

U32 = 2.0 ** -24  # the kernels' scale and lse are f32


@dataclass
class Arith:
    """What the kernels' arithmetic does (tests/ref/prefix_attention_ref.h's pa_ref_arith)."""
    dot: float      # a dot product's error over the head dim, of the sum of |products| (0: exact)
    u: float        # unit roundoff of the sums and other operations
    ex: float       # relative error of one exponential
    r16: float      # P and dS rounded to 16 bits before the second products (0: not)
    a16: float      # that rounding below min16, absolute
    min16: float    # the dtype's smallest normal
    o16: float      # the outputs' rounding, relative
    ao16: float     # ... absolute below the normal range
    tiles: int      # the most key tiles a row's online softmax walks (a rescale each)
    delta_from_out: bool  # delta = dO . O of the stored 16-bit O (GPU); else sum_j P dP (host)


def arith(f16, D, gpu, tiles16, T):
    """The host's fp64 (exp within an ulp, dot products of D terms within 3 D u), or the GPU's
    f32 (its dot products exact on the grid) with exponentials within 8 u and, with tiles16
    (sm_80+: mma and wgmma), P and dS in 16 bits and 64-key tiles or wider (at most T / 64 + 2
    for a row); the portable kernels (older devices) rescale at every key. Outputs: half an ulp
    of the 16-bit dtype (bf16 2^-8, f16 2^-11), half the subnormals' spacing below its normals."""
    if f16:
        o16, a16, min16 = 2.0 ** -11, 2.0 ** -25, 2.0 ** -14
    else:
        o16, a16, min16 = 2.0 ** -8, 2.0 ** -134, 2.0 ** -126
    u = 2.0 ** -24 if gpu else 2.0 ** -53
    return Arith(dot=0.0 if gpu else 3.0 * D * u, u=u, ex=8 * u if gpu else 2.0 ** -52,
                 r16=o16 if gpu and tiles16 else 0.0, a16=a16, min16=min16, o16=o16, ao16=a16,
                 tiles=T // 64 + 2 if gpu and tiles16 else T + 2, delta_from_out=gpu)


def bound(ar, e, m, ref, K):
    """An element's bound from its carried error e and sum of |terms| m: the sum of K terms
    (3 K u of m), times the scale or 1 / l, the 16-bit store (pa_ref_bound)."""
    b = e + 3.0 * K * ar.u * m
    b = b + ((1 + U32) * (1 + ar.u) - 1) * (np.abs(ref) + b)
    return b + ((1 + U32) * (1 + ar.o16) - 1) * (np.abs(ref) + b) + ar.ao16


def round16(ar, x, e):
    """The 16-bit rounding of a value within e of x >= 0: half an ulp of its size, below the normal
    range at most a16 and at most its size."""
    if ar.r16 == 0:
        return np.zeros_like(x)
    return ar.r16 * (x + e) + np.where(x - e < ar.min16, np.minimum(ar.a16, x + e), 0.0)


def causal_ref(q, k, v, do, scale, ar=None):
    """fp64 causal attention over one sequence: q [L, Hq, D], k, v [L, Hkv, D]; out, lse, dq, dk,
    dv, and with ar the bounds: out's and lse's, and (e, m) of dq, dk, dv for bound()."""
    L, Hq, D = q.shape
    Hkv = k.shape[1]
    r = Hq // Hkv
    kk = np.repeat(k, r, axis=1)
    vv = np.repeat(v, r, axis=1)
    mask = np.tril(np.ones((L, L), bool))[None]
    z = np.where(mask, np.einsum("ihd,jhd->hij", q, kk) * scale, -np.inf)
    m = z.max(-1, keepdims=True)
    p = np.exp(z - m)
    den = p.sum(-1, keepdims=True)
    p /= den
    lse = (m + np.log(den))[..., 0]  # [h, i]
    out = np.einsum("hij,jhd->ihd", p, vv)
    dp = np.einsum("ihd,jhd->hij", do, vv)
    delta = (p * dp).sum(-1, keepdims=True)
    ds = p * (dp - delta)
    dq = np.einsum("hij,jhd->ihd", ds, kk) * scale
    dk = (np.einsum("hij,ihd->jhd", ds, q) * scale).reshape(L, Hkv, r, D).sum(2)
    dv = np.einsum("hij,ihd->jhd", p, do).reshape(L, Hkv, r, D).sum(2)
    if ar is None:
        return out, lse.T, dq, dk, dv
    # the model of tests/ref/prefix_attention_ref.c, row by row over [h, i]
    u, K = ar.u, np.arange(1, L + 1, dtype=np.float64)
    zmax = np.where(mask, np.abs(np.where(mask, z, 0.0)), 0.0).max(-1)
    amax = np.where(mask, np.einsum("ihd,jhd->hij", np.abs(q), np.abs(kk)) * scale, 0.0).max(-1)
    edp = ar.dot * np.einsum("ihd,jhd->hij", np.abs(do), np.abs(vv))  # dP's error
    e = ar.dot * amax + U32 * zmax + 8 * u * (2 * zmax + np.abs(lse))
    rho = (ar.tiles + 1) * ar.ex + ar.tiles * u + K * u
    eta = np.expm1(2 * (e + rho))
    blse = e + rho + 4 * u * (np.abs(lse) + np.log(K) + 1) + U32 * np.abs(lse)
    small = (ar.r16 > 0) & (p < 2 * ar.min16)
    W = (eta + ar.r16 * (1 + eta))[..., None] * p  # |w~_j - p_j|
    W = W + np.where(small, (1 + eta)[..., None] * np.minimum(ar.a16, p), 0)
    oe = np.einsum("hij,jhd->ihd", W, np.abs(vv))
    M = np.einsum("hij,jhd->ihd", p, np.abs(vv))
    bout = bound(ar, oe, M + oe, out, K[:, None, None])
    etaP = np.expm1(e + blse + 2 * ar.ex)
    if ar.delta_from_out:  # dO . O~ of the stored O: its weights' part, its rest, the f32 sum
        bD = (W * np.abs(dp)).sum(-1) + (np.abs(do) * (bout - oe)).sum(-1).T
        bD = bD + 3.0 * D * u * (np.abs(do) * (np.abs(out) + bout)).sum(-1).T
    else:
        bD = (etaP + 3.0 * K * u * (1 + etaP)) * (p * np.abs(dp)).sum(-1)
        bD = bD + (1 + etaP) * (p * edp).sum(-1)
    G = np.abs(dp - delta)
    flush = np.where(p < 2.0 ** -120, p, 0.0)
    etaP3, bD3 = etaP[..., None], bD[..., None]
    ed = (1 + etaP3) * p * bD3
    eq = p * (etaP3 * G + (1 + etaP3) * edp + 2 * u * (1 + etaP3) * (G + edp + bD3)) + flush * G
    rnd = round16(ar, np.abs(ds), eq + ed)
    bS, bSq = eq + ed + rnd, eq + rnd
    ep = etaP3 * p + flush
    bP = ep + round16(ar, p, ep)
    ak, aq, ado = np.abs(kk), np.abs(q), np.abs(do)
    # delta's error is the row's: it moves dq by bD |sum_j P~_ij k_jd|
    pk = np.abs(np.einsum("hij,jhd->ihd", p, kk)) + np.einsum("hij,jhd->ihd", etaP3 * p + flush, ak)
    dq_e = scale * (np.einsum("hij,jhd->ihd", bSq, ak) + bD.T[..., None] * pk)
    dq_m = scale * np.einsum("hij,jhd->ihd", np.abs(ds) + bS, ak)

    def group(x):
        return x.reshape(L, Hkv, r, D).sum(2)
    dk_e = group(scale * np.einsum("hij,ihd->jhd", bS, aq))
    dk_m = group(scale * np.einsum("hij,ihd->jhd", np.abs(ds) + bS, aq))
    dv_e = group(np.einsum("hij,ihd->jhd", bP, ado))
    dv_m = group(np.einsum("hij,ihd->jhd", p + bP, ado))
    return out, lse.T, dq, dk, dv, (bout, blse.T, (dq_e, dq_m), (dk_e, dk_m), (dv_e, dv_m))


def replicated_ref(layout, q, k, v, do, scale, ar=None):
    """The reference on the packed layout's tokens: (out, lse, dq, dk, dv), and with ar a bound of
    each element (the packed kernels sum dq over the row's keys, dk and dv over the query rows that
    see the key and the GQA group's heads, with the mma path's per-head partials: ratio + 2 more)."""
    T, Hq, _ = q.shape
    ratio = Hq // k.shape[1]
    out, lse, dq = np.zeros_like(q), np.zeros(q.shape[:2]), np.zeros_like(q)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    bout, blse = np.zeros_like(q), np.zeros(q.shape[:2])
    em = [np.zeros_like(x) for x in (q, q, k, k, v, v)]
    keys, rows = np.zeros(T), np.zeros(T)
    for p in range(layout.num_prompts):
        a, b = layout.prefix_range(p)
        resp = layout.response_ranges(p) or [(b, b)]
        end = resp[-1][1]
        keys[a:b] = np.arange(1, b - a + 1)
        rows[a:b] = end - np.arange(a, b)
        for g, (s, e) in enumerate(resp):
            keys[s:e] = (b - a) + np.arange(1, e - s + 1)
            rows[s:e] = e - np.arange(s, e)
            idx = np.r_[a:b, s:e]
            d = do[idx].copy()
            if g > 0:
                d[: b - a] = 0  # the prefix's upstream gradient counts once
            res = causal_ref(q[idx], k[idx], v[idx], d, scale, ar)
            keep = np.ones(len(idx), bool) if g == 0 else np.r_[np.zeros(b - a, bool), np.ones(e - s, bool)]
            out[idx[keep]] = res[0][keep]
            lse[idx[keep]] = res[1][keep]
            dq[idx] += res[2]
            dk[idx] += res[3]
            dv[idx] += res[4]
            if ar is not None:
                bo, bl, *parts = res[5]
                bout[idx[keep]] = bo[keep]
                blse[idx[keep]] = bl[keep]
                for x, part in zip(em, [y for pair in parts for y in pair]):
                    x[idx] += part
    if ar is None:
        return out, lse, dq, dk, dv
    kq = keys[:, None, None]
    kkv = (ratio * (rows + 1) + 2)[:, None, None]
    bounds = (bout, blse, bound(ar, em[0], em[1], dq, kq), bound(ar, em[2], em[3], dk, kkv),
              bound(ar, em[4], em[5], dv, kkv))
    return (out, lse, dq, dk, dv), bounds


def grid(rng, shape):
    return rng.integers(-7, 8, shape) / 4.0


def check_within(name, got, want, bnd):
    """Every element within its bound; returns the worst |got - want| / bound."""
    err = np.abs(np.asarray(got, np.float64) - want)
    worst = np.unravel_index(np.argmax(err / bnd), err.shape)
    assert np.all(err <= bnd), "%s%s: %.9g, fp64 %.9g, bound %.3g" % (
        name, worst, np.asarray(got, np.float64)[worst], want[worst], bnd[worst])
    return float((err / bnd).max())


def visible(layout):
    """[T, T]: query row i sees key j (the packed layout's rule)."""
    T = layout.tokens
    m = np.zeros((T, T), bool)
    for p in range(layout.num_prompts):
        a, b = layout.prefix_range(p)
        m[a:b, a:b] = np.tril(np.ones((b - a, b - a), bool))
        for s, e in layout.response_ranges(p):
            m[s:e, a:b] = True
            m[s:e, s:e] = np.tril(np.ones((e - s, e - s), bool))
    return m


def runs(layout):
    """The runs of keys (or query rows) the kernels cut into 64-wide tiles: each prompt's prefix,
    and its responses (each one's keys; its rows stacked)."""
    keys, qrows = [], []
    for p in range(layout.num_prompts):
        a, b = layout.prefix_range(p)
        rr = layout.response_ranges(p)
        keys += [(a, b)] + rr
        qrows += [(a, b)] + ([(rr[0][0], rr[-1][1])] if rr else [])
    return [x for x in keys if x[1] > x[0]], [x for x in qrows if x[1] > x[0]]


def power(layout, q, k, v, do, scale, ref, bnd):
    """What the bounds catch (tests/test_prefix_attention.c's pa_power_of, in a simpler form): for
    each kind of fault, the least over the faults of the most an element moves over its bound. A
    fault: a whole 64-key tile of a run left out of every row and head that sees it, or the last
    tile of every run at once (out and dq); a whole 64-row query tile, or every run's last, left
    out of dk and dv; out and dq of the next query head, dk and dv of the next key head."""
    out, lse, dq, dk, dv = ref
    bout, _, bdq, bdk, bdv = bnd
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    r = Hq // Hkv
    vis = visible(layout)
    kk, vv = np.repeat(k, r, axis=1), np.repeat(v, r, axis=1)
    P = np.where(vis[None], np.exp(np.einsum("ihd,jhd->hij", q, kk) * scale - lse.T[..., None]), 0.0)
    dP = np.einsum("ihd,jhd->hij", do, vv)
    dS = P * (dP - (do * out).sum(-1).T[..., None])
    key_runs, row_runs = runs(layout)

    def tiles(rr):
        whole = [np.arange(t, t + 64) for s, e in rr for t in range(s, e - 63, 64)]
        return whole + [np.concatenate([np.arange(s + (e - s - 1) // 64 * 64, e) for s, e in rr])]

    worst = {}

    def note(kind, x):
        worst[kind] = min(worst.get(kind, np.inf), x)
    for K in tiles(key_runs):
        PK = P[:, :, K].sum(-1)  # [h, i]
        SK = np.einsum("hij,jhd->ihd", P[:, :, K], vv[K])
        rem = (1 - PK).T[..., None]
        moved = np.where(rem > 1e-12, np.abs((out - SK) / np.where(rem > 1e-12, rem, 1) - out), np.inf)
        seen = PK.T[..., None] > 0
        note("key tile (out)", np.where(seen, moved / bout, 0).max())
        note("key tile (dq)", (np.abs(scale * np.einsum("hij,jhd->ihd", dS[:, :, K], kk[K])) / bdq).max())
    for Q in tiles(row_runs):
        mk = (scale * np.einsum("hij,ihd->jhd", dS[:, Q], q[Q])).reshape(T, Hkv, r, D).sum(2)
        mv = np.einsum("hij,ihd->jhd", P[:, Q], do[Q]).reshape(T, Hkv, r, D).sum(2)
        note("query tile (dk, dv)", max((np.abs(mk) / bdk).max(), (np.abs(mv) / bdv).max()))
    if Hq > 1:
        note("head (out)", (np.abs(np.roll(out, -1, 1) - out) / bout).max())
        note("head (dq)", (np.abs(np.roll(dq, -1, 1) - dq) / bdq).max())
    if Hkv > 1:
        note("head (dk, dv)", max((np.abs(np.roll(dk, -1, 1) - dk) / bdk).max(),
                                  (np.abs(np.roll(dv, -1, 1) - dv) / bdv).max()))
    return worst


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
    """The host's fp64 kernels: one rounding per output, the fp64 model's bounds."""
    lay = rlk.prefix_layout([17, 1], [[1, 5, 29], [7]])
    T = lay.tokens
    q, k, v, do = (grid(rng, (T, h, D)).astype(np.float16) for h in (Hq, Hkv, Hkv, Hq))
    scale = 0.2
    out, lse = rlk.prefix_attention(q, k, v, lay, scale=scale)
    dq, dk, dv = rlk.prefix_attention_backward(q, k, v, lay, out, lse, do, scale=scale)
    ref, bnd = replicated_ref(lay, *(x.astype(np.float64) for x in (q, k, v, do)), scale,
                              arith(True, D, False, False, T))
    for name, got, want, b in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, dq, dk, dv), ref, bnd):
        check_within(name, got, want, b)


def test_gpu_bounds_catch_faults(rng):
    """On the CUDA case's layout (below) and inputs drawn as it draws them, the GPU bounds are
    well below what a dropped key or query tile or a mixed-up head moves: it moves some element by
    more than twice its bound (a fault then shows through any error within the bound). Needs no
    device: the reference alone."""
    lay = rlk.prefix_layout([77], [[1, 33, 70]])
    T, Hq, Hkv, D = lay.tokens, 8, 2, 128
    q, k, v, do = (grid(rng, (T, h, D)) for h in (Hq, Hkv, Hkv, Hq))
    ref, bnd = replicated_ref(lay, q, k, v, do, D ** -0.5, arith(False, D, True, True, T))
    for kind, x in power(lay, q, k, v, do, D ** -0.5, ref, bnd).items():
        assert x > 2, "%s: moves no element by more than twice its bound (%.3g)" % (kind, x)


def test_bad_layout(host):
    lay = rlk.PrefixLayout([0, 4, 4, 12], [0, 3])  # a response of length 0
    x = np.zeros((12, 1, 64), np.float16)
    with pytest.raises(rlk.InvalidArgument, match="seq_offsets"):
        rlk.prefix_attention(x, x, x, lay)
    # a scale that f32 makes 0 would be read as the default 1/sqrt(D)
    good = rlk.PrefixLayout([0, 4, 8, 12], [0, 3])
    with pytest.raises(rlk.InvalidArgument, match="^scale: 1e-50 is 0 as an f32"):
        rlk.prefix_attention(x, x, x, good, scale=1e-50)
    # offsets past i32 once wrapped into another layout where torch was not loaded
    with pytest.raises(rlk.InvalidArgument, match="seq_offsets: 4294967299 is not an i32"):
        rlk.PrefixLayout([0, 2 ** 32 + 3, 6], [0, 2])


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
def test_out_with_autograd_is_refused(host):
    """out= with inputs requiring grad: autograd makes the output, so the buffer would be left
    unwritten; refused instead."""
    import torch
    lay = rlk.PrefixLayout([0, 4, 8, 12], [0, 3])
    q = torch.randn(12, 1, 64, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(rlk.InvalidArgument, match="out="):
        rlk.prefix_attention(q, q.detach(), q.detach(), lay, out=torch.empty_like(q))
    with torch.no_grad():
        out = torch.zeros_like(q)
        assert rlk.prefix_attention(q, q, q, lay, out=out).out is out and out.abs().sum() > 0


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device (or no torch)")
def test_cuda_autograd(rng):
    """rlk.autograd.prefix_attention on the device against the fp64 reference, every element of
    out, dq, dk and dv within the bound of the device's kernels (bf16)."""
    import torch
    from rlk.autograd import prefix_attention as pa_autograd
    _, lay = rlk.pack_grpo([torch.zeros(77, 1)], [[torch.zeros(n, 1) for n in (1, 33, 70)]])
    T, Hq, Hkv, D = lay.tokens, 8, 2, 128
    host = [grid(rng, (T, h, D)) for h in (Hq, Hkv, Hkv, Hq)]  # exact in bf16
    q, k, v = (torch.tensor(x, device="cuda", dtype=torch.bfloat16, requires_grad=True) for x in host[:3])
    do = torch.tensor(host[3], device="cuda", dtype=torch.bfloat16)
    out = pa_autograd(q, k, v, lay)
    out.backward(do)
    major = torch.cuda.get_device_capability()[0]
    ref, bnd = replicated_ref(lay, *host, D ** -0.5, arith(False, D, True, major >= 8, T))
    for name, got, i in (("out", out, 0), ("dq", q.grad, 2), ("dk", k.grad, 3), ("dv", v.grad, 4)):
        check_within(name, got.detach().float().cpu().numpy(), ref[i], bnd[i])


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device (or no torch)")
def test_cuda_on_a_side_stream(rng):
    """stream=: the forward and backward run on the given stream and equal the default stream's
    bit for bit (the layout the call keeps alive is no tensor to tell the allocator of)."""
    import torch
    lay = rlk.prefix_layout([37], [[5, 20]])
    T, H, D = lay.tokens, 2, 64
    q, k, v, do = (torch.tensor(grid(rng, (T, H, D)), device="cuda", dtype=torch.bfloat16) for _ in range(4))
    want = rlk.prefix_attention(q, k, v, lay)
    want_grads = rlk.prefix_attention_backward(q, k, v, lay, want.out, want.lse, do)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = rlk.prefix_attention(q, k, v, lay, stream=s)
        grads = rlk.prefix_attention_backward(q, k, v, lay, got.out, got.lse, do, stream=s)
    s.synchronize()
    assert torch.equal(got.out, want.out)
    for a, b in zip(grads, want_grads):
        assert torch.equal(a, b)

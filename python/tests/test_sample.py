"""rlk.sample: tokens drawn from the filtered distribution (a quick chi-square against numpy's
fp64 filter), logp bitwise equal to rlk.logprob, per-row settings, seeds and errors."""
import numpy as np
import pytest

import rlk
from conftest import HAVE_CUDA

pytestmark = pytest.mark.skipif(not rlk.OPS["sample"].available(),
                                reason="the loaded librlk has no rlk_sample")


def filtered_probs(x, T, k, p):
    """vLLM's order on one row, ties at a threshold kept: top-k, then top-p, in fp64."""
    x = x.astype(np.float64)
    keep = np.ones_like(x, bool)
    if 0 < k < x.size:
        keep &= x >= np.sort(x)[::-1][k - 1]
    w = np.where(keep, np.exp((x - x.max()) / T), 0.0)
    if p < 1.0:
        order = np.argsort(-x, kind="stable")
        above = 0.0
        z = w.sum()
        kept = np.zeros_like(keep)
        i = 0
        while i < x.size and keep[order[i]] and above < p * z:
            g = i
            while g < x.size and x[order[g]] == x[order[i]]:
                kept[order[g]] = True
                above += w[order[g]]
                g += 1
            i = g
        w = np.where(kept, w, 0.0)
    return w / w.sum()


def chi_square(counts, want):
    """The statistic over the tokens expected at least 5 times, the rest pooled in one bin, and
    its degrees of freedom."""
    e = want * counts.sum()
    m = e >= 5
    o, x = list(counts[m]), list(e[m])
    if e[~m].sum() >= 5:
        o.append(counts[~m].sum())
        x.append(e[~m].sum())
    o, x = np.array(o), np.array(x)
    return float(((o - x) ** 2 / x).sum()), len(x) - 1


def chi_square_bound(df, z=6.0):
    """The chi-square quantile about z sigma out (Wilson-Hilferty): a correct sampler passes all
    but about once in 1e9 runs, where df + 6 sqrt(2 df) fails about once in 5000 at small df."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * np.sqrt(a)) ** 3


def test_distribution(place, rng):
    V, B, T, k, p = 50, 4000, 0.8, 12, 0.85
    # a row that keeps a few tokens, none of the top-p partial sums within rounding of p
    while True:
        row = (rng.standard_normal(V) * 1.5).astype(np.float32)
        w = np.sort(np.exp((row.astype(np.float64) - row.max()) / T))[::-1][:k]
        cum = np.cumsum(w) / w.sum()
        if cum[0] < 0.6 and np.abs(cum - p).min() > 1e-4:
            break
    logits = np.tile(row, (B, 1))
    seeds = rng.integers(-2**62, 2**62, B).astype(np.int64)
    want = filtered_probs(row, T, k, p)
    counts = np.zeros(V)
    for off in range(5):
        out = rlk.sample(place.to(logits), temperature=T, top_k=k, top_p=p,
                         seed=place.to(seeds), offset=off)
        tok = place.back(out.tokens)
        assert tok.dtype == np.int64 and tok.min() >= 0
        np.add.at(counts, tok, 1)
    assert np.all(counts[want == 0] == 0), "a filtered-out token was drawn"
    chi, df = chi_square(counts, want)
    assert df >= 1 and chi < chi_square_bound(df), "chi-square %.1f over %d bins" % (chi, df + 1)


def test_logp_matches_logprob_bitwise(place, rng):
    B, V = 9, 3001
    logits = (rng.standard_normal((B, V)) * 3).astype(np.float32)
    temps = np.array([1.0, 0.7, 0.0, 1.3, 0.5, 1.0, 0.9, 2.0, 0.0], np.float32)
    out = rlk.sample(place.to(logits), temperature=place.to(temps), top_p=0.9, seed=7,
                     logp_filtered=True)
    tok, lp = place.back(out.tokens), place.back(out.logp)
    # rlk.logprob over the same tensor (a row's 16-byte alignment shapes how it is summed), one
    # call per temperature
    x = place.to(logits)
    for t in sorted(set(float(v) or 1.0 for v in temps)):
        ref = place.back(rlk.logprob(x, place.to(tok), temperature=t, lse=False).logp)
        for i in range(B):
            if (float(temps[i]) or 1.0) == t:
                assert ref[i].tobytes() == lp[i].tobytes(), "row %d" % i
    greedy = temps == 0
    assert np.all(tok[greedy] == logits[greedy].argmax(1))
    assert np.all(place.back(out.logp_filtered)[greedy] == 0.0)


def test_seeds_reproduce_and_rows_are_independent(place, rng):
    V = 700
    row = (rng.standard_normal(V) * 0.3).astype(np.float32)
    logits = np.tile(row, (32, 1))
    seeds = rng.integers(0, 2**62, 32).astype(np.int64)
    a = place.back(rlk.sample(place.to(logits), seed=place.to(seeds), offset=3).tokens)
    b = place.back(rlk.sample(place.to(logits), seed=place.to(seeds), offset=3).tokens)
    assert np.array_equal(a, b)
    # a row keeps its token when it moves to another batch
    c = place.back(rlk.sample(place.to(logits[:3]), seed=place.to(seeds[[5, 0, 31]]), offset=3).tokens)
    assert np.array_equal(c, a[[5, 0, 31]])
    # a scalar seed still gives rows their own draws
    d = place.back(rlk.sample(place.to(logits), seed=11, token_dtype="i32").tokens)
    assert d.dtype == np.int32 and len(set(d.tolist())) > 8


def test_bad_rows_and_arguments(place):
    x = np.zeros((3, 10), np.float32)
    x[1, 4] = np.nan
    x[2, :] = -np.inf
    status = place.to(np.zeros(1, np.int32))
    out = rlk.sample(place.to(x), status=status, seed=1)
    tok = place.back(out.tokens)
    assert tok[0] >= 0 and tok[1] == -1 and tok[2] == -1
    assert place.back(status)[0] == rlk.SAMPLE_STATUS_NAN | rlk.SAMPLE_STATUS_NO_TOKEN
    with pytest.raises(rlk.InvalidArgument, match="temperature"):
        rlk.sample(place.to(x), temperature=-1.0)
    with pytest.raises(rlk.InvalidArgument, match="top_p"):
        rlk.sample(place.to(x), top_p=0.0)
    with pytest.raises(rlk.InvalidArgument, match="seeds"):
        rlk.sample(place.to(x), seed=place.to(np.zeros(2, np.int64)))
    with pytest.raises(rlk.InvalidArgument, match="logits"):
        rlk.sample(place.to(x.astype(np.float64)))
    # numbers the library's f32 would read as another setting: a temperature of 0 (greedy), a
    # top_p of 0, an infinite temperature
    for kw in ({"temperature": 1e-50}, {"temperature": 1e39}, {"top_p": 1e-50}, {"min_p": 1e-60}):
        name = next(iter(kw))
        with pytest.raises(rlk.InvalidArgument, match=r"^%s: .* as an f32" % name):
            rlk.sample(place.to(x), seed=1, **kw)


def test_integer_settings_the_library_cannot_hold(place):
    # int64_t top_k and uint64_t seed / offset: a wider Python int's low bits would be another
    # setting (2^64 + 1 as top_k 1 cuts a row of distinct logits to its maximum), a fraction
    # another top_k
    x = np.tile(np.arange(8, dtype=np.float32), (2, 1))
    for kw in ({"top_k": 2**64 + 1}, {"top_k": 2**63}, {"top_k": -2**64 + 1}, {"top_k": 2.5},
               {"top_k": float("nan")}, {"seed": 2**64}, {"seed": -2**63 - 1}, {"offset": 2**64 + 3},
               {"seed": 1.5}):
        name = next(iter(kw))
        with pytest.raises(rlk.InvalidArgument, match="^%s: " % name):
            rlk.sample(place.to(x), **kw)
    # the bounds themselves, and an integral float, are taken: top_k 2^63 - 1 keeps every token
    out = rlk.sample(place.to(x), top_k=2**63 - 1, seed=2**64 - 1, offset=-2**63, threshold=True)
    assert np.all(place.back(out.threshold) == -np.inf)
    out = rlk.sample(place.to(x), top_k=2.0, threshold=True)
    assert np.all(place.back(out.threshold) == 6.0)


def test_torch_ops_sample_refuses_wide_seeds(host):
    # torch.compile's operator takes seeds as signed int64: a wider number is refused as
    # rlk.sample refuses it, not masked to its low bits
    torch = pytest.importorskip("torch")
    from rlk import torch_ops
    x = torch.zeros(2, 8)
    for kw in ({"seed": 2**64}, {"offset": -2**63 - 1}):
        with pytest.raises(rlk.InvalidArgument, match="^%s: " % next(iter(kw))):
            torch_ops.sample(x, **kw)
    a = torch_ops.sample(x, seed=2**64 - 1, offset=3).tokens
    assert torch.equal(a, rlk.sample(x, seed=-1, offset=3).tokens)


def test_row_split_changes_nothing(place, rng):
    # rows of 80 KB: a 512-thread layout, which sm_90 can split over a cluster
    B, V = 5, 20000
    logits = (rng.standard_normal((B, V)) * 2).astype(np.float32)
    temps = place.to(np.array([1.0, 0.0, 0.6, 1.0, 1.7], np.float32))
    seeds = place.to(rng.integers(0, 2**62, B).astype(np.int64))
    x = place.to(logits)
    one = rlk.sample(x, temperature=temps, seed=seeds, offset=9, row_split=1)
    for split in (2, 8, "auto", rlk.SAMPLE_ROW_SPLIT_AUTO):
        out = rlk.sample(x, temperature=temps, seed=seeds, offset=9, row_split=split)
        assert np.array_equal(place.back(out.tokens), place.back(one.tokens)), split
        assert place.back(out.logp).tobytes() == place.back(one.logp).tobytes(), split
    with pytest.raises(rlk.InvalidArgument, match="row_split"):
        rlk.sample(x, row_split=3)


def test_plain_launch_changes_nothing(place, rng):
    # pdl=False: a plain launch where the default may overlap the previous kernel's end
    logits = place.to((rng.standard_normal((6, 3000)) * 2).astype(np.float32))
    seeds = place.to(rng.integers(0, 2**62, 6).astype(np.int64))
    a = rlk.sample(logits, seed=seeds, offset=4)
    b = rlk.sample(logits, seed=seeds, offset=4, pdl=False)
    assert np.array_equal(place.back(a.tokens), place.back(b.tokens))
    assert place.back(a.logp).tobytes() == place.back(b.logp).tobytes()


@pytest.mark.skipif(not HAVE_CUDA, reason="needs torch with a CUDA device")
def test_against_torch_distribution():
    import torch
    torch.manual_seed(0)
    V, B = 64, 8192
    row = torch.randn(V, device="cuda") * 2
    logits = row.expand(B, V).contiguous()
    seeds = torch.randint(0, 2**62, (B,), device="cuda", dtype=torch.int64)
    counts = torch.zeros(V, device="cuda")
    for off in range(8):
        out = rlk.sample(logits, temperature=1.0, seed=seeds, offset=off)
        counts += torch.bincount(out.tokens, minlength=V)
    p = torch.softmax(row.double(), 0)
    chi, df = chi_square(counts.double().cpu().numpy(), p.cpu().numpy())
    assert chi < chi_square_bound(df), "chi-square %.1f over %d bins" % (chi, df + 1)
    lp = torch.log_softmax(logits.float(), -1).gather(1, out.tokens[:, None])[:, 0]
    assert torch.allclose(out.logp, lp, atol=1e-5)

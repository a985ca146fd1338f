"""The front-ends users know: "cpu" as the host backend's name, empty batches as no-ops, the
nn.Module wrappers (rlk.nn) and the FlashInfer-style sampling functions (rlk.sampling)."""
import numpy as np
import pytest

import rlk

try:
    import torch
except ImportError:
    torch = None

need_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
pytestmark = pytest.mark.usefixtures("host")


def test_cpu_names_the_host_backend():
    assert rlk.context("cpu") is rlk.context("host")
    assert rlk.Backend.CPU is rlk.Backend.HOST
    assert rlk.context("cpu").backend == rlk.Backend.HOST
    # a name that is none lists every one, "cpu" among them
    with pytest.raises(rlk.InvalidArgument, match="backend: 'gpu' is not one of auto, cuda, hip, host, cpu"):
        rlk.context("gpu")


def _empty_calls(z, m, logits, labels):
    """Every functional op on a batch with no rows."""
    return {
        "group_advantage": lambda: rlk.group_advantage(z[:, 0], 4, mask=m, broadcast=True),
        "policy_loss": lambda: rlk.policy_loss(z, z, z, m),
        "value_loss": lambda: rlk.value_loss(z, z, z, m),
        "gae": lambda: rlk.gae(z, z, m),
        "discounted_returns": lambda: rlk.discounted_returns(z, m),
        "reverse_cumsum": lambda: rlk.reverse_cumsum(z, m),
        "masked_whiten": lambda: rlk.masked_whiten(z, m),
        "token_kl": lambda: rlk.token_kl(z, z, "k3", mask=m),
        "token_baseline": lambda: rlk.token_baseline(z, z, z, 4, mask=m),
        "logprob": lambda: rlk.logprob(logits, labels, entropy=True),
        "sample": lambda: rlk.sample(logits, top_k=5),
    }


def test_empty_batches_are_no_ops_numpy():
    z = np.zeros((0, 8), np.float32)
    m = np.zeros((0, 8), bool)
    logits, labels = np.zeros((0, 16), np.float32), np.zeros(0, np.int64)
    ctx = rlk.context("host")
    before = ctx.counters()["calls"]
    out = {name: fn() for name, fn in _empty_calls(z, m, logits, labels).items()}
    assert ctx.counters()["calls"] == before  # no kernel was looked up, none launched
    pl = out["policy_loss"]
    assert pl.loss.shape == (1,) and pl.loss[0] == 0 and pl.grad_logp.shape == (0, 8)
    assert not pl.metrics.any()
    assert out["value_loss"].loss[0] == 0
    adv, tok = out["group_advantage"]
    assert adv.shape == (0,) and tok.shape == (0, 8)
    assert out["logprob"].logp.shape == (0,) and out["logprob"].entropy.shape == (0,)
    assert out["sample"].tokens.shape == (0,)


@need_torch
def test_empty_batches_are_no_ops_torch_and_autograd():
    z = torch.zeros(0, 8)
    m = torch.zeros(0, 8, dtype=torch.bool)
    logits, labels = torch.zeros(0, 16), torch.zeros(0, dtype=torch.int64)
    ctx = rlk.context("cpu")
    before = ctx.counters()["calls"]
    for fn in _empty_calls(z, m, logits, labels).values():
        fn()
    logp = z.clone().requires_grad_(True)
    loss, metrics = rlk.autograd.policy_loss(logp, z, z, m)
    loss.backward()
    assert float(loss.detach()) == 0.0 and logp.grad.shape == (0, 8)
    hidden = torch.zeros(0, 4, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.ones(16, 4, dtype=torch.bfloat16, requires_grad=True)
    lp = rlk.autograd.linear_token_logprob(hidden, weight, labels)
    lp.sum().backward()
    assert lp.shape == (0,)
    assert torch.equal(weight.grad, torch.zeros_like(weight))  # no row: a zero gradient
    assert ctx.counters()["calls"] == before


@need_torch
def test_an_empty_batch_needs_every_row_tensor_empty():
    """A call is an empty batch only when every tensor of the batch's rows has none: one empty
    input beside others with rows is refused as the library would refuse it, naming both; an
    empty weight (its rows are the vocabulary's) goes to the library, which names it."""
    z, z5 = torch.zeros(0, 8), torch.zeros(5, 8)
    m5 = torch.ones(5, 8, dtype=torch.bool)
    none64 = torch.zeros(0, dtype=torch.int64)
    hidden = torch.randn(5, 16).to(torch.bfloat16)
    weight = torch.randn(40, 16).to(torch.bfloat16)
    refused = {
        "logprob": (lambda: rlk.logprob(torch.randn(5, 16), none64), "labels has no rows but logits has 5"),
        "policy_loss": (lambda: rlk.policy_loss(z, z, z, m5), "has no rows but mask has 5"),
        "token_kl": (lambda: rlk.token_kl(z, z5, "k3"), "logp has no rows but ref_logp has 5"),
        "linear_logprob": (lambda: rlk.linear_logprob(hidden, weight, none64),
                           "labels has no rows but hidden has 5"),
        "gae": (lambda: rlk.gae(z, z5), "rewards has no rows but values has 5"),
    }
    for name, (fn, msg) in refused.items():
        with pytest.raises(rlk.InvalidArgument, match=msg):
            fn()
    with pytest.raises(rlk.InvalidArgument, match="weight: shape.0. = 0"):
        rlk.linear_logprob(hidden, weight[:0], torch.zeros(5, dtype=torch.int64))
    with pytest.raises(rlk.InvalidArgument, match="logits: shape.1. = 0"):
        rlk.logprob(torch.zeros(5, 0), torch.zeros(5, dtype=torch.int64))


@need_torch
def test_an_empty_selection_and_given_outputs():
    """rows= selecting none of hidden's rows is an empty batch (hidden's rows are not the
    batch's then); its backward writes a given grad_hidden's rows 0, as a call does to the rows
    it does not select, and leaves them with accumulate=True; a given grad_weight likewise."""
    hidden = torch.randn(5, 16).to(torch.bfloat16)
    weight = torch.randn(40, 16).to(torch.bfloat16)
    none64 = torch.zeros(0, dtype=torch.int64)
    out = rlk.linear_logprob(hidden, weight, none64, rows=none64, entropy=True)
    assert out.logp.shape == (0,) and out.entropy.shape == (0,)
    nothing = torch.zeros(0)
    for accumulate in (False, True):
        gh, gw = torch.full((5, 16), 3.0), torch.full((40, 16), 2.0)
        rlk.linear_logprob_backward(hidden, weight, none64, nothing, nothing, rows=none64,
                                    grad_hidden=gh, grad_weight=gw, accumulate=accumulate)
        assert torch.equal(gh, torch.full_like(gh, 3.0 if accumulate else 0.0))
        assert torch.equal(gw, torch.full_like(gw, 2.0 if accumulate else 0.0))
    with pytest.raises(rlk.InvalidArgument, match="labels has no rows but .* has 2"):
        rlk.linear_logprob(hidden, weight, none64, rows=torch.tensor([0, 3]))
    # a status word is ORed into by every call, never cleared: an empty batch leaves its bits
    st = torch.tensor([4], dtype=torch.int32)
    rlk.logprob(torch.zeros(0, 8), none64, status=st)
    rlk.linear_logprob(hidden, weight, none64, rows=none64, status=st)
    assert st.tolist() == [4]
    assert rlk.kernel_trees.__name__ == "rlk.kernel_trees"  # loaded on first use


# ---- rlk.nn -------------------------------------------------------------------------------

N, H, V = 24, 32, 96


def _head(gen):
    hidden = torch.randn(4, N // 4, H, generator=gen).to(torch.bfloat16)
    weight = (torch.randn(V, H, generator=gen) * 0.3).to(torch.bfloat16)
    labels = torch.randint(0, V, (4, N // 4), generator=gen)
    labels[0, :2] = -100
    return hidden, weight, labels


@need_torch
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_fused_linear_cross_entropy_matches_fp64(reduction):
    gen = torch.Generator().manual_seed(7)
    hidden, weight, labels = _head(gen)
    h = hidden.detach().clone().requires_grad_(True)
    w = weight.detach().clone().requires_grad_(True)
    loss = rlk.nn.FusedLinearCrossEntropyLoss(reduction=reduction)(w, h, labels)
    # fp64 reference from the same bf16 values (their products are exact in fp64)
    h64 = hidden.double().requires_grad_(True)
    w64 = weight.double().requires_grad_(True)
    z = h64.reshape(-1, H) @ w64.T
    ref = torch.nn.functional.cross_entropy(z, labels.reshape(-1), reduction=reduction,
                                            ignore_index=-100)
    # rlk's per-token logp is f32: within 4 ulp of f32 of |lse| + |z_y| (the two terms it is
    # the difference of, each rounded to f32 once and the result once more)
    lse = torch.logsumexp(z, -1)
    zy = z.gather(1, labels.reshape(-1, 1).clamp(min=0))[:, 0]
    tok_tol = 4 * 2.0 ** -24 * (lse.abs() + zy.abs() + 1)
    tok_tol = torch.where(labels.reshape(-1) == -100, torch.zeros_like(tok_tol), tok_tol)
    if reduction == "none":
        assert loss.shape == labels.shape
        err = (loss.double().reshape(-1) - ref).abs()
        assert (err <= tok_tol).all(), (err - tok_tol).max()
    else:
        # a sum of f32 terms adds one f32 rounding per term of the running sum
        tol = tok_tol.sum() + tok_tol.numel() * 2.0 ** -24 * ref.abs() * (
            1 if reduction == "sum" else (labels != -100).sum())
        if reduction == "mean":
            tol = tol / (labels != -100).sum()
        assert abs(float(loss.detach()) - float(ref.detach())) <= float(tol.detach())
    (loss.sum() if reduction == "none" else loss).backward()
    (ref.sum() if reduction == "none" else ref).backward()
    # gradients come back bf16: rounded once (2^-8 of each value) after an f32 accumulation over
    # the rows (or vocabulary) whose error is at most (terms) * 2^-24 * sum |terms| (bounded here
    # by |dz| @ |h| and |dz| @ |w| in fp64)
    p = torch.softmax(z, -1)
    onehot = torch.zeros_like(p)
    valid = labels.reshape(-1) != -100
    onehot[valid, labels.reshape(-1)[valid]] = 1
    scale = (1.0 / valid.sum()) if reduction == "mean" else 1.0
    dz = ((p - onehot) * valid[:, None] * scale).abs()
    for got, want, bound, terms in ((w.grad, w64.grad, dz.T @ h64.detach().reshape(-1, H).abs(), N),
                                    (h.grad.reshape(-1, H), h64.grad.reshape(-1, H),
                                     dz @ w64.detach().abs(), V)):
        tol = 2.0 ** -8 * want.abs() + terms * 2.0 ** -24 * bound * (1 + 2.0 ** -8)
        err = (got.double() - want).abs()
        assert (err <= tol + 1e-300).all(), (err - tol).max()


@need_torch
def test_fused_linear_cross_entropy_mean_of_no_tokens_is_zero():
    """Every target ignore_index (a micro-batch of prompt tokens): the mean is 0, with a zero
    gradient, as Liger's FusedLinearCrossEntropyLoss gives (its count taken as at least 1), not
    the 0 / 0 of torch's cross_entropy, whose NaN a trainer would step on."""
    gen = torch.Generator().manual_seed(8)
    hidden, weight, labels = _head(gen)
    h = hidden.detach().clone().requires_grad_(True)
    w = weight.detach().clone().requires_grad_(True)
    ignored = torch.full_like(labels, -100)
    loss = rlk.nn.FusedLinearCrossEntropyLoss()(w, h, ignored)
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert torch.count_nonzero(h.grad) == 0 and torch.count_nonzero(w.grad) == 0
    # one token scored: the mean is that token's loss alone
    one = ignored.clone()
    one[1, 2] = labels[1, 2].clamp(min=0)
    per_token = rlk.nn.FusedLinearCrossEntropyLoss(reduction="none")(weight, hidden, one)
    assert torch.equal(rlk.nn.FusedLinearCrossEntropyLoss()(weight, hidden, one).detach(),
                       per_token.sum().detach())


@need_torch
def test_autograd_entropy_with_ignore_index_none_is_the_default():
    """ignore_index=None is the ops' default (-100), as rlk.logprob takes it: the entropy that
    rlk.autograd returns is 0 on the rows labelled -100 and the fp64 entropy elsewhere."""
    from rlk import autograd as A
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 16, generator=gen)
    labels = torch.randint(0, 16, (6,), generator=gen)
    labels[2] = -100
    z = logits.double()
    want = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    want[2] = 0
    # f32 entropy of 16 logits of magnitude ~3: a few f32 ulps of log(16) + |z|
    _, ent = A.token_logprob(logits.clone().requires_grad_(True), labels, entropy=True,
                             ignore_index=None)
    torch.testing.assert_close(ent.detach().double(), want, rtol=0, atol=1e-5)
    hidden, weight, _ = _head(gen)
    h = hidden.reshape(-1, H)[:6]
    _, ent = A.linear_token_logprob(h, weight, labels.clamp(max=V - 1), entropy=True,
                                    ignore_index=None)
    z = h.double() @ weight.double().T
    want = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    want[2] = 0
    torch.testing.assert_close(ent.double(), want, rtol=0, atol=1e-5)


@need_torch
def test_policy_loss_modules_are_the_autograd_calls():
    gen = torch.Generator().manual_seed(8)
    hidden, weight, labels = _head(gen)
    old = torch.randn(4, N // 4, generator=gen) * 0.1 - 4
    adv = torch.randn(4, generator=gen)
    mask = torch.rand(4, N // 4, generator=gen) > 0.2
    settings = dict(clip_high=0.28, kl_coef=1e-3, entropy_coef=0.01)
    h1, w1 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    mod = rlk.nn.FusedLinearPolicyLoss(**settings)
    loss1, m1 = mod(w1, h1, labels, old, adv, mask, ref_logp=old)
    loss1.backward()
    h2, w2 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    logp, ent = rlk.autograd.linear_token_logprob(h2, w2, labels, entropy=True)
    loss2, m2 = rlk.autograd.policy_loss(logp, old, adv, mask, entropy=ent, ref_logp=old,
                                         **settings)
    loss2.backward()
    for a, b in ((loss1, loss2), (m1, m2), (h1.grad, h2.grad), (w1.grad, w2.grad)):
        assert torch.equal(a, b)
    lp = logp.detach().clone().requires_grad_(True)
    loss3, _ = rlk.nn.PolicyLoss(clip_high=0.28)(lp, old, adv, mask)
    loss4, _ = rlk.autograd.policy_loss(logp.detach(), old, adv, mask, clip_high=0.28)
    assert torch.equal(loss3, loss4)
    with pytest.raises(rlk.InvalidArgument, match="bias"):
        mod(w1, h1, labels, old, adv, mask, bias=torch.zeros(V))
    # entropy_coef given at the call, not at construction: the entropy is computed for it
    h5, w5 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss5, m5 = rlk.nn.FusedLinearPolicyLoss(clip_high=0.28, kl_coef=1e-3)(
        w5, h5, labels, old, adv, mask, ref_logp=old, entropy_coef=0.01)
    loss5.backward()
    for a, b in ((loss5, loss2), (m5, m2), (h5.grad, h2.grad), (w5.grad, w2.grad)):
        assert torch.equal(a, b)


@need_torch
def test_fused_linear_cross_entropy_compiles_without_graph_break():
    gen = torch.Generator().manual_seed(9)
    hidden, weight, labels = _head(gen)
    per_token = rlk.nn.FusedLinearCrossEntropyLoss(reduction="none")
    expl = torch._dynamo.explain(per_token)(weight, hidden, labels)
    assert expl.graph_break_count == 0, expl.break_reasons
    # the operator's own results: bitwise
    assert torch.equal(torch.compile(per_token, fullgraph=True)(weight, hidden, labels),
                       per_token(weight, hidden, labels))
    # the mean is torch's sum, which the compiled graph may add in another order: n f32
    # additions differ by at most n * 2^-24 * sum |terms|
    mean = rlk.nn.FusedLinearCrossEntropyLoss()
    terms = per_token(weight, hidden, labels)
    tol = terms.numel() * 2.0 ** -24 * float(terms.abs().sum()) / float((labels != -100).sum())
    got = torch.compile(mean, fullgraph=True)(weight, hidden, labels)
    assert abs(float(got) - float(mean(weight, hidden, labels))) <= tol


# ---- rlk.sampling -------------------------------------------------------------------------

@need_torch
def test_flashinfer_style_sampling_is_rlk_sample():
    gen = torch.Generator().manual_seed(10)
    logits = torch.randn(6, 50, generator=gen) * 3
    probs = torch.softmax(logits, -1)
    top_k = torch.tensor([1, 5, 10, 50, 3, 7], dtype=torch.int32)
    ids = rlk.sampling.top_k_top_p_sampling_from_logits(logits, top_k, 0.9, seed=123)
    assert ids.dtype == torch.int32 and ids.shape == (6,)
    same = rlk.sample(logits, top_k=top_k, top_p=0.9, seed=123, offset=0).tokens
    assert torch.equal(ids.long(), same)
    assert ids[0] == logits[0].argmax()  # top_k 1 is greedy
    # probabilities are sampled through their logarithm: the rows' distributions are the same
    via_probs = rlk.sampling.top_k_top_p_sampling_from_probs(probs, top_k, 0.9, seed=123)
    assert torch.equal(via_probs.long(), rlk.sample(torch.log(probs), top_k=top_k, top_p=0.9,
                                                    seed=123, offset=0).tokens)
    for fn, arg in ((rlk.sampling.top_k_sampling_from_probs, 3),
                    (rlk.sampling.top_p_sampling_from_probs, 0.5),
                    (rlk.sampling.min_p_sampling_from_probs, 0.2)):
        got = fn(probs, arg, seed=5)
        keep = {rlk.sampling.top_k_sampling_from_probs: lambda p: p >= p.topk(3, -1).values[:, -1:],
                rlk.sampling.min_p_sampling_from_probs: lambda p: p >= 0.2 * p.max(-1, keepdim=True).values}
        if fn in keep:  # the token drawn is one the filter keeps
            assert keep[fn](probs).gather(1, got.long()[:, None]).all()
    assert rlk.sampling.sampling_from_logits(logits, seed=1).dtype == torch.int32


@need_torch
def test_sampling_seeds_come_from_torch_generators():
    logits = torch.randn(4, 32, generator=torch.Generator().manual_seed(11))
    torch.manual_seed(3)
    a = rlk.sampling.sampling_from_logits(logits)
    torch.manual_seed(3)
    b = rlk.sampling.sampling_from_logits(logits)
    assert torch.equal(a, b)
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert torch.equal(rlk.sampling.sampling_from_logits(logits, generator=g1),
                       rlk.sampling.sampling_from_logits(logits, generator=g2))


@need_torch
def test_sampling_checks():
    logits = torch.randn(2, 8)
    logits[1, 3] = float("nan")
    with pytest.raises(ValueError, match="contains NaN"):
        rlk.sampling.sampling_from_logits(logits, check_nan=True)
    with pytest.raises(rlk.Unsupported, match="top_k_first"):
        rlk.sampling.top_k_top_p_sampling_from_logits(torch.randn(2, 8), 2, 0.5,
                                                      filter_apply_order="joint")
    assert rlk.sampling.top_k_top_p_sampling_from_logits(torch.zeros(0, 8), 2, 0.5).shape == (0,)


@need_torch
def test_sampling_indices_and_flashinfer_argument_order():
    """FlashInfer's positional order (indices after the filters) and its indices: output i drawn
    from row indices[i], in indices' dtype; a seed tensor of one value spreads over the rows."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(12)) * 3
    idx = torch.tensor([2, 0, 2, 1, 1, 0, 2, 2], dtype=torch.int64)
    ids = rlk.sampling.top_k_top_p_sampling_from_logits(logits, 5, 0.9, idx, "top_k_first", True, None, False,
                                                        7, 0)
    assert ids.dtype == torch.int64 and ids.shape == (8,)
    assert torch.equal(ids, rlk.sample(logits[idx], top_k=5, top_p=0.9, seed=7, offset=0).tokens)
    i32 = rlk.sampling.sampling_from_logits(logits, idx.int(), seed=3)
    assert i32.dtype == torch.int32
    assert torch.equal(i32.long(), rlk.sample(logits[idx], seed=3, offset=0).tokens)
    top1 = rlk.sampling.top_k_sampling_from_probs(torch.softmax(logits, -1), 1, idx, seed=1)
    assert torch.equal(top1, logits.argmax(-1)[idx])
    flat = torch.zeros(64, 40)  # every row the same distribution: a shared seed must not repeat draws
    a = rlk.sampling.sampling_from_logits(flat, seed=torch.tensor([5]))
    assert torch.equal(a, rlk.sampling.sampling_from_logits(flat, seed=torch.tensor([5])))
    assert len(set(a.tolist())) > 16
    with pytest.raises(ValueError, match="indices"):
        rlk.sampling.sampling_from_logits(logits, torch.tensor([0.5]))


@need_torch
def test_autograd_token_logprob_refuses_its_own_outputs_as_keywords():
    """lse= and logp= are the function's own (it keeps the lse for the backward): an
    InvalidArgument naming them, not a TypeError from inside the forward."""
    import torch
    from rlk import autograd as A
    x = torch.randn(3, 5, requires_grad=True)
    y = torch.tensor([0, 1, 4])
    for kw in (dict(lse=False), dict(logp=torch.empty(3))):
        with pytest.raises(rlk.InvalidArgument, match="%s= is the function's own" % next(iter(kw))):
            A.token_logprob(x, y, **kw)

"""On CUDA: no call synchronizes (every op and autograd wrapper under
torch.cuda.set_sync_debug_mode("error"), the fused LM head's included), and a whole GRPO loss
step, a sampling step and the fused LM head's calls (forward, backward, the policy loss from
hidden states by each path this device runs, the autograd wrapper) captured with
torch.cuda.graph replay on new inputs to bitwise the eager results."""
import functools

import numpy as np
import pytest

import rlk
from conftest import HAVE_CUDA

if not HAVE_CUDA:
    print("test_cuda_graph: skipped, no CUDA device (or no torch)")
    pytest.skip("no CUDA device (or no torch): the sync and graph-capture checks need one",
                allow_module_level=True)

import torch  # noqa: E402
from rlk import autograd as A  # noqa: E402

B, T, G, V = 8, 48, 4, 320  # sequences, tokens, group size, vocabulary


def grpo_inputs(seed):
    """One GRPO batch on the GPU: logits [B*T, V], labels, old and reference log-probs, the
    response mask (lengths in [T/4, T]) and one score per sequence."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    lens = torch.randint(T // 4, T + 1, (B,), generator=g)
    x = {
        "logits": torch.randn(B * T, V, generator=g),
        "labels": torch.randint(0, V, (B * T,), generator=g),
        "old": torch.randn(B, T, generator=g) * 0.1 - 5.0,
        "ref": torch.randn(B, T, generator=g) * 0.1 - 5.0,
        "mask": torch.arange(T)[None, :] < lens[:, None],
        "scores": torch.randn(B, generator=g),
    }
    return {k: v.cuda() for k, v in x.items()}


def grpo_step(x):
    """logprob forward, group advantages, policy loss (token-mean by the device's own mask
    count), logprob backward: what a trainer's loss step launches."""
    logits = x["logits"].detach().requires_grad_(True)
    logp = A.token_logprob(logits, x["labels"]).view(B, T)
    _, adv = rlk.group_advantage(x["scores"], G, mask=x["mask"], broadcast=True)
    loss, metrics = A.policy_loss(logp, x["old"], adv, x["mask"], ref_logp=x["ref"], kl_coef=1e-3,
                                  clip_high=0.28)
    (grad,) = torch.autograd.grad(loss, logits)
    return loss, metrics, grad, adv


def sample_inputs(seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return {"logits": (torch.randn(B, V, generator=g) * 3).cuda(),
            "seeds": torch.randint(0, 2**62, (B,), generator=g).cuda(),
            "offsets": torch.randint(0, 2**20, (B,), generator=g).cuda(),
            "temps": (torch.rand(B, generator=g) + 0.5).cuda()}


def sample_step(x, pdl):
    return rlk.sample(x["logits"], temperature=x["temps"], top_p=0.9, top_k=50, seed=x["seeds"],
                      offset=x["offsets"], logp_filtered=True, pdl=pdl)


HN, HH, HV = B * T, 128, 1000  # the fused LM head's tokens, hidden size and vocabulary


def head_inputs(seed):
    """A head's inputs on the GPU: hidden [HN, HH] and weight [HV, HH] in bf16, labels, and the
    policy loss's old log-probs, advantages and mask over [B, T] (B T = HN)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = {"hidden": torch.randn(HN, HH, generator=g).bfloat16(),
         "weight": (torch.randn(HV, HH, generator=g) * 0.1).bfloat16(),
         "labels": torch.randint(0, HV, (HN,), generator=g),
         "old": torch.randn(B, T, generator=g) * 0.1 - 6.9,
         "adv": torch.randn(B, T, generator=g),
         "mask": torch.rand(B, T, generator=g) > 0.1}
    return {k: v.cuda() for k, v in x.items()}


def head_paths():
    """rlk.linear_policy_loss's paths this device runs (the token chunks need sm_90)."""
    return ["recompute"] + (["token_chunks"] if torch.cuda.get_device_capability() == (9, 0) else [])


HEAD_OUTPUTS = ("logp", "lse", "entropy", "grad_hidden", "grad_weight", "loss", "metrics", "loss logp",
                "loss grad_hidden", "loss grad_weight", "autograd logp", "autograd entropy",
                "autograd grad_hidden", "autograd grad_weight")


def head_step(x, path):
    """The fused LM head as a trainer launches it: rlk.linear_logprob and its backward, the policy
    loss from hidden states (rlk.linear_policy_loss by `path`), and
    rlk.autograd.linear_token_logprob forward and backward."""
    h, w, y = x["hidden"], x["weight"], x["labels"]
    out = rlk.linear_logprob(h, w, y, entropy=True)
    gh, gw = rlk.linear_logprob_backward(h, w, y, out.lse, x["adv"].reshape(-1), x["old"].reshape(-1) * 0.01,
                                         out.entropy)
    pl = rlk.linear_policy_loss(h, w, y, x["old"], x["adv"], x["mask"], clip_high=0.28, entropy_coef=0.01,
                                logp=True, path=path)
    hl, wl = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
    lp, ent = A.linear_token_logprob(hl, wl, y, entropy=True)
    ghl, gwl = torch.autograd.grad((lp * x["adv"].reshape(-1)).sum() + 0.01 * ent.sum(), (hl, wl))
    return (out.logp, out.lse, out.entropy, gh, gw, pl.loss, pl.metrics, pl.logp, pl.grad_hidden,
            pl.grad_weight, lp, ent, ghl, gwl)


def constants():
    """Device tensors made from host data (a copy that waits for the host): before the check."""
    return {"groups": torch.tensor([0, 3, 8], device="cuda"),
            "seq_norm": torch.tensor([B * 2.0], device="cuda"),
            "baseline": torch.randn(B, device="cuda")}


def every_op(x, c):
    """Every functional op and autograd wrapper once, on CUDA tensors."""
    mask, old, ref = x["mask"], x["old"], x["ref"]
    lp = old + 0.05
    adv = torch.randn(B, T, device="cuda")
    rlk.group_advantage(x["scores"], G)
    rlk.group_advantage(x["scores"], G, mask=mask, broadcast=True)
    rlk.group_advantage(x["scores"], group_offsets=c["groups"])
    n = mask.sum(dtype=torch.float64)  # a device scalar: a global count all-reduced on the GPU
    for tn in (None, 300.0, n, n.float().view(1)):
        rlk.policy_loss(lp, old, adv, mask, ref_logp=ref, kl_coef=1e-3, token_normalizer=tn)
    rlk.policy_loss(lp, old, adv, mask, agg="seq-mean-token-mean", mode="gspo",
                    seq_normalizer=c["seq_norm"])
    offs = torch.arange(0, B * T + 1, T, device="cuda")
    rlk.policy_loss(lp.reshape(-1), old.reshape(-1), adv.reshape(-1), mask.reshape(-1).float(),
                    seq_offsets=offs)
    rlk.value_loss(lp, old, adv, mask)
    rlk.value_loss(lp, old, adv, mask, token_normalizer=n, agg="token-mean")
    rlk.gae(adv, lp, mask, gamma=0.99, lam=0.95)
    rlk.discounted_returns(adv, mask)
    rlk.reverse_cumsum(adv, mask, baseline=c["baseline"])
    rlk.masked_whiten(adv, mask, stats=True)
    rlk.token_baseline(adv, old, (lp * lp).exp(), G, mask=mask, rollout_is_weights=lp.exp())
    rlk.token_baseline(adv, old, (lp * lp).exp(), group_offsets=c["groups"], mask=mask, compact=True)
    rlk.token_kl(old, ref, "k3", mask=mask, outputs="both")
    rlk.token_kl(old, ref, "k1", outputs="grad", grad_kl=adv, straight_through=True, old_logp=lp)
    out = rlk.logprob(x["logits"], x["labels"], entropy=True)
    rlk.logprob_backward(x["logits"], x["labels"], out.lse, grad_logp=torch.ones(B * T, device="cuda"))
    rlk.sample(x["logits"][:B], temperature=0.7, top_k=20, seed=1)
    # autograd: forward and backward
    leaf = lp.clone().requires_grad_(True)
    loss, _ = A.policy_loss(leaf, old, adv, mask, ref_logp=ref, kl_coef=1e-3)
    loss.backward()
    vleaf = lp.clone().requires_grad_(True)
    vloss, _ = A.value_loss(vleaf, old, adv, mask)
    vloss.backward()
    kleaf = lp.clone().requires_grad_(True)
    A.token_kl(kleaf, ref, "k3", mask=mask).sum().backward()
    logits = x["logits"].clone().requires_grad_(True)
    logp, ent = A.token_logprob(logits, x["labels"], entropy=True)
    (logp.sum() + ent.sum()).backward()
    assert leaf.grad is not None and vleaf.grad is not None and logits.grad is not None
    assert kleaf.grad is not None
    if rlk.OPS.get("prefix_attention") is not None and rlk.OPS["prefix_attention"].available():
        # a fresh layout: its device copy is made on first use, without waiting either
        lay = rlk.prefix_layout([37], [[1, 20, 30]])
        q, k, v = (torch.randn(lay.tokens, h, 64, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for h in (4, 2, 2))
        A.prefix_attention(q, k, v, lay).sum().backward()
        assert q.grad is not None


def test_no_op_synchronizes():
    x = grpo_inputs(1)
    c = constants()
    hx = head_inputs(1)
    every_op(x, c)  # compiles or loads the kernels
    for path in head_paths():
        head_step(hx, path)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        every_op(x, c)
        grpo_step(x)
        for path in head_paths():
            head_step(hx, path)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    # the check is live: a read-back is refused in this mode
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):
            x["mask"].sum().item()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def capture(fn, static):
    """fn(static) warmed up on a side stream, then captured; returns (graph, outputs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(static)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(static)
    return g, out


def same_bits(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert torch.equal(got.view(torch.uint8) if got.dtype == torch.bool else got, want), \
        "%s: the replay differs from eager (max |diff| %s)" % (
            what, (got.double() - want.double()).abs().max().item())


def replays_bitwise(g, out, static, inputs, step, seeds, names):
    """For each seed: fresh inputs(seed) copied into the captured `static` ones, the graph replayed,
    and its outputs `out` compared bit for bit with step(fresh) run eagerly. Returns the eager
    outputs, one per seed."""
    wants = []
    for seed in seeds:
        fresh = inputs(seed)
        for k, v in fresh.items():
            static[k].copy_(v)
        g.replay()
        want = step(fresh)
        torch.cuda.synchronize()
        for name, got, w in zip(names, out, want):
            same_bits(got, w, name)
        wants.append(want)
    return wants


def test_grpo_loss_step_graph_replays_bitwise():
    static = grpo_inputs(2)
    g, out = capture(grpo_step, static)
    for want in replays_bitwise(g, out, static, grpo_inputs, grpo_step, (3, 4),
                                ("loss", "metrics", "grad_logits", "advantages")):
        assert torch.isfinite(want[0]) and want[2].abs().sum() > 0  # a real step, not zeros


@pytest.mark.parametrize("path", ["recompute", "token_chunks"])
def test_fused_head_graph_replays_bitwise(path):
    if path not in head_paths():
        pytest.skip("the token chunks need sm_90; this device is sm_%d%d" % torch.cuda.get_device_capability())
    static = head_inputs(11)
    step = functools.partial(head_step, path=path)
    g, out = capture(step, static)
    for want in replays_bitwise(g, out, static, head_inputs, step, (12, 13), HEAD_OUTPUTS):
        # a real step, not zeros
        assert torch.isfinite(want[5]) and want[4].abs().sum() > 0 and want[9].abs().sum() > 0


@pytest.mark.parametrize("pdl", [True, False], ids=["pdl", "no-pdl"])
def test_sampling_step_graph_replays_bitwise(pdl):
    static = sample_inputs(5)
    step = functools.partial(sample_step, pdl=pdl)
    g, out = capture(step, static)
    for want in replays_bitwise(g, out, static, sample_inputs, step, (6, 7),
                                ("tokens", "logp", "logp_filtered")):
        assert (want.tokens >= 0).all()


def test_replay_uses_new_normalizer():
    # a device normalizer captured by pointer: a new value in it changes the replayed loss
    x = grpo_inputs(8)
    lp = x["old"] + 0.05
    adv = torch.randn(B, T, device="cuda")
    n = torch.tensor([100.0], device="cuda")

    def step(_):
        return rlk.policy_loss(lp, x["old"], adv, x["mask"], token_normalizer=n)

    g, out = capture(step, None)
    g.replay()
    torch.cuda.synchronize()
    first = out.loss.clone()
    n.fill_(200.0)
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_allclose(out.loss.item() * 2, first.item(), rtol=1e-6)

"""rlk's torch.library operators (rlk.torch_ops): torch.library.opcheck of each (schema, fake
kernel against the real one, autograd registration, AOT dispatch with dynamic shapes), and
torch.compile(fullgraph=True) of GRPO loss steps with no graph break and the eager results
bitwise (the compiled graph calls the same kernels on the same inputs)."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import rlk  # noqa: E402
from rlk import autograd as A  # noqa: E402
from rlk import torch_ops  # noqa: E402

# the cases' CPU tensors need the host backend (CASES is empty without it, and each such test says
# so); the CUDA graph test needs only the device, which a GPU machine without a host compiler has
host_cases = pytest.mark.usefixtures("host")

B, T, G, V, H = 8, 16, 4, 64, 32


def _losses_inputs(gen):
    logp = (torch.randn(B, T, generator=gen) * 0.3 - 2.0)
    old = logp + torch.randn(B, T, generator=gen) * 0.1
    adv = torch.randn(B, T, generator=gen)
    mask = torch.rand(B, T, generator=gen) > 0.2
    return logp, old, adv, mask


def _cases():
    """(name, op, args, kwargs) per registered operator: small inputs of each layout it takes."""
    gen = torch.Generator().manual_seed(1)
    logp, old, adv, mask = _losses_inputs(gen)
    req = logp.clone().requires_grad_(True)
    ent = torch.rand(B, T, generator=gen).requires_grad_(True)
    scores = torch.randn(B, generator=gen)
    logits = torch.randn(B, V, generator=gen)
    labels = torch.randint(0, V, (B,), generator=gen)
    lse = rlk.logprob(logits, labels).lse
    hidden = torch.randn(B, H, generator=gen).to(torch.bfloat16)
    weight = (torch.randn(V, H, generator=gen) * 0.2).to(torch.bfloat16)
    lin = rlk.linear_logprob(hidden, weight, labels, entropy=True)
    rows = torch.tensor([0, 2, 3, 6], dtype=torch.int32)  # a row selection: labels and outputs [4]
    lin_rows = rlk.linear_logprob(hidden, weight, labels[:4], entropy=True, rows=rows)
    q = (torch.randn(20, 2, 64, generator=gen) * 0.5).to(torch.bfloat16)
    k = (torch.randn(20, 1, 64, generator=gen) * 0.5).to(torch.bfloat16)
    v = torch.randn(20, 1, 64, generator=gen).to(torch.bfloat16)
    layout = rlk.prefix_layout([6], [[8, 6]])
    pa = rlk.prefix_attention(q, k, v, layout)
    ops = torch.ops.rlk
    return [
        ("group_advantage", ops.group_advantage, (scores, G), {}),
        ("group_advantage broadcast", ops.group_advantage, (scores, G),
         {"mask": mask, "broadcast": True, "mode": int(rlk.AdvantageMode.RLOO)}),
        ("policy_loss", ops.policy_loss, (req, old, adv, None, mask),
         {"ref_logp": old, "kl_coef": 1e-3, "clip_high": 0.28, "token_normalizer": 90.0}),
        ("policy_loss entropy", ops.policy_loss, (req, old, adv, ent, mask),
         {"entropy_coef": 0.01, "agg": int(rlk.LossAgg.SEQ_MEAN_TOKEN_MEAN)}),
        ("policy_loss normalizer tensor", ops.policy_loss, (req, old, adv, None, mask),
         {"token_normalizer_tensor": torch.tensor([77.0])}),
        ("value_loss", ops.value_loss, (req, old, adv, mask), {"clip": 0.2}),
        ("gae", ops.gae, (adv, old, mask), {"lam": 0.95}),
        ("discounted_returns", ops.discounted_returns, (adv, mask), {"gamma": 0.99}),
        ("reverse_cumsum", ops.reverse_cumsum, (adv, mask), {"baseline": scores}),
        ("masked_whiten", ops.masked_whiten, (adv, mask), {"stats": True}),
        ("token_baseline", ops.token_baseline, (adv, old, torch.rand(B, T, generator=gen), G),
         {"mask": mask}),
        ("token_kl", ops.token_kl, (req, old), {"mask": mask}),
        ("token_kl straight-through", ops.token_kl, (req, old),  # the value alone: its settings kept
         {"mask": mask, "straight_through": True, "old_logp": old}),
        ("logprob", ops.logprob, (logits.clone().requires_grad_(True), labels), {"entropy": True}),
        ("logprob_backward", ops.logprob_backward, (logits, labels, lse, torch.randn(B, generator=gen)), {}),
        ("linear_logprob", ops.linear_logprob,
         (hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True), labels),
         {"entropy": True}),
        ("linear_logprob_backward", ops.linear_logprob_backward,
         (hidden, weight, labels, lin.lse, torch.randn(B, generator=gen), torch.randn(B, generator=gen),
          lin.entropy), {}),
        ("linear_logprob_backward weight alone", ops.linear_logprob_backward,  # hidden's placeholder
         (hidden, weight, labels, lin.lse, torch.randn(B, generator=gen)), {"want_hidden": False, "grad_f32": False}),
        ("linear_logprob rows", ops.linear_logprob,
         (hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True), labels[:4]),
         {"entropy": True, "rows": rows}),
        ("linear_logprob_backward rows", ops.linear_logprob_backward,
         (hidden, weight, labels[:4], lin_rows.lse, torch.randn(4, generator=gen),
          torch.randn(4, generator=gen), lin_rows.entropy), {"rows": rows}),
        ("linear_policy_loss", ops.linear_policy_loss,
         (hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True), labels,
          old[0, :B].reshape(2, B // 2).contiguous(), adv[0, :B].reshape(2, B // 2).contiguous()),
         {"logp": True}),
        ("linear_policy_loss hidden alone", ops.linear_policy_loss,  # weight's placeholder in bf16
         (hidden.clone().requires_grad_(True), weight, labels,
          old[0, :B].reshape(2, B // 2).contiguous(), adv[0, :B].reshape(2, B // 2).contiguous()),
         {"want_weight": False, "grad_f32": False}),
        ("logprob_partials", ops.logprob_partials, (logits[:, 16:48].contiguous(), labels, 16),
         {"entropy": True}),
        ("logprob_combine", ops.logprob_combine, (torch.stack(
            [rlk.logprob_partials(logits[:, :32].contiguous(), labels, 0, entropy=True),
             rlk.logprob_partials(logits[:, 32:].contiguous(), labels, 32, entropy=True)]), labels),
         {"entropy": True}),
        ("linear_logprob_partials", ops.linear_logprob_partials,
         (hidden, weight[:32].contiguous(), labels, 0), {"entropy": True}),
        ("linear_logprob_partials rows", ops.linear_logprob_partials,
         (hidden, weight[:32].contiguous(), labels[:4], 0), {"entropy": True, "rows": rows}),
        ("sample", ops.sample, (logits,), {"temperature": 0.7, "top_k": 10, "seed": 5,
                                           "logp_filtered": True}),
        ("prefix_attention", ops.prefix_attention,
         (q.clone().requires_grad_(True), k.clone().requires_grad_(True),
          v.clone().requires_grad_(True)) + layout.host_tensors, {}),
        ("prefix_attention_backward", ops.prefix_attention_backward,
         (q, k, v) + layout.host_tensors + (pa.out, pa.lse, torch.randn_like(q)), {}),
    ]


def _host_runs():
    """Whether the host backend runs here (the cases' CPU tensors need it; a GPU machine may lack
    its compiler: then every case skips, through the host fixture, with the reason)."""
    try:
        rlk.context("host")
        return True
    except rlk.RlkError:
        return False


CASES = _cases() if rlk.OPS["policy_loss"].available() and _host_runs() else []
NO_CASES = "no cases: the loaded librlk has no rlk_policy_loss, or the host backend does not run here"


@host_cases
@pytest.mark.skipif(not CASES, reason=NO_CASES)
def test_every_operator_has_a_case():
    covered = {str(op) for _, op, _, _ in CASES}
    names = {str(op) for op in torch_ops.OPS.values()}
    assert names <= covered, names - covered


@host_cases
@pytest.mark.parametrize("name,op,args,kwargs", CASES, ids=[c[0] for c in CASES])
def test_opcheck(name, op, args, kwargs):
    torch.library.opcheck(op, args, kwargs)


def _grpo_step_linear(hidden, weight, labels, scores, mask, old):
    adv = rlk.group_advantage(scores, G)
    logp = A.linear_token_logprob(hidden, weight, labels).view(B, T)
    return A.policy_loss(logp, old, adv, mask, clip_high=0.28, ref_logp=old, kl_coef=1e-3)


def _grpo_step_logits(logits, labels, scores, mask, old):
    adv = rlk.group_advantage(scores, G, mode="rloo")
    logp, ent = A.token_logprob(logits, labels, entropy=True)
    return A.policy_loss(logp, old, adv, mask, entropy=ent, entropy_coef=0.01,
                         agg="seq-mean-token-mean")


def _run(fn, leaves, *args):
    for x in leaves:
        x.grad = None
    loss, metrics = fn(*leaves, *args)
    loss.backward()
    return [loss.detach(), metrics] + [x.grad.clone() for x in leaves]


def _graph_breaks(fn, *args):
    expl = torch._dynamo.explain(fn)(*args)
    return expl.graph_count, expl.graph_break_count, [str(r.reason)[:300] for r in expl.break_reasons]


@host_cases
@pytest.mark.skipif(not CASES, reason=NO_CASES)
def test_compiled_grpo_step_fused_head_has_no_graph_break_and_equal_results():
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(B * T, H, generator=gen).to(torch.bfloat16).requires_grad_(True)
    weight = (torch.randn(V, H, generator=gen) * 0.2).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, V, (B * T,), generator=gen)
    scores = torch.randn(B, generator=gen)
    _, old, _, mask = _losses_inputs(gen)
    torch._dynamo.reset()
    graphs, breaks, reasons = _graph_breaks(_grpo_step_linear, hidden, weight, labels, scores,
                                            mask, old)
    assert (graphs, breaks) == (1, 0), reasons
    eager = _run(_grpo_step_linear, [hidden, weight], labels, scores, mask, old)
    compiled = _run(torch.compile(_grpo_step_linear, fullgraph=True), [hidden, weight], labels,
                    scores, mask, old)
    for e, c in zip(eager, compiled):  # the same kernels on the same inputs: the same bits
        assert torch.equal(e, c)


@host_cases
@pytest.mark.skipif(not CASES, reason=NO_CASES)
def test_compiled_grpo_step_logits_has_no_graph_break_and_equal_results():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(B, T, V, generator=gen).requires_grad_(True)
    labels = torch.randint(0, V, (B, T), generator=gen)
    scores = torch.randn(B, generator=gen)
    _, old, _, mask = _losses_inputs(gen)
    torch._dynamo.reset()
    graphs, breaks, reasons = _graph_breaks(_grpo_step_logits, logits, labels, scores, mask, old)
    assert (graphs, breaks) == (1, 0), reasons
    eager = _run(_grpo_step_logits, [logits], labels, scores, mask, old)
    compiled = _run(torch.compile(_grpo_step_logits, fullgraph=True), [logits], labels, scores,
                    mask, old)
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)


_FRESH_STEP = """
import torch, rlk
from rlk import autograd as A
def step(logits, labels, scores, mask, old):
    adv = rlk.group_advantage(scores, 4, mode="rloo")
    logp, ent = A.token_logprob(logits, labels, entropy=True)
    return A.policy_loss(logp, old, adv, mask, entropy=ent, entropy_coef=0.01, agg="seq-mean-token-mean")
g = torch.Generator().manual_seed(4)
args = (torch.randn(8, 16, 64, generator=g).requires_grad_(True), torch.randint(0, 64, (8, 16), generator=g),
        torch.randn(8, generator=g), torch.rand(8, 16, generator=g) > 0.2, -torch.rand(8, 16, generator=g))
loss, _ = torch.compile(step, fullgraph=True)(*args)
loss.backward()
print("compiled", float(loss))
"""


@host_cases
@pytest.mark.skipif(not CASES, reason=NO_CASES)
def test_a_fresh_process_compiles_the_step_whole():
    """The package's first call inside torch.compile(fullgraph=True), nothing called before it
    (the caches that an earlier call fills are empty then): no graph break, so no error."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _FRESH_STEP], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "compiled" in r.stdout, r.stderr[-3000:]


@host_cases
@pytest.mark.skipif(not CASES, reason=NO_CASES)
def test_compiled_functional_calls_match_eager():
    """The functional API (not only rlk.autograd) traces into the operators: advantages,
    returns, whitening, KL and sampling in one graph."""
    gen = torch.Generator().manual_seed(4)
    logp, old, adv, mask = _losses_inputs(gen)
    logits = torch.randn(B, V, generator=gen)

    def fn(logp, old, rewards, mask, logits):
        a, tok = rlk.group_advantage(rewards[:, 0].contiguous(), G, mask=mask, broadcast=True)
        gae_adv, ret = rlk.gae(rewards, old, mask, lam=0.95)
        white = rlk.masked_whiten(gae_adv, mask)
        kl = rlk.token_kl(logp, old, "k3", mask=mask)
        cums = rlk.reverse_cumsum(rewards, mask)
        disc = rlk.discounted_returns(rewards, mask, gamma=0.9)
        s = rlk.sample(logits, temperature=0.8, top_p=0.9, seed=11)
        out = rlk.policy_loss(logp, old, tok, mask)
        return a, tok, ret, white, kl, cums, disc, s.tokens, s.logp, out.loss, out.grad_logp

    torch._dynamo.reset()
    graphs, breaks, reasons = _graph_breaks(fn, logp, old, adv, mask, logits)
    assert (graphs, breaks) == (1, 0), reasons
    eager = fn(logp, old, adv, mask, logits)
    compiled = torch.compile(fn, fullgraph=True)(logp, old, adv, mask, logits)
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)


@host_cases
@pytest.mark.skipif(not CASES, reason=NO_CASES)
def test_compiled_prefix_attention_takes_new_layouts_as_data():
    """Each step's packed batch has its own layout: the compiled prefix attention takes it as
    data (its offsets are tensors), so new layouts of new lengths cost no graph past the one
    that makes the shapes dynamic, with the eager results bitwise, and the layouts kept by the
    operators stay bounded."""
    from torch._dynamo.utils import counters

    def fn(q, k, v, layout):
        return A.prefix_attention(q, k, v, layout).float().square().sum()

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    gen = torch.Generator().manual_seed(6)
    for i in range(torch_ops._KEPT_LAYOUTS + 4):
        layout = rlk.prefix_layout([5 + i % 3, 4], [[3 + i, 2], [1 + i % 5]])
        n = layout.tokens
        q, k, v = (torch.randn(n, h, 64, generator=gen).to(torch.bfloat16) for h in (2, 1, 1))
        args = [x.clone().requires_grad_(True) for x in (q, k, v)]
        want = fn(*args, layout)
        want.backward()
        got_args = [x.clone().requires_grad_(True) for x in (q, k, v)]
        got = compiled(*got_args, layout)
        got.backward()
        assert torch.equal(got, want)
        for a, b in zip(got_args, args):
            assert torch.equal(a.grad, b.grad)
    assert counters["stats"]["unique_graphs"] <= 2
    assert len(torch_ops._LAYOUTS) <= torch_ops._KEPT_LAYOUTS


@host_cases
@pytest.mark.skipif(not CASES, reason=NO_CASES)
def test_stream_is_refused_under_compile():
    logp, old, adv, mask = _losses_inputs(torch.Generator().manual_seed(5))

    def fn(logp):
        return rlk.policy_loss(logp, old, adv, mask, stream=0).loss

    with pytest.raises(Exception, match="stream= is not supported under torch.compile"):
        torch.compile(fn, fullgraph=True)(logp)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: CUDA graphs need one")
def test_reduce_overhead_replays_bitwise(monkeypatch):
    """mode="reduce-overhead": the step is captured in a CUDA graph and replayed; each replay
    gives the eager bits, and once the graphs are recorded a replay calls no op of the package:
    no rlk Binder is made (every op call makes one, in any thread: the backward's too)."""
    dev = "cuda"
    gen = torch.Generator().manual_seed(6)
    hidden = torch.randn(B * T, 64, generator=gen).to(dev, torch.bfloat16).requires_grad_(True)
    weight = (torch.randn(256, 64, generator=gen) * 0.2).to(dev, torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, 256, (B * T,), generator=gen).to(dev)
    scores = torch.randn(B, generator=gen).to(dev)
    _, old, _, mask = (x.to(dev) for x in _losses_inputs(gen))
    eager = _run(_grpo_step_linear, [hidden, weight], labels, scores, mask, old)
    calls = []
    made = rlk._tensor.Binder.__init__

    def counted(self, op):
        calls.append(op.name)
        made(self, op)

    monkeypatch.setattr(rlk._tensor.Binder, "__init__", counted)
    step = torch.compile(_grpo_step_linear, mode="reduce-overhead", fullgraph=True)
    per_step = []
    for _ in range(6):  # warm-up, record, then replays
        before = len(calls)
        got = _run(step, [hidden, weight], labels, scores, mask, old)
        torch.cuda.synchronize()
        per_step.append(calls[before:])
        for e, c in zip(eager, got):
            assert torch.equal(e, c)
    assert per_step[0], "the warm-up runs the ops through the package: the count must see them"
    assert per_step[-3:] == [[], [], []], per_step


@host_cases
@pytest.mark.skipif(not CASES, reason=NO_CASES)
@pytest.mark.parametrize("want", ["hidden", "weight"])
def test_linear_policy_loss_gradient_of_one_head_tensor_alone(want):
    """want_hidden / want_weight false with that tensor still requiring grad: the operator's
    backward gives it no gradient (the call computed none) and the other the loss's, against an
    fp64 reference. At old_logp = logp the PPO ratio is 1 (inside the clip), so the token-mean
    loss is -mean(A r) and its gradient -A r / N through log_softmax(hidden @ weight.T)."""
    gen = torch.Generator().manual_seed(8)
    n = B
    hidden = torch.randn(n, H, generator=gen).to(torch.bfloat16).requires_grad_(True)
    weight = (torch.randn(V, H, generator=gen) * 0.2).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, V, (n,), generator=gen)
    adv = torch.randn(2, n // 2, generator=gen)
    h64 = hidden.detach().double().requires_grad_(True)
    w64 = weight.detach().double().requires_grad_(True)
    logp64 = torch.log_softmax(h64 @ w64.T, dim=-1).gather(1, labels[:, None])[:, 0]
    old = logp64.detach().float().reshape(2, n // 2)
    ref = -(adv.double().reshape(-1) * torch.exp(logp64 - old.double().reshape(-1))).mean()
    ref.backward()
    out = torch.ops.rlk.linear_policy_loss(hidden, weight, labels, old, adv,
                                           want_hidden=want == "hidden",
                                           want_weight=want == "weight")
    out[0].backward()
    assert abs(out[0].item() - ref.item()) < 1e-5
    got, other = (hidden, weight) if want == "hidden" else (weight, hidden)
    expect = h64.grad if want == "hidden" else w64.grad
    assert other.grad is None
    # computed in f32 from bf16 inputs, returned in the input's dtype (bf16): its rounding,
    # 2^-9 relative, dominates; twice that, and an absolute floor for entries near 0
    assert got.grad.dtype == torch.bfloat16
    torch.testing.assert_close(got.grad.double(), expect, rtol=2.0 ** -8, atol=1e-5)

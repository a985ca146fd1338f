"""verl 0.9.1's actor path end to end on the CPU (verl_engine_run.py: its ActorRolloutRefWorker
over the FSDP engine, gloo, world size 1; use_remove_padding and use_fused_kernels):
compute_log_prob, then update_actor's PPO step, with FusedLinearForPPO on verl's torch backend,
on rlk, and on rlk with the remove-padding rows' shared prefixes computed once. The log-probs and
entropy per response token, the update's loss and gradient norm, and the updated weights agree
within the tolerances derived below."""
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="needs torch (make trainer-test installs it)")
pytest.importorskip("verl", reason="needs verl (make trainer-test installs it)")

import rlk  # noqa: E402

import reference  # noqa: E402
import tiny  # noqa: E402
import verl_engine_run as run  # noqa: E402
from reference import U  # noqa: E402
from test_trl_prefix import LAMBDA  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

for op in ("linear_logprob", "prefix_attention"):
    if not rlk.OPS[op].available():
        pytest.skip("the loaded librlk has no rlk_%s" % op, allow_module_level=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verl-engine")
    out = {}
    for name, flags in (("torch", []), ("rlk", ["--rlk"]), ("prefix", ["--prefix"])):
        path = str(tmp / (name + ".pt"))
        r = subprocess.run([sys.executable, os.path.join(HERE, "verl_engine_run.py"), path] + flags,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
        out[name] = torch.load(path)
    return out


def head_bounds(weights):
    """test_verl.bounds for the engine's model (bf16 parameters: FSDP's mixed precision): verl's
    torch backend rounds each logit to bf16 and z / T again, rlk's head does not: per logit
    |d(z/T)| <= zeta = 2 u zmax / T + u^2 zmax / T, zmax <= sqrt(H) max|gamma| max ||W_v||
    (the final RMSNorm's output has 2-norm sqrt(H) times at most max|gamma|; the head is tied to
    the embedding). logp: 2 zeta. The entropy: 2 (zmax / T) zeta, and verl rounds it to bf16 (its
    hidden states' dtype) in both: + 2 u ln V. The gradient, relative: verl rounds dz to bf16 (u),
    the probabilities move by a factor e^(2 zeta), the body's bf16 backward may round each of its
    D = 9 L + 2 points on a path to the other neighbour (2u): 2 zeta + u + 2 D u."""
    cfg = tiny.config(**tiny.PREFIX_MODEL)
    head = weights["model.embed_tokens.weight"].to(torch.bfloat16).double()
    gamma = weights["model.norm.weight"].to(torch.bfloat16).double()
    zmax = math.sqrt(cfg.hidden_size) * gamma.abs().max().item() * head.norm(dim=1).max().item()
    zeta = (2 * U + U * U) * zmax / run.TEMPERATURE
    return (2 * zeta, 2 * (zmax / run.TEMPERATURE) * zeta + 2 * U * math.log(cfg.vocab_size),
            2 * zeta + U + 2 * (9 * cfg.num_hidden_layers + 2) * U)


def test_every_run_went_through_its_path(runs):
    assert "report" not in runs["torch"]
    assert "FusedLinearForPPO (use_fused_kernels, torch and liger backends)" in runs["rlk"]["report"]["swapped"]
    assert runs["rlk"]["prefix_calls"] == {}
    # compute_log_prob's 2 micro-batches and update_actor's 2, each a packed backbone call
    assert runs["prefix"]["prefix_calls"] == {"packed": 4}


def test_rlk_beside_verls_torch_backend(runs):
    a, b = runs["torch"], runs["rlk"]
    lp_tol, ent_tol, eps = head_bounds(a["before"])
    m = a["response_mask"].bool()
    assert (b["log_probs"] - a["log_probs"])[m].abs().max() <= lp_tol
    assert (b["entropy"] - a["entropy"])[m].abs().max() <= ent_tol
    _compare_update(a, b, eps)


def test_prefix_sharing_beside_every_sequence_whole(runs):
    """rlk's head in both; per response token both within LAMBDA ||c||_2 of the fp64 reference
    (reference.py, bf16 parameters; test_trl_prefix.py derives the tolerance); the update within
    the first-order relative bound 2 max dp + 2 D u (dp: the largest token's tolerance of the
    two runs' difference)."""
    a, b = runs["rlk"], runs["prefix"]
    cfg = tiny.config(**tiny.PREFIX_MODEL, tied=True)
    ref = reference.Qwen2(a["before"], cfg, params="bf16")
    t = a["tensors"]
    P = t["prompts"].shape[1]
    dp = 0.0
    with reference.one_thread():
        for i in range(t["input_ids"].shape[0]):
            keep = t["attention_mask"][i].bool()
            tokens = t["input_ids"][i][keep]
            plen = int(t["attention_mask"][i, :P].sum())
            n = int(t["response_mask"][i].sum())
            labels = torch.full_like(tokens, -100)
            labels[plen - 1:plen + n - 1] = tokens[plen:plen + n]
            r = ref.forward(tokens, torch.arange(len(tokens)), labels, run.TEMPERATURE)
            tol = LAMBDA * r.bounds()[:, 1]
            for got in (a, b):
                err = (got["log_probs"][i, :n].double() - r.logp).abs()
                assert (err <= tol).all(), "row %d: %s, tolerance %s" % (i, err, tol)
            dp = max(dp, float(2 * tol.max()))
    eps = 2 * dp + 2 * (9 * cfg.num_hidden_layers + 2) * U
    _compare_update(a, b, eps)


def _compare_update(a, b, eps):
    """The PPO step: the old log-probs are each run's own compute_log_prob output and the update's
    forward repeats it, so the ratio is 1 in both and the loss is the same token-mean of -A (an
    f32 sum of at most 64 terms: 64 2^-24 relative). The gradient norm within eps relative; SGD
    moves a tensor by LR g, so the weights within eps times the first run's own move."""
    la, lb = a["metrics"]["actor/pg_loss"][0], b["metrics"]["actor/pg_loss"][0]
    assert abs(la - lb) <= 64 * 2.0 ** -24 * abs(la)
    ga, gb = a["metrics"]["grad_norm"][0], b["metrics"]["grad_norm"][0]
    assert abs(ga - gb) <= eps * ga, (ga, gb, eps)
    assert eps < 1, "a tolerance as large as the step itself shows nothing"
    for n, w0 in a["before"].items():
        step = (a["after"][n] - w0).norm().item()
        d = (a["after"][n] - b["after"][n]).norm().item()
        assert d <= eps * step + 1e-7 * w0.norm().item(), "%s: %g (tolerance %g)" % (n, d, eps * step)

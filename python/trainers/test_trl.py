"""TRL's GRPOTrainer (the pinned release) training the tiny Qwen2 model on the CPU, as installed
and with rlk.integrations.trl.patch(): rlk's fused LM head computes the log-probs and entropy of
the policy and reference passes, rlk's loss the loss. Per step the loss and the gradient norm,
and the weights after the run, agree within the tolerance derived below; the same under gradient
accumulation, two DDP processes (gloo), a LoRA adapter, gradient checkpointing and
cast_lm_head_to_fp32."""
import functools
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="needs torch (make trainer-test installs it)")
trl = pytest.importorskip("trl", reason="needs trl (make trainer-test installs it)")

import rlk  # noqa: E402
from rlk.integrations import _common  # noqa: E402
from rlk.integrations import trl as rtrl  # noqa: E402

import grpo_run  # noqa: E402
import tiny  # noqa: E402
from reference import U, U32 as F32  # noqa: E402  (bf16's and f32's unit roundoffs)

HERE = os.path.dirname(os.path.abspath(__file__))

if not rlk.OPS["linear_logprob"].available():
    pytest.skip("the loaded librlk has no rlk_linear_logprob", allow_module_level=True)


def _run(tmp, name, flags, ddp=False):
    out = str(tmp / (name + ".pt"))
    py = os.path.join(os.path.dirname(sys.executable), "python")
    cmd = [sys.executable, os.path.join(HERE, "grpo_run.py"), out] + flags
    if ddp:
        cmd = [py, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(29500 + (os.getpid() % 400))] + cmd[1:]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return torch.load(out), out


def logit_bound(weights):
    """An upper bound of |z_v| for every token and weight set: the final RMSNorm's output h has
    ||h||_2 = sqrt(H) times at most max|gamma|, so |h . W_v| <= sqrt(H) max|gamma| max_v ||W_v||."""
    zmax = 0.0
    for w in weights:
        head = w["lm_head.weight"] if "lm_head.weight" in w else w["base_model.model.lm_head.weight"]
        gamma = [v for k, v in w.items() if k.endswith("model.norm.weight")][0]
        zmax = max(zmax, math.sqrt(head.shape[1]) * gamma.abs().max().item() *
                   head.norm(dim=1).max().item())
    return zmax


def tolerances(weights, H, layers):
    """(delta, eps): delta bounds a token's log-prob difference, eps the relative difference of a
    gradient, between TRL's head and rlk's.
    TRL's head rounds each logit z_v = h . W_v to bf16 (its GEMM writes the tile in the compute
    dtype; the f32 accumulation adds H 2^-24 |z| at most), rlk's does not (f32 accumulation on a
    GPU, fp64 on the host): |dz_v| <= (u + H 2^-24) zmax per logit. logp_y = z_y / T - lse(z / T)
    and lse is 1-Lipschitz in the max norm, so |d logp| <= 2 (u + H 2^-24) zmax / T = delta. (With
    cast_lm_head_to_fp32 TRL's head is f32 and rlk rounds W to bf16: |dz_v| <= u |h| |W_v| <= u
    zmax, within the same delta.)
    A probability p_v = exp(logp_v) then differs by at most a factor exp(delta) - 1 ~ delta, and
    the logits' gradient g (onehot - p) and the entropy's by 2 delta relative. That gradient
    enters the backbone's backward, which runs in bf16 under autocast: each of its roundings on
    the path from the head to a parameter may round to the other neighbour when its input moved,
    one ulp (2u relative) more each. The path is at most 9 roundings a layer (o_proj, the attention's two products and its
    softmax, v/k/q, the MLP's down, up and gate projections) plus the final norm and the
    embedding: D = 9 L + 2. First order, without cancellation: eps = 2 delta + 2 D u."""
    zmax = logit_bound(weights)
    delta = 2.0 * (U + H * F32) * zmax / grpo_run.TEMPERATURE
    return delta, 2.0 * delta + 2.0 * (9 * layers + 2) * U


def compare(a, b, trainable_only=True):
    """Checks run b (rlk) against run a (TRL) step by step and in the final weights."""
    assert a["completions"] == b["completions"], "the runs sampled different completions"
    assert len(a["logs"]) == len(b["logs"]) == grpo_run.STEPS
    cfg = tiny.config()
    delta, eps = tolerances([a["weights"], b["weights"]], cfg.hidden_size, cfg.num_hidden_layers)
    for step, ((la, ga, ka), (lb, gb, kb)) in enumerate(zip(a["logs"], b["logs"])):
        # The loss: the policy term's value is -A times a ratio of 1 (one iteration: the old
        # log-probs are the detached current ones) whatever the log-probs; the KL term is beta
        # times the mean of k3(d) = exp(d) - d - 1 over d = ref - logp, |k3'(d)| = |exp(d) - 1|.
        # Each d moves by at most 2 delta (two passes), so |dloss| <= beta (exp(dmax) - 1) 2 delta
        # + beta 2 delta^2 (second order); dmax <= sqrt(2 kl_max) is not known per token, and
        # |d| <= 1 holds while the mean KL stays below 0.05 (checked): exp(1) - 1 < 1.72.
        assert ka is None or ka < 0.05
        tol_loss = grpo_run.BETA * (1.72 * 2 * delta + 2 * delta * delta)
        assert abs(la - lb) <= tol_loss, "step %d: loss %r vs %r (tolerance %g)" % (step, la, lb, tol_loss)
        assert abs(ga - gb) <= eps * ga, "step %d: grad norm %r vs %r (eps %g)" % (step, ga, gb, eps)
    # SGD: each step moves a tensor of weights by lr g; g differs by at most eps ||g|| (a
    # tensor's 2-norm: the embedding's rows sum the gradients of a token's occurrences, which
    # cancel element by element but not in the norm), so after the run
    # ||dw|| <= lr eps sum_t ||g_t|| (the run's own sums; first order: the weights' own difference
    # changes later gradients by a further factor lr eps).
    names = a["trainable"] if trainable_only else list(a["weights"])
    moved = False
    for n in names:
        tol = grpo_run.LR * eps * a["grad_norm_sum"].get(n, 0.0) + 1e-7 * a["weights"][n].norm().item()
        d = (a["weights"][n] - b["weights"][n]).norm().item()
        assert d <= tol, "%s: weights differ by %g (tolerance %g)" % (n, d, tol)
        if n in tiny_initial():
            moved = moved or (a["weights"][n] - tiny_initial()[n]).norm().item() > tol
    assert moved, "no weight moved by more than the tolerance: the comparison shows nothing"


_initial = {}


def tiny_initial():
    if not _initial:
        _initial.update({n: p.detach().float() for n, p in tiny.model().named_parameters()})
    return _initial


def routed(run, passes):
    """rlk computed every log-prob pass of the run: `passes` a step (policy and reference)."""
    calls = run["head_calls"]
    assert calls.get("rlk", 0) == passes * grpo_run.STEPS, calls
    assert not [k for k in calls if k != "rlk"], calls


CONFIGS = {
    "plain": ([], False),
    "accum2": (["--accum", "2", "--batch", "4"], False),
    "ddp": (["--batch", "4"], True),
    "checkpointing": (["--checkpointing"], False),
    "cast_head": (["--cast-head"], False),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_grpo_trainer_agrees(tmp_path, name):
    flags, ddp = CONFIGS[name]
    a, _ = _run(tmp_path, "trl", flags, ddp)
    b, out = _run(tmp_path, "rlk", flags + ["--rlk"], ddp)
    compare(a, b)
    accum = 2 if "--accum" in flags else 1
    routed(b, 2 * accum)  # the policy's and the reference's pass of each micro-batch
    assert b["report"]["version"] == trl.__version__
    if ddp:
        # the loss ran through the DDP wrapper: gradients were all-reduced, so both ranks hold
        # the same weights although they trained on different completions
        assert b["wrapped"] == "DistributedDataParallel"
        other = torch.load(out + ".rank1")["weights"]
        for n, w in b["weights"].items():
            assert torch.equal(w, other[n]), n


def test_grpo_trainer_lora(tmp_path):
    """A LoRA adapter: only its weights train; the head's weight takes no gradient."""
    a, _ = _run(tmp_path, "trl", ["--peft"])
    b, _ = _run(tmp_path, "rlk", ["--peft", "--rlk"])
    assert b["trainable"] and all("lora" in n for n in b["trainable"])
    assert a["completions"] == b["completions"]
    cfg = tiny.config()
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
            for k, v in a["weights"].items()}
    delta, eps = tolerances([base], cfg.hidden_size, cfg.num_hidden_layers)
    for (la, ga, _), (lb, gb, _) in zip(a["logs"], b["logs"]):
        assert abs(ga - gb) <= eps * ga
    for n in b["trainable"]:
        tol = grpo_run.LR * eps * a["grad_norm_sum"][n] + 1e-7 * a["weights"][n].norm().item()
        assert (a["weights"][n] - b["weights"][n]).norm().item() <= tol, n
    routed(b, 2)


def test_patch_reports_and_checks_the_version(monkeypatch):
    h = rtrl.patch()
    try:
        assert h.report["version"] == "1.16.0"
        assert "GRPOTrainer log-probs and entropy (fused LM head)" in h.report["swapped"]
        assert "generation" in h.report["left"]
        from trl.trainer import utils as U
        assert U._ChunkedLogProbFunction is rtrl.ChunkedHead
    finally:
        h.undo()
    from trl.trainer import utils as U
    assert U._ChunkedLogProbFunction is not rtrl.ChunkedHead
    monkeypatch.setattr(rtrl, "TESTED", ("0.0.1",))
    with pytest.raises(_common.UntestedVersion, match="force=True"):
        rtrl.patch()
    rtrl.patch(force=True).undo()


def test_patch_that_fails_partway_undoes_what_it_set(monkeypatch):
    """A TRL whose fused-head seam moved (under force): patch() raises, and the loss it had
    already swapped is TRL's again."""
    from trl.trainer import grpo_trainer as G
    from trl.trainer import utils as U
    own_loss = G.GRPOTrainer.__dict__["_compute_loss"]
    own_pass = G.GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"]
    monkeypatch.delattr(U, "_ChunkedLogProbFunction")
    with pytest.raises(AttributeError):
        rtrl.patch(force=True)
    assert G.GRPOTrainer.__dict__["_compute_loss"] is own_loss
    assert G.GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"] is own_pass


def _head_inputs(n=37, H=64, V=203, seed=5):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, H, generator=g)).to(torch.bfloat16)
    weight = (torch.randn(V, H, generator=g) * 0.2).to(torch.bfloat16)
    labels = torch.randint(0, V, (n,), generator=g)
    return hidden, weight, labels


def _fp64_head(hidden, weight, labels, T):
    z = hidden.double() @ weight.double().T / T
    lp = torch.log_softmax(z, -1)
    return lp.gather(1, labels[:, None])[:, 0], -(lp.exp() * lp).sum(-1)


class _Trainer:
    """What ChunkedHead reads of a GRPOTrainer in scope: args.cast_lm_head_to_fp32, the model's
    input embeddings (the model's dtype) and its accelerator's autocast (mixed precision: a 16-bit
    dtype, or None)."""

    def __init__(self, cast, dtype=torch.bfloat16, mixed=None):
        self.args = type("Args", (), {"cast_lm_head_to_fp32": cast})()
        autocast = functools.partial(torch.autocast, "cpu", dtype=mixed, enabled=mixed is not None)
        self.accelerator = type("Accelerator", (), {"autocast": lambda _: autocast()})()
        emb = torch.nn.Embedding(2, 2).to(dtype)
        self.model = type("Model", (), {"get_input_embeddings": lambda _: emb})()


def test_head_outside_a_grpo_pass_is_trls():
    """Another trainer's fused head (SFT, DPO) keeps TRL's own function."""
    h = rtrl.patch()
    try:
        hidden, weight, labels = _head_inputs()
        before = rtrl.head_calls.copy()
        from trl.trainer import utils as U
        U._ChunkedLogProbFunction.apply(hidden, weight, None, labels, 1.0, 64, None, 1.0,
                                        ("log_probs",))
        assert rtrl.head_calls - before == {"trl: not a GRPOTrainer log-prob pass": 1}
    finally:
        h.undo()


def test_patch_twice_falls_back_to_trls():
    """patch() on a patch (a re-run cell, a worker hook beside the user's call): the fallbacks still
    reach TRL's own functions (not rlk's wrappers, which would recurse), with TRL's results, and the
    two undo()s restore TRL's."""
    from trl.trainer import grpo_trainer as G
    from trl.trainer import utils as U
    own_head, own_pass = U._ChunkedLogProbFunction, G.GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"]
    own_loss = G.GRPOTrainer.__dict__["_compute_loss"]
    hidden, weight, labels = _head_inputs()
    args = (hidden, weight, None, labels, 1.0, 64, None, 1.0, ("log_probs",))
    want = own_head.apply(*args)[0]
    h1 = rtrl.patch(prefix=True)
    h2 = rtrl.patch(prefix=True)
    try:
        assert rtrl.ChunkedHead.own is own_head and _common.trainer_own(U._use_triton) is not U._use_triton
        assert torch.equal(U._ChunkedLogProbFunction.apply(*args)[0], want)
        assert _common.trainer_own(G.GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"]) is own_pass
        assert _common.trainer_own(G.GRPOTrainer.__dict__["_compute_loss"]) is own_loss
    finally:
        h2.undo()
        h1.undo()
    assert U._ChunkedLogProbFunction is own_head and G.GRPOTrainer.__dict__["_compute_loss"] is own_loss
    assert G.GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"] is own_pass


def test_loss_pass_gets_the_batchs_model_inputs(tmp_path):
    """compute_loss hands the policy's log-prob pass the batch's inputs beside the tokens as TRL's
    own _compute_loss does (images, their layouts, token types: a VLM's log-probs need them)."""
    from trl.trainer.grpo_trainer import GRPOTrainer
    t = grpo_run.trainer(grpo_run.options(["unused"]), str(tmp_path))
    B, P, C = 4, 3, 5
    seen = {}

    def spy(model, input_ids, attention_mask, logits_to_keep, **kw):
        seen[who] = {k: v for k, v in kw.items() if v is not None and k != "compute_aux_loss"}
        return torch.full((B, C), -1.0, requires_grad=True), torch.ones(B, C), None
    t._get_per_token_logps_and_entropies = spy
    t.current_gradient_accumulation_steps = 1
    inputs = {"prompt_ids": torch.randint(3, 100, (B, P)), "prompt_mask": torch.ones(B, P, dtype=torch.long),
              "completion_ids": torch.randint(3, 100, (B, C)), "completion_mask": torch.ones(B, C, dtype=torch.long),
              "advantages": torch.randn(B), "num_items_in_batch": torch.tensor(float(B * C)),
              "ref_per_token_logps": torch.full((B, C), -1.1), "pixel_values": torch.randn(8, 12),
              "image_grid_thw": torch.tensor([[1, 2, 2]] * 2), "num_images": [1, 0, 1, 0],
              "token_type_ids": torch.zeros(B, P + C, dtype=torch.long)}
    who = "trl"
    GRPOTrainer._compute_loss(t, t.model, inputs)
    with rtrl.patch():
        who = "rlk"
        GRPOTrainer._compute_loss(t, t.model, inputs)
    assert seen["trl"].keys() == seen["rlk"].keys() and len(seen["trl"]) >= 5, seen
    assert all(seen["rlk"][k] is v for k, v in seen["trl"].items() if k != "compute_entropy")


def test_trainer_own_follows_rlks_stand_ins_only():
    """A wrapper copied from rlk's stand-in (functools.wraps copies attributes) is not rlk's."""
    import functools

    def own():
        return 0
    mine = _common.stand_in(functools.wraps(own)(lambda: 1), own)
    user = functools.wraps(mine)(lambda: 2)
    assert _common.trainer_own(mine) is own and _common.trainer_own(user) is user
    assert _common.trainer_own(len) is len  # not weakly referable: never a stand-in


def test_head_of_zero3_is_trls():
    """A DeepSpeed ZeRO-3 head (its weight marked by a ds_id: TRL gathers it for its own head's
    forward, rlk's backward would read it partitioned) keeps TRL's function."""
    h = rtrl.patch()
    try:
        hidden, weight, labels = _head_inputs()
        weight = torch.nn.Parameter(weight)
        weight.ds_id = 0
        before = rtrl.head_calls.copy()
        rtrl._scope.trainer = _Trainer(False)
        try:
            rtrl.ChunkedHead.apply(hidden, weight, None, labels, 1.0, 64, None, 1.0, ("log_probs",))
        finally:
            rtrl._scope.trainer = None
        assert rtrl.head_calls - before == {"trl: DeepSpeed ZeRO-3 (the head's weight partitioned)": 1}
    finally:
        h.undo()


def test_cast_head_of_an_f32_model_in_f32_is_trls():
    """cast_lm_head_to_fp32 on an f32 model without mixed precision: no 16-bit dtype in play, so
    the head stays TRL's exact f32 one (as without the flag), not rounded to bf16 for the kernels;
    in bf16 mixed precision (bf16=True: the body in bf16 autocast, TRL's head outside it) rlk's."""
    h = rtrl.patch()
    try:
        hidden, weight, labels = _head_inputs()
        hidden, weight = hidden.float(), weight.float()
        args = (hidden, weight, None, labels, 0.7, 64, None, 1.0, ("log_probs", "entropy"))
        want = rtrl.ChunkedHead.own.apply(*args)
        got = {}
        for mixed in (None, torch.bfloat16):
            before = rtrl.head_calls.copy()
            rtrl._scope.trainer = _Trainer(True, torch.float32, mixed)
            try:
                got[mixed] = rtrl.ChunkedHead.apply(*args)
            finally:
                rtrl._scope.trainer = None
            calls = rtrl.head_calls - before
            assert calls == ({"rlk": 1} if mixed else {
                "trl: cast_lm_head_to_fp32 on an f32 model without 16-bit autocast": 1})
        assert torch.equal(got[None][0], want[0]) and torch.equal(got[None][1], want[1])
    finally:
        h.undo()


@pytest.mark.parametrize("cast", [False, True])
def test_head_against_fp64(cast):
    """ChunkedHead in a GRPOTrainer pass against fp64, with temperature and logit_scale, bf16
    operands (cast=False) and TRL's f32 head (cast_lm_head_to_fp32: hidden and W in f32)."""
    hidden, weight, labels = _head_inputs()
    T, scale = 0.7, 1.5
    if cast:
        # an f32 head whose weights moved off the bf16 grid (as training moves them)
        g = torch.Generator().manual_seed(11)
        weight = weight.float() * (1 + 1e-3 * torch.randn(weight.shape, generator=g))
        hidden = hidden.float()
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    rtrl._scope.trainer = _Trainer(cast)
    try:
        lp, ent, *rest = rtrl.ChunkedHead.apply(hidden, weight, None, labels, T, 64, None, scale,
                                                ("log_probs", "entropy"))
    finally:
        rtrl._scope.trainer = None
    assert rest == [None, None, None]
    want_lp, want_ent = _fp64_head(hidden.detach(), weight.detach(), labels, T / scale)
    # fp64 accumulation on the host backend: with bf16 operands only the f32 outputs' rounding
    # (2^-24 relative of |z| / T' terms) remains; with the f32 head, W's rounding to bf16 moves
    # each z by at most u sum_k |h_k W_vk|, so logp by twice the largest over v, divided by T'.
    zabs = (hidden.detach().double().abs() @ weight.detach().double().abs().T) * scale / T
    tol = (2 * U if cast else 8 * F32) * zabs.max().item() + 1e-6
    assert (lp.double() - want_lp).abs().max().item() <= tol
    assert (ent.double() - want_ent).abs().max().item() <= 2 * tol
    # the gradient against fp64 autograd of the same weighted sum
    w = torch.linspace(-1, 1, lp.numel())
    (lp * w).sum().add((ent * w.flip(0)).sum()).backward()
    h64 = hidden.detach().double().requires_grad_(True)
    w64 = weight.detach().double().requires_grad_(True)
    if cast:  # rlk's operands: the bf16-rounded weight (the test measures that rounding above)
        w64 = weight.detach().to(torch.bfloat16).double().requires_grad_(True)
    z = (h64 @ w64.T).detach().requires_grad_(True)
    lp64 = torch.log_softmax(z * scale / T, -1)
    a, b = lp64.gather(1, labels[:, None])[:, 0], -(lp64.exp() * lp64).sum(-1)
    (a * w.double()).sum().add((b * w.flip(0).double()).sum()).backward()
    dz = z.grad.abs()
    want_h, want_w = dz @ w64.detach().abs(), dz.T @ h64.detach().abs()
    (h64 @ w64.T).backward(z.grad)
    # grad_hidden = dz W and grad_weight = dz^T h from the kernels: dz rounded to the operands'
    # 16-bit type for the products (u |dz_v| a term, so u sum_v |dz_v| |W_vk| in all), the sums
    # accumulated in f32 or better (V or N terms of 2^-24), the result rounded to a bf16 input's
    # dtype (u relative) and kept in f32 for an f32 one
    out_round = 0.0 if cast else U
    for got, want, terms, k in ((hidden.grad, h64.grad, want_h, weight.shape[0]),
                                (weight.grad, w64.grad, want_w, hidden.shape[0])):
        err = (got.double() - want).abs()
        tol = (U + k * F32) * terms + out_round * want.abs()
        assert (err <= tol * (1 + out_round) + 1e-12).all(), (err - tol).max()

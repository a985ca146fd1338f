"""TRL's GRPOTrainer (the pinned release) with rlk.integrations.trl.patch(prefix=True): each
prompt group's log-prob passes packed once with rlk's prefix-shared attention, on the tiny Qwen2
model (head dim 64) on the CPU, beside the same trainer with one row per completion (rlk's head
in both). Per completion token the packed pass's log-prob and entropy are within the rounding
tolerance of an independent fp64 forward (reference.py) derived below, as the replicated pass's
are; over 5 training steps the loss, the gradient norm and the updated weights agree within
tolerances derived from the same analysis."""
import math
import tempfile

import pytest

torch = pytest.importorskip("torch", reason="needs torch (make trainer-test installs it)")
trl = pytest.importorskip("trl", reason="needs trl (make trainer-test installs it)")

import rlk  # noqa: E402
from rlk.integrations import trl as rtrl  # noqa: E402

import grpo_run  # noqa: E402
import reference  # noqa: E402
import tiny  # noqa: E402

# The tolerance: reference.py's first-order error of a bf16 evaluation is delta = sum_i c_i e_i
# over its rounding points, c_i = u' |d out / d x_i| |x_i| (u' the point's unit roundoff) and
# e_i in [-1, 1] the point's relative rounding error. Modelled as independent and of mean zero
# (round to nearest; Higham and Mary's probabilistic rounding analysis), Hoeffding's inequality
# gives P(|delta| >= LAMBDA ||c||_2) <= 2 exp(-LAMBDA^2 / 2): 3e-8 per token at LAMBDA 6. (The
# worst case, ||c||_1, is about 30x larger here and a layout mistake would hide inside it.)
LAMBDA = 6.0
EPSILON = trl.GRPOConfig.__dataclass_fields__["epsilon"].default  # the runs' clip range (both sides)

for op in ("linear_logprob", "prefix_attention"):
    if not rlk.OPS[op].available():
        pytest.skip("the loaded librlk has no rlk_%s" % op, allow_module_level=True)


@pytest.fixture(scope="module")
def trainer():
    a = grpo_run.options(["unused", "--prefix-model", "--sensitive"])
    return grpo_run.trainer(a, tempfile.mkdtemp(prefix="rlk-grpo-"))


def _batch():
    """A batch as GRPOTrainer's passes get it: prompts left-padded to P, completions right-padded
    to C (pad 0), rows of one prompt not adjacent; a one-token prompt, a group of one, a
    completion of one token, a full one and a fully masked one."""
    g = torch.Generator().manual_seed(17)
    P, C = 6, 8
    prompts = {"a": torch.randint(3, 123, (6,), generator=g), "b": torch.randint(3, 123, (1,), generator=g),
               "c": torch.randint(3, 123, (4,), generator=g)}
    rows = [("a", 4), ("b", 8), ("a", 1), ("c", 0), ("a", 8), ("b", 3), ("c", 5)]
    ids = torch.zeros(len(rows), P + C, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, (name, n) in enumerate(rows):
        p = prompts[name]
        ids[i, P - len(p):P] = p
        mask[i, P - len(p):P] = 1
        ids[i, P:P + n] = torch.randint(3, 123, (n,), generator=g)
        mask[i, P:P + n] = 1
    return ids, mask, C


def _pass(t, ids, mask, C, prefix, grad, batch_size=None):
    h = rtrl.patch(prefix=prefix)
    try:
        with torch.set_grad_enabled(grad):
            lp, ent, _ = t._get_per_token_logps_and_entropies(t.model, ids, mask, C, batch_size=batch_size,
                                                              compute_entropy=True)
    finally:
        h.undo()
    return lp.detach().double(), ent.detach().double()


def _reference_rows(model, ids, mask, C, positions=None):
    """Per row: (n, reference.Scored or None) of the fp64 reference; positions(pad, plen, n)
    may give other positions (a packing mistake, for the sensitivity check)."""
    P = ids.shape[1] - C
    out = []
    for i in range(ids.shape[0]):
        n = int(mask[i, P:].sum())
        plen = int(mask[i, :P].sum())
        if n == 0:
            out.append((0, None))
            continue
        pad = P - plen
        tokens = ids[i, pad:P + n]
        pos = torch.arange(pad, P + n) if positions is None else positions(pad, plen, n)
        labels = torch.full_like(tokens, -100)
        labels[plen - 1:plen + n - 1] = tokens[plen:plen + n]
        out.append((n, model.forward(tokens, pos, labels, grpo_run.TEMPERATURE)))
    return out


def test_packed_pass_matches_replicated_and_fp64(trainer):
    """The policy pass (with gradients) and a forward-only pass (no_grad: the old policy's and the
    reference's), packed whole and in chunks of 3 rows (a chunk splits a group), against the
    replicated pass and the fp64 reference, token by token."""
    ids, mask, C = _batch()
    model = trainer.accelerator.unwrap_model(trainer.model)
    ref = reference.Qwen2({n: p.detach() for n, p in model.named_parameters()}, model.config)
    with reference.one_thread():
        rows = _reference_rows(ref, ids, mask, C)
        bounds = [(r.bounds("logp"), r.bounds("entropy")) if n else None for n, r in rows]
    before = rtrl.prefix_calls["packed"]
    runs = {"replicated": _pass(trainer, ids, mask, C, False, True)}
    for grad in (True, False):
        for bs in (None, 3):
            runs["packed grad=%s batch_size=%s" % (grad, bs)] = _pass(trainer, ids, mask, C, True, grad, bs)
    assert rtrl.prefix_calls["packed"] - before == 4
    worst = 0.0
    for name, (lp, ent) in runs.items():
        for i, (n, r) in enumerate(rows):
            assert not lp[i, n:].any() and not ent[i, n:].any(), "%s: row %d past its completion" % (name, i)
            if n == 0:
                continue
            # each evaluation within LAMBDA ||c||_2 of the fp64 value (so replicated and packed
            # within twice that of each other)
            b_lp, b_ent = bounds[i]
            err_lp = (lp[i, :n] - r.logp).abs()
            err_ent = (ent[i, :n] - r.entropy).abs()
            assert (err_lp <= LAMBDA * b_lp[:, 1]).all(), \
                "%s row %d: logp off by %s, tolerance %s" % (name, i, err_lp, LAMBDA * b_lp[:, 1])
            assert (err_ent <= LAMBDA * b_ent[:, 1]).all(), \
                "%s row %d: entropy off by %s, tolerance %s" % (name, i, err_ent, LAMBDA * b_ent[:, 1])
            worst = max(worst, float((err_lp / b_lp[:, 1]).max()))
    print("largest log-prob error: %.3g ||c||_2" % worst)
    # the tolerance sees a layout mistake: completions positioned from 0 instead of continuing
    # from the prompt move some token by more than the two evaluations' tolerance
    with reference.one_thread():
        wrong = _reference_rows(ref, ids, mask, C,
                                positions=lambda pad, plen, n: torch.cat([torch.arange(pad, pad + plen),
                                                                           torch.arange(n)]))
    moved = [float(((w.logp - r.logp).abs() / (2 * LAMBDA * b[0][:, 1])).max())
             for (_, w), (n, r), b in zip(wrong, rows, bounds) if n]
    assert max(moved) > 1.0, moved


def _groups(ids, mask, P):
    """The rows of a batch sharing a prompt (what the packed pass computes once)."""
    groups = {}
    for i in range(ids.shape[0]):
        groups.setdefault(ids[i, :P][mask[i, :P].bool()].numpy().tobytes(), []).append(i)
    return list(groups.values())


def _coefficients(rows, groups, a):
    """||c||_2 of sum_t a_t logp_t over a batch's rows for the replicated evaluation (every row
    its own rounding points, independent) plus the packed one (a group's members share the
    prefix's points: correlated, at worst fully, so their coefficient norms add). a[i]: row i's
    coefficients (None: the row is not scored)."""
    norms = [r.functional(a[i])[1] if n else 0.0 for i, (n, r) in enumerate(rows)]
    rep = math.sqrt(sum(x * x for x in norms))
    packed = math.sqrt(sum(sum(norms[i] for i in g) ** 2 for g in groups))
    return rep, packed


def _step_tolerances(run, steps_per_generation):
    """Per training step of `run` (recorded: the inputs and the weights each step started from),
    (loss tolerance, relative gradient tolerance) between the replicated and the packed trainer.
    The loss (dapo: a token-mean over N = num_items_in_batch / steps_per_generation) is
    (1 / N) sum_t pg_t + beta k3(ref_t - logp_t), k3(d) = e^d - d - 1, pg_t = -A r_t (clipped by
    TRL's min), r_t = exp(logp_t - old_t). Without old log-probs r_t = exp(logp - logp.detach())
    is exactly 1 in both runs, so pg_t too. To first order the loss moves with the log-probs of
    the policy pass (at the step's weights), the reference pass (the initial weights: TRL's frozen
    reference) and the old-policy pass (the weights of the step that generated) by
    (1 / N) sum_t a_t dlogp_t + b_t dref_t + o_t dold_t, a_t = -A r_t [unclipped] - beta
    (e^d_t - 1), b_t = beta (e^d_t - 1), o_t = A r_t [unclipped]: three evaluations with their
    own rounding points, each of the two runs within LAMBDA ||c||_2 of the fp64 value (the
    coefficients' squares add over independent evaluations). Second order: k3'' = e^d, so
    + beta / N sum_t e^(|d| + e) e^2 / 2, e = the token's own logp and ref tolerances.
    The gradient, relative (first order, without cancellation, as test_trl.py's): the head's
    probabilities move by a factor e^dp - 1 ~ dp (dp = the largest token's logp tolerance of the
    two runs, 2 LAMBDA ||c||_2), so the logits' gradient by 2 dp, the loss's weights of a token
    by as much again through dr (the reference's) and do (the old policy's); the backbone's
    backward in bf16 may round each of its D = 9 L + 2 points on the path to a parameter to the
    other neighbour in one run (2u relative each): eps = 2 max(dp + dr + do) + 2 D u."""
    cfg = tiny.config(**tiny.PREFIX_MODEL)
    recs = run["recorded"]
    models = {}

    def ref_at(s):
        if s not in models:
            models[s] = reference.Qwen2(recs[s]["weights"], cfg)
        return models[s]

    out = []
    for s, rec in enumerate(recs):
        x = rec["inputs"]
        ids = torch.cat([x["prompt_ids"], x["completion_ids"]], 1)
        mask = torch.cat([x["prompt_mask"], x["completion_mask"]], 1)
        C = x["completion_ids"].shape[1]
        P = ids.shape[1] - C
        groups = _groups(ids, mask, P)
        pol = _reference_rows(ref_at(s), ids, mask, C)
        refp = _reference_rows(ref_at(0), ids, mask, C)
        old = None
        if "old_per_token_logps" in x:
            old = _reference_rows(ref_at(s - s % steps_per_generation), ids, mask, C)
        N = float(x["num_items_in_batch"]) / steps_per_generation
        A = x["advantages"].double()
        a, b, o = [None] * len(pol), [None] * len(pol), [None] * len(pol)
        second, worst = 0.0, 0.0
        for i, (n, r) in enumerate(pol):
            if n == 0:
                continue
            d = refp[i][1].logp - r.logp
            kl = grpo_run.BETA * (d.exp() - 1)
            a[i], b[i] = -kl / N, kl / N
            dp = 2 * LAMBDA * r.bounds()[:, 1]
            dr = 2 * LAMBDA * refp[i][1].bounds()[:, 1]
            do = torch.zeros_like(dp)
            if old is not None:
                ratio = (r.logp - old[i][1].logp).exp()
                free = (ratio <= 1 + EPSILON) if A[i] > 0 else (ratio >= 1 - EPSILON)
                g = A[i] * ratio * free / N
                a[i] = a[i] - g
                o[i] = g
                do = 2 * LAMBDA * old[i][1].bounds()[:, 1]
            e = dp + dr
            second += float((grpo_run.BETA * (d.abs() + e).exp() * e * e / 2).sum()) / N
            worst = max(worst, float((dp + dr + do).max()))
        terms = [_coefficients(pol, groups, a), _coefficients(refp, groups, b)]
        if old is not None:
            terms.append(_coefficients(old, groups, o))
        rep = math.sqrt(sum(t[0] ** 2 for t in terms))
        packed = math.sqrt(sum(t[1] ** 2 for t in terms))
        loss_tol = LAMBDA * (rep + packed) + second
        eps = 2 * worst + 2 * (9 * cfg.num_hidden_layers + 2) * reference.U
        out.append((loss_tol, eps))
    return out


TRAIN = {
    "plain": [],
    # an old-policy pass (generation every 2 steps), groups split between the micro-batches by
    # TRL's shuffle, and the packed attention recomputed in the backward
    "old_policy+checkpointing": ["--steps-per-generation", "2", "--checkpointing"],
}


@pytest.mark.parametrize("name", list(TRAIN))
def test_grpo_trainer_with_prefix_sharing(tmp_path, name):
    from test_trl import _run
    flags = ["--prefix-model", "--record"] + TRAIN[name]
    a, out = _run(tmp_path, "replicated", flags + ["--rlk"])
    # the packed run trains on the completions the replicated run sampled (sampling itself is
    # the same code in both, but a rounding-sized difference in the weights can flip a sampled
    # token, after which the runs train on different data)
    b, _ = _run(tmp_path, "packed", flags + ["--prefix", "--replay", out])
    assert a["completions"] == b["completions"]
    assert len(a["logs"]) == len(b["logs"]) == grpo_run.STEPS
    spg = 2 if "--steps-per-generation" in flags else 1
    # every log-prob pass packed: the policy's each step, the reference's and (generating every
    # spg steps) the old policy's at each generation
    passes = grpo_run.STEPS + -(-grpo_run.STEPS // spg) * (2 if spg > 1 else 1)
    assert b["prefix_calls"] == {"packed": passes}, b["prefix_calls"]
    assert "GRPOTrainer log-prob passes packed per prompt (prefix-shared attention)" in b["report"]["swapped"]
    with reference.one_thread():
        tols = _step_tolerances(a, spg)
    for step, ((la, ga, _), (lb, gb, _), (tl, eps)) in enumerate(zip(a["logs"], b["logs"], tols)):
        assert abs(la - lb) <= tl, "step %d: loss %r vs %r (tolerance %g)" % (step, la, lb, tl)
        assert abs(ga - gb) <= eps * ga, "step %d: grad norm %r vs %r (eps %g)" % (step, ga, gb, eps)
    # SGD: ||dw|| <= lr max eps sum_t ||g_t|| (first order, as test_trl.compare)
    eps = max(e for _, e in tols)
    moved = False
    first = a["recorded"][0]["weights"]
    for n in a["trainable"]:
        tol = grpo_run.LR * eps * a["grad_norm_sum"].get(n, 0.0) + 1e-7 * a["weights"][n].norm().item()
        d = (a["weights"][n] - b["weights"][n]).norm().item()
        assert d <= tol, "%s: weights differ by %g (tolerance %g)" % (n, d, tol)
        moved = moved or (a["weights"][n] - first[n]).norm().item() > tol
    assert moved, "no weight moved by more than the tolerance: the comparison shows nothing"


def _llama_of(qwen2, temperature):
    """A Llama model computing what the Qwen2 model computes: Qwen2 is Llama with q/k/v biases, so
    the same weights with attention_bias (o_proj's bias zero) and the same configuration."""
    import transformers
    cfg = qwen2.config.to_dict()
    for k in ("model_type", "architectures", "layer_types", "use_sliding_window", "sliding_window",
              "max_window_layers"):
        cfg.pop(k, None)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**dict(cfg, attention_bias=True)))
    llama = llama.to(next(qwen2.parameters()).dtype)
    missing, unexpected = llama.load_state_dict(qwen2.state_dict(), strict=False)
    assert not unexpected and all(k.endswith("o_proj.bias") for k in missing), (missing, unexpected)
    with torch.no_grad():
        for layer in llama.model.layers:
            layer.self_attn.o_proj.bias.zero_()
    llama.config._attn_implementation = qwen2.config._attn_implementation.split("_or_")[-1]
    # the trainer's fused head on it, as GRPOTrainer gives its policy
    from trl.trainer import grpo_trainer
    grpo_trainer.add_fused_lm_head(llama, temperature=temperature, outputs=("log_probs", "entropy"))
    return llama.train(qwen2.training)


def test_llama_packs(trainer):
    """A Llama model takes the packed pass as Qwen2 does (its forward hands packed_mask() to its
    mask builder, which returns it as it is): with Qwen2's weights its packed log-probs and
    entropies are the Qwen2 model's bit for bit, which the test above holds to the fp64
    reference; the packed pass ran (prefix_calls)."""
    ids, mask, C = _batch()
    qwen2 = trainer.accelerator.unwrap_model(trainer.model)
    llama = _llama_of(qwen2, trainer.temperature)
    before = rtrl.prefix_calls["packed"]
    out = {}
    for name, model in (("qwen2", qwen2), ("llama", llama)):
        h = rtrl.patch(prefix=True)
        try:
            with torch.no_grad():
                lp, ent, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, C, compute_entropy=True)
        finally:
            h.undo()
        out[name] = (lp, ent)
    assert rtrl.prefix_calls["packed"] - before == 2, dict(rtrl.prefix_calls)
    assert torch.equal(out["llama"][0], out["qwen2"][0]) and torch.equal(out["llama"][1], out["qwen2"][1])


def test_other_token_mixers_fall_back():
    """share() refuses what the packed row would get wrong (layers that mix tokens other than by
    attention, which would run across the packed responses; sliding windows; attention dropout),
    so the passes fall back to the trainer's own, with the reason counted."""
    import transformers
    from rlk.integrations import transformers as rtf
    small = dict(vocab_size=64, hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64)
    cases = {
        "conv": transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
            **dict(small, layer_types=["conv", "full_attention"]))),
        "sliding": transformers.MistralForCausalLM(transformers.MistralConfig(**dict(small, sliding_window=16))),
        "dropout": transformers.LlamaForCausalLM(transformers.LlamaConfig(**dict(small, attention_dropout=0.1))),
    }
    reasons = {name: rtf.share(m) for name, m in cases.items()}
    assert "conv" in (reasons["conv"] or "") and "sliding" in (reasons["sliding"] or "") and \
        "dropout" in (reasons["dropout"] or ""), reasons
    for m in cases.values():  # nothing changed
        assert not m.config._attn_implementation.startswith(rtf.NAME)
    assert rtf.share(transformers.MistralForCausalLM(transformers.MistralConfig(
        **dict(small, sliding_window=None)))) is None

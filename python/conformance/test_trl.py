"""rlk.integrations.trl beside TRL's own GRPOTrainer._compute_loss (the installed package, run
unchanged on a trainer object that holds only what that method reads, with the model's
log-probs given as its _get_per_token_logps_and_entropies), on every case, f32 and f64: the
loss, its gradient and every metric that method logs."""
import collections
import math
import types

import numpy as np
import pytest
import torch

import trainers  # noqa: F401
from cases import CASES, close, close_loss, make, torch_inputs

G = pytest.importorskip("trl.trainer.grpo_trainer")

from rlk.integrations import trl as rt  # noqa: E402

DTYPES = ("f32", "f64")
NOT_EXPRESSED = ()
# every loss type at both levels (vespo's gamma weights are per sequence either way; the level
# changes its bias-corrected KL)
LEVELS_TYPES = [(lv, lt) for lv in ("token", "sequence") for lt in rt.LOSS_TYPES]


@pytest.fixture
def rng():
    return np.random.default_rng(int.from_bytes(__import__("os").urandom(4), "little"))


class OneProcess:
    """The accelerator of a single process (what TRL's metrics reduce over)."""
    num_processes = 2  # the dapo normalizer divides by it; the reductions are local
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def trainer(loss_type, level, beta, case, logp, ent, ent_coef=0.0, bias_kl=False, delta=None,
            quantile=1.0, off_policy=None, vllm=False):
    t = object.__new__(G.GRPOTrainer)
    over = case["over"]
    t.__dict__.update(
        loss_type=loss_type, importance_sampling_level=level, beta=beta, epsilon_low=0.2,
        epsilon_high=(5.0 if loss_type == "cispo" else over.get("clip_high", 0.28)),
        top_entropy_quantile=quantile, off_policy_mask_threshold=off_policy, use_vllm=vllm,
        vllm_importance_sampling_correction=vllm, vllm_importance_sampling_mode="token_truncate",
        aux_loss_enabled=False,
        _entropy_bonus_enabled=ent_coef != 0.0, entropy_coef=ent_coef, use_adaptive_entropy=False,
        current_gradient_accumulation_steps=3,
        max_completion_length=logp.shape[1] + 2, model=types.SimpleNamespace(training=True),
        accelerator=OneProcess(),
        _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
        args=types.SimpleNamespace(use_bias_correction_kl=bias_kl, delta=delta,
                                   sapo_temperature_pos=1.0, sapo_temperature_neg=1.05,
                                   steps_per_generation=2, vespo_k_pos=2.0, vespo_lambda_pos=3.0,
                                   vespo_k_neg=3.0, vespo_lambda_neg=2.0))
    t._get_per_token_logps_and_entropies = lambda *a, **k: (logp, ent, None)
    return t


def run(fn, loss_type, level, beta, case, nan, ent_coef=0.0, bias_kl=False, delta=None, **weights):
    x = torch_inputs(case, ["lp", "old", "ref", "ent"], nan=nan, requires_grad=("lp", "ent"))
    B, T = case["lp"].shape
    inputs = {"prompt_ids": torch.zeros((B, 0), dtype=torch.long),
              "prompt_mask": torch.zeros((B, 0), dtype=torch.long),
              "completion_ids": torch.zeros((B, T), dtype=torch.long),
              "completion_mask": torch.from_numpy(case["mask"].astype(np.int64)),
              "advantages": torch.from_numpy(case["adv_seq"]),
              "old_per_token_logps": x["old"], "ref_per_token_logps": x["ref"],
              "num_items_in_batch": torch.tensor(float(case["mask"].sum() * 2 + 3))}
    if weights.get("vllm"):
        inputs["importance_sampling_ratio"] = torch.from_numpy(case["is_ratio"])
    tr = trainer(loss_type, level, beta, case, x["lp"], x["ent"], ent_coef, bias_kl, delta, **weights)
    loss = fn(tr, None, inputs)
    loss.backward()
    metrics = {k: v[-1] for k, v in tr._metrics["train"].items() if k not in NOT_EXPRESSED}
    grad_ent = x["ent"].grad
    if grad_ent is not None:
        grad_ent = torch.where(torch.from_numpy(case["mask"]), grad_ent, 0.0)
    return loss.detach(), x["lp"].grad, metrics, grad_ent


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("beta", (0.0, 0.04))
@pytest.mark.parametrize("level,loss_type", LEVELS_TYPES)
def test_grpo_loss(level, loss_type, beta, case_name, dtype, rng):
    case = make(case_name, dtype, rng)
    want = run(G.GRPOTrainer._compute_loss, loss_type, level, beta, case, False)
    got = run(rt.compute_loss, loss_type, level, beta, case, case.get("nan", False))
    what = "%s %s beta=%s %s %s" % (level, loss_type, beta, case_name, dtype)
    close_loss(got, want, dtype, what)


def close_with_entropy(got, want, dtype, what):
    """close_loss, and the gradient in the entropies (run's fourth value)."""
    close_loss(got[:3], want[:3], dtype, what)
    close(got[3], want[3], dtype, what + " entropy grad")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("beta", (0.0, 0.04))
@pytest.mark.parametrize("loss_type", rt.LOSS_TYPES)
def test_grpo_loss_entropy_bonus(loss_type, beta, case_name, dtype, rng):
    """TRL's static entropy bonus (a mean over the scored tokens, divided by the accumulation
    steps only): loss, both gradients and every metric, "policy_loss" included."""
    case = make(case_name, dtype, rng)
    want = run(G.GRPOTrainer._compute_loss, loss_type, "token", beta, case, False, ent_coef=0.05)
    got = run(rt.compute_loss, loss_type, "token", beta, case, case.get("nan", False), ent_coef=0.05)
    what = "entropy bonus %s beta=%s %s %s" % (loss_type, beta, case_name, dtype)
    close_with_entropy(got, want, dtype, what)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("level,loss_type", LEVELS_TYPES)
def test_grpo_loss_bias_corrected_kl(level, loss_type, case_name, dtype, rng):
    """use_bias_correction_kl: the k3 term times the importance ratio, with its gradient."""
    case = make(case_name, dtype, rng)
    want = run(G.GRPOTrainer._compute_loss, loss_type, level, 0.04, case, False, bias_kl=True)
    got = run(rt.compute_loss, loss_type, level, 0.04, case, case.get("nan", False), bias_kl=True)
    what = "bias-corrected kl %s %s %s %s" % (level, loss_type, case_name, dtype)
    close_loss(got, want, dtype, what, extra=bias_kl_rounding(level, loss_type, case, dtype))


def bias_kl_rounding(level, loss_type, case, dtype):
    """Bounds on the rounding of the bias-corrected KL term beta * k3 * ratio / n that the test's
    scale does not cover. k3 = e^d - d - 1 (d = ref - lp) is a difference of terms of size
    w = e^d + |d| + 1 and its gradient 1 - e^d another, each formed and multiplied by the ratio
    e^(lp - old) (up to e^25 in these cases) in working precision; where d is small, the result
    is a small fraction of w. Per element the terms are A * w, A = beta * ratio / n: TRL's own
    f64 gradient of that term at d = 1 everywhere, which is -A (at the sequence level too: there
    the row's mean k3 e - 2 adds back what 1 - e takes beyond -1). Each implementation rounds
    d, e^d (2 units), two subtractions, the log-ratio (|lr| units of the ratio) and its exponential
    (2), the products and quotient by beta and n (4), and sums at most B*T terms; two
    implementations each that far from the exact value."""
    if dtype == "f64":
        u = 2.0 ** -53
    else:
        u = 2.0 ** -24
    mask = torch.from_numpy(case["mask"])
    f64 = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
           for k, v in case.items()}
    f64["ref"] = f64["lp"] + 1.0
    at1 = run(G.GRPOTrainer._compute_loss, loss_type, level, 0.04, f64, False, bias_kl=True)
    at0 = run(G.GRPOTrainer._compute_loss, loss_type, level, 0.0, f64, False, bias_kl=True)
    a = (at1[1] - at0[1]).abs().double()
    d = torch.from_numpy(case["ref"].astype(np.float64) - case["lp"].astype(np.float64))
    w = torch.where(mask, d.exp() + d.abs() + 1.0, 0.0)
    lr = torch.where(mask, torch.from_numpy(case["lp"] - case["old"]).double().abs(), 0.0)
    units = 2 * (2 + 2 + 1 + 2 + 4 + float(lr.max()) + mask.numel())
    rows = mask.sum(1, keepdim=True).clamp(min=1)
    # the sequence level's gradient adds the row's mean k3 through the ratio's derivative
    grad_terms = a * (w + (w.sum(1, keepdim=True) / rows if level == "sequence" else 0.0))
    # the kl metric: the mean of k3 * ratio over the mask, at d = 1 the mean ratio times e - 2
    mean_ratio = float(at1[2]["kl"]) / (math.e - 2.0)
    return {"grad": units * u * grad_terms, "loss": units * u * float((a * w).sum()),
            "kl": units * u * mean_ratio * float(w.max())}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("level,loss_type", [(lv, lt) for lv in ("token", "sequence")
                                              for lt in rt.DELTA_TYPES])
@pytest.mark.parametrize("delta", (1.6, 1.08, 1.0))
def test_grpo_loss_delta(level, loss_type, delta, case_name, dtype, rng):
    """Two-sided clipping: delta 1.6 above 1 + epsilon_high, 1.08 inside the clip range, 1.0 at
    its lowest (ratios reach each on both sides)."""
    case = make(case_name, dtype, rng)
    want = run(G.GRPOTrainer._compute_loss, loss_type, level, 0.04, case, False, delta=delta)
    got = run(rt.compute_loss, loss_type, level, 0.04, case, case.get("nan", False), delta=delta)
    hi = 1.0 + case["over"].get("clip_high", 0.28)
    if level == "token" and delta <= hi:
        # the one convention left: a ratio exactly 1 + epsilon_high under a negative advantage,
        # where TRL's clamp passes clamp_bound_grad and rlk's dual clip splits its min tie
        r = torch.exp(torch.from_numpy(case["lp"]) - torch.from_numpy(case["old"]))
        tie = (r == hi) & torch.from_numpy(case["adv_seq"] < 0)[:, None] & torch.from_numpy(case["mask"])
        got = (got[0], torch.where(tie, want[1], got[1]), got[2], got[3])
    close_loss(got, want, dtype, "delta %s %s %s %s %s" % (delta, level, loss_type, case_name, dtype))


WEIGHTS = ({"quantile": 0.6}, {"off_policy": 0.02}, {"vllm": True},
           {"quantile": 0.5, "off_policy": 0.02, "vllm": True})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("weights", WEIGHTS, ids=lambda w: "+".join(sorted(w)))
@pytest.mark.parametrize("level,loss_type", LEVELS_TYPES)
def test_grpo_loss_policy_weights(level, loss_type, weights, case_name, dtype, rng):
    """The high-entropy token mask (top_entropy_quantile, with the entropy bonus on the same
    tokens), the off-policy sequence mask and the vLLM importance ratio (vespo: inside its gamma
    weights), alone and together, with a KL term."""
    case = make(case_name, dtype, rng)
    case["is_ratio"] = np.exp(0.3 * rng.standard_normal(case["lp"].shape)).astype(case["lp"].dtype)
    want = run(G.GRPOTrainer._compute_loss, loss_type, level, 0.04, case, False, ent_coef=0.05, **weights)
    got = run(rt.compute_loss, loss_type, level, 0.04, case, case.get("nan", False), ent_coef=0.05, **weights)
    what = "weights %s %s %s %s %s" % (sorted(weights), level, loss_type, case_name, dtype)
    close_with_entropy(got, want, dtype, what)


def test_patch_swaps_and_restores():
    before = G.GRPOTrainer.__dict__["_compute_loss"]
    h = rt.patch()
    assert G.GRPOTrainer._compute_loss is rt.compute_loss
    h.undo()
    assert G.GRPOTrainer.__dict__["_compute_loss"] is before


@pytest.mark.parametrize("k", (None, 3))
@pytest.mark.parametrize("temperature", (1.0, 0.7))
@pytest.mark.parametrize("row_mask", (False, True))
def test_selective_log_softmax(k, temperature, row_mask, rng):
    from trl.trainer.utils import selective_log_softmax
    B, Tn, V = 3, 5, 509
    logits = torch.from_numpy((rng.standard_normal((B, Tn, V)) * 2).astype(np.float32))
    shape = (B, Tn) if k is None else (B, Tn, k)
    index = torch.from_numpy(rng.integers(0, V, shape))
    rm = torch.from_numpy(rng.random(shape) < 0.7) if row_mask else None
    if rm is not None and k is not None:
        rm = rm[..., :1].expand(shape)  # a row is in or out as a whole
    outs = []
    for fn in (selective_log_softmax, rt.selective_log_softmax):
        x = logits.clone().requires_grad_(True)
        lp = fn(x, index, temperature=temperature, row_mask=rm)
        (lp * torch.linspace(-1, 2, lp.numel()).view(lp.shape)).sum().backward()
        outs.append((lp.detach(), x.grad))
    what = "selective_log_softmax k=%s T=%s mask=%s" % (k, temperature, row_mask)
    close(outs[1][0], outs[0][0], "f32", what + " logp")
    close(outs[1][1], outs[0][1], "f32", what + " grad")

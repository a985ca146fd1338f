"""TRL's DistillationTrainer (the pinned release) distilling the wider tiny teacher into the tiny
student on the CPU under bf16 autocast, as installed and with rlk.integrations.trl_distill.patch():
rlk's two-head kernels compute every step's per-token divergence and its gradient. Per step the
loss and the gradient norm, and the weights after the run, agree within the tolerances derived
below, for the forward KL, the JSD and the reverse KL (TRL's beta 0, 0.5, 1)."""
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="needs torch (make trainer-test installs it)")
trl = pytest.importorskip("trl", reason="needs trl (make trainer-test installs it)")

import rlk  # noqa: E402
from rlk.integrations import trl_distill as rd  # noqa: E402

import distill_run  # noqa: E402
import tiny  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
U16 = 2.0 ** -8   # bf16's unit roundoff (8 significant bits, round to nearest)
F32 = 2.0 ** -24

if not rlk.OPS["linear_divergence"].available():
    pytest.skip("the loaded librlk has no rlk_linear_divergence", allow_module_level=True)


def _run(tmp, name, flags):
    out = str(tmp / (name + ".pt"))
    r = subprocess.run([sys.executable, os.path.join(HERE, "distill_run.py"), out] + flags,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return torch.load(out)


def zmax_of(head, norm_weight):
    """|h . W_v| <= sqrt(H) max|gamma| max_v ||W_v||: the final RMSNorm's output has 2-norm at
    most sqrt(H) max|gamma| (autocast rounds h and W to bf16: at most (1 + u)^2 more)."""
    return math.sqrt(head.shape[1]) * norm_weight.abs().max().item() * head.norm(dim=1).max().item() * \
        (1 + U16) ** 2


def tolerances(student_weights):
    """(dD, eps): dD bounds the difference of a step's loss (a mean of per-token divergences) that
    the two computations' arithmetic makes on the same weights; eps the relative difference of a
    gradient.
    Both take the same bf16 operands. TRL projects them with an f32 GEMM (each logit within
    (H + 2) 2^-24 zmax / T of the exact one, the 2 for the scalings), rlk in fp64 (exact to
    2^-40). A token's divergence moves by at most sum_v |dD/dz_v| max |dz| over both heads' logits;
    sum_v |dD/dz_v| <= 2 + 2 L for every beta, L = 2 (zmax_s + zmax_t) / T + 2 log V bounding
    |log p_s - log p_t| (|log p| = lse - z <= 2 zmax / T + log V on each side), and f32's
    sums over V columns add (V + 8) 2^-24 (2 + L): dD = (2 + 2 L) (H + 2) 2^-24 zmax / T x 2 heads
    + (V + 8) 2^-24 (2 + L).
    The gradient: TRL rounds the logits' gradient to bf16 before its products (u a column), rlk
    does not; then the backbone's backward runs under bf16 autocast, where each rounding on the
    path from the head to a parameter may round the other way when its input moved, one more u
    each: at most 9 a layer (o_proj, the attention's two products and its softmax, v/k/q, the
    MLP's three projections) plus the final norm and the embedding. First order: eps = (1 + 9 L_layers
    + 2) u."""
    cfg_s, cfg_t = tiny.config(), tiny.config(hidden=distill_run.TEACHER_HIDDEN)
    teacher = dict(tiny.model(seed=99, hidden=distill_run.TEACHER_HIDDEN).named_parameters())
    zs = max(zmax_of(w["lm_head.weight"], w["model.norm.weight"]) for w in student_weights)
    zt = zmax_of(teacher["lm_head.weight"].detach(), teacher["model.norm.weight"].detach())
    T = distill_run.TEMPERATURE
    L = 2 * (zs + zt) / T + 2 * math.log(cfg_s.vocab_size)
    H = max(cfg_s.hidden_size, cfg_t.hidden_size)
    dD = (2 + 2 * L) * (H + 2) * F32 * (zs + zt) / T + (cfg_s.vocab_size + 8) * F32 * (2 + L)
    eps = (1 + 9 * cfg_s.num_hidden_layers + 2) * U16
    return dD, eps


def compare(a, b):
    assert a["completions"] == b["completions"], "the runs sampled different completions"
    assert len(a["logs"]) == len(b["logs"]) == distill_run.STEPS
    dD, eps = tolerances([a["weights"], b["weights"]])
    lr = distill_run.LR
    drift = 0.0  # ||w_a - w_b|| before the step, first order: lr eps sum of the earlier norms
    for step, ((la, ga), (lb, gb)) in enumerate(zip(a["logs"], b["logs"])):
        # the loss moves with the weights' drift by at most ||g|| drift (first order)
        tol_loss = dD + ga * drift
        assert abs(la - lb) <= tol_loss, "step %d: loss %r vs %r (tolerance %g)" % (step, la, lb, tol_loss)
        assert abs(ga - gb) <= eps * ga, "step %d: grad norm %r vs %r (eps %g)" % (step, ga, gb, eps)
        drift += lr * eps * ga
    # SGD: a tensor moves by lr g a step, g within eps ||g||: ||dw|| <= lr eps sum_t ||g_t||
    moved = False
    initial = dict(tiny.model().named_parameters())
    for n in a["trainable"]:
        tol = lr * eps * a["grad_norm_sum"].get(n, 0.0) + 1e-7 * a["weights"][n].norm().item()
        d = (a["weights"][n] - b["weights"][n]).norm().item()
        assert d <= tol, "%s: weights differ by %g (tolerance %g)" % (n, d, tol)
        moved = moved or (a["weights"][n] - initial[n].detach()).norm().item() > tol
    assert moved, "no weight moved by more than the tolerance: the comparison shows nothing"


@pytest.mark.parametrize("beta", (0.0, 0.5, 1.0))
def test_distillation_trainer_agrees(tmp_path, beta):
    a = _run(tmp_path, "trl", ["--beta", str(beta)])
    b = _run(tmp_path, "rlk", ["--beta", str(beta), "--rlk"])
    compare(a, b)
    # rlk computed the divergence of every step (one micro-batch a step)
    assert b["calls"] == {"rlk": distill_run.STEPS}, b["calls"]
    assert b["report"]["version"] == trl.__version__


def test_patch_restores():
    from trl.trainer import distillation_trainer as D
    own = D.ChunkedDivergenceFunction
    h = rd.patch()
    assert D.ChunkedDivergenceFunction is rd.ChunkedDivergence
    h.undo()
    assert D.ChunkedDivergenceFunction is own

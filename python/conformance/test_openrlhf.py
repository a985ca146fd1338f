"""rlk.integrations.openrlhf beside OpenRLHF's own PolicyLoss, ValueLoss and GAE (the installed
package, called unchanged), on every case, f32 and f64: losses, gradients and metrics."""
import numpy as np
import pytest
import torch

import trainers  # noqa: F401
from cases import CASES, close, make, torch_inputs

L = pytest.importorskip("openrlhf.models.loss")
import openrlhf.models.utils as U  # noqa: E402
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker  # noqa: E402

from rlk.integrations import openrlhf as ro  # noqa: E402

DTYPES = ("f32", "f64")


@pytest.fixture
def rng():
    return np.random.default_rng(int.from_bytes(__import__("os").urandom(4), "little"))


def run(cls, case, nan, ctor, fwd, adv_key):
    t = torch_inputs(case, ["lp", "old", adv_key], nan=nan, requires_grad=("lp",))
    mask = torch.from_numpy(case["mask"]).float()
    loss, clip_ratio, ppo_kl, _, _ = cls(**ctor)(t["lp"], t["old"], t[adv_key], mask, **fwd)
    loss.backward()
    return loss.detach(), t["lp"].grad, clip_ratio, ppo_kl


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("token_level", (True, False))
@pytest.mark.parametrize("dual", (None, "case"))
@pytest.mark.parametrize("kind", ("ppo", "gspo"))
def test_policy_loss(kind, dual, token_level, case_name, dtype, rng):
    case = make(case_name, dtype, rng)
    over = case["over"]
    ctor = {"clip_eps_low": 0.2, "clip_eps_high": over.get("clip_high", 0.28),
            "dual_clip": None if dual is None else over.get("dual_clip", 3.0),
            "token_level_loss": token_level, "policy_loss_type": kind}
    # per-token advantages (GAE-like) and per-sequence ones broadcast over the tokens
    case["adv_row"] = np.repeat(case["adv_seq"][:, None], case["lp"].shape[1], 1)
    for adv_key in ("adv", "adv_row"):
        for fwd in ({}, {"dp_size": 2, "batch_num_tokens": 29.0, "global_batch_size": 7.0}):
            want = run(L.PolicyLoss, case, False, ctor, fwd, adv_key)
            got = run(ro.PolicyLoss, case, case.get("nan", False), ctor, fwd, adv_key)
            what = "%s dual=%s token=%s %s %s %s %s" % (kind, dual, token_level, case_name, dtype,
                                                       adv_key, fwd)
            close(got[0], want[0], dtype, what + " loss")
            close(got[1], want[1], dtype, what + " grad")
            close(got[2], want[2], dtype, what + " clip_ratio")
            close(got[3], want[3], dtype, what + " ppo_kl")


CORRECTIONS = (
    {"is_correction_level": "token", "is_correction_mode": "mask", "is_correction_threshold": (0.8, 1.25)},
    {"is_correction_level": "token", "is_correction_mode": "clip", "is_correction_threshold": (0.8, 1.25)},
    {"is_correction_level": "seq", "is_correction_mode": "mask", "is_correction_threshold": (0.9, 1.1)},
    {"is_correction_level": "token", "is_correction_gating": "binary_kl", "is_correction_threshold": (0.0, 0.01)},
    {"is_correction_level": "seq", "is_correction_gating": "tv", "is_correction_threshold": (0.0, 0.03)},
)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("corr", range(len(CORRECTIONS)))
@pytest.mark.parametrize("kind", ("ppo", "gspo"))
def test_policy_loss_is_correction(kind, corr, case_name, dtype, rng):
    """The train/rollout mismatch correction (rollout log-probs 0.2-scale noise off the old ones;
    bands the data crosses): loss, gradient and all four metrics."""
    case = make(case_name, dtype, rng)
    roll = case["old"] + (rng.standard_normal(case["old"].shape) * 0.2).astype(case["old"].dtype)
    ctor = dict(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=3.0, policy_loss_type=kind,
                **CORRECTIONS[corr])
    outs = []
    for cls, nan in ((L.PolicyLoss, False), (ro.PolicyLoss, case.get("nan", False))):
        t = torch_inputs(case, ["lp", "old", "adv"], nan=nan, requires_grad=("lp",))
        r = torch.from_numpy(np.where(case["mask"], roll, np.nan if nan else 0.0))
        mask = torch.from_numpy(case["mask"]).float()
        res = cls(**ctor)(t["lp"], t["old"], t["adv"], mask, rollout_log_probs=r)
        res[0].backward()
        outs.append((res[0].detach(), t["lp"].grad) + tuple(res[1:]))
    what = "%s %s %s %s" % (kind, CORRECTIONS[corr], case_name, dtype)
    for i, name in enumerate(("loss", "grad", "clip_ratio", "ppo_kl", "vllm_kl", "is_filter_ratio")):
        if outs[1][i] is None or outs[0][i] is None:
            assert outs[1][i] is None and outs[0][i] is None, what + " " + name
            continue
        close(outs[1][i], outs[0][i], dtype, what + " " + name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("token_level", (True, False))
@pytest.mark.parametrize("clip", (None, 0.5))
def test_value_loss(clip, token_level, case_name, dtype, rng):
    case = make(case_name, dtype, rng)
    mask = torch.from_numpy(case["mask"]).float()
    outs = []
    for cls, nan in ((L.ValueLoss, False), (ro.ValueLoss, case.get("nan", False))):
        t = torch_inputs(case, ["values", "old_values", "returns"], nan=nan,
                         requires_grad=("values",))
        loss = cls(clip, token_level)(t["values"], t["old_values"], t["returns"], mask)
        loss.backward()
        outs.append((loss.detach(), t["values"].grad))
    what = "value clip=%s token=%s %s %s" % (clip, token_level, case_name, dtype)
    close(outs[1][0], outs[0][0], dtype, what + " loss")
    close(outs[1][1], outs[0][1], dtype, what + " grad")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
def test_gae(case_name, dtype, rng):
    case = make(case_name, dtype, rng)
    mask = torch.from_numpy(case["mask"]).float()
    t = torch_inputs(case, ["values", "rewards"])
    want = RemoteExperienceMaker.get_advantages_and_returns(None, t["values"], t["rewards"], mask,
                                                            0.99, 0.95)
    tn = torch_inputs(case, ["values", "rewards"], nan=case.get("nan", False))
    got = ro.get_advantages_and_returns(tn["values"], tn["rewards"], mask, 0.99, 0.95)
    close(got[0], want[0], dtype, "advantages")
    close(got[1], want[1], dtype, "returns")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("estimator", ("k1", "k2", "k3"))
@pytest.mark.parametrize("grad", ("pathwise", "unbiased", "unbiased-no-old"))
def test_compute_approx_kl(grad, estimator, case_name, dtype, rng):
    """compute_approx_kl: the value and the gradients in both log-probs under a random upstream
    gradient; the cases' old log-probs as the base (log-ratios past +-20 and on 20), the
    reference's as the rollout policy of the unbiased gradient's weight (some above the clip)."""
    case = make(case_name, dtype, rng)
    up = torch.from_numpy(rng.standard_normal(case["lp"].shape).astype(np.float32))
    unbiased = grad != "pathwise"
    outs = []
    for fn in (U.compute_approx_kl, ro.compute_approx_kl):
        t = torch_inputs(case, ["lp", "old", "ref"], requires_grad=("lp", "old"))
        old = 4.0 * t["ref"] - 3.0 * t["lp"].detach() if grad == "unbiased" else None
        kl = fn(t["lp"], t["old"], log_probs_old=old, kl_estimator=estimator, unbiased_gradient=unbiased)
        (kl * up).sum().backward()
        outs.append((kl.detach(), t["lp"].grad, t["old"].grad))
    for k, part in enumerate(("kl", "grad log_probs", "grad log_probs_base")):
        assert outs[1][k].dtype == outs[0][k].dtype
        # OpenRLHF computes in f32 whatever the inputs: compare at f32's tolerance
        close(outs[1][k], outs[0][k], "f32", "compute_approx_kl %s %s %s %s %s" % (
            estimator, grad, case_name, dtype, part))
    with pytest.raises(ValueError):
        ro.compute_approx_kl(t["lp"], t["old"], kl_estimator="k4")


def test_patch_swaps_and_restores():
    import openrlhf.models as M
    import openrlhf.trainer.ppo_utils.experience_maker as E
    before = (L.PolicyLoss, L.ValueLoss, M.PolicyLoss, U.compute_approx_kl, E.compute_approx_kl)
    h = ro.patch()
    assert L.PolicyLoss is ro.PolicyLoss and M.ValueLoss is ro.ValueLoss
    assert U.compute_approx_kl is ro.compute_approx_kl and E.compute_approx_kl is ro.compute_approx_kl
    h.undo()
    assert (L.PolicyLoss, L.ValueLoss, M.PolicyLoss, U.compute_approx_kl, E.compute_approx_kl) == before


def test_patch_reaches_modules_that_imported_by_name_before_it():
    """A trainer module imported before patch() holds OpenRLHF's classes by name (the critic's
    `from openrlhf.models import ValueLoss`): patched there too, reported, and restored."""
    import openrlhf.trainer.ray.ppo_critic as C
    own = C.ValueLoss
    h = ro.patch(head=False)
    try:
        assert C.ValueLoss is ro.ValueLoss
        assert "openrlhf.trainer.ray.ppo_critic.ValueLoss" in h.report["swapped"]
    finally:
        h.undo()
    assert C.ValueLoss is own


def test_patch_restores_modules_first_imported_by_it(monkeypatch):
    """A trainer module that patch() itself loads first (the experience maker, with
    compute_approx_kl by name) takes OpenRLHF's, is patched as the others, and undo() leaves it
    OpenRLHF's."""
    import sys

    import openrlhf.trainer.ppo_utils as pkg
    name = "openrlhf.trainer.ppo_utils.experience_maker"
    monkeypatch.setattr(pkg, "experience_maker", sys.modules[name])  # both restored afterwards
    monkeypatch.delitem(sys.modules, name)
    h = ro.patch(head=False)
    try:
        E = sys.modules[name]
        assert E.compute_approx_kl is ro.compute_approx_kl
        assert name + ".compute_approx_kl" in h.report["swapped"]
    finally:
        h.undo()
    assert E.compute_approx_kl is U.compute_approx_kl and U.compute_approx_kl is not ro.compute_approx_kl


def test_patch_that_fails_partway_undoes_what_it_set(monkeypatch):
    """An OpenRLHF whose seam moved (under force: an Actor without its own forward): patch()
    raises, and the losses it had already swapped are OpenRLHF's again."""
    import openrlhf.models as M
    from openrlhf.models.actor import Actor
    before = (L.PolicyLoss, L.ValueLoss, M.PolicyLoss, U.compute_approx_kl)
    monkeypatch.delattr(Actor, "forward")
    with pytest.raises(KeyError):
        ro.patch(force=True)
    assert (L.PolicyLoss, L.ValueLoss, M.PolicyLoss, U.compute_approx_kl) == before


def test_patch_of_a_source_tree_without_metadata(monkeypatch):
    """An OpenRLHF imported from a source tree (no distribution metadata, so no version): refused,
    and patched with force=True, the version reported unknown."""
    import importlib.metadata

    from rlk.integrations._common import UntestedVersion

    def no_metadata(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "version", no_metadata)
    with pytest.raises(UntestedVersion, match="force=True"):
        ro.patch(head=False)
    assert L.PolicyLoss is not ro.PolicyLoss
    h = ro.patch(head=False, force=True)
    try:
        assert h.report["version"] == "unknown" and L.PolicyLoss is ro.PolicyLoss
    finally:
        h.undo()
    assert L.PolicyLoss is not ro.PolicyLoss

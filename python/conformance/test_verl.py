"""rlk.integrations.verl beside verl's own core_algos functions (the installed package, called
unchanged), on every case, f32 and f64: losses, gradients and every metric verl logs."""
import numpy as np
import pytest
import torch

import trainers  # noqa: F401
from cases import CASES, close, close_loss, make, torch_inputs

ca = pytest.importorskip("verl.trainer.ppo.core_algos")
from verl.workers.config import ActorConfig  # noqa: E402

import rlk  # noqa: E402
from rlk.integrations import verl as rv  # noqa: E402

DTYPES = ("f32", "f64")
AGGS = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
        "seq-mean-token-sum-norm")


def config(case, global_info=None, **kw):
    over = case["over"]
    args = dict(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, ppo_mini_batch_size=4,
                use_dynamic_bsz=False, rollout_n=1, clip_ratio=0.2, clip_ratio_low=0.2,
                clip_ratio_high=over.get("clip_high", 0.28), clip_ratio_c=over.get("dual_clip", 3.0))
    args.update(kw)
    c = ActorConfig(**args)
    if global_info:
        c.global_batch_info.update(global_info)
    return c


def run_policy(fn, case, agg, cfg, nan, isw=None):
    t = torch_inputs(case, ["lp", "old", "adv"], nan=nan, requires_grad=("lp",))
    mask = torch.from_numpy(case["mask"]).float()
    loss, metrics = fn(old_log_prob=t["old"], log_prob=t["lp"], advantages=t["adv"],
                       response_mask=mask, loss_agg_mode=agg, config=cfg, rollout_is_weights=isw)
    loss.backward()
    return loss.detach(), t["lp"].grad, metrics


@pytest.fixture
def rng():
    return np.random.default_rng(int.from_bytes(__import__("os").urandom(4), "little"))


GLOBAL_INFOS = (None, {"dp_size": 2, "batch_num_tokens": 31.0, "global_batch_size": 5.0,
                       "loss_scale_factor": 13.0})


def compare_policy(mode, agg, case_name, dtype, rng, isw=None, seed=None, **cfg_kw):
    """verl's registered loss `mode` and the adapter on one case, local and with global batch
    info: loss, gradient and every metric. seed: torch's generator seeded alike before each side
    (a loss that draws at random)."""
    case = make(case_name, dtype, rng)
    nan = case.get("nan", False)
    w = isw(case) if callable(isw) else isw
    for info in GLOBAL_INFOS:
        cfg = config(case, info, **cfg_kw)
        if seed is not None:
            torch.manual_seed(seed)
        want = run_policy(ca.get_policy_loss_fn(mode), case, agg, cfg, False, w)
        if seed is not None:
            torch.manual_seed(seed)
        got = run_policy(rv.compute_policy_loss(mode), case, agg, cfg, nan, w)
        what = "%s %s %s %s %s" % (mode, agg, case_name, dtype, "dp" if info else "local")
        close_loss(got, want, dtype, what)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("mode", ("vanilla", "gspo", "sapo", "cispo", "gpg", "geo_mean"))
def test_policy_loss(mode, agg, case_name, dtype, rng):
    compare_policy(mode, agg, case_name, dtype, rng)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ("vanilla", "gspo", "cispo", "geo_mean"))
def test_policy_loss_broadcast_advantages(mode, dtype, rng):
    """Advantages as verl's outcome estimators leave them: one per sequence, expanded over the
    tokens (a stride-0 view, read as it is)."""
    case = make(CASES[0], dtype, rng)
    cfg = config(case)
    mask = torch.from_numpy(case["mask"]).float()
    out = []
    for fn in (ca.get_policy_loss_fn(mode), rv.compute_policy_loss(mode)):
        t = torch_inputs(case, ["lp", "old", "adv"], requires_grad=("lp",))
        adv = t["adv"][:, :1].expand_as(t["adv"])
        assert adv.stride(1) == 0
        loss, metrics = fn(old_log_prob=t["old"], log_prob=t["lp"], advantages=adv,
                           response_mask=mask, loss_agg_mode="token-mean", config=cfg)
        loss.backward()
        out.append((loss.detach(), t["lp"].grad, metrics))
    close_loss(out[1], out[0], dtype, "%s broadcast advantages %s" % (mode, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("mode", ("clip_cov", "kl_cov"))
@pytest.mark.parametrize("weighted", (False, True))
def test_cov_policy_losses(mode, agg, weighted, case_name, dtype, rng):
    """clip_cov and kl_cov with shares large enough to pick tokens in these small batches (verl's
    defaults pick one token or none here); torch's generator seeded alike before each side, so
    clip_cov's random draw is the same; with and without rollout weights."""
    from verl.workers.config.actor import PolicyLossConfig
    pl = PolicyLossConfig(loss_mode=mode, clip_cov_ratio=0.2, clip_cov_lb=0.02, clip_cov_ub=5.0,
                          kl_cov_ratio=0.25, ppo_kl_coef=0.7)
    isw = None
    if weighted:
        isw = lambda case: torch.from_numpy(  # noqa: E731
            (rng.random(case["lp"].shape) + 0.5).astype(case["lp"].dtype))
    compare_policy(mode, agg, case_name, dtype, rng, isw=isw, seed=int(rng.integers(1 << 30)),
                   policy_loss=pl)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("mode", ("dppo_tv", "dppo_kl", "dro"))
def test_dppo_dro_policy_losses(mode, agg, case_name, dtype, rng):
    """The DPPO trust regions at bounds the data reaches on both sides (0.02 on p - p_old, 0.01
    on the binary KL), DRO with beta 0.3; with rollout weights for the DPPO pair."""
    from verl.workers.config.actor import PolicyLossConfig
    bound = 0.01 if mode == "dppo_kl" else 0.02
    isw = None
    if mode != "dro":
        isw = lambda case: torch.from_numpy(  # noqa: E731
            (rng.random(case["lp"].shape) + 0.5).astype(case["lp"].dtype))
    compare_policy(mode, agg, case_name, dtype, rng, isw=isw,
                   policy_loss=PolicyLossConfig(loss_mode=mode, dro_beta=0.3),
                   clip_ratio_low=bound, clip_ratio_high=bound)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("agg", ("token-mean", "seq-mean-token-mean"))
@pytest.mark.parametrize("rc", ({"loss_type": "reinforce", "rollout_is": "token"},
                                {"loss_type": "reinforce", "rollout_is": "sequence"},
                                {"loss_type": "ppo_clip", "rollout_is": "token"}))
def test_bypass_mode(rc, agg, case_name, dtype, rng):
    """bypass_mode with verl's rollout correction (token or sequence IS weights, threshold 1.5)."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.workers.config.actor import PolicyLossConfig
    pl = PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=RolloutCorrectionConfig(
        rollout_is_threshold=1.5, **rc))
    compare_policy("bypass_mode", agg, case_name, dtype, rng, policy_loss=pl)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("mode", ("vanilla", "gspo", "cispo", "geo_mean", "dro"))
def test_policy_loss_rollout_is_weights(mode, case_name, dtype, rng):
    from verl.workers.config.actor import PolicyLossConfig
    case = make(case_name, dtype, rng)
    isw = torch.from_numpy((rng.random((case["lp"].shape)) + 0.5).astype(case["lp"].dtype))
    cfg = config(case, policy_loss=PolicyLossConfig(loss_mode=mode, dro_beta=0.3))
    want = run_policy(ca.get_policy_loss_fn(mode), case, "token-mean", cfg, False, isw)
    got = run_policy(rv.compute_policy_loss(mode), case, "token-mean", cfg, case.get("nan", False),
                     isw)
    close(got[0], want[0], dtype, "loss")
    close(got[1], want[1], dtype, "grad")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("agg", AGGS)
def test_agg_loss(agg, case_name, dtype, rng):
    case = make(case_name, dtype, rng)
    mask = torch.from_numpy(case["mask"]).float()
    for kw in ({}, {"dp_size": 4, "batch_num_tokens": 17, "global_batch_size": 3,
                    "loss_scale_factor": 7}):
        outs = []
        for fn, nan in ((ca.agg_loss, False), (rv.agg_loss, case.get("nan", False))):
            x = torch_inputs(case, ["ent"], nan=nan, requires_grad=("ent",))["ent"]
            loss = fn(x, mask, agg, **kw)
            loss.backward()
            outs.append((loss.detach(), x.grad))
        close(outs[1][0], outs[0][0], dtype, "agg_loss %s %s" % (agg, kw))
        close(outs[1][1], outs[0][1], dtype, "agg_loss grad %s %s" % (agg, kw))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("agg", AGGS)
def test_value_loss(agg, case_name, dtype, rng):
    case = make(case_name, dtype, rng)
    mask = torch.from_numpy(case["mask"]).float()
    outs = []
    for fn, nan in ((ca.compute_value_loss, False), (rv.compute_value_loss, case.get("nan", False))):
        t = torch_inputs(case, ["values", "old_values", "returns"], nan=nan,
                         requires_grad=("values",))
        loss, clipfrac = fn(t["values"], t["returns"], t["old_values"], mask, 0.5,
                            loss_agg_mode=agg)
        loss.backward()
        outs.append((loss.detach(), t["values"].grad, clipfrac))
    what = "value %s %s %s" % (agg, case_name, dtype)
    close(outs[1][0], outs[0][0], dtype, what + " loss")
    close(outs[1][1], outs[0][1], dtype, what + " grad")
    close(outs[1][2], outs[0][2], dtype, what + " vf_clipfrac")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
def test_gae_and_whiten(case_name, dtype, rng):
    case = make(case_name, dtype, rng)
    mask = torch.from_numpy(case["mask"]).float()
    t = torch_inputs(case, ["rewards", "values"])
    want = ca.compute_gae_advantage_return(t["rewards"], t["values"], mask, 0.99, 0.95)
    tn = torch_inputs(case, ["rewards", "values"], nan=case.get("nan", False))
    got = rv.compute_gae_advantage_return(tn["rewards"], tn["values"], mask, 0.99, 0.95)
    keep = torch.from_numpy(case["mask"]) if case.get("nan") else torch.ones_like(mask).bool()
    close(got[0][keep], want[0][keep], dtype, "gae advantages")
    close(got[1][keep], want[1][keep], dtype, "gae returns")
    import verl.utils.torch_functional as vf
    close(rv.masked_whiten(t["values"], mask)[keep], vf.masked_whiten(t["values"], mask)[keep],
          dtype, "masked_whiten")


KL_PENALTIES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("name", KL_PENALTIES + tuple(n + "+" for n in KL_PENALTIES))
def test_kl_penalty(name, case_name, dtype, rng):
    """core_algos.kl_penalty: the value and both gradients under a random upstream gradient; the
    cases' old log-probs as the reference (log-ratios past +-20 and exactly on 20)."""
    case = make(case_name, dtype, rng)
    up = torch.from_numpy(rng.standard_normal(case["lp"].shape).astype(case["lp"].dtype))
    outs = []
    for fn in (ca.kl_penalty, rv.kl_penalty):
        t = torch_inputs(case, ["lp", "old"], requires_grad=("lp", "old"))
        kl = fn(t["lp"], t["old"], name)
        (kl * up).sum().backward()
        outs.append((kl.detach(), t["lp"].grad, t["old"].grad))
    for k, part in enumerate(("kl", "grad logprob", "grad ref_logprob")):
        assert outs[1][k].dtype == outs[0][k].dtype
        close(outs[1][k], outs[0][k], dtype, "kl_penalty %s %s %s %s" % (name, case_name, dtype, part))


def test_kl_penalty_full_raises():
    x = torch.zeros(2, 3)
    for fn in (ca.kl_penalty, rv.kl_penalty):
        with pytest.raises(NotImplementedError):
            fn(x, x, "full")


def test_patch_swaps_and_restores():
    # (the PPO path's modules that import agg_loss by name need verl's whole dependency set:
    # python/trainers/test_verl.py checks them swapped)
    before = (ca.POLICY_LOSS_REGISTRY["vanilla"], ca.agg_loss, ca.compute_value_loss, ca.kl_penalty)
    h = rv.patch()
    assert ca.get_policy_loss_fn("vanilla") is rv.compute_policy_loss_vanilla
    # core_algos' own functions keep verl's aggregation
    assert (ca.agg_loss, ca.compute_value_loss, ca.kl_penalty) == before[1:]
    assert h.report["version"] == "0.9.1" and "core_algos.agg_loss" in h.report["left"]
    h.undo()
    assert (ca.POLICY_LOSS_REGISTRY["vanilla"], ca.agg_loss, ca.compute_value_loss,
            ca.kl_penalty) == before


def test_patch_that_fails_partway_undoes_what_it_set(monkeypatch):
    """A verl whose seam moved (under force): the step that fails raises, and what the steps
    before it set is undone, no half-patched trainer without a handle."""
    import verl.models.transformers.dense_common as dc
    import verl.utils.torch_functional as vf
    before = (ca.POLICY_LOSS_REGISTRY["vanilla"], ca.compute_grpo_outcome_advantage,
              vf.logprobs_from_logits)
    monkeypatch.delattr(dc, "forward_base_model")
    with pytest.raises(AttributeError):
        rv.patch(prefix=True, force=True)
    assert (ca.POLICY_LOSS_REGISTRY["vanilla"], ca.compute_grpo_outcome_advantage,
            vf.logprobs_from_logits) == before


# ---- outcome advantage estimators -----------------------------------------------------

ESTIMATORS = ("grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "opo", "grpo_passk",
              "reinforce_plus_plus_baseline")  # (gpg and remax take other arguments: below)


class AlgoConfig(dict):
    """What verl's estimators read from their config: .get(name, default)."""


def outcome_batch(layout, rewards, dtype, rng, singletons=True):
    """Token rewards [B, T] with a response mask and verl's `index` (a uid per sample): groups of
    4 in order ("fixed"), or groups of 1 to 7 members whose samples are shuffled ("shuffled").
    rewards: "continuous", or "passfail" (0/1 outcome in the last response token: ties)."""
    dt = np.float64 if dtype == "f64" else np.float32
    if layout == "fixed":
        sizes = [4] * 6
    else:
        sizes = list(rng.integers(2, 8, 6)) + ([1, 1] if singletons else [])
    ids = np.concatenate([np.full(n, "uid-%d" % g, dtype=object) for g, n in enumerate(sizes)])
    if layout == "shuffled":
        ids = ids[rng.permutation(len(ids))]
    Bn, Tn = len(ids), 11
    lens = rng.integers(1, Tn + 1, Bn)
    mask = (np.arange(Tn)[None, :] < lens[:, None])
    if rewards == "passfail":
        tok = np.zeros((Bn, Tn))
        tok[np.arange(Bn), lens - 1] = rng.integers(0, 2, Bn)
    else:
        tok = rng.standard_normal((Bn, Tn)) * 0.5 * mask
    return (torch.from_numpy(tok.astype(dt)), torch.from_numpy(mask.astype(dt)), ids)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rewards", ("continuous", "passfail"))
@pytest.mark.parametrize("layout", ("fixed", "shuffled"))
@pytest.mark.parametrize("norm", (True, False))
@pytest.mark.parametrize("name", ESTIMATORS)
def test_outcome_estimator(name, norm, layout, rewards, dtype, rng):
    if not norm and name not in ("grpo", "grpo_vectorized", "grpo_passk"):
        pytest.skip("norm_adv_by_std_in_grpo is read by grpo, grpo_vectorized and grpo_passk only")
    # verl refuses a one-member group under pass@k
    tok, mask, ids = outcome_batch(layout, rewards, dtype, rng, singletons=name != "grpo_passk")
    cfg = AlgoConfig(norm_adv_by_std_in_grpo=norm)
    kw = {"norm_adv_by_std_in_grpo": norm} if name in ("grpo", "grpo_vectorized") else {}
    want, want_ret = ca.get_adv_estimator_fn(name)(
        token_level_rewards=tok.clone(), response_mask=mask, index=ids, epsilon=1e-6,
        config=cfg, **kw)
    got, got_ret = rv.ADV_ESTIMATORS[name](
        token_level_rewards=tok.clone(), response_mask=mask, index=ids, epsilon=1e-6,
        config=cfg, **kw)
    what = "%s norm=%s %s %s %s" % (name, norm, layout, rewards, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape, what
    # rlk's advantages are f32 (f64 statistics for f64 scores)
    close(got, want, dtype, what + " advantages", rtol=2e-6)
    close(got_ret, want_ret, dtype, what + " returns", rtol=2e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ("fixed", "shuffled"))
def test_gpg_and_remax(layout, dtype, rng):
    tok, mask, ids = outcome_batch(layout, "continuous", dtype, rng)
    tok[0] = 0.0  # a zero score (gpg counts the non-zero ones)
    for name, kw in (("gpg", dict(index=ids, epsilon=1e-6, f_norm=1.7)),
                     ("remax", dict(reward_baselines=torch.from_numpy(
                         rng.standard_normal(tok.shape[0]).astype(tok.numpy().dtype))))):
        want = ca.get_adv_estimator_fn(name)(token_level_rewards=tok.clone(), response_mask=mask,
                                             config=AlgoConfig(), **kw)
        got = rv.ADV_ESTIMATORS[name](token_level_rewards=tok.clone(), response_mask=mask,
                                      config=AlgoConfig(), **kw)
        what = "%s %s %s" % (name, layout, dtype)
        for g, w, part in zip(got, want, ("advantages", "returns")):
            assert g.dtype == w.dtype and g.shape == w.shape, what
            close(g, w, dtype, what + " " + part, rtol=2e-6 if name == "gpg" else None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ("fixed", "shuffled"))
@pytest.mark.parametrize("weights", (None, [1.0, 0.3]))
def test_gdpo(weights, layout, dtype, rng):
    """Two reward components on each response's last token, grouped and normalized apart, summed
    with weights, whitened; and the plain form (the token rewards as the one component)."""
    tok, mask, ids = outcome_batch(layout, "continuous", dtype, rng)
    B, Tn, P = tok.shape[0], tok.shape[1], 3
    lens = mask.sum(-1).long()
    batch = {"prompts": torch.zeros((B, P), dtype=torch.long),
             "attention_mask": torch.cat([torch.ones((B, P), dtype=torch.long), mask.long()], dim=1)}
    extra = {"fmt": list(rng.integers(0, 2, B).astype(float)), "acc": list(rng.standard_normal(B))}
    cfg = AlgoConfig(gdpo_reward_keys=["fmt", "acc"], norm_adv_by_std_in_grpo=True)
    if weights is not None:
        cfg["gdpo_reward_weights"] = weights
    for kw in (dict(non_tensor_batch=extra, batch=batch), {}):
        want = ca.get_adv_estimator_fn("gdpo")(token_level_rewards=tok.clone(), response_mask=mask,
                                                index=ids, epsilon=1e-6, config=cfg, **kw)
        got = rv.ADV_ESTIMATORS["gdpo"](token_level_rewards=tok.clone(), response_mask=mask,
                                        index=ids, epsilon=1e-6, config=cfg, **kw)
        what = "gdpo %s %s %s %s" % (weights, layout, dtype, "components" if kw else "plain")
        assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape, what
        close(got[0], want[0], dtype, what, rtol=2e-5)
    assert int(lens.min()) >= 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma", (1.0, 0.97))
def test_reinforce_plus_plus(gamma, dtype, rng):
    """Token rewards with observation tokens masked inside the responses (multi-turn): the
    running return carried through them."""
    import types
    dt = np.float64 if dtype == "f64" else np.float32
    B, Tn = 7, 23
    lens = rng.integers(1, Tn + 1, B)
    mask = np.arange(Tn)[None, :] < lens[:, None]
    mask &= ~(rng.random((B, Tn)) < 0.3)  # observation spans
    mask[:, 0] = True
    tok = torch.from_numpy((rng.standard_normal((B, Tn)) * 0.5).astype(dt))
    m = torch.from_numpy(mask.astype(dt))
    cfg = types.SimpleNamespace(gamma=gamma)
    want = ca.get_adv_estimator_fn("reinforce_plus_plus")(token_level_rewards=tok.clone(),
                                                          response_mask=m, config=cfg)
    got = rv.ADV_ESTIMATORS["reinforce_plus_plus"](token_level_rewards=tok.clone(), response_mask=m,
                                                   config=cfg)
    what = "reinforce_plus_plus gamma=%s %s" % (gamma, dtype)
    close(got[1], want[1], dtype, what + " returns")
    close(got[0], want[0], dtype, what + " advantages")


def test_patch_swaps_estimators():
    before = dict(ca.ADV_ESTIMATOR_REGISTRY)
    h = rv.patch()
    for name in ESTIMATORS:
        assert ca.get_adv_estimator_fn(name) is rv.ADV_ESTIMATORS[name], name
    h.undo()
    assert ca.ADV_ESTIMATOR_REGISTRY == before


# ---- log-probs and entropy from logits ------------------------------------------------

@pytest.mark.parametrize("shape", ((7, 257), (3, 5, 1031)))
def test_logprobs_and_entropy_from_logits(shape, rng):
    import verl.utils.torch_functional as vf
    logits = torch.from_numpy((rng.standard_normal(shape) * 3).astype(np.float32))
    labels = torch.from_numpy(rng.integers(0, shape[-1], shape[:-1]))
    g_lp = torch.from_numpy(rng.standard_normal(shape[:-1]).astype(np.float32))
    g_ent = torch.from_numpy(rng.standard_normal(shape[:-1]).astype(np.float32))
    outs = []
    for fns in ((vf.logprobs_from_logits_naive, vf.entropy_from_logits),
                (rv.logprobs_from_logits, rv.entropy_from_logits)):
        x = logits.clone().requires_grad_(True)
        lp = fns[0](x, labels) if fns[0] is vf.logprobs_from_logits_naive else \
            fns[0](x, labels, inplace_backward=False)
        ent = fns[1](x)
        ((lp * g_lp).sum() + (ent * g_ent).sum()).backward()
        outs.append((lp.detach(), ent.detach(), x.grad))
    what = "logits %s" % (shape,)
    close(outs[1][0], outs[0][0], "f32", what + " logp")
    close(outs[1][1], outs[0][1], "f32", what + " entropy")
    close(outs[1][2], outs[0][2], "f32", what + " grad")


# ---- optimal token baseline ---------------------------------------------------------------

OTB = {"optimal_token_baseline": "compute_optimal_token_baseline_advantage",
       "tir_optimal_token_baseline": "compute_multi_turn_optimal_token_baseline_advantage"}


def otb_batch(layout, dtype, rng):
    """verl's inputs of the token-baseline estimators: groups of 4 in order ("fixed") or of 1 to
    7 members shuffled ("shuffled"); response masks with holes (multi-turn), an empty row, and
    rows copied within a group (tied longest members); old log-probs and sum pi^2 of real
    distributions (w = 1 - 2 pi + sum pi^2 > 0); rollout importance weights."""
    dt = np.float64 if dtype == "f64" else np.float32
    sizes = [4] * 6 if layout == "fixed" else list(rng.integers(2, 8, 6)) + [1, 1]
    group = np.concatenate([np.full(n, g) for g, n in enumerate(sizes)])
    Bn, Tn = len(group), 23
    lens = rng.integers(1, Tn + 1, Bn)
    mask = (np.arange(Tn)[None, :] < lens[:, None]) & (rng.random((Bn, Tn)) > 0.2)
    mask[rng.integers(0, Bn)] = False
    for b in range(1, Bn):
        if group[b] == group[b - 1] and rng.random() < 0.2:
            mask[b] = mask[b - 1]
    ids = np.array(["uid-%d" % g for g in group], dtype=object)
    if layout == "shuffled":
        order = rng.permutation(Bn)
        ids, mask = ids[order], mask[order]
    pi = 0.02 + 0.96 * rng.random((Bn, Tn))
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a).astype(dt))  # noqa: E731
    return dict(token_level_rewards=t(rng.standard_normal((Bn, Tn)) * 0.5 * mask),
                response_mask=t(mask), index=ids, old_log_probs=t(np.log(pi)),
                sum_pi_squared=t(pi * pi + rng.random((Bn, Tn)) * (1 - pi) ** 2),
                rollout_is_weights=t(0.5 + rng.random((Bn, Tn))))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_tail", (True, False))
@pytest.mark.parametrize("isw", (True, False))
@pytest.mark.parametrize("layout", ("fixed", "shuffled"))
@pytest.mark.parametrize("name", sorted(OTB))
def test_token_baseline_estimator(name, layout, isw, zero_tail, dtype, rng):
    kw = otb_batch(layout, dtype, rng)
    if not isw:
        kw["rollout_is_weights"] = None
    want, want_ret = getattr(ca, OTB[name])(handle_zero_tail=zero_tail, **kw)
    got, got_ret = rv.ADV_ESTIMATORS[name](handle_zero_tail=zero_tail, **kw)
    what = "%s %s isw=%s zero_tail=%s %s" % (name, layout, isw, zero_tail, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape, what
    close(got, want, dtype, what + " advantages")
    close(got_ret, want_ret, dtype, what + " returns")


def test_patch_swaps_token_baseline_estimators():
    h = rv.patch()
    try:
        for name, fn_name in OTB.items():
            assert ca.get_adv_estimator_fn(name) is rv.ADV_ESTIMATORS[name], name
            assert getattr(ca, fn_name) is rv.ADV_ESTIMATORS[name], fn_name
    finally:
        h.undo()
    assert ca.get_adv_estimator_fn("optimal_token_baseline").__module__ == ca.__name__

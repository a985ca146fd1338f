"""rlk.policy_loss / rlk.value_loss against the fp64 references (refs.py), on every place;
rlk.autograd against torch autograd of the same formulas, and gradcheck in fp64."""
import math

import numpy as np
import pytest

import refs
import rlk
from conftest import HAVE_CUDA, HAVE_TORCH

if HAVE_TORCH:
    import torch

HAVE_PL = rlk.OPS["policy_loss"].available()
HAVE_VL = rlk.OPS["value_loss"].available()
need_pl = pytest.mark.skipif(not HAVE_PL, reason="the loaded librlk has no rlk_policy_loss")
need_vl = pytest.mark.skipif(not HAVE_VL, reason="the loaded librlk has no rlk_value_loss")
need_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


def padded_batch(rng, B, T, dtype=np.float32):
    lens = rng.integers(1, T + 1, B)
    mask = np.arange(T)[None, :] < lens[:, None]
    logp = (rng.standard_normal((B, T)) * 0.5 - 2.0).astype(dtype)
    old = (logp + rng.standard_normal((B, T)) * 0.3).astype(dtype)
    ref = (logp + rng.standard_normal((B, T)) * 0.3).astype(dtype)
    adv = rng.standard_normal((B, T)).astype(dtype)
    return logp, old, ref, adv, mask


# A loss is a sum of terms of order 1 (advantage x ratio) that can cancel to 1e-5: its rounding is
# absolute, so a loss's tolerance is relative to at least this, however small the sum.
LOSS_FLOOR = 1e-3


def close(got, want, tol=2e-5, what="", floor=0.0):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, what
    scale = max(1e-30, floor, float(np.abs(want).max()) if want.size else 1.0)
    err = float(np.abs(got - want).max()) if want.size else 0.0
    assert np.all(np.isfinite(got)), what + ": non-finite"
    assert err <= tol * scale + 1e-12, "%s: max error %g (scale %g)" % (what, err, scale)


def check_metrics(got, want, names, tol=2e-5, slack=None):
    """slack: {metric: extra absolute tolerance} for fractions that a rounding can flip."""
    got = rlk.metrics_dict(got, names)
    for k, v in want.items():
        t = tol * max(1.0, abs(v)) + (slack or {}).get(k, 0.0)
        assert abs(got[k] - v) <= t, "%s: %g, expected %g" % (k, got[k], v)


@need_pl
def test_policy_loss_verl_defaults(place, rng):
    B, T = 12, 67
    logp, old, ref, adv, mask = padded_batch(rng, B, T)
    out = rlk.policy_loss(place.to(logp), place.to(old), place.to(adv), place.to(mask),
                          ref_logp=place.to(ref), kl_coef=0.001, clip_high=0.28)
    loss, grad, _, metrics = refs.policy_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.001,
                                              clip_high=0.28)
    close(place.back(out.loss), [loss], what="loss", floor=LOSS_FLOOR)
    close(place.back(out.grad_logp) * mask, grad, what="grad_logp")
    assert np.all(place.back(out.grad_logp)[~mask] == 0.0)
    assert out.grad_entropy is None
    check_metrics(place.back(out.metrics), metrics, rlk.POLICY_LOSS_METRICS)


CONFIGS = [
    # mode, agg and what else each one exercises
    dict(mode="gspo", agg="seq-mean-token-mean", clip_low=0.0003, clip_high=0.0004,
         seq_adv=True),
    dict(mode="cispo", agg="token-sum", clip_low=math.inf, clip_high=4.0, entropy_coef=0.01),
    dict(mode="sapo", agg="seq-mean-token-sum", sapo_tau_pos=1.3, sapo_tau_neg=0.7,
         kl_estimator="k2", kl_coef=0.05, kl_output_clamp=0.2),
    dict(mode="reinforce", agg="seq-mean-token-sum-norm", norm_scale=64.0, loss_scale=0.25,
         kl_estimator="abs", kl_coef=0.1, weights=True),
    dict(mode="ppo", agg="token-mean", dual_clip=0.0, kl_estimator="k1", kl_coef=0.2,
         kl_straight_through=True, kl_input_clamp=0.4, log_ratio_min=-0.25, log_ratio_max=0.5),
]


def _ids(c):
    return c["mode"]


@need_pl
@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_policy_loss_modes(place, rng, cfg):
    cfg = dict(cfg)
    B, T = 9, 40
    logp, old, ref, adv, mask = padded_batch(rng, B, T)
    if cfg.pop("seq_adv", False):
        adv = adv[:, 0].copy()
    ent = (rng.random((B, T)) * 3).astype(np.float32) if "entropy_coef" in cfg else None
    w = (rng.random((B, T)) + 0.5).astype(np.float32) if cfg.pop("weights", False) else None
    kl = "kl_coef" in cfg
    kw = {k: v for k, v in cfg.items()}
    out = rlk.policy_loss(place.to(logp), place.to(old), place.to(adv), place.to(mask),
                          ref_logp=place.to(ref) if kl else None,
                          entropy=place.to(ent) if ent is not None else None,
                          rollout_is_weights=place.to(w) if w is not None else None, **kw)
    names = {"sapo_tau_pos": "tau_pos", "sapo_tau_neg": "tau_neg", "kl_estimator": "kl",
             "kl_output_clamp": "kl_out", "kl_input_clamp": "kl_in", "kl_straight_through": "kl_st"}
    rkw = {names.get(k, k): v for k, v in cfg.items()}
    loss, grad, ge, metrics = refs.policy_loss(logp, old, adv, mask, ref_logp=ref if kl else None,
                                               entropy=ent, is_weights=w, **rkw)
    close(place.back(out.loss), [loss], what="loss", floor=LOSS_FLOOR)
    close(place.back(out.grad_logp) * mask, grad, what="grad_logp")
    if ge is not None:
        close(place.back(out.grad_entropy) * mask, ge, what="grad_entropy")
    check_metrics(place.back(out.metrics), metrics, rlk.POLICY_LOSS_METRICS, tol=1e-4)


@need_pl
def test_policy_loss_packed_layout(place, rng):
    offs = refs.random_offsets(rng, 150, max_group=40)
    offs.insert(2, offs[1])  # an empty sequence
    N, S = offs[-1], len(offs) - 1
    logp = (rng.standard_normal(N) * 0.5 - 2).astype(np.float32)
    old = (logp + rng.standard_normal(N) * 0.3).astype(np.float32)
    adv = rng.standard_normal(S).astype(np.float32)
    mask = (rng.random(N) < 0.8).astype(np.float32) * 0.5
    out = rlk.policy_loss(place.to(logp), place.to(old), place.to(adv), place.to(mask),
                          seq_offsets=place.to(np.array(offs, np.int64)),
                          agg="seq-mean-token-mean")
    loss, grad, _, metrics = refs.policy_loss(logp, old, adv, mask, seq_offsets=offs,
                                              agg="seq-mean-token-mean")
    close(place.back(out.loss), [loss], what="loss", floor=LOSS_FLOOR)
    counts = mask != 0
    close(place.back(out.grad_logp) * counts, grad * counts, what="grad_logp")
    check_metrics(place.back(out.metrics), metrics, rlk.POLICY_LOSS_METRICS, tol=1e-4)


@need_pl
def test_policy_loss_f64(place, rng):
    logp, old, ref, adv, mask = padded_batch(rng, 5, 33, np.float64)
    out = rlk.policy_loss(place.to(logp), place.to(old), place.to(adv), place.to(mask),
                          clip_low=0.1, clip_high=0.3)
    loss, grad, _, _ = refs.policy_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.3)
    assert place.back(out.loss).dtype == np.float64
    close(place.back(out.loss), [loss], tol=1e-12, what="loss", floor=LOSS_FLOOR)
    close(place.back(out.grad_logp) * mask, grad, tol=1e-12, what="grad_logp")


@need_pl
def test_policy_loss_errors(place, rng):
    logp, old, ref, adv, mask = padded_batch(rng, 4, 8)
    with pytest.raises(rlk.InvalidArgument):  # one dtype for every input
        rlk.policy_loss(place.to(logp), place.to(old.astype(np.float64)), place.to(adv))
    with pytest.raises(rlk.InvalidArgument):  # old_logp of another shape
        rlk.policy_loss(place.to(logp), place.to(old[:, :7].copy()), place.to(adv))
    with pytest.raises(rlk.InvalidArgument, match="policy_loss"):  # Dr. GRPO needs norm_scale
        rlk.policy_loss(place.to(logp), place.to(old), place.to(adv),
                        agg="seq-mean-token-sum-norm", norm_scale=0.0)
    with pytest.raises(rlk.InvalidArgument, match="mode"):
        rlk.policy_loss(place.to(logp), place.to(old), place.to(adv), mode="trpo")
    with pytest.raises(rlk.InvalidArgument, match="old_logp: is required"):
        rlk.policy_loss(place.to(logp), None, place.to(adv))


@need_vl
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_value_loss(place, rng, packed):
    B, T = 7, 50
    v = rng.standard_normal((B, T)).astype(np.float32)
    vo = (v + rng.standard_normal((B, T)) * 0.6).astype(np.float32)
    R = (v + rng.standard_normal((B, T))).astype(np.float32)
    mask = rng.random((B, T)) < 0.75
    kw, rkw = {}, {}
    if packed:
        v, vo, R, mask = v.reshape(-1), vo.reshape(-1), R.reshape(-1), mask.reshape(-1)
        offs = list(range(0, B * T + 1, T))
        kw = dict(seq_offsets=place.to(np.array(offs, np.int32)), agg="seq-mean-token-sum")
        rkw = dict(seq_offsets=offs, agg="seq-mean-token-sum")
    out = rlk.value_loss(place.to(v), place.to(vo), place.to(R), place.to(mask), clip=0.3, **kw)
    loss, grad, metrics = refs.value_loss(v, vo, R, mask, clip=0.3, **rkw)
    close(place.back(out.loss), [loss], what="loss", floor=LOSS_FLOOR)
    close(place.back(out.grad_values) * mask, grad, what="grad_values")
    # a token whose clipped and unclipped errors nearly tie may be decided either way in f32
    check_metrics(place.back(out.metrics), metrics, rlk.VALUE_LOSS_METRICS, tol=1e-4,
                  slack={"clipfrac": 3.0 / metrics["mask_sum"]})


# ---- autograd ---------------------------------------------------------------------------------

def torch_policy_loss(lp, old, adv, mask, ref, clip_low=0.2, clip_high=0.28, dual=3.0,
                      kl_coef=0.001):
    """verl's vanilla PPO loss with dual clip and the clamped k3 KL, token-mean (torch ops)."""
    m = mask.to(lp.dtype)
    ratio = torch.exp(torch.clamp(lp - old, -20, 20))
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    c1 = torch.maximum(l1, l2)
    pg = torch.where(adv < 0, torch.minimum(-adv * dual, c1), c1)
    e = torch.clamp(ref - lp, -20, 20)  # k3 on log(ref/pi)
    kl = torch.clamp(torch.exp(e) - e - 1, -10, 10)
    return ((pg * m).sum() + kl_coef * (kl * m).sum()) / m.sum()


@need_pl
@need_torch
def test_autograd_policy_loss_matches_torch(place, rng):
    if not place.torch:
        pytest.skip("autograd needs torch tensors")
    from rlk.autograd import policy_loss
    logp, old, ref, adv, mask = [place.to(a) for a in padded_batch(rng, 16, 96)]
    x1 = logp.clone().requires_grad_(True)
    x2 = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(x1, old, adv, mask, ref_logp=ref, kl_coef=0.001, clip_high=0.28)
    want = torch_policy_loss(x2, old, adv, mask, ref)
    (3.0 * loss).backward()  # an incoming gradient other than 1
    (3.0 * want).backward()
    assert loss.shape == () and not metrics.requires_grad
    close(place.back(loss)[None], place.back(want)[None], what="loss", floor=LOSS_FLOOR)
    close(place.back(x1.grad), place.back(x2.grad), tol=1e-5, what="grad")


@need_pl
@need_vl
@need_torch
def test_autograd_backward_twice_with_retain_graph(place, rng):
    """A kept graph's second backward reads the kept gradients again, so the first must not scale
    them in place (a backward whose graph is freed after it may); the one-shot backward gives the
    kept one's gradient bit for bit."""
    if not place.torch:
        pytest.skip("autograd needs torch tensors")
    from rlk.autograd import policy_loss, value_loss
    logp, old, _, adv, mask = [place.to(a) for a in padded_batch(rng, 4, 40)]
    calls = (lambda x: policy_loss(x, old, adv, mask)[0],
             lambda x: value_loss(x, old, adv, mask, clip=0.2)[0])
    for f in calls:
        x = logp.clone().requires_grad_(True)
        loss = f(x)
        (2.0 * loss).backward(retain_graph=True)
        g2 = x.grad.clone()
        (3.0 * loss).backward()
        g3 = x.grad - g2
        close(place.back(g3), place.back(g2) * 1.5, tol=1e-6, what="second backward")
        y = logp.clone().requires_grad_(True)
        (2.0 * f(y)).backward()
        assert torch.equal(y.grad, g2)


@need_pl
@need_torch
def test_autograd_policy_loss_gradcheck_f64(place, rng):
    if not place.torch:
        pytest.skip("autograd needs torch tensors")
    from rlk.autograd import PolicyLoss
    logp, old, ref, adv, mask = [place.to(a) for a in padded_batch(rng, 3, 11, np.float64)]
    ent = place.to(rng.random((3, 11)) * 2)
    x = logp.clone().requires_grad_(True)
    h = ent.clone().requires_grad_(True)
    kw = dict(old_logp=old, advantages=adv, mask=mask, ref_logp=ref, kl_coef=0.05,
              entropy_coef=0.01, mode="sapo")
    assert torch.autograd.gradcheck(lambda a, b: PolicyLoss.apply(a, b, kw)[0], (x, h),
                                    eps=1e-6, atol=1e-7)


@need_vl
@need_torch
def test_autograd_value_loss(place, rng):
    if not place.torch:
        pytest.skip("autograd needs torch tensors")
    from rlk.autograd import ValueLoss, value_loss
    B, T = 6, 30
    v = place.to(rng.standard_normal((B, T)))
    vo = place.to(rng.standard_normal((B, T)))
    R = place.to(rng.standard_normal((B, T)))
    mask = place.to(rng.random((B, T)) < 0.8)
    x1 = v.clone().float().requires_grad_(True)
    x2 = v.clone().float().requires_grad_(True)
    loss, _ = value_loss(x1, vo.float(), R.float(), mask, clip=0.5)
    loss.backward()
    vc = vo.float() + torch.clamp(x2 - vo.float(), -0.5, 0.5)
    lt = 0.5 * torch.maximum((x2 - R.float()) ** 2, (vc - R.float()) ** 2)
    want = (lt * mask).sum() / mask.sum()
    want.backward()
    close(place.back(loss)[None], place.back(want)[None], what="loss")
    close(place.back(x1.grad), place.back(x2.grad), tol=1e-5, what="grad")
    x = v.clone().requires_grad_(True)
    kw = dict(old_values=vo, returns=R, mask=mask, clip=0.5)
    assert torch.autograd.gradcheck(lambda a: ValueLoss.apply(a, kw)[0], (x,), eps=1e-6, atol=1e-7)


@need_torch
def test_autograd_refuses_numpy():
    from rlk.autograd import policy_loss
    with pytest.raises(rlk.InvalidArgument, match="expects torch tensors"):
        policy_loss(np.zeros(4, np.float32), np.zeros(4, np.float32), np.zeros(4, np.float32))


# ---- normalizer forms -------------------------------------------------------------------------

NORM_FORMS = ["number", "f32-tensor", "f64-0d", "none"]


def norm_arg(place, form, v):
    """A normalizer as a call takes it: a number, an f32 [1] or f64 0-d array, or None."""
    if form == "number":
        return v
    if form == "none":
        return None
    if form == "f32-tensor":
        return place.to(np.array([v], np.float32))
    if place.torch:
        return torch.tensor(v, dtype=torch.float64, device="cuda" if place.cuda else "cpu")
    return np.array(v, np.float64)  # 0-d


@need_pl
@pytest.mark.parametrize("form", NORM_FORMS)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_policy_loss_normalizer_forms(place, rng, form, agg):
    B, T = 9, 77
    logp, old, ref, adv, mask = padded_batch(rng, B, T)
    # exact in f32; "none": the call's own counts (the reference's default)
    tn, sn = (None, None) if form == "none" else (1.25 * float(mask.sum()), 1.5 * B)
    kw = dict(ref_logp=ref, kl_coef=0.01, agg=agg, norm_scale=T)
    out = rlk.policy_loss(place.to(logp), place.to(old), place.to(adv), place.to(mask),
                          token_normalizer=norm_arg(place, form, tn),
                          seq_normalizer=norm_arg(place, form, sn),
                          **dict(kw, ref_logp=place.to(ref)))
    loss, grad, _, metrics = refs.policy_loss(logp, old, adv, mask, token_normalizer=tn,
                                              seq_normalizer=sn, **kw)
    close(place.back(out.loss), [loss], what="loss", floor=LOSS_FLOOR)
    close(place.back(out.grad_logp) * mask, grad, what="grad_logp")
    # the same divisor as a number gives the same bits (the kernels divide by the same double),
    # except seq-mean-token-sum-norm's, applied in another order
    if agg != "seq-mean-token-sum-norm":
        n = rlk.policy_loss(place.to(logp), place.to(old), place.to(adv), place.to(mask),
                            token_normalizer=float(mask.sum()) if tn is None else tn,
                            seq_normalizer=B if sn is None else sn,
                            **dict(kw, ref_logp=place.to(ref)))
        assert np.array_equal(place.back(out.grad_logp), place.back(n.grad_logp))
        assert np.array_equal(place.back(out.loss), place.back(n.loss))


@need_vl
@pytest.mark.parametrize("form", NORM_FORMS)
def test_value_loss_normalizer_forms(place, rng, form):
    B, T = 6, 90
    v = rng.standard_normal((B, T)).astype(np.float32)
    vo = (v + rng.standard_normal((B, T)) * 0.6).astype(np.float32)
    R = (v + rng.standard_normal((B, T))).astype(np.float32)
    mask = (rng.random((B, T)) < 0.7).astype(np.float32) * rng.choice([0.5, 1.0, 2.0], (B, T))
    mask = mask.astype(np.float32)
    tn = None if form == "none" else 0.75 * float(np.float32(mask.sum()))
    out = rlk.value_loss(place.to(v), place.to(vo), place.to(R), place.to(mask), clip=0.3,
                         token_normalizer=norm_arg(place, form, tn))
    want_tn = tn
    if form == "f32-tensor":
        want_tn = float(np.float32(tn))
    loss, grad, _ = refs.value_loss(v, vo, R, mask, clip=0.3, token_normalizer=want_tn)
    close(place.back(out.loss), [loss], what="loss", floor=LOSS_FLOOR)
    close(place.back(out.grad_values) * (mask != 0), grad, what="grad_values")


@need_pl
def test_policy_loss_count_of_nothing(place, rng):
    # every token masked, no normalizer: a loss of 0 and zero gradients, not a division by 0
    B, T = 3, 20
    logp, old, _, adv, mask = padded_batch(rng, B, T)
    out = rlk.policy_loss(place.to(logp), place.to(old), place.to(adv),
                          place.to(np.zeros_like(mask)))
    assert place.back(out.loss)[0] == 0.0
    assert not np.any(place.back(out.grad_logp))


@need_pl
def test_normalizer_errors(place, rng):
    B, T = 3, 20
    logp, old, _, adv, mask = padded_batch(rng, B, T)
    args = (place.to(logp), place.to(old), place.to(adv), place.to(mask))
    with pytest.raises(rlk.InvalidArgument, match="token_normalizer_tensor"):
        rlk.policy_loss(*args, token_normalizer=place.to(np.ones(2, np.float32)))
    with pytest.raises(rlk.InvalidArgument, match="token_normalizer_tensor"):
        rlk.policy_loss(*args, token_normalizer=place.to(np.ones(1, np.int32)))
    with pytest.raises(rlk.InvalidArgument, match="token_normalizer"):
        rlk.policy_loss(*args, token_normalizer=-3.0)


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device (or no torch)")
def test_checks_read_the_outputs_not_their_buffer():
    """RLK_CHECK on CUDA: the losses' outputs share one buffer with padding and the library's
    workspace, never written as outputs; memory the allocator hands back full of NaN must not
    read as "an output holds NaN" on valid input."""
    g = torch.Generator().manual_seed(5)
    logp, old = (-torch.rand(4, 33, generator=g, dtype=torch.float64) for _ in range(2))
    adv = torch.randn(4, 33, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 33, generator=g) > 0.3
    logp, old, adv, mask = (x.cuda() for x in (logp, old, adv, mask))
    want = rlk.policy_loss(logp, old, adv, mask)
    rlk.set_checks(True)
    try:
        for _ in range(3):  # the freed NaN block is what the next allocations take
            torch.full((1 << 16,), float("nan"), device="cuda", dtype=torch.float64)
            got = rlk.policy_loss(logp, old, adv, mask)
            assert torch.equal(got.loss, want.loss) and torch.equal(got.grad_logp, want.grad_logp)
    finally:
        rlk.set_checks(False)

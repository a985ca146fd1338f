"""rlk.group_advantage against the fp64 reference, on every place available (numpy and torch
CPU on the host backend, torch CUDA), and its error paths."""
import numpy as np
import pytest

import refs
import rlk
from conftest import HAVE_CUDA, HAVE_TORCH

if HAVE_TORCH:
    import torch


def close(got, want, tol=2e-5, cond=0.0):
    """cond: how much the inputs' rounding is magnified (per element, or one number)."""
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    err = np.abs(got - want) / (1.0 + np.abs(want) + cond)
    assert np.all(np.isfinite(got)), "non-finite outputs"
    assert err.max() <= tol, "max scaled error %g at %d" % (err.max(), err.argmax())


def group_conditioning(s, offs, eps, unbiased):
    """Per member: its group's largest |score| over (std + eps). f32 rounds the scores, the mean
    and the std by about eps_f32 of that largest score, and the division by a std near zero (two
    close members) magnifies it: a tolerance relative to the advantage alone fails there."""
    out = np.zeros(len(s))
    for a, b in zip(offs[:-1], offs[1:]):
        g = np.asarray(s[a:b], np.float64)
        std = g.std(ddof=1 if unbiased and len(g) > 1 else 0) if len(g) > 1 else 1.0
        out[a:b] = np.abs(g).max() / (std + eps)
    return out


@pytest.mark.parametrize("mode", refs.MODES)
def test_modes_fixed_groups(place, rng, mode):
    B, G = 8 * int(rng.integers(20, 60)), 8
    s = rng.standard_normal(B).astype(np.float32)
    adv = rlk.group_advantage(place.to(s), group_size=G, mode=mode)
    close(place.back(adv), refs.group_advantage(s, refs.fixed_offsets(B, G), mode))


@pytest.mark.parametrize("singleton", ["mean0-std1", "zero"])
@pytest.mark.parametrize("mode", ["grpo", "rloo"])
def test_uneven_groups_with_singletons(place, rng, mode, singleton):
    B = int(rng.integers(50, 300))
    offs = refs.random_offsets(rng, B)
    s = rng.standard_normal(B).astype(np.float32)
    adv = rlk.group_advantage(place.to(s), group_offsets=place.to(np.array(offs, np.int32)),
                              mode=mode, singleton=singleton, eps=1e-4, unbiased=False)
    want = refs.group_advantage(s, offs, mode, eps=1e-4, unbiased=False, singleton=singleton)
    close(place.back(adv), want, cond=group_conditioning(s, offs, 1e-4, False))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["opo", "passk", "passk-unscaled"])
def test_outcome_modes(place, rng, mode, dtype):
    B = int(rng.integers(50, 300))
    offs = refs.random_offsets(rng, B)
    # pass/fail scores for pass@k (ties for the best place), continuous ones otherwise
    s = (rng.integers(0, 2, B) if mode != "opo" and B % 2 else rng.standard_normal(B)).astype(dtype)
    w = rng.integers(1, 400, B).astype(dtype)
    adv = rlk.group_advantage(place.to(s), group_offsets=place.to(np.array(offs, np.int64)),
                              mode=mode, weights=place.to(w) if mode == "opo" else None)
    close(place.back(adv), refs.group_advantage(s, offs, mode, weights=w))


@pytest.mark.parametrize("mode", ["grpo", "mean-only", "batch-std", "opo", "passk"])
def test_unscorable_nan_scores(place, rng, mode):
    B, G = 8 * int(rng.integers(10, 40)), 8
    s = rng.standard_normal(B).astype(np.float32)
    s[rng.random(B) < 0.3] = np.nan
    s[:G] = np.nan  # a group with no scorable member
    s[G:2 * G - 1] = np.nan  # and one with a single one
    w = rng.integers(1, 50, B).astype(np.float32)
    adv = rlk.group_advantage(place.to(s), G, mode=mode, eps=1e-4, singleton="zero",
                              nan_scores="unscorable", weights=place.to(w) if mode == "opo" else None)
    want = refs.group_advantage(s, refs.fixed_offsets(B, G), mode, eps=1e-4, singleton="zero",
                                weights=w, nan_scores="unscorable")
    close(place.back(adv), want)
    assert np.all(place.back(adv)[np.isnan(s)] == 0.0)


def test_error_opo_weights(place, rng):
    s = rng.standard_normal(16).astype(np.float32)
    with pytest.raises(rlk.InvalidArgument, match="weights"):
        rlk.group_advantage(place.to(s), 4, mode="opo")
    with pytest.raises(rlk.InvalidArgument, match="weights"):
        rlk.group_advantage(place.to(s), 4, mode="grpo", weights=place.to(s))


def test_f64_scores_and_preallocated_output(place, rng):
    B, G = 96, 16
    s = rng.standard_normal(B)
    out = place.to(np.full(B, np.nan, np.float32))
    got = rlk.group_advantage(place.to(s), G, mode=rlk.AdvantageMode.BATCH_STD, advantages=out)
    assert got is out
    close(place.back(out), refs.group_advantage(s, refs.fixed_offsets(B, G), "batch-std"))


def test_token_rewards_mask_and_broadcast(place, rng):
    B, T, G = 32, 37, 4
    rewards = rng.standard_normal((B, T)).astype(np.float32)
    mask = rng.random((B, T)) < 0.7
    adv, tok = rlk.group_advantage(place.to(rewards), group_size=G, mask=place.to(mask),
                                   broadcast=True)
    want = refs.group_advantage(rewards, refs.fixed_offsets(B, G), mask=mask)
    close(place.back(adv), want, tol=1e-4)
    tok = place.back(tok)
    assert tok.shape == (B, T)
    close(tok, want[:, None] * mask, tol=1e-4)
    assert np.all(tok[~mask] == 0.0)


def test_strided_rows(place, rng):
    # rows of [B, T] scores may be strided (a column slice of a wider buffer)
    B, T, G = 16, 10, 8
    wide = rng.standard_normal((B, T + 6)).astype(np.float32)
    s = place.to(wide)[:, :T]
    adv = rlk.group_advantage(s, G, mode="mean-only")
    close(place.back(adv), refs.group_advantage(wide[:, :T], refs.fixed_offsets(B, G), "mean-only"),
          tol=1e-4)


# ---- error paths: every one an exception naming the problem, never a crash ------------------

def test_error_group_size_does_not_divide(place):
    s = place.to(np.ones(10, np.float32))
    with pytest.raises(rlk.InvalidArgument, match="does not divide"):
        rlk.group_advantage(s, group_size=3)


def test_error_both_or_neither_grouping(place):
    s = place.to(np.ones(8, np.float32))
    with pytest.raises(rlk.InvalidArgument, match="exactly one"):
        rlk.group_advantage(s)
    with pytest.raises(rlk.InvalidArgument, match="exactly one"):
        rlk.group_advantage(s, 4, group_offsets=place.to(np.array([0, 4, 8], np.int64)))


def test_error_dtype(place):
    with pytest.raises(rlk.InvalidArgument, match="scores: dtype i32 is not supported"):
        rlk.group_advantage(place.to(np.ones(8, np.int32)), 4)
    with pytest.raises(rlk.InvalidArgument, match="advantages: dtype f64"):
        rlk.group_advantage(place.to(np.ones(8, np.float32)), 4,
                            advantages=place.to(np.zeros(8, np.float64)))


def test_error_non_contiguous_rows(place, rng):
    s = place.to(rng.standard_normal((12, 8)).astype(np.float32)).T  # [8, 12], column-major
    with pytest.raises(rlk.InvalidArgument, match="contiguous"):
        rlk.group_advantage(s, 4)


def test_error_shapes(place):
    with pytest.raises(rlk.InvalidArgument, match="advantages"):
        rlk.group_advantage(place.to(np.ones(8, np.float32)), 4,
                            advantages=place.to(np.zeros(7, np.float32)))
    with pytest.raises(rlk.InvalidArgument, match="broadcast"):
        rlk.group_advantage(place.to(np.ones(8, np.float32)), 4, broadcast=True)


def test_error_enum_names():
    with pytest.raises(rlk.InvalidArgument, match="mode: 'ppo' is not one of grpo, mean-only"):
        rlk.group_advantage(np.ones(8, np.float32), 4, mode="ppo")
    with pytest.raises(rlk.InvalidArgument, match="singleton"):
        rlk.group_advantage(np.ones(8, np.float32), 4, singleton=7)


def test_error_not_an_array():
    with pytest.raises(rlk.InvalidArgument, match="expected a torch.Tensor or a numpy.ndarray"):
        rlk.group_advantage([1.0, 2.0, 3.0, 4.0], 2)


def test_error_read_only_output(host):
    out = np.zeros(8, np.float32)
    out.flags.writeable = False
    with pytest.raises(rlk.InvalidArgument, match="read-only"):
        rlk.group_advantage(np.ones(8, np.float32), 4, advantages=out)


def test_library_message_is_carried(host):
    with pytest.raises(rlk.InvalidArgument) as e:
        rlk.group_advantage(np.ones(8, np.float32), 4, eps=-1.0)
    assert "eps" in str(e.value) and e.value.status == 1
    assert str(e.value).startswith("group_advantage: ")


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_torch_uint8_mask_is_refused_with_a_hint(host):
    s = torch.ones(4, 6)
    with pytest.raises(rlk.InvalidArgument, match=r"uint8 has no rlk equivalent \(use .bool"):
        rlk.group_advantage(s, 2, mask=torch.ones(4, 6, dtype=torch.uint8))


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device (or no torch)")
def test_torch_mixed_devices_are_refused():
    s = torch.randn(8, 6, device="cuda")
    with pytest.raises(rlk.InvalidArgument, match="mask: is in host memory"):
        rlk.group_advantage(s, 4, mask=torch.ones(8, 6, dtype=torch.bool))
    with pytest.raises(rlk.InvalidArgument, match="is in host memory"):
        rlk.group_advantage(s, 4, advantages=torch.empty(8))


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device (or no torch)")
def test_torch_cuda_runs_on_the_current_stream():
    B, G = 4096, 16
    s = torch.randn(B, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        adv = rlk.group_advantage(s, G)
        torch.cuda._sleep(1000)  # work after ours on the same stream
    side.synchronize()
    v = s.double().view(-1, G)
    want = (v - v.mean(1, keepdim=True)) / (v.std(1, keepdim=True) + 1e-6)
    assert torch.allclose(adv.double(), want.view(-1), atol=1e-4)


@pytest.mark.skipif(not HAVE_TORCH, reason="rlk.integrations.trl needs torch")
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_trl_group_advantages(host, rng, scale):
    from rlk.integrations import trl as rt
    B, G = 8 * int(rng.integers(4, 20)), 8
    r = rng.standard_normal(B).astype(np.float32)
    r[rng.random(B) < 0.25] = np.nan
    r[G:2 * G - 1] = np.nan
    got = rt.group_advantages(torch.from_numpy(r), G, scale)
    mode = {"group": "grpo", "batch": "batch-std", "none": "mean-only"}[scale]
    want = refs.group_advantage(r, refs.fixed_offsets(B, G), mode, eps=1e-4, singleton="zero",
                                nan_scores="unscorable")
    close(got.numpy(), want)
    with pytest.raises(ValueError, match="scale_rewards"):
        rt.group_advantages(torch.from_numpy(r), G, "sometimes")

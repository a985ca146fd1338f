#!/usr/bin/env python3
"""One GRPO loss step on random data, with rlk in place of the torch code, and the torch
formulas beside it: group advantages -> token advantages -> clipped policy loss with dual clip
and a k3 KL penalty (verl's defaults), token-mean; the loss, its gradient and the metrics.

    python3 examples/grpo_step.py [--prompts 32] [--group 8] [--tokens 512] [--cpu]

Runs on the GPU when torch sees one (zero copy, on the current stream), else on the CPU through
rlk's host backend: torch CPU tensors when torch is installed, numpy arrays otherwise.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

import numpy as np  # noqa: E402

import rlk  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

CLIP_LOW, CLIP_HIGH, DUAL, KL_COEF, EPS = 0.2, 0.28, 3.0, 0.001, 1e-6


def data(P, G, T, seed):
    """Sequence scores, response masks and per-token log-probs of P prompts x G responses."""
    rng = np.random.default_rng(seed)
    B = P * G
    lens = rng.integers(T // 4, T + 1, B)
    return {
        "scores": rng.standard_normal(B).astype(np.float32),
        "mask": np.arange(T)[None, :] < lens[:, None],
        "logp": (rng.standard_normal((B, T)) * 0.5 - 1.5).astype(np.float32),
        "old_logp": None, "ref_logp": None, "rng": rng,
    }


def torch_step(d, G):
    """What a torch trainer writes (verl's formulas), differentiated by autograd."""
    s = d["scores"].view(-1, G)
    adv = ((s - s.mean(-1, keepdim=True)) / (s.std(-1, keepdim=True) + EPS)).view(-1)
    m = d["mask"].float()
    A = adv[:, None] * m
    lp = d["logp"].clone().requires_grad_(True)
    ratio = torch.exp(torch.clamp(lp - d["old_logp"], -20, 20))
    l1, l2 = -A * ratio, -A * torch.clamp(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH)
    c1 = torch.maximum(l1, l2)
    pg = torch.where(A < 0, torch.minimum(-A * DUAL, c1), c1)
    kl = torch.clamp(d["ref_logp"] - lp, -20, 20)
    k3 = torch.clamp(torch.exp(kl) - kl - 1, -10, 10)
    loss = ((pg * m).sum() + KL_COEF * (k3 * m).sum()) / m.sum()
    loss.backward()
    clipfrac = ((l2 > l1).float() * m).sum() / m.sum()
    return {"advantages": adv, "loss": loss.detach(), "grad": lp.grad, "clipfrac": clipfrac}


def rlk_step_torch(d, G):
    """The same step through rlk: two calls, the second a torch.autograd.Function."""
    from rlk.autograd import policy_loss
    adv, tok = rlk.group_advantage(d["scores"], G, mask=d["mask"], broadcast=True, eps=EPS)
    lp = d["logp"].clone().requires_grad_(True)
    loss, metrics = policy_loss(lp, d["old_logp"], tok, d["mask"], ref_logp=d["ref_logp"],
                                clip_low=CLIP_LOW, clip_high=CLIP_HIGH, dual_clip=DUAL,
                                kl_coef=KL_COEF)
    loss.backward()
    return {"advantages": adv, "loss": loss.detach(), "grad": lp.grad,
            "clipfrac": metrics[rlk.POLICY_LOSS_METRICS.index("clipfrac")]}


def rlk_step_numpy(d, G):
    """Without torch: the functional calls, which return the fused gradient directly."""
    adv, tok = rlk.group_advantage(d["scores"], G, mask=d["mask"], broadcast=True, eps=EPS)
    out = rlk.policy_loss(d["logp"], d["old_logp"], tok, d["mask"], ref_logp=d["ref_logp"],
                          clip_low=CLIP_LOW, clip_high=CLIP_HIGH, dual_clip=DUAL, kl_coef=KL_COEF)
    return {"advantages": adv, "loss": out.loss[0], "grad": out.grad_logp,
            "clipfrac": rlk.metrics_dict(out.metrics)["clipfrac"]}


def numpy_step(d, G):
    """The torch formulas in numpy float64, with the gradient written out (for --numpy runs)."""
    s = d["scores"].astype(np.float64).reshape(-1, G)
    adv = ((s - s.mean(1, keepdims=True)) / (s.std(1, ddof=1, keepdims=True) + EPS)).reshape(-1)
    m = d["mask"].astype(np.float64)
    A = adv[:, None] * m
    lp = d["logp"].astype(np.float64)
    x = np.clip(lp - d["old_logp"], -20, 20)
    ratio = np.exp(x)
    rc = np.clip(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH)
    l1, l2 = -A * ratio, -A * rc
    c1 = np.maximum(l1, l2)
    g1 = np.where(l1 >= l2, -A * ratio, -A * ratio * ((ratio >= 1 - CLIP_LOW) & (ratio <= 1 + CLIP_HIGH)))
    dual = (A < 0) & (c1 > -A * DUAL)
    pg = np.where(dual, -A * DUAL, c1)
    g1 = np.where(dual, 0.0, g1)
    e = lp - d["ref_logp"]
    k3 = np.exp(-e) + e - 1
    n = m.sum()
    loss = ((pg * m).sum() + KL_COEF * (k3 * m).sum()) / n
    grad = (g1 + KL_COEF * (1 - np.exp(-e))) * m / n
    return {"advantages": adv, "loss": loss, "grad": grad,
            "clipfrac": ((l2 > l1) * m).sum() / n}


def as_np(x):
    if torch is not None and torch.is_tensor(x):
        return x.detach().double().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--cpu", action="store_true", help="stay on the CPU even with a GPU")
    ap.add_argument("--numpy", action="store_true", help="numpy arrays even with torch")
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "little"))
    args = ap.parse_args()
    P, G, T = args.prompts, args.group, args.tokens
    d = data(P, G, T, args.seed)
    rng = d.pop("rng")
    d["old_logp"] = (d["logp"] + rng.standard_normal(d["logp"].shape) * 0.2).astype(np.float32)
    d["ref_logp"] = (d["logp"] + rng.standard_normal(d["logp"].shape) * 0.2).astype(np.float32)

    use_torch = torch is not None and not args.numpy
    dev = "cuda" if use_torch and torch.cuda.is_available() and not args.cpu else "cpu"
    if use_torch:
        td = {k: torch.from_numpy(v).to(dev) for k, v in d.items()}
        ours, theirs, where = rlk_step_torch, torch_step, "torch on %s" % dev
        inputs = td
    else:
        ours, theirs, where = rlk_step_numpy, numpy_step, "numpy (host backend)"
        inputs = d
    print("GRPO step: %d prompts x %d responses, %d tokens, seed %d, %s; librlk %s" % (
        P, G, T, args.seed, where, rlk.version_string()))

    results = {}
    for name, fn in (("rlk", ours), ("torch" if use_torch else "numpy", theirs)):
        fn(inputs, G)  # the first rlk call compiles or loads its kernels
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        r = fn(inputs, G)
        if dev == "cuda":
            torch.cuda.synchronize()
        r["ms"] = (time.perf_counter() - t) * 1e3
        results[name] = r

    a, b = results.values()
    print("%-8s %14s %12s %14s %10s" % ("path", "loss", "clipfrac", "|grad|_1", "ms"))
    for name, r in results.items():
        print("%-8s %14.8f %12.6f %14.8f %10.3f" % (name, float(as_np(r["loss"])),
                                                    float(as_np(r["clipfrac"])),
                                                    np.abs(as_np(r["grad"])).sum(), r["ms"]))
    diffs = {k: float(np.abs(as_np(a[k]) - as_np(b[k])).max()) for k in
             ("advantages", "loss", "grad", "clipfrac")}
    print("max |rlk - %s|: %s" % (list(results)[1], ", ".join("%s %.3g" % kv for kv in diffs.items())))
    ok = diffs["loss"] < 1e-4 and diffs["grad"] < 1e-6 and diffs["advantages"] < 1e-4
    print("agree" if ok else "DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

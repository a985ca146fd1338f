"""PyTorch baselines for the fused policy loss and value loss, timed on the GPU beside
rlk-bench-policy-loss in the same run (same shapes, same formulas).

  policy: PPO with clip-higher (0.2 / 0.28) and dual clip (3), the k3 KL with verl's clamps
          (+-20 on the log-ratio, +-10 on the value) times 0.001, token-mean over the tokens that
          count; autograd for d loss / d logp. The eager form is what trainers run (about twenty
          kernels forward and backward); --compile adds torch.compile of the same function.
  gspo:   the sequence ratio from the masked mean log-ratio, straight through to each token,
          seq-mean-token-mean.
  value:  clipped value loss, 0.5 max((v - R)^2, (v_clip - R)^2), token-mean.

Inputs: logp ~ N(-2, 0.1), old/ref = logp + N(0, 0.05), advantages N(0, 1) per token, sequence
lengths in [T/4, T) with the mask t < length (f32, or bool converted in the loss). Device-event
medians after warm-up, rotating input sets past the 60 MB L2. One line per case; --json FILE.
"""
import argparse
import json

import torch

from event_timing import event_times, median_min_max

FLOOR_TBPS = 4.14
L2_BYTES = 60 * 1024 * 1024


def time_ms(fn, sets, warmup, iters):
    """fn on input set i % len(sets) at call i."""
    return median_min_max(event_times(lambda i: fn(sets[i % len(sets)]), warmup, iters))


def make_set(B, T, mask_dtype, dev, gen):
    lp = torch.randn(B, T, device=dev, generator=gen) * 0.1 - 2.0
    old = lp + torch.randn(B, T, device=dev, generator=gen) * 0.05
    ref = lp + torch.randn(B, T, device=dev, generator=gen) * 0.05
    adv = torch.randn(B, T, device=dev, generator=gen)
    lens = torch.randint(T // 4, T, (B,), device=dev, generator=gen)
    mask = torch.arange(T, device=dev)[None, :] < lens[:, None]
    mask = mask.to(mask_dtype)
    return {"lp": lp, "old": old, "ref": ref, "adv": adv, "mask": mask}


def ppo_loss(lp, old, ref, adv, mask):
    m = mask.to(lp.dtype)
    neg_kl = torch.clamp(lp - old, -20.0, 20.0)
    ratio = torch.exp(neg_kl)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1.0 - 0.2, 1.0 + 0.28)
    clipped = torch.maximum(l1, l2)
    l3 = -adv * 3.0
    pg = torch.where(adv < 0, torch.minimum(l3, clipped), clipped)
    kl = torch.clamp(ref - lp, -20.0, 20.0)
    k3 = torch.clamp(torch.exp(kl) - kl - 1.0, -10.0, 10.0)
    n = m.sum()
    loss = (pg * m).sum() / n + 0.001 * (k3 * m).sum() / n
    clipfrac = ((l2 > l1).to(lp.dtype) * m).sum() / n
    return loss, clipfrac


def gspo_loss(lp, old, ref, adv, mask):
    m = mask.to(lp.dtype)
    n_seq = m.sum(-1).clamp(min=1.0)
    seq = ((lp - old) * m).sum(-1) / n_seq
    log_s = torch.clamp(lp - lp.detach() + seq.detach()[:, None], max=10.0)
    s = torch.exp(log_s)
    adv_seq = adv[:, :1]  # one advantage per sequence
    pg = torch.maximum(-adv_seq * s, -adv_seq * torch.clamp(s, 0.8, 1.28))
    return ((pg * m).sum(-1) / n_seq).mean(), None


def value_loss(v, old, ret, mask):
    m = mask.to(v.dtype)
    vc = torch.clamp(v, old - 0.5, old + 0.5)
    l = 0.5 * torch.maximum((v - ret) ** 2, (vc - ret) ** 2)
    return (l * m).sum() / m.sum(), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of each loss")
    args = ap.parse_args()
    dev = "cuda"
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)
    cases = [
        ("policy ppo+dual+k3 token-mean padded, f32 mask", 1024, 4096, torch.float32, "ppo"),
        ("policy ppo+dual+k3 token-mean padded, bool mask", 1024, 4096, torch.bool, "ppo"),
        ("policy ppo+dual+k3 token-mean padded, f32 mask", 256, 2048, torch.float32, "ppo"),
        ("policy ppo+dual+k3 token-mean padded, bool mask", 256, 2048, torch.bool, "ppo"),
        ("policy gspo seq-mean-token-mean padded, bool mask", 1024, 4096, torch.bool, "gspo"),
        ("value clip 0.5 token-mean padded, bool mask", 1024, 4096, torch.bool, "value"),
    ]
    rows = {}
    for label, B, T, mdt, kind in cases:
        mbytes = 1 if mdt == torch.bool else 4
        streams = 3 if kind == "value" else 4
        set_bytes = B * T * (4 * streams + mbytes + 4)
        nsets = 1
        while nsets < 16 and nsets * set_bytes < 2 * L2_BYTES:
            nsets += 1
        sets = [make_set(B, T, mdt, dev, gen) for _ in range(nsets)]

        def run(s, f):
            lp = s["lp"].detach().requires_grad_(True)
            if kind == "value":
                loss, _ = f(lp, s["old"], s["adv"], s["mask"])
            else:
                loss, _ = f(lp, s["old"], s["ref"], s["adv"], s["mask"])
            loss.backward()
            return lp.grad

        base = {"ppo": ppo_loss, "gspo": gspo_loss, "value": value_loss}[kind]
        variants = [("eager", base)]
        if args.compile:
            variants.append(("compile", torch.compile(base)))
        # agree with float64 before timing
        s0 = sets[0]
        g32 = run(s0, base)
        s64 = {k: (v.double() if v.dtype == torch.float32 else v) for k, v in s0.items()}
        g64 = run(s64, base)
        assert torch.allclose(g32.double(), g64, rtol=1e-4, atol=1e-9), label
        floor = set_bytes / (FLOOR_TBPS * 1e12) * 1e3
        for vname, f in variants:
            med, mn, mx = time_ms(lambda s: run(s, f), sets, 10, args.iters)
            name = f"torch {vname} {label} B={B} T={T}"
            rows[name] = (med, mn, mx, floor, set_bytes)
    print(f"{'case (fwd+bwd)':72s} {'median ms':>10s} {'min ms':>10s} {'max ms':>10s} {'x floor':>8s}")
    for name, (med, mn, mx, floor, _) in rows.items():
        print(f"{name:72s} {med:10.5f} {mn:10.5f} {mx:10.5f} {med / floor:8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "floor_tbps": FLOOR_TBPS,
                       "results": [{"name": k, "median_ms": v[0], "min_ms": v[1], "max_ms": v[2],
                                    "floor_ms": v[3], "bytes": v[4]} for k, v in rows.items()]},
                      f, indent=1)


if __name__ == "__main__":
    main()

"""A decode step's draw from the LM head, timed beside cuBLAS: rlk.linear_sample (the head's GEMM
keeping f32 logits and records, rlk_sample over them, the combine of the drawn tokens' log-probs),
cuBLAS's h @ W^T alone (the floor: what any engine's draw starts with; the goal is rlk within
1.25x of it at M <= 256), and an engine's usual path, bf16 logits from cuBLAS then rlk.sample.
Before timing, each M checks the property the op exists for: the rollout's log-probs bitwise
rlk.linear_logprob's for the drawn tokens.

    python tools/bench/linear_sample_bench.py [--shape H,V] [--rows 1,8,64,256] [--rounds 50]
        [--variant auto|tiled] [--json FILE] [--device cuda|cpu]

On a GPU: H 4096, V 151936, bf16 (the default). On the CPU (--device cpu) a small shape runs the
same check against the host backend (an fp64 path: correctness, not speed). Timing as
linear_divergence_bench.py's (tools/bench/rounds.py on a GPU, wall clock on the CPU)."""
import argparse
import json
import math

import torch

from linear_divergence_bench import VARIANTS, rlk, run_options, timer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default=None, help="H,V (default: 4096,151936 on a GPU, 256,8191 on the CPU)")
    ap.add_argument("--rows", default=None, help="decode batch sizes M (default: 1,8,64,256; 1,8,64 on the CPU)")
    run_options(ap, 50, "the head's kernels (rlk_linear_logprob_variant)")
    a = ap.parse_args()
    dev = a.device
    H, V = (int(x) for x in (a.shape or ("4096,151936" if dev == "cuda" else "256,8191")).split(","))
    rows = [int(x) for x in (a.rows or ("1,8,64,256" if dev == "cuda" else "1,8,64")).split(",")]
    g = torch.Generator(device=dev).manual_seed(0)
    dt = torch.bfloat16
    w = (torch.randn(V, H, generator=g, device=dev) * (3.0 / math.sqrt(H))).to(dt)
    run = timer(dev, a.rounds)
    draw = dict(temperature=0.8, top_k=50, top_p=0.9)
    results = {"shape": [H, V], "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
               "rlk": rlk.version_string(), "variant": a.variant, "rows": {}}
    for M in rows:
        h = torch.randn(M, H, generator=g, device=dev).to(dt)
        seeds = torch.randint(0, 2 ** 62, (M,), generator=g, device=dev)

        def fused():
            return rlk.linear_sample(h, w, seed=seeds, variant=VARIANTS[a.variant], **draw)

        def cublas():
            return torch.mm(h, w.t())

        def engine():
            return rlk.sample(torch.mm(h, w.t()), seed=seeds, **draw)

        out = fused()
        trainer = rlk.linear_logprob(h, w, out.tokens, temperature=draw["temperature"],
                                     variant=VARIANTS[a.variant])
        equal = (trainer.logp.view(torch.int32) == out.logp.view(torch.int32)).float().mean().item()
        t_fused, t_cublas, t_engine = run([fused, cublas, engine])
        row = {"log-probs bitwise rlk.linear_logprob's": equal, "rlk.linear_sample ms": t_fused,
               "h @ W^T ms (cuBLAS on a GPU)": t_cublas, "h @ W^T + rlk.sample ms": t_engine,
               "rlk / h @ W^T": t_fused / t_cublas, "rlk / (h @ W^T + rlk.sample)": t_fused / t_engine}
        results["rows"][M] = row
        print("M %d" % M, json.dumps(row, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

"""What the teacher's top-k lists cost: rlk.linear_divergence's forward at N 8192, H 4096, V 151936
(bf16, random heads) as the forward KL at its own split count and at 8, and as the top-k at k 1, 8
and 32 (and 32 at 8 splits), beside two cuBLAS GEMMs, in one run (rotated rounds, medians; CUDA).

    python tools/bench/divergence_top_k_cost.py OUT.json [ROUNDS]
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rlk  # noqa: E402
from rounds import median, rotated_rounds  # noqa: E402

CASES = [("fkl", None, None), ("fkl splits 8", None, 8), ("topk 1", 1, None), ("topk 8", 8, None),
         ("topk 32", 32, None), ("topk 32 splits 8", 32, 8)]


def main():
    out_path, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    N, H, V = 8192, 4096, 151936
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, sd=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * sd).to(torch.bfloat16)

    sh, th = rand(N, H), rand(N, H)
    sw, tw = rand(V, H, sd=2.0 / math.sqrt(H)), rand(V, H, sd=2.0 / math.sqrt(H))
    fns = [lambda k=k, s=s: rlk.linear_divergence(sh, sw, th, tw, top_k=k, splits=s) for _, k, s in CASES]
    for f in fns:
        f()
    torch.cuda.synchronize()
    ts = [median(t) for t in rotated_rounds(fns, rounds)]
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gemms = []
    sh @ sw.T, th @ tw.T  # warm-up
    for _ in range(3):
        e0.record()
        sh @ sw.T
        th @ tw.T
        e1.record()
        torch.cuda.synchronize()
        gemms.append(e0.elapsed_time(e1))
    two = median(gemms)
    out = {"device": torch.cuda.get_device_name(), "two GEMMs ms": two}
    for (name, _, _), t in zip(CASES, ts):
        out[name] = t
        print("%-20s %8.2f ms  %.3fx two GEMMs" % (name, t, t / two))
    print("two GEMMs %.2f ms" % two)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

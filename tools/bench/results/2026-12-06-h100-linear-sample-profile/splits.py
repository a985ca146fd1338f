"""One row block (N <= 128): the planner's splits (0) against one tile a block, at H 896, 2048
and 4096, V 151936, bf16; logp of both bitwise equal."""
import json, math, sys
import torch
sys.path.insert(0, "tools/bench")
from linear_divergence_bench import rlk, timer  # noqa: E402
V = 151936
tiles = (V + 255) // 256
run = timer("cuda", 30)
out = {}
g = torch.Generator(device="cuda").manual_seed(0)
for H in (896, 2048, 4096):
    w = (torch.randn(V, H, generator=g, device="cuda") * (3.0 / math.sqrt(H))).to(torch.bfloat16)
    for N in (1, 8, 64, 128):
        h = torch.randn(N, H, generator=g, device="cuda").to(torch.bfloat16)
        y = torch.randint(0, V, (N,), generator=g, device="cuda")
        a = lambda: rlk.linear_logprob(h, w, y, stages=4, splits=0)
        b = lambda: rlk.linear_logprob(h, w, y, stages=4, splits=tiles)
        same = torch.equal(a().logp.view(torch.int32), b().logp.view(torch.int32))
        ta, tb = run([a, b])
        out["H%d N%d" % (H, N)] = dict(chosen=ta, one_tile=tb, bitwise=same)
        print("H %d N %d chosen %.4f one-tile %.4f ratio %.3f bitwise %s" % (H, N, ta, tb, tb / ta, same), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)

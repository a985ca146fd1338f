"""The sm_90a forward at small N: time against the ring's depth (stages 2, 3, 4) and the splits,
beside cuBLAS's h @ W^T: does the stream of W follow the bytes a multiprocessor keeps in flight?"""
import json, math, sys
import torch
sys.path.insert(0, "tools/bench")
from linear_divergence_bench import rlk, timer  # noqa: E402
H, V = 4096, 151936
g = torch.Generator(device="cuda").manual_seed(0)
w = (torch.randn(V, H, generator=g, device="cuda") * (3.0 / math.sqrt(H))).to(torch.bfloat16)
run = timer("cuda", 30)
out = {}
for N in (1, 64, 256):
    h = torch.randn(N, H, generator=g, device="cuda").to(torch.bfloat16)
    y = torch.randint(0, V, (N,), generator=g, device="cuda")
    fns, names = [lambda: torch.mm(h, w.t())], ["cublas"]
    for st in (2, 3, 4):
        for sp in (0, 297, 594):
            fns.append(lambda st=st, sp=sp: rlk.linear_logprob(h, w, y, stages=st, splits=sp))
            names.append("stages %d splits %d" % (st, sp))
    for f in fns: f()
    torch.cuda.synchronize()
    ts = run(fns)
    out[N] = dict(zip(names, ts))
    print("N", N, " ".join("%s=%.3f" % kv for kv in out[N].items()), flush=True)
json.dump(out, open(sys.argv[1] if len(sys.argv) > 1 else "/dev/null", "w"), indent=1)

"""linear_sample at M 1 and 256 for ncu: a warm-up, then one profiled call each, and per-kernel
device times from torch's profiler."""
import math, sys, torch
import rlk
H, V = 4096, 151936
g = torch.Generator(device="cuda").manual_seed(0)
w = (torch.randn(V, H, generator=g, device="cuda") * (3.0 / math.sqrt(H))).to(torch.bfloat16)
for M in (1, 256):
    h = torch.randn(M, H, generator=g, device="cuda").to(torch.bfloat16)
    seeds = torch.randint(0, 2 ** 62, (M,), generator=g, device="cuda")
    f = lambda: rlk.linear_sample(h, w, seed=seeds, temperature=0.8, top_k=50, top_p=0.9)
    for _ in range(3): f()
    torch.cuda.synchronize()
    if "--kernels" in sys.argv:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
            for _ in range(10): f()
            torch.cuda.synchronize()
        print("M", M)
        print(p.key_averages().table(sort_by="cuda_time_total", row_limit=8))
    else:
        torch.cuda.cudart().cudaProfilerStart(); f(); torch.cuda.synchronize(); torch.cuda.cudart().cudaProfilerStop()

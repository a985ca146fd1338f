"""The divergence forward beside cuBLAS's two GEMMs, each run for ~SECONDS back to back, for
clock/power sampling (nvidia-smi) and for ncu (--once: one launch each after warm-up)."""
import math, sys, time, torch, rlk
once = "--once" in sys.argv
secs = float(next((a.split("=")[1] for a in sys.argv if a.startswith("--seconds=")), "3"))
N, H, V = 8192, 4096, 151936
g = torch.Generator(device="cuda").manual_seed(0)
def rand(*s, sd=1.0): return (torch.randn(*s, generator=g, device="cuda") * sd).to(torch.bfloat16)
sh, th = rand(N, H), rand(N, H)
sw, tw = rand(V, H, sd=2 / math.sqrt(H)), rand(V, H, sd=2 / math.sqrt(H))
fwd = lambda: rlk.linear_divergence(sh, sw, th, tw, mode="forward_kl")
gemm = lambda: (torch.mm(sh, sw.t()), torch.mm(th, tw.t()))
for f in (fwd, gemm): f(); torch.cuda.synchronize()
if once:
    torch.cuda.nvtx.range_push("probe"); fwd(); gemm(); torch.cuda.synchronize(); torch.cuda.nvtx.range_pop()
    sys.exit(0)
for name, f in (("rlk fwd", fwd), ("cublas 2 gemm", gemm), ("rlk fwd again", fwd)):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    print("%.3f start %s" % (time.time(), name), flush=True)
    n = 0; t0 = time.time(); e0.record()
    while time.time() - t0 < secs:
        f(); n += 1
        if n % 4 == 0: torch.cuda.synchronize()
    e1.record(); torch.cuda.synchronize()
    print("%.3f end %s: %d calls, %.3f ms each" % (time.time(), name, n, e0.elapsed_time(e1) / n), flush=True)

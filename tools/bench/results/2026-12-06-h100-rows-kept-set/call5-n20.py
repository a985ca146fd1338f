"""The fused head at 2^20 rows in one call, forward and backward (bf16 gradients), on a GPU:
time, the backward's workspace, and 256 random rows' logp and grad_hidden bitwise those of a
call over those rows alone (batch invariance at the extreme)."""
import json, math, time
import torch
import rlk
N, H, V = 1 << 20, 4096, 151936
dev, dt = "cuda", torch.bfloat16
g = torch.Generator(device=dev).manual_seed(0)
h = torch.randn(N, H, generator=g, device=dev, dtype=dt)
w = (torch.randn(V, H, generator=g, device=dev) * (3.0 / math.sqrt(H))).to(dt)
y = torch.randint(0, V, (N,), generator=g, device=dev)
gl = torch.randn(N, generator=g, device=dev)
gh, gw = torch.empty_like(h), torch.empty_like(w)
def timed(fn):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); out = fn(); b.record(); b.synchronize(); return out, a.elapsed_time(b)
torch.cuda.synchronize()
base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
f, t_f = timed(lambda: rlk.linear_logprob(h, w, y))
fwd_extra = (torch.cuda.max_memory_allocated() - base) / 2**20
base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
_, t_b = timed(lambda: rlk.linear_logprob_backward(h, w, y, f.lse, grad_logp=gl, grad_hidden=gh, grad_weight=gw))
bwd_extra = (torch.cuda.max_memory_allocated() - base) / 2**20
idx = torch.sort(torch.randperm(N, generator=g, device=dev)[:256]).values
hs, ys = h[idx].contiguous(), y[idx].contiguous()
fs = rlk.linear_logprob(hs, w, ys)
ghs, _ = rlk.linear_logprob_backward(hs, w, ys, fs.lse, grad_logp=gl[idx].contiguous(), grad_dtype="same", want_weight=False)
out = {"device": torch.cuda.get_device_name(), "N": N, "H": H, "V": V,
       "forward ms": t_f, "forward beyond inputs MiB": fwd_extra,
       "backward ms": t_b, "backward beyond inputs and gradients MiB": bwd_extra,
       "backward TFLOP/s (3 products)": 6 * N * H * V / t_b / 1e9,
       "256 rows: logp bitwise the 256-row call's": bool(torch.equal(f.logp[idx], fs.logp)),
       "256 rows: grad_hidden bitwise the 256-row call's": bool(torch.equal(gh[idx], ghs)),
       "logp finite": bool(torch.isfinite(f.logp).all()), "grad_weight finite": bool(torch.isfinite(gw).all())}
print(json.dumps(out, indent=1))

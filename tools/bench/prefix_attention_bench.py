"""Prefix-shared attention on one GPU, in one run: rlk.prefix_attention (packed [prefix | r_1 ..
r_G]) beside SDPA with the prefix replicated per response and flex_attention on the packed stream
with a shared-prefix block mask (the anchors of /work/shared/anchors/wave2_anchors.py, same
timing method: median of CUDA-event times after warm-up). Also: rlk against SDPA on the same data
(outputs and gradients mapped back to the packed layout), and bitwise repeatability.

    PYTHONPATH=python python3 tools/bench/prefix_attention_bench.py [--no-flex] [--quick] [--kernels] [--b2b]
        [--rounds R]

Prints one line per row and a table; JSON to $OUT/prefix_attention.json when OUT is set. Each call
is timed alone (the anchors' method: the device waits for the host's work before the first
launch). With --b2b, forward + backward is also timed over ten calls queued back to back, per
call (the host's time hidden, as in a training step); with --kernels, rlk's forward + backward is
split into its kernels' CUDA times (torch profiler, five calls back to back); with --rounds R, every
implementation's forward and forward + backward are timed again in R rotated rounds (rounds.py:
no implementation always runs right after another's heat, the host's queueing time hidden), with
their ratios to SDPA."""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import rlk  # noqa: E402
from rlk.autograd import prefix_attention as rlk_attention  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_split import kernel_split  # noqa: E402
from rounds import median, rotated_rounds  # noqa: E402

dev = "cuda"
ROWS = []
# RLK_PREFIX_ATTENTION_VARIANT (auto, mma, wgmma, portable) picks rlk's forward; rows name it
RLK_IMPL = "rlk prefix_attention [%s]" % os.environ.get("RLK_PREFIX_ATTENTION_VARIANT", "auto")


def timed(fn, calls=1):
    """Per-call device time of `calls` calls of fn queued one after another (events around them)."""
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(calls):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / calls


def median_of(fn, reps, warm, calls=1):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = sorted(timed(fn, calls) for _ in range(reps))
    return ts[len(ts) // 2]


def bench(fn, iters=10, warm=3):
    """Median of `iters` calls timed one at a time (the device idle before each)."""
    return median_of(fn, iters, warm)


def bench_b2b(fn, calls=10, reps=3, warm=2):
    """Per-call time of `calls` calls queued back to back (median of reps batches): what a training
    step that launches one after another sees, the host's time per call hidden behind the
    device's."""
    return median_of(fn, reps, warm, calls)


def row(case, impl, ms, note=""):
    ROWS.append(dict(case=case, impl=impl, ms=ms, note=note))
    print("%-46s %-36s %9.3f ms  %s" % (case, impl, ms, note), flush=True)


def flops(G, Lp, Lr, Hq, D):
    rep = G * Hq * 4 * D * (Lp + Lr) ** 2 / 2
    sh = Hq * 4 * D * (Lp * Lp / 2 + G * (Lr * Lp + Lr * Lr / 2))
    return rep, sh


def kernel_times(case, fn, calls=5):
    """Rows of each kernel's mean CUDA time per call of fn (calls back to back, after a warm-up)."""
    total = 0.0
    for name, ms, launches in kernel_split(fn, calls):
        total += ms
        row(case + " kernels", "  " + name[-34:], ms, "%d launches a call" % launches)
    row(case + " kernels", "  sum of the kernels", total)


def rlk_calls(q, k, v, do, lay):
    """rlk's forward (no grad, no lse) and forward + backward on copies of q, k, v that take the
    gradients, and those copies."""
    qa, ka, va = (x.clone().requires_grad_(True) for x in (q, k, v))

    def f():
        return rlk.prefix_attention(q, k, v, lay, lse=False).out

    def fb():
        qa.grad = ka.grad = va.grad = None
        rlk_attention(qa, ka, va, lay).backward(do)
    return f, fb, (qa, ka, va)


def run_case(G, Lp, Lr, Hq, Hkv, D, prompts=1, flex=True, check=False, iters=10, kernels=False, b2b=False,
             rounds=0):
    case = "attn G%d (%d+%d)x%d Hq%d Hkv%d D%d" % (G, Lp, Lr, prompts, Hq, Hkv, D)
    lay = rlk.prefix_layout([Lp] * prompts, [[Lr] * G] * prompts)
    T = lay.tokens
    torch.manual_seed(1)
    q, k, v = (torch.randn(T, h, D, device=dev, dtype=torch.bfloat16) for h in (Hq, Hkv, Hkv))
    do = torch.randn(T, Hq, D, device=dev, dtype=torch.bfloat16)
    # the replicated layout from the same data: [B, H, L, D], B = prompts x G
    idx = []
    for p in range(prompts):
        a, b = lay.prefix_range(p)
        for s, e in lay.response_ranges(p):
            idx.append(torch.cat([torch.arange(a, b), torch.arange(s, e)]))
    idx = torch.stack(idx).to(dev)  # [B, L]
    rep = [x[idx].permute(0, 2, 1, 3).contiguous().requires_grad_(True) for x in (q, k, v)]
    do_rep = do[idx].permute(0, 2, 1, 3).contiguous()
    fl_rep, fl_sh = flops(G, Lp, Lr, Hq, D)
    fl_rep *= prompts
    fl_sh *= prompts

    def sdpa_f():
        with torch.no_grad():
            return F.scaled_dot_product_attention(rep[0], rep[1], rep[2], is_causal=True, enable_gqa=True)

    def sdpa_fb():
        for x in rep:
            x.grad = None
        F.scaled_dot_product_attention(rep[0], rep[1], rep[2], is_causal=True, enable_gqa=True).backward(do_rep)

    rlk_f, rlk_fb, (qa, ka, va) = rlk_calls(q, k, v, do, lay)

    t = bench(sdpa_f, iters)
    row(case + " fwd", "SDPA replicated prefix", t, "%.0f TFLOP/s eff" % (fl_rep / t / 1e9))
    t = bench(sdpa_fb, max(3, iters // 2))
    row(case + " fwd+bwd", "SDPA replicated prefix", t, "%.0f TFLOP/s eff" % (3.5 * fl_rep / t / 1e9))
    if b2b:
        row(case + " fwd+bwd b2b", "SDPA replicated prefix", bench_b2b(sdpa_fb), "back to back, per call")
    t0 = time.time()
    rlk_f()
    torch.cuda.synchronize()
    t = bench(rlk_f, iters)
    row(case + " fwd", RLK_IMPL, t, "%.0f TFLOP/s useful (first call %.2f s)" % (
        fl_sh / t / 1e9, time.time() - t0))
    t = bench(rlk_fb, max(3, iters // 2))
    row(case + " fwd+bwd", RLK_IMPL, t, "%.0f TFLOP/s useful" % (3.5 * fl_sh / t / 1e9))
    if b2b:
        row(case + " fwd+bwd b2b", RLK_IMPL, bench_b2b(rlk_fb), "back to back, per call")
    if kernels:
        kernel_times(case + " fwd+bwd", rlk_fb)

    if flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        seg = torch.zeros(T, dtype=torch.int32, device=dev)  # response id per token, -1 prefix
        pid = torch.zeros(T, dtype=torch.int32, device=dev)
        for p in range(prompts):
            a, b = lay.prefix_range(p)
            seg[a:b] = -1
            pid[a:b] = p
            for g, (s, e) in enumerate(lay.response_ranges(p)):
                seg[s:e] = g
                pid[s:e] = p

        def mask_mod(bb, hh, qi, ki):
            same = pid[qi] == pid[ki]
            return same & (ki <= qi) & ((seg[ki] == -1) | (seg[ki] == seg[qi]))
        bm = create_block_mask(mask_mod, 1, 1, T, T, device=dev)
        qs, ks, vs = (x.transpose(0, 1)[None].contiguous().requires_grad_(True) for x in (q, k, v))
        dos = do.transpose(0, 1)[None].contiguous()
        fa = torch.compile(flex_attention)

        def flex_f():
            with torch.no_grad():
                return fa(qs, ks, vs, block_mask=bm, enable_gqa=True)

        def flex_fb():
            qs.grad = ks.grad = vs.grad = None
            fa(qs, ks, vs, block_mask=bm, enable_gqa=True).backward(dos)
        t = bench(flex_f, iters)
        row(case + " fwd", "flex_attention shared-prefix mask", t, "%.0f TFLOP/s useful" % (fl_sh / t / 1e9))
        t = bench(flex_fb, max(3, iters // 2))
        row(case + " fwd+bwd", "flex_attention shared-prefix mask", t, "%.0f TFLOP/s useful" % (
            3.5 * fl_sh / t / 1e9))
        if b2b:
            row(case + " fwd+bwd b2b", "flex_attention shared-prefix mask", bench_b2b(flex_fb),
                "back to back, per call")

    if rounds:
        # the same calls again, in rotated rounds (rounds.py): ratios free of the order they ran in
        rc = [("fwd", "SDPA replicated prefix", sdpa_f), ("fwd+bwd", "SDPA replicated prefix", sdpa_fb),
              ("fwd", RLK_IMPL, rlk_f), ("fwd+bwd", RLK_IMPL, rlk_fb)]
        if flex:
            rc += [("fwd", "flex_attention shared-prefix mask", flex_f),
                   ("fwd+bwd", "flex_attention shared-prefix mask", flex_fb)]
        times = rotated_rounds([fn for _, _, fn in rc], rounds)
        sdpa = {p: median(t) for (p, impl, _), t in zip(rc, times) if impl.startswith("SDPA")}
        for (p, impl, _), t in zip(rc, times):
            row(case + " " + p + " rounds", impl, median(t), "median of %d rotated rounds (min %.3f), %.3fx SDPA" % (
                rounds, min(t), median(t) / sdpa[p]))

    if check:
        # rlk vs SDPA in fp32 on the replicated layout (the prefix's upstream gradient on replica 0)
        repf = [x.detach().float().requires_grad_(True) for x in rep]
        w = do_rep.float().clone()
        w[1:, :, :Lp] = 0
        o = F.scaled_dot_product_attention(repf[0], repf[1], repf[2], is_causal=True, enable_gqa=True)
        o.backward(w)
        ref = {}
        for name, x, g in (("out", o, None), ("dq", None, repf[0].grad), ("dk", None, repf[1].grad),
                           ("dv", None, repf[2].grad)):
            y = (x if x is not None else g).detach().permute(0, 2, 1, 3)  # [B, L, H, D]
            flat = torch.zeros(T, y.shape[2], D, device=dev)
            if name == "out":
                flat[idx.reshape(-1)] = y.reshape(-1, y.shape[2], D)
            else:
                flat.index_add_(0, idx.reshape(-1), y.reshape(-1, y.shape[2], D))
            ref[name] = flat
        rlk_fb()
        got = dict(out=rlk_f().float(), dq=qa.grad.float(), dk=ka.grad.float(), dv=va.grad.float())
        for name in got:
            err = (got[name] - ref[name]).abs().max().item()
            scale = ref[name].abs().max().item()
            row(case + " check", "rlk vs fp32 SDPA replicated: %s" % name, 0.0,
                "max abs err %.3e (max |ref| %.3e, rel %.2e)" % (err, scale, err / scale))
        # bitwise repeat
        o1 = rlk_f().clone()
        g1 = [x.grad.clone() for x in (qa, ka, va)]
        o2 = rlk_f()
        rlk_fb()
        same = torch.equal(o1, o2) and all(torch.equal(a, b.grad) for a, b in zip(g1, (qa, ka, va)))
        row(case + " check", "rlk bitwise repeat (fwd, dq, dk, dv)", 0.0, "identical" if same else "DIFFERENT")
    del rep, q, k, v, do, qa, ka, va
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--quick", action="store_true", help="the main case only")
    ap.add_argument("--kernels", action="store_true", help="rlk's kernel times per case (torch profiler)")
    ap.add_argument("--b2b", action="store_true", help="also fwd+bwd timed over 10 calls back to back")
    ap.add_argument("--rounds", type=int, default=0,
                    help="also every implementation's calls in R rotated rounds (rounds.py)")
    a = ap.parse_args()
    print("GPU %s, torch %s, rlk %s" % (torch.cuda.get_device_name(), torch.__version__, rlk.version_string()))
    # numerics and repeatability on an odd case small enough for fp32 SDPA, then the timings
    run_case(5, 333, 129, 16, 4, 128, flex=False, check=True, iters=3)
    opts = dict(kernels=a.kernels, b2b=a.b2b, rounds=a.rounds)
    run_case(16, 4096, 512, 32, 8, 128, flex=not a.no_flex, **opts)
    if not a.quick:
        run_case(8, 1024, 1024, 32, 8, 128, flex=False, **opts)
        run_case(1, 4096, 512, 32, 8, 128, prompts=16, flex=False, iters=5, **opts)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "prefix_attention.json"), "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=ROWS), f, indent=1)
    print("\n%-46s %-36s %9s" % ("case", "impl", "ms"))
    for r in ROWS:
        if r["ms"] > 0:
            print("%-46s %-36s %9.3f" % (r["case"], r["impl"], r["ms"]))


if __name__ == "__main__":
    main()

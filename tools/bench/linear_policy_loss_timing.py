"""Where the time of rlk.linear_policy_loss goes beyond its kernels, on one GPU (N H V, bf16,
PPO token-mean over a mask, f32 gradients given):
  --host   for each path (recompute, token chunks): the host's time to queue one call with the
           device busy, the event time of a call after 1 ms and after 75 ms of device work, and
           the device timeline of one call (kernels over 0.5 ms and every gap over 30 us), then
           each kernel's time and launches a call;
  --busy   rotated rounds (rounds.py) with the device kept busy 1 ms and then 40 ms before each
           timed call: the three and four cuBLAS GEMMs, rlk's forward + backward (f32 gradients)
           and rlk.linear_policy_loss by both paths, with their ratios;
  --rows A,B,... / --groups A,B,...
           rotated rounds (busy 40 ms) of the token chunks at each chunk_tokens (0: the call's
           choice) and each tile-order group (0: the default), beside the three cuBLAS GEMMs.
Usage: python3 linear_policy_loss_timing.py [N H V] [--host] [--busy] [--rounds R]
                                            [--rows A,B,...] [--groups A,B,...]"""
import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
import rlk  # noqa: E402
from kernel_split import kernel_split  # noqa: E402
from rounds import median, rotated_rounds  # noqa: E402
from torch_linear_logprob import loss_gemms  # noqa: E402

CYCLES_A_MS = 2_000_000  # torch.cuda._sleep's cycles in about a millisecond


class Problem:
    def __init__(self, N, H, V):
        torch.manual_seed(0)
        self.h = (torch.randn(N, H, device="cuda") * 0.05).bfloat16()
        self.w = (torch.randn(V, H, device="cuda") * 0.05).bfloat16()
        self.y = torch.randint(0, V, (N,), device="cuda")
        B = 8 if N % 8 == 0 else 1
        self.old = -5 * torch.rand(B, N // B, device="cuda")
        self.adv = torch.randn(B, N // B, device="cuda")
        self.mask = torch.rand(B, N // B, device="cuda") > 0.1
        self.g_lp = torch.rand(N, device="cuda") - 0.5
        self.gh = torch.empty(N, H, device="cuda")
        self.gw = torch.empty(V, H, device="cuda")

    def policy(self, path, rows=None, group=None):
        return lambda: rlk.linear_policy_loss(self.h, self.w, self.y, self.old, self.adv, self.mask,
                                              grad_hidden=self.gh, grad_weight=self.gw, metrics=False,
                                              path=path, chunk_tokens=rows or None, group=group or None)


def event_ms(fn, busy_ms, n=5):
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(busy_ms * CYCLES_A_MS))
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return median(ts)


def timeline(path, fn):
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
        torch.cuda._sleep(CYCLES_A_MS)
        fn()
        torch.cuda.synchronize()
    ks = sorted((e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    t0, prev, busy = ks[0].time_range.start, None, 0
    for e in ks:
        dur = e.time_range.end - e.time_range.start
        gap = e.time_range.start - prev if prev is not None else 0
        busy += dur
        if gap > 30 or dur > 500:
            print(f"  t={(e.time_range.start - t0) / 1e3:8.3f} ms gap {gap / 1e3:7.3f} dur {dur / 1e3:7.3f} "
                  f"{e.name[:70]}")
        prev = e.time_range.end
    print(f"  timeline {path}: span {(ks[-1].time_range.end - t0) / 1e3:.3f} ms, busy {busy / 1e3:.3f} ms, "
          f"{len(ks)} device events")


def host(pb):
    for path in ("recompute", "token_chunks"):
        fn = pb.policy(path)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        hs = []
        for _ in range(5):
            torch.cuda._sleep(75 * CYCLES_A_MS)
            t0 = time.perf_counter()
            fn()
            hs.append((time.perf_counter() - t0) * 1e3)
            torch.cuda.synchronize()
        print(f"host {path}: enqueue ms {median(hs):.3f} (all {[round(x, 3) for x in hs]})")
        print(f"events {path}: busy 1 ms -> {event_ms(fn, 1):.3f} ms, busy 75 ms -> {event_ms(fn, 75):.3f} ms")
        timeline(path, fn)
        # each kernel's time a call (kernel_split.py: one line per linear_logprob_bwd_sm90 kind)
        for name, ms, launches in kernel_split(fn, calls=3):
            print(f"  {ms:8.3f} ms in {launches:3d} x {name[:90]}")


def gemms(pb):
    dz = (torch.randn(pb.h.shape[0], pb.w.shape[0], device="cuda") * 1e-3).bfloat16()
    return loss_gemms(pb.h, pb.w, dz)


def report_rounds(cases, rounds, busy_ms, floors):
    """The cases in rotated rounds, busy_ms of device work before each timed call: a line each with
    the median, the spread and the ratio to each of the first len(floors) cases (named floors)."""
    t = rotated_rounds([f for _, f in cases], rounds, busy_cycles=busy_ms * CYCLES_A_MS)
    m = [median(x) for x in t]
    width = max(len(label) for label, _ in cases)
    for (label, _), x, mm in zip(cases, t, m):
        ratios = "  ".join(f"{mm / m[i]:.3f}x {f}" for i, f in enumerate(floors))
        print(f"busy {busy_ms:2d} ms  {label:{width}s} median {mm:7.3f} ms (min {min(x):7.3f} max {max(x):7.3f})  "
              f"{ratios}")


def busy_rounds(pb, rounds):
    h, w, y, g_lp, gh, gw = pb.h, pb.w, pb.y, pb.g_lp, pb.gh, pb.gw
    three, four = gemms(pb)

    def fwd_bwd():
        r = rlk.linear_logprob(h, w, y)
        rlk.linear_logprob_backward(h, w, y, r.lse, g_lp, grad_hidden=gh, grad_weight=gw)

    cases = [("three GEMMs", three), ("four GEMMs", four), ("rlk fwd+bwd f32", fwd_bwd),
             ("rlk loss recompute", pb.policy("recompute")), ("rlk loss token chunks", pb.policy("token_chunks"))]
    for busy_ms in (1, 40):
        report_rounds(cases, rounds, busy_ms, ("three", "four"))


def chunk_sweep(pb, rows, groups, rounds):
    three, _ = gemms(pb)
    cases = [("three GEMMs", three)]
    cases += [(f"token chunks rows {r or 'auto'}", pb.policy("token_chunks", rows=r)) for r in rows]
    cases += [(f"token chunks group {g or 'default'}", pb.policy("token_chunks", group=g)) for g in groups]
    report_rounds(cases, rounds, 40, ("three",))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="*", type=int, default=[8192, 4096, 151936])
    ap.add_argument("--host", action="store_true")
    ap.add_argument("--busy", action="store_true")
    ap.add_argument("--rounds", type=int, default=6)
    ints = lambda v: [int(x) for x in v.split(",")]  # noqa: E731
    ap.add_argument("--rows", type=ints, default=[])
    ap.add_argument("--groups", type=ints, default=[])
    a = ap.parse_args()
    pb = Problem(*a.shape)
    print(f"GPU {torch.cuda.get_device_name()}, N H V = {a.shape}")
    if a.host:
        host(pb)
    if a.busy:
        busy_rounds(pb, a.rounds)
    if a.rows or a.groups:
        chunk_sweep(pb, a.rows, a.groups, a.rounds)


if __name__ == "__main__":
    main()

"""The fused head's row handling on a GPU, timed: the backward at growing N (its workspace and
time, bf16 gradients as the autograd op writes them), and the forward and backward of a row
selection (rows=) beside the trainer's way, index_select of the selected hidden rows then the op
on them (and, backward, index_add of their gradient into a zeroed grad_hidden).

    python tools/bench/head_rows_bench.py [--H 4096] [--V 151936] [--ns 8192,65536,131072]
        [--select 16384,8192] [--rounds 5] [--json FILE]

RLK_LIBRARY picks the library (run twice to compare two builds). Timing: tools/bench/rounds.py
(rotated rounds, device events)."""
import argparse
import json
import math
import os

import torch

import rlk
from rounds import median, rotated_rounds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--H", type=int, default=4096)
    ap.add_argument("--V", type=int, default=151936)
    ap.add_argument("--ns", default="8192,65536,131072", help="the backward's row counts")
    ap.add_argument("--select", default="16384,8192", help="N_all,n of the row selection")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    H, V, dev, dt = a.H, a.V, "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    w = (torch.randn(V, H, generator=g, device=dev) * (3.0 / math.sqrt(H))).to(dt)
    out = {"device": torch.cuda.get_device_name(), "library": os.environ.get("RLK_LIBRARY", ""), "H": H, "V": V,
           "backward": {}, "selection": {}}
    for N in (int(x) for x in a.ns.split(",")):
        h = torch.randn(N, H, generator=g, device=dev).to(dt)
        y = torch.randint(0, V, (N,), generator=g, device=dev)
        gl = torch.randn(N, generator=g, device=dev)
        lse = rlk.linear_logprob(h, w, y).lse
        gh, gw = torch.empty_like(h), torch.empty_like(w)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()

        def bwd():
            return rlk.linear_logprob_backward(h, w, y, lse, grad_logp=gl, grad_hidden=gh, grad_weight=gw)
        bwd()
        torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - base) / 2**20
        t = median(rotated_rounds([bwd], a.rounds)[0])
        row = {"ms": t, "TFLOP/s (3 products)": 3 * 2 * N * H * V / t / 1e9, "workspace MiB": extra}
        out["backward"][N] = row
        print("backward N %d" % N, json.dumps(row), flush=True)
        del h, y, gl, lse, gh, gw
        torch.cuda.empty_cache()
    N_all, n = (int(x) for x in a.select.split(","))
    h = torch.randn(N_all, H, generator=g, device=dev).to(dt)
    rows = torch.sort(torch.randperm(N_all, generator=g, device=dev)[:n]).values
    y = torch.randint(0, V, (n,), generator=g, device=dev)
    gl = torch.randn(n, generator=g, device=dev)
    hw = (h, w)

    def sel_fwd():
        return rlk.linear_logprob(h, w, y, rows=rows)

    def gathered_fwd():
        return rlk.linear_logprob(h.index_select(0, rows), w, y)
    lse = sel_fwd().lse
    same = torch.equal(sel_fwd().logp, gathered_fwd().logp)
    gh, gw = torch.empty_like(h), torch.empty_like(w)

    def sel_bwd():
        return rlk.linear_logprob_backward(h, w, y, lse, grad_logp=gl, grad_hidden=gh, grad_weight=gw, rows=rows)

    def gathered_bwd():
        sub = h.index_select(0, rows)
        g_sub, _ = rlk.linear_logprob_backward(sub, w, y, lse, grad_logp=gl, grad_weight=gw, grad_dtype="same")
        return torch.zeros_like(h).index_add_(0, rows, g_sub)
    ts = [median(x) for x in rotated_rounds([sel_fwd, gathered_fwd, sel_bwd, gathered_bwd], a.rounds)]
    out["selection"] = {"N_all": N_all, "n": n, "logp bitwise the gathered call's": same,
                        "rows= forward ms": ts[0], "index_select + forward ms": ts[1],
                        "rows= backward ms": ts[2], "index_select + backward + index_add ms": ts[3]}
    print("selection", json.dumps(out["selection"]), flush=True)
    del hw
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

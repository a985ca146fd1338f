#!/usr/bin/env python3
"""Device time of rlk's ops called through Python, to set beside the C benchmarks of the same
cases (rlk-bench-policy-loss, rlk-bench-advantage-scan), and a GRPO loss step captured in a
CUDA graph beside the same step run eagerly.

    python3 tools/bench/python_device_time.py [--json FILE] [--reps N]

Cases (torch CUDA tensors, f32):
  rlk.policy_loss 1024 x 4096, bool mask, lengths in [T/4, T), PPO clip 0.2/0.28 dual clip 3,
    k3 KL 0.001, token-mean (rlk-bench-policy-loss's "bool mask" case), with the normalizer
    as a number, as a device scalar, and left to the call (the device's own mask count);
  rlk.gae 256 x 4096, bool mask, with returns (rlk-bench-advantage-scan's first case);
  a GRPO loss step (token_logprob forward, group advantages, policy loss, logprob backward
    through torch.autograd.grad) at two sizes, eager and replayed from a CUDA graph.
Each figure: the mean time per call of --calls calls made back to back from Python between two
CUDA events (inputs rotated over sets that exceed the L2 cache), the median of --reps such
runs. Python's host time per call is hidden when it is below the device time; the figure then
shows the launches' device cost, otherwise the host's.
"""
import argparse
import datetime
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402

import rlk  # noqa: E402
from rlk import autograd as A  # noqa: E402
from event_timing import event_times  # noqa: E402
from run_report import git_revision, write_json  # noqa: E402


def b2b_ms(fn, sets, calls, reps):
    """Median over reps of the mean device time per call of `calls` calls back to back."""
    for s in sets:  # warm-up: kernels compiled or loaded, allocator primed
        fn(s)

    def back_to_back(_):
        for i in range(calls):
            fn(sets[i % len(sets)])
    return statistics.median(event_times(back_to_back, 0, reps)) / calls


def policy_sets(B, T, nsets):
    sets = []
    for _ in range(nsets):
        lens = torch.randint(T // 4, T, (B,), device="cuda")
        mask = torch.arange(T, device="cuda")[None, :] < lens[:, None]
        lp = torch.randn(B, T, device="cuda") * 0.1 - 2.0
        sets.append({"lp": lp, "old": lp + torch.randn(B, T, device="cuda") * 0.05,
                     "ref": lp + torch.randn(B, T, device="cuda") * 0.05,
                     "adv": torch.randn(B, T, device="cuda"), "mask": mask,
                     "n": float(mask.sum()), "n_dev": mask.sum(dtype=torch.float32).view(1)})
    return sets


def policy_call(normalizer):
    def run(s):
        tn = {"number": s["n"], "device scalar": s["n_dev"], "none (device count)": None}[normalizer]
        return rlk.policy_loss(s["lp"], s["old"], s["adv"], s["mask"], ref_logp=s["ref"],
                               kl_coef=1e-3, kl_estimator="k3", clip_high=0.28,
                               token_normalizer=tn)
    return run


def gae_sets(B, T, nsets):
    sets = []
    for _ in range(nsets):
        lens = torch.randint(T // 4, T, (B,), device="cuda")
        sets.append({"r": torch.randn(B, T, device="cuda"), "v": torch.randn(B, T, device="cuda"),
                     "mask": torch.arange(T, device="cuda")[None, :] < lens[:, None]})
    return sets


def gae_call(s):
    return rlk.gae(s["r"], s["v"], s["mask"], gamma=1.0, lam=0.95)


def grpo_inputs(B, T, V, G):
    lens = torch.randint(T // 4, T + 1, (B,), device="cuda")
    return {"logits": torch.randn(B * T, V, device="cuda"),
            "labels": torch.randint(0, V, (B * T,), device="cuda"),
            "old": torch.randn(B, T, device="cuda") * 0.1 - 5.0,
            "ref": torch.randn(B, T, device="cuda") * 0.1 - 5.0,
            "mask": torch.arange(T, device="cuda")[None, :] < lens[:, None],
            "scores": torch.randn(B, device="cuda"), "B": B, "T": T, "G": G}


def grpo_step(x):
    logits = x["logits"].detach().requires_grad_(True)
    logp = A.token_logprob(logits, x["labels"]).view(x["B"], x["T"])
    _, adv = rlk.group_advantage(x["scores"], x["G"], mask=x["mask"], broadcast=True)
    loss, metrics = A.policy_loss(logp, x["old"], adv, x["mask"], ref_logp=x["ref"],
                                  kl_coef=1e-3, clip_high=0.28)
    (grad,) = torch.autograd.grad(loss, logits)
    return loss, metrics, grad


def graph_of(fn, x):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(x)
    return g


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    rows = []

    def row(name, ms):
        rows.append({"case": name, "ms": round(ms, 5)})
        print("%-58s %9.4f ms" % (name, ms), flush=True)

    ps = policy_sets(1024, 4096, 2)  # 2 sets x 84 MB: beyond the L2
    for norm in ("number", "device scalar", "none (device count)"):
        row("policy_loss 1024x4096 bool mask, normalizer %s" % norm,
            b2b_ms(policy_call(norm), ps, args.calls, args.reps))
    del ps
    gs = gae_sets(256, 4096, 6)  # 6 sets x 13 MB
    row("gae 256x4096 bool mask +returns", b2b_ms(gae_call, gs, args.calls, args.reps))
    del gs
    for B, T, V in ((8, 48, 320), (16, 512, 32768)):
        x = grpo_inputs(B, T, V, 4)
        g = graph_of(grpo_step, x)
        name = "grpo loss step B=%d T=%d V=%d" % (B, T, V)
        row(name + " eager", b2b_ms(grpo_step, [x], max(10, args.calls // 5), args.reps))
        row(name + " graph replay", b2b_ms(lambda _: g.replay(), [x], max(10, args.calls // 5),
                                           args.reps))
        del g, x
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "command": " ".join(sys.argv), "revision": git_revision() or os.environ.get("REV"), "rows": rows}
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

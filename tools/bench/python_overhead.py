#!/usr/bin/env python3
"""The Python-side cost of one rlk call: each functional op and autograd Function, on small
inputs, split into the library call and what the package adds around it.

    python3 tools/bench/python_overhead.py [--device cpu|cuda] [--frameworks numpy,torch]
                                           [--ops a,b] [--calls N] [--json FILE] [--floors]

--floors also times torch's own costs in the same run (an empty torch.library custom op with
1..5 tensor arguments, an empty autograd.Function's forward + backward, ...) and prints each
torch call's ratio to its floor.

For each op and framework: the host wall time of one call (time.perf_counter around each of
--calls calls after warm-up, median), and the median time of the same library calls replayed
through their ctypes function pointers with the args structs the package built (inside one
call, while its arrays are alive: "library"). The difference ("python") is what the package
spends around the launch: descriptors, checks, context and stream lookups, output allocation,
workspace-size queries, autograd bookkeeping. "package" times the same calls again with the
launches made no-ops: the package's own time alone, what decides a call's cost on a GPU, where
the library's call only queues a launch (on the host backend it runs the kernel).

--device cpu (the default without CUDA): numpy arrays and torch CPU tensors on the host
backend, so "library" holds a tiny host kernel. --device cuda: torch CUDA tensors, timed
without synchronizing (the device is synchronized between batches, off the clock), so "call"
is what the trainer's thread spends and "library" the library's host-side launch.
Inputs are small (a few hundred elements): the figures are per-call costs, not throughput.
"""
import argparse
import contextlib
import ctypes
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

import numpy as np  # noqa: E402

import rlk  # noqa: E402
from rlk import _entry, _tensor  # noqa: E402
from run_report import git_revision, write_json  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

B, T, G = 16, 32, 4      # sequences, tokens, group size
N, V = 16, 64            # logprob rows and vocabulary
HEAD_H = 32              # the fused head's hidden size (linear_logprob)

# ---------------------------------------------------------------------------------------------
# Inputs and calls
# ---------------------------------------------------------------------------------------------


def inputs(fw, dev):
    """Small inputs of one framework ("numpy" or "torch") on `dev`."""
    rng = np.random.default_rng(0)
    mask = np.arange(T)[None, :] < rng.integers(T // 2, T + 1, B)[:, None]
    arrays = {
        "scores": rng.standard_normal(B).astype(np.float32),
        "mask": mask,
        "logp": (rng.standard_normal((B, T)) * 0.1 - 2.0).astype(np.float32),
        "old": (rng.standard_normal((B, T)) * 0.1 - 2.0).astype(np.float32),
        "adv": rng.standard_normal((B, T)).astype(np.float32),
        "values": rng.standard_normal((B, T)).astype(np.float32),
        "rewards": rng.standard_normal((B, T)).astype(np.float32),
        "logits": rng.standard_normal((N, V)).astype(np.float32),
        "labels": rng.integers(0, V, N).astype(np.int64),
        "grad": rng.standard_normal(N).astype(np.float32),
        "hidden": rng.standard_normal((N, HEAD_H)).astype(np.float16),
        "weight": (rng.standard_normal((V, HEAD_H)) / 8).astype(np.float16),
    }
    x = {k: (torch.from_numpy(v).to(dev) if fw == "torch" else v) for k, v in arrays.items()}
    # the global token count a trainer passes (else the loss reads the mask's sum back)
    x["n"] = float(mask.sum())
    x["lse"] = rlk.logprob(x["logits"], x["labels"]).lse  # for logprob_backward
    x["head_lse"] = rlk.linear_logprob(x["hidden"], x["weight"], x["labels"]).lse  # and the head's
    return x


# The tensor arguments each functional case passes: its floor is an empty torch.library custom
# op taking as many tensors.
TENSORS = {"group_advantage": 1, "group_advantage broadcast": 2, "policy_loss": 5,
           "policy_loss normalizer=None": 5, "value_loss": 4, "gae": 3, "discounted_returns": 2,
           "reverse_cumsum": 2, "masked_whiten": 2, "logprob": 2, "logprob_backward": 4,
           "linear_logprob": 3, "linear_logprob_backward": 5, "sample": 1, "linear_sample": 2}


def functional_calls():
    """(op, fn(x)) for every functional op the loaded library has."""
    have = set(rlk.available_ops())
    calls = [
        ("group_advantage", "group_advantage", lambda x: rlk.group_advantage(x["scores"], G)),
        ("group_advantage broadcast", "group_advantage",
         lambda x: rlk.group_advantage(x["scores"], G, mask=x["mask"], broadcast=True)),
        ("policy_loss", "policy_loss",
         lambda x: rlk.policy_loss(x["logp"], x["old"], x["adv"], x["mask"], ref_logp=x["old"],
                                   kl_coef=1e-3, clip_high=0.28, token_normalizer=x["n"])),
        ("policy_loss normalizer=None", "policy_loss",
         lambda x: rlk.policy_loss(x["logp"], x["old"], x["adv"], x["mask"], ref_logp=x["old"],
                                   kl_coef=1e-3, clip_high=0.28)),
        ("value_loss", "value_loss",
         lambda x: rlk.value_loss(x["values"], x["old"], x["rewards"], x["mask"],
                                  token_normalizer=x["n"])),
        ("gae", "gae", lambda x: rlk.gae(x["rewards"], x["values"], x["mask"], lam=0.95)),
        ("discounted_returns", "discounted_returns",
         lambda x: rlk.discounted_returns(x["rewards"], x["mask"])),
        ("reverse_cumsum", "reverse_cumsum", lambda x: rlk.reverse_cumsum(x["rewards"], x["mask"])),
        ("masked_whiten", "masked_whiten", lambda x: rlk.masked_whiten(x["adv"], x["mask"])),
        ("logprob", "logprob", lambda x: rlk.logprob(x["logits"], x["labels"], entropy=True)),
        ("logprob_backward", "logprob_backward",
         lambda x: rlk.logprob_backward(x["logits"], x["labels"], x["lse"], grad_logp=x["grad"])),
        ("linear_logprob", "linear_logprob",
         lambda x: rlk.linear_logprob(x["hidden"], x["weight"], x["labels"])),
        ("linear_logprob_backward", "linear_logprob_backward",
         lambda x: rlk.linear_logprob_backward(x["hidden"], x["weight"], x["labels"], x["head_lse"],
                                               x["grad"])),
        # a decode step's draw with a rollout's usual settings: top-k + top-p, the row's seed
        # fixed, the offset advancing (a new number each step)
        ("sample", "sample",
         lambda x: rlk.sample(x["logits"], temperature=0.8, top_k=8, top_p=0.9, seed=1234,
                              offset=x.setdefault("step", iter(range(1 << 62))).__next__())),
        ("linear_sample", "linear_sample",
         lambda x: rlk.linear_sample(x["hidden"], x["weight"], temperature=0.8, top_k=8, top_p=0.9,
                                     seed=1234, offset=x.setdefault("step", iter(range(1 << 62))).__next__())),
    ]
    assert {name for name, _, _ in calls} == set(TENSORS)
    return [(name, fn) for name, op, fn in calls if op in have]


def empty_custom_ops(counts):
    """torch.ops.rlkbench.empty<n>: a torch.library custom op taking n tensors that does nothing
    (returns nothing), the dispatcher's own cost per call."""
    ops = {}
    for n in sorted(set(counts)):
        schema = "(%s) -> ()" % ", ".join("Tensor t%d" % i for i in range(n))
        op = torch.library.custom_op("rlkbench::empty%d" % n, lambda *ts: None, mutates_args=(),
                                     schema=schema)
        op.register_fake(lambda *ts: None)
        ops[n] = getattr(torch.ops.rlkbench, "empty%d" % n)
    return ops


def autograd_calls():
    """(op, fn(x)) for the autograd Functions: the forward alone, and forward + backward."""
    from rlk import autograd as A
    have = set(rlk.available_ops())

    def policy(x):
        return A.policy_loss(x["logp_req"], x["old"], x["adv"], x["mask"], ref_logp=x["old"],
                             kl_coef=1e-3, clip_high=0.28, token_normalizer=x["n"])[0]

    def value(x):
        return A.value_loss(x["values_req"], x["old"], x["rewards"], x["mask"],
                            token_normalizer=x["n"])[0]

    def logprob(x):
        return A.token_logprob(x["logits_req"], x["labels"])

    def step(fn, leaf):
        def run(x):  # what a trainer's step does: fresh gradients, backward() on a scalar
            x[leaf].grad = None
            out = fn(x)
            (out if out.dim() == 0 else out.sum()).backward()
        return run

    calls = []
    for name, ops, fn, leaf in (("policy_loss", ("policy_loss",), policy, "logp_req"),
                                ("value_loss", ("value_loss",), value, "values_req"),
                                ("token_logprob", ("logprob", "logprob_backward"), logprob,
                                 "logits_req")):
        if all(o in have for o in ops):
            calls.append(("autograd %s" % name, fn))
            calls.append(("autograd %s fwd+bwd" % name, step(fn, leaf)))
    return calls


def torch_floors(dev):
    """What torch itself costs per call on `dev` (no rlk): the building blocks a binding needs
    (an allocation, a view, the attribute reads of one tensor argument) and an autograd step of
    the shape the loss wrappers take (a Function, or one elementwise op, then backward())."""
    x = torch.randn(B, T, device=dev)
    leaf = x.clone().requires_grad_(True)

    class Scalar(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a.new_zeros(())

        @staticmethod
        def backward(ctx, g):
            return g.expand(B, T)

    class Vector(torch.autograd.Function):  # a per-row output, as token_logprob's
        @staticmethod
        def forward(ctx, a):
            return a.new_zeros((B,))

        @staticmethod
        def backward(ctx, g):
            return g[:, None].expand(B, T)

    def function_step():
        leaf.grad = None
        Scalar.apply(leaf).backward()

    def vector_step():  # what the token_logprob step does around its Function: .sum(), backward()
        leaf.grad = None
        Vector.apply(leaf).sum().backward()

    def elementwise_step():
        leaf.grad = None
        (leaf * 2).sum().backward()

    tensors = [torch.randn(B, T, device=dev) for _ in range(max(TENSORS.values()))]
    customs = [("floor: custom op, %d tensor%s" % (n, "" if n == 1 else "s"),
                (lambda op, ts: lambda: op(*ts))(op, tensors[:n]))
               for n, op in empty_custom_ops(TENSORS.values()).items()]
    return customs + [
        ("floor: torch.empty", lambda: torch.empty(B, T, device=dev)),
        ("floor: a view (x[0:1])", lambda: x[0:1]),
        ("floor: one argument's reads", lambda: (x.get_device(), x.dtype, x.shape, x.stride(),
                                                 x.data_ptr())),
        ("floor: an elementwise op (x * 2)", lambda: x * 2),
        ("floor: Function fwd+bwd", function_step),
        ("floor: Function fwd+bwd, its [rows] output summed", vector_step),
        ("floor: (x * 2).sum().backward()", elementwise_step),
    ]


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def python_path():
    """Inside, calls take the package's Python path (no compiled entry: rlk/_entry.py)."""
    saved = _entry._state["module"]
    _entry._state["module"] = None
    try:
        yield
    finally:
        _entry._state["module"] = saved


_NOOP = []


def noop_function():
    """A C function of an rlk op's signature that does nothing and returns 0 (built here once):
    what a compiled-entry plan calls instead of the library inside no_launches."""
    if not _NOOP:
        d = tempfile.mkdtemp(prefix="rlk-noop-")
        src, lib = os.path.join(d, "noop.c"), os.path.join(d, "noop.so")
        with open(src, "w") as f:
            f.write("int rlk_noop(void *c, const void *a, void *s) { (void)c; (void)a; (void)s; return 0; }\n")
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", src, "-o", lib], check=True)
        _NOOP.append(ctypes.CDLL(lib).rlk_noop)
    return _NOOP[0]


@contextlib.contextmanager
def timed_launches(calls, sync):
    """Inside, every launch the package makes (through its Python path) is first replayed `calls`
    times straight through its ctypes function pointer with the args struct the package built,
    while the call's arrays are all alive; yields the list of those replays' median times (us)."""
    got = []
    launch = _tensor.Op.launch

    def hook(self, ctx, args, stream):
        fn = getattr(rlk.library(), "rlk_" + self.name)  # the declared entry point
        h, ref = ctx.handle, ctypes.byref(args)
        got.append(median_us(lambda: fn(h, ref, stream), calls, sync))
        return launch(self, ctx, args, stream)

    _tensor.Op.launch = hook
    try:
        with python_path():
            yield got
    finally:
        _tensor.Op.launch = launch


def median_us(fn, calls, sync):
    """The median host wall time of fn() in microseconds, over `calls` calls in batches of 100
    with sync() between batches (off the clock)."""
    times = []
    clock = time.perf_counter
    while len(times) < calls:
        for _ in range(min(100, calls - len(times))):
            t0 = clock()
            fn()
            times.append(clock() - t0)
        sync()
    return statistics.median(times) * 1e6


@contextlib.contextmanager
def no_launches():
    """Inside, the package makes every call but its launches (the ctypes call of rlk_<op>): what
    a call then costs is the package's own time, whatever the library's call costs here."""
    launch = _tensor.Op.launch
    _tensor.Op.launch = lambda self, ctx, args, stream: None
    # the compiled entry's plans call the library's function they were made with: made anew
    # inside with a function that does nothing
    ops = [o for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("rlk.")
           for o in vars(m).values() if isinstance(o, _tensor.Op) and o._run is not None]
    runs = [o._run for o in ops]
    noop = noop_function() if _entry.module() is not None else None
    _entry.forget()
    if noop is not None:
        for o in ops:
            o._run = noop
    try:
        yield
    finally:
        _tensor.Op.launch = launch
        for o, r in zip(ops, runs):
            o._run = r
        _entry.forget()


def measure(name, fw, fn, x, calls, warmup, sync):
    for _ in range(warmup):  # the first calls compile (or load) the kernels
        fn(x)
    sync()
    call = median_us(lambda: fn(x), calls, sync)
    with timed_launches(calls, sync) as lib:
        fn(x)
    sync()
    with no_launches():
        for _ in range(3):  # the compiled entry's plans made again (no_launches)
            fn(x)
        own = median_us(lambda: fn(x), calls, sync)
    return {"op": name, "framework": fw, "call_us": round(call, 2),
            "library_us": round(sum(lib), 2), "python_us": round(call - sum(lib), 2),
            "package_us": round(own, 2), "launches": len(lib), "calls": calls}


def goal_ratios(rows):
    """Each torch call over its floor measured in the same run: a functional call over the empty
    custom op with as many tensors (goal 1.5x), an autograd forward + backward over an empty
    autograd.Function's (goal 1.3x)."""
    floors = {r["op"]: r["call_us"] for r in rows if r["op"].startswith("floor: ")}
    out = []
    for r in rows:
        if r["framework"] != "torch" or r["op"].startswith("floor: "):
            continue
        base = r["op"].replace(" (python path)", "")
        if base in TENSORS:
            n = TENSORS[base]
            floor, goal = "floor: custom op, %d tensor%s" % (n, "" if n == 1 else "s"), 1.5
        elif r["op"].startswith("autograd token_logprob fwd+bwd"):  # a per-row output, summed
            floor, goal = "floor: Function fwd+bwd, its [rows] output summed", 1.3
        elif r["op"].endswith("fwd+bwd") or r["op"].endswith("fwd+bwd (python path)"):
            floor, goal = "floor: Function fwd+bwd", 1.3
        else:
            continue
        if floor in floors:
            out.append({"op": r["op"], "call_us": r["call_us"], "floor": floor,
                        "floor_us": floors[floor], "ratio": round(r["call_us"] / floors[floor], 2),
                        "package_us": r["package_us"],
                        "package_ratio": round(r["package_us"] / floors[floor], 2), "goal": goal})
    return out


def machine(dev):
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "numpy": np.__version__, "torch": torch.__version__ if torch else None,
            "librlk": rlk.version_string(), "device": dev,
            "compiled_entry": _entry.status()[0]}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["cores"] = os.cpu_count()
    if dev == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cuda = torch is not None and torch.cuda.is_available()
    ap.add_argument("--device", default="cuda" if cuda else "cpu", choices=("cpu", "cuda"))
    ap.add_argument("--frameworks", help="numpy,torch (default: those present; cuda: torch)")
    ap.add_argument("--ops", help="comma-separated substrings of the op names to run")
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per op (default 2000)")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--json", help="also write the rows and the machine here")
    ap.add_argument("--floors", action="store_true",
                    help="also time torch's own per-call costs (allocation, view, an autograd step)")
    args = ap.parse_args(argv)

    if args.device == "cuda":
        if not cuda:
            ap.error("--device cuda needs torch with a CUDA device")
        frameworks = ["torch"]
        dev = "cuda"
        sync = torch.cuda.synchronize
    else:
        frameworks = ["numpy"] + (["torch"] if torch is not None else [])
        dev = "cpu"
        sync = lambda: None  # noqa: E731  (host calls are synchronous)
    if args.frameworks:
        frameworks = [f for f in args.frameworks.split(",") if f in frameworks]
    wanted = args.ops.split(",") if args.ops else None
    if torch is not None and "torch" in frameworks:
        _entry.wait()  # the compiled entry built (or found) before anything is timed
        print("compiled entry: %s" % _entry.status()[0])

    rows = []
    line = "%-34s %-6s %9s %9s %9s %9s"
    print(line % ("op", "fw", "call us", "library", "python", "package"))
    for fw in frameworks:
        x = inputs(fw, dev)
        cases = functional_calls()
        if fw == "torch":
            for k in ("logp", "values", "logits"):
                x[k + "_req"] = x[k].clone().requires_grad_(True)
            cases += autograd_calls()
        for name, fn in cases:
            if wanted and not any(w in name for w in wanted):
                continue
            paths = [("", contextlib.nullcontext)]
            if fw == "torch" and _entry.module() is not None:  # both paths, side by side
                paths.append((" (python path)", python_path))
            for suffix, path in paths:
                with path():
                    r = measure(name + suffix, fw, fn, x, args.calls, args.warmup, sync)
                rows.append(r)
                print(line % (r["op"], fw, "%.1f" % r["call_us"], "%.1f" % r["library_us"],
                              "%.1f" % r["python_us"], "%.1f" % r["package_us"]), flush=True)
    if args.floors and torch is not None:
        for name, fn in torch_floors(dev):
            us = median_us(lambda: fn(), args.calls, sync)
            rows.append({"op": name, "framework": "torch", "call_us": round(us, 2), "calls": args.calls})
            print(line % (name, "torch", "%.1f" % us, "-", "-", "-"), flush=True)
    goals = goal_ratios(rows)
    if goals:
        print("\nbeside torch's floors in this run (goals: functional <= 1.5x, autograd fwd+bwd "
              "<= 1.3x; the whole call, then the package's own time):")
        for g in goals:
            print("  %-34s %7.1f us / %-28s %7.1f us = %.2fx %-10s package %7.1f us = %.2fx %s" % (
                g["op"], g["call_us"], g["floor"], g["floor_us"], g["ratio"],
                "ok" if g["ratio"] <= g["goal"] else "over %.1fx" % g["goal"], g["package_us"],
                g["package_ratio"], "ok" if g["package_ratio"] <= g["goal"] else
                "over %.1fx" % g["goal"]))
    report = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
              "revision": git_revision(), "machine": machine(dev), "rows": rows, "goals": goals}
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

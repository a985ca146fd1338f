"""On-policy distillation's divergence from two heads' hidden states, timed in one run beside the
trainers' own: rlk.linear_divergence (forward; forward + backward through rlk.autograd), TRL's
ChunkedDivergenceFunction (trl.kernels.chunked_divergence, installed), verl's top-k forward KL
(verl.trainer.distillation.fsdp.losses.compute_forward_kl_topk, which takes the student's
materialized logits: the logits' GEMM is timed with it) and cuBLAS's GEMMs of the same shapes, the
floors: two for the forward (both heads' logits); for forward + backward with a frozen teacher,
four (the logits once, then the student's grad_hidden and grad_weight: what a path that kept the
logits would multiply) and six (the logits recomputed in the backward, as rlk does within its
0.3 GiB). Each implementation's peak memory beyond its inputs and gradients is measured beside
its time; every output is checked against rlk's before timing (same divergence, same gradients to
the bf16 rounding of TRL's logits' gradient). --variant picks rlk's forward kernels (auto: the
sm_90a wgmma kernels on an H100 / H200, where the backward's run too; tiled: the portable ones).

    python tools/bench/linear_divergence_bench.py [--shape N,H,V] [--modes fkl,rkl,jsd,topk]
        [--variant auto|tiled] [--rounds 20] [--json FILE] [--device cuda|cpu]

On a GPU: N 8192, H 4096 both heads, V 151936, bf16 (the default). On the CPU
(--device cpu) a small shape runs the same comparison against the host backend (an fp64
reference path: correctness, not speed). Timing by tools/bench/rounds.py on a GPU (rotated rounds,
device events); by wall clock on the CPU."""
import argparse
import json
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

import rlk  # noqa: E402
import rlk.autograd as ag  # noqa: E402

VARIANTS = {"auto": 0, "wgmma": 1, "tiled": 2}
MODES = {"fkl": (0.0, "forward_kl", 0), "rkl": (1.0, "reverse_kl", 0), "jsd": (0.5, "jsd", 0),
         "topk": (0.0, "forward_kl", 32)}


def trl_divergence():
    try:
        from trl.kernels.chunked_divergence import ChunkedDivergenceFunction
        return ChunkedDivergenceFunction
    except Exception as e:  # noqa: BLE001
        print("TRL's chunked divergence is not importable here (%s): skipped" % e)
        return None


def verl_topk():
    try:
        from verl.trainer.distillation.fsdp import losses
        from verl.workers.config import DistillationConfig, DistillationLossConfig
        # unclamped log-probs (the dataclass clamps at -10 by default): the definition rlk computes
        cfg = DistillationConfig(distillation_loss=DistillationLossConfig(topk=32, use_chunked_topk=True,
                                                                         log_prob_min_clamp=None))
        return losses.compute_forward_kl_topk, cfg
    except Exception as e:  # noqa: BLE001
        print("verl's top-k distillation loss is not importable here (%s): skipped" % e)
        return None, None


def timer(dev, rounds):
    if dev == "cuda":
        from rounds import median, rotated_rounds

        def run(fns):
            return [median(t) for t in rotated_rounds(fns, rounds)]
        return run

    def run_cpu(fns):
        out = []
        for fn in fns:
            fn()
            ts = []
            for _ in range(max(3, rounds // 4)):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            out.append(sorted(ts)[len(ts) // 2])
        return out
    return run_cpu


def peak_beyond(dev, fn):
    """Bytes an implementation's call holds at its peak beyond what was allocated before it (its
    outputs included; CUDA only)."""
    if dev != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def run_options(ap, rounds, variant_help):
    """The options this bench and linear_sample_bench.py share: --rounds (timer's), --variant
    (rlk_linear_logprob_variant), --device and --json."""
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--variant", default="auto", choices=sorted(VARIANTS), help=variant_help)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default=None)


def head_args(rounds, variant_help, more=None):
    """The head benches' command line: --shape N,H,V (default: 8192,4096,151936 on a GPU,
    256,256,8191 on the CPU), run_options's, and what more(ap) adds. Returns (args, N, H, V, a
    seeded generator on the device)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default=None, help="N,H,V (default: 8192,4096,151936 on a GPU, 256,256,8191 on the CPU)")
    if more is not None:
        more(ap)
    run_options(ap, rounds, variant_help)
    a = ap.parse_args()
    N, H, V = (int(x) for x in (a.shape or ("8192,4096,151936" if a.device == "cuda" else "256,256,8191")).split(","))
    return a, N, H, V, torch.Generator(device=a.device).manual_seed(0)


def main():
    a, N, H, V, g = head_args(20, "rlk's forward kernels (rlk_linear_logprob_variant)",
                              lambda ap: ap.add_argument("--modes", default="fkl,rkl,jsd,topk"))
    dev = a.device
    dt = torch.bfloat16

    def rand(*shape, sd=1.0):
        return (torch.randn(*shape, generator=g, device=dev) * sd).to(dt)

    sh, th = rand(N, H), rand(N, H)
    sw, tw = rand(V, H, sd=2.0 / math.sqrt(H)), rand(V, H, sd=2.0 / math.sqrt(H))
    upstream = torch.rand(N, generator=g, device=dev) + 0.5
    run = timer(dev, a.rounds)
    CDF = trl_divergence()
    verl_fn, verl_cfg = verl_topk()
    results = {"shape": [N, H, V], "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
               "rlk": rlk.version_string(), "variant": a.variant, "modes": {}}

    def gemm(x, w):
        return torch.mm(x, w.t())

    # the floors: the forward's two logits GEMMs; forward + backward adds dz @ W and dz^T @ h (four),
    # and with the logits recomputed both heads' again (six); each GEMM writes a bf16 output
    dz = rand(N, V, sd=1e-3) if dev == "cuda" else None
    floors = [None, None, None]
    if dev == "cuda":
        floors = run([lambda: (gemm(sh, sw), gemm(th, tw)),
                      lambda: (gemm(sh, sw), gemm(th, tw), torch.mm(dz, sw), torch.mm(dz.t(), sh)),
                      lambda: (gemm(sh, sw), gemm(th, tw), gemm(sh, sw), gemm(th, tw), torch.mm(dz, sw),
                               torch.mm(dz.t(), sh))])
    floor_fwd, floor_four, floor_fb = floors
    del dz
    for name in a.modes.split(","):
        beta, mode, top_k = MODES[name]
        kw = dict(mode=mode, beta=0.5 if mode != "jsd" else beta, top_k=top_k, variant=VARIANTS[a.variant])
        fwd = lambda: rlk.linear_divergence(sh, sw, th, tw, **kw)  # noqa: E731
        s_w = sw.detach().requires_grad_(True)
        s_h = sh.detach().requires_grad_(True)

        def fb():
            s_h.grad = s_w.grad = None
            d = ag.linear_divergence(s_h, s_w, th, tw, **kw)
            (d * upstream).sum().backward()
        row = {}
        fns, names = [fwd, fb], ["rlk fwd", "rlk fwd+bwd"]
        if CDF is not None and top_k == 0:
            def trl_fwd():
                with torch.no_grad():
                    return CDF.apply(sh, sw, None, th, tw, None, beta, 1.0, 1.0, None, 1.0, None)

            def trl_fb():
                s_h.grad = s_w.grad = None
                d, _ = CDF.apply(s_h, s_w, None, th, tw, None, beta, 1.0, 1.0, None, 1.0, None)
                (d * upstream).sum().backward()
            # the same divergence before timing it
            mine, theirs = fwd().divergence, trl_fwd()[0]
            err = (mine - theirs).abs().max().item()
            row["max |rlk - TRL| divergence"] = err
            fns += [trl_fwd, trl_fb]
            names += ["TRL fwd", "TRL fwd+bwd"]
        if verl_fn is not None and top_k:
            def verl_fwd(exact=False):
                # verl takes the student's logits as the model wrote them (bf16 from the GEMM);
                # the check before timing gives it f32 logits, so that both compute one thing
                mm = (lambda x, w: torch.mm(x.float(), w.float().t())) if exact else gemm
                with torch.no_grad():
                    logits = mm(sh, sw).float()
                    t_lp = mm(th, tw).float().log_softmax(-1)
                    vals, ids = t_lp.topk(top_k, -1)
                    nested = lambda x: torch.nested.as_nested_tensor([x], layout=torch.jagged)  # noqa: E731
                    return verl_fn(logits[None], nested(vals), nested(ids), verl_cfg, "thd")
            mine = fwd().divergence
            theirs = verl_fwd(exact=True)["distillation_losses"].reshape(-1)
            row["max |rlk - verl| divergence"] = (mine - theirs.to(mine.dtype)).abs().max().item()
            fns.append(verl_fwd)
            names.append("verl top-k fwd (logits materialized)")
        times = run(fns)
        for n_, t_ in zip(names, times):
            row[n_ + " ms"] = t_
        for n_, f_ in zip(names, fns):
            row[n_ + " peak bytes"] = peak_beyond(dev, f_)
        if floor_fwd:
            row["fwd / two GEMMs"] = row["rlk fwd ms"] / floor_fwd
            row["fwd+bwd / four GEMMs"] = row["rlk fwd+bwd ms"] / floor_four
            row["fwd+bwd / six GEMMs"] = row["rlk fwd+bwd ms"] / floor_fb
        if "TRL fwd+bwd ms" in row:
            row["TRL / rlk fwd+bwd"] = row["TRL fwd+bwd ms"] / row["rlk fwd+bwd ms"]
        results["modes"][name] = row
        print(name, json.dumps(row, indent=1))
    results["two GEMMs ms"], results["four GEMMs ms"], results["six GEMMs ms"] = floor_fwd, floor_four, floor_fb
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

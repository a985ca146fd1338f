"""PyTorch baselines for token log-probs and entropy from logits, timed on the GPU beside
rlk-bench-logprob in the same run.

  naive         log_softmax over fp32-upcast logits, then gather the label column
  row-chunked   1024 rows at a time, log_softmax in the logits' dtype, gather (TRL's bf16 path)
  entropy       softmax of the fp32 logits; logsumexp - sum(p * z)
  fwd+bwd       autograd through the naive path, the gradient of sum(logp) written in bf16

Shapes: 16384 x 151936, 4096 x 151936 and 16384 x 128256, bf16 logits (--shape NxV overrides).
Device-event median / min / max after warm-up; the extra peak memory of each call; the ratio to
the read-once floor (bytes / 4.14 TB/s, the H200's device-to-device copy rate). Prints one line
per case and writes JSON with --json.
"""
import argparse
import json

import torch
import torch.nn.functional as F

from event_timing import timed

FLOOR_TBPS = 4.14


def extra_peak_gib(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**30


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--shape", action="append", help="NxV (repeatable)")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shape] if args.shape else \
        [(16384, 151936), (4096, 151936), (16384, 128256)]
    dev = "cuda"
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    rows = []

    for n, v in shapes:
        logits = torch.randn(n, v, device=dev, dtype=torch.bfloat16, generator=gen) * 3
        labels = torch.randint(0, v, (n,), device=dev, generator=gen)
        read_bytes = n * v * logits.element_size()
        floor_ms = read_bytes / (FLOOR_TBPS * 1e12) * 1e3

        def naive():
            return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels[:, None]).squeeze(-1)

        def row_chunked():
            parts = []
            for x, y in zip(logits.split(1024), labels.split(1024)):
                parts.append(F.log_softmax(x, dim=-1).gather(-1, y[:, None]).squeeze(-1))
            return torch.cat(parts)

        def entropy():
            z = logits.float()
            p = torch.softmax(z, dim=-1)
            return torch.logsumexp(z, dim=-1) - (p * z).sum(-1)

        leaf = logits.detach().clone().requires_grad_(True)

        def fwd_bwd():
            leaf.grad = None
            lp = torch.log_softmax(leaf.float(), dim=-1).gather(-1, labels[:, None]).squeeze(-1)
            lp.sum().backward()

        # the baselines agree with each other before they are timed
        a, b = naive(), row_chunked()
        assert torch.allclose(a, b.float(), atol=0.15), (a - b.float()).abs().max()

        cases = [("naive log_softmax+gather", naive, 1),
                 ("row-chunked (1024) log_softmax", row_chunked, 1),
                 ("entropy naive", entropy, 1),
                 ("autograd fwd+bwd (grad bf16)", fwd_bwd, 3)]
        for label, fn, passes in cases:
            try:
                med, lo, hi = timed(fn, 2, args.iters)
                peak = extra_peak_gib(fn)
            except torch.cuda.OutOfMemoryError:
                print(f"torch logp {n}x{v}: {label}: out of memory")
                torch.cuda.empty_cache()
                continue
            fl = floor_ms * passes
            name = f"torch logp {n}x{v} bf16: {label}"
            rows.append({"name": name, "median_ms": med, "min_ms": lo, "max_ms": hi,
                         "floor_ms": fl, "ratio_to_floor": med / fl, "extra_peak_gib": peak})
            print(f"{name:62s} {med:10.4f} ms (min {lo:.4f} max {hi:.4f})  x{med / fl:.2f} of floor "
                  f"{fl:.4f} ms  peak +{peak:.2f} GiB", flush=True)
        del logits, labels, leaf
        torch.cuda.empty_cache()

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "floor_tbps": FLOOR_TBPS, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()

"""The LM head a GRPO trainer's log-prob pass runs, forward + backward at one shape, with the peak
memory each call adds beyond its inputs: rlk's fused head as rlk.integrations.trl.patch() runs it
(rlk.integrations._head.head_logprobs) beside TRL's own ChunkedLogProbFunction (trl.kernels, the
head patch's seam; at TRL's default chunk) and torch's matmul + log_softmax. Also the forward
alone (the old policy's and the reference's passes). Median of CUDA-event timings after warm-up.

    python3 tools/bench/head_memory.py [--rows 4096] [--hidden 896] [--vocab 151936] [--json F]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402

from event_timing import event_times  # noqa: E402


def measure(fn, iters=10):
    """(median ms, peak GiB the call allocated beyond what was held before it)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
    ts = sorted(event_times(lambda _: fn(), 0, iters))
    return ts[len(ts) // 2], peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--chunk", type=int, default=None, help="TRL's chunk_size (default: what TRL's log-prob pass passes)")
    ap.add_argument("--json")
    a = ap.parse_args()
    from rlk.integrations import _head
    torch.manual_seed(0)
    N, H, V = a.rows, a.hidden, a.vocab
    hidden = (torch.randn(N, H, device="cuda") * 0.5).bfloat16().requires_grad_(True)
    weight = (torch.randn(V, H, device="cuda") * 0.05).bfloat16().requires_grad_(True)
    labels = torch.randint(0, V, (N,), device="cuda")
    g = torch.randn(N, device="cuda")
    impls = {}

    def rlk_fb():
        hidden.grad = weight.grad = None
        logp, ent = _head.head_logprobs(hidden, weight, labels, entropy=True)
        (logp * g + ent * 0.01).sum().backward()

    def rlk_f():
        with torch.no_grad():
            _head.head_logprobs(hidden, weight, labels, entropy=True)
    impls["rlk fused head"] = (rlk_fb, rlk_f)
    try:
        from trl.kernels import ChunkedLogProbFunction as C
        from trl.trainer import utils as U
        chunk = a.chunk or U._CHUNKED_LOGPROB_CHUNK_SIZE  # what TRL's log-prob pass passes

        def trl_call():
            return C.apply(hidden, weight, None, labels, 1.0, chunk, None, 1.0, ("log_probs", "entropy"))

        def trl_fb():
            hidden.grad = weight.grad = None
            out = trl_call()
            (out[0] * g + out[1] * 0.01).sum().backward()

        def trl_f():
            with torch.no_grad():
                trl_call()
        impls["TRL ChunkedLogProbFunction (chunk %d)" % chunk] = (trl_fb, trl_f)
    except Exception as e:  # noqa: BLE001
        print("TRL's ChunkedLogProbFunction is not importable here (%s): skipped" % e)

    def torch_fb():
        hidden.grad = weight.grad = None
        lp = torch.log_softmax((hidden @ weight.T).float(), -1)
        logp = lp.gather(-1, labels[:, None])[:, 0]
        ent = -(lp.exp() * lp).sum(-1)
        (logp * g + ent * 0.01).sum().backward()

    def torch_f():
        with torch.no_grad():
            lp = torch.log_softmax((hidden @ weight.T).float(), -1)
            lp.gather(-1, labels[:, None])
    impls["torch matmul + log_softmax"] = (torch_fb, torch_f)
    rows = []
    print("N %d H %d V %d bf16, log-probs + entropy" % (N, H, V))
    for name, (fb, f) in impls.items():
        try:
            t_fb, m_fb = measure(fb)
            t_f, m_f = measure(f)
        except Exception as e:  # noqa: BLE001
            print("%-44s failed: %s" % (name, str(e)[:200]))
            continue
        rows.append(dict(impl=name, fwd_bwd_ms=t_fb, fwd_bwd_peak_gib=m_fb, fwd_ms=t_f, fwd_peak_gib=m_f))
        print("%-44s fwd+bwd %8.3f ms peak +%.3f GiB   fwd %8.3f ms peak +%.3f GiB" % (name, t_fb, m_fb, t_f, m_f))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(N=N, H=H, V=V, device=torch.cuda.get_device_name(), rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()

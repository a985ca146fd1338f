"""Anchors for rlk_linear_logprob on the same GPU: cuBLAS h @ W^T alone (bf16 out), the backward's
two other GEMMs (dZ @ W, dZ^T @ h: with a recompute of h @ W^T, the 4-GEMM floor of a forward +
backward), and torch's matmul + fp32 logsumexp + gather (+ entropy), forward only. With --anchors,
forward + backward of what trainers use in the same run: torch autograd, Liger-Kernel's
fused_linear_cross_entropy, cut-cross-entropy (its default gradient filtering, and exact), and rlk
through Python (rlk.autograd.linear_token_logprob). Median of --iters CUDA-event timings after 3
warm-up calls. With --kernels, rlk's forward and backward (bf16 gradients) split into their
kernels' CUDA times (torch profiler), the backward at each vocabulary chunk of --chunks A,B,...
(0: the call's own choice). With --rounds R, forward + backward of the four cuBLAS GEMMs, rlk (f32
and bf16 gradients) and Liger in R rounds, each round timing every case once in a rotated order
with the device kept busy while the host queues the call: the ratios of one run, free of the
drift as the GPU warms and of the host's per-call time. With --loss-rounds R, the same for the
policy loss straight from hidden states: the three cuBLAS GEMMs (fwd, dH, dW) and the four,
rlk.linear_policy_loss by both paths (recompute; token chunks: three products) with f32
gradients, and Liger's fused_linear_cross_entropy; then how far the two paths' gradients are
apart. Usage:
python3 torch_linear_logprob.py [N H V] [--iters K] [--anchors] [--kernels] [--chunks A,B,...]
                                [--rounds R] [--loss-rounds R]"""
import os
import sys

import torch

from event_timing import event_times


def timed(fn, iters):
    ts = sorted(event_times(lambda _: fn(), 3, iters))
    return ts[len(ts) // 2], ts[0], ts[-1]


def timed_memory(fn, iters):
    """timed(), and the peak memory the calls allocated beyond what was held before, GiB."""
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    med, lo, hi = timed(fn, iters)
    return med, lo, hi, (torch.cuda.max_memory_allocated() - base) / 2 ** 30


def main():
    anchors = "--anchors" in sys.argv
    kernels = "--kernels" in sys.argv
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    iters = 10
    chunks = [0]
    rounds = loss_rounds = 0
    if "--loss-rounds" in sys.argv:
        loss_rounds = int(sys.argv[sys.argv.index("--loss-rounds") + 1])
        args.remove(str(loss_rounds))
    if "--rounds" in sys.argv:
        rounds = int(sys.argv[sys.argv.index("--rounds") + 1])
        args.remove(str(rounds))
    if "--iters" in sys.argv:
        iters = int(sys.argv[sys.argv.index("--iters") + 1])
        args.remove(str(iters))
    if "--chunks" in sys.argv:
        spec = sys.argv[sys.argv.index("--chunks") + 1]
        chunks = [int(c) for c in spec.split(",")]
        args.remove(spec)
    N, H, V = (int(x) for x in args[:3]) if len(args) >= 3 else (8192, 4096, 151936)
    g = torch.Generator(device="cuda").manual_seed(0)
    h = (torch.rand(N, H, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    w = ((torch.rand(V, H, device="cuda", generator=g) * 2 - 1) * (3.0 / H ** 0.5)).to(torch.bfloat16)
    y = torch.randint(0, V, (N,), device="cuda", generator=g)
    flop = 2.0 * N * H * V

    def gemm():
        return h @ w.t()

    def lse_path():
        z = (h @ w.t()).float()
        lse = torch.logsumexp(z, dim=-1)
        logp = z.gather(1, y[:, None])[:, 0] - lse
        p = torch.softmax(z, dim=-1)
        ent = lse - (p * z).sum(-1)
        return logp, ent

    dz = (torch.rand(N, V, device="cuda", generator=g) * 1e-3).to(torch.bfloat16)

    def dh_gemm():
        return dz @ w

    def dw_gemm():
        return dz.t() @ h

    name = torch.cuda.get_device_name()
    for label, fn in (("cuBLAS h @ W^T (bf16 out)", gemm), ("cuBLAS dZ @ W (dH)", dh_gemm),
                      ("cuBLAS dZ^T @ h (dW)", dw_gemm), ("torch matmul + logsumexp + entropy", lse_path)):
        med, lo, hi, extra = timed_memory(fn, iters)
        print(f"{label} N={N} H={H} V={V} on {name}: median {med:.3f} ms (min {lo:.3f}, max {hi:.3f}), "
              f"{flop / (med * 1e-3) / 1e12:.0f} TFLOP/s, peak extra {extra:.2f} GiB")
    if rounds:
        fwd_bwd_rounds(h, w, y, dz, rounds, name)
    if loss_rounds:
        loss_rounds_run(h, w, y, dz, loss_rounds, name)
    if anchors or kernels:
        del dz
        torch.cuda.empty_cache()
    if kernels:
        rlk_kernels(h, w, y, iters, chunks, name)
    if anchors:
        fwd_bwd_anchors(h, w, y, iters, name)


def profile_kernels(label, fn, calls=3):
    """Each kernel's mean CUDA time per call of fn, and the sum."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kernel_split import kernel_split
    total = 0.0
    for name, ms, launches in kernel_split(fn, calls):
        total += ms
        print(f"  {label} kernel {name[-60:]}: {ms:.3f} ms, {launches} launches a call")
    print(f"  {label} kernels: sum {total:.3f} ms")


def rlk_kernels(h, w, y, iters, chunks, name):
    """rlk's forward and backward (grad_logp and grad_entropy given, bf16 gradients): event-timed
    medians and kernel splits, the backward once per vocabulary chunk asked for."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import rlk
    N, H = h.shape
    V = w.shape[0]
    r = rlk.linear_logprob(h, w, y, entropy=True)
    logp, lse, ent = r.logp, r.lse, r.entropy
    g = torch.Generator(device="cuda").manual_seed(1)
    g_lp = torch.rand(N, device="cuda", generator=g) - 0.5
    g_ent = (torch.rand(N, device="cuda", generator=g) - 0.5) * 0.1
    gh = torch.empty_like(h)
    gw = torch.empty_like(w)

    def fwd():
        rlk.linear_logprob(h, w, y, entropy=True)
    med, lo, hi = timed(fwd, iters)
    print(f"rlk linear_logprob fwd + entropy N={N} H={H} V={V} on {name}: median {med:.3f} ms "
          f"(min {lo:.3f}, max {hi:.3f})")
    profile_kernels("fwd", fwd)
    for chunk in chunks:
        def bwd():
            rlk.linear_logprob_backward(h, w, y, lse, g_lp, g_ent, ent, grad_hidden=gh, grad_weight=gw,
                                        chunk=chunk or None)
        med, lo, hi = timed(bwd, iters)
        print(f"rlk linear_logprob_backward chunk={chunk} bf16 grads N={N} H={H} V={V} on {name}: "
              f"median {med:.3f} ms (min {lo:.3f}, max {hi:.3f})")
        profile_kernels(f"bwd chunk={chunk}", bwd)
    del logp


def report_rounds(cases, times, median, ratios):
    """Each case's line from its round times: median, range, ratios(median, all medians), and the
    peak memory one more call adds beyond what is allocated."""
    meds = [median(t) for t in times]
    lines = []
    for (label, fn), t, med in zip(cases, times, meds):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
        lines.append(f"median {med:.3f} ms (min {min(t):.3f}, max {max(t):.3f}, {len(t)} rounds), "
                     f"{ratios(med, meds)}, peak extra {extra:.3f} GiB")
    return lines


def backward_of(loss_fn, *leaves):
    """A case that clears the leaves' gradients and backpropagates loss_fn()."""
    def run():
        for t in leaves:
            t.grad = None
        loss_fn().backward()
    return run


def liger_case(label, hr, wr, y):
    """[(label, Liger's fused_linear_cross_entropy forward + backward)], or [] when it is not
    installed (reported, not fatal)."""
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except Exception as e:  # noqa: BLE001
        print("Liger-Kernel unavailable:", repr(e)[:200])
        return []
    return [(label, backward_of(lambda: liger_fused_linear_cross_entropy(hr, wr, y, reduction="sum"), hr, wr))]


def print_rounds(kind, cases, rounds, ratios, h, w, name):
    """The cases in rotated rounds (rounds.py), one line each (report_rounds)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from rounds import median, rotated_rounds
    meds = report_rounds(cases, rotated_rounds([fn for _, fn in cases], rounds), median, ratios)
    (N, H), V = h.shape, w.shape[0]
    for (label, _), med in zip(cases, meds):
        print(f"rounds {kind} {label} N={N} H={H} V={V} on {name}: {med}")


def fwd_bwd_rounds(h, w, y, dz, rounds, name):
    """Forward + backward in rotated rounds (see the module's doc): each case's median, its ratio
    to the four GEMMs', and the peak memory one call adds beyond the outputs (gradients and logp)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import rlk
    import rlk.autograd as ra
    N, H = h.shape
    V = w.shape[0]
    g = torch.Generator(device="cuda").manual_seed(2)
    g_lp = torch.rand(N, device="cuda", generator=g) - 0.5
    gh32 = torch.empty(N, H, device="cuda")
    gw32 = torch.empty(V, H, device="cuda")
    hr = h.detach().clone().requires_grad_(True)
    wr = w.detach().clone().requires_grad_(True)

    def rlk_f32():
        r = rlk.linear_logprob(h, w, y)
        rlk.linear_logprob_backward(h, w, y, r.lse, g_lp, grad_hidden=gh32, grad_weight=gw32)

    cases = [("four cuBLAS GEMMs (fwd, recompute, dH, dW)", loss_gemms(h, w, dz)[1]),
             ("rlk forward + backward, f32 gradients (C calls through Python)", rlk_f32),
             ("rlk linear_token_logprob, autograd, bf16 gradients",
              backward_of(lambda: -ra.linear_token_logprob(hr, wr, y).sum(), hr, wr))]
    cases += liger_case("Liger fused_linear_cross_entropy", hr, wr, y)
    print_rounds("fwd+bwd", cases, rounds, lambda med, m: f"{med / m[0]:.3f}x the four GEMMs", h, w, name)


def loss_gemms(h, w, dz):
    """The cuBLAS floors of the policy loss from hidden states: three GEMMs (fwd, dH, dW) and four
    (with the recompute), as two functions."""
    def three():
        h @ w.t()
        dz @ w
        dz.t() @ h

    def four():
        h @ w.t()
        three()
    return three, four


def loss_rounds_run(h, w, y, dz, rounds, name):
    """The policy loss from hidden states in rotated rounds (see the module's doc): PPO, token-mean
    over a mask, tokens as [8, N / 8]."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import rlk
    N, H = h.shape
    V = w.shape[0]
    B = 8 if N % 8 == 0 else 1
    g = torch.Generator(device="cuda").manual_seed(3)
    old = -5 * torch.rand(B, N // B, device="cuda", generator=g)
    adv = torch.randn(B, N // B, device="cuda", generator=g)
    mask = torch.rand(B, N // B, device="cuda", generator=g) > 0.1
    grads = {p: (torch.empty(N, H, device="cuda"), torch.empty(V, H, device="cuda"))
             for p in ("recompute", "token_chunks")}
    hr = h.detach().clone().requires_grad_(True)
    wr = w.detach().clone().requires_grad_(True)

    def policy(path):
        gh, gw = grads[path]
        return lambda: rlk.linear_policy_loss(h, w, y, old, adv, mask, grad_hidden=gh, grad_weight=gw,
                                              metrics=False, path=path)

    three, four = loss_gemms(h, w, dz)
    cases = [("three cuBLAS GEMMs (fwd, dH, dW)", three), ("four cuBLAS GEMMs", four),
             ("rlk linear_policy_loss, recompute, f32 gradients", policy("recompute")),
             ("rlk linear_policy_loss, token chunks, f32 gradients", policy("token_chunks"))]
    cases += liger_case("Liger fused_linear_cross_entropy (scalar CE)", hr, wr, y)
    print_rounds("loss", cases, rounds,
                 lambda med, m: f"{med / m[0]:.3f}x the three GEMMs, {med / m[1]:.3f}x the four", h, w, name)
    (rh, rw), (ch, cw) = grads["recompute"], grads["token_chunks"]
    for label, a, b in (("grad_hidden", rh, ch), ("grad_weight", rw, cw)):
        d = (a - b).abs().max().item()
        print(f"paths apart: {label} max |recompute - token chunks| {d:.3e} (max |recompute| "
              f"{a.abs().max().item():.3e})")


def fwd_bwd_anchors(h, w, y, iters, name):
    """Forward + backward (gradients of hidden and weight) of each anchor that is installed."""
    N, H = h.shape
    V = w.shape[0]
    hr = h.detach().clone().requires_grad_(True)
    wr = w.detach().clone().requires_grad_(True)

    def torch_loss():
        z = (hr @ wr.t()).float()
        return -(z.gather(1, y[:, None])[:, 0] - torch.logsumexp(z, -1)).sum()

    cases = [("torch autograd (matmul + logsumexp)", torch_loss)]
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
        cases.append(("Liger fused_linear_cross_entropy",
                      lambda: liger_fused_linear_cross_entropy(hr, wr, y, reduction="sum")))
    except Exception as e:  # noqa: BLE001 - an anchor that is not installed is reported, not fatal
        print("Liger-Kernel unavailable:", repr(e)[:200])
    try:
        from cut_cross_entropy import linear_cross_entropy
        cases.append(("cut-cross-entropy (default filtering)",
                      lambda: linear_cross_entropy(hr, wr, y, reduction="sum")))
        cases.append(("cut-cross-entropy (exact: filter_eps=None)",
                      lambda: linear_cross_entropy(hr, wr, y, reduction="sum", filter_eps=None)))
    except Exception as e:  # noqa: BLE001
        print("cut-cross-entropy unavailable:", repr(e)[:200])
    try:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
        import rlk.autograd as ra
        cases.append(("rlk linear_token_logprob (Python autograd)",
                      lambda: -ra.linear_token_logprob(hr, wr, y).sum()))
    except Exception as e:  # noqa: BLE001
        print("rlk unavailable:", repr(e)[:200])
    for label, fn in cases:
        try:
            med, lo, hi, extra = timed_memory(backward_of(fn, hr, wr), iters)
            print(f"fwd+bwd {label} N={N} H={H} V={V} on {name}: median {med:.3f} ms (min {lo:.3f}, "
                  f"max {hi:.3f}), peak extra {extra:.2f} GiB")
        except Exception as e:  # noqa: BLE001
            print(f"fwd+bwd {label}: failed: {e!r}"[:300])


if __name__ == "__main__":
    main()

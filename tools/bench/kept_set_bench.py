"""Kept-set replay's cost: each op that takes a rollout's kept-set threshold, timed with and
without it in the same rounds (the goal: <= 1.05x the plain op). The thresholds are the
sampler's own (rlk.sample with top-k 50 and top-p 0.9 over the same logits), so the replayed
softmax covers what a rollout kept. Before timing, each pair checks that the replay moved the
log-probs (a threshold that kept everything would time the plain path twice).

    python tools/bench/kept_set_bench.py [--shape N,H,V] [--rounds 20] [--json FILE]
        [--device cuda|cpu]

On a GPU: N 8192, H 4096, V 151936, bf16 (the default; logprob over [N, V] bf16 logits). On
the CPU (--device cpu) a small shape against the host backend (correctness of the setup, not
speed). Timing as linear_divergence_bench.py's (tools/bench/rounds.py on a GPU)."""
import json
import math

import torch

from linear_divergence_bench import head_args, rlk, timer


def main():
    a, N, H, V, g = head_args(20, "the fused head's kernels (rlk_linear_logprob_variant)")
    dev = a.device
    dt = torch.bfloat16
    h = torch.randn(N, H, generator=g, device=dev).to(dt)
    w = (torch.randn(V, H, generator=g, device=dev) * (3.0 / math.sqrt(H))).to(dt)
    logits = torch.mm(h, w.t())  # bf16 [N, V]: what logprob reads, and what the rollout sampled from
    drawn = rlk.sample(logits.float(), top_k=50, top_p=0.9, seed=torch.arange(N, device=dev), threshold=True)
    labels, thr = drawn.tokens, drawn.threshold
    B = 8 if N % 8 == 0 else 1  # the loss's [B, T] over hidden's rows
    old = (torch.randn(N, generator=g, device=dev) * 0.1 - 1.0).view(B, -1)
    adv = torch.randn(N, generator=g, device=dev).view(B, -1)
    gl = torch.randn(N, generator=g, device=dev)
    results = {"shape": [N, H, V], "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
               "rlk": rlk.version_string(), "dtype": "bf16", "draw": "top_k 50, top_p 0.9", "ops": {}}
    run = timer(dev, a.rounds)

    def pair(name, fn, check):
        """fn(threshold or None), timed both ways; check(out) -> the f32 log-probs compared."""
        moved = (check(fn(thr)) - check(fn(None))).abs().max().item()
        t_plain, t_kept = run([lambda: fn(None), lambda: fn(thr)])
        row = {"plain ms": t_plain, "kept-set ms": t_kept, "kept / plain": t_kept / t_plain,
               "max |logp change|": moved}
        results["ops"][name] = row
        print(name, json.dumps(row))

    pair("logprob forward", lambda t: rlk.logprob(logits, labels, threshold=t), lambda o: o.logp)
    # the backwards take their own forward's lse (the kept set's with the threshold)
    lse = {t is None: rlk.logprob(logits, labels, threshold=t).lse for t in (None, thr)}
    pair("logprob backward", lambda t: rlk.logprob_backward(logits, labels, lse[t is None], grad_logp=gl,
                                                             threshold=t),
         lambda o: o.float().sum(-1))
    pair("linear_logprob forward", lambda t: rlk.linear_logprob(h, w, labels, threshold=t), lambda o: o.logp)
    lse = {t is None: rlk.linear_logprob(h, w, labels, threshold=t).lse for t in (None, thr)}
    pair("linear_logprob backward", lambda t: rlk.linear_logprob_backward(
        h, w, labels, lse[t is None], grad_logp=gl, threshold=t, grad_dtype="same"),
        lambda o: o[0].float().sum(-1))
    pair("linear_policy_loss", lambda t: rlk.linear_policy_loss(h, w, labels, old, adv, threshold=t, logp=True,
                                                                grad_dtype="same"),
         lambda o: o.logp)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

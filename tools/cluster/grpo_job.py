#!/usr/bin/env python3
"""The kernels of one GRPO training step, as a job runs them, on the host backend (numpy, no
torch) or, with --device cuda, on the GPU (torch tensors on the current CUDA device): sampling
from the LM head's logits, the fused LM head + log-probs forward and backward, token log-probs
from logits, prefix-shared attention forward and backward, group advantages, the token KL and
the policy loss. tools/cluster/kernel_tree.py runs it under RLK_JIT_RECORD to record the job's
configurations, then many times against the precompiled tree.

    python3 tools/cluster/grpo_job.py [--vocab 151936] [--hidden 256] [--head-vocab V]
                                      [--device host|cuda] [--json]

Prints (or, with --json, writes as one JSON line) the seconds from the start of `import rlk` to
the first launch and to the end, and the context's counters (compiles must be 0 on a tree).
With --device cuda, torch is imported and its CUDA context made before the clock starts: a
trainer has both before it first calls rlk, so the figures are rlk's own.
"""
import argparse
import json
import sys
import time

# read before argparse: torch and its CUDA context come before the clock starts
ON_CUDA = "--device=cuda" in sys.argv or ["--device", "cuda"] in [sys.argv[i:i + 2]
                                                                 for i in range(len(sys.argv))]
if ON_CUDA:
    import torch
    torch.zeros(1, device="cuda")

T_START = time.perf_counter()
import numpy as np  # noqa: E402

import rlk  # noqa: E402  (the time to here is the import's)

T_IMPORT = time.perf_counter()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=151936, help="V (Qwen2.5's by default)")
    ap.add_argument("--hidden", type=int, default=256, help="H of the LM head (kept small: the host computes it)")
    ap.add_argument("--head-vocab", type=int, help="the LM head's rows (default --vocab); the head's "
                    "kernels do not depend on it, so a smaller head runs the same kernels sooner")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--device", choices=("host", "cuda"), default="host")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    P, G, V, H = args.prompts, args.group, args.vocab, args.hidden
    B, L, R = P * G, 8, 6                  # sequences, prompt tokens, response tokens
    rng = np.random.default_rng(0)
    f16 = np.float16
    if ON_CUDA:
        def dev(a):
            return torch.from_numpy(np.ascontiguousarray(a)).to("cuda")
    else:
        def dev(a):
            return a

    # sampling: one token per sequence from the LM head's logits (the first launch)
    logits = dev(rng.standard_normal((B, V), dtype=np.float32))
    tok = rlk.sample(logits, temperature=0.7, top_k=50, top_p=0.9, seed=1)
    t_first = time.perf_counter()

    # the fused LM head: log-probs of the responses' tokens from hidden states, and the backward
    n = B * R
    hidden = dev((rng.standard_normal((n, H)) * 0.5).astype(f16))
    vh = args.head_vocab or V
    weight = dev((rng.standard_normal((vh, H)) * 0.05).astype(f16))
    labels = dev(rng.integers(0, vh, n))
    head = rlk.linear_logprob(hidden, weight, labels, entropy=True)
    rlk.linear_logprob_backward(hidden, weight, labels, head.lse, dev(np.ones(n, np.float32)))

    # token log-probs from (reference) logits, forward and backward
    ref_logits = logits[:, :4096].clone() if ON_CUDA else logits[:, :4096].copy()
    ref = rlk.logprob(ref_logits, tok.tokens % 4096, entropy=True)
    rlk.logprob_backward(ref_logits, tok.tokens % 4096, ref.lse, grad_logp=dev(np.ones(B, np.float32)))

    # prefix-shared attention over [prompt | G responses] per prompt, forward and backward
    layout = rlk.prefix_layout([L] * P, [[R] * G] * P)
    q = dev((rng.standard_normal((layout.tokens, 4, 128)) * 0.3).astype(f16))
    kv = dev((rng.standard_normal((layout.tokens, 1, 128)) * 0.3).astype(f16))
    att = rlk.prefix_attention(q, kv, kv, layout)
    rlk.prefix_attention_backward(q, kv, kv, layout, att.out, att.lse, q)

    # advantages, KL and the policy loss
    scores = dev(rng.standard_normal(B).astype(np.float32))
    mask = dev(np.ones((B, R), bool))
    adv = rlk.group_advantage(scores, G)
    logp = head.logp.reshape(B, R)
    old = logp + dev((rng.standard_normal((B, R)) * 0.01).astype(np.float32))
    rlk.token_kl(logp, old, "k3", mask=mask)
    rlk.policy_loss(logp, old, adv, mask, ref_logp=old, kl_coef=1e-3, clip_high=0.28,
                    entropy=head.entropy.reshape(B, R), entropy_coef=0.0)
    if ON_CUDA:
        torch.cuda.synchronize()  # the job's launches ran (a fault shows here, not at exit)
    t_end = time.perf_counter()

    c = rlk.context("cuda" if ON_CUDA else "host").counters()
    out = {"import_s": round(T_IMPORT - T_START, 4), "first_launch_s": round(t_first - T_START, 4),
           "job_s": round(t_end - T_START, 4), "compiles": c["compiles"],
           "disk_hits": c["disk_hits"], "lookups": c["calls"]}
    print(json.dumps(out) if args.json else
          "import %.3f s, first launch %.3f s, job %.3f s; %d compiles, %d kernels from the cache" % (
              out["import_s"], out["first_launch_s"], out["job_s"], out["compiles"], out["disk_hits"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

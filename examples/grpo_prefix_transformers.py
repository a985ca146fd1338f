#!/usr/bin/env python3
"""A GRPO group's response log-probs from a transformers causal LM (Qwen2 architecture, random
weights: nothing is downloaded), computed two ways:

  replicated  every response as [prompt; response], SDPA attention (what trainers do today)
  shared      the group packed as [prompt | r_1 | ... | r_G], the prompt processed once,
              rlk's prefix-shared attention ("rlk_prefix" in transformers' registry)

It checks that the two agree within bf16 rounding (log-probs and the parameters' gradients of a
loss over them) and times forward + backward of each. Runs on CUDA when present, else on the CPU
(rlk's host backend).

    python examples/grpo_prefix_transformers.py --prompts 2 --group 16 --prefix 1024 --response 256
"""
import argparse
import time

import torch
import transformers

from rlk.integrations import transformers as rtf


def build_model(args, device):
    torch.manual_seed(args.seed)
    cfg = transformers.Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.heads * 64, intermediate_size=args.heads * 64 * 3,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=max(1, args.heads // 4), head_dim=64,
        max_position_embeddings=args.prefix + args.response + 8)
    return transformers.Qwen2ForCausalLM(cfg).to(device=device, dtype=torch.bfloat16)


def replicated(model, prompts, responses):
    """One padded-free batch per prompt: its G [prompt; response] rows (equal lengths)."""
    out = []
    for p, rs in zip(prompts, responses):
        ids = torch.stack([torch.cat([p, r]) for r in rs])
        logits = model(input_ids=ids, use_cache=False).logits.float()
        lp = torch.log_softmax(logits[:, len(p) - 1:-1], -1)
        out.append(lp.gather(2, torch.stack(rs)[:, :, None])[:, :, 0])
    return torch.cat([x.flatten() for x in out])


def shared(model, prompts, responses):
    lps = rtf.response_logprobs(model, prompts, responses)
    return torch.cat([x for g in lps for x in g])


def step(model, fn, prompts, responses, weights):
    model.zero_grad(set_to_none=True)
    lp = fn(model, prompts, responses)
    (lp * weights).sum().backward()
    return lp.detach()


def timed(model, fn, prompts, responses, weights, device, iters):
    step(model, fn, prompts, responses, weights)  # warm-up (first compiles, allocator)
    if device.type == "cuda":
        torch.cuda.synchronize()
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(iters):
            t0.record()
            step(model, fn, prompts, responses, weights)
            t1.record()
            torch.cuda.synchronize()
            times.append(t0.elapsed_time(t1))
    else:
        times = []
        for _ in range(iters):
            s = time.perf_counter()
            step(model, fn, prompts, responses, weights)
            times.append(1e3 * (time.perf_counter() - s))
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prefix", type=int, default=64)
    ap.add_argument("--response", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4, help="query heads (head dim 64; KV heads / 4)")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)

    rtf.register()
    model = build_model(args, device)
    g = torch.Generator().manual_seed(args.seed + 1)
    prompts = [torch.randint(0, args.vocab, (args.prefix,), generator=g).to(device)
               for _ in range(args.prompts)]
    responses = [[torch.randint(0, args.vocab, (args.response,), generator=g).to(device)
                  for _ in range(args.group)] for _ in range(args.prompts)]
    n = args.prompts * args.group * args.response
    weights = torch.linspace(-1.0, 1.0, n, device=device)

    results = {}
    for name, impl, fn in (("replicated", "sdpa", replicated), ("shared", rtf.NAME, shared)):
        model.set_attn_implementation(impl)
        lp = step(model, fn, prompts, responses, weights)
        grad = torch.cat([p.grad.float().flatten() for p in model.parameters()])
        ms = timed(model, fn, prompts, responses, weights, device, args.iters)
        results[name] = (lp, grad, ms)

    (lr, gr, tr), (ls, gs, ts) = results["replicated"], results["shared"]
    err = (ls - lr).abs().max().item()
    rel = ((gs - gr).norm() / gr.norm()).item()
    print("model: Qwen2 %d layers, %d heads x 64, bf16, %s; %d prompts x %d responses, prefix %d, "
          "response %d" % (args.layers, args.heads, device, args.prompts, args.group, args.prefix,
                           args.response))
    print("tokens: replicated %d, shared %d" % (args.prompts * args.group * (args.prefix + args.response),
                                                 args.prompts * (args.prefix + args.group * args.response)))
    print("forward + backward (median of %d): replicated %.2f ms, shared %.2f ms (%.2fx)"
          % (args.iters, tr, ts, tr / ts))
    print("max |logp shared - replicated| %.3g; gradient relative difference %.3g" % (err, rel))
    ok = err < 0.2 and rel < 0.1
    print("shared and replicated %s" % ("agree" if ok else "DISAGREE"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

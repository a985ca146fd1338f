#!/usr/bin/env python3
"""A GRPO step on a transformers causal LM (Qwen2 architecture, random weights: nothing is
downloaded) with the LM head fused with the log-softmax, beside the plain model:

  plain  model(...).logits -> log_softmax -> gather   (the [B, T, V] logits stored, twice in bf16
                                                        and f32, and their gradient)
  fused  rlk.integrations.transformers.token_logprobs (rlk_linear_logprob and its backward: the
                                                        logits never stored)

Both feed the same group advantages (rlk.group_advantage) and policy loss
(rlk.autograd.policy_loss). The example checks that the loss and every parameter's gradient
agree within bf16 rounding and times forward + backward of each (and the peak memory on CUDA).
Runs on CUDA when present, else on the CPU (rlk's host backend).

    python examples/fused_lm_head_transformers.py --batch 16 --tokens 1024 --vocab 151936
"""
import argparse
import time

import torch
import transformers

import rlk
from rlk import autograd as rag
from rlk.integrations import transformers as rtf


def build_model(args, device):
    torch.manual_seed(args.seed)
    cfg = transformers.Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 256), head_dim=64,
        max_position_embeddings=args.tokens + 8)
    return transformers.Qwen2ForCausalLM(cfg).to(device=device, dtype=torch.bfloat16)


def plain_logprobs(model, ids, labels_mask):
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(2, ids[:, 1:, None])[..., 0] * labels_mask


def fused_logprobs(model, ids, labels_mask):
    return rtf.token_logprobs(model, ids, labels_mask=labels_mask)


def grpo_step(model, logprobs_fn, batch):
    ids, labels_mask, old_logp, advantages = batch
    model.zero_grad(set_to_none=True)
    logp = logprobs_fn(model, ids, labels_mask)
    loss, _ = rag.policy_loss(logp, old_logp, advantages, labels_mask.bool(), clip_low=0.2,
                              clip_high=0.28, scalar_loss=True)
    loss.backward()
    return loss.detach()


def timed(model, fn, batch, device, iters):
    grpo_step(model, fn, batch)  # warm-up (first compiles, the allocator)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            grpo_step(model, fn, batch)
            t1.record()
            torch.cuda.synchronize()
            times.append(t0.elapsed_time(t1))
        else:
            s = time.perf_counter()
            grpo_step(model, fn, batch)
            times.append(1e3 * (time.perf_counter() - s))
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return sorted(times)[len(times) // 2], peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8, help="sequences (groups of --group)")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48, help="prompt + response tokens a sequence")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)

    model = build_model(args, device)
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, args.vocab, (args.batch, args.tokens), generator=g).to(device)
    labels_mask = torch.zeros(args.batch, args.tokens - 1, device=device)
    labels_mask[:, args.prompt - 1:] = 1  # response tokens only
    with torch.no_grad():
        old_logp = fused_logprobs(model, ids, labels_mask)
        old_logp = old_logp + 0.05 * torch.randn(old_logp.shape, generator=g).to(device)
        rewards = torch.randint(0, 2, (args.batch,), generator=g).float().to(device)
        adv = rlk.group_advantage(rewards, args.group)[:, None].expand(-1, args.tokens - 1).contiguous()
    batch = (ids, labels_mask, old_logp, adv)

    results = {}
    for name, fn in (("plain", plain_logprobs), ("fused", fused_logprobs)):
        loss = grpo_step(model, fn, batch)
        grad = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
        ms, peak = timed(model, fn, batch, device, args.iters)
        results[name] = (loss, grad, ms, peak)

    (lp_, gp, tp, mp), (lf, gf, tf, mf) = results["plain"], results["fused"]
    err = abs(lf.item() - lp_.item())
    rel = ((gf - gp).norm() / gp.norm()).item()
    print("model: Qwen2 %d layers, hidden %d, vocab %d, bf16, %s; %d x %d tokens" % (
        args.layers, args.hidden, args.vocab, device, args.batch, args.tokens))
    print("GRPO step forward + backward (median of %d): plain %.2f ms, fused %.2f ms (%.2fx)" % (
        args.iters, tp, tf, tp / tf))
    if device.type == "cuda":
        print("peak memory: plain %.2f GiB, fused %.2f GiB" % (mp, mf))
    print("|loss fused - plain| %.3g; gradient relative difference %.3g" % (err, rel))
    ok = err < 1e-2 * max(1.0, abs(lp_.item())) and rel < 0.03
    print("fused and plain %s" % ("agree" if ok else "DISAGREE"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

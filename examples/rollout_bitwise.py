"""Rollout log-probs that the trainer reproduces bit for bit.

A small Qwen2-architecture model (random weights) decodes a batch of prompts with its KV cache,
each step's tokens drawn by rlk.linear_sample from the last hidden states and the LM head
(temperature, top-k, top-p, a seed per request). Then the trainer scores every sampled token with
rlk.linear_logprob, all of them in one shuffled batch: every log-prob equals the rollout's, bit
for bit. With the rollout's thresholds (kept-set replay) the trainer's log-probs are over the
kept sets the rollout sampled from (checked against an fp64 computation of that distribution),
and the importance ratio's mean is 1 rather than the kept mass. Beside it, what a rollout engine
usually computes: logits from a bf16 matmul and their log-softmax, against the trainer's f32
head: the log-probs differ.

    python examples/rollout_bitwise.py --device cpu
"""
import argparse

import torch
import transformers

import rlk
from rlk.integrations import rollout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--temperature", type=float, default=0.8)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=4096, hidden_size=256, intermediate_size=512,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=64, tie_word_embeddings=False)
    model = transformers.Qwen2ForCausalLM(cfg).to(device=args.device, dtype=torch.bfloat16).eval()
    B, T, temp = args.prompts, args.steps, args.temperature
    prompts = torch.randint(0, cfg.vocab_size, (B, 12), device=args.device)
    seeds = torch.randint(0, 2 ** 62, (B,), device=args.device)

    out = rollout.decode(model, prompts, T, temperature=temp, top_k=64, top_p=0.9, seeds=seeds)
    perm = torch.randperm(B * T, device=args.device)
    hidden, tokens = out.hidden.reshape(B * T, -1)[perm], out.tokens.reshape(-1)[perm]
    weight = rollout.head_weight(model)
    plain = rlk.linear_logprob(hidden, weight, tokens, temperature=temp)
    equal = (plain.logp.view(torch.int32) == out.logp.reshape(-1)[perm].view(torch.int32)).float().mean()
    print("trainer vs rollout (rlk.linear_sample): %.1f%% of %d log-probs bitwise equal"
          % (100 * equal.item(), B * T))

    kept = rlk.linear_logprob(hidden, weight, tokens, temperature=temp,
                              threshold=out.threshold.reshape(-1)[perm])
    # the distribution the rollout drew from, in fp64: the logits whose f32 value (what the
    # sampler compared) is at or above the row's threshold, and the drawn token (a GPU's f32 dot
    # product may round the other way from fp64's), renormalized at the temperature
    z = hidden.double() @ weight.double().T
    keep = z.float() >= out.threshold.reshape(-1)[perm, None]
    keep[torch.arange(B * T, device=args.device), tokens] = True
    z = z.masked_fill(~keep, -float("inf"))
    drawn = torch.log_softmax(z / temp, -1).gather(1, tokens[:, None])[:, 0]
    print("importance ratio trainer / rollout: full vocabulary mean %.3f (the kept mass), "
          "kept-set replay mean %.6f" % (torch.exp(plain.logp - drawn).mean().item(),
                                          torch.exp(kept.logp.double() - drawn).mean().item()))

    # what an engine usually does: bf16 logits from a matmul, torch's sampler, the trainer's head
    logits = (hidden @ weight.T).float() / temp
    engine = torch.log_softmax(logits, -1).gather(1, tokens[:, None])[:, 0]
    diff = (engine - plain.logp).abs()
    print("bf16 matmul logits vs the trainer's f32 head: %.1f%% bitwise equal, max |diff| %.2e"
          % (100 * (diff == 0).float().mean().item(), diff.max().item()))


if __name__ == "__main__":
    main()

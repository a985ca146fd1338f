"""How far each LM head's token log-probs are from an fp64 head's, on the same 16-bit inputs.

The heads: rlk's fused head (rlk.linear_logprob: logits accumulated in f32 registers, never
rounded to 16 bits), torch's bf16 head (h @ W^T in bf16, then log_softmax in f32: what a trainer
does without a fused head), and torch's f32-cast head (h and W cast to f32, h @ W^T in f32:
TRL's cast_lm_head_to_fp32). The reference is the fp64 head on the same bf16 h and W, so each
error is the head's own arithmetic.

Hidden states: the final hidden states of a random Qwen2-architecture model (transformers,
random weights, nothing downloaded) on random token ids, and synthetic heavy-tailed ones (a
Student-t with 3 degrees of freedom per element, scaled to the model's RMS, a few outlier
channels 30x larger, as trained LLMs have). The head's weight: N(0, 0.02^2) (Qwen2's init) in
bf16. For each head and each set: the largest and the mean absolute error of the log-probs of
sampled labels (drawn from the fp64 softmax, as a rollout would), and the largest error of the
entropy. Writes JSON (--json) and prints a table.

Usage: python3 head_accuracy.py [--vocab 151936] [--hidden 896] [--tokens 4096] [--device cuda]
                                [--json out.json]
On the CPU (--device cpu) rlk runs its host backend, which computes in fp64: its row is then the
reference against itself, and only torch's heads say something.
"""
import argparse
import json
import math
import sys
import time

import torch


def fp64_head(h, w, labels):
    z = h.double() @ w.double().T
    lp = torch.log_softmax(z, dim=-1)
    ent = -(lp.exp() * lp).sum(-1)
    return lp.gather(-1, labels[:, None])[:, 0], ent


def torch_head(h, w, labels, dtype):
    z = (h.to(dtype) @ w.to(dtype).T).float()
    lp = torch.log_softmax(z, dim=-1)
    ent = -(lp.exp() * lp).sum(-1)
    return lp.gather(-1, labels[:, None])[:, 0], ent


def rlk_head(h, w, labels):
    import rlk
    out = rlk.linear_logprob(h, w, labels, entropy=True)
    return out.logp, out.entropy


def chunks(n, size):
    return [(i, min(i + size, n)) for i in range(0, n, size)]


def errors(head, h, w, labels, ref_lp, ref_ent, rows):
    worst_lp = mean_lp = worst_ent = 0.0
    for a, b in chunks(h.shape[0], rows):
        lp, ent = head(h[a:b], w, labels[a:b])
        d = (lp.double() - ref_lp[a:b]).abs()
        worst_lp = max(worst_lp, d.max().item())
        mean_lp += d.sum().item()
        worst_ent = max(worst_ent, (ent.double() - ref_ent[a:b]).abs().max().item())
    return {"max_abs_logp": worst_lp, "mean_abs_logp": mean_lp / h.shape[0], "max_abs_entropy": worst_ent}


def model_hidden(n, hidden, device, seed):
    """Final hidden states (after the last norm) of a random Qwen2-shaped model."""
    from transformers import Qwen2Config, Qwen2Model
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=32000, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=4,
                      num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128),
                      max_position_embeddings=4096)
    model = Qwen2Model(cfg).to(device=device, dtype=torch.bfloat16).eval()
    seq = 512
    out = []
    with torch.no_grad():
        for _ in range((n + seq - 1) // seq):
            ids = torch.randint(0, cfg.vocab_size, (1, seq), device=device)
            out.append(model(input_ids=ids).last_hidden_state[0])
    return torch.cat(out)[:n].contiguous()


def heavy_tailed(n, hidden, rms, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = torch.distributions.StudentT(3.0)
    x = t.sample((n, hidden)).float()
    x[:, torch.randperm(hidden, generator=g)[:4]] *= 30.0
    x *= rms / x.pow(2).mean().sqrt()
    return x.to(device=device, dtype=torch.bfloat16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", type=int, default=1024, help="rows a head call takes (bounds the logits' memory)")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = args.device
    torch.manual_seed(args.seed)
    w = (0.02 * torch.randn(args.vocab, args.hidden)).to(device=dev, dtype=torch.bfloat16)
    sets = {}
    try:
        sets["qwen2-random-final-hidden"] = model_hidden(args.tokens, args.hidden, dev, args.seed)
    except ImportError as e:
        print("skipping the model's hidden states: %s" % e, file=sys.stderr)
    rms = sets["qwen2-random-final-hidden"].float().pow(2).mean().sqrt().item() if sets else 1.0
    sets["heavy-tailed-t3"] = heavy_tailed(args.tokens, args.hidden, rms, dev, args.seed)
    heads = {"rlk fused (bf16 in, f32 acc)": rlk_head,
             "torch bf16 head": lambda h, w_, y: torch_head(h, w_, y, torch.bfloat16),
             "torch f32-cast head": lambda h, w_, y: torch_head(h, w_, y, torch.float32)}
    result = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
              "vocab": args.vocab, "hidden": args.hidden, "tokens": args.tokens, "sets": {}}
    for name, h in sets.items():
        ref_lp, ref_ent, labels = [], [], []
        for a, b in chunks(h.shape[0], args.rows):
            z = h[a:b].double() @ w.double().T
            p = torch.softmax(z, dim=-1)
            y = torch.multinomial(p.float(), 1)[:, 0]
            lp, ent = fp64_head(h[a:b], w, y)
            ref_lp.append(lp)
            ref_ent.append(ent)
            labels.append(y)
        ref_lp, ref_ent, labels = torch.cat(ref_lp), torch.cat(ref_ent), torch.cat(labels)
        row = {"hidden_rms": h.float().pow(2).mean().sqrt().item(), "hidden_max": h.float().abs().max().item()}
        for hname, head in heads.items():
            row[hname] = errors(head, h, w, labels, ref_lp, ref_ent, args.rows)
        result["sets"][name] = row
    print("%-28s %-30s %14s %14s %14s" % ("hidden states", "head", "max|dlogp|", "mean|dlogp|", "max|dH|"))
    for name, row in result["sets"].items():
        for hname in heads:
            e = row[hname]
            print("%-28s %-30s %14.3e %14.3e %14.3e" % (name, hname, e["max_abs_logp"], e["mean_abs_logp"],
                                                       e["max_abs_entropy"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

"""PyTorch baselines for group advantages, timed on the GPU beside rlk-bench in the same run.

  vectorized: view [B/G, G], mean and unbiased std over the group, (s - mean) / (std + eps)
  dict loop:  what verl's compute_grpo_outcome_advantage does: Python lists per prompt id,
              per-group stack/mean/std, then a per-sample loop writing the output.
Device-event medians after warm-up; prints one line per case and writes JSON with --json.
"""
import argparse
import json
from collections import defaultdict

import torch

from event_timing import timed


def grpo_vectorized(scores, G, eps=1e-6):
    """What a vectorized torch trainer writes: [B/G, G] view, mean and unbiased std per row."""
    s = scores.view(-1, G)
    return ((s - s.mean(-1, keepdim=True)) / (s.std(-1, keepdim=True) + eps)).view(-1)


def grpo_dict_loop(scores, G, eps=1e-6):
    """verl's compute_grpo_outcome_advantage: Python lists keyed by prompt id, per-group
    stack/mean/std, then one indexed write per sample."""
    B = scores.shape[0]
    ids = [i // G for i in range(B)]
    members = defaultdict(list)
    for i in range(B):
        members[ids[i]].append(scores[i])
    mean, std = {}, {}
    for k, v in members.items():
        t = torch.stack(v)
        mean[k], std[k] = t.mean(), t.std()
    out = scores.clone()
    for i in range(B):
        out[i] = (scores[i] - mean[ids[i]]) / (std[ids[i]] + eps)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = "cuda"
    B, G, eps = 1024, 16, 1e-6
    scores = torch.randn(B, device=dev)

    def vectorized():
        return grpo_vectorized(scores, G, eps)

    def dict_loop():
        return grpo_dict_loop(scores, G, eps)

    # agree before timing: the baselines compute the same thing
    assert torch.allclose(vectorized(), dict_loop(), atol=1e-5)
    rows = {}
    rows[f"torch vectorized grpo B={B} G={G}"] = timed(vectorized, 20, 200)
    rows[f"torch verl dict loop grpo B={B} G={G}"] = timed(dict_loop, 1, 5)
    for name, (med, mn, mx) in rows.items():
        print(f"{name:58s} {med:12.5f} {mn:12.5f} {mx:12.5f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "results": [{"name": k, "median_ms": v[0], "min_ms": v[1], "max_ms": v[2]}
                                   for k, v in rows.items()]}, f, indent=1)


if __name__ == "__main__":
    main()

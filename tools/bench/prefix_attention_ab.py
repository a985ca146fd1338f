"""rlk's prefix attention alone at the bench's three shapes (main, G 8, G 1): forward, forward +
backward (event-timed medians) and the kernels' CUDA times, rows labelled LABEL. For same-run
comparisons of two builds: run it once per library, alternating (RLK_LIBRARY and PYTHONPATH of
each build's tree), e.g.

    RLK_LIBRARY=$PWD/build/lib/librlk.so.0 PYTHONPATH=python python3 tools/bench/prefix_attention_ab.py new1
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import prefix_attention_bench as pb  # noqa: E402
import rlk  # noqa: E402


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "rlk"
    for (G, Lp, Lr, P) in ((16, 4096, 512, 1), (8, 1024, 1024, 1), (1, 4096, 512, 16)):
        Hq, Hkv, D = 32, 8, 128
        case = "%s G%d (%d+%d)x%d" % (label, G, Lp, Lr, P)
        lay = rlk.prefix_layout([Lp] * P, [[Lr] * G] * P)
        T = lay.tokens
        torch.manual_seed(1)
        q, k, v = (torch.randn(T, h, D, device="cuda", dtype=torch.bfloat16) for h in (Hq, Hkv, Hkv))
        do = torch.randn(T, Hq, D, device="cuda", dtype=torch.bfloat16)
        f, fb, _ = pb.rlk_calls(q, k, v, do, lay)
        f()
        fb()
        torch.cuda.synchronize()
        pb.row(case + " fwd", "rlk", pb.bench(f, 10))
        pb.row(case + " fwd+bwd", "rlk", pb.bench(fb, 6))
        pb.kernel_times(case, fb)


if __name__ == "__main__":
    main()

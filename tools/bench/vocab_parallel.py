"""Vocab-parallel token log-probs and entropy: rlk (one all-gather of [N, 4] f32 records, then a
combine in rank order) beside a PyTorch implementation of Megatron's vocab-parallel cross entropy
(all_reduce MAX of the row max, all_reduce SUM of the target logit and of the sum of exp) with
verl's vocab-parallel entropy (one more all_reduce SUM of sum p z). Forward only, bf16 logits,
N = 16384, V = 151936 split evenly over the ranks (--tokens / --vocab override).

  torchrun --nproc_per_node=2 tools/bench/vocab_parallel.py     two GPUs, NCCL (the real case)
  python3 tools/bench/vocab_parallel.py --simulate 2            one GPU: the shards in one process,
                                                                and rlk's NCCL call on a 1-rank group

Distributed mode checks, then times (CUDA-event median of --iters after warm-up, per rank):
  rlk-group   rlk.vocab_parallel_logprob(group=...): torch's all_gather_into_tensor of the records
  rlk-nccl    rlk.vocab_parallel_logprob_nccl: rlk_logprob_vocab_parallel, rlk's own ncclAllGather
              on the group's communicator (libnccl found in the process, PyTorch's copy)
  megatron    the torch implementation below (3 all-reduces with the entropy, 2 without)
Checks: both rlk paths give bitwise the same logp / lse / entropy on every rank and equal each
other; they match the unsharded rlk.logprob on the whole row and the Megatron path to 2e-3.
Needs PYTHONPATH=python and RLK_LIBRARY (or an installed rlk). Prints a table; --json writes it.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

import torch
import torch.distributed as dist

import rlk
from event_timing import event_times


def timed(fn, warmup, iters):
    return statistics.median(event_times(lambda _: fn(), warmup, iters))


def megatron_logprob(shard, labels, vocab_start, group, entropy=True):
    """Megatron's _VocabParallelCrossEntropy forward (negated: log-probs), with verl's
    _VocabParallelEntropy on the same statistics. Ignored labels (< 0) get logp 0."""
    z = shard.float()
    m = z.max(dim=-1).values
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    z.sub_(m.unsqueeze(-1))
    vs = z.shape[1]
    owned = (labels >= vocab_start) & (labels < vocab_start + vs)
    idx = torch.where(owned, labels - vocab_start, torch.zeros_like(labels))
    t = z.gather(1, idx.unsqueeze(-1)).squeeze(-1) * owned
    e = z.exp()
    sumexp = e.sum(dim=-1)
    dist.all_reduce(t, group=group)
    dist.all_reduce(sumexp, group=group)
    logsum = sumexp.log()
    logp = torch.where(labels < 0, torch.zeros_like(t), t - logsum)
    if not entropy:
        return logp, None
    szp = (e * z).sum(dim=-1)
    dist.all_reduce(szp, group=group)
    return logp, logsum - szp / sumexp


def make_inputs(N, V, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    full = (torch.randn(N, V, generator=g, device="cuda") * 3).to(torch.bfloat16)
    labels = torch.randint(0, V, (N,), generator=g, device="cuda")
    labels[::97] = -100
    return full, labels


def max_err(a, b):
    ok = torch.isfinite(b)
    return (a[ok].double() - b[ok].double()).abs().max().item()


def distributed(args):
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    dist.all_reduce(torch.zeros(1, device="cuda"))  # the communicator exists from here on
    N, V = args.tokens, args.vocab
    full, labels = make_inputs(N, V)
    w = V // world
    v0 = rank * w
    v1 = V if rank == world - 1 else v0 + w
    shard = full[:, v0:v1]
    comm = rlk.nccl_comm_of(group)

    a = rlk.vocab_parallel_logprob(shard, labels, v0, group=group, entropy=True)
    b = rlk.vocab_parallel_logprob_nccl(shard, labels, v0, comm, entropy=True)
    ref = rlk.logprob(full, labels, entropy=True)
    meg = megatron_logprob(shard, labels, v0, group)
    torch.cuda.synchronize()
    checks = {}
    for name, x, y in (("logp", a.logp, b.logp), ("lse", a.lse, b.lse), ("entropy", a.entropy, b.entropy)):
        checks["group==nccl " + name] = bool(torch.equal(x.view(torch.int32), y.view(torch.int32)))
        everyone = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(everyone, x)
        checks["same on every rank " + name] = all(torch.equal(e.view(torch.int32), x.view(torch.int32))
                                                   for e in everyone)
    errs = {"vs unsharded logp": max_err(a.logp, ref.logp), "vs unsharded entropy": max_err(a.entropy, ref.entropy),
            "vs megatron logp": max_err(a.logp, meg[0]), "vs megatron entropy": max_err(a.entropy, meg[1])}
    ok = all(checks.values()) and all(v <= 2e-3 for v in errs.values())

    rows = {
        "rlk-group": timed(lambda: rlk.vocab_parallel_logprob(shard, labels, v0, group=group, entropy=True),
                           args.warmup, args.iters),
        "rlk-nccl": timed(lambda: rlk.vocab_parallel_logprob_nccl(shard, labels, v0, comm, entropy=True),
                          args.warmup, args.iters),
        "megatron": timed(lambda: megatron_logprob(shard, labels, v0, group), args.warmup, args.iters),
        "megatron (no entropy)": timed(lambda: megatron_logprob(shard, labels, v0, group, entropy=False),
                                       args.warmup, args.iters),
        "rlk unsharded, whole V, one GPU": timed(lambda: rlk.logprob(full, labels, entropy=True),
                                                 args.warmup, args.iters),
    }
    if rank == 0:
        report(args, {"mode": "nccl", "world": world, "N": N, "V": V, "ok": ok, "checks": checks,
                      "errors": errs, "ms": rows})
    dist.destroy_process_group()
    return 0 if ok else 1


def simulate(args):
    """One GPU: P shards in one process (the records gathered by a copy), and rlk's own NCCL
    path on a 1-rank NCCL group (P = 1: a real ncclAllGather through the process's libnccl)."""
    P, N, V = args.simulate, args.tokens, args.vocab
    full, labels = make_inputs(N, V)
    edges = [V * r // P for r in range(P + 1)]
    shards = [full[:, edges[r]:edges[r + 1]] for r in range(P)]
    ref = rlk.logprob(full, labels, entropy=True)
    gathered = torch.empty((P, N, 4), dtype=torch.float32, device="cuda")

    def records():
        for r in range(P):
            rlk.logprob_partials(shards[r], labels, edges[r], entropy=True, partials=gathered[r])

    records()
    outs = [rlk.logprob_combine(gathered.clone(), labels, entropy=True) for _ in range(P)]
    torch.cuda.synchronize()
    checks = {"same on every simulated rank": all(
        torch.equal(o.logp.view(torch.int32), outs[0].logp.view(torch.int32))
        and torch.equal(o.entropy.view(torch.int32), outs[0].entropy.view(torch.int32)) for o in outs)}
    errs = {"vs unsharded logp": max_err(outs[0].logp, ref.logp),
            "vs unsharded lse": max_err(outs[0].lse, ref.lse),
            "vs unsharded entropy": max_err(outs[0].entropy, ref.entropy)}

    fd, path = tempfile.mkstemp(prefix="rlk-nccl-")
    os.close(fd)
    os.unlink(path)
    try:
        dist.init_process_group("nccl", init_method="file://" + path, rank=0, world_size=1)
        dist.all_reduce(torch.zeros(1, device="cuda"))
        comm = rlk.nccl_comm_of()
        version, lib = rlk.nccl_version()
        one = rlk.vocab_parallel_logprob_nccl(full, labels, 0, comm, entropy=True)
        torch.cuda.synchronize()
        checks["nccl P=1: lse bitwise the unsharded op's"] = bool(torch.equal(one.lse.view(torch.int32),
                                                                              ref.lse.view(torch.int32)))
        errs["nccl P=1 logp"] = max_err(one.logp, ref.logp)
        nccl_ms = timed(lambda: rlk.vocab_parallel_logprob_nccl(full, labels, 0, comm, entropy=True),
                        args.warmup, args.iters)
        nccl_note = "libnccl %d from %s" % (version, lib)
    except Exception as e:  # reported, not fatal: the simulation above stands alone
        checks["nccl P=1 ran"] = False
        nccl_ms, nccl_note = float("nan"), "failed: %r" % (e,)
    ok = all(checks.values()) and all(v <= 2e-3 for v in errs.values())

    rows = {
        "rlk_logprob unsharded (whole V)": timed(lambda: rlk.logprob(full, labels, entropy=True),
                                                 args.warmup, args.iters),
        "one shard's records (V/%d)" % P: timed(
            lambda: rlk.logprob_partials(shards[0], labels, 0, entropy=True, partials=gathered[0]),
            args.warmup, args.iters),
        "combine of %d records" % P: timed(lambda: rlk.logprob_combine(gathered, labels, entropy=True),
                                           args.warmup, args.iters),
        "all %d shards' records + combine" % P: timed(
            lambda: (records(), rlk.logprob_combine(gathered, labels, entropy=True)), args.warmup, args.iters),
        "rlk-nccl P=1 (records, all-gather, combine)": nccl_ms,
    }
    report(args, {"mode": "simulate", "P": P, "N": N, "V": V, "ok": ok, "checks": checks,
                  "errors": errs, "ms": rows, "nccl": nccl_note})
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if ok else 1


def report(args, res):
    print("vocab-parallel logprob (%s), N=%d V=%d bf16, entropy on" % (res["mode"], res["N"], res["V"]))
    for k, v in res["checks"].items():
        print("  check %-45s %s" % (k, "ok" if v else "FAILED"))
    for k, v in res["errors"].items():
        print("  max |err| %-41s %.3g" % (k, v))
    if "nccl" in res:
        print("  %s" % res["nccl"])
    for k, v in res["ms"].items():
        print("  %-48s %8.3f ms" % (k, v))
    print("  result: %s" % ("ok" if res["ok"] else "FAILED"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--simulate", type=int, default=0, help="P shards on one GPU")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.simulate:
        return simulate(args)
    if "WORLD_SIZE" not in os.environ:
        print("run under torchrun (--nproc_per_node=2), or with --simulate P", file=sys.stderr)
        return 2
    return distributed(args)


if __name__ == "__main__":
    sys.exit(main())

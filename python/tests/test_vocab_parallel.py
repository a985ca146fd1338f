"""rlk.vocab_parallel_logprob and its pieces: P shards simulated in one process (records,
all-gather, a combine per rank: bitwise equal, against fp64 references of the whole row), the
shard backward, bad labels; and two real processes over torch.distributed (gloo, CPU tensors on
the host backend), forward and autograd backward against torch on the whole vocabulary."""
import os
import tempfile

import numpy as np
import pytest

import refs
import rlk
from conftest import HAVE_TORCH

if HAVE_TORCH:
    import torch

pytestmark = pytest.mark.skipif(not rlk.OPS["logprob_combine"].available(),
                                reason="the loaded librlk has no rlk_logprob_combine")


def close(got, want, tol=1e-5):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape
    ok = np.isfinite(want)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    err = np.abs(got[ok] - want[ok]).max() if ok.any() else 0.0
    assert err <= tol * max(1.0, np.abs(want[ok]).max()), "err %g" % err


def shard_edges(V, P, rng):
    cuts = [0] + sorted(int(V * r // P + rng.integers(-3, 4)) for r in range(1, P)) + [V]
    return cuts


def make(rng, N, V, edges):
    logits = (rng.standard_normal((N, V)) * 3).astype(np.float32)
    labels = rng.integers(0, V, N).astype(np.int64)
    for i, e in enumerate(edges[1:-1]):
        labels[(2 * i) % N] = e - 1
        labels[(2 * i + 1) % N] = e
    labels[-1] = -100
    return logits, labels


@pytest.mark.parametrize("P", [2, 4, 8])
def test_simulated_ranks(place, rng, P):
    N, V = 29, 777
    edges = shard_edges(V, P, rng)
    logits, labels = make(rng, N, V, edges)
    parts = [rlk.logprob_partials(place.to(logits[:, edges[r]:edges[r + 1]]), place.to(labels),
                                  edges[r], temperature=0.8, entropy=True) for r in range(P)]
    gathered = np.stack([place.back(p) for p in parts])
    outs = []
    for rank in range(P):
        status = place.to(np.zeros(1, np.int32))
        out = rlk.vocab_parallel_logprob(
            place.to(logits[:, edges[rank]:edges[rank + 1]]), place.to(labels), edges[rank],
            all_gather=lambda mine, g=gathered: place.to(g), temperature=0.8, entropy=True,
            status=status)
        outs.append([place.back(x) for x in out])
        assert place.back(status)[0] == 0
    for rank in range(1, P):
        for a, b in zip(outs[rank], outs[0]):
            assert a.tobytes() == b.tobytes()
    logp, lse, ent, _, _ = refs.logprob(logits, labels, 0.8)
    close(outs[0][0], logp)
    close(outs[0][1], lse)
    close(outs[0][2], ent)
    assert outs[0][0][-1] == 0.0


def test_shard_backward(place, rng):
    N, V, P = 17, 300, 3
    edges = shard_edges(V, P, rng)
    logits, labels = make(rng, N, V, edges)
    parts = np.stack([place.back(rlk.logprob_partials(
        place.to(logits[:, edges[r]:edges[r + 1]]), place.to(labels), edges[r], temperature=1.3,
        entropy=True)) for r in range(P)])
    out = rlk.logprob_combine(place.to(parts), place.to(labels), entropy=True)
    g_lp = rng.standard_normal(N).astype(np.float32)
    g_h = rng.standard_normal(N).astype(np.float32)
    grads = [place.back(rlk.logprob_backward(
        place.to(logits[:, edges[r]:edges[r + 1]]), place.to(labels), out.lse, place.to(g_lp),
        place.to(g_h), out.entropy, temperature=1.3, vocab_start=edges[r])) for r in range(P)]
    close(np.concatenate(grads, axis=1), refs.logprob_grad(logits, labels, g_lp, g_h, 1.3))


def test_labels_no_shard_or_two_shards_own(place, rng):
    N, V = 6, 64
    logits, labels = make(rng, N, V, [0, 32, 64])
    labels[:] = [0, 31, 32, 63, 64, -7]
    # shard 1 overlaps shard 0 by one column (31): label 31 is owned twice
    spans = [(0, 32), (31, 64)]
    parts = np.stack([place.back(rlk.logprob_partials(
        place.to(logits[:, a:b]), place.to(labels), a)) for a, b in spans])
    status = place.to(np.zeros(1, np.int32))
    out = rlk.logprob_combine(place.to(parts), place.to(labels), status=status)
    logp = place.back(out.logp)
    assert np.isnan(logp[[1, 4, 5]]).all() and np.isfinite(logp[[0, 2, 3]]).all()
    assert place.back(status)[0] == rlk.STATUS_BAD_LABEL | rlk.STATUS_LABEL_OWNERS


# ---- two processes over torch.distributed (gloo) ---------------------------------------------

def _worker(rank, world, init, N, V, seed, results):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        _work(rank, world, N, V, seed, results)
    except Exception as e:  # reported to the parent at once rather than by its timeout
        results.put((rank, "error", repr(e), None))
    finally:
        dist.destroy_process_group()


def _work(rank, world, N, V, seed, results):
    import torch.distributed as dist
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(N, V, generator=g) * 3
    labels = torch.randint(0, V, (N,), generator=g)
    labels[0] = V // world - 1
    labels[1] = V // world
    labels[2] = -100
    w = V // world
    shard = full[:, rank * w:(rank + 1) * w].clone().requires_grad_(True)
    from rlk.autograd import vocab_parallel_token_logprob
    logp, ent = vocab_parallel_token_logprob(shard, labels, entropy=True, group=dist.group.WORLD)
    (logp.sum() + 0.5 * ent.sum()).backward()
    results.put((rank, logp.detach().numpy().tobytes(), ent.detach().numpy().tobytes(),
                 shard.grad.numpy().copy()))


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_two_processes_gloo(host):
    import torch.multiprocessing as mp
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    N, V, world, seed = 12, 96, 2, 1234
    fd, path = tempfile.mkstemp(prefix="rlk-gloo-")
    os.close(fd)
    os.unlink(path)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, "file://" + path, N, V, seed, q))
             for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        rank, lp, ent, grad = q.get(timeout=240)
        assert lp != "error", "rank %d: %s" % (rank, ent)
        got[rank] = (lp, ent, grad)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert got[0][0] == got[1][0] and got[0][1] == got[1][1]  # bitwise on both ranks

    g = torch.Generator().manual_seed(seed)
    full = (torch.randn(N, V, generator=g) * 3).double().requires_grad_(True)
    labels = torch.randint(0, V, (N,), generator=g)
    labels[0] = V // world - 1
    labels[1] = V // world
    labels[2] = -100
    logs = torch.log_softmax(full, -1)
    keep = labels != -100
    want_lp = torch.where(keep, logs.gather(1, labels.clamp(min=0)[:, None])[:, 0], 0.0)
    want_ent = -(logs.exp() * logs).sum(-1)
    # an ignored row gets no gradient at all (rlk_logprob_backward's contract)
    (want_lp.sum() + 0.5 * torch.where(keep, want_ent, 0.0).sum()).backward()
    lp = np.frombuffer(got[0][0], np.float32)
    ent = np.frombuffer(got[0][1], np.float32)
    close(lp, want_lp.detach().numpy())
    # an ignored row's entropy is 0 too, as token_logprob's: a value with no gradient would mislead
    close(ent, torch.where(keep, want_ent, 0.0).detach().numpy())
    grad = np.concatenate([got[0][2], got[1][2]], axis=1)
    close(grad, full.grad.numpy(), tol=2e-5)


def test_nccl_version_or_unavailable():
    try:
        version, path = rlk.nccl_version()
    except rlk.Unavailable as e:
        assert "libnccl is not available" in str(e)
        return
    assert 20000 <= version < 30000 and "nccl" in path


def test_nccl_path_refused_off_cuda(host, rng):
    logits, labels = make(rng, 4, 16, [0, 16])
    with pytest.raises(rlk.Unsupported):
        rlk.vocab_parallel_logprob_nccl(logits, labels, 0, 1)

"""Vocab-parallel log-probs and entropy: each tensor-parallel rank holds logits for a vocabulary
shard [vocab_start, vocab_start + V_shard); one all-gather of [N, 4] f32 records per call, then
a combine in rank order that gives bitwise the same logp, lse and entropy on every rank.

    out = rlk.vocab_parallel_logprob(logits_shard, labels, group=tp_group, entropy=True)

The record format is documented in include/rlk.h (rlk_logprob's shard form): per row
{m, s, u, t} = the shard's max z, sum exp(z - m), sum exp(z - m)(z - m), and the label's z where
the shard owns the label (+inf elsewhere). The pieces are callable alone (logprob_partials, then
the caller's all-gather, then logprob_combine); the backward is local to each shard
(rlk.logprob_backward with vocab_start, or rlk.autograd.vocab_parallel_token_logprob).
"""
import ctypes

from .. import _lib
from .. import _types as T
from .._tensor import Binder, Op, dim, compiling, traced
from .logprob import FORWARD_OP, LogprobArgs, LogprobResult, _common

__all__ = ["STATUS_LABEL_OWNERS", "PARTIAL_FIELDS", "LogprobCombineArgs", "logprob_partials",
           "logprob_combine", "vocab_parallel_logprob", "nccl_comm_of", "vocab_parallel_logprob_nccl",
           "nccl_version"]

STATUS_LABEL_OWNERS = 2  # RLK_LOGPROB_STATUS_LABEL_OWNERS: a label two shards own
PARTIAL_FIELDS = T.c_constant("RLK_LOGPROB_PARTIAL_FIELDS")


LogprobCombineArgs = T.c_struct("rlk_logprob_combine_args")


COMBINE_OP = Op("logprob_combine", LogprobCombineArgs, rows_at={"partials": 1})


LogprobVocabParallelArgs = T.c_struct("rlk_logprob_vocab_parallel_args")


# the nested forward's tensors bind as "fwd.<field>" (Op flattens embedded structs)
NCCL_OP = Op("logprob_vocab_parallel", LogprobVocabParallelArgs, workspace=True)

_LABELS = (T.DType.I32, T.DType.I64)
_F32 = (T.DType.F32,)


def logprob_partials(logits, labels, vocab_start, *, temperature=None, ignore_index=None,
                     entropy=False, partials=None, block=None, unroll=None, stream=None):
    """This shard's records (rlk_logprob's shard form): logits [N, V_shard] are the vocabulary
    columns [vocab_start, vocab_start + V_shard), labels [N] index the whole vocabulary.
    entropy=True fills the records' entropy part. partials: an optional f32 [N, 4] output
    (contiguous, 16-byte aligned), e.g. this rank's slice of an all-gather buffer.
    Returns the f32 [N, 4] records."""
    if compiling():
        return traced("logprob_partials", dict(
            logits=logits, labels=labels, vocab_start=vocab_start, temperature=temperature,
            ignore_index=ignore_index, entropy=entropy, partials=partials, block=block,
            unroll=unroll, stream=stream))
    b = Binder(FORWARD_OP)
    a = b.args
    _common(b, logits, labels, temperature, ignore_index, None, None, block, unroll, None)
    T.set_int(a, "vocab_start", vocab_start)
    a.partial_entropy = 1 if entropy else 0
    if partials is None:
        partials = b.empty((dim(logits, 0), PARTIAL_FIELDS), T.DType.F32)
    b.set("partials", partials, _F32, output=True)
    b.run(stream)
    return partials


def logprob_combine(partials, labels, *, ignore_index=None, entropy=False, lse=True, logp=None,
                    status=None, stream=None):
    """Merges gathered records [P, N, 4] (rank order) into logp, lse and entropy
    (rlk_logprob_combine). entropy=True needs records made with entropy=True. status: an
    optional zeroed i32 [1] that gets STATUS_BAD_LABEL (a label no shard owns) or
    STATUS_LABEL_OWNERS (two shards own it); those rows are NaN. Returns LogprobResult."""
    if compiling():
        return traced("logprob_combine", dict(
            partials=partials, labels=labels, ignore_index=ignore_index, entropy=entropy, lse=lse,
            logp=logp, status=status, stream=stream))
    b = Binder(COMBINE_OP)
    a = b.args
    b.set("partials", partials, _F32)
    b.set("labels", labels, _LABELS)
    if ignore_index is not None:
        T.set_int(a, "ignore_index", ignore_index)
    b.set("status", status, (T.DType.I32,), optional=True, output=True)
    if logp is None:
        logp = b.empty((dim(labels, 0),), T.DType.F32)
    b.set("logp", logp, _F32, output=True)
    result = LogprobResult(logp, *_lse_entropy(b, labels, lse, entropy, ""))
    b.run(stream)
    return result


def _lse_entropy(b, labels, lse, entropy, at):
    """New f32 [N] lse and entropy outputs (each None where not wanted), bound to the fields
    at + "lse" and at + "entropy"."""
    n = (dim(labels, 0),)
    lse_out = b.output(at + "lse", T.DType.F32, n) if lse else None
    ent_out = b.output(at + "entropy", T.DType.F32, n) if entropy else None
    return lse_out, ent_out


def _gather_with_group(partials, group):
    import torch
    import torch.distributed as dist
    world = dist.get_world_size(group)
    n = partials.shape[0]
    # concatenated along rows (the layout every backend takes), then viewed as [P, N, 4]
    out = torch.empty((world * n, PARTIAL_FIELDS), dtype=partials.dtype, device=partials.device)
    dist.all_gather_into_tensor(out, partials, group=group)
    return out.view(world, n, PARTIAL_FIELDS)


def vocab_parallel_logprob(logits, labels, vocab_start=None, *, group=None, all_gather=None,
                           temperature=None, ignore_index=None, entropy=False, lse=True,
                           status=None, block=None, unroll=None, stream=None):
    """logp (and lse, entropy) of the whole vocabulary from this rank's logits shard.

    Exactly one way to exchange the records: `group`, a torch.distributed ProcessGroup (NCCL
    for CUDA tensors, gloo for CPU ones; all_gather_into_tensor, so rlk needs no NCCL handle),
    or `all_gather`, a function taking this rank's f32 [N, 4] records and returning every
    rank's, [P, N, 4] in rank order (or a list of P [N, 4]). vocab_start: this shard's first
    vocabulary index; with a group it defaults to rank * V_shard (equal shards, Megatron's
    layout). Runs on the current stream; the collective is the caller's (no synchronization
    here beyond what it does). Returns LogprobResult, bitwise the same on every rank."""
    if group is not None and all_gather is not None:
        raise ValueError("vocab_parallel_logprob: give one of group and all_gather, not both")
    if group is None and all_gather is None:
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("vocab_parallel_logprob: give a group or an all_gather function "
                             "(torch.distributed is not initialized)")
        group = dist.group.WORLD
    if vocab_start is None:
        if group is None:
            raise ValueError("vocab_parallel_logprob: vocab_start is required with all_gather")
        import torch.distributed as dist
        vocab_start = dist.get_rank(group) * dim(logits, 1)
    parts = logprob_partials(logits, labels, vocab_start, temperature=temperature,
                             ignore_index=ignore_index, entropy=entropy, block=block,
                             unroll=unroll, stream=stream)
    if group is not None:
        gathered = _gather_with_group(parts, group)
    else:
        gathered = all_gather(parts)
        if isinstance(gathered, (list, tuple)):
            if type(gathered[0]).__module__.startswith("torch"):
                import torch
                gathered = torch.stack(list(gathered))
            else:
                import numpy
                gathered = numpy.stack(list(gathered))
    return logprob_combine(gathered, labels, ignore_index=ignore_index, entropy=entropy, lse=lse,
                           status=status, stream=stream)


def nccl_comm_of(group=None):
    """The ncclComm_t (an int) of a torch.distributed NCCL process group, for
    vocab_parallel_logprob_nccl. It is 0 until the group has run a collective (unless it was
    created with device_id=...): run one first."""
    import torch
    import torch.distributed as dist
    pg = group if group is not None else dist.group.WORLD
    return int(pg._get_backend(torch.device("cuda"))._comm_ptr())


def vocab_parallel_logprob_nccl(logits, labels, vocab_start, nccl_comm, *, temperature=None,
                                ignore_index=None, entropy=False, lse=True, status=None,
                                block=None, unroll=None, stream=None):
    """vocab_parallel_logprob through rlk's own NCCL call (rlk_logprob_vocab_parallel): CUDA
    tensors, `nccl_comm` a communicator of the libnccl this process loaded (nccl_comm_of(group)
    for PyTorch's). The caller keeps the collective order the same on every rank. Returns
    LogprobResult."""
    b = Binder(NCCL_OP)
    a = b.args
    _common(b, logits, labels, temperature, ignore_index, status, None, block, unroll, None, into="fwd")
    T.set_int(a.fwd, "vocab_start", vocab_start)
    logp = b.output("fwd.logp", T.DType.F32, (dim(labels, 0),))
    result = LogprobResult(logp, *_lse_entropy(b, labels, lse, entropy, "fwd."))
    T.set_int(a, "nccl_comm", nccl_comm)
    nbytes = b.workspace_size()
    _, ptr = b.workspace(nbytes + 16)
    a.workspace = (ptr + 15) // 16 * 16
    a.workspace_bytes = nbytes
    b.run(stream)
    return result


def nccl_version():
    """(version code, library file) of the libnccl rlk_logprob_vocab_parallel would use
    (rlk_nccl_version); raises rlk.Unavailable naming every candidate when there is none."""
    fn = _lib.function("rlk_nccl_version", ctypes.c_int,
                       [ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_size_t])
    v = ctypes.c_int(0)
    buf = ctypes.create_string_buffer(512)
    status = fn(ctypes.byref(v), buf, len(buf))
    if status:
        _lib.check(status, "nccl_version")
    return v.value, buf.value.decode(errors="replace")

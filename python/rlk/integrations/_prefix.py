"""Sequences that share a prefix, packed for rlk's prefix-shared attention ("rlk_prefix",
rlk.integrations.transformers): per group the shared prefix once, then each member's own tokens
([prefix | own_1 | ... | own_G], rlk.pack_grpo's layout), every token at the position it has in
its own sequence, and where each token of each sequence sits in the packed stream.

A token's hidden state depends only on the tokens before it in its sequence and their positions,
so a prefix computed once is what each member would compute: members must share the prefix's
tokens and their first position. Built on the host from host copies of the tokens (the layout's
offsets are host data the library checks).
"""
import collections

import torch

from ..ops import prefix_attention as _pa

Packed = collections.namedtuple("Packed", "ids positions layout rows")
Packed.__doc__ = """ids and positions: int64 [T] (host); layout: rlk PrefixLayout; rows: per
sequence (input order) the int64 packed row of each of its tokens."""


def pack(seqs, first_positions, groups):
    """seqs: 1-D int64 host tensors; first_positions[s]: the position of seqs[s][0]; groups:
    (members, prefix_len) pairs covering every sequence once, each member longer than its group's
    prefix_len and sharing its first prefix_len tokens and first position with the others."""
    ids, pos, rows = [], [], [None] * len(seqs)
    prefix_lens, own_lens = [], []
    t = 0
    for members, L in groups:
        head = members[0]
        for m in members:
            if len(seqs[m]) <= L or first_positions[m] != first_positions[head] or \
                    not torch.equal(seqs[m][:L], seqs[head][:L]):
                raise ValueError("pack: sequence %d does not extend its group's prefix of %d" % (m, L))
        p0 = first_positions[head]
        ids.append(seqs[head][:L])
        pos.append(torch.arange(p0, p0 + L))
        prefix_rows = torch.arange(t, t + L)
        t += L
        prefix_lens.append(L)
        own_lens.append([])
        for m in members:
            n = len(seqs[m]) - L
            ids.append(seqs[m][L:])
            pos.append(torch.arange(p0 + L, p0 + L + n))
            rows[m] = torch.cat([prefix_rows, torch.arange(t, t + n)])
            t += n
            own_lens[-1].append(n)
    layout = _pa.prefix_layout(prefix_lens, own_lens)
    return Packed(torch.cat(ids), torch.cat(pos), layout, rows)


def common_prefix(a, b):
    """The number of leading tokens a and b share."""
    n = min(len(a), len(b))
    diff = (a[:n] != b[:n]).nonzero()
    return n if len(diff) == 0 else int(diff[0])


def consecutive_groups(seqs, first_positions, window=256):
    """Groups of consecutive sequences that share a prefix, chosen to save the most tokens:
    a partition into runs maximizing sum (members - 1) * prefix_len, each run's prefix the
    common prefix of its members (at most the shortest member's length - 1, so every member
    keeps a token). Runs of at most `window` sequences (dynamic programming over the runs'
    ends). Returns (members, prefix_len) pairs in order."""
    n = len(seqs)
    link = [common_prefix(seqs[i], seqs[i + 1]) if first_positions[i] == first_positions[i + 1]
            else 0 for i in range(n - 1)]
    best = [0] * (n + 1)
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        best[j], start[j] = best[j - 1], j - 1  # sequence j - 1 alone
        L = len(seqs[j - 1]) - 1
        for i in range(j - 2, max(-1, j - 1 - window), -1):  # the run i .. j - 1
            L = min(L, link[i], len(seqs[i]) - 1)
            if L <= 0:
                break
            gain = best[i] + (j - 1 - i) * L
            if gain > best[j]:
                best[j], start[j] = gain, i
    runs, j = [], n
    while j > 0:
        i = start[j]
        members = list(range(i, j))
        L = min([len(seqs[m]) - 1 for m in members] + link[i:j - 1]) if len(members) > 1 else 0
        runs.append((members, max(L, 0)))
        j = i
    return runs[::-1]

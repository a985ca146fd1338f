"""FlashInfer-style sampling functions on rlk's sampler (rlk.sample): the same names, arguments
(in FlashInfer's order) and results, so code written against flashinfer.sampling switches by its
import.

    from rlk import sampling
    ids = sampling.top_k_top_p_sampling_from_logits(logits, top_k=50, top_p=0.9)   # int32 [B]

top_k, top_p and min_p are a number (every row) or a tensor [batch]. indices (int32 or int64
[batch]) maps each output to a row of the input, which then holds the unique distributions; the
tokens come back in indices' dtype (int32 without). Draws are reproducible: the seed comes from
`generator` (a torch.Generator) or, without one, from torch's default CPU generator (so
torch.manual_seed fixes them), or from seed= / offset= when given (a number, or a tensor of one
value or one per output; a seed given without an offset starts at offset 0); `deterministic` is
accepted and always holds. Probability inputs are sampled through their logarithm (the same
distribution). check_nan=True raises ValueError for NaN input, which reads a flag back (it
synchronizes, as FlashInfer's does). rlk's filters apply min-p, then top-k, then top-p over what
top-k kept: filter_apply_order="top_k_first"; "joint" is not offered.
"""
import torch

from .errors import Unsupported
from .ops import sample as _sample

__all__ = ["sampling_from_logits", "sampling_from_probs", "top_k_sampling_from_probs",
           "top_p_sampling_from_probs", "min_p_sampling_from_probs",
           "top_k_top_p_sampling_from_probs", "top_k_top_p_sampling_from_logits"]

_SEED_BITS = 1 << 62
_MIX = -7046029254386353131  # 0x9E3779B97F4A7C15 as an int64: spreads a seed over the rows


def _seed(generator, seed, offset, rows, device):
    """(seed, offset) for one call: given, else drawn from the generator (a CUDA generator gives
    its seed and Philox offset, then advances it). A seed tensor of one value becomes one seed
    per output, that value mixed with the output's index (each row draws its own numbers, as a
    shared scalar seed does); a tensor of one offset, one offset per output."""
    if seed is None:
        if generator is not None and generator.device.type != "cpu":
            off = generator.get_offset()
            generator.set_offset(off + 4)
            return generator.initial_seed(), off
        return int(torch.randint(_SEED_BITS, (), generator=generator)), 0
    if offset is None:
        offset = 0
    if isinstance(seed, torch.Tensor):
        seed = seed.to(device=device, dtype=torch.int64).reshape(-1)
        if seed.numel() == 1 and rows != 1:
            seed = seed + torch.arange(rows, device=device, dtype=torch.int64) * _MIX
        if not isinstance(offset, torch.Tensor):
            offset = torch.full((rows,), int(offset), device=device, dtype=torch.int64)
    if isinstance(offset, torch.Tensor):
        offset = offset.to(device=device, dtype=torch.int64).reshape(-1)
        if offset.numel() == 1 and rows != 1:
            offset = offset.expand(rows).contiguous()
    return seed, offset


def _check_nan(x, check_nan, what):
    if check_nan and bool(torch.isnan(x).any()):
        raise ValueError("Input %s contains NaN." % what)


def _rows(x, indices):
    """The input's rows the outputs draw from: x itself, or x[indices]."""
    if indices is None:
        return x
    if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int32, torch.int64) \
            or indices.dim() != 1:
        raise ValueError("indices: expected an int32 or int64 tensor [batch_size], got %r"
                         % (getattr(indices, "dtype", type(indices)),))
    return x.index_select(0, indices.to(device=x.device, dtype=torch.int64))


def _draw(x, indices, generator, seed, offset, **filters):
    rows = _rows(x, indices)
    seed, offset = _seed(generator, seed, offset, rows.shape[0], rows.device)
    out = _sample.sample(rows, seed=seed, offset=offset, token_dtype="i32", logp=False, **filters).tokens
    return out if indices is None or indices.dtype == torch.int32 else out.to(indices.dtype)


def _from_probs(probs, indices, check_nan, generator, seed, offset, **filters):
    _check_nan(probs, check_nan, "probs")
    return _draw(torch.log(probs), indices, generator, seed, offset, **filters)


def _order(filter_apply_order):
    if filter_apply_order != "top_k_first":
        raise Unsupported("filter_apply_order=%r: rlk's sampler applies top-k first "
                          "(\"top_k_first\")" % (filter_apply_order,))


def sampling_from_logits(logits, indices=None, deterministic=True, generator=None, check_nan=False,
                         seed=None, offset=None):
    """One token per row of logits [B, V] (or per entry of indices) from softmax(logits): int32
    [B]."""
    _check_nan(logits, check_nan, "logits")
    return _draw(logits, indices, generator, seed, offset)


def sampling_from_probs(probs, indices=None, deterministic=True, generator=None, check_nan=False,
                        seed=None, offset=None):
    """One token per row of probs [B, V] (rows summing to 1): int32 [B]."""
    return _from_probs(probs, indices, check_nan, generator, seed, offset)


def top_k_sampling_from_probs(probs, top_k, indices=None, deterministic=True, generator=None,
                              check_nan=False, seed=None, offset=None):
    """From the top_k most likely tokens of each row, renormalized."""
    return _from_probs(probs, indices, check_nan, generator, seed, offset, top_k=top_k)


def top_p_sampling_from_probs(probs, top_p, indices=None, deterministic=True, generator=None,
                              check_nan=False, seed=None, offset=None):
    """From the smallest set of most likely tokens whose mass reaches top_p (nucleus)."""
    return _from_probs(probs, indices, check_nan, generator, seed, offset, top_p=top_p)


def min_p_sampling_from_probs(probs, min_p, indices=None, deterministic=True, generator=None,
                              check_nan=False, seed=None, offset=None):
    """From the tokens whose probability is at least min_p times the row's largest."""
    return _from_probs(probs, indices, check_nan, generator, seed, offset, min_p=min_p)


def top_k_top_p_sampling_from_probs(probs, top_k, top_p, indices=None, filter_apply_order="top_k_first",
                                    deterministic=True, generator=None, check_nan=False, seed=None,
                                    offset=None):
    """Top-k, then top-p over what top-k kept."""
    _order(filter_apply_order)
    return _from_probs(probs, indices, check_nan, generator, seed, offset, top_k=top_k, top_p=top_p)


def top_k_top_p_sampling_from_logits(logits, top_k, top_p, indices=None, filter_apply_order="top_k_first",
                                     deterministic=True, generator=None, check_nan=False, seed=None,
                                     offset=None):
    """Top-k, then top-p over what top-k kept, from logits [B, V]: int32 [B]."""
    _order(filter_apply_order)
    _check_nan(logits, check_nan, "logits")
    return _draw(logits, indices, generator, seed, offset, top_k=top_k, top_p=top_p)

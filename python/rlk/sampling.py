"""FlashInfer-style sampling functions on rlk's sampler (rlk.sample): the same names, arguments
and results, so code written against flashinfer.sampling switches by its import.

    from rlk import sampling
    ids = sampling.top_k_top_p_sampling_from_logits(logits, top_k=50, top_p=0.9)   # int32 [B]

top_k, top_p and min_p are a number (every row) or a tensor [B]. Draws are reproducible: the
seed comes from `generator` (a torch.Generator) or, without one, from torch's default CPU
generator (so torch.manual_seed fixes them), or from seed= / offset= when given; `deterministic`
is accepted and always holds. Probability inputs are sampled through their logarithm (the same
distribution). check_nan=True raises ValueError for NaN input, which reads a flag back (it
synchronizes, as FlashInfer's does). rlk's filters apply min-p, then top-k, then top-p over
what top-k kept: filter_apply_order="top_k_first"; "joint" is not offered.
"""
import torch

from .errors import Unsupported
from .ops import sample as _sample

__all__ = ["sampling_from_logits", "sampling_from_probs", "top_k_sampling_from_probs",
           "top_p_sampling_from_probs", "min_p_sampling_from_probs",
           "top_k_top_p_sampling_from_probs", "top_k_top_p_sampling_from_logits"]

_SEED_BITS = 1 << 62


def _seed(generator, seed, offset):
    """(seed, offset) for one call: given, else drawn from the generator (a CUDA generator gives
    its seed and Philox offset, then advances it)."""
    if seed is not None:
        return seed, offset if offset is not None else 0
    if generator is not None and generator.device.type != "cpu":
        off = generator.get_offset()
        generator.set_offset(off + 4)
        return generator.initial_seed(), off
    return int(torch.randint(_SEED_BITS, (), generator=generator)), 0


def _check_nan(x, check_nan, what):
    if check_nan and bool(torch.isnan(x).any()):
        raise ValueError("Input %s contains NaN." % what)


def _draw(logits, generator, seed, offset, **filters):
    seed, offset = _seed(generator, seed, offset)
    return _sample.sample(logits, seed=seed, offset=offset, token_dtype="i32", logp=False,
                          **filters).tokens


def _from_probs(probs, check_nan, generator, seed, offset, **filters):
    _check_nan(probs, check_nan, "probs")
    return _draw(torch.log(probs), generator, seed, offset, **filters)


def _order(filter_apply_order):
    if filter_apply_order != "top_k_first":
        raise Unsupported("filter_apply_order=%r: rlk's sampler applies top-k first "
                          "(\"top_k_first\")" % (filter_apply_order,))


def sampling_from_logits(logits, deterministic=True, generator=None, check_nan=False, *,
                         seed=None, offset=None):
    """One token per row of logits [B, V] from softmax(logits): int32 [B]."""
    _check_nan(logits, check_nan, "logits")
    return _draw(logits, generator, seed, offset)


def sampling_from_probs(probs, deterministic=True, generator=None, check_nan=False, *, seed=None,
                        offset=None):
    """One token per row of probs [B, V] (rows summing to 1): int32 [B]."""
    return _from_probs(probs, check_nan, generator, seed, offset)


def top_k_sampling_from_probs(probs, top_k, deterministic=True, generator=None, check_nan=False, *,
                              seed=None, offset=None):
    """From the top_k most likely tokens of each row, renormalized."""
    return _from_probs(probs, check_nan, generator, seed, offset, top_k=top_k)


def top_p_sampling_from_probs(probs, top_p, deterministic=True, generator=None, check_nan=False, *,
                              seed=None, offset=None):
    """From the smallest set of most likely tokens whose mass reaches top_p (nucleus)."""
    return _from_probs(probs, check_nan, generator, seed, offset, top_p=top_p)


def min_p_sampling_from_probs(probs, min_p, deterministic=True, generator=None, check_nan=False, *,
                              seed=None, offset=None):
    """From the tokens whose probability is at least min_p times the row's largest."""
    return _from_probs(probs, check_nan, generator, seed, offset, min_p=min_p)


def top_k_top_p_sampling_from_probs(probs, top_k, top_p, filter_apply_order="top_k_first",
                                    deterministic=True, generator=None, check_nan=False, *,
                                    seed=None, offset=None):
    """Top-k, then top-p over what top-k kept."""
    _order(filter_apply_order)
    return _from_probs(probs, check_nan, generator, seed, offset, top_k=top_k, top_p=top_p)


def top_k_top_p_sampling_from_logits(logits, top_k, top_p, filter_apply_order="top_k_first",
                                     deterministic=True, generator=None, check_nan=False, *,
                                     seed=None, offset=None):
    """Top-k, then top-p over what top-k kept, from logits [B, V]: int32 [B]."""
    _order(filter_apply_order)
    _check_nan(logits, check_nan, "logits")
    return _draw(logits, generator, seed, offset, top_k=top_k, top_p=top_p)

"""Bad input that only the device sees (a label outside [0, V), a sampling row with no finite
logit, a NaN score), made visible without synchronizing on every call.

The library reports such input through a status word a call ORs bits into, when the caller gives
one (rlk_logprob, rlk_linear_logprob, their backwards, rlk_linear_policy_loss, rlk_logprob_combine,
rlk_sample); it never reads it back, so calls stay asynchronous and capturable. The package gives
every such call that has no status of the caller's one of its own: one word per op and device,
never cleared by the calls, so a bad row anywhere since the last look stays flagged.

  rlk.check_status()   reads the words (one synchronization), clears them, and raises
                       rlk.BadInput naming each op and what it saw; call it where the loop already
                       synchronizes (the trainer adapters do, where they read the loss)
  rlk.status()         the same words as {op: bits}, without raising
  RLK_CHECK=1 (or rlk.set_checks(True))
                       every call synchronizes after its launch and raises BadInput at once, also
                       for NaN in the outputs of the ops that have no status word (a NaN score,
                       advantages of an undefined std, a whitening with no valid element)
"""
import os
import threading

from . import _types as T
from .errors import InvalidArgument

__all__ = ["BadInput", "check_status", "status", "set_checks", "checks"]


class BadInput(InvalidArgument):
    """A call's input that only the device could judge: `found` maps each op to its status
    bits (or to "nan" for NaN outputs)."""

    # found has a default: an exception is unpickled (multiprocessing, a remote worker's error)
    # by calling its class with args, the message alone, and then restoring its attributes
    def __init__(self, message, found=None):
        super().__init__(message)
        self.found = found


# What each op's status bits mean (include/rlk.h: RLK_LOGPROB_STATUS_*, RLK_SAMPLE_STATUS_*).
_LOGPROB_BITS = {1: "a label outside [0, V) that is not ignore_index (its log-prob is NaN)",
                 2: "a label owned by two or more vocabulary shards",
                 4: "a selected row outside hidden or not after the one before (its outputs are NaN)"}
_SAMPLE_BITS = {1: "a NaN or +inf logit (logp NaN)", 2: "a row whose logits are all -inf (token -1)",
                4: "a per-row setting out of range (token -1, outputs NaN)"}
MEANINGS = {"logprob": _LOGPROB_BITS, "logprob_backward": _LOGPROB_BITS, "logprob_combine": _LOGPROB_BITS,
            "logprob_vocab_parallel": _LOGPROB_BITS, "linear_logprob": _LOGPROB_BITS,
            "linear_logprob_backward": _LOGPROB_BITS, "linear_policy_loss": _LOGPROB_BITS,
            "sample": _SAMPLE_BITS}

_state = {"check": os.environ.get("RLK_CHECK", "") not in ("", "0")}
_lock = threading.Lock()
_words = {}  # (op name, place key, framework) -> the op's status word there


def set_checks(on):
    """Turns the synchronizing check after every call on or off (RLK_CHECK=1 turns it on)."""
    _state["check"] = bool(on)


def checks():
    """Whether every call is checked as it returns."""
    return _state["check"]


def describe(op, bits):
    names = MEANINGS.get(op, {})
    said = [text for bit, text in sorted(names.items()) if bits & bit]
    rest = bits & ~sum(names)
    if rest:
        said.append("status bits 0x%x" % rest)
    return "%s: %s" % (op, "; ".join(said))


def word_for(binder):
    """The package's status word for this call's op and place (made, zeroed, on first use)."""
    key = (binder.name, binder.place.key, binder.place.framework)
    w = _words.get(key)
    if w is None:
        with _lock:
            w = _words.get(key)
            if w is None:
                w = binder.zeros((1,), T.DType.I32)
                binder.made.pop()  # not one of this call's outputs
                _words[key] = w
    return w


def _read(w):
    return int(w[0])


def _clear(w):
    if hasattr(w, "zero_"):
        w.zero_()
    else:
        w[0] = 0


def status():
    """{op: bits} of every op whose status word has a bit set since the last check_status()
    (one synchronization per device that has words)."""
    found = {}
    for (op, *_), w in list(_words.items()):
        bits = _read(w)
        if bits:
            found[op] = found.get(op, 0) | bits
    return found


def check_status():
    """Raises BadInput naming each op that saw bad input since the last check, after clearing
    the words; returns None when none did."""
    found = {}
    for (op, *_), w in list(_words.items()):
        bits = _read(w)
        if bits:
            found[op] = found.get(op, 0) | bits
            _clear(w)
    if found:
        raise BadInput("rlk: bad input seen on the device: " + "; ".join(describe(o, b) for o, b in found.items()),
                       found)


def after_call(binder, word, stream):
    """RLK_CHECK: waits for the call and raises on its status word or NaN outputs."""
    p = binder.place
    if p.framework == "torch" and p.backend != T.Backend.HOST:
        import torch
        if stream is None:
            torch.cuda.current_stream(p.device).synchronize()
        else:
            torch.cuda.synchronize(p.device)
    if word is not None:
        bits = _read(word)
        if bits:
            _clear(word)
            raise BadInput("rlk: " + describe(binder.name, bits), {binder.name: bits})
    for a in binder.made:
        if _has_nan(a):
            raise BadInput("rlk: %s: an output holds NaN (a NaN input, or a statistic of no element)" % binder.name,
                           {binder.name: "nan"})


def _has_nan(a):
    if hasattr(a, "is_floating_point"):
        return a.is_floating_point() and bool(a.isnan().any())
    kind = getattr(getattr(a, "dtype", None), "kind", "")
    if kind == "f":
        import numpy
        return bool(numpy.isnan(a).any())
    return False

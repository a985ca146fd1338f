"""What the trainer adapters share: torch's clamp convention, normalizers, patching, the
trainer-version check."""
import contextlib
import importlib
import importlib.metadata
import weakref

import torch

_bound_grad = {}


def torch_clamp_bound_grad():
    """The gradient torch.clamp with number bounds passes where its input equals a bound: 1 in
    older torch releases, 0 in current ones (probed once on the installed torch)."""
    if "v" not in _bound_grad:
        x = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
        x.clamp(0.0, 1.0).sum().backward()
        _bound_grad["v"] = float(x.grad[0])
    return _bound_grad["v"]


def dense(x, per_sequence=False):
    """x as the library reads it. A broadcast view (a stride of 0) goes as it is where the library
    reads it: one row shared by every row ([B, T] with row stride 0, its row contiguous), and with
    per_sequence (advantages) one value per sequence expanded over the tokens ([B, T] with
    strides {1, 0}: the policy loss's per-sequence form). Any other is materialized."""
    if not torch.is_tensor(x) or all(s != 0 or n == 1 for s, n in zip(x.stride(), x.shape)):
        return x
    if x.dim() == 2:
        (B, T), (s0, s1) = x.shape, x.stride()
        if s0 == 0 and (T == 1 or s1 == 1):
            return x
        if per_sequence and s1 == 0 and (B == 1 or s0 == 1):
            return x
    return x.contiguous()


def mask_arg(mask):
    """A mask in a dtype the kernels read (bool, i32 or f32)."""
    if mask is None or mask.dtype in (torch.bool, torch.int32, torch.float32):
        return dense(mask)
    if mask.dtype.is_floating_point:
        return mask.float()
    return mask.to(torch.int32)


def as_float(x):
    return float(x.item()) if torch.is_tensor(x) else float(x)


def nonempty_rows(mask):
    """The sequences with at least one token that counts (a host read: pass global counts to
    avoid it)."""
    return float((mask.sum(-1) > 0).sum().item())


def mask_total(mask):
    return float(mask.sum(dtype=torch.float64).item())


class UntestedVersion(RuntimeError):
    """The installed trainer is not a version the adapter was tested with."""


def check_version(package, tested, force=False):
    """The installed version of `package` (its distribution name); raises UntestedVersion when it
    is not one of `tested`, unless force (then the version is returned all the same). A package
    without distribution metadata (imported from a source tree on the path) has no version to
    check: refused, or with force "unknown"."""
    try:
        have = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        if force:
            return "unknown"
        raise UntestedVersion(
            "rlk: %s has no installed distribution metadata (not installed, or imported from a "
            "source tree), so its version is unknown; this adapter was tested with %s: pass "
            "force=True to patch it anyway" % (package, ", ".join(sorted(tested)))) from None
    if have not in tested and not force:
        raise UntestedVersion(
            "rlk: %s %s is installed; this adapter was tested with %s. Its seams may have moved: "
            "pass force=True to patch it anyway" % (package, have, ", ".join(sorted(tested))))
    return have


# rlk's stand-ins, by identity, to the trainer objects they replace (stand_in, trainer_own): a
# registry rather than an attribute, which functools.wraps or a subclass would copy onto objects
# that are not rlk's.
_STAND_INS = weakref.WeakKeyDictionary()


def stand_in(wrapper, own):
    """Records `wrapper` as rlk's stand-in for the trainer's `own` (trainer_own finds it)."""
    _STAND_INS[wrapper] = own
    return wrapper


def trainer_own(value):
    """The trainer's own object behind `value`: value itself, or what rlk's stand-ins (stand_in)
    replace, through a patch applied on a patch (patch() called twice: a re-run notebook cell, a
    worker hook beside the user's call), so that a fallback never calls rlk's own wrapper."""
    while True:
        try:
            own = _STAND_INS.get(value)
        except TypeError:  # not weakly referable, so never a stand-in
            return value
        if own is None:
            return value
        value = own


class Patch:
    """Attributes set on modules or classes, restored by undo() (also a context manager).
    report: what a trainer's patch() swapped ("swapped": names) and what it left to the trainer
    ("left": {name: why}); "version": the trainer's version."""

    def __init__(self):
        self._saved = []
        self.report = {"version": None, "swapped": [], "left": {}}

    def swapped(self, name):
        self.report["swapped"].append(name)

    def left(self, name, why):
        self.report["left"][name] = why

    def set(self, target, name, value):
        if isinstance(target, str):
            target = importlib.import_module(target)
        self._saved.append((target, name, target.__dict__.get(name, _MISSING)))
        setattr(target, name, value)

    def set_item(self, mapping, key, value):
        self._saved.append((_Item(mapping), key, mapping.get(key, _MISSING)))
        mapping[key] = value

    def undo(self):
        while self._saved:
            target, name, old = self._saved.pop()
            if isinstance(target, _Item):
                if old is _MISSING:
                    target.mapping.pop(name, None)
                else:
                    target.mapping[name] = old
            elif old is _MISSING:
                delattr(target, name)
            else:
                setattr(target, name, old)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()
        return False


_MISSING = object()


@contextlib.contextmanager
def all_or_nothing(handle):
    """A patch() body on `handle`: when a step raises (a trainer whose seam moved, under force),
    what the steps before it set is undone before the exception goes on, so that a patch() is
    applied whole or not at all, never leaving the trainer half-patched with no handle to undo."""
    try:
        yield handle
    except BaseException:
        handle.undo()
        raise


class _Item:
    def __init__(self, mapping):
        self.mapping = mapping


def float_pair(a, b, dtype):
    """a and b as `dtype` (f32 or f64, what the kernels read) with contiguous rows."""
    return tuple((x if x.dtype is dtype else x.to(dtype)).contiguous() for x in (a, b))

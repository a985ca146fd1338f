"""Arrays in, rlk_tensor descriptors out, zero copy.

A Binder holds the args struct of one op call and writes each array argument's rlk_tensor into
it (data pointer, shape, strides in elements). It checks that the arrays all live in one place
(one CUDA device, or host memory), that their dtypes have an rlk equivalent, allocates missing
outputs in the same place and framework, picks the context and the stream, and keeps every
scratch buffer it made alive until the launch is queued.

This is the hot path of every call, so the work per argument is kept small: the kind of an
argument is one dict lookup by its type, places and dtype maps are built once, a descriptor is
one struct.pack_into straight into the args struct, and an args struct is a copy of one that
rlk_<op>_args_init filled once.

Neither torch nor numpy is imported here: an argument can only be a torch tensor if the
caller imported torch, so sys.modules tells (once per argument type).
"""
import ctypes
import enum
import struct
import sys

from . import _context
from . import _entry
from . import _lib
from . import _log
from . import _status
from . import _types as T
from .errors import InvalidArgument

_shared_contexts = _context._contexts  # (backend, device) -> the shared Context

# rlk_tensor as one struct.pack_into writes it: data, dtype, ndim, then shape[MAX_DIMS] and
# strides[MAX_DIMS] as bytes packed once per layout (kept in _LAYOUTS: a call's arrays mostly
# have the layouts of the call before), the unused dimensions zero.
_PTR = struct.Struct("=Q")  # a descriptor's data pointer (its first field)
_I32 = T.DType.I32
_MAX_DIMS = T.MAX_DIMS
_HEAD = struct.Struct("=Qii%ds" % (16 * T.MAX_DIMS))
_LAYOUTS = {}  # (shape, strides) -> (ndim, shape and strides packed, whether dimension 0 is 0)
_OUT_LAYOUTS = {}  # shape -> the same for a contiguous array of that shape


def _layout(shape, strides):
    """The _LAYOUTS entry of (shape, strides) (tuples; strides in elements), made and kept; None
    where there are more dimensions than a descriptor holds."""
    n = len(shape)
    if n > _MAX_DIMS:
        return None
    pad = 8 * (_MAX_DIMS - n)
    packed = struct.pack("=%dq%dx%dq%dx" % (n, pad, n, pad), *shape, *strides)
    entry = (n, packed, bool(n and not shape[0]))
    if len(_LAYOUTS) >= 4096:  # a bound on what a run of ever-new shapes can keep
        _LAYOUTS.clear()
    _LAYOUTS[(tuple(shape), tuple(strides))] = entry
    return entry


def _out_layout(shape):
    """The layout entry of a contiguous array of `shape` (a tuple), kept per shape."""
    entry = _OUT_LAYOUTS.get(shape)
    if entry is None:
        entry = _layout(shape, contiguous_strides(shape))
        if len(_OUT_LAYOUTS) >= 4096:
            _OUT_LAYOUTS.clear()
        _OUT_LAYOUTS[shape] = entry
    return entry


def _desc_matches_mirror():
    """The packed layout is the ctypes mirror's (a 64-bit ABI without padding inside)."""
    want = [0, 8, 12, 16, 16 + 8 * T.MAX_DIMS]
    got = [getattr(T.Tensor, f).offset for f, _ in T.Tensor._fields_]
    return got == want and _HEAD.size == ctypes.sizeof(T.Tensor)


if not _desc_matches_mirror():
    raise ImportError("rlk: rlk_tensor is not laid out as this package packs it (a 64-bit "
                      "platform is needed)")

_TORCH, _NUMPY = 1, 2
_KIND = {}            # type(x) -> _TORCH or _NUMPY, filled the first time a type is seen
_torch = None         # the torch module, once a torch tensor was seen
_TORCH_DT = {}        # torch dtype -> rlk DType
_TORCH_OF = {}        # rlk DType -> torch dtype
_NUMPY_DT = {}        # numpy dtype -> rlk DType
_NUMPY_OF = {}        # rlk DType -> numpy dtype
_raw_stream = None    # device index -> the current torch stream's raw handle
_strided = None       # torch.strided


def _init_torch(t):
    global _torch, _raw_stream, _strided, _HOST_TORCH
    _TORCH_DT.update({t.float32: T.DType.F32, t.float16: T.DType.F16, t.bfloat16: T.DType.BF16,
                      t.float64: T.DType.F64, t.int32: T.DType.I32, t.int64: T.DType.I64,
                      t.bool: T.DType.BOOL})
    _TORCH_OF.update({v: k for k, v in _TORCH_DT.items()})
    _HOST_TORCH = Place(T.Backend.HOST, 0, "torch", t.device("cpu"))
    # What torch's own compiled code reads the stream with: no Stream object is made per call.
    raw = getattr(t._C, "_cuda_getCurrentRawStream", None)
    _raw_stream = raw if raw is not None else (lambda i: t.cuda.current_stream(i).cuda_stream)
    _strided = t.strided
    _torch = t


def _init_numpy(np):
    dts = {np.dtype(np.float32): T.DType.F32, np.dtype(np.float16): T.DType.F16,
           np.dtype(np.float64): T.DType.F64, np.dtype(np.int32): T.DType.I32,
           np.dtype(np.int64): T.DType.I64, np.dtype(np.bool_): T.DType.BOOL}
    _NUMPY_OF.update({v: k for k, v in dts.items()})
    _NUMPY_DT.update(dts)  # last: a filled _NUMPY_DT says both maps are ready


def _kind(x):
    """_TORCH, _NUMPY or None; after the first argument of a type, one dict lookup."""
    cls = type(x)
    kind = _KIND.get(cls)
    if kind is None:
        t, np = sys.modules.get("torch"), sys.modules.get("numpy")
        if t is not None and isinstance(x, t.Tensor):
            if _torch is None:
                _init_torch(t)
            kind = _TORCH
        elif np is not None and isinstance(x, np.ndarray):
            if not _NUMPY_DT:
                _init_numpy(np)
            kind = _NUMPY
        else:
            return None
        _KIND[cls] = kind
    return kind


def compiling():
    """Whether torch.compile is tracing the caller. Every op that has a torch.library operator
    starts with `if compiling(): return traced("<op>", dict(<each parameter>=...))` (not
    locals(), which the Dynamo of torch 2.11 cannot trace): a call made while torch.compile
    traces it goes to that operator (rlk.torch_ops.<op>, the same arguments and results), which
    the graph holds where the library cannot be called through ctypes. An eager call pays one
    torch.compiler.is_compiling() (about 0.1 us; nothing before torch is imported)."""
    f = _is_compiling
    if f is None:
        f = _find_is_compiling()
    return f()


def traced(name, args):
    """rlk.torch_ops.<name> called with `args`, the op function's parameters by name."""
    from . import torch_ops
    return getattr(torch_ops, name)(**args)


_is_compiling = None  # torch.compiler.is_compiling, once torch is imported


def _not_compiling():
    return False


def _find_is_compiling():
    """torch.compiler.is_compiling when torch is imported (kept from then on), else a stand-in
    that says no (torch cannot be tracing a call when it is not even imported)."""
    global _is_compiling
    t = sys.modules.get("torch")
    if t is None:
        return _not_compiling
    _is_compiling = t.compiler.is_compiling
    return _is_compiling


def is_torch(x):
    return _kind(x) == _TORCH


def is_numpy(x):
    return _kind(x) == _NUMPY


def _dtype_names(dtypes):
    return " or ".join(T.DType(d).name.lower() for d in dtypes)


def f32(name, value):
    """A number for a C float setting: float(value), refused (InvalidArgument naming the setting)
    where the f32 the library reads would be 0 for a nonzero value or infinite for a finite one,
    which it would take for another setting (a temperature of 0 is greedy, a scale of 0 the
    default). Anything float() refuses (a tensor of more than one element, a string) is an
    InvalidArgument naming the setting too."""
    try:
        v = float(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise InvalidArgument("%s: %r is not a number (%s)" % (name, value, e)) from None
    r = ctypes.c_float(v).value
    if (r == 0.0 and v != 0.0) or (r != r) != (v != v) or (abs(r) == float("inf") and abs(v) != float("inf")):
        raise InvalidArgument("%s: %r is %s as an f32 (the library's type for it)"
                              % (name, value, "0" if r == 0.0 else "infinite"))
    return v


def dim(x, i):
    """x's size in dimension i, or 0 where x has fewer dimensions (as its descriptor reads:
    the library then names the bad shape)."""
    s = x.shape
    return s[i] if i < len(s) else 0


_CONTIG = {}  # shape -> its contiguous strides (elements)


def contiguous_strides(shape):
    """The strides (elements) of a contiguous array of `shape` (a tuple), cached per shape."""
    strides = _CONTIG.get(shape)
    if strides is not None:
        return strides
    strides, acc = [], 1
    for d in reversed(tuple(shape)):
        strides.append(acc)
        acc *= int(d)
    strides = tuple(reversed(strides))
    if len(_CONTIG) < 4096:
        _CONTIG[shape] = strides
    return strides


_ONE_ELEMENT = _out_layout((1,))  # a status word's layout


class Place:
    """Where an op call runs: the backend, the device ordinal and the framework its outputs
    are allocated with ("torch" or "numpy"). One object per place, made once."""

    __slots__ = ("backend", "device", "framework", "torch_device", "key", "torch", "host")

    def __init__(self, backend, device, framework, torch_device=None):
        self.backend = backend
        self.device = device
        self.framework = framework
        self.torch_device = torch_device
        self.key = (backend, device)  # the shared context's key
        # what the hot path asks, answered once
        self.torch = framework == "torch"
        self.host = backend == T.Backend.HOST

    def same_memory(self, other):
        return self.key == other.key

    def describe(self):
        if self.backend == T.Backend.HOST:
            return "host memory (%s)" % self.framework
        return "%s" % (self.torch_device,)


_HOST_NUMPY = Place(T.Backend.HOST, 0, "numpy")
_HOST_TORCH = None    # made with the torch dtype maps
_CUDA_PLACES = {}     # device index -> Place


def _torch_place(x):
    if x.is_cuda:
        return _CUDA_PLACES.get(x.get_device()) or _cuda_place(x)
    if x.is_cpu:
        return _HOST_TORCH
    raise InvalidArgument("tensors on %s are not supported (cpu or cuda)" % x.device)


def _cuda_place(x):
    dev = x.device
    index = dev.index if dev.index is not None else _torch.cuda.current_device()
    backend = T.Backend.HIP if getattr(_torch.version, "hip", None) else T.Backend.CUDA
    p = Place(backend, index, "torch", dev)
    _CUDA_PLACES[index] = p
    return p


def place_of(x):
    """The Place of one array, or raises InvalidArgument for anything else."""
    kind = _kind(x)
    if kind == _TORCH:
        return _torch_place(x)
    if kind == _NUMPY:
        return _HOST_NUMPY
    raise InvalidArgument("expected a torch.Tensor or a numpy.ndarray, got %s" % type(x).__name__)


class Binder:
    """The args struct and the arrays of one call of `op` (an Op); op.name names the call in
    error messages. `args` starts as rlk_<op>_args_init left it."""

    __slots__ = ("op", "name", "args", "offsets", "place", "ctx", "keep", "made", "given", "no_rows")

    def __init__(self, op):
        self.op = op
        self.name = op.name
        defaults = op._defaults
        self.args = op.new_args() if defaults is None else op.args_struct.from_buffer_copy(defaults)
        self.offsets = op.offsets
        self.place = None
        self.ctx = None
        self.keep = []  # scratch allocated here, alive until the launch is queued
        self.made = []  # every array allocated here (zeroed instead of a launch: see run)
        self.given = []  # the outputs the caller gave, status words aside (zeroed too, unless accumulating)
        self.no_rows = False  # a required input has no rows: an empty batch

    def _fail(self, name, msg):
        return InvalidArgument("%s: %s: %s" % (self.name, name, msg))

    def _join(self, name, p):
        cur = self.place
        if cur is None:
            self.place = p
        elif cur is not p and not cur.same_memory(p):
            raise self._fail(name, "is in %s, the other arguments in %s" % (
                p.describe(), cur.describe()))

    def _status_shape(self, name, shape):
        """The refusal of a status word that is not one i32: an empty tensor (whose data pointer
        may be NULL, which the library would take for no word at all) or a longer one."""
        return self._fail(name, "shape %s, expected [1] (one i32 word)" % (list(shape),))

    def set(self, name, x, dtypes=None, optional=False, output=False):
        """Writes the rlk_tensor of argument `name` into the args field of that name and
        returns its rlk dtype. None is an absent tensor when `optional` (the field stays as
        args_init zeroed it; returns None). `dtypes`: the rlk dtypes accepted (checked here for
        a clearer message; the library checks again). `output`: the array is written (must be
        writable)."""
        if x is None:
            if optional:
                return None
            raise self._fail(name, "is required")
        kind = _KIND.get(type(x)) or _kind(x)
        if kind == _TORCH:
            # the common case in as few steps as it takes; anything unusual goes to _torch_refused
            dev = x.get_device()  # -1 for host memory: one query for the place
            if dev < 0:
                p = _HOST_TORCH if x.is_cpu else None
            else:
                p = (_CUDA_PLACES.get(dev) or _cuda_place(x)) if x.is_cuda else None
            dt = _TORCH_DT.get(x.dtype)
            if p is not self.place or p is None:
                if self.place is None and p is not None:
                    self.place = p  # the call's first array: its place is the call's
                else:
                    self._torch_checks(name, x, p, dt, output)
            if dt is None or output:
                self._torch_checks(name, x, p, dt, output)
            try:  # a tensor without strides (sparse, nested) raises here
                shape, strides, ptr = x.shape, x.stride(), x.data_ptr()
            except RuntimeError:
                raise self._fail(name, "only strided (dense) tensors are supported, got %s" % (
                    x.layout,)) from None
            lay = _LAYOUTS.get((shape, strides))
            if lay is not None and (dtypes is None or dt in dtypes):  # the common case
                if output:
                    if name not in self.op.status_fields:  # a status word is ORed into, never cleared
                        self.given.append(x)
                    elif shape != (1,):
                        raise self._status_shape(name, shape)
                elif lay[2] and not optional and name not in self.op.rows_elsewhere:
                    self.no_rows = True
                _HEAD.pack_into(self.args, self.offsets[name], ptr, dt, lay[0], lay[1])
                return dt
        elif kind == _NUMPY:
            self._join(name, _HOST_NUMPY)
            dt = _NUMPY_DT.get(x.dtype)
            if dt is None:
                raise self._fail(name, "dtype %s has no rlk equivalent" % x.dtype)
            if output and not x.flags.writeable:
                raise self._fail(name, "is an output but the array is read-only")
            item, strides = x.itemsize, x.strides
            if item != 1:
                for s in strides:
                    if s % item:
                        raise self._fail(name, "strides %s are not a multiple of the element "
                                         "size %d" % (x.strides, item))
                strides = tuple([s // item for s in strides])
            shape, ptr = x.shape, x.ctypes.data
        else:
            raise self._fail(name, "expected a torch.Tensor or a numpy.ndarray, got %s" % (
                type(x).__name__))
        if dtypes is not None and dt not in dtypes:
            raise self._fail(name, "dtype %s is not supported (expected %s)" % (
                dt.name.lower(), _dtype_names(dtypes)))
        lay = _LAYOUTS.get((shape, strides)) or _layout(shape, strides)
        if lay is None:
            raise self._fail(name, "has %d dimensions, at most %d are supported" % (
                len(shape), _MAX_DIMS))
        if output:
            if name not in self.op.status_fields:
                self.given.append(x)
            elif tuple(shape) != (1,):
                raise self._status_shape(name, shape)
        elif lay[2] and not optional and name not in self.op.rows_elsewhere:
            self.no_rows = True
        _HEAD.pack_into(self.args, self.offsets[name], ptr, dt, lay[0], lay[1])
        return dt

    def bind(self, inputs, arrays):
        """Binds the inputs `inputs` (an Op.inputs spec) to `arrays`, in its order (None for an
        absent optional one), as set would one by one; returns the first one's rlk dtype. A torch
        tensor in the call's place whose dtype is accepted and whose layout was seen before
        takes the short way (what set checks, in a loop with nothing looked up twice); anything
        else, the first tensor of the call included, goes through set."""
        args = self.args
        first = None
        tdev = self.place.torch_device if self.place is not None else None
        for (name, off, dtypes, required), x in zip(inputs, arrays):
            if x is None:
                if required:
                    raise self._fail(name, "is required")
                continue
            if tdev is not None and _KIND.get(type(x)) == _TORCH and x.device == tdev:
                dt = _TORCH_DT.get(x.dtype)
                try:  # a tensor without strides (sparse, nested): set names it
                    lay = _LAYOUTS.get((x.shape, x.stride()))
                except RuntimeError:
                    lay = None
                if lay is not None and dt is not None and (dtypes is None or dt in dtypes):
                    if lay[2] and required and name not in self.op.rows_elsewhere:
                        self.no_rows = True
                    _HEAD.pack_into(args, off, x.data_ptr(), dt, lay[0], lay[1])
                    if first is None:
                        first = dt
                    continue
            dt = self.set(name, x, dtypes, optional=not required)
            if first is None:
                first = dt
            tdev = self.place.torch_device
        return first

    def _torch_checks(self, name, x, p, dt, output):
        """Binds the call to torch tensor x's place p and checks what set's common case leaves
        out: an unsupported device (p None), a dtype with no rlk equivalent (dt None), an
        output that requires grad."""
        if p is None:
            raise self._fail(name, "tensors on %s are not supported (cpu or cuda)" % x.device)
        if p is not self.place:
            self._join(name, p)
        if dt is None:
            hint = " (use .bool() or .float() for a mask)" if str(x.dtype) == "torch.uint8" else ""
            raise self._fail(name, "dtype %s has no rlk equivalent%s" % (x.dtype, hint))
        if output and x.requires_grad and x.is_leaf:
            raise self._fail(name, "is an output but requires grad")

    def output(self, name, dtype, shape):
        """A new contiguous array of rlk dtype `dtype` and `shape` (a tuple) in the call's
        place, bound to output `name`: what an op allocates for an output not given."""
        a = self._alloc(shape, dtype, False)
        lay = _OUT_LAYOUTS.get(shape) or _out_layout(shape)
        _HEAD.pack_into(self.args, self.offsets[name], a.data_ptr() if self.place.torch
                        else a.ctypes.data, dtype, lay[0], lay[1])
        return a

    def outputs(self, dtype, fields):
        """New contiguous arrays of rlk dtype `dtype` in the call's place, one per field of
        `fields` (an Op.outputs spec), each bound to its field; returns them in a list. What
        output does for each, with the layouts packed beforehand and one loop for all."""
        p = self.place
        if p is None:
            p = self.require_place()
        args, made = self.args, self.made
        out = []
        if p.torch:
            empty, tdt = _torch.empty, _TORCH_OF[dtype]
            for off, shape, ndim, packed in fields:
                if p.host:  # no device keyword: about 0.1 us less
                    a = empty(size=shape, dtype=tdt)
                else:
                    a = empty(size=shape, dtype=tdt, device=p.torch_device)
                _HEAD.pack_into(args, off, a.data_ptr(), dtype, ndim, packed)
                out.append(a)
            made.extend(out)
        else:
            for off, shape, ndim, packed in fields:
                a = self._alloc(shape, dtype, False)
                _HEAD.pack_into(args, off, a.ctypes.data, dtype, ndim, packed)
                out.append(a)
        return out

    def set_new(self, name, x, dtype, shape):
        """Binds output `name` to x, an array this call just made with `empty` (contiguous,
        `shape`, rlk dtype `dtype`, in the call's place): only its pointer is asked for."""
        ptr = x.data_ptr() if self.place.torch else x.ctypes.data
        self.set_at(name, ptr, dtype, shape)
        return x

    def set_at(self, name, ptr, dtype, shape):
        """Binds output `name` to contiguous memory of `shape` (a tuple) at address `ptr`, part
        of an array this call made."""
        lay = _OUT_LAYOUTS.get(shape) or _out_layout(shape)
        _HEAD.pack_into(self.args, self.offsets[name], ptr, dtype, lay[0], lay[1])

    def empty(self, shape, dtype):
        """A new uninitialized array of rlk dtype `dtype` in the call's place."""
        return self._alloc(shape, dtype, False)

    def zeros(self, shape, dtype):
        return self._alloc(shape, dtype, True)

    def _alloc(self, shape, dtype, zero):
        p = self.place
        if p is None:
            p = self.require_place()
        if p.torch:  # size= by name: as quick as separate sizes, and 0-d too
            if p.host:  # no device keyword: about 0.1 us less
                a = (_torch.zeros if zero else _torch.empty)(size=shape, dtype=_TORCH_OF[dtype])
            else:
                a = (_torch.zeros if zero else _torch.empty)(size=shape, dtype=_TORCH_OF[dtype],
                                                            device=p.torch_device)
        else:
            nd = _NUMPY_OF.get(dtype)
            if nd is None:
                raise InvalidArgument("%s: %s outputs need torch (numpy has no such dtype)" % (
                    self.name, T.DType(dtype).name.lower()))
            np = sys.modules["numpy"]
            a = (np.zeros if zero else np.empty)(tuple(shape), dtype=nd)
        self.made.append(a)
        return a

    def empty_batch(self):
        """For a call whose required input has no rows: whether it is an empty batch (every
        tensor indexed by the batch's rows has none; False leaves the call to the library,
        which names what it refuses). Raises InvalidArgument where some have rows."""
        empty = self.op.empty_batch(self.args, self.name)
        if not empty:
            self.no_rows = False
        return empty

    def workspace_size(self):
        """The op's scratch bytes for the args bound so far (none for an empty batch)."""
        if self.no_rows and self.empty_batch():
            return 0
        return self.op.workspace_size(self.context(), self.args)

    def scratch(self, key):
        """Binds the op's workspace (its `workspace` and `workspace_bytes` fields) for the args
        bound so far, the size asked of the library once per key: everything the size depends
        on (place, shapes, dtypes, the settings that shape the call)."""
        sizes = self.op.sizes
        n = sizes.get(key)
        if n is None:
            n = self.workspace_size()
            if len(sizes) >= 4096:  # a bound on what a run of ever-new shapes can keep
                sizes.clear()
            sizes[key] = n
        self._bind_workspace(n)

    def bind_workspace(self):
        """Binds the op's workspace (its `workspace` and `workspace_bytes` fields) for the args
        bound so far, its size asked of the library on this call; nothing where it needs none."""
        self._bind_workspace(self.workspace_size())

    def _bind_workspace(self, n):
        if n:
            a = self.args
            _, a.workspace = self.workspace(n)
            a.workspace_bytes = n

    def workspace(self, nbytes):
        """A scratch buffer of `nbytes` (at least 1) in the call's place, kept alive here;
        returns (array, pointer)."""
        a = self._alloc((max(int(nbytes), 1),), T.DType.BOOL, zero=False)
        self.keep.append(a)
        ptr = a.data_ptr() if self.place.torch else a.ctypes.data
        return a, ptr

    def require_place(self):
        if self.place is None:
            raise InvalidArgument("%s: no tensor argument given" % self.name)
        return self.place

    def context(self):
        """The shared context of the call's place (looked up once per call)."""
        ctx = self.ctx
        if ctx is None:
            p = self.require_place()
            ctx = _context.shared(p.key)
            self.ctx = ctx
        return ctx

    def stream(self, stream=None):
        """The raw stream handle for the launch: the given one (a torch.cuda.Stream, an object
        with .cuda_stream, or an int), else the current torch stream of the device; None on
        the host."""
        p = self.require_place()
        if p.host:
            return None
        if stream is None:
            return _raw_stream(p.device) or None
        if hasattr(stream, "cuda_stream"):
            return stream.cuda_stream or None
        if isinstance(stream, int):
            return stream or None
        raise InvalidArgument("%s: stream: expected a torch.cuda.Stream or an int, got %s" % (
            self.name, type(stream).__name__))

    def _status_word(self):
        """(the package's status word of this call's op and place, its data pointer), kept on
        the op for the next call in this place."""
        word = _status.word_for(self)
        got = self.op.status_words[self.place] = (word, word.data_ptr() if self.place.torch
                                                  else word.ctypes.data)
        return got

    def run(self, stream=None):
        """Launches the op with the args built here on this call's context and stream. An empty
        batch (a required input with no rows) launches nothing: every tensor of the batch's rows
        must have none (Op.empty_batch), and the outputs, those this call allocated and those
        given (unless the call adds to them; never a status word, which calls OR into), are
        zeroed (a loss over no token is 0, a weight's gradient from no row is 0), as torch's sums
        over nothing are."""
        p = self.place
        if self.no_rows and self.empty_batch():
            out = self.made if getattr(self.args, "accumulate", 0) else self.made + self.given
            for a in out:
                if p.torch:
                    a.zero_()
                else:
                    a.fill(0)
            return self.context()
        ctx = self.ctx
        if ctx is None:
            ctx = _shared_contexts.get(p.key)  # what context() finds, without its two calls
            if ctx is None:
                ctx = self.context()
        raw = None if stream is None and p.host else self.stream(stream)
        word = None
        op = self.op
        if op.status_offset is not None and not _PTR.unpack_from(self.args, op.status_offset)[0]:
            # the package's own status word for a call that brought none (_status.py)
            word, ptr = op.status_words.get(p) or self._status_word()
            _HEAD.pack_into(self.args, op.status_offset, ptr, _I32, 1, _ONE_ELEMENT[1])
        op.launch(ctx, self.args, raw)
        if _status._state["check"]:
            _status.after_call(self, word, stream)
        if stream is not None and self.keep and p.torch and not p.host:
            # Scratch allocated on the current stream but used on another: tell the caching
            # allocator, so the memory is not reused before that stream is done with it.
            t = _torch
            s = stream if isinstance(stream, t.cuda.Stream) else t.cuda.ExternalStream(raw)
            for a in self.keep:
                if hasattr(a, "record_stream"):  # keep holds other objects too (a prefix layout)
                    a.record_stream(s)
        return ctx


# ---- the compiled entry's plans (rlk/_entry.py) ------------------------------------------------

def use_plans(stream, first):
    """Whether a call whose first tensor argument is `first` may go through a plan: a torch
    tensor (anything else takes the Python path, which names what is wrong), the compiled entry
    loaded, no stream= given and no status checking (both take the Python path's steps)."""
    return (_kind(first) == _TORCH and stream is None and not _status._state["check"]
            and _entry.module() is not None)


def plan_call(name, key, tensors, scalars):
    """The outputs (a list) of a call through the plan kept for (name, key), or None when there
    is none or the tensors do not fit it: `tensors` in the order the plan's inputs were given,
    `scalars` the numbers it writes into each call's struct."""
    kept = _entry.plans.get((name, key))
    if kept is None:
        return None
    plan, dev = kept
    out = plan(tensors, scalars, 0 if dev < 0 else _raw_stream(dev))
    if _log.pending:
        _log.flush(out if out.__class__ is int else 0)
    if out is None or out.__class__ is list:
        return out
    _lib.check(out, name)  # the library's status


_PLAIN = (int, float, str, bool, type(None))

# The C types of the struct fields a plan writes per call, as _entry.cpp's Kind: f64, f32, i32
# and 64-bit integers (each stored as ctypes would: an integer's low bits)
_PLAN_SCALAR_KIND = {ctypes.c_double: 0, ctypes.c_float: 1, ctypes.c_int32: 2, ctypes.c_uint32: 2,
                     ctypes.c_int64: 3, ctypes.c_uint64: 3}


def keep_plan(name, key, b, ctx, inputs, scalars, out_dtype, outs, total=0, ws=(0, 0, None)):
    """Keeps the call Binder b just made on ctx as the plan of (name, key): its args struct as
    built. inputs: (args field, the tensor or None) in the order plan_call passes them; scalars:
    (args field, whether written per call); outs: (element offset in one buffer of `total`
    elements, or -1 for an allocation of its own; sizes; strides; args fields taking its pointer)
    in the order plan_call returns them, all of rlk dtype out_dtype; ws: (bytes, byte offset in the
    buffer, args field of its pointer; None without one). key[:-1] are settings: a plan only when each is a
    plain value (a tensor's may change under the same key); its last item a shape. Every pointer
    the struct holds must be an input, an output or the workspace (or stay as it is: the status
    word). An output of its own allocation may name its own rlk dtype as a fifth item; a scalar
    field is written as its C type (f64, f32, i32 or a 64-bit integer's bits)."""
    p = b.place
    if not p.torch or b.no_rows:
        return
    for v in key[:-1]:
        if not isinstance(v, _PLAIN) and not isinstance(v, enum.Enum):
            return
    off = b.op.offsets
    ins = []
    for field, x in inputs:
        if x is None:
            ins.append((-1, _torch.float32, (), ()))  # (must stay absent)
        elif _KIND.get(type(x)) != _TORCH:
            return
        else:
            ins.append((off[field], x.dtype, tuple(x.shape), tuple(x.stride())))
    outs = [(o[0], tuple(o[1]), tuple(o[2]), [off[f] for f in o[3]], _TORCH_OF[o[4] if len(o) > 4 else out_dtype])
            for o in outs]
    kinds = b.op.scalar_kinds
    if any(on and kinds[f] is None for f, on in scalars):
        raise TypeError("keep_plan: a scalar field of a type a plan cannot write")
    dev = -1 if p.host else p.device
    plan = _entry.module().Plan(
        bytes(b.args), ctypes.cast(b.op._run, ctypes.c_void_p).value, ctx.handle.value,
        0 if p.host else 1, dev, ins, outs, total, _TORCH_OF[out_dtype], ws[0], ws[1],
        off[ws[2]] if ws[0] else -1, [(off[f], kinds[f]) for f, on in scalars if on])
    _entry.keep(name, key, (plan, dev))


class Op:
    """One op family's entry points, declared on first use:
      rlk_<name>_args_init(args *), rlk_<name>(ctx, const args *, stream) and, when the op
      has scratch, rlk_<name>_workspace_size(ctx, const args *, size_t *).
    Binding checks the struct's size against the library once, and fills one args struct with
    the library's defaults; every call's args struct starts as a copy of it."""

    def __init__(self, name, args_struct, workspace=False, shared=(), rows_at=None, selection=None):
        """shared: the tensor fields whose first dimension does not count the batch's rows (a
        head's weight [V, H], offsets [S + 1], a loss and its metrics; the status word always);
        rows_at: {field: dimension} for those that count them in another dimension (gathered
        records [P, N, fields]); selection: (field, fields) where a row selection, when given,
        stands for those fields' rows (rows into hidden [N, H]). The other tensor fields all
        have no rows in an empty batch (empty_batch)."""
        self.name = name
        self.args_struct = args_struct
        self.has_workspace = workspace
        # field name -> byte offset, where Binder.set packs a descriptor; the fields of an
        # embedded args struct as "outer.inner"
        self.offsets = {}
        # number field name -> how a plan writes it (_PLAN_SCALAR_KIND)
        self.scalar_kinds = {}
        for name, ftype in args_struct._fields_:
            off = getattr(args_struct, name).offset
            self.offsets[name] = off
            self.scalar_kinds[name] = _PLAN_SCALAR_KIND.get(ftype)
            if isinstance(ftype, type) and issubclass(ftype, ctypes.Structure) and ftype is not T.Tensor:
                for sub, stype in ftype._fields_:
                    self.offsets[name + "." + sub] = off + getattr(ftype, sub).offset
                    self.scalar_kinds[name + "." + sub] = _PLAN_SCALAR_KIND.get(stype)
        tensors = [name for name, ftype in args_struct._fields_ if ftype is T.Tensor]
        for name, ftype in args_struct._fields_:
            if isinstance(ftype, type) and issubclass(ftype, ctypes.Structure) and ftype is not T.Tensor:
                tensors += [name + "." + sub for sub, stype in ftype._fields_ if stype is T.Tensor]
        rows_at = rows_at or {}
        self.status_fields = frozenset(f for f in ("status", "head.status", "fwd.status") if f in tensors)
        shared = tuple(shared) + tuple(self.status_fields)
        for f in shared + tuple(rows_at) + ((selection[0],) + tuple(selection[1]) if selection else ()):
            if f not in tensors:
                raise TypeError("Op %s: %s is not a tensor field" % (name, f))
        self._rows = tuple((f, self.offsets[f], rows_at.get(f, 0)) for f in tensors if f not in shared)
        # the fields whose first dimension is not the batch's rows (none of them makes one empty)
        self.rows_elsewhere = frozenset(shared) | frozenset(rows_at)
        self._selection = (None if selection is None else
                           (self.offsets[selection[0]], frozenset(selection[1])))
        # the status word field (an i32 [1] the call ORs bad-input bits into), if the op has one
        self.status_field = next((f for f in ("status", "head.status", "fwd.status") if f in self.offsets), None)
        self.status_offset = None if self.status_field is None else self.offsets[self.status_field]
        self.status_words = {}  # Place -> (its status word, the word's data pointer)
        self._defaults = None
        self._run = self._workspace_size = None
        self.sizes = {}  # workspace bytes by the key an op family derives from a call

    def _bind(self):
        if self._defaults is None:
            S = ctypes.POINTER(self.args_struct)
            _lib.check_abi(self.args_struct)
            init = _lib.function("rlk_%s_args_init" % self.name, None, [S])
            run = _lib.function("rlk_%s" % self.name, ctypes.c_int,
                                [ctypes.c_void_p, S, ctypes.c_void_p])
            ws = None
            if self.has_workspace:
                ws = _lib.function("rlk_%s_workspace_size" % self.name, ctypes.c_int,
                                   [ctypes.c_void_p, S, ctypes.POINTER(ctypes.c_size_t)])
            defaults = self.args_struct()
            init(defaults)
            self._run, self._workspace_size = run, ws
            self._defaults = defaults  # last: other threads take a set _defaults as bound
        return self._defaults

    def inputs(self, *fields):
        """The spec Binder.bind takes: (name, accepted rlk dtypes or None, required) per input
        field, its offset looked up here once."""
        return tuple((name, self.offsets[name], dtypes, required)
                     for name, dtypes, required in fields)

    def outputs(self, *fields):
        """The spec Binder.outputs takes: (name, shape) per output field, or (name, shape,
        bound shape) where the array is bound as another shape of as many elements (a 0-d
        loss as [1]); each field's offset and layout looked up here once."""
        spec = []
        for name, shape, *bound in fields:
            ndim, packed, _ = _out_layout(tuple(bound[0] if bound else shape))
            spec.append((self.offsets[name], tuple(shape), ndim, packed))
        return tuple(spec)

    def empty_batch(self, args, what):
        """For a call (named `what`) with an input of no rows: True when every tensor bound in
        args that counts the batch's rows has none, False when none of them is empty (a shared
        or selected-from tensor is: the library judges the call); raises InvalidArgument when
        some have rows and some none."""
        sel = self._selection
        skip = ()
        if sel is not None and _HEAD.unpack_from(args, sel[0])[2] > 0:
            skip = sel[1]  # the selection's rows are the batch's: the selected-from tensors' are not
        empty = full = None
        for name, off, d in self._rows:
            if name in skip:
                continue
            ndim, packed = _HEAD.unpack_from(args, off)[2:]
            if ndim <= d:
                continue
            n = struct.unpack_from("=q", packed, 8 * d)[0]
            if n == 0:
                empty = empty or name
            elif full is None:
                full = (name, n)
        if empty is None:
            return False
        if full is None:
            return True
        raise InvalidArgument("%s: %s has no rows but %s has %d (an empty batch has none in every "
                              "tensor of the batch's rows)" % (what, empty, full[0], full[1]))

    def available(self):
        """True when the loaded library has this op (and its struct matches)."""
        try:
            self._bind()
            return True
        except Exception:
            return False

    def new_args(self):
        """An args struct holding the library's defaults (rlk_<name>_args_init's)."""
        defaults = self._defaults
        if defaults is None:
            defaults = self._bind()
        return self.args_struct.from_buffer_copy(defaults)

    def workspace_size(self, ctx, args):
        n = ctypes.c_size_t(0)
        status = self._workspace_size(ctx.handle, args, ctypes.byref(n))
        if _log.pending:
            _log.flush(status)
        if status:
            _lib.check(status, self.name)
        return n.value

    def launch(self, ctx, args, stream):
        # ctypes passes args by reference (the argtype is a pointer to its struct)
        status = self._run(ctx.handle, args, stream)
        if _log.pending:  # a kernel compiled on this call's first use: logged with its time
            _log.flush(status)
        if status:
            _lib.check(status, self.name)

"""Arrays in, rlk_tensor descriptors out, zero copy.

A Binder collects the arrays of one op call: it checks that they all live in one place (one
CUDA device, or host memory), that their dtypes have an rlk equivalent, and builds the
rlk_tensor for each (data pointer, shape, strides in elements). It allocates missing outputs
in the same place and framework, picks the context and the stream, and keeps every array it
made alive until the launch is queued.

Neither torch nor numpy is imported here: an argument can only be a torch tensor if the
caller imported torch, so sys.modules tells.
"""
import ctypes
import sys

from . import _context
from . import _lib
from . import _types as T
from .errors import InvalidArgument

_TORCH_DTYPES = None
_NUMPY_DTYPES = None


def _torch():
    return sys.modules.get("torch")


def _numpy():
    return sys.modules.get("numpy")


def is_torch(x):
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def is_numpy(x):
    np = _numpy()
    return np is not None and isinstance(x, np.ndarray)


def _torch_dtypes():
    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        t = _torch()
        _TORCH_DTYPES = {t.float32: T.DType.F32, t.float16: T.DType.F16, t.bfloat16: T.DType.BF16,
                         t.float64: T.DType.F64, t.int32: T.DType.I32, t.int64: T.DType.I64,
                         t.bool: T.DType.BOOL}
    return _TORCH_DTYPES


def _numpy_dtypes():
    global _NUMPY_DTYPES
    if _NUMPY_DTYPES is None:
        np = _numpy()
        _NUMPY_DTYPES = {np.dtype(np.float32): T.DType.F32, np.dtype(np.float16): T.DType.F16,
                         np.dtype(np.float64): T.DType.F64, np.dtype(np.int32): T.DType.I32,
                         np.dtype(np.int64): T.DType.I64, np.dtype(np.bool_): T.DType.BOOL}
    return _NUMPY_DTYPES


def _dtype_names(dtypes):
    return " or ".join(T.DType(d).name.lower() for d in dtypes)


class Place:
    """Where an op call runs: the backend, the device ordinal and the framework its outputs
    are allocated with ("torch" or "numpy")."""

    __slots__ = ("backend", "device", "framework", "torch_device")

    def __init__(self, backend, device, framework, torch_device=None):
        self.backend = backend
        self.device = device
        self.framework = framework
        self.torch_device = torch_device

    def same_memory(self, other):
        return self.backend == other.backend and self.device == other.device

    def describe(self):
        if self.backend == T.Backend.HOST:
            return "host memory (%s)" % self.framework
        return "%s" % (self.torch_device,)


def place_of(x):
    """The Place of one array, or raises InvalidArgument for anything else."""
    if is_torch(x):
        dev = x.device
        if dev.type == "cpu":
            return Place(T.Backend.HOST, 0, "torch", dev)
        if dev.type == "cuda":
            t = _torch()
            backend = T.Backend.HIP if getattr(t.version, "hip", None) else T.Backend.CUDA
            return Place(backend, dev.index if dev.index is not None else t.cuda.current_device(),
                         "torch", dev)
        raise InvalidArgument("tensors on %s are not supported (cpu or cuda)" % dev)
    if is_numpy(x):
        return Place(T.Backend.HOST, 0, "numpy")
    raise InvalidArgument("expected a torch.Tensor or a numpy.ndarray, got %s" % type(x).__name__)


class Binder:
    """The arrays of one op call. `op` names the op in error messages."""

    def __init__(self, op):
        self.op = op
        self.place = None
        self.keep = []  # arrays allocated here, alive until the launch is queued

    def _fail(self, name, msg):
        return InvalidArgument("%s: %s: %s" % (self.op, name, msg))

    def _join(self, name, x):
        try:
            p = place_of(x)
        except InvalidArgument as e:
            raise self._fail(name, str(e)) from None
        if self.place is None:
            self.place = p
        elif not self.place.same_memory(p):
            raise self._fail(name, "is in %s, the other arguments in %s" % (
                p.describe(), self.place.describe()))
        return p

    def tensor(self, name, x, dtypes=None, optional=False, output=False):
        """The rlk_tensor for argument `name`. None is an absent tensor when `optional`.
        `dtypes`: the rlk dtypes accepted (checked here for a clearer message; the library
        checks again). `output`: the array is written (must be writable)."""
        if x is None:
            if optional:
                return T.Tensor()
            raise self._fail(name, "is required")
        self._join(name, x)
        t = T.Tensor()
        if is_torch(x):
            dt = _torch_dtypes().get(x.dtype)
            if dt is None:
                hint = " (use .bool() or .float() for a mask)" if str(x.dtype) == "torch.uint8" else ""
                raise self._fail(name, "dtype %s has no rlk equivalent%s" % (x.dtype, hint))
            if x.layout != _torch().strided:
                raise self._fail(name, "only strided (dense) tensors are supported, got %s" % x.layout)
            if output and x.requires_grad and x.is_leaf:
                raise self._fail(name, "is an output but requires grad")
            shape, strides, ptr = tuple(x.shape), tuple(x.stride()), x.data_ptr()
        else:
            dt = _numpy_dtypes().get(x.dtype)
            if dt is None:
                raise self._fail(name, "dtype %s has no rlk equivalent" % x.dtype)
            if output and not x.flags.writeable:
                raise self._fail(name, "is an output but the array is read-only")
            item = x.itemsize
            if any(s % item for s in x.strides):
                raise self._fail(name, "strides %s are not a multiple of the element size %d" % (
                    x.strides, item))
            shape, strides, ptr = x.shape, tuple(s // item for s in x.strides), x.ctypes.data
        if dtypes is not None and dt not in dtypes:
            raise self._fail(name, "dtype %s is not supported (expected %s)" % (
                T.DType(dt).name.lower(), _dtype_names(dtypes)))
        if len(shape) > T.MAX_DIMS:
            raise self._fail(name, "has %d dimensions, at most %d are supported" % (
                len(shape), T.MAX_DIMS))
        t.data = ptr or None
        t.dtype = int(dt)
        t.ndim = len(shape)
        for i, (n, s) in enumerate(zip(shape, strides)):
            t.shape[i] = n
            t.strides[i] = s
        return t

    def empty(self, shape, dtype):
        """A new uninitialized array of rlk dtype `dtype` in the call's place."""
        return self._alloc(shape, dtype, zero=False)

    def zeros(self, shape, dtype):
        return self._alloc(shape, dtype, zero=True)

    def _alloc(self, shape, dtype, zero):
        p = self.require_place()
        dtype = T.DType(dtype)
        if p.framework == "torch":
            t = _torch()
            td = {v: k for k, v in _torch_dtypes().items()}[dtype]
            make = t.zeros if zero else t.empty
            a = make(tuple(shape), dtype=td, device=p.torch_device)
        else:
            np = _numpy()
            nd = {v: k for k, v in _numpy_dtypes().items()}.get(dtype)
            if nd is None:
                raise InvalidArgument("%s: %s outputs need torch (numpy has no such dtype)" % (
                    self.op, dtype.name.lower()))
            a = (np.zeros if zero else np.empty)(tuple(shape), dtype=nd)
        return a

    def workspace(self, nbytes):
        """A scratch buffer of `nbytes` (at least 1) in the call's place, kept alive here;
        returns (array, pointer)."""
        a = self._alloc((max(int(nbytes), 1),), T.DType.BOOL, zero=False)
        self.keep.append(a)
        ptr = a.data_ptr() if is_torch(a) else a.ctypes.data
        return a, ptr

    def require_place(self):
        if self.place is None:
            raise InvalidArgument("%s: no tensor argument given" % self.op)
        return self.place

    def context(self):
        p = self.require_place()
        return _context.context(p.backend, p.device)

    def stream(self, stream=None):
        """The raw stream handle for the launch: the given one (a torch.cuda.Stream, an object
        with .cuda_stream, or an int), else the current torch stream of the device; None on
        the host."""
        p = self.require_place()
        if p.backend == T.Backend.HOST:
            return None
        if stream is None:
            t = _torch()
            return t.cuda.current_stream(p.torch_device).cuda_stream or None
        if hasattr(stream, "cuda_stream"):
            return stream.cuda_stream or None
        if isinstance(stream, int):
            return stream or None
        raise InvalidArgument("%s: stream: expected a torch.cuda.Stream or an int, got %s" % (
            self.op, type(stream).__name__))

    def run(self, op, args, stream=None):
        """Launches `op` with `args` on this call's context and stream."""
        ctx = self.context()
        raw = self.stream(stream)
        op.launch(ctx, args, raw)
        if stream is not None and self.keep and self.place.framework == "torch" \
                and self.place.backend != T.Backend.HOST:
            # Scratch allocated on the current stream but used on another: tell the caching
            # allocator, so the memory is not reused before that stream is done with it.
            t = _torch()
            s = stream if isinstance(stream, t.cuda.Stream) else t.cuda.ExternalStream(raw)
            for a in self.keep:
                a.record_stream(s)
        return ctx


class Op:
    """One op family's entry points, declared on first use:
      rlk_<name>_args_init(args *), rlk_<name>(ctx, const args *, stream) and, when the op
      has scratch, rlk_<name>_workspace_size(ctx, const args *, size_t *)."""

    def __init__(self, name, args_struct, workspace=False):
        self.name = name
        self.args_struct = args_struct
        self.has_workspace = workspace
        self._fns = None

    def _bind(self):
        if self._fns is None:
            S = ctypes.POINTER(self.args_struct)
            _lib.check_abi(self.args_struct)
            fns = {
                "init": _lib.function("rlk_%s_args_init" % self.name, None, [S]),
                "run": _lib.function("rlk_%s" % self.name, ctypes.c_int,
                                     [ctypes.c_void_p, S, ctypes.c_void_p]),
            }
            if self.has_workspace:
                fns["workspace"] = _lib.function(
                    "rlk_%s_workspace_size" % self.name, ctypes.c_int,
                    [ctypes.c_void_p, S, ctypes.POINTER(ctypes.c_size_t)])
            self._fns = fns
        return self._fns

    def available(self):
        """True when the loaded library has this op (and its struct matches)."""
        try:
            self._bind()
            return True
        except Exception:
            return False

    def new_args(self):
        """An args struct filled by the library's rlk_<name>_args_init (its defaults)."""
        fns = self._bind()
        a = self.args_struct()
        fns["init"](ctypes.byref(a))
        return a

    def workspace_size(self, ctx, args):
        n = ctypes.c_size_t(0)
        _lib.check(self._bind()["workspace"](ctx.handle, ctypes.byref(args), ctypes.byref(n)),
                   self.name)
        return n.value

    def launch(self, ctx, args, stream):
        _lib.check(self._bind()["run"](ctx.handle, ctypes.byref(args), stream), self.name)

"""Contexts: one per (backend, device), created lazily on first use and shared by threads.

Torch CUDA tensors use the CUDA backend (HIP under a ROCm build of torch) on the tensor's
device; numpy arrays and torch CPU tensors use the host backend. The C context may be used
from several threads at once, so one per place is enough.
"""
import ctypes
import threading

from . import _entry
from . import _lib
from . import _log
from . import _types as T
from .errors import InvalidArgument

_lock = threading.Lock()
_contexts = {}
_options = {"cache_dir": None, "log_level": None}


def configure(cache_dir=None, log_level=None):
    """Options for contexts created from now on: the writable cache root (default: RLK_CACHE_DIR,
    XDG, ~/.cache/rlk) and the log level ("error", "warn", "info", "debug"). Each call sets both:
    an option left out (None) goes back to its default, so configure() restores the defaults.
    Contexts already created keep theirs (release_contexts() drops them)."""
    if log_level is not None:
        T.enum_value(T.LogLevel, log_level, "log_level")
    _options["cache_dir"] = cache_dir
    _options["log_level"] = log_level


class Context:
    """An rlk_context: a backend on one device, its compiler and its kernel cache."""

    def __init__(self, backend=T.Backend.AUTO, device=0, cache_dir=None, log_level=None,
                 compile_only=False, target=None):
        lib = _lib.library()
        # installed rlk_kernels_* trees, read-only, before the cache opens (imported here: `python -m
        # rlk.kernel_trees` runs the module as a script, which a package import of it would shadow)
        from . import kernel_trees
        kernel_trees.use_installed()
        opt = T.ContextOptions()
        lib.rlk_context_options_init(ctypes.byref(opt))
        opt.backend = T.enum_value(T.Backend, backend, "backend")
        T.set_int(opt, "device", device)
        self._keep = []
        if cache_dir is not None:
            b = str(cache_dir).encode()
            self._keep.append(b)
            opt.cache_dir = b
        if log_level is not None:
            opt.log_level = T.enum_value(T.LogLevel, log_level, "log_level")
        opt.compile_only = 1 if compile_only else 0
        if target is not None:
            b = str(target).encode()
            self._keep.append(b)
            opt.target = b
        handle = ctypes.c_void_p()
        _lib.check(lib.rlk_context_create(ctypes.byref(handle), ctypes.byref(opt)))
        self._handle = handle
        self._lib = lib
        self.device = int(device)
        self.backend = T.Backend(lib.rlk_context_backend(handle))

    @property
    def handle(self):
        """The rlk_context * as a ctypes.c_void_p."""
        if self._handle is None:
            raise InvalidArgument("the rlk context was closed")
        return self._handle

    def close(self):
        """Destroys the C context. The caller makes sure none of its launches still runs."""
        if self._handle is not None:
            _entry.forget()  # a plan may hold this handle
            self._lib.rlk_context_destroy(self._handle)
            self._handle = None

    def info(self):
        """rlk_context_device_info as a dict."""
        d = T.DeviceInfo()
        _lib.check(self._lib.rlk_context_device_info(self.handle, ctypes.byref(d)))
        return {"name": d.name.decode(errors="replace"), "target": d.target.decode(),
                "compiler": d.compiler.decode(errors="replace"),
                "compute_capability": (d.compute_major, d.compute_minor),
                "multiprocessors": d.multiprocessors, "compile_only": bool(d.compile_only),
                "total_memory": d.total_memory}

    def counters(self):
        """rlk_context_counters as a dict (lookups, hits, misses, compiles, seconds)."""
        c = T.Counters()
        _lib.check(self._lib.rlk_context_counters(self.handle, ctypes.byref(c)))
        return {name: getattr(c, name) for name, _ in T.Counters._fields_}

    def reset_counters(self):
        self._lib.rlk_context_reset_counters(self.handle)

    @property
    def cache_dir(self):
        """The writable cache root in use, or "" when the cache runs in memory only."""
        return self._lib.rlk_context_cache_dir(self.handle).decode()

    def precompile(self, config):
        """rlk_precompile: compiles what one op configuration line needs; returns the kernel count."""
        n = ctypes.c_int(0)
        status = self._lib.rlk_precompile(self.handle, str(config).encode(), ctypes.byref(n))
        _log.flush(status)
        _lib.check(status)
        return n.value

    def synchronize(self, stream=None):
        """Waits for the work on `stream` (a raw stream handle; None: the default stream)."""
        _lib.check(self._lib.rlk_stream_synchronize(self.handle, stream))

    def __repr__(self):
        return "rlk.Context(backend=%s, device=%d)" % (self.backend.name.lower(), self.device)


def context(backend="host", device=0):
    """The shared context for (backend, device), created on first use (thread-safe)."""
    b = T.Backend(T.enum_value(T.Backend, backend, "backend"))
    key = (b, int(device))
    ctx = _contexts.get(key)
    if ctx is not None:
        return ctx
    with _lock:
        ctx = _contexts.get(key)
        if ctx is None:
            ctx = Context(b, int(device), cache_dir=_options["cache_dir"],
                          log_level=_options["log_level"])
            _contexts[key] = ctx
        return ctx


def shared(key):
    """The shared context for key = (Backend member, device ordinal): on the hot path of every
    call, so the common case is one dict lookup."""
    ctx = _contexts.get(key)
    return ctx if ctx is not None else context(*key)


def jit_summary():
    """One line on the kernels of the contexts in use: how many were compiled and in how long,
    loaded from the kernel cache, looked up; returned and logged at INFO on the "rlk" logger
    (each compile is logged there as it happens)."""
    return _log.summary(_contexts)


def release_contexts():
    """Destroys the shared contexts (the next call creates fresh ones). No launch through
    them may still be running."""
    with _lock:
        for ctx in _contexts.values():
            ctx.close()
        _contexts.clear()

"""Finding, loading and checking librlk.

Where the library is looked for, first found wins:
  1. RLK_LIBRARY: a path to librlk.so (a set but unloadable path is an error, never skipped);
  2. the copy inside the package (rlk/_lib/librlk.so.0: every wheel carries one);
  3. the source tree the package sits in: ../build/lib/librlk.so.0 beside python/;
  4. the system loader: ctypes.util.find_library("rlk"), then "librlk.so.0" (LD_LIBRARY_PATH).
`import rlk` loads it (once) and fails with LibraryNotFound, an ImportError, that lists every
place tried and why each failed. Its major version must be this package's.
"""
import ctypes
import ctypes.util
import os
import threading
from pathlib import Path

from . import _log
from . import _types as T
from .errors import AbiMismatch, LibraryNotFound, Unavailable, error_for_status

# The runtime version this package mirrors (include/rlk.h RLK_VERSION_*).
VERSION_MAJOR = 0
VERSION_MINOR = 1
SONAME = "librlk.so.%d" % VERSION_MAJOR

_lock = threading.Lock()
_lib = None
_path = None
_abi_checked = {}


def candidates():
    """The paths tried, in order, as (how, path-or-name) pairs."""
    out = []
    env = os.environ.get("RLK_LIBRARY")
    if env:
        return [("RLK_LIBRARY", env)]
    here = Path(__file__).resolve().parent
    out.append(("installed copy", str(here / "_lib" / SONAME)))
    checkout = here.parent.parent  # python/rlk of a source tree, not an installed package's folder
    if here.parent.name == "python" and (checkout / "include" / "rlk.h").is_file():
        out.append(("source tree", str(checkout / "build" / "lib" / SONAME)))
    found = ctypes.util.find_library("rlk")
    if found:
        out.append(("system (find_library)", found))
    out.append(("system loader", SONAME))
    return out


def _declare(lib):
    """Prototypes of the core API (op functions are declared by their op family)."""
    c = ctypes
    P = c.POINTER
    protos = {
        "rlk_status_string": (c.c_char_p, [c.c_int]),
        "rlk_last_error": (c.c_char_p, []),
        "rlk_version_string": (c.c_char_p, []),
        "rlk_version": (c.c_int, []),
        "rlk_context_options_init": (None, [P(T.ContextOptions)]),
        "rlk_context_create": (c.c_int, [P(c.c_void_p), P(T.ContextOptions)]),
        "rlk_context_destroy": (None, [c.c_void_p]),
        "rlk_context_backend": (c.c_int, [c.c_void_p]),
        "rlk_backend_name": (c.c_char_p, [c.c_int]),
        "rlk_context_device_info": (c.c_int, [c.c_void_p, P(T.DeviceInfo)]),
        "rlk_context_counters": (c.c_int, [c.c_void_p, P(T.Counters)]),
        "rlk_context_reset_counters": (None, [c.c_void_p]),
        "rlk_context_cache_dir": (c.c_char_p, [c.c_void_p]),
        "rlk_context_supported_targets": (c.c_char_p, [c.c_void_p]),
        "rlk_dtype_size": (c.c_size_t, [c.c_int]),
        "rlk_dtype_name": (c.c_char_p, [c.c_int]),
        "rlk_stream_synchronize": (c.c_int, [c.c_void_p, c.c_void_p]),
        "rlk_precompile": (c.c_int, [c.c_void_p, c.c_char_p, P(c.c_int)]),
        "rlk_precompile_ops": (c.c_char_p, []),
        "rlk_precompile_help": (c.c_char_p, [c.c_char_p]),
    }
    for name, (res, argtypes) in protos.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = argtypes
    # Optional: older libraries lack it, and then sizes cannot be checked (see check_abi).
    if hasattr(lib, "rlk_abi_struct_size"):
        lib.rlk_abi_struct_size.restype = c.c_size_t
        lib.rlk_abi_struct_size.argtypes = [c.c_char_p]
    if hasattr(lib, "rlk_abi_enum_constant"):
        lib.rlk_abi_enum_constant.restype = c.c_char_p
        lib.rlk_abi_enum_constant.argtypes = [c.c_size_t, P(c.c_char_p), P(c.c_int)]


def _open(how, where):
    lib = ctypes.CDLL(where)
    try:
        _declare(lib)
    except AttributeError as e:
        raise LibraryNotFound("%s (%s) is not librlk: %s" % (where, how, e)) from None
    major = lib.rlk_version() // 10000
    minor = lib.rlk_version() // 100 % 100
    if major != VERSION_MAJOR or minor < VERSION_MINOR:
        raise LibraryNotFound(
            "%s (%s) is librlk %s; this package needs %d.%d or a later %d.x" % (
                where, how, lib.rlk_version_string().decode(), VERSION_MAJOR, VERSION_MINOR,
                VERSION_MAJOR))
    return lib


def library():
    """The loaded librlk (a ctypes.CDLL), loading it on first use."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for how, where in candidates():
            is_path = os.sep in where
            if is_path and not os.path.exists(where):
                if how == "RLK_LIBRARY":
                    raise LibraryNotFound("RLK_LIBRARY=%s: no such file" % where)
                tried.append("%s: %s (absent)" % (how, where))
                continue
            try:
                lib = _open(how, where)
            except OSError as e:
                if how == "RLK_LIBRARY":
                    raise LibraryNotFound("RLK_LIBRARY=%s: %s" % (where, e)) from None
                tried.append("%s: %s (%s)" % (how, where, e))
                continue
            _path = getattr(lib, "_name", where)
            if hasattr(lib, "rlk_set_log_callback"):  # older libraries log to stderr
                _log.install(lib)
            _lib = lib
            return lib
        raise LibraryNotFound(
            "librlk could not be loaded; install the rlk wheel (it carries the library), build "
            "it with `make lib` in the source tree, or set RLK_LIBRARY. Tried:\n  "
            + "\n  ".join(tried))


def library_path():
    """The path (or loader name) librlk was loaded from."""
    library()
    return _path


def check(status, what=None):
    """Raises the exception for a non-zero rlk_status, with rlk_last_error()'s text
    (prefixed with `what`, the op's name, when given)."""
    if status:
        lib = library()
        msg = lib.rlk_last_error().decode("utf-8", "replace")
        if what and not msg.startswith(what):
            msg = "%s: %s" % (what, msg)
        raise error_for_status(status, msg)


def check_abi(cls):
    """Checks once that the library's sizeof of cls's C struct is ctypes.sizeof(cls).

    A library that does not know the struct (built before that op family existed) raises
    Unavailable; a different size raises AbiMismatch. Both name the library's path."""
    name = cls._abi_name_
    if _abi_checked.get(cls):
        return
    lib = library()
    if not hasattr(lib, "rlk_abi_struct_size"):
        _abi_checked[cls] = True  # nothing to compare with; the symbol check still applies
        return
    size = lib.rlk_abi_struct_size(name.encode())
    if size == 0:
        raise Unavailable("%s (librlk %s) has no %s: it was built without that op" % (
            library_path(), version_string(), name))
    if size != ctypes.sizeof(cls):
        raise AbiMismatch("%s: librlk at %s says %d bytes, this package's mirror is %d; "
                          "rebuild the library and the package from one tree" % (
                              name, library_path(), size, ctypes.sizeof(cls)))
    _abi_checked[cls] = True


def enum_constants():
    """{constant name: (its enum's typedef name or None, value)} for every enum constant of the
    header the library was built from (rlk_abi_enum_constant); {} for a library without the
    table (built before it existed)."""
    lib = library()
    if not hasattr(lib, "rlk_abi_enum_constant"):
        return {}
    rows, i = {}, 0
    enum_type, value = ctypes.c_char_p(), ctypes.c_int()
    while True:
        name = lib.rlk_abi_enum_constant(i, ctypes.byref(enum_type), ctypes.byref(value))
        if name is None:
            return rows
        rows[name.decode()] = (enum_type.value.decode() if enum_type.value else None, value.value)
        i += 1


def check_enums():
    """Checks every enum mirror registered with _types.c_enum against the library's table: its
    members (aliases aside) must be the C enum's constants, prefix taken off, with their values.
    A difference raises AbiMismatch naming it. Once per mirror (import rlk checks them all)."""
    rows = None
    for cls, (c_name, prefixes) in T.C_ENUMS.items():
        if _abi_checked.get(cls):
            continue
        if rows is None:
            rows = enum_constants()
            if not rows:
                return  # nothing to compare with
        want = {}
        for name, (enum_type, value) in rows.items():
            if enum_type == c_name:
                prefix = next((p for p in prefixes if name.startswith(p)), "")
                want[name[len(prefix):]] = value
        have = {m.name: int(m.value) for m in cls}  # iterating skips the aliases
        if have != want:
            diff = sorted(set(have.items()) ^ set(want.items()))
            raise AbiMismatch("%s: librlk at %s has %s, this package's mirror %s (differing: %s); "
                              "rebuild the library and the package from one tree" % (
                                  c_name, library_path(), _members(want), _members(have),
                                  ", ".join("%s = %d" % kv for kv in diff)))
        _abi_checked[cls] = True


def _members(d):
    return "{%s}" % ", ".join("%s = %d" % kv for kv in sorted(d.items(), key=lambda kv: kv[1]))


def function(name, restype, argtypes):
    """An op entry point of the library, declared; Unavailable if the library lacks it."""
    lib = library()
    try:
        fn = getattr(lib, name)
    except AttributeError:
        raise Unavailable("%s (librlk %s) has no %s: it was built without that op" % (
            library_path(), version_string(), name)) from None
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


def version_string():
    """The loaded library's version, "MAJOR.MINOR.PATCH"."""
    return library().rlk_version_string().decode()

"""ctypes mirrors of the core structs and enums of include/rlk.h.

Every mirrored struct is built from the header itself (c_struct; see _header) and registered
under its C name. Before one is passed to the library its size is compared with
rlk_abi_struct_size(name) (see _lib.check_abi), and the test suite compiles a small C program
that prints sizeof and offsetof of every registered struct and field and compares them with
these mirrors (python/tests/test_abi.py). Op families name their own args structs in their
module under rlk/ops/.

Every mirrored enum is built from the header too (c_enum) and registered under its C name: its
members are the C constants with their prefix taken off, and when the library loads they are
compared with its table of every constant (rlk_abi_enum_constant; see _lib.check_enums), so a
header whose constants differ from the loaded library's fails the import instead of passing a
wrong value.
"""
import ctypes
import enum
import sys

from . import _header

ABI_STRUCTS = {}


def c_struct(name):
    """The ctypes mirror of the C struct `name`, read from rlk.h, registered under that name."""
    cls = _header.struct(name)
    ABI_STRUCTS[name] = cls
    return cls


c_constant = _header.constant  # an integer #define of rlk.h, by name

C_ENUMS = {}  # IntEnum mirror -> (its C enum's typedef name, the prefixes of its constants)


_INT_RANGES = {}  # (struct class, field) -> (lo, hi, name): the [lo, hi) of its C integer type


def set_int(struct, field, value, what=None):
    """struct.field = value for an integer field, refused (InvalidArgument naming `what`, else
    the field) where the value is no integer or the field's C type cannot hold it: ctypes would
    keep the low bits, and the library would read another setting (a top_k of 2^32 + 3 as 3)."""
    key = (struct.__class__, field)
    r = _INT_RANGES.get(key)
    if r is None:
        ctype = dict(struct.__class__._fields_)[field]
        bits = 8 * ctypes.sizeof(ctype)
        signed = ctype(-1).value < 0
        r = _INT_RANGES[key] = ((-(1 << (bits - 1)), 1 << (bits - 1), "int%d_t" % bits) if signed
                                else (0, 1 << bits, "uint%d_t" % bits))
    if value.__class__ is not int:
        if isinstance(value, (float, str, bytes)) and not (isinstance(value, float) and value.is_integer()):
            from .errors import InvalidArgument
            raise InvalidArgument("%s: %r is not an integer" % (what or field, value))
        value = int(value)
    if not r[0] <= value < r[1]:
        from .errors import InvalidArgument
        raise InvalidArgument("%s: %d is outside what the library's %s holds" % (what or field, value, r[2]))
    setattr(struct, field, value)


_ENUM_KEYS = {}  # enum class -> {member, its value, its spellings: int}


def _enum_keys(enum_cls):
    keys = {}
    for name, m in enum_cls.__members__.items():  # aliases too (Backend.CPU)
        for k in (m.value, name, name.lower(), name.lower().replace("_", "-")):
            keys[k] = int(m.value)
    _ENUM_KEYS[enum_cls] = keys
    return keys


def c_enum(py_name, name, *prefixes, aliases=()):
    """The IntEnum mirror of the C enum `name`, read from rlk.h: each member is a constant of it
    with the first of `prefixes` it starts with taken off (RLK_ADV_RLOO is RLOO); `aliases` are
    other spellings of a member's value, as (spelling, value) pairs."""
    members = []
    for constant, value in _header.enum(name):
        prefix = next((p for p in prefixes if constant.startswith(p)), "")
        members.append((constant[len(prefix):], value))
    cls = enum.IntEnum(py_name, members + list(aliases), module=sys._getframe(1).f_globals.get("__name__"))
    C_ENUMS[cls] = (name, prefixes)
    _enum_keys(cls)  # now, not at a first call that torch.compile traces (a dict written there breaks the graph)
    return cls


# CPU: the host backend under the name torch gives its device
Backend = c_enum("Backend", "rlk_backend", "RLK_BACKEND_", aliases=[("CPU", 3)])
LogLevel = c_enum("LogLevel", "rlk_log_level", "RLK_LOG_")
DType = c_enum("DType", "rlk_dtype", "RLK_DTYPE_", "RLK_")


DTYPE_SIZE = {DType.F32: 4, DType.F16: 2, DType.BF16: 2, DType.F64: 8, DType.I32: 4,
              DType.I64: 8, DType.BOOL: 1}

# Short names accepted wherever a dtype is asked for, as rlk_dtype_name spells them.
DTYPE_BY_NAME = {"f32": DType.F32, "f16": DType.F16, "bf16": DType.BF16, "f64": DType.F64,
                 "i32": DType.I32, "i64": DType.I64, "bool": DType.BOOL}

MAX_DIMS = c_constant("RLK_MAX_DIMS")

Tensor = c_struct("rlk_tensor")  # data pointer, dtype, shape and strides in elements; data NULL = absent
ContextOptions = c_struct("rlk_context_options")
DeviceInfo = c_struct("rlk_device_info")
Counters = c_struct("rlk_counters")


def enum_value(enum_cls, value, what):
    """An enum argument given as the enum, its int value, or a name ("grpo", "mean-only",
    "MEAN_ONLY"); raises InvalidArgument naming `what` otherwise."""
    # The common spellings are one dict lookup; only exact ints, strs and members of enum_cls
    # take it (True == 1 and 1.0 == 1 would match an int key, and must not).
    cls = value.__class__
    if cls is int or cls is str or cls is enum_cls:
        keys = _ENUM_KEYS.get(enum_cls) or _enum_keys(enum_cls)
        v = keys.get(value)
        if v is not None:
            return v
    return _enum_value_slow(enum_cls, value, what)


def _enum_value_slow(enum_cls, value, what):
    from .errors import InvalidArgument
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        raise InvalidArgument("%s: %r is not one of %s" % (what, value, _names(enum_cls)))
    if isinstance(value, int):
        if value in {m.value for m in enum_cls}:
            return int(value)
    elif isinstance(value, str):
        key = value.strip().upper().replace("-", "_")
        if key in enum_cls.__members__:
            return int(enum_cls[key])
    raise InvalidArgument("%s: %r is not one of %s" % (what, value, _names(enum_cls)))


def _names(enum_cls):
    # every name a value may take, aliases too ("cpu" for the host backend)
    return ", ".join(n.lower().replace("_", "-") for n in enum_cls.__members__)

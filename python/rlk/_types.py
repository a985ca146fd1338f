"""ctypes mirrors of the core structs and enums of include/rlk.h.

Every mirrored struct is registered with @abi_struct under its C name. Before one is passed
to the library its size is compared with rlk_abi_struct_size(name) (see _lib.check_abi), and the
test suite compiles a small C program that prints sizeof and offsetof of every registered
struct and field and compares them with these mirrors (python/tests/test_abi.py).
Op families keep their own args structs in their module under rlk/ops/.

Every mirrored enum is registered with @c_enum under its C name: its members are the C
constants with their prefix taken off, and when the library loads they are compared with its
table of every constant of the header (rlk_abi_enum_constant; see _lib.check_enums), so a
constant added, removed or renumbered in the header fails the import instead of passing a wrong
value.
"""
import ctypes
import enum

ABI_STRUCTS = {}


def abi_struct(name):
    """Registers a ctypes.Structure subclass as the mirror of the C struct `name`."""
    def register(cls):
        cls._abi_name_ = name
        ABI_STRUCTS[name] = cls
        return cls
    return register


C_ENUMS = {}  # IntEnum mirror -> (its C enum's typedef name, the prefixes of its constants)


def c_enum(name, *prefixes):
    """Registers an IntEnum as the mirror of the C enum `name`: each member is a constant of it
    with the first of `prefixes` it starts with taken off (RLK_ADV_RLOO is RLOO); aliases are
    other spellings of a member's value."""
    def register(cls):
        C_ENUMS[cls] = (name, prefixes)
        return cls
    return register


@c_enum("rlk_backend", "RLK_BACKEND_")
class Backend(enum.IntEnum):
    AUTO = 0
    CUDA = 1
    HIP = 2
    HOST = 3
    CPU = 3  # the host backend under the name torch gives its device


@c_enum("rlk_log_level", "RLK_LOG_")
class LogLevel(enum.IntEnum):
    DEFAULT = -1
    ERROR = 0
    WARN = 1
    INFO = 2
    DEBUG = 3


@c_enum("rlk_dtype", "RLK_DTYPE_", "RLK_")
class DType(enum.IntEnum):
    INVALID = 0
    F32 = 1
    F16 = 2
    BF16 = 3
    F64 = 4
    I32 = 5
    I64 = 6
    BOOL = 7


DTYPE_SIZE = {DType.F32: 4, DType.F16: 2, DType.BF16: 2, DType.F64: 8, DType.I32: 4,
              DType.I64: 8, DType.BOOL: 1}

# Short names accepted wherever a dtype is asked for, as rlk_dtype_name spells them.
DTYPE_BY_NAME = {"f32": DType.F32, "f16": DType.F16, "bf16": DType.BF16, "f64": DType.F64,
                 "i32": DType.I32, "i64": DType.I64, "bool": DType.BOOL}

MAX_DIMS = 4


@abi_struct("rlk_tensor")
class Tensor(ctypes.Structure):
    """rlk_tensor: data pointer, dtype, shape and strides in elements. data NULL = absent."""
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
    ]


@abi_struct("rlk_context_options")
class ContextOptions(ctypes.Structure):
    _fields_ = [
        ("backend", ctypes.c_int),
        ("device", ctypes.c_int),
        ("cache_dir", ctypes.c_char_p),
        ("log_level", ctypes.c_int),
        ("compile_only", ctypes.c_int),
        ("target", ctypes.c_char_p),
    ]


@abi_struct("rlk_device_info")
class DeviceInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 128),
        ("target", ctypes.c_char * 32),
        ("compiler", ctypes.c_char * 64),
        ("compute_major", ctypes.c_int),
        ("compute_minor", ctypes.c_int),
        ("multiprocessors", ctypes.c_int),
        ("compile_only", ctypes.c_int),
        ("total_memory", ctypes.c_size_t),
    ]


@abi_struct("rlk_counters")
class Counters(ctypes.Structure):
    _fields_ = [
        ("calls", ctypes.c_uint64),
        ("memory_hits", ctypes.c_uint64),
        ("disk_hits", ctypes.c_uint64),
        ("misses", ctypes.c_uint64),
        ("compiles", ctypes.c_uint64),
        ("rebuilt", ctypes.c_uint64),
        ("compile_seconds", ctypes.c_double),
        ("load_seconds", ctypes.c_double),
    ]


_ENUM_KEYS = {}  # enum class -> {member, its value, its spellings: int}


def _enum_keys(enum_cls):
    keys = {}
    for name, m in enum_cls.__members__.items():  # aliases too (Backend.CPU)
        for k in (m.value, name, name.lower(), name.lower().replace("_", "-")):
            keys[k] = int(m.value)
    _ENUM_KEYS[enum_cls] = keys
    return keys


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
    return ", ".join(m.name.lower().replace("_", "-") for m in enum_cls)

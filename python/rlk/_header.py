"""The ctypes mirrors of include/rlk.h's structs and the constants of its enums, read from the
header itself.

The header is the one declaration of every struct a caller fills (its fields, their types and
their order) and of every enum's constants. Each mirror is built from it when first asked for
(struct(name), enum(name)), so a field or constant added, renamed or retyped there reaches the
package with no second list to keep. Where the header is looked for, first found wins: the copy
inside the package (rlk/_lib/rlk.h, which every wheel carries beside the library), then the
source tree the package sits in (../include/rlk.h beside python/). A mirror's size is still
compared with the loaded library's (rlk_abi_struct_size, _lib.check_abi) before it is passed in,
and each enum with the library's table of constants at import, so a header of another version
than the library's is caught there.

The reader knows the header's own style only: `typedef struct name { fields } name;` with
fields `type a;`, `type a, b;` or `type a[N]` (N a number or a #define of the header), and
`typedef enum name { A = 0, B, ... } name;` with integer values; a type the table below does not
know, or a value that is not an integer, is an ImportError naming it, never a guess.
"""
import ctypes
import re
import threading
from pathlib import Path

_HERE = Path(__file__).resolve().parent
PLACES = (("installed copy", _HERE / "_lib" / "rlk.h"),
          ("source tree", _HERE.parent.parent / "include" / "rlk.h"))

_SCALARS = {
    "int": ctypes.c_int, "float": ctypes.c_float, "double": ctypes.c_double, "char": ctypes.c_char,
    "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64, "size_t": ctypes.c_size_t,
}

_lock = threading.Lock()
_parsed = None  # (structs: name -> [(field, type text, array length text or None)], enums, defines)
_built = {}     # name -> ctypes.Structure


class HeaderNotFound(ImportError):
    """No rlk.h where the package looks for one, or one it cannot read."""


def path():
    """The header the mirrors come from."""
    for _, p in PLACES:
        if p.is_file():
            return p
    raise HeaderNotFound("rlk: the package's structs are read from rlk.h, which is not here; tried:\n  "
                         + "\n  ".join("%s: %s (absent)" % (how, p) for how, p in PLACES))


def _parse(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    defines = {m.group(1): int(m.group(2))
               for m in re.finditer(r"^#define\s+(\w+)\s+\(?(-?\d+)\)?[ \t]*$", text, re.M)}
    enums = {}
    for m in re.finditer(r"typedef enum \w*\s*\{([^}]*)\}\s*(\w+)\s*;", text):
        constants, value = [], -1
        for item in (" ".join(i.split()) for i in m.group(1).split(",")):
            if not item:
                continue
            c = re.match(r"(\w+)(?: = (-?\d+))?$", item)
            if c is None:
                raise HeaderNotFound("rlk.h: %s: cannot read the constant `%s`" % (m.group(2), item))
            value = int(c.group(2)) if c.group(2) is not None else value + 1
            constants.append((c.group(1), value))
        enums[m.group(2)] = constants
    structs = {}
    for m in re.finditer(r"typedef struct (\w+)\s*\{(.*?)\}\s*(\w+)\s*;", text, re.S):
        fields = []
        for decl in m.group(2).split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            first = re.match(r"((?:const )?\w+(?: \*)?)\s*(\*?\s*\w+(?:\[\w+\])?)$",
                             decl.split(",")[0].strip())
            if first is None:
                raise HeaderNotFound("rlk.h: %s: cannot read the field `%s`" % (m.group(3), decl))
            base = first.group(1)
            for item in [first.group(2)] + [d.strip() for d in decl.split(",")[1:]]:
                d = re.match(r"(\*?)\s*(\w+)(?:\[(\w+)\])?$", item)
                if d is None:
                    raise HeaderNotFound("rlk.h: %s: cannot read the field `%s`" % (m.group(3), item))
                ctype = (base + " *" if d.group(1) else base).replace("* *", "**")
                fields.append((d.group(2), ctype, d.group(3)))
        structs[m.group(3)] = fields
    return structs, enums, defines


def _ctype(struct_name, field, text, length):
    structs, enums, defines = _parsed
    t = text.replace("const ", "")
    if t.endswith("*"):
        pointee = t[:-1].strip()
        if pointee == "char":
            base = ctypes.c_char_p
        elif pointee in _SCALARS:
            base = ctypes.POINTER(_SCALARS[pointee])
        else:
            base = ctypes.c_void_p
    elif t in _SCALARS:
        base = _SCALARS[t]
    elif t in enums:
        base = ctypes.c_int
    elif t in structs:
        base = _build(t)
    else:
        raise HeaderNotFound("rlk.h: %s.%s: the type `%s` has no ctypes mirror" % (struct_name, field, text))
    if length is None:
        return base
    n = int(length) if length.isdigit() else defines.get(length)
    if n is None:
        raise HeaderNotFound("rlk.h: %s.%s: the length `%s` is not a #define of the header"
                             % (struct_name, field, length))
    return base * n


def _build(name):
    cls = _built.get(name)
    if cls is None:
        fields = _parsed[0].get(name)
        if fields is None:
            raise HeaderNotFound("rlk.h (%s) declares no struct %s" % (path(), name))
        cls = type(name, (ctypes.Structure,),
                   {"_fields_": [(f, _ctype(name, f, t, n)) for f, t, n in fields], "_abi_name_": name,
                    "__doc__": "The ctypes mirror of %s (include/rlk.h)." % name})
        _built[name] = cls
    return cls


def _header():
    global _parsed
    with _lock:
        if _parsed is None:
            p = path()
            try:
                _parsed = _parse(p.read_text())
            except OSError as e:
                raise HeaderNotFound("rlk: cannot read %s: %s" % (p, e)) from None
        return _parsed


def struct(name):
    """The ctypes.Structure mirroring the header's struct `name` (one class per name)."""
    _header()
    with _lock:
        return _build(name)


def enum(name):
    """The constants of the header's enum `name`, [(constant, value)] in declaration order."""
    constants = _header()[1].get(name)
    if constants is None:
        raise HeaderNotFound("rlk.h (%s) declares no enum %s" % (path(), name))
    return list(constants)


def constant(name):
    """A #define of the header whose value is an integer (RLK_MAX_DIMS)."""
    value = _header()[2].get(name)
    if value is None:
        raise HeaderNotFound("rlk.h (%s) has no integer #define %s" % (path(), name))
    return value

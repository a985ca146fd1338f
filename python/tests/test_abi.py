"""The package's ctypes mirrors against include/rlk.h.

Two checks: every mirrored struct's size against rlk_abi_struct_size() of the loaded library,
and a small C program compiled against the header that prints sizeof and offsetof of every
mirrored struct and field, compared field by field with ctypes. A field renamed, reordered,
added or retyped in the header fails one of them."""
import ctypes
import os
import shutil
import subprocess

import pytest

import rlk  # noqa: F401  (imports every op family, registering its structs)
from rlk import _lib
from rlk._types import ABI_STRUCTS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.path.join(REPO, "include", "rlk.h")


def test_every_op_family_registers_its_struct():
    for name, op in rlk.OPS.items():
        assert ABI_STRUCTS.get(op.args_struct._abi_name_) is op.args_struct
        assert op.args_struct._abi_name_ == "rlk_%s_args" % name


def test_sizes_match_the_library():
    lib = rlk.library()
    assert hasattr(lib, "rlk_abi_struct_size"), "librlk lacks rlk_abi_struct_size"
    assert lib.rlk_abi_struct_size(b"rlk_no_such_struct") == 0
    assert lib.rlk_abi_struct_size(None) == 0
    for name, cls in ABI_STRUCTS.items():
        size = lib.rlk_abi_struct_size(name.encode())
        assert size == ctypes.sizeof(cls), "%s: library %d, mirror %d" % (name, size, ctypes.sizeof(cls))


def _c_program():
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "rlk.h"', "int main(void) {"]
    for name, cls in sorted(ABI_STRUCTS.items()):
        lines.append('  printf("%s %%zu\\n", sizeof(%s));' % (name, name))
        for field, _ in cls._fields_:
            lines.append('  printf("%s.%s %%zu %%zu\\n", offsetof(%s, %s), sizeof(((%s *)0)->%s));'
                         % (name, field, name, field, name, field))
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(not os.path.exists(HEADER), reason="not run from the source tree")
@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")
def test_layouts_match_the_header(tmp_path):
    src = tmp_path / "abi.c"
    exe = tmp_path / "abi"
    src.write_text(_c_program())
    cc = shutil.which("cc") or shutil.which("gcc")
    r = subprocess.run([cc, "-std=c11", "-I", os.path.dirname(HEADER), str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, "a mirrored struct or field is not in rlk.h:\n" + r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    c = {}
    for line in filter(None, out):
        parts = line.split()
        c[parts[0]] = tuple(int(p) for p in parts[1:])
    for name, cls in ABI_STRUCTS.items():
        assert c[name] == (ctypes.sizeof(cls),), "%s: sizeof %s in C, %d mirrored" % (
            name, c[name], ctypes.sizeof(cls))
        for field, _ in cls._fields_:
            desc = getattr(cls, field)
            assert c["%s.%s" % (name, field)] == (desc.offset, desc.size), \
                "%s.%s: (offset, size) %s in C, (%d, %d) mirrored" % (
                    name, field, c["%s.%s" % (name, field)], desc.offset, desc.size)


@pytest.mark.skipif(not os.path.exists(HEADER), reason="not run from the source tree")
def test_package_version_matches_the_header():
    text = open(HEADER).read()
    ver = [int(text.split("#define RLK_VERSION_%s " % k)[1].split()[0]) for k in ("MAJOR", "MINOR")]
    assert ver == [_lib.VERSION_MAJOR, _lib.VERSION_MINOR]
    assert rlk.__version__.startswith("%d.%d." % tuple(ver))


@pytest.mark.skipif(not os.path.exists(HEADER), reason="not run from the source tree")
def test_every_public_struct_has_a_size_row():
    import re
    names = re.findall(r"typedef struct (rlk_\w+) \{", open(HEADER).read())
    assert "rlk_tensor" in names
    lib = rlk.library()
    missing = [n for n in names if lib.rlk_abi_struct_size(n.encode()) == 0]
    assert not missing, "add these to src/core/abi.c: %s" % missing


def _header_enums():
    """{constant: its enum's typedef name (None for an unnamed enum)} for every enum of rlk.h,
    parsed from the header's text."""
    import re
    text = re.sub(r"/\*.*?\*/", "", open(HEADER).read(), flags=re.S)
    found = {}
    for m in re.finditer(r"enum\s*(\w*)\s*\{(.*?)\}", text, re.S):
        for item in m.group(2).split(","):
            name = item.split("=")[0].strip()
            if name:
                found[name] = m.group(1) or None
    return found


@pytest.mark.skipif(not os.path.exists(HEADER), reason="not run from the source tree")
def test_enum_table_is_the_headers_enums():
    header = _header_enums()
    assert header["RLK_ADV_RLOO"] == "rlk_advantage_mode" and header["RLK_PL_METRIC_KL_MEAN"] is None
    table = _lib.enum_constants()
    missing = sorted(set(header) - set(table))
    assert not missing, "add these to the enum table of src/runtime/abi.c: %s" % missing
    extra = sorted(set(table) - set(header))
    assert not extra, "not enum constants of rlk.h: %s" % extra
    wrong = sorted(n for n in header if table[n][0] != header[n])
    assert not wrong, "rows under another enum than the header's: %s" % [(n, table[n][0]) for n in wrong]


def test_enum_table_ends_and_takes_null_pointers():
    lib = rlk.library()
    n = len(_lib.enum_constants())
    assert n > 0
    assert lib.rlk_abi_enum_constant(n, None, None) is None
    assert lib.rlk_abi_enum_constant(n - 1, None, None) is not None
    assert lib.rlk_abi_enum_constant(2 ** 63, None, None) is None


def _package_enums():
    """Every IntEnum the package defines (rlk._types and the op families' modules)."""
    import enum
    import importlib
    import pkgutil
    from rlk import _types, ops
    mods = [_types] + [importlib.import_module("rlk.ops." + m.name)
                       for m in pkgutil.iter_modules(ops.__path__)]
    return {v for mod in mods for v in vars(mod).values()
            if isinstance(v, type) and issubclass(v, enum.IntEnum) and v.__module__ == mod.__name__}


def test_every_enum_mirror_is_registered_and_checked():
    from rlk._types import C_ENUMS
    enums = _package_enums()
    assert rlk.AdvantageMode in enums and rlk.DType in enums
    unregistered = sorted(e.__name__ for e in enums - set(C_ENUMS))
    assert not unregistered, "register these with @_types.c_enum: %s" % unregistered
    unchecked = sorted(e.__name__ for e in C_ENUMS if not _lib._abi_checked.get(e))
    assert not unchecked, "not checked against the library at import: %s" % unchecked


def test_enum_mirror_values_are_the_libraries():
    table = _lib.enum_constants()
    assert int(rlk.AdvantageMode.PASSK_UNSCALED) == table["RLK_ADV_PASSK_UNSCALED"][1]
    assert int(rlk.DType.BF16) == table["RLK_BF16"][1]
    assert int(rlk.DType.INVALID) == table["RLK_DTYPE_INVALID"][1]
    assert rlk.Backend.CPU is rlk.Backend.HOST  # an alias, not a constant of the C enum
    assert int(rlk.LogLevel.DEFAULT) == table["RLK_LOG_DEFAULT"][1] == -1


@pytest.mark.parametrize("members", [
    {"STRAIGHT_THROUGH": 0, "THROUGH_MEAN": 2},              # a renumbered constant
    {"STRAIGHT_THROUGH": 0},                                 # a constant the mirror lacks
    {"STRAIGHT_THROUGH": 0, "THROUGH_MEAN": 1, "EXTRA": 2},  # a member the library lacks
], ids=["renumbered", "missing", "extra"])
def test_a_wrong_enum_mirror_fails_the_check(members):
    import enum
    from rlk._types import C_ENUMS
    from rlk.errors import AbiMismatch
    wrong = enum.IntEnum("WrongSeqRatioGrad", members)
    C_ENUMS[wrong] = ("rlk_seq_ratio_grad", ("RLK_SEQ_RATIO_",))
    try:
        with pytest.raises(AbiMismatch, match="rlk_seq_ratio_grad: librlk at .* has "
                                              r"\{STRAIGHT_THROUGH = 0, THROUGH_MEAN = 1\}"):
            _lib.check_enums()
    finally:
        del C_ENUMS[wrong]
        _lib._abi_checked.pop(wrong, None)


def test_error_classes_carry_the_status_values():
    from rlk import errors
    table = _lib.enum_constants()
    statuses = {n: v for n, (t, v) in table.items() if t == "rlk_status" and n != "RLK_OK"}
    assert table["RLK_OK"][1] == 0
    for name, value in statuses.items():
        cls = errors.error_for_status(value, "x").__class__
        assert cls.status == value and cls.__doc__.startswith(name), (name, cls)


def test_metric_names_are_the_slots_in_order():
    table = _lib.enum_constants()
    for prefix, count, names in (("RLK_PL_METRIC_", "RLK_POLICY_LOSS_METRICS", rlk.POLICY_LOSS_METRICS),
                                 ("RLK_VL_METRIC_", "RLK_VALUE_LOSS_METRICS", rlk.VALUE_LOSS_METRICS)):
        assert table[count][1] == len(names)
        assert [table[prefix + n.upper()][1] for n in names] == list(range(len(names)))

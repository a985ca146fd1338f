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

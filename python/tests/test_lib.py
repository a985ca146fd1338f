"""Finding and loading the library, errors, contexts."""
import ctypes
import ctypes.util
import os
import shutil
import subprocess
import sys
import threading

import pytest

import rlk
from rlk import _lib
from rlk._tensor import Op
from rlk.errors import error_for_status

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, **env):
    e = dict(os.environ)
    e["PYTHONPATH"] = PYTHON_DIR
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=60)


def test_loaded_library_matches_the_package():
    lib = rlk.library()
    assert rlk.version_string().split(".")[0] == rlk.__version__.split(".")[0]
    assert lib.rlk_version() // 10000 == _lib.VERSION_MAJOR
    assert os.path.exists(rlk.library_path()) or rlk.library_path().startswith("librlk")


def test_rlk_library_wins_and_a_bad_one_is_an_import_error(tmp_path):
    r = run_python("import rlk; print(rlk.library_path())", RLK_LIBRARY=rlk.library_path())
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == rlk.library_path()
    catch = "try:\n import rlk\nexcept ImportError as e:\n print(type(e).__name__, e)"
    missing = str(tmp_path / "nope.so")
    r = run_python(catch, RLK_LIBRARY=missing)
    assert r.returncode == 0, r.stderr
    assert "LibraryNotFound RLK_LIBRARY=%s: no such file" % missing in r.stdout
    # a loadable library that is not librlk
    libm = ctypes.util.find_library("m")
    if libm:
        r = run_python(catch, RLK_LIBRARY="/lib/x86_64-linux-gnu/" + libm)
        if "no such file" not in r.stdout:
            assert "is not librlk" in r.stdout, r.stdout + r.stderr


def test_import_without_a_library_names_every_place_tried(tmp_path):
    """A package copied away from its library (no RLK_LIBRARY, no rlk/_lib, no build/ beside
    it, nothing on the loader's path) fails to import, listing where it looked."""
    pkg = tmp_path / "site"
    shutil.copytree(os.path.join(PYTHON_DIR, "rlk"), pkg / "rlk",
                    ignore=shutil.ignore_patterns("_lib", "__pycache__"))
    (pkg / "rlk" / "_lib").mkdir()
    shutil.copyfile(os.path.join(os.path.dirname(PYTHON_DIR), "include", "rlk.h"), pkg / "rlk" / "_lib" / "rlk.h")
    r = _import_copied(pkg, tmp_path)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()
    assert any("rlk.errors.LibraryNotFound: librlk could not be loaded" in l for l in last), r.stderr
    assert str(pkg / "rlk" / "_lib" / "librlk.so.0") + " (absent)" in r.stderr
    # not a checkout's python/: no build/ beside it is looked at (nor listed)
    assert str(tmp_path / "build" / "lib" / "librlk.so.0") not in r.stderr
    assert "source tree:" not in r.stderr
    assert "system loader: librlk.so.0" in r.stderr
    # a checkout's python/ looks in its build/lib
    tree = tmp_path / "checkout"
    shutil.copytree(pkg / "rlk", tree / "python" / "rlk")
    (tree / "include").mkdir()
    shutil.copyfile(os.path.join(os.path.dirname(PYTHON_DIR), "include", "rlk.h"), tree / "include" / "rlk.h")
    r = _import_copied(tree / "python", tmp_path)
    assert r.returncode != 0
    assert "source tree: " + str(tree / "build" / "lib" / "librlk.so.0") + " (absent)" in r.stderr, r.stderr


def _import_copied(pkg, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("RLK_LIBRARY", "LD_LIBRARY_PATH")}
    env["PYTHONPATH"] = str(pkg)
    return subprocess.run([sys.executable, "-c", "import rlk"], env=env, capture_output=True,
                          text=True, timeout=60, cwd=str(cwd))


def test_import_without_the_header_names_every_place_tried(tmp_path):
    """The structs are read from rlk.h: a package with neither its copy nor a source tree around
    it fails to import with an ImportError naming both places."""
    pkg = tmp_path / "site"
    shutil.copytree(os.path.join(PYTHON_DIR, "rlk"), pkg / "rlk",
                    ignore=shutil.ignore_patterns("_lib", "__pycache__"))
    r = _import_copied(pkg, tmp_path)
    assert r.returncode != 0
    assert "rlk._header.HeaderNotFound: rlk: the package's structs are read from rlk.h" in r.stderr, r.stderr
    assert str(pkg / "rlk" / "_lib" / "rlk.h") + " (absent)" in r.stderr
    assert str(tmp_path / "include" / "rlk.h") + " (absent)" in r.stderr


def test_errors_map_statuses():
    assert isinstance(error_for_status(1, "x"), rlk.InvalidArgument)
    assert isinstance(error_for_status(1, "x"), ValueError)
    assert isinstance(error_for_status(2, "x"), rlk.Unsupported)
    assert isinstance(error_for_status(3, "x"), rlk.Unavailable)
    assert isinstance(error_for_status(4, "log"), rlk.CompileError)
    assert isinstance(error_for_status(8, "x"), MemoryError)
    assert isinstance(error_for_status(10, "x"), TimeoutError)
    e = error_for_status(99, "odd")
    assert type(e) is rlk.RlkError and e.status == 99 and str(e) == "odd"
    for code in range(1, 12):
        err = error_for_status(code, "m")
        assert isinstance(err, rlk.RlkError) and err.status == code and err.message == "m"
        # the library names every status the package maps
        assert rlk.library().rlk_status_string(code).decode() not in ("", "unknown status")


def test_context_is_shared_and_thread_safe(host):
    seen = []
    rlk.release_contexts()
    threads = [threading.Thread(target=lambda: seen.append(rlk.context("host"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 8 and all(c is seen[0] for c in seen)
    ctx = seen[0]
    assert ctx.backend == rlk.Backend.HOST
    assert ctx.info()["target"].startswith("host")
    assert set(ctx.counters()) >= {"calls", "compiles", "misses"}
    assert ctx.cache_dir == os.environ["RLK_CACHE_DIR"] or ctx.cache_dir.startswith(
        os.environ["RLK_CACHE_DIR"])
    assert ctx.precompile("group_advantage mode=rloo group_size=4") >= 1
    with pytest.raises(rlk.InvalidArgument, match="unknown setting"):
        ctx.precompile("group_advantage colour=blue")


def test_context_errors():
    with pytest.raises(rlk.InvalidArgument, match="backend"):
        rlk.context("tpu")


def test_missing_op_is_unavailable():
    class Args(ctypes.Structure):
        _fields_ = [("x", ctypes.c_int)]
        _abi_name_ = "rlk_no_such_op_args"
    op = Op("no_such_op", Args)
    assert not op.available()
    with pytest.raises(rlk.Unavailable, match="rlk_no_such_op_args"):
        op.new_args()


def test_wrong_struct_size_is_an_abi_mismatch():
    class Args(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p)]
        _abi_name_ = "rlk_group_advantage_args"
    with pytest.raises(rlk.AbiMismatch, match="rlk_group_advantage_args"):
        Op("group_advantage", Args).new_args()


def test_available_ops():
    assert "group_advantage" in rlk.available_ops()

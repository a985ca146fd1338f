"""The compiled entry: a repeated call on torch tensors without the Python path's per-call work.

_entry.cpp holds Plan: one call the Python path made, kept (its args struct, where each tensor's
pointer goes, how the outputs lie). A later call with the same settings and tensors of the same
dtypes, device, sizes and strides runs through the plan: pointers written, outputs allocated,
the library called, all in C++. Anything else (another shape, a numpy array, a stream= argument,
status checking on) takes the Python path, which may keep a new plan. Results are the Python
path's bit for bit: the library receives the same struct with other data pointers.

The module is built on first use against the torch in use (a C++ compiler and torch's headers;
about 15 s on one core), in the background while calls take the Python path (one built before is
loaded at once), and kept in RLK_TORCH_ENTRY_DIR (default: $XDG_CACHE_HOME/rlk-torch-entry or
~/.cache/rlk-torch-entry), in a folder named by a digest of the source, torch, Python and the
compile line. RLK_TORCH_ENTRY: "0" never builds or uses it, "wait" builds it in the foreground on
first use (benchmarks, tests). A build that fails is logged once (the "rlk" logger, INFO) and
calls keep the Python path.
"""
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time

logger = logging.getLogger("rlk")

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_entry.cpp")
_NAME = "_rlk_entry"
_lock = threading.Lock()
_state = {"module": None, "started": False, "error": None, "thread": None}
plans = {}  # (op name, key) -> Plan; emptied when contexts are released (their handles go)
_MAX_PLANS = 4096


def _mode():
    return os.environ.get("RLK_TORCH_ENTRY", "1").strip().lower()


def _root():
    """Where built modules are kept: RLK_TORCH_ENTRY_DIR, else rlk-torch-entry beside the
    default kernel cache (the kernel cache's own folder holds kernels alone)."""
    root = os.environ.get("RLK_TORCH_ENTRY_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = os.path.join(xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache"),
                            "rlk-torch-entry")
    return root


def _compiler():
    for cxx in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if cxx and shutil.which(cxx):
            return shutil.which(cxx)
    return None


def _command(torch, cxx, out):
    """The compile and link line for the module at `out`."""
    tdir = os.path.dirname(os.path.abspath(torch.__file__))
    lib = os.path.join(tdir, "lib")
    C = torch._C
    flags = ["-O2", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", "-w",
             "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(C._GLIBCXX_USE_CXX11_ABI),
             "-DTORCH_EXTENSION_NAME=" + _NAME]
    for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):  # torch's pybind11 ABI, as its extensions do
        v = getattr(C, "_PYBIND11_" + name, None)
        if v is not None:
            flags.append('-DPYBIND11_%s="%s"' % (name, v))
    return ([cxx] + flags + ["-I" + os.path.join(tdir, "include"),
                             "-I" + os.path.join(tdir, "include", "torch", "csrc", "api", "include"),
                             "-I" + sysconfig.get_paths()["include"], _SOURCE, "-o", out,
                             "-L" + lib, "-Wl,-rpath," + lib, "-lc10", "-ltorch", "-ltorch_cpu",
                             "-ltorch_python"])


def _locate():
    """(the module's path, its compile line writing `OUT`): named by a digest of the source,
    torch, Python and the line."""
    import torch
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (CXX, c++, g++ or clang++)")
    with open(_SOURCE, "rb") as f:
        h = hashlib.sha256(f.read())
    line = _command(torch, cxx, "OUT")
    for part in (torch.__version__, str(torch.version.git_version), sys.version, " ".join(line),
                 sysconfig.get_config_var("EXT_SUFFIX") or ""):
        h.update(b"\0" + part.encode())
    folder = os.path.join(_root(), h.hexdigest()[:32])
    return os.path.join(folder, _NAME + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")), line


def _load(path):
    spec = importlib.util.spec_from_file_location(_NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _state["module"] = module


def _fail(e):
    _state["error"] = "%s: %s" % (type(e).__name__, e)
    logger.info("rlk: the compiled torch entry is not in use (%s); calls take the Python path",
                _state["error"])


def _build(path, line):
    """Compiles the module to `path` and loads it; a failure is said once and leaves it off."""
    t0 = time.perf_counter()
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        for f in os.listdir(folder):  # what a build cut short (its process ended) left
            old = os.path.join(folder, f)
            if f.endswith(".so.tmp") and time.time() - os.path.getmtime(old) > 600:
                os.unlink(old)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".so.tmp")
        os.close(fd)
        try:
            r = subprocess.run([tmp if a == "OUT" else a for a in line], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError("the compiler failed:\n" + (r.stderr or r.stdout)[-2000:])
            os.replace(tmp, path)  # whole or absent: processes building at once each write their own
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _load(path)
        logger.info("rlk: built the compiled torch entry in %.1f s (%s)", time.perf_counter() - t0, path)
    except Exception as e:  # any failure leaves the Python path
        _fail(e)


def module():
    """The loaded module, or None: not built yet (the first request starts the build), off, or
    its build failed."""
    m = _state["module"]
    if m is not None or _state["started"]:
        return m
    mode = _mode()
    with _lock:
        if _state["started"]:
            return _state["module"]
        _state["started"] = True
        if mode in ("0", "off", "no", "false"):
            _state["error"] = "RLK_TORCH_ENTRY=%s" % mode
            return None
        try:
            path, line = _locate()
            if os.path.exists(path):  # built before: loaded now
                _load(path)
                return _state["module"]
        except Exception as e:
            _fail(e)
            return None
        if mode == "wait":
            _build(path, line)
        else:
            t = threading.Thread(target=_build, args=(path, line), name="rlk-torch-entry", daemon=True)
            _state["thread"] = t
            t.start()
    return _state["module"]


def wait(timeout=None):
    """The module once its build is done (starting it if needed), or None when it is not in use."""
    module()
    t = _state["thread"]
    if t is not None:
        t.join(timeout)
    return _state["module"]


def status():
    """("in use" | "building" | "off: <why>", path or None)."""
    if _state["module"] is not None:
        return "in use", _state["module"].__file__
    if _state["error"] is not None:
        return "off: " + _state["error"], None
    return ("building" if _state["started"] else "not started"), None


def keep(op, key, plan):
    """Keeps plan for (op, key), bounded like the ops' size tables."""
    if len(plans) >= _MAX_PLANS:
        plans.clear()
    plans[(op, key)] = plan


def forget():
    """Drops every plan (the contexts their handles point to are going)."""
    plans.clear()

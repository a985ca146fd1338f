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

It is code this process runs, so it is loaded only from folders this user (or root) owns that no
one else may write, made 0700 (a shared or world-writable RLK_TORCH_ENTRY_DIR leaves the entry
off, as the kernel cache refuses such a root). One process builds a folder's module at a time
(a lock the compiler holds), and the compiler renames its own output into place: a process that
exits mid-build leaves the module to the next one, not a half-written file.
"""
import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import stat
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


def _untrusted(path, root):
    """Why code at `path` may not be loaded (None when it may): it and every folder up to `root`
    a link, someone else's (not this user's, not root's), or writable by group or others."""
    uid = os.geteuid()
    p = os.path.abspath(path)
    root = os.path.abspath(root)
    while True:
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            return "%s is a link" % p
        if st.st_uid not in (0, uid):
            return "%s is owned by uid %d, not this user" % (p, st.st_uid)
        if st.st_mode & 0o022:
            return "%s is writable by group or others" % p
        if p == root or os.path.dirname(p) == p:
            return None
        p = os.path.dirname(p)


def _tighten(folder, root):
    """Folders of this user's from `folder` up to `root` made 0700 where others could write them
    (an earlier version made them under the umask: 0775 under a umask of 002); the root only when
    it is the default one, never an RLK_TORCH_ENTRY_DIR the user chose."""
    uid = os.geteuid()
    p, root = os.path.abspath(folder), os.path.abspath(root)
    while True:
        if p == root and os.environ.get("RLK_TORCH_ENTRY_DIR"):
            return
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == uid and st.st_mode & 0o022:
            os.chmod(p, 0o700)
        if p == root or os.path.dirname(p) == p:
            return
        p = os.path.dirname(p)


def _load(path):
    _tighten(os.path.dirname(path), _root())
    why = _untrusted(path, _root())
    if why:
        raise _Untrusted("not loading the compiled entry: " + why)
    spec = importlib.util.spec_from_file_location(_NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _state["module"] = module


class _Untrusted(RuntimeError):
    """A folder or module others could have written: said as a warning, not only at INFO."""


def _fail(e):
    _state["error"] = "%s: %s" % (type(e).__name__, e)
    (logger.warning if isinstance(e, _Untrusted) else logger.info)(
        "rlk: the compiled torch entry is not in use (%s); calls take the Python path", _state["error"])


# The compile runs in a shell that renames its output into place when it succeeds: the rename is
# the compiler's, done even when the process that started it has exited.
_BUILD_SH = 'tmp=$1; out=$2; shift 2; "$@" && chmod 755 "$tmp" && mv -f "$tmp" "$out"; rc=$?; ' \
            '[ $rc = 0 ] || rm -f "$tmp"; exit $rc'


def _build(path, line):
    """Compiles the module to `path` and loads it; a failure is said once and leaves it off. Under
    the folder's lock: a build another process holds it for is waited for, and its module loaded."""
    t0 = time.perf_counter()
    folder = os.path.dirname(path)
    try:
        root = _root()
        os.makedirs(root, mode=0o700, exist_ok=True)
        _tighten(root, root)
        why = _untrusted(root, root)
        if not why:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            _tighten(folder, root)
            why = _untrusted(folder, root)
        if why:
            raise _Untrusted("not building the compiled entry: " + why)
        lock = os.open(os.path.join(folder, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process's build: waited for
            if os.path.exists(path):
                _load(path)
                return
            for f in os.listdir(folder):  # under the lock, any output left is a build cut short
                if f.endswith(".so.tmp"):
                    os.unlink(os.path.join(folder, f))
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".so.tmp")
            os.close(fd)
            log = os.path.join(folder, "build.log")
            with open(log, "w") as out:
                # the lock passes to the compile, which holds it until it ends (this process may not)
                r = subprocess.run(["sh", "-c", _BUILD_SH, "sh", tmp, path] +
                                   [tmp if a == "OUT" else a for a in line],
                                   stdout=out, stderr=subprocess.STDOUT, pass_fds=(lock,))
            if r.returncode != 0:
                with open(log) as f:
                    raise RuntimeError("the compiler failed:\n" + f.read()[-2000:])
        finally:
            os.close(lock)
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

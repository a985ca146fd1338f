"""Shared fixtures: a private kernel cache for the session, and the places an op can run
(numpy on the host backend always; torch CPU and torch CUDA when torch and a GPU are there)."""
import os
import shutil
import sys
import tempfile

import numpy as np
import pytest

_CACHE = tempfile.mkdtemp(prefix="rlk-pytest-cache-")
# Before the library reads it: tests never touch the user's cache.
os.environ["RLK_CACHE_DIR"] = _CACHE
# nor the user's compiled torch entry (rlk/_entry.py): built once here, for this session
os.environ["RLK_TORCH_ENTRY_DIR"] = _CACHE + "-torch-entry"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import rlk  # noqa: F401  (an installed package, or PYTHONPATH=python)
except ImportError:  # the package beside these tests
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_CACHE, ignore_errors=True)
    shutil.rmtree(_CACHE + "-torch-entry", ignore_errors=True)


def _gpu_test(item):
    """A test that exists for the device: guarded by a CUDA-availability skipif, or the
    torch-cuda place of a parametrized test."""
    for m in item.iter_markers("skipif"):
        if "CUDA" in str(m.kwargs.get("reason", "")):
            return True
    spec = getattr(item, "callspec", None)
    return spec is not None and any(getattr(v, "cuda", False) for v in spec.params.values())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a GPU run (RLK_TEST_GPU=1, as tools/bench/gpu-tests.sh sets), a device test that skips
    tested nothing where it was meant to: it fails, with the skip's reason."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and os.environ.get("RLK_TEST_GPU") == "1" and HAVE_CUDA and _gpu_test(item):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = "a GPU test skipped on a GPU run: %s" % reason


try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

HAVE_CUDA = HAVE_TORCH and torch.cuda.is_available()


class Place:
    """Makes arrays of one framework and device from numpy arrays, and reads them back."""

    def __init__(self, name):
        self.name = name
        self.torch = name != "numpy"
        self.cuda = name == "torch-cuda"

    def to(self, a):
        if not self.torch:
            return np.ascontiguousarray(a)
        t = torch.from_numpy(np.ascontiguousarray(a))
        return t.cuda() if self.cuda else t

    def back(self, x):
        if self.torch:
            if self.cuda:
                torch.cuda.synchronize()
            return x.detach().cpu().numpy()
        return x

    def __repr__(self):
        return self.name


def _places():
    out = [pytest.param(Place("numpy"), id="numpy")]
    out.append(pytest.param(Place("torch-cpu"), id="torch-cpu", marks=pytest.mark.skipif(
        not HAVE_TORCH, reason="torch is not installed")))
    out.append(pytest.param(Place("torch-cuda"), id="torch-cuda", marks=pytest.mark.skipif(
        not HAVE_CUDA, reason="no CUDA device (or no torch)")))
    return out


PLACES = _places()


_host_state = {}


def require_host():
    """Skips the test when the host backend cannot run here (no clang, as on some GPU machines)."""
    if "error" not in _host_state:
        import rlk
        try:
            rlk.context("host")
            _host_state["error"] = None
        except rlk.RlkError as e:
            _host_state["error"] = str(e)
    if _host_state["error"]:
        pytest.skip("the host backend is unavailable: %s" % _host_state["error"])


@pytest.fixture
def host():
    require_host()


def run_example(name, *args, timeout=300):
    """examples/<name> run with args by this interpreter (skipped where the tests are not in the
    source tree); asserts it succeeded and returns its stdout's lines."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    example = os.path.join(root, "examples", name)
    if not os.path.exists(example):
        pytest.skip("not run from the source tree")
    r = subprocess.run([sys.executable, example, *args], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


@pytest.fixture(params=PLACES)
def place(request):
    if not request.param.cuda:
        require_host()
    return request.param


@pytest.fixture
def rng():
    # Fresh inputs every run; the seed is printed on failure through the fixture value.
    seed = int.from_bytes(os.urandom(4), "little")
    return np.random.default_rng(seed)

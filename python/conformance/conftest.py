"""Conformance of rlk with the trainers' own functions (verl, TRL, OpenRLHF), run unchanged
under torch autograd beside rlk on the host backend. Run by `make conformance`, which installs the
pinned trainer packages into build/conformance-venv (requirements.txt)."""
import os
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # python/: the rlk package of this tree
os.environ.setdefault("RLK_CACHE_DIR", tempfile.mkdtemp(prefix="rlk-conformance-cache-"))
os.environ.setdefault("RLK_TORCH_ENTRY_DIR", tempfile.mkdtemp(prefix="rlk-conformance-torch-entry-"))

import trainers  # noqa: E402,F401  (installs the import stand-ins before any trainer module)

PACKAGES = ("verl", "trl", "openrlhf", "torch", "transformers", "numpy")


def _versions():
    out = {}
    for p in PACKAGES:
        try:
            out[p] = trainers.version(p)
        except Exception:
            out[p] = "missing"
    return out


def _revision():
    try:
        return subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


def pytest_report_header(config):
    v = _versions()
    return ["conformance: " + ", ".join("%s %s" % kv for kv in v.items()),
            "rlk revision: " + _revision()]


_results = []


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        path, _, name = report.nodeid.partition("::")
        _results.append((os.path.basename(path) + "::" + name, report.outcome))


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("RLK_CONFORMANCE_REPORT")
    if not path:
        return
    import datetime
    v = _versions()
    counts = {}
    for _, o in _results:
        counts[o] = counts.get(o, 0) + 1
    with open(path, "w") as f:
        f.write("# Conformance with verl, TRL and OpenRLHF: last result\n\n")
        f.write("Written by `make conformance` (python/conformance). Date: %s UTC; rlk revision %s.\n\n"
                % (datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), _revision()))
        f.write("Packages: " + ", ".join("%s %s" % kv for kv in v.items()) + ".\n\n")
        f.write("Totals: " + ", ".join("%d %s" % (n, o) for o, n in sorted(counts.items())) + ".\n\n")
        f.write("| test | result |\n|---|---|\n")
        for name, o in _results:
            f.write("| `%s` | %s |\n" % (name, o))

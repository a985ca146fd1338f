"""The library's messages through Python's logging: each first compile at INFO with its time,
warnings at WARNING (none on C's stderr), and the one-line summary."""
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import rlk

pytestmark = pytest.mark.usefixtures("host")

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_first_compile_is_logged_at_info_with_its_time(caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="rlk")
    rlk.release_contexts()
    rlk.configure(cache_dir=str(tmp_path))  # an empty cache: the kernel compiles
    try:
        scores = np.arange(26, dtype=np.float32)
        rlk.group_advantage(scores, 13)
        compiles = [r for r in caplog.records if r.getMessage().startswith("compiled ")]
        assert len(compiles) == 1, [r.getMessage() for r in caplog.records]
        rec = compiles[0]
        assert rec.levelno == logging.INFO and rec.name == "rlk"
        m = re.fullmatch(r"compiled (group_advantage\S*) (.*group=13.*) for (host\S*) .* in (\d+\.\d\d) s",
                         rec.getMessage())
        assert m, rec.getMessage()
        assert float(m.group(4)) > 0
        caplog.clear()
        rlk.group_advantage(scores, 13)  # in memory now: nothing compiles, nothing is logged
        assert not [r for r in caplog.records if r.getMessage().startswith("compiled ")]
        line = rlk.jit_summary()
        assert re.match(r"rlk: 1 kernel compiled in \d+\.\d\d s, 0 loaded from the kernel cache", line), line
        assert any(r.getMessage() == line for r in caplog.records)
    finally:
        rlk.release_contexts()
        rlk.configure()


def test_warnings_go_to_the_logger_not_to_stderr():
    code = ("import logging, sys, numpy as np\n"
            "logging.basicConfig(stream=sys.stdout, level=logging.WARNING,"
            " format='PYLOG %(name)s %(levelname)s %(message)s')\n"
            "import rlk\n"
            "rlk.logprob(np.zeros((2, 8), np.float32), np.zeros(2, np.int64))\n")
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, RLK_LOGPROB_VARIANT="sideways")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "PYLOG rlk WARNING RLK_LOGPROB_VARIANT='sideways'" in r.stdout, r.stdout + r.stderr
    assert "rlk warn" not in r.stderr  # the library's own stderr format


def test_a_compile_is_logged_by_its_own_call_on_its_own_thread(caplog):
    """The library logs a compile on the thread that runs it; a call returning on one thread logs
    its own compiles only, and one still running on another thread logs its own when it returns,
    timed from its start to that return (not cut short at the other thread's compile)."""
    import threading
    import time

    from rlk import _log, _types as T
    caplog.set_level(logging.INFO, logger="rlk")
    _log.flush()  # nothing of an earlier call on this thread
    info = int(T.LogLevel.INFO)
    started, done = threading.Event(), threading.Event()
    hold = 0.3

    def other():  # a call on another thread: its compile begins, it returns `hold` seconds later
        _log._on_message(info, b"compiling other_kernel k=2 for host", None)
        started.set()
        time.sleep(hold)
        _log.flush()
        done.set()

    _log._on_message(info, b"compiling this_kernel k=1 for host", None)
    t = threading.Thread(target=other, name="other-call")
    t.start()
    assert started.wait(10)
    _log.flush()  # this thread's call returns while the other's is still compiling
    mine = [r for r in caplog.records if r.getMessage().startswith("compiled ")]
    assert [r.getMessage().split(" in ")[0] for r in mine] == ["compiled this_kernel k=1 for host"]
    assert done.wait(10)
    t.join()
    theirs = [r for r in caplog.records if r.getMessage().startswith("compiled other_kernel")]
    assert len(theirs) == 1 and theirs[0].threadName == "other-call", [r.getMessage() for r in caplog.records]
    secs = float(re.fullmatch(r"compiled other_kernel k=2 for host in (\d+\.\d\d) s", theirs[0].getMessage()).group(1))
    assert secs >= hold - 0.01  # %.2f of a time of at least `hold`


def test_a_failed_compile_is_not_logged_as_compiled(tmp_path):
    """A compile the compiler fails: the call raises CompileError, and the log says the compile
    failed (not "compiled ... in N s"); the process's tally counts no kernel compiled."""
    import shutil
    cc = shutil.which("clang-14") or shutil.which("clang")
    if cc is None:
        pytest.skip("no clang to identify the failing compiler as")
    bad = tmp_path / "cc"
    # identifies itself as the real compiler, then fails every compile
    bad.write_text('#!/bin/sh\ncase "$*" in *--version*) exec %s "$@";; esac\necho "no code today" >&2\nexit 1\n'
                   % cc)
    bad.chmod(0o755)
    code = ("import logging, sys, numpy as np\n"
            "logging.basicConfig(stream=sys.stdout, level=logging.INFO, format='PYLOG %(message)s')\n"
            "import rlk\n"
            "from rlk import _log\n"
            "try:\n"
            "    rlk.group_advantage(np.arange(8, dtype=np.float32), 4)\n"
            "except rlk.CompileError:\n"
            "    print('RAISED CompileError')\n"
            "print('TALLY', _log.compiled['kernels'])\n")
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, RLK_HOST_CC=str(bad), RLK_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "RAISED CompileError" in lines, r.stdout + r.stderr
    assert not [l for l in lines if l.startswith("PYLOG compiled ")], r.stdout
    assert [l for l in lines if re.fullmatch(r"PYLOG compiling group_advantage\S* .* failed after \d+\.\d\d s", l)], r.stdout
    assert "TALLY 0" in lines, r.stdout

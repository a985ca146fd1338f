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

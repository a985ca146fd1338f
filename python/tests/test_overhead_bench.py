"""tools/bench/python_overhead.py runs (what it measures is not judged here: a shared CI machine's
timings are no test) and reports every functional op, and with torch each call's ratio to the
floor torch measured in the same run."""
import json
import os
import subprocess
import sys

import pytest

import rlk

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "tools", "bench", "python_overhead.py")


@pytest.mark.skipif(not os.path.exists(BENCH), reason="not run from the source tree")
@pytest.mark.usefixtures("host")
def test_overhead_benchmark_runs(tmp_path):
    out = tmp_path / "overhead.json"
    r = subprocess.run([sys.executable, BENCH, "--calls", "30", "--warmup", "3", "--floors",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    ops = {row["op"] for row in report["rows"]}
    have = set(rlk.available_ops())
    for op in ("group_advantage", "policy_loss", "value_loss", "gae", "logprob"):
        if op in have:
            assert op in ops, sorted(ops)
    try:
        import torch  # noqa: F401
    except ImportError:
        assert report["goals"] == []
        return
    goals = {g["op"]: g for g in report["goals"]}
    assert goals["policy_loss"]["floor"] == "floor: custom op, 5 tensors"
    assert goals["autograd policy_loss fwd+bwd"]["floor"] == "floor: Function fwd+bwd"
    assert all(g["ratio"] > 0 for g in goals.values())

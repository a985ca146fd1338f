"""examples/grpo_step.py runs and agrees with its reference, on numpy (the host backend)."""
import os
import subprocess
import sys

import pytest

import rlk

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "examples", "grpo_step.py")


@pytest.mark.skipif(not os.path.exists(EXAMPLE), reason="not run from the source tree")
@pytest.mark.skipif(not rlk.OPS["policy_loss"].available(),
                    reason="the loaded librlk has no rlk_policy_loss")
def test_grpo_step_example(host):
    r = subprocess.run([sys.executable, EXAMPLE, "--numpy", "--prompts", "4", "--group", "4",
                        "--tokens", "64"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "agree" in r.stdout.splitlines()[-1]
    assert "max |rlk - numpy|" in r.stdout


def _precompile_tool():
    """rlk-precompile beside the library under test (build/bin for build/lib), or None."""
    lib = os.path.realpath(rlk.library_path())
    tool = os.path.join(os.path.dirname(os.path.dirname(lib)), "bin", "rlk-precompile")
    return tool if os.access(tool, os.X_OK) else None


@pytest.mark.skipif(not os.path.exists(EXAMPLE), reason="not run from the source tree")
@pytest.mark.skipif(not rlk.OPS["policy_loss"].available(),
                    reason="the loaded librlk has no rlk_policy_loss")
def test_recorded_example_runs_without_jit(host, tmp_path):
    """RLK_JIT_RECORD: one run records its configurations; precompiled from that file, the run
    repeats with RLK_JIT=0 on an empty writable cache (any compile would be an error)."""
    tool = _precompile_tool()
    if tool is None:
        pytest.skip("no rlk-precompile beside %s" % rlk.library_path())
    record, tree = tmp_path / "record.conf", tmp_path / "tree"
    args = [sys.executable, EXAMPLE, "--numpy", "--prompts", "4", "--group", "4", "--tokens", "64"]
    env = dict(os.environ, RLK_CACHE_DIR=str(tmp_path / "cache1"), RLK_JIT_RECORD=str(record))
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = record.read_text().splitlines()
    assert any(l.startswith("group_advantage ") for l in lines), lines
    assert any(l.startswith("policy_loss ") for l in lines), lines
    assert len(lines) == len(set(lines))
    r = subprocess.run([tool, "--out", str(tree), "--targets", "host", "--config", str(record), "-q"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    env = dict(os.environ, RLK_CACHE_DIR=str(tmp_path / "cache2"), RLK_CACHE_RO_DIRS=str(tree), RLK_JIT="0")
    env.pop("RLK_JIT_RECORD", None)
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "agree" in r.stdout.splitlines()[-1]

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

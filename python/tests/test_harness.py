"""tools/bench/harness.py's checks, at small sizes: every op family's rlk calls against its
PyTorch baselines (the trainers' formulas) on the same inputs. Needs torch; on the GPU when
there is one, else on torch CPU tensors and the host backend."""
import os
import subprocess
import sys

import pytest

from conftest import HAVE_CUDA, HAVE_TORCH

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARNESS = os.path.join(REPO, "tools", "bench", "harness.py")


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.skipif(not os.path.exists(HARNESS), reason="not run from the source tree")
def test_every_family_agrees_with_its_torch_baselines(tmp_path, request):
    if not HAVE_CUDA:
        request.getfixturevalue("host")  # skips where the host backend cannot run
    cmd = [sys.executable, HARNESS, "--quick", "--reps", "2", "--warmup", "0", "--no-charts", "--no-anchors",
           "--shrink", "8" if HAVE_CUDA else "32", "--out-dir", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "DIFF" not in out, out
    assert os.path.exists(tmp_path / "harness.json")

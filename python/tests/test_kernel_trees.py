"""A precompiled kernel tree as a wheel (rlk.kernel_trees): built, installed, found by the
package with nothing in the environment naming it, and used with RLK_JIT=0."""
import os
import subprocess
import sys
import zipfile

import pytest

import rlk
from rlk import kernel_trees

pytestmark = pytest.mark.usefixtures("host")

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "group_advantage mode=rloo group_size=4 scores=f32"
JOB = ("import numpy as np, rlk\n"
       "rlk.group_advantage(np.arange(8, dtype=np.float32), 4, mode='rloo')\n"
       "from rlk import kernel_trees\n"
       "print(sorted(kernel_trees.installed()), rlk.context('host').counters()['compiles'])\n")


def _run(tmp_path, site):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLK_")}
    if "RLK_LIBRARY" in os.environ:
        env["RLK_LIBRARY"] = os.environ["RLK_LIBRARY"]
    env.update(PYTHONPATH=os.pathsep.join([PYTHON_DIR] + ([site] if site else [])), RLK_JIT="0",
               RLK_CACHE_MODE="ro", RLK_CACHE_DIR=str(tmp_path / "empty"))
    return subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_tree_wheel_is_found_and_used_without_compiling(tmp_path):
    tree = tmp_path / "tree"
    ctx = rlk.Context("host", cache_dir=str(tree))
    try:
        assert ctx.precompile(CONFIG) >= 1
    finally:
        ctx.close()
    wheel = kernel_trees.build_wheel(str(tree), "host", str(tmp_path / "dist"))
    name = os.path.basename(wheel)
    assert name.startswith("rlk_kernels_host-%s-py3-none-manylinux_2_" % rlk.__version__), name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert "rlk_kernels_host-%s.dist-info/entry_points.txt" % rlk.__version__ in names
        assert any(n.startswith("rlk_kernels_host/tree/v1/") for n in names), names
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(site), wheel], check=True, capture_output=True)

    # without the installed tree the kernel is missing: RLK_JIT=0 makes that an error
    r = _run(tmp_path, None)
    assert r.returncode != 0 and "JitDisabled" in r.stderr, r.stdout + r.stderr
    # with it the package finds the tree by itself and compiles nothing
    r = _run(tmp_path, str(site))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["['host']", "0"], r.stdout
    assert not (tmp_path / "empty").exists() or not any((tmp_path / "empty").rglob("*"))

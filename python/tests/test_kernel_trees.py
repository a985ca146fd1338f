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
        meta = z.read("rlk_kernels_host-%s.dist-info/METADATA" % rlk.__version__).decode()
        assert "Requires-Dist: rlk==%s\n" % rlk.__version__ in meta, meta
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


def _fake_host_tree(root, machine, glibc_minor):
    """A tree laid out as rlk-precompile writes one (v<schema>/<compiler>/<target>/...) holding
    one host kernel: an ELF file whose bytes name a glibc version."""
    entry = root / "v1" / "clang-14.0.6" / ("host-" + machine) / "group_advantage" / "ab" / ("ab" * 32)
    entry.mkdir(parents=True)
    (entry / "kernel.so").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 57 + b"GLIBC_2.2.5\0GLIBC_2.%d\0"
                                      % glibc_minor)
    (entry / "kernel.meta").write_text("target=host-%s\n" % machine)
    return root


@pytest.mark.parametrize("machine", ["aarch64", "x86_64", "ppc64le"])
def test_a_host_tree_wheel_is_tagged_with_the_trees_arch(tmp_path, machine):
    """A host tree's wheel is tagged with its target's machine, whatever the machine that wraps
    it (a tree precompiled on an aarch64 node and wrapped on an x86_64 one installs on aarch64)."""
    tree = _fake_host_tree(tmp_path / "tree", machine, 28)
    wheel = kernel_trees.build_wheel(str(tree), "host", str(tmp_path / "dist"))
    assert os.path.basename(wheel) == "rlk_kernels_host-%s-py3-none-manylinux_2_28_%s.whl" % (
        rlk.__version__, machine)
    with zipfile.ZipFile(wheel) as z:
        assert "Tag: py3-none-manylinux_2_28_%s" % machine in z.read(
            "rlk_kernels_host-%s.dist-info/WHEEL" % rlk.__version__).decode()


def test_a_tree_of_two_host_arches_is_refused(tmp_path):
    tree = _fake_host_tree(tmp_path / "tree", "aarch64", 17)
    _fake_host_tree(tree, "x86_64", 17)
    with pytest.raises(ValueError, match="aarch64 and x86_64"):
        kernel_trees.build_wheel(str(tree), "host", str(tmp_path / "dist"))

"""Builds rlk's wheel: the Python package with every subpackage, librlk.so.0 and the rlk.h its
structs are read from inside it (rlk/_lib/), tagged for this machine's platform
(manylinux_2_<glibc>_<arch>) since the library is native code.

Where the library comes from, first found wins:
  1. RLK_BUNDLE_LIBRARY: a built librlk.so.0 to bundle as it is (RLK_LIBRARY, which says what a
     process loads, is not read here: a test build left in it would ship);
  2. the C sources: csrc/ inside an sdist (built under the build directory), or the rlk
     repository around python/ (its build/, `make lib` run first so the copy is current).
Without either the build fails and says why: a wheel without its library would install and then
have nothing to call. The sdist carries the C sources (csrc/), so it builds the library too; a
C11 compiler and make are all that takes.
"""
import os
import re
import shutil
import subprocess
import sys
import platform

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
SONAME = "librlk.so.0"
# What `make lib` reads: the sdist carries these under csrc/.
C_SOURCES = ("Makefile", "include", "src", "templates", "tools/build")
# The oldest glibc a manylinux tag may name (manylinux2014).
MIN_GLIBC_MINOR = 17

_bundled = {}  # "path": the librlk.so.0 the build put into the package


def say(msg):
    """Printed where pip shows it (with -v; always when the build fails)."""
    print("rlk: " + msg, file=sys.stderr, flush=True)


def _c_sources_at(root):
    return (os.path.isfile(os.path.join(root, "Makefile")) and os.path.isdir(os.path.join(root, "src")) and
            os.path.isfile(os.path.join(root, "include", "rlk.h")))


def c_source_root():
    """The directory `make lib` runs in: the sdist's csrc/, else the rlk repository whose python/
    this is (an sdist unpacked inside another project never builds that project)."""
    csrc = os.path.join(HERE, "csrc")
    if _c_sources_at(csrc):
        return csrc
    parent = os.path.dirname(HERE)
    if os.path.basename(HERE) == "python" and _c_sources_at(parent):
        return parent
    return None


def build_library(build_temp):
    """The path of the librlk.so.0 to bundle, built first when the C sources are here."""
    env = os.environ.get("RLK_BUNDLE_LIBRARY")
    if env:
        if not os.path.isfile(env):
            # pip runs the build in the package's own directory, not the one it was started in
            where = "" if os.path.isabs(env) else (
                " (looked for %s: a relative path is read from %s, where the build runs; give an "
                "absolute path)" % (os.path.abspath(env), os.getcwd()))
            raise SystemExit("rlk: RLK_BUNDLE_LIBRARY=%s: no such file%s" % (env, where))
        say("bundling RLK_BUNDLE_LIBRARY=%s as it is" % env)
        return os.path.realpath(env)
    root = c_source_root()
    if root is None:
        raise SystemExit("rlk: cannot bundle librlk: RLK_BUNDLE_LIBRARY is unset and there are no C sources "
                         "(neither %s nor %s)" % (os.path.join(HERE, "csrc", "Makefile"),
                                                 os.path.join(os.path.dirname(HERE), "Makefile")))
    # The repository keeps its build/ (make lib is incremental); an sdist builds in build_temp.
    build = os.path.join(root, "build") if root == os.path.dirname(HERE) else \
        os.path.abspath(os.path.join(build_temp, "librlk"))
    lib = os.path.join(build, "lib", SONAME)
    cmd = ["make", "-C", root, "-j%d" % (os.cpu_count() or 1), "BUILD=" + build, "lib"]
    if shutil.which("make") is None:
        if os.path.isfile(lib):
            say("make is missing; bundling the library already built at %s" % lib)
            return os.path.realpath(lib)
        raise SystemExit("rlk: building librlk needs make and a C11 compiler; neither a built "
                         "library (%s) nor make was found" % lib)
    say("building librlk: %s" % " ".join(cmd))
    r = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
    if r.returncode != 0 or not os.path.isfile(lib):
        raise SystemExit("rlk: `%s` failed (exit %d); the library is needed in the wheel" % (
            " ".join(cmd), r.returncode))
    return os.path.realpath(lib)


def manylinux_tag(lib):
    """manylinux_2_<N>_<arch>: N the newest glibc symbol version the library references."""
    with open(lib, "rb") as f:
        minors = [int(m) for m in re.findall(rb"GLIBC_2\.(\d+)", f.read())]
    minor = max(minors + [MIN_GLIBC_MINOR])
    arch = platform.machine().lower().replace("-", "_")
    return "manylinux_2_%d_%s" % (minor, arch)


class build_py_with_library(build_py):
    def run(self):
        # setuptools' staging folder outlives a build: a module since removed would ship again
        shutil.rmtree(os.path.join(self.build_lib, "rlk"), ignore_errors=True)
        super().run()
        lib = build_library(self.get_finalized_command("build").build_temp)
        dest = os.path.join(self.build_lib, "rlk", "_lib")
        os.makedirs(dest, exist_ok=True)
        shutil.copyfile(lib, os.path.join(dest, SONAME))
        _bundled["path"] = lib
        say("bundled %s as rlk/_lib/%s" % (lib, SONAME))
        # The package's structs are read from the header (rlk/_header.py): the library's own.
        header = os.path.join(c_source_root() or "", "include", "rlk.h")
        if not os.path.isfile(header):
            raise SystemExit("rlk: cannot bundle rlk.h: no C sources beside the package (%s)" % header)
        shutil.copyfile(header, os.path.join(dest, "rlk.h"))


class NativeDistribution(Distribution):
    """The package carries a native library: built into the platform's directory and wheel."""

    def has_ext_modules(self):
        return True


class platform_wheel(bdist_wheel):
    """py3-none-manylinux_2_<N>_<arch>: any Python 3 (ctypes, no extension module), this
    platform's library."""

    def get_tag(self):
        lib = _bundled.get("path")
        if lib is None:  # get_tag before the build: what the build will bundle
            lib = build_library(self.get_finalized_command("build").build_temp)
        return "py3", "none", manylinux_tag(lib)


class sdist_with_c_sources(sdist):
    """The sdist also carries the C sources the library builds from, under csrc/."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = c_source_root()
        if root is None:
            raise SystemExit("rlk: an sdist needs the C sources (the repository around python/)")
        ignore = shutil.ignore_patterns("__pycache__", "*.o", "*.d")
        for rel in C_SOURCES:
            src, dst = os.path.join(root, rel), os.path.join(base_dir, "csrc", rel)
            if os.path.isdir(src):
                shutil.copytree(src, dst, ignore=ignore)
            else:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy2(src, dst)


setup(distclass=NativeDistribution,
      cmdclass={"build_py": build_py_with_library, "bdist_wheel": platform_wheel,
                "sdist": sdist_with_c_sources})

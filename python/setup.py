"""Installs the pure-Python package and, when the source tree beside it has been built
(`make lib`), a copy of that librlk.so.0 inside it (rlk/_lib/), so an installed package finds
the library it was built with. Without a built library the package is installed alone and
looks for librlk at run time (RLK_LIBRARY, the system loader)."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SONAME = "librlk.so.0"


class build_py_with_library(build_py):
    def run(self):
        super().run()
        lib = os.environ.get("RLK_LIBRARY") or os.path.join(HERE, "..", "build", "lib", SONAME)
        if os.path.exists(lib):
            dest = os.path.join(self.build_lib, "rlk", "_lib")
            os.makedirs(dest, exist_ok=True)
            shutil.copyfile(os.path.realpath(lib), os.path.join(dest, SONAME))
            self.announce("rlk: bundled %s" % os.path.realpath(lib), level=2)
        else:
            self.announce("rlk: no built librlk at %s; the package will look for it at run time "
                          "(RLK_LIBRARY, the system loader)" % lib, level=2)


setup(cmdclass={"build_py": build_py_with_library})

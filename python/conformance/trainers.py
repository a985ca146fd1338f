"""The trainers' own modules, imported unchanged from the installed packages (verl, trl,
openrlhf at the versions pinned in requirements.txt).

Their loss and advantage modules import whole frameworks at the top (transformers, ray,
deepspeed, accelerate, ...) for things these functions never touch. Where such a package is not
installed, a stand-in module answers an import statement executed by a trainer's own module:
every attribute is an inert placeholder class. Availability probes (importlib.util.find_spec)
and every other importer still see that the package is missing.
Only imports are stood in for; no trainer function is replaced, copied or re-written here, and
a package that is installed is always the real one.
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

# The packages whose imports may be stood in for (the importing module's top-level name).
TRAINERS = ("verl", "trl", "openrlhf")

stood_in = set()


class _Placeholder:
    """Stands for any class or function of a package that is not installed."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return self

    def __class_getitem__(cls, item):
        return cls

    def __getattr__(self, name):
        return _Placeholder()

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())

    def __or__(self, other):
        return self

    __ror__ = __or__


class _StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        cls = type(name, (_Placeholder,), {"__module__": self.__name__})
        setattr(self, name, cls)
        return cls


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        m = _StandIn(spec.name)
        m.__path__ = []
        m.__version__ = "0.0.0"
        return m

    def exec_module(self, module):
        stood_in.add(module.__name__.split(".")[0])


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.missing = {}

    def _is_missing(self, root):
        if root not in self.missing:
            others = [f for f in sys.meta_path if f is not self]
            spec = None
            for f in others:
                find = getattr(f, "find_spec", None)
                if find is None:
                    continue
                try:
                    spec = find(root, None)
                except Exception:
                    spec = None
                if spec is not None:
                    break
            self.missing[root] = spec is None
        return self.missing[root]

    def find_spec(self, name, path, target=None):
        root = name.split(".")[0]
        if root in sys.stdlib_module_names or not _from_trainer_import() or not self._is_missing(root):
            return None
        return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)


def _from_trainer_import():
    """True for an import statement executed by a trainer's module; False for anyone else and
    for availability probes (importlib.util.find_spec), which must keep seeing the truth."""
    f = sys._getframe(2)
    while f is not None:
        code = f.f_code
        if code.co_name == "find_spec" and code.co_filename.endswith(("importlib/util.py",
                                                                        "importlib\\util.py")):
            return False
        if "importlib" not in code.co_filename:
            mod = f.f_globals.get("__name__", "")
            return mod.split(".")[0] in TRAINERS
        f = f.f_back
    return False


_finder = _Finder()
if _finder not in sys.meta_path:
    sys.meta_path.insert(0, _finder)


def version(dist):
    from importlib.metadata import version as v
    return v(dist)

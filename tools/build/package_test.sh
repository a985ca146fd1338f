#!/usr/bin/env bash
# The Python package as a user installs it: each of the wheel and the sdist goes into a fresh
# virtual environment, away from the source tree (no PYTHONPATH, no RLK_LIBRARY, run from an
# empty directory); every module of the package is imported, the library must be the one the
# wheel carries, and the examples run against the installed package. auditwheel checks the
# wheel's manylinux tag against the library's symbol versions; the sdist must hold the wheel's
# modules, the build files and the C sources, and nothing else.
#
#   tools/build/package_test.sh DIST_DIR [TORCH_VENV]
#
# DIST_DIR holds one rlk-*.whl and one rlk-*.tar.gz. TORCH_VENV: a virtual environment with torch
# and transformers (the conformance one); its site-packages is put on the fresh environments'
# path (a .pth file) so the examples and the integrations can run without a second torch install.
# Without it the torch examples and the integrations are skipped, and say so.
set -euo pipefail

dist=$(cd "$1" && pwd)
torch_venv=${2:-}
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d -t rlk-package-test-XXXXXX)
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH RLK_LIBRARY
export RLK_CACHE_DIR="$work/cache"
export RLK_TORCH_ENTRY_DIR="$work/torch-entry"  # the compiled entry (python/rlk/_entry.py)

wheel=$(ls "$dist"/rlk-*.whl)
sdist=$(ls "$dist"/rlk-*.tar.gz)
arch=$(uname -m)
case "$(basename "$wheel")" in
  rlk-*-py3-none-manylinux_2_*_"$arch".whl) ;;
  *) echo "package_test: $(basename "$wheel") is not a py3-none-manylinux_2_N_$arch wheel" >&2; exit 1 ;;
esac

# The sdist carries the package's modules (those of the wheel), its build files and the C sources
# (csrc/), and nothing else: a file setuptools adds by default (tests/test*.py, without the
# conftest.py and refs.py they import) would ship a suite that cannot run.
python3 - "$wheel" "$sdist" <<'EOF'
import re, sys, tarfile, zipfile
wheel, sdist = sys.argv[1:]
in_wheel = {n for n in zipfile.ZipFile(wheel).namelist()
            if n.startswith("rlk/") and not n.startswith("rlk/_lib/")}
with tarfile.open(sdist) as t:
    names = [m.name.split("/", 1)[1] for m in t.getmembers() if m.isfile() and "/" in m.name]
in_sdist = {n for n in names if n.startswith("rlk/")}
build = re.compile(r"(csrc/.+|rlk\.egg-info/.+|PKG-INFO|README\.md|pyproject\.toml|setup\.py|setup\.cfg|MANIFEST\.in)$")
stray = sorted(n for n in names if not n.startswith("rlk/") and not build.match(n))
problems = ["only in the wheel: " + n for n in sorted(in_wheel - in_sdist)]
problems += ["only in the sdist: " + n for n in sorted(in_sdist - in_wheel)]
problems += ["not part of the package or its build: " + n for n in stray]
if problems:
    sys.exit("package_test: the sdist's files:\n  " + "\n  ".join(problems))
print("sdist: the wheel's %d package files, the build files and csrc/" % len(in_sdist))
EOF

# pip runs the build in python/, not where it was started: a relative RLK_BUNDLE_LIBRARY that is
# only there (where pip started) is refused naming the path looked for, not as if it were absent.
mkdir -p "$work/rel"
: > "$work/rel/librlk-relative.so.0"
if (cd "$work/rel" && RLK_BUNDLE_LIBRARY=librlk-relative.so.0 \
      python3 -m pip wheel -q --no-deps -w "$work/rel" "$repo/python") > "$work/rel.txt" 2>&1; then
  echo "package_test: a wheel was built with RLK_BUNDLE_LIBRARY=librlk-relative.so.0, absent from python/" >&2
  exit 1
fi
if ! grep -qF "looked for $repo/python/librlk-relative.so.0: a relative path is read from $repo/python" "$work/rel.txt"; then
  echo "package_test: a relative RLK_BUNDLE_LIBRARY's error does not say where it was looked for:" >&2
  cat "$work/rel.txt" >&2
  exit 1
fi
echo "RLK_BUNDLE_LIBRARY: a relative path is refused naming where it was looked for"

# The tag claims what auditwheel (PyPA's own checker) finds in the library's symbol versions.
tag=$(basename "$wheel" .whl | sed 's/.*-py3-none-//')
python3 -m venv "$work/auditwheel"
"$work/auditwheel/bin/pip" install -q auditwheel
"$work/auditwheel/bin/auditwheel" show "$wheel" > "$work/auditwheel.txt"
if ! tr '\n' ' ' < "$work/auditwheel.txt" | grep -q "consistent with the following platform tag: \"$tag\""; then
  echo "package_test: auditwheel does not find $(basename "$wheel") consistent with $tag:" >&2
  cat "$work/auditwheel.txt" >&2
  exit 1
fi
echo "auditwheel: consistent with $tag"

torch_site=
if [ -n "$torch_venv" ] && [ -x "$torch_venv/bin/python" ]; then
  torch_site=$("$torch_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
fi

fresh_venv() {  # fresh_venv DIR: a new environment, with the torch one's packages when given
  python3 -m venv "$1"
  if [ -n "$torch_site" ]; then
    echo "$torch_site" > "$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch-env.pth"
  fi
}

check_installed() {  # check_installed VENV WHAT
  local py="$1/bin/python"
  (cd "$work/run" && "$py" - "$2" <<'EOF'
import importlib, os, pkgutil, sys
import rlk
what = sys.argv[1]
here = os.path.dirname(rlk.__file__)
assert "site-packages" in here, "rlk imported from %s, not the installed package" % here
lib = os.path.realpath(rlk.library_path())
assert lib == os.path.realpath(os.path.join(here, "_lib", "librlk.so.0")), lib
have_torch = importlib.util.find_spec("torch") is not None
imported, skipped = [], []
for m in pkgutil.walk_packages(rlk.__path__, "rlk."):
    try:
        importlib.import_module(m.name)
    except ModuleNotFoundError as e:  # a torch module, where torch is not installed
        if have_torch or e.name != "torch":
            raise
        skipped.append(m.name)
        continue
    imported.append(m.name)
ops = rlk.available_ops()
assert "policy_loss" in ops and "group_advantage" in ops, ops
entry = "no torch"
if have_torch:  # the compiled entry's source is in the package and builds against this torch
    import tempfile
    os.environ.update(RLK_TORCH_ENTRY="wait", RLK_TORCH_ENTRY_DIR=tempfile.mkdtemp())
    from rlk import _entry
    assert _entry.wait() is not None, _entry.status()
    entry = _entry.status()[0]
print("%s: rlk %s from %s, library %s; %d modules imported%s; compiled entry: %s; ops: %s" % (
    what, rlk.__version__, here, lib, len(imported),
    " (skipped without torch: %s)" % ", ".join(skipped) if skipped else "", entry, ", ".join(ops)))
EOF
  )
}

run_examples() {  # run_examples VENV: the examples, copied away from the source tree
  local py="$1/bin/python"
  cp "$repo"/examples/*.py "$work/run/"
  (cd "$work/run" && "$py" grpo_step.py --numpy --prompts 4 --group 4 --tokens 64 | tail -1)
  if "$py" -c 'import torch, transformers' 2>/dev/null; then
    (cd "$work/run" && "$py" grpo_step.py --cpu --prompts 4 --group 4 --tokens 64 | tail -1)
    (cd "$work/run" && "$py" fused_lm_head_transformers.py --device cpu --iters 1 | tail -1)
    (cd "$work/run" && "$py" grpo_prefix_transformers.py --device cpu --iters 1 | tail -1)
    (cd "$work/run" && "$py" rollout_bitwise.py --device cpu --prompts 4 --steps 8 | tail -3)
  else
    echo "package_test: torch or transformers missing: the torch examples did not run"
  fi
}

mkdir -p "$work/run"
echo "== wheel $(basename "$wheel")"
fresh_venv "$work/wheel-venv"
"$work/wheel-venv/bin/pip" install -q --no-deps "$wheel"
check_installed "$work/wheel-venv" wheel
run_examples "$work/wheel-venv"

echo "== sdist $(basename "$sdist") (builds librlk from its C sources)"
fresh_venv "$work/sdist-venv"
"$work/sdist-venv/bin/pip" install -q --no-deps "$sdist"
check_installed "$work/sdist-venv" sdist
echo "package_test: ok"

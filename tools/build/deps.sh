#!/usr/bin/env bash
# deps.sh - makes sure the system packages the build and the tests need are present.
# As root with apt-get it installs what is missing; otherwise it names the command to run.
#   needed:   gcc make pkg-config check            (build, tests)
#             clang                                (the host backend's kernel compiler)
#             python3 with numpy and pytest        (the Python package's tests; pip)
#   optional: pytest-xdist                         (the Python tests on every CPU; pip, as root)
#   fuzz:     clang and its libFuzzer runtime        (`deps.sh fuzz`, what `make fuzz` needs:
#             Debian's libclang-rt-<N>-dev)
#   optional: libamdhip64-dev                      (hiprtc: HIP kernels compiled without an AMD GPU)
#             the CUDA toolkit's NVRTC             (CUDA kernels; /usr/local/cuda or RLK_NVRTC_LIB)
set -eu

missing=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# `deps.sh fuzz`: clang, and a libFuzzer it can link (a one-line fuzz target must build).
libfuzzer_links() {
  local dir
  dir=$(mktemp -d) || return 1
  printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$dir/t.c"
  "${FUZZ_CC:-clang}" -fsanitize=fuzzer,address,undefined "$dir/t.c" -o "$dir/t" >/dev/null 2>&1
  local rc=$?
  rm -rf "$dir"
  return $rc
}
if [ "${1:-}" = fuzz ]; then
  if ! command -v "${FUZZ_CC:-clang}" >/dev/null 2>&1; then
    missing+=(clang)
  elif ! libfuzzer_links; then
    # compiler-rt's package for this clang: libclang-rt-<N>-dev (Debian 12+, Ubuntu 22.04+);
    # older releases ship libFuzzer in libclang-common-<N>-dev.
    major=$("${FUZZ_CC:-clang}" -dumpversion 2>/dev/null | cut -d. -f1)
    pkg=libclang-rt-$major-dev
    if command -v apt-cache >/dev/null 2>&1 && ! apt-cache show "$pkg" >/dev/null 2>&1; then
      pkg=libclang-common-$major-dev
    fi
    missing+=("$pkg")
  fi
  if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "rlk: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    libfuzzer_links || { echo "rlk: ${FUZZ_CC:-clang} still cannot link -fsanitize=fuzzer" >&2; exit 1; }
    exit 0
  fi
  echo "rlk: make fuzz needs: ${missing[*]}" >&2
  echo "rlk: install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi

command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
pkg-config --exists check 2>/dev/null || missing+=(check)
command -v clang >/dev/null 2>&1 || command -v clang-14 >/dev/null 2>&1 || missing+=(clang)
if command -v dpkg-query >/dev/null 2>&1 && ! have_pkg libamdhip64-dev; then
  missing+=(libamdhip64-dev)
fi

# Python (the package's tests, python/tests): numpy and pytest from PyPI; as root they are
# pip-installed when missing, otherwise the pip command is printed. Without python3 or pip,
# Debian's python3-numpy and python3-pytest do.
if ! command -v python3 >/dev/null 2>&1; then
  missing+=(python3 python3-numpy python3-pytest)
else
  py_missing=()
  python3 -c 'import numpy' >/dev/null 2>&1 || py_missing+=(numpy)
  python3 -c 'import pytest' >/dev/null 2>&1 || py_missing+=(pytest)
  if [ ${#py_missing[@]} -gt 0 ]; then
    if ! python3 -m pip --version >/dev/null 2>&1; then
      for p in "${py_missing[@]}"; do missing+=("python3-$p"); done
    elif [ "$(id -u)" = 0 ]; then
      echo "rlk: pip installing ${py_missing[*]}" >&2
      python3 -m pip install -q "${py_missing[@]}" >/dev/null 2>&1 ||
        python3 -m pip install -q --break-system-packages "${py_missing[@]}" >/dev/null ||
        { echo "rlk: run: python3 -m pip install ${py_missing[*]}" >&2; exit 1; }
    else
      echo "rlk: missing Python packages: ${py_missing[*]}" >&2
      echo "rlk: install them with: python3 -m pip install --user ${py_missing[*]}" >&2
      exit 1
    fi
  fi
  # optional: pytest-xdist runs the Python tests on every CPU (make python-test uses it when present)
  if ! python3 -c 'import xdist' >/dev/null 2>&1 && [ "$(id -u)" = 0 ] &&
      python3 -m pip --version >/dev/null 2>&1; then
    python3 -m pip install -q pytest-xdist >/dev/null 2>&1 ||
      python3 -m pip install -q --break-system-packages pytest-xdist >/dev/null 2>&1 ||
      echo "rlk: pytest-xdist not installed: the Python tests run on one CPU" >&2
  fi
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "rlk: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  exit 0
fi

echo "rlk: missing system packages: ${missing[*]}" >&2
echo "rlk: install them with: sudo apt-get install ${missing[*]}" >&2
exit 1

#!/usr/bin/env bash
# deps.sh - makes sure the system packages the build and the tests need are present.
# As root with apt-get it installs what is missing; otherwise it names the command to run.
#   needed:   gcc make pkg-config check            (build, tests)
#             clang                                (the host backend's kernel compiler)
#   optional: libamdhip64-dev                      (hiprtc: HIP kernels compiled without an AMD GPU)
#             the CUDA toolkit's NVRTC             (CUDA kernels; /usr/local/cuda or RLK_NVRTC_LIB)
set -eu

missing=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
pkg-config --exists check 2>/dev/null || missing+=(check)
command -v clang >/dev/null 2>&1 || command -v clang-14 >/dev/null 2>&1 || missing+=(clang)
if command -v dpkg-query >/dev/null 2>&1 && ! have_pkg libamdhip64-dev; then
  missing+=(libamdhip64-dev)
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

#!/bin/sh
# check_layers.sh - fails when an #include crosses a layer of src/ the wrong way, or a tool
# reaches into the library's internals.
#
#   core (errors, logging, fs, dynamic loading, targets)      rank 0
#   backend (device runtimes)   tune (tuning database)        rank 1
#   jit (compilers, cache, keys, templates; loads through backend.h) rank 2
#   runtime (context, precompile, settings, recording)        rank 3
#   ops (argument checks, variant selection, launches)        rank 4
#
# A file may include its own folder's headers and those of a lower rank, never a peer's or a
# higher one's. Ops may also include templates/common/ (kernel argument lists shared with the
# templates, "common/<op>_params.h"). tools/*.c may include only rlk.h, the tools' own headers, and the one
# documented internal header for benchmarks, runtime/bench_hooks.h.
#
#   tools/build/check_layers.sh [ROOT]      check the tree at ROOT (default: .)
#   tools/build/check_layers.sh --self-test check that a wrong include is caught
set -u

rank() {
  case "$1" in
    core) echo 0 ;;
    backend | tune) echo 1 ;;
    jit) echo 2 ;;
    runtime) echo 3 ;;
    ops) echo 4 ;;
    *) echo -1 ;;
  esac
}

check() {
  root=$1
  bad=0
  for f in $(cd "$root" && find src -name '*.[ch]' | sort); do
    layer=$(echo "$f" | cut -d/ -f2)
    r=$(rank "$layer")
    if [ "$r" -lt 0 ]; then
      echo "layers: $f is in no layer (src/$layer)" >&2
      bad=1
      continue
    fi
    for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$root/$f"); do
      case "$inc" in
        rlk.h) continue ;;
        */*) ;;
        *) echo "layers: $f includes \"$inc\" without its folder" >&2; bad=1; continue ;;
      esac
      to=$(echo "$inc" | cut -d/ -f1)
      [ "$to" = "$layer" ] && continue
      [ "$to" = common ] && [ "$layer" = ops ] && continue
      t=$(rank "$to")
      if [ "$t" -lt 0 ] || [ "$t" -ge "$r" ]; then
        echo "layers: $f ($layer) includes $inc ($to): only lower layers may be included" >&2
        bad=1
      fi
    done
  done
  for f in $(cd "$root" && ls tools/*.c tools/*.h 2>/dev/null); do
    for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$root/$f"); do
      case "$inc" in
        rlk.h | runtime/bench_hooks.h) ;;
        */*) echo "layers: $f includes $inc: tools use include/rlk.h (benchmarks also runtime/bench_hooks.h)" >&2; bad=1 ;;
        *) [ -f "$root/tools/$inc" ] || { echo "layers: $f includes $inc, not a tools/ header" >&2; bad=1; } ;;
      esac
    done
  done
  return $bad
}

if [ "${1:-}" = "--self-test" ]; then
  tmp=$(mktemp -d) || exit 1
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/src/core" "$tmp/src/jit" "$tmp/tools"
  printf '#include "core/core.h"\n#include "rlk.h"\n' > "$tmp/src/jit/a.c"
  printf '#include "rlk.h"\n#include "tool.h"\n' > "$tmp/tools/rlk-x.c"
  : > "$tmp/tools/tool.h"
  check "$tmp" || { echo "layers self-test: a clean tree was refused" >&2; exit 1; }
  printf '#include "jit/jit.h"\n' > "$tmp/src/core/b.c"
  check "$tmp" 2>/dev/null && { echo "layers self-test: core including jit was not caught" >&2; exit 1; }
  rm "$tmp/src/core/b.c"
  printf '#include "ops/ops.h"\n' > "$tmp/tools/rlk-y.c"
  check "$tmp" 2>/dev/null && { echo "layers self-test: a tool including ops/ was not caught" >&2; exit 1; }
  echo "layers self-test: ok"
  exit 0
fi

check "${1:-.}" && echo "layers: ok"

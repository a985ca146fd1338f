#!/bin/sh
# check_layers.sh - fails when the layers of src/ are crossed the wrong way, at the include level
# (before a build) or at the link level (the objects of a build), or when a tool or a kernel
# template reaches outside what it may use.
#
#   core (errors, logging, fs, dynamic loading, targets, TMA limits)  rank 0
#   backend (device runtimes)   tune (tuning database)              rank 1
#   jit (compilers, cache store, keys, templates; loads through backend.h) rank 2
#   runtime (context, cache admin, precompile, settings, recording)   rank 3
#   ops (argument checks, variant selection, launches)               rank 4
#
# Includes: a file of src/ may include its own folder's headers and those of a lower rank, never a
# peer's or a higher one's, whether it spells the include "x" or <x> (a <x> that names a file under
# src/, include/ or templates/ is the project's, found through the -I paths). Ops may also include
# templates/common/ (kernel argument lists shared with the templates, "common/<op>_params.h").
# tools/*.c may include only rlk.h, the tools' own headers, and the one documented internal header
# for benchmarks, runtime/bench_hooks.h. Templates include only the files of their source set, by
# name (the JIT hands them to the compiler that way): their own folder's and templates/common/'s
# (templates/common/ its own alone). Nothing else at all (NVRTC has no toolkit headers, and a file
# outside the project would change behind a key), but templates/host/ also the C standard
# library's headers.
#
# Links (nm over the objects): every symbol an object of the library uses that another object of
# the library defines is defined in the same layer or a lower one; a backend (src/backend/<name>/)
# is reached from outside the backend layer only through its open function
# (rlk_<name>_backend_open), everything else through its vtable; a tool uses only what
# include/rlk.h and src/runtime/bench_hooks.h declare. The embedded template sources (gen/) are
# the jit layer's.
#
#   tools/build/check_layers.sh [ROOT]               the includes of the tree at ROOT (default: .)
#   tools/build/check_layers.sh --links OBJ [ROOT]   the links of the objects under OBJ (build/obj)
#   tools/build/check_layers.sh --self-test          both checks catch what they are for ($CC)
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

# The include lines of a file as "q name" (q: " or <), one a line.
includes() {
  sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*\(["<]\)\([^">]*\)[">].*/\1 \2/p' "$1"
}

# Is <name> one of the project's headers (reached through -Iinclude, -Isrc or -Itemplates)?
project_header() {
  [ -f "$1/include/$2" ] || [ -f "$1/src/$2" ] || [ -f "$1/templates/$2" ]
}

C_HEADERS=" assert.h complex.h ctype.h errno.h fenv.h float.h inttypes.h iso646.h limits.h locale.h"
C_HEADERS="$C_HEADERS math.h setjmp.h signal.h stdalign.h stdarg.h stdatomic.h stdbool.h stddef.h"
C_HEADERS="$C_HEADERS stdint.h stdio.h stdlib.h stdnoreturn.h string.h tgmath.h threads.h time.h"
C_HEADERS="$C_HEADERS uchar.h wchar.h wctype.h "

check_includes() {
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
    includes "$root/$f" | while read -r q inc; do
      [ "$q" = "<" ] && ! project_header "$root" "$inc" && continue
      case "$inc" in
        rlk.h) continue ;;
        */*) ;;
        *) echo "layers: $f includes $q$inc without its folder" >&2; echo bad; continue ;;
      esac
      to=$(echo "$inc" | cut -d/ -f1)
      [ "$to" = "$layer" ] && continue
      [ "$to" = common ] && [ "$layer" = ops ] && continue
      t=$(rank "$to")
      if [ "$t" -lt 0 ] || [ "$t" -ge "$r" ]; then
        echo "layers: $f ($layer) includes $inc ($to): only lower layers may be included" >&2
        echo bad
      fi
    done | grep -q bad && bad=1
  done
  for f in $(cd "$root" && ls tools/*.c tools/*.h 2>/dev/null); do
    includes "$root/$f" | while read -r q inc; do
      [ "$q" = "<" ] && ! project_header "$root" "$inc" && continue
      case "$inc" in
        rlk.h | runtime/bench_hooks.h) ;;
        */*) echo "layers: $f includes $inc: tools use include/rlk.h (benchmarks also runtime/bench_hooks.h)" >&2; echo bad ;;
        *) [ -f "$root/tools/$inc" ] || { echo "layers: $f includes $inc, not a tools/ header" >&2; echo bad; } ;;
      esac
    done | grep -q bad && bad=1
  done
  for f in $(cd "$root" && find templates -type f | sort); do
    dir=$(dirname "$f")
    includes "$root/$f" | while read -r q inc; do
      if [ "$q" = "<" ]; then
        case "$dir:$C_HEADERS" in
          templates/host:*" $inc "*) continue ;;
        esac
        echo "layers: $f includes <$inc>: templates include only the files of their source set" \
             "(templates/host also the C standard headers)" >&2
        echo bad
      elif case "$inc" in */*) true ;; *) false ;; esac ||
           { [ ! -f "$root/$dir/$inc" ] && { [ "$dir" = templates/common ] || [ ! -f "$root/templates/common/$inc" ]; }; }; then
        echo "layers: $f includes \"$inc\", which is not a file of $dir/ or templates/common/" >&2
        echo bad
      fi
    done | grep -q bad && bad=1
  done
  return $bad
}

# The functions a header declares: rlk_ names followed by "(", comments left out.
declared() {
  awk '{ line = line $0 "\n" } END {
         out = ""
         while ((i = index(line, "/*")) > 0) {
           out = out substr(line, 1, i - 1)
           rest = substr(line, i + 2)
           j = index(rest, "*/")
           line = j ? substr(rest, j + 2) : ""
         }
         printf "%s%s", out, line
       }' "$@" | grep -o 'rlk_[A-Za-z0-9_]*[[:space:]]*(' | tr -d '( \t' | sort -u
}

check_links() {
  obj=$1 root=$2
  [ -d "$obj/src" ] || { echo "layers: no objects under $obj/src (build first)" >&2; return 1; }
  api=$(declared "$root/include/rlk.h" "$root/src/runtime/bench_hooks.h" | tr '\n' ' ')
  # Only objects whose source is in the tree: a stale object of a removed file is not the build's.
  files=$(cd "$obj" && find src gen tools -name '*.o' 2>/dev/null | sort | while read -r o; do
    case "$o" in gen/*) echo "$o" ;; *) [ -f "$root/${o%.o}.c" ] && echo "$o" ;; esac
  done)
  [ -n "$files" ] || { echo "layers: no objects under $obj" >&2; return 1; }
  # nm -A: "file:value type name" (defined) or "file: U name" (undefined).
  (cd "$obj" && nm -A -g $files) | awk -v api=" $api " '
    function layer(f,   p) {
      split(f, p, "/")
      if (p[1] == "gen") return "jit"
      if (p[1] == "tools") return "tools"
      return p[2]
    }
    function rank(l) {
      return l == "core" ? 0 : (l == "backend" || l == "tune") ? 1 : l == "jit" ? 2 : l == "runtime" ? 3 : l == "ops" ? 4 : -1
    }
    function backend_impl(f,   p, n) { n = split(f, p, "/"); return (p[1] == "src" && p[2] == "backend" && n == 4) ? p[3] : "" }
    {
      i = index($0, ":"); f = substr($0, 1, i - 1)
      n = split(substr($0, i + 1), a, " "); type = a[n - 1]; name = a[n]
      if (type == "U") { nu++; uf[nu] = f; us[nu] = name }
      else if (type != "w" && type != "v" && !(name in def)) def[name] = f
    }
    END {
      bad = 0
      for (k = 1; k <= nu; k++) {
        s = us[k]; f = uf[k]
        if (!(s in def)) continue          # the C library, dlopen-ed APIs
        d = def[s]; lu = layer(f); ld = layer(d)
        if (lu == "tools") {
          if (index(api, " " s " ") == 0) {
            printf "layers: %s uses %s (%s), which neither rlk.h nor runtime/bench_hooks.h declares\n", f, s, d
            bad = 1
          }
          continue
        }
        if (ld != lu && rank(ld) >= rank(lu)) {
          printf "layers: %s (%s) uses %s, defined in %s (%s): only its own and lower layers\n", f, lu, s, d, ld
          bad = 1
        }
        impl = backend_impl(d)
        if (impl != "" && lu != "backend" && s !~ /_backend_open$/) {
          printf "layers: %s (%s) uses %s of the %s backend (%s): backends are reached through their vtable\n", f, lu, s, impl, d
          bad = 1
        }
      }
      exit bad
    }' >&2
}

self_test() {
  tmp=$(mktemp -d) || exit 1
  trap 'rm -rf "$tmp"' EXIT
  cc=${CC:-cc}
  # includes
  mkdir -p "$tmp/src/core" "$tmp/src/jit" "$tmp/src/runtime" "$tmp/tools" "$tmp/include" \
           "$tmp/templates/cuda" "$tmp/templates/host" "$tmp/templates/common"
  printf '#include "core/core.h"\n#include "rlk.h"\n#include <stdio.h>\n' > "$tmp/src/jit/a.c"
  : > "$tmp/src/core/core.h"
  : > "$tmp/src/jit/jit.h"
  : > "$tmp/include/rlk.h"
  printf '#include "rlk.h"\n#include "tool.h"\n' > "$tmp/tools/rlk-x.c"
  : > "$tmp/tools/tool.h"
  printf '#include "p.cuh"\n#include "k_params.h"\n' > "$tmp/templates/cuda/k.cuh"
  : > "$tmp/templates/cuda/p.cuh"
  printf '#include <math.h>\n#include "h.h"\n#include "k_params.h"\n' > "$tmp/templates/host/k.c"
  : > "$tmp/templates/host/h.h"
  : > "$tmp/templates/common/k_params.h"
  check_includes "$tmp" || { echo "layers self-test: a clean tree was refused" >&2; exit 1; }
  expect_include_caught() { # file text what
    printf "$2" > "$tmp/$1"
    check_includes "$tmp" 2>/dev/null && { echo "layers self-test: $3 was not caught" >&2; exit 1; }
    rm "$tmp/$1"
  }
  expect_include_caught src/core/b.c '#include "jit/jit.h"\n' "core including jit"
  expect_include_caught src/core/b.c '#include <jit/jit.h>\n' "core including <jit/jit.h>"
  expect_include_caught tools/rlk-y.c '#include "ops/ops.h"\n' "a tool including ops/"
  expect_include_caught tools/rlk-y.c '#include <core/core.h>\n' "a tool including <core/core.h>"
  expect_include_caught templates/cuda/t.cuh '#include <cuda_fp16.h>\n' "a CUDA template including a toolkit header"
  expect_include_caught templates/host/t.c '#include "../cuda/p.cuh"\n' "a host template including another folder's file"
  expect_include_caught templates/host/t.c '#include "p.cuh"\n' "a host template including a CUDA header by name"
  expect_include_caught templates/common/t.h '#include "h.h"\n' "a shared header including a host header"
  # links
  obj="$tmp/obj"
  mkdir -p "$obj/src/core" "$obj/src/jit" "$obj/src/ops" "$obj/src/backend/cuda" "$obj/tools" \
           "$tmp/src/runtime"
  printf 'rlk_status rlk_api_call(void);\n' > "$tmp/include/rlk.h"
  : > "$tmp/src/runtime/bench_hooks.h"
  compile() { # object text: its source goes where the tree keeps it
    mkdir -p "$(dirname "$tmp/$1")" && printf "$2" > "$tmp/${1%.o}.c" &&
      "$cc" -c -o "$obj/$1" "$tmp/${1%.o}.c" || exit 1
  }
  compile src/core/c.o 'int rlk_core_fn(void) { return 1; }\n'
  compile src/jit/j.o 'int rlk_core_fn(void);\nint rlk_jit_fn(void) { return rlk_core_fn(); }\nint rlk_api_call(void) { return 0; }\n'
  compile src/backend/cuda/b.o 'int rlk_cuda_backend_open(void) { return 0; }\nint rlk_cuda_detail(void) { return 0; }\n'
  compile src/ops/o.o 'int rlk_cuda_backend_open(void);\nint rlk_jit_fn(void);\nint rlk_ops_fn(void) { return rlk_jit_fn() + rlk_cuda_backend_open(); }\n'
  compile tools/t.o 'int rlk_api_call(void);\nint main(void) { return rlk_api_call(); }\n'
  check_links "$obj" "$tmp" || { echo "layers self-test: clean objects were refused" >&2; exit 1; }
  expect_link_caught() { # object text what
    compile "$1" "$2"
    check_links "$obj" "$tmp" 2>/dev/null && { echo "layers self-test: $3 was not caught" >&2; exit 1; }
    rm "$obj/$1" "$tmp/${1%.o}.c"
  }
  expect_link_caught src/core/u.o 'int rlk_jit_fn(void);\nint rlk_up(void) { return rlk_jit_fn(); }\n' \
    "core using jit"
  expect_link_caught src/ops/u.o 'int rlk_cuda_detail(void);\nint rlk_up(void) { return rlk_cuda_detail(); }\n' \
    "ops using a backend's own function"
  expect_link_caught tools/u.o 'int rlk_jit_fn(void);\nint rlk_up(void) { return rlk_jit_fn(); }\n' \
    "a tool using what rlk.h does not declare"
  compile src/core/stale.o 'int rlk_jit_fn(void);\nint rlk_stale(void) { return rlk_jit_fn(); }\n'
  rm "$tmp/src/core/stale.c" # its source is gone: a leftover, not part of the build
  check_links "$obj" "$tmp" || { echo "layers self-test: a stale object was judged" >&2; exit 1; }
  echo "layers self-test: ok"
  exit 0
}

case "${1:-}" in
  --self-test) self_test ;;
  --links) check_links "${2:?usage: check_layers.sh --links OBJDIR [ROOT]}" "${3:-.}" && echo "layers: links ok" ;;
  *) check_includes "${1:-.}" && echo "layers: includes ok" ;;
esac

#!/usr/bin/env bash
# run_checks.sh - runs the Check suites of TEST_BIN in JOBS parallel processes (default: the
# CPUs), one suite per process, the longest first (`TEST_BIN --list`), each with its own private
# cache root; prints every suite's output in list order and a summary. Exits non-zero when a
# suite fails or crashes. Environment (RLK_TEST_GPU, CK_*, RLK_TEST_BIN_DIR) passes through.
#   tools/build/run_checks.sh build/tests/check_rlk [JOBS]
set -u
bin=${1:?usage: run_checks.sh TEST_BIN [JOBS]}
jobs=${2:-$(nproc 2>/dev/null || echo 2)}
logs=$(mktemp -d "${TMPDIR:-/tmp}/rlk-checks-XXXXXX") || exit 2
trap 'rm -rf "$logs"' EXIT
suites=$("$bin" --list) || exit 2
start=$(date +%s)
# Each suite's verdict is printed as it finishes (what ran still shows when a caller's time limit
# cuts the run short); the whole logs follow in list order.
printf '%s\n' $suites | xargs -P "$jobs" -I{} sh -c \
  't=$(date +%s); RLK_TEST_SUITE="$1" "$2" > "$3/$1.log" 2>&1; rc=$?; echo $rc > "$3/$1.rc";
   s=$(( $(date +%s) - t )); echo $s > "$3/$1.s";
   echo "suite $1 done: rc=$rc ${s}s $(grep -E "^[0-9]+%: Checks" "$3/$1.log" | tail -1)";
   [ $rc = 0 ] || grep -E ":[EF]:" "$3/$1.log" | head -5' _ {} "$bin" "$logs"
failed=""
for s in $suites; do
  cat "$logs/$s.log"
  rc=$(cat "$logs/$s.rc" 2>/dev/null || echo missing)
  [ "$rc" = 0 ] || failed="$failed $s($rc)"
done
echo "check suites: $(printf '%s\n' $suites | wc -l) run in $(( $(date +%s) - start )) s, $jobs at a time;" \
  "seconds each: $(for s in $suites; do printf '%s %s, ' "$s" "$(cat "$logs/$s.s" 2>/dev/null)"; done)"
if [ -n "$failed" ]; then
  echo "FAILED suites:$failed"
  exit 1
fi

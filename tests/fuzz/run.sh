#!/usr/bin/env bash
# run.sh BUILD SECONDS TARGET... - runs the fuzz targets built under BUILD/fuzz (make fuzz).
#
# Each target first replays its kept inputs once (tests/fuzz/corpus/<target>, the seeds and
# what earlier runs found, and tests/fuzz/crashes/<target>, reproducers of fixed faults), then
# fuzzes for SECONDS from them. New inputs go to BUILD/corpus/<target> (never into the
# repository: `make fuzz-corpus` keeps those that reach new code), a crashing input to
# BUILD/artifacts/<target>/. Any crash, sanitizer report, leak, hang (FUZZ_TIMEOUT seconds an
# input, default 25) or excess memory fails the run. FUZZ_JOBS targets run at once (default: the
# CPUs). Logs: BUILD/logs/<target>.log. The last lines are a table of executions per target.
set -u
cd "$(dirname "$0")/../.."
build=$1
secs=$2
shift 2
timeout_s=${FUZZ_TIMEOUT:-25}
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$build/logs"

# A fault shows as a sanitizer report on stderr; make any report fatal and leaks too.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

run_one() {
  local t=$1 bin=$build/fuzz/fuzz_$1 log=$build/logs/$1.log
  local kept=() d
  for d in tests/fuzz/corpus/$t tests/fuzz/crashes/$t; do
    [ -d "$d" ] && kept+=("$d")
  done
  mkdir -p "$build/corpus/$t" "$build/artifacts/$t"
  {
    echo "== replay: ${kept[*]:-(no kept inputs)}"
    "$bin" -runs=0 -timeout="$timeout_s" -artifact_prefix="$build/artifacts/$t/" "${kept[@]}" 2>&1 ||
      { echo "== FAILED in replay"; exit 1; }
    echo "== fuzz: $secs s"
    "$bin" -max_total_time="$secs" -timeout="$timeout_s" -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$build/artifacts/$t/" "$build/corpus/$t" "${kept[@]}" 2>&1 ||
      { echo "== FAILED while fuzzing"; exit 1; }
  } >"$log" 2>&1
}

pids=()
names=()
for t in "$@"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
  echo "fuzz: $t (log $build/logs/$t.log)"
  run_one "$t" &
  pids+=($!)
  names+=("$t")
done

failed=0
printf '%-14s %12s %8s %s\n' target executions corpus result
for i in "${!pids[@]}"; do
  t=${names[$i]}
  log=$build/logs/$t.log
  if wait "${pids[$i]}"; then result=ok; else result=FAILED; failed=1; fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  corpus=$(find "$build/corpus/$t" -type f | wc -l)
  printf '%-14s %12s %8s %s\n' "$t" "${execs:-?}" "$corpus" "$result"
  if [ $result != ok ]; then
    grep -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|contract broken|SUMMARY' "$log" | sed 's/^/    /'
    ls "$build/artifacts/$t" 2>/dev/null | sed "s|^|    artifact: $build/artifacts/$t/|"
  fi
done
exit $failed

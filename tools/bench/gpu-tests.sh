#!/usr/bin/env bash
# gpu-tests.sh - the whole GPU test suite in one device call, with a short summary: builds where
# make, a C compiler and Check are there (else takes the build/ carried from the development
# machine), compiles the GPU cases' kernels (tests/gpu-kernels.conf) with every CPU into a
# read-only tree, runs every Check suite's GPU cases ("gpu" of all suites side by side, with
# linear_logprob's "gpu_backward" and logprob's "gpu_variants" beside them) and python/tests on
# CUDA. Exits 0 only when everything ran and passed and no GPU case skipped (on an sm_90 device
# none may). Logs: $OUT/tests.tgz; the summary: $OUT/summary.txt and the end of the output.
#   here:   make -j2 tests lib     (the GPU machine has no Check library to build the tests with)
#   device: REV=<revision> tools/bench/gpu-tests.sh     (run with carry ["build"], from the root)
#   GPU_ARCH (sm_90a), C_SECONDS (480: each Check run's limit), PY_SECONDS (300).
set -u
OUT=${OUT:-gpu-out}
W=/tmp/rlk-gpu-tests
rm -rf "$W" && mkdir -p "$W" "$OUT"
summary=$W/summary.txt
jobs=$(nproc 2>/dev/null || echo 4)
start=$(date +%s)
export RLK_TEST_BIN_DIR=$PWD/build/bin RLK_CACHE_DIR=$W/cache PYTHONUNBUFFERED=1
# libnccl.so.2 from the NCCL wheel, where the loader does not find one (logprob_shard's case)
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$nccl" ] && [ -d "$nccl" ] && export LD_LIBRARY_PATH=$nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

note() { # a line of the summary, kept in $OUT as it grows (a call cut short still returns it)
  echo "$*" | tee -a "$summary"
  cp "$summary" "$OUT/summary.txt"
}
finish() {
  note "total $(( $(date +%s) - start )) s, exit status $1"
  tar czf "$OUT/tests.tgz" -C "$W" --exclude cache --exclude kernels . 2>/dev/null
  exit "$1"
}

note "date: $(date -u +%FT%TZ) revision: ${REV:-unknown}"
note "$(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1 | head -1)"
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)

# 1. the build
if command -v make > /dev/null && command -v cc > /dev/null && pkg-config --exists check 2> /dev/null; then
  s=$(date +%s)
  make -j"$jobs" tests lib > "$W/build.log" 2>&1
  r=$?
  note "build: rc=$r $(( $(date +%s) - s )) s"
  [ $r -ne 0 ] && { tail -20 "$W/build.log" | tee -a "$summary"; finish $r; }
else
  note "build: no make, cc or Check here: the carried build/ ($(ls -l --time-style=+%FT%T build/tests/check_rlk 2>/dev/null | awk '{print $6}'))"
fi
for f in build/tests/check_rlk build/bin/rlk-precompile build/lib/librlk.so.0; do
  [ -e "$f" ] || { note "missing $f: run make -j2 tests lib here and carry build"; finish 2; }
done

# 2. the GPU cases' kernels, compiled with every CPU (a configuration missing from the list is
# compiled when a case asks for it)
s=$(date +%s)
build/bin/rlk-precompile --targets "${GPU_ARCH:-sm_90a}" --config tests/gpu-kernels.conf --out "$W/kernels" \
  -j "$jobs" -q > "$W/precompile.log" 2>&1
r=$?
note "precompile tests/gpu-kernels.conf: rc=$r $(( $(date +%s) - s )) s"
rc=$r

# 3. the Check suites' GPU cases
export RLK_TEST_GPU=1 RLK_TEST_RO_CACHE=$W/kernels
s=$(date +%s)
for sc in linear_logprob:gpu_backward logprob:gpu_variants; do
  ( RLK_TEST_SUITE=${sc%%:*} CK_RUN_CASE=${sc#*:} timeout "${C_SECONDS:-480}" build/tests/check_rlk \
      > "$W/c-${sc#*:}.log" 2>&1
    echo $? > "$W/c-${sc#*:}.rc" ) &
done
CK_RUN_CASE=gpu timeout "${C_SECONDS:-480}" tools/build/run_checks.sh build/tests/check_rlk "$jobs" \
  > "$W/c-gpu.log" 2>&1
echo $? > "$W/c-gpu.rc"
wait
for c in gpu gpu_backward gpu_variants; do
  r=$(cat "$W/c-$c.rc" 2>/dev/null || echo missing)
  [ "$r" = 0 ] || rc=1
  note "check case $c: rc=$r $(grep -hE '^[0-9]+%: Checks' "$W/c-$c.log" | awk '{c += $3; f += $5; e += $7} END {printf "checks %d, failures %d, errors %d", c, f, e}')"
done
note "check cases: $(( $(date +%s) - s )) s; $(grep -hE '^check suites' "$W/c-gpu.log" | cut -c1-300)"
grep -hE '^suite .* rc=[^0]|:[EF]:' "$W"/c-*.log | head -20 | tee -a "$summary"

# 4. python/tests on CUDA (the numpy place needs the host compiler, which skips where it is missing)
s=$(date +%s)
xd=$(python3 -c 'import xdist' > /dev/null 2>&1 && echo "-n 8 --dist loadfile")
RLK_LIBRARY=$PWD/build/lib/librlk.so.0 PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} \
  timeout "${PY_SECONDS:-300}" python3 -m pytest -q -rs $xd python/tests > "$W/pytest.log" 2>&1
r=$?
[ $r -ne 0 ] && rc=1
note "pytest: rc=$r $(( $(date +%s) - s )) s: $(tail -1 "$W/pytest.log")"
grep -E '^(FAILED|ERROR)' "$W/pytest.log" | head -10 | tee -a "$summary"

# 5. skips: a GPU case that skipped did not test anything
grep -hE '^skip \(' "$W"/c-*.log | sort | uniq -c | sort -rn > "$W/c-skips.txt"
grep -E '^SKIPPED' "$W/pytest.log" | grep -iE 'cuda|gpu|device|sm_9' > "$W/py-gpu-skips.txt"
n=$(( $(wc -l < "$W/c-skips.txt") + $(wc -l < "$W/py-gpu-skips.txt") ))
note "GPU skips: $n (device compute capability ${cap:-unknown})"
head -10 "$W/c-skips.txt" "$W/py-gpu-skips.txt" 2>/dev/null | tee -a "$summary"
[ "$n" -ne 0 ] && [ "${cap:-}" = "9.0" ] && rc=1
finish $rc

#!/usr/bin/env bash
# gpu-verify.sh - a short GPU check of a change in one call: the GPU cases of the named Check
# suites (each time-boxed), chosen Python tests on CUDA, and the main benchmarks of this build
# beside a base build (tools/bench/ab-run.sh). Everything lands in $OUT/verify.tgz; a table is
# printed last.
#   usage (repository root, build/ built):
#     SUITES="policy_loss linear_logprob" PYTESTS="python/tests/test_x.py" BASE=.gpu/base \
#       tools/bench/gpu-verify.sh
#   SUITE_TIMEOUT (s per suite, 120), PYTEST_TIMEOUT (s, 240), PYTEST_K (pytest -k); BASE empty:
#   no A/B (BENCHES and ROUNDS go to ab-run.sh).
set -u
OUT=${OUT:-gpu-out}
W=/tmp/rlk-gpu-verify
rm -rf "$W" && mkdir -p "$W" "$OUT"
export RLK_TEST_BIN_DIR=$PWD/build/bin RLK_CACHE_DIR=/tmp/rlk-gpu-verify-cache PYTHONUNBUFFERED=1
summary=$W/summary.txt
{
  echo "date: $(date -u +%FT%TZ) revision: ${REV:-unknown}"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
} > "$summary"
rc=0
for s in ${SUITES:-}; do
  t0=$(date +%s)
  RLK_TEST_SUITE=$s CK_RUN_CASE=gpu RLK_TEST_GPU=1 timeout "${SUITE_TIMEOUT:-120}" build/tests/check_rlk \
    > "$W/suite-$s.log" 2>&1
  r=$?
  [ $r -ne 0 ] && rc=$r
  echo "suite $s: rc=$r $(( $(date +%s) - t0 ))s $(grep -E 'Checks' "$W/suite-$s.log" | tail -1)" >> "$summary"
  grep -E ':[EF]:' "$W/suite-$s.log" | head -5 >> "$summary"
  cp "$summary" "$OUT/summary.txt" # what ran so far comes back even if the call is cut short
done
if [ -n "${PYTESTS:-}" ]; then
  t0=$(date +%s)
  RLK_LIBRARY=$PWD/build/lib/librlk.so.0 PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} \
    timeout "${PYTEST_TIMEOUT:-240}" python3 -m pytest -q -rs $PYTESTS ${PYTEST_K:+-k "$PYTEST_K"} \
    > "$W/pytest.log" 2>&1
  r=$?
  [ $r -ne 0 ] && rc=$r
  echo "pytest: rc=$r $(( $(date +%s) - t0 ))s $(tail -1 "$W/pytest.log")" >> "$summary"
  grep -E '^(FAILED|ERROR)' "$W/pytest.log" | head -10 >> "$summary"
  cp "$summary" "$OUT/summary.txt"
fi
if [ -n "${BASE:-}" ]; then
  ROUNDS=${ROUNDS:-1} tools/bench/ab-run.sh "$BASE" build/bin "$W/ab" > "$W/ab.txt" 2>&1
  echo "== A/B (A: $BASE, B: this build), medians in ms" >> "$summary"
  grep -E '^(bench|rlk-bench)' "$W/ab.txt" >> "$summary"
fi
tar czf "$OUT/verify.tgz" -C "$W" .
cp "$summary" "$OUT/summary.txt"
cat "$summary"
exit $rc

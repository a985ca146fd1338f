#!/usr/bin/env bash
# call 1: the divergence's wide forward (this build) beside main's (build/main) in one run, the
# divergence GPU cases, then the whole GPU suite as time allows.
set -u
OUT=${OUT:-gpu-out}; W=/tmp/s36w; rm -rf $W; mkdir -p "$OUT" $W
s0=$(date +%s); dl=$(( s0 + ${DEADLINE:-560} ))
left() { echo $(( dl - $(date +%s) )); }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python RLK_CACHE_DIR=$W/cache
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee $W/gpu.txt
NEW=$PWD/build/lib/librlk.so.0 OLD=$PWD/build/main/lib/librlk.so.0
run_ld() { # side rounds json
  local lib=$NEW; [ "$1" = old ] && lib=$OLD
  RLK_LIBRARY=$lib timeout $(( $(left) < 150 ? $(left) : 150 )) python3 tools/bench/linear_divergence_bench.py \
    --modes fkl,jsd --rounds $2 --json $W/ld-$1-$3.json > $W/ld-$1-$3.log 2>&1
  echo "== ld $1 $3 rc=$? $(( $(date +%s) - s0 )) s"
}
# the divergence's GPU cases on the new build first (a wrong kernel must not be timed as a win)
RLK_TEST_GPU=1 RLK_TEST_SUITE=linear_divergence CK_RUN_CASE=gpu RLK_TEST_BIN_DIR=$PWD/build/bin \
  timeout 150 build/tests/check_rlk > $W/c-ld.log 2>&1
echo "== ld gpu cases rc=$? $(( $(date +%s) - s0 )) s: $(grep -E '^[0-9]+%' $W/c-ld.log)"
grep -E ':[EF]:' $W/c-ld.log | head -8
run_ld new 3 a
run_ld old 3 a
[ $(left) -gt 120 ] && run_ld new 2 b
# the whole GPU suite with what is left
if [ $(left) -gt 200 ]; then
  C_SECONDS=$(( $(left) - 130 )) PY_SECONDS=100 OUT=$W/tests tools/bench/gpu-tests.sh > $W/tests.log 2>&1
  echo "== gpu-tests rc=$? $(( $(date +%s) - s0 )) s"
  tail -25 $W/tests/summary.txt
fi
tar czf "$OUT/s36call1.tgz" -C $W --exclude cache --exclude kernels .
for f in $W/ld-*.log; do echo "---- $f"; grep -vE "^\s*$" $f | tail -9; done
echo "total $(( $(date +%s) - s0 )) s"

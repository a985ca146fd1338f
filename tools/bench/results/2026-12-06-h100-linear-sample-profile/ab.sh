#!/usr/bin/env bash
# the fused forward's idle warpgroup: its GPU suites, then linear_sample before (build/s24/old) and after
set -u
OUT=${OUT:-s24d-out}; mkdir -p "$OUT"
s0=$(date +%s)
W=/tmp/rlk-d; mkdir -p $W
build/bin/rlk-precompile --targets sm_90a --config tests/gpu-kernels.conf --out $W/kernels -j 16 -q > $W/pre.log 2>&1
echo "precompile rc=$? $(( $(date +%s) - s0 )) s"
export RLK_TEST_GPU=1 RLK_TEST_RO_CACHE=$W/kernels
for s in invariance linear_logprob linear_sample kept_set linear_logprob_rows linear_policy_loss; do
  ( RLK_TEST_SUITE=$s CK_RUN_CASE=gpu timeout 200 build/tests/check_rlk > "$OUT/c-$s.log" 2>&1; echo "$s rc=$? $(grep -E '^[0-9]+%: Checks' "$OUT/c-$s.log")" ) &
done
wait
grep -hE ':[EF]:' "$OUT"/c-*.log | head
echo "suites $(( $(date +%s) - s0 )) s"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python:$PWD/tools/bench
for v in old new; do
  lib=$PWD/build/lib/librlk.so.0; [ $v = old ] && lib=$PWD/build/s24/old/librlk.so.0
  RLK_CACHE_DIR=/tmp/rlkc-$v RLK_LIBRARY=$lib timeout 120 python3 tools/bench/linear_sample_bench.py --rounds 30 --json "$OUT/linear-sample-$v.json" > "$OUT/ls-$v.log" 2>&1
  echo "== $v rc=$? $(( $(date +%s) - s0 )) s"
done
for v in old new; do RLK_LIBRARY= python3 -c "
import json; d=json.load(open('$OUT/linear-sample-$v.json'))
for M,r in d['rows'].items(): print('$v', 'M', M, 'rlk %.3f ms' % r['rlk.linear_sample ms'], 'cublas %.3f' % r['h @ W^T ms (cuBLAS on a GPU)'], 'ratio %.3f' % r['rlk / h @ W^T'], 'bitwise', r[\"log-probs bitwise rlk.linear_logprob's\"])" 2>&1 | tail -5; done
echo "total $(( $(date +%s) - s0 )) s"

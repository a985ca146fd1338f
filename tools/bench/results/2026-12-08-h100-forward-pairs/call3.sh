#!/usr/bin/env bash
# A short call: the GPU cases of the suites the changes since the last whole suite touch (the
# fused head's forward pairs and token-chunk slices, the divergence's -inf teacher logits, the
# shard records, the CUDA backend's error paths, the scan test), each suite in its own process,
# the GPU cases' kernels precompiled with every CPU first; then rlk.linear_sample at 129 / 192 / 256 / 420
# rows, old (build/expB) and new. Carry build/lib, build/tests, build/bin, build/expB.
set -u
OUT=${OUT:-gpu-out}; W=/tmp/short; rm -rf $W; mkdir -p "$OUT" $W
s0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python RLK_TEST_BIN_DIR=$PWD/build/bin RLK_CACHE_DIR=$W/cache
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
build/bin/rlk-precompile --targets sm_90a --config tests/gpu-kernels.conf --out $W/kernels -j "$(nproc)" -q > $W/precompile.log 2>&1
echo "== precompile rc=$? $(( $(date +%s) - s0 )) s"
export RLK_TEST_GPU=1 RLK_TEST_RO_CACHE=$W/kernels
for sc in linear_logprob:gpu linear_logprob:gpu_backward linear_divergence:gpu logprob_shard:gpu invariance:gpu \
          advantage_scan:gpu linear_sample:gpu hopper:gpu kept_set:gpu; do
  ( RLK_TEST_SUITE=${sc%%:*} CK_RUN_CASE=${sc#*:} timeout 240 build/tests/check_rlk > "$W/${sc/:/-}.log" 2>&1
    echo "$sc rc=$? $(grep -hE '^[0-9]+%: Checks' "$W/${sc/:/-}.log")" >> $W/results.txt ) &
done
wait
echo "== checks $(( $(date +%s) - s0 )) s"; sort $W/results.txt
grep -hE ':[EF]:|^skip' $W/*.log | head -20
for side in old:expB new:lib; do
  RLK_LIBRARY=$PWD/build/${side#*:}/librlk.so.0 timeout 90 python3 tools/bench/linear_sample_bench.py \
    --rows 129,192,256,420 --rounds 6 --json $W/ls-${side%%:*}.json > $W/ls-${side%%:*}.log 2>&1
  echo "== ls ${side%%:*} rc=$? $(( $(date +%s) - s0 )) s"
done
cp $W/*.json $W/*.log $W/results.txt "$OUT"/ 2>/dev/null
python3 - $W <<'PY'
import json, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/ls-*.json")):
    d = json.load(open(f))
    print(os.path.basename(f)[3:-5], " ".join("M %s %.4f ms (%.3fx cuBLAS, bitwise %.3f)" % (M, r["rlk.linear_sample ms"], r["rlk / h @ W^T"], r["log-probs bitwise rlk.linear_logprob's"]) for M, r in d["rows"].items()))
PY
echo "total $(( $(date +%s) - s0 )) s"

#!/usr/bin/env bash
# session 28 call 3 (an H200): TRL's step at G 16 prompt 4096 in micro-batches beside rlk's packed
# step; linear_sample beside cuBLAS; the sampler's whole bench; the two-head divergence; W-stream.
set -u
OUT=${OUT:-gpu-out}; W=/tmp/s28w; rm -rf $W; mkdir -p "$OUT" $W/step
s0=$(date +%s)
export RLK_CACHE_DIR=/tmp/s28-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python RLK_LIBRARY=$PWD/build/lib/librlk.so.0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | head -1 | tee $W/gpu.txt
dl=$(( s0 + ${DEADLINE_S:-560} ))
cap() { local l=$(( dl - $(date +%s) )); [ "$l" -lt 15 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > $W/wheels.log 2>&1
( export PYTHONPATH=$PYTHONPATH:/tmp/site
  timeout $(cap 210) python3 tools/bench/trainer_step.py --archs qwen2.5-0.5b --groups 16 --prompts 4096 \
    --responses 512 --variants trl-mb8,trl-mb4,trl+rlk+prefix --reps 2 --out-dir $W/step > $W/step.log 2>&1
  echo "== step rc=$? $(( $(date +%s) - s0 )) s" )
timeout $(cap 70) python3 tools/bench/linear_sample_bench.py --rounds 20 --json $W/linear_sample.json > $W/linear_sample.log 2>&1
echo "== linear_sample rc=$? $(( $(date +%s) - s0 )) s"
timeout $(cap 90) build/bin/rlk-bench-sample --backend cuda --json $W/sample.json > $W/sample.log 2>&1
echo "== sample rc=$? $(( $(date +%s) - s0 )) s"
timeout $(cap 110) python3 tools/bench/linear_divergence_bench.py --modes fkl,jsd,topk --rounds 5 \
  --json $W/linear_divergence.json > $W/linear_divergence.log 2>&1
echo "== divergence rc=$? $(( $(date +%s) - s0 )) s"
c=$(cap 60); if [ "$c" -gt 25 ]; then
  nvcc -std=c++17 -O3 -arch=sm_90a -o $W/w_stream tools/bench/w_stream.cu -lcuda > $W/wstream.log 2>&1 && \
    timeout $(( c - 20 )) $W/w_stream >> $W/wstream.log 2>&1
  echo "== wstream rc=$? $(( $(date +%s) - s0 )) s"
fi
tar czf "$OUT/s28call3.tgz" -C $W --exclude w_stream .
echo "---- step"; grep '^{' $W/step.log | python3 -c '
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r["variant"], "G%d p%d r%d" % (r["G"], r["prompt"], r["response"]), "step %.3f s" % r["step_s"] if "step_s" in r else r.get("error","")[:200], "peak %.2f GiB" % r["peak_gib"] if r.get("peak_gib") else "", r.get("prefix_calls",""), "loss", r.get("loss"), r.get("phase_ms",""))'
tail -2 $W/step.log
echo "---- linear_sample"; tail -12 $W/linear_sample.log
echo "---- sample"; grep -E "stream|plain|greedy" $W/sample.log | grep -v "one call" | head -40
echo "---- divergence"; tail -12 $W/linear_divergence.log
echo "---- wstream"; tail -14 $W/wstream.log
echo "total $(( $(date +%s) - s0 )) s"

#!/usr/bin/env bash
# the GPU suite, the rows bench (after), and the prefix-shared step at the goal's shape (phase times)
set -u
OUT=${OUT:-c3-out}; mkdir -p "$OUT"
s0=$(date +%s)
REV=${REV:-unknown} STEPS="tests" DEADLINE_S=300 tools/bench/gpu-session.sh > "$OUT/session.log" 2>&1
tail -14 "$OUT/session.log" | grep -v "^==> \|^$"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python:$PWD/tools/bench RLK_CACHE_DIR=/tmp/rlk-rows-cache RLK_LIBRARY=$PWD/build/lib/librlk.so.0
timeout 100 python3 tools/bench/head_rows_bench.py --ns 8192,65536 --rounds 5 --json "$OUT/head-rows-after.json" > "$OUT/head-rows-after.log" 2>&1
echo "== head rows rc=$? $(( $(date +%s) - s0 )) s"; grep -E "^(backward|selection)" "$OUT/head-rows-after.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PYTHONPATH:/tmp/site
left=$(( 560 - ($(date +%s) - s0) ))
timeout $left python3 tools/bench/trainer_step.py --archs qwen2.5-0.5b --groups 16 --prompts 4096 --responses 512 \
  --variants trl+rlk+prefix --reps 3 --out-dir "$OUT/step" > "$OUT/step.log" 2>&1
echo "== step rc=$? $(( $(date +%s) - s0 )) s"; grep '^{' "$OUT/step.log" | cut -c1-900

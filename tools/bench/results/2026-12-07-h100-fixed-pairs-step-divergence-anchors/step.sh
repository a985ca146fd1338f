#!/usr/bin/env bash
# the packed TRL step at G 16, prompt 4096, response 512 (its wheels carried in .whl/)
set -u
OUT=${OUT:-gpu-out}; W=/tmp/s30step; rm -rf $W; mkdir -p "$OUT/step" $W
s0=$(date +%s)
export RLK_CACHE_DIR=/tmp/s30-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python RLK_LIBRARY=$PWD/build/lib/librlk.so.0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1 | tee $W/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $W/wheels.log 2>&1
export PYTHONPATH=$PYTHONPATH:/tmp/site
timeout ${STEP_SECONDS:-420} python3 tools/bench/trainer_step.py --archs qwen2.5-0.5b --groups 16 --prompts 4096 \
  --responses 512 --variants ${VARIANTS:-trl+rlk+prefix} --reps ${REPS:-3} --out-dir $W > $W/step.log 2>&1
echo "== step rc=$? $(( $(date +%s) - s0 )) s"; tail -5 $W/step.log | cut -c1-300
cp -r $W/. "$OUT/step/"
python3 - $W/trainer_step.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = d if isinstance(d, list) else d.get("rows", d)
for r in (rows if isinstance(rows, list) else [rows]):
    print({k: v for k, v in r.items() if k not in ("prefix_calls",)})
PY
echo "total $(( $(date +%s) - s0 )) s"

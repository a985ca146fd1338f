#!/usr/bin/env bash
# call 2: the trainer step's forward phases, trainer_step.py now and before 6c8be3d;
# the divergence beside TRL's and verl's (tokenizers for verl's transformers carried)
# (tools/bench/trainer_step_pre6c8.py: `git show 6c8be3d^:tools/bench/trainer_step.py`, placed there for the run)
set -u
OUT=${OUT:-gpu-out}; mkdir -p $OUT; s0=$(date +%s); D=${DEADLINE:-200}
export RLK_CACHE_DIR=/tmp/s32-cache PYTHONUNBUFFERED=1 RLK_LIBRARY=$PWD/build/lib/librlk.so.0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $OUT/wheels.log 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/vsite .whl-verl/*.whl >> $OUT/wheels.log 2>&1
for v in cur pre; do
  s=tools/bench/trainer_step.py; [ $v = pre ] && s=tools/bench/trainer_step_pre6c8.py
  PYTHONPATH=$PWD/python:/tmp/site timeout 60 python3 $s --archs qwen2.5-0.5b --groups 16 --prompts 4096 \
    --responses 512 --variants trl+rlk+prefix --reps 2 --out-dir $OUT/step-$v > $OUT/step-$v.log 2>&1
  echo "step $v rc=$? $(( $(date +%s) - s0 )) s"
  grep '^{' $OUT/step-$v.log | python3 -c 'import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r.get("step_s"), r.get("min_s"), r.get("phase_ms"), r.get("prefix_calls"), r.get("error","")[:300])'
done
PYTHONPATH=$PWD/python:/tmp/vsite:/tmp/site:$PWD/tools/bench/standin timeout $(( D - ($(date +%s) - s0) )) \
  python3 tools/bench/linear_divergence_bench.py --modes fkl,topk --rounds 3 --json $OUT/div.json > $OUT/div.log 2>&1
echo "divergence rc=$? $(( $(date +%s) - s0 )) s"
grep -E 'importable|ms"|peak|/ |max \|' $OUT/div.log | cut -c1-140

#!/usr/bin/env bash
# the two goal shapes of the GRPO step on TRL (Qwen2.5-0.5B, random weights, bf16)
set -u
OUT=${OUT:-step-out}; mkdir -p "$OUT"
s0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python RLK_LIBRARY=$PWD/build/lib/librlk.so.0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > "$OUT/wheels.log" 2>&1 && export PYTHONPATH=$PYTHONPATH:/tmp/site
timeout 150 python3 tools/bench/trainer_step.py --archs qwen2.5-1.5b --groups 8 --prompts 512 --responses 1024 \
  --variants trl,trl+rlk --reps 2 --out-dir "$OUT/head" > "$OUT/head.log" 2>&1
echo "== head rc=$? $(( $(date +%s) - s0 )) s"
timeout 200 python3 tools/bench/trainer_step.py --archs qwen2.5-0.5b --groups 16 --prompts 2048 --responses 512 \
  --variants trl,trl+rlk,trl+rlk+prefix --reps 2 --out-dir "$OUT/prefix" > "$OUT/prefix.log" 2>&1
echo "== prefix rc=$? $(( $(date +%s) - s0 )) s"
for f in head prefix; do grep '^{' "$OUT/$f.log" | python3 -c '
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r["variant"], "G%d p%d r%d" % (r["G"], r["prompt"], r["response"]), "step %.3f s" % r["step_s"] if "step_s" in r else r.get("error","")[:300], "peak %.2f GiB" % r["peak_gib"] if r.get("peak_gib") else "", r.get("prefix_calls",""), "loss", r.get("loss"))'; tail -3 "$OUT/$f.log"; done
echo "total $(( $(date +%s) - s0 )) s"

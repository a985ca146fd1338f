#!/usr/bin/env bash
# session 28: on an H200, TRL's step at G 16 prompt 4096 (issue 38) first; then the split-atomics
# A/B of the sampler (base templates vs the embedded new ones); then the whole GPU suite.
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT/ab" "$OUT/step"
s0=$(date +%s)
export RLK_CACHE_DIR=/tmp/s28-cache PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | head -1)
echo "$gpu" | tee "$OUT/gpu.txt"
if echo "$gpu" | grep -q H200 && [ "${STEP:-1}" = 1 ]; then
  ( export PYTHONPATH=$PWD/python RLK_LIBRARY=$PWD/build/lib/librlk.so.0
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      > "$OUT/step/wheels.log" 2>&1 && export PYTHONPATH=$PYTHONPATH:/tmp/site
    timeout ${STEP_S:-230} python3 tools/bench/trainer_step.py --archs qwen2.5-0.5b --groups 16 --prompts 4096 \
      --responses 512 --variants trl,trl+rlk+prefix --reps 2 --out-dir "$OUT/step" > "$OUT/step/step.log" 2>&1
    echo "== step rc=$? $(( $(date +%s) - s0 )) s" )
fi
s=$(date +%s)
for r in 1 2; do
  for side in base new; do
    td=""; [ $side = base ] && td=$PWD/build/s28/base_templates
    for c in topp topk+topp; do
      n=${c/+/_}
      env ${td:+RLK_TEMPLATE_DIR=$td} timeout 60 build/bin/rlk-bench-sample --backend cuda --case $c \
        --json "$OUT/ab/$n-$side-$r.json" > "$OUT/ab/$n-$side-$r.log" 2>&1
      echo "ab $c $side $r rc=$? $(( $(date +%s) - s )) s"
    done
  done
done
left=$(( 575 - ($(date +%s) - s0) ))
echo "tests with $left s left"
REV=${REV:-s28} C_SECONDS=$(( left > 300 ? 220 : left - 70 )) PY_SECONDS=100 tools/bench/gpu-tests.sh > "$OUT/tests.log" 2>&1
rc=$?
tail -22 "$OUT/tests.log"
grep '^{' "$OUT/step/step.log" 2>/dev/null | python3 -c '
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r["variant"], "G%d p%d r%d" % (r["G"], r["prompt"], r["response"]), "step %.3f s" % r["step_s"] if "step_s" in r else r.get("error","")[:200], "peak %.2f GiB" % r["peak_gib"] if r.get("peak_gib") else "", r.get("prefix_calls",""), "loss", r.get("loss"))'
tail -3 "$OUT/step/step.log" 2>/dev/null
python3 - "$OUT/ab" <<'PY'
import json, glob, os, sys, statistics
rows = {}
for f in glob.glob(os.path.join(sys.argv[1], "*.json")):
    n, side, r = os.path.basename(f)[:-5].rsplit("-", 2)
    try: d = json.load(open(f))
    except Exception as e: print("bad", f, e); continue
    for x in d.get("results", []):
        rows.setdefault(x["name"], {}).setdefault(side, []).append(x["median_ms"])
for name, s in sorted(rows.items()):
    if "base" in s and "new" in s and "one call" not in name:
        a, b = statistics.median(s["base"]), statistics.median(s["new"])
        print(f"{name[:48]:48} base {a:.4f} new {b:.4f} new/base {b/a:.3f}")
PY
echo "total $(( $(date +%s) - s0 )) s"
exit $rc

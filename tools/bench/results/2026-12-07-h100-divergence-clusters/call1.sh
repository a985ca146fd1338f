#!/usr/bin/env bash
# call 1: the divergence forward's tile-order group swept; the packed TRL step profiled (host vs
# device per phase); the per-call cost on CUDA with the draws' plans
set -u
OUT=${OUT:-gpu-out}; mkdir -p $OUT; s0=$(date +%s); D=${DEADLINE:-560}
el() { echo $(( $(date +%s) - s0 )); }
export RLK_CACHE_DIR=/tmp/rlk-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1 | tee $OUT/gpu.txt
git log --oneline -1 2>/dev/null | tee $OUT/rev.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $OUT/wheels.log 2>&1
# 1. the tile-order group (8 = main's)
for g in 8 2 4 16 32; do
  RLK_EXPERIMENT_LD_GROUP=$g PYTHONPATH=$PWD/python RLK_LIBRARY=$PWD/build/ldgroup/lib/librlk.so.0 timeout 70 \
    python3 tools/bench/linear_divergence_bench.py --modes fkl --rounds 3 --json $OUT/ld-g$g.json > $OUT/ld-g$g.log 2>&1
  echo "ld group $g rc=$? $(el) s"
done
# 2. the packed step, profiled
export RLK_LIBRARY=$PWD/build/lib/librlk.so.0
PYTHONPATH=$PWD/python:/tmp/site timeout 170 python3 tools/bench/trainer_step.py --archs qwen2.5-0.5b --groups 16 --prompts 4096 \
  --responses 512 --variants trl+rlk+prefix,trl --reps 2 --profile --out-dir $OUT/step > $OUT/step.log 2>&1
echo "step rc=$? $(el) s"
# 3. per-call cost on CUDA
left=$(( D - $(el) - 15 )); [ $left -gt 150 ] && left=150
PYTHONPATH=$PWD/python timeout $left python3 tools/bench/python_overhead.py --device cuda --floors --calls 1000 \
  --json $OUT/overhead.json > $OUT/overhead.log 2>&1
echo "overhead rc=$? $(el) s"
echo "=== summary"
python3 - $OUT <<'PY'
import json, sys, os
for g in (8, 2, 4, 16, 32):
    try: d = json.load(open(os.path.join(sys.argv[1], "ld-g%d.json" % g)))
    except Exception as e: print("group", g, "no result", e); continue
    r = d["modes"]["fkl"]
    print("group %2d: fwd %.2f ms (%.3fx two GEMMs %.2f) fwd+bwd %.2f (%.3fx four, %.3fx six)" % (g, r["rlk fwd ms"],
          r["fwd / two GEMMs"], d["two GEMMs ms"], r["rlk fwd+bwd ms"], r["fwd+bwd / four GEMMs"], r["fwd+bwd / six GEMMs"]))
PY
grep '^{' $OUT/step.log | python3 -c 'import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r.get("variant"), r.get("step_s"), "dev", r.get("phase_ms"), "host", r.get("phase_host_ms"), r.get("error","")[:300])
    for t in (r.get("profile_top") or [])[:8]: print("   ", t)'
grep -A40 beside $OUT/overhead.log | grep -v "python path" | cut -c1-140 | head -40
echo "total $(el) s"

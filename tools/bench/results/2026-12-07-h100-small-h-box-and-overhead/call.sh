#!/usr/bin/env bash
# session 29 call 1: (1) the whole GPU suite with build/lib (small h box + packed mass bins) and
# the compiled torch entry's CUDA cases; (2) linear_sample: main's library vs the small h box;
# (3) the per-call overhead on CUDA tensors; (4) top-k + top-p: main's sampler templates (cur) vs
# the packed mass bins (v1) via RLK_TEMPLATE_DIR; (5) trainer_step's packed rlk step, if time.
set -u
OUT=${OUT:-gpu-out}; W=/tmp/s29w1; rm -rf $W; mkdir -p "$OUT" $W/ab $W/ls
s0=$(date +%s)
export RLK_CACHE_DIR=/tmp/s29-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1 | tee $W/gpu.txt
which g++ c++ >> $W/gpu.txt 2>&1
REV=${REV:-s29c1} C_SECONDS=160 PY_SECONDS=130 tools/bench/gpu-tests.sh > $W/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s0 )) s"; tail -14 $W/tests.log
cp -r /tmp/rlk-gpu-tests/*.log /tmp/rlk-gpu-tests/summary.txt $W/ 2>/dev/null
for side in old new; do
  lib=$PWD/build/lib/librlk.so.0; [ $side = old ] && lib=$PWD/build/s28/oldlib/librlk.so.0
  PYTHONPATH=$PWD/python RLK_LIBRARY=$lib timeout 90 python3 tools/bench/linear_sample_bench.py --rounds 12 \
    --json $W/ls/ls-$side-1.json > $W/ls/ls-$side-1.log 2>&1
  echo "linear_sample $side rc=$? $(( $(date +%s) - s0 )) s"
done
PYTHONPATH=$PWD/python RLK_LIBRARY=$PWD/build/lib/librlk.so.0 RLK_TORCH_ENTRY=wait timeout 120 python3 \
  tools/bench/python_overhead.py --device cuda --floors --json $W/overhead.json > $W/overhead.log 2>&1
echo "overhead rc=$? $(( $(date +%s) - s0 )) s"; grep -A14 beside $W/overhead.log | cut -c1-150
for r in 1; do
  for side in cur v1; do
    [ $(( $(date +%s) - s0 )) -gt 470 ] && break
    td=$PWD/build/s28/${side}_templates
    RLK_TEMPLATE_DIR=$td timeout 60 build/bin/rlk-bench-sample --backend cuda --case topk+topp \
      --json $W/ab/topk_topp-$side-$r.json > $W/ab/topk_topp-$side-$r.log 2>&1
    echo "ab $side $r rc=$? $(( $(date +%s) - s0 )) s"
  done
done
left=$(( ${STEP_BUDGET:-0} - ($(date +%s) - s0) ))
if [ $left -gt 100 ]; then
  ( export PYTHONPATH=$PWD/python RLK_LIBRARY=$PWD/build/lib/librlk.so.0
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      > $W/wheels.log 2>&1 && export PYTHONPATH=$PYTHONPATH:/tmp/site
    mkdir -p $W/step
    timeout $((left - 10)) python3 tools/bench/trainer_step.py --archs qwen2.5-0.5b --groups 16 --prompts 4096 \
      --responses 512 --variants trl+rlk+prefix --reps 2 --out-dir $W/step > $W/step/step.log 2>&1
    echo "== step rc=$? $(( $(date +%s) - s0 )) s"; grep '^{' $W/step/step.log | cut -c1-700 )
fi
tar czf "$OUT/s29call1.tgz" -C $W .
python3 - $W <<'PY'
import json, glob, os, sys, statistics
W = sys.argv[1]
rows = {}
for f in glob.glob(os.path.join(W, "ab", "*.json")):
    n, side, r = os.path.basename(f)[:-5].rsplit("-", 2)
    try: d = json.load(open(f))
    except Exception as e: print("bad", f, e); continue
    for x in d.get("results", []):
        rows.setdefault(x["name"], {}).setdefault(side, []).append(x["median_ms"])
for name, s in sorted(rows.items()):
    if "one call" in name: continue
    cur = statistics.median(s["cur"]) if "cur" in s else float("nan")
    print(f"{name[:44]:44} " + " ".join(f"{k} {statistics.median(v):.4f} ({statistics.median(v)/cur:.3f})" for k, v in sorted(s.items())))
for f in sorted(glob.glob(os.path.join(W, "ls", "*.json"))):
    side = os.path.basename(f).split("-")[1]
    try: d = json.load(open(f))
    except Exception as e: print("bad", f, e); continue
    for m, x in sorted(d["rows"].items(), key=lambda kv: int(kv[0])):
        t, cb = x["rlk.linear_sample ms"], x["h @ W^T ms (cuBLAS on a GPU)"]
        bw = x.get("log-probs bitwise rlk.linear_logprob's")
        print(f"linear_sample {side} M {m}: {t:.4f} ms ({t/cb:.3f}x cuBLAS {cb:.4f}), bitwise {bw}")
PY
echo "total $(( $(date +%s) - s0 )) s"

#!/usr/bin/env bash
# call 1: the GPU cases of the suites the cluster pairs run through, then main's forward (old) against the pairs (new), then the step, then the divergence
set -u
OUT=${OUT:-gpu-out}; W=/tmp/s32c1; rm -rf $W; mkdir -p "$OUT" $W/ab
s0=$(date +%s)
export RLK_CACHE_DIR=/tmp/s30-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1 | tee $W/gpu.txt
export RLK_TEST_GPU=1 RLK_TEST_BIN_DIR=$PWD/build/bin
for s in linear_logprob invariance linear_sample linear_logprob_rows; do
  RLK_TEST_SUITE=$s CK_RUN_CASE=gpu timeout 110 build/tests/check_rlk > $W/c-$s.log 2>&1 &
done
wait
for s in linear_logprob invariance linear_sample linear_logprob_rows; do echo "check $s: $(grep -E '^[0-9]+%' $W/c-$s.log | tail -1)"; grep -E ':[EF]:' $W/c-$s.log | head -3; done
echo "checks $(( $(date +%s) - s0 )) s"
for side in old new; do
  lib=$PWD/build/lib/librlk.so.0; bin=build/bin/rlk-bench-linear-logprob
  [ $side = old ] && lib=$PWD/build/s30/old/lib/librlk.so.0 && bin=build/s30/old/rlk-bench-linear-logprob
  PYTHONPATH=$PWD/python RLK_LIBRARY=$lib timeout 50 python3 tools/bench/linear_sample_bench.py --rounds 6 \
    --json $W/ab/ls-$side.json > $W/ab/ls-$side.log 2>&1
  echo "linear_sample $side rc=$? $(( $(date +%s) - s0 )) s"
  timeout 40 $bin --shape 256,4096,151936 --shape 4096,4096,151936 --shape 16384,4096,151936 --iters 10 \
    > $W/ab/ll-$side.log 2>&1
  echo "linear_logprob $side rc=$? $(( $(date +%s) - s0 )) s"
done

tar czf "$OUT/s32call1.tgz" -C $W .
for side in old new; do echo "== $side"; grep -v '^#' $W/ab/ll-$side.log | head -5 | cut -c1-160; done
python3 - $W <<'PY'
import json, os, sys
W = sys.argv[1]
for side in ("old", "new"):
    try: d = json.load(open(os.path.join(W, "ab", "ls-%s.json" % side)))
    except Exception as e: print("bad", side, e); continue
    for m, x in sorted(d["rows"].items(), key=lambda kv: int(kv[0])):
        t, cb = x["rlk.linear_sample ms"], x["h @ W^T ms (cuBLAS on a GPU)"]
        print(f"linear_sample {side} M {m}: {t:.4f} ms ({t/cb:.3f}x cuBLAS {cb:.4f}) bitwise {x.get('log-probs bitwise rlk.linear_logprob' + chr(39) + 's')}")
PY
[ -f $W/overhead.log ] && grep -A40 beside $W/overhead.log | cut -c1-150 | grep -v "python path"
echo "total $(( $(date +%s) - s0 )) s"
# the trainer step (step.sh here; the build tree kept it in build/s30/)
left=$(( ${DEADLINE:-555} - 155 - ($(date +%s) - s0) )); [ $left -gt ${STEP_CAP:-240} ] && left=${STEP_CAP:-240}
[ $left -gt 60 ] && STEP_SECONDS=$left OUT=$OUT bash build/s30/step.sh 2>&1 | tail -12
echo "all $(( $(date +%s) - s0 )) s"
# the two-head divergence beside TRL's chunked divergence and verl's top-k KL
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/vsite .whl-verl/*.whl > /tmp/vwheels.log 2>&1
echo "verl wheels rc=$?"
mkdir -p $OUT/div
PYTHONPATH=$PWD/python:/tmp/vsite:/tmp/site:$PWD/tools/bench/standin RLK_LIBRARY=$PWD/build/lib/librlk.so.0 RLK_CACHE_DIR=/tmp/s30-cache \
  timeout $(( ${DEADLINE:-555} - ($(date +%s) - s0) )) python3 tools/bench/linear_divergence_bench.py --modes fkl,jsd,topk --rounds ${DIV_ROUNDS:-5} \
  --json $OUT/div/linear_divergence.json > $OUT/div/div.log 2>&1
echo "divergence rc=$? $(( $(date +%s) - s0 )) s"; grep -v '^ "' $OUT/div/div.log | tail -4
python3 - $OUT/div/div.log <<'PY'
import sys
for l in open(sys.argv[1]):
    if " ms\"" in l or "peak" in l or "/ " in l or "max |" in l: print(l.rstrip()[:150])
PY
echo "all $(( $(date +%s) - s0 )) s"

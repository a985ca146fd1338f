#!/usr/bin/env bash
# call 7: the divergence clusters launched by attribute (no compiled cluster dims): GPU cases, A/B by N
set -u
OUT=${OUT:-gpu-out}; W=/tmp/run; rm -rf $W; mkdir -p $OUT $W; s0=$(date +%s); D=${DEADLINE:-560}
el() { echo $(( $(date +%s) - s0 )); }
export RLK_CACHE_DIR=/tmp/rlk-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1 | tee $W/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $W/wheels.log 2>&1
export RLK_TEST_GPU=1
for s in linear_divergence hopper; do
  RLK_TEST_SUITE=$s CK_RUN_CASE=gpu timeout 200 build/tests/check_rlk > $W/c-$s.log 2>&1 &
done
PYTHONPATH=$PWD/python:/tmp/site RLK_LIBRARY=$PWD/build/lib/librlk.so.0 timeout 200 python3 -m pytest -q -rs -x python/tests -k "divergence" > $W/pytest.log 2>&1 &
wait
for s in linear_divergence hopper; do echo "check $s: $(grep -E '^[0-9]+%' $W/c-$s.log | tail -1)"; grep -E ':[EF]:' $W/c-$s.log | head -5; done
echo "pytest: $(tail -1 $W/pytest.log)"; grep -E "SKIP" $W/pytest.log | cut -c1-160 | sort | uniq -c | head -8
echo "tests $(el) s"
for side in old new; do
  lib=$PWD/build/lib/librlk.so.0; pp=$PWD/python; modes=fkl,jsd,topk
  [ $side = old ] && lib=$PWD/build/old/librlk.so.0 && modes=fkl,jsd,topk
  [ $side = new ] && pp=$PWD/python:/tmp/site
  PYTHONPATH=$pp RLK_LIBRARY=$lib timeout 150 python3 tools/bench/linear_divergence_bench.py --modes $modes --rounds 3 \
    --json $W/ld-$side.json > $W/ld-$side.log 2>&1
  echo "bench $side rc=$? $(el) s"
  for n in 128 1000 4096; do
    PYTHONPATH=$PWD/python RLK_LIBRARY=$lib timeout 60 python3 tools/bench/linear_divergence_bench.py --modes fkl --rounds 3 \
      --shape $n,4096,151936 --json $W/ld-$side-n$n.json > $W/ld-$side-n$n.log 2>&1
    echo "bench $side N $n rc=$? $(el) s"
  done
done
left=$(( D - $(el) - 15 ))
[ $left -gt 40 ] && PYTHONPATH=$PWD/python RLK_LIBRARY=$PWD/build/lib/librlk.so.0 timeout $left ncu --clock-control none \
  --kernel-name regex:"linear_divergence_fwd_sm90" --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
  python3 tools/bench/results/2026-12-07-h100-divergence-clusters/ld_probe.py --once > $W/ncu.txt 2>&1
echo "ncu rc=$? $(el) s"
tar czf $OUT/results.tgz -C $W .
echo "=== summary"
python3 - $W <<'PY'
import json, sys, os
for side in ("old", "new", "old-n128", "new-n128", "old-n1000", "new-n1000", "old-n4096", "new-n4096"):
    try: d = json.load(open(os.path.join(sys.argv[1], "ld-%s.json" % side)))
    except Exception as e: print(side, "no result", e); continue
    for m, r in d["modes"].items():
        extra = " ".join("%s %.2f" % (k, v) for k, v in r.items() if k.startswith(("TRL", "verl")) and k.endswith("ms"))
        print("%s %-4s fwd %.2f ms (%.3fx two GEMMs %.2f) fwd+bwd %.2f (%.3fx four, %.3fx six) %s" % (side, m, r["rlk fwd ms"],
              r["fwd / two GEMMs"], d["two GEMMs ms"], r["rlk fwd+bwd ms"], r["fwd+bwd / four GEMMs"], r["fwd+bwd / six GEMMs"], extra))
PY
grep -E "Duration|L2 Cache Throughput|DRAM Throughput|Compute \(SM\)|L2 Hit Rate" $W/ncu.txt | head -8
echo "total $(el) s"

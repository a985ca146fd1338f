#!/usr/bin/env bash
# call 1: the divergence forward's clusters (1, 2, 4 row blocks) on this GPU, main's kernels in a
# measurement build that reads RLK_EXPERIMENT_LD_CLUSTER (build/expA); then the whole GPU suite.
set -u
OUT=${OUT:-gpu-out}; W=/tmp/ld-clusters; rm -rf $W; mkdir -p "$OUT" $W
s0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python RLK_CACHE_DIR=$W/cache
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $W/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader -lms 500 > $W/smi.csv 2>&1 &
smi=$!
ld() { # cluster pass
  RLK_LIBRARY=$PWD/build/expA/librlk.so.0 RLK_EXPERIMENT_LD_CLUSTER=$1 timeout 70 python3 \
    tools/bench/linear_divergence_bench.py --modes fkl --rounds 3 --json $W/ld-cl$1-$2.json > $W/ld-cl$1-$2.log 2>&1
  echo "== ld cl$1 pass $2 rc=$? $(( $(date +%s) - s0 )) s $(date +%T)"
}
for p in 1 2; do for cl in 4 1 2; do ld $cl $p; done; done
kill $smi 2>/dev/null
tar czf "$OUT/ld-clusters.tgz" -C $W --exclude cache .
C_SECONDS=300 PY_SECONDS=200 OUT=$OUT/tests tools/bench/gpu-tests.sh > $W/gpu-tests.log 2>&1
echo "== gpu-tests rc=$? $(( $(date +%s) - s0 )) s"
echo "---- gpu tests"; tail -14 $W/gpu-tests.log
echo "---- divergence clusters"
python3 - $W <<'PY'
import json, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/ld-*.json")):
    d = json.load(open(f)); m = d["modes"]["fkl"]
    print(os.path.basename(f)[3:-5], "fwd %.2f ms (%.3fx two GEMMs %.2f)" % (m["rlk fwd ms"], m["fwd / two GEMMs"], d["two GEMMs ms"]),
          "fwd+bwd %.2f (%.3fx six)" % (m["rlk fwd+bwd ms"], m["fwd+bwd / six GEMMs"]))
PY
echo "total $(( $(date +%s) - s0 )) s"

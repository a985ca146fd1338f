#!/usr/bin/env bash
# call 2: the device's cluster shapes as the library reads them, the divergence with the forward's
# cluster chosen from them (main) beside forced quads and pairs (build/expA reads
# RLK_EXPERIMENT_LD_CLUSTER), then the whole GPU suite (SUITE=0 skips it).
set -u
OUT=${OUT:-gpu-out}; W=/tmp/ld-shapes; rm -rf $W; mkdir -p "$OUT" $W
s0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python RLK_CACHE_DIR=$W/cache
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $W/gpu.txt
RLK_LIBRARY=$PWD/build/lib/librlk.so.0 RLK_LOG=debug python3 -c '
import logging; logging.basicConfig(level=logging.DEBUG)
import rlk; rlk.context("cuda")' > $W/probe.log 2>&1
grep -h "clusters of" $W/probe.log | tee $W/clusters.txt
ld() { # name lib cluster modes
  RLK_LIBRARY=$PWD/build/$2/librlk.so.0 RLK_EXPERIMENT_LD_CLUSTER=$3 timeout 90 python3 \
    tools/bench/linear_divergence_bench.py --modes $4 --rounds 3 --json $W/ld-$1.json > $W/ld-$1.log 2>&1
  echo "== ld $1 rc=$? $(( $(date +%s) - s0 )) s $(date +%T)"
}
ld auto-1 lib "" fkl,jsd
ld cl4-1 expA 4 fkl
ld cl2-1 expA 2 fkl
ld auto-2 lib "" fkl
tar czf "$OUT/ld.tgz" -C $W --exclude cache .
if [ "${SUITE:-1}" = 1 ]; then
  C_SECONDS=300 PY_SECONDS=200 OUT=$OUT/tests tools/bench/gpu-tests.sh > $W/gpu-tests.log 2>&1
  echo "== gpu-tests rc=$? $(( $(date +%s) - s0 )) s"
  echo "---- gpu tests"; tail -14 $W/gpu-tests.log
fi
echo "---- clusters: $(cat $W/clusters.txt)"
python3 - $W <<'PY'
import json, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/ld-*.json")):
    d = json.load(open(f))
    for mode, m in d["modes"].items():
        print(os.path.basename(f)[3:-5], mode, "fwd %.2f ms (%.3fx two GEMMs %.2f)" % (m["rlk fwd ms"], m["fwd / two GEMMs"], d["two GEMMs ms"]),
              "fwd+bwd %.2f (%.3fx six)" % (m["rlk fwd+bwd ms"], m["fwd+bwd / six GEMMs"]))
PY
echo "total $(( $(date +%s) - s0 )) s"

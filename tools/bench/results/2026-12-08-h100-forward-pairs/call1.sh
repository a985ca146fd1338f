#!/usr/bin/env bash
# The sm_90a forward in pairs of row blocks: rlk.linear_sample and rlk.linear_logprob's forward
# at M 1 to 512 with the library before (build/expB) and after (build/lib), alternating, beside
# cuBLAS; then the whole GPU suite. Carry build/lib, build/tests, build/bin, build/expB.
set -u
OUT=${OUT:-gpu-out}; W=/tmp/pairs; rm -rf $W; mkdir -p "$OUT" $W
s0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python RLK_CACHE_DIR=$W/cache
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
ls_run() { # side lib round
  RLK_LIBRARY=$PWD/build/$2/librlk.so.0 timeout 150 python3 tools/bench/linear_sample_bench.py \
    --rows 1,64,129,256,384,512 --rounds 8 --json $W/ls-$1-$3.json > $W/ls-$1-$3.log 2>&1
  echo "== ls $1 round $3 rc=$? $(( $(date +%s) - s0 )) s"
}
ls_run old expB 1
ls_run new lib 1
ls_run old expB 2
ls_run new lib 2
cp $W/*.json $W/*.log "$OUT"/ 2>/dev/null
C_SECONDS=300 PY_SECONDS=200 OUT=$OUT/tests REV=${REV:-unknown} tools/bench/gpu-tests.sh > $W/gpu-tests.log 2>&1
echo "== gpu-tests rc=$? $(( $(date +%s) - s0 )) s"
echo "---- gpu tests"; tail -14 $W/gpu-tests.log
python3 - $W <<'PY'
import json, glob, sys, os
rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/ls-*.json")):
    side = os.path.basename(f).split("-")[1]
    for M, r in json.load(open(f))["rows"].items():
        rows.setdefault(int(M), {}).setdefault(side, []).append((r["rlk.linear_sample ms"], r["h @ W^T ms (cuBLAS on a GPU)"], r["log-probs bitwise rlk.linear_logprob's"]))
print("M | old ms (/cuBLAS) | new ms (/cuBLAS) | bitwise")
for M in sorted(rows):
    cells = []
    for side in ("old", "new"):
        v = rows[M].get(side, [])
        cells.append(" ".join("%.4f (%.3fx)" % (a, a / b) for a, b, _ in v) or "-")
    eq = min(e for s in rows[M].values() for _, _, e in s)
    print("%d | %s | %s | %.3f" % (M, cells[0], cells[1], eq))
PY
echo "total $(( $(date +%s) - s0 )) s"

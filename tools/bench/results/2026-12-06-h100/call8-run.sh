#!/usr/bin/env bash
# the GPU suite, then the sampler A/B: before = d7230a4 (build/ab/before), after = this build
set -u
OUT=${OUT:-ab-out}; mkdir -p "$OUT"
s0=$(date +%s)
export PYTHONPATH=$PWD/python RLK_LIBRARY=$PWD/build/lib/librlk.so.0
C_SECONDS=200 PY_SECONDS=100 tools/bench/gpu-tests.sh > "$OUT/tests.log" 2>&1
echo "== tests rc=$? $(( $(date +%s) - s0 )) s"; grep -E "check case|pytest:|GPU skips|FAIL|fail" "$OUT/tests.log" | head -20
ROUNDS=2 BENCHES="rlk-bench-sample" tools/bench/ab-run.sh build/ab/before/bin build/bin "$OUT/ab" > "$OUT/ab.txt" 2>&1
echo "== ab rc=$? $(( $(date +%s) - s0 )) s"
python3 - "$OUT/ab.txt" <<'PY'
import sys, statistics as s
rows=[l.split() for l in open(sys.argv[1]) if l.startswith('rlk-bench')]
r=[float(x[-1]) for x in rows]
print("B/A over %d cases: median %.3f min %.3f max %.3f" % (len(r), s.median(r), min(r), max(r)))
for key in ("topk", "topk+topp", "plain", "greedy", "minp", "topp"):
    sel=[float(x[-1]) for x in rows if x[2]==key]
    if sel: print("  %-10s %2d cases: median %.3f min %.3f max %.3f" % (key, len(sel), s.median(sel), min(sel), max(sel)))
PY
echo "total $(( $(date +%s) - s0 )) s"

#!/usr/bin/env bash
# A/B: before = d7230a4 (build/ab/before), after = this tree's build. One device call.
set -u
OUT=${OUT:-ab-out}; mkdir -p "$OUT"
A=build/ab/before
s0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
export RLK_CACHE_DIR=/tmp/rlk-ab-cache
# fused head: forward + backward, A B A B
for r in 1 2; do for side in A B; do
  d=build/bin; [ $side = A ] && d=$A/bin
  timeout 120 $d/rlk-bench-linear-logprob --shape 8192,4096,151936 --iters 5 --backward > "$OUT/head-$side-$r.log" 2>&1
  echo "== head $side $r rc=$? $(( $(date +%s) - s0 )) s"; grep -v '^\s*$' "$OUT/head-$side-$r.log" | tail -6
done; done
# prefix attention through Python, A B
for side in A B; do
  if [ $side = A ]; then root=$A; lib=$A/lib/librlk.so.0; else root=.; lib=build/lib/librlk.so.0; fi
  mkdir -p "$OUT/pattn-$side"; RLK_LIBRARY=$PWD/$lib PYTHONPATH=$root/python OUT=$OUT/pattn-$side timeout 150 python3 $root/tools/bench/prefix_attention_bench.py --quick --no-flex > "$OUT/pattn-$side.log" 2>&1
  echo "== prefix attention $side rc=$? $(( $(date +%s) - s0 )) s"; tail -14 "$OUT/pattn-$side.log"
done
# the three main C benchmarks
ROUNDS=1 tools/bench/ab-run.sh $A/bin build/bin "$OUT/ab" > "$OUT/ab.txt" 2>&1
echo "== ab rc=$? $(( $(date +%s) - s0 )) s"
grep -v "^==" "$OUT/ab.txt" | awk 'NR==1 || $NF+0>0' | sort -k6 -n | (head -5; echo ...; tail -8)
python3 - "$OUT/ab.txt" <<'PY'
import sys
r=[float(l.split()[-1]) for l in open(sys.argv[1]) if l.split() and l.split()[-1].replace('.','',1).isdigit()]
import statistics as s
if r: print("B/A over %d cases: median %.3f min %.3f max %.3f" % (len(r), s.median(r), min(r), max(r)))
PY
echo "total $(( $(date +%s) - s0 )) s"

#!/usr/bin/env bash
# ab-run.sh - the three main benchmarks (logprob, policy loss, sampling) of two builds in one
# run, alternating A B A B so that drift on the GPU lands on both: what "unchanged within noise"
# is measured with when a change should not move kernel times.
#   usage: tools/bench/ab-run.sh A_BIN_DIR B_BIN_DIR [OUT_DIR]
#   A_BIN_DIR, B_BIN_DIR: build/bin folders of the two revisions (their rlk-bench-* tools)
#   ROUNDS (default 2), ITERS (passed as --iters when set), BENCHES (default: the three)
# Writes <OUT_DIR>/<bench>-<A|B>-<round>.{json,log}; prints each run's table, then a summary of
# the medians per case and build from the JSON files.
set -u
A=$1
B=$2
OUT=${3:-ab-out}
ROUNDS=${ROUNDS:-2}
BENCHES=${BENCHES:-"rlk-bench-logprob rlk-bench-policy-loss rlk-bench-sample"}
mkdir -p "$OUT"
export RLK_CACHE_DIR=${RLK_CACHE_DIR:-/tmp/rlk-ab-cache}
rc=0
for r in $(seq 1 "$ROUNDS"); do
  for b in $BENCHES; do
    for side in A B; do
      dir=$A
      [ "$side" = B ] && dir=$B
      log=$OUT/$b-$side-$r.log
      timeout 300 "$dir/$b" --backend cuda ${ITERS:+--iters "$ITERS"} --json "$OUT/$b-$side-$r.json" \
        > "$log" 2>&1
      s=$?
      echo "== $b $side round $r rc=$s"
      [ $s -ne 0 ] && rc=$s && tail -5 "$log"
    done
  done
done
python3 - "$OUT" <<'EOF'
import json, os, sys, glob, statistics
out = sys.argv[1]
rows = {}
def walk(x, path, side, bench):
    if isinstance(x, dict):
        name = x.get("name") or x.get("case")
        for k in ("median_ms", "ms", "median_us", "us"):
            if name is not None and isinstance(x.get(k), (int, float)):
                rows.setdefault((bench, str(name), k), {}).setdefault(side, []).append(float(x[k]))
        for k, v in x.items():
            walk(v, path + [k], side, bench)
    elif isinstance(x, list):
        for v in x:
            walk(v, path, side, bench)
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    base = os.path.basename(f)[:-5]
    bench, side, _ = base.rsplit("-", 2)
    try:
        walk(json.load(open(f)), [], side, bench)
    except Exception as e:
        print("unreadable", f, e)
print(f"{'bench':24} {'case':44} {'unit':10} {'A':>10} {'B':>10} {'B/A':>7}")
for (bench, name, unit), sides in sorted(rows.items()):
    if "A" in sides and "B" in sides:
        a, b = statistics.median(sides["A"]), statistics.median(sides["B"])
        print(f"{bench:24} {name[:44]:44} {unit:10} {a:10.4f} {b:10.4f} {b / a if a else float('nan'):7.3f}")
EOF
exit $rc

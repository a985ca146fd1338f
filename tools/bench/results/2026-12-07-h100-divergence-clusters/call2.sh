#!/usr/bin/env bash
# call 2: the divergence forward's clocks/power beside cuBLAS and its ncu sections; the packed
# TRL step's timeline; the draws' per-call cost (full log)
set -u
OUT=${OUT:-gpu-out}; W=/tmp/run; rm -rf $W; mkdir -p $OUT $W; s0=$(date +%s); D=${DEADLINE:-560}
el() { echo $(( $(date +%s) - s0 )); }
export RLK_CACHE_DIR=/tmp/rlk-cache PYTHONUNBUFFERED=1 RLK_LIBRARY=$PWD/build/lib/librlk.so.0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | head -1 | tee $W/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $W/wheels.log 2>&1
# 1. clocks and power while each runs ~3 s
R=clocks_event_reasons.active; nvidia-smi --query-gpu=$R --format=csv > /dev/null 2>&1 || R=clocks_throttle_reasons.active
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$R --format=csv -lms 100 > $W/smi.csv 2>&1 &
smi=$!
PYTHONPATH=$PWD/python timeout 60 python3 tools/bench/results/2026-12-07-h100-divergence-clusters/ld_probe.py --seconds=3 > $W/probe.log 2>&1
echo "probe rc=$? $(el) s"; kill $smi
# 2. ncu: one launch each
PYTHONPATH=$PWD/python timeout 150 ncu --clock-control none --kernel-name regex:"linear_divergence_fwd_sm90|nvjet" \
  --launch-count 3 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
  python3 tools/bench/results/2026-12-07-h100-divergence-clusters/ld_probe.py --once > $W/ncu.txt 2>&1
echo "ncu rc=$? $(el) s"
# 3. the packed step, its timeline
PYTHONPATH=$PWD/python:/tmp/site timeout 170 python3 tools/bench/trainer_step.py --archs qwen2.5-0.5b --groups 16 --prompts 4096 \
  --responses 512 --variants trl+rlk+prefix --reps 3 --profile --out-dir $W/step > $W/step.log 2>&1
echo "step rc=$? $(el) s"
# 4. per-call cost on CUDA
left=$(( D - $(el) - 20 )); [ $left -gt 100 ] && left=100
PYTHONPATH=$PWD/python timeout $left python3 tools/bench/python_overhead.py --device cuda --floors --calls 1000 \
  --ops sample,linear_sample,linear_logprob,policy_loss --json $W/overhead.json > $W/overhead.log 2>&1
echo "overhead rc=$? $(el) s"
tar czf $OUT/results.tgz -C $W .
echo "=== summary"
cat $W/probe.log
python3 - $W/smi.csv $W/probe.log <<'PY'
import sys, datetime
rows = [l.strip().split(", ") for l in open(sys.argv[1]) if l[:1].isdigit()]
marks = [l.split() for l in open(sys.argv[2]) if " start " in l or " end " in l]
def ts(s): return datetime.datetime.strptime(s, "%Y/%m/%d %H:%M:%S.%f").timestamp()
spans = {}
for m in marks:
    name = " ".join(m[2:]).split(":")[0]
    spans.setdefault(name, []).append(float(m[0]))
for name, (a, b) in spans.items():
    sel = [r for r in rows if a + 0.5 <= ts(r[0]) <= b]
    if not sel: print(name, "no samples"); continue
    clk = sorted(float(r[1].split()[0]) for r in sel); pw = sorted(float(r[3].split()[0]) for r in sel)
    print("%-15s sm clock median %.0f MHz (min %.0f), power median %.0f W, reasons %s" % (name, clk[len(clk)//2], clk[0], pw[len(pw)//2], sorted({r[5] for r in sel})))
PY
grep -E "linear_divergence_fwd_sm90|nvjet|SM Frequency|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Registers Per|Achieved Occupancy" $W/ncu.txt | cut -c1-120 | head -40
grep '^{' $W/step.log | python3 -c 'import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r.get("variant"), r.get("step_s"), "dev", r.get("phase_ms"), "host", r.get("phase_host_ms"), r.get("error","")[:300])'
grep -A12 beside $W/overhead.log | cut -c1-150
echo "total $(el) s"

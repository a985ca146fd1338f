#!/usr/bin/env bash
set -u
OUT=${OUT:-prof-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python RLK_LIBRARY=$PWD/build/lib/librlk.so.0 RLK_CACHE_DIR=/tmp/rlkc
timeout 120 python3 build/s24/prof.py --kernels 2>&1 | grep -v "^-\|^$" | cut -c1-160 | tee "$OUT/kernels.txt" | head -40
timeout 300 ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section LaunchStats --section Occupancy --section SchedulerStats python3 build/s24/prof.py > "$OUT/ncu.txt" 2>&1
echo "ncu rc=$?"
grep -E "linear_logprob|sample|combine|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|L2 Hit|Stall|Warp Cycles Per Issued|Registers Per|Block Size|Grid Size|Achieved Occupancy|Waves Per SM|Issued Warp|No Eligible|Dynamic Shared" "$OUT/ncu.txt" | cut -c1-150 | head -120

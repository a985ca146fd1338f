#!/usr/bin/env bash
# gpu-run.sh - everything the GPU machine does in one call: check the carried build runs,
# run the GPU test suite, the benchmarks, precompile throughput and the PyTorch baseline.
# Writes logs and JSON under $OUT (or ./gpu-out) and prints a short table last.
#   usage: tools/bench/gpu-run.sh     (from the repository root, with build/ built)
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export RLK_TEST_BIN_DIR=$PWD/build/bin
export RLK_CACHE_DIR=/tmp/rlk-gpu-cache
rm -rf "$RLK_CACHE_DIR"

{
  echo "date: $(date -u +%FT%TZ)"
  echo "revision: ${REV:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  ldd --version | head -1
  ls /usr/local/cuda/lib64/libnvrtc.so* 2>/dev/null | head -3
} | tee "$OUT/env.txt"

# The GPU cases live in the test cases named "gpu" (CK_RUN_CASE selects them); the rest of the
# suite needs the host compiler, which the GPU machine may lack. GPU_TESTS=all runs everything.
echo "== GPU tests"
if [ "${GPU_TESTS:-gpu}" = all ]; then
  RLK_TEST_GPU=1 build/tests/check_rlk > "$OUT/tests.log" 2>&1
else
  CK_RUN_CASE=gpu RLK_TEST_GPU=1 build/tests/check_rlk > "$OUT/tests.log" 2>&1
fi
test_rc=$?
tail -25 "$OUT/tests.log"

echo "== demo: first run compiles (or loads from disk), second run loads from disk"
{ build/bin/rlk-demo; echo "demo 1 rc=$?"; build/bin/rlk-demo; echo "demo 2 rc=$?"; } > "$OUT/demo.log" 2>&1
grep -E 'device|counters|rc=' "$OUT/demo.log"

echo "== rlk-bench"
build/bin/rlk-bench --backend cuda --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"

echo "== precompile throughput (sm_90a, NVRTC, ${NPROC:-$(nproc)} cores)"
conf=/tmp/rlk-sweep.conf
echo "group_advantage mode=grpo,mean-only,rloo,batch-std group_size=2,4,8,16,32,64 scores=f32,f64" > "$conf"
: > "$OUT/precompile.txt"
for j in 1 2 8; do
  dir=/tmp/rlk-pre-$j
  rm -rf "$dir"
  s=$(date +%s.%N)
  build/bin/rlk-precompile --targets sm_90a --config "$conf" --out "$dir" -j "$j" -q > /tmp/precompile-j$j.log 2>&1
  rc=$?
  e=$(date +%s.%N)
  n=$(build/bin/rlk-cache --root "$dir" list --keys 2>/dev/null | grep -c .)
  python3 -c "import sys; j,rc,n,s,e=sys.argv[1:]; t=float(e)-float(s); print(f'precompile -j {j}: rc={rc} kernels={n} seconds={t:.2f} kernels/s={int(n)/t:.2f}')" \
    "$j" "$rc" "$n" "$s" "$e" | tee -a "$OUT/precompile.txt"
done

echo "== a precompiled read-only tree serves the demo with RLK_JIT=0 and zero compiles"
rm -rf /tmp/rlk-shipped /tmp/rlk-empty
build/bin/rlk-precompile --targets sm_90a --config tools/precompile.conf --out /tmp/rlk-shipped -j 8 -q >> "$OUT/demo.log" 2>&1
echo "precompile tools/precompile.conf rc=$?" | tee -a "$OUT/demo.log"
RLK_CACHE_RO_DIRS=/tmp/rlk-shipped RLK_CACHE_DIR=/tmp/rlk-empty RLK_JIT=0 build/bin/rlk-demo >> "$OUT/demo.log" 2>&1
echo "demo from the read-only tree with RLK_JIT=0 rc=$?" | tee -a "$OUT/demo.log"
tail -12 "$OUT/demo.log" | grep -E 'counters after call 2|rc='

echo "== PyTorch baseline"
python3 tools/bench/torch_group_advantage.py --json "$OUT/torch.json" 2>&1 | tee "$OUT/torch.log"

echo
echo "== summary"
grep -E 'Checks' "$OUT/tests.log" | tail -1
grep -E '^(benchmark|jit|op)' "$OUT/bench.log"
cat "$OUT/precompile.txt"
grep -E '^torch' "$OUT/torch.log"
exit $test_rc

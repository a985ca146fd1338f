#!/usr/bin/env bash
# gpu-syncfree.sh - the checks of the synchronization-free paths in one GPU call (repository root,
# build/ built): the normalizer kernels precompiled in parallel, the token losses' GPU cases for
# the normalizer forms (RLK_TEST_ONLY=normalizers), the CUDA pytest cases (sync debug mode,
# graph capture, normalizer forms), the per-call Python overhead, the ops through Python beside
# the C benchmarks of the same cases. Logs go to $OUT; a short table is printed last.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export RLK_TEST_BIN_DIR=$PWD/build/bin RLK_CACHE_DIR=/tmp/rlk-syncfree-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/python RLK_LIBRARY=$PWD/build/lib/librlk.so.0
t0=$SECONDS
build/bin/rlk-precompile --targets sm_90a --config tools/bench/precompile-token-loss-normalizers.conf \
  --out "$RLK_CACHE_DIR" -j "$(nproc)" -q > "$OUT/precompile.log" 2>&1
echo "precompile rc=$? at $((SECONDS - t0)) s"
RLK_TEST_SUITE=policy_loss CK_RUN_CASE=gpu RLK_TEST_GPU=1 RLK_TEST_ONLY=normalizers timeout 150 \
  build/tests/check_rlk > "$OUT/ctest.log" 2>&1
echo "C gpu normalizers rc=$? at $((SECONDS - t0)) s: $(grep -E 'Checks' "$OUT/ctest.log")"
grep -E ':[EF]:' "$OUT/ctest.log" | head -5
timeout 200 python3 -m pytest -q -rs python/tests/test_cuda_graph.py python/tests/test_losses.py \
  -k "graph or synchron or (cuda and (normalizer or count))" > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? at $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest.log")"
grep -E "FAILED|Error" "$OUT/pytest.log" | head -8
timeout 120 python3 tools/bench/python_overhead.py --calls 1000 --json "$OUT/python_overhead.json" > "$OUT/python_overhead.log" 2>&1
timeout 120 python3 tools/bench/python_device_time.py --json "$OUT/python_device_time.json" > "$OUT/python_device_time.log" 2>&1
timeout 90 build/bin/rlk-bench-policy-loss --json "$OUT/bench-policy-loss.json" > "$OUT/bench-policy-loss.log" 2>&1
timeout 90 build/bin/rlk-bench-advantage-scan --json "$OUT/bench-advantage-scan.json" > "$OUT/bench-advantage-scan.log" 2>&1
echo "benchmarks done at $((SECONDS - t0)) s"
echo "== python overhead (us per call)"
grep -E "policy_loss|value_loss|gae|group_advantage|fwd\+bwd" "$OUT/python_overhead.log"
echo "== through Python (ms per call, back to back)"
cat "$OUT/python_device_time.log"
echo "== C benchmarks, the same cases"
grep -E "bool mask.*B=1024 T=4096|^op|^case" "$OUT/bench-policy-loss.log" | head -5
grep -E "gae 256x4096 skip \(verl\)" "$OUT/bench-advantage-scan.log"

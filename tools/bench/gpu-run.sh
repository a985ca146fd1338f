#!/usr/bin/env bash
# gpu-run.sh - everything the GPU machine does in one call: the GPU test cases, the demo, every
# benchmark tool (build/bin/rlk-bench*) and every PyTorch baseline (tools/bench/torch_*.py), the
# Python package's GPU tests and per-call overhead, the side-by-side harness, precompile
# throughput.
# Logs and JSON go to a work folder that is packed into $OUT/results.tgz; a short table is
# printed last.
#   usage (repository root, build/ built):  REV=<git revision> tools/bench/gpu-run.sh
#   STEPS="tests demo record bench torch python tune precompile" limits what runs (default: all);
#   STEPS="redesign demo record" [BASE=<main's build/bin>] checks the declared kernel arguments
#   and the recording on the device, with the main ops' benchmarks before and after;
#   STEPS=sample runs only the sampler: its GPU cases, rlk-bench-sample, and the cluster split's
#   cases at every row_split.
set -u
OUT=${OUT:-gpu-out}
W=/tmp/rlk-gpu-run
rm -rf "$W" && mkdir -p "$W" "$OUT"
export RLK_TEST_BIN_DIR=$PWD/build/bin
export RLK_CACHE_DIR=/tmp/rlk-gpu-cache
export PYTHONUNBUFFERED=1
rm -rf "$RLK_CACHE_DIR"
STEPS=${STEPS:-"tests demo record bench torch python tune precompile"}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
# Wheels carried in .whl/ (Liger-Kernel, an anchor of the harness) go to a private site dir.
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
summary=$W/summary.txt
: > "$summary"

{
  echo "date: $(date -u +%FT%TZ)"
  echo "revision: ${REV:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  ldd --version | head -1
  ls /usr/local/cuda/lib64/libnvrtc.so.* 2>/dev/null | tail -1
  python3 -c 'import torch; print("torch", torch.__version__)' 2>/dev/null
} | tee "$W/env.txt" >> "$summary"

test_rc=0
if has tests; then
  # make test-gpu's flow without make (the GPU machine has none) and without the host compiler
  # (clang, which it lacks either): the configurations of tests/gpu-kernels.conf compiled with
  # every CPU into a read-only tree, then the suites' "gpu" cases side by side against it, then
  # the fused LM head's backward cases ("gpu_backward"). GPU_TESTS=all runs every case instead.
  # The kernels the cases asked for are recorded (tests-record.conf) to refresh the list.
  echo "== GPU tests"
  tc=/tmp/rlk-test-gpu-cache
  rm -rf "$tc"
  s=$(date +%s)
  build/bin/rlk-precompile --targets "${GPU_ARCH:-sm_90a}" --config tests/gpu-kernels.conf --out "$tc" \
    -j "$(nproc)" -q > "$W/tests-precompile.log" 2>&1
  echo "precompile tests/gpu-kernels.conf: rc=$? $(( $(date +%s) - s )) s" | tee -a "$summary"
  case_env="CK_RUN_CASE=gpu"
  [ "${GPU_TESTS:-gpu}" = all ] && case_env="-u CK_RUN_CASE"
  s=$(date +%s)
  env $case_env RLK_TEST_GPU=1 RLK_TEST_RO_CACHE=$tc RLK_JIT_RECORD=$W/tests-record.conf \
    timeout "${GPU_TESTS_SECONDS:-420}" tools/build/run_checks.sh build/tests/check_rlk "$(nproc)" \
    > "$W/tests.log" 2>&1
  test_rc=$?
  echo "GPU suites: rc=$test_rc $(( $(date +%s) - s )) s" | tee -a "$summary"
  s=$(date +%s)
  CK_RUN_SUITE=linear_logprob CK_RUN_CASE=gpu_backward RLK_TEST_GPU=1 RLK_TEST_RO_CACHE=$tc \
    RLK_JIT_RECORD=$W/tests-record.conf timeout 300 build/tests/check_rlk > "$W/tests-backward.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && test_rc=$rc
  echo "linear_logprob gpu_backward: rc=$rc $(( $(date +%s) - s )) s" | tee -a "$summary"
  grep -hE '^suite |check suites|FAILED|:[EF]:|^skip' "$W/tests.log" "$W/tests-backward.log" | head -60 | tee -a "$summary"
fi

if has sample; then
  echo "== sample: GPU cases"
  RLK_TEST_SUITE=sample CK_RUN_CASE=gpu RLK_TEST_GPU=1 timeout 500 build/tests/check_rlk > "$W/sample-tests.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && test_rc=$rc
  grep -E 'Checks|:[EF]:|^skip' "$W/sample-tests.log" | tail -20
  { echo "== sample tests (rc=$rc)"; grep -E 'Checks|:[EF]:' "$W/sample-tests.log"; } >> "$summary"
  echo "== rlk-bench-sample"
  timeout 300 build/bin/rlk-bench-sample --backend cuda --iters 20 --json "$W/rlk-bench-sample.json" \
    > "$W/rlk-bench-sample.log" 2>&1
  echo "rc=$?" >> "$W/rlk-bench-sample.log"
  { echo "== rlk-bench-sample"; grep -E 'plain|greedy|topk\+topp|rc=' "$W/rlk-bench-sample.log"; } | tee -a "$summary"
  for rs in 1 2 4 8; do
    for c in plain-split greedy-split; do
      timeout 120 build/bin/rlk-bench-sample --backend cuda --iters 20 --case $c --row-split $rs \
        --json "$W/rlk-bench-sample-$c-$rs.json" > "$W/rlk-bench-sample-$c-$rs.log" 2>&1
      echo "rc=$?" >> "$W/rlk-bench-sample-$c-$rs.log"
      { echo "== $c row_split $rs"; grep -E 'stream|rc=' "$W/rlk-bench-sample-$c-$rs.log"; } | tee -a "$summary"
    done
  done
fi

if has demo; then
  echo "== demo"
  { build/bin/rlk-demo; echo "demo 1 rc=$?"; build/bin/rlk-demo; echo "demo 2 rc=$?";
    build/bin/rlk-grpo-step --backend cuda --prompts 8 --group 8 --tokens 256 --vocab 32000; echo "grpo-step rc=$?"; } \
    > "$W/demo.log" 2>&1
  { echo "== demo"; grep -E 'counters after call|rc=|^sample|^logprob|^group|^policy|bitwise' "$W/demo.log"; } | tee -a "$summary"
fi

# RLK_JIT_RECORD on the device: a GRPO step records its configurations, rlk-precompile builds
# them for the device's target into a fresh tree, and the step reruns with RLK_JIT=0 from it.
if has record; then
  echo "== record"
  R=$W/record
  mkdir -p "$R"
  tgt=$(build/bin/rlk-grpo-step --backend cuda --prompts 2 --group 4 --tokens 16 --vocab 32000 2>&1 | sed -n 's/.*target \([^,]*\),.*/\1/p' | head -1)
  { RLK_CACHE_DIR=$R/c1 RLK_JIT_RECORD=$R/record.conf build/bin/rlk-grpo-step --backend cuda --prompts 2 --group 4 \
      --tokens 16 --vocab 32000; echo "record run rc=$?"; cat "$R/record.conf";
    build/bin/rlk-precompile --out "$R/tree" --targets "$tgt" --config "$R/record.conf" -q; echo "precompile rc=$?";
    RLK_CACHE_DIR=$R/c2 RLK_CACHE_RO_DIRS=$R/tree RLK_JIT=0 build/bin/rlk-grpo-step --backend cuda --prompts 2 \
      --group 4 --tokens 16 --vocab 32000; echo "RLK_JIT=0 run rc=$?"; } > "$W/record.log" 2>&1
  { echo "== record (target $tgt)"; grep -E 'rc=|^counters|^[a-z_]+ ' "$W/record.log"; } | tee -a "$summary"
fi

# The kernels whose argument became a declared struct (sample, group_advantage, advantage_scan):
# their GPU cases; then the three main ops' benchmarks, and with BASE=<another checkout's
# build/bin> the same benchmarks of that build in the same run, for a before/after table.
if has redesign; then
  for s in sample group_advantage advantage_scan; do
    echo "== $s: GPU cases"
    CK_RUN_SUITE=$s CK_RUN_CASE=gpu RLK_TEST_GPU=1 timeout 500 build/tests/check_rlk > "$W/redesign-$s.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && test_rc=$rc
    { echo "== $s GPU cases (rc=$rc)"; grep -E 'Checks|:[EF]:' "$W/redesign-$s.log"; } | tee -a "$summary"
  done
  for b in rlk-bench-logprob rlk-bench-policy-loss rlk-bench-sample; do
    for side in after ${BASE:+before}; do
      bin=build/bin/$b
      [ "$side" = before ] && bin=$BASE/$b
      [ -x "$bin" ] || continue
      timeout 300 "$bin" --backend cuda --json "$W/$b-$side.json" > "$W/$b-$side.log" 2>&1
      { echo "== $b ($side, rc=$?)"; tail -25 "$W/$b-$side.log"; } | tee -a "$summary"
    done
  done
fi

if has bench; then
  for b in build/bin/rlk-bench*; do
    n=$(basename "$b")
    echo "== $n"
    timeout 300 "$b" --backend cuda --json "$W/$n.json" > "$W/$n.log" 2>&1
    echo "rc=$?" >> "$W/$n.log"
    tail -30 "$W/$n.log"
    { echo "== $n"; tail -30 "$W/$n.log"; } >> "$summary"
  done
fi

if has torch; then
  for t in tools/bench/torch_*.py; do
    n=$(basename "$t" .py)
    echo "== $n"
    timeout 300 python3 "$t" --json "$W/$n.json" > "$W/$n.log" 2>&1
    echo "rc=$?" >> "$W/$n.log"
    tail -20 "$W/$n.log"
    { echo "== $n"; tail -20 "$W/$n.log"; } >> "$summary"
  done
fi

if has python && [ -d python/tests ]; then
  echo "== python package on the GPU"
  export RLK_LIBRARY=$PWD/build/lib/librlk.so.0 PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
  timeout 300 python3 -m pytest -q -rs python/tests > "$W/pytest.log" 2>&1
  echo "rc=$?" >> "$W/pytest.log"
  tail -15 "$W/pytest.log"
  { echo "== pytest"; tail -15 "$W/pytest.log"; } >> "$summary"
  if [ -f tools/bench/harness.py ]; then
    echo "== harness"
    timeout 400 python3 tools/bench/harness.py --out-dir "$W/harness" > "$W/harness.log" 2>&1
    echo "rc=$?" >> "$W/harness.log"
    tail -40 "$W/harness.log"
    { echo "== harness"; tail -40 "$W/harness.log"; } >> "$summary"
  fi
  if [ -f tools/bench/python_device_time.py ]; then
    echo "== ops through Python (device time, back to back) and a captured GRPO loss step"
    timeout 300 python3 tools/bench/python_device_time.py --json "$W/python_device_time.json" > "$W/python_device_time.log" 2>&1
    echo "rc=$?" >> "$W/python_device_time.log"
    { echo "== python_device_time"; cat "$W/python_device_time.log"; } | tee -a "$summary"
  fi
  if [ -f tools/bench/python_overhead.py ]; then
    echo "== python overhead per call (torch CUDA tensors)"
    timeout 300 python3 tools/bench/python_overhead.py --json "$W/python_overhead.json" > "$W/python_overhead.log" 2>&1
    echo "rc=$?" >> "$W/python_overhead.log"
    { echo "== python_overhead"; cat "$W/python_overhead.log"; } | tee -a "$summary"
  fi
  if [ -f examples/grpo_step.py ]; then
    timeout 120 python3 examples/grpo_step.py > "$W/grpo_step.log" 2>&1
    echo "rc=$?" >> "$W/grpo_step.log"
    { echo "== examples/grpo_step.py"; tail -15 "$W/grpo_step.log"; } | tee -a "$summary"
  fi
fi

if has tune && [ -x tools/bench/tune-sweep.sh ]; then
  echo "== tune sweep (logprob)"
  OUT=$W/tune timeout 600 tools/bench/tune-sweep.sh > "$W/tune-sweep.log" 2>&1
  echo "rc=$?" >> "$W/tune-sweep.log"
  tail -25 "$W/tune-sweep.log"
  { echo "== tune sweep"; tail -25 "$W/tune-sweep.log"; } >> "$summary"
fi

if has precompile; then
  echo "== precompile throughput (sm_90a, NVRTC, $(nproc) cores)"
  conf=/tmp/rlk-sweep.conf
  echo "group_advantage mode=grpo,mean-only,rloo,batch-std group_size=2,4,8,16,32,64 scores=f32,f64" > "$conf"
  for j in 1 2 8; do
    dir=/tmp/rlk-pre-$j
    rm -rf "$dir"
    s=$(date +%s.%N)
    build/bin/rlk-precompile --targets sm_90a --config "$conf" --out "$dir" -j "$j" -q > "$W/precompile-j$j.log" 2>&1
    rc=$?
    e=$(date +%s.%N)
    n=$(build/bin/rlk-cache --root "$dir" list --keys 2>/dev/null | grep -c .)
    python3 -c "import sys; j,rc,n,s,e=sys.argv[1:]; t=float(e)-float(s); print(f'precompile -j {j}: rc={rc} kernels={n} seconds={t:.2f} kernels/s={int(n)/t:.2f}')" \
      "$j" "$rc" "$n" "$s" "$e" | tee -a "$summary"
  done
  rm -rf /tmp/rlk-shipped /tmp/rlk-empty
  build/bin/rlk-precompile --targets sm_90a --config tools/precompile.conf --out /tmp/rlk-shipped -j 8 -q > "$W/shipped.log" 2>&1
  echo "precompile tools/precompile.conf rc=$?" | tee -a "$summary"
  RLK_CACHE_RO_DIRS=/tmp/rlk-shipped RLK_CACHE_DIR=/tmp/rlk-empty RLK_JIT=0 build/bin/rlk-demo >> "$W/shipped.log" 2>&1
  echo "demo from the read-only tree with RLK_JIT=0 rc=$?" | tee -a "$summary"
  grep 'counters after call 2' "$W/shipped.log" | tee -a "$summary"
fi

tar czf "$OUT/results.tgz" -C "$W" .
cp "$summary" "$OUT/summary.txt"
echo
echo "== summary"
cat "$summary"
exit $test_rc

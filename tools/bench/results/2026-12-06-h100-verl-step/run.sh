#!/usr/bin/env bash
# verl's step beside its torch and Liger (CuTe DSL on sm_90) backends
# wheels carried: .whl-verl/ (verl and what it imports), the CUTLASS DSL 4.8.1 (.cdsl3/, its cu13
# library split in two parts, .cdsl1/ and .cdsl2/, too large for one transfer), transformers 5.10.4
set -u
OUT=${OUT:-s24b-out}; mkdir -p "$OUT"
s0=$(date +%s)
ls -la .cdsl1 .cdsl2 .cdsl3 .whl-verl 2>&1 | head -20
cat .cdsl1/cu13.part-* .cdsl2/cu13.part-* > /tmp/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl 2>/dev/null
echo "$(cat .cdsl3/cu13.sha256)  /tmp/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl" | sha256sum -c - || echo "cutlass dsl wheel incomplete: no Liger"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/vsite \
  .whl-verl/*.whl .cdsl3/*.whl /tmp/nvidia_cutlass_dsl_libs_cu13-*.whl > "$OUT/wheels.log" 2>&1; echo "wheels rc=$?"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python:/tmp/vsite:/tmp/vsite/nvidia_cutlass_dsl/dsl_packages RLK_LIBRARY=$PWD/build/lib/librlk.so.0
run() { # name cap args...
  local name=$1 cap=$2; shift 2
  local left=$(( 570 - ($(date +%s) - s0) )); [ $left -lt $cap ] && cap=$left
  [ $cap -lt 20 ] && { echo "== $name: not run"; return; }
  timeout $cap python3 tools/bench/trainer_step.py "$@" --reps 3 --out-dir "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? $(( $(date +%s) - s0 )) s"
  grep '^{' "$OUT/$name.log" | python3 -c '
import json,sys
for l in sys.stdin:
    r=json.loads(l); ph=r.get("phase_ms",{})
    upd=sum(v for k,v in ph.items() if k in ("loss","backward","optimizer"))
    print("%-22s %s G%d p%d r%d" % (r["variant"], r["arch"], r["G"], r["prompt"], r["response"]),
          "step %.3f s update %.1f ms peak %.2f GiB loss %.7f" % (r["step_s"], upd, r["peak_gib"], r["loss"]) if "step_s" in r else r.get("error","")[:400],
          r.get("prefix_calls",""), r.get("ray",""))'
}
run small 200 --archs qwen2.5-0.5b --groups 8 --prompts 512 --responses 1024 --variants verl-liger,verl-torch,verl-rlk
run prefix 200 --archs qwen2.5-0.5b --groups 16 --prompts 2048 --responses 512 --variants verl-liger,verl-torch,verl-rlk,verl-rlk-rmpad,verl-rlk-rmpad+prefix
run large 170 --archs qwen2.5-1.5b --groups 8 --prompts 512 --responses 1024 --variants verl-liger,verl-torch,verl-rlk
echo "total $(( $(date +%s) - s0 )) s"

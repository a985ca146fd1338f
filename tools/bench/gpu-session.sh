#!/usr/bin/env bash
# gpu-session.sh - one device call: the GPU test suite (gpu-tests.sh), then the benchmarks that
# need a GPU (the fused head beside cuBLAS, its memory beside TRL's head, the distillation
# divergence, the cluster loop on a GPU tree, the heads' accuracy against fp64, a trainer's GRPO step), each bounded so that the whole call ends inside DEADLINE_S seconds. Wheels carried in
# .whl/ (a trainer the image lacks) go to a private site directory first; verl's (.whl-verl/) to
# another, for the verl step alone (Liger on sm_90 needs the CUTLASS DSL among them; its .pth is not read
# from a --target directory, so its packages go on the path here).
#   device: REV=<revision> tools/bench/gpu-session.sh     (carry build/bin build/lib build/tests .whl)
#   STEPS="tests head memory sample divergence overhead cluster kept accuracy step verl" limits what runs (default: tests divergence
#   accuracy step); DEADLINE_S (570); the step's sweep: ARCHS, GROUPS_, PROMPTS, RESPONSES, STEP_S.
# $OUT: summary.txt (the tests' summary, then one line per benchmark), tests.tgz, bench.tgz.
set -u
OUT=${OUT:-gpu-out}
B=/tmp/rlk-gpu-bench
rm -rf "$B" && mkdir -p "$B" "$OUT"
start=$(date +%s)
deadline=$(( start + ${DEADLINE_S:-570} ))
STEPS=${STEPS:-"tests divergence accuracy step"}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python RLK_LIBRARY=$PWD/build/lib/librlk.so.0
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl > "$B/wheels.log" 2>&1 && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi

rc=0
if has tests; then
  C_SECONDS=${C_SECONDS:-200} PY_SECONDS=${PY_SECONDS:-110} tools/bench/gpu-tests.sh
  rc=$?
fi
line() { echo "$*" | tee -a "$OUT/summary.txt"; }
# bench NAME CAP_S COMMAND...: runs COMMAND for at most CAP_S seconds and whatever is left
bench() {
  local name=$1 cap=$2 left s r
  shift 2
  left=$(( deadline - $(date +%s) ))
  [ "$left" -lt "$cap" ] && cap=$left
  [ "$cap" -lt 15 ] && { line "bench $name: not run ($left s left)"; return; }
  s=$(date +%s)
  timeout "$cap" "$@" > "$B/$name.log" 2>&1
  r=$?
  line "bench $name: rc=$r $(( $(date +%s) - s )) s (limit $cap s)"
}
has head && bench head 100 python3 tools/bench/torch_linear_logprob.py 8192 4096 151936 --rounds 5
has memory && bench memory 45 python3 tools/bench/head_memory.py --json "$B/head_memory.json"
has sample && bench sample 60 python3 tools/bench/linear_sample_bench.py --rounds 20 --json "$B/linear_sample.json"
has divergence && bench divergence 110 python3 tools/bench/linear_divergence_bench.py --modes fkl,jsd,topk \
  --rounds 5 --json "$B/linear_divergence.json"
has overhead && bench overhead 40 python3 tools/bench/python_overhead.py --device cuda --floors --calls 300 \
  --json "$B/python_overhead_cuda.json"
has cluster && bench cluster 120 python3 tools/cluster/kernel_tree.py --work "$B/kernel-tree" --targets sm_90a \
  --launch sm_90a --procs 64 -j "$(nproc)" --json "$B/kernel_tree.json"
has kept && bench kept 90 python3 tools/bench/kept_set_bench.py --rounds 10 --json "$B/kept_set.json"
has accuracy && bench accuracy 60 python3 tools/bench/head_accuracy.py --json "$B/head_accuracy.json"
has step && bench step "${STEP_S:-150}" python3 tools/bench/trainer_step.py --archs "${ARCHS:-qwen2.5-0.5b}" \
  --groups "${GROUPS_:-8}" --prompts "${PROMPTS:-512}" --responses "${RESPONSES:-512}" \
  --variants trl,trl+rlk,trl+rlk+prefix --reps 2 --out-dir "$B/step"
# verl's step beside its own backends: verl 0.9.1 wants transformers < 5.11, so its wheels (carried
# in .whl-verl/) go to a site directory of their own, ahead of the image's packages
if has verl && ls .whl-verl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/vsite \
    .whl-verl/*.whl > "$B/verl-wheels.log" 2>&1
  PYTHONPATH=$PWD/python:/tmp/vsite:/tmp/vsite/nvidia_cutlass_dsl/dsl_packages bench verl "${VERL_S:-200}" python3 tools/bench/trainer_step.py \
    --archs "${ARCHS:-qwen2.5-0.5b}" --groups "${GROUPS_:-8}" --prompts "${PROMPTS:-512}" \
    --responses "${RESPONSES:-1024}" --variants "${VERL_VARIANTS:-verl-torch,verl-liger,verl-rlk,verl-rlk-rmpad}" \
    --reps 2 --out-dir "$B/verl"
fi
tar czf "$OUT/bench.tgz" -C "$B" . 2>/dev/null
for f in "$B"/*.log; do [ -e "$f" ] && { echo "== $(basename "$f")"; tail -25 "$f"; }; done
line "session total $(( $(date +%s) - start )) s, tests rc=$rc"
exit $rc

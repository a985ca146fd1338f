#!/usr/bin/env bash
# tune-sweep.sh - the logprob shape sweep on a GPU, in one call: build/bin/rlk-tune over three
# vocabularies (151936, 128256, 50257) x two token counts (4096, 16384), bf16 logits and i64
# labels, the forward with and without the entropy and the backward, on the CUDA backend, with
# every candidate the op declares (the tensor-map ones included). Builds nothing (build/ is
# carried). About 1-2 minutes on an H200.
#
#   usage (repository root, build/ built):  tools/bench/tune-sweep.sh
#
# Writes to $OUT (default ./tune-out): tune.db (the tuning database), tune.json (every
# candidate's times), tune.log (the whole run), bench.log (rlk-bench-logprob with the database,
# i.e. through the op calls' own lookup) and table.txt, printed last.
# Knobs: VOCABS, TOKENS (space-separated), ITERS (timed calls per candidate, 100), WARMUP (10),
# TIMEOUT (s without progress before a candidate fails, 20), EXTRA (more rlk-tune options, e.g.
# "--exclude variant=tma"), LIMIT (s for the whole sweep, 420), BACKEND (cuda; host runs the
# same steps on the CPU, to try the script without a GPU).
set -u
OUT=${OUT:-tune-out}
VOCABS=${VOCABS:-"151936 128256 50257"}
TOKENS=${TOKENS:-"4096 16384"}
ITERS=${ITERS:-100}
WARMUP=${WARMUP:-10}
TIMEOUT=${TIMEOUT:-20}
LIMIT=${LIMIT:-420}
BACKEND=${BACKEND:-cuda}
EXTRA=${EXTRA:-}
BIN=build/bin
mkdir -p "$OUT"
if [ ! -x "$BIN/rlk-tune" ]; then
  echo "tune-sweep.sh: $BIN/rlk-tune is missing: build first (make tools)" >&2
  exit 2
fi
export RLK_CACHE_DIR=${RLK_CACHE_DIR:-/tmp/rlk-tune-cache}
DB=$OUT/tune.db
rm -f "$DB" "$DB.pending" "$OUT/tune.json" "$OUT/table.txt"
list() { echo "$*" | tr -s ' ' ','; }
V=$(list $VOCABS)
N=$(list $TOKENS)

{
  echo "date: $(date -u +%FT%TZ)"
  echo "revision: ${REV:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  echo "vocabularies: $V; tokens: $N; iters $ITERS, warm-up $WARMUP"
} | tee "$OUT/tune.log"

# fwd with and without the entropy, and the backward (dlogits in bf16 from g_lp)
timeout "$LIMIT" "$BIN/rlk-tune" --backend "$BACKEND" --db "$DB" --json "$OUT/tune.json" \
  --sweep "logprob pass=fwd logits=bf16 labels=i64 entropy=0,1 vocab=$V tokens=$N" \
  --sweep "logprob pass=bwd logits=bf16 labels=i64 entropy=0 grad=same vocab=$V tokens=$N" \
  --iters "$ITERS" --warmup "$WARMUP" --timeout "$TIMEOUT" -j "$(nproc)" $EXTRA 2>&1 | tee -a "$OUT/tune.log"
rc=${PIPESTATUS[0]}
echo "rlk-tune rc=$rc" >> "$OUT/tune.log"

# the records as the ops see them, then the op calls themselves with the database in use
"$BIN/rlk-tune" --list --db "$DB" >> "$OUT/tune.log" 2>&1
RLK_TUNE_DB=$DB timeout 200 "$BIN/rlk-bench-logprob" --backend "$BACKEND" > "$OUT/bench.log" 2>&1
echo "rlk-bench-logprob with the database rc=$?" >> "$OUT/bench.log"

# the table rlk-tune printed at its end (from its header line on)
awk '/^config  /{p=1} p{print} p && /failed; records in/{exit}' "$OUT/tune.log" > "$OUT/table.txt"
echo
echo "== rlk-bench-logprob with the database"
grep -E 'ms \(min|WRONG|warning' "$OUT/bench.log"
tail -1 "$OUT/bench.log"
echo
echo "== candidates rejected or failed"
grep -E '^    .* (rejected|failed): |FAILED' "$OUT/tune.log" | head -20
echo "== rlk-tune (rc=$rc): $(grep -c '' "$DB" 2>/dev/null || echo 0) lines in $DB"
cat "$OUT/table.txt"
exit $rc

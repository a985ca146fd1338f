#!/usr/bin/env bash
# the fused head's rows: the backward at growing N and a row selection, before (72d9a95) and after
set -u
OUT=${OUT:-rows-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python:$PWD/tools/bench RLK_CACHE_DIR=/tmp/rlk-rows-cache
for side in before after; do
  lib=$PWD/build/lib/librlk.so.0; [ $side = before ] && lib=$PWD/build/ab/lib-before/librlk.so.0
  RLK_LIBRARY=$lib timeout 150 python3 tools/bench/head_rows_bench.py --rounds 5 --json "$OUT/head-rows-$side.json" > "$OUT/head-rows-$side.log" 2>&1
  echo "== head rows $side rc=$?"; grep -E "^(backward|selection)" "$OUT/head-rows-$side.log"; tail -2 "$OUT/head-rows-$side.log" | grep -v "^selection"
done

#!/usr/bin/env bash
# the fused head's backward at each revision between d7230a4 and 82f1f58, two rounds (the second reversed)
set -u
OUT=${OUT:-ab-out}; mkdir -p "$OUT"
s0=$(date +%s)
export RLK_CACHE_DIR=/tmp/rlk-bisect-cache
revs="d7230a4 e854cc3 d5884a1 932fbfc 5b63c62 0de5e42 82f1f58"
rev_r=$(echo $revs | tr ' ' '\n' | tac | tr '\n' ' ')
# warm-up (compiles) once each
for r in $revs; do timeout 60 build/ab/bisect/$r/rlk-bench-linear-logprob --shape 1024,4096,151936 --iters 1 --backward > /dev/null 2>&1; done
echo "warm $(( $(date +%s) - s0 )) s"
for round in 1 2 3; do
  list=$revs; [ $round = 2 ] && list=$rev_r
  for r in $list; do
    timeout 90 build/ab/bisect/$r/rlk-bench-linear-logprob --shape 8192,4096,151936 --iters 7 --backward > "$OUT/$r-$round.log" 2>&1
    f=$(grep -o 'fwd+entropy.*median [0-9.]*' "$OUT/$r-$round.log" | grep -o '[0-9.]*$'); b=$(grep -o 'backward.*median [0-9.]*' "$OUT/$r-$round.log" | grep -o '[0-9.]*$')
    echo "$round $r fwd $f bwd $b"
  done
done | tee "$OUT/bisect.txt"
echo "total $(( $(date +%s) - s0 )) s"

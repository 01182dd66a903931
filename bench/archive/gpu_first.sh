#!/usr/bin/env bash
# Why is a fresh process's first load slower? (issue 3) Each mode of
# bench_first in its own process, alternated, ROUNDS rounds, hot file.
#   bench/archive/gpu_first.sh BUILD FILE [ROUNDS]
set -uo pipefail
B=$1 F=$2 R=${3:-3}
cat "$F" > /dev/null
for r in $(seq "$R"); do
  for m in fresh memset warmcopy ringwarm twice twice_new; do
    echo "# round $r mode $m"
    "$B"/bench_first "$F" $m
  done
  echo "# round $r: ferry load (whole process)"
  "$B"/ferry --stats load --path ring "$F" 2>&1 | head -3
done
echo "# register"
"$B"/bench_first "$F" reg

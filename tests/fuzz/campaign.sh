#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# campaign.sh - a long fuzzing campaign whose corpora accumulate: each target
# runs until RUNS executions (or SECONDS), growing a corpus kept in WORKDIR,
# whose new coverage is then merged (libFuzzer -merge=1: the fewest inputs
# that add to it) into the committed seeds, tests/fuzz/corpus/TARGET, so CI's
# short runs start where the campaign ended.
#
#     tests/fuzz/campaign.sh BUILD_DIR RUNS SECONDS WORKDIR [TARGET...]
#
# BUILD_DIR as for run_fuzz.sh (clang, -DFERRY_FUZZ=ON -DFERRY_SANITIZE=ON).
# Targets run one after another (start two campaigns with different targets to
# use two cores). Per target WORKDIR/TARGET.log is libFuzzer's log and the last
# line printed here is "TARGET: N runs in S s, cov C ft F, grown corpus K
# files; committed corpus A -> B files, findings 0". A finding (crash-, leak-, timeout-, oom- files in
# WORKDIR) leaves the committed corpus alone and makes the exit status 1.
set -u
if [ $# -lt 4 ]; then
    echo "usage: $0 BUILD_DIR RUNS SECONDS WORKDIR [TARGET...]" >&2
    exit 2
fi
build=$1 runs=$2 secs=$3 work=$4
shift 4
targets=${*:-safetensors index gguf zip pickle memstat}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work" || exit 2
status=0
for t in $targets; do
    bin=$build/tests/fuzz/fuzz_$t
    [ -x "$bin" ] || { echo "campaign: $bin not found" >&2; exit 2; }
    dict=$here/$t.dict
    [ -f "$dict" ] || dict=$here/safetensors.dict
    corpus=$work/$t
    mkdir -p "$corpus"
    t0=$(date +%s)
    "$bin" -dict="$dict" -runs="$runs" -max_total_time="$secs" -print_final_stats=1 \
        -artifact_prefix="$work/$t-" "$corpus" "$here/corpus/$t" "$here/crashes" >"$work/$t.log" 2>&1
    rc=$?
    cat "$work/$t.log" >>"$work/$t.all.log" # every pass's log (the next pass overwrites $t.log)
    t1=$(date +%s)
    done_line=$(grep -E '^#[0-9]+' "$work/$t.log" | tail -1)
    n=$(grep -E '^stat::number_of_executed_units:' "$work/$t.log" | awk '{print $2}')
    cov=$(echo "$done_line" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$done_line" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
    found=$(find "$work" -maxdepth 1 -type f \( -name "$t-crash-*" -o -name "$t-leak-*" -o -name "$t-timeout-*" \
        -o -name "$t-oom-*" \) | wc -l)
    if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
        echo "$t: libFuzzer exit $rc, findings $found (see $work/$t.log)"
        status=1
        continue
    fi
    # -merge=1 into the committed corpus keeps its files (the named seeds the
    # make_*corpus.py scripts write) and adds the fewest of the campaign's
    # inputs that reach what they do not
    before=$(find "$here/corpus/$t" -type f | wc -l)
    "$bin" -merge=1 "$here/corpus/$t" "$corpus" >"$work/$t-merge.log" 2>&1 || {
        echo "$t: merge failed (see $work/$t-merge.log)"
        status=1
        continue
    }
    after=$(find "$here/corpus/$t" -type f | wc -l)
    echo "$t: ${n:-?} runs in $((t1 - t0)) s, cov ${cov:-?} ft ${ft:-?}, grown corpus $(find "$corpus" -type f | wc -l) files; committed corpus $before -> $after files, findings 0"
done
exit $status

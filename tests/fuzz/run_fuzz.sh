#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run_fuzz.sh - run ferry's libFuzzer targets for a while, one after the other.
#
#     tests/fuzz/run_fuzz.sh BUILD_DIR SECONDS [TARGET...]
#
# BUILD_DIR is a build configured with
#     CC=clang cmake -S . -B BUILD_DIR -G Ninja -DFERRY_FUZZ=ON -DFERRY_SANITIZE=ON
# and built (ninja -C BUILD_DIR fuzz_safetensors fuzz_index fuzz_gguf fuzz_zip
# fuzz_pickle fuzz_memstat fuzz_keep). TARGETs default to "safetensors index gguf
# zip pickle memstat keep". Each
# fuzzer starts fresh from a copy of its seed corpus (tests/fuzz/corpus/TARGET,
# in a temporary folder) plus
# tests/fuzz/crashes, with tests/fuzz/TARGET.dict (safetensors.dict when there is
# none), and runs for SECONDS. Exits 1 if any fuzzer found
# a crash, leak, timeout or out-of-memory; the reproducer is left in
# tests/fuzz/{crash,leak,timeout,oom}-* (replay it with
# BUILD_DIR/tests/fuzz/fuzz_TARGET FILE). Exits 2 on a usage or setup error.
#
# Environment: FERRY_FUZZ_SKIP (see fuzz_safetensors.c) is passed on;
# FERRY_FUZZ_KEEP=1 keeps the grown corpora and logs (kept anyway on failure);
# FERRY_FUZZ_ARGS adds libFuzzer flags (e.g. "-use_value_profile=1").
set -u

if [ $# -lt 2 ]; then
    echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2
    exit 2
fi
build=$1
secs=$2
shift 2
targets=${*:-safetensors index gguf zip pickle memstat keep}
case $secs in '' | *[!0-9]*) echo "$0: SECONDS must be a whole number" >&2; exit 2 ;; esac

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-fuzz.XXXXXX") || exit 2
# The temporary folder (corpora, logs) goes at the end unless something failed.
trap 'echo "run_fuzz: interrupted; logs and corpora are in $work" >&2; exit 130' INT TERM

# libFuzzer's reproducers in tests/fuzz/, one path a line.
artifacts() {
    find "$here" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
        -o -name 'oom-*' \) | sort
}

status=0
for t in $targets; do
    bin=$build/tests/fuzz/fuzz_$t
    if [ ! -x "$bin" ]; then
        echo "run_fuzz: $bin not found: configure with CC=clang -DFERRY_FUZZ=ON -DFERRY_SANITIZE=ON and build it" >&2
        exit 2
    fi
    if [ ! -d "$here/corpus/$t" ]; then
        echo "run_fuzz: no seed corpus $here/corpus/$t" >&2
        exit 2
    fi
    corpus=$work/$t
    mkdir -p "$corpus"
    cp "$here/corpus/$t/"* "$corpus/"
    nseed=$(find "$corpus" -type f | wc -l)
    artifacts >"$work/before"
    log=$work/$t.log
    dict=$here/$t.dict
    [ -f "$dict" ] || dict=$here/safetensors.dict
    echo "run_fuzz: fuzz_$t for ${secs}s from $nseed seeds + $here/crashes (log: $log)"
    # The first corpus folder gets the new inputs; crashes/ is only read.
    # shellcheck disable=SC2086
    "$bin" "$corpus" "$here/crashes" \
        -dict="$dict" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
        -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$here/" \
        ${FERRY_FUZZ_ARGS:-} >"$log" 2>&1
    rc=$?
    artifacts | comm -13 "$work/before" - >"$work/new"
    # The last status line and the final statistics.
    grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -n 1 | sed 's/^/run_fuzz:   /'
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$log" |
        sed 's/^/run_fuzz:   /'
    echo "run_fuzz:   corpus: $nseed seeds -> $(find "$corpus" -type f | wc -l) inputs"
    if [ $rc -ne 0 ] || [ -s "$work/new" ]; then
        status=1
        echo "run_fuzz: fuzz_$t FAILED (exit $rc); the report:"
        grep -nE 'ERROR: |invariant violated|message: |SUMMARY: |Test unit written to|==[0-9]+== ' "$log" |
            head -n 20 | sed 's/^/run_fuzz:   /'
        grep -E '^ +#[0-9]+ ' "$log" | head -n 15 | sed 's/^/run_fuzz:   /'
        echo "run_fuzz:   full log: $log"
        sed 's/^/run_fuzz:   reproducer: /' "$work/new"
    else
        echo "run_fuzz: fuzz_$t OK"
    fi
done
if [ $status -eq 0 ] && [ "${FERRY_FUZZ_KEEP:-0}" != 1 ]; then
    rm -rf "$work"
else
    echo "run_fuzz: logs and grown corpora kept in $work"
fi
exit $status

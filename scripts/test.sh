#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ferry's whole test suite on a fresh Debian machine (this is what CI runs):
#   1. plain build (gcc, warnings as errors) + ctest
#   2. the same suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   3. the threaded unit-test cases under ThreadSanitizer
#   4. the libFuzzer targets (clang), each run fresh for FERRY_FUZZ_SECONDS (60)
# Ends with one line "N passed, N failed" over all stages; exit 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh || { echo "0 passed, 1 failed"; exit 1; }

jobs=$(nproc 2>/dev/null || echo 2)
fuzz_secs=${FERRY_FUZZ_SECONDS:-60}
# the tests' Python: deps.sh's venv (PyPI's reference packages, Debian's torch)
python=$PWD/.deps/venv/bin/python3
passed=0
failed=0
skipped=0
failures=()
ctest_wrap=() # a command run_ctest runs ctest under (setarch -R for TSan where needed)

# run_ctest NAME BUILD_DIR [CTEST-ARGS...]: add ctest's counts to the totals
run_ctest() {
    local name=$1 dir=$2 log
    shift 2
    log=$(mktemp)
    (cd "$dir" && "${ctest_wrap[@]}" ctest --output-on-failure -j "$jobs" --timeout 600 "$@") 2>&1 | tee "$log"
    local line total nfail nskip
    line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1)
    nskip=$(grep -cE 'Not Run|\*\*\*Skipped' "$log" || true)
    if [ -z "$line" ]; then
        failed=$((failed + 1)); failures+=("$name: ctest did not run")
    else
        nfail=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
        total=$(sed -E 's/.* failed out of ([0-9]+).*/\1/' <<<"$line")
        passed=$((passed + total - nfail - nskip)); failed=$((failed + nfail)); skipped=$((skipped + nskip))
        [ "$nfail" -eq 0 ] || failures+=("$name: $nfail ctest tests failed")
    fi
    rm -f "$log"
}

# build NAME DIR CMAKE-ARGS...: configure and build (only the targets in
# $targets when set), counting a failure as one
build() {
    local name=$1 dir=$2
    shift 2
    echo "== [$name] configure + build"
    if cmake -S . -B "$dir" -G Ninja -DPython3_EXECUTABLE="$python" "$@" >/dev/null && cmake --build "$dir" -j "$jobs" ${targets:+--target $targets}; then
        return 0
    fi
    failed=$((failed + 1)); failures+=("$name: build failed")
    return 1
}

if build plain build -DCMAKE_BUILD_TYPE=RelWithDebInfo; then
    echo "== [plain] tests"
    run_ctest plain build
fi

if build sanitize build-asan -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=ON; then
    echo "== [sanitize] tests under ASan+UBSan"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        run_ctest sanitize build-asan
fi

# ThreadSanitizer: the tests labelled threads (the cases whose code runs on
# several threads, marked where each test is declared: tests/labels.cmake),
# not the whole suite: TSan is slow, and the single-threaded cases have nothing
# to show it. The targets built are the ones those tests run: the CLI, and each
# unit-test binary (the part of a case's name before its dot) among the tests
# that ctest lists under the label once the tree is configured.
tsan_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_TSAN=ON)
threads_bins=
if cmake -S . -B build-tsan -G Ninja -DPython3_EXECUTABLE="$python" "${tsan_args[@]}" >/dev/null; then
    threads_bins=$(cd build-tsan && ctest -N -L threads | sed -n 's/^ *Test *#[0-9]*: \(test_[a-z0-9_]*\)\..*/\1/p' |
        sort -u | tr '\n' ' ')
fi
if targets="ferry $threads_bins" build tsan build-tsan "${tsan_args[@]}"; then
    echo "== [tsan] threaded cases under ThreadSanitizer"
    # gcc 12's TSan refuses the address layout some kernels randomise into
    # ("unexpected memory mapping"): run without ASLR there.
    if ! build-tsan/tests/unit/test_gpu --list >/dev/null 2>&1 && setarch "$(uname -m)" -R true 2>/dev/null; then
        ctest_wrap=(setarch "$(uname -m)" -R)
    fi
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 run_ctest tsan build-tsan -L threads
    ctest_wrap=()
fi

if CC=clang build fuzz build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_FUZZ=ON -DFERRY_SANITIZE=ON; then
    echo "== [fuzz] each fuzzer fresh for ${fuzz_secs}s"
    if tests/fuzz/run_fuzz.sh build-fuzz "$fuzz_secs"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1)); failures+=("fuzz: a fuzzer found a problem (reproducer in tests/fuzz/)")
    fi
fi

echo
for f in "${failures[@]}"; do echo "FAILED: $f"; done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]

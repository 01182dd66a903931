#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# soak.sh - the long soak of the residency store under faults (tests/unit/test_soak.c):
# seeded runs of many jobs over several models on the sim device, faults injected
# at every fault point in turn, every byte checked after every job.
#
#     scripts/soak.sh [JOBS] [SEED...]        (default 20000 jobs, seeds 1 2 3)
#
# Uses build/ (scripts/test.sh makes it; FERRY_BUILD=DIR picks another, e.g. an
# ASan build). Prints one "soak: seed S: ..." line per seed; exits 1 if any failed.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD:-$here/build}
jobs=${1:-20000}
shift || true
seeds=${*:-1 2 3}
case $jobs in '' | *[!0-9]*) echo "soak.sh: JOBS must be a whole number" >&2; exit 2 ;; esac
if ! cmake --build "$build" --target test_soak >/dev/null; then
    echo "soak.sh: could not build test_soak in $build (run scripts/test.sh first, or set FERRY_BUILD)" >&2
    exit 2
fi
status=0
for s in $seeds; do
    out=$(FERRY_SOAK_JOBS=$jobs FERRY_SOAK_SEED=$s "$build/tests/unit/test_soak" long 2>&1)
    rc=$?
    grep '^soak: seed' <<<"$out"
    if [ $rc -ne 0 ]; then
        echo "$out" | tail -20
        status=1
    fi
done
exit $status

#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# What ferry load and ferry bench print for a new user:
# without a GPU, load names the devices that do work here (sim:SIZE, cpu); a
# one-tensor file is "1 tensor"; a file too small to time gets a time, not a
# GB/s figure; bench --device cpu shows no host->device link and no route cpu
# cannot take; hash and convert count "1 tensor" too. ferry load --route
# register --repeat registers once and says so.
#   test_load_bench_messages.sh FERRY SOURCE
set -u
ferry=$1 src=$2
one=$src/tests/fuzz/corpus/safetensors/dtype_bf16.safetensors # 1 tensor, a few bytes
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
has() { grep -qF -- "$2" <<<"$1" || fail "$3: no '$2' in: $1"; }
hasnt() { ! grep -qF -- "$2" <<<"$1" || fail "$3: '$2' in: $1"; }

out=$("$ferry" load "$one" 2>&1)
rc=$?
if [ $rc -eq 0 ]; then
    echo "(a GPU is here: the no-GPU message is not checked)"
else
    [ $rc -eq 1 ] || fail "load with no GPU exited $rc, not 1"
    has "$out" "--device sim:SIZE" "load with no GPU"
    has "$out" "--device cpu" "load with no GPU"
    [ "$(wc -l <<<"$out")" -eq 1 ] || fail "load with no GPU: more than one line: $out"
fi

out=$("$ferry" load --device cpu "$one" 2>&1) || fail "load --device cpu failed: $out"
has "$out" ": 1 tensor," "load of a one-tensor file"
has "$out" "too small for a GB/s figure" "load of a tiny file"
hasnt "$out" "GB/s via" "load of a tiny file"

# --repeat on the register path registers once: the first load says it
# registered, the repeats that they reused the registration
out=$("$ferry" load --device sim:1GiB --route register --repeat 3 "$one" 2>&1) || fail "load --route register failed: $out"
[ "$(grep -c 'registered in .* ms' <<<"$out")" -eq 1 ] || fail "load --route register --repeat 3: not one 'registered in': $out"
[ "$(grep -c 'registration reused' <<<"$out")" -eq 2 ] || fail "load --route register --repeat 3: not two reuses: $out"
out=$("$ferry" load --device sim:1GiB --route register --repeat 2 --json "$one" 2>&1) || fail "load --json failed: $out"
[ "$(grep -c '"registration": "registered"' <<<"$out")" -eq 1 ] || fail "load --json: no first registration: $out"
[ "$(grep -c '"registration": "reused"' <<<"$out")" -eq 1 ] || fail "load --json: no reuse: $out"
has "$out" '"register_seconds": 0.0' "load --json of a reused registration"
# the repeats load into the first load's device memory (each file's own);
# with --verify each gets fresh memory, so that a copy that did not happen shows
out=$("$ferry" load --device sim:1GiB --repeat 3 --json "$one" "$src/tests/fuzz/corpus/safetensors/all_dtypes.safetensors" 2>&1) || fail "load --repeat 3 failed: $out"
[ "$(grep -c '"device_memory": "new"' <<<"$out")" -eq 2 ] || fail "load --repeat 3 of two files: not two new: $out"
[ "$(grep -c '"device_memory": "reused"' <<<"$out")" -eq 4 ] || fail "load --repeat 3 of two files: not four reused: $out"
out=$("$ferry" load --device sim:1GiB --repeat 2 --verify --json "$one" 2>&1) || fail "load --repeat 2 --verify failed: $out"
[ "$(grep -c '"device_memory": "new"' <<<"$out")" -eq 2 ] || fail "load --repeat 2 --verify: not new memory each time: $out"
[ "$(grep -c '"verified": true' <<<"$out")" -eq 3 ] || fail "load --repeat 2 --verify: not verified: $out"
out=$("$ferry" load --device sim:1GiB --route register --pinned-budget 4KiB "$one" "$one" 2>&1)
[ $? -eq 0 ] || fail "load --pinned-budget 4KiB of a one-page file failed: $out"
out=$("$ferry" load --device sim:1GiB --route register --pinned-budget 1 "$one" 2>&1) && fail "a budget of 1 byte was not refused: $out"
has "$out" "exceeds the pinned budget" "load --pinned-budget 1"

out=$("$ferry" bench --device cpu "$one" 2>&1) || fail "bench --device cpu failed: $out"
hasnt "$out" "host->device" "bench --device cpu"
hasnt "$out" "--path" "bench --device cpu"
! grep -qE '^(direct|register|cufile) ' <<<"$out" || fail "bench --device cpu lists a path cpu cannot take: $out"
has "$out" "host memory copy" "bench --device cpu"
has "$out" "times are shown, not rates" "bench of a tiny file"

out=$("$ferry" bench --device sim:1GiB "$one" 2>&1) || fail "bench --device sim failed: $out"
hasnt "$out" "use --path" "bench's cufile probe"
has "$out" "probe: cuFile (GPUDirect Storage) unavailable:" "bench's cufile probe"
out=$("$ferry" bench --device sim:1GiB --json "$one" 2>/dev/null) || fail "bench --json failed: $out"
has "$out" '"probes": {' "bench --json's probes"
has "$out" '"route": "ring"' "bench --json's runs"
# --route is the option; --path its deprecated spelling, one line on stderr
out=$("$ferry" load --device sim:1GiB --route ring --json "$one" 2>&1) || fail "load --route ring failed: $out"
has "$out" '"route": "ring"' "load --json"
hasnt "$out" '"path_used"' "load --json"
hasnt "$out" "deprecated" "load --route"
out=$("$ferry" load --device sim:1GiB --path ring --json "$one" 2>&1 >/dev/null) || fail "load --path ring failed: $out"
[ "$out" = "ferry load: --path is deprecated, use --route" ] || fail "load --path: not one deprecation line: $out"
out=$("$ferry" load --help 2>&1)
hasnt "$out" "--path" "load --help"
has "$out" "--route R" "load --help"
# the copy-limit probe fits a small device (it asked for 256 MiB whatever the device had)
out=$("$ferry" bench --device sim:64MiB "$one" 2>&1) || fail "bench --device sim:64MiB failed: $out"
hasnt "$out" "out of device memory" "bench on a 64 MiB device"

# the other counts that may be 1 (hash's model line, convert's summary)
out=$("$ferry" hash "$one" 2>&1) || fail "hash failed: $out"
has "$out" "(model: 1 tensor," "hash of a one-tensor file"
tmp=$(mktemp -d)
out=$("$ferry" convert "$one" "$tmp/out.safetensors" 2>&1) || fail "convert failed: $out"
has "$out" ": 1 tensor," "convert of a one-tensor file"
rm -rf "$tmp"

[ $fails -eq 0 ] && echo "load/bench messages: all checks passed"
exit $((fails > 0))

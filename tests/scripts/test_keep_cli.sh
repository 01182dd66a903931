#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# ferry keep from the command line: --help, usage errors, the CUDA backend's
# "not built yet", a keeper run in the background answering --status (text
# and --json), a second keeper on the same socket refused, SIGTERM stopping it
# with exit 0 and the socket removed, and --status with no keeper there.
#   test_keep_cli.sh FERRY PYTHON
set -u
ferry=$1 py=$2
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
has() { grep -qF -- "$2" <<<"$1" || fail "$3: no '$2' in: $1"; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/ferry-keepcli.XXXXXX") || exit 1
chmod 700 "$dir"
sock=$dir/k.sock
kp=
cleanup() { [ -n "$kp" ] && kill -9 "$kp" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

out=$("$ferry" keep --help 2>&1) || fail "keep --help exited $?"
has "$out" "usage: ferry keep" "keep --help"
has "$out" "--status" "keep --help"
out=$("$ferry" help keep 2>&1) || fail "help keep exited $?"
has "$out" "usage: ferry keep" "help keep"
"$ferry" keep --bogus >/dev/null 2>&1; [ $? -eq 2 ] || fail "keep --bogus: not exit 2"
out=$("$ferry" keep --budget lots 2>&1); [ $? -eq 2 ] || fail "keep --budget lots: not exit 2"
has "$out" "--budget needs a size" "keep --budget lots"
"$ferry" keep --json >/dev/null 2>&1; [ $? -eq 2 ] || fail "keep --json without --status: not exit 2"
out=$("$ferry" keep --socket "$sock" --device cuda:0 2>&1); [ $? -eq 1 ] || fail "keep --device cuda:0: not exit 1"
[ "$out" = "ferry keep: device cuda:0: the CUDA backend is not built yet; use sim:SIZE" ] || fail "cuda message: $out"

out=$("$ferry" keep --status --socket "$sock" 2>&1); [ $? -eq 1 ] || fail "status with no keeper: not exit 1"
has "$out" "$sock" "status with no keeper"
has "$out" "no keeper is running there" "status with no keeper"

"$ferry" keep --socket "$sock" --device sim:64MiB 2>"$dir/log" &
kp=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
out=$("$ferry" keep --status --socket "$sock" 2>&1) || fail "status exited $?: $out"
has "$out" "device sim:64MiB, budget 64.00 MiB, holding 0 B in 0 entries" "status"
has "$out" "1 client connected" "status"
out=$("$ferry" keep --status --json --socket "$sock" 2>&1) || fail "status --json exited $?: $out"
"$py" -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["budget"]==64<<20 and d["entries"]==0 and len(d["clients"])==1 and d["listed"]==[], d' "$out" ||
    fail "status --json: $out"
out=$("$ferry" keep --socket "$sock" 2>&1); [ $? -eq 1 ] || fail "a second keeper: not exit 1"
has "$out" "a keeper is already running there" "a second keeper"
kill -TERM "$kp"
wait "$kp"; rc=$?
kp=
[ $rc -eq 0 ] || fail "keeper exited $rc after SIGTERM"
[ -e "$sock" ] && fail "the socket is left after SIGTERM"
has "$(cat "$dir/log")" "stopping: 0 entries" "keeper log"

# a directory open to others is refused
chmod 755 "$dir"
out=$("$ferry" keep --socket "$sock" 2>&1); [ $? -eq 1 ] || fail "a shared directory: not exit 1"
has "$out" "it must be private" "a shared directory"

[ $fails -eq 0 ] && echo "keep cli: all checks passed"
[ $fails -eq 0 ]

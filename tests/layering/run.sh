#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# tests/layering/run.sh SRC BUILD CC - the layering of src/ holds, and breaking
# it fails: (1) the check passes on the real tree; (2) a resid/ file that
# includes the GPU backend does not compile with resid's include path; (3) nor
# does one that includes xfer's private header; (4) the check refuses each of
# those and a "../" path, naming the file and the rule.
set -u
SRC=$1 BUILD=$2 CC=$3
ROOT=$(cd "$SRC/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { cmake -DSRC="$1" -P "$ROOT/cmake/check_layers.cmake" >"$tmp/out" 2>&1; }

check "$SRC" || { echo "FAIL: the real tree breaks its layering:"; cat "$tmp/out"; fail=1; }

compile_in_resid() { # header: must not compile from resid/
    printf '#include "%s"\nint fy_probe(void);\nint fy_probe(void) { return 0; }\n' "$1" >"$tmp/probe.c"
    if "$CC" -fsyntax-only -I"$ROOT/include" -I"$BUILD/include" -I"$BUILD/layers/resid" "$tmp/probe.c" 2>"$tmp/cc"; then
        echo "FAIL: resid/ can include $1"; fail=1
    fi
}
compile_in_resid gpu/gpu.h
compile_in_resid xfer/xfer_impl.h
compile_in_resid file/file_impl.h
# what resid/ may use still compiles there (so the failures above are the rule, not a broken setup)
printf '#include "xfer/xfer.h"\n#include "io/io.h"\n#include "common/common.h"\n' >"$tmp/ok.c"
"$CC" -fsyntax-only -I"$ROOT/include" -I"$BUILD/include" -I"$BUILD/layers/resid" "$tmp/ok.c" ||
    { echo "FAIL: resid/ cannot include what it may use"; fail=1; }

for bad in '#include "gpu/gpu.h"' '#include "../gpu/gpu.h"' '#include "xfer/xfer_impl.h"'; do
    rm -rf "$tmp/src" && cp -r "$SRC" "$tmp/src"
    printf '%s\n' "$bad" >>"$tmp/src/resid/store_impl.h"
    if check "$tmp/src"; then
        echo "FAIL: the check accepts $bad in resid/"; fail=1
    elif ! grep -q "src/resid/store_impl.h" "$tmp/out"; then
        echo "FAIL: the check's message does not name the file:"; cat "$tmp/out"; fail=1
    fi
done
[ $fail -eq 0 ] && echo "layering: 8 checks passed"
exit $fail

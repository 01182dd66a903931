#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# tests/layering/resources.sh SRC - the store's resources stand alone.
# The files of resid/'s resource layer (docs/ARCHITECTURE.md, "resid/")
# include no header of resid/ but each other's, never store_impl.h, and name
# none of the store's types (ferry_store, ferry_model, rtensor), so each is
# built and tested through its own header (tests/unit/test_resources.c).
# Then the check is shown to refuse a copy of a resource that includes
# store_impl.h, and one that takes a ferry_store.
set -u
SRC=$1
RESOURCES="arena.h arena.c fences.h fences.c lru.h lru.c pinpool.h pinpool.c spill.h spill.c policy.h policy.c keeper.h keeper.c"
PUBLIC="ferry.h ferry_experimental.h" # the public headers, which any layer may include
check() { # DIR: 0 when every resource in DIR keeps the rule, else names what breaks it
    d=$1 bad=0
    for f in $RESOURCES; do
        [ -f "$d/$f" ] || { echo "FAIL: resource $f is missing from $d"; bad=1; continue; }
        for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"/]*\)".*/\1/p' "$d/$f"); do
            case " $RESOURCES $PUBLIC " in
            *" $inc "*) ;;
            *) echo "FAIL: $f includes \"$inc\", which is not a resource's header"; bad=1 ;;
            esac
        done
        if grep -n '\<\(ferry_store\|ferry_model\|rtensor\)\>' "$d/$f" | grep -v '^[0-9]*:[[:space:]]*\(/\*\|\*\)' >/dev/null; then
            echo "FAIL: $f names one of the store's types: $(grep -n '\<\(ferry_store\|ferry_model\|rtensor\)\>' "$d/$f" | grep -v '^[0-9]*:[[:space:]]*\(/\*\|\*\)' | head -1)"
            bad=1
        fi
    done
    return $bad
}
check "$SRC/resid" || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for probe in inc type; do
    rm -rf "$tmp/resid"
    cp -r "$SRC/resid" "$tmp/resid"
    if [ $probe = inc ]; then
        sed -i '0,/#include "arena.h"/s//#include "arena.h"\n#include "store_impl.h"/' "$tmp/resid/arena.c"
    else
        printf 'void rs_lru_probe(struct ferry_store *s);\n' >>"$tmp/resid/lru.h"
    fi
    if out=$(check "$tmp/resid"); then
        echo "FAIL: the check let a resource break the rule ($probe probe)"
        exit 1
    fi
    echo "refused as it should ($probe probe): $out"
done
echo "resources: $(echo $RESOURCES | wc -w) files include no header of the store and name none of its types"

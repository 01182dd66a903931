#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# tests/layering/mutual.sh BUILD ALLOWED - no two C files call each other.
# For every pair of object files of src/ and tools/ferry/ in BUILD, a file
# "uses" another when it references a symbol the other defines (nm); a pair
# that uses each other both ways is a call circle, and fails the check. The
# shared helper of such a pair belongs in a file of its own, below both.
# ALLOWED lists the pairs that still wait for that (one "a.c b.c" a line,
# paths from the repository's root, # comments): each must still be mutual
# (a pair that was broken is struck from the list), and no other may be.
set -u
BUILD=$1 ALLOWED=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
objs=$(find "$BUILD/CMakeFiles" -path '*/src/*.c.o' -o -path '*/tools/ferry/*.c.o' | grep -v '/tests/' | sort)
[ -n "$objs" ] || { echo "FAIL: no object files of src/ under $BUILD/CMakeFiles"; exit 1; }
# one line per (file, symbol): defs and uses, the file named by its source path
for o in $objs; do
    src=$(printf '%s\n' "$o" | sed -e 's|.*/CMakeFiles/[^/]*\.dir/||' -e 's|\.o$||')
    nm --defined-only -g "$o" | awk -v f="$src" 'NF == 3 { print $3, f }' >>"$tmp/defs"
    nm -u "$o" | awk -v f="$src" '{ print $NF, f }' >>"$tmp/uses"
done
sort -u "$tmp/defs" >"$tmp/d"
sort -u "$tmp/uses" >"$tmp/u"
# (user, definer) for each symbol a file uses and another file defines
join "$tmp/u" "$tmp/d" | awk '$2 != $3 { print $2, $3 }' | sort -u >"$tmp/edges"
# mutual pairs, each once (a < b)
awk '{ e[$1 " " $2] = 1 } END { for (k in e) { split(k, p, " "); if (p[1] < p[2] && ((p[2] " " p[1]) in e)) print p[1], p[2] } }' \
    "$tmp/edges" | sort >"$tmp/mutual"
grep -v '^[[:space:]]*\(#\|$\)' "$ALLOWED" | awk '{ if ($1 < $2) print $1, $2; else print $2, $1 }' | sort >"$tmp/allowed"
fail=0
comm -23 "$tmp/mutual" "$tmp/allowed" >"$tmp/new"
comm -13 "$tmp/mutual" "$tmp/allowed" >"$tmp/stale"
if [ -s "$tmp/new" ]; then
    echo "FAIL: these files call each other (move what they share into a file of its own):"
    while read -r a b; do
        echo "  $a <-> $b"
        echo "    $a uses: $(join "$tmp/u" "$tmp/d" | awk -v a="$a" -v b="$b" '$2 == a && $3 == b { print $1 }' | tr '\n' ' ')"
        echo "    $b uses: $(join "$tmp/u" "$tmp/d" | awk -v a="$a" -v b="$b" '$2 == b && $3 == a { print $1 }' | tr '\n' ' ')"
    done <"$tmp/new"
    fail=1
fi
if [ -s "$tmp/stale" ]; then
    echo "FAIL: these pairs no longer call each other: strike them from $ALLOWED:"
    sed 's/^/  /' "$tmp/stale"
    fail=1
fi
[ $fail -eq 0 ] && echo "layering: no new call circles among $(echo "$objs" | wc -l) object files ($(wc -l <"$tmp/allowed") pairs still listed)"
exit $fail

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The C sources keep .clang-format's style: clang-format 14 (Debian 12's, the
# version .clang-format is written for) changes nothing in any tracked .c or .h
# file. Exit 0 when they are formatted, 1 naming the files that are not, 77
# (skipped) without git's file list or clang-format 14.
set -uo pipefail
root=${1:-$(dirname "$0")/../..}
cd "$root" || exit 1
cf=
for c in clang-format-14 clang-format; do
    if command -v "$c" >/dev/null && "$c" --version | grep -q 'version 14\.'; then cf=$c; break; fi
done
[ -n "$cf" ] || { echo "check_format: no clang-format 14: skipped"; exit 77; }
files=$(git ls-files '*.c' '*.h' 2>/dev/null) || { echo "check_format: not a git checkout: skipped"; exit 77; }
bad=()
for f in $files; do
    "$cf" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
    echo "check_format: ${#bad[@]} file(s) differ from .clang-format (run: $cf -i FILE):"
    printf '  %s\n' "${bad[@]}"
    exit 1
fi
echo "check_format: $(wc -w <<<"$files") files formatted"

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/deps.sh's choice of the deb-src line (from the machine's apt sources,
# one-line and deb822, a local mirror, disabled entries; deb.debian.org only
# when nothing fits) and its wait for another apt's lists lock, on fake trees.
#
#   test_deps_sources.sh      (exit 0 passed, 1 failed)
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../scripts/deps.sh
. "$here/../../scripts/deps.sh"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
n=0

# case NAME EXPECTED: the deb-src line for $tmp/NAME/{sources.list,sources.list.d}
case_() {
    local name=$1 want=$2 got
    n=$((n + 1))
    got=$(deb_src_line "$tmp/$name/sources.list" "$tmp/$name/sources.list.d" bookworm)
    if [ "$got" = "$want" ]; then
        echo "ok $name"
    else
        echo "FAIL $name"
        echo "  want: $want"
        echo "  got:  $got"
        failed=$((failed + 1))
    fi
}
# tree NAME: an empty fake /etc/apt
tree() { mkdir -p "$tmp/$1/sources.list.d"; }

# Debian 12's own layout: deb822, two suites in one stanza, security after
tree debian12
cat >"$tmp/debian12/sources.list.d/debian.sources" <<'EOF'
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
echo "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main" \
    >"$tmp/debian12/sources.list.d/google-cloud-sdk.list.disabled-by-farm"
case_ debian12 "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main"

# a local mirror (apt-cacher style) in deb822: the security stanza comes first,
# a deb-src-only and a disabled stanza do not count, field names in any case,
# a key pasted into the stanza cannot go on one line and is left out
tree mirror822
cat >"$tmp/mirror822/sources.list.d/mirror.sources" <<'EOF'
# local mirror
Types: deb
URIs: http://mirror.lan:3142/debian-security
Suites: bookworm-security
Components: main

Types: deb-src
URIs: http://src-only.lan/debian
Suites: bookworm
Components: main

Enabled: no
Types: deb
URIs: http://disabled.lan/debian
Suites: bookworm
Components: main

types: deb deb-src
uris: http://mirror.lan:3142/debian
  http://second.lan/debian
suites:
 bookworm-updates
 bookworm
components: main contrib
signed-by:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mDMEZ...
 -----END PGP PUBLIC KEY BLOCK-----
EOF
case_ mirror822 "deb-src http://mirror.lan:3142/debian bookworm main"

# one-line sources.list: comments, a cdrom, options with and without spaces;
# only signed-by and trusted are kept
tree oneline
cat >"$tmp/oneline/sources.list" <<'EOF'
# deb http://commented.example/debian bookworm main
deb cdrom:[Debian GNU/Linux 12.5.0 _Bookworm_]/ bookworm main
deb http://security.debian.org/debian-security bookworm-security main
deb-src http://src.example/debian bookworm main
deb [ arch=amd64 signed-by=/etc/apt/keyrings/mirror.gpg ] http://mirror.example/debian bookworm main contrib  # the main one
deb [arch=amd64] http://second.example/debian bookworm main
EOF
case_ oneline "deb-src [signed-by=/etc/apt/keyrings/mirror.gpg] http://mirror.example/debian bookworm main"

# sources.list before the parts, and the parts in C-locale order, both formats
tree order
echo "deb http://other.example/debian trixie main" >"$tmp/order/sources.list"
printf 'Types: deb\nURIs: http://b.example/debian\nSuites: bookworm\nComponents: main\n' \
    >"$tmp/order/sources.list.d/b.sources"
echo "deb [trusted=yes] file:/srv/mirror bookworm main" >"$tmp/order/sources.list.d/a-local.list"
echo "deb http://Z.example/debian bookworm main" >"$tmp/order/sources.list.d/Z.list"
case_ order "deb-src http://Z.example/debian bookworm main"
rm "$tmp/order/sources.list.d/Z.list"
case_ order "deb-src [trusted=yes] file:/srv/mirror bookworm main"

# nothing for this codename, and nothing at all: Debian's own mirror
tree other
echo "deb http://deb.example/debian trixie main" >"$tmp/other/sources.list"
case_ other "deb-src http://deb.debian.org/debian bookworm main"
n=$((n + 1))
got=$(deb_src_line "$tmp/none/sources.list" "$tmp/none/sources.list.d" bookworm)
[ "$got" = "deb-src http://deb.debian.org/debian bookworm main" ] || { echo "FAIL none: $got"; failed=$((failed + 1)); }

# the lists lock: held by "another apt" for 3 s, apt_get update waits for it
# (a private, empty apt tree: nothing is fetched, the machine's apt is untouched)
if command -v apt-get >/dev/null && command -v python3 >/dev/null; then
    n=$((n + 1))
    mkdir -p "$tmp/apt/lists/partial" "$tmp/apt/cache/archives/partial"
    : >"$tmp/apt/sources.list"
    O=(-o "Dir::Etc::SourceList=$tmp/apt/sources.list" -o "Dir::Etc::SourceParts=$tmp/apt/none"
       -o "Dir::State::Lists=$tmp/apt/lists" -o "Dir::Cache=$tmp/apt/cache")
    python3 -c '
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)
fcntl.lockf(fd, fcntl.LOCK_EX)
open(sys.argv[2], "w").close()
time.sleep(3)' "$tmp/apt/lists/lock" "$tmp/locked" &
    holder=$!
    while [ ! -e "$tmp/locked" ]; do sleep 0.1; done
    start=$(date +%s)
    if out=$(apt_get "${O[@]}" update -qq 2>&1) && grep -q "waiting for another apt" <<<"$out" &&
        [ $(($(date +%s) - start)) -ge 2 ]; then
        echo "ok lists lock: waited, then updated"
    else
        echo "FAIL lists lock: $out"
        failed=$((failed + 1))
    fi
    wait "$holder"
else
    echo "no apt-get here: the lists-lock wait is not tried"
fi

echo "deps_sources: $((n - failed)) of $n passed"
[ "$failed" -eq 0 ]

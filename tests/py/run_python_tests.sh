#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Run the Python binding's tests (tests/py/test_binding*.py) with pytest under
# every interpreter here that has pytest: Debian's /usr/bin/python3 (numpy,
# torch 1.13 from apt), python3 and python on PATH, and any listed in
# $FERRY_TEST_PYTHONS. Tests needing numpy or torch skip themselves where
# those are missing.
#
#   run_python_tests.sh LIBFERRY_SO
#
# Exit: 0 all passed, 1 a failure, 77 (skipped) when no interpreter has pytest.
lib=${1:?usage: run_python_tests.sh path/to/libferry.so}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
case $lib in /*) ;; *) lib=$(pwd)/$lib ;; esac

seen=""
ran=0
failed=0
for py in /usr/bin/python3 $(command -v python3) $(command -v python) $FERRY_TEST_PYTHONS; do
    [ -x "$py" ] || continue
    # one run per installation: a venv shares its interpreter binary with the
    # system Python but not its packages, so tell them apart by prefix
    exe=$("$py" -c 'import sys; print("%s:%d.%d" % ((sys.prefix,) + sys.version_info[:2]))' 2>/dev/null) || continue
    case " $seen " in *" $exe "*) continue ;; esac
    seen="$seen $exe"
    ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if ! "$py" -c 'import pytest' 2>/dev/null; then
        echo "python_binding: $py ($ver): no pytest, not run"
        continue
    fi
    have=$("$py" -c '
import importlib.util as u
print(" ".join(m for m in ("numpy", "torch", "safetensors", "ml_dtypes") if u.find_spec(m)) or "-")')
    echo "python_binding: $py ($ver; with: $have)"
    # no bytecode or pytest cache in the source tree; the library under test
    # comes from $FERRY_LIBRARY, the package from python/ of this checkout
    if PYTHONDONTWRITEBYTECODE=1 FERRY_LIBRARY="$lib" PYTHONPATH="$root/python" \
        "$py" -m pytest -q -p no:cacheprovider -p no:hypothesispytest -rs "$here"/test_binding*.py; then
        ran=$((ran + 1))
    else
        rc=$?
        ran=$((ran + 1))
        failed=$((failed + 1))
        echo "python_binding: $py: pytest exit $rc"
    fi
done
if [ "$ran" -eq 0 ]; then
    echo "python_binding: no interpreter with pytest (apt-get install python3-pytest): skipped"
    exit 77
fi
echo "python_binding: $ran interpreter(s) ran the tests, $failed failed"
[ "$failed" -eq 0 ]

# SPDX-License-Identifier: Apache-2.0
"""The GPU scripts' check(): run one named check, print PASS/FAIL (with the
traceback) and count it in results, keeping going after a failure."""
import sys
import time
import traceback

results = {"passed": 0, "failed": 0}


def check(name, fn, *args):
    t0 = time.perf_counter()
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - report every failure, keep going
        results["failed"] += 1
        print(f"FAIL {name}\n" + "".join("    " + ln for ln in traceback.format_exc().splitlines(True)))
    else:
        results["passed"] += 1
        print(f"PASS {name} ({time.perf_counter() - t0:.2f} s)")
    sys.stdout.flush()

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""keeper_restart.py - a client restart with and without a keeper: how long a
fresh process's store takes to have every model on the device, and how many
bytes it read from the checkpoints.

    PYTHONPATH=python FERRY_LIBRARY=build/libferry.so \\
        bench/keeper_restart.py [--device DEV] [--rounds N] [--budget SIZE] CHECKPOINT...

Starts `ferry keep` (the CLI beside libferry.so) on a private socket with
--budget (default: the checkpoints' size plus 1 GiB), then, for each round, two
fresh processes alternated: one whose store reads the checkpoints alone
(`none`), one whose store uses the keeper (`keeper`). The first `keeper`
process feeds the keeper; every later one is a restart served by it. Each
process times from its store's creation (its start and imports excluded) to
every checkpoint being on the device, one model per checkpoint. Prints one
JSON line per process and a table; stops the keeper and checks that it exits
0 and leaves its socket removed.

DEV: cuda:N (default when PyTorch sees a GPU), else sim:SIZE (default
sim:(checkpoints + 1 GiB)). On sim the figures measure the code path, not
hardware."""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def child(args):
    from ferry import _core, _store
    t0 = time.perf_counter()
    core = _store.StoreCore(_core.device(args.device), keeper=args.keeper or None)
    for i, path in enumerate(args.paths):
        handles, infos = core.open_files([path])
        m = core.add(f"m{i}", handles, infos)
        core.to_device(m)
    ready = time.perf_counter() - t0
    st = core.stats()
    print(json.dumps({"ready_s": round(ready, 4), "bytes_read": st["bytes_read"],
                      "bytes_from_keeper": st["bytes_from_keeper"], "bytes_htod": st["bytes_htod"],
                      "keeper": st["keeper"]}))


def default_device(total):
    try:
        import torch
        if torch.cuda.is_available():
            return "cuda:0"
    except ImportError:
        pass
    return f"sim:{(total >> 20) + 1024}MiB"


def answers(sock):
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(sock)
            return True
        except OSError:
            return False


def run_child(paths, device, keeper):
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--device", device] + \
        (["--keeper", keeper] if keeper else []) + list(paths)
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"keeper_restart: a client failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", metavar="CHECKPOINT")
    ap.add_argument("--device")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", help="the keeper's budget (e.g. 48GiB)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--keeper", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    for p in args.paths:
        if not os.path.isfile(p):
            raise SystemExit(f"keeper_restart: {p}: no such file")
    total = sum(os.path.getsize(p) for p in args.paths)
    device = args.device or default_device(total)
    budget = args.budget or f"{(total >> 20) + 1024}MiB"
    from ferry import _lib
    cli = os.path.join(os.path.dirname(_lib.path), "ferry")
    if not os.access(cli, os.X_OK):
        raise SystemExit(f"keeper_restart: no ferry CLI beside {_lib.path}")
    where = tempfile.mkdtemp(prefix="fk-bench-", dir="/tmp")
    os.chmod(where, 0o700)
    sock = os.path.join(where, "keep.sock")
    log = open(os.path.join(where, "keeper.log"), "wb")
    keeper = subprocess.Popen([cli, "keep", "--socket", sock, "--device", "sim", "--budget", budget],
                              stdout=log, stderr=log)
    rows = []
    try:
        t0 = time.monotonic()
        while not answers(sock):
            if keeper.poll() is not None or time.monotonic() - t0 > 10:
                raise SystemExit(f"keeper_restart: the keeper did not start (log: {where}/keeper.log)")
            time.sleep(0.02)
        for r in range(args.rounds):
            for method in ("none", "keeper"):
                res = run_child(args.paths, device, sock if method == "keeper" else None)
                res.update(round=r, method=method, device=device)
                rows.append(res)
                print(json.dumps(res), flush=True)
    finally:
        keeper.terminate()
        rc = keeper.wait(30)
        log.close()
        left = os.path.exists(sock)
        print(f"keeper: exit {rc}, socket {'left behind' if left else 'removed'}", flush=True)
        if rc == 0 and not left:
            shutil.rmtree(where, ignore_errors=True)
    gb = total / 1e9
    print(f"\n{len(args.paths)} checkpoint(s), {gb:.2f} GB, device {device}, keeper budget {budget}\n")
    print("| round | method | ready s | GB/s | bytes read | from keeper |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for x in rows:
        print(f"| {x['round']} | {x['method']} | {x['ready_s']:.3f} | {gb / x['ready_s']:.2f} | "
              f"{x['bytes_read']} | {x['bytes_from_keeper']} |")


if __name__ == "__main__":
    main()

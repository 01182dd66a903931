# SPDX-License-Identifier: Apache-2.0
"""keeper - `ferry keep` for the pack's test: a keeper on the default socket
of a runtime directory, which the ComfyUI process given that
XDG_RUNTIME_DIR finds on its own."""
import os
import socket
import subprocess
import time


def start_keeper(cli, xdg, log):
    """`ferry keep` (the CLI at cli) on the default socket of
    XDG_RUNTIME_DIR xdg, once it answers; None without the CLI."""
    if not os.access(cli, os.X_OK):
        return None
    sock = os.path.join(xdg, "ferry", "keep.sock")
    proc = subprocess.Popen([cli, "keep", "--device", "sim:256MiB"], env=dict(os.environ, XDG_RUNTIME_DIR=xdg),
                            stdout=log, stderr=log)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 10 and proc.poll() is None:
        with socket.socket(socket.AF_UNIX) as c:
            try:
                c.connect(sock)
                return proc
            except OSError:
                time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise AssertionError(f"`ferry keep` did not start on {sock}")

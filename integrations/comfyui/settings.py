# SPDX-License-Identifier: MIT
"""settings - the pack's options, read once from the environment at start-up
(ComfyUI's own custom-node settings live in the frontend; an environment
variable is what a server, a container or a test can set)."""
import logging
import os

GIB = 1024 ** 3  # ComfyUI's "GB" flags (--reserve-vram, --cache-ram) count 1024**3 bytes

HOST_LIMIT_ENV = "FERRY_HOST_LIMIT_GB"
"""The most host RAM (GiB) ferry may budget for: a user's cap below what the
machine or its container allows. Unset: ferry's own figure (the cgroup's
memory.max or MemAvailable, ferry.host_available())."""

STATS_ENV = "FERRY_COMFYUI_STATS"
"""A file to append each prompt's memory figures to, one JSON object a line."""

DISABLE_ENV = "FERRY_COMFYUI_DISABLE"
"""1: every ferry node loads with ComfyUI's own loader (an A/B switch)."""

USS_ENV = "FERRY_COMFYUI_USS"
"""0: skip the USS figures (each read of /proc/self/smaps_rollup walks the
process's page tables: 10-30 ms per resident GiB, twice a prompt)."""

RESIDENCY_ENV = "FERRY_COMFYUI_RESIDENCY"
"""0: ComfyUI moves the weights of the models the ferry nodes load (over
ferry's views of the file) instead of ferry's store (residency.py), on a GPU
and on FERRY_COMFYUI_DEVICE alike. Unset or 1: ferry's store holds them on
a GPU, and on the CPU only where FERRY_COMFYUI_DEVICE names a simulated
device."""

DEVICE_ENV = "FERRY_COMFYUI_DEVICE"
"""A ferry device for ComfyUI's CPU device (sim:SIZE, e.g. sim:64MiB): the
store then holds the ferry nodes' models there, as it does on a GPU (tests
and experiments on a machine without one). Unset: on the CPU nothing moves."""

STREAM_COPIES_ENV = "FERRY_COMFYUI_STREAM_COPIES"
"""Where a streamed diffusion model's blocks come from at each step: ring
(the default: read from the checkpoint through ferry's pinned ring, so host
memory stays at the ring's size), pinned (a pinned copy of each block as the
host budget allows: faster steps, that much more host memory) or auto (pinned
when all of them fit the host budget)."""

KEEPER_ENV = "FERRY_COMFYUI_KEEPER"
"""Whether ferry's store asks a keeper (`ferry keep`, ferry's docs/KEEPER.md)
for the weights it would read from checkpoints, and feeds it those it reads,
so that a restarted ComfyUI finds them in memory: unset or 1, the keeper at
the default socket when one is running there; a socket path, the keeper
there when one is running; 0, none. A keeper that is not running, or dies
later, only costs its cache: the store reads the checkpoints."""


def _flag(name, default):
    v = os.environ.get(name, "").strip().lower()
    if not v:
        return default
    return v not in ("0", "false", "no", "off")


def _host_limit():
    text = os.environ.get(HOST_LIMIT_ENV, "").strip()
    if not text:
        return None
    try:
        gb = float(text)
        if gb <= 0:
            raise ValueError
    except ValueError:
        logging.warning("ferry: %s=%r is not a positive number of GiB; ignored", HOST_LIMIT_ENV, text)
        return None
    return int(gb * GIB)


disabled = _flag(DISABLE_ENV, False)
read_uss = _flag(USS_ENV, True)
stats_path = os.environ.get(STATS_ENV, "").strip() or None
host_limit_user = _host_limit()
residency = _flag(RESIDENCY_ENV, None)  # None: unset
sim_device = os.environ.get(DEVICE_ENV, "").strip() or None
stream_copies = os.environ.get(STREAM_COPIES_ENV, "").strip().lower() or "ring"
if stream_copies not in ("ring", "pinned", "auto"):
    logging.warning("ferry: %s=%r is none of ring, pinned, auto; ring is used", STREAM_COPIES_ENV, stream_copies)
    stream_copies = "ring"
keeper = os.environ.get(KEEPER_ENV, "").strip() or True
if keeper is not True:
    if keeper.lower() in ("0", "false", "no", "off"):
        keeper = None
    elif keeper.lower() in ("1", "true", "yes", "on"):
        keeper = True
    elif not keeper.startswith("/"):
        logging.warning("ferry: %s=%r is none of 0, 1 or an absolute socket path; the default socket is used",
                        KEEPER_ENV, keeper)
        keeper = True
if sim_device is not None and not sim_device.startswith("sim:"):
    logging.warning("ferry: %s=%r is not sim:SIZE; ignored", DEVICE_ENV, sim_device)
    sim_device = None


def host_budget(ferry_module):
    """(bytes, where the figure came from): the user's limit where it is
    below what ferry finds available now, else ferry's figure; (limit, env)
    when ferry cannot be asked."""
    available, source = None, ""
    fn = getattr(ferry_module, "host_available", None) if ferry_module is not None else None
    if fn is not None:
        try:
            available, source = fn()
        except OSError as e:
            source = f"ferry.host_available failed: {e}"
    if host_limit_user is not None and (available is None or host_limit_user < available):
        return host_limit_user, HOST_LIMIT_ENV
    return available, source

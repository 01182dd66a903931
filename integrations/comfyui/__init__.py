# SPDX-License-Identifier: MIT
"""ferry's ComfyUI node pack: loader nodes that read checkpoints with ferry
(zero-copy views of the file, kept as the model's weights where ComfyUI would
copy them unchanged), falling back to ComfyUI's own loaders for what ferry
cannot serve, and one memory line per prompt in ComfyUI's log. See README.md."""
import logging

from . import keep_views, memstats, settings
from .loaders import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS, ferry_status

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]


def _start():
    ferry, word = ferry_status()
    logging.info("ferry: %s", word)
    budget, source = settings.host_budget(ferry)
    if budget is not None:
        logging.info("ferry: host budget %s (%s)", memstats.fmt_bytes(budget), source)
    if not keep_views.available():
        logging.info("ferry: this torch has no module registration hooks: ComfyUI copies the weights it loads")
    if settings.disabled:
        logging.info("ferry: %s is set: the ferry nodes load with ComfyUI's loaders", settings.DISABLE_ENV)
    logging.info("ferry: %s", memstats.install())


_start()

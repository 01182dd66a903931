# SPDX-License-Identifier: Apache-2.0
"""av.video.reformatter stand-in: ColorRange, whose members comfy_api compares frames with."""
import enum


class ColorRange(enum.IntEnum):
    UNSPECIFIED = 0
    MPEG = 1
    JPEG = 2

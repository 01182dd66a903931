# SPDX-License-Identifier: Apache-2.0
"""A stand-in for PyAV (`av`) that satisfies only what ComfyUI does with it
while importing: its modules `import av` and `from av.container import
InputContainer`, `from av.subtitles.stream import SubtitleStream`, `from
av.video.reformatter import ColorRange` at module level (comfy_api's video
types, comfy_extras' video, audio, image, LTX, SAM3 and dataset nodes); every
other use of av is inside a function that a text-to-video prompt ending in
SaveImage never calls.

PyAV's wheel (~36 MB, with FFmpeg) does not fit the GPU benchmark's carry
limit, so bench/gpu_comfyui.sh puts bench/stubs first on PYTHONPATH. Names are
placeholders: anything that would decode or encode media (av.open, a frame
from an array, a codec, ...) raises ImportError naming this stub.

FERRY_AV_STUB_LOG=FILE appends each attribute looked up on this package
(one name a line), to check which ones ComfyUI touches."""
import os
import sys

STUB = True
__version__ = "0.0.0+ferry-bench-stub"
time_base = 1000000
_LOG = os.environ.get("FERRY_AV_STUB_LOG")


def _record(name):
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(name + "\n")


def _unavailable(what):
    raise ImportError(f"av.{what}: PyAV is not installed; bench/stubs/av stands in for it "
                      "(import-time only: no video or audio encoding or decoding)")


class _Placeholder:
    """A type to name in isinstance checks and annotations; using it raises."""

    def __init__(self, *a, **kw):
        _unavailable(type(self).__name__)

    @classmethod
    def from_ndarray(cls, *a, **kw):
        _unavailable(cls.__name__ + ".from_ndarray")

    def __class_getitem__(cls, item):
        return cls


def _placeholder(name):
    return type(name, (_Placeholder,), {})


def open(*a, **kw):  # noqa: A001 - PyAV's name
    _unavailable("open")


# what the import-time lines name, and the types used in isinstance checks
VideoStream = _placeholder("VideoStream")
AudioStream = _placeholder("AudioStream")
VideoFrame = _placeholder("VideoFrame")
AudioFrame = _placeholder("AudioFrame")
CodecContext = _placeholder("CodecContext")


def __getattr__(name):
    """Any other top-level name: a placeholder type (recorded with
    FERRY_AV_STUB_LOG), so that an annotation or isinstance naming it holds."""
    if name.startswith("__"):
        raise AttributeError(name)
    _record(name)
    value = _placeholder(name)
    setattr(sys.modules[__name__], name, value)
    return value

# SPDX-License-Identifier: Apache-2.0
"""av.subtitles.stream stand-in: the type comfy_api's video types test streams against."""
from av import _placeholder

SubtitleStream = _placeholder("SubtitleStream")

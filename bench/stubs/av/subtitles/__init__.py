# SPDX-License-Identifier: Apache-2.0
"""av.subtitles stand-in (see av/__init__.py)."""

# SPDX-License-Identifier: Apache-2.0
"""av.video stand-in (see av/__init__.py)."""

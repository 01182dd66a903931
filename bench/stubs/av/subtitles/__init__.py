"""av.subtitles stand-in (see av/__init__.py)."""

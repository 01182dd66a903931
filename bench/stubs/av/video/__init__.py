"""av.video stand-in (see av/__init__.py)."""

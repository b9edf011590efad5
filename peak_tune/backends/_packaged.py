"""Compiler libraries that ship inside other packages' wheels or sources (DXC's in
compushady, Slang's in slangpy), or that a variable names."""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path

__all__ = ["packaged_library"]


def packaged_library(variable: str, package: str, pattern: str) -> str | None:
    """$`variable` when set (None if it names no file), else the first file matching
    `pattern` (a glob below the installed `package`'s folder), else None."""
    named = os.environ.get(variable)
    if named:
        return named if Path(named).is_file() else None
    try:
        spec = find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.glob(pattern))
    return str(found[0]) if found else None

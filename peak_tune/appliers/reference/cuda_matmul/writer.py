"""The line writer the CUDA emitters use (shared with the C printer)."""

from __future__ import annotations

from ..code_writer import CodeWriter

__all__ = ["CodeWriter"]

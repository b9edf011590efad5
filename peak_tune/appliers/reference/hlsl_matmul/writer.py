"""The line writer of the HLSL printer: HLSL's `[unroll]` attribute for unrolled loops."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..code_writer import CodeWriter

__all__ = ["HlslWriter"]


class HlslWriter(CodeWriter):
    @contextmanager
    def unrolled(self, var: str, count: str, start: str = "0", factor: int = 0
                 ) -> Iterator[None]:
        """`[unroll]` (`[unroll(factor)]`) + `for (int var = start; var < count; ++var) {`."""
        self.line(f"[unroll({factor})]" if factor else "[unroll]")
        with self.block(f"for (int {var} = {start}; {var} < {count}; ++{var})"):
            yield

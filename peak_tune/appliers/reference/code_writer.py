"""An indenting line writer shared by the reference implementations' code printers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["CodeWriter"]


class CodeWriter:
    """Collects C / CUDA C++ lines with four-space indentation."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._depth = 0

    def line(self, text: str = "") -> None:
        self._lines.append("    " * self._depth + text if text else "")

    def lines(self, *texts: str) -> None:
        for text in texts:
            self.line(text)

    def raw(self, text: str) -> None:
        """Lines pasted as they are (preprocessor blocks, snippets), not indented."""
        self._lines.extend(text.splitlines())

    def pragma(self, text: str) -> None:
        """A pragma line, indented like code (GCC accepts both)."""
        self.line(f"#pragma {text}")

    @contextmanager
    def block(self, head: str) -> Iterator[None]:
        """`head {` ... `}` with the body indented (a bare `{` when head is empty)."""
        self.line(f"{head} {{" if head else "{")
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            self.line("}")

    @contextmanager
    def unrolled(self, var: str, count: str, start: str = "0", factor: int = 0
                 ) -> Iterator[None]:
        """`#pragma unroll` (`#pragma unroll factor` when given) +
        `for (int var = start; var < count; ++var) {`."""
        self.line(f"#pragma unroll {factor}" if factor else "#pragma unroll")
        with self.block(f"for (int {var} = {start}; {var} < {count}; ++{var})"):
            yield

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"

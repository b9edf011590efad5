"""Ctrl-C during a run: the first lets the running trial finish, a second stops at once."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator

__all__ = ["StopRequest"]


class StopRequest:
    """The first Ctrl-C lets the running trial finish; a second one stops at once."""

    def __init__(self) -> None:
        self._requested = False

    def requested(self) -> bool:
        return self._requested

    def _handle(self, signum: int, frame: object) -> None:
        if self._requested:
            raise KeyboardInterrupt
        self._requested = True
        print("peak-tune: stopping after this trial (Ctrl-C again to stop now)",
              file=sys.stderr)

    @contextlib.contextmanager
    def on_ctrl_c(self) -> Iterator[None]:
        previous = signal.signal(signal.SIGINT, self._handle)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

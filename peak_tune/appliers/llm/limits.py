"""Caps on how an applier's calls reach the endpoint: at most `concurrency` requests in
flight at once, and request starts spaced at least 60 / `requests_per_minute` seconds
apart (every HTTP attempt counts, retries included). Shared by every thread that uses
one applier."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["RequestGate"]


class RequestGate:
    """`with gate.slot(): send()` waits for a free slot and for the rate's next start."""

    def __init__(self, concurrency: int, requests_per_minute: float,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._slots = threading.BoundedSemaphore(concurrency)
        self._interval_s = 60.0 / requests_per_minute if requests_per_minute > 0 else 0.0
        self._sleep = sleep
        self._clock = clock
        self._lock = threading.Lock()
        self._next_start = 0.0

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        with self._slots:
            self._wait_for_rate()
            yield

    def _wait_for_rate(self) -> None:
        if not self._interval_s:
            return
        with self._lock:
            now = self._clock()
            start = max(now, self._next_start)
            self._next_start = start + self._interval_s
        if start > now:
            self._sleep(start - now)

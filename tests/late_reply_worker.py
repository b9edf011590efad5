"""The C backend's worker on a machine slow to wake a process: every reply, pings
included, leaves LATE_S late. An honest kernel must keep its own times there; a floor
taken without the wake-up read the lateness as a lie (tests/backends/test_c.py)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import IO, Any

from peak_tune.backends import _c_worker, _worker_child

LATE_S = 0.006
_on_time = _worker_child._answer


def _late(replies: IO[bytes], request: Mapping[str, Any], reply: dict[str, Any]) -> None:
    time.sleep(LATE_S)
    _on_time(replies, request, reply)


_worker_child._answer = _late

if __name__ == "__main__":
    sys.exit(_c_worker.main())

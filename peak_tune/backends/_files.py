"""Files the backends write where others may read them at once: atomically."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

from peak_tune.errors import environment_fault

__all__ = ["put_atomically", "write_atomically"]


def put_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """`write` a temporary file beside `path`, then rename it to `path`: readers see all
    of it or nothing. Its folder is made again if it was deleted (once more if that
    happens as it is written); a full disk is an EnvironmentFault."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}")
    for attempt in range(2):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write(temporary)
            os.replace(temporary, path)
            return
        except FileNotFoundError:
            if attempt:
                raise
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            fault = environment_fault(exc, f"writing {path}")
            if fault is None:
                raise
            raise fault from exc


def write_atomically(path: Path, data: str | bytes) -> None:
    """`data` to `path` through put_atomically."""
    if isinstance(data, bytes):
        put_atomically(path, lambda temporary: temporary.write_bytes(data))
    else:
        put_atomically(path, lambda temporary: temporary.write_text(data))

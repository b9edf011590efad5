"""Files written where others may read them at once (the cache, the vendor's timings,
checkpoints, builds): all of a file or nothing, and a folder cleared meanwhile is no crash."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peak_tune.errors import EnvironmentFault, environment_fault

__all__ = ["FOLDER_REMOVED", "put_atomically", "write_atomically", "write_json_atomically"]

FOLDER_REMOVED = "folder removed under the run"
_ATTEMPTS = 3  # a folder deleted as the file is written is made again, twice


def put_atomically(path: Path, write: Callable[[Path], object], doing: str = "") -> None:
    """`write` a temporary file beside `path`, then rename it to `path`: readers see all
    of it or nothing. Its folder is made again if it was deleted meanwhile (a user
    clearing the cache); a full disk, or a folder that keeps vanishing, is an
    EnvironmentFault naming `doing` (default: "writing <path>")."""
    doing = doing or f"writing {path}"
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}")
    for _ in range(_ATTEMPTS):
        try:
            if not _folder_made(path.parent):
                continue
            write(temporary)
            os.replace(temporary, path)
            return
        except FileNotFoundError:
            continue
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            fault = environment_fault(exc, doing)
            if fault is None:
                raise
            raise fault from exc
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    raise EnvironmentFault(FOLDER_REMOVED, f"{doing}: {path.parent} was deleted "
                                           f"{_ATTEMPTS} times as it was written")


def _folder_made(folder: Path) -> bool:
    """Make `folder` if missing; False where it was deleted while pathlib made it (its
    mkdir found it there, then saw no folder: a race with a user clearing the cache)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        if folder.exists():  # a file in the folder's place: not a race
            raise
        return False
    return True


def write_atomically(path: Path, data: str | bytes, doing: str = "") -> None:
    """`data` to `path` through put_atomically."""
    if isinstance(data, bytes):
        put_atomically(path, lambda temporary: temporary.write_bytes(data), doing)
    else:
        put_atomically(path, lambda temporary: temporary.write_text(data), doing)


def write_json_atomically(path: Path, data: Any, doing: str = "", indent: int | None = None
                          ) -> None:
    """`data` as JSON (sorted keys unless `indent` is given) through put_atomically."""
    text = json.dumps(data, indent=indent, sort_keys=indent is None)
    write_atomically(path, text, doing)

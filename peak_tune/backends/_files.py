"""Files the backends write where others may read them at once: atomically."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from peak_tune.backends.base import Artifact
from peak_tune.errors import environment_fault

__all__ = ["built_or_reused", "put_atomically", "write_atomically"]


def built_or_reused(build_dir: str, key: str, suffix: str,
                    build: Callable[[Path], tuple[str, Mapping[str, int]]]) -> Artifact:
    """<build_dir>/<key><suffix> and its sidecar <key>.json (the compiler's log and the
    build's resources): reused where both are there, else `build(path)` -> (log,
    resources) writes it and the sidecar is written after it, so a sidecar always
    describes a whole build."""
    folder = Path(build_dir).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    built, sidecar = folder / f"{key}{suffix}", folder / f"{key}.json"
    if built.exists() and sidecar.exists():
        record = json.loads(sidecar.read_text())
        return Artifact(str(built), key, log=record["log"], reused=True,
                        resources=record["resources"])
    log, resources = build(built)
    write_atomically(sidecar, json.dumps({"log": log, "resources": dict(resources)}))
    return Artifact(str(built), key, log=log, resources=dict(resources))


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

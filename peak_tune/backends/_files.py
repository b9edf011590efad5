"""Builds kept for reuse: a build and the sidecar that describes it."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from peak_tune.atomic_files import write_atomically
from peak_tune.backends.base import Artifact

__all__ = ["built_or_reused"]


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

"""Named checkpoints of variants made by hand (`peak-tune apply`), stored with the cache.

The index is one small JSON file in the results folder (`checkpoints.json`): for each
checkpoint its parent checkpoint, the transformation that made it, every tuning value,
the variant's content hash and its measurements. The variant itself lives in the cache
under that hash. Every change is read-modify-write under a file lock and replaces the
index atomically, so a killed command or two commands at once never lose a checkpoint.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from peak_tune.atomic_files import write_json_atomically
from peak_tune.errors import UserError

__all__ = ["SEED", "Checkpoint", "CheckpointStore", "Timing", "timing_key"]

log = logging.getLogger(__name__)

SEED = "seed"  # the name of the seed kernel, the root every checkpoint descends from
INDEX_NAME = "checkpoints.json"
_FORMAT = 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Timing:
    """One measurement of a checkpoint's variant, next to the vendor's in the same run."""

    status: str  # a Status value: "ok", "wrong_result", ...
    gflops: float = 0.0
    median_ms: float = 0.0
    spread: float = 0.0
    vendor: str = ""
    vendor_gflops: float = 0.0
    message: str = ""
    measured: str = ""  # ISO time

    @property
    def ratio(self) -> float | None:
        return self.gflops / self.vendor_gflops if self.vendor_gflops and self.gflops else None


def timing_key(device: str, dtype: str, size_label: str) -> str:
    """Where a measurement is filed: one per device, dtype and problem size."""
    return f"{device} {dtype} {size_label}"


@dataclass(frozen=True)
class Checkpoint:
    """A variant reached from its parent checkpoint (or the seed) by one transformation."""

    name: str
    parent: str  # a checkpoint name, or SEED
    transformation: str
    transform_version: int
    params: Mapping[str, int]  # the value of every tuning parameter of the variant
    defaults_used: tuple[str, ...]  # parameters whose value was the default, not given
    context_hash: str
    kernel: str
    backend: str
    device: str
    dtype: str
    size: Mapping[str, int]
    applier: str
    created: str
    timings: Mapping[str, Timing] = field(default_factory=dict)
    sample: int = 0  # which answer of the applier (see `apply --sample`)

    @property
    def size_label(self) -> str:
        return "x".join(str(v) for v in self.size.values())

    @property
    def key(self) -> str:
        """The key of the measurement taken when the checkpoint was made."""
        return timing_key(self.device, self.dtype, self.size_label)

    def timing(self, key: str | None = None) -> Timing | None:
        return self.timings.get(key or self.key)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["defaults_used"] = list(self.defaults_used)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checkpoint:
        values = dict(data)
        values["params"] = dict(data["params"])
        values["size"] = dict(data["size"])
        values["defaults_used"] = tuple(data["defaults_used"])
        values["timings"] = {k: Timing(**t) for k, t in data.get("timings", {}).items()}
        return cls(**values)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@dataclass
class _Index:
    current: str | None = None
    counter: int = 0  # auto-names are cp<counter + 1>; never reused after a delete
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)


class CheckpointStore:
    """The checkpoint index of one results folder."""

    def __init__(self, results: Path) -> None:
        self.results = results
        self.path = results / INDEX_NAME

    # ------------------------------------------------------------------ reading

    def _load(self) -> _Index:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return _Index()
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"checkpoint index {self.path} cannot be read ({exc}); "
                            "it is left as it is") from exc
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise UserError(f"checkpoint index {self.path} has an unknown format; "
                            "it is left as it is")
        try:
            checkpoints = {n: Checkpoint.from_json(c) for n, c in data["checkpoints"].items()}
        except (KeyError, TypeError) as exc:
            raise UserError(f"checkpoint index {self.path} is damaged ({exc}); "
                            "it is left as it is") from exc
        return _Index(data.get("current"), int(data.get("counter", 0)), checkpoints)

    def all(self) -> list[Checkpoint]:
        """Every checkpoint, oldest first."""
        return list(self._load().checkpoints.values())

    def current(self) -> str | None:
        return self._load().current

    def get(self, name: str) -> Checkpoint:
        index = self._load()
        if name not in index.checkpoints:
            raise UserError(_unknown(name, index))
        return index.checkpoints[name]

    def children(self, name: str) -> list[Checkpoint]:
        return [c for c in self.all() if c.parent == name]

    def find_same(self, draft: Checkpoint) -> Checkpoint | None:
        """A checkpoint already made by the same step from the same parent with the same
        values, measured on the same device, dtype and size."""
        for c in self.all():
            if (c.parent, c.transformation, c.context_hash, dict(c.params), c.key,
                    c.sample) == (draft.parent, draft.transformation, draft.context_hash,
                                  dict(draft.params), draft.key, draft.sample):
                return c
        return None

    def check_new_name(self, name: str) -> None:
        """Raise UserError unless `name` is well formed and free (checked again on add)."""
        check_name(name)
        if name in self._load().checkpoints:
            raise UserError(_taken(name))

    # ------------------------------------------------------------------ writing

    @contextlib.contextmanager
    def _editing(self) -> Iterator[_Index]:
        """Read, let the caller change, and write back atomically, under a file lock."""
        self.results.mkdir(parents=True, exist_ok=True)
        with open(self.results / ".checkpoints.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            index = self._load()
            yield index
            self._write(index)

    def _write(self, index: _Index) -> None:
        data = {"format": _FORMAT, "current": index.current, "counter": index.counter,
                "checkpoints": {n: c.to_json() for n, c in index.checkpoints.items()}}
        write_json_atomically(self.path, data, f"writing the checkpoints {self.path}", indent=1)

    def add(self, draft: Checkpoint, name: str | None) -> Checkpoint:
        """Store `draft` under `name` (or the next free cpN) and make it current."""
        if name is not None:
            check_name(name)
        with self._editing() as index:
            if name is None:
                while f"cp{index.counter + 1}" in index.checkpoints:
                    index.counter += 1
                name = f"cp{index.counter + 1}"
                index.counter += 1
            elif name in index.checkpoints:
                raise UserError(_taken(name))
            if draft.parent != SEED and draft.parent not in index.checkpoints:
                raise UserError(_unknown(draft.parent, index))
            checkpoint = replace(draft, name=name)
            index.checkpoints[name] = checkpoint
            index.current = name
        log.info("checkpoint %s saved in %s", name, self.path)
        return checkpoint

    def set_current(self, name: str) -> Checkpoint | None:
        """Make `name` (or the seed) the checkpoint the next apply starts from."""
        with self._editing() as index:
            if name != SEED and name not in index.checkpoints:
                raise UserError(_unknown(name, index))
            index.current = None if name == SEED else name
            return index.checkpoints.get(name)

    def record_timing(self, name: str, key: str, timing: Timing) -> Checkpoint:
        with self._editing() as index:
            if name not in index.checkpoints:
                raise UserError(_unknown(name, index))
            old = index.checkpoints[name]
            index.checkpoints[name] = replace(old, timings={**old.timings, key: timing})
            return index.checkpoints[name]

    def delete(self, name: str) -> Checkpoint:
        """Remove one checkpoint without children; its variant stays in the cache."""
        with self._editing() as index:
            if name not in index.checkpoints:
                raise UserError(_unknown(name, index))
            kids = [c.name for c in index.checkpoints.values() if c.parent == name]
            if kids:
                raise UserError(f"checkpoint {name!r} has children ({', '.join(kids)}): "
                                "delete them first")
            gone = index.checkpoints.pop(name)
            if index.current == name:
                index.current = None if gone.parent == SEED else gone.parent
            return gone


def check_name(name: str) -> None:
    if name == SEED or not _NAME.match(name):
        raise UserError(f"checkpoint name {name!r}: use letters, digits, '.', '_' and '-' "
                        f"(at most 64, not starting with a symbol; {SEED!r} is reserved)")


def _taken(name: str) -> str:
    return (f"checkpoint {name!r} exists already (choose another --name, or "
            f"`peak-tune checkpoint delete {name}` first)")


def _unknown(name: str, index: _Index) -> str:
    names = ", ".join(index.checkpoints) or "none yet"
    return f"no checkpoint {name!r} (checkpoints: {names})"

"""Content-addressed cache of variants, applications and evaluations.

One cache serves every study in a results folder. Keys are hashes of everything that
decides the result, so an edited kernel, transformation text, compiler or device never
reuses an old entry. Writes are atomic (temp file + rename), so a killed run leaves no
half-written entry, and the folder can be copied to another machine and replayed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peak_tune.atomic_files import write_json_atomically
from peak_tune.core import KernelContext, Outcome, stable_hash
from peak_tune.errors import UserError, environment_fault
from peak_tune.serialize import (
    context_from_json,
    context_to_json,
    outcome_from_json,
    outcome_to_json,
)

__all__ = ["Cache", "CacheCounters", "application_key", "confirmation_key", "evaluation_key"]

_KINDS = ("contexts", "applications", "evaluations", "confirmations")


def application_key(
    parent_hash: str, transform_id: str, version: int, text_hash: str, applier: str, sample: int
) -> str:
    return stable_hash(["apply", parent_hash, transform_id, version, text_hash, applier, sample])


def evaluation_key(
    context: KernelContext,
    params: Mapping[str, int],
    size: Mapping[str, int],
    dtype: str,
    fingerprint: Mapping[str, str],
    spec_identity: str,
) -> str:
    """The variant as it runs (KernelContext.run_identity, not its lineage), its values,
    the size and dtype, the device and compiler (fingerprint) and the spec."""
    return stable_hash(
        ["evaluate", context.run_identity(), dict(params), dict(size), dtype,
         dict(fingerprint), spec_identity]
    )


def confirmation_key(
    context_hash: str,
    params: Mapping[str, int],
    size: Mapping[str, int],
    dtype: str,
    vendor_key: str,
    rounds: int,
) -> str:
    """The key of an end-of-run re-timing of a variant beside the vendor: the variant and
    its values, the size and dtype, and the vendor's key (itself the size, dtype, backend
    fingerprint and spec), and how many rounds were timed."""
    return stable_hash(
        ["confirm", context_hash, dict(params), dict(size), dtype, vendor_key, rounds]
    )


@dataclass
class CacheCounters:
    """What this process asked of the cache (not what is on disk)."""

    hits: int = 0
    misses: int = 0
    compiles: int = 0


class Cache:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.builds = folder / "builds"
        try:
            for kind in (*_KINDS, "builds"):
                (folder / kind).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise environment_fault(exc, f"making the cache folder {folder}") or UserError(
                f"cannot make the cache folder {folder}: {exc.strerror}") from exc
        self.counters = CacheCounters()

    def _path(self, kind: str, key: str) -> Path:
        return self.folder / kind / key[:2] / f"{key}.json"

    def _read(self, kind: str, key: str) -> Any | None:
        try:
            return json.loads(self._path(kind, key).read_text())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, OSError):
            return None  # a damaged entry is a miss; it is rewritten

    def _write(self, kind: str, key: str, data: Any) -> None:
        """Write one entry atomically. A folder deleted under a running tuner is made
        again; a full disk (or memory) is an EnvironmentFault, never a half entry."""
        path = self._path(kind, key)
        write_json_atomically(path, data, f"writing the cache entry {path}")

    # Variants are stored under their content hash so lineage can be walked later.
    def put_context(self, context: KernelContext) -> str:
        digest = context.content_hash()
        if not self._path("contexts", digest).exists():
            self._write("contexts", digest, context_to_json(context))
        return digest

    def get_context(self, digest: str) -> KernelContext | None:
        data = self._read("contexts", digest)
        return context_from_json(data) if data else None

    def lineage(self, context: KernelContext) -> list[KernelContext]:
        """The chain from the seed to `context`, seed first (as far as stored)."""
        chain = [context]
        while chain[-1].lineage:
            parent = self.get_context(chain[-1].lineage.parent_hash)
            if parent is None:
                break
            chain.append(parent)
        return chain[::-1]

    def get_application(self, key: str) -> dict[str, Any] | None:
        """{"child": hash} or {"error": class name, "message": text}; counts hit/miss."""
        data = self._read("applications", key)
        self._count(data is not None)
        return data

    def put_application(self, key: str, record: dict[str, Any]) -> None:
        self._write("applications", key, record)

    def get_evaluation(self, key: str) -> Outcome | None:
        data = self._read("evaluations", key)
        self._count(data is not None)
        return outcome_from_json(data, cached=True) if data else None

    def has_evaluation(self, key: str) -> bool:
        """Whether an evaluation is stored (not counted as a hit or a miss)."""
        return self._path("evaluations", key).is_file()

    def put_evaluation(self, key: str, outcome: Outcome) -> None:
        self._write("evaluations", key, outcome_to_json(outcome))

    def get_confirmation(self, key: str) -> dict[str, Any] | None:
        """An end-of-run re-timing (tune.SizeConfirmation.to_json()); not counted as a
        hit or a miss (the counters are the trials')."""
        data = self._read("confirmations", key)
        return data if isinstance(data, dict) else None

    def put_confirmation(self, key: str, record: dict[str, Any]) -> None:
        self._write("confirmations", key, record)

    def _count(self, hit: bool) -> None:
        if hit:
            self.counters.hits += 1
        else:
            self.counters.misses += 1

    def stats(self) -> dict[str, Any]:
        """Entries and bytes on disk per kind."""
        result: dict[str, Any] = {"folder": str(self.folder)}
        for kind in (*_KINDS, "builds"):
            files = [p for p in (self.folder / kind).rglob("*") if p.is_file()]
            result[kind] = {"entries": len(files), "bytes": sum(p.stat().st_size for p in files)}
        return result

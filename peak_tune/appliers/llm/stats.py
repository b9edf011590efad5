"""Research records of the LLM applier (the paper's questions): per transformation,
model and position in the sequence, how often an application succeeds, how it fails,
how many attempts success takes, and the tokens spent.

Every call record is appended to `<cache>/llm-calls.jsonl` by the tuning session; one
application is the calls for one (parent variant, transformation, model).
"""

from __future__ import annotations

import csv
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .client import CallRecord

__all__ = ["JOURNAL", "append_records", "read_records", "summarize", "write_csv"]

JOURNAL = "llm-calls.jsonl"


def append_records(folder: Path, records: Iterable[CallRecord]) -> None:
    with (folder / JOURNAL).open("a") as handle:
        for record in records:
            handle.write(json.dumps(asdict(record), sort_keys=True) + "\n")


def read_records(folder: Path) -> list[CallRecord]:
    path = folder / JOURNAL
    if not path.is_file():
        return []
    return [CallRecord(**json.loads(line)) for line in path.read_text().splitlines() if line]


def summarize(records: Sequence[CallRecord]) -> list[dict[str, Any]]:
    """One row per (transformation, model, position)."""
    applications: dict[tuple[str, str, int, str], list[CallRecord]] = defaultdict(list)
    for r in records:
        applications[(r.transform_id, r.model, r.position, r.parent)].append(r)
    groups: dict[tuple[str, str, int], list[list[CallRecord]]] = defaultdict(list)
    for (tid, model, position, _), calls in applications.items():
        groups[(tid, model, position)].append(calls)
    rows = []
    for (tid, model, position), apps in sorted(groups.items()):
        succeeded = [calls for calls in apps if calls[-1].outcome == "ok"]
        failures = Counter(calls[-1].outcome for calls in apps if calls[-1].outcome != "ok")
        rows.append({
            "transformation": tid, "model": model, "position": position,
            "applications": len(apps), "succeeded": len(succeeded),
            "success_rate": len(succeeded) / len(apps),
            "mean_calls_to_success": (sum(len(c) for c in succeeded) / len(succeeded)
                                      if succeeded else None),
            "failures": dict(failures),
            "prompt_tokens": sum(r.prompt_tokens for calls in apps for r in calls),
            "completion_tokens": sum(r.completion_tokens for calls in apps for r in calls),
        })
    return rows


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["transformation"])
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "failures": json.dumps(row.get("failures", {}))})

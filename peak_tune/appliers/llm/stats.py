"""Research records of the LLM applier (the paper's questions): per transformation,
model and position in the sequence, how often an application succeeds, how it fails,
how many attempts success takes, which checks replies failed on the way (repaired or
not: which transformation texts need rewording for a model), and the tokens and
dollars spent.

Every call record is appended to `<cache>/llm-calls.jsonl` by the tuning session, with
the study's name; one application is the calls for one (parent variant, transformation,
model, sample). A cost is None (shown "unknown") when any of its calls had no price.
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

__all__ = ["CHECKS", "JOURNAL", "append_records", "dollars", "read_records", "summarize", "totals",
           "totals_by", "write_csv"]

JOURNAL = "llm-calls.jsonl"
# the outcomes of a reply that did not do what its step says (LLMApplier's checks);
# the rest (rate_limited, server_error, ...) are the endpoint's
CHECKS = ("no_code", "truncated", "scope", "unchanged", "missing_param", "dead_param",
          "bad_launch", "compile_error", "wrong_result")


def append_records(folder: Path, records: Iterable[CallRecord], study: str = "") -> None:
    with (folder / JOURNAL).open("a") as handle:
        for record in records:
            data = asdict(record)
            data["study"] = study or record.study
            handle.write(json.dumps(data, sort_keys=True) + "\n")


def read_records(folder: Path) -> list[CallRecord]:
    path = folder / JOURNAL
    if not path.is_file():
        return []
    return [CallRecord(**json.loads(line)) for line in path.read_text().splitlines() if line]


def summarize(records: Sequence[CallRecord]) -> list[dict[str, Any]]:
    """One row per (transformation, model, position)."""
    applications: dict[tuple[str, str, int, str, int], list[CallRecord]] = defaultdict(list)
    for r in records:
        applications[(r.transform_id, r.model, r.position, r.parent, r.sample)].append(r)
    groups: dict[tuple[str, str, int], list[list[CallRecord]]] = defaultdict(list)
    for (tid, model, position, _, _), calls in applications.items():
        groups[(tid, model, position)].append(calls)
    rows = []
    for (tid, model, position), apps in sorted(groups.items()):
        succeeded = [calls for calls in apps if calls[-1].outcome == "ok"]
        failures = Counter(calls[-1].outcome for calls in apps if calls[-1].outcome != "ok")
        checks = Counter(r.outcome for calls in apps for r in calls if r.outcome in CHECKS)
        repaired = sum(1 for calls in succeeded if any(r.outcome in CHECKS for r in calls))
        rows.append({
            "transformation": tid, "model": model, "position": position,
            "applications": len(apps), "succeeded": len(succeeded),
            "success_rate": len(succeeded) / len(apps),
            "mean_calls_to_success": (sum(len(c) for c in succeeded) / len(succeeded)
                                      if succeeded else None),
            "failures": dict(failures),
            "check_failures": dict(sorted(checks.items())),
            "repaired": repaired,
            **totals([r for calls in apps for r in calls]),
        })
    return rows


def totals(records: Sequence[CallRecord]) -> dict[str, Any]:
    """Calls, tokens and dollars (None when a call had no price) of some records."""
    costs = [r.cost_usd for r in records]
    return {
        "calls": len(records),
        "prompt_tokens": sum(r.prompt_tokens for r in records),
        "completion_tokens": sum(r.completion_tokens for r in records),
        "cost_usd": None if any(c is None for c in costs) else sum(c or 0.0 for c in costs),
    }


def totals_by(records: Sequence[CallRecord], field: str) -> dict[str, dict[str, Any]]:
    """`totals` per value of a record field ("transform_id", "study", "model")."""
    groups: dict[str, list[CallRecord]] = defaultdict(list)
    for r in records:
        groups[str(getattr(r, field))].append(r)
    return {name: totals(calls) for name, calls in sorted(groups.items())}


def dollars(cost: float | None) -> str:
    return "unknown" if cost is None else f"${cost:.4f}"


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["transformation"])
        writer.writeheader()
        for row in rows:
            cost = row.get("cost_usd")
            writer.writerow({**row, "failures": json.dumps(row.get("failures", {})),
                             "check_failures": json.dumps(row.get("check_failures", {})),
                             "cost_usd": "unknown" if cost is None else f"{cost:.6f}"})

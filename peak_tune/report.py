"""Progress while tuning, and the summary at the end (text and JSON)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any

import optuna
from rich.console import Console
from rich.table import Table

from peak_tune.backends.base import OVER_BUDGET
from peak_tune.core import Status
from peak_tune.tune import TrialRecord, TuneSession

__all__ = ["ProgressView", "summary", "print_summary"]

_STATUS_LABELS = {
    Status.OK: "ok",
    Status.INVALID: "invalid",
    Status.APPLY_ERROR: "apply error",
    Status.COMPILE_ERROR: "compile error",
    Status.WRONG_RESULT: "wrong result",
    Status.RUNTIME_ERROR: "crash",
    Status.TIMEOUT: "timeout",
}

_LABEL_BY_VALUE = {status.value: label for status, label in _STATUS_LABELS.items()}


class ProgressView:
    """One line per trial on stderr: trials done, best so far, percent of the vendor."""

    def __init__(self, session: TuneSession, total: int) -> None:
        self.session = session
        self.total = total
        self.done = 0
        self.console = Console(stderr=True, highlight=False)
        self.started = time.perf_counter()

    def __call__(self, record: TrialRecord) -> None:
        self.done += 1
        best = self.session.best_gflops()
        vendor = self.session.vendor_gflops()
        share = f" = {100 * best / vendor:5.1f}% of vendor" if vendor else ""
        what = (f"{record.gflops:8.2f} GFLOP/s" if record.status is Status.OK
                else _STATUS_LABELS[record.status])
        cached = " (cached)" if record.cached else ""
        steps = " > ".join(record.sequence) or "seed"
        self.console.print(
            f"[{self.done:>4}/{self.total}] trial {record.number:<4} {what:<18}{cached:<9} "
            f"best {best:8.2f} GFLOP/s{share}  | {steps}",
            soft_wrap=True,
        )


def _counts(study: optuna.Study) -> tuple[Counter[str], Counter[str], int]:
    """Trials by state, by outcome, and how many were stopped at the build budget."""
    states: Counter[str] = Counter()
    outcomes: Counter[str] = Counter({label: 0 for label in _STATUS_LABELS.values()})
    over_budget = 0
    for t in study.get_trials(deepcopy=False):
        states[t.state.name] += 1
        status = t.user_attrs.get("status")
        if status:
            outcomes[_LABEL_BY_VALUE.get(status, status)] += 1
        over_budget += str(t.user_attrs.get("message", "")).startswith(OVER_BUDGET)
    return states, outcomes, over_budget


def summary(session: TuneSession, seconds: float) -> dict[str, Any]:
    """The machine-readable summary (the `--json` line)."""
    best = session.best_trial()
    states, outcomes, over_budget = _counts(session.study)
    vendor_name = next(iter(session.vendor.values()))[0] if session.vendor else ""
    vendor_gflops = session.vendor_gflops()
    best_gflops = best.values[0] if best else 0.0
    counters = session.cache.counters
    return {
        "study": session.study.study_name,
        "storage": session.storage_url,
        "kernel": session.spec.name,
        "device": session.device.name,
        "backend": session.backend.name,
        "dtype": session.config.dtype,
        "sizes": [s.label() for s in session.sizes],
        "best": {
            "gflops": best_gflops,
            "sequence": best.user_attrs.get("sequence", []) if best else [],
            "params": best.user_attrs.get("params", {}) if best else {},
            "context_hash": best.user_attrs.get("context_hash", "") if best else "",
            "trial": best.number if best else None,
            "gflops_by_size": best.user_attrs.get("gflops", {}) if best else {},
        },
        "vendor": {
            "name": vendor_name,
            "gflops": vendor_gflops,
            "gflops_by_size": {k: m.gflops for k, (_, m) in session.vendor.items()},
        },
        "ratio": best_gflops / vendor_gflops if vendor_gflops else None,
        "trials": {
            # run to an end: trials enqueued but never started (a new study's first
            # trials per branch, the polisher's next neighbour) are not counted
            "total": states["COMPLETE"] + states["PRUNED"] + states["FAIL"],
            "complete": states["COMPLETE"],
            "pruned": states["PRUNED"],
            "failed": states["FAIL"],
            "by_outcome": dict(outcomes),
            "over_build_budget": over_budget,  # of the invalid ones (pruned)
        },
        "executor": {
            "name": session.executor.name,
            "evaluations_by_worker": dict(getattr(session.executor, "evaluations", {})),
        },
        "cache": {
            "hits": counters.hits,
            "misses": counters.misses,
            "compiles": counters.compiles,
        },
        "seconds": round(seconds, 3),
        **_llm_spend(session),
    }


def _llm_spend(session: TuneSession) -> dict[str, Any]:
    """This run's LLM calls, tokens and dollars (None: no price), in all and per
    transformation; nothing for an applier that makes no calls."""
    records = getattr(session.applier, "records", None)
    if records is None:
        return {}
    from peak_tune.appliers.llm.stats import totals, totals_by

    spend = totals(records)
    spend["tokens"] = spend["prompt_tokens"] + spend["completion_tokens"]
    spend["by_transformation"] = totals_by(records, "transform_id")
    return {"llm": spend}


def print_summary(data: dict[str, Any], to_stderr: bool) -> None:
    console = Console(stderr=to_stderr, highlight=False, file=sys.stderr if to_stderr else None)
    best, vendor = data["best"], data["vendor"]
    table = Table(title=f"peak-tune: {data['study']}", show_header=False, title_justify="left")
    table.add_row("best", f"{best['gflops']:.2f} GFLOP/s (trial {best['trial']})")
    table.add_row("sequence", " > ".join(best["sequence"]) or "(seed)")
    table.add_row("parameters", ", ".join(f"{k}={v}" for k, v in best["params"].items()) or "-")
    table.add_row("vendor", f"{vendor['gflops']:.2f} GFLOP/s ({vendor['name']}, this run)")
    ratio = data["ratio"]
    table.add_row("ratio", f"{ratio:.3f}x vendor" if ratio is not None else "-")
    trials = data["trials"]
    table.add_row("trials", f"{trials['total']} ({trials['complete']} complete, "
                  f"{trials['pruned']} pruned, {trials['failed']} failed)")
    outcomes = ", ".join(f"{k} {v}" for k, v in trials["by_outcome"].items())
    if trials["over_build_budget"]:
        outcomes += f" ({trials['over_build_budget']} of the invalid: over the build budget)"
    table.add_row("by outcome", outcomes)
    cache = data["cache"]
    table.add_row("cache", f"{cache['hits']} hits, {cache['misses']} misses, "
                  f"{cache['compiles']} compiles")
    if "llm" in data:
        llm = data["llm"]
        cost = "cost unknown" if llm["cost_usd"] is None else f"${llm['cost_usd']:.4f}"
        table.add_row("LLM", f"{llm['calls']} calls, {llm['prompt_tokens']} + "
                      f"{llm['completion_tokens']} tokens, {cost} (this run)")
    table.add_row("variant", best["context_hash"][:16] or "-")
    table.add_row("storage", data["storage"])
    table.add_row("time", f"{data['seconds']:.1f} s")
    console.print(table)

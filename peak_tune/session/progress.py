"""Progress while tuning (an Observer of the session), and the summary at the end (text
and JSON)."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import optuna
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from peak_tune.appliers.base import calls_of
from peak_tune.backends.base import OVER_BUDGET
from peak_tune.core import Status
from peak_tune.search.trials import TrialAttrs
from peak_tune.session.confirmation import CONFIRM_ROUNDS
from peak_tune.session.events import STATUS_LABELS, Event, NewBest, RunEnded, TrialFinished
from peak_tune.session.tune import TuneSession

__all__ = ["ProgressView", "summary", "print_summary"]

_LABEL_BY_VALUE = {status.value: label for status, label in STATUS_LABELS.items()}


class ProgressView:
    """What a person watches while a study runs (an Observer, session.events): at a
    terminal a live display of trials done of the target, the best so far, its share of
    the vendor and of the documented peak, trials per second and the time left, with a
    line for each new best; elsewhere (a pipe, a log, --json) one plain line per trial
    on stderr."""

    def __init__(self, total: int, live: bool = False, console: Console | None = None) -> None:
        self.total = total
        self.done = 0
        self.console = console or Console(stderr=True, highlight=False)
        self.live = live
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def notify(self, event: Event) -> None:
        if isinstance(event, TrialFinished):
            self.done += 1
            if self.live:
                self._advance(event)
            else:
                self.console.print(_trial_line(self.done, self.total, event), soft_wrap=True,
                                   highlight=False)
        elif isinstance(event, NewBest) and self.live:
            record = event.record
            self._print(f"new best: trial {record.number}, {record.gflops:.2f} GFLOP/s | "
                        f"{' > '.join(record.sequence) or 'seed'}")
        elif isinstance(event, RunEnded):
            self.close()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _print(self, text: str) -> None:
        console = self._progress.console if self._progress else self.console
        console.print(text, soft_wrap=True, highlight=False)

    def _advance(self, event: TrialFinished) -> None:
        if self._progress is None:
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(),
                MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                TextColumn("{task.fields[best]}"),
                console=self.console, transient=False)
            self._progress.start()
            self._task = self._progress.add_task("trials", total=self.total,
                                                 rate="", best="")
        assert self._task is not None
        task = self._progress.tasks[0]
        speed = (self.done / task.elapsed) if task.elapsed else 0.0
        self._progress.update(self._task, completed=self.done, rate=f"{speed:.2f}/s",
                              best=_best_text(event))


def _best_text(event: TrialFinished) -> str:
    """"best 12.3 GFLOP/s = 81.0% of vendor, 2.5% of peak"."""
    shares = []
    if event.denominator:
        shares.append(f"{100 * event.best_gflops / event.denominator:.1f}% of "
                      f"{event.against}")
    if event.peak_gflops and event.against != "peak":
        shares.append(f"{100 * event.best_gflops / event.peak_gflops:.1f}% of peak")
    return f"best {event.best_gflops:.2f} GFLOP/s" + (f" = {', '.join(shares)}"
                                                      if shares else "")


def _trial_line(done: int, total: int, event: TrialFinished) -> str:
    record = event.record
    share = (f" = {100 * event.best_gflops / event.denominator:5.1f}% of {event.against}"
             if event.denominator else "")
    what = (f"{record.gflops:8.2f} GFLOP/s" if record.status is Status.OK
            else STATUS_LABELS[record.status])
    cached = " (cached)" if record.cached else ""
    steps = " > ".join(record.sequence) or "seed"
    return (f"[{done:>4}/{total}] trial {record.number:<4} {what:<18}{cached:<9} "
            f"best {event.best_gflops:8.2f} GFLOP/s{share}  | {steps}")


def _counts(study: optuna.Study) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """Trials by state, by outcome, and by note: stopped at the build budget, noisy
    (their timing stayed spread after re-measuring), re-measured timings."""
    states: Counter[str] = Counter()
    outcomes: Counter[str] = Counter({label: 0 for label in STATUS_LABELS.values()})
    notes: Counter[str] = Counter({"over_budget": 0, "noisy": 0, "remeasured": 0})
    for t in study.get_trials(deepcopy=False):
        states[t.state.name] += 1
        attrs = TrialAttrs.of(t)
        if attrs.status:
            outcomes[_LABEL_BY_VALUE.get(attrs.status, attrs.status)] += 1
        notes["over_budget"] += attrs.message.startswith(OVER_BUDGET)
        notes["noisy"] += attrs.noisy
        notes["remeasured"] += attrs.remeasured
    return states, outcomes, notes


def _vendor(session: TuneSession) -> dict[str, Any]:
    """The vendor's figure and how stable it was, per size (harness.vendor)."""
    figures = session.vendors.figures
    names = [f.name for f in figures.values()]
    by_size = {label: f.stability(since=session.started_at) for label, f in figures.items()}
    return {
        "name": names[0] if names else "",
        "library": session.vendors.library,  # False: the device has none (see "peak")
        "why_none": session.vendors.no_library_because,
        "gflops": session.vendors.gflops(),
        "gflops_by_size": {k: m.gflops for k, (_, m) in session.vendors.chosen.items()},
        "timings": sum(s["timings"] for s in by_size.values()),
        "timings_this_run": sum(s["this_run"] for s in by_size.values()),
        "noisy": any(s["noisy"] for s in by_size.values()),
        "by_size": by_size,
    }


def _confirmation(session: TuneSession) -> dict[str, Any]:
    """The end-of-run re-timing of the best trial beside the vendor (confirm_best):
    "confirmed", "noisy" (flagged, not cached), "failed" (the best no longer validates)
    or "none" (nothing re-timed, `why`)."""
    confirmation = session.confirmation
    if confirmation is None:
        return {"status": "none", "why": session.confirmation_note}
    failure = confirmation.failure
    noisy = confirmation.noisy_because
    by_size = {label: {"status": c.status.value, "message": c.message,
                       "kernel_gflops": c.kernel_gflops, "vendor_gflops": c.vendor_gflops,
                       "kernel_samples_ms": [list(r) for r in c.kernel_ms],
                       "vendor_samples_ms": [list(r) for r in c.vendor_ms],
                       "noisy_because": c.noisy_because, "busy_cores": c.busy_cores,
                       "at": c.at}
               for label, c in confirmation.by_size.items()}
    data: dict[str, Any] = {
        "status": "failed" if failure else "noisy" if noisy else "confirmed",
        "why": (f"trial {confirmation.trial} failed its re-validation at {failure[0]}: "
                f"{failure[1].status.value}: {failure[1].message}" if failure else noisy),
        "source": confirmation.source, "trial": confirmation.trial, "rounds": CONFIRM_ROUNDS,
        "by_size": by_size,
    }
    if not failure:
        data.update(kernel_gflops=confirmation.kernel_gflops,
                    vendor_gflops=confirmation.vendor_gflops)
    return data


def summary(session: TuneSession, seconds: float) -> dict[str, Any]:
    """The machine-readable summary (the `--json` line). The best and the ratio are the
    end-of-run re-timing's where there is one (the search's best is `search_gflops`)."""
    best = session.searcher.best_trial()
    attrs = TrialAttrs.of(best) if best else TrialAttrs()
    states, outcomes, notes = _counts(session.study)
    vendor = _vendor(session)
    search_gflops = best.values[0] if best else 0.0
    confirmed = _confirmation(session)
    timed = confirmed["status"] in ("confirmed", "noisy")
    best_gflops = confirmed["kernel_gflops"] if timed else search_gflops
    # the vendor's figure (with the timings taken beside the re-timing), else the peak
    against, denominator = session.vendors.denominator()
    ratio = (None if confirmed["status"] == "failed" or not denominator or best is None
             else best_gflops / denominator)
    roof = session.vendors.roofline()
    peak = roof.gflops
    noisy = vendor["noisy"] or (confirmed["status"] == "noisy" if timed
                                else attrs.noisy)
    counters = session.cache.counters
    return {
        "study": session.study.study_name,
        "storage": session.storage_url,
        "kernel": session.spec.name,
        "device": session.device.name,
        "backend": session.backend.name,
        "dtype": session.config.target.dtype,
        "sizes": [s.label() for s in session.sizes],
        "best": {
            "gflops": best_gflops,
            "search_gflops": search_gflops,  # the study's value: the best of its trials
            "confirmed": timed,  # gflops is the end-of-run re-timing's
            "sequence": list(attrs.sequence),
            "params": attrs.params,
            "context_hash": attrs.context_hash,
            "trial": session.searcher.stored_number(best) if best else None,
            "gflops_by_size": attrs.gflops_by_size,
            "noisy": attrs.noisy,
        },
        "vendor": vendor,
        # what the device can reach on this kernel (catalog.roofline: the documented
        # peak, or the memory bandwidth's share where the kernel is bound by memory),
        # and the best's share of it
        "peak": {"gflops": peak, "ratio": best_gflops / peak if peak and best else None,
                 "bound": roof.bound, "documented_gflops": roof.peak_gflops},
        "confirmation": confirmed,
        # best over the vendor's figure, or over the documented peak where the device has
        # no vendor library (ratio_to says which); None when the best failed its
        # re-validation or there is neither
        "ratio": ratio,
        "ratio_to": against or None,
        "search_ratio": search_gflops / denominator if denominator and best else None,
        # the ratio rests on a noisy timing: the vendor's, or the re-timing's (else the
        # best trial's)
        "ratio_noisy": noisy,
        "trials": {
            # run to an end: trials enqueued but never started (a new study's first
            # trials per branch, the polisher's next neighbour) are not counted
            "total": states["COMPLETE"] + states["PRUNED"] + states["FAIL"],
            "complete": states["COMPLETE"],
            "pruned": states["PRUNED"],
            "failed": states["FAIL"],
            "by_outcome": dict(outcomes),
            "over_build_budget": notes["over_budget"],  # of the invalid ones (pruned)
            "noisy": notes["noisy"],  # of the complete ones: flagged, not cached
            "remeasured": notes["remeasured"],  # timings measured again for their spread
        },
        "executor": {
            "name": session.executor.name,
            "evaluations_by_worker": session.executor.evaluations_by_worker(),
        },
        "cache": {
            "hits": counters.hits,
            "misses": counters.misses,
            "compiles": counters.compiles,
        },
        "seconds": round(seconds, 3),
        # where the trial loop's time went: the devices' busy share, the window's jobs by
        # stage, the builds, the driver's own seconds (TuneSession.time_report)
        "time": session.time_report(),
        "this_run": session.ledger.as_json(),  # heard from the run's events
        **_llm_spend(session),
    }


def _llm_spend(session: TuneSession) -> dict[str, Any]:
    """This run's LLM calls, tokens and dollars (None: no price), in all and per
    transformation; nothing for an applier that makes no calls."""
    records = calls_of(session.applier)
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
    table.add_row("best", _best_line(best, data["confirmation"]))
    table.add_row("sequence", " > ".join(best["sequence"]) or "(seed)")
    table.add_row("parameters", ", ".join(f"{k}={v}" for k, v in best["params"].items()) or "-")
    if vendor.get("library", True):
        table.add_row("vendor", f"{vendor['gflops']:.2f} GFLOP/s ({vendor['name']})")
    else:
        table.add_row("vendor", f"none on this device ({vendor['why_none']})")
    if data["peak"]["gflops"]:
        share = data["peak"]["ratio"]
        table.add_row("peak", _peak_words(data["peak"])
                      + (f"; the best is {100 * share:.1f}% of it" if share else ""))
    for label, stability in vendor.get("by_size", {}).items():
        table.add_row(f"vendor {label}", _stability_line(stability))
    table.add_row("re-timing", _confirmation_line(data["confirmation"]))
    table.add_row("ratio", _ratio_line(data))
    trials = data["trials"]
    table.add_row("trials", f"{trials['total']} ({trials['complete']} complete, "
                  f"{trials['pruned']} pruned, {trials['failed']} failed)")
    outcomes = ", ".join(f"{k} {v}" for k, v in trials["by_outcome"].items())
    if trials["over_build_budget"]:
        outcomes += f" ({trials['over_build_budget']} of the invalid: over the build budget)"
    table.add_row("by outcome", outcomes)
    if trials.get("noisy") or trials.get("remeasured"):
        table.add_row("noise", f"{trials['noisy']} trials noisy (flagged, not cached), "
                      f"{trials['remeasured']} timings measured again for their spread")
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
    if data["time"].get("mean_jobs"):
        table.add_row("where it went", _where_time_went_line(data["time"]))
    console.print(table)


def _where_time_went_line(time: dict[str, Any]) -> str:
    """The trial loop's time in one line: how busy each device was, where the window's
    jobs sat on average, the builds, and the driver's own seconds."""
    busy = ", ".join(f"{name} {100 * share:.0f}%"
                     for name, share in time["device_busy_fraction"].items())
    jobs = time["mean_jobs"]
    builds = time.get("builds") or {}
    built = (f"; {builds['count']} builds, median {builds['median_s']:.2f} s"
             if builds else "")
    loop = time["driver_loop_s"]
    return (f"device busy (by worker): {busy} of {time['run_s']:.1f} s; trials in flight "
            f"at most {time['in_flight']}, on average {jobs['building']:.1f} building, "
            f"{jobs['build_queue']:.1f} waiting for a build worker, "
            f"{jobs['device_queue']:.1f} for a device, {jobs['on_device']:.1f} on one"
            f"{built}; the driver asked for {loop['asking']:.1f} s, told "
            f"{loop['telling']:.1f} s")


def _best_line(best: dict[str, Any], confirmation: dict[str, Any]) -> str:
    status = confirmation["status"]
    if best["trial"] is None:
        return "- (no finished trial)"
    if status in ("confirmed", "noisy"):
        return (f"{best['gflops']:.2f} GFLOP/s (trial {best['trial']}, the end-of-run "
                f"re-timing{', noisy' if status == 'noisy' else ''}; the search timed "
                f"{best['search_gflops']:.2f})")
    noisy = ", noisy: its timing stayed spread" if best.get("noisy") else ""
    failed = ", FAILED its re-validation" if status == "failed" else ", not re-timed"
    return f"{best['gflops']:.2f} GFLOP/s (trial {best['trial']}, the search's{noisy}{failed})"


def _confirmation_line(confirmation: dict[str, Any]) -> str:
    """The end-of-run re-timing in one line."""
    status = confirmation["status"]
    if status == "none":
        return confirmation["why"] or "-"
    if status == "failed":
        return f"FAILED: {confirmation['why']} (marked in the study)"
    source = {"timed": "timed now", "study": "from the study",
              "cache": "from the cache"}[confirmation["source"]]
    if confirmation["vendor_gflops"]:
        line = (f"kernel {confirmation['kernel_gflops']:.2f} / vendor "
                f"{confirmation['vendor_gflops']:.2f} GFLOP/s, {confirmation['rounds']} rounds "
                f"of each, interleaved, the vendor's joining its figure ({source})")
    else:
        line = (f"kernel {confirmation['kernel_gflops']:.2f} GFLOP/s, "
                f"{confirmation['rounds']} rounds, no vendor beside it ({source})")
    return line + (f" (NOISY, not cached: {confirmation['why']})" if status == "noisy" else "")


def _peak_words(peak: dict[str, Any]) -> str:
    """"67000 GFLOP/s documented", or the roofline's memory-bound share of it."""
    if peak.get("bound") in ("memory", "mixed"):
        where = "at its sizes" if peak["bound"] == "memory" else "at some of its sizes"
        return (f"{peak['gflops']:.0f} GFLOP/s: the kernel is bound by memory bandwidth "
                f"{where} (documented compute peak {peak['documented_gflops']:.0f})")
    return f"{peak['gflops']:.0f} GFLOP/s documented"


def _ratio_line(data: dict[str, Any]) -> str:
    ratio, status = data["ratio"], data["confirmation"]["status"]
    if ratio is None:
        return ("- (the best trial failed its re-validation)" if status == "failed"
                else "- (no finished trial)" if data["best"]["trial"] is None else "-")
    against = ("vendor" if data.get("ratio_to", "vendor") == "vendor" else "roofline"
               if data.get("peak", {}).get("bound") in ("memory", "mixed") else "documented peak")
    if status in ("confirmed", "noisy"):
        noisy = ", noisy" if data.get("ratio_noisy") else ""
        return f"{ratio:.3f}x {against} (the best's end-of-run re-timing{noisy})"
    noisy = ", noisy: see the vendor's timings and the best trial" if data.get(
        "ratio_noisy") else ""
    return f"{ratio:.3f}x {against} (the search's best, not re-timed{noisy})"


def _stability_line(stability: dict[str, Any]) -> str:
    """How stable the vendor was at one size, in one line."""
    noisy = stability["noisy_timings"]
    return (f"median of {stability['timings']} timings ({stability['this_run']} this run"
            f"{f', {noisy} noisy' if noisy else ''}): min {stability['min_gflops']:.2f} / "
            f"median {stability['median_gflops']:.2f} / max {stability['max_gflops']:.2f} "
            f"GFLOP/s, spread {100 * stability['spread']:.1f}% between timings"
            f"{f' (NOISY: {why})' if (why := stability['noisy_because']) else ''}")

"""The batch's combined progress view (one line per study) and its final summary."""

from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from peak_tune.batch.run import DONE, FAILED, RUNNING, STOPPED, BatchRun, StudyProgress

__all__ = ["BatchView", "batch_json", "print_batch_summary"]

_STYLE = {DONE: "green", FAILED: "red", STOPPED: "yellow", RUNNING: "cyan"}


def _ratio(item: StudyProgress) -> str:
    if item.ratio is None:
        return "-"
    return f"{item.ratio:.3f}x" + (" of peak" if not item.vendor_gflops else "")


def study_table(batch: BatchRun, final: bool) -> Table:
    title = f"peak-tune batch: {escape(str(batch.plan.path))}"
    title += "" if final else " (Ctrl-C stops)"
    table = Table(title=title, title_justify="left")
    for name in ("study", "state", "trials", "best GFLOP/s", "vendor GFLOP/s", "ratio"):
        table.add_column(name, justify="left" if name in ("study", "state") else "right")
    if final:
        for name in ("new", "compiles", "cache hits", "time"):
            table.add_column(name, justify="right")
    table.add_column("note")
    for item in batch.items:
        cache = (item.summary or {}).get("cache", {})
        row = [item.study.name, f"[{_STYLE.get(item.state, '')}]{item.state}",
               f"{item.done}/{item.study.trials}", f"{item.best_gflops:.2f}",
               f"{item.vendor_gflops:.2f}" if item.vendor_gflops else "-", _ratio(item)]
        if final:
            row += [str(item.new), str(cache.get("compiles", "-")),
                    str(cache.get("hits", "-")), f"{item.seconds:.1f} s"]
        table.add_row(*row, escape(item.reason))  # reasons hold [extras], not markup
    return table


class BatchView:
    """On a terminal, a live table refreshed on every trial; elsewhere (logs, pipes),
    one line each time a study changes state."""

    def __init__(self, batch: BatchRun) -> None:
        self.batch = batch
        self.console = Console(stderr=True, highlight=False)
        self._live: Live | None = None
        self._states: dict[str, str] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> BatchView:
        if self.console.is_terminal:
            self._live = Live(study_table(self.batch, final=False), console=self.console,
                              refresh_per_second=4, transient=True)
            self._live.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._live is not None:
            self._live.stop()

    def changed(self, item: StudyProgress) -> None:
        with self._lock:
            if self._live is not None:
                self._live.update(study_table(self.batch, final=False))
            elif self._states.get(item.study.name) != item.state:
                self._states[item.study.name] = item.state
                self.console.print(self._line(item), soft_wrap=True)

    def _line(self, item: StudyProgress) -> str:
        position = self.batch.items.index(item) + 1
        text = (f"[{position}/{len(self.batch.items)}] {item.study.name}: {item.state}, "
                f"{item.done}/{item.study.trials} trials")
        if item.state in (DONE, STOPPED):
            text += f", best {item.best_gflops:.2f} GFLOP/s ({_ratio(item)} vendor)"
        return escape(text + (f": {item.reason}" if item.reason else ""))


def batch_json(batch: BatchRun, seconds: float) -> dict[str, Any]:
    """The `--json` line: every study's summary, its state and why it failed."""
    return {
        "batch": str(batch.plan.path),
        "storage": batch.storage_url,
        "studies": [item.as_json() for item in batch.items],
        "failed": len(batch.failed),
        "interrupted": batch.interrupted,
        "seconds": round(seconds, 3),
    }


def print_batch_summary(batch: BatchRun, to_stderr: bool) -> None:
    stream = sys.stderr if to_stderr else sys.stdout
    # Logs and pipes get wide lines rather than study names folded over several.
    console = Console(highlight=False, file=stream, width=None if stream.isatty() else 200)
    console.print(study_table(batch, final=True))
    console.print(f"storage {batch.storage_url}")

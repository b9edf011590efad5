"""The suite's one expensive step, shared by its tests: every kernel through the CLI once
per session (one batch, plus a tuner per `alone` kernel), and a table of what each got
in the terminal summary. Processes the kernels leave behind record their pids in a
folder; whatever of them is still running at the end is killed, by pid."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adversarial.cases import ALL, Case
from tests.adversarial.runner import Outcome, build_catalog, run_alone, run_batch

_SEEN: dict[str, tuple[Case, Outcome]] = {}


def leftover_pids(mark_dir: Path) -> list[int]:
    """Pids the kernels recorded whose process is still alive (not a zombie). A mark is
    named `<kernel>.<pid>.pid` by the process itself: the name holds the pid from the
    moment the file exists, while its text may not be written yet (a loaded machine)."""
    alive = []
    for mark in sorted(mark_dir.glob("*.pid")):
        pid = int(mark.name.split(".")[-2])
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


@pytest.fixture(scope="session")
def mark_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("adversarial-pids")
    yield folder
    for pid in leftover_pids(folder):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture(scope="session")
def outcomes(tmp_path_factory: pytest.TempPathFactory, mark_dir: Path) -> dict[str, Outcome]:
    """Case name -> what the CLI made of its seed trial."""
    work = tmp_path_factory.mktemp("adversarial")
    catalog = build_catalog(work / "catalog", ALL, mark_dir)
    together = [c for c in ALL if not c.alone]
    found = run_batch(together, catalog, work / "batch")
    for case in (c for c in ALL if c.alone):
        found[case.name] = run_alone(case, catalog, work / case.name)
    _SEEN.update({c.name: (c, found[c.name]) for c in ALL})
    return found


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _SEEN:
        return
    write = terminalreporter.write_line
    write("")
    write("adversarial kernels (expected -> what the CLI reported):")
    for case, outcome in _SEEN.values():
        write(f"  {case.name:28} {case.threat:10} {case.expect:8} -> {outcome.describe()}")

"""Cheating kernels, each run through the CLI as a user's own seed, end rejected (or, for
a cheat a sound harness neutralises, no faster than honest work); correct kernels end
accepted at a plausible speed; a daemon a kernel starts does not outlive the tuner.
The whole suite is one `peak-tune batch` (conftest.outcomes): 2-3 minutes on 2 cores."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.adversarial.cases import CHEATS, CORRECT, NO_GAIN, NO_GAIN_FACTOR, REJECT, Case
from tests.adversarial.conftest import leftover_pids
from tests.adversarial.runner import Outcome

# a speed no honest kernel on this host reaches: 64 fp32 flops per cycle per core at 5 GHz
PEAK_BOUND_GFLOPS = 64 * 5.0 * (os.cpu_count() or 1)
SLOWEST_GFLOPS = 0.01


def _ids(cases: tuple[Case, ...]) -> list[str]:
    return [c.name for c in cases]


@pytest.mark.parametrize("case", CHEATS, ids=_ids(CHEATS))
def test_cheat_gets_no_accepted_speed(case: Case, outcomes: dict[str, Outcome]) -> None:
    got = outcomes[case.name]
    if case.expect == REJECT:
        assert got.rejected, f"{case.name} ({case.threat}) was not rejected: {got.describe()}"
        return
    assert case.expect == NO_GAIN
    # the fastest correct kernel of the same run: one study's timing is noisy on a busy
    # host, and a cheat that works gains far more than the correct kernels differ
    honest = max(outcomes[c.name].gflops for c in CORRECT)
    assert got.rejected or (got.outcome == "ok" and got.gflops <= NO_GAIN_FACTOR * honest), (
        f"{case.name} ({case.threat}) gained: {got.describe()}, the fastest correct kernel "
        f"{honest:.2f} GFLOP/s")


@pytest.mark.parametrize("case", CORRECT, ids=_ids(CORRECT))
def test_correct_kernel_is_accepted(case: Case, outcomes: dict[str, Outcome]) -> None:
    got = outcomes[case.name]
    assert got.outcome == "ok", f"{case.name} is correct but got: {got.describe()}"
    assert SLOWEST_GFLOPS < got.gflops < PEAK_BOUND_GFLOPS, got.describe()


@pytest.mark.parametrize("name", ["fork_daemon", "escaped_helper_precompute"])
def test_nothing_a_kernel_starts_outlives_the_tuner(
    name: str, outcomes: dict[str, Outcome], mark_dir: Path
) -> None:
    assert name in outcomes  # its tuner has exited
    marks = list(mark_dir.glob(f"{name}.*.pid")) + list(
        mark_dir.glob(f"{name.split('_precompute')[0]}.*.pid"))
    if not marks:  # killed before it could write its pid: the harness was quicker
        assert outcomes[name].rejected, f"{name} recorded no process and was accepted"
        return
    deadline = time.monotonic() + 2.0
    while leftover_pids(mark_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [p for p in leftover_pids(mark_dir)
             if any(m.read_text().split()[0] == str(p) for m in marks)]
    assert not alive, f"{name}: process(es) {alive} still running after the tuner exited"

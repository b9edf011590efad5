"""The Observer seam (peak_tune.session.events): what a session tells those who watch
it, and the progress view a person reads, plain and live."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from peak_tune.core import Status
from peak_tune.search.trials import TrialRecord
from peak_tune.session.config import TuneConfig
from peak_tune.session.events import (
    Event,
    NewBest,
    Observers,
    RunEnded,
    TrialFinished,
    VendorMeasured,
)
from peak_tune.session.progress import ProgressView
from peak_tune.session.tune import open_session
from tests.search.test_search_replay import RECORDING, SPACE


class Heard:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def notify(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]


def test_a_run_tells_every_trial_each_new_best_the_vendor_and_its_end(tmp_path: Path) -> None:
    session = open_session(TuneConfig.of(sizes=({"M": 96, "N": 96, "K": 96},), results=tmp_path,
                                         only=SPACE, replay=RECORDING, seed=1))
    heard = Heard()
    session.subscribe(heard)
    try:
        session.measure_vendor()
        session.run(15)
    finally:
        session.close()
    finished = heard.of(TrialFinished)
    assert [e.record.number for e in finished] == [t.number for t in session.study.trials
                                                   if t.state.is_finished()]
    assert len(finished) == 15
    assert heard.of(VendorMeasured) and heard.of(VendorMeasured)[0].reason == "start"
    bests = [e.record.gflops for e in heard.of(NewBest)]
    assert bests == sorted(set(bests)) and bests[-1] == session.searcher.best_gflops()
    assert all(e.against == "vendor" and e.denominator > 0 for e in finished)
    [end] = heard.of(RunEnded)
    assert end == RunEnded(15, stopped=False) and heard.events[-1] is end


def test_trials_are_shown_and_summed_up_by_their_stored_numbers(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """Where the storage numbers a trial otherwise than the working study (trials stored
    as they finish, other drivers' in between: the study mirror's test), the run speaks
    of it by the stored number, the dashboard's: in each trial's line, the summary's best
    and the sanitizer's rejections (which a resumed run reads)."""
    from peak_tune.session.progress import summary

    session = open_session(TuneConfig.of(sizes=({"M": 96, "N": 96, "K": 96},), results=tmp_path,
                                         only=SPACE, replay=RECORDING, seed=1))
    monkeypatch.setattr(session.searcher.mirror, "stored_number", lambda number: number + 100)
    heard = Heard()
    session.subscribe(heard)
    try:
        session.measure_vendor()
        session.run(8)
        best = session.searcher.best_trial()
        assert best is not None
        assert [e.record.number for e in heard.of(TrialFinished)] == [
            t.number + 100 for t in session.study.trials if t.state.is_finished()]
        assert summary(session, 1.0)["best"]["trial"] == best.number + 100
        session.searcher.reject(best.number)
        assert session.study.user_attrs["sanitizer_rejected"] == [best.number + 100]
        after = session.searcher.best_trial()
        assert after is not None and after.number != best.number  # no longer counted
    finally:
        session.close()


def test_an_observer_that_fails_is_logged_and_the_others_still_hear() -> None:
    class Broken:
        def notify(self, event: Event) -> None:
            raise RuntimeError("a view with a bug")

    observers, heard = Observers(), Heard()
    observers.subscribe(Broken())
    observers.subscribe(heard)
    observers.notify(RunEnded(0, stopped=True))
    assert heard.events == [RunEnded(0, stopped=True)]


def _finished(number: int, gflops: float, best: float) -> TrialFinished:
    record = TrialRecord(number, Status.OK, ("loop-interchange",), {}, gflops, "", False, 0.1)
    return TrialFinished(record, best, "vendor", 20.0, 400.0)


def test_off_a_terminal_each_trial_is_one_plain_line() -> None:
    out = io.StringIO()
    view = ProgressView(3, console=Console(file=out, width=200))
    for n, gflops in enumerate((5.0, 10.0, 8.0)):
        view.notify(_finished(n, gflops, max(5.0, 10.0 if n else 5.0)))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[1].startswith("[   2/3] trial 1") and "50.0% of vendor" in lines[1]


def test_at_a_terminal_the_live_display_shows_the_target_best_shares_and_time_left() -> None:
    out = io.StringIO()
    view = ProgressView(4, live=True, console=Console(file=out, width=200,
                                                      force_terminal=True))
    view.notify(_finished(0, 10.0, 10.0))
    view.notify(NewBest(_finished(1, 16.0, 16.0).record))
    view.notify(_finished(1, 16.0, 16.0))
    view.notify(RunEnded(2, stopped=True))
    shown = out.getvalue()
    assert "2/4" in shown and "left" in shown and "/s" in shown
    assert "best 16.00 GFLOP/s = 80.0% of vendor, 4.0% of peak" in shown
    assert "new best: trial 1, 16.00 GFLOP/s | loop-interchange" in shown
    assert "[   1/4]" not in shown  # no plain lines at a terminal


def test_the_ledger_hears_what_a_run_did_and_why_it_stopped() -> None:
    """The summary's `this_run` is the RunLedger's: trials by outcome, cache answers, new
    bests, vendor timings, and a budget that stopped the run."""
    from peak_tune.core import Status
    from peak_tune.search.trials import TrialRecord
    from peak_tune.session.events import (
        BudgetSpent,
        NewBest,
        RunEnded,
        RunLedger,
        TrialFinished,
        VendorMeasured,
    )

    def record(number: int, status: Status, cached: bool = False) -> TrialRecord:
        return TrialRecord(number, status, ("loop-interchange",), {}, 1.0 * number, "",
                           cached, 0.1)

    ledger = RunLedger()
    for event in (VendorMeasured("64x64x64", "numpy", 50.0, "start", False),
                  TrialFinished(record(0, Status.OK), 0.0, "vendor", 50.0, 0.0),
                  NewBest(record(0, Status.OK)),
                  TrialFinished(record(1, Status.WRONG_RESULT, cached=True), 0.0, "vendor",
                                50.0, 0.0),
                  BudgetSpent("the token budget (1000) is spent"), RunEnded(2, True)):
        ledger.notify(event)
    assert ledger.as_json() == {
        "trials": 2, "by_outcome": {"ok": 1, "wrong result": 1}, "cached": 1,
        "new_bests": 1, "vendor_timings": 1, "stopped": True,
        "budget_spent": "the token budget (1000) is spent"}

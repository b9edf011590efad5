"""The study's best trial, kept up to date as trials finish instead of ranked anew.

The driver asks for the best after every trial it shows (the progress line, a new-best
event) and for every job it hands out (the slow cutoff). Ranking the whole study each
time made the driver's cost per trial grow with the study: at 4000 trials a sort of every
completed trial, thousands of times a minute. A study's trials only ever grow in number
and a finished trial never changes, so BestSoFar looks at each finished trial once: it
rescans only from the oldest trial still running (a window's worth of trials).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from optuna.trial import FrozenTrial, TrialState

__all__ = ["BestSoFar"]


class BestSoFar:
    """The fastest completed trial with a value whose stored number is not rejected;
    among equals the lowest number (as a stable ranking by speed gives)."""

    def __init__(self) -> None:
        self._settled = 0  # trials below this number are finished and were looked at
        self._best: FrozenTrial | None = None
        self._rejected: frozenset[int] = frozenset()

    def of(self, trials: Sequence[FrozenTrial], rejected: frozenset[int],
           stored_number: Callable[[int], int]) -> FrozenTrial | None:
        """The best of `trials` (the study's, trial n at index n), without those whose
        stored number is in `rejected`; a newly rejected one makes it look at all again."""
        if rejected != self._rejected:
            self._settled, self._best, self._rejected = 0, None, rejected
        settled = True
        for trial in trials[self._settled:]:
            if trial.state == TrialState.COMPLETE and trial.values and (
                    stored_number(trial.number) not in rejected) and self._beats(trial):
                self._best = trial
            if settled and trial.state.is_finished():
                self._settled = trial.number + 1
            else:
                settled = False
        return self._best

    def _beats(self, trial: FrozenTrial) -> bool:
        best = self._best
        return best is None or trial.values[0] > best.values[0] or (
            trial.values[0] == best.values[0] and trial.number < best.number)

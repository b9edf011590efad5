"""The study's best, kept up to date as trials finish (search.best): always the first of
a full ranking by speed, whatever order the trials finish in, and cheap at every call."""

from __future__ import annotations

import random

import optuna
from optuna.trial import FrozenTrial, TrialState

from peak_tune.search.best import BestSoFar


def ranked_first(trials: list[FrozenTrial], rejected: frozenset[int]) -> FrozenTrial | None:
    """What Searcher.ranked_trials()[0] gives: a stable sort of the completed ones."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.values
            and t.number not in rejected]
    ranked = sorted(done, key=lambda t: -t.values[0])
    return ranked[0] if ranked else None


def test_the_best_follows_trials_finishing_out_of_order_ties_and_rejections():
    rng = random.Random(7)
    study = optuna.create_study(direction="maximize")
    best = BestSoFar()
    running: list[optuna.Trial] = []
    rejected: frozenset[int] = frozenset()
    for step in range(600):
        running.append(study.ask())
        if len(running) > 12 or rng.random() < 0.4:  # a window of trials in flight
            trial = running.pop(rng.randrange(len(running)))  # any of them finishes
            outcome = rng.random()
            if outcome < 0.6:
                study.tell(trial, float(rng.choice(range(4))))  # many ties
            elif outcome < 0.8:
                study.tell(trial, state=TrialState.PRUNED)
            else:
                study.tell(trial, state=TrialState.FAIL)
        if step % 97 == 96:  # the sanitizer rejects the best so far
            current = ranked_first(study.get_trials(deepcopy=False), rejected)
            if current is not None:
                rejected = rejected | {current.number}
        trials = study.get_trials(deepcopy=False)
        expected = ranked_first(trials, rejected)
        got = best.of(trials, rejected, lambda number: number)
        assert (got and got.number) == (expected and expected.number), step


def test_it_looks_again_only_at_trials_not_yet_settled():
    """Trials before the oldest one still running are looked at once: a study of
    thousands of finished trials costs a call only its unfinished tail."""
    study = optuna.create_study(direction="maximize")
    for value in range(3000):
        study.add_trial(optuna.trial.create_trial(value=float(value % 50)))
    still_running = study.ask()
    study.add_trial(optuna.trial.create_trial(value=49.0))
    looked: list[int] = []
    best = BestSoFar()

    def stored_number(number: int) -> int:
        looked.append(number)
        return number

    assert best.of(study.get_trials(deepcopy=False), frozenset(), stored_number).number == 49
    looked.clear()
    assert best.of(study.get_trials(deepcopy=False), frozenset(), stored_number).number == 49
    assert looked == [3001]  # the running trial's successor, not the 3000 before it
    study.tell(still_running, 99.0)
    assert best.of(study.get_trials(deepcopy=False), frozenset(),
                   stored_number).number == still_running.number
    # a rejection makes it look at everything again
    assert best.of(study.get_trials(deepcopy=False), frozenset({still_running.number}),
                   lambda n: n).number == 49

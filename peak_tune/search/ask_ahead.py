"""TPE's asks drawn in a process of its own, a few trials ahead of the driver.

Sampling was most of the driver's work: about 60 ms an ask with the history window full
and the CUDA catalog's ~15 parameter groups, spent between trials (155 of 262 s of a 4096
fp32 study's loop on the H200), holding the interpreter lock the applier thread needs as
well. Drawn ahead, asking took 18 of 246 s of the same study, and a 4096 fp16 study went
from 13.9 to 15.2 trials/s (benchmarks/results, search-15 to -17; fp32's rate is bound by
its NVRTC builds either way).

A sampler process keeps its own in-memory copy of the study and answers each request
with the relative parameters of a new trial (the sequence choice and the values of its
steps, as the driver's sampler would draw them); the driver enqueues them as the trial's
fixed parameters, so its own ask only creates the trial. A value outside them (a
parameter seen for the first time) the driver still samples itself.

The process keeps `depth` draws ready and learns every finished trial as the driver
tells it (the driver's own trials, the polisher's neighbours, other drivers' pulled
trials). The draws handed out and not yet told stay RUNNING in its study, so TPE's
constant liar keeps new points away from them as it does from running trials in the
driver. A draw is made up to `depth` asks before the driver uses it, and the order of
what the process learns depends on when trials finish: used only where trials are told
as they finish, which is not repeatable anyway.

If the process fails, the driver logs it once and samples in its own thread again.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import optuna
from optuna.storages import InMemoryStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from peak_tune.search.focus import ParamRoles
from peak_tune.search.samplers import make_sampler
from peak_tune.study.piped_child import PipedChild, child_pipes

__all__ = ["ASK_AHEAD", "ASK_AHEAD_MIN_CORES", "AskAhead", "Draw"]

log = logging.getLogger(__name__)

ASK_AHEAD = 2  # the default depth: a draw ready at every ask, each a little stale
# On 2 cores the process competes with the driver and the study writer for a core: a
# study with an instant device ran 17.7 trials/s drawing ahead, 22.9 drawing in the
# driver (benchmarks/results/2026-11-30-cpu-driver-ahead.json)
ASK_AHEAD_MIN_CORES = 4


@dataclass(frozen=True)
class Draw:
    """One trial's parameters drawn by the sampler process; `ticket` names the trial in
    its study (told back with the result)."""

    ticket: int
    params: dict[str, Any]


class AskAhead:
    """The sampler process of one study: `sampler` (a name of `make_sampler`) seeded with
    `seed`, knowing the parameter `roles` (the sequence encoding; pickled), started with
    the `finished` trials."""

    def __init__(self, sampler: str, seed: int | None, roles: ParamRoles | None,
                 directions: Sequence[StudyDirection], finished: Sequence[FrozenTrial],
                 depth: int) -> None:
        if depth < 1:
            raise ValueError("depth must be 1 or more")
        self.depth = depth
        self.failure = ""  # why the process stopped answering; then draw() gives None
        self._ready: deque[Draw] = deque()
        self._counts: deque[int] = deque()
        self._child = PipedChild("peak_tune.search.ask_ahead", "sampler-feed")
        self._child.send("open", (sampler, seed, roles, list(directions)))
        for trial in finished:
            self._child.send("told", (None, trial))
        for _ in range(depth):
            self._child.send("ask")

    def draw(self) -> Draw | None:
        """The next ready draw (waiting for one), and a new one requested in its place;
        None once the process has failed."""
        while not self._ready and not self.failure:
            self._take_reply()
        if self.failure:
            return None
        self._child.send("ask")
        return self._ready.popleft()

    def told(self, ticket: int | None, trial: FrozenTrial) -> None:
        """A finished trial of the study: the one drawn as `ticket`, or (None) one the
        process did not draw."""
        if self.failure or (ticket is None and trial.state == TrialState.FAIL):
            return  # TPE leaves failed trials out; a drawn one must end its liar
        self._child.send("told", (ticket, trial))

    def finished_count(self) -> int:
        """How many finished trials the process's study holds, once it has taken in all
        told so far (for checks; -1 after a failure)."""
        self._child.send("count")
        while not self._counts and not self.failure:
            self._take_reply()
        return self._counts.popleft() if self._counts else -1

    def close(self) -> None:
        self._child.close()

    def _take_reply(self) -> None:
        """Wait for the process's next reply and take it in."""
        try:
            kind, payload = self._child.receive()
        except (EOFError, OSError):
            code = self._child.wait()
            self._fail(f"could not send it a {self._child.send_error}" if self._child.send_error
                       else f"it ended (exit code {code})")
            return
        if kind == "drawn":
            self._ready.append(Draw(*payload))
        elif kind == "count":
            self._counts.append(int(payload))
        elif kind == "failed":
            self._fail(str(payload))

    def _fail(self, why: str) -> None:
        self.failure = why
        log.warning("the sampler process stopped (%s); sampling in the driver from now on",
                    why)


def _serve(inbox: Connection, outbox: Connection) -> None:
    """The sampler process: draws on request, finished trials taken in, in the order the
    driver sent them, until the driver's end of the pipe goes away."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _, (name, seed, roles, directions) = inbox.recv()
    storage = InMemoryStorage()
    study = optuna.create_study(storage=storage, directions=directions,
                                sampler=make_sampler(name, seed, roles))
    drawn: dict[int, optuna.Trial] = {}  # handed out, not yet told back
    while True:
        try:
            kind, payload = inbox.recv()
        except EOFError:
            return
        try:
            if kind == "told":
                _take_in(study, storage, drawn, *payload)
            elif kind == "ask":
                trial = study.ask()
                drawn[trial.number] = trial
                outbox.send(("drawn", (trial.number, dict(trial.relative_params))))
            elif kind == "count":
                outbox.send(("count", sum(t.state.is_finished() for t in study.get_trials(
                    deepcopy=False))))
        except OSError:  # the driver closed its end while a draw was on its way: done
            return
        except Exception as error:  # reported; the driver samples on its own from then on
            with contextlib.suppress(OSError):
                outbox.send(("failed", f"{type(error).__name__}: {error}"[:500]))
            return


def _take_in(study: optuna.Study, storage: InMemoryStorage, drawn: dict[int, optuna.Trial],
             ticket: int | None, told: FrozenTrial) -> None:
    """Finish the drawn trial `ticket` as `told` finished in the driver (its parameters
    are the driver's: the draw's and any it sampled itself), or add `told` as it is."""
    trial = drawn.pop(ticket, None) if ticket is not None else None
    if trial is None:
        study.add_trial(told)
        return
    for name, distribution in told.distributions.items():
        storage.set_trial_param(trial._trial_id, name,
                                distribution.to_internal_repr(told.params[name]), distribution)
    for step, value in told.intermediate_values.items():
        storage.set_trial_intermediate_value(trial._trial_id, step, value)
    if told.state == TrialState.COMPLETE:
        study.tell(trial, told.values)
    else:
        study.tell(trial, state=told.state)


if __name__ == "__main__":  # python -m peak_tune.search.ask_ahead IN OUT
    _serve(*child_pipes(sys.argv))

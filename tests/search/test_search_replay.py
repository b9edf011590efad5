"""Search logic against a replay of real recorded outcomes: fast and exact.

The recording (tests/fixtures/replay/matmul-c-small.json) holds every legal point of a
four-transformation space of the C matmul at 96x96x96, measured by the real C backend
(benchmarks/record_space.py made it).
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import optuna
import pytest

from peak_tune.backends.replay import point_distance, surrogate_fidelity
from peak_tune.core import Status
from peak_tune.session.config import TuneConfig
from peak_tune.session.tune import TuneSession, open_session

RECORDING = Path(__file__).parents[1] / "fixtures" / "replay" / "matmul-c-small.json"
SPACE = ("loop-interchange", "unroll-k", "openmp-parallel", "restrict-align")


def recorded_best() -> float:
    data = json.loads(RECORDING.read_text())
    return max(o["flops"] / statistics.median(o["samples_ms"]) / 1e6
               for o in data["outcomes"] if o["status"] == "ok")


def session(tmp_path: Path, recording: Path = RECORDING, **over) -> TuneSession:
    config = TuneConfig.of(sizes=({"M": 96, "N": 96, "K": 96},), results=tmp_path,
                           only=SPACE, replay=recording, **over)
    opened = open_session(config)
    opened.measure_vendor()
    return opened


def run(tmp_path: Path, trials: int, **over) -> TuneSession:
    opened = session(tmp_path, **over)
    opened.run(trials, lambda record: None)
    return opened


def points(s: TuneSession) -> list[tuple]:
    return [(tuple(t.user_attrs["sequence"]), tuple(sorted(t.user_attrs["params"].items())))
            for t in s.study.trials]


def test_same_seed_repeats_the_search_exactly(tmp_path):
    first = run(tmp_path / "a", 30, seed=3)
    second = run(tmp_path / "b", 30, seed=3)
    other = run(tmp_path / "c", 30, seed=4)
    assert points(first) == points(second)
    assert points(first) != points(other)
    assert first.searcher.best_gflops() == second.searcher.best_gflops()


def test_first_trial_is_the_seed_and_search_beats_it(tmp_path):
    s = run(tmp_path, 40, seed=1)
    seed_trial = s.study.trials[0]
    assert seed_trial.user_attrs["sequence"] == []
    assert s.searcher.best_gflops() > 3 * seed_trial.values[0]


def test_illegal_picks_are_pruned_or_repaired(tmp_path):
    pruned = run(tmp_path / "p", 40, seed=5, encoding="steps", illegal="prune")
    states = [t.state for t in pruned.study.trials]
    assert optuna.trial.TrialState.PRUNED in states
    invalid = [t for t in pruned.study.trials if t.user_attrs["status"] == "invalid"]
    assert all("applied twice" in t.user_attrs["message"] or "requires" in
               t.user_attrs["message"] or "conflicts" in t.user_attrs["message"]
               for t in invalid)
    repaired = run(tmp_path / "r", 40, seed=5, encoding="steps", illegal="repair")
    assert all(t.user_attrs["status"] != "invalid" for t in repaired.study.trials)


def test_failures_are_recorded_with_their_class(tmp_path):
    data = json.loads(RECORDING.read_text())
    broken = 0
    for outcome in data["outcomes"]:
        if "openmp-parallel" in outcome["sequence"]:
            outcome.update(status="wrong_result", message="wrong result at 96x96x96: 3 off",
                           samples_ms=None, flops=None)
            broken += 1
    assert broken
    recording = tmp_path / "broken.json"
    recording.write_text(json.dumps(data))
    s = run(tmp_path / "r", 30, seed=6, recording=recording)
    failed = [t for t in s.study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed
    for t in failed:
        assert "openmp-parallel" in t.user_attrs["sequence"]
        assert t.user_attrs["status"] == Status.WRONG_RESULT.value
        assert t.user_attrs["message"].startswith("wrong result")


def test_resumed_study_repeats_no_evaluation(tmp_path):
    first = run(tmp_path, 12, seed=7, study="resume-me")
    calls = first.backend.calls  # type: ignore[attr-defined]
    assert calls > 0
    again = session(tmp_path, seed=7, study="resume-me")
    again.run(8, lambda record: None)
    assert len(again.study.trials) == 20
    evaluated = {p for p in points(again)[:12]}
    # points already done answer from the cache: the replay backend sees only new ones
    new_points = {p for p in points(again)[12:]} - evaluated
    assert again.backend.calls <= len(new_points)  # type: ignore[attr-defined]


def test_fixed_sequence_tunes_only_its_parameters(tmp_path):
    s = run(tmp_path, 10, seed=8, sequence=("unroll-k", "openmp-parallel"))
    assert {tuple(t.user_attrs["sequence"]) for t in s.study.trials} == {
        ("unroll-k", "openmp-parallel")}
    assert {frozenset(t.params) for t in s.study.trials} == {
        frozenset({"unroll-k.UNROLL_K", "openmp-parallel.OMP_CHUNK"})}


def test_step_values_report_each_prefix(tmp_path):
    s = run(tmp_path, 15, seed=9, step_values=True)
    done = [t for t in s.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert any(t.user_attrs["sequence"] for t in done)
    for t in done:
        assert sorted(t.intermediate_values) == list(range(len(t.user_attrs["sequence"])))


def test_missing_point_in_recording_is_an_error(tmp_path):
    data = json.loads(RECORDING.read_text())
    data["outcomes"] = [o for o in data["outcomes"] if o["sequence"] == []]
    recording = tmp_path / "tiny.json"
    recording.write_text(json.dumps(data))
    s = session(tmp_path, recording=recording, seed=1)
    with pytest.raises(Exception, match="has no outcome"):
        s.run(20, lambda record: None)
    assert optuna.trial.TrialState.RUNNING not in {t.state for t in s.study.trials}


def test_parallel_builds_keep_every_trial_accounted_for(tmp_path):
    s = run(tmp_path, 23, seed=10, compile_workers=4)
    assert len(s.study.trials) == 23
    assert optuna.trial.TrialState.RUNNING not in {t.state for t in s.study.trials}
    assert len(set(points(s))) > 15  # the constant liar keeps a batch's trials apart


def _partial(tmp_path: Path, keep_every: int, partial: bool) -> tuple[Path, set[float]]:
    """The recording with only every `keep_every`-th point kept, and the speeds kept."""
    data = json.loads(RECORDING.read_text())
    data["outcomes"] = data["outcomes"][::keep_every]
    data["partial"] = partial
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(data))
    kept = {round(o["flops"] / statistics.median(o["samples_ms"]) / 1e6, 6)
            for o in data["outcomes"] if o["status"] == "ok"}
    return path, kept


def test_a_partial_recording_answers_a_missing_point_with_a_recorded_neighbour(tmp_path):
    path, kept = _partial(tmp_path, 3, partial=True)
    s = session(tmp_path / "study", recording=path, seed=2)
    records = []
    s.run(40, records.append)
    ran = [r for r in records if r.status is Status.OK]
    assert len(ran) > 10
    # every speed is one the recording holds: nothing invented
    assert all(round(r.gflops, 6) in kept for r in ran)


def test_the_nearest_point_shares_the_most_steps_then_the_closest_values():
    here = {"sequence": ["a", "b"], "params": {"TILE": 32}}
    same_steps_far_value = {"sequence": ["a", "b"], "params": {"TILE": 4}}
    other_steps_same_value = {"sequence": ["a", "c"], "params": {"TILE": 32}}
    swapped = {"sequence": ["b", "a"], "params": {"TILE": 32}}
    assert point_distance(here, swapped) < point_distance(here, other_steps_same_value)
    assert point_distance(here, same_steps_far_value) < point_distance(
        here, other_steps_same_value)
    assert point_distance(here, here) == 0


def test_the_surrogates_fidelity_is_high_where_speed_follows_the_values():
    outcomes = [{"sequence": ["a"], "params": {"TILE": t, "UNROLL": u}, "size": "8x8x8",
                 "status": "ok", "flops": 1e6, "samples_ms": [1.0 / (t + 0.1 * u)]}
                for t in (1, 2, 4, 8, 16, 32, 64) for u in (1, 2, 4)]
    fidelity = surrogate_fidelity(outcomes)
    assert fidelity["points"] == 21 and fidelity["spearman"] > 0.9
    times = [o["samples_ms"] for o in outcomes]
    random.Random(0).shuffle(times)  # speed unrelated to the values: nothing to predict
    shuffled = [dict(o, samples_ms=t) for o, t in zip(outcomes, times, strict=True)]
    assert surrogate_fidelity(shuffled)["spearman"] < 0.5


GPU_RECORDING = RECORDING.with_name("matmul-cuda-fp16-partial.json")


def test_a_seeded_replay_of_a_gpu_recording_repeats_itself(tmp_path):
    """Builds one at a time in a replay: with several, the order they finish in changed
    which trials the sampler saw running, and so its draws, from run to run."""
    def replayed(folder: Path) -> TuneSession:
        config = TuneConfig.of(sizes=({"M": 4096, "N": 4096, "K": 4096},), results=folder,
                               device="h200", dtype="float16", replay=GPU_RECORDING, seed=3)
        opened = open_session(config)
        opened.run(40, lambda record: None)
        opened.close()
        return opened

    first, second = replayed(tmp_path / "a"), replayed(tmp_path / "b")
    assert first.compile_workers == 1
    assert points(first) == points(second)
    assert len(set(points(first))) > 20

"""A new study starts with one trial per branch of the catalog's conflict graph."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from peak_tune.appliers.reference.cuda_matmul import apply_transformation
from peak_tune.catalog.loaders import load_devices, load_spec, load_transformations
from peak_tune.catalog.sequences import check_sequence
from peak_tune.catalog.types import Transformation
from peak_tune.evaluation.pipeline import seed_context
from peak_tune.expr import evaluate_bool
from peak_tune.search.space import SubsetEncoding, branch_sequences, branch_trial_params
from peak_tune.session.config import TuneConfig
from peak_tune.session.tune import open_session

ROOT = Path(__file__).parents[2]


def catalog(backend: str) -> dict[str, Transformation]:
    found = load_transformations([ROOT / "transforms"])
    return {tid: t for tid, t in found.items() if backend in t.backends}


def fake(tid: str, requires: tuple[str, ...] = (),
         conflicts: tuple[str, ...] = ()) -> Transformation:
    return Transformation(id=tid, version=1, title=tid, kernels=("matmul",), backends=("c",),
                          requires=requires, conflicts=conflicts, params=(), constraints=(),
                          passes=())


def test_each_side_of_a_conflict_gets_its_own_branch():
    steps = {t.id: t for t in (fake("base"), fake("simt", ("base",)),
                               fake("mma", ("base",), ("simt",)), fake("extra", ("base",)),
                               fake("after-mma", ("mma",)))}
    assert branch_sequences(steps) == [["base", "mma"], ["base", "extra", "mma", "after-mma"],
                                       ["base", "extra", "simt"]]


def test_cuda_branches_reach_tensor_cores_and_simt_tiles_and_apply():
    steps = catalog("cuda")
    branches = branch_sequences(steps)
    assert any("tensor-core" in b and "tensor-tiling" in b for b in branches)
    assert any("thread-tiling" in b and "thread-cache" in b for b in branches)
    assert ["refactor", "tb-tiling", "pipelining", "tensor-core", "vector-loads",
            "wgmma"] in branches  # the deepest branch alone
    assert any("pipelining" in b for b in branches) and any("register-staging" in b
                                                           for b in branches)
    device = load_devices([ROOT / "backends" / "devices"])["h200"]
    spec = load_spec(ROOT / "seeds" / "matmul")
    for branch in branches:
        check_sequence(branch, steps)
        context = seed_context(spec, "cuda")
        for tid in branch:  # the reference applier accepts every step in this order
            context = apply_transformation(context, steps[tid], device)
        assert context.applied[-1] == branch[-1]
        defaults = {k: v for tid in branch for k, v in steps[tid].defaults.items()}
        assert {p.name for p in context.params} <= set(defaults)
        assert all(evaluate_bool(c, defaults) for c in context.constraints), branch


def test_branch_trial_decodes_to_its_sequence_with_declared_defaults():
    steps = catalog("cuda")
    branch = next(b for b in branch_sequences(steps) if "tensor-core" in b)
    params = branch_trial_params(branch, steps, "subset")
    assert params["refactor.BLOCK_M"] == 128 and params["tb-tiling.TILE_K_SIZE"] == 64
    study = optuna.create_study()
    study.enqueue_trial(params)
    trial = study.ask()
    assert SubsetEncoding(steps, repair=False).suggest(trial) == branch


@pytest.mark.parametrize("branch_start", [True, False])
def test_new_study_enqueues_seed_then_branches(tmp_path, branch_start):
    session = open_session(TuneConfig.of(results=tmp_path, branch_start=branch_start))
    try:
        waiting = session.study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    finally:
        session.close()
    expected = 1 + (len(branch_sequences(catalog("c"))) if branch_start else 0)
    assert len(waiting) == expected >= (3 if branch_start else 1)
    assert not any(v for k, v in waiting[0].params.items() if k.startswith("use."))

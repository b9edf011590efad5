"""The parts of a tuning run made from its configuration: the backend (here, on a Ray
cluster, or a replay), the applier wired to it, the executor, the sequence encoding,
and the LLM spend a resumed study already holds."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from peak_tune.appliers.base import Applier, ModelCalls
from peak_tune.appliers.wiring import AppliedWith, wired_applier
from peak_tune.backends import make_backend
from peak_tune.backends.base import Backend
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelSpec, ProblemSize
from peak_tune.errors import UserError
from peak_tune.evaluation.cache import Cache
from peak_tune.evaluation.pipeline import Pipeline
from peak_tune.executors import Executor, LocalExecutor, choose_executor
from peak_tune.search.space import (
    FixedEncoding,
    SequenceEncoding,
    StepsEncoding,
    SubsetEncoding,
)
from peak_tune.search.study import StudySettings
from peak_tune.session.config import (
    ApplierSettings,
    BudgetScope,
    Encoding,
    Illegal,
    RunSettings,
    SearchSettings,
    TuneConfig,
)

if TYPE_CHECKING:
    from peak_tune.executors.ray import RaySettings

__all__ = ["apply_workers", "backend_for", "compile_workers", "count_earlier_spend",
           "encoding_for", "executor_for", "study_settings", "wired_applier_for"]


def compile_workers(run: RunSettings, on_host: bool) -> int:
    """Builds at once: 1 for a backend that runs on the host (a compiler beside a CPU
    timing would disturb it) and for a replay (it builds nothing, and builds finishing in
    their own order would let the sampler see another set of running trials from one run
    to the next: a seeded replay repeats itself only one at a time), else one per host
    core."""
    if run.compile_workers > 0:
        return run.compile_workers
    return 1 if on_host or run.replay is not None else max(1, os.cpu_count() or 1)


def apply_workers(settings: ApplierSettings, applier: Applier) -> int:
    """Applications at once: one for the reference applier (fast, and a seeded run
    stays repeatable), several for the LLM one (each call waits on the network)."""
    if settings.workers > 0:
        return settings.workers
    return applier.concurrency if isinstance(applier, ModelCalls) else 1


def _ray_settings(run: RunSettings, builds: int) -> RaySettings:
    from peak_tune.executors.ray import RaySettings

    return RaySettings(address=run.ray_address, workers=run.ray_workers,
                       builds_per_worker=max(1, builds // 2))


def backend_for(run: RunSettings, device: DeviceProfile, name: str, builds: int) -> Backend:
    """The backend here; with a Ray address, the cluster's (ClusterBackend: the device
    is probed and the vendor timed there, none is needed here); a replay's."""
    if run.replay is None and run.ray_address and \
            choose_executor(run.executor, run.ray_address, name) == "ray":
        from peak_tune.executors.cluster_backend import ClusterBackend

        return ClusterBackend(name, device, _ray_settings(run, builds))
    if run.replay is None:
        return make_backend(name, device)
    from peak_tune.backends.replay import ReplayBackend

    return ReplayBackend(device, run.replay)


def executor_for(run: RunSettings, pipeline: Pipeline, backend_name: str,
                 builds: int) -> Executor:
    choice = choose_executor(run.executor, run.ray_address, backend_name)
    if choice == "local":
        return LocalExecutor(pipeline, builds)
    if run.replay is not None:
        raise UserError("--replay answers from a recording: use --executor local")
    from peak_tune.executors.ray import RayExecutor

    return RayExecutor(_ray_settings(run, builds), pipeline, backend_name)


def wired_applier_for(config: TuneConfig, backend: Backend, spec: KernelSpec,
                      cache: Cache) -> Applier:
    """The reference applier, or the LLM one wired to this backend's compiler and
    validation so that compile errors and wrong results go back to the model."""
    settings = config.applier
    if settings.samples < 1:
        raise UserError("--samples must be 1 or more")
    if settings.name != "llm" and settings.samples > 1:
        raise UserError("--samples needs --applier llm (the reference applier is "
                        "deterministic: every sample would be the same)")
    against = AppliedWith(backend, spec, config.target.dtype, cache, config.run.eval_config,
                          run_kernels=config.run.replay is None)
    return wired_applier(settings.name, settings.model, settings.llm_settings, against)


def encoding_for(search: SearchSettings, transformations: Mapping[str, Transformation]
                 ) -> SequenceEncoding:
    if search.sequence:
        return FixedEncoding(search.sequence, transformations)
    repair = search.illegal is Illegal.REPAIR
    if search.encoding is Encoding.SUBSET:
        return SubsetEncoding(transformations, repair)
    return StepsEncoding(transformations, repair, search.max_steps)


def count_earlier_spend(settings: ApplierSettings, study: str | None, applier: Applier,
                        cache_folder: Path) -> None:
    """With budget_scope "study", the LLM budget also counts the calls the journal
    holds for this study from earlier runs (only a study named with --study has any: a
    new run's study is new)."""
    if settings.budget_scope is BudgetScope.RUN or not isinstance(applier, ModelCalls):
        return
    from peak_tune.appliers.llm.client import Usage
    from peak_tune.appliers.llm.prices import price_for
    from peak_tune.appliers.llm.stats import read_records

    name = study
    if not name:
        return
    earlier = [r for r in read_records(cache_folder) if r.study == name]
    prices = str(settings.llm_settings.get("prices_file") or "")
    cost, unpriced = 0.0, set()
    for r in earlier:  # a call journaled without a price is priced by today's table
        if r.cost_usd is not None:
            cost += r.cost_usd
        elif (price := price_for(r.model, prices)) is not None:
            cost += price.cost_usd(r.prompt_tokens, r.completion_tokens)
        else:
            unpriced.add(r.model)
    if unpriced and settings.llm_settings.get("max_cost_usd"):
        raise UserError(f"--max-cost with --budget-scope study: study {name!r} has earlier "
                        f"calls without a price (model {', '.join(sorted(unpriced))}); "
                        "give it with --llm-prices FILE, or count this run only")
    applier.count_earlier(Usage(len(earlier), sum(r.prompt_tokens for r in earlier),
                                sum(r.completion_tokens for r in earlier), cost))


def study_settings(config: TuneConfig, spec: KernelSpec, device: DeviceProfile,
                   sizes: list[ProblemSize], storage_url: str, backend_name: str,
                   applier_identity: str) -> StudySettings:
    """What the Searcher needs to create, name, resume or warm-start the study."""
    search, dtype = config.search, config.target.dtype
    labels = [s.label() for s in sizes]
    base = "-".join([spec.name, device.name, dtype, "_".join(labels)])
    return StudySettings(
        storage_url=storage_url, name=config.store.study,
        base_name=base + ("-fixed" if search.sequence else ""),
        identity={"kernel": spec.name, "backend": backend_name, "device": device.name,
                  "dtype": dtype, "sizes": labels},
        applier_identity=applier_identity, sampler=search.sampler, seed=search.seed,
        encoding=search.encoding, fixed_sequence=bool(search.sequence),
        branch_start=search.branch_start, warm_start=search.warm_start,
        warm_start_top=search.warm_start_top, ask_ahead=search.ask_ahead,
        sampler_processes=search.sampler_processes)

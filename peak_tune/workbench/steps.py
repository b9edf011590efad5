"""The interactive steps an engineer (or an AI agent) takes one at a time.

Apply one transformation to a checkpoint (or the seed) through the same Pipeline and
cache as tuning, so a repeat costs no applier call and no compile; show the change as a
diff; validate and time the variant next to the vendor baseline; keep the result as a
named checkpoint (peak_tune.workbench.checkpoints). `peak-tune apply`, `peak-tune checkpoint` and
the MCP server (peak_tune.workbench.mcp_server) are thin layers over this module.
"""

from __future__ import annotations

import difflib
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peak_tune.appliers.base import Applier, calls_of
from peak_tune.appliers.wiring import AppliedWith, LLMJournal, wired_applier
from peak_tune.backends import make_backend
from peak_tune.backends.base import Backend, EvalConfig
from peak_tune.catalog.resolve import Catalog
from peak_tune.catalog.sequences import check_sequence
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import (
    KernelContext,
    KernelSpec,
    Measurement,
    Outcome,
    ProblemSize,
    Status,
)
from peak_tune.errors import ApplyError, InvalidPoint, UserError
from peak_tune.evaluation.cache import Cache
from peak_tune.evaluation.pipeline import Pipeline, PipelineSetup, seed_context
from peak_tune.session.config import ApplierSettings
from peak_tune.session.target import resolve_kernel_target
from peak_tune.workbench.checkpoints import (
    SEED,
    Checkpoint,
    CheckpointStore,
    Timing,
    now,
    timing_key,
)

__all__ = ["ApplyRequest", "ApplyResult", "Evaluation", "Target", "Workbench",
           "WorkbenchConfig", "source_diff"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """What to work on; a field left None comes from the starting checkpoint (from the
    seed: the current checkpoint), else the defaults (matmul, the device's backend, cpu,
    float32, the kernel's default size)."""

    kernel: str | None = None
    backend: str | None = None
    device: str | None = None
    dtype: str | None = None
    size: Mapping[str, int] | str | None = None  # a size's text: see core.size_of

    def over(self, base: Target) -> Target:
        """This target's fields, with `base`'s where this one has none."""
        return Target(
            kernel=self.kernel if self.kernel is not None else base.kernel,
            backend=self.backend if self.backend is not None else base.backend,
            device=self.device if self.device is not None else base.device,
            dtype=self.dtype if self.dtype is not None else base.dtype,
            size=self.size if self.size is not None else base.size,
        )


@dataclass(frozen=True)
class WorkbenchConfig:
    results: Path = Path("results")
    catalogs: tuple[str, ...] = ()
    target: Target = field(default_factory=Target)
    applier: ApplierSettings = field(default_factory=ApplierSettings)  # as the tune command's
    eval_config: EvalConfig = field(default_factory=EvalConfig)


@dataclass(frozen=True)
class ApplyRequest:
    transformation: str
    params: Mapping[str, int] = field(default_factory=dict)
    start: str | None = None  # a checkpoint name or "seed"; None: the current checkpoint
    name: str | None = None  # None: the next free cpN
    sample: int = 0  # another sample asks the applier afresh (the LLM: a new answer)
    target: Target = field(default_factory=Target)  # overrides the config's target


@dataclass(frozen=True)
class Evaluation:
    """A variant validated and timed at one size, and the vendor timed in the same run."""

    outcome: Outcome
    vendor: tuple[str, Measurement] | None
    device: str
    dtype: str
    size: ProblemSize
    compiles: int  # compiler runs this evaluation needed (0: the cache answered)

    def timing(self) -> Timing:
        m = self.outcome.measurement
        name, vendor = self.vendor if self.vendor else ("", None)
        return Timing(
            status=self.outcome.status.value, gflops=m.gflops if m else 0.0,
            median_ms=m.median_ms if m else 0.0, spread=m.spread if m else 0.0,
            vendor=name, vendor_gflops=vendor.gflops if vendor else 0.0,
            message=self.outcome.message, measured=now(),
        )

    @property
    def key(self) -> str:
        return timing_key(self.device, self.dtype, self.size.label())


@dataclass(frozen=True)
class ApplyResult:
    parent: str  # the checkpoint it started from, or "seed"
    transformation: str
    diff: str
    params: Mapping[str, int]
    param_sources: Mapping[str, str]  # given | inherited | default | first allowed value
    context_hash: str
    applied_from_cache: bool
    evaluation: Evaluation
    checkpoint: Checkpoint | None  # None when the variant failed validation
    reused: bool  # the same step from the same parent was checkpointed before
    # the LLM applier's calls for this step: calls, repairs, tokens, cost_usd (None:
    # another applier, or no call: the step came from the cache)
    llm: Mapping[str, Any] | None = None

    @property
    def defaults_used(self) -> list[str]:
        return [n for n, s in self.param_sources.items() if s in _DEFAULT_SOURCES]


_DEFAULT_SOURCES = ("default", "first allowed value")


@dataclass(frozen=True)
class _Resolved:
    spec: KernelSpec
    device: DeviceProfile
    backend: str
    dtype: str
    size: ProblemSize


def source_diff(old: str, new: str, old_label: str, new_label: str) -> str:
    """A unified diff of two kernel sources ("" when they are the same)."""
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=f"a/{old_label}", tofile=f"b/{new_label}")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


class Workbench:
    """Opens backends lazily: listing and showing checkpoints never start a compiler."""

    def __init__(self, config: WorkbenchConfig) -> None:
        self.config = config
        self.catalog = Catalog.with_user_folders(config.catalogs)
        self.store = CheckpointStore(config.results)
        self._cache: Cache | None = None
        self._backends: dict[str, Backend] = {}
        self._pipelines: dict[tuple[str, str, str, str], Pipeline] = {}

    @property
    def cache(self) -> Cache:
        if self._cache is None:
            self._cache = Cache(self.config.results / "cache")
        return self._cache

    @functools.cached_property
    def journal(self) -> LLMJournal:
        return LLMJournal(self.cache)

    def close(self) -> None:
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()
        self._pipelines.clear()

    # ---------------------------------------------------------------- resolving

    def start_checkpoint(self, name: str | None) -> Checkpoint | None:
        """The checkpoint called `name`; None for the seed. Without a name, the current."""
        name = name if name is not None else self.store.current()
        return None if name in (None, SEED) else self.store.get(name)

    def _resolve(self, target: Target, start: Checkpoint | None) -> _Resolved:
        given = target.over(self.config.target)
        if start is not None:
            for mine, theirs in ((given.kernel, start.kernel), (given.backend, start.backend)):
                if mine is not None and mine != theirs:
                    raise UserError(f"checkpoint {start.name!r} is a {theirs} variant, not "
                                    f"{mine} (start from `--from seed` instead)")
        # Unset fields come from the starting checkpoint; from the seed, from the current
        # checkpoint if it is of the same kernel and backend (the session's settings).
        base = start or self.start_checkpoint(None)
        if base is not None and given.kernel in (None, base.kernel) and \
                given.backend in (None, base.backend):
            given = given.over(Target(base.kernel, base.backend, base.device, base.dtype,
                                      base.size))
        found = resolve_kernel_target(self.catalog, given.kernel or "matmul", given.device,
                                      given.backend, given.dtype or "float32",
                                      [given.size] if given.size else [])
        return _Resolved(found.spec, found.device, found.backend, found.dtype, found.sizes[0])

    def _pipeline(self, r: _Resolved) -> Pipeline:
        key = (r.spec.name, r.backend, r.device.name, r.dtype)
        if key not in self._pipelines:
            if r.device.name not in self._backends:
                self._backends[r.device.name] = make_backend(r.backend, r.device)
            backend = self._backends[r.device.name]
            device = backend.probe()
            transformations = {t.id: t for t in self.catalog.transformations_for(
                r.spec.name, r.backend)}
            setup = PipelineSetup(r.spec, r.dtype, device, transformations,
                                  self.config.eval_config)
            applier = self._applier(backend, r.spec, r.dtype)
            self._pipelines[key] = Pipeline(setup, backend, applier, self.cache)
        return self._pipelines[key]

    def _applier(self, backend: Backend, spec: KernelSpec, dtype: str) -> Applier:
        """As a tuning session builds it: the LLM one repairs compile errors and wrong
        results."""
        against = AppliedWith(backend, spec, dtype, self.cache, self.config.eval_config)
        settings = self.config.applier
        return wired_applier(settings.name, settings.model, dict(settings.llm_settings),
                             against)

    def context(self, checkpoint: Checkpoint | None, pipe: Pipeline) -> KernelContext:
        if checkpoint is None:
            return pipe.seed
        return self.stored_context(checkpoint)

    def stored_context(self, checkpoint: Checkpoint) -> KernelContext:
        context = self.cache.get_context(checkpoint.context_hash)
        if context is None:
            raise UserError(f"checkpoint {checkpoint.name!r}: its variant "
                            f"{checkpoint.context_hash[:16]} is not in the cache at "
                            f"{self.cache.folder}")
        return context

    def transformation(self, tid: str, kernel: str, backend: str, dtype: str) -> Transformation:
        t = self.catalog.transformation(tid)
        if not t.applies_to(kernel, backend):
            raise UserError(f"transformation {tid!r} is for {', '.join(t.kernels)} on "
                            f"{', '.join(t.backends)}, not {kernel} on {backend}")
        if not t.applies_to(kernel, backend, dtype):
            raise UserError(f"transformation {tid!r} is for {', '.join(t.dtypes)}, "
                            f"not {dtype}")
        return t

    def transformations(self, target: Target | None = None) -> list[Transformation]:
        """Those that apply to the kernel and backend of the current checkpoint (or the
        configured target)."""
        r = self._resolve(target or Target(), self.start_checkpoint(None))
        return self.catalog.transformations_for(r.spec.name, r.backend)

    # ------------------------------------------------------------------ applying

    def apply(self, request: ApplyRequest) -> ApplyResult:
        """Apply one transformation, evaluate the variant, and checkpoint it if it passes.

        Raises UserError for unknown names and illegal steps (nothing is stored),
        ApplyError when the applier failed."""
        start = self.start_checkpoint(request.start)
        if request.name is not None:
            self.store.check_new_name(request.name)
        r = self._resolve(request.target, start)
        t = self.transformation(request.transformation, r.spec.name, r.backend, r.dtype)
        parent_label = start.name if start else SEED
        pipe = self._pipeline(r)
        parent = self.context(start, pipe)
        try:
            check_sequence([*parent.applied, t.id], pipe.setup.transformations)
        except InvalidPoint as exc:
            raise UserError(f"cannot apply {t.id} to {parent_label}: {exc}") from exc
        inherited = dict(start.params) if start else {}
        values, sources = self._values(parent, t, inherited, request.params, parent_label)
        misses = self.cache.counters.misses
        calls_before = len(calls_of(pipe.applier) or ())
        child = self._apply_step(pipe, parent, t, request.sample, parent_label)
        llm = _llm_use(list(calls_of(pipe.applier) or ())[calls_before:])
        applied_from_cache = self.cache.counters.misses == misses
        values, sources = _for_variant(child, values, sources)
        evaluation = self._measure(pipe, r, child, values)
        checkpoint, reused = None, False
        if evaluation.outcome.status is Status.OK:
            draft = Checkpoint(
                name="", parent=parent_label, transformation=t.id,
                transform_version=t.version, params=values,
                defaults_used=tuple(n for n, s in sources.items() if s in _DEFAULT_SOURCES),
                context_hash=child.content_hash(), kernel=r.spec.name, backend=r.backend,
                device=r.device.name, dtype=r.dtype, size=r.size.as_dict(),
                applier=pipe.applier.identity, created=now(),
                timings={evaluation.key: evaluation.timing()}, sample=request.sample)
            checkpoint, reused = self._save(draft, request.name)
        new_label = checkpoint.name if checkpoint else f"{t.id} (not saved)"
        return ApplyResult(
            parent=parent_label, transformation=t.id,
            diff=source_diff(parent.source, child.source, parent_label, new_label),
            params=values, param_sources=sources, context_hash=child.content_hash(),
            applied_from_cache=applied_from_cache, evaluation=evaluation,
            checkpoint=checkpoint, reused=reused, llm=llm)

    def _apply_step(self, pipe: Pipeline, parent: KernelContext, t: Transformation,
                    sample: int, parent_label: str) -> KernelContext:
        misses = self.cache.counters.misses
        try:
            return pipe.apply_one(parent, t, sample)
        except InvalidPoint as exc:
            raise UserError(f"cannot apply {t.id} to {parent_label}: {exc}") from exc
        except ApplyError as exc:
            if self.cache.counters.misses != misses:
                raise
            raise ApplyError(f"{exc} (the cached answer of sample {sample}: --sample "
                             f"{sample + 1} asks the applier afresh)") from exc
        finally:
            self.journal.write(pipe.applier)

    def _values(self, parent: KernelContext, t: Transformation, inherited: Mapping[str, int],
                given: Mapping[str, int], label: str) -> tuple[dict[str, int], dict[str, str]]:
        """Every tuning value of the variant-to-be, and where it came from."""
        domains = {p.name: p for p in parent.params}
        for p in t.params:
            domains.setdefault(p.name, p)
        unknown = sorted(set(given) - set(domains))
        if unknown:
            known = ", ".join(domains) or "none"
            raise UserError(f"{t.id} on {label} has no parameter {', '.join(unknown)} "
                            f"(parameters: {known})")
        values: dict[str, int] = {}
        sources: dict[str, str] = {}
        for name, domain in domains.items():
            if name in given:
                if given[name] not in domain.values:
                    raise UserError(f"{name}={given[name]} is not allowed (choose from "
                                    f"{', '.join(map(str, domain.values))})")
                values[name], sources[name] = given[name], "given"
            elif name in inherited:
                values[name], sources[name] = inherited[name], "inherited"
            else:
                owner = t if any(p.name == name for p in t.params) else \
                    self.catalog.transformations.get(domain.introduced_by)
                value, declared = owner.default_value(name) if owner else (domain.values[0],
                                                                           False)
                values[name] = value
                sources[name] = "default" if declared else "first allowed value"
        return values, sources

    def _save(self, draft: Checkpoint, name: str | None) -> tuple[Checkpoint, bool]:
        """A new checkpoint, or the one this same step made before (made current)."""
        same = self.store.find_same(draft)
        if same is not None and name in (None, same.name):
            self.store.set_current(same.name)
            timing = draft.timings[draft.key]
            return self.store.record_timing(same.name, draft.key, timing), True
        return self.store.add(draft, name), False

    # ---------------------------------------------------------------- evaluating

    def _measure(self, pipe: Pipeline, r: _Resolved, context: KernelContext,
                 values: Mapping[str, int]) -> Evaluation:
        try:
            pipe.check_point(context, values, r.size)
        except InvalidPoint as exc:
            raise UserError(f"cannot evaluate: {exc}") from exc
        compiles = self.cache.counters.compiles
        outcome = pipe.evaluate(context, values, r.size)
        vendor = None
        if outcome.status is Status.OK:
            vendor = pipe.backend.time_vendor(r.spec, r.dtype, r.size, self.config.eval_config)
        return Evaluation(outcome, vendor, r.device.name, r.dtype, r.size,
                          self.cache.counters.compiles - compiles)

    def evaluate(self, name: str, target: Target | None = None
                 ) -> tuple[Checkpoint | None, Evaluation]:
        """Validate and time a checkpoint (or the seed), at its own size and dtype unless
        `target` says otherwise; the measurement is kept with the checkpoint."""
        start = self.start_checkpoint(name)
        r = self._resolve(target or Target(), start)
        pipe = self._pipeline(r)
        context = self.context(start, pipe)
        values = dict(start.params) if start else {}
        evaluation = self._measure(pipe, r, context, values)
        if start is None:
            return None, evaluation
        return self.store.record_timing(start.name, evaluation.key, evaluation.timing()), \
            evaluation

    # -------------------------------------------------------------- checkpoints

    def source(self, name: str, other: Checkpoint | None = None) -> tuple[str, KernelContext]:
        """(label, variant) of a checkpoint; the seed is the seed of `other`'s kernel."""
        checkpoint = self.start_checkpoint(name)
        if checkpoint is not None:
            return checkpoint.name, self.stored_context(checkpoint)
        base = other or self.start_checkpoint(None)
        target = Target(base.kernel, base.backend) if base else Target()
        r = self._resolve(target, None)
        return SEED, seed_context(r.spec, r.backend)

    def diff(self, a: str, b: str) -> str:
        first = self.start_checkpoint(a)
        second = self.start_checkpoint(b)
        label_a, context_a = self.source(a, second)
        label_b, context_b = self.source(b, first)
        return source_diff(context_a.source, context_b.source, label_a, label_b)

    def chain(self, checkpoint: Checkpoint) -> list[Checkpoint]:
        """The checkpoints from the first after the seed down to `checkpoint`."""
        chain = [checkpoint]
        while chain[-1].parent != SEED:
            chain.append(self.store.get(chain[-1].parent))
        return chain[::-1]

    def restore(self, name: str) -> Checkpoint | None:
        """Make `name` the checkpoint the next apply starts from (None: the seed)."""
        return self.store.set_current(name)


def _for_variant(child: KernelContext, values: dict[str, int], sources: dict[str, str]
                 ) -> tuple[dict[str, int], dict[str, str]]:
    """Values for exactly the variant's parameters (an applier may add one of its own)."""
    out_values: dict[str, int] = {}
    out_sources: dict[str, str] = {}
    for p in child.params:
        if p.name in values:
            out_values[p.name], out_sources[p.name] = values[p.name], sources[p.name]
        else:
            out_values[p.name], out_sources[p.name] = p.values[0], "first allowed value"
    return out_values, out_sources


def _llm_use(records: list[Any]) -> dict[str, Any] | None:
    """Calls, repairs (follow-ups sent back to the model), tokens and dollars of an LLM
    applier's records; None for none."""
    if not records:
        return None
    from peak_tune.appliers.llm.stats import totals

    return {**totals(records),
            "repairs": sum(1 for r in records if r.turn > 0 and r.attempt == 1)}

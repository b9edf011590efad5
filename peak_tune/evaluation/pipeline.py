"""From a transformation sequence and parameter values to an Outcome, through the cache.

This is the one place where typed errors from appliers and backends become Status
values. A repeat of anything already done costs no applier call, no compile, no run.
An EnvironmentFault (disk full, host out of memory, a killed compiler) is the machine's,
not the variant's: it becomes no Outcome, so nothing caches it; it reaches the driver,
which stops the run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path

from peak_tune.appliers.base import Applier
from peak_tune.backends.base import Artifact, Backend, EvalConfig, EvalRequest
from peak_tune.catalog.sequences import check_sequence
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import (
    KernelContext,
    KernelSpec,
    Outcome,
    ProblemSize,
    Status,
    stable_hash,
    vendor_call,
)
from peak_tune.errors import (
    ApplyError,
    BuildOverBudget,
    CompileError,
    EvaluationError,
    InvalidPoint,
    KernelCrash,
    KernelTimeout,
    WrongResult,
)
from peak_tune.evaluation.build_pins import BuildPins
from peak_tune.evaluation.cache import Cache, application_key, evaluation_key
from peak_tune.evaluation.validation import applicable_sizes, require_size_constraints
from peak_tune.expr import evaluate_bool, evaluate_int
from peak_tune.harness.noise import NoisePolicy, measure_steadily, timing_spread

__all__ = ["Pipeline", "PipelineSetup", "evaluate_built", "make_request",
           "outcome_of_error", "seed_context"]

log = logging.getLogger(__name__)

_STATUS_OF: dict[type[EvaluationError], Status] = {
    CompileError: Status.COMPILE_ERROR,
    KernelCrash: Status.RUNTIME_ERROR,
    KernelTimeout: Status.TIMEOUT,
    WrongResult: Status.WRONG_RESULT,
}


def seed_context(spec: KernelSpec, backend: str) -> KernelContext:
    if backend not in spec.sources:
        raise InvalidPoint(f"kernel {spec.name!r} has no seed for backend {backend!r}")
    return KernelContext(
        kernel=spec.name, backend=backend, source=spec.sources[backend],
        entry=spec.entry[backend], launch=dict(spec.launch.get(backend, {})),
    )


@dataclass(frozen=True)
class PipelineSetup:
    spec: KernelSpec
    dtype: str
    device: DeviceProfile
    transformations: Mapping[str, Transformation]
    eval_config: EvalConfig
    samples: int = 1  # independent applications tried per step (see Pipeline.apply_step)
    noise: NoisePolicy = NoisePolicy()  # when a timing is measured again, and flagged


_BUILD_ATTEMPTS = 3  # a build deleted before it was pinned is built again


class Pipeline:
    def __init__(
        self, setup: PipelineSetup, backend: Backend, applier: Applier, cache: Cache
    ) -> None:
        self.setup = setup
        self.backend = backend
        self.applier = applier
        self.cache = cache
        self.seed = seed_context(setup.spec, backend.name)
        self.cache.put_context(self.seed)
        self._fingerprint = dict(backend.fingerprint())
        self.counter_lock = threading.Lock()  # cache counters, from several threads
        self._applying: dict[str, threading.Lock] = {}
        self._pins = BuildPins()  # what runs is safe from the cache being cleared
        spec = setup.spec
        self._spec_identity = stable_hash(
            [spec.reference, spec.error_scale, dict(spec.tolerances), spec.flops,
             [vars(a) for a in spec.args], [s.values for s in spec.check_sizes]]
        )

    # ---------------------------------------------------------------- applying

    def build(self, sequence: Sequence[str]) -> list[KernelContext]:
        """Contexts after each step (seed first). Raises InvalidPoint or ApplyError."""
        check_sequence(sequence, self.setup.transformations)
        chain = [self.seed]
        for tid in sequence:
            chain.append(self.apply_step(chain[-1], self.setup.transformations[tid]))
        return chain

    def apply_step(self, parent: KernelContext, transformation: Transformation
                   ) -> KernelContext:
        """The child of the first of `setup.samples` independent applications (sample
        indices 0, 1, ...) that succeeds. With an applier that checks its children
        (the LLM applier compiles and validates each), that is the first sample that
        compiles and computes the right result. Later samples are asked for only when
        the earlier ones failed, and every sample is cached under its own index, so a
        repeat replays the same choice without a call. InvalidPoint is final; after
        every sample failed, ApplyError with the last failure."""
        failures: list[str] = []
        for sample in range(self.setup.samples):
            try:
                return self.apply_one(parent, transformation, sample)
            except InvalidPoint:
                raise
            except ApplyError as exc:
                failures.append(str(exc))
        if len(failures) == 1:
            raise ApplyError(failures[0])
        raise ApplyError(f"all {len(failures)} samples failed; last: {failures[-1]}")

    def apply_one(
        self, parent: KernelContext, transformation: Transformation, sample: int = 0
    ) -> KernelContext:
        key = application_key(
            parent.content_hash(), transformation.id, transformation.version,
            transformation.text_hash(), self.applier.identity, sample,
        )
        with self._one_application_at_a_time(key):  # trials applying the same step at once
            record = self.cache.get_application(key)
            if record is None:
                record = self._apply_uncached(parent, transformation, sample)
                self.cache.put_application(key, record)
        if "invalid" in record:
            raise InvalidPoint(record["invalid"])
        if "error" in record:
            raise ApplyError(record["error"])
        child = self.cache.get_context(record["child"])
        if child is None:  # a copied cache without its contexts: apply again
            record = self._apply_uncached(parent, transformation, sample)
            self.cache.put_application(key, record)
            child = self.cache.get_context(record["child"])
            if child is None:
                raise ApplyError(f"{transformation.id}: {record.get('error', 'no variant')}")
        return child

    def _one_application_at_a_time(self, key: str) -> threading.Lock:
        """The lock of one application key: the second caller waits and reads the cache,
        so concurrent trials never pay an LLM call twice."""
        with self.counter_lock:
            return self._applying.setdefault(key, threading.Lock())

    def _apply_uncached(
        self, parent: KernelContext, transformation: Transformation, sample: int
    ) -> dict[str, str]:
        try:
            child = self.applier.apply(parent, transformation, self.setup.device, sample)
        except InvalidPoint as exc:
            return {"invalid": f"{transformation.id}: {exc}"}
        except ApplyError as exc:
            return {"error": f"{transformation.id}: {exc}"}
        return {"child": self.cache.put_context(child)}

    # -------------------------------------------------------------- evaluating

    def flops(self, size: ProblemSize) -> float:
        return float(evaluate_int(self.setup.spec.flops, size.as_dict()))

    def compile(self, context: KernelContext, params: Mapping[str, int],
                time_limit_s: float = 0.0) -> Artifact:
        """Build the variant (thread-safe, so builds can run ahead of the timing).

        Raises CompileError, InvalidPoint for resources the device lacks, or
        BuildOverBudget when the build outlasts `time_limit_s` (0: no limit)."""
        values = {p.name: params[p.name] for p in context.params}
        artifact = self.backend.compile(context, values, self.setup.dtype,
                                        str(self.cache.builds), time_limit_s)
        if not artifact.reused:
            with self.counter_lock:
                self.cache.counters.compiles += 1
        return artifact

    def pinned(self, artifact: Artifact) -> Artifact:
        """`artifact` under a name outside the cache, safe from the cache being cleared
        until it has run (evaluation.build_pins)."""
        return self._pins.pin(artifact)

    def cached(self, context: KernelContext, params: Mapping[str, int],
               size: ProblemSize) -> Outcome | None:
        """The outcome without running anything: invalid, or from the cache; else None."""
        try:
            self.check_point(context, params, size)
        except InvalidPoint as exc:
            return Outcome(Status.INVALID, message=str(exc))
        return self.cache.get_evaluation(self._key(context, params, size))

    def must_run(self, context: KernelContext, params: Mapping[str, int],
                 size: ProblemSize) -> bool:
        """Whether evaluating this point needs a build and a run (no cache counting)."""
        try:
            self.check_point(context, params, size)
        except InvalidPoint:
            return False
        return not self.cache.has_evaluation(self._key(context, params, size))

    def evaluate(
        self,
        context: KernelContext,
        params: Mapping[str, int],
        size: ProblemSize,
        slow_cutoff_ms: float = 0.0,
        artifact: Future[Artifact] | None = None,
    ) -> Outcome:
        """Validate and time one variant at one size with its parameter values.

        A kernel slower than `slow_cutoff_ms` on its first run is timed only once.
        `artifact` is a build already started (see `compile`); else it is built here.
        """
        known = self.cached(context, params, size)
        if known is not None:
            return known
        outcome = self._evaluate_uncached(context, params, size, slow_cutoff_ms, artifact)
        self.store(context, params, size, outcome)
        return outcome

    def _key(self, context: KernelContext, params: Mapping[str, int], size: ProblemSize) -> str:
        return evaluation_key(
            context, params, size.as_dict(), self.setup.dtype,
            self._fingerprint, self._spec_identity,
        )

    def vendor_key(self, size: ProblemSize) -> str:
        """The cache key of the vendor's timings at `size` (harness.vendor.VendorStore):
        what decides them, as for a kernel's evaluation (device, compiler, harness)."""
        call = vendor_call(self.setup.spec, self.backend.name).value
        return stable_hash(["vendor", size.as_dict(), self.setup.dtype, self._fingerprint,
                            self._spec_identity, call])

    def check_point(
        self, context: KernelContext, params: Mapping[str, int], size: ProblemSize
    ) -> None:
        """Raise InvalidPoint if a constraint fails or a parameter has no value."""
        missing = [p.name for p in context.params if p.name not in params]
        if missing:
            raise InvalidPoint(f"no value for parameter(s) {', '.join(missing)}")
        for constraint in context.constraints:
            if not evaluate_bool(constraint, params):
                raise InvalidPoint(f"constraint {constraint} fails for {_shown(params)}")
        require_size_constraints(context, params, size)

    def request(self, context: KernelContext, values: Mapping[str, int], size: ProblemSize,
                slow_cutoff_ms: float) -> EvalRequest:
        """What the backend is asked to validate and time for one point."""
        return make_request(self.setup, context, values, size, slow_cutoff_ms)

    def store(self, context: KernelContext, params: Mapping[str, int], size: ProblemSize,
              outcome: Outcome) -> None:
        """Keep an outcome in the cache (the driver writes it for Ray workers too); a
        transient one (a build stopped at the study's budget) or a noisy one (its timing
        still spread after re-measuring) is not kept: the next run measures it again."""
        if not outcome.transient and not outcome.noisy:
            self.cache.put_evaluation(self._key(context, params, size), outcome)

    def _evaluate_uncached(
        self,
        context: KernelContext,
        params: Mapping[str, int],
        size: ProblemSize,
        slow_cutoff_ms: float,
        artifact: Future[Artifact] | None,
    ) -> Outcome:
        values = {p.name: params[p.name] for p in context.params}
        for attempt in range(_BUILD_ATTEMPTS):
            try:
                built = self._pins.pin(artifact.result() if artifact and not attempt
                                       else self.compile(context, values))
            except (InvalidPoint, EvaluationError) as exc:
                return outcome_of_error(exc)
            outcome = evaluate_built(self.backend, self.setup, built, context, values, size,
                                     slow_cutoff_ms)
            if outcome.status is Status.OK or not _vanished(built):
                break
            # deleted before it was loaded (its folder cleared under the running tuner):
            # the failure is the folder's, not the kernel's; build and evaluate again
            log.warning("the build %s was deleted before it ran: building it again",
                        built.path)
        return outcome


def make_request(setup: PipelineSetup, context: KernelContext, values: Mapping[str, int],
                 size: ProblemSize, slow_cutoff_ms: float) -> EvalRequest:
    return EvalRequest(
        spec=setup.spec, context=context, params=values, dtype=setup.dtype,
        size=size, check_sizes=applicable_sizes(context, values, setup.spec.check_sizes),
        config=replace(setup.eval_config, slow_cutoff_ms=slow_cutoff_ms),
    )


def evaluate_built(backend: Backend, setup: PipelineSetup, built: Artifact,
                   context: KernelContext, values: Mapping[str, int], size: ProblemSize,
                   slow_cutoff_ms: float) -> Outcome:
    """Validate and time a built variant; the kernel's failures become Outcomes.

    A noisy timing is measured again (setup.noise); one still noisy is flagged."""
    try:
        request = make_request(setup, context, values, size, slow_cutoff_ms)
        steady = measure_steadily(lambda: backend.evaluate(built, request), setup.noise)
    except (InvalidPoint, EvaluationError) as exc:
        return outcome_of_error(exc)
    if steady.remeasured:
        log.info("%s at %s: timed %d times (spread %.0f%%)%s", context.content_hash()[:12],
                 size.label(), steady.remeasured + 1,
                 100 * timing_spread(steady.measurement), ", still noisy" if steady.noisy else "")
    return Outcome(Status.OK, measurement=steady.measurement, noisy=steady.noisy,
                   remeasured=steady.remeasured)


def outcome_of_error(exc: InvalidPoint | EvaluationError) -> Outcome:
    """The one place where a typed error of a backend becomes a Status. EnvironmentFault
    is neither an InvalidPoint nor an EvaluationError, so no caller catches it to come
    here: the machine's fault is never a variant's Outcome, and never cached."""
    if isinstance(exc, InvalidPoint):  # resources (threads, shared memory) the device lacks
        return Outcome(Status.INVALID, message=str(exc),
                       transient=isinstance(exc, BuildOverBudget))
    status = next((s for cls, s in _STATUS_OF.items() if isinstance(exc, cls)),
                  Status.RUNTIME_ERROR)
    log.info("%s: %s", status.value, exc)
    return Outcome(status, message=str(exc), detail=exc.detail)


def _vanished(built: Artifact) -> bool:
    """The build's file is gone (a backend whose builds are files)."""
    return bool(built.path) and not Path(built.path).exists()


def _shown(params: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items()))

"""An applier wired to a backend, and the journal of its LLM calls: one recipe shared by
tuning sessions and the interactive workbench."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from peak_tune.appliers import make_applier
from peak_tune.appliers.base import Applier, calls_of
from peak_tune.backends.base import Backend, EvalConfig
from peak_tune.core import KernelSpec
from peak_tune.evaluation.cache import Cache

__all__ = ["AppliedWith", "LLMJournal", "wired_applier"]


@dataclass(frozen=True)
class AppliedWith:
    """What an applier is checked against: the backend that builds and runs candidates."""

    backend: Backend
    spec: KernelSpec
    dtype: str
    cache: Cache
    eval_config: EvalConfig
    run_kernels: bool = True  # False under --replay: nothing can run a candidate


def wired_applier(name: str, model: str | None, llm_settings: Mapping[str, Any],
                  against: AppliedWith) -> Applier:
    """The reference applier, or the LLM one wired to the backend's compiler and
    validation, so that compile errors and wrong results go back to the model."""
    if name != "llm":
        return make_applier(name)
    from peak_tune.appliers.llm import (
        LLMApplier,
        LLMConfig,
        backend_compile_check,
        backend_result_check,
    )

    settings = LLMConfig.from_env(model, **dict(llm_settings))
    builds = str(against.cache.builds)
    check = backend_compile_check(against.backend, against.dtype, builds)
    results = backend_result_check(against.backend, against.spec, against.dtype, builds,
                                   against.eval_config) if against.run_kernels else None
    return LLMApplier(settings, compile_check=check, result_check=results,
                      size_symbols=against.spec.size_symbols,
                      build_notes=build_notes(against.backend.name, against.spec,
                                              against.dtype))


def build_notes(backend: str, spec: KernelSpec, dtype: str) -> str:
    """How a candidate is built and checked, for the model's prompt."""
    from peak_tune.backends import build_description

    checks = ", ".join(s.label() for s in spec.check_sizes) or "none"
    return (f"Built with: {build_description(backend, dtype)}.\n"
            f"Checked against a float64 numpy reference ({spec.reference}) at the sizes "
            f"{checks} (multiples of no tile) and at every tuned size: every output "
            f"element must be within the {dtype} tolerance, each run on fresh inputs.")


@dataclass
class LLMJournal:
    """Appends an applier's new LLM call records to the cache's journal (`peak-tune stats`)."""

    cache: Cache
    written: dict[int, int] = field(default_factory=dict)  # records written, per applier

    def write(self, applier: Applier, study: str = "") -> None:
        records = calls_of(applier)
        done = self.written.get(id(applier), 0)
        if not records or len(records) <= done:
            return
        from peak_tune.appliers.llm.stats import append_records

        append_records(self.cache.folder, records[done:], study)
        self.written[id(applier)] = len(records)

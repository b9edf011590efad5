"""A `result_check` for the LLM applier built on a backend's own validation: the
candidate is compiled at one legal tuning point and run through `Backend.evaluate` at
the spec's check sizes (fresh inputs, poisoned outputs, guards, float64 reference), so
the wrong-result repair loop sees exactly the mismatch the tuner would report."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from peak_tune.backends.base import Backend, EvalConfig, EvalRequest
from peak_tune.core import KernelContext, KernelSpec
from peak_tune.errors import CompileError, EvaluationError, InvalidPoint, WrongResult
from peak_tune.evaluation.validation import applicable_sizes

from .compile_check import sample_point

__all__ = ["ResultCheck", "backend_result_check"]

log = logging.getLogger(__name__)

ResultCheck = Callable[[KernelContext], "str | None"]


def backend_result_check(
    backend: Backend, spec: KernelSpec, dtype: str, build_dir: str,
    eval_config: EvalConfig | None = None,
) -> ResultCheck:
    """result_check(context) -> the validator's mismatch summary on a WrongResult, else
    None.

    The variant runs at every check size of the spec that it allows, smallest first, so
    the summary names the smallest failing size (the largest is also timed once, with
    no warm-up). Anything but a wrong result (a crash, a
    timeout, a point the device cannot run, no check size) is left to the tuner's own
    evaluation. Calls are serialised: a backend drives one worker at a time."""
    config = replace(eval_config or EvalConfig(), warmup=0, repeats=1, slow_cutoff_ms=0.0)
    lock = threading.Lock()

    def result_check(context: KernelContext) -> str | None:
        point = sample_point(context)
        sizes = sorted(applicable_sizes(context, point, spec.check_sizes),
                       key=lambda s: _volume(s.as_dict()))
        if not sizes:
            log.debug("no check size fits %s: result check skipped", context.content_hash())
            return None
        request = EvalRequest(spec=spec, context=context, params=point, dtype=dtype,
                              size=sizes[-1], check_sizes=tuple(sizes[:-1]), config=config)
        with lock:
            try:
                artifact = backend.compile(context, point, dtype, build_dir)
                backend.evaluate(artifact, request)
            except WrongResult as exc:
                shown = ", ".join(f"{k}={v}" for k, v in point.items())
                return (exc.detail or str(exc)) + (f"\ntuning parameters: {shown}"
                                                   if shown else "")
            except (CompileError, InvalidPoint) as exc:
                log.debug("result check skipped: %s", exc)
            except EvaluationError as exc:  # crash, timeout: the tuner records those itself
                log.info("result check: %s", exc)
        return None

    return result_check


def _volume(values: dict[str, int]) -> int:
    product = 1
    for value in values.values():
        product *= value
    return product

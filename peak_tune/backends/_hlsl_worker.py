"""The HLSL backend's evaluation worker (a child process; see peak_tune.backends.worker).

`python -m peak_tune.backends._hlsl_worker --request-fd R --response-fd W` owns one
Vulkan device (backends._vulkan): it loads a variant's SPIR-V into a compute pipeline,
validates it at the check sizes and at the size, then times it there by the device's
timestamps, every run on fresh inputs from a secret seed and with fresh poison in its
outputs, each one checked (in full at the check sizes, by a random projection at the
size where the spec declares them: peak_tune.evaluation.validation), the device's caches flushed
before every timed run. A shader cannot reach this process's memory: buffers are bound
with robust buffer access, so its reads and writes past them stay inside them (on
lavapipe the shader runs in this process). A hang or a lost device is the parent's to
end: it kills this process at the deadline.
"""

from __future__ import annotations

import logging
import struct
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from peak_tune.backends._vulkan import Buffer, ComputePipeline, VulkanDevice
from peak_tune.backends._worker_child import serve
from peak_tune.backends.wire import Timing, spec_from_wire
from peak_tune.core import KernelSpec, ProblemSize
from peak_tune.errors import CompileError, UserError
from peak_tune.evaluation.projections import (
    Projection,
    check_projected,
    project_expected,
    projectable,
)
from peak_tune.evaluation.validation import (
    Problem,
    check_outputs,
    compute_expected,
    make_problem,
)
from peak_tune.expr import evaluate_int
from peak_tune.harness.values import secret_seed

_log = logging.getLogger(__name__)

_FLUSH_BYTES = 64 << 20  # more than any GPU's L2 (the H200's is 60 MiB)
_GRID_KEYS = ("grid_x", "grid_y", "grid_z")
_DRAWS_BYTES = 4 << 30  # host memory for the timed runs' drawn problems (_Draws)

_device: list[VulkanDevice] = []


def _vulkan() -> VulkanDevice:
    if not _device:
        _device.append(VulkanDevice())
    return _device[0]


def _info(request: dict[str, Any]) -> dict[str, Any]:
    """What the parent's probe needs; {"available": False, "reason": ...} without one."""
    try:
        device = _vulkan()
    except Exception as exc:  # VulkanUnavailable, a driver's own error
        return {"available": False, "reason": str(exc).splitlines()[0] if str(exc) else
                type(exc).__name__}
    return {"available": True, "name": device.name, "driver": str(device.driver_version),
            "max_threads": device.max_invocations, "max_shared_bytes": device.max_shared_bytes,
            "robust": device.robust, "storage16": device.storage16,
            "cooperative_matrix": device.cooperative_matrix,
            "workgroup_matrix": device.workgroup_matrix,
            "tensor_addressing": device.tensor_addressing}


class _Bound:
    """A problem's buffers on the device and the pipeline that runs the shader on them."""

    def __init__(self, device: VulkanDevice, spirv: bytes, problem: Problem) -> None:
        self.device = device
        self.buffers: dict[str, Buffer] = {b.arg.name: device.buffer(max(b.array.nbytes, 4))
                                           for b in problem.buffers}
        scalars = [a for a in problem.spec.args if a.kind == "scalar"]
        self.push = struct.pack(f"{len(scalars)}I",
                                *(problem.scalars[a.name] for a in scalars))
        ordered = [self.buffers[a.name] for a in problem.spec.args if a.kind == "buffer"]
        self.pipeline: ComputePipeline = device.pipeline(spirv, ordered, len(self.push))

    def run(self, problem: Problem, groups: tuple[int, int, int], flush: Buffer | None,
            round_: int) -> float:
        """Write the inputs and poison, dispatch, read the outputs back; the ms."""
        for buffer in problem.buffers:
            self.device.write(self.buffers[buffer.arg.name], buffer.array)
        elapsed = self.device.dispatch(self.pipeline, groups, self.push, flush, round_)
        for buffer in problem.outputs:
            array = buffer.array
            array[...] = self.device.read(self.buffers[buffer.arg.name], array.dtype,
                                          array.size).reshape(array.shape)
        return elapsed

    def close(self) -> None:
        self.device.destroy(self.pipeline)
        for buffer in self.buffers.values():
            self.device.free(buffer)


def _groups(launch: Mapping[str, str], names: Mapping[str, int]) -> tuple[int, int, int]:
    found = []
    for key in _GRID_KEYS:
        try:
            value = evaluate_int(launch.get(key, "1"), names)
        except Exception as exc:
            raise CompileError(f"compile error: launch {key}: {exc}") from None
        if value < 1:
            raise UserError(f"launch {key} = {value} at {dict(names)}: no thread group")
        found.append(value)
    return found[0], found[1], found[2]


class _Draws:
    """The problems of the runs at one size: drawn once in this worker, each from its
    own secret seed with its reference projections (both sides), and used in turn by
    every evaluation at that size. At 4096 drawing inputs, poison and projections costs
    the host about 0.5 s, twenty times an H200's timed run; drawn once, a run costs its
    upload, dispatch, read-back and check. Reusing them gives a shader nothing to replay:
    it sees only the buffers bound to it, and before each of its runs the inputs are
    written and the outputs poisoned again, so no dispatch can leave anything for the
    next; consecutive runs of an evaluation have different problems (up to _DRAWS_BYTES
    of them, at least two)."""

    def __init__(self, key: str, spec: KernelSpec, size: ProblemSize, dtype: str) -> None:
        self.key = key
        self.base = make_problem(spec, size, dtype, secret_seed())
        entry_bytes = sum(b.array.nbytes for b in self.base.buffers)  # inputs and poison
        self.most = max(2, _DRAWS_BYTES // max(1, entry_bytes))
        self.drawn: list[tuple[Problem, tuple[Projection, ...]]] = []
        self.turn = 0

    def next(self) -> tuple[Problem, tuple[Projection, ...]]:
        """The next run's problem, written into the buffers, and its projections."""
        if len(self.drawn) < self.most and self.turn >= len(self.drawn):
            problem = self.base.drawn(secret_seed())
            self.drawn.append((problem, project_expected(problem, secret_seed())))
        problem, projections = self.drawn[self.turn % len(self.drawn)]
        self.turn += 1
        problem.write()
        return problem, projections


_draws: list[_Draws] = []  # the last size's (the next evaluation is likely at it too)


def _draws_for(request_spec: Any, spec: KernelSpec, size: ProblemSize, dtype: str) -> _Draws:
    key = repr((sorted(request_spec.items()) if isinstance(request_spec, dict)
                else request_spec, size.as_dict(), dtype))
    if not _draws or _draws[0].key != key:
        _draws[:] = [_Draws(key, spec, size, dtype)]
    return _draws[0]


def _validate_and_time(spec: KernelSpec, size: ProblemSize, dtype: str, spirv: bytes,
                       launch: Mapping[str, str], names: Mapping[str, int],
                       timing: Timing | None, flush: Buffer | None,
                       draws: _Draws | None = None) -> list[float]:
    """One run at `size`, checked (in full, or by both projections with `timing` where
    the spec has them); with `timing`, then the timed runs, each on inputs no other run
    of the evaluation had and checked by one projection. The timed runs' ms."""
    device = _vulkan()
    if draws is None or not projectable(spec):
        problem, draws = make_problem(spec, size, dtype, secret_seed()), None
    else:
        problem = draws.base
    groups = _groups(launch, {**size.as_dict(), **names})
    bound = _Bound(device, spirv, problem)
    try:
        if draws is not None:
            one_run_ms = _drawn_run(bound, draws, groups, None, 0, both=True)
        else:
            one_run_ms = _checked_run(bound, problem, groups, None, 0)
        if timing is None:
            return []
        runs = range(1, 1 + timing.repeat_count(one_run_ms))
        if draws is not None:
            return [_drawn_run(bound, draws, groups, flush, index, both=False)
                    for index in runs]
        return [_checked_run(bound, problem, groups, flush, index) for index in runs]
    finally:
        bound.close()


def _drawn_run(bound: _Bound, draws: _Draws, groups: tuple[int, int, int],
               flush: Buffer | None, round_: int, both: bool) -> float:
    """A run on the next drawn problem, checked by both projections or by one of them
    chosen at random (either sees an error in any element)."""
    problem, projections = draws.next()
    if not both:
        chosen = np.random.default_rng(secret_seed()).integers(len(projections))
        projections = (projections[int(chosen)],)
    elapsed = bound.run(problem, groups, flush, round_)
    check_projected(problem, projections)
    return elapsed


def _checked_run(bound: _Bound, problem: Problem, groups: tuple[int, int, int],
                 flush: Buffer | None, round_: int) -> float:
    """A run on fresh inputs, checked in full (the check sizes, and a spec that declares
    no projections: the drawn problems serve the rest)."""
    problem = problem.refill(secret_seed())
    expected = compute_expected(problem)
    elapsed = bound.run(problem, groups, flush, round_)
    check_outputs(problem, expected)
    return elapsed


def _evaluate(request: dict[str, Any]) -> dict[str, Any]:
    spec = spec_from_wire(request["spec"])
    dtype = str(request["dtype"])
    size = ProblemSize.of(request["size"])
    timing = Timing.of(request["config"])
    with open(str(request["spirv"]), "rb") as handle:
        spirv = handle.read()
    names = {**{k: int(v) for k, v in request["params"].items()},
             **{k: int(v) for k, v in request["group"].items()}}
    launch = dict(request["launch"])
    flush = _flush_buffer()
    for check in request["check_sizes"]:
        _validate_and_time(spec, ProblemSize.of(check), dtype, spirv, launch, names, None,
                           None)
    draws = _draws_for(request["spec"], spec, size, dtype)
    samples = _validate_and_time(spec, size, dtype, spirv, launch, names, timing, flush,
                                 draws)
    return {"samples_ms": samples}


_flush: list[Buffer] = []


def _flush_buffer() -> Buffer:
    if not _flush:
        _flush.append(_vulkan().buffer(_FLUSH_BYTES))
    return _flush[0]


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    np.seterr(all="ignore")
    return serve({"info": _info, "evaluate": _evaluate})


if __name__ == "__main__":
    sys.exit(main())

"""Judging a host backend's runs in the tuner's process, where the kernel cannot reach.

The kernel runs in a job process (peak_tune.backends.worker: forked per evaluation by
a worker that is a child subreaper) on buffers in a shared arena (peak_tune.harness.
arena), inputs mapped read-only there. This side writes every input and poison while the
job is stopped, flushes the caches, sends one run's request and only then resumes the
job, stops it again when it replies, judges that run's output, and times the run by its
own clock as well. So:

- every run, timed ones included, has fresh inputs from a secret seed, which no thread
  of the kernel's sees before the call, and is checked (in full at the check sizes; by a
  random projection at the tuned size when the spec declares them, see
  validation.check_projected; in full otherwise);
- the verdict never travels through the worker: a forged reply can at most lie about the
  time, and that lie is bounded by the judge's own clock: if the median reported time is
  below `CONFIRMED` x (the median the judge saw, each run's round trip less the job's
  reply floor, taken before the kernel was loaded, less `CONFIRM_SLACK_MS`), the
  judge's times replace the reported ones;
  and no speed above the device's peak passes (the backend's check);
- after every reply, and at the end of the job, the processes the kernel started are
  looked for under the worker (isolation): one found fails the evaluation, and the
  worker kills them all.

Work that needs no kernel is done ahead where the backend has a core to spare (while its
compiler builds the next variant: `work_ahead`): the next evaluation's job is forked, and
the timed runs' inputs, poison and projections are drawn from secret seeds into the
tuner's own memory, to be written into the arena only while the job is stopped, just
before their run. The kernel can see them no earlier than when drawn inline.
"""

from __future__ import annotations

import ctypes
import logging
import statistics
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from peak_tune.backends.wire import Timing, spec_to_wire
from peak_tune.backends.worker import WorkerProcess
from peak_tune.core import KernelSpec, ProblemSize
from peak_tune.errors import EvaluationError, KernelCrash, KernelTimeout, WrongResult
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
    guard_elements,
    make_problem,
    numpy_dtype,
    storage_bytes,
)
from peak_tune.harness.arena import Arena
from peak_tune.harness.values import secret_seed

__all__ = ["CacheFlusher", "HostJudge", "RunTarget"]

_log = logging.getLogger(__name__)

_FLUSH_MIN_BYTES = 8 << 20
_FLUSH_MAX_BYTES = 256 << 20
_KEPT_PROBLEMS = 8  # (spec, size, dtype) arenas kept between evaluations
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters
# Reported times must reach this share of what the judge's clock saw, less this slack.
# The round trip also holds the job's wake-up and the time before the judge gets a core
# back from threads that spin after a call (OpenMP's pool, OpenBLAS's): 0.3-0.9 ms a run
# for OpenMP kernels at 512 on a 2-core VM, and up to 4x numpy's own time at 512 when
# the judge's times replaced its reported ones with a 0.5 ms slack.
CONFIRMED = 0.5
CONFIRM_SLACK_MS = 3.0
FLOOR_PINGS = 5  # empty round trips per evaluation that set its reply floor


@dataclass(frozen=True)
class RunTarget:
    """What the worker calls: a compiled kernel (library, entry) or the vendor."""

    vendor: bool
    library: str = ""
    entry: str = ""


class CacheFlusher:
    """Evicts the caches by reading and writing a buffer larger than the last level."""

    def __init__(self) -> None:
        self._buffer = np.ones(_flush_bytes() // 8)

    def flush(self) -> None:
        self._buffer += 1.0


def _flush_bytes() -> int:
    """1.5 x the largest cache sysfs reports, within [8 MiB, 256 MiB]."""
    largest = 0
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            largest = max(largest, int(digits) * scale)
    return min(max(largest * 3 // 2, _FLUSH_MIN_BYTES), _FLUSH_MAX_BYTES)


_Key = tuple[Any, ...]  # (spec name, spec args, size, dtype)


@dataclass(frozen=True)
class _Drawn:
    """One timed run's inputs and poison (not yet written) and its projections."""

    problem: Problem
    projections: tuple[Projection, ...] | None


@dataclass
class _Kept:
    """One (spec, size, dtype)'s buffers in their arena, refilled for every run."""

    arena: Arena
    problem: Problem
    layout: list[dict[str, Any]]


def _keep_heap() -> None:
    """Let glibc keep freed blocks of up to 1 GiB in the heap: each run's temporaries (a
    few MB of inputs, poison and float64 copies) then reuse memory instead of being mapped
    and faulted in afresh, which took 3 of the 4 ms of a run's projections at 512."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30)
        libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    except (OSError, AttributeError):  # not glibc: only slower
        pass


class HostJudge:
    """Runs and judges a host backend's kernels; one instance per worker, one thread."""

    def __init__(self, worker: WorkerProcess) -> None:
        _keep_heap()
        self._worker = worker
        self._kept: dict[tuple[Any, ...], _Kept] = {}
        self._flusher: CacheFlusher | None = None
        self._prepared: set[str] = set()  # arenas this evaluation's job has bound its call to
        self._ahead: deque[_Drawn] = deque()  # drawn for `_ahead_key`'s timed runs
        self._ahead_key: _Key | None = None  # the last problem timed
        self._ahead_count = 0  # its timed runs
        self._ahead_timeout_s = 0.0

    def work_ahead(self) -> bool:
        """Do one piece of the next evaluation's work that needs no kernel (see the module
        docstring); False when there is none left. For the time a compiler runs."""
        if self._ahead_key is None or not self._worker.running:
            return False
        if self._worker.job_pid < 0:
            try:
                self._worker.begin_job(self._ahead_timeout_s)
            except EvaluationError:  # no kernel's fault: the next evaluation starts afresh
                self._worker.stop()
                return False
            return True
        if len(self._ahead) >= self._ahead_count:
            return False
        kept = self._kept.get(self._ahead_key)
        if kept is None:
            return False
        self._ahead.append(_draw(kept, flush=True))
        return True

    def close(self) -> None:
        self._ahead.clear()
        for kept in self._kept.values():
            kept.arena.close()
        self._kept.clear()

    def measure(self, spec: KernelSpec, dtype: str, size: ProblemSize,
                check_sizes: tuple[ProblemSize, ...], timing: Timing, target: RunTarget,
                timeout_s: float) -> list[float]:
        """Validate at every check size and at `size`, then time at `size`: every run on
        new inputs and checked. Samples in ms; WrongResult, KernelCrash, KernelTimeout."""
        deadline = time.monotonic() + timeout_s
        blas = threadpool_limits(limits=1, user_api="blas")  # none spinning beside a run
        self._prepared.clear()  # a new job
        try:
            if not self._worker.job_ready():  # none forked ahead, or it has gone
                self._worker.begin_job(timeout_s)
            floor_ms = self._reply_floor_ms(deadline)
            for check in check_sizes:
                self._run(spec, check, dtype, target, deadline, project=False)
            one_run_ms, _ = self._run(spec, size, dtype, target, deadline)
            reported: list[float] = []
            seen: list[float] = []
            count = timing.repeat_count(one_run_ms)
            self._plan_ahead(_key(spec, size, dtype), count, timeout_s)
            while len(reported) < count:
                run = self._run(spec, size, dtype, target, deadline, flush=True)
                reported.append(run[0])
                seen.append(max(run[1] - floor_ms, 0.0))
        except (WrongResult, KernelCrash):
            self._end_job(deadline)  # a breach found there says more than the failure
            self.close()  # guards may be dirty: fresh arenas next time
            raise
        except KernelTimeout:
            self.close()
            raise KernelTimeout(f"kernel timed out after {timeout_s:g} s") from None
        finally:
            blas.restore_original_limits()
        self._end_job(deadline)
        if statistics.median(reported) < CONFIRMED * (statistics.median(seen) -
                                                      CONFIRM_SLACK_MS):
            _log.warning("timings reported by the worker (median %.3f ms) are below what "
                         "the judge saw (%.3f ms): the judge's are used",
                         statistics.median(reported), statistics.median(seen))
            return seen
        return reported

    def _reply_floor_ms(self, deadline: float) -> float:
        """What a run's round trip holds besides the run: the median round trip of
        requests that do nothing, through the same resume and stop as a run, in this job
        before it loads the kernel (so no kernel can slow them to widen its margin). The
        worker's wake-up after a stop can take a scheduler tick on a busy machine, and a
        floor taken once at start, without the stop, read that as a lying kernel."""
        trips = []
        for _ in range(FLOOR_PINGS):
            self._worker.call({"op": "ping"}, self._remaining(deadline), pause_after=True)
            trips.append(self._worker.last_round_trip_s * 1e3)
        return statistics.median(trips)

    def _plan_ahead(self, key: _Key, count: int, timeout_s: float) -> None:
        if key != self._ahead_key:
            self._ahead.clear()
        self._ahead_key, self._ahead_count, self._ahead_timeout_s = key, count, timeout_s

    def _drawn(self, kept: _Kept, key: _Key, project: bool, flush: bool) -> _Drawn:
        """This run's inputs: drawn ahead for a timed run where there are, else now."""
        if flush and project and self._ahead and key == self._ahead_key:
            drawn = self._ahead.popleft()
            if drawn.problem.buffers is kept.problem.buffers:
                return drawn
            self._ahead.clear()  # drawn for an arena since closed
        return _draw(kept, flush, project)

    @staticmethod
    def _remaining(deadline: float) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise KernelTimeout("kernel timed out: the evaluation's time limit passed")
        return remaining

    def _end_job(self, deadline: float) -> None:
        self._worker.end_job(max(deadline - time.monotonic(), 0.0) + 5.0)
        self._worker.check_clean()

    def _run(self, spec: KernelSpec, size: ProblemSize, dtype: str, target: RunTarget,
             deadline: float, project: bool = True,
             flush: bool = False) -> tuple[float, float]:
        """One run on fresh inputs, judged; its duration in ms as the worker reported it,
        and the judge's round trip for it."""
        key = _key(spec, size, dtype)
        kept = self._problem(key, spec, size, dtype)
        if kept.arena.path not in self._prepared:  # once per size and job
            request = {"op": "prepare", "arena": kept.arena.path, "regions": kept.layout,
                       "spec": spec_to_wire(spec), "dtype": dtype, "size": size.as_dict(),
                       "vendor": target.vendor, "library": target.library,
                       "entry": target.entry}
            # the inputs are written while no thread of the job runs
            self._worker.call(request, self._remaining(deadline), pause_after=True)
            self._prepared.add(kept.arena.path)
        drawn = self._drawn(kept, key, project, flush)
        problem, projections = drawn.problem, drawn.projections
        problem.write()
        expected = compute_expected(problem) if projections is None else None
        if flush:
            if self._flusher is None:
                self._flusher = CacheFlusher()
            self._flusher.flush()
        # resumes the job, and stops it again until the next request: nothing of it runs
        # while we judge and write the next inputs
        reply = self._worker.call({"op": "go", "arena": kept.arena.path},
                                  self._remaining(deadline), pause_after=True)
        reported_ms = float(reply["elapsed_ns"]) / 1e6
        round_trip_ms = self._worker.last_round_trip_s * 1e3
        with np.errstate(all="ignore"):
            if expected is None:
                assert projections is not None
                check_projected(problem, projections)
            else:
                check_outputs(problem, expected)
        return reported_ms, round_trip_ms

    def _problem(self, key: _Key, spec: KernelSpec, size: ProblemSize, dtype: str) -> _Kept:
        kept = self._kept.pop(key, None)
        if kept is None:
            kept = _arena_problem(spec, size, dtype)
            while len(self._kept) >= _KEPT_PROBLEMS:
                self._kept.pop(next(iter(self._kept))).arena.close()
        self._kept[key] = kept  # most recent last
        return kept


def _key(spec: KernelSpec, size: ProblemSize, dtype: str) -> _Key:
    return (spec.name, spec.args, size.values, dtype)


def _draw(kept: _Kept, flush: bool, project: bool = True) -> _Drawn:
    """New inputs and poison from a secret seed, and the projections that will judge
    the run (timed runs: one side each, at random); None where the output is checked
    in full."""
    problem = kept.problem.drawn(secret_seed())
    if project and projectable(problem.spec):
        return _Drawn(problem, project_expected(problem, secret_seed(), one_side=flush))
    return _Drawn(problem, None)


def _arena_problem(spec: KernelSpec, size: ProblemSize, dtype: str) -> _Kept:
    """A problem whose buffers lie in a new arena, and the layout the worker maps."""
    itemsize = numpy_dtype(dtype).itemsize
    arena = Arena(Arena.bytes_for(storage_bytes(spec, size, dtype)))
    problem = make_problem(spec, size, dtype, secret_seed(), allocate=arena.allocate)
    layout = []
    for buffer, region in zip(problem.buffers, arena.regions, strict=True):
        layout.append({"name": buffer.arg.name, "offset": region.offset,
                       "data_offset": region.offset + guard_elements(itemsize) * itemsize,
                       "count": buffer.count, "shape": list(buffer.shape),
                       "protected": [list(p) for p in region.protected],
                       "read_only": list(region.read_only())
                       if buffer.arg.intent == "in" else []})
    return _Kept(arena, problem, layout)


def layout_arrays(mapping: Any, layout: list[Mapping[str, Any]],
                  dtype: np.dtype) -> dict[str, np.ndarray]:
    """The worker's numpy views of the data of each buffer (for the vendor)."""
    return {b["name"]: np.frombuffer(mapping, dtype, b["count"], b["data_offset"])
            .reshape(b["shape"]) for b in layout}

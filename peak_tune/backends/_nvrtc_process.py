"""NVRTC in compiler processes: a build that can be stopped, and a crash that stays there.

A thread inside nvrtcCompileProgram cannot be stopped, so one runaway build (an LLM's
`#pragma unroll` over a huge loop) would hold a build thread, and the tuner's exit, for
as long as it runs. Each build runs instead in a compiler process of this module
(a `WorkerProcess`, one per build running at once, reused): past its time limit the
process is killed and the next build starts a fresh one; a crash of NVRTC ends only that
process and becomes a compile error. Compiler processes run at the tuner's priority by
default. Lowering theirs (PEAK_TUNE_BUILD_NICENESS, 1 to 19 steps below) was meant to
keep the timing worker and the driver's asks from waiting behind a study's builds for a
core; measured on an H100 (fp16 and bf16 4096 searches), +5 kept the GPU busy 46-54% of
the time against 57-63% at 0: the builds are what feeds the device, and the sampler
processes took cores from them.

Parent side: `build_cubin`. Child side: `python -m peak_tune.backends._nvrtc_process`.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from peak_tune.atomic_files import write_atomically
from peak_tune.backends._nvrtc import compile_cubin, cubin_resources, ptxas_resources
from peak_tune.backends._worker_child import serve
from peak_tune.backends.base import over_budget_message
from peak_tune.backends.worker import WorkerProcess
from peak_tune.errors import (
    COMPILER_KILLED,
    OUT_OF_MEMORY,
    BuildOverBudget,
    CompileError,
    EnvironmentFault,
    KernelCrash,
    KernelTimeout,
    UserError,
)

# write_atomically: re-exported from _files
__all__ = ["BUILD_NICENESS", "NVRTC_TIMEOUT_S", "build_cubin", "build_niceness",
           "write_atomically"]

NVRTC_TIMEOUT_S = 300.0  # a build longer than this is taken for a hung compiler
BUILD_NICENESS = 0  # compiler processes' steps below the tuner's priority (os.nice)
NICENESS_VARIABLE = "PEAK_TUNE_BUILD_NICENESS"
_MODULE = "peak_tune.backends._nvrtc_process"


class _Compilers:
    """Idle compiler processes; a build takes one or starts one, and gives it back."""

    def __init__(self) -> None:
        self._idle: list[WorkerProcess] = []
        self._started: list[WorkerProcess] = []
        self._lock = threading.Lock()

    @contextmanager
    def one(self) -> Iterator[WorkerProcess]:
        with self._lock:
            if self._idle:
                compiler = self._idle.pop()
            else:
                build_niceness()  # a bad setting is the user's error, not a crash there
                compiler = WorkerProcess(_MODULE)
                self._started.append(compiler)
        try:
            yield compiler
        finally:
            with self._lock:
                self._idle.append(compiler)

    def stop_all(self) -> None:
        with self._lock:
            for compiler in self._started:
                compiler.stop()


def build_niceness() -> int:
    """The compiler processes' steps below the tuner's priority: PEAK_TUNE_BUILD_NICENESS
    where set, else BUILD_NICENESS."""
    setting = os.environ.get(NICENESS_VARIABLE, "").strip()
    if not setting:
        return BUILD_NICENESS
    if not setting.isdigit() or int(setting) > 19:
        raise UserError(f"{NICENESS_VARIABLE} must be a whole number from 0 to 19, "
                        f"not {setting!r}")
    return int(setting)


_COMPILERS = _Compilers()
atexit.register(_COMPILERS.stop_all)


def build_cubin(source: str, options: Sequence[str], name: str, entry: str, cubin: Path,
                time_limit_s: float = 0.0) -> tuple[str, dict[str, int]]:
    """Compile `source` into the file `cubin` in a compiler process; NVRTC's log and the
    entry's resources (registers, stack, static shared memory, spills).

    Raises CompileError (also for a crash of NVRTC, or a build past NVRTC_TIMEOUT_S),
    InvalidPoint for a register limit below what an instruction needs, BuildOverBudget
    past a `time_limit_s` shorter than NVRTC_TIMEOUT_S, EnvironmentFault for a full disk
    or memory that ran out in the compiler process.
    """
    budget = 0 < time_limit_s < NVRTC_TIMEOUT_S
    request = {"op": "compile", "source": source, "options": list(options), "name": name,
               "entry": entry, "cubin": str(cubin)}
    with _COMPILERS.one() as compiler:
        try:
            reply = compiler.call(request, time_limit_s if budget else NVRTC_TIMEOUT_S)
        except KernelTimeout:
            if budget:
                raise BuildOverBudget(over_budget_message(time_limit_s)) from None
            raise CompileError(f"compile error: NVRTC ran past {NVRTC_TIMEOUT_S:g} s and "
                               "was stopped", detail="$ nvrtc " + " ".join(options)) from None
        except KernelCrash as exc:
            if exc.signal_number == signal.SIGKILL:  # killed from outside: the OOM killer
                raise EnvironmentFault(COMPILER_KILLED, "NVRTC's process was killed "
                                       "(SIGKILL: out of memory, or another process)") from None
            how = str(exc).removeprefix("kernel crashed: ")
            raise CompileError(f"compile error: NVRTC crashed ({how})",
                               detail=exc.detail) from None
    if "fault" in reply:  # the machine's, in the compiler process: typed, not a log line
        raise EnvironmentFault(str(reply["fault"]), str(reply["message"]))
    return str(reply["log"]), {k: int(v) for k, v in reply["resources"].items()}


def _compile(request: dict[str, Any]) -> dict[str, Any]:
    """The child's one operation: NVRTC's build, written to request["cubin"]. Resources
    come from the cubin; spills from ptxas's report where the log has it (NVRTC 13.0 was
    seen to give it only for the first build per architecture in a process)."""
    try:
        found = compile_cubin(request["source"], request["options"], request["name"])
        entry = request["entry"]
        resources = {**ptxas_resources(found.log, entry),
                     **cubin_resources(found.cubin, entry)}
        write_atomically(Path(request["cubin"]), found.cubin)
    except EnvironmentFault as fault:  # the disk filled: said as such, not as a crash
        return {"fault": fault.kind, "message": fault.message}
    except MemoryError:
        return {"fault": OUT_OF_MEMORY, "message": "NVRTC's process could not allocate "
                                                   "memory"}
    return {"log": found.log, "resources": resources}


if __name__ == "__main__":
    os.nice(build_niceness())
    sys.exit(serve({"compile": _compile}))

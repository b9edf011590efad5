"""Running a compiler for a build: in a process group of its own, within its limits, and
telling the machine's faults (disk full, out of memory, a killed compiler) from the
source's errors. The C backend (gcc) and the HIP backend (clang) build through here."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from peak_tune.backends.base import over_budget_message
from peak_tune.errors import (
    COMPILER_KILLED,
    DISK_FULL,
    FILE_SIZE_LIMIT,
    OUT_OF_MEMORY,
    BackendUnavailable,
    BuildOverBudget,
    CompileError,
    EnvironmentFault,
    environment_fault,
)

__all__ = ["FaultPattern", "environment_fault_of", "first_error", "kill_group",
           "run_compiler", "run_process_group"]

FaultPattern = tuple[re.Pattern[str], str]  # a compiler's own line for a machine fault
WorkAhead = Callable[[], bool]  # one piece of other work; False when none is left
_ERROR_LINE = re.compile(r"^.*?:(\d+):(?:\d+:)? (?:fatal )?error: (.*)$"  # gcc, clang, dxc
                         r"|^ERROR: [^:]*:(\d+): (.*)$")  # glslang


def run_compiler(command: list[str], time_limit_s: float = 0.0, *, hang_limit_s: float,
                 env: Mapping[str, str] | None = None,
                 faults: Sequence[FaultPattern] = (),
                 while_waiting: WorkAhead | None = None) -> str:
    """Run the compiler; its log, or CompileError naming the first error (BuildOverBudget
    when it outlasts a `time_limit_s` shorter than `hang_limit_s`; EnvironmentFault when
    the disk or memory ran out or the compiler was killed; `faults` adds the compiler's
    own words for those). `env`: variables set for it beside the environment's;
    `while_waiting`: work done while it runs (see run_process_group)."""
    shown = "$ " + shlex.join(command) + "\n"
    budget = 0 < time_limit_s < hang_limit_s
    try:
        returncode, log = run_process_group(
            command, time_limit_s if budget else hang_limit_s, env, while_waiting)
    except subprocess.TimeoutExpired as exc:
        if budget:
            raise BuildOverBudget(over_budget_message(time_limit_s)) from None
        raise CompileError(f"compile error: compiler timed out after {hang_limit_s:g} s",
                           detail=shown) from exc
    except OSError as exc:  # it could not even start (no memory to fork, say)
        raise environment_fault(exc, f"starting {command[0]}") or BackendUnavailable(
            f"cannot run {command[0]}: {exc.strerror}") from exc
    fault = environment_fault_of(log, returncode, faults)
    if fault is not None:
        raise fault
    if returncode != 0:
        raise CompileError(f"compile error: {first_error(log, returncode)}",
                           detail=shown + log)
    return log


def run_process_group(command: list[str], timeout_s: float,
                      env: Mapping[str, str] | None = None,
                      while_waiting: WorkAhead | None = None) -> tuple[int, str]:
    """(exit status, stdout and stderr) of `command`, run in a session of its own: the
    first Ctrl-C at a terminal lets the trial finish, so it must not kill the compiler and
    make the trial a compile error. Past `timeout_s` (or on any exception here) the whole
    process group is killed: gcc alone would leave its cc1 running at 100% of a core.
    `while_waiting` is called, one short piece of work a call, while the command runs and
    it returns True (the compiler takes one core; the other would idle)."""
    started = time.monotonic()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "LC_ALL": "C", **(env or {})},  # plain ASCII
                          start_new_session=True) as process:
        try:
            while while_waiting is not None and process.poll() is None and while_waiting():
                pass
            remaining = max(timeout_s - (time.monotonic() - started), 1e-3)
            out, err = process.communicate(timeout=remaining)
        except BaseException:
            kill_group(process.pid)  # before the leader is reaped: its id is still ours
            process.communicate()
            raise
        if process.returncode < 0:  # the driver itself was killed: its children may live on
            kill_group(process.pid)
    return process.returncode, out + err


def kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


# What gcc, as and ld print when the machine, not the source, made a build fail. Their
# output is the only signal, so this table and `environment_fault_of` are the one place
# that reads it; lines about the source itself (an `#error` of the kernel) are skipped.
_FAULT_WORDS = (
    ("No space left on device", DISK_FULL),
    ("Disk quota exceeded", DISK_FULL),
    ("File size limit exceeded", FILE_SIZE_LIMIT),
    ("File too large", FILE_SIZE_LIMIT),
    ("virtual memory exhausted", OUT_OF_MEMORY),
    ("out of memory allocating", OUT_OF_MEMORY),
    ("Cannot allocate memory", OUT_OF_MEMORY),
    ("Killed signal terminated program", COMPILER_KILLED),
    ("Terminated signal terminated program", COMPILER_KILLED),
)
_ABOUT_THE_SOURCE = re.compile(r"^(?:[^\s:]+:\d+:(?:\d+:)? |\s*\d*\s*\|)")


def environment_fault_of(log: str, returncode: int, faults: Sequence[FaultPattern] = ()
                         ) -> EnvironmentFault | None:
    """The fault of the machine that a failed build's log or exit status shows, or None."""
    if returncode == 0:
        return None
    if returncode < 0:
        how = _signal_name(-returncode)
        if -returncode == signal.SIGXFSZ:
            return EnvironmentFault(FILE_SIZE_LIMIT, f"the compiler was stopped by {how}")
        return EnvironmentFault(COMPILER_KILLED, f"the compiler was killed by {how} (by "
                                "the out-of-memory killer, or from outside)")
    for line in log.splitlines():
        if _ABOUT_THE_SOURCE.match(line):
            continue
        for words, kind in _FAULT_WORDS:
            if words in line:
                return EnvironmentFault(kind, f"the build failed: {line.strip()}")
        for pattern, kind in faults:
            if pattern.match(line.strip()):
                return EnvironmentFault(kind, f"the build failed: {line.strip()}")
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def first_error(log: str, returncode: int) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in lines:
        found = _ERROR_LINE.match(line)
        if found:
            number, text = (found.group(1), found.group(2)) if found.group(1) else \
                (found.group(3), found.group(4))
            return f"line {number}: {text.strip()}"
    for line in lines:
        if "error" in line.lower() or "undefined reference" in line:
            return line
    return lines[0] if lines else f"compiler exited with status {returncode}"

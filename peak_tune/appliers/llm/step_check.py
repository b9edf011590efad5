"""Does a reply do what its step says? Checks run on every code reply before it is
accepted, each failure going back to the model as a repair (LLMApplier._run_pass):

- the step changed the kernel or its launch (an echoed kernel is not a step; judged
  after its last pass, as one pass of several may leave a region as it was);
- every tuning parameter that must be there is live: the kernel preprocessed with two
  of its allowed values differs (a dropped earlier step, or a parameter hard-coded with
  `#define NAME 8`, leaves the tuner searching a dead macro).

Liveness is judged by the C preprocessor (`cpp`, or `cc -E`), which reads CUDA, HIP and
HLSL as well as C once `#include` lines are left out (the parameters are the kernel's
own macros, never a header's) and `#pragma` lines are made ordinary text (a preprocessor
leaves pragmas it does not know unexpanded, and `schedule(static, OMP_CHUNK)` or
`unroll UNROLL_K` must count). Where no preprocessor is installed, or the kernel does
not preprocess at a legal point, a textual check stands in: the name must be used
somewhere other than its own guard and `#define`.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from peak_tune.core import KernelContext, ParamDomain
from peak_tune.errors import ApplyError

from .compile_check import sample_point

__all__ = ["DeadParameterError", "UnchangedError", "dead_parameters", "require_change"]

_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b.*$", re.MULTILINE)
_PRAGMA = re.compile(r"^[ \t]*#[ \t]*pragma\b", re.MULTILINE)
_PREPROCESS_TIMEOUT_S = 30.0
_PREPROCESSORS = 4  # preprocessor processes at once


class UnchangedError(ApplyError):
    """The reply's code is the kernel it was given: the step was not applied."""


class DeadParameterError(ApplyError):
    """A tuning parameter no longer changes the code (dropped, or hard-coded)."""


def require_change(before: KernelContext, after: KernelContext, tid: str) -> None:
    """UnchangedError when `after` has `before`'s code (but for whitespace) and launch."""
    if before.source.split() == after.source.split() and \
            dict(before.launch) == dict(after.launch):
        raise UnchangedError(
            f"the code sent back is the kernel as it was given: {tid} was not applied")


def dead_parameters(context: KernelContext, names: Sequence[str]) -> list[str]:
    """Those of `names` (tuning parameters of `context`) whose value does not change
    the preprocessed kernel."""
    domains = {p.name: p for p in context.params if p.name in names}
    if not domains:
        return []
    point = sample_point(context)
    base = _preprocessed(context.source, point)
    if base is None or base.startswith("failed:"):  # no preprocessor, or not here: read
        return [n for n in names if n in domains and not _used(context.source, n)]
    varied = {name: {**point, name: other} for name, domain in domains.items()
              if (other := _other_value(domain, point.get(name))) is not None}
    # one preprocessor per parameter, side by side (each is a process of its own)
    with ThreadPoolExecutor(max_workers=min(_PREPROCESSORS, len(varied) or 1)) as pool:
        outputs = dict(zip(varied, pool.map(
            lambda at: _preprocessed(context.source, at), varied.values()), strict=True))
    return [name for name, output in outputs.items() if output == base]


def _other_value(domain: ParamDomain, value: int | None) -> int | None:
    return next((v for v in domain.values if v != value), None)


def _preprocessed(source: str, point: dict[str, int]) -> str | None:
    """The preprocessor's output at `point` (None where it cannot run or failed)."""
    command = _preprocessor()
    if command is None:
        return None
    defines = [f"-D{name}={value}" for name, value in sorted(point.items())]
    try:
        text = _PRAGMA.sub("PT_PRAGMA", _INCLUDE.sub("", source))
        done = subprocess.run([*command, *defines, "-"], input=text,
                              capture_output=True, text=True, timeout=_PREPROCESS_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # a point that fails (an #error of the kernel) differs from one that passes
    return done.stdout if done.returncode == 0 else f"failed: {done.stderr}"


@functools.cache
def _preprocessor() -> tuple[str, ...] | None:
    for program, flags in (("cpp", ("-P", "-w")), ("cc", ("-E", "-P", "-w", "-x", "c")),
                           ("gcc", ("-E", "-P", "-w", "-x", "c"))):
        path = shutil.which(program)
        if path is not None:
            return (path, *flags)
    return None


def _used(source: str, name: str) -> bool:
    """Whether `name` appears in a line other than its own #ifndef / #define / #error."""
    own = re.compile(rf"^\s*#\s*(?:ifndef|ifdef|define|undef)\s+{re.escape(name)}\b|"
                     rf"^\s*#\s*error\b")
    word = re.compile(rf"\b{re.escape(name)}\b")
    return any(word.search(line) and not own.match(line) for line in source.splitlines())

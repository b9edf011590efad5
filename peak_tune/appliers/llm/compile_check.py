"""A `compile_check` for the LLM applier built on a backend's own compile: the repair
loop then sees exactly the errors the tuner would hit."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

from peak_tune.backends.base import Backend
from peak_tune.core import KernelContext
from peak_tune.errors import CompileError, ExpressionError, InvalidPoint
from peak_tune.expr import evaluate_bool

__all__ = ["backend_compile_check", "local_paths_removed", "sample_point"]

_MAX_POINTS = 4096
# an absolute path's folders (a build folder, a temporary one, the user's home)
_FOLDERS = re.compile(r"(?<![\w.])/(?:[^\s/:'\"()\[\]]+/)+(?=[^\s/:'\"()\[\]]+)")


def backend_compile_check(
    backend: Backend, dtype: str, build_dir: str
) -> Callable[[KernelContext], str | None]:
    """compile_check(context) -> the compiler's log on a CompileError, else None.

    The variant is built at one legal tuning point (`sample_point`). A point the device
    cannot run (InvalidPoint: too much shared memory, ...) is not a compile error. The
    log goes to the endpoint: absolute paths in it are cut to their file names."""

    def compile_check(context: KernelContext) -> str | None:
        try:
            backend.compile(context, sample_point(context), dtype, build_dir)
        except CompileError as exc:
            return local_paths_removed(exc.detail or str(exc))
        except InvalidPoint:
            return None
        return None

    return compile_check


def local_paths_removed(log: str) -> str:
    """`log` with every absolute path cut to its last part (`/tmp/pt-x/kernel.c:4:` ->
    `kernel.c:4:`): no folder of this machine goes out with a repair."""
    return _FOLDERS.sub("", log)


def sample_point(context: KernelContext) -> dict[str, int]:
    """The first parameter values (in domain order) that meet every constraint; the
    first values of each domain when none is found among the first points."""
    names = [p.name for p in context.params]
    domains = [p.values for p in context.params]
    for values in itertools.islice(itertools.product(*domains), _MAX_POINTS):
        point = dict(zip(names, values, strict=True))
        try:
            if all(evaluate_bool(c, point) for c in context.constraints):
                return point
        except ExpressionError:
            continue
    return {p.name: p.values[0] for p in context.params if p.values}

"""Compiler libraries that ship inside other packages' wheels or sources (DXC's in
compushady, Slang's in slangpy), or that a variable names, and how each runs as a
command (`python -m peak_tune.backends._dxc_library --library LIB ...`) in a process of
its own."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import NoReturn

__all__ = ["exit_past_destructors", "library_command", "packaged_library"]

# (library, the arguments before the output flag, those after its value) ->
# (built, the module, the compiler's messages)
Build = Callable[[str, list[str], list[str]], tuple[bool, bytes, str]]


def packaged_library(variable: str, package: str, pattern: str) -> str | None:
    """$`variable` when set (None if it names no file), else the first file matching
    `pattern` (a glob below the installed `package`'s folder), else None."""
    named = os.environ.get(variable)
    if named:
        return named if Path(named).is_file() else None
    try:
        spec = find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.glob(pattern))
    return str(found[0]) if found else None


def library_command(argv: list[str], output_flag: str, usage: str, build: Build) -> int:
    """`--library LIB ARGS... OUTPUT_FLAG OUTPUT ...` as the compiler's own command: its
    messages on stderr, the module written to OUTPUT; 1 when it built nothing, 2 for a
    command line of another form."""
    if len(argv) < 5 or argv[0] != "--library" or output_flag not in argv:
        print(f"usage: {usage}", file=sys.stderr)
        return 2
    library, rest = argv[1], argv[2:]
    at = rest.index(output_flag)
    built, module, messages = build(library, rest[:at], rest[at + 2:])
    if messages:
        print(messages, file=sys.stderr, end="")
    if not built or not module:
        return 1
    Path(rest[at + 1]).write_bytes(module)
    return 0


def exit_past_destructors(code: int) -> NoReturn:
    """Leave now, past the library's static destructors: the module is written, and a
    library torn down at exit is one more place for a third-party build to hang."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

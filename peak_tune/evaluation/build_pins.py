"""Builds held outside the cache while they run.

The cache's builds folder is the user's to clear, even under a running tuner. A build is
linked (or, across file systems, copied) into a private folder as soon as it is built, and
the worker loads that name: clearing the cache then removes the cache's name, not the file
about to be loaded, and the kernel is never blamed for the user's `rm -rf`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

from peak_tune.backends.base import Artifact

KEPT = 64  # pinned files kept; a loaded library outlives its name, so older ones can go


class BuildPins:
    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._folder: Path | None = None
        self._pinned: OrderedDict[str, Path] = OrderedDict()  # build path -> pinned name
        self._lock = threading.Lock()

    def pin(self, built: Artifact) -> Artifact:
        """`built` under its pinned name; `built` itself when its file is already gone
        (the caller finds it missing and builds again)."""
        if not built.path:
            return built
        with self._lock:
            pinned = self._pinned.get(built.path)
            if pinned is None or not pinned.exists():
                pinned = self._place(Path(built.path))
                if pinned is None:
                    return built
                self._pinned[built.path] = pinned
            self._pinned.move_to_end(built.path)
            while len(self._pinned) > self._kept:
                _, oldest = self._pinned.popitem(last=False)
                oldest.unlink(missing_ok=True)
        return replace(built, path=str(pinned))

    def _place(self, source: Path) -> Path | None:
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="peak-tune-running-"))
            weakref.finalize(self, shutil.rmtree, self._folder, ignore_errors=True)
        target = self._folder / source.name
        target.unlink(missing_ok=True)
        try:
            os.link(source, target)
        except FileNotFoundError:
            return None
        except OSError:  # another file system, or links not allowed: a copy
            try:
                shutil.copyfile(source, target)
            except FileNotFoundError:
                target.unlink(missing_ok=True)
                return None
        return target

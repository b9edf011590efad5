"""Shared memory for host backends: the judge writes inputs and reads outputs in its own
process, the worker runs the kernel on the same pages.

An arena is one file under /dev/shm (the temp folder where that is missing), mapped by
both processes. Each buffer's guarded storage (validation.GuardedBuffer: guard bytes,
data, guard bytes) lies between runs of pages that the worker maps PROT_NONE, so a write
or read further past a buffer than its guard faults at once (SIGSEGV: a crash) instead of
landing in other memory. The data starts 64-byte aligned and the storage ends right
before the trailing protected pages.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["PROTECTED_BYTES", "PROT_NONE", "PROT_READ", "Arena", "Region", "map_for_kernel",
           "set_access"]

PAGE = mmap.PAGESIZE
PROT_NONE, PROT_READ = 0, 1
PROTECTED_BYTES = 16 * PAGE  # PROT_NONE pages before and after every buffer
_ALIGN = 64


@dataclass(frozen=True)
class Region:
    """Where one buffer's storage lies in the arena (bytes) and where the protected
    pages around it are."""

    offset: int
    nbytes: int
    protected: tuple[tuple[int, int], ...]  # (offset, length) of PROT_NONE ranges

    def read_only(self) -> tuple[int, int]:
        """(offset, length) of the pages holding the storage: read-only in the worker for
        an input (a kernel that writes its inputs, even to put them back, faults)."""
        start = self.offset - self.offset % PAGE
        return start, self.protected[1][0] - start


def _shm_folder() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else tempfile.gettempdir()


class Arena:
    """The judge's side: one shared file, carved into guarded regions as buffers are
    allocated (`allocate` fits validation.make_problem's `allocate`)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.path = str(Path(_shm_folder()) / f"peak-tune-arena-{uuid.uuid4().hex}")
        self.capacity = capacity_bytes
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, capacity_bytes)
            self._map = mmap.mmap(fd, capacity_bytes)
        finally:
            os.close(fd)
        self.regions: list[Region] = []
        self._used = 0

    @staticmethod
    def bytes_for(storage_bytes: list[int]) -> int:
        """Capacity that fits buffers of these storage sizes."""
        return sum(_region_bytes(n) for n in storage_bytes)

    def allocate(self, nbytes: int) -> np.ndarray:
        """A uint8 view of a fresh region's storage."""
        size = _region_bytes(nbytes)
        if self._used + size > self.capacity:
            raise MemoryError(f"arena of {self.capacity} bytes is full")
        base = self._used
        data_end = base + size - PROTECTED_BYTES  # page aligned
        start = data_end - nbytes
        start -= start % _ALIGN  # storage start 64-byte aligned: so is the data
        region = Region(start, nbytes, ((base, PROTECTED_BYTES), (data_end, PROTECTED_BYTES)))
        self.regions.append(region)
        self._used += size
        return np.frombuffer(self._map, np.uint8, nbytes, start)

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _region_bytes(nbytes: int) -> int:
    inner = -(-(nbytes + _ALIGN) // PAGE) * PAGE
    return inner + 2 * PROTECTED_BYTES


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def map_for_kernel(path: str, protected: list[tuple[int, int]],
                   read_only: list[tuple[int, int]]) -> tuple[mmap.mmap, int]:
    """The worker's side: map the arena and make the protected ranges PROT_NONE, the
    `read_only` ones (inputs) too until a call opens them (set_access). Returns the
    mapping (keep it) and its base address."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        mapping = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    set_access(base, protected, PROT_NONE)
    set_access(base, read_only, PROT_NONE)  # readable only during a call: see set_access
    return mapping, base


def set_access(base: int, ranges: list[tuple[int, int]], prot: int) -> None:
    """mprotect each (offset, length) of the mapping at `base`. The worker keeps the
    inputs PROT_NONE except during the timed call (PROT_READ): a thread a kernel left
    running cannot start on a run's inputs before the call does."""
    for offset, length in ranges:
        if _libc.mprotect(base + offset, length, prot) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed on the arena")

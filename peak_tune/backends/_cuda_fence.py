"""Device buffers fenced by unmapped memory (CUDA's virtual memory management).

A guard region inside an allocation sees a stray write only if it changes a byte; a
kernel that writes back the value it found past its output, or reaches past the guard
into some other allocation, leaves no trace there. Here each run's guarded storage is
placed at the very end of a mapping whose neighbours in the address space are reserved
and never mapped: the first byte past the storage (rounded up to 256 bytes, so that the
buffer starts aligned as cudaMalloc's do) and every byte up to `_FENCE_BYTES` before or
after the mapping are unmapped, so any access there ends the kernel with an illegal-
address fault, whatever it writes. The mapping's slack in front of the storage (the
allocation granularity, 2 MiB on current GPUs, leaves some) is filled with a fixed byte
and counted on every check, as the guards are.

Mappings are expensive to make and cheap to reuse: blocks are kept per size and handed
out again (their contents are rewritten by every run). Where the driver has no virtual
memory management (CuPy on ROCm, an old driver) `FencedBlocks.available` is False and the
caller allocates plainly; the guards inside the storage still apply.
"""

from __future__ import annotations

import ctypes
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

__all__ = ["SLACK_BYTE", "Block", "FencedBlocks"]

_log = logging.getLogger(__name__)

SLACK_BYTE = 0xA5  # the slack in front of the storage holds this in every byte
_ALIGN = 256  # the storage's size is rounded up to this: its start stays aligned
_FENCE_BYTES = 1 << 30  # unmapped address space reserved before and after each mapping
_KEEP_BYTES = 24 << 30  # mapped bytes kept for reuse; beyond this, returned blocks go


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", _Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_PINNED, _ON_DEVICE, _READ_WRITE = 1, 1, 3  # CU_MEM_ALLOCATION_TYPE_PINNED, ..._LOCATION_
# TYPE_DEVICE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE


@dataclass
class Block:
    """One mapping: `storage` (uint8, `nbytes` long) ends where the mapping ends; `slack`
    (uint8) is the mapping before it, which its user fills with SLACK_BYTE before each
    run."""

    nbytes: int
    storage: Any
    slack: Any
    reserved: int  # start of the reserved address range
    reserved_bytes: int
    mapped: int  # start of the mapping
    mapped_bytes: int
    handle: int


def _rounded(nbytes: int, unit: int) -> int:
    return -(-nbytes // unit) * unit


class FencedBlocks:
    """Fenced blocks by size, made on first need and reused."""

    def __init__(self, device: int = 0) -> None:
        self.device = device
        self.free: dict[int, list[Block]] = defaultdict(list)
        self.kept_bytes = 0
        self._cuda: Any = None
        self._prop = _AllocationProp()
        self._granularity = 0
        self.available = self._load()

    def _load(self) -> bool:
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
            for name in ("cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess",
                         "cuMemGetAllocationGranularity"):
                getattr(cuda, name)
        except (OSError, AttributeError) as exc:
            _log.info("no fenced buffers (CUDA virtual memory management): %s", exc)
            return False
        prop = self._prop
        prop.type = _PINNED
        prop.location = _Location(_ON_DEVICE, self.device)
        granularity = ctypes.c_size_t()
        if cuda.cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(prop),
                                              0):
            return False
        self._cuda, self._granularity = cuda, granularity.value
        return True

    @staticmethod
    def storage_bytes(nbytes: int) -> int:
        """The bytes a storage of `nbytes` takes: rounded up so that it starts aligned."""
        return _rounded(nbytes, _ALIGN)

    def take(self, nbytes: int) -> Block:
        """A block whose storage has storage_bytes(nbytes) bytes. Where the device is out
        of memory, the blocks kept for other sizes and CuPy's cached memory are given
        back first and the block made once more (MemoryError if it still does not fit)."""
        size = self.storage_bytes(nbytes)
        if self.free[size]:
            block = self.free[size].pop()
            self.kept_bytes -= block.mapped_bytes
            return block
        try:
            return self._make(size)
        except MemoryError:
            self.release_kept()
            _free_cupy_cache()
            return self._make(size)

    def release_kept(self) -> None:
        """Unmap every block kept for reuse."""
        for blocks in self.free.values():
            for block in blocks:
                self._release(block)
        self.free.clear()
        self.kept_bytes = 0

    def give_back(self, block: Block) -> None:
        """The block is free again (kept for reuse up to a budget, else unmapped)."""
        if self.kept_bytes + block.mapped_bytes > _KEEP_BYTES:
            self._release(block)
            return
        self.free[block.nbytes].append(block)
        self.kept_bytes += block.mapped_bytes

    def _call(self, name: str, *args: Any) -> None:
        status = getattr(self._cuda, name)(*args)
        if status:
            if status == 2:  # CUDA_ERROR_OUT_OF_MEMORY
                raise MemoryError(f"{name}: out of device memory")
            raise RuntimeError(f"{name} failed with CUDA error {status}")

    def _make(self, size: int) -> Block:
        import cupy

        mapped_bytes = _rounded(size, self._granularity)
        reserved_bytes = mapped_bytes + 2 * _FENCE_BYTES
        handle = ctypes.c_ulonglong()
        reserved = ctypes.c_ulonglong()
        self._call("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(mapped_bytes),
                   ctypes.byref(self._prop), ctypes.c_ulonglong(0))
        try:
            self._call("cuMemAddressReserve", ctypes.byref(reserved),
                       ctypes.c_size_t(reserved_bytes), ctypes.c_size_t(self._granularity),
                       ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
        except Exception:
            self._cuda.cuMemRelease(handle)
            raise
        mapped = reserved.value + _FENCE_BYTES
        try:
            self._call("cuMemMap", ctypes.c_ulonglong(mapped), ctypes.c_size_t(mapped_bytes),
                       ctypes.c_size_t(0), handle, ctypes.c_ulonglong(0))
            access = _AccessDesc(_Location(_ON_DEVICE, self.device), _READ_WRITE)
            self._call("cuMemSetAccess", ctypes.c_ulonglong(mapped),
                       ctypes.c_size_t(mapped_bytes), ctypes.byref(access), ctypes.c_size_t(1))
        except Exception:
            self._cuda.cuMemUnmap(ctypes.c_ulonglong(mapped), ctypes.c_size_t(mapped_bytes))
            self._cuda.cuMemAddressFree(reserved, ctypes.c_size_t(reserved_bytes))
            self._cuda.cuMemRelease(handle)
            raise
        start = mapped + mapped_bytes - size
        return Block(size, _wrap(cupy, start, size), _wrap(cupy, mapped, start - mapped),
                     reserved.value, reserved_bytes, mapped, mapped_bytes, handle.value)

    def _release(self, block: Block) -> None:
        import cupy

        cupy.cuda.runtime.deviceSynchronize()  # nothing may still use the mapping
        self._cuda.cuMemUnmap(ctypes.c_ulonglong(block.mapped),
                              ctypes.c_size_t(block.mapped_bytes))
        self._cuda.cuMemAddressFree(ctypes.c_ulonglong(block.reserved),
                                    ctypes.c_size_t(block.reserved_bytes))
        self._cuda.cuMemRelease(ctypes.c_ulonglong(block.handle))


def _free_cupy_cache() -> None:
    """CuPy's pool gives the device memory it holds unused back (a timing at 4096 leaves
    blocks of 4096's sizes there that one at 8192 cannot use)."""
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()


def _wrap(cupy: Any, pointer: int, nbytes: int) -> Any:
    """A uint8 cupy array over device memory this module owns."""
    if nbytes == 0:
        return cupy.empty(0, cupy.uint8)
    memory = cupy.cuda.UnownedMemory(pointer, nbytes, None, 0)
    return cupy.ndarray((nbytes,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))

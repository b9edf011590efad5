"""The fenced blocks' bookkeeping without a GPU: where the device runs out of memory,
the blocks kept for reuse and CuPy's cached memory are given back before the block is
made once more (a timing at 4096 leaves blocks that one at 8192 cannot use); and the
share of device memory a timing holds for one check is set in bytes or refused clearly."""

from __future__ import annotations

from collections import defaultdict

import pytest

from peak_tune.backends import _cuda_fence
from peak_tune.backends._cuda_fence import Block, FencedBlocks


class FakeDevice(FencedBlocks):
    """FencedBlocks whose driver calls are recorded: `_make` fails `failures` times."""

    def __init__(self, failures: int) -> None:  # no libcuda: nothing of the parent's load
        self.free = defaultdict(list)
        self.kept_bytes = 0
        self.failures = failures
        self.made: list[int] = []
        self.released: list[Block] = []

    def _make(self, size: int) -> Block:
        if self.failures:
            self.failures -= 1
            raise MemoryError("cuMemCreate: out of device memory")
        self.made.append(size)
        return Block(size, None, None, 0, 0, 0, size, 0)

    def _release(self, block: Block) -> None:
        self.released.append(block)


@pytest.fixture
def cupy_frees(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    freed: list[bool] = []
    monkeypatch.setattr(_cuda_fence, "_free_cupy_cache", lambda: freed.append(True))
    return freed


def test_out_of_memory_gives_back_what_is_kept_and_makes_the_block_again(
    cupy_frees: list[bool]
) -> None:
    device = FakeDevice(failures=0)
    small = [device.take(1000), device.take(1000), device.take(5000)]
    for block in small:
        device.give_back(block)
    assert device.kept_bytes > 0 and not device.released
    device.failures = 1
    big = device.take(1 << 20)
    assert big.nbytes == device.storage_bytes(1 << 20) and device.made[-1] == big.nbytes
    assert sorted(b.nbytes for b in device.released) == sorted(b.nbytes for b in small)
    assert device.kept_bytes == 0 and not any(device.free.values()) and cupy_frees == [True]


def test_a_block_that_still_does_not_fit_is_a_memory_error(cupy_frees: list[bool]) -> None:
    device = FakeDevice(failures=2)
    with pytest.raises(MemoryError, match="out of device memory"):
        device.take(1 << 20)
    assert cupy_frees == [True]  # given back once, then the second failure stands


def test_a_kept_block_of_the_size_is_reused_without_the_driver(cupy_frees: list[bool]) -> None:
    device = FakeDevice(failures=0)
    block = device.take(4096)
    device.give_back(block)
    device.failures = 5  # the driver would fail: it is not asked
    assert device.take(4096) is block and device.kept_bytes == 0 and not cupy_frees


def test_the_held_runs_setting_is_bytes_or_a_clear_error() -> None:
    from peak_tune.backends._cuda_device import HELD_RUNS_VARIABLE, _held_budget
    from peak_tune.errors import UserError

    assert _held_budget(None, 20 << 30) == 20 << 30 and _held_budget("", 7) == 7
    assert _held_budget("25165824", 20 << 30) == 24 << 20
    with pytest.raises(UserError, match=f"{HELD_RUNS_VARIABLE} must be a number of bytes"):
        _held_budget("2GB", 20 << 30)

"""benchmarks/sass_mix.py: the hot loop found in SASS text, and, where cuobjdump, nvdisasm
and NVRTC are installed (the test extras), in the cubins of real variants."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.nvrtc import needs_nvrtc

# two loops: an outer one (0x0010-0x0090) around an inner FFMA loop (0x0030-0x0070)
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   STS.128 [R0], R4 ;
        /*0030*/                   LDS.64 R8, [R0+0x80] ;
        /*0040*/                   LDS.128 R12, [R0+0x100] ;
        /*0050*/                   FFMA R16, R8, R12, R16 ;
        /*0060*/              @!P0 FFMA R17, R9, R13, R17 ;
        /*0070*/               @P1 BRA 0x30 ;
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0090*/               @P2 BRA 0x10 ;
        /*00a0*/                   EXIT ;
"""


@pytest.fixture
def sass_mix(benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark("sass_mix")


def test_the_innermost_loop_with_the_arithmetic_is_the_hot_one(sass_mix: ModuleType) -> None:
    instructions = sass_mix.parse(SASS)
    assert [i.opcode for i in instructions][:3] == ["MOV", "LDG.E.128", "STS.128"]
    assert instructions[5].opcode == "FFMA"  # the predicate is dropped
    assert sorted((loop.start, loop.end) for loop in sass_mix.loops(instructions)) == [
        (0x10, 0x90), (0x30, 0x70)]
    family, loop = sass_mix.hot_loop(instructions)
    assert family == "FFMA" and (loop.start, loop.end) == (0x30, 0x70)
    assert len(loop.body) == 5 and loop.count("FFMA") == 2
    assert loop.widths("LDS") == {"LDS.64": 1, "LDS.128": 1}


def test_a_kernel_without_loops_of_arithmetic_has_no_hot_loop(sass_mix: ModuleType) -> None:
    straight = "\n".join(line for line in SASS.splitlines() if "BRA" not in line)
    assert sass_mix.hot_loop(sass_mix.parse(straight)) is None


@needs_nvrtc
def test_thread_tiles_make_the_hot_loop_mostly_ffma(sass_mix: ModuleType, tmp_path: Path) -> None:
    """The naive seed's K loop against 8 x 8 thread tiles with 128-bit shared loads: what
    the SIMT steps are for, read off the cubins."""
    if sass_mix.tools_path() is None:
        pytest.skip("no cuobjdump/nvdisasm: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
    naive = sass_mix.mix(("refactor",), {"BLOCK_M": 16, "BLOCK_N": 16}, "h100", "float32",
                         str(tmp_path))
    point = {"BLOCK_M": 128, "BLOCK_N": 128, "TRD_Y_DIM": 8, "TRD_X_DIM": 8, "TILE_K_SIZE": 8,
             "THREAD_CHUNK": 4}
    tiled = sass_mix.mix(("refactor", "thread-tiling", "tb-tiling", "thread-cache",
                          "thread-chunk", "transpose"), point, "h100", "float32", str(tmp_path))
    assert naive["arithmetic"] == tiled["arithmetic"] == "FFMA"
    assert naive["arithmetic_share"] < 0.5 < 0.7 < tiled["arithmetic_share"]
    assert set(tiled["shared_loads"]) == {"LDS.128"}

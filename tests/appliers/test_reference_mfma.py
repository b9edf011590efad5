"""The AMD matrix-core step (`mfma`, transforms/hip/mfma.md) of the reference applier,
checked without an AMD GPU in three ways:

- the lane layouts (mfma_layout, the one place the emitter takes them from): a numpy
  model of one wave's MFMA built from them computes A @ B, and they give the entries
  AMD's matrix instruction calculator prints for v_mfma_f32_32x32x8f16, _32x32x2f32,
  _16x16x16f16 and _16x16x4f32 (MFMA_TILE 32 and 16);
- real builds for gfx90a (MI250) and gfx942 (MI300X) with clang: the MFMA instruction is
  in the code object, the accumulators fit the register budget, and points the device
  cannot run are pruned (skipped with the reason without the toolchain);
- the printed kernels run on the host (clang++ with tests/fixtures/hip_host: a thread per
  lane, the MFMA builtins as a rendezvous of the wave's lanes) at odd sizes, fp16 and
  fp32, against numpy (skipped without clang++).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from peak_tune.appliers.reference import ReferenceApplier
from peak_tune.appliers.reference.cuda_matmul import apply_transformation, plan_of
from peak_tune.appliers.reference.cuda_matmul.emit_mfma import MFMA_INSTRUCTIONS
from peak_tune.appliers.reference.cuda_matmul.mfma_layout import (
    LANES,
    TILES,
    CExpr,
    a_element,
    accumulators,
    b_element,
    d_element,
    per_lane,
)
from peak_tune.appliers.reference.cuda_matmul.plan import (
    Plan,
    dump_plan,
    load_plan,
    structure_problem,
)
from peak_tune.backends import _hip_amd
from peak_tune.backends._cuda_launch import evaluate_launch
from peak_tune.backends.hip import HipBackend
from peak_tune.catalog.loaders import load_device, load_spec, load_transformations
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext
from peak_tune.errors import ApplyError, CompileError, InvalidPoint
from peak_tune.evaluation.pipeline import seed_context
from peak_tune.expr import evaluate_bool
from tests.appliers.conftest import build_cuda as build
from tests.appliers.cuda_host import run_on_host
from tests.appliers.test_reference_cuda import tuning_point
from tests.appliers.test_reference_hip import needs_amd_clang

ROOT = Path(__file__).resolve().parents[2]
DEVICES = ROOT / "backends" / "devices"
HOST_SHIM = ROOT / "tests" / "fixtures" / "hip_host" / "include"
MFMA = ("refactor", "tb-tiling", "mfma")
SEQUENCES = (  # mfma with the portable steps around it, in several orders
    MFMA,
    ("refactor", "tb-tiling", "transpose", "offset", "mfma", "vector-loads", "block-swizzle"),
    ("refactor", "tb-tiling", "mfma", "register-staging", "double-buffer", "vector-loads",
     "launch-bounds"),
    ("refactor", "split-k", "tb-tiling", "interior-tiles", "mfma", "transpose"),
)
ODD_SIZES = ((67, 53, 97), (31, 17, 5), (1, 1, 1), (129, 70, 33))
HOST_CLANG = next(filter(None, map(shutil.which, ("clang++-19", "clang++"))), None)
needs_host_clang = pytest.mark.skipif(HOST_CLANG is None,
                                      reason="needs clang++ (ext_vector_type, _Float16)")


@pytest.fixture(scope="module")
def catalog() -> dict[str, Transformation]:
    return load_transformations([ROOT / "transforms"])


@pytest.fixture(scope="module")
def seed() -> KernelContext:
    return seed_context(load_spec(ROOT / "seeds" / "matmul"), "hip")


@pytest.fixture(scope="module")
def mi250() -> DeviceProfile:
    return load_device(DEVICES / "mi250.toml")


def _variant(sequence: tuple[str, ...], seed: KernelContext,
             catalog: dict[str, Transformation], device: DeviceProfile) -> KernelContext:
    return build(seed, sequence, catalog, device)


# ---------------------------------------------------------------- the lane layouts


def _wave_mfma(a: np.ndarray, b: np.ndarray, per: int, tile: int) -> np.ndarray:
    """One wave's tile x tile x (64 / tile * per) MFMA as the lanes see it: each lane
    gathers its operands by a_element / b_element, the instruction forms the product of
    the matrices they make up, and each lane reads its results by d_element."""
    groups = LANES // tile
    k = groups * per
    lane_a, lane_b = np.zeros((LANES, per)), np.zeros((LANES, per))
    for lane in range(LANES):
        for i in range(per):
            lane_a[lane, i] = a[a_element(lane, i, per, tile)]
            lane_b[lane, i] = b[b_element(lane, i, per, tile)]
    # the hardware's side, from AMD's tables: A[i][k] in lane i + T (k / per), B[k][j]
    # in lane j + T (k / per), element k % per of each
    whole_a = np.array([[lane_a[m + tile * (q // per), q % per] for q in range(k)]
                        for m in range(tile)])
    whole_b = np.array([[lane_b[n + tile * (q // per), q % per] for n in range(tile)]
                        for q in range(k)])
    product = whole_a @ whole_b
    c = np.full((tile, tile), np.nan)
    for lane in range(LANES):
        for i in range(accumulators(tile)):
            row, col = d_element(lane, i, tile, 4 * groups)
            assert np.isnan(c[row, col]), "two accumulators map to one element"
            c[row, col] = product[row, col]
    return c


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("element_bytes", [2, 4])
def test_one_wave_of_mfma_lanes_computes_the_tile_product(element_bytes, tile):
    per, depth = per_lane(element_bytes), LANES // tile * per_lane(element_bytes)
    rng = np.random.default_rng(element_bytes)
    a, b = rng.uniform(-1, 1, (tile, depth)), rng.uniform(-1, 1, (depth, tile))
    assert np.allclose(_wave_mfma(a, b, per, tile), a @ b, rtol=0, atol=1e-12)
    # a K loop of such steps, as the kernel runs it, is the whole product
    a, b = rng.uniform(-1, 1, (tile, 4 * depth)), rng.uniform(-1, 1, (4 * depth, tile))
    total = sum(_wave_mfma(a[:, k0:k0 + depth], b[k0:k0 + depth], per, tile)
                for k0 in range(0, 4 * depth, depth))
    assert np.allclose(total, a @ b, rtol=0, atol=1e-12)


def test_the_layouts_are_amds():
    # entries of `matrix_calculator.py -a cdna2|cdna3 -i v_mfma_f32_32x32x8f16 -A/-B/-D -M`
    # (ROCm/amd_matrix_instruction_calculator): (lane, element) -> matrix entry; all 256
    # A, 256 B and 1024 D entries agreed, the same for _32x32x2f32 and on CDNA3
    assert a_element(0, 0, 4, 32) == (0, 0) and a_element(1, 3, 4, 32) == (1, 3)
    assert a_element(32, 0, 4, 32) == (0, 4) and a_element(63, 3, 4, 32) == (31, 7)
    assert b_element(1, 0, 4, 32) == (0, 1) and b_element(32, 1, 4, 32) == (5, 0)
    assert b_element(63, 3, 4, 32) == (7, 31)
    assert a_element(33, 0, 1, 32) == (1, 1) and b_element(33, 0, 1, 32) == (1, 1)
    rows_of_lane_0 = [d_element(0, i, 32, 8)[0] for i in range(accumulators(32))]
    assert rows_of_lane_0 == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27]
    assert d_element(32, 0, 32, 8) == (4, 0) and d_element(63, 15, 32, 8) == (31, 31)
    assert d_element(5, 4, 32, 8) == (8, 5)
    # v_mfma_f32_16x16x16f16 (and _16x16x4f32 with one element a lane): A[i][k] is item
    # k % 4 of lane i + 16 (k / 4); D[i][j] item i % 4 of lane j + 16 (i / 4)
    assert a_element(17, 2, 4, 16) == (1, 6) and a_element(63, 3, 4, 16) == (15, 15)
    assert b_element(17, 2, 4, 16) == (6, 1) and b_element(48, 0, 1, 16) == (3, 0)
    assert [d_element(0, i, 16, 16)[0] for i in range(accumulators(16))] == [0, 1, 2, 3]
    assert d_element(21, 3, 16, 16) == (7, 5) and d_element(63, 3, 16, 16) == (15, 15)


def test_the_kernel_prints_the_layouts_it_is_checked_with(seed, catalog, mi250):
    source = _variant(MFMA, seed, catalog, mi250).source
    lane, i, per, tile = CExpr("lane"), CExpr("i"), CExpr("PT_MFMA_KL"), CExpr("MFMA_TILE")
    row, k = a_element(lane, i, per, tile)
    assert f"PT_AS(s, m0 + {row}, k0 + {k})" in source
    k, col = b_element(lane, i, per, tile)
    assert f"PT_BS(s, k0 + {k}, n0 + {col})" in source
    row, col = d_element(lane, i, tile, CExpr("PT_MFMA_DROWS"))
    assert f"const int r = bm + wr + mi * MFMA_TILE + {row};" in source
    assert f"const int c = bn + wc + ni * MFMA_TILE + {col};" in source
    assert str(row) == "i / 4 * PT_MFMA_DROWS + lane / MFMA_TILE * 4 + i % 4"


# ---------------------------------------------------------------- plan and rule


def test_mfma_is_a_hip_only_part_that_leaves_older_states_alone(seed, catalog, mi250):
    tiled = Plan(shared=True)
    assert structure_problem(tiled.but(mfma=True)) == "mfma is AMD-only (HIP, not CUDA)"
    assert structure_problem(tiled.but(mfma=True, hip=True)) == ""
    assert "mfma" not in dump_plan(tiled.but(hip=True))  # states before it: unchanged
    context = _variant(MFMA, seed, catalog, mi250)
    assert load_plan(context.state) == Plan(shared=True, hip=True, mfma=True)
    assert plan_of(context).mfma
    assert structure_problem(Plan(hip=True, mfma=True)) == "mfma needs shared"


def test_mfma_is_offered_for_amd_kernels_only(seed, catalog, mi250):
    assert catalog["mfma"].backends == ("hip",)
    assert not catalog["mfma"].applies_to("matmul", "cuda")
    h200 = load_device(DEVICES / "h200.toml")
    cuda = build(seed_context(load_spec(ROOT / "seeds" / "matmul"), "cuda"),
                 ("refactor", "tb-tiling"), catalog, h200)
    with pytest.raises(InvalidPoint, match="not for cuda/matmul"):
        ReferenceApplier().apply(cuda, catalog["mfma"], h200)
    portable = dataclasses.replace(catalog["mfma"], backends=("cuda", "hip"))
    with pytest.raises(InvalidPoint, match="AMD-only"):
        apply_transformation(cuda, portable, h200)
    # HIP on an NVIDIA GPU (the HIP-on-CUDA header) has no matrix cores of this kind
    hip_on_h200 = build(seed, ("refactor", "tb-tiling"), catalog, h200)
    with pytest.raises(InvalidPoint, match="matrix cores"):
        apply_transformation(hip_on_h200, catalog["mfma"], h200)


def test_mfma_needs_the_lds_tiles_and_replaces_the_thread_tiles(seed, catalog, mi250):
    with pytest.raises(InvalidPoint, match="requires tb-tiling"):
        build(seed, ("refactor", "mfma"), catalog, mi250)
    with pytest.raises(InvalidPoint, match="conflicts with thread-tiling"):
        build(seed, ("refactor", "tb-tiling", "thread-tiling", "mfma"), catalog, mi250)
    with pytest.raises(InvalidPoint, match="mfma and thread_tile exclude each other"):
        build(seed, MFMA + ("thread-tiling",), catalog, mi250)
    # the rule refuses too, whatever a catalog says
    lax = dataclasses.replace(catalog["mfma"], conflicts=())
    tiled = build(seed, ("refactor", "tb-tiling", "warp-tiling"), catalog, mi250)
    with pytest.raises(InvalidPoint, match="replaces the SIMT"):
        apply_transformation(tiled, lax, mi250)


def test_the_wave_grid_sets_the_block_and_the_constraints(seed, catalog, mi250):
    context = _variant(MFMA, seed, catalog, mi250)
    assert context.launch["block_x"] == "64 * WAVES_M * WAVES_N"
    assert "block_y" not in context.launch
    assert {p.name for p in context.params} >= {"WAVES_M", "WAVES_N", "MFMA_TILE"}
    point = {"BLOCK_M": 128, "BLOCK_N": 64, "TILE_K_SIZE": 32, "WAVES_M": 2, "WAVES_N": 2,
             "MFMA_TILE": 32}
    assert all(evaluate_bool(c, point) for c in context.constraints)
    shape = evaluate_launch(context.launch, {**point, "M": 300, "N": 200, "K": 50})
    assert shape.threads == 256 and shape.grid == (4, 3, 1)

    def broken(**change: int) -> list[str]:
        return [c for c in context.constraints if not evaluate_bool(c, {**point, **change})]

    assert broken(BLOCK_N=32) == ["BLOCK_N % (MFMA_TILE * WAVES_N) == 0"]  # a wave tile < 32
    assert broken(BLOCK_N=32, MFMA_TILE=16) == []  # ... of two 16 x 16 tiles
    assert broken(BLOCK_M=16, WAVES_M=1) == ["BLOCK_M % (MFMA_TILE * WAVES_M) == 0"]
    assert broken(TILE_K_SIZE=8, MFMA_TILE=16) == [  # 16 x 16 x 16 in fp16
        "TILE_K_SIZE % (256 // MFMA_TILE) == 0"]
    accumulators_bound = ("MFMA_TILE * MFMA_TILE // 64 * (BLOCK_M // (MFMA_TILE * WAVES_M))"
                          " * (BLOCK_N // (MFMA_TILE * WAVES_N)) <= 256")
    assert broken(BLOCK_M=256, BLOCK_N=256, WAVES_M=1, WAVES_N=2) == [  # 32 tiles a wave
        accumulators_bound]
    # the same wave tile in 16 x 16 tiles holds as many results: 128 tiles of 4
    assert broken(BLOCK_M=256, BLOCK_N=256, WAVES_M=1, WAVES_N=2, MFMA_TILE=16) == [
        accumulators_bound]
    lds = broken(BLOCK_M=256, BLOCK_N=256, TILE_K_SIZE=64, WAVES_M=4, WAVES_N=4)
    assert len(lds) == 1 and lds[0].endswith("<= 65536")  # 128 KiB of tiles


# ---------------------------------------------------------------- real builds


def _instruction(dtype: str, tile: int, arch: str) -> str:
    return MFMA_INSTRUCTIONS[dtype, tile][1 if arch == "gfx90a" else 2]


def _amd_build(context: KernelContext, values: Mapping[str, int], dtype: str,
               device: str, build_dir: Path) -> dict[str, int]:
    profile = load_device(DEVICES / f"{device}.toml")
    arch = str(profile.facts["arch"])
    artifact = HipBackend(profile).compile(context, values, dtype, str(build_dir))
    toolchain = _hip_amd.find_toolchain()
    found = _hip_amd.matrix_instructions(
        _hip_amd.disassemble(toolchain, Path(artifact.path), arch))
    assert found == [_instruction(dtype, values["MFMA_TILE"], arch)], (device, dtype, found)
    return dict(artifact.resources)


@needs_amd_clang
@pytest.mark.hip
@pytest.mark.parametrize("sequence", SEQUENCES, ids=lambda s: "+".join(s[2:]))
def test_mfma_variants_compile_to_matrix_instructions(sequence, seed, catalog, mi250,
                                                      tmp_path):
    """At the first and last legal points, fp16 and fp32, each MFMA tile, for gfx90a
    and gfx942: the MFMA instruction of the element type and tile, MFMA_TILE^2 / 64
    accumulators per tile in AGPRs or VGPRs within the unified file, no spills. A point
    pruned for its resources is fine."""
    context = _variant(sequence, seed, catalog, mi250)
    jobs = []
    for device in ("mi250", "mi300x"):
        profile = load_device(DEVICES / f"{device}.toml")
        for end in (0, -1):
            values = tuning_point(context, end, profile)
            jobs += [(device, profile, values, dtype) for dtype in ("float16", "float32")]
        for tile in TILES:  # a legal point of each tile
            values = _point_with_tile(context, profile, tile)
            jobs += [(device, profile, values, dtype) for dtype in ("float16", "float32")]

    def build(job: tuple[str, DeviceProfile, dict[str, int], str]) -> bool:
        device, profile, values, dtype = job
        tile = values["MFMA_TILE"]
        tiles = (values["BLOCK_M"] // (tile * values["WAVES_M"])
                 * (values["BLOCK_N"] // (tile * values["WAVES_N"])))
        try:
            resources = _amd_build(context, values, dtype, device, tmp_path)
        except InvalidPoint as exc:
            assert "spilled" in str(exc) or "LDS" in str(exc), exc
            return False
        assert resources["agprs"] <= int(profile.facts["max_agprs"])
        assert accumulators(tile) * tiles <= resources["vgprs"] <= 512  # VGPRs + AGPRs
        assert resources["vgpr_spills"] == resources["sgpr_spills"] == 0
        assert resources["max_threads_per_block"] == 64 * values["WAVES_M"] * \
            values["WAVES_N"]  # __launch_bounds__(PT_THREADS)
        return True

    with ThreadPoolExecutor(2) as pool:  # two clang processes at once
        built = sum(pool.map(build, jobs))
    assert built >= 8


def _point_with_tile(context: KernelContext, profile: DeviceProfile,
                     tile: int) -> dict[str, int]:
    """The first legal point of the context's space with MFMA_TILE = tile."""
    fixed = dataclasses.replace(context, params=tuple(
        dataclasses.replace(p, values=(tile,)) if p.name == "MFMA_TILE" else p
        for p in context.params))
    return tuning_point(fixed, 0, profile)


@needs_amd_clang
@pytest.mark.hip
def test_accumulators_sit_in_agprs_on_gfx90a(seed, catalog, mi250, tmp_path):
    context = _variant(MFMA, seed, catalog, mi250)
    point = {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 32, "WAVES_M": 2, "WAVES_N": 2,
             "MFMA_TILE": 32}
    for device in ("mi250", "mi300x"):
        resources = _amd_build(context, point, "float16", device, tmp_path)
        assert resources["agprs"] == 4 * 16  # 2 x 2 tiles of 16 a lane per wave
    # the same wave tiles as 4 x 4 tiles of 16 x 16: as many results, 4 a lane per tile
    small = {**point, "MFMA_TILE": 16}
    resources = _amd_build(context, small, "float16", "mi250", tmp_path)
    assert resources["agprs"] == 16 * 4


@needs_amd_clang
@pytest.mark.hip
def test_points_the_device_cannot_run_are_pruned(seed, catalog, mi250, tmp_path):
    context = _variant(MFMA, seed, catalog, mi250)
    backend = HipBackend(mi250)
    # tiles of 256 x 64 and 64 x 256 in 4-byte elements: 128 KiB of LDS, over 64 KiB
    big = {"BLOCK_M": 256, "BLOCK_N": 256, "TILE_K_SIZE": 64, "WAVES_M": 4, "WAVES_N": 4,
           "MFMA_TILE": 32}
    with pytest.raises(InvalidPoint, match="bytes of shared memory"):
        backend.compile(context, big, "float32", str(tmp_path))
    # one wave owning a 128 x 128 tile: 256 accumulators a lane, and the operands and
    # copies of a 64-deep K tile beside them, spill
    lonely = {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 64, "WAVES_M": 1, "WAVES_N": 1,
              "MFMA_TILE": 32}
    with pytest.raises(InvalidPoint, match="spilled to scratch"):
        backend.compile(context, lonely, "float16", str(tmp_path))


@needs_amd_clang
@pytest.mark.hip
def test_a_float64_build_fails_with_the_reason(seed, catalog, mi250, tmp_path):
    context = _variant(MFMA, seed, catalog, mi250)
    point = {"BLOCK_M": 64, "BLOCK_N": 64, "TILE_K_SIZE": 16, "WAVES_M": 2, "WAVES_N": 2,
             "MFMA_TILE": 32}
    with pytest.raises(CompileError) as failure:
        HipBackend(mi250).compile(context, point, "float64", str(tmp_path))
    assert "not float64" in (failure.value.detail or "") + str(failure.value)


# ---------------------------------------------------------------- run on the host

def _run_on_host(context: KernelContext, params: Mapping[str, int], dtype: str,
                 sizes: tuple[tuple[int, int, int], ...], folder: Path) -> None:
    """The kernel on the host through the HIP shim (tests/fixtures/hip_host), with clang."""
    assert HOST_CLANG is not None
    run_on_host(context, params, sizes, folder, compiler=(HOST_CLANG, f"-I{HOST_SHIM}"),
                dtype=dtype)


HOST_POINTS = (  # (sequence, point): static LDS only, a few waves (a thread per lane)
    (MFMA, {"BLOCK_M": 64, "BLOCK_N": 64, "TILE_K_SIZE": 16, "WAVES_M": 2, "WAVES_N": 1,
            "MFMA_TILE": 32}),
    (MFMA, {"BLOCK_M": 32, "BLOCK_N": 128, "TILE_K_SIZE": 8, "WAVES_M": 1, "WAVES_N": 2,
            "MFMA_TILE": 32}),
    (MFMA, {"BLOCK_M": 32, "BLOCK_N": 64, "TILE_K_SIZE": 16, "WAVES_M": 1, "WAVES_N": 2,
            "MFMA_TILE": 16}),
    (SEQUENCES[1], {"BLOCK_M": 64, "BLOCK_N": 32, "TILE_K_SIZE": 16, "OFFSET_AMOUNT": 1,
                    "SWIZZLE_GROUP": 2, "WAVES_M": 1, "WAVES_N": 1, "MFMA_TILE": 32}),
    (SEQUENCES[1], {"BLOCK_M": 32, "BLOCK_N": 32, "TILE_K_SIZE": 32, "OFFSET_AMOUNT": 1,
                    "SWIZZLE_GROUP": 2, "WAVES_M": 1, "WAVES_N": 1, "MFMA_TILE": 16}),
    (SEQUENCES[2], {"BLOCK_M": 64, "BLOCK_N": 64, "TILE_K_SIZE": 32, "WAVES_M": 1,
                    "WAVES_N": 2, "MIN_BLOCKS_PER_SM": 1, "MFMA_TILE": 32}),
    (SEQUENCES[3], {"BLOCK_M": 32, "BLOCK_N": 64, "TILE_K_SIZE": 8, "K_SPLITS": 3,
                    "WAVES_M": 1, "WAVES_N": 2, "MFMA_TILE": 32}),
    (SEQUENCES[3], {"BLOCK_M": 16, "BLOCK_N": 64, "TILE_K_SIZE": 16, "K_SPLITS": 3,
                    "WAVES_M": 1, "WAVES_N": 2, "MFMA_TILE": 16}),
)


@needs_host_clang
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize(("sequence", "point"), HOST_POINTS,
                         ids=["+".join(s[2:]) + f"-{p['BLOCK_M']}x{p['BLOCK_N']}"
                              f"-mfma{p['MFMA_TILE']}" for s, p in HOST_POINTS])
def test_mfma_kernels_are_right_at_odd_sizes_on_the_host(sequence, point, dtype, seed,
                                                         catalog, mi250, tmp_path):
    context = _variant(sequence, seed, catalog, mi250)
    assert set(point) == {p.name for p in context.params}
    assert all(evaluate_bool(c, point) for c in context.constraints)
    _run_on_host(context, point, dtype, ODD_SIZES, tmp_path)


@needs_host_clang
def test_a_wrong_layout_fails_on_the_host(seed, catalog, mi250, tmp_path):
    """The host run can fail: the epilogue's rows of the lane groups swapped."""
    context = _variant(MFMA, seed, catalog, mi250)
    row = str(d_element(CExpr("lane"), CExpr("i"), CExpr("MFMA_TILE"),
                        CExpr("PT_MFMA_DROWS"))[0])
    swapped = row.replace("lane / MFMA_TILE * 4", "(64 / MFMA_TILE - 1 - lane / MFMA_TILE) * 4")
    assert row in context.source
    broken = dataclasses.replace(context, source=context.source.replace(row, swapped))
    for tile in TILES:
        point = {"BLOCK_M": 32, "BLOCK_N": 32, "TILE_K_SIZE": 16, "WAVES_M": 1, "WAVES_N": 1,
                 "MFMA_TILE": tile}
        folder = tmp_path / str(tile)
        folder.mkdir()
        with pytest.raises(AssertionError, match="wrong result"):
            _run_on_host(broken, point, "float32", ((32, 32, 16),), folder)


def test_apply_error_for_a_device_with_other_waves(seed, catalog, mi250):
    narrow = dataclasses.replace(mi250, facts={**mi250.facts, "warp_size": 32})
    tiled = build(seed, ("refactor", "tb-tiling"), catalog, mi250)
    with pytest.raises(ApplyError, match="waves of 64 lanes"):
        apply_transformation(tiled, catalog["mfma"], narrow)

"""The wave-broadcast step on the HLSL matmul shader: each lane reads a share of the
thread-cache fragments and takes the rest from its wave patch's lanes with
WaveReadLaneAt. Its shaders give C = A x B on lavapipe through the HLSL backend, built by
DXC and by glslang, in fp32 and fp16; one that reads from the wrong lane does not."""

from __future__ import annotations

import dataclasses

import pytest

from peak_tune.appliers.reference import ReferenceApplier
from peak_tune.appliers.reference.cuda_matmul.plan import Plan
from peak_tune.appliers.reference.cuda_matmul.rules import wave_broadcast
from peak_tune.backends._hlsl_compile import find_compiler
from peak_tune.backends.base import EvalRequest
from peak_tune.backends.hlsl import HlslBackend
from peak_tune.catalog.resolve import Catalog
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext
from peak_tune.errors import BackendUnavailable, InvalidPoint, WrongResult
from tests.appliers.test_reference_hlsl import (
    CHECKS,
    CONFIG,
    PARAMS,
    SIZE,
    applied,
    needs_vulkan,
)

BEFORE = ["refactor", "tb-tiling", "thread-tiling", "thread-cache", "warp-tiling"]
# (sequence, WARP_X_DIM): lavapipe's waves of 8 lanes as 4 x 2 and 2 x 4 patches
SEQUENCES = (
    ([*BEFORE, "wave-broadcast"], 2),
    (["refactor", "tb-tiling", "thread-tiling", "thread-chunk", "transpose", "thread-cache",
      "warp-tiling", "wave-broadcast", "vector-loads", "register-staging", "double-buffer"], 4),
    (["refactor", "block-swizzle", "tb-tiling", "offset", "thread-tiling", "warp-tiling",
      "thread-cache", "wave-broadcast", "interior-tiles"], 2),
)
A_FROM = "lane_y * WARP_X_DIM + i % WARP_X_DIM);"
B_FROM = "j % PT_PATCH_ROWS * WARP_X_DIM + lane_x);"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.with_user_folders()


@pytest.fixture(scope="module")
def lavapipe(catalog: Catalog) -> DeviceProfile:
    return catalog.device("lavapipe")


def params_for(context: KernelContext, warp_x: int) -> dict[str, int]:
    names = {p.name for p in context.params}
    return {k: v for k, v in {**PARAMS, "WARP_X_DIM": warp_x}.items() if k in names}


def test_lanes_read_shares_and_take_the_rest_from_their_patch(catalog, lavapipe):
    context = applied(catalog, lavapipe, SEQUENCES[0][0])
    source = context.source
    assert "const int lane_x = lane % WARP_X_DIM, lane_y = lane / WARP_X_DIM;" in source
    assert "a_own[s] = (ACC)PT_AS(as, PT_ROW(s * WARP_X_DIM + lane_x), kk);" in source
    assert "b_own[s] = (ACC)PT_BS(bs, kk, PT_COL(s * PT_PATCH_ROWS + lane_y));" in source
    assert f"a[i] = WaveReadLaneAt(a_own[i / WARP_X_DIM], {A_FROM}" in source
    assert f"b[j] = WaveReadLaneAt(b_own[j / PT_PATCH_ROWS], {B_FROM}" in source
    assert "#define PT_PATCH_ROWS (PT_WAVE_SIZE / WARP_X_DIM)" in source
    # the ties, with lavapipe's subgroups of 8 lanes, prune points before a build
    assert "TRD_Y_DIM % WARP_X_DIM == 0" in context.constraints
    assert "TRD_X_DIM % max(1, 8 // WARP_X_DIM) == 0" in context.constraints
    assert {p.name for p in context.params} == {
        p.name for p in applied(catalog, lavapipe, BEFORE).params}  # no new parameters
    assert "#pragma" not in source and "__" not in source


def test_the_step_is_refused_without_its_requirements_or_outside_hlsl(catalog, lavapipe):
    applier, step = ReferenceApplier(), catalog.transformation("wave-broadcast")
    no_waves = applied(catalog, lavapipe, ["refactor", "tb-tiling", "thread-tiling",
                                           "thread-cache"])
    with pytest.raises(InvalidPoint, match="wave-broadcast requires warp-tiling"):
        applier.apply(no_waves, step, lavapipe)
    no_cache = applied(catalog, lavapipe, ["refactor", "tb-tiling", "thread-tiling",
                                           "warp-tiling"])
    with pytest.raises(InvalidPoint, match="wave-broadcast requires thread-cache"):
        applier.apply(no_cache, step, lavapipe)
    # the rule says the same where the catalog's order is not checked
    with pytest.raises(InvalidPoint, match="needs the register fragments of thread-cache"):
        wave_broadcast(Plan(hlsl=True, shared=True, thread_tile=True, warp_tile=True),
                       lavapipe)
    for backend in ("cuda", "hip"):
        assert "wave-broadcast" not in {t.id for t in
                                        catalog.transformations_for("matmul", backend)}
        with pytest.raises(InvalidPoint, match="wave-broadcast is HLSL's"):
            wave_broadcast(Plan(shared=True, thread_tile=True, thread_cache=True,
                                warp_tile=True, hip=backend == "hip"), lavapipe)
    h200 = catalog.device("h200")
    coopmat = applied(catalog, h200, ["refactor", "tb-tiling", "cooperative-matrix"])
    assert "cooperative-matrix" in step.conflicts
    with pytest.raises(InvalidPoint, match="requires thread-cache, warp-tiling"):
        applier.apply(coopmat, step, h200)


def _backend(lavapipe: DeviceProfile, compiler: str) -> HlslBackend:
    try:
        find_compiler(compiler)
    except BackendUnavailable as exc:
        pytest.skip(f"no {compiler} to build the wave-broadcast shaders with: {exc}")
    return HlslBackend(dataclasses.replace(lavapipe, facts={**lavapipe.facts,
                                                            "hlsl_compiler": compiler}))


def _gflops(backend: HlslBackend, catalog: Catalog, context: KernelContext,
            params: dict[str, int], dtype: str, build_dir: str) -> float:
    artifact = backend.compile(context, params, dtype, build_dir)
    request = EvalRequest(spec=catalog.spec("matmul"), context=context, params=params,
                          dtype=dtype, size=SIZE, check_sizes=CHECKS, config=CONFIG)
    return backend.evaluate(artifact, request).gflops


@needs_vulkan
@pytest.mark.hlsl
@pytest.mark.parametrize("compiler", ["dxc", "glslang"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_wave_broadcast_variants_validate_on_lavapipe(catalog, lavapipe, compiler, dtype,
                                                      tmp_path):
    """64 x 72 x 80 and 13 x 11 x 17 (partial tiles: lanes outside C still share)."""
    with _backend(lavapipe, compiler) as backend:
        backend.probe()
        for sequence, warp_x in SEQUENCES:
            context = applied(catalog, lavapipe, sequence)
            params = params_for(context, warp_x)
            assert _gflops(backend, catalog, context, params, dtype, str(tmp_path)) > 0, \
                sequence


@needs_vulkan
@pytest.mark.hlsl
@pytest.mark.parametrize("compiler", ["dxc", "glslang"])
@pytest.mark.parametrize("wrong", [(A_FROM, "lane_y * WARP_X_DIM + (i + 1) % WARP_X_DIM);"),
                                   (B_FROM, "(j + 1) % PT_PATCH_ROWS * WARP_X_DIM + lane_x);")],
                         ids=["a-from-the-next-column", "b-from-the-next-row"])
def test_a_broadcast_from_the_wrong_lane_is_caught(catalog, lavapipe, compiler, wrong,
                                                   tmp_path):
    sequence, warp_x = SEQUENCES[0]
    context = applied(catalog, lavapipe, sequence)
    right, misread = wrong
    assert context.source.count(right) == 1
    broken = dataclasses.replace(context, source=context.source.replace(right, misread))
    with _backend(lavapipe, compiler) as backend:
        backend.probe()
        params = params_for(context, warp_x)
        assert _gflops(backend, catalog, context, params, "float32", str(tmp_path)) > 0
        with pytest.raises(WrongResult):
            _gflops(backend, catalog, broken, params, "float32", str(tmp_path))

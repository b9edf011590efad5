"""The HLSL backend on a Vulkan device (Mesa's lavapipe on a CPU machine): the seed
shader validates and times; wrong, lazy and hanging shaders fail the way a user would
see; points over the device's thread-group or groupshared limits are pruned before
anything is dispatched. Skipped, with the reason, without glslang or a Vulkan driver."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from peak_tune.backends import _hlsl_compile
from peak_tune.backends._hlsl_compile import find_optimizer
from peak_tune.backends.base import EvalConfig, EvalRequest
from peak_tune.backends.hlsl import HlslBackend
from peak_tune.catalog.loaders import load_device, load_spec
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, KernelSpec, ProblemSize
from peak_tune.errors import BackendUnavailable, InvalidPoint, KernelTimeout, WrongResult
from tests.backends.test_hlsl_toolchain import COMPILERS_HERE, TILED, _no_vulkan

pytestmark = [pytest.mark.hlsl,
              pytest.mark.skipif(not COMPILERS_HERE, reason="no HLSL compiler on PATH"),
              pytest.mark.skipif(_no_vulkan() is not None, reason=f"no Vulkan: {_no_vulkan()}")]

ROOT = Path(__file__).resolve().parents[2]
SEED = (ROOT / "seeds" / "matmul" / "naive.hlsl").read_text()
LAUNCH = {"grid_x": "ceil_div(N, group_x)", "grid_y": "ceil_div(M, group_y)"}
SIZE = ProblemSize.of({"M": 48, "N": 40, "K": 56})
CHECKS = (ProblemSize.of({"M": 13, "N": 11, "K": 17}),)
CONFIG = EvalConfig(timeout_s=60.0, warmup=1, repeats=3, max_timing_s=5.0)


@pytest.fixture(scope="module")
def spec() -> KernelSpec:
    return load_spec(ROOT / "seeds" / "matmul")


@pytest.fixture(scope="module")
def lavapipe() -> DeviceProfile:
    return load_device(ROOT / "backends" / "devices" / "lavapipe.toml")


@pytest.fixture(scope="module")
def backend(lavapipe: DeviceProfile) -> Iterator[HlslBackend]:
    with HlslBackend(lavapipe) as driver:
        driver.probe()
        yield driver


def shader(source: str) -> KernelContext:
    return KernelContext(kernel="matmul", backend="hlsl", source=source, entry="main",
                         launch=dict(LAUNCH))


def run(backend: HlslBackend, spec: KernelSpec, source: str, params: dict[str, int],
        tmp_path: Path, config: EvalConfig = CONFIG, dtype: str = "float32",
        size: ProblemSize = SIZE, checks: tuple[ProblemSize, ...] = CHECKS) -> float:
    context = shader(source)
    artifact = backend.compile(context, params, dtype, str(tmp_path))
    request = EvalRequest(spec=spec, context=context, params=params, dtype=dtype,
                          size=size, check_sizes=checks, config=config)
    measurement = backend.evaluate(artifact, request)
    assert len(measurement.samples_ms) == config.repeats
    return measurement.gflops


def test_the_seed_validates_and_times_on_the_vulkan_device(backend, spec, tmp_path):
    assert run(backend, spec, SEED, {"BLOCK_X": 8, "BLOCK_Y": 4}, tmp_path) > 0
    assert run(backend, spec, TILED, {"TILE": 8}, tmp_path) > 0
    fingerprint = backend.fingerprint()
    assert "llvmpipe" in fingerprint["device"]
    assert fingerprint["compiler"].split()[0] in ("dxc", "glslang")


def test_fp16_runs_in_16_bit_buffers_and_is_held_to_fp16s_tolerance(backend, spec,
                                                                     tmp_path):
    """half in and out, fp32 accumulation: validated like CUDA's fp16; a shader that
    accumulates in half fails the tolerance at the check size."""
    long_k = ProblemSize.of({"M": 64, "N": 64, "K": 1024})
    assert run(backend, spec, SEED, {}, tmp_path, dtype="float16", size=long_k) > 0
    # glslang builds no half from a literal: the zero comes from the inputs
    half_sum = (SEED.replace("ACC acc = 0;", "half acc = A[0] - A[0];")
                .replace("(ACC)A[", "A[").replace("(ACC)B[", "B["))
    # checked element by element at a long K (a projection of so small an error can
    # stay inside its bound for some inputs)
    with pytest.raises(WrongResult, match="wrong result at 32x32x1024"):
        run(backend, spec, half_sum, {}, tmp_path, dtype="float16", size=long_k,
            checks=(ProblemSize.of({"M": 32, "N": 32, "K": 1024}),))


def test_a_second_build_of_the_same_point_is_reused(backend, tmp_path):
    first = backend.compile(shader(SEED), {"BLOCK_X": 8}, "float32", str(tmp_path))
    again = backend.compile(shader(SEED), {"BLOCK_X": 8}, "float32", str(tmp_path))
    assert again.reused and again.path == first.path
    assert again.resources["group_x"] == 8 and again.resources["threads"] == 8 * 16


needs_spirv_opt = pytest.mark.skipif(find_optimizer() is None, reason="no spirv-opt here")


def with_spirv_opt(profile: DeviceProfile, wanted: str) -> DeviceProfile:
    return dataclasses.replace(profile, facts={**profile.facts, "spirv_opt": wanted})


@needs_spirv_opt
def test_spirv_opt_builds_another_module_that_validates_and_says_so(lavapipe, spec,
                                                                      tmp_path):
    """The optimizer is part of the build's key (no module of the other setting is
    reused) and of the fingerprint; its module computes the same product."""
    modules, names = {}, {}
    for wanted in ("off", "on"):
        with HlslBackend(with_spirv_opt(lavapipe, wanted)) as backend:
            names[wanted] = backend.fingerprint()["optimizer"]
            artifact = backend.compile(shader(TILED), {"TILE": 8}, "float32", str(tmp_path))
            assert not artifact.reused
            modules[wanted] = Path(artifact.path).read_bytes()
            assert run(backend, spec, TILED, {"TILE": 8}, tmp_path) > 0
    assert names["off"] == "none" and names["on"].startswith("spirv-opt ")
    assert modules["on"] != modules["off"]
    # [unroll] loops come out unrolled: no loop is left but the K loop
    assert modules["on"].count(struct.pack("<HH", 246, 4)) == 1  # OpLoopMerge
    assert modules["off"].count(struct.pack("<HH", 246, 4)) > 1


def test_spirv_opt_asked_for_and_missing_or_misspelt_is_one_clear_error(lavapipe,
                                                                         monkeypatch):
    monkeypatch.setattr(_hlsl_compile, "_spirv_tool", lambda name: None)
    with HlslBackend(with_spirv_opt(lavapipe, "on")) as backend, \
            pytest.raises(BackendUnavailable, match="spirv-opt is not installed"):
        backend.compile(shader(SEED), {}, "float32", "unused")
    with HlslBackend(with_spirv_opt(lavapipe, "auto")) as backend:
        assert backend.fingerprint()["optimizer"] == "none"  # auto: without it
    with HlslBackend(with_spirv_opt(lavapipe, "yes")) as backend, \
            pytest.raises(BackendUnavailable, match="spirv_opt is .*not 'yes'"):
        backend.compile(shader(SEED), {}, "float32", "unused")


def test_a_shader_that_skips_work_is_a_wrong_result(backend, spec, tmp_path):
    lazy = SEED.replace("k < sizes.K;", "k + 1 < sizes.K;")
    with pytest.raises(WrongResult, match="wrong result at 13x11x17"):
        run(backend, spec, lazy, {}, tmp_path)


def test_a_shader_that_leaves_a_row_unwritten_is_named(backend, spec, tmp_path):
    lazy = SEED.replace("if (row >= sizes.M", "if (row == 0 || row >= sizes.M")
    with pytest.raises(WrongResult, match="output C not written"):
        run(backend, spec, lazy, {}, tmp_path)


def test_a_group_over_the_devices_limit_is_pruned_before_dispatch(backend, tmp_path):
    with pytest.raises(InvalidPoint, match="thread group of 2048 is over the device's 1024"):
        backend.compile(shader(SEED), {"BLOCK_X": 64, "BLOCK_Y": 32}, "float32",
                        str(tmp_path))


def test_groupshared_over_the_devices_limit_is_pruned(backend, tmp_path):
    hoard = SEED.replace("[numthreads", "groupshared float hoard[9000];\n[numthreads").replace(
        "C[row * sizes.N + col] = (DTYPE)acc;",
        "hoard[col] = acc; GroupMemoryBarrierWithGroupSync();\n"
        "    C[row * sizes.N + col] = (DTYPE)hoard[col];")
    with pytest.raises(InvalidPoint, match="36000 bytes of groupshared memory"):
        backend.compile(shader(hoard), {}, "float32", str(tmp_path))


def test_a_hanging_shader_times_out_and_the_next_evaluation_runs(backend, spec, tmp_path):
    # lavapipe (Mesa 22.3) ends a shader's loops after about 65535 iterations in all, so
    # no shader hangs it: this one runs for seconds a dispatch (3e10 dependent FMAs)
    endless = SEED.replace("if (row >= sizes.M", "float spin = A[0];\n"
                           "    for (uint i = 0; i < 60000; i++) {\n"
                           "        [unroll] for (uint u = 0; u < 2048; u++)"
                           " spin = spin * 0.999f + 0.5f;\n"
                           "    }\n"
                           "    if (spin == 12345.0f) C[0] = spin;\n"
                           "    if (row >= sizes.M")
    quick = dataclasses.replace(CONFIG, timeout_s=2.0)
    with pytest.raises(KernelTimeout):
        run(backend, spec, endless, {}, tmp_path, quick)
    assert run(backend, spec, SEED, {}, tmp_path) > 0  # a fresh worker took over


def test_a_profile_for_another_vulkan_device_says_so(tmp_path):
    adreno = load_device(ROOT / "backends" / "devices" / "adreno-x1-85.toml")
    with HlslBackend(adreno) as other:
        with pytest.raises(BackendUnavailable, match="no Vulkan device of the adreno-x1-85 "
                                                     "kind .Adreno. here: the first Vulkan "
                                                     "device is llvmpipe"):
            other.probe()

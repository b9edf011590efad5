"""The HLSL toolchain and Vulkan runtime the HLSL backend is built on: the seed compute
shader compiles to valid SPIR-V with each HLSL compiler here, its thread group and
groupshared bytes are read from the module, and it runs on a Vulkan device (Mesa's
lavapipe on a CPU machine) with results that match numpy. Skipped, with the reason,
where glslang or a Vulkan driver is missing."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from peak_tune.backends._hlsl_compile import COMPILERS, compile_spirv, find_compiler
from peak_tune.backends._spirv import SpirvError, read_resources
from peak_tune.errors import BackendUnavailable, CompileError

pytestmark = pytest.mark.hlsl

ROOT = Path(__file__).resolve().parents[2]
SEED = (ROOT / "seeds" / "matmul" / "naive.hlsl").read_text()
TILED = (ROOT / "tests" / "fixtures" / "hlsl" / "tiled.hlsl").read_text()


def _compilers() -> list[str]:
    found = []
    for name in COMPILERS:
        try:
            find_compiler(name)
            found.append(name)
        except BackendUnavailable:
            continue
    return found


def _no_vulkan() -> str | None:
    try:
        from peak_tune.backends._vulkan import VulkanUnavailable, devices

        return None if devices() else "no Vulkan device"
    except VulkanUnavailable as exc:
        return str(exc)


COMPILERS_HERE = _compilers()
needs_compiler = pytest.mark.skipif(not COMPILERS_HERE, reason="no HLSL compiler (dxc, "
                                    "glslangValidator) on PATH")


@needs_compiler
@pytest.mark.parametrize("compiler", COMPILERS_HERE)
@pytest.mark.parametrize("dtype", ["float", "half"])
def test_the_seed_compiles_and_its_thread_group_is_read(compiler, dtype, tmp_path):
    built = tmp_path / "seed.spv"
    _, resources = compile_spirv(find_compiler(compiler), SEED,
                                 {"DTYPE": dtype, "BLOCK_X": 32, "BLOCK_Y": 4}, built,
                                 sixteen_bit=dtype == "half")
    assert resources.local_size == (32, 4, 1) and resources.threads == 128
    assert resources.shared_bytes == 0
    sixteen = {"StorageBuffer16BitAccess", "UniformAndStorageBuffer16BitAccess"}
    assert bool(sixteen & set(resources.capabilities)) == (dtype == "half")
    assert read_resources(built.read_bytes()) == resources


@needs_compiler
@pytest.mark.parametrize("tile", [8, 16])
def test_groupshared_bytes_follow_from_the_arrays(tile, tmp_path):
    _, resources = compile_spirv(find_compiler(), TILED, {"TILE": tile}, tmp_path / "t.spv")
    assert resources.shared_bytes == 4 * tile * tile + 4 * tile * (tile + 1)
    assert resources.local_size == (tile, tile, 1)


@needs_compiler
def test_a_compile_error_names_its_line(tmp_path):
    broken = SEED.replace("ACC acc = 0;", "ACC acc = undeclared;")
    line = next(i for i, text in enumerate(broken.splitlines(), 1) if "undeclared" in text)
    with pytest.raises(CompileError, match=f"line {line}: .*undeclared"):
        compile_spirv(find_compiler(), broken, {}, tmp_path / "x.spv")
    assert not (tmp_path / "x.spv").exists()


def test_what_is_not_spirv_is_refused():
    with pytest.raises(SpirvError, match="no SPIR-V"):
        read_resources(b"\x00" * 64)
    with pytest.raises(SpirvError, match="bytes is no SPIR-V module"):
        read_resources(b"\x03\x02\x23\x07")


def test_an_unknown_compiler_is_a_clear_error():
    with pytest.raises(BackendUnavailable, match="unknown HLSL compiler 'fxc'"):
        find_compiler("fxc")


@needs_compiler
@pytest.mark.skipif(_no_vulkan() is not None, reason=f"no Vulkan: {_no_vulkan()}")
@pytest.mark.parametrize("source,defines", [(SEED, {"BLOCK_X": 8, "BLOCK_Y": 8}),
                                            (TILED, {"TILE": 8})], ids=["seed", "tiled"])
def test_shaders_run_on_the_vulkan_device_and_match_numpy(source, defines, tmp_path):
    from peak_tune.backends._vulkan import VulkanDevice

    m, n, k = 67, 53, 97  # multiples of no group size: the bounds checks matter
    rng = np.random.default_rng(7)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    _, resources = compile_spirv(find_compiler(), source, defines, tmp_path / "k.spv")
    x, y, _ = resources.local_size
    with VulkanDevice() as device:
        buffers = [device.buffer(a.nbytes), device.buffer(b.nbytes), device.buffer(m * n * 4)]
        device.write(buffers[0], a)
        device.write(buffers[1], b)
        device.write(buffers[2], np.full(m * n, np.nan, np.float32))
        pipeline = device.pipeline((tmp_path / "k.spv").read_bytes(), buffers, 12)
        ms = device.dispatch(pipeline, (-(-n // x), -(-m // y), 1),
                             struct.pack("3I", m, n, k))
        got = device.read(buffers[2], np.float32, m * n).reshape(m, n)
    assert ms > 0
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@needs_compiler
def test_sizes_in_a_constant_buffer_are_refused(tmp_path):
    """glslang puts a global struct without ConstantBuffer<> in a constant buffer at
    binding 0, over A: lavapipe happened to compute right with it, NVIDIA's driver read
    zeros. The backend binds push constants only, and says so. (DXC makes the same
    struct a push-constant block.)"""
    try:
        glslang = find_compiler("glslang")
    except BackendUnavailable as exc:
        pytest.skip(f"glslang's constant-buffer behaviour needs glslang: {exc}")
    global_struct = SEED.replace("[[vk::push_constant]] ConstantBuffer<Sizes> sizes;",
                                 "[[vk::push_constant]] Sizes sizes;")
    with pytest.raises(CompileError, match="reads a constant buffer.*push constants"):
        compile_spirv(glslang, global_struct, {}, tmp_path / "g.spv")
    _, resources = compile_spirv(find_compiler(), SEED, {}, tmp_path / "s.spv")
    assert resources.push_constant_bytes == 12 and resources.uniform_buffers == 0


def test_dxcs_library_runs_as_a_command_and_its_errors_name_the_line(tmp_path):
    """DXC's shared library (compushady's, or $PEAK_TUNE_DXC_LIBRARY) is run in a process
    of its own like the `dxc` command, and its diagnostics come back the same way."""
    try:
        dxc = find_compiler("dxc")
    except BackendUnavailable as exc:
        pytest.skip(f"no DXC (dxc on PATH, compushady, or PEAK_TUNE_DXC_LIBRARY): {exc}")
    _, resources = compile_spirv(dxc, SEED, {"BLOCK_X": 32}, tmp_path / "s.spv")
    assert resources.local_size == (32, 16, 1) and resources.push_constant_bytes == 12
    broken = SEED.replace("acc += ", "acc += missing_name + ")
    with pytest.raises(CompileError, match="missing_name") as caught:
        compile_spirv(dxc, broken, {}, tmp_path / "b.spv")
    assert "error" in (caught.value.detail or "")


def test_a_device_without_robust_buffer_access_is_refused():
    """capabilities.bounded_buffers rests on robust buffer access: without it a shader's
    write past C could reach the worker's memory (lavapipe runs shaders in-process)."""
    from peak_tune.backends.hlsl import HlslBackend
    from peak_tune.catalog.loaders import load_device

    backend = HlslBackend(load_device(ROOT / "backends" / "devices" / "lavapipe.toml"))
    assert backend.capabilities.bounded_buffers
    with pytest.raises(BackendUnavailable, match="no robust buffer access"):
        backend._check_device({"name": "a device", "robust": False})
    backend._check_device({"name": "llvmpipe (LLVM 15)", "robust": True})

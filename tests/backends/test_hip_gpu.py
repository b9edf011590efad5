"""HIP on an NVIDIA GPU: every HIP reference variant and the seed, built through the
HIP-on-CUDA header, validate and time on the GPU beside cuBLAS, and a wrong HIP kernel
fails as a CUDA one does. Skipped (with the reason) where CuPy sees no CUDA device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from peak_tune.backends import make_backend
from peak_tune.backends.base import EvalConfig, EvalRequest
from peak_tune.backends.cuda import profile_for_gpu, visible_gpu
from peak_tune.backends.hip import HipOnCudaBackend
from peak_tune.catalog.loaders import load_devices, load_spec, load_transformations
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext, KernelSpec, ProblemSize
from peak_tune.errors import InvalidPoint, WrongResult
from peak_tune.evaluation.pipeline import seed_context
from tests.appliers.conftest import build_cuda as build
from tests.appliers.conftest import minimal_prefix
from tests.appliers.test_reference_cuda import tuning_point

pytestmark = [pytest.mark.gpu, pytest.mark.hip]

ROOT = Path(__file__).resolve().parents[2]
HIP_IDS = [p.stem for p in sorted((ROOT / "transforms" / "gpu").glob("*.md"))]
SIZE = ProblemSize.of({"M": 512, "N": 512, "K": 512})
CONFIG = EvalConfig(timeout_s=60.0, warmup=1, repeats=3, max_timing_s=1.0)


@pytest.fixture(scope="module")
def spec() -> KernelSpec:
    return load_spec(ROOT / "seeds" / "matmul")


@pytest.fixture(scope="module")
def profile() -> DeviceProfile:
    try:
        name, arch = visible_gpu()
    except Exception as exc:  # noqa: BLE001 - no CuPy or no device: skip with why
        pytest.skip(reason=f"no CUDA GPU: {exc}")
    found = profile_for_gpu(name, arch, load_devices([ROOT / "backends" / "devices"]).values())
    if found is None:
        pytest.skip(reason=f"no device profile for {name} ({arch})")
    return found


@pytest.fixture(scope="module")
def backend(profile: DeviceProfile) -> Iterator[HipOnCudaBackend]:
    driver = make_backend("hip", profile)
    assert isinstance(driver, HipOnCudaBackend)
    with driver:
        driver.probe()
        yield driver


@pytest.fixture(scope="module")
def catalog() -> dict[str, Transformation]:
    found = load_transformations([ROOT / "transforms"])
    return {tid: t for tid, t in found.items() if "hip" in t.backends}


def _evaluate(backend: HipOnCudaBackend, spec: KernelSpec, context: KernelContext,
              params: dict[str, int], dtype: str, build_dir: Path) -> float:
    artifact = backend.compile(context, params, dtype, str(build_dir))
    request = EvalRequest(spec=spec, context=context, params=params, dtype=dtype, size=SIZE,
                          check_sizes=spec.check_sizes, config=CONFIG)
    return backend.evaluate(artifact, request).gflops


def test_the_hip_seed_and_cublas_run(backend, spec, tmp_path):
    seed = seed_context(spec, "hip")
    assert _evaluate(backend, spec, seed, {}, "float32", tmp_path) > 0
    name, vendor = backend.time_vendor(spec, "float32", SIZE, CONFIG)
    assert "cuBLAS" in name and vendor.gflops > 0
    assert "HIP-on-CUDA" in backend.fingerprint()["compiler"]


@pytest.mark.parametrize("tid", HIP_IDS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_each_hip_variant_is_right_on_the_gpu(tid, dtype, backend, spec, catalog, profile,
                                              tmp_path):
    context = build(seed_context(spec, "hip"), minimal_prefix(tid, catalog) + [tid],
                    catalog, profile)
    ran = 0
    for end in (0, -1):
        try:
            gflops = _evaluate(backend, spec, context, tuning_point(context, end, profile),
                               dtype, tmp_path)
        except InvalidPoint:
            continue
        assert gflops > 0
        ran += 1
    assert ran, f"{tid}: no point ran"


def test_a_hip_kernel_that_skips_work_is_a_wrong_result(backend, spec, tmp_path):
    seed = seed_context(spec, "hip")
    lazy = dataclasses.replace(seed, source=seed.source.replace("k < K;", "k < K - 1;"))
    with pytest.raises(WrongResult, match="wrong result"):
        _evaluate(backend, spec, lazy, {}, "float32", tmp_path)


def test_an_amd_profile_on_cupys_cuda_build_says_so(profile, tmp_path, monkeypatch):
    """The AMD backend's runtime is the GPU worker on CuPy's ROCm build. Shown an AMD GPU
    (a topology like ROCm's kernel driver's) where CuPy runs on CUDA, it starts the
    worker, sees the platform and says in one line why it cannot run there."""
    from peak_tune.backends import hip
    from peak_tune.catalog.loaders import load_device
    from peak_tune.errors import BackendUnavailable

    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "properties").write_text("gfx_target_version 90010\n")
    monkeypatch.setattr(hip, "_KFD_NODES", tmp_path)
    mi250 = load_device(ROOT / "backends" / "devices" / "mi250.toml")
    with hip.HipBackend(mi250) as amd:
        with pytest.raises(BackendUnavailable, match="runs on CUDA .*not its ROCm build"):
            amd.probe()

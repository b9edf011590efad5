"""Compile-and-run helpers for the reference applier's C variants (gcc + ctypes).

Kept small and independent of the C backend so the applier's tests exercise only the
applier: the kernel is compiled as the backend does (-O3 -march=native -fopenmp), run on
fresh random inputs with NaN-poisoned outputs and guard zones, and compared with a
float64 reference at the spec's tolerance.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import pytest

from peak_tune.appliers.reference.cuda_matmul import apply_transformation
from peak_tune.catalog.loaders import load_device, load_spec, load_transformations
from peak_tune.catalog.resolve import Catalog
from peak_tune.catalog.types import DeviceProfile, Transformation
from peak_tune.core import KernelContext
from peak_tune.evaluation.pipeline import seed_context

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-Wall",
         "-Werror")
C_TYPES = {"float32": "float", "float64": "double"}
TOLERANCE = {"float32": 2e-5, "float64": 1e-12}
ODD_SIZES = ((67, 53, 97), (31, 17, 5), (1, 1, 1), (2, 130, 3), (129, 7, 131))
GUARD = 64

Kernel = Callable[..., None]


def _vector_bits() -> int:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return 256
    return 512 if "avx512f" in flags else 256


@pytest.fixture(scope="session")
def transformations() -> dict[str, Transformation]:
    return load_transformations([ROOT / "transforms" / "c"])


@pytest.fixture(scope="session")
def device() -> DeviceProfile:
    return DeviceProfile(
        name="cpu", title="test host", backend="c", peak_gflops={}, memory_bandwidth_gbs=0.0,
        facts={"vector_bits": _vector_bits(), "cores": 2, "l1d_kib": 48, "l2_kib": 2048},
    )


@pytest.fixture(scope="session")
def seed() -> KernelContext:
    spec = load_spec(ROOT / "seeds" / "matmul")
    return KernelContext(kernel="matmul", backend="c", source=spec.sources["c"],
                         entry=spec.entry["c"])


@pytest.fixture(scope="session")
def compiler(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Kernel]:
    """compile(source, params, dtype) -> the loaded `matmul` function."""
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("gcc is not installed")
    folder = tmp_path_factory.mktemp("kernels")

    def compile_kernel(source: str, params: Mapping[str, int], dtype: str = "float32") -> Kernel:
        defines = [f"-DDTYPE={C_TYPES[dtype]}"] + [f"-D{k}={v}" for k, v in sorted(params.items())]
        key = hashlib.sha256((source + " ".join(defines)).encode()).hexdigest()[:20]
        c_file, library = folder / f"{key}.c", folder / f"{key}.so"
        if not library.exists():
            c_file.write_text(source)
            done = subprocess.run([cc, *FLAGS, *defines, str(c_file), "-o", str(library)],
                                  capture_output=True, text=True, timeout=120)
            if done.returncode:
                raise AssertionError(f"compile failed ({defines}):\n{done.stderr[:4000]}")
        function: Kernel = ctypes.CDLL(str(library)).matmul
        return function

    return compile_kernel


@pytest.fixture(scope="session")
def check() -> Callable[..., None]:
    """check(kernel, dtype, sizes): AssertionError on a wrong result or a stray write."""
    return check_matmul


def check_matmul(kernel: Kernel, dtype: str = "float32",
                 sizes: Iterable[tuple[int, int, int]] = ODD_SIZES, seed: int = 0) -> None:
    """Run the kernel at each (M, N, K); AssertionError on a wrong or stray write."""
    rng = np.random.default_rng(seed)
    np_type = np.dtype(dtype)
    for m, n, k in sizes:
        a = rng.uniform(-1, 1, (m, k)).astype(np_type)
        b = rng.uniform(-1, 1, (k, n)).astype(np_type)
        a_copy, b_copy = a.copy(), b.copy()
        c_zone = np.full(m * n + 2 * GUARD, np.nan, np_type)
        c_zone[:GUARD] = c_zone[-GUARD:] = 12345.0
        pointer = ctypes.c_void_p(c_zone.ctypes.data + GUARD * np_type.itemsize)
        kernel(a.ctypes.data_as(ctypes.c_void_p), b.ctypes.data_as(ctypes.c_void_p), pointer,
               ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k))
        c = c_zone[GUARD:-GUARD].reshape(m, n)
        assert (c_zone[:GUARD] == 12345.0).all() and (c_zone[-GUARD:] == 12345.0).all(), (
            f"write outside C at {m}x{n}x{k}")
        assert np.array_equal(a, a_copy) and np.array_equal(b, b_copy), "inputs changed"
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        error = np.abs(c - a64 @ b64) / np.maximum(np.abs(a64) @ np.abs(b64), 1e-30)
        assert np.isfinite(c).all(), f"unwritten or non-finite outputs at {m}x{n}x{k}"
        worst = float(error.max())
        assert worst <= TOLERANCE[dtype], f"wrong result at {m}x{n}x{k}: error {worst:.3g}"


def minimal_prefix(tid: str, catalog: Mapping[str, Transformation]) -> list[str]:
    """The shortest sequence whose steps meet `tid`'s requirements, in a legal order."""
    prefix: list[str] = []
    for required in catalog[tid].requires:
        for step in minimal_prefix(required, catalog) + [required]:
            if step not in prefix:
                prefix.append(step)
    return prefix


# ------------------------------------------------- fixtures of the LLM applier's tests


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.with_user_folders()


@pytest.fixture(scope="module")
def c_seed(catalog: Catalog) -> KernelContext:
    spec = catalog.spec("matmul")
    return KernelContext(kernel="matmul", backend="c", source=spec.sources["c"],
                         entry=spec.entry["c"])


# ---------------------------------------------------------------- CUDA reference fixtures


@pytest.fixture(scope="module")
def cuda_catalog() -> dict[str, Transformation]:
    """The transformations with a CUDA reference implementation."""
    found = load_transformations([ROOT / "transforms"])
    return {tid: t for tid, t in found.items() if "cuda" in t.backends}


@pytest.fixture(scope="module")
def h200() -> DeviceProfile:
    return load_device(ROOT / "backends" / "devices" / "h200.toml")


@pytest.fixture(scope="module")
def cuda_seed() -> KernelContext:
    return seed_context(load_spec(ROOT / "seeds" / "matmul"), "cuda")


def build_cuda(start: KernelContext, sequence: Iterable[str],
               catalog: Mapping[str, Transformation], device: DeviceProfile) -> KernelContext:
    """`start` after each step of `sequence`, by the CUDA reference applier."""
    for tid in sequence:
        start = apply_transformation(start, catalog[tid], device)
    return start

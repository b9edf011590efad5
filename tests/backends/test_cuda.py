"""The CUDA backend on a real GPU: the seed and cuBLAS validate and time; kernels that
cheat, crash or hang fail with the class and message a user would see, and the next
evaluation works. Skipped (with the reason) where CuPy sees no CUDA device.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from peak_tune.backends._cuda_device import HELD_RUNS_VARIABLE
from peak_tune.backends.base import EvalConfig, EvalRequest
from peak_tune.backends.cuda import CudaBackend, profile_for_gpu, visible_gpu
from peak_tune.catalog.loaders import load_devices, load_spec
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, KernelSpec, Measurement, ProblemSize
from peak_tune.errors import (
    InvalidPoint,
    KernelCrash,
    KernelTimeout,
    NoVendorLibrary,
    WrongResult,
)
from peak_tune.evaluation.pipeline import seed_context

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]

ROOT = Path(__file__).resolve().parents[2]
ADVERSARIAL = ROOT / "tests" / "fixtures" / "adversarial_cuda"
SQUARE = ProblemSize.of({"M": 512, "N": 512, "K": 512})
ODD = ProblemSize.of({"M": 333, "N": 517, "K": 259})
CONFIG = EvalConfig(timeout_s=60.0, warmup=1, repeats=5, max_timing_s=1.0)
SKIP_SOURCE = """\
extern "C" __global__ void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= M || col >= N) return;
    ACC acc = 0;
    for (int k = 0; k < K - SKIP; k++) acc += (ACC)A[row * K + k] * (ACC)B[k * N + col];
    C[row * N + col] = (DTYPE)acc;
}
"""


@pytest.fixture(scope="module")
def spec() -> KernelSpec:
    return load_spec(ROOT / "seeds" / "matmul")


@pytest.fixture(scope="module")
def profile() -> DeviceProfile:
    """The device profile of this GPU: same architecture, by name where one matches."""
    name, arch = visible_gpu()
    found = profile_for_gpu(name, arch, load_devices([ROOT / "backends" / "devices"]).values())
    if found is None:
        pytest.skip(reason=f"no device profile for {name} ({arch})")
    return found


@pytest.fixture(scope="module")
def backend(profile: DeviceProfile) -> Iterator[CudaBackend]:
    with CudaBackend(profile) as driver:
        yield driver


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cuda-builds"))


def context_of(spec: KernelSpec, source: str, **fields: object) -> KernelContext:
    context = dataclasses.replace(seed_context(spec, "cuda"), source=source)
    return dataclasses.replace(context, **fields)  # type: ignore[arg-type]


def run(
    backend: CudaBackend, spec: KernelSpec, build_dir: str, context: KernelContext,
    params: Mapping[str, int] | None = None, *, dtype: str = "float32",
    size: ProblemSize = SQUARE, config: EvalConfig = CONFIG,
) -> Measurement:
    artifact = backend.compile(context, dict(params or {}), dtype, build_dir)
    request = EvalRequest(spec=spec, context=context, params=dict(params or {}), dtype=dtype,
                          size=size, check_sizes=spec.check_sizes, config=config)
    return backend.evaluate(artifact, request)


def fixture(spec: KernelSpec, name: str, **fields: object) -> KernelContext:
    return context_of(spec, (ADVERSARIAL / name).read_text(), **fields)


# ---------------------------------------------------------------- the seed and cuBLAS


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("size", [SQUARE, ODD], ids=["512", "333x517x259"])
def test_naive_seed_validates_and_times(
    backend: CudaBackend, spec: KernelSpec, build_dir: str, dtype: str, size: ProblemSize
) -> None:
    measurement = run(backend, spec, build_dir, seed_context(spec, "cuda"), dtype=dtype,
                      size=size)
    assert len(measurement.samples_ms) == CONFIG.repeats
    assert all(s > 0 for s in measurement.samples_ms)
    m, n, k = (size.as_dict()[s] for s in "MNK")
    assert measurement.flops == 2 * m * n * k
    assert measurement.gflops > 0


@pytest.mark.parametrize(("dtype", "compute"), [
    ("float32", "CUBLAS_COMPUTE_32F (true SGEMM, TF32 off)"),
    ("float16", "fp32 accumulation (CUBLAS_COMPUTE_32F)"),
    ("bfloat16", "bf16 in/out, fp32 accumulation (CUBLAS_COMPUTE_32F)"),
])
def test_vendor_is_cublas_timed_by_the_same_code(
    backend: CudaBackend, spec: KernelSpec, dtype: str, compute: str
) -> None:
    name, measurement = backend.time_vendor(spec, dtype, SQUARE, CONFIG)
    assert name.startswith("cuBLAS ") and compute in name
    assert len(measurement.samples_ms) == CONFIG.repeats and measurement.gflops > 0


def test_probe_and_fingerprint_describe_this_gpu(
    backend: CudaBackend, profile: DeviceProfile
) -> None:
    assert backend.probe() is profile
    fingerprint = backend.fingerprint()
    assert set(fingerprint) == {"device", "driver", "cuda_runtime", "compiler", "flags",
                                "harness"}
    assert fingerprint["compiler"].startswith("NVRTC ")
    assert f"-arch={profile.facts['arch']}" in fingerprint["flags"]


def test_macro_parameter_reaches_the_kernel(
    backend: CudaBackend, spec: KernelSpec, build_dir: str
) -> None:
    context = context_of(spec, SKIP_SOURCE)
    assert run(backend, spec, build_dir, context, {"SKIP": 0}).gflops > 0
    with pytest.raises(WrongResult, match="wrong result at 67x53x97"):
        run(backend, spec, build_dir, context, {"SKIP": 1})


# ---------------------------------------------------------------- resources


def test_block_over_the_functions_thread_limit_is_pruned(
    backend: CudaBackend, spec: KernelSpec, build_dir: str
) -> None:
    source = SKIP_SOURCE.replace('extern "C" __global__ void',
                                 'extern "C" __global__ void __launch_bounds__(256)')
    launch = {**seed_context(spec, "cuda").launch, "block_x": "32", "block_y": "16",
              "grid_x": "ceil_div(N, 32)"}
    with pytest.raises(InvalidPoint, match="block of 512 threads exceeds this function's "
                                           "limit of 256"):
        run(backend, spec, build_dir, context_of(spec, source, launch=launch), {"SKIP": 0})


def test_dynamic_shared_memory_over_48k_opts_in_and_over_the_limit_is_pruned(
    backend: CudaBackend, spec: KernelSpec, build_dir: str
) -> None:
    big = {**seed_context(spec, "cuda").launch, "shared_bytes": "100000"}
    assert run(backend, spec, build_dir,
               context_of(spec, spec.sources["cuda"], launch=big)).gflops > 0
    too_big = {**big, "shared_bytes": "M * 1000"}
    with pytest.raises(InvalidPoint, match="shared memory per block"):
        run(backend, spec, build_dir, context_of(spec, spec.sources["cuda"], launch=too_big))


# ---------------------------------------------------------------- adversarial kernels


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("oob_write.cu", "wrote out of bounds: guard after C changed at 67x53x97"),
        ("stale.cu", "wrong result at 512x512x512: "),
        ("race.cu", "wrong result at "),
    ],
)
def test_cheating_kernel_fails_validation(
    backend: CudaBackend, spec: KernelSpec, build_dir: str, name: str, message: str
) -> None:
    with pytest.raises(WrongResult) as caught:
        run(backend, spec, build_dir, fixture(spec, name))
    assert str(caught.value).startswith(message)


def test_illegal_address_is_a_crash_and_the_next_evaluation_works(
    backend: CudaBackend, spec: KernelSpec, build_dir: str
) -> None:
    with pytest.raises(KernelCrash, match="kernel crashed: .*illegal memory access"):
        run(backend, spec, build_dir, fixture(spec, "illegal_address.cu"))
    assert run(backend, spec, build_dir, seed_context(spec, "cuda")).gflops > 0


@pytest.mark.parametrize(
    ("name", "errors", "message"),
    [
        # a store 8 KiB past C that puts back the value it found: no content check sees
        # it, but the memory past every buffer is unmapped, so it faults
        ("cheat_write_far_past_c.cu", (KernelCrash,), "illegal memory access"),
        # a changed byte before C's front guard: the mapping's slack there is checked
        ("write_before_front_guard.cu", (WrongResult, KernelCrash),
         "memory before C's front guard changed|illegal memory access"),
    ],
)
def test_a_write_outside_the_guards_fails_and_the_next_evaluation_works(
    backend: CudaBackend, spec: KernelSpec, build_dir: str, name: str,
    errors: tuple[type[Exception], ...], message: str,
) -> None:
    with pytest.raises(errors, match=message):
        run(backend, spec, build_dir, fixture(spec, name))
    # the slack is refilled and the block reused: the seed is not blamed for it afterwards
    assert run(backend, spec, build_dir, seed_context(spec, "cuda")).gflops > 0


def test_endless_kernel_times_out_and_the_next_evaluation_works(
    backend: CudaBackend, spec: KernelSpec, build_dir: str
) -> None:
    short = dataclasses.replace(CONFIG, timeout_s=5.0)
    with pytest.raises(KernelTimeout, match="kernel timed out after 5 s"):
        run(backend, spec, build_dir, fixture(spec, "forever.cu"), config=short)
    assert run(backend, spec, build_dir, seed_context(spec, "cuda")).gflops > 0


# ---------------------------------------------------------------- compute-sanitizer


needs_sanitizer = pytest.mark.skipif(
    shutil.which("compute-sanitizer") is None
    and not Path("/usr/local/cuda/bin/compute-sanitizer").is_file(),
    reason="compute-sanitizer is not installed")


def _sanitize(
    backend: CudaBackend, spec: KernelSpec, build_dir: str, context: KernelContext
) -> str:
    artifact = backend.compile(context, {}, "float32", build_dir)
    request = EvalRequest(spec=spec, context=context, params={}, dtype="float32", size=SQUARE,
                          check_sizes=spec.check_sizes, config=CONFIG)
    return backend.sanitize(artifact, request)


@needs_sanitizer
def test_sanitizer_passes_the_seed(backend: CudaBackend, spec: KernelSpec, build_dir: str) -> None:
    report = _sanitize(backend, spec, build_dir, seed_context(spec, "cuda"))
    assert report.startswith("compute-sanitizer memcheck at 67x53x97: no errors\n"
                             "compute-sanitizer racecheck at 67x53x97: no errors\n")


@needs_sanitizer
@pytest.mark.parametrize(("name", "message"), [
    ("race.cu", "compute-sanitizer racecheck at 67x53x97: "),
    ("illegal_address.cu", "compute-sanitizer memcheck at 67x53x97: "),
])
def test_sanitizer_reports_races_and_bad_accesses(
    backend: CudaBackend, spec: KernelSpec, build_dir: str, name: str, message: str
) -> None:
    with pytest.raises(WrongResult) as caught:
        _sanitize(backend, spec, build_dir, fixture(spec, name))
    assert str(caught.value).startswith(message), caught.value.detail[-2000:]


# ---------------------------------------------------------------- Nsight Compute


@pytest.mark.skipif(shutil.which("ncu") is None and not Path("/usr/local/cuda/bin/ncu").is_file(),
                    reason="Nsight Compute (ncu) is not installed")
def test_ncu_profiles_one_launch_at_the_timed_size(
    backend: CudaBackend, spec: KernelSpec, build_dir: str
) -> None:
    context = seed_context(spec, "cuda")
    artifact = backend.compile(context, {}, "float32", build_dir)
    request = EvalRequest(spec=spec, context=context, params={}, dtype="float32", size=SQUARE,
                          check_sizes=spec.check_sizes, config=CONFIG)
    report = backend.profile(artifact, request)
    assert report.metrics["Registers Per Thread"][0].isdigit()
    assert float(report.metrics["Compute (SM) Throughput"][0].replace(",", "")) > 0
    assert report.summary().startswith("SM ")
    assert '"Grid Size"' in report.raw  # the CSV header a person can open


# ---------------------------------------------------------------- TMA tensor maps

TMA_SEQUENCES = {
    "tma": ("refactor", "tb-tiling", "tensor-core", "vector-loads", "pipelining", "wgmma",
            "tma"),
    "warp-specialize tma": ("refactor", "tb-tiling", "tensor-core", "vector-loads",
                            "pipelining", "wgmma", "warp-specialize", "tma"),
}
TMA_POINT = {"BLOCK_M": 128, "BLOCK_N": 128, "TILE_K_SIZE": 64, "NUM_STAGES": 3,
             "WGMMA_N": 128}


def hopper_kernel(spec: KernelSpec, profile: DeviceProfile,
                  sequence: tuple[str, ...]) -> KernelContext:
    """The reference applier's kernel after `sequence`; skipped off sm_90a."""
    if profile.facts.get("arch") != "sm_90a":
        pytest.skip(reason=f"wgmma and TMA need sm_90a, not {profile.facts.get('arch')}")
    from peak_tune.appliers.reference.cuda_matmul import apply_transformation
    from peak_tune.catalog.loaders import load_transformations

    catalog = load_transformations([ROOT / "transforms"])
    context = seed_context(spec, "cuda")
    for step in sequence:
        context = apply_transformation(context, catalog[step], profile)
    return context


@pytest.mark.parametrize("kernel", list(TMA_SEQUENCES))
@pytest.mark.parametrize("size", [SQUARE, ProblemSize.of({"M": 200, "N": 136, "K": 1000}), ODD],
                         ids=["512", "edges 200x136x1000", "odd, no maps"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tma_kernels_validate_with_the_backends_tensor_maps(
    backend: CudaBackend, profile: DeviceProfile, spec: KernelSpec, build_dir: str,
    kernel: str, size: ProblemSize, dtype: str,
) -> None:
    """The maps (K and N multiples of 8) load edge tiles with zeros; at odd sizes the
    backend passes null and the kernel's cp.async copies run."""
    context = hopper_kernel(spec, profile, TMA_SEQUENCES[kernel])
    measurement = run(backend, spec, build_dir, context, TMA_POINT, dtype=dtype, size=size)
    assert measurement.gflops > 0


STREAM_K = ("refactor", "tb-tiling", "tensor-core", "vector-loads", "pipelining", "wgmma",
            "warp-specialize", "block-swizzle", "tma", "register-budget", "tma-store",
            "persistent", "stream-k")
# output tiles past whole waves of one block per SM (at the spec's check sizes there are
# fewer tiles than SMs): 64 x 128 tiles of 1000 x 1700 are 224; K = 999 has no tensor maps
STREAM_K_SIZES = tuple(ProblemSize.of(dict(zip("MNK", s, strict=True)))
                       for s in ((1000, 1700, 500), (1000, 1700, 999), (1100, 4000, 200)))


@pytest.mark.parametrize(("dtype", "downwards"), [("float16", 1), ("bfloat16", 1),
                                                 ("float16", 0)])
def test_stream_k_hands_partial_sums_over_correctly_where_a_wave_is_partial(
    backend: CudaBackend, profile: DeviceProfile, spec: KernelSpec, build_dir: str, dtype: str,
    downwards: int,
) -> None:
    """Every element compared with the reference at sizes where blocks share output
    tiles (runs of one K tile and empty ones at 1100 x 4000 x 200), then the timed runs
    checked by projection: each launch relies on the hand-over flags the last one
    cleared."""
    context = hopper_kernel(spec, profile, STREAM_K)
    point = {"BLOCK_M": 64, "BLOCK_N": 128, "TILE_K_SIZE": 64, "NUM_STAGES": 4,
             "WGMMA_N": 128, "SWIZZLE_GROUP": 4, "PRODUCER_REGS": 40, "SK_DOWNWARDS": downwards}
    artifact = backend.compile(context, point, dtype, build_dir)
    request = EvalRequest(spec=spec, context=context, params=point, dtype=dtype,
                          size=STREAM_K_SIZES[0], check_sizes=STREAM_K_SIZES, config=CONFIG)
    assert backend.evaluate(artifact, request).gflops > 0


# ---------------------------------------------------------------- a user's own kernels

USER_CATALOGS = ROOT / "tests" / "fixtures" / "catalogs"
USER_SIZES = {"bmm": {"BATCH": 3, "M": 96, "N": 80, "K": 72},
              "matmul_bt": {"M": 200, "N": 136, "K": 88},
              "softmax": {"ROWS": 300, "COLS": 517}}


@pytest.mark.parametrize("kernel", sorted(USER_SIZES))
def test_a_users_own_kernel_validates_on_the_gpu_and_a_broken_copy_does_not(
    backend: CudaBackend, build_dir: str, kernel: str
) -> None:
    """A user's folder (spec and naive .cu, no code in peak_tune) validates and times on
    the GPU against its own reference; the same seed with its last write dropped fails."""
    user_spec = load_spec(USER_CATALOGS / kernel / "seeds" / kernel)
    size = ProblemSize.of(USER_SIZES[kernel])
    seed = seed_context(user_spec, "cuda")
    measurement = run(backend, user_spec, build_dir, seed, size=size)
    assert len(measurement.samples_ms) == CONFIG.repeats and measurement.gflops > 0
    lines = seed.source.rstrip().rstrip("}").rstrip().splitlines()
    broken = dataclasses.replace(seed, source="\n".join(lines[:-1]) + "\n}\n")
    with pytest.raises(WrongResult):
        run(backend, user_spec, build_dir, broken, size=size)


@pytest.mark.parametrize(("kernel", "named"), [("bmm", ", strided batched"),
                                               ("matmul_bt", ", B transposed")])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_users_declared_gemm_is_cublas_checked_like_a_kernel(
    backend: CudaBackend, kernel: str, named: str, dtype: str
) -> None:
    """[vendor] cuda = "gemm" on batched buffers is cuBLAS's strided batched GEMM, and
    "gemm-bt" reads B as N x K: both validate against the folder's own reference."""
    user_spec = load_spec(USER_CATALOGS / kernel / "seeds" / kernel)
    if dtype not in user_spec.tolerances:
        user_spec = dataclasses.replace(user_spec, dtypes=(*user_spec.dtypes, dtype),
                                        tolerances={**user_spec.tolerances, dtype: 5e-4})
    name, measurement = backend.time_vendor(user_spec, dtype,
                                            ProblemSize.of(USER_SIZES[kernel]), CONFIG)
    assert name.startswith("cuBLAS ") and name.endswith(named)
    assert measurement.gflops > 0


def test_a_kernel_without_a_declared_vendor_has_none_on_the_gpu(backend: CudaBackend) -> None:
    user_spec = load_spec(USER_CATALOGS / "softmax" / "seeds" / "softmax")
    with pytest.raises(NoVendorLibrary, match="declares no vendor call on cuda"):
        backend.time_vendor(user_spec, "float32", ProblemSize.of(USER_SIZES["softmax"]),
                            CONFIG)


# ---------------------------------------------------------------- runs checked in batches

# Correct for its first LATE_LAUNCH launches, then it skips the work: with the check
# sizes, the validation and the warm-up before them, its later timed runs are wrong.
LATE_LAUNCH = 12
LATE_SOURCE = f"""\
__device__ unsigned int launches = 0;
__device__ unsigned int blocks_done = 0;

extern "C" __global__ void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {{
    unsigned int launch = launches;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (launch < {LATE_LAUNCH} && row < M && col < N) {{
        ACC acc = 0;
        for (int k = 0; k < K; k++) acc += (ACC)A[row * K + k] * (ACC)B[k * N + col];
        C[row * N + col] = (DTYPE)acc;
    }}
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0) {{
        __threadfence();
        if (atomicAdd(&blocks_done, 1u) == gridDim.x * gridDim.y - 1) {{
            launches = launch + 1;
            blocks_done = 0;
        }}
    }}
}}
"""
MANY_RUNS = EvalConfig(timeout_s=120.0, warmup=2, repeats=16, max_timing_s=60.0)


@pytest.fixture(scope="module")
def small_batches(profile: DeviceProfile) -> Iterator[CudaBackend]:
    """A backend whose worker holds about two 512 fp32 runs for one check (about 10 MB
    each), as a GPU too small for its runs does."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(HELD_RUNS_VARIABLE, str(24 << 20))
        with CudaBackend(profile) as driver:
            yield driver


def test_runs_checked_in_batches_still_catch_a_wrong_run_in_a_later_batch(
    small_batches: CudaBackend, spec: KernelSpec, build_dir: str
) -> None:
    assert LATE_LAUNCH > len(spec.check_sizes) + 1 + MANY_RUNS.warmup + 4  # batches of right runs
    with pytest.raises(WrongResult):
        run(small_batches, spec, build_dir, context_of(spec, LATE_SOURCE), config=MANY_RUNS)
    # the seed on the same worker: every run right, every batch passes
    measurement = run(small_batches, spec, build_dir, seed_context(spec, "cuda"),
                      config=MANY_RUNS)
    assert len(measurement.samples_ms) == MANY_RUNS.repeats


def test_cublas_timed_in_batches_gives_every_run(small_batches: CudaBackend,
                                                  spec: KernelSpec) -> None:
    name, measurement = small_batches.time_vendor(spec, "float32", SQUARE, MANY_RUNS)
    assert name.startswith("cuBLAS ") and len(measurement.samples_ms) == MANY_RUNS.repeats

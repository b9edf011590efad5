"""The CUDA backend's side that needs no GPU: NVRTC builds, launch geometry, probing.

NVRTC comes from pip wheels (`pip install -e '.[cuda-compile]'`); without them the
compile tests skip with the reason. Launch-geometry and loader tests always run.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from peak_tune.backends import make_backend
from peak_tune.backends._cuda_device import Timing
from peak_tune.backends._cuda_launch import (
    TensorMapBox,
    check_launch,
    evaluate_launch,
    tensor_map_boxes,
)
from peak_tune.backends._cuda_tma import TensorMapLayout, layout_for
from peak_tune.backends._nvrtc import (
    compile_cubin,
    cubin_resources,
    ptxas_resources,
)
from peak_tune.backends._nvrtc_process import _COMPILERS, BUILD_NICENESS, build_niceness
from peak_tune.backends.base import Artifact, EvalConfig, EvalRequest
from peak_tune.backends.cuda import CudaBackend, profile_for_gpu
from peak_tune.catalog.loaders import load_device, load_devices, load_spec, load_transformations
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, KernelSpec, ProblemSize
from peak_tune.errors import (
    BackendUnavailable,
    BuildOverBudget,
    CatalogError,
    CompileError,
    EnvironmentFault,
    InvalidPoint,
    UserError,
)
from peak_tune.evaluation.pipeline import seed_context
from tests.appliers.conftest import build_cuda
from tests.nvrtc import needs_nvrtc

ROOT = Path(__file__).resolve().parents[2]
DEVICES = ROOT / "backends" / "devices"
ADVERSARIAL = ROOT / "tests" / "fixtures" / "adversarial_cuda"
CONFORMANCE = ROOT / "tests" / "fixtures" / "conformance" / "cuda"
LAUNCH = {"grid_x": "ceil_div(N, 16)", "grid_y": "ceil_div(M, 16)", "block_x": "16",
          "block_y": "16"}
TILE_SOURCE = """\
#ifndef TILE
#error "TILE must be set with -DTILE=..."
#endif
extern "C" __global__ void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    __shared__ ACC tile[TILE * TILE];
    int i = threadIdx.x;
    tile[i % (TILE * TILE)] = (ACC)A[i];
    __syncthreads();
    C[i] = (DTYPE)tile[(i + 1) % (TILE * TILE)];
}
"""

# STEPS fully unrolled K steps of an 8 x 8 outer product: NVRTC takes seconds (2.3 s for
# 128 on a 2-core VM), as the search's largest unrolled kernels do
SLOW_SOURCE = """\
extern "C" __global__ void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    __shared__ ACC as[STEPS][8], bs[STEPS][8];
    for (int e = threadIdx.x; e < STEPS * 8; e += blockDim.x) {
        as[e / 8][e % 8] = A[e];
        bs[e / 8][e % 8] = B[e];
    }
    __syncthreads();
    ACC acc[8][8] = {};
    #pragma unroll
    for (int k = 0; k < STEPS; ++k)
        #pragma unroll
        for (int i = 0; i < 8; ++i)
            #pragma unroll
            for (int j = 0; j < 8; ++j) acc[i][j] += as[k][i] * bs[(k + threadIdx.x) % STEPS][j];
    for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 8; ++j) C[threadIdx.x * 64 + i * 8 + j] = acc[i][j];
}
"""


@pytest.fixture(scope="module")
def spec() -> KernelSpec:
    return load_spec(ROOT / "seeds" / "matmul")


@pytest.fixture(scope="module")
def h200() -> DeviceProfile:
    return load_device(DEVICES / "h200.toml")


@pytest.fixture(scope="module")
def backend(h200: DeviceProfile) -> Iterator[CudaBackend]:
    with CudaBackend(h200) as driver:
        yield driver


def context_of(source: str, **fields: object) -> KernelContext:
    context = KernelContext(kernel="matmul", backend="cuda", source=source, entry="matmul",
                            launch=LAUNCH)
    return dataclasses.replace(context, **fields)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the seed builds


@needs_nvrtc
@pytest.mark.parametrize("device", ["a100", "h200"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_seed_compiles_to_a_cubin_with_its_resources(
    spec: KernelSpec, tmp_path: Path, device: str, dtype: str
) -> None:
    profile = load_device(DEVICES / f"{device}.toml")
    context = seed_context(spec, "cuda")
    artifact = CudaBackend(profile).compile(context, {}, dtype, str(tmp_path))
    assert Path(artifact.path).read_bytes()[:4] == b"\x7fELF"  # a cubin, not PTX
    assert 8 <= artifact.resources["registers"] <= 64
    assert artifact.resources["stack_bytes"] == 0
    assert artifact.resources["shared_static_bytes"] == 0


@needs_nvrtc
def test_the_build_cost_benchmark_reports_nvrtcs_phases(
    backend: CudaBackend, spec: KernelSpec, benchmark: Callable[[str], ModuleType]
) -> None:
    """benchmarks/nvrtc_build_cost.py --phases: NVRTC's own phase times for a build with
    the backend's options, and the front end of the kernel's headers alone (what a
    precompiled header could save)."""
    cost = benchmark("nvrtc_build_cost")
    phases = cost._phases(backend, seed_context(spec, "cuda"), {}, "float16", 1)
    assert {"CUDA C++ Frontend", "NVVM Optimizer", "PTX Translation",
            "headers only"} <= set(phases)
    assert all(ms > 0 for ms in phases.values())
    assert phases["headers only"] <= 2 * phases["CUDA C++ Frontend"]


@needs_nvrtc
def test_identical_build_in_a_new_folder_still_reports_resources(
    backend: CudaBackend, spec: KernelSpec, tmp_path: Path
) -> None:
    """NVRTC 13.0 was seen to leave ptxas's report out of the log of a repeated build."""
    context = seed_context(spec, "cuda")
    first = backend.compile(context, {}, "float32", str(tmp_path / "one"))
    second = backend.compile(context, {}, "float32", str(tmp_path / "two"))
    assert not second.reused
    for key in ("registers", "stack_bytes", "shared_static_bytes"):
        assert second.resources[key] == first.resources[key]
    assert Path(second.path).read_bytes() == Path(first.path).read_bytes()


@needs_nvrtc
def test_two_orders_that_print_the_same_source_share_one_build(
    spec: KernelSpec, h200: DeviceProfile, tmp_path: Path
) -> None:
    """Builds are keyed by what NVRTC sees: block-swizzle and thread-tiling commute, and
    the second order reuses the first's cubin though the variants (their lineage, their
    evaluations) stay apart; other values, or another source, build anew."""
    seed = seed_context(spec, "cuda")
    catalog = load_transformations([ROOT / "transforms"])
    one = build_cuda(seed, ("refactor", "thread-tiling", "block-swizzle"), catalog, h200)
    other = build_cuda(seed, ("refactor", "block-swizzle", "thread-tiling"), catalog, h200)
    assert one.source == other.source and one.content_hash() != other.content_hash()
    backend = CudaBackend(h200)
    values = {p.name: p.values[0] for p in one.params}
    first = backend.compile(one, values, "float32", str(tmp_path))
    second = backend.compile(other, values, "float32", str(tmp_path))
    assert not first.reused and second.reused and second.path == first.path
    assert second.resources == first.resources
    moved = {**values, "SWIZZLE_GROUP": one.param("SWIZZLE_GROUP").values[1]}
    assert not backend.compile(other, moved, "float32", str(tmp_path)).reused
    assert not backend.compile(seed, {}, "float32", str(tmp_path)).reused


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cubin_resources_agree_with_the_ptxas_report(arch: str) -> None:
    source = ('extern "C" __global__ void matmul(float *c) {\n'
              "    __shared__ float tile[1000];\n"
              "    float local[100];\n"
              "    tile[threadIdx.x % 1000] = c[threadIdx.x];\n"
              "    __syncthreads();\n"
              "    for (int i = 0; i < 100; i++) local[i] = c[i * threadIdx.x];\n"
              "    c[5] = local[threadIdx.x % 100] + tile[(threadIdx.x + 1) % 1000];\n}\n"
              'extern "C" __global__ void other(float *c) { c[0] = 1; }\n')
    built = compile_cubin(source, [f"-arch={arch}", "--ptxas-options=-v"])
    report = {entry: ptxas_resources(built.log, entry) for entry in ("matmul", "other")}
    if not report["matmul"]:
        pytest.skip("this NVRTC left ptxas's report out of the log")
    for entry, expected in report.items():
        keys = ("registers", "stack_bytes", "shared_static_bytes")
        assert cubin_resources(built.cubin, entry) == {k: expected[k] for k in keys}
    assert report["matmul"]["stack_bytes"] == 400
    assert report["matmul"]["shared_static_bytes"] == 4000
    assert cubin_resources(b"not an ELF file", "matmul") == {}


@needs_nvrtc
def test_compile_error_carries_the_nvrtc_log(backend: CudaBackend, tmp_path: Path) -> None:
    broken = ('extern "C" __global__ void matmul(DTYPE *C) {\n'
              "    C[0] = 1\n}\n")
    with pytest.raises(CompileError) as caught:
        backend.compile(context_of(broken), {}, "float32", str(tmp_path))
    assert str(caught.value) == 'compile error: line 3: expected a ";"'
    assert "-arch=sm_90" in caught.value.detail and "error" in caught.value.detail


@needs_nvrtc
def test_a_build_past_its_time_limit_is_stopped_and_the_next_one_builds(
    backend: CudaBackend, tmp_path: Path
) -> None:
    """The search's build budget: NVRTC is stopped mid-build (it runs in a compiler
    process), the point is over budget, and nothing half-built is left to be reused."""
    slow = context_of(SLOW_SOURCE)
    started = time.monotonic()
    with pytest.raises(BuildOverBudget, match=r"build stopped after 0\.3 s"):
        backend.compile(slow, {"STEPS": 256}, "float32", str(tmp_path), time_limit_s=0.3)
    stopped_after = time.monotonic() - started
    assert not list(tmp_path.glob("*.cubin"))
    quick = backend.compile(slow, {"STEPS": 2}, "float32", str(tmp_path), time_limit_s=60)
    assert quick.resources["registers"] > 0 and not quick.reused
    # the same slow build without a limit runs to its end, well past where it was stopped
    started = time.monotonic()
    assert backend.compile(slow, {"STEPS": 256}, "float32", str(tmp_path)).resources
    assert time.monotonic() - started > stopped_after


def _restart_compilers() -> None:
    """Compiler processes take their priority when they start: stop the ones running."""
    _COMPILERS.stop_all()
    _COMPILERS._started.clear()
    _COMPILERS._idle.clear()


def _compiler_priorities() -> list[int]:
    running = [c._proc.pid for c in _COMPILERS._started if c.running]  # type: ignore[union-attr]
    assert running
    return [os.getpriority(os.PRIO_PROCESS, pid) for pid in running]


@needs_nvrtc
def test_compiler_processes_run_below_the_tuners_priority_when_asked(
    backend: CudaBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PEAK_TUNE_BUILD_NICENESS=5: the builds give way to the timing worker and the driver."""
    _restart_compilers()
    monkeypatch.setenv("PEAK_TUNE_BUILD_NICENESS", "5")
    try:
        backend.compile(context_of(SLOW_SOURCE), {"STEPS": 2}, "float32", str(tmp_path))
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert _compiler_priorities() == [min(19, mine + 5)] * len(_compiler_priorities())
    finally:
        _restart_compilers()


def test_build_niceness_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """PEAK_TUNE_BUILD_NICENESS picks the steps below the tuner's priority (default 0); a
    value that is not a step from 0 to 19 is one line naming the variable, before any
    compiler starts."""
    monkeypatch.delenv("PEAK_TUNE_BUILD_NICENESS", raising=False)
    assert build_niceness() == BUILD_NICENESS
    monkeypatch.setenv("PEAK_TUNE_BUILD_NICENESS", "7")
    assert build_niceness() == 7
    for bad in ("-3", "lots", "25"):
        monkeypatch.setenv("PEAK_TUNE_BUILD_NICENESS", bad)
        with pytest.raises(UserError, match="PEAK_TUNE_BUILD_NICENESS must be a whole number"):
            build_niceness()


@needs_nvrtc
def test_compilers_run_at_the_tuners_priority_by_default(
    backend: CudaBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _restart_compilers()
    monkeypatch.delenv("PEAK_TUNE_BUILD_NICENESS", raising=False)
    try:
        backend.compile(context_of(SLOW_SOURCE), {"STEPS": 3}, "float32", str(tmp_path))
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert set(_compiler_priorities()) == {mine}
    finally:
        _restart_compilers()


@needs_nvrtc
def test_a_compiler_that_dies_is_a_compile_error_and_the_next_build_works(
    backend: CudaBackend, tmp_path: Path
) -> None:
    """NVRTC crashing (here: its process faulting mid-build) fails that variant only."""
    failed: list[BaseException] = []

    def build() -> None:
        try:
            backend.compile(context_of(SLOW_SOURCE), {"STEPS": 512}, "float32", str(tmp_path))
        except CompileError as exc:
            failed.append(exc)

    builder = threading.Thread(target=build)
    builder.start()
    deadline = time.monotonic() + 30
    busy = []
    while not busy and time.monotonic() < deadline:  # the compiler the build took
        busy = [c for c in _COMPILERS._started if c.running and c not in _COMPILERS._idle]
        time.sleep(0.05)
    assert busy, "no compiler process started"
    time.sleep(0.3)
    os.kill(busy[0]._proc.pid, signal.SIGSEGV)  # type: ignore[union-attr]
    builder.join(60)
    assert len(failed) == 1 and str(failed[0]) == "compile error: NVRTC crashed (SIGSEGV)"
    assert backend.compile(context_of(SLOW_SOURCE), {"STEPS": 2}, "float32",
                           str(tmp_path)).resources


@needs_nvrtc
def test_a_compiler_killed_from_outside_is_the_machines_fault(
    backend: CudaBackend, tmp_path: Path
) -> None:
    """SIGKILL (the out-of-memory killer's signal) is not the kernel's doing: an
    EnvironmentFault, which is never cached as the variant's compile error."""
    caught: list[BaseException] = []

    def build() -> None:
        try:
            backend.compile(context_of(SLOW_SOURCE), {"STEPS": 512}, "float32", str(tmp_path))
        except (CompileError, EnvironmentFault) as exc:
            caught.append(exc)

    builder = threading.Thread(target=build)
    builder.start()
    deadline = time.monotonic() + 30
    busy = []
    while not busy and time.monotonic() < deadline:
        busy = [c for c in _COMPILERS._started if c.running and c not in _COMPILERS._idle]
        time.sleep(0.05)
    assert busy, "no compiler process started"
    time.sleep(0.3)
    os.kill(busy[0]._proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
    builder.join(60)
    assert len(caught) == 1 and isinstance(caught[0], EnvironmentFault)
    assert "compiler killed" in str(caught[0])


@needs_nvrtc
def test_tuning_parameter_reaches_the_code_and_sets_static_shared_memory(
    backend: CudaBackend, tmp_path: Path
) -> None:
    with pytest.raises(CompileError, match="TILE must be set"):
        backend.compile(context_of(TILE_SOURCE), {}, "float32", str(tmp_path))
    small = backend.compile(context_of(TILE_SOURCE), {"TILE": 8}, "float32", str(tmp_path))
    large = backend.compile(context_of(TILE_SOURCE), {"TILE": 64}, "float32", str(tmp_path))
    assert small.resources["shared_static_bytes"] == 8 * 8 * 4
    assert large.resources["shared_static_bytes"] == 64 * 64 * 4
    with pytest.raises(CompileError, match="'DTYPE' cannot be a tuning parameter"):
        backend.compile(context_of(TILE_SOURCE), {"DTYPE": 1}, "float32", str(tmp_path))


@needs_nvrtc
def test_device_side_launch_does_not_build(backend: CudaBackend, tmp_path: Path) -> None:
    """A variant cannot run its work outside the timed launch (no -rdc, no other stream)."""
    source = (ADVERSARIAL / "device_launch.cu").read_text()
    with pytest.raises(CompileError, match="device-side kernel launch"):
        backend.compile(context_of(source), {}, "float32", str(tmp_path))


@needs_nvrtc
@pytest.mark.parametrize("name", ["oob_write.cu", "race.cu", "stale.cu", "illegal_address.cu",
                                  "forever.cu"])
def test_adversarial_fixtures_build(backend: CudaBackend, tmp_path: Path, name: str) -> None:
    source = (ADVERSARIAL / name).read_text()
    assert backend.compile(context_of(source), {}, "float32", str(tmp_path)).resources


@needs_nvrtc
@pytest.mark.parametrize("name", sorted(p.name for p in CONFORMANCE.glob("*.cu")))
def test_conformance_fixtures_build(backend: CudaBackend, tmp_path: Path, name: str) -> None:
    """The CUDA conformance kernels (run on the GPU by test_cuda_conformance) compile."""
    source = (CONFORMANCE / name).read_text()
    assert backend.compile(context_of(source), {}, "float32", str(tmp_path)).resources


USER_CATALOGS = ROOT / "tests" / "fixtures" / "catalogs"


@needs_nvrtc
@pytest.mark.parametrize("kernel", ["bmm", "matmul_bt", "softmax"])
def test_a_users_own_cuda_seed_builds_from_its_catalog_folder(
    h200: DeviceProfile, tmp_path: Path, kernel: str
) -> None:
    """A user's kernel folder (a spec and a naive .cu, no code in peak_tune) builds for
    the H200 with its own launch table; test_cuda runs the same folders on a GPU."""
    user_spec = load_spec(USER_CATALOGS / kernel / "seeds" / kernel)
    context = seed_context(user_spec, "cuda")
    assert context.entry == kernel and "grid_x" in context.launch
    artifact = CudaBackend(h200).compile(context, {}, "float32", str(tmp_path))
    assert Path(artifact.path).read_bytes()[:4] == b"\x7fELF"
    assert artifact.resources["stack_bytes"] == 0


# ---------------------------------------------------------------- launch geometry


def test_launch_expressions_may_name_the_running_devices_sms_and_nothing_else() -> None:
    persistent = {**LAUNCH, "grid_x": "min(ceil_div(M, TILE) * ceil_div(N, TILE), SMS)"}
    check_launch(persistent, {"M", "N", "K", "TILE"})
    shape = evaluate_launch(persistent, {"M": 4096, "N": 4096, "K": 8, "TILE": 16,
                                         "SMS": 132})
    assert shape.grid[0] == 132
    with pytest.raises(CompileError, match=r"unknown name\(s\) \['CORES'\]"):
        check_launch({**LAUNCH, "grid_x": "CORES"}, {"M", "N", "K", "TILE"})


@needs_nvrtc
@pytest.mark.parametrize(
    ("launch", "message"),
    [
        ({**LAUNCH, "block_x": "64", "block_y": "32"}, "block of 2048 threads exceeds"),
        ({**LAUNCH, "block_z": "65"}, "block extent z = 65 is outside 1..64"),
        ({**LAUNCH, "shared_bytes": "TILE * 16384"},
         r"262144 bytes of shared memory per block \(0 static \+ 262144 dynamic\) exceed"),
    ],
)
def test_launch_the_device_cannot_run_is_pruned_before_it_is_built(
    backend: CudaBackend, tmp_path: Path, launch: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidPoint, match=message):
        backend.compile(context_of(TILE_SOURCE, launch=launch), {"TILE": 16}, "float32",
                        str(tmp_path))
    assert not list(tmp_path.iterdir())  # no NVRTC run was spent on it


@needs_nvrtc
def test_static_shared_memory_over_the_limit_is_pruned_once_built(
    backend: CudaBackend, tmp_path: Path
) -> None:
    launch = {**LAUNCH, "shared_bytes": "232448 - 512"}  # fits until the 1024 static bytes
    with pytest.raises(InvalidPoint, match=r"\(1024 static \+ 231936 dynamic\) exceed"):
        backend.compile(context_of(TILE_SOURCE, launch=launch), {"TILE": 16}, "float32",
                        str(tmp_path))


@needs_nvrtc
def test_launch_that_depends_on_sizes_is_left_to_the_worker(
    backend: CudaBackend, tmp_path: Path
) -> None:
    launch = {**LAUNCH, "shared_bytes": "M * 1000000"}
    artifact = backend.compile(context_of(TILE_SOURCE, launch=launch), {"TILE": 8}, "float32",
                               str(tmp_path))
    assert artifact.resources["registers"] > 0


@pytest.mark.parametrize(
    ("launch", "message"),
    [
        ({}, "has no launch geometry"),
        ({**LAUNCH, "threads": "256"}, r"unknown launch key\(s\) \['threads'\]"),
        ({"grid_x": "1"}, "launch needs block_x"),
        ({**LAUNCH, "tma_A": "64, 64"}, r'expected "ROWS, COLS, SWIZZLE"'),
        ({**LAUNCH, "tma_A": "64, 64, 128 +"}, "launch tma_A"),
        ({**LAUNCH, "tma_": "64, 64, 0"}, r"unknown launch key\(s\) \['tma_'\]"),
    ],
)
def test_malformed_launch_is_a_compile_error(
    backend: CudaBackend, tmp_path: Path, launch: dict[str, str], message: str
) -> None:
    with pytest.raises(CompileError, match=message):
        backend.compile(context_of(TILE_SOURCE, launch=launch), {"TILE": 8}, "float32",
                        str(tmp_path))


def test_launch_expressions_evaluate_over_sizes_and_parameters() -> None:
    geometry = evaluate_launch({"grid_x": "ceil_div(N, BN)", "grid_y": "ceil_div(M, 16)",
                                "block_x": "BN", "shared_bytes": "BN * 4"},
                               {"M": 67, "N": 53, "BN": 32})
    assert geometry.grid == (2, 5, 1) and geometry.block == (32, 1, 1)
    assert geometry.shared_bytes == 128 and geometry.threads == 32
    with pytest.raises(InvalidPoint, match="grid extent y = 70000"):
        evaluate_launch({"grid_x": "1", "grid_y": "70000", "block_x": "1"}, {})


def test_tensor_maps_follow_the_spec_buffer_order_and_boxes_tma_can_move() -> None:
    launch = {**LAUNCH, "tma_B": "TK, 64, 128", "tma_A": "BM, 64, 128"}
    boxes = tensor_map_boxes(launch, {"BM": 128, "TK": 32}, ["A", "B", "C"])
    assert boxes == [TensorMapBox("A", 128, 64, 128), TensorMapBox("B", 32, 64, 128)]
    with pytest.raises(CompileError, match=r"tensor maps of \['D'\], which are not buffers"):
        tensor_map_boxes({**LAUNCH, "tma_D": "8, 8, 0"}, {}, ["A", "B", "C"])
    with pytest.raises(InvalidPoint, match="each side must be 1..256"):
        tensor_map_boxes(launch, {"BM": 512, "TK": 32}, ["A", "B", "C"])
    with pytest.raises(InvalidPoint, match="swizzle of A is 96 bytes"):
        tensor_map_boxes({"tma_A": "8, 8, 96"}, {}, ["A"])


def test_tensor_map_layout_is_innermost_first_and_null_where_tma_cannot_map() -> None:
    box = TensorMapBox("A", 128, 64, 128)
    layout = layout_for(box, (4096, 1000), 2, 0x7F0000000100)
    assert layout == TensorMapLayout(data_type=1, address=0x7F0000000100, dims=(1000, 4096),
                                     pitch=2000, box=(64, 128), swizzle_mode=3)
    assert layout_for(box, (4096, 1001), 2, 0x7F0000000100) is None  # pitch 2002 bytes
    assert layout_for(box, (4096, 1000), 2, 0x7F0000000102) is None  # address
    with pytest.raises(InvalidPoint, match="wider than its 64-byte swizzle"):
        layout_for(TensorMapBox("A", 8, 64, 64), (64, 64), 2, 0)
    with pytest.raises(InvalidPoint, match="not a multiple of 16"):
        layout_for(TensorMapBox("A", 8, 12, 0), (64, 64), 2, 0)


def test_request_for_a_tensor_map_of_no_buffer_fails_before_the_gpu(
    backend: CudaBackend, spec: KernelSpec
) -> None:
    context = context_of(TILE_SOURCE, launch={**LAUNCH, "tma_X": "8, 8, 0"})
    request = EvalRequest(spec=spec, context=context, params={"TILE": 8}, dtype="float32",
                          size=ProblemSize.of({"M": 64, "N": 64, "K": 64}),
                          check_sizes=(), config=EvalConfig())
    artifact = Artifact("unused.cubin", "key")
    with pytest.raises(CompileError, match="not buffers of the kernel"):
        backend._request(artifact, request, request.size)


def test_slow_kernels_get_fewer_timed_runs() -> None:
    timing = Timing(warmup=1, repeats=20, max_timing_s=1.0, slow_cutoff_ms=0.0, seed=0)
    assert timing.repeat_count(10.0) == 20  # 20 x 10 ms fits in 1 s
    assert timing.repeat_count(100.0) == 10
    assert timing.repeat_count(5000.0) == 3  # never fewer than 3
    cut = Timing(warmup=1, repeats=20, max_timing_s=1.0, slow_cutoff_ms=50.0, seed=0)
    assert cut.repeat_count(60.0) == 1 and cut.repeat_count(40.0) == 20


def test_unknown_dtype_is_a_clear_error(backend: CudaBackend, tmp_path: Path) -> None:
    with pytest.raises(UserError,
                       match="supports dtypes float32, float16, bfloat16, float64, not 'int8'"):
        backend.compile(context_of(TILE_SOURCE), {}, "int8", str(tmp_path))


# ---------------------------------------------------------------- catalog, registry, probe


def test_spec_launch_table_reaches_the_seed_context(spec: KernelSpec) -> None:
    assert spec.launch["cuda"]["grid_x"] == "ceil_div(N, 16)"
    assert seed_context(spec, "cuda").launch == spec.launch["cuda"]
    assert seed_context(spec, "c").launch == {}
    assert "float16" in spec.dtypes and "bfloat16" in spec.dtypes


def test_spec_launch_with_an_unknown_name_is_a_catalog_error(tmp_path: Path) -> None:
    folder = tmp_path / "matmul"
    folder.mkdir()
    for name in ("naive.c", "naive.cu", "naive.hip", "naive.hlsl"):
        (folder / name).write_text((ROOT / "seeds" / "matmul" / name).read_text())
    text = (ROOT / "seeds" / "matmul" / "spec.toml").read_text()
    (folder / "spec.toml").write_text(text.replace('block_x = "16"', 'block_x = "BX"'))
    with pytest.raises(CatalogError, match=r"launch\.cuda\.block_x: unknown name\(s\) \['BX'\]"):
        load_spec(folder)


def test_registry_builds_the_cuda_backend_without_touching_a_gpu(h200: DeviceProfile) -> None:
    backend = make_backend("cuda", h200)
    assert isinstance(backend, CudaBackend) and backend.name == "cuda"
    with pytest.raises(UserError, match="driven by the 'cuda' backend, not 'c'"):
        make_backend("c", h200)


def _gpu_visible() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    import cupy

    try:
        return bool(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return False


@pytest.mark.skipif(_gpu_visible(), reason="a GPU is visible here: probing succeeds")
def test_probe_without_a_gpu_says_what_to_install(backend: CudaBackend) -> None:
    with pytest.raises(BackendUnavailable,
                       match=r"CUDA backend needs a GPU and cupy: pip install 'peak-tune\[cuda\]' "
                             r"\(.+\)"):
        backend.probe()


def test_the_visible_gpu_finds_its_profile() -> None:
    profiles = list(load_devices([ROOT / "backends" / "devices"]).values())
    for gpu, arch, expected in [("NVIDIA H200", "sm_90", "h200"),
                                ("NVIDIA H100 80GB HBM3", "sm_90", "h100"),
                                ("NVIDIA A100-SXM4-80GB", "sm_80", "a100")]:
        found = profile_for_gpu(gpu, arch, profiles)
        assert found is not None and found.name == expected
    unnamed = profile_for_gpu("Some Future GPU", "sm_90", profiles)
    assert unnamed is not None and unnamed.name in {"h200", "h100"}
    assert profile_for_gpu("NVIDIA RTX 4090", "sm_89", profiles) is None


@needs_nvrtc
def test_sanitizer_and_ncu_get_one_validation_at_one_size(
    backend: CudaBackend, spec: KernelSpec, tmp_path: Path
) -> None:
    """What the one-shot worker runs under compute-sanitizer or ncu: the built variant,
    validated once at the given size only; the request file is gone afterwards."""
    context = seed_context(spec, "cuda")
    artifact = backend.compile(context, {}, "float32", str(tmp_path))
    size = ProblemSize.of({"M": 64, "N": 32, "K": 16})
    request = EvalRequest(spec=spec, context=context, params={}, dtype="float32",
                          size=ProblemSize.of({"M": 512, "N": 512, "K": 512}),
                          check_sizes=spec.check_sizes, config=EvalConfig())
    with backend._one_shot_request(artifact, request, size) as path:
        message = json.loads(path.read_text())
    assert not path.exists()
    assert (message["cubin"], message["entry"]) == (artifact.path, context.entry)
    assert (message["size"], message["check_sizes"]) == ({"M": 64, "N": 32, "K": 16}, [])


def test_hip_sources_on_nvidia_refuse_bfloat16_in_one_line(h200: DeviceProfile,
                                                           tmp_path: Path) -> None:
    from peak_tune.backends.hip import HipOnCudaBackend

    with pytest.raises(UserError, match="^the HIP backend supports dtypes float32, float16, "
                                        "float64, not 'bfloat16'$"):
        HipOnCudaBackend(h200).compile(context_of(TILE_SOURCE), {}, "bfloat16", str(tmp_path))

"""The C backend for real: gcc compiles, kernels run in the worker, failures are typed.

Adversarial kernels (tests/fixtures/adversarial) each cheat in one way and must fail
with the class and message a user would see; the seed must pass and be timed.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from peak_tune.backends.base import EvalConfig, EvalRequest
from peak_tune.backends.c import CBackend
from peak_tune.catalog.loaders import load_device, load_spec
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, KernelSpec, Measurement, ProblemSize
from peak_tune.errors import (
    BackendUnavailable,
    CompileError,
    KernelCrash,
    KernelTimeout,
    UserError,
    WrongResult,
)

ROOT = Path(__file__).resolve().parents[2]
ADVERSARIAL = ROOT / "tests" / "fixtures" / "adversarial"
SIZE = ProblemSize.of({"M": 128, "N": 128, "K": 128})
CONFIG = EvalConfig(timeout_s=30.0, warmup=1, repeats=3, max_timing_s=1.0)

# A kernel whose behaviour depends on a -D macro: it skips SKIP iterations of the K
# loop, so SKIP=0 is right and SKIP=1 is wrong; without the macro it does not build.
SKIP_SOURCE = """\
#ifndef SKIP
#error "SKIP must be set with -DSKIP=..."
#endif
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    #pragma omp parallel for
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K - SKIP; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}
"""


@pytest.fixture(scope="module")
def spec() -> KernelSpec:
    return load_spec(ROOT / "seeds" / "matmul")


@pytest.fixture(scope="module")
def cpu() -> DeviceProfile:
    return load_device(ROOT / "backends" / "devices" / "cpu.toml")


@pytest.fixture(scope="module")
def backend(cpu: DeviceProfile) -> Iterator[CBackend]:
    with CBackend(cpu) as driver:
        yield driver


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("c-builds"))


def context_of(source: str, **fields: object) -> KernelContext:
    context = KernelContext(kernel="matmul", backend="c", source=source, entry="matmul")
    return dataclasses.replace(context, **fields)  # type: ignore[arg-type]


def request_for(
    spec: KernelSpec, context: KernelContext, params: Mapping[str, int] | None = None,
    *, dtype: str = "float32", config: EvalConfig = CONFIG,
    check_sizes: tuple[ProblemSize, ...] | None = None,
) -> EvalRequest:
    checks = spec.check_sizes if check_sizes is None else check_sizes
    return EvalRequest(spec=spec, context=context, params=dict(params or {}), dtype=dtype,
                       size=SIZE, check_sizes=checks, config=config)


def run_source(
    backend: CBackend, spec: KernelSpec, build_dir: str, source: str,
    params: Mapping[str, int] | None = None, *, config: EvalConfig = CONFIG,
    check_sizes: tuple[ProblemSize, ...] | None = None,
) -> Measurement:
    context = context_of(source)
    artifact = backend.compile(context, dict(params or {}), "float32", build_dir)
    request = request_for(spec, context, params, config=config, check_sizes=check_sizes)
    return backend.evaluate(artifact, request)


def fixture(name: str) -> str:
    return (ADVERSARIAL / name).read_text()


# ---------------------------------------------------------------- the seed


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_naive_seed_validates_and_times(
    backend: CBackend, spec: KernelSpec, build_dir: str, dtype: str
) -> None:
    context = context_of(spec.sources["c"])
    artifact = backend.compile(context, {}, dtype, build_dir)
    assert Path(artifact.path).is_file() and not artifact.reused
    measurement = backend.evaluate(artifact, request_for(spec, context, dtype=dtype))
    assert len(measurement.samples_ms) == CONFIG.repeats
    assert all(s > 0 for s in measurement.samples_ms)
    assert measurement.flops == 2 * 128**3
    assert measurement.gflops > 0


def test_second_compile_is_reused_without_compiler_run(
    backend: CBackend, spec: KernelSpec, build_dir: str
) -> None:
    context = context_of(spec.sources["c"])
    first = backend.compile(context, {}, "float32", build_dir)
    built_at = os.stat(first.path).st_mtime_ns
    second = backend.compile(context, {}, "float32", build_dir)
    assert second.reused
    assert second.path == first.path and second.compile_key == first.compile_key
    assert os.stat(second.path).st_mtime_ns == built_at
    other_dtype = backend.compile(context, {}, "float64", build_dir)
    assert other_dtype.compile_key != first.compile_key


def test_probe_and_fingerprint_describe_this_host(backend: CBackend) -> None:
    profile = backend.probe()
    assert profile.facts["cores"] == os.cpu_count()
    assert profile.facts["isa"] in ("avx512", "avx2", "sse", "neon", "scalar")
    assert profile.facts["vector_bits"] in (512, 256, 128, 0)
    fingerprint = backend.fingerprint()
    assert set(fingerprint) == {"device", "compiler", "flags", "harness"}
    assert "-fopenmp" in fingerprint["flags"] and fingerprint["compiler"]


# ---------------------------------------------------------------- parameters, compile errors


def test_macro_parameter_reaches_the_code(
    backend: CBackend, spec: KernelSpec, build_dir: str
) -> None:
    assert run_source(backend, spec, build_dir, SKIP_SOURCE, {"SKIP": 0}).gflops > 0
    with pytest.raises(WrongResult, match="wrong result at 67x53x97"):
        run_source(backend, spec, build_dir, SKIP_SOURCE, {"SKIP": 1})
    with pytest.raises(CompileError, match="SKIP must be set"):
        backend.compile(context_of(SKIP_SOURCE), {}, "float32", build_dir)


def test_compile_error_carries_the_compiler_log(backend: CBackend, build_dir: str) -> None:
    broken = "void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {\n" \
             "    C[0] = A[0] * B[0]\n}\n"
    with pytest.raises(CompileError) as caught:
        backend.compile(context_of(broken), {}, "float32", build_dir)
    assert str(caught.value).startswith("compile error: line 2: expected ';'")
    assert "error: expected ';'" in caught.value.detail
    assert "-DDTYPE=float" in caught.value.detail  # the command is shown too
    assert not list(Path(build_dir).glob(".*"))  # no temporary left behind


def test_unknown_dtype_is_a_clear_error(backend: CBackend, build_dir: str) -> None:
    with pytest.raises(UserError, match="supports dtypes float32, float64, not 'int8'"):
        backend.compile(context_of("void matmul(void) {}"), {}, "int8", build_dir)


# ---------------------------------------------------------------- adversarial kernels


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("skip_k.c", "wrong result at 67x53x97: "),
        ("stale.c", "wrong result at 128x128x128: "),
        ("oob_write.c", "wrote out of bounds: guard after C changed at 67x53x97"),
        ("tile16.c", "wrong result at 67x53x97: "),
        ("partial.c", "output C not written (poison left) at 67x53x97: 53 of 3551 elements"),
    ],
)
def test_cheating_kernel_fails_validation(
    backend: CBackend, spec: KernelSpec, build_dir: str, name: str, message: str
) -> None:
    with pytest.raises(WrongResult) as caught:
        run_source(backend, spec, build_dir, fixture(name))
    assert str(caught.value).startswith(message)


def test_kernel_writing_its_input_faults(backend: CBackend, spec: KernelSpec,
                                         build_dir: str) -> None:
    """Inputs are mapped read-only where the kernel runs: writing one (even to put the
    value back later) is a crash, and the next evaluation works."""
    with pytest.raises(KernelCrash, match="SIGSEGV"):
        run_source(backend, spec, build_dir, fixture("write_input.c"))
    seed = (ROOT / "seeds" / "matmul" / "naive.c").read_text()
    assert run_source(backend, spec, build_dir, seed).gflops > 0


def test_wrong_result_names_the_worst_element(
    backend: CBackend, spec: KernelSpec, build_dir: str
) -> None:
    with pytest.raises(WrongResult, match=r"elements off, worst C\[\d+,\d+\] = \S+ \(expected"):
        run_source(backend, spec, build_dir, fixture("skip_k.c"))


def test_tile_only_kernel_passes_when_it_declares_its_constraint(
    backend: CBackend, spec: KernelSpec, build_dir: str
) -> None:
    context = context_of(fixture("tile16.c"), size_constraints=("K % 16 == 0",))
    artifact = backend.compile(context, {}, "float32", build_dir)
    assert backend.evaluate(artifact, request_for(spec, context)).gflops > 0


def test_crash_is_reported_and_the_next_evaluation_succeeds(
    backend: CBackend, spec: KernelSpec, build_dir: str
) -> None:
    with pytest.raises(KernelCrash, match="kernel crashed: SIGSEGV"):
        run_source(backend, spec, build_dir, fixture("null_write.c"))
    assert run_source(backend, spec, build_dir, spec.sources["c"]).gflops > 0


def test_endless_kernel_times_out_and_the_next_evaluation_succeeds(
    backend: CBackend, spec: KernelSpec, build_dir: str
) -> None:
    short = dataclasses.replace(CONFIG, timeout_s=2.0)
    with pytest.raises(KernelTimeout, match="kernel timed out after 2 s"):
        run_source(backend, spec, build_dir, fixture("forever.c"), config=short)
    assert run_source(backend, spec, build_dir, spec.sources["c"]).gflops > 0


def test_kernel_printing_to_stdout_still_passes(
    backend: CBackend, spec: KernelSpec, build_dir: str
) -> None:
    measurement = run_source(backend, spec, build_dir, fixture("chatty.c"))
    assert len(measurement.samples_ms) == CONFIG.repeats and measurement.gflops > 0


def test_speed_above_the_device_peak_is_rejected(
    cpu: DeviceProfile, spec: KernelSpec, build_dir: str
) -> None:
    tiny_peak = dataclasses.replace(cpu, peak_gflops={"float32": 1e-3})
    with CBackend(tiny_peak) as backend, pytest.raises(WrongResult, match="impossible speed"):
        run_source(backend, spec, build_dir, spec.sources["c"], check_sizes=())


ORPHAN_SCRIPT = """
import sys
from pathlib import Path
from peak_tune.backends.base import EvalConfig, EvalRequest
from peak_tune.backends.c import CBackend
from peak_tune.catalog.loaders import load_device, load_spec
from peak_tune.core import KernelContext, ProblemSize
spec = load_spec(Path("seeds/matmul"))
backend = CBackend(load_device(Path("backends/devices/cpu.toml")))
source = Path("tests/fixtures/adversarial/forever.c").read_text()
context = KernelContext(kernel="matmul", backend="c", source=source, entry="matmul")
artifact = backend.compile(context, {}, "float32", sys.argv[1])
size = ProblemSize.of({"M": 8, "N": 8, "K": 8})
backend.evaluate(artifact, EvalRequest(spec, context, {}, "float32", size, (),
                                       EvalConfig(timeout_s=600)))
"""


def _workers(pid: int) -> list[int]:
    """The C workers among the children of `pid` (not the compiler it runs first)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            try:
                if b"_c_worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
            except OSError:
                continue
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_worker_stuck_in_a_kernel_dies_with_its_parent(build_dir: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT, build_dir], cwd=ROOT,
                              env=env)
    try:
        assert _wait_for(lambda: bool(_workers(parent.pid)), 30), "no worker started"
        worker = _workers(parent.pid)[0]
        time.sleep(1.0)  # let it enter the endless kernel
        assert _alive(worker)
    finally:
        parent.kill()
        parent.wait()
    assert _wait_for(lambda: not _alive(worker), 5), "orphan worker left running"


# ---------------------------------------------------------------- vendor, missing compiler


def test_vendor_is_numpy_timed_by_the_same_code(backend: CBackend, spec: KernelSpec) -> None:
    name, measurement = backend.time_vendor(spec, "float32", SIZE, CONFIG)
    assert name.startswith("numpy (") and name != "numpy ()"
    assert len(measurement.samples_ms) == CONFIG.repeats
    assert measurement.gflops > 0


def test_cc_pointing_nowhere_is_backend_unavailable(
    cpu: DeviceProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "/nonexistent")
    with pytest.raises(BackendUnavailable, match="CC=/nonexistent"):
        CBackend(cpu).probe()


def test_no_compiler_on_path_is_backend_unavailable(
    cpu: DeviceProfile, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, build_dir: str
) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    backend = CBackend(cpu)
    with pytest.raises(BackendUnavailable, match=r"no C compiler found: install gcc"):
        backend.probe()
    with pytest.raises(BackendUnavailable):
        backend.compile(context_of("void matmul(void) {}"), {}, "float32", build_dir)


def test_compiler_never_runs_beside_a_timing(
    backend: CBackend, spec: KernelSpec, tmp_path: Path
) -> None:
    """An LLM applier's result check compiles while the timer thread times: the compiler
    waits for the timing, so it cannot disturb it on this CPU."""
    seed = (ROOT / "seeds" / "matmul" / "naive.c").read_text()
    timed = backend.compile(context_of(seed), {}, "float32", str(tmp_path))
    long_timing = EvalConfig(warmup=1, repeats=30, timeout_s=120, max_timing_s=30)
    request = dataclasses.replace(request_for(spec, context_of(seed), config=long_timing),
                                  size=ProblemSize.of({"M": 384, "N": 384, "K": 384}))
    ended: dict[str, float] = {}

    def timing() -> None:
        backend.evaluate(timed, request)
        ended["timing"] = time.perf_counter()

    timer = threading.Thread(target=timing)
    timer.start()
    time.sleep(0.3)  # the timing holds the worker by now
    assert timer.is_alive(), "the timing ended too soon to test anything"
    backend.compile(context_of(seed + "\n/* another variant */\n"), {}, "float32",
                    str(tmp_path))
    ended["compile"] = time.perf_counter()
    timer.join()
    assert ended["compile"] > ended["timing"]


# ---------------------------------------------------------------- work done while gcc builds

# Right for its first three calls in a process (the job's two check sizes and the
# untimed run at the size), then it skips the last K iteration: every timed run is wrong.
WRONG_WHEN_TIMED = """\
static int calls;
void matmul(const DTYPE *A, const DTYPE *B, DTYPE *C, int M, int N, int K) {
    int skip = ++calls > 3;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            DTYPE acc = 0;
            for (int k = 0; k < K - skip; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}
"""


def _children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").glob("*/children")
            for child in task.read_text().split()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_build_forks_the_next_job_and_a_job_gone_meanwhile_is_no_crash(
    cpu: DeviceProfile, spec: KernelSpec, tmp_path: Path
) -> None:
    """While gcc builds, the judge forks the next evaluation's job (the compiler has one
    core, the other would idle). A job that is gone by the evaluation (killed from
    outside, with no kernel run in it) is replaced: the variant is not called a crash."""
    seed = spec.sources["c"]
    others = set(_workers(os.getpid()))  # other tests' backends
    with CBackend(cpu) as backend:
        first = backend.compile(context_of(seed), {}, "float32", str(tmp_path))
        backend.evaluate(first, request_for(spec, context_of(seed)))
        (worker,) = set(_workers(os.getpid())) - others
        assert _children(worker) == []  # the job ends with its evaluation
        other = context_of(seed + "\n/* another variant */\n")
        built = backend.compile(other, {}, "float32", str(tmp_path))
        (job,) = _children(worker)  # forked during the build, waiting for its kernel
        os.kill(job, 9)
        assert _wait_for(lambda: not _alive(job), 5.0)
        measurement = backend.evaluate(built, request_for(spec, other))
        assert len(measurement.samples_ms) == CONFIG.repeats


def test_timed_runs_drawn_during_a_build_are_still_judged(
    cpu: DeviceProfile, spec: KernelSpec, tmp_path: Path
) -> None:
    """The timed runs' inputs and projections drawn while gcc built the kernel judge its
    runs as inline ones would: a kernel wrong only once it is timed fails."""
    seed = spec.sources["c"]
    with CBackend(cpu) as backend:
        first = backend.compile(context_of(seed), {}, "float32", str(tmp_path))
        backend.evaluate(first, request_for(spec, context_of(seed)))  # what to draw for
        wrong = context_of(WRONG_WHEN_TIMED)
        artifact = backend.compile(wrong, {}, "float32", str(tmp_path))
        with pytest.raises(WrongResult, match="wrong result at 128x128x128"):
            backend.evaluate(artifact, request_for(spec, wrong))
        # the next variant after the failure is judged on fresh arenas, and passes
        again = context_of(seed + "\n/* once more */\n")
        built = backend.compile(again, {}, "float32", str(tmp_path))
        assert backend.evaluate(built, request_for(spec, again)).gflops > 0


def test_a_machine_slow_to_wake_the_job_keeps_an_honest_kernels_times(
    cpu: DeviceProfile, spec: KernelSpec, build_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peak_tune.backends import c
    from tests.late_reply_worker import LATE_S

    monkeypatch.setattr(c, "_WORKER_MODULE", "tests.late_reply_worker")
    small = ProblemSize.of({"M": 16, "N": 16, "K": 16})  # a run far shorter than LATE_S
    context = context_of(spec.sources["c"])
    with CBackend(cpu) as late:
        artifact = late.compile(context, {}, "float32", build_dir)
        request = dataclasses.replace(request_for(spec, context, check_sizes=()), size=small)
        measurement = late.evaluate(artifact, request)
    assert max(measurement.samples_ms) < LATE_S * 1e3 / 2  # its own, not the round trips

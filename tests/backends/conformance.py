"""The harness's contract, which every backend must pass (imported by each backend's
test_<name>_conformance.py, which supplies the fixtures `backend`, `spec`, `build_dir`,
`kernel(name)` and `size`).

Each kernel under tests/fixtures/conformance/<backend>/ cheats in one way; the seed is
the honest one. What a user would notice: the seed is accepted and timed, each cheat is
rejected with the class a user sees, and the next honest evaluation still works. Host
code (capabilities.host_code) can also fork, start threads and write to the worker's
pipes; those cheats are run where the backend declares it. Where buffers are bounded
(capabilities.bounded_buffers: Vulkan's robust buffer access), reads and writes past a
buffer stay inside it: such a kernel is judged by its result alone. A backend whose
kernels cannot carry state from one launch to the next (a shader sees only the buffers
bound to it, written afresh before every run) has no `every_other_call` fixture: the
kernel fixture skips that case, naming why.

tests/backends/test_conformance_registry.py checks that every registered backend
(peak_tune.backends.BACKENDS) has its test_<name>_conformance.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from peak_tune.backends.base import Backend, EvalConfig, EvalRequest
from peak_tune.core import KernelContext, KernelSpec, Measurement, ProblemSize
from peak_tune.errors import KernelCrash, NoVendorLibrary, WrongResult
from peak_tune.evaluation.pipeline import seed_context

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "conformance"
CONFIG = EvalConfig(timeout_s=60.0, warmup=1, repeats=4, max_timing_s=1.0)

Kernel = Callable[[str], KernelContext]


def evaluate(backend: Backend, spec: KernelSpec, build_dir: str, context: KernelContext,
             size: ProblemSize, dtype: str = "float32") -> Measurement:
    artifact = backend.compile(context, {}, dtype, build_dir)
    request = EvalRequest(spec=spec, context=context, params={}, dtype=dtype, size=size,
                          check_sizes=spec.check_sizes, config=CONFIG)
    return backend.evaluate(artifact, request)


def test_seed_is_accepted_and_timed(backend: Backend, spec: KernelSpec, build_dir: str,
                                    size: ProblemSize) -> None:
    measurement = evaluate(backend, spec, build_dir, seed_context(spec, backend.name), size)
    assert len(measurement.samples_ms) == CONFIG.repeats
    assert all(s > 0 for s in measurement.samples_ms) and measurement.gflops > 0


def test_vendor_is_checked_and_timed_like_a_kernel(backend: Backend, spec: KernelSpec,
                                                   size: ProblemSize) -> None:
    """As declared: a vendor library timed like a kernel, or NoVendorLibrary (the
    ratio is then to the device's roofline) saying what the ratio is to."""
    if not backend.capabilities.vendor_library:
        with pytest.raises(NoVendorLibrary, match="peak|GFLOP/s"):
            backend.time_vendor(spec, "float32", size, CONFIG)
        return
    name, measurement = backend.time_vendor(spec, "float32", size, CONFIG)
    assert name and len(measurement.samples_ms) == CONFIG.repeats
    assert measurement.gflops > 0


@pytest.mark.parametrize(("name", "expected", "message"), [
    ("unwritten", WrongResult, "not written|wrong result"),
    ("every_other_call", WrongResult, "wrong result|not written"),
])
def test_cheat_is_rejected_and_the_next_seed_passes(
    backend: Backend, spec: KernelSpec, build_dir: str, kernel: Kernel, size: ProblemSize,
    name: str, expected: type[Exception], message: str,
) -> None:
    with pytest.raises(expected, match=message):
        evaluate(backend, spec, build_dir, kernel(name), size)
    evaluate(backend, spec, build_dir, seed_context(spec, backend.name), size)


def test_a_read_past_an_input_poisons_the_result(backend: Backend, spec: KernelSpec,
                                                 build_dir: str, kernel: Kernel,
                                                 size: ProblemSize) -> None:
    """`read_past_a` adds 0 x the element past A's end into the last row: NaN pads
    make it a wrong result; bounded buffers read inside A (0 x a number is 0) and the
    result is as right as the kernel's arithmetic."""
    if backend.capabilities.bounded_buffers:
        assert evaluate(backend, spec, build_dir, kernel("read_past_a"), size).gflops > 0
    else:
        with pytest.raises(WrongResult, match="wrong result"):
            evaluate(backend, spec, build_dir, kernel("read_past_a"), size)
    evaluate(backend, spec, build_dir, seed_context(spec, backend.name), size)


def test_write_past_a_guard_is_out_of_bounds(backend: Backend, spec: KernelSpec,
                                             build_dir: str, kernel: Kernel,
                                             size: ProblemSize) -> None:
    """A write past C: into the guards it is OutOfBounds; into a bounded buffer it
    lands inside C (a wrong result) or nowhere, and reaches nothing else: the worker
    and its next evaluation are unharmed."""
    name = "write_8k_past" if backend.capabilities.host_code else "oob_write"
    if backend.capabilities.bounded_buffers:
        try:
            evaluate(backend, spec, build_dir, kernel(name), size)
        except WrongResult as exc:
            assert "wrong result" in str(exc) or "not written" in str(exc), exc
    else:
        with pytest.raises(WrongResult, match="wrote out of bounds"):
            evaluate(backend, spec, build_dir, kernel(name), size)
    evaluate(backend, spec, build_dir, seed_context(spec, backend.name), size)


def test_capabilities_match_the_methods(backend: Backend) -> None:
    offered = backend.capabilities
    assert offered.sanitizer == callable(getattr(backend, "sanitize", None))
    assert offered.profiler == callable(getattr(backend, "profile", None))
    assert not (offered.bounded_buffers and offered.host_code)  # host code reaches all


# ---------------------------------------------------------------- host code only


def _host_code(backend: Backend) -> None:
    if not backend.capabilities.host_code:
        pytest.skip(reason=f"{backend.name} kernels are not host code")


def test_write_onto_a_protected_page_crashes(backend: Backend, spec: KernelSpec,
                                             build_dir: str, kernel: Kernel,
                                             size: ProblemSize) -> None:
    _host_code(backend)
    with pytest.raises(KernelCrash, match="SIGSEGV"):
        evaluate(backend, spec, build_dir, kernel("write_far_past"), size)
    evaluate(backend, spec, build_dir, seed_context(spec, backend.name), size)


@pytest.mark.parametrize(("name", "message"), [
    ("fork_once", "started 1 process"),
    ("forged_reply", "forged|wrong result|not written"),
    # its thread is stopped before it finishes, or faults on inputs closed after the call
    ("late_thread", "wrong result|not written|SIGSEGV"),
])
def test_tampering_is_rejected_and_the_next_seed_passes(
    backend: Backend, spec: KernelSpec, build_dir: str, kernel: Kernel, size: ProblemSize,
    name: str, message: str,
) -> None:
    _host_code(backend)
    with pytest.raises((WrongResult, KernelCrash), match=message):
        evaluate(backend, spec, build_dir, kernel(name), size)
    measurement = evaluate(backend, spec, build_dir, seed_context(spec, backend.name), size)
    assert measurement.gflops > 0


def test_a_daemon_does_not_outlive_its_evaluation(
    backend: Backend, spec: KernelSpec, build_dir: str, kernel: Kernel, size: ProblemSize,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _host_code(backend)
    pidfile = tmp_path / "daemon.pid"
    monkeypatch.setenv("PEAK_TUNE_DAEMON_PIDFILE", str(pidfile))
    backend.close()  # the next worker starts with the variable
    with pytest.raises(WrongResult, match="process"):
        evaluate(backend, spec, build_dir, kernel("daemon"), size)
    daemon = int(pidfile.read_text())
    for _ in range(50):
        if not Path(f"/proc/{daemon}").exists() or \
                Path(f"/proc/{daemon}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        os.kill(daemon, 9)
        pytest.fail(f"the kernel's daemon {daemon} outlived its evaluation")

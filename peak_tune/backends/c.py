"""The C backend: gcc/clang with OpenMP, kernels loaded with ctypes in a killable worker.

A variant is compiled to a shared library whose name is its compile key, so a repeat
costs no compiler run; tuning parameters arrive as -D macros and the element type as
`-DDTYPE=float|double`. Kernels run in a child process (peak_tune.backends._c_worker)
that validates them against the float64 reference and times them; numpy's BLAS is
timed as the vendor baseline by the same code in the same process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from peak_tune.atomic_files import put_atomically, write_atomically
from peak_tune.backends._compiler import run_compiler
from peak_tune.backends.base import (
    Artifact,
    Capabilities,
    EvalConfig,
    EvalRequest,
)
from peak_tune.backends.wire import Timing, config_to_wire, macro_flags, measurement_from_reply
from peak_tune.backends.worker import WorkerProcess
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import (
    KernelContext,
    KernelSpec,
    Measurement,
    ProblemSize,
    VendorCall,
    stable_hash,
    vendor_call,
)
from peak_tune.errors import (
    BackendUnavailable,
    CompileError,
    NoVendorLibrary,
    UserError,
    WrongResult,
    environment_fault,
)
from peak_tune.evaluation.validation import applicable_sizes, require_size_constraints, size_label
from peak_tune.harness.host_judge import HostJudge, RunTarget

__all__ = ["CBackend", "COMPILE_TIMEOUT_S", "FLAGS", "HARNESS_VERSION", "cpu_peak_gflops"]

_log = logging.getLogger(__name__)

HARNESS_VERSION = "c-2"  # bump when validation or timing in the worker changes
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11")
_LIBS = ("-lm",)
COMPILE_TIMEOUT_S = 60.0
_C_TYPES = {"float32": "float", "float64": "double"}
_MACRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_LIBRARIES_PER_WORKER = 200  # a fresh worker after this many loaded kernels
_SPEED_MARGIN = 1.1  # above this multiple of the device peak, a timing is impossible
# cpufreq is often absent (VMs): /proc/cpuinfo then shows the base clock, and boost goes
# higher (AMD EPYC 9004: 2.4-3.1 GHz base, 3.5-4.4 boost; Intel Xeon 4th gen 1.9-3.5 base,
# up to 4.2 boost)
_BOOST_ALLOWANCE = 1.5
_FALLBACK_CLOCK_GHZ = 6.0  # no clock known: above any shipping CPU's boost
_MODEL_CLOCK = re.compile(r"@\s*([0-9.]+)\s*GHz", re.IGNORECASE)
_DTYPE_BITS = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16}
_OPENMP_PROBE = "#include <omp.h>\nint peak_tune_threads(void) { return omp_get_max_threads(); }\n"
_WORKER_MODULE = "peak_tune.backends._c_worker"


@dataclass(frozen=True)
class _Toolchain:
    command: tuple[str, ...]  # the compiler and any words $CC carried
    version: str  # first line of `--version`


@dataclass(frozen=True)
class _Host:
    toolchain: _Toolchain
    profile: DeviceProfile  # with detected facts filled
    cpu_model: str
    cores: int


class CBackend:
    """Backend "c": see the module docstring. Construct with the cpu DeviceProfile.

    One instance drives one worker process; use it from one thread at a time.
    """

    name = "c"
    capabilities = Capabilities(on_host=True, host_code=True, launch_region=False)

    # how a variant is built, for the LLM's prompt (the element type and the tuning
    # values follow as -D macros)
    build_command = "cc " + " ".join(FLAGS) + " -lm (the host's gcc or clang)"

    @staticmethod
    def element_macros(dtype: str) -> dict[str, str]:
        """What a build of `dtype` defines besides the tuning values (see export)."""
        return {"DTYPE": _C_TYPES[dtype]} if dtype in _C_TYPES else {}

    def __init__(self, profile: DeviceProfile) -> None:
        self._profile = profile
        self._host: _Host | None = None
        self._worker = WorkerProcess(_WORKER_MODULE, fork_jobs=True)  # host code: a job each
        self._judge = HostJudge(self._worker)
        self._calls = threading.RLock()  # one worker request or compiler run at a time
        self._loaded: set[str] = set()

    def __enter__(self) -> CBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------ device and toolchain

    def probe(self) -> DeviceProfile:
        """The host CPU with isa, vector_bits, cores filled; checks compiler and OpenMP."""
        return self._probe().profile

    def fingerprint(self) -> Mapping[str, str]:
        host = self._probe()
        return {
            "device": f"{host.cpu_model} ({host.cores} cores)",
            "compiler": host.toolchain.version,
            "flags": " ".join(FLAGS + _LIBS),
            "harness": HARNESS_VERSION,
        }

    def _probe(self) -> _Host:
        if self._host is None:
            toolchain = _find_compiler()
            _check_openmp(toolchain)
            cpu = _read_cpuinfo()
            cores = os.cpu_count() or 1
            isa, vector_bits = _vector_isa(cpu.flags)
            clock_ghz, clock_from = _clock_ghz(cpu)
            fma_units = _fma_units(isa)
            detected: dict[str, int | float | str] = {
                "isa": isa, "vector_bits": vector_bits, "cores": cores, "cpu_model": cpu.model,
                "fma_units": fma_units, "clock_ghz": round(clock_ghz, 3),
                "clock_from": clock_from}
            facts = dict(self._profile.facts)
            for key, value in detected.items():
                if facts.get(key, "detect") == "detect":
                    facts[key] = value
            peaks = {**{dtype: cpu_peak_gflops(cores, vector_bits, fma_units, clock_ghz, dtype)
                        for dtype in _C_TYPES},  # a documented peak (not 0) wins
                     **{dtype: peak for dtype, peak in self._profile.peak_gflops.items() if peak}}
            profile = dataclasses.replace(self._profile, facts=facts, peak_gflops=peaks)
            self._host = _Host(toolchain, profile, cpu.model, cores)
            _log.info("C backend: %s, %s, %s, peak %s GFLOP/s", toolchain.version, cpu.model,
                      isa, ", ".join(f"{d} {v:.0f}" for d, v in peaks.items()))
        return self._host

    # ------------------------------------------------------------ compile

    def compile(
        self, context: KernelContext, params: Mapping[str, int], dtype: str, build_dir: str,
        time_limit_s: float = 0.0,
    ) -> Artifact:
        """Build <build_dir>/<key>.so, or reuse it if a build of the same key exists."""
        host = self._probe()
        if dtype not in _C_TYPES:
            raise UserError(f"the C backend supports dtypes {', '.join(_C_TYPES)}, "
                            f"not {dtype!r}")
        defines = [f"-DDTYPE={_C_TYPES[dtype]}", *macro_flags(params, reserved=("DTYPE",))]
        key = stable_hash({
            "build": context.build_identity(),
            "params": sorted((k, int(v)) for k, v in params.items()),
            "dtype": dtype,
            "flags": list(FLAGS + _LIBS),
            "compiler": host.toolchain.version,
            "device": [host.cpu_model, host.profile.facts.get("isa", "")],  # -march=native
        })
        build = Path(build_dir).absolute()  # the worker may not share our cwd later
        library, log_path = build / f"{key}.so", build / f"{key}.log"
        if library.exists():
            log = _read_if_there(log_path)
            return Artifact(str(library), key, log=log, reused=True)
        log = self._build([*host.toolchain.command, *FLAGS, *defines], context.source,
                          library, time_limit_s)
        write_atomically(log_path, log)
        _log.debug("compiled %s", library)
        return Artifact(str(library), key, log=log)

    def _build(self, compiler: list[str], text: str, library: Path, time_limit_s: float
               ) -> str:
        """Compile `text` in a folder of its own, then put its source and library in the
        build folder; the log. A build folder deleted meanwhile (a user clearing the
        cache) is made again: the kernel is not blamed for it."""
        try:
            with tempfile.TemporaryDirectory(prefix="peak-tune-build-") as folder:
                source = Path(folder) / library.with_suffix(".c").name
                built = Path(folder) / library.name
                write_atomically(source, text)
                with self._calls:  # never beside a timing on this CPU (an LLM's check)
                    log = run_compiler([*compiler, "-o", str(built), str(source), *_LIBS],
                                       time_limit_s, hang_limit_s=COMPILE_TIMEOUT_S,
                                       while_waiting=self._judge.work_ahead)
                put_atomically(library.with_suffix(".c"),
                               lambda temporary: shutil.copy(source, temporary))
                put_atomically(library, lambda temporary: shutil.copy(built, temporary))
        except OSError as exc:  # the temporary folder itself (a full /tmp)
            fault = environment_fault(exc, f"building {library.name} in {tempfile.gettempdir()}")
            if fault is None:
                raise
            raise fault from exc
        return log

    # ------------------------------------------------------------ run

    def evaluate(self, artifact: Artifact, request: EvalRequest) -> Measurement:
        """Validate at the check sizes and at the size, then time there: every run on
        fresh inputs and judged in this process (peak_tune.harness.host_judge)."""
        self._probe()
        require_size_constraints(request.context, request.params, request.size)
        checks = applicable_sizes(request.context, request.params, request.check_sizes)
        target = RunTarget(vendor=False, library=artifact.path, entry=request.context.entry)
        measurement = self._measure(request.spec, request.dtype, request.size, checks,
                                    request.config, target)
        self._reject_impossible_speed(request.spec, request.dtype, request.size, measurement)
        return measurement

    def time_vendor(
        self, spec: KernelSpec, dtype: str, size: ProblemSize, config: EvalConfig
    ) -> tuple[str, Measurement]:
        """numpy (its BLAS for a GEMM call), timed and checked like a variant."""
        call = vendor_call(spec, "c")
        if call is VendorCall.NONE:
            raise NoVendorLibrary(f"kernel {spec.name!r} declares no vendor baseline on the "
                                  "CPU ([vendor] c = \"none\")")
        # numpy runs in a job of its own, like a kernel: its BLAS threads end with it
        measurement = self._measure(spec, dtype, size, (), config, RunTarget(vendor=True))
        if call is VendorCall.REFERENCE:
            return f"numpy (reference expression in {dtype})", measurement
        with self._calls:
            blas = self._worker.call({'op': 'blas'}, 60.0)['name']
        layout = "" if call is VendorCall.GEMM else " matmul with B transposed"
        return f"numpy{layout} ({blas})", measurement

    def close(self) -> None:
        with self._calls:
            self._worker.stop()
            self._judge.close()
            self._loaded.clear()

    def _measure(self, spec: KernelSpec, dtype: str, size: ProblemSize,
                 checks: tuple[ProblemSize, ...], config: EvalConfig,
                 target: RunTarget) -> Measurement:
        """One worker job; a fresh worker when the old one has loaded too many kernels.
        One at a time: the timer and an LLM applier's result check share the worker."""
        with self._calls:
            if not self._worker.running:
                self._loaded.clear()
            if not target.vendor and target.library not in self._loaded:
                if len(self._loaded) >= _MAX_LIBRARIES_PER_WORKER:
                    self._worker.stop()
                    self._loaded.clear()
                self._loaded.add(target.library)
            samples = self._judge.measure(spec, dtype, size, checks,
                                          Timing.of(config_to_wire(config)), target,
                                          config.timeout_s)
        return measurement_from_reply(spec, size, {"samples_ms": samples})

    def _reject_impossible_speed(
        self, spec: KernelSpec, dtype: str, size: ProblemSize, measurement: Measurement
    ) -> None:
        peak = float(self._probe().profile.peak_gflops.get(dtype, 0.0))
        if peak > 0 and measurement.gflops > _SPEED_MARGIN * peak:
            raise WrongResult(
                f"impossible speed at {size_label(spec, size)}: {measurement.gflops:.1f} "
                f"GFLOP/s is above {_SPEED_MARGIN:g} x the device peak ({peak:g} GFLOP/s)")


def _read_if_there(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:  # never written, or deleted with the build folder
        return ""


def _find_compiler() -> _Toolchain:
    """$CC if set (it must work), else gcc, cc or clang on PATH."""
    chosen = os.environ.get("CC", "").strip()
    if chosen:
        words = shlex.split(chosen)
        found = shutil.which(words[0])
        if found is None:
            raise BackendUnavailable(f"CC={chosen} is not a compiler on this machine: "
                                     "fix CC or unset it to use gcc")
        command = (found, *words[1:])
    else:
        found = next((p for p in map(shutil.which, ("gcc", "cc", "clang")) if p), None)
        if found is None:
            raise BackendUnavailable(
                "no C compiler found: install gcc (apt-get install gcc) or set CC")
        command = (found,)
    try:
        done = subprocess.run([*command, "--version"], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendUnavailable(f"{command[0]} --version failed: {exc}") from exc
    version = (done.stdout.strip().splitlines() or [""])[0]
    if done.returncode != 0 or not version:
        raise BackendUnavailable(f"{command[0]} --version failed: is it a C compiler?")
    return _Toolchain(command, version)


def _check_openmp(toolchain: _Toolchain) -> None:
    """The compiler must build an OpenMP shared library (kernels use -fopenmp)."""
    with tempfile.TemporaryDirectory(prefix="peak-tune-probe-") as folder:
        source = Path(folder) / "probe.c"
        source.write_text(_OPENMP_PROBE)
        command = [*toolchain.command, *FLAGS, "-o", str(Path(folder) / "probe.so"),
                   str(source)]
        try:
            run_compiler(command, hang_limit_s=COMPILE_TIMEOUT_S)
        except CompileError as exc:
            raise BackendUnavailable(
                f"{toolchain.command[0]} cannot build OpenMP code (-fopenmp): "
                f"{str(exc).removeprefix('compile error: ')}; install libgomp or use gcc"
            ) from exc


@dataclass(frozen=True)
class _CpuInfo:
    model: str
    flags: frozenset[str]
    mhz: float  # the highest "cpu MHz" listed (0: none): the base clock in most VMs


def _read_cpuinfo() -> _CpuInfo:
    """CPU model name, feature flags and clock (Linux /proc/cpuinfo; platform fallback)."""
    model, flags, mhz = "", frozenset[str](), 0.0
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
        elif key == "cpu mhz":
            with contextlib.suppress(ValueError):
                mhz = max(mhz, float(value))
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    return _CpuInfo(model, flags, mhz)


def _clock_ghz(cpu: _CpuInfo) -> tuple[float, str]:
    """The highest clock a core may run at, and where it was read: cpufreq's maximum
    (boost included) where the kernel exposes it; else the clock in the model name or
    /proc/cpuinfo times _BOOST_ALLOWANCE (both are base clocks: a VM shows no boost);
    else _FALLBACK_CLOCK_GHZ."""
    khz = 0
    for entry in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq"):
        with contextlib.suppress(OSError, ValueError):
            khz = max(khz, int(entry.read_text().strip()))
    if khz > 0:
        return khz / 1e6, "cpufreq"
    named = _MODEL_CLOCK.search(cpu.model)
    base_ghz = max(cpu.mhz / 1e3, float(named.group(1)) if named else 0.0)
    if base_ghz > 0:
        return base_ghz * _BOOST_ALLOWANCE, "cpuinfo"
    return _FALLBACK_CLOCK_GHZ, "fallback"


def _fma_units(isa: str) -> int:
    """Vector FMAs a core can start per cycle, at most: two on x86 (Intel's server cores
    with AVX-512 have two 512-bit units; Zen 4 runs a 512-bit FMA as two 256-bit halves,
    half of that), four 128-bit pipes on the widest Arm cores (Apple M, Neoverse V)."""
    return 4 if isa == "neon" else 2


def cpu_peak_gflops(cores: int, vector_bits: int, fma_units: int, clock_ghz: float,
                    dtype: str) -> float:
    """An upper bound on the host's arithmetic rate: every core issuing `fma_units`
    fused multiply-adds (2 FLOPs) on full vectors of `dtype` every cycle at `clock_ghz`.
    A timing over it (times _SPEED_MARGIN) did not compute what it claims."""
    lanes = max(1, vector_bits // _DTYPE_BITS.get(dtype, 32))
    return cores * fma_units * lanes * 2 * clock_ghz

def _vector_isa(flags: Collection[str]) -> tuple[str, int]:
    if "avx512f" in flags:
        return "avx512", 512
    if "avx2" in flags:
        return "avx2", 256
    if "sse2" in flags:
        return "sse", 128
    if "asimd" in flags:
        return "neon", 128
    return "scalar", 0

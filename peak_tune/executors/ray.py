"""Evaluation on a Ray cluster: one actor per device, the driver alone writes the cache.

Each actor owns one device (`num_gpus=1` for GPU backends, one CPU host for the C
backend) and one backend with its killable kernel worker, and times one variant at a
time, so two timings never share a device. Variants are built by Ray tasks on free CPUs
anywhere in the cluster and shipped to the actor (a cubin is one file), or, for the C
backend, in the actor's own threads on its node. The driver answers what the cache
knows, sends the rest to the least busy actor, and stores what comes back. An actor
that dies (a node lost, a worker killed) is restarted by Ray and its job runs again.
"""

from __future__ import annotations

import logging
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from peak_tune.backends import capabilities, make_backend
from peak_tune.backends.base import Artifact, EvalConfig, EvalRequest
from peak_tune.catalog.types import DeviceProfile
from peak_tune.core import KernelContext, KernelSpec, Measurement, Outcome, ProblemSize, Status
from peak_tune.errors import (
    BackendUnavailable,
    BuildOverBudget,
    EvaluationError,
    InvalidPoint,
    UserError,
)
from peak_tune.evaluation.pipeline import Pipeline, PipelineSetup, evaluate_built, outcome_of_error
from peak_tune.executors.base import EvalJob, JobTimes, busy_by_worker

__all__ = ["NAMESPACE", "BuiltVariant", "JobTimes", "RayExecutor", "RaySettings",
           "build_variant", "device_options", "devices_of_kind", "import_ray", "init_ray",
           "probe_device", "require_devices"]

log = logging.getLogger(__name__)

NAMESPACE = "peak-tune"  # the device actors are named <run>-device-<i> in it
_ACTOR_RESTARTS = 4
_CONNECT_TIMEOUT_S = 10.0
_CRASH_CONFIRM_DELAY_S = 1.0
_RESTART_WAIT_S = 600.0  # a worker that does not come back by then is sent jobs again
_INSTALL_HINT = "pip install 'peak-tune[ray]'"


@dataclass(frozen=True)
class RaySettings:
    address: str | None = None  # None: start a local Ray on this machine
    workers: int = 0  # device actors; 0: one per GPU (GPU backends) or per node (C)
    builds_per_worker: int = 4  # variants one actor builds at once (GPU backends)
    local_cpus: int | None = None  # CPUs of a Ray started here (None: all)
    # A job whose worker died is run again this many times (a lost node is not the
    # kernel's fault); lost once more, the trial fails as a crash.
    retries_on_loss: int = 2
    # Where variants are built: "cpu", as Ray tasks on any node's free CPUs, shipped to
    # the device's node (NVRTC needs no GPU); "device", in the device actor's threads;
    # "auto": cpu, but device for the C backend, whose -march=native build is for the
    # node that runs it (on a cluster of one kind of CPU, "cpu" is fine for C too).
    build_on: str = "auto"


@dataclass
class _Pending:
    """A job on its way: what the cache already answered and where the rest goes."""

    job: EvalJob
    known: list[Outcome | None]
    missing: Sequence[int]
    result: Future[list[Outcome]]
    attempts: int = 0
    sent_at: float = 0.0  # perf_counter when it was last sent to a worker


@dataclass(frozen=True)
class WorkerReply:
    outcomes: list[Outcome]
    compiled: bool  # the actor ran the compiler (not an identical build on its disk)
    worker: str
    build_s: float = 0.0  # compiling (on a CPU worker or in the actor)
    waited_s: float = 0.0  # in the actor, waiting for its device
    busy_s: float = 0.0  # validating and timing on the device


@dataclass(frozen=True)
class BuiltVariant:
    """A build made on a CPU worker: the artifact and its one file, to land on the
    device's node; or the outcome of a build that failed."""

    artifact: Artifact | None
    payload: bytes = b""
    failed: Outcome | None = None
    build_s: float = 0.0


def probe_device(backend_name: str, profile: DeviceProfile
                 ) -> tuple[DeviceProfile, dict[str, str]]:
    """A Ray task on a node with a device of the profile's kind: the device as probed
    there, and the backend's fingerprint (ClusterBackend)."""
    backend = make_backend(backend_name, profile)
    try:
        return backend.probe(), dict(backend.fingerprint())
    finally:
        backend.close()


def build_variant(backend_name: str, setup: PipelineSetup, job: EvalJob) -> BuiltVariant:
    """A Ray task (num_cpus=1): compile where there is a free CPU; no device needed."""
    started = time.perf_counter()
    backend = make_backend(backend_name, setup.device)
    values = {p.name: job.params[p.name] for p in job.context.params}
    with tempfile.TemporaryDirectory(prefix="peak-tune-build-") as folder:
        try:
            artifact = backend.compile(job.context, values, setup.dtype, folder,
                                       job.build_limit_s)
        except (InvalidPoint, EvaluationError) as exc:
            return BuiltVariant(None, failed=outcome_of_error(exc),
                                build_s=time.perf_counter() - started)
        return BuiltVariant(artifact, Path(artifact.path).read_bytes(),
                            build_s=time.perf_counter() - started)


class DeviceWorker:
    """The actor's body: one device, its backend, builds in threads, one timing at a time."""

    def __init__(self, backend_name: str, setup: PipelineSetup, label: str) -> None:
        self.backend = make_backend(backend_name, setup.device)
        self.backend.probe()
        self.setup = setup
        self.label = label
        self.build_dir = tempfile.mkdtemp(prefix="peak-tune-builds-")
        self._timing = threading.Lock()

    def evaluate(self, job: EvalJob, shipped: BuiltVariant | None = None) -> WorkerReply:
        """Validate and time `job`: built here, or `shipped` from a CPU worker."""
        arrived = time.perf_counter()
        values = {p.name: job.params[p.name] for p in job.context.params}
        try:
            built = (self._landed(shipped) if shipped is not None else
                     self.backend.compile(job.context, values, self.setup.dtype, self.build_dir,
                                          job.build_limit_s))
        except (InvalidPoint, EvaluationError) as exc:
            # the compiler ran unless the point was refused before it (resources)
            ran = isinstance(exc, (BuildOverBudget, EvaluationError))
            return WorkerReply([outcome_of_error(exc)] * len(job.sizes), ran, self.label,
                               time.perf_counter() - arrived)
        build_s = shipped.build_s if shipped is not None else time.perf_counter() - arrived
        if isinstance(built, Outcome):
            return WorkerReply([built] * len(job.sizes), True, self.label, build_s)
        ready = time.perf_counter()
        with self._timing:
            started = time.perf_counter()
            outcomes = [self._confirmed(built, job, values, size, cutoff)
                        for size, cutoff in zip(job.sizes, job.slow_cutoff_ms, strict=True)]
            busy = time.perf_counter() - started
        return WorkerReply(outcomes, not built.reused, self.label, build_s,
                           started - ready, busy)

    def _landed(self, shipped: BuiltVariant) -> Artifact | Outcome:
        """The shipped build written into this actor's build folder (once)."""
        if shipped.artifact is None:
            return shipped.failed or Outcome(Status.COMPILE_ERROR, message="no build")
        path = Path(self.build_dir) / Path(shipped.artifact.path).name
        if not path.exists():
            partial = path.with_suffix(path.suffix + f".{uuid.uuid4().hex}.part")
            partial.write_bytes(shipped.payload)
            partial.replace(path)
        return replace(shipped.artifact, path=str(path))

    def _confirmed(self, built: Artifact, job: EvalJob, values: Mapping[str, int],
                   size: ProblemSize, cutoff: float) -> Outcome:
        """A crash is run once more before it is reported: when Ray stops this actor, its
        kernel worker dies first, and that must not be cached as the kernel's crash (this
        actor dies before a second answer, and the driver runs the job elsewhere)."""
        outcome = evaluate_built(self.backend, self.setup, built, job.context, values, size,
                                 cutoff)
        if outcome.status is not Status.RUNTIME_ERROR:
            return outcome
        time.sleep(_CRASH_CONFIRM_DELAY_S)
        return evaluate_built(self.backend, self.setup, built, job.context, values, size,
                              cutoff)

    def compile_variant(self, context: KernelContext, params: Mapping[str, int], dtype: str,
                        time_limit_s: float) -> Artifact:
        """A build in this actor's folder, for the driver's own requests (ClusterBackend)."""
        return self.backend.compile(context, params, dtype, self.build_dir, time_limit_s)

    def evaluate_artifact(self, artifact: Artifact, request: EvalRequest) -> Measurement:
        with self._timing:
            return self.backend.evaluate(artifact, request)

    def time_vendor(self, spec: KernelSpec, dtype: str, size: ProblemSize,
                    config: EvalConfig) -> tuple[str, Measurement]:
        with self._timing:  # never beside a kernel's timing on this device
            return self.backend.time_vendor(spec, dtype, size, config)

    def ping(self) -> str:
        return self.label

    def shutdown(self) -> None:
        """Stop the backend's kernel worker and remove this actor's builds."""
        self.backend.close()
        shutil.rmtree(self.build_dir, ignore_errors=True)


class RayExecutor:
    name = "ray"

    def __init__(self, settings: RaySettings, pipeline: Pipeline, backend_name: str) -> None:
        ray = import_ray()
        self._ray = ray
        self.pipeline = pipeline
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            init_ray(ray, settings)
        on_host = capabilities(backend_name).on_host
        per_worker = 1 if on_host else settings.builds_per_worker
        if settings.build_on not in ("auto", "cpu", "device"):
            raise UserError(f"unknown build place {settings.build_on!r} (auto, cpu, device)")
        on_cpu = settings.build_on == "cpu" or (settings.build_on == "auto" and not on_host)
        self._builder = ray.remote(num_cpus=1)(build_variant) if on_cpu else None
        self._setup_ref = ray.put(pipeline.setup)  # once, not pickled with every build
        self._backend_name = backend_name
        count = settings.workers or _default_workers(ray, backend_name,
                                                      pipeline.setup.device)
        options: dict[str, Any] = {
            "max_restarts": _ACTOR_RESTARTS, "max_task_retries": 0,
            "max_concurrency": per_worker, "namespace": NAMESPACE,
            # a job whose build is done need not wait behind one still building
            "allow_out_of_order_execution": True,
            **device_options(backend_name, pipeline.setup.device),
        }
        actor = ray.remote(DeviceWorker)
        run = uuid.uuid4().hex[:8]
        self.worker_names = [f"peak-tune-{run}-device-{i}" for i in range(count)]
        self._workers = [actor.options(name=name, **options).remote(
            backend_name, pipeline.setup, name) for name in self.worker_names]
        self._retries = settings.retries_on_loss
        self.lost = 0  # jobs whose worker died under them
        self._busy = [0] * count
        self.evaluations: dict[str, int] = {}  # jobs each device worker evaluated
        self.job_times: list[JobTimes] = []
        self._ready = threading.Condition()  # guards _busy, _down and _waiting
        self._down: set[int] = set()  # workers Ray is restarting
        self._waiting: dict[Any, tuple[int, _Pending]] = {}  # reply ref: worker, job
        self._closing = False
        self._results = threading.Thread(target=self._stream_results, name="ray-results",
                                         daemon=True)
        self._results.start()
        self._per_worker = per_worker
        try:  # fail here, with the reason, if a device cannot be driven
            ray.get([w.ping.remote() for w in self._workers], timeout=600)
        except Exception as exc:
            self.close()
            raise UserError(f"a Ray device worker could not start: {_first_line(exc)}") from exc

    @property
    def slots(self) -> int:
        return 2 * self._per_worker * len(self._workers)

    def on_device(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """Run one of DeviceWorker's methods on the first device worker and wait for it
        (the driver's own requests: its builds and timings stay on one node)."""
        return self._ray.get(getattr(self._workers[0], method).remote(*args),
                             timeout=timeout_s)

    def submit(self, job: EvalJob) -> Future[list[Outcome]]:
        known = [self.pipeline.cached(job.context, job.params, size) for size in job.sizes]
        missing = [i for i, outcome in enumerate(known) if outcome is None]
        result: Future[list[Outcome]] = Future()
        if not missing:
            result.set_result([o for o in known if o is not None])
            return result
        remote_job = replace(job, sizes=tuple(job.sizes[i] for i in missing),
                             slow_cutoff_ms=tuple(job.slow_cutoff_ms[i] for i in missing))
        self._send(_Pending(remote_job, known, missing, result))
        return result

    def evaluations_by_worker(self) -> dict[str, int]:
        return dict(self.evaluations)

    def busy_seconds(self) -> dict[str, float]:
        """Seconds each device worker spent validating and timing, in the replies so far."""
        return busy_by_worker(self.job_times, tuple(self.worker_names))

    def _send(self, pending: _Pending) -> None:
        """To the least busy worker that is up (waiting, if Ray is restarting them all)."""
        with self._ready:
            self._ready.wait_for(lambda: len(self._down) < len(self._workers))
            up = [i for i in range(len(self._workers)) if i not in self._down]
            index = min(up, key=self._busy.__getitem__)
            self._busy[index] += 1
        pending.sent_at = time.perf_counter()
        shipped = (self._builder.remote(self._backend_name, self._setup_ref, pending.job)
                   if self._builder is not None else None)
        reply = self._workers[index].evaluate.remote(pending.job, shipped)
        with self._ready:
            self._waiting[reply] = (index, pending)
            self._ready.notify_all()

    def _stream_results(self) -> None:
        """The results thread: `ray.wait` for whichever reply comes first, hand it on."""
        while not self._closing:
            with self._ready:
                self._ready.wait_for(lambda: bool(self._waiting) or self._closing, timeout=1)
                refs = list(self._waiting)
            if not refs:
                continue
            done, _ = self._ray.wait(refs, num_returns=1, timeout=1.0)
            for ref in done:
                with self._ready:
                    index, pending = self._waiting.pop(ref)
                    self._busy[index] -= 1
                try:
                    reply = self._ray.get(ref)
                except Exception as exc:
                    self._worker_lost(pending, index, exc)
                    continue
                self._finished(reply, pending)

    def _finished(self, reply: WorkerReply, pending: _Pending) -> None:
        try:
            self.evaluations[reply.worker] = self.evaluations.get(reply.worker, 0) + 1
            self.job_times.append(JobTimes(reply.worker, time.perf_counter() - pending.sent_at,
                                           reply.build_s, reply.waited_s, reply.busy_s,
                                           reply.compiled, pending.job.trial))
            if reply.compiled:
                with self.pipeline.counter_lock:
                    self.pipeline.cache.counters.compiles += 1
            for i, size, outcome in zip(pending.missing, pending.job.sizes, reply.outcomes,
                                        strict=True):
                self.pipeline.store(pending.job.context, pending.job.params, size, outcome)
                pending.known[i] = outcome
            _settle(pending.result, [o for o in pending.known if o is not None])
        except BaseException as exc:
            _settle(pending.result, exc)

    def _worker_lost(self, pending: _Pending, index: int, exc: BaseException) -> None:
        """Run the job again once Ray has restarted the worker; after too many losses,
        fail it as a crash (not cached: the next study may have better luck)."""
        self.lost += 1
        log.warning("device worker %d lost a job: %s", index, _first_line(exc))
        with self._ready:
            if index not in self._down:
                self._down.add(index)
                threading.Thread(target=self._wait_until_up, args=(index,), daemon=True).start()
        if pending.attempts < self._retries:
            pending.attempts += 1
            threading.Thread(target=self._send, args=(pending,), daemon=True).start()
            return
        lost = Outcome(Status.RUNTIME_ERROR, message="evaluation worker lost "
                       f"{pending.attempts + 1} times: {_first_line(exc)}")
        _settle(pending.result, [o if o is not None else lost for o in pending.known])

    def _wait_until_up(self, index: int) -> None:
        """Ping a worker Ray is restarting until it answers, then send it jobs again."""
        deadline = time.monotonic() + _RESTART_WAIT_S
        while time.monotonic() < deadline and self._workers:
            try:
                self._ray.get(self._workers[index].ping.remote(), timeout=60)
                break
            except Exception:  # still restarting
                time.sleep(0.5)
        with self._ready:
            self._down.discard(index)  # up, or given up on: its jobs will fail as lost
            self._ready.notify_all()

    def close(self) -> None:
        self._closing = True
        with self._ready:
            self._ready.notify_all()
        self._results.join(timeout=10)
        try:
            self._ray.get([w.shutdown.remote() for w in self._workers], timeout=60)
        except Exception as exc:  # a dead actor has nothing left to clean
            log.info("device worker shutdown: %s", _first_line(exc))
        for worker in self._workers:
            self._ray.kill(worker, no_restart=True)
        self._workers = []
        if self._started_ray:
            self._ray.shutdown()


def _settle(result: Future[list[Outcome]], value: list[Outcome] | BaseException) -> None:
    """Hand a job's result on, unless the trial loop cancelled it meanwhile (a stopped
    run): its outcome is in the cache already, and nobody waits for it."""
    if result.cancelled():
        return
    try:
        if isinstance(value, BaseException):
            result.set_exception(value)
        else:
            result.set_result(value)
    except InvalidStateError:  # cancelled between the check and now
        pass


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise UserError(f"--executor ray needs Ray: {_INSTALL_HINT}") from exc
    return ray


def _check_reachable(address: str) -> None:
    """Fail in seconds, not minutes, when a head at host:port does not answer (Ray itself
    retries for minutes)."""
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", "local": Ray finds the cluster itself
    try:
        socket.create_connection((host, int(port)), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise UserError(f"cannot reach the Ray cluster at {address}: "
                        f"{exc.strerror or exc}") from exc


def init_ray(ray: Any, settings: RaySettings) -> None:
    if settings.address:
        _check_reachable(settings.address)
    try:
        if settings.address:
            ray.init(address=settings.address, namespace=NAMESPACE, log_to_driver=False,
                     logging_level=logging.WARNING)
        else:
            # "local": a Ray of its own, never a cluster some earlier `ray start` left
            ray.init(address="local", num_cpus=settings.local_cpus, namespace=NAMESPACE,
                     include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING)
    except Exception as exc:
        where = settings.address or "a local Ray"
        raise UserError(f"cannot start or reach {where}: {_first_line(exc)}") from exc


def device_options(backend_name: str, profile: DeviceProfile) -> dict[str, Any]:
    """The Ray resources one device of the profile's kind takes: one CPU for a host
    backend; one GPU otherwise, of the profile's accelerator type where it names one
    (facts.ray_accelerator_type, as Ray labels nodes' GPUs: "H200",
    "AMD-Instinct-MI250X-MI250"), so actors land on nodes that have that GPU."""
    if capabilities(backend_name).on_host:
        return {"num_cpus": 1}
    kind = str(profile.facts.get("ray_accelerator_type", ""))
    return {"num_gpus": 1, "num_cpus": 1, **({"accelerator_type": kind} if kind else {})}


def devices_of_kind(ray: Any, backend_name: str, profile: DeviceProfile) -> int:
    """How many devices of the profile's kind the cluster's live nodes have."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if capabilities(backend_name).on_host:
        return len(nodes)
    kind = str(profile.facts.get("ray_accelerator_type", ""))
    return sum(int(n.get("Resources", {}).get("GPU", 0)) for n in nodes
               if not kind or f"accelerator_type:{kind}" in n.get("Resources", {}))


def require_devices(ray: Any, backend_name: str, profile: DeviceProfile, where: str) -> int:
    """The count of devices of the profile's kind in the cluster; BackendUnavailable
    naming what its nodes have when there is none."""
    count = devices_of_kind(ray, backend_name, profile)
    if count:
        return count
    kind = str(profile.facts.get("ray_accelerator_type", "")) or "any GPU"
    seen = sorted({key.removeprefix("accelerator_type:")
                   for n in ray.nodes() if n.get("Alive") for key in n.get("Resources", {})
                   if key.startswith("accelerator_type:")})
    gpus = int(ray.cluster_resources().get("GPU", 0))
    has = f"{gpus} GPU(s){': ' + ', '.join(seen) if seen else ''}" if gpus else "no GPU"
    arch = profile.facts.get("arch", "")
    raise BackendUnavailable(
        f"no GPU of the {profile.name} kind ({arch or kind}) is visible here or in {where} "
        f"(Ray resource accelerator_type:{kind}; its nodes have {has})")


def _default_workers(ray: Any, backend_name: str, profile: DeviceProfile) -> int:
    if capabilities(backend_name).on_host:
        return max(1, devices_of_kind(ray, backend_name, profile))
    return require_devices(ray, backend_name, profile, "the Ray cluster")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

"""A killable child process that answers JSON-line requests over a dedicated pipe pair.

Backends run kernels in such a worker so that a crash, a hang or a stray write cannot
take the tuner down. The parent (`WorkerProcess`) enforces a deadline per request and
kills the worker's whole process group on timeout; a worker that dies is reported as a
KernelCrash naming the signal, and the next request starts a fresh one.

A kernel runs in the worker's process and can write anything the worker can, so the
parent trusts a reply only as far as it checks it: every request carries a random nonce
and a sequence number that its reply must echo, a second reply to one request (or any
bytes after it) is a forgery, and after every request the worker must have no child
processes (`HarnessBreach`: the worker and everything it started are killed). The parent
can stop the worker (SIGSTOP to its group) while it judges a run's output, so that no
thread of the kernel's can go on writing after it replied.

Jobs (`fork_jobs`, for host code): the worker never runs a kernel itself. `begin_job`
makes it fork a job process that serves the requests of one evaluation and exits at
`end_job`; so no thread, static variable or loaded library of one kernel outlives its
evaluation. The worker is a child subreaper and reports on a control pipe of its own
(closed in the job) how the job ended and what it left behind, which it kills: a
process the kernel started is found however it detached. Replies left on the pipe at
the end of a job are that job's forgeries, never the next one's.

Requests and replies travel over two pipes passed with `pass_fds`, never over stdout,
so a kernel that prints cannot corrupt the protocol (the worker's stdout goes to
/dev/null, its stderr to a file whose tail becomes the crash detail).

The child side is peak_tune.backends._worker_child.serve; the wire format is
peak_tune.backends.wire.
"""

from __future__ import annotations

import json
import logging
import os
import select
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import peak_tune
from peak_tune.backends.wire import ERROR_KINDS
from peak_tune.errors import (
    BackendUnavailable,
    EnvironmentFault,
    EvaluationError,
    KernelCrash,
    KernelTimeout,
    WrongResult,
)
from peak_tune.harness import isolation

__all__ = ["HarnessBreach", "WorkerProcess"]

_log = logging.getLogger(__name__)

_STDERR_TAIL_BYTES = 4000
_STOP_WAIT_S = 2.0  # a SIGSTOP not in effect after this is a worker gone wrong

class HarnessBreach(WrongResult):
    """The kernel tampered with the harness: a forged, stale or duplicated reply, or a
    process it started. The worker and all it started are killed."""

    taints_process = True


class _Expired(Exception):
    pass


class _Died(Exception):
    pass


class _JobEnded(Exception):
    """The job process ended while a reply was awaited (the worker's report)."""

    def __init__(self, report: Mapping[str, Any]) -> None:
        super().__init__(str(report))
        self.report = report


class WorkerProcess:
    """Parent side: start, call with a deadline, kill and restart a worker module."""

    def __init__(self, module: str, *, startup_timeout_s: float = 60.0,
                 fork_jobs: bool = False) -> None:
        """`fork_jobs`: run each job in a process of its own (host code, which can fork
        and leave threads; a GPU kernel cannot, and runs in the worker)."""
        self._module = module
        self._startup_timeout_s = startup_timeout_s
        self._fork_jobs = fork_jobs
        self._scan_all = fork_jobs
        self._control_fd = -1
        self._control = b""
        self.job_pid = -1
        self._paused = False
        self._token = ""
        self._sequence = 0
        self.last_round_trip_s = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._request_fd = -1
        self._response_fd = -1
        self._stderr: IO[bytes] | None = None
        self._buffer = b""

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the worker and wait until it says it is ready."""
        self.stop()
        request_read, self._request_fd = os.pipe()
        self._response_fd, response_write = os.pipe()
        self._stderr = tempfile.TemporaryFile(prefix="peak-tune-worker-")
        command = [sys.executable, "-m", self._module,
                   "--request-fd", str(request_read), "--response-fd", str(response_write)]
        passed = [request_read, response_write]
        if self._fork_jobs:
            self._control_fd, control_write = os.pipe()
            command += ["--control-fd", str(control_write)]
            passed.append(control_write)
        self._token = os.urandom(8).hex()
        env = {**child_env(), isolation.TOKEN_VARIABLE: self._token}
        self._proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
            pass_fds=tuple(passed), start_new_session=True, env=env,
        )
        for fd in passed:
            os.close(fd)
        try:
            ready = self._receive(time.monotonic() + self._startup_timeout_s)
        except (_Expired, _Died) as exc:
            tail = self._stderr_tail()
            self.stop()
            last = tail.strip().splitlines()[-1:] or ["no output"]
            raise BackendUnavailable(
                f"evaluation worker {self._module} did not start: {last[0]}") from exc
        # without a subreaper, processes that detached are looked for in all of /proc
        self._scan_all = self._fork_jobs and not ready.get("result", {}).get("subreaper")
        _log.debug("worker %s started (pid %d)", self._module, self._proc.pid)

    def call(self, request: Mapping[str, Any], timeout_s: float,
             pause_after: bool = False) -> dict[str, Any]:
        """Send one request; its reply's result, or the typed error it raised.
        `pause_after`: the worker is stopped (SIGSTOP to its group, and waited for until
        every thread is) as soon as the reply is in, so
        that the checks of the reply and all that follows it have the cores to
        themselves (an OpenMP kernel's threads spin for a while after the call).

        Raises KernelTimeout (worker killed) after `timeout_s`, KernelCrash if the
        worker dies; either way the next call starts a fresh worker.
        """
        if not self.running:
            self.start()
        self._clear_stderr()
        self._sequence += 1
        nonce = os.urandom(8).hex()
        try:
            began = time.perf_counter()
            # a paused worker gets the request before it runs again: its main thread
            # wakes with the request waiting, at the same moment as any other thread
            self._send({**request, "nonce": nonce, "seq": self._sequence})
            self.resume()
            reply = self._receive(time.monotonic() + timeout_s)
            self.last_round_trip_s = time.perf_counter() - began
            if pause_after:
                self._signal_stop()
            if request.get("op") == "begin" and reply.get("ok"):
                self.job_pid = int(reply["result"]["pid"])  # the one process allowed
            self._check_reply(reply, nonce)
            if pause_after:
                self._wait_stopped()
        except _Expired:
            self.stop()
            raise KernelTimeout(f"kernel timed out after {timeout_s:g} s") from None
        except _Died:
            raise self._crash() from None
        except _JobEnded as ended:
            self.job_pid = -1
            raise self._job_crash(ended.report) from None
        if reply.get("ok"):
            return dict(reply["result"])
        if reply.get("restart"):
            self.stop()
        raise _decode_error(reply)

    def _check_reply(self, reply: Mapping[str, Any], nonce: str) -> None:
        """The reply answers this request, alone, and the worker started nothing."""
        if reply.get("nonce") != nonce or reply.get("seq") != self._sequence:
            self._breach("a reply that does not answer the request (forged or stale)")
        if self._buffer or self._readable(self._response_fd):
            self._breach("more than one reply to one request (forged)")
        started = self._started()
        if started:
            self._breach(f"the kernel started {len(started)} process(es) "
                         f"(pid {min(started)}): kernels must not fork")

    def _started(self) -> set[int]:
        """Processes the kernel started: under the worker, all but the job."""
        if self._proc is None:
            return set()
        if self._fork_jobs:
            return isolation.tree(self._proc.pid) - {self.job_pid}
        return isolation.children(self._proc.pid)

    def begin_job(self, timeout_s: float) -> None:
        """A fresh job process for the next requests (fork_jobs workers only)."""
        if self._fork_jobs:
            self.job_pid = int(self.call({"op": "begin"}, timeout_s)["pid"])

    def job_ready(self) -> bool:
        """Whether a job forked ahead (begin_job) is there for the next requests. One that
        ended meanwhile, with nothing of a kernel's run in it, is forgotten: False."""
        if not self._fork_jobs or self.job_pid < 0 or not self.running:
            return False
        if self._readable(self._control_fd) or isolation.stopped(self.job_pid) is None:
            try:
                self._control_report(time.monotonic() + _STOP_WAIT_S)
            except (_Expired, _Died):
                self.stop()
            self.job_pid = -1
            return False
        return True

    def end_job(self, timeout_s: float) -> None:
        """End the job: the worker reports how it ended and what it left, which it has
        killed; a reply still on the pipe is the job's forgery. HarnessBreach for either."""
        if not self._fork_jobs or self.job_pid < 0 or not self.running:
            return
        self.resume()
        self._sequence += 1
        try:
            self._send({"op": "end", "seq": self._sequence})
            report = self._control_report(time.monotonic() + timeout_s)
        except (_Expired, _Died):
            self.stop()
            raise KernelTimeout(f"the job did not end within {timeout_s:g} s") from None
        finally:
            self.job_pid = -1
        extra = self._buffer or self._readable(self._response_fd)
        if extra:
            self._breach("a reply nobody asked for (forged)")
        if report.get("leftovers"):
            self._breach(f"the kernel left {report['leftovers']} process(es) running "
                         "after its evaluation (killed): kernels must not fork")

    def _control_report(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self._control:
            if not self._wait_readable(self._control_fd, deadline):
                raise _Expired()
            chunk = os.read(self._control_fd, 1 << 12)
            if not chunk:
                raise _Died()
            self._control += chunk
        line, self._control = self._control.split(b"\n", 1)
        report: dict[str, Any] = json.loads(line)
        return report

    def _job_crash(self, report: Mapping[str, Any]) -> KernelCrash | HarnessBreach:
        detail = self._stderr_tail()
        leftovers = int(report.get("leftovers", 0))
        if leftovers:
            self.stop()
            return HarnessBreach(f"harness tampering: the kernel left {leftovers} "
                                 "process(es) running (killed): kernels must not fork")
        signum = int(report.get("signal", 0))
        if signum:
            try:
                how = signal.Signals(signum).name
            except ValueError:
                how = f"signal {signum}"
        else:
            how = f"job exited with status {report.get('status', '?')}"
        return KernelCrash(f"kernel crashed: {how}", detail=detail)

    def check_clean(self) -> None:
        """After a job: nothing the worker started is still running anywhere (its
        children, its session, its token), else HarnessBreach."""
        if self._proc is None:
            return
        found = isolation.descendants(self._proc.pid, self._token, self._scan_all)
        if found:
            self._breach(f"the kernel started {len(found)} process(es) (pid {min(found)}) "
                         "that outlived its run: kernels must not fork")

    def _breach(self, what: str) -> None:
        self.stop()
        raise HarnessBreach(f"harness tampering: {what}")

    @staticmethod
    def _readable(fd: int) -> bool:
        poller = select.poll()  # after every run: poll's 1 us, not a selector's 11
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))

    @staticmethod
    def _wait_readable(fd: int, deadline: float) -> bool:
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if selector.select(remaining):
                    return True

    def _signal_stop(self) -> None:
        """Stop every thread of the worker (SIGSTOP to its group); the next call resumes
        it."""
        assert self._proc is not None
        os.killpg(self._proc.pid, signal.SIGSTOP)
        self._paused = True

    def _wait_stopped(self) -> None:
        """Wait until every thread of the job (or the worker) is stopped; KernelCrash if
        it died instead."""
        assert self._proc is not None
        deadline = time.monotonic() + _STOP_WAIT_S
        delay = 0.0  # the stop takes tens of microseconds: look again at once, at first
        if self.job_pid > 0:
            while time.monotonic() < deadline:
                state = isolation.stopped(self.job_pid)
                if state:
                    return
                if state is None or self._readable(self._control_fd):
                    self.resume()
                    report = self._control_report(time.monotonic() + _STOP_WAIT_S)
                    self.job_pid = -1
                    raise self._job_crash(report)
                time.sleep(delay)
                delay = min(delay + 1e-4, 1e-3)
            self.stop()
            raise KernelCrash("kernel crashed: the job did not stop for its check")
        while time.monotonic() < deadline:
            info = os.waitid(os.P_PID, self._proc.pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
            if info is not None and info.si_code == os.CLD_STOPPED:
                os.waitid(os.P_PID, self._proc.pid, os.WSTOPPED | os.WNOHANG)  # consume
                return
            if self._proc.poll() is not None:
                raise self._crash()
            time.sleep(delay)
            delay = min(2 * delay, 1e-3)
        self.stop()
        raise KernelCrash("kernel crashed: the worker did not stop for its check")

    def resume(self) -> None:
        if self._proc is not None and self._paused:
            self._paused = False
            try:
                os.killpg(self._proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc is not None else -1

    def stop(self) -> None:
        """Kill the worker's process group and whatever it started; release its pipes."""
        if self._proc is not None:
            started = isolation.descendants(self._proc.pid, self._token, self._scan_all)
            if self._proc.returncode is None:
                self._kill_group()
            isolation.end(started)
            self._proc.wait()
            self._proc = None
        for fd in (self._request_fd, self._response_fd, self._control_fd):
            if fd >= 0:
                os.close(fd)
        self._request_fd = self._response_fd = self._control_fd = -1
        self._buffer = self._control = b""
        self.job_pid = -1
        self._paused = False
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _kill_group(self) -> None:
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _crash(self) -> KernelCrash:
        """The worker closed its pipe: collect how it ended, then clean up."""
        if self._proc is None:
            return KernelCrash("kernel crashed: worker gone")
        self._kill_group()  # before reaping: the dead worker's status stays as it was
        returncode = self._proc.wait()
        detail = self._stderr_tail()
        self.stop()
        if returncode < 0:
            try:
                how = signal.Signals(-returncode).name
            except ValueError:
                how = f"signal {-returncode}"
        else:
            how = f"worker exited with status {returncode}"
        crash = KernelCrash(f"kernel crashed: {how}", detail=detail)
        crash.signal_number = -returncode if returncode < 0 else 0
        return crash

    def _send(self, request: Mapping[str, Any]) -> None:
        data = (json.dumps(request, separators=(",", ":")) + "\n").encode()
        try:
            while data:
                written = os.write(self._request_fd, data)
                data = data[written:]
        except BrokenPipeError:
            raise _Died() from None

    def _receive(self, deadline: float) -> dict[str, Any]:
        with selectors.DefaultSelector() as selector:
            selector.register(self._response_fd, selectors.EVENT_READ)
            if self.job_pid > 0:
                selector.register(self._control_fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _Expired()
                ready = {key.fd for key, _ in selector.select(remaining)}
                if self._control_fd in ready and self._response_fd not in ready:
                    raise _JobEnded(self._control_report(time.monotonic() + _STOP_WAIT_S))
                if self._response_fd not in ready:
                    continue
                chunk = os.read(self._response_fd, 1 << 16)
                if not chunk:
                    raise _Died()
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _clear_stderr(self) -> None:
        if self._stderr is not None:
            self._stderr.seek(0)
            self._stderr.truncate()

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - _STDERR_TAIL_BYTES))
        return self._stderr.read().decode(errors="replace")


def child_env() -> dict[str, str]:
    """The parent's environment with this package importable (checkout or install)."""
    env = dict(os.environ)
    root = str(Path(peak_tune.__file__).resolve().parent.parent)
    paths = [root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _decode_error(reply: Mapping[str, Any]) -> Exception:
    kind = reply.get("kind", "crash")
    if kind == "environment":  # the machine's fault, not the kernel's: never cached
        return EnvironmentFault(str(reply.get("fault", "")), str(reply.get("message", "")))
    classes = dict(ERROR_KINDS)
    cls = classes.get(kind, KernelCrash)
    message = str(reply.get("message", "worker error"))
    if issubclass(cls, EvaluationError):
        return cls(message, detail=str(reply.get("detail", "")))
    return cls(message)

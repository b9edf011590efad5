"""The child side of a worker process (peak_tune.backends.worker): `serve(handlers)`
answers requests over the pipe pair until the parent closes it; with a control pipe it
is a child subreaper that runs each job in a process forked for it.

Each handler takes the request dict and returns a JSON-serialisable dict; typed errors
it raises travel back (encode_error) and are raised again in the parent with the same
class. Runs in the worker; imports only what a worker needs.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from peak_tune.backends.wire import ERROR_KINDS
from peak_tune.errors import EnvironmentFault, environment_fault
from peak_tune.harness import isolation

__all__ = ["Handler", "serve"]

_WATCHDOG_PERIOD_S = 1.0

Handler = Callable[[dict[str, Any]], dict[str, Any]]


def serve(handlers: Mapping[str, Handler], argv: Sequence[str] | None = None,
          job_ops: frozenset[str] = frozenset()) -> int:
    """Answer requests until the parent closes the request pipe. Runs in the worker.
    With --control-fd, requests of `job_ops` are served only inside a job (a forked
    process, see WorkerProcess.begin_job)."""
    parser = argparse.ArgumentParser(description="peak-tune evaluation worker")
    parser.add_argument("--request-fd", type=int, required=True)
    parser.add_argument("--response-fd", type=int, required=True)
    parser.add_argument("--control-fd", type=int, default=-1)
    args = parser.parse_args(argv)
    faulthandler.enable()
    _die_with_parent()
    control = args.control_fd
    subreaper = control >= 0 and isolation.become_subreaper()
    with os.fdopen(args.request_fd, "rb") as requests, \
            os.fdopen(args.response_fd, "wb") as replies:
        _reply(replies, {"ok": True, "result": {"pid": os.getpid(), "subreaper": subreaper}})
        for line in requests:
            request = json.loads(line)
            if control >= 0 and request.get("op") == "begin":
                _run_job(handlers, request, requests, replies, control)
                continue
            if control >= 0 and request.get("op") == "end":
                # the end of a job that died before reading it: its report is on the
                # control pipe, and an answer here would read as a forged reply
                continue
            if control >= 0 and request.get("op") in job_ops:
                reply = {"ok": False, "kind": "crash", "message": "no job to run it in"}
            else:
                reply = _handle(handlers, request)
            _answer(replies, request, reply)
    return 0


def _answer(replies: IO[bytes], request: Mapping[str, Any], reply: dict[str, Any]) -> None:
    reply.update(nonce=request.get("nonce"), seq=request.get("seq"))
    _reply(replies, reply)


def _run_job(handlers: Mapping[str, Handler], begin: Mapping[str, Any], requests: IO[bytes],
             replies: IO[bytes], control: int) -> None:
    """Fork the job; in the worker, wait for it, kill what it left and report."""
    job = os.fork()
    if job == 0:  # the job: never touches the control pipe
        os.close(control)
        _die_with_parent()
        _answer(replies, begin, {"ok": True, "result": {"pid": os.getpid()}})
        for line in requests:
            request = json.loads(line)
            if request.get("op") == "end":
                break
            _answer(replies, request, _handle(handlers, request))
        replies.flush()
        os._exit(0)
    status = _wait_for(job)
    leftovers = 0
    for _ in range(10):  # what it started, reparented here: kill until none is left
        found = isolation.tree(os.getpid())
        if not found:
            break
        leftovers = max(leftovers, len(found))
        isolation.end(found)
        for pid in found:
            _wait_for(pid)
    report: dict[str, Any] = {"ended": True, "leftovers": leftovers}
    if os.WIFSIGNALED(status):
        report["signal"] = os.WTERMSIG(status)
    else:
        report["status"] = os.WEXITSTATUS(status)
    os.write(control, (json.dumps(report) + "\n").encode())


def _wait_for(pid: int) -> int:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue


def _handle(handlers: Mapping[str, Handler], request: dict[str, Any]) -> dict[str, Any]:
    op = str(request.get("op"))
    if op == "ping":
        return {"ok": True, "result": {}}
    if op not in handlers:
        return {"ok": False, "kind": "crash", "message": f"worker has no operation {op!r}"}
    try:
        return {"ok": True, "result": handlers[op](request)}
    except Exception as exc:  # every failure travels back typed
        return _encode_error(exc)


def _reply(stream: IO[bytes], message: Mapping[str, Any]) -> None:
    stream.write((json.dumps(message, separators=(",", ":")) + "\n").encode())
    stream.flush()


def _die_with_parent() -> None:
    """Exit when the parent process goes away, even while a kernel is running.

    The request pipe's EOF ends an idle worker; this watchdog thread (the kernel runs
    with the GIL released) ends one stuck in a kernel. PR_SET_PDEATHSIG is not used:
    it fires when the parent *thread* that started the worker exits.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_WATCHDOG_PERIOD_S)
        os._exit(3)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _encode_error(exc: Exception) -> dict[str, Any]:
    reply: dict[str, Any] = {"ok": False, "restart": bool(getattr(exc, "taints_process", False))}
    fault = exc if isinstance(exc, EnvironmentFault) else environment_fault(exc, "evaluating")
    if fault is not None:
        reply.update(kind="environment", fault=fault.kind, message=fault.message, restart=True)
        return reply
    for kind, cls in ERROR_KINDS:
        if isinstance(exc, cls):
            reply.update(kind=kind, message=str(exc), detail=getattr(exc, "detail", ""))
            return reply
    reply.update(kind="crash", message=f"{type(exc).__name__}: {exc}",
                 detail=traceback.format_exc())
    return reply

"""A local server speaking the OpenAI chat-completions protocol, for tests.

POST /v1/chat/completions answers from a queue of scripted behaviours (a reply, an HTTP
error with optional Retry-After, a slow reply); GET /v1/models lists `models`. Every
request is recorded with its headers, JSON body and arrival time, so tests can count
calls, see where the API key went and how requests were spaced; `max_in_flight` is the
most chat requests the server held at once. An empty queue answers 500 with "no
scripted reply", so an unexpected call fails loudly.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Behaviour", "LLMServer", "Received", "error", "reply", "slow", "truncated"]


@dataclass(frozen=True)
class Behaviour:
    """One scripted answer: `status` 200 with `content`, or an error status."""

    content: str = ""
    status: int = 200
    delay_s: float = 0.0
    prompt_tokens: int = 100
    completion_tokens: int = 50
    retry_after_s: float | None = None  # sent as the Retry-After header of an error
    finish_reason: str = "stop"  # "length": the reply was cut off at the token limit


def reply(content: str, prompt_tokens: int = 100, completion_tokens: int = 50) -> Behaviour:
    return Behaviour(content=content, prompt_tokens=prompt_tokens,
                     completion_tokens=completion_tokens)


def truncated(content: str) -> Behaviour:
    """A reply the endpoint cut off at its token limit (finish_reason "length")."""
    return Behaviour(content=content, finish_reason="length")


def error(status: int, retry_after_s: float | None = None) -> Behaviour:
    return Behaviour(status=status, retry_after_s=retry_after_s)


def slow(delay_s: float, content: str = "```c\n```") -> Behaviour:
    return Behaviour(content=content, delay_s=delay_s)


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0  # time.monotonic() when the request arrived


class LLMServer:
    """Threaded HTTP server on 127.0.0.1, a free port. Use as a context manager."""

    def __init__(self, models: tuple[str, ...] = ("test-model",),
                 responder: Callable[[dict[str, Any]], Behaviour] | None = None) -> None:
        self.models = models
        self.responder = responder  # answers from the request once the script is used up
        self.behaviours: deque[Behaviour] = deque()
        self.received: list[Received] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self.behaviours.extend(behaviours)

    def chat_requests(self) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path.endswith("/chat/completions")]

    def __enter__(self) -> LLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _next(self, body: dict[str, Any]) -> Behaviour:
        with self._lock:
            if self.behaviours:
                return self.behaviours.popleft()
        return self.responder(body) if self.responder else Behaviour(status=599)

    def _record(self, received: Received) -> None:
        with self._lock:
            self.received.append(received)

    def _enter(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1


def _handler(server: LLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # quiet

        def do_GET(self) -> None:  # noqa: N802
            server._record(Received("GET", self.path, _headers(self)))
            if self.path.rstrip("/").endswith("/models"):
                data = [{"id": m, "object": "model", "created": 0, "owned_by": "test"}
                        for m in server.models]
                self._json(200, {"object": "list", "data": data})
            else:
                self._json(404, {"error": {"message": "not found", "type": "invalid_request"}})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            server._record(Received("POST", self.path, _headers(self), body, time.monotonic()))
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._json(404, {"error": {"message": "not found", "type": "invalid_request"}})
                return
            server._enter()
            try:
                self._answer(server._next(body), body)
            finally:
                server._leave()

        def _answer(self, behaviour: Behaviour, body: dict[str, Any]) -> None:
            if behaviour.delay_s:
                time.sleep(behaviour.delay_s)
            if behaviour.status == 599:
                self._json(500, {"error": {"message": "no scripted reply", "type": "server"}})
            elif behaviour.status != 200:
                self._json(behaviour.status, {"error": {"message": f"scripted {behaviour.status}",
                                                        "type": "scripted"}},
                           behaviour.retry_after_s)
            else:
                self._json(200, _completion(body.get("model", ""), behaviour))

        def _json(self, status: int, payload: dict[str, Any],
                  retry_after_s: float | None = None) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                if retry_after_s is not None:
                    self.send_header("Retry-After", f"{retry_after_s:g}")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

    return Handler


def _headers(handler: BaseHTTPRequestHandler) -> dict[str, str]:
    return {name.lower(): value for name, value in handler.headers.items()}


def _completion(model: str, behaviour: Behaviour) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "finish_reason": behaviour.finish_reason,
                     "message": {"role": "assistant", "content": behaviour.content}}],
        "usage": {"prompt_tokens": behaviour.prompt_tokens,
                  "completion_tokens": behaviour.completion_tokens,
                  "total_tokens": behaviour.prompt_tokens + behaviour.completion_tokens},
    }

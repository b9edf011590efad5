"""A helper process of the driver: `python -m MODULE IN_FD OUT_FD`, pickled messages
over two pipes.

Not a multiprocessing child: spawning one re-imports the caller's main module, which
runs a user's script again unless it is guarded by `if __name__ == "__main__"`. Messages
go out from a thread of their own, so a child that is slow to read never blocks the
driver. When the driver ends, even killed, the child reads the end of its pipe and exits.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["Message", "PipedChild", "child_pipes", "one_with_a_reply"]

Message = tuple[str, Any]
_CLOSE_WAIT_S = 10.0
_ALIVE_CHECK_S = 1.0  # how often a wait for a reply checks that the child still runs


class PipedChild:
    """The process `python -m module`, sent messages in order and read on demand."""

    def __init__(self, module: str, thread_name: str) -> None:
        from peak_tune.backends.worker import child_env

        to_child, child_in = _pipe()
        child_out, from_child = _pipe()
        self._process = subprocess.Popen(
            [sys.executable, "-m", module, str(child_in.fileno()), str(child_out.fileno())],
            pass_fds=(child_in.fileno(), child_out.fileno()), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, env=child_env())
        child_in.close()
        child_out.close()
        self._replies = from_child
        self.send_error = ""  # why the sending stopped early, if it did
        self._outgoing: queue.Queue[Message | None] = queue.Queue()
        self._sender = threading.Thread(target=self._send_loop, args=(to_child,),
                                        name=thread_name, daemon=True)
        self._sender.start()

    @property
    def exit_code(self) -> int | None:
        """None while the process runs."""
        return self._process.poll()

    def send(self, kind: str, payload: Any = None) -> None:
        self._outgoing.put((kind, payload))

    def has_reply(self) -> bool:
        """A reply is waiting: `receive` returns without waiting."""
        return self._replies.poll(0)

    def receive(self) -> Message:
        """The next reply, waiting for it; EOFError once the process has ended (the
        replies it sent before are read first)."""
        while not self._replies.poll(_ALIVE_CHECK_S):
            if self.exit_code is not None:
                raise EOFError
        kind, payload = self._replies.recv()
        return str(kind), payload

    def close(self) -> None:
        """Stop sending (the child sees the end of its pipe) and wait for it to exit."""
        self._outgoing.put(None)
        self._sender.join(timeout=_CLOSE_WAIT_S)
        self._replies.close()
        try:
            self._process.wait(timeout=_CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def wait(self) -> int:
        return self._process.wait()

    def kill(self) -> None:
        self._process.kill()
        self._process.wait()

    def _send_loop(self, to_child: Connection) -> None:
        """Ends (closing the pipe: the child exits) at None, when the child is gone, or
        at a message that cannot be pickled (kept in `send_error`)."""
        with to_child:
            while (message := self._outgoing.get()) is not None:
                try:
                    to_child.send(message)
                except OSError:  # the child is gone; reading its replies says so
                    return
                except Exception as error:  # pickling failed
                    self.send_error = f"{message[0]!r} message: {type(error).__name__}: {error}"
                    return


def one_with_a_reply(children: Sequence[PipedChild]) -> PipedChild:
    """The first of `children` with a reply waiting (waiting for one); EOFError once one
    of them has ended with nothing more to read."""
    while True:
        for child in children:
            if child.has_reply():
                return child
        wait([child._replies for child in children], _ALIVE_CHECK_S)
        if not any(child.has_reply() for child in children) and any(
                child.exit_code is not None for child in children):
            raise EOFError


def _pipe() -> tuple[Connection, Connection]:
    """A one-way pipe as (write end, read end) connections; not inherited by children
    but the one that gets its ends by `pass_fds`."""
    read_fd, write_fd = os.pipe()
    return Connection(write_fd, readable=False), Connection(read_fd, writable=False)


def child_pipes(argv: list[str]) -> tuple[Connection, Connection]:
    """In the child: (its inbox, its outbox) from `python -m MODULE IN_FD OUT_FD`.

    A Ctrl-C at a terminal goes to the driver's whole process group; the driver, not the
    signal, says when the child ends (a study writer killed by it lost the trials it had
    not written yet). Other signals (a SIGKILL or SIGTERM of the group) still reach it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return (Connection(int(argv[1]), writable=False),
            Connection(int(argv[2]), readable=False))

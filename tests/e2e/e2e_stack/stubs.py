"""Stand-ins for pmcheck's two ports (the HTTP check and the agent check), answering exactly the
bytes a test gives, to see how HAProxy reads a given answer."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from .proc import LOOPBACK


class _StubServer:
    """A threaded TCP server on 127.0.0.1 (a port of its own) calling ``self.serve(conn)`` per
    connection; counts the connections it served, so a test can wait for the next checks."""

    def __init__(self, name: str):
        self.name = name
        self.sock = socket.create_server((LOOPBACK, 0))
        self.port = self.sock.getsockname()[1]
        self.served = 0
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._accept, name=name, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(timeout=5)

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                if self.closed.is_set():
                    return
                # A transient failure (an aborted connection, no descriptor left for a moment)
                # must not end the stand-in: HAProxy would then see its port refuse.
                time.sleep(0.01)
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                self.serve(conn)
            except OSError:
                return
        with self.lock:
            self.served += 1

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def count(self) -> int:
        with self.lock:
            return self.served


class AgentLineStub(_StubServer):
    """An agent-check port that writes ``line`` (plus ``\n``) to each connection without
    reading first and closes, as ``pmcheck serve --agent-listen`` does."""

    def __init__(self, line: str = ""):
        super().__init__("agent-line-stub")
        self.line = line

    def serve(self, conn: socket.socket) -> None:
        conn.sendall(self.line.encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(512):  # whatever the client still sends, until it closes
            pass


class HttpStatusStub(_StubServer):
    """A check port that answers every request with ``status`` and ``reason`` (HTTP/1.0, a
    one-line body), as pmcheck's HTTP responder does."""

    def __init__(self, status: int = 200, reason: str = "OK"):
        super().__init__("http-status-stub")
        self.status, self.reason = status, reason

    def serve(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data and len(data) < 65536:
            b = conn.recv(4096)
            if not b:
                break
            data += b
        body = f"{self.reason}\n".encode()
        head = f"HTTP/1.0 {self.status} {self.reason}\r\nContent-Type: text/plain\r\n"
        conn.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

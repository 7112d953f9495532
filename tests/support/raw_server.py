"""A server on loopback written on a raw socket, so it can break HTTP's rules: it answers
each request by calling a function of the test's (a sandbox server that misbehaves)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

Answer = Callable[[socket.socket, bytes], None]


class RawServer:
    """Answers every request on loopback by calling ``answer(connection, request_head)``,
    one at a time; counts the requests and the body bytes its answers managed to send."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.sent = 0
        self.requests = 0
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._socket.settimeout(0.05)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(10)
                head = self._read_request(connection)
                self.requests += 1
                # OSError: the client hung up, which is what these tests want of it.
                with contextlib.suppress(OSError):
                    self.answer(connection, head)

    @staticmethod
    def _read_request(connection: socket.socket) -> bytes:
        """The request's head, its body read too: closing a socket with unread data would
        reset the connection."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = connection.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                while len(body) < int(value):
                    chunk = connection.recv(65536)
                    if not chunk:
                        break
                    body += chunk
        return head

    def send(self, connection: socket.socket, data: bytes) -> None:
        connection.sendall(data)
        self.sent += len(data)

    def close(self) -> None:
        self._stopping.set()
        self._thread.join()
        self._socket.close()


def response(status: str, body: bytes, *headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Connection: close", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@contextlib.contextmanager
def raw_servers() -> Iterator[Callable[[Answer], RawServer]]:
    """A function starting a :class:`RawServer` per call; all of them closed at the end."""
    servers: list[RawServer] = []

    def start(answer: Answer) -> RawServer:
        servers.append(RawServer(answer))
        return servers[-1]

    try:
        yield start
    finally:
        for server in servers:
            server.close()

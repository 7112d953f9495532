"""A loopback HTTP proxy in front of moto's DynamoDB server that makes chosen requests fail.

While ``failing`` names an operation (``BatchWriteItem``...), its requests whose body holds
``marker`` are answered as DynamoDB answers an internal error (HTTP 500,
``InternalServerError``), never reaching moto; every other request is passed on as sent.

>>> with FailingDynamoDBProxy(dynamodb_server.endpoint_url) as proxy:  # doctest: +SKIP
...     proxy.fail("BatchWriteItem", marker="SESSION#")
"""

from __future__ import annotations

import http.server
import threading
import urllib.error
import urllib.request
from types import TracebackType

_INTERNAL_ERROR = (
    b'{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError",'
    b'"message":"Internal server error"}'
)
# Hop-by-hop headers, and those the proxy sets itself.
_DROPPED = {"host", "content-length", "transfer-encoding", "connection", "server", "date"}


class FailingDynamoDBProxy:
    """Serve on a free loopback port (``url``) until the ``with`` block ends."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self._operation: str | None = None
        self._marker = b""
        self.refused = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                return

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                operation = self.headers.get("X-Amz-Target", "").rpartition(".")[2]
                if proxy.refuses(operation, body):
                    self._answer(
                        500, {"Content-Type": "application/x-amz-json-1.0"}, _INTERNAL_ERROR
                    )
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _DROPPED}
                request = urllib.request.Request(
                    proxy.target + self.path, data=body, method="POST", headers=headers
                )
                try:
                    with urllib.request.urlopen(request) as response:
                        status, answer, data = response.status, response.headers, response.read()
                except urllib.error.HTTPError as error:
                    status, answer, data = error.code, error.headers, error.read()
                self._answer(status, dict(answer.items()), data)

            def _answer(self, status: int, headers: dict[str, str], data: bytes) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    if name.lower() not in _DROPPED:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def fail(self, operation: str | None, marker: str = "") -> None:
        """Fail the requests of ``operation`` holding ``marker`` from now on (None: none)."""
        self._operation, self._marker = operation, marker.encode()

    def refuses(self, operation: str, body: bytes) -> bool:
        refused = operation == self._operation and self._marker in body
        self.refused += refused
        return refused

    def __enter__(self) -> FailingDynamoDBProxy:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

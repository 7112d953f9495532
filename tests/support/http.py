"""Helpers for tests that talk HTTP to a real server on loopback."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import json
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentscope_serverless.auth import InMemoryKeyStore, KeyStore
from agentscope_serverless.deployers.local_deployer import ServerThread


@contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a free loopback port; yield its base URL."""
    server = ServerThread(app, host="127.0.0.1", port=0)
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


def free_port() -> int:
    """A loopback port that was free a moment ago (for servers started as processes)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_healthy(url: str, process: subprocess.Popen[Any], timeout: float = 30) -> None:
    """Poll ``url/health`` until it answers 200 (fails if the process exits first)."""
    deadline = time.monotonic() + timeout
    status = None
    while True:
        assert process.poll() is None, "the server process exited"
        try:
            status = httpx.get(f"{url}/health").status_code
            if status == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"the server did not come up (health: {status})"
        time.sleep(0.05)


def closed_by_the_server(connection: socket.socket) -> bool:
    """Whether the server closes ``connection`` (read until it does, for at most 30 s)."""
    connection.settimeout(30)
    try:
        while connection.recv(4096):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def assert_late_request_heads_are_cut_off(url: str) -> None:
    """The server at ``url`` closes a connection that sent half a request line, one that
    sent nothing, and one that sent half a request head after a whole request; it still
    answers."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    assert port is not None
    with socket.create_connection((host, port)) as half_line:
        half_line.sendall(b"POST /proc")
        assert closed_by_the_server(half_line)
    with socket.create_connection((host, port)) as silent:
        assert closed_by_the_server(silent)
    with socket.create_connection((host, port)) as kept_alive:
        kept_alive.sendall(b"GET /health HTTP/1.1\r\nHost: agent\r\n\r\n")
        assert kept_alive.recv(4096).startswith(b"HTTP/1.1 200")
        kept_alive.sendall(b"POST /process HTTP/1.1\r\nHost: agent\r\n")
        assert closed_by_the_server(kept_alive)
    assert httpx.get(f"{url}/health").status_code == 200


def issue_key(store: KeyStore, user_id: str | None = None) -> str:
    """A fresh key in ``store``: a user key for ``user_id``, or a service key."""

    async def create() -> str:
        await store.start()
        kind = "user" if user_id is not None else "service"
        return (await store.create_key(kind=kind, user_id=user_id)).key  # type: ignore[arg-type]

    return asyncio.run(create())


def revoke_key(store: KeyStore, key: str) -> None:
    """Revoke ``key`` (given in full) in ``store``."""
    asyncio.run(store.revoke_key(key.split("_")[1]))


@dataclass(frozen=True)
class Keys:
    """Keys of two users, a service key and a revoked key, all in one store."""

    store: InMemoryKeyStore
    alice: str
    bob: str
    service: str
    revoked: str

    @classmethod
    def make(cls) -> Keys:
        store = InMemoryKeyStore()
        revoked = issue_key(store, "carol")
        revoke_key(store, revoked)
        return cls(
            store=store,
            alice=issue_key(store, "alice"),
            bob=issue_key(store, "bob"),
            service=issue_key(store),
            revoked=revoked,
        )


def invalid_status(path: str) -> int:
    """The status of an invalid request on ``path``: 400 on the OpenAI-compatible routes, as
    OpenAI answers it (its SDKs raise BadRequestError), 422 on the project's own."""
    return 400 if path.startswith("/compatible-mode/v1/") else 422


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def user_message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def posted_at_once(
    client: httpx.Client, path: str, bodies: list[Any], headers: dict[str, str] | None = None
) -> list[httpx.Response]:
    """``bodies`` posted to ``path``, each from its own thread, at the same moment."""
    start = threading.Barrier(len(bodies))

    def send(body: Any) -> httpx.Response:
        start.wait()
        return client.post(path, json=body, headers=headers)

    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(send, bodies))


def the_one_taken(answers: list[httpx.Response], taken: int) -> int:
    """The answers of requests sent at once naming one message id, each with its own text:
    exactly one answered ``taken``, the others 409 MESSAGE_ID_CONFLICT not to be retried.
    Returns the position of the one taken."""
    statuses = [a.status_code for a in answers]
    assert sorted(statuses) == [taken] + [409] * (len(answers) - 1), statuses
    for answer in answers:
        if answer.status_code == 409:
            assert answer.json()["error"]["code"] == "MESSAGE_ID_CONFLICT"
            assert answer.headers["x-should-retry"] == "false"
    return statuses.index(taken)


def a2a_send(text: str, **message: Any) -> dict[str, Any]:
    """An A2A 0.3 JSON-RPC ``message/send`` of ``text`` (more fields of the message in
    ``message``: ``messageId``, ``contextId``...)."""
    sent = {"role": "user", "kind": "message", "messageId": "m1", **message}
    sent["parts"] = [{"kind": "text", "text": text}]
    return {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": sent}}


@dataclass
class SSE:
    """A parsed SSE stream: its events (``event`` name or None, parsed ``data``) and comments."""

    events: list[tuple[str | None, Any]]
    comments: list[str]
    raw: str = ""
    ids: list[str | None] = field(default_factory=list)

    @property
    def data(self) -> list[Any]:
        return [data for _, data in self.events]


def parse_sse(lines: list[str]) -> SSE:
    """Parse SSE lines strictly: every event is optional ``id:`` and ``event:`` then ``data:``,
    then a blank. The ids are kept in :attr:`SSE.ids`."""
    events: list[tuple[str | None, Any]] = []
    ids: list[str | None] = []
    comments: list[str] = []
    name: str | None = None
    data: str | None = None
    event_id: str | None = None
    for line in lines:
        if line == "":
            if data is not None:
                events.append((name, data if data == "[DONE]" else json.loads(data)))
                ids.append(event_id)
            name, data, event_id = None, None, None
        elif line.startswith("id: "):
            event_id = line[len("id: ") :]
        elif line.startswith(":"):
            comments.append(line)
        elif line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            assert data is None, "one data line per event"
            data = line[len("data: ") :]
        else:
            raise AssertionError(f"unexpected SSE line {line!r}")
    assert data is None, "the stream ended inside an event"
    return SSE(events=events, comments=comments, raw="\n".join(lines), ids=ids)


def stream(client: httpx.Client, path: str, **kwargs: Any) -> tuple[httpx.Response, SSE]:
    """POST ``path`` and parse the whole SSE reply."""
    with client.stream("POST", path, **kwargs) as response:
        if response.status_code != 200:
            response.read()
            return response, SSE(events=[], comments=[])
        return response, parse_sse(list(response.iter_lines()))


def text_of(events: list[Any]) -> str:
    """The text of the delta events of a /process stream."""
    return "".join(
        e["text"] for e in events if e.get("object") == "content" and e.get("delta") and e["text"]
    )


def assert_docs_run_only_their_pinned_scripts(docs: httpx.Response) -> None:
    """The docs page, where users paste their key, ran the latest Swagger UI 5.x of a CDN
    (``swagger-ui-dist@5``) with no integrity check and no Content-Security-Policy: whatever
    that URL served next ran on the API's origin. Now one version, checked, and nothing else
    but the page's own script."""
    page = docs.text
    sources = re.findall(r'<(?:script|link)[^>]+(?:src|href)="([^"]+)"', page)
    assert sources and all("swagger-ui-dist@5.35.0/" in url for url in sources), sources
    tags = re.findall(r"<(?:script|link)[^>]+(?:src|href)=[^>]+>", page)
    assert all('integrity="sha384-' in tag and 'crossorigin="anonymous"' in tag for tag in tags)
    policy = dict(
        part.strip().split(" ", 1) for part in docs.headers["Content-Security-Policy"].split(";")
    )
    assert policy["default-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
    (inline,) = re.findall(r"<script>(.*?)</script>", page, re.S)
    digest = base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in policy["script-src"].split()
    assert "'unsafe-inline'" not in policy["script-src"]

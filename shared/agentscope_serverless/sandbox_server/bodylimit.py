"""Bounds on request bodies: each one's size whatever its transfer encoding, and the bytes
of all those the server holds at once.

``Content-Length`` alone is not enough: a chunked body has none. This ASGI middleware
counts the bytes as they arrive and answers 413 once they pass the cap, before the
application sees (or buffers) any of them. A body is read only once there is room for it in
the budget of bodies held together (until its request is answered): a request waits for
room up to :data:`BODY_WAIT_SECONDS`, then is answered 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentscope_serverless.errors import SandboxUnavailableError

MAX_BODY_BYTES = 64 * 1024**2
DEFAULT_BODIES_BYTES = 4 * MAX_BODY_BYTES
# Bodies this small pass without waiting (counted all the same): every connection's own
# buffers are of that size, and a request to release a sandbox never waits behind uploads.
SMALL_BODY_BYTES = 64 * 1024
BODY_WAIT_SECONDS = 5.0
RETRY_AFTER_SECONDS = 10


class BodyBudget:
    """The bytes of request bodies held at once, at most ``total`` (more only for small
    bodies, and for one body alone, whatever its size).

    >>> async def demo(budget: BodyBudget) -> None:
    ...     if await budget.take(1024, wait=5.0):
    ...         budget.give_back(1024)
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.held = 0
        self._waiting: set[asyncio.Future[None]] = set()

    async def take(self, size: int, *, wait: float) -> bool:
        """Hold ``size`` bytes once there is room, waiting ``wait`` seconds at most; False
        when there was none by then."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while size > SMALL_BODY_BYTES and self.held and self.held + size > self.total:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            freed = loop.create_future()
            self._waiting.add(freed)
            try:
                await asyncio.wait({freed}, timeout=remaining)
            finally:
                self._waiting.discard(freed)
        self.held += size
        return True

    def give_back(self, size: int) -> None:
        """``size`` bytes held are free again (the requests waiting for room look again)."""
        self.held -= size
        for freed in self._waiting:
            if not freed.done():
                freed.set_result(None)


class BodyLimit:
    """Refuse (413) any HTTP request whose body is longer than ``limit`` bytes, and hold at
    most ``budget`` bytes of bodies at once (503 for a request finding no room in time).

    >>> from starlette.applications import Starlette
    >>> app = BodyLimit(Starlette(), limit=1024, budget=4096)
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int = MAX_BODY_BYTES,
        budget: int = DEFAULT_BODIES_BYTES,
        wait: float = BODY_WAIT_SECONDS,
    ) -> None:
        self.app = app
        self.limit = limit
        self.budget = BodyBudget(budget)
        self.wait = wait

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._too_large(send)
            return
        if length is not None:
            held = int(length)
        elif b"transfer-encoding" in headers:
            held = self.limit  # a chunked body may take up to the cap until it is read whole
        else:
            held = 0  # no body
        if not await self.budget.take(held, wait=self.wait):
            await self._no_room(send)
            return
        try:
            chunks: list[bytes] = []
            total = 0
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                body = message.get("body", b"")
                total += len(body)
                if total > self.limit:
                    await self._too_large(send)
                    return
                chunks.append(body)
                if not message.get("more_body", False):
                    break
            if total < held:
                self.budget.give_back(held - total)
                held = total
            await self._serve(scope, receive, send, chunks)
        finally:
            self.budget.give_back(held)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, chunks: list[bytes]) -> None:
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        await _answer(
            send,
            413,
            {"detail": f"request body larger than {self.limit} bytes"},
            [(b"connection", b"close")],
        )

    async def _no_room(self, send: Send) -> None:
        detail = (
            f"the sandbox server holds {self.budget.total} bytes of request bodies at most, "
            f"and found no room for this one within {self.wait:g} s: retry in "
            f"{RETRY_AFTER_SECONDS} s"
        )
        # Its body unread: the server's HTTP protocol drops what the client still sends for
        # a while before it closes the connection, so that the client reads this answer.
        await _answer(
            send,
            503,
            {"detail": detail, "code": SandboxUnavailableError.code},
            [(b"retry-after", str(RETRY_AFTER_SECONDS).encode())],
        )


async def _answer(
    send: Send, status: int, content: dict[str, Any], headers: list[Any] | None = None
) -> None:
    body = json.dumps(content).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


__all__ = [
    "BODY_WAIT_SECONDS",
    "DEFAULT_BODIES_BYTES",
    "MAX_BODY_BYTES",
    "BodyBudget",
    "BodyLimit",
]

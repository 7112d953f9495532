"""A user's plain (blocking) functions run in daemon threads of our own, so a server that
is told to stop always exits.

The threads of ``asyncio.to_thread`` (the loop's default executor) and of anyio (FastAPI's
and Starlette's worker threads) are not daemon threads: Python waits for them as it exits
(``asyncio.run`` joins the default executor's threads), so a plain function that never
returns (a task in a loop, a handler waiting on a socket) kept a server that was stopped
(SIGTERM, Ctrl-C) alive. A daemon thread does not: the process exits with it still
running, and what it returns is dropped (a thread cannot be stopped).

>>> import asyncio
>>> asyncio.run(run_in_thread(sum, [1, 2, 3]))
6
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any, TypeVar, cast

_T = TypeVar("_T")
# What a call gave: its result, or the exception it raised.
_Outcome = tuple[Any, BaseException | None]

# A call waiting for the worker's thread: the loop and future awaiting it, the context it
# runs in, the function and its arguments.
_Call = tuple[
    asyncio.AbstractEventLoop,
    "asyncio.Future[_Outcome]",
    contextvars.Context,
    Callable[..., Any],
    tuple[Any, ...],
]


class ThreadWorker:
    """A daemon thread running the calls given to :meth:`run` one after another, each in a
    copy of its caller's context (as ``asyncio.to_thread`` runs them): the steps of a sync
    generator, say, all in one thread.

    What a call raises is raised to its caller, whatever it is (``KeyboardInterrupt``,
    ``SystemExit`` too). A caller cancelled while its call runs does not stop it: its
    result is dropped. The thread starts with the first call and ends once :meth:`close`
    was called and the calls given before have run.

    >>> async def twice() -> list[int]:
    ...     worker = ThreadWorker("example")
    ...     try:
    ...         return [await worker.run(len, "ab"), await worker.run(len, "abc")]
    ...     finally:
    ...         worker.close()
    >>> asyncio.run(twice())
    [2, 3]
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def run(self, function: Callable[..., _T], /, *args: Any) -> _T:
        """``function(*args)``, called in the worker's thread."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Outcome] = loop.create_future()
        self._calls.put((loop, future, contextvars.copy_context(), function, args))
        self._start()
        result, error = await future
        if error is not None:
            # Raised here, in the caller's frame, rather than thrown into its task by the
            # future: asyncio throws a GeneratorExit into the coroutine, and an async
            # generator it passes through takes it for its own closing (and is left broken).
            try:
                raise error
            finally:
                del error
        return cast(_T, result)

    def close(self) -> None:
        """Let the thread end once the calls given so far have run (without waiting)."""
        self._calls.put(None)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            _answer(*call)
            del call  # nothing of a call is held while the thread waits for the next


def _answer(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[_Outcome],
    context: contextvars.Context,
    function: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    """Call ``function(*args)`` in ``context`` and settle ``future`` with what it gave."""
    try:
        outcome: _Outcome = (context.run(function, *args), None)
    except StopIteration:
        # A coroutine cannot raise it (PEP 479): what it means, said.
        outcome = (None, RuntimeError("a plain function raised StopIteration"))
    except BaseException as exc:
        outcome = (None, exc)
    _settle(loop, future, outcome)


def _settle(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[_Outcome], outcome: _Outcome
) -> None:
    """Give ``future`` the outcome of its call, in its loop's thread; nothing when its
    caller stopped waiting (cancelled) or its loop has closed."""

    def settle() -> None:
        if not future.done():
            future.set_result(outcome)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(settle)


async def stepped(
    worker: ThreadWorker, generator: Generator[_T, Any, Any], close_within: float
) -> AsyncGenerator[_T, None]:
    """The items of a plain ``generator``, each of its steps taken in ``worker``'s thread.
    Ended early (its reader gone, cancelled), the generator is closed in that thread once
    the step it may be taking is over, so its ``finally`` may block without holding the
    loop; one still busy after ``close_within`` seconds is left to close on its own (a
    thread cannot be stopped)."""
    done = object()
    try:
        while (item := await worker.run(next, generator, done)) is not done:
            yield cast(_T, item)
    finally:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(close_within):
                await worker.run(generator.close)


async def run_in_thread(function: Callable[..., _T], /, *args: Any) -> _T:
    """``function(*args)`` called in a daemon thread of its own (see :class:`ThreadWorker`):
    ``asyncio.to_thread`` without holding the process's exit."""
    worker = ThreadWorker(getattr(function, "__name__", "call"))
    try:
        return await worker.run(function, *args)
    finally:
        worker.close()


__all__ = ["ThreadWorker", "run_in_thread", "stepped"]

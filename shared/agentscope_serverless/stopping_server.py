"""The uvicorn server every local entry point runs (``serve``, ``--reload``'s worker,
``python -m agentscope_serverless.serve``, ``AgentApp.run()``).

Stopped, it gives the requests still open their grace (``timeout_graceful_shutdown``,
:data:`~agentscope_serverless.serve.STOP_GRACE_SECONDS` unless ``AgentApp.run()`` is given
another) to end, then cancels the runs still going while their clients are still connected: a
streamed client gets the run's ``canceled`` event and the end of its stream, a non-streamed
one the canceled response. What is still open once those runs are stored (at most
:data:`~agentscope_serverless.recorder.STOP_SECONDS` later) is cut.

Asked again to stop (a second SIGTERM or Ctrl-C) while it stops, it stops at once: the
requests still open are not waited for, and the app's stop hooks still going are cancelled.

Once stopped, the tasks still running (an agent's run or a background task that catches its
cancellation, left behind by what ran it) are cancelled and get
:data:`LEFT_BEHIND_SECONDS` to end: those still going then are left, a WARNING saying where
each waits, and the process exits without them (``asyncio.run`` waits for them however long).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import socket
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from agentscope_serverless.recorder import STOP_SECONDS, stop_runs

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Left to the cancelled runs' requests to send their last events before what is still open
# is cut.
_FLUSH_SECONDS = 0.5
# Left to the tasks still running once the server has stopped, cancelled then (again, for
# those that ignored it): a background task whose stop a second signal cut short has its
# cleanup (1 s) and its end stored.
LEFT_BEHIND_SECONDS = 2.0


class StoppingServer(uvicorn.Server):
    """A uvicorn server that cancels its runs when its grace for open requests ends, and
    stops at once when asked again."""

    def __init__(self, config: uvicorn.Config, *, interrupted: bool = True) -> None:
        """``interrupted``: whether a Ctrl-C (SIGINT) stops it, not only SIGTERM. Not for a
        worker of ``--reload``: its reloader, in the same process group, gets the terminal's
        Ctrl-C too and stops the worker with SIGTERM, which would make the stop a second one,
        cut short."""
        self.grace = config.timeout_graceful_shutdown
        if self.grace is not None:  # (None: it waits for the requests, however long)
            config.timeout_graceful_shutdown = self.grace + math.ceil(STOP_SECONDS + _FLUSH_SECONDS)
        super().__init__(config)
        self.interrupted = interrupted
        self._stoppable: CuttableStop | None = None

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's ``run`` (``asyncio.run`` of :meth:`serve`), but for the tasks still
        running once the server stopped: they are left behind after
        :data:`LEFT_BEHIND_SECONDS` (see :func:`_end_the_rest`), not waited for forever."""
        factory = self.config.get_loop_factory()
        loop = asyncio.new_event_loop() if factory is None else factory()
        if factory is None:
            asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self.serve(sockets=sockets))
        finally:
            try:
                if loop.run_until_complete(_end_the_rest()):
                    # (Else the async generators the tasks left behind run cannot be closed:
                    # they are running still.)
                    loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                if factory is None:
                    asyncio.set_event_loop(None)
                loop.close()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGINT and not self.interrupted:
            return
        # uvicorn's own handler stops its wait for the requests still open on a second SIGINT
        # alone, and never the app's stop.
        if self.should_exit and not self.force_exit:
            self.force_exit = True
            if self._stoppable is not None:
                self._stoppable.cut_short()
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # The application is loaded by now (in the worker of --reload too): its lifespan and
        # its requests run it wrapped from here on.
        self._stoppable = CuttableStop(self.config.loaded_app)
        self.config.loaded_app = self._stoppable
        await super().startup(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.grace is None:
            await super().shutdown(sockets)
            return
        cutting = asyncio.create_task(self._cut_after(self.grace))
        try:
            await super().shutdown(sockets)
        finally:
            cutting.cancel()

    async def _cut_after(self, grace: float) -> None:
        await asyncio.sleep(grace)
        await stop_runs()
        await asyncio.sleep(_FLUSH_SECONDS)
        for task in self.server_state.tasks:
            task.cancel(msg="the server stopped")


class CuttableStop:
    """``app``, whose stop (its lifespan's shutdown: the stop hooks) :meth:`cut_short`
    cancels."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # The task running the app's start and stop, and whether its stop was cut short.
        self._lifespan: asyncio.Task[Any] | None = None
        self._cut_short = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        self._lifespan = asyncio.current_task()

        async def saying_why(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.failed" and self._cut_short:
                # Not the cancellation's traceback: the stop was cut short on purpose.
                message = {"type": message["type"], "message": "the stop was cut short"}
            await send(message)

        await self.app(scope, receive, saying_why)

    def cut_short(self) -> None:
        """Cancel the app's stop (its stop hooks) still going; callable from a signal
        handler."""
        task = self._lifespan
        if task is not None and not task.done():
            self._cut_short = True
            task.get_loop().call_soon_threadsafe(_stop_now, task)


def _stop_now(lifespan: asyncio.Task[Any]) -> None:
    from agentscope_serverless.log import logger

    logger.warning("asked again to stop: the stop hooks still going are cancelled")
    lifespan.cancel()


async def _end_the_rest() -> bool:
    """Cancel the tasks still running (``asyncio.run``'s last step), and wait
    :data:`LEFT_BEHIND_SECONDS` at most for them to end: one still going then (it catches
    its cancellation) is left behind, a WARNING saying where it waits. Whether all ended."""
    from agentscope_serverless.log import logger
    from agentscope_serverless.stacks import awaited_stack

    rest = asyncio.all_tasks() - {asyncio.current_task()}
    if not rest:
        return True
    for task in rest:
        task.cancel()
    _, going = await asyncio.wait(rest, timeout=LEFT_BEHIND_SECONDS)
    if going:
        logger.warning(
            "%d task(s) ignoring their cancellation were left behind as the server stopped",
            len(going),
            extra={"stacks": sorted(awaited_stack(task) or task.get_name() for task in going)},
        )
        _hold(going)
    return not going


def _hold(tasks: set[asyncio.Task[Any]]) -> None:
    """Keep ``tasks`` from being destroyed as the process exits (a daemon thread's frame is
    never cleared): destroyed, each would log that it was pending, and its coroutine be
    closed, running the code it is stuck in once more, its errors logged, as Python ends."""
    threading.Thread(target=_holding, args=(tasks,), name="left-behind", daemon=True).start()


def _holding(tasks: set[asyncio.Task[Any]]) -> None:
    threading.Event().wait()


def run(app: Any, **options: Any) -> None:
    """``uvicorn.run(app, **options)``, on a :class:`StoppingServer`."""
    with contextlib.suppress(KeyboardInterrupt):
        StoppingServer(uvicorn.Config(app, **options)).run()


__all__ = ["LEFT_BEHIND_SECONDS", "CuttableStop", "StoppingServer", "run"]

"""The uvicorn server every local entry point runs (``serve``, ``--reload``'s worker,
``python -m agentscope_serverless.serve``, ``AgentApp.run()``).

Stopped, it gives the requests still open their grace (``timeout_graceful_shutdown``,
:data:`~agentscope_serverless.serve.STOP_GRACE_SECONDS` unless ``AgentApp.run()`` is given
another) to end, then cancels the runs still going while their clients are still connected: a
streamed client gets the run's ``canceled`` event and the end of its stream, a non-streamed
one the canceled response. What is still open once those runs are stored (at most
:data:`~agentscope_serverless.recorder.STOP_SECONDS` later) is cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
from typing import Any

import uvicorn

from agentscope_serverless.recorder import STOP_SECONDS, stop_runs

# Left to the cancelled runs' requests to send their last events before what is still open
# is cut.
_FLUSH_SECONDS = 0.5


class StoppingServer(uvicorn.Server):
    """A uvicorn server that cancels its runs when its grace for open requests ends."""

    def __init__(self, config: uvicorn.Config) -> None:
        self.grace = config.timeout_graceful_shutdown
        if self.grace is not None:  # (None: it waits for the requests, however long)
            config.timeout_graceful_shutdown = self.grace + math.ceil(STOP_SECONDS + _FLUSH_SECONDS)
        super().__init__(config)

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


def run(app: Any, **options: Any) -> None:
    """``uvicorn.run(app, **options)``, on a :class:`StoppingServer`."""
    with contextlib.suppress(KeyboardInterrupt):
        StoppingServer(uvicorn.Config(app, **options)).run()


__all__ = ["StoppingServer", "run"]

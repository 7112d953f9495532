"""``stream_printing_messages``: the ``(msg, last)`` pairs agents print while a task runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any


async def stream_printing_messages(
    agents: list[Any], coroutine_task: Coroutine[Any, Any, Any]
) -> AsyncIterator[tuple[Any, bool]]:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    for agent in agents:
        agent.msg_queue = queue
    task = asyncio.ensure_future(coroutine_task)
    task.add_done_callback(lambda _: queue.put_nowait(None))
    while (item := await queue.get()) is not None:
        yield item
    await task

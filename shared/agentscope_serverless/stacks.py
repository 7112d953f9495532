"""Where suspended asynchronous code is waiting, as one short line for a log.

A task's :meth:`asyncio.Task.get_stack` gives only the frame of its own coroutine: what that
coroutine awaits (the agent's generator, the call it is stuck in) is not on the stack of a
suspended task. :func:`awaited_stack` follows the awaits down from a coroutine or an async
generator instead, through the async generators iterated by ``async for`` (each awaited by
an ``asend`` object that names its generator only to the garbage collector) and the tasks
awaited, and names each frame by its module, function and line, nothing of its values.

>>> async def answer():
...     await asyncio.sleep(1)
...     yield "done"
>>> async def show():
...     reply = answer()
...     waiting = asyncio.ensure_future(reply.__anext__())
...     await asyncio.sleep(0)
...     where = awaited_stack(reply)
...     waiting.cancel()
...     return where
>>> asyncio.run(show())
'...answer:2 > asyncio.tasks.sleep:...'
"""

from __future__ import annotations

import asyncio
import gc
import inspect
from types import FrameType

# The most awaits followed (those of a recursion could be endless).
MAX_AWAITS = 64


def awaited_stack(awaitable: object) -> str:
    """The frames ``awaitable`` (a coroutine or an async generator, suspended) is waiting
    in, outermost first: ``module.function:line > ...`` ("" when it is not waiting)."""
    frames: list[str] = []
    current: object = awaitable
    for _ in range(MAX_AWAITS):
        if current is None:
            break
        frame = _frame_of(current)
        if frame is not None:
            module = frame.f_globals.get("__name__", "?")
            frames.append(f"{module}.{frame.f_code.co_qualname}:{frame.f_lineno}")
        current = _awaited_by(current)
    return " > ".join(frames)


def _frame_of(awaitable: object) -> FrameType | None:
    for name in ("cr_frame", "ag_frame", "gi_frame"):
        frame = getattr(awaitable, name, None)
        if frame is not None:
            return frame  # type: ignore[no-any-return]
    return None


def _awaited_by(awaitable: object) -> object:
    """What ``awaitable`` waits on (None: nothing we can follow, a plain future say)."""
    if isinstance(awaitable, asyncio.Task):
        return awaitable.get_coro()
    for name in ("cr_await", "ag_await", "gi_yieldfrom"):
        if hasattr(awaitable, name):
            return getattr(awaitable, name)
    # An async generator's __anext__() or athrow() awaitable, or a task's __await__(): its
    # generator, or its task, is found only among what it refers to.
    referred = gc.get_referents(awaitable)
    return next((o for o in referred if inspect.isasyncgen(o) or isinstance(o, asyncio.Task)), None)


__all__ = ["MAX_AWAITS", "awaited_stack"]

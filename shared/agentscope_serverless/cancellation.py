"""Whether a ``CancelledError`` cancels what runs the code, or is the code's own failure.

asyncio raises ``CancelledError`` in a task being cancelled (``task.cancel()``: a run
canceled, a server stopping), and also in code awaiting a step that was cancelled apart
from it (a future, or a task of its own, cancelled by something else): that one is a
failure of the code, to be reported as such, not taken for a cancellation.

>>> async def awaits_a_cancelled_step() -> bool:
...     step = asyncio.ensure_future(asyncio.sleep(1))
...     step.cancel()
...     try:
...         await step
...     except asyncio.CancelledError:
...         return cancelled_from_outside()
...     return True
>>> asyncio.run(awaits_a_cancelled_step())
False
"""

from __future__ import annotations

import asyncio


def cancelled_from_outside() -> bool:
    """Whether the asyncio task running this is being cancelled (``task.cancel()``)."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0


__all__ = ["cancelled_from_outside"]

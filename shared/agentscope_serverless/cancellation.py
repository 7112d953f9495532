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

# How long the cleanup of a canceled run's agent (its ``finally`` blocks, and what they await)
# may take: the run's task is cancelled once, then once more, cutting the cleanup short, only
# when it outlasts this. Less than an erase waits for the runs it stops (5 s).
CLEANUP_SECONDS = 3.0
# The same for a run or a background task stopped at its function's time limit: the margin
# left must still store its end.
TIME_LIMIT_CLEANUP_SECONDS = 1.0


def cancelled_from_outside() -> bool:
    """Whether the asyncio task running this is being cancelled (``task.cancel()``)."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0


__all__ = ["CLEANUP_SECONDS", "TIME_LIMIT_CLEANUP_SECONDS", "cancelled_from_outside"]

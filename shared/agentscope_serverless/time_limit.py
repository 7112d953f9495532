"""The time the serving invocation has left, so that work ends cleanly before Lambda stops it.

Lambda stops a function at its time limit (its ``Timeout``) without notice: a run of the agent
still going would stay in progress in the store until it reads as lost, and a buffered
response would never reach its caller. A Lambda entry point therefore says by when the work
of the invocation it serves must have ended (:func:`ending_by`: the invocation's deadline
less ``TIME_LIMIT_MARGIN_SECONDS``), and what is long-running looks at
:func:`seconds_left`: a run of the agent ends then as ``failed`` with the error
:data:`TIME_LIMIT` (its partial reply kept in the session, the run stored, the response
sent), a background task is stored as failed with it, and a stream following a stored run
ends for its client to resume. Outside Lambda nothing sets a deadline.

>>> with ending_by(time.time() + 30):
...     0 < seconds_left() <= 30
True
>>> seconds_left() is None
True
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

from agentscope_serverless.errors import TimeLimitError

# The error code of a run or task ended at the function's time limit.
TIME_LIMIT = TimeLimitError.code

# When the work of the invocation being served must have ended (time.time()), or None. A
# context variable: tasks started while serving a request inherit it; nothing outlives it.
_deadline: ContextVar[float | None] = ContextVar("agentscope_deadline", default=None)


def seconds_left() -> float | None:
    """Seconds until the work of the invocation being served must have ended (0 or less:
    it is due now); None when nothing limits it."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.time()


@contextlib.contextmanager
def ending_by(deadline: float | None) -> Iterator[None]:
    """Within this block, work must end by ``deadline`` (a ``time.time()``; None: no limit)."""
    token = _deadline.set(deadline)
    try:
        yield
    finally:
        _deadline.reset(token)


__all__ = ["TIME_LIMIT", "ending_by", "seconds_left"]

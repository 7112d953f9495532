"""An agent that warns (``warnings.warn``, as a library it calls would) and whose worker
thread raises: the function's log must show each as one JSON line."""

from __future__ import annotations

import threading
import warnings
from collections.abc import AsyncIterator
from typing import Any

from agentscope_serverless.app import AgentApp

WARNING = "the weather API is deprecated\nuse the forecast API"
THREAD_ERROR = "the poller lost its connection\nand gave up"
THREAD_NAME = "weather-poller"

app = AgentApp(app_name="warning", app_description="Warns, and its worker thread raises.")


def _poll() -> None:
    raise RuntimeError(THREAD_ERROR)


@app.query(framework="text")
async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
    warnings.warn(WARNING, UserWarning, stacklevel=1)
    worker = threading.Thread(target=_poll, name=THREAD_NAME)
    worker.start()
    worker.join()
    yield "done"

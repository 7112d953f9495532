"""An agent that logs through a library's logger (Python's logging, as an SDK it calls
would), quoting the chat API's key: the function's log must show that line as JSON with
the key masked."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from agentscope_serverless.app import AgentApp

LIBRARY_LOGGER = "weather_sdk"

app = AgentApp(app_name="logging", app_description="Logs through a library's logger.")


@app.query(framework="text")
async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
    logging.getLogger(LIBRARY_LOGGER).warning(
        "retrying with the key %s", os.environ.get("LLM_API_KEY", "")
    )
    yield "done"

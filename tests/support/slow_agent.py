"""A slow agent for the runs tests: a piece of text every 200 ms for 5 s.

Its ``finally`` block saves ``{"cleanup": true}`` as the session's agent state, so a test
can see (from any process) that the handler's cleanup ran when the run was cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from agentscope_serverless.app import AgentApp

PIECES = 25
INTERVAL_SECONDS = 0.2

app = AgentApp(app_name="slow", app_description="Answers slowly, a piece at a time.")


@app.query(framework="text")
async def query(self: Any, msgs: Any, session: Any = None, **kwargs: Any) -> AsyncIterator[str]:
    try:
        for index in range(PIECES):
            yield f"piece {index}. "
            await asyncio.sleep(INTERVAL_SECONDS)
    finally:
        await self.state_service.save_state(
            session.user_id, {"cleanup": True}, session_id=session.id
        )


@app.task("/jobs/double", queue="numbers")
async def double(payload: dict[str, Any]) -> dict[str, int]:
    """A background task: twice ``payload["n"]`` (a missing ``n`` fails the task)."""
    await asyncio.sleep(0.2)
    return {"doubled": 2 * payload["n"]}

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


@app.endpoint("/ask")
async def ask(body: dict[str, Any]) -> dict[str, Any]:
    """The agent's run, to its end, from an endpoint (``await app.query``)."""
    final = await app.query({"input": [{"role": "user", "content": body["text"]}], **body["run"]})
    return {"status": final.status, "error": final.error and final.error.model_dump()}


@app.endpoint("/ask-stream")
async def ask_stream(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """The agent's events, streamed from an endpoint (AgentScope's ``stream_query`` pattern)."""
    request = {"input": [{"role": "user", "content": body["text"]}], **body["run"]}
    async for event in app.stream_query(request):
        yield event.model_dump(include={"object", "status", "error"})

"""An agent whose cleanup takes a while, for the tests of canceled runs: a piece of text
every 200 ms (for 30 s); once cancelled, its ``finally`` block waits 0.6 s (for ever when
told :data:`NEVER_ENDING`), then saves ``{"cleanup": true}`` as the session's agent state.
Told :data:`SWALLOWING`, it ignores its cancellation and goes on.

:data:`LOG` says, by session, what it did: ``cancelled``, then ``cleaned up`` or, when its
cleanup was cancelled in turn, ``cleanup cut short``.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import Any

from agentscope_serverless.app import AgentApp

LOG: dict[str, list[str]] = collections.defaultdict(list)
NEVER_ENDING = "clean up for ever"
# Told this, it catches every cancellation and goes on (6 s in all), then ends: ``went on``.
SWALLOWING = "never stop"

app = AgentApp(app_name="tidy", app_description="Answers a piece at a time, then tidies up.")


@app.query(framework="text")
async def query(self: Any, msgs: Any, session: Any = None, **kwargs: Any) -> AsyncIterator[str]:
    log = LOG[session.id]
    if msgs[-1].get_text_content() == SWALLOWING:
        for _ in range(30):
            try:
                yield "piece. "
                await asyncio.sleep(0.2)
            except asyncio.CancelledError:
                log.append("cancelled")  # and goes on
        log.append("went on")
        return
    endless = msgs[-1].get_text_content() == NEVER_ENDING
    try:
        for _ in range(150):
            yield "piece. "
            await asyncio.sleep(0.2)
    except asyncio.CancelledError:
        log.append("cancelled")
        raise
    finally:
        try:
            await asyncio.sleep(3600 if endless else 0.6)
            await self.state_service.save_state(
                session.user_id, {"cleanup": True}, session_id=session.id
            )
            log.append("cleaned up")
        except asyncio.CancelledError:
            log.append("cleanup cut short")
            raise

"""Erase all of the caller's data in one call.

| Method and path | What |
|---|---|
| ``DELETE /users/me/data`` | delete the caller's sessions, stored runs, long-term memory,
state and Idempotency-Key records, and release their sandboxes |

The user's runs in progress are asked to stop, and waited for (a few seconds at most, see
``stop_runs``): else one would store its turn after the erase. Those still going then
store nothing more. Then each service deletes the
user's data at once (see ``delete_user_runs``, ``delete_user_memory``, ``delete_user_state``,
``delete_user_sessions``): the stored runs (their events hold the conversations) go first,
the session history last, and the user's sandboxes (their workspaces) are released on the
sandbox server, when the application has one. Retrying after an error is safe.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response

from agentscope_serverless.http.auth import CurrentUser, KeyedRoute
from agentscope_serverless.http.context import AppContext, get_context

router = APIRouter(prefix="/users", tags=["users"], route_class=KeyedRoute)


@router.delete("/me/data", status_code=204, summary="Erase all of the caller's data")
async def erase_my_data(
    user_id: CurrentUser, context: Annotated[AppContext, Depends(get_context)]
) -> Response:
    await context.stop_runs(user_id)
    services = context.current
    if services.runs is not None:
        await services.runs.delete_user_runs(user_id)
    if services.memory is not None:
        await services.memory.delete_user_memory(user_id)
    if services.state is not None:
        await services.state.delete_user_state(user_id)
    await context.session_history.delete_user_sessions(user_id)
    if context.idempotency is not None:
        # A replayed request would answer with what it answered then.
        await context.idempotency.delete_user_records(user_id)
    if services.sandbox is not None:
        await services.sandbox.release_user_async(user_id)
    return Response(status_code=204)

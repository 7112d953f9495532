"""Erase all of the caller's data in one call.

| Method and path | What |
|---|---|
| ``DELETE /users/me/data`` | delete the caller's sessions, stored runs, long-term memory,
state and Idempotency-Key records, and release their sandboxes |

How the erase goes, and what a failure leaves, is told in :func:`erase_my_data`'s
documentation (shown in the API docs).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Response

from agentscope_serverless.errors import AgentScopeServerlessError, MethodNotImplementedError
from agentscope_serverless.http.auth import CurrentUser, KeyedRoute
from agentscope_serverless.http.context import AppContext, get_context
from agentscope_serverless.log import logger

router = APIRouter(prefix="/users", tags=["users"], route_class=KeyedRoute)

# A store of the user's data: what it holds, and the call deleting a user's share of it.
Eraser = tuple[str, Callable[[str], Awaitable[object]]]


@router.delete("/me/data", status_code=204, summary="Erase all of the caller's data")
async def erase_my_data(
    user_id: CurrentUser, context: Annotated[AppContext, Depends(get_context)]
) -> Response:
    """Erase all of the caller's data.

    The caller's runs in progress are asked to stop, and waited for (a few seconds at
    most): else one would store its turn after the erase. Those still going then store
    nothing more. Should that fail (the runs' store is unavailable), nothing is erased.

    Then each store deletes the caller's data at once, in this order: the stored runs
    (their events hold the conversations), long-term memory, agent state, the session
    history, the Idempotency-Key records (a replayed request would answer with what it
    answered then), and the caller's sandboxes (their workspaces) are released on the
    sandbox server, when the application has one. A store that fails does not stop the
    others: each is asked in turn, and each erases the caller's data whole or, failing,
    keeps it for a retry. The answer then names what could not be erased, with the error
    of one that failed: one a retry may cure first (a 503), else, for a state service
    written for AgentScope Runtime without ``delete_user_state()``, a 501 naming that
    method. Retrying after an error is safe.

    Runs of the caller found once the stores are erased started meanwhile (a client
    sending its next turn at once): they read what was being erased, and would store their
    turn after it. They are stopped and the stores erased again, up to 3 times in all;
    runs still starting after that are a 409 ``CONFLICT`` (erase again once they end).
    """

    async def erase_once() -> None:
        await context.stop_runs(user_id)
        failed: list[tuple[str, Exception]] = []
        for what, erase in _erasers(context):
            try:
                await erase(user_id)
            except Exception as exc:  # the other stores are still erased
                failed.append((what, exc))
        if failed:
            raise _not_all_erased(failed)

    await context.erase_while_runs_start(erase_once, user_id, None, "the caller's data was erased")
    return Response(status_code=204)


def _erasers(context: AppContext) -> list[Eraser]:
    """The stores of the application holding a user's data, in the order they are erased."""
    services = context.current
    erasers: list[Eraser] = []
    if services.runs is not None:
        erasers.append(("stored runs", services.runs.delete_user_runs))
    if services.memory is not None:
        erasers.append(("long-term memory", services.memory.delete_user_memory))
    if services.state is not None:
        erasers.append(("agent state", services.state.delete_user_state))
    erasers.append(("sessions", context.session_history.delete_user_sessions))
    if context.idempotency is not None:
        erasers.append(("Idempotency-Key records", context.idempotency.delete_user_records))
    if services.sandbox is not None:
        erasers.append(("sandboxes", services.sandbox.release_user_async))
    return erasers


def _not_all_erased(failed: list[tuple[str, Exception]]) -> Exception:
    """The error answering an erase that ``failed`` in some stores (what each holds, and
    its error): the first whose retry may succeed (a method not implemented stays so),
    its message naming every store not erased; the others are logged."""
    answered = min(failed, key=lambda f: isinstance(f[1], MethodNotImplementedError))[1]
    for what, exc in failed:
        if exc is not answered:
            logger.error(
                "could not erase a user's data",
                exc_info=exc,
                extra={"store": what, "error": type(exc).__name__},
            )
    if isinstance(answered, AgentScopeServerlessError):
        not_erased = ", ".join(what for what, _ in failed)
        answered.message = (
            f"could not erase the caller's {not_erased} (the rest of their data is erased): "
            f"{answered.message}"
        )
    return answered

"""The agent state interface, and the behaviour every backend shares.

State is a JSON-serialisable dict kept per user, session (``"default"`` when none is
given) and round. Rounds are numbered from 1; a save without ``round_id`` gets the next
round atomically.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from typing import Any

from agentscope_serverless.errors import ConflictError, InvalidInputError
from agentscope_serverless.log import logger
from agentscope_serverless.services._once import next_write_id
from agentscope_serverless.services._ported import (
    STATE_HOOKS,
    STATE_METHODS,
    adapt_ported_subclass,
    agentscope_base_method,
)
from agentscope_serverless.services._validation import (
    json_copy,
    require_positive_int,
    require_user_id,
    session_id_or_default,
)
from agentscope_serverless.services.base import (
    ServiceWithLifecycleManager,
    StartedGuard,
    service_call,
)

# Round ids are exact integers in every store (JSON numbers, Redis scores, DynamoDB).
MAX_ROUND_ID = 2**53 - 1


def stored_state(body: str | bytes, session_id: str, round_id: int) -> dict[str, Any] | None:
    """The state stored as ``body``; None (as AgentScope Runtime's ``export_state`` gives
    for corrupt data) when it is not a JSON object: written by hand, or by another writer.
    A warning names the session and round, not the data.

    >>> stored_state('{"step": 1}', "s1", 1)
    {'step': 1}
    >>> stored_state("not json{", "s1", 1) is None
    True
    """
    try:
        state = json.loads(body)
    except (ValueError, RecursionError):  # not JSON (or not UTF-8), too deep
        state = None
    if isinstance(state, dict):
        return state
    logger.warning(
        "a stored state is not a JSON object: read as none",
        extra={"session_id": session_id, "round_id": round_id},
    )
    return None


def rounds_exhausted() -> ConflictError:
    """The error of a save that would allocate the round after :data:`MAX_ROUND_ID`."""
    return ConflictError(
        f"the session has a round {MAX_ROUND_ID}, the largest round id, so there is no "
        "next round to save in: give round_id"
    )


class StateService(StartedGuard, ServiceWithLifecycleManager):
    """Serialisable agent state by user, session and round.

    >>> async def demo(state: StateService) -> None:
    ...     round_id = await state.save_state("u1", {"step": 3}, session_id="s1")
    ...     assert await state.export_state("u1", session_id="s1") == {"step": 3}

    Every backend stores a copy (as JSON) and returns a copy: mutating what you passed in
    or got back never changes what is stored.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A backend written for AgentScope Runtime overrides the public methods instead.
        adapt_ported_subclass(cls, StateService, STATE_METHODS, STATE_HOOKS)

    @agentscope_base_method
    @service_call
    async def save_state(
        self,
        user_id: str,
        state: dict[str, Any],
        session_id: str | None = None,
        round_id: int | None = None,
    ) -> int:
        """Store ``state`` and return its round id.

        Without ``round_id`` the next round is allocated atomically (concurrent saves get
        distinct rounds); with it, that round is overwritten.
        """
        user_id = require_user_id(user_id)
        if not isinstance(state, dict):
            raise InvalidInputError(
                f"state must be a dict, got {type(state).__name__}", field="state"
            )
        stored = json_copy(state, field="state")
        sid = session_id_or_default(session_id)
        if round_id is None:
            # Under an Idempotency-Key the save is keyed: its run again (after a store
            # froze mid-write) gets the round of the first, and stores no second round.
            return await self._save_next(user_id, sid, stored, next_write_id())
        round_id = require_positive_int(round_id, field="round_id", maximum=MAX_ROUND_ID)
        await self._save_round(user_id, sid, round_id, stored)
        return round_id

    @agentscope_base_method
    @service_call
    async def export_state(
        self, user_id: str, session_id: str | None = None, round_id: int | None = None
    ) -> dict[str, Any] | None:
        """A copy of the state of ``round_id`` (the latest round by default), or None."""
        user_id = require_user_id(user_id)
        sid = session_id_or_default(session_id)
        if round_id is not None:
            round_id = require_positive_int(round_id, field="round_id", maximum=MAX_ROUND_ID)
        saved = await self._load(user_id, sid, round_id)
        return None if saved is None else saved[1]

    @service_call
    async def export_latest_state(
        self, user_id: str, session_id: str | None = None
    ) -> tuple[int | None, dict[str, Any]] | None:
        """The latest round of the session and a copy of its state, read together; None
        when the session has no state. The round is None when the service cannot tell it:
        one written for AgentScope Runtime, whose ``export_state()`` gives the state only.

        One read whatever the number of rounds (listing the rounds to pick the last would
        read them all).

        >>> async def latest(state: StateService) -> None:
        ...     round_id, saved = await state.export_latest_state("u1", session_id="s1")
        """
        user_id = require_user_id(user_id)
        return await self._load(user_id, session_id_or_default(session_id), None)

    @service_call
    async def list_rounds(self, user_id: str, session_id: str | None = None) -> list[int]:
        """The round ids stored for the session, ascending."""
        user_id = require_user_id(user_id)
        return await self._list_rounds(user_id, session_id_or_default(session_id))

    @service_call
    async def delete_state(self, user_id: str, session_id: str | None = None) -> None:
        """Delete every round of the session's state; no error when there is none."""
        user_id = require_user_id(user_id)
        await self._delete(user_id, session_id_or_default(session_id))

    @service_call
    async def delete_user_state(self, user_id: str) -> None:
        """Delete the state of every session of ``user_id``, at once."""
        await self._delete_user_state(require_user_id(user_id))

    @abstractmethod
    async def _delete_user_state(self, user_id: str) -> None:
        """Remove every round of every session of the user."""

    @abstractmethod
    async def _save_next(
        self, user_id: str, session_id: str, state: dict[str, Any], write_id: str | None
    ) -> int:
        """Atomically allocate the round after the highest one and store ``state`` there;
        raise :func:`rounds_exhausted` (storing nothing) when the highest is the last.

        With a ``write_id`` already applied to the session (and remembered for
        :data:`~agentscope_serverless.services._once.WRITE_ID_SECONDS`), store ``state``
        in that write's round instead and return it; the id is recorded atomically with
        the round it names.
        """

    @abstractmethod
    async def _save_round(
        self, user_id: str, session_id: str, round_id: int, state: dict[str, Any]
    ) -> None:
        """Store ``state`` as round ``round_id``, replacing what was there."""

    @abstractmethod
    async def _load(
        self, user_id: str, session_id: str, round_id: int | None
    ) -> tuple[int | None, dict[str, Any]] | None:
        """The round (the highest when None) with a fresh copy of its state, or None."""

    @abstractmethod
    async def _list_rounds(self, user_id: str, session_id: str) -> list[int]:
        """Stored round ids, ascending."""

    @abstractmethod
    async def _delete(self, user_id: str, session_id: str) -> None:
        """Remove every round of the session."""


__all__ = ["MAX_ROUND_ID", "StateService", "rounds_exhausted", "stored_state"]

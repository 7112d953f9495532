"""Agent state in the process's memory: the embedded default for local runs and tests."""

from __future__ import annotations

import copy
from typing import Any

from agentscope_serverless.services.agent_state.base import (
    MAX_ROUND_ID,
    StateService,
    rounds_exhausted,
)


class InMemoryStateService(StateService):
    """State kept in a dict: ``{user_id: {session_id: {round_id: state}}}``.

    >>> state = InMemoryStateService()
    """

    def __init__(self) -> None:
        self._states: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
        # user -> (session, write id) -> round (the saves made under an Idempotency-Key)
        self._applied: dict[str, dict[tuple[str, str], int]] = {}

    def _rounds(self, user_id: str, session_id: str) -> dict[int, dict[str, Any]]:
        return self._states.setdefault(user_id, {}).setdefault(session_id, {})

    async def _save_next(
        self, user_id: str, session_id: str, state: dict[str, Any], write_id: str | None
    ) -> int:
        rounds = self._rounds(user_id, session_id)
        applied = self._applied.get(user_id, {})
        if write_id is not None and (session_id, write_id) in applied:
            round_id = applied[session_id, write_id]
        else:
            round_id = max(rounds, default=0) + 1
            if round_id > MAX_ROUND_ID:
                raise rounds_exhausted()
        rounds[round_id] = state
        if write_id is not None:
            self._applied.setdefault(user_id, {})[session_id, write_id] = round_id
        return round_id

    async def _save_round(
        self, user_id: str, session_id: str, round_id: int, state: dict[str, Any]
    ) -> None:
        self._rounds(user_id, session_id)[round_id] = state

    async def _load(
        self, user_id: str, session_id: str, round_id: int | None
    ) -> tuple[int, dict[str, Any]] | None:
        rounds = self._states.get(user_id, {}).get(session_id, {})
        if round_id is None:
            round_id = max(rounds, default=None)
        state = rounds.get(round_id) if round_id is not None else None
        if round_id is None or state is None:
            return None
        return round_id, copy.deepcopy(state)

    async def _list_rounds(self, user_id: str, session_id: str) -> list[int]:
        return sorted(self._states.get(user_id, {}).get(session_id, {}))

    async def _delete_user_state(self, user_id: str) -> None:
        self._states.pop(user_id, None)
        self._applied.pop(user_id, None)

    async def _delete(self, user_id: str, session_id: str) -> None:
        sessions = self._states.get(user_id)
        if sessions is not None:
            sessions.pop(session_id, None)
            applied = self._applied.get(user_id, {})
            for mark in [mark for mark in applied if mark[0] == session_id]:
                del applied[mark]
            if not sessions:  # nothing of the user's is left
                del self._states[user_id]
                self._applied.pop(user_id, None)


__all__ = ["InMemoryStateService"]

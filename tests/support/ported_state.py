"""A state service written for AgentScope Runtime 1.0.5, as its users write one for a store
of theirs: a subclass of ``StateService`` overriding ``save_state`` and ``export_state``
only (AgentScope's abstract methods), keeping rounds in a dict."""

from __future__ import annotations

import copy
from typing import Any

from agentscope_serverless.services.agent_state import StateService


class DictStateService(StateService):
    def __init__(self) -> None:
        self.rounds: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def health(self) -> bool:
        return True

    async def save_state(
        self,
        user_id: str,
        state: dict[str, Any],
        session_id: str | None = None,
        round_id: int | None = None,
    ) -> int:
        rounds = self.rounds.setdefault((user_id, session_id or "default"), {})
        round_id = round_id or max(rounds, default=0) + 1
        rounds[round_id] = copy.deepcopy(state)
        return round_id

    async def export_state(
        self, user_id: str, session_id: str | None = None, round_id: int | None = None
    ) -> dict[str, Any] | None:
        rounds = self.rounds.get((user_id, session_id or "default"), {})
        if not rounds:
            return None
        return copy.deepcopy(rounds.get(round_id or max(rounds)))

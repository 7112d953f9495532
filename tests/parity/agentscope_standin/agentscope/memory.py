"""``MemoryBase``: the interface of AgentScope memories."""

from __future__ import annotations

from typing import Any


class MemoryBase:
    """As in agentscope 1.0.21: marks (the ReActAgent's hints), and ``delete_by_mark``
    left to the subclass."""

    def __init__(self) -> None:
        self._compressed_summary = ""

    async def add(self, memories: Any, marks: str | list[str] | None = None, **kwargs: Any) -> None:
        raise NotImplementedError

    async def delete(self, msg_ids: list[str], **kwargs: Any) -> int:
        raise NotImplementedError

    async def delete_by_mark(self, mark: str | list[str], *args: Any, **kwargs: Any) -> int:
        raise NotImplementedError(f"delete_by_mark is not implemented in {type(self).__name__}")

    async def update_messages_mark(
        self,
        new_mark: str | None,
        old_mark: str | None = None,
        msg_ids: list[str] | None = None,
    ) -> int:
        raise NotImplementedError

    async def update_compressed_summary(self, summary: str) -> None:
        self._compressed_summary = summary

    async def get_memory(
        self,
        mark: str | None = None,
        exclude_mark: str | None = None,
        prepend_summary: bool = True,
        **kwargs: Any,
    ) -> list[Any]:
        raise NotImplementedError

    async def size(self) -> int:
        raise NotImplementedError

    async def clear(self) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        pass


class LongTermMemoryBase:
    """AgentScope's long-term memory: ``record``/``retrieve`` and the agent's tools."""

    def __init__(self) -> None:
        pass

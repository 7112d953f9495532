"""``MemoryBase``: the interface of AgentScope memories."""

from __future__ import annotations

from typing import Any


class MemoryBase:
    def __init__(self) -> None:
        pass

    async def add(self, memories: Any, allow_duplicates: bool = False) -> None:
        raise NotImplementedError

    async def get_memory(self) -> list[Any]:
        raise NotImplementedError

    async def size(self) -> int:
        raise NotImplementedError

    async def clear(self) -> None:
        raise NotImplementedError

    async def delete(self, index: Any) -> None:
        raise NotImplementedError

    async def retrieve(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        pass


class LongTermMemoryBase:
    """AgentScope's long-term memory: ``record``/``retrieve`` and the agent's tools."""

    def __init__(self) -> None:
        pass

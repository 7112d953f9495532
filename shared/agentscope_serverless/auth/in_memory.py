"""Keys in the process's memory: for tests and the development server."""

from __future__ import annotations

from agentscope_serverless.auth.base import KeyStore
from agentscope_serverless.auth.keys import KeyRecord


class InMemoryKeyStore(KeyStore):
    """Key records in a dict; they live as long as the object.

    >>> store = InMemoryKeyStore()
    """

    def __init__(self) -> None:
        self._records: dict[str, KeyRecord] = {}

    async def _get(self, key_id: str) -> KeyRecord | None:
        return self._records.get(key_id)

    async def _put(self, record: KeyRecord) -> None:
        self._records[record.key_id] = record

    async def _revoke(self, key_id: str) -> KeyRecord | None:
        record = self._records.get(key_id)
        if record is not None:
            record = self._records[key_id] = record.model_copy(update={"revoked": True})
        return record

    async def _list(self) -> list[KeyRecord]:
        return list(self._records.values())


__all__ = ["InMemoryKeyStore"]

"""Keys in a DynamoDB table: for a deployed stack, managed with the ``agentscope-serverless keys``
CLI (``AUTH_KEYS_BACKEND=dynamodb``, ``AUTH_KEYS_TABLE``).

One item per key, partition key ``key_id`` (string), with ``key_hash`` (SHA-256 of the
secret, never the secret), ``kind``, ``user_id`` (user keys), ``created_at`` and ``revoked``
(a Boolean; set by hand as ``"true"`` or ``1`` it revokes the key, as in a key file).

**Cache.** A Lambda should not read DynamoDB on every request, so the records read by
:meth:`authenticate` are kept in the process for ``cache_seconds`` (``AUTH_KEYS_CACHE_SECONDS``,
30 s by default; 0 turns the cache off). Only records found are cached (a key created a
moment ago works at once), and the secret is still checked against the cached hash on every
request. A revoke made through this object takes effect at once; one made elsewhere (the
CLI, another Lambda instance) takes effect in every process within ``cache_seconds``.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from agentscope_serverless.auth.base import KeyStore
from agentscope_serverless.auth.keys import KEY_ID_PATTERN, KeyRecord
from agentscope_serverless.errors import ConflictError, StoreUnavailableError
from agentscope_serverless.services._dynamodb import (
    ConditionFailed,
    DynamoDBBackedService,
    DynamoDBClient,
    DynamoDBStore,
    Item,
    n,
    s,
)

DEFAULT_CACHE_SECONDS = 30.0
CACHE_SIZE = 1024


def _item(record: KeyRecord) -> Item:
    item: Item = {
        "key_id": s(record.key_id),
        "key_hash": s(record.key_hash),
        "kind": s(record.kind),
        "created_at": n(record.created_at),
        "revoked": {"BOOL": record.revoked},
    }
    if record.user_id is not None:
        item["user_id"] = s(record.user_id)
    return item


def _record(item: Item) -> KeyRecord:
    """The key record an item holds; an item none can be read from (edited by hand) is
    refused as a malformed record of a key file is, naming its key id and the attribute at
    fault, never a value."""
    try:
        return KeyRecord(
            key_id=_attribute(item, "key_id", "S"),
            key_hash=_attribute(item, "key_hash", "S"),
            kind=_attribute(item, "kind", "S"),
            user_id=_attribute(item, "user_id", "S") if "user_id" in item else None,
            created_at=_created_at(item),
            revoked=_revoked(item),
        )
    except ValidationError as exc:
        fault = "; ".join(f"{_place(error['loc'])}: {error['msg']}" for error in exc.errors())
    except _MalformedAttribute as exc:
        fault = str(exc)
    key_id = item.get("key_id")
    key_id = key_id.get("S") if isinstance(key_id, dict) else None
    if isinstance(key_id, str) and re.fullmatch(KEY_ID_PATTERN, key_id):
        which = f"key_id {key_id}"
    else:
        # Not shown: it may be a whole key pasted where its id goes, its secret in clear.
        which = "one whose key_id is not a key id"
    raise StoreUnavailableError("key table", f"it holds a malformed item, {which} ({fault})")


class _MalformedAttribute(Exception):
    """An attribute of a key item is missing or of the wrong type: the message says which."""


def _attribute(item: Item, name: str, kind: str) -> Any:
    value = item.get(name)
    if not isinstance(value, dict) or kind not in value:
        raise _MalformedAttribute(f"{name}: missing, or not of type {kind}")
    return value[kind]


def _created_at(item: Item) -> int:
    created_at = _attribute(item, "created_at", "N")
    try:
        return int(created_at)
    except ValueError:
        raise _MalformedAttribute("created_at: not a whole number") from None


def _place(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "item"


def _revoked(item: Item) -> Any:
    """The item's ``revoked`` flag as the key record reads it, whatever type it was given.

    One revoking a key by hand (the console, the AWS CLI) may type it as a string or a
    number: ``"true"`` or ``1`` revokes it, as in a key file; a value read as neither true
    nor false (``"2"``, a list) makes the item malformed, never an active key.
    """
    value = item.get("revoked")
    if value is None:
        return False
    if "BOOL" in value:
        return value["BOOL"]
    if "S" in value:
        return value["S"]
    if "N" in value:
        try:
            return Decimal(value["N"])
        except ArithmeticError:
            raise _MalformedAttribute("revoked: not a number") from None
    raise _MalformedAttribute("revoked: neither a Boolean, a string nor a number")


class DynamoDBKeyStore(DynamoDBBackedService, KeyStore):
    """Key records in the DynamoDB table ``table_name``, cached briefly (see the module).

    >>> store = DynamoDBKeyStore("agentscope-api-keys", region_name="eu-west-1")

    Takes the connection arguments of the DynamoDB services (``client``, ``endpoint_url``,
    ``region_name``, credentials).
    """

    def __init__(
        self,
        table_name: str = "agentscope-api-keys",
        *,
        client: DynamoDBClient | None = None,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
    ) -> None:
        if cache_seconds < 0:
            raise ValueError("cache_seconds must not be negative")
        self._store = DynamoDBStore(
            table_name=table_name,
            setting="AUTH_KEYS_TABLE",
            client=client,
            endpoint_url=endpoint_url,
            region_name=region_name,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
        )
        self.cache_seconds = cache_seconds
        self._cache: OrderedDict[str, tuple[float, KeyRecord]] = OrderedDict()
        # Counts the revokes made through this object: a read that overlapped one may hold
        # the record as it was before, so it is not cached.
        self._revokes = 0

    @property
    def table_name(self) -> str:
        """The table holding the keys."""
        return self._store.table_name

    async def stop(self) -> None:
        self._cache.clear()
        await super().stop()

    async def _get(self, key_id: str) -> KeyRecord | None:
        cached = self._cache.get(key_id)
        if cached is not None and cached[0] > time.monotonic():
            self._cache.move_to_end(key_id)
            return cached[1]
        self._cache.pop(key_id, None)
        revokes = self._revokes
        response = await self._store.run(
            "get_item", idempotent=True, Key={"key_id": s(key_id)}, ConsistentRead=True
        )
        item = response.get("Item")
        if item is None:
            return None
        record = _record(item)
        if self.cache_seconds > 0 and revokes == self._revokes:
            self._cache[key_id] = (time.monotonic() + self.cache_seconds, record)
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return record

    async def _put(self, record: KeyRecord) -> None:
        try:
            await self._store.run(
                "put_item",
                idempotent=False,
                Item=_item(record),
                ConditionExpression="attribute_not_exists(key_id)",
            )
        except ConditionFailed:
            raise ConflictError("a key with this id exists already; create the key again") from None

    async def _revoke(self, key_id: str) -> KeyRecord | None:
        try:
            response = await self._store.run(
                "update_item",
                idempotent=True,
                Key={"key_id": s(key_id)},
                UpdateExpression="SET revoked = :revoked",
                ConditionExpression="attribute_exists(key_id)",
                ExpressionAttributeValues={":revoked": {"BOOL": True}},
                ReturnValues="ALL_NEW",
            )
        except ConditionFailed:
            return None
        finally:
            self._revokes += 1
            self._cache.pop(key_id, None)
        return _record(response["Attributes"])

    async def _list(self) -> list[KeyRecord]:
        records: list[KeyRecord] = []
        kwargs: dict[str, Any] = {"ConsistentRead": True}
        while True:
            page = await self._store.run("scan", idempotent=True, **kwargs)
            records.extend(_record(item) for item in page.get("Items", []))
            if not page.get("LastEvaluatedKey"):
                return records
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


__all__ = ["DEFAULT_CACHE_SECONDS", "DynamoDBKeyStore"]

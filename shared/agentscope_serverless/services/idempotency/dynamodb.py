"""Idempotency records on DynamoDB, in the session table, claimed by a conditional write.

Item: pk ``IDEMPOTENCY#<sha256 of the user id>``, sk ``KEY#<sha256 of the key>``, with
``fingerprint``, ``state``, ``lease_until``, ``token``, ``response``, ``seed`` and
``expires_at`` (the table's TTL attribute; expired records are ignored before DynamoDB
deletes them). A key with no live record is claimed by a conditional put (a new seed); a
live one released, or whose lease lapsed, by a conditional update keeping its seed.
A completed record that wrote in a session holds the session's hash in ``session`` and its
id in ``session_id`` (to ask whether it still exists before a replay), and is listed by an
item in the same partition, sk ``SESSION#<sha256 of the session id>#<sha256 of the key>``,
for deleting the session.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import replace
from typing import Any

from agentscope_serverless.services._dynamodb import (
    ConditionFailed,
    DynamoDBBackedService,
    DynamoDBStore,
    Item,
    id_hash,
    is_live,
    n,
    names,
    now,
    number,
    s,
)
from agentscope_serverless.services.idempotency.base import (
    COMPLETED,
    IN_PROGRESS,
    KEPT,
    RELEASED,
    IdempotencyRecord,
    IdempotencyStore,
    now_ms,
)

# The key has no live record: none, or an expired one.
_UNCLAIMED = "attribute_not_exists(#pk) OR #e < :now"
# The key's live record is free: released, or a lapsed lease of the same request.
_TAKEN_OVER = (
    "#e >= :now AND (#st = :released "
    "OR (#st = :progress AND lease_until < :now_ms AND fingerprint = :fp))"
)


class DynamoDBIdempotencyStore(DynamoDBBackedService, IdempotencyStore):
    """Idempotency records in a DynamoDB table (the session table in the cloud).

    >>> records = DynamoDBIdempotencyStore("agentscope-sessions", region_name="eu-west-1")
    """

    def __init__(
        self,
        table_name: str = "agentscope-sessions",
        *,
        expiry_seconds: int = 24 * 3600,
        lease_seconds: float = 60.0,
        **store_options: Any,
    ) -> None:
        IdempotencyStore.__init__(self, expiry_seconds, lease_seconds)
        self._store = DynamoDBStore(
            table_name=table_name, setting="DYNAMODB_SESSIONS_TABLE", **store_options
        )

    @staticmethod
    def _item_key(user_id: str, key: str) -> Item:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return {"pk": s(f"IDEMPOTENCY#{id_hash(user_id)}"), "sk": s(f"KEY#{digest}")}

    @staticmethod
    def _listing_prefix(session_id: str) -> str:
        return f"SESSION#{id_hash(session_id)}#"

    async def _claim(self, user_id: str, key: str, record: IdempotencyRecord) -> IdempotencyRecord:
        item_key = self._item_key(user_id, key)
        while True:
            at = now()
            item: Item = {
                **item_key,
                "fingerprint": s(record.fingerprint),
                "state": s(IN_PROGRESS),
                "lease_until": n(record.lease_until_ms),
                "token": s(record.token),
                "seed": s(record.seed),
                "expires_at": n(at + self.held_seconds),
            }
            with contextlib.suppress(ConditionFailed):
                await self._store.run(
                    "put_item",
                    idempotent=False,
                    Item=item,
                    ConditionExpression=_UNCLAIMED,
                    ExpressionAttributeNames=names("#pk", "#e"),
                    ExpressionAttributeValues={":now": n(at)},
                )
                return record
            with contextlib.suppress(ConditionFailed):
                return await self._take_over(item_key, record, at)
            response = await self._store.run(
                "get_item", idempotent=True, Key=item_key, ConsistentRead=True
            )
            existing: Item | None = response.get("Item")
            # Else expired, or released, since: the next round claims it.
            if (
                existing is not None
                and is_live(existing, now())
                and existing["state"]["S"] != RELEASED
            ):
                return IdempotencyRecord(
                    existing["fingerprint"]["S"],
                    existing["state"]["S"],
                    number(existing, "lease_until"),
                    existing["token"]["S"],
                    existing.get("response", {}).get("S"),
                    existing.get("session_id", {}).get("S"),
                )

    async def _take_over(
        self, item_key: Item, record: IdempotencyRecord, at: int
    ) -> IdempotencyRecord:
        """Claim the key's live record if it is free (:data:`_TAKEN_OVER`), keeping its seed
        (taking ``record``'s when it has none); raise ``ConditionFailed`` when it is not."""
        response = await self._store.run(
            "update_item",
            idempotent=False,
            Key=item_key,
            UpdateExpression=(
                "SET fingerprint = :fp, #st = :progress, lease_until = :lease, #t = :token, "
                "#e = :e, #seed = if_not_exists(#seed, :seed)"
            ),
            ConditionExpression=_TAKEN_OVER,
            ExpressionAttributeNames={
                **names("#e"),
                "#st": "state",
                "#t": "token",
                "#seed": "seed",
            },
            ExpressionAttributeValues={
                ":fp": s(record.fingerprint),
                ":progress": s(IN_PROGRESS),
                ":lease": n(record.lease_until_ms),
                ":token": s(record.token),
                ":e": n(at + self.expiry_seconds),
                ":seed": s(record.seed),
                ":now": n(at),
                ":now_ms": n(now_ms()),
                ":released": s(RELEASED),
            },
            ReturnValues="ALL_NEW",
        )
        return replace(record, seed=response["Attributes"]["seed"]["S"])

    async def _renew(self, user_id: str, key: str, token: str, lease_until_ms: int) -> None:
        try:
            await self._store.run(
                "update_item",
                idempotent=True,
                Key=self._item_key(user_id, key),
                UpdateExpression="SET lease_until = :lease, #e = :e",
                ConditionExpression="#t = :token AND #st = :progress AND lease_until < :lease",
                ExpressionAttributeNames={"#t": "token", "#st": "state", "#e": "expires_at"},
                ExpressionAttributeValues={
                    ":lease": n(lease_until_ms),
                    ":e": n(now() + self.held_seconds),
                    ":token": s(token),
                    ":progress": s(IN_PROGRESS),
                },
            )
        except ConditionFailed:
            return

    async def _complete(
        self, user_id: str, key: str, token: str, response: str, session_id: str | None
    ) -> None:
        item_key = self._item_key(user_id, key)
        expires_at = n(now() + self.expiry_seconds)
        update = "SET #st = :done, #r = :response, lease_until = :zero, #e = :e"
        session: Item = {}
        if session_id is not None:
            # Listed first: a record kept but not listed would outlive its session.
            digest = item_key["sk"]["S"].removeprefix("KEY#")
            listing = s(self._listing_prefix(session_id) + digest)
            await self._store.put([{"pk": item_key["pk"], "sk": listing, "expires_at": expires_at}])
            update += ", #sess = :session, session_id = :session_id"
            session = {":session": s(id_hash(session_id)), ":session_id": s(session_id)}
        try:
            await self._store.run(
                "update_item",
                idempotent=True,
                Key=item_key,
                UpdateExpression=update,
                ConditionExpression="#t = :token",
                ExpressionAttributeNames={
                    **names("#e"),
                    "#st": "state",
                    "#r": "response",
                    "#t": "token",
                    **({"#sess": "session"} if session else {}),
                },
                ExpressionAttributeValues={
                    ":done": s(COMPLETED),
                    ":response": s(response),
                    ":zero": n(0),
                    ":e": expires_at,
                    ":token": s(token),
                    **session,
                },
            )
        except ConditionFailed:
            return

    async def _abandon(self, user_id: str, key: str, token: str) -> None:
        try:
            await self._store.run(
                "update_item",
                idempotent=True,
                Key=self._item_key(user_id, key),
                UpdateExpression="SET #st = :released, lease_until = :zero, #e = :e REMOVE #t",
                ConditionExpression="#t = :token",
                ExpressionAttributeNames={**names("#e"), "#st": "state", "#t": "token"},
                ExpressionAttributeValues={
                    ":released": s(RELEASED),
                    ":zero": n(0),
                    ":e": n(now() + self.expiry_seconds),
                    ":token": s(token),
                },
            )
        except ConditionFailed:
            return

    async def _forget(self, user_id: str, key: str, token: str, session_id: str | None) -> None:
        item_key = self._item_key(user_id, key)
        try:
            await self._store.run(
                "delete_item",
                idempotent=True,
                Key=item_key,
                ConditionExpression="#t = :token AND #st = :done",
                ExpressionAttributeNames={"#t": "token", "#st": "state"},
                ExpressionAttributeValues={":token": s(token), ":done": s(COMPLETED)},
            )
        except ConditionFailed:
            return
        if session_id is not None:
            digest = item_key["sk"]["S"].removeprefix("KEY#")
            listing = s(self._listing_prefix(session_id) + digest)
            await self._store.delete([{"pk": item_key["pk"], "sk": listing}])

    async def _delete_user(self, user_id: str) -> None:
        await self._store.delete_partition(f"IDEMPOTENCY#{id_hash(user_id)}")

    async def _keep(self, user_id: str, key: str, value: str) -> None:
        item: Item = {
            **self._item_key(user_id, key),
            "state": s(KEPT),
            "response": s(value),
            "expires_at": n(now() + self.expiry_seconds),
        }
        await self._store.run("put_item", idempotent=True, Item=item)

    async def _take(self, user_id: str, key: str) -> str | None:
        try:
            response = await self._store.run(
                "delete_item",
                idempotent=False,
                Key=self._item_key(user_id, key),
                ConditionExpression="#st = :kept AND #e >= :now",
                ExpressionAttributeNames={**names("#e"), "#st": "state"},
                ExpressionAttributeValues={":kept": s(KEPT), ":now": n(now())},
                ReturnValues="ALL_OLD",
            )
        except ConditionFailed:
            return None
        value: str = response["Attributes"]["response"]["S"]
        return value

    async def _delete_session(self, user_id: str, session_id: str) -> None:
        pk = s(f"IDEMPOTENCY#{id_hash(user_id)}")
        prefix = self._listing_prefix(session_id)
        listings = [
            {"pk": item["pk"], "sk": item["sk"]}
            async for item in self._store.query(
                KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
                ExpressionAttributeValues={":pk": pk, ":prefix": s(prefix)},
                ProjectionExpression="pk, sk",
                ConsistentRead=True,
            )
        ]
        for listing in listings:
            digest = listing["sk"]["S"].removeprefix(prefix)
            # Unless claimed again since (once expired) by a request in another session.
            with contextlib.suppress(ConditionFailed):
                await self._store.run(
                    "delete_item",
                    idempotent=True,
                    Key={"pk": pk, "sk": s(f"KEY#{digest}")},
                    ConditionExpression="#sess = :session",
                    ExpressionAttributeNames={"#sess": "session"},
                    ExpressionAttributeValues={":session": s(id_hash(session_id))},
                )
        if listings:
            await self._store.delete(listings)


__all__ = ["DynamoDBIdempotencyStore"]

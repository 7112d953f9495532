"""Agent state on DynamoDB: one partition per user and session, one item per round.

Table (see :mod:`agentscope_serverless.infra.dynamodb_tables`), with ``U``/``S`` the
SHA-256 of the user and session ids:

=================  =====================  ==============================================
pk                 sk                     attributes
=================  =====================  ==============================================
``STATE#U#S``      ``META``               ``user_id``, ``session_id``, ``max_round``,
                                          ``generation``, ``expires_at``, ``stamped_until``
``STATE#U#S``      ``R#<gen>#<round>``    one round: ``body`` (state JSON), ``expires_at``
                                          (larger ones: head plus tail items)
``STATE#U#S``      ``APPLIED#<write id>``  ``round``, ``generation``, ``expires_at``: a save
                                          made under an Idempotency-Key, and the round it
                                          got (in the meta item's generation)
``STATE_USER#U``   ``S#<S>``              ``state_pk``, ``expires_at``: the user's index of
                                          sessions with state (written once per session,
                                          at its first save; the meta item is then marked
                                          ``indexed``), expiring as the rounds do
=================  =====================  ==============================================

- **Save without a round**: one ``UpdateItem ADD max_round 1`` on the meta item allocates
  the round atomically (concurrent saves get distinct rounds), then ``PutItem`` stores it.
- **Keyed save without a round** (under an ``Idempotency-Key``): a consistent read of its
  ``APPLIED#`` item gives the round of an earlier run; otherwise a round is allocated and
  the item is put only if absent (a run that lost that race takes the winner's round,
  leaving a gap), *before* the state is written. Whatever step a store failure cut, a run
  again stores the state in one round.
- **Save with a round**: the state overwrites that round; ``max_round`` is raised with a
  conditional update when the round is higher, so the next allocated round follows it.
- **Export**: ``GetItem`` of the meta item, then a ``Query`` (the latest round: in reverse
  order, stopping at the first complete round).
- **Delete** removes the meta item and the session's index item in one transaction (the
  state is gone at once, and a save making it again indexes it anew), then the rounds and
  the ``APPLIED#`` items of every generation but that of a meta item made again meanwhile
  (so a delete cut short by a store failure finishes when retried); a save that lands after
  the meta item went sees it gone, or of another generation, and deletes its round. A keyed
  save run again after the delete takes a round of the new state.
- **Delete a user's state**: the meta items of every indexed session in one transaction
  (up to 100 items: the state is gone at once), then the rounds (16 sessions at once) and
  the index; a session whose state a save made again meanwhile gets its index item back.
- **TTL** (``ttl_seconds``): a sliding expiry of the session's state, refreshed by every
  read and write; see :mod:`agentscope_serverless.services._dynamodb`. The session's index
  item is stamped and restamped with its rounds: it outlives the state, and goes after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any

from agentscope_serverless.services._dynamodb import (
    LIVE,
    ConditionFailed,
    DynamoDBBackedService,
    DynamoDBClient,
    DynamoDBStore,
    Item,
    assemble,
    body_items,
    gather_bounded,
    id_hash,
    is_live,
    iterate,
    n,
    names,
    new_generation,
    now,
    number,
    position_key,
    position_of,
    s,
    tail_keys,
    take,
)
from agentscope_serverless.services._once import WRITE_ID_SECONDS
from agentscope_serverless.services._validation import optional_ttl_seconds
from agentscope_serverless.services.agent_state.base import (
    MAX_ROUND_ID,
    StateService,
    rounds_exhausted,
    stored_state,
)

# How many sessions' state a delete of a user's state deletes at once.
_CONCURRENCY = 16


class DynamoDBStateService(DynamoDBBackedService, StateService):
    """Agent state on a DynamoDB table (the cloud default).

    >>> state = DynamoDBStateService("agentscope-state", region_name="eu-west-1")

    Takes the same connection arguments as
    :class:`~agentscope_serverless.services.session_history.dynamodb.DynamoDBSessionHistoryService`.
    """

    def __init__(
        self,
        table_name: str = "agentscope-state",
        *,
        client: DynamoDBClient | None = None,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        ttl_seconds: int | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 10.0,
    ) -> None:
        self._store = DynamoDBStore(
            table_name=table_name,
            setting="DYNAMODB_STATE_TABLE",
            client=client,
            endpoint_url=endpoint_url,
            region_name=region_name,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )
        self._ttl = optional_ttl_seconds(ttl_seconds)

    @staticmethod
    def _pk(user_id: str, session_id: str) -> str:
        return f"STATE#{id_hash(user_id)}#{id_hash(session_id)}"

    @staticmethod
    def _index_key(user_id: str, session_id: str) -> Item:
        """The key of the session's item in the user's index."""
        return {"pk": s(f"STATE_USER#{id_hash(user_id)}"), "sk": s(f"S#{id_hash(session_id)}")}

    @staticmethod
    def _prefix(meta: Item) -> str:
        return f"R#{meta['generation']['S']}#"

    # --- the meta item ------------------------------------------------------------------

    async def _live_meta(self, pk: str, index: Item, *, allocate: bool) -> Item:
        """The meta item, created (or replaced, when expired) if needed; with ``allocate``
        its ``max_round`` is incremented. ``index``: the key of the session's index item."""
        while True:
            at = now()
            sets = ["#g = if_not_exists(#g, :generation)"]
            values = {":generation": s(new_generation()), ":now": n(at)}
            aliases = ["#g", "#e"]
            if self._ttl is not None:
                sets += ["#e = :expires", "#s = if_not_exists(#s, :stamped)"]
                values |= {":expires": n(at + self._ttl), ":stamped": n(at + 2 * self._ttl)}
                aliases.append("#s")
            update = "SET " + ", ".join(sets)
            if allocate:
                update += " ADD max_round :one"
                values[":one"] = n(1)
            try:
                response = await self._store.run(
                    "update_item",
                    idempotent=not allocate,
                    Key={"pk": s(pk), "sk": s("META")},
                    UpdateExpression=update,
                    ConditionExpression=LIVE,
                    ExpressionAttributeNames=names(*aliases),
                    ExpressionAttributeValues=values,
                    ReturnValues="ALL_NEW",
                )
            except ConditionFailed:
                await self._replace_expired(pk, at)
                continue
            meta: Item = response["Attributes"]
            await self._restamp_if_due(pk, index, meta)
            return meta

    async def _replace_expired(self, pk: str, at: int) -> None:
        try:
            await self._store.run(
                "delete_item",
                idempotent=True,
                Key={"pk": s(pk), "sk": s("META")},
                ConditionExpression="#e < :now",
                ExpressionAttributeNames=names("#e"),
                ExpressionAttributeValues={":now": n(at)},
            )
        except ConditionFailed:
            return

    async def _read_meta(self, pk: str, index: Item) -> Item | None:
        """The live meta item; with a TTL, reading it also refreshes its expiry."""
        meta = await self._store.read_container({"pk": s(pk), "sk": s("META")}, self._ttl)
        if meta is not None:
            await self._restamp_if_due(pk, index, meta)
        return meta

    async def _restamp_if_due(self, pk: str, index: Item, meta: Item) -> None:
        key = {"pk": s(pk), "sk": s("META")}
        await self._store.restamp_if_due(key, meta, pk, self._prefix(meta), self._ttl, index)

    # --- rounds -------------------------------------------------------------------------

    async def _write_round(self, pk: str, meta: Item, round_id: int, state: dict[str, Any]) -> None:
        extra: Item = {}
        if self._ttl is not None:
            extra["expires_at"] = n(now() + 2 * self._ttl)
        tails, head = body_items(
            pk, position_key(self._prefix(meta), round_id), json.dumps(state), extra
        )
        await self._store.put(tails)
        response = await self._store.run(
            "put_item", idempotent=True, Item=head, ReturnValues="ALL_OLD"
        )
        old = response.get("Attributes")
        if old is not None and old.get("version") != head.get("version"):
            stale = tail_keys(old)
            if stale:
                await self._store.delete(stale)
        if not await self._store.holds({"pk": s(pk), "sk": s("META")}, meta):
            # Deleted meanwhile, after its delete had listed the rounds: this round would
            # stay stored, reachable by no one.
            await self._store.delete([{"pk": head["pk"], "sk": head["sk"]}, *tail_keys(head)])

    def _range(self, pk: str, meta: Item) -> dict[str, Any]:
        prefix = self._prefix(meta)
        return {
            "KeyConditionExpression": "pk = :pk AND sk BETWEEN :low AND :high",
            "ExpressionAttributeValues": {
                ":pk": s(pk),
                ":low": s(prefix),
                ":high": s(f"{prefix}~"),
            },
            "ConsistentRead": True,
        }

    async def _round_body(self, pk: str, meta: Item, round_id: int) -> str | None:
        head = position_key(self._prefix(meta), round_id)
        items = self._store.query(
            KeyConditionExpression="pk = :pk AND sk BETWEEN :low AND :high",
            ExpressionAttributeValues={":pk": s(pk), ":low": s(head), ":high": s(f"{head}#~")},
            ConsistentRead=True,
        )
        bodies = [body async for _, body in assemble(items, now())]
        return bodies[0] if bodies else None

    async def _latest_body(self, pk: str, meta: Item) -> tuple[int, str] | None:
        newest = await take(self._bodies_newest_first(pk, meta), 1)
        return newest[0] if newest else None

    async def _bodies_newest_first(
        self, pk: str, meta: Item
    ) -> AsyncGenerator[tuple[int, str], None]:
        """Each round, newest first, with its state's JSON."""
        # In reverse key order a round's tails come before its head, which closes the round.
        at = now()
        prefix = self._prefix(meta)
        group: list[Item] = []
        async for item in self._store.query(
            **self._range(pk, meta), ScanIndexForward=False, Limit=8
        ):
            group.append(item)
            if "part" not in item:
                async for head, body in assemble(iterate(reversed(group)), at):
                    yield position_of(prefix, head["sk"]["S"]), body
                group = []

    # --- the service hooks --------------------------------------------------------------

    async def _index(self, user_id: str, session_id: str, meta: Item) -> None:
        """Record the session in the user's index, once (so the user's state can be found)."""
        if "indexed" in meta:
            return
        pk = self._pk(user_id, session_id)
        await self._store.put([self._index_item(user_id, session_id)])
        with contextlib.suppress(ConditionFailed):  # deleted meanwhile: nothing to mark
            await self._store.run(
                "update_item",
                idempotent=True,
                Key={"pk": s(pk), "sk": s("META")},
                UpdateExpression="SET #i = :true",
                ConditionExpression="#g = :generation",
                ExpressionAttributeNames=names("#i", "#g"),
                ExpressionAttributeValues={
                    ":true": {"BOOL": True},
                    ":generation": meta["generation"],
                },
            )

    def _index_item(self, user_id: str, session_id: str) -> Item:
        """The session's index item, expiring (with a TTL) when its rounds written now do."""
        item = {
            **self._index_key(user_id, session_id),
            "state_pk": s(self._pk(user_id, session_id)),
        }
        if self._ttl is not None:
            item["expires_at"] = n(now() + 2 * self._ttl)
        return item

    async def _delete_user_state(self, user_id: str) -> None:
        index = [
            item
            async for item in self._store.query(
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": s(f"STATE_USER#{id_hash(user_id)}")},
                ConsistentRead=True,
            )
        ]
        metas = [{"pk": item["state_pk"], "sk": s("META")} for item in index]
        await self._store.delete_together(metas)
        await gather_bounded(
            (self._store.delete_partition(item["state_pk"]["S"]) for item in index), _CONCURRENCY
        )
        if index:
            await self._store.delete([{"pk": item["pk"], "sk": item["sk"]} for item in index])
        # A save may have made a session's state again meanwhile, and indexed it before the
        # index item went: it keeps its index, so the user's next delete finds it.
        remade = await asyncio.gather(*(self._has_meta(item["state_pk"]) for item in index))
        kept = [item for item, found in zip(index, remade, strict=True) if found]
        if self._ttl is not None:
            # As written now: the one read may expire before the state made again.
            for item in kept:
                item["expires_at"] = n(now() + 2 * self._ttl)
        await self._store.put(kept)

    async def _has_meta(self, pk: Item) -> bool:
        response = await self._store.run(
            "get_item",
            idempotent=True,
            Key={"pk": pk, "sk": s("META")},
            ProjectionExpression="#pk",
            ExpressionAttributeNames=names("#pk"),
            ConsistentRead=True,
        )
        return "Item" in response

    async def _save_next(
        self, user_id: str, session_id: str, state: dict[str, Any], write_id: str | None
    ) -> int:
        pk = self._pk(user_id, session_id)
        mark = {"pk": s(pk), "sk": s(f"APPLIED#{write_id}")}
        round_id = None if write_id is None else await self._applied_round(mark)
        index = self._index_key(user_id, session_id)
        meta = await self._live_meta(pk, index, allocate=round_id is None)
        await self._index(user_id, session_id, meta)
        if round_id is None:
            round_id = number(meta, "max_round")
            if round_id > MAX_ROUND_ID:
                raise rounds_exhausted()
            if write_id is not None:
                round_id = await self._apply(mark, meta, round_id)
        await self._raise_max_round(pk, meta, round_id)
        await self._write_round(pk, meta, round_id, state)
        return round_id

    async def _raise_max_round(self, pk: str, meta: Item, round_id: int) -> None:
        """Make the next allocated round follow ``round_id``, on a meta item still there:
        raising it on one deleted meanwhile would make one of no generation, which no read
        of the state could use."""
        if number(meta, "max_round") < round_id:
            await self._store.set_if(
                {"pk": s(pk), "sk": s("META")},
                "#m",
                round_id,
                "attribute_exists(#g) AND (attribute_not_exists(#m) OR #m < :value)",
            )

    async def _applied_round(self, mark: Item) -> int | None:
        """The round of an earlier run of a keyed save, or None."""
        response = await self._store.run("get_item", idempotent=True, Key=mark, ConsistentRead=True)
        item = response.get("Item")
        if item is None or not is_live(item, now()):
            return None
        return number(item, "round")

    async def _apply(self, mark: Item, meta: Item, round_id: int) -> int:
        """Record ``round_id`` (of ``meta``'s generation) as the keyed save's round, unless a
        run of it did first."""
        at = now()
        try:
            await self._store.run(
                "put_item",
                idempotent=True,
                Item={
                    **mark,
                    "round": n(round_id),
                    "generation": meta["generation"],
                    "expires_at": n(at + WRITE_ID_SECONDS),
                },
                ConditionExpression="attribute_not_exists(pk) OR #e < :now",
                ExpressionAttributeNames=names("#e"),
                ExpressionAttributeValues={":now": n(at)},
            )
        except ConditionFailed:
            earlier = await self._applied_round(mark)
            if earlier is not None:
                return earlier
            # Expired between the two reads: this run's round is as good.
            return await self._apply(mark, meta, round_id)
        return round_id

    async def _save_round(
        self, user_id: str, session_id: str, round_id: int, state: dict[str, Any]
    ) -> None:
        pk = self._pk(user_id, session_id)
        meta = await self._live_meta(pk, self._index_key(user_id, session_id), allocate=False)
        await self._index(user_id, session_id, meta)
        await self._raise_max_round(pk, meta, round_id)
        await self._write_round(pk, meta, round_id, state)

    async def _load(
        self, user_id: str, session_id: str, round_id: int | None
    ) -> tuple[int, dict[str, Any]] | None:
        pk = self._pk(user_id, session_id)
        meta = await self._read_meta(pk, self._index_key(user_id, session_id))
        if meta is None:
            return None
        if round_id is None:
            latest = await self._latest_body(pk, meta)
            if latest is None:
                return None
            round_id, body = latest
        else:
            found = await self._round_body(pk, meta, round_id)
            if found is None:
                return None
            body = found
        state = stored_state(body, session_id, round_id)
        return None if state is None else (round_id, state)

    async def _list_rounds(self, user_id: str, session_id: str) -> list[int]:
        pk = self._pk(user_id, session_id)
        meta = await self._read_meta(pk, self._index_key(user_id, session_id))
        if meta is None:
            return []
        at = now()
        return [
            position_of(self._prefix(meta), item["sk"]["S"])
            async for item in self._store.query(
                **self._range(pk, meta),
                ProjectionExpression="sk, #p, #e",
                ExpressionAttributeNames=names("#p", "#e"),
            )
            if "part" not in item and is_live(item, at)
        ]

    async def _delete(self, user_id: str, session_id: str) -> None:
        pk = self._pk(user_id, session_id)
        # Together: a save making the state again after this indexes it anew, and the index
        # keeps no session whose state is gone.
        meta = {"pk": s(pk), "sk": s("META")}
        await self._store.delete_together([meta, self._index_key(user_id, session_id)])
        # The rounds and applied write ids of every generation but the live one's, not only
        # those of the meta item deleted: a delete cut short by a store failure leaves them,
        # and its retry, which finds no meta item, must still find them.
        # A save to the generation deleted checks the meta item after writing its round: if
        # before the meta item went, the round was written before this Query, which lists
        # it; if after, the save sees it gone and deletes the round itself. A save after the
        # meta item went makes a new generation, its meta item before its rounds: the meta
        # item read after this Query names it, and its rounds stay.
        items = [
            item
            async for item in self._store.query(
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": s(pk)},
                ProjectionExpression="pk, sk, #g",
                ExpressionAttributeNames=names("#g"),
                ConsistentRead=True,
            )
        ]
        response = await self._store.run(
            "get_item",
            idempotent=True,
            Key={"pk": s(pk), "sk": s("META")},
            ConsistentRead=True,
        )
        live = response.get("Item")
        keys = [
            {"pk": item["pk"], "sk": item["sk"]}
            for item in items
            if item["sk"]["S"] != "META" and not (live is not None and self._of(live, item))
        ]
        if keys:
            await self._store.delete(keys)

    def _of(self, meta: Item, item: Item) -> bool:
        """Whether ``item`` (a round or an applied write id) is of ``meta``'s generation."""
        sort_key: str = item["sk"]["S"]
        if sort_key.startswith("APPLIED#"):
            return bool(item.get("generation") == meta["generation"])
        return sort_key.startswith(self._prefix(meta))


__all__ = ["DynamoDBStateService"]

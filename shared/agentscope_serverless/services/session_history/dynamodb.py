"""Session history on DynamoDB: one item per message, sessions listed per user by Query.

Table (see :mod:`agentscope_serverless.infra.dynamodb_tables`), with ``U``/``S`` the
SHA-256 of the user and session ids:

=========================  ==================  ===========================================
pk                         sk                  attributes
=========================  ==================  ===========================================
``USER#U``                 ``COUNTER``         ``next_order``: creation counter of the user;
                                               ``generation``: random, set with the counter
                                               (list cursors name it)
``USER#U``                 ``SESSION#S``       the session: ``user_id``, ``session_id``,
                                               ``creation_order`` (sort key of the local
                                               index ``by_creation``), ``next_seq``,
                                               ``generation``, ``expires_at``,
                                               ``stamped_until``
``USER#U``                 ``PURGE#S#<gen>``   a session deleted whose messages of generation
                                               ``gen`` may not all be deleted yet
``SESSION#U#S``            ``M#<gen>#<seq>``   one message: ``body`` (JSON), ``expires_at``
                                               (larger ones: head plus tail items); with
                                               ``max_messages_per_session``, ``claim``: the
                                               sort key of its id's item
``SESSION#U#S``            ``M#<gen>#~I#<I>``  ``seq`` of the message whose id hashes to I;
                                               once marked, ``message_id``, ``marks`` and
                                               ``marks_version``
``SESSION#U#S``            ``M#<gen>#~S``      the summary, when one is kept: ``body``,
                                               ``expires_at`` (a larger one: head plus
                                               tail items, as a message)
=========================  ==================  ===========================================

- **Append** (O(1) per message, whatever the session's size): one ``UpdateItem ADD
  next_seq`` on the session item allocates contiguous sequence numbers atomically (so
  concurrent appends never collide and keep one order), then one ``TransactWriteItems``
  (all or none: 50 messages and 4 MB a transaction) writes the messages (the tail items of
  large ones before, unread without their heads). Appending to a missing session creates
  it.
  Each message id is first claimed by a conditional ``PutItem``: an id already in the
  session is not written again (its new sequence number stays a gap). A message is
  written only while the item of its id holds its sequence number (a ``ConditionCheck``
  in the transaction): one deleted meanwhile is left out. A head is written only where
  none is (or its own, replayed): of two appends writing one message at once (a retry
  racing the append it repeats), the first head stays and the other deletes its tail
  items, which would be part of no message. An append refused (409) for an id, given by
  its sender, that the session holds for a message saying something else writes none of
  its messages: it is refused before writing when it finds the id's message, then writes
  them in one transaction (up to 50 messages and 3.5 MB: a larger one takes several, and
  may keep some), none when another append wrote one first, and gives back the items of
  the ids it claimed. An append that finds an id claimed by another, its message not
  written yet, writes its own at that number; when it finds no message there after all
  (the other append, refused, gave the id back, or the message was deleted meanwhile), it
  claims the id again from its own number and writes the message there, in its place
  among its messages (refused as above where the session holds the id for another
  message by then): a success names only messages stored. A message deleted meanwhile is
  thus stored again, as if the append came after the delete. Two appends at
  once may land out of sequence order, so a read between them sees the later without
  the earlier, and a walk through the pages then may pass over the earlier one.
- **Read**: ``GetItem`` on the session item, then ``Query`` of its message partition in
  sort-key order; pages use an opaque cursor holding a sequence number and a digest of
  the session's user, id and generation (used on another session it is refused). A turn's
  window (its last N messages) is one ``Query`` in reverse order, stopping at the N-th.
- **List**: ``Query`` on the ``by_creation`` index of the user's partition (never Scan);
  the cursor holds a creation order and a digest of the user and the counter's generation,
  and every Query is bound to the caller's user. A delete of the user's sessions deletes
  the counter: made again, of a new generation, it gives the orders of the sessions gone,
  and a cursor listing those is refused.
- **Create** is idempotent: a conditional ``PutItem`` (``attribute_not_exists``); a
  concurrent creator's session wins and is returned.
- **Delete** removes the session item (the session is gone at once) and writes a purge
  record naming its generation, in one transaction; then its messages go, then the record.
  A delete cut short by a store failure leaves the record: the next delete of the session,
  or of the user's sessions, finds it and deletes what is left. An append that lands after
  the session item went (it read the session item before) sees the session item gone, or
  of another generation, and deletes what it wrote. A delete of the user's sessions does
  the same for every session (up to 49 session items in one transaction), deleting the
  messages of 16 sessions at once.
- **TTL** (``ttl_seconds``): a sliding expiry of the whole session, refreshed by every read
  and write (a page of sessions listed: theirs, an ``UpdateItem`` each); see
  :mod:`agentscope_serverless.services._dynamodb`.
- **Summary**: items of its own, after the session's messages and ids in sort-key order,
  so neither reading the session item (every turn) nor any Query of messages reads any of
  it, and a summary of any size is kept, split as a message is. Replacing it writes its
  tail items, then its head, then deletes the tail items of the one it replaced; a write
  that lands after its session's delete deletes what it wrote and is made again, on the
  session created again.
- **Delete messages**: a message's head item and the item of its id go first, in one
  transaction conditional on both (the message is gone at once), then its tail items; with
  ``max_messages_per_session`` its sequence number is recorded as a gap. As appends write
  a message only while the item of its id holds its number, none is left, or written
  again, without it; one not written yet (its append in flight, or failed midway and
  retried) keeps it. **Marks** live on the item of the message's id, each update
  conditional on the version of the marks it read (retried when another came first).
- ``max_messages_per_session`` keeps the newest N messages stored: reads take them newest
  first (a page of messages starts at the oldest of them), so older ones are hidden at once
  and deleted, with the items of their ids, by the next append: as a delete of messages
  does, each with the item of its id in one transaction while that item holds its number
  (an append retried meanwhile may have written the message again, its id now at another
  number), then their tail items. What is kept is counted
  from the messages stored, not from the sequence numbers given out, which appends in
  flight, or failed midway, hold unused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

from agentscope_serverless.infra.dynamodb_tables import SESSIONS_BY_CREATION_INDEX
from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.schemas.pagination import Page
from agentscope_serverless.schemas.session import Session
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
from agentscope_serverless.services._stored import decode_message, encode_message
from agentscope_serverless.services._validation import (
    check_cursor_listing,
    check_cursor_session,
    listing_cursor,
    listing_cursor_position,
    listing_tag,
    optional_positive_int,
    optional_ttl_seconds,
    session_cursor,
    session_cursor_position,
    session_tag,
)
from agentscope_serverless.services.session_history.base import SessionHistoryService, remark

# Cursor positions stay within DynamoDB's 38-digit numbers.
_MAX_CURSOR = 10**30
# How many times a summary is read when it is replaced while read.
_SUMMARY_READS = 3
# The sort key prefix of a purge record in a user's partition: ``PURGE#<S>#<generation>``.
_PURGE = "PURGE#"
# How many requests a delete of sessions sends at once, the purge records it handles in a
# round, and the items a BatchWriteItem deletes.
_CONCURRENCY = 16
_PURGE_CHUNK = 400
_BATCH = 25


class DynamoDBSessionHistoryService(DynamoDBBackedService, SessionHistoryService):
    """Session history on a DynamoDB table (the cloud default).

    >>> history = DynamoDBSessionHistoryService("agentscope-sessions", region_name="eu-west-1")
    >>> local = DynamoDBSessionHistoryService(
    ...     "agentscope-sessions", endpoint_url="http://127.0.0.1:5000", region_name="us-east-1"
    ... )

    ``client`` injects a ready aioboto3 DynamoDB client (used as-is, not closed by
    ``stop()``); otherwise one is created from the usual AWS credential chain, or the
    credentials given.
    """

    def __init__(
        self,
        table_name: str = "agentscope-sessions",
        *,
        client: DynamoDBClient | None = None,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        ttl_seconds: int | None = None,
        max_messages_per_session: int | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 10.0,
    ) -> None:
        self._store = DynamoDBStore(
            table_name=table_name,
            setting="DYNAMODB_SESSIONS_TABLE",
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
        self._max_messages = optional_positive_int(
            max_messages_per_session, field="max_messages_per_session"
        )

    # --- keys -------------------------------------------------------------------------

    @staticmethod
    def _session_key(user_id: str, session_id: str) -> Item:
        return {"pk": s(f"USER#{id_hash(user_id)}"), "sk": s(f"SESSION#{id_hash(session_id)}")}

    @staticmethod
    def _counter_key(user_id: str) -> Item:
        """The key of the user's creation counter (the order of their sessions)."""
        return {"pk": s(f"USER#{id_hash(user_id)}"), "sk": s("COUNTER")}

    @staticmethod
    def _messages_pk(user_id: str, session_id: str) -> str:
        return f"SESSION#{id_hash(user_id)}#{id_hash(session_id)}"

    @staticmethod
    def _prefix(meta: Item) -> str:
        return f"M#{meta['generation']['S']}#"

    def _first_visible(self, meta: Item) -> int:
        """Where the newest N sequence numbers start, those left unused (``gaps``) counting
        for none: 1 when at most N messages are stored (no trim is due). An append that
        failed midway leaves numbers neither used nor recorded, so what is kept is read from
        the messages stored (see :meth:`_oldest_kept`)."""
        if self._max_messages is None:
            return 1
        first = number(meta, "next_seq") - self._max_messages + 1
        for gap in sorted(map(int, meta.get("gaps", {}).get("NS", ())), reverse=True):
            if gap < first:
                break
            first -= 1
        return max(1, first)

    async def _record_gaps(
        self, user_id: str, session_id: str, meta: Item, gaps: list[int], *, add: bool
    ) -> Item:
        """The session item after adding (or removing) ``gaps``, sequence numbers that hold
        no message; ``meta`` itself when the session was deleted meanwhile."""
        try:
            response = await self._store.run(
                "update_item",
                idempotent=True,
                Key=self._session_key(user_id, session_id),
                UpdateExpression=f"{'ADD' if add else 'DELETE'} gaps :gaps",
                ConditionExpression="generation = :generation",
                ExpressionAttributeValues={
                    ":gaps": {"NS": [str(gap) for gap in gaps]},
                    ":generation": meta["generation"],
                },
                ReturnValues="ALL_NEW",
            )
        except ConditionFailed:
            return meta
        updated: Item = response["Attributes"]
        return updated

    # --- the session item ---------------------------------------------------------------

    async def _read_meta(self, user_id: str, session_id: str) -> Item | None:
        """The live session item; with a TTL, reading it also refreshes its expiry."""
        meta = await self._store.read_container(self._session_key(user_id, session_id), self._ttl)
        if meta is not None:
            await self._restamp_if_due(user_id, session_id, meta)
        return meta

    async def _create_meta(self, user_id: str, session_id: str) -> tuple[Item, bool]:
        """The session item, created if missing; True when this call created it."""
        while True:
            counter = await self._store.run(
                "update_item",
                idempotent=False,
                Key=self._counter_key(user_id),
                UpdateExpression="ADD next_order :one SET #g = if_not_exists(#g, :generation)",
                ExpressionAttributeNames=names("#g"),
                ExpressionAttributeValues={":one": n(1), ":generation": s(new_generation())},
                ReturnValues="UPDATED_NEW",
            )
            at = now()
            meta: Item = {
                **self._session_key(user_id, session_id),
                "user_id": s(user_id),
                "session_id": s(session_id),
                "creation_order": counter["Attributes"]["next_order"],
                "next_seq": n(0),
                "generation": s(new_generation()),
            }
            if self._ttl is not None:
                meta |= {"expires_at": n(at + self._ttl), "stamped_until": n(at + 2 * self._ttl)}
            try:
                await self._store.run(
                    "put_item",
                    idempotent=False,
                    Item=meta,
                    ConditionExpression="attribute_not_exists(#pk) OR #e < :now",
                    ExpressionAttributeNames=names("#pk", "#e"),
                    ExpressionAttributeValues={":now": n(at)},
                )
                return meta, True
            except ConditionFailed:
                existing = await self._read_meta(user_id, session_id)
                if existing is not None:
                    return existing, False

    async def _allocate(self, user_id: str, session_id: str, count: int) -> Item:
        """Reserve ``count`` sequence numbers (the session item after the update)."""
        while True:
            at = now()
            update, values = "ADD next_seq :count", {":count": n(count), ":now": n(at)}
            if self._ttl is not None:
                update += " SET #e = :expires"
                values[":expires"] = n(at + self._ttl)
            try:
                response = await self._store.run(
                    "update_item",
                    idempotent=False,
                    Key=self._session_key(user_id, session_id),
                    UpdateExpression=update,
                    ConditionExpression=f"attribute_exists(#pk) AND {LIVE}",
                    ExpressionAttributeNames=names("#e", "#pk"),
                    ExpressionAttributeValues=values,
                    ReturnValues="ALL_NEW",
                )
                meta: Item = response["Attributes"]
                return meta
            except ConditionFailed:
                await self._create_meta(user_id, session_id)

    async def _restamp_if_due(self, user_id: str, session_id: str, meta: Item) -> None:
        await self._store.restamp_if_due(
            self._session_key(user_id, session_id),
            meta,
            self._messages_pk(user_id, session_id),
            self._prefix(meta),
            self._ttl,
        )

    # --- messages -----------------------------------------------------------------------

    def _message_items(
        self,
        user_id: str,
        session_id: str,
        meta: Item,
        messages: list[tuple[int, Message]],
        given: list[Message],
    ) -> tuple[list[Item], list[Item]]:
        """The items of ``messages`` (numbered), out of ``given``, the append's messages."""
        extra: Item = {}
        if self._ttl is not None:
            extra["expires_at"] = n(now() + 2 * self._ttl)
        tails: list[Item] = []
        heads: list[Item] = []
        for seq, message in messages:
            message_tails, head = body_items(
                self._messages_pk(user_id, session_id),
                position_key(self._prefix(meta), seq),
                encode_message(message, given),
                extra,
            )
            if self._max_messages is not None:
                # Trimmed, the message takes the item of its id along.
                head["claim"] = self._claim_key(user_id, session_id, meta, message.id)["sk"]
            tails += message_tails
            heads.append(head)
        return tails, heads

    def _between(self, user_id: str, session_id: str, low: str, high: str) -> dict[str, Any]:
        """The ``Query`` arguments reading the session's message items with sort keys from
        ``low`` to ``high``."""
        return {
            "KeyConditionExpression": "pk = :pk AND sk BETWEEN :low AND :high",
            "ExpressionAttributeValues": {
                ":pk": s(self._messages_pk(user_id, session_id)),
                ":low": s(low),
                ":high": s(high),
            },
        }

    async def _messages(
        self, user_id: str, session_id: str, meta: Item, after: int, limit: int | None = None
    ) -> AsyncGenerator[tuple[int, Message], None]:
        prefix = self._prefix(meta)
        first = after + 1
        query = self._between(user_id, session_id, position_key(prefix, first), f"{prefix}~")
        query["ConsistentRead"] = True
        if limit is not None:
            query["Limit"] = limit
        async for head, body in assemble(self._store.query(**query), now()):
            yield position_of(prefix, head["sk"]["S"]), decode_message(body)

    async def _newest_first(
        self, user_id: str, session_id: str, meta: Item, page_size: int
    ) -> AsyncGenerator[Message, None]:
        """The messages stored, newest first (read ``page_size`` items a request)."""
        # In reverse key order a message's tails come before its head, which closes it.
        at = now()
        prefix = self._prefix(meta)
        group: list[Item] = []
        async for item in self._store.query(
            **self._between(user_id, session_id, prefix, f"{prefix}~"),
            ConsistentRead=True,
            ScanIndexForward=False,
            Limit=page_size,
        ):
            group.append(item)
            if "part" not in item:
                async for _, body in assemble(iterate(reversed(group)), at):
                    yield decode_message(body)
                group = []

    async def _oldest_kept(self, user_id: str, session_id: str, meta: Item, limit: int) -> int:
        """The sequence number of the ``limit``-th newest message stored (1 when fewer are)."""
        at = now()
        prefix = self._prefix(meta)
        heads = (
            position_of(prefix, item["sk"]["S"])
            async for item in self._store.query(
                **self._between(user_id, session_id, prefix, f"{prefix}~"),
                ProjectionExpression="sk, #p, #e",
                ExpressionAttributeNames=names("#p", "#e"),
                ConsistentRead=True,
                ScanIndexForward=False,
                Limit=limit,
            )
            if "part" not in item and is_live(item, at)
        )
        newest = await take(heads, limit)
        return newest[-1] if len(newest) == limit else 1

    async def _trim(self, user_id: str, session_id: str, meta: Item) -> None:
        first_visible = self._first_visible(meta)
        if first_visible == 1 or self._max_messages is None:
            return
        # The sequence numbers of appends still in flight count among the newest N until
        # they are written or recorded as gaps: only messages older than the newest N
        # stored go (and only gaps before them, which no later count needs).
        first_visible = min(
            first_visible,
            await self._oldest_kept(user_id, session_id, meta, self._max_messages),
        )
        if first_visible == 1:
            return
        prefix = self._prefix(meta)
        removals: list[list[Item]] = []
        tails: list[Item] = []
        last_hidden = position_key(prefix, first_visible - 1) + "#~"
        async for item in self._store.query(
            **self._between(user_id, session_id, prefix, last_hidden),
            ProjectionExpression="pk, sk, claim, #p",
            ExpressionAttributeNames=names("#p"),
            ConsistentRead=True,
        ):
            key = {"pk": item["pk"], "sk": item["sk"]}
            if "part" in item:
                tails.append(key)
                continue
            claim = None
            if "claim" in item:
                claim = {"pk": item["pk"], "sk": item["claim"]}
            removals.append(self._removal(key, claim, position_of(prefix, key["sk"]["S"])))
        # Each message with the item of its id, while both are there, as a delete of the
        # message: a retried append may have written it again meanwhile (this trim listed it
        # before another removed it), and the item of its id now holds its new number.
        left_out = await self._store.write_together(removals)
        # Where the item of its id holds another number (or none), the message is no
        # longer reachable by its id: it goes alone.
        alone = [removals[i][:1] for i, failed in left_out.items() if 0 not in failed]
        if alone:
            await self._store.write_together(alone)
        if tails:
            await self._store.delete(tails)
        passed = [
            gap for gap in map(int, meta.get("gaps", {}).get("NS", ())) if gap < first_visible
        ]
        if passed:
            await self._record_gaps(user_id, session_id, meta, passed, add=False)

    # --- the summary -------------------------------------------------------------------

    def _summary_key(self, user_id: str, session_id: str, meta: Item) -> Item:
        """The key of the summary's head item: in the message partition, after the items
        of every message and id of the generation (so no Query of those reads it), and
        with them restamped, and deleted with the session."""
        return {
            "pk": s(self._messages_pk(user_id, session_id)),
            "sk": s(f"{self._prefix(meta)}~S"),
        }

    async def _read_summary(self, user_id: str, session_id: str, meta: Item) -> str:
        """The summary (``""`` when none); read again when it was replaced while read (the
        tail items of the one replaced are deleted once the new head is in place)."""
        head = self._summary_key(user_id, session_id, meta)["sk"]["S"]
        for _ in range(_SUMMARY_READS):
            items = [
                item
                async for item in self._store.query(
                    **self._between(user_id, session_id, head, f"{head}#~"), ConsistentRead=True
                )
            ]
            at = now()
            bodies = [body async for _, body in assemble(iterate(items), at)]
            if bodies:
                return bodies[0]
            if not any("part" not in item and is_live(item, at) for item in items):
                break
        return ""

    async def _write_summary(self, user_id: str, session_id: str, meta: Item, summary: str) -> bool:
        """Store ``summary`` in place of the session's one, split as a large message is:
        its tail items, then its head, then the tail items of the one replaced go. False,
        with none of it left stored, when the session was deleted meanwhile."""
        extra: Item = {}
        if self._ttl is not None:
            extra["expires_at"] = n(now() + 2 * self._ttl)
        key = self._summary_key(user_id, session_id, meta)
        tails, head = body_items(key["pk"]["S"], key["sk"]["S"], summary, extra)
        await self._store.put(tails)
        response = await self._store.run(
            "put_item", idempotent=True, Item=head, ReturnValues="ALL_OLD"
        )
        old = response.get("Attributes")
        if old is not None and old.get("version") != head.get("version"):
            await self._store.delete(tail_keys(old))
        if await self._store.holds(self._session_key(user_id, session_id), meta):
            return True
        # Deleted meanwhile, after its delete had listed the items: this summary would stay
        # stored, reachable by no one.
        await self._store.delete([key, *tail_keys(head)])
        return False

    async def _remove_summary(self, user_id: str, session_id: str, meta: Item) -> None:
        """Delete the session's summary, its head first (it is gone at once)."""
        response = await self._store.run(
            "delete_item",
            idempotent=True,
            Key=self._summary_key(user_id, session_id, meta),
            ReturnValues="ALL_OLD",
        )
        old = response.get("Attributes")
        if old is not None:
            await self._store.delete(tail_keys(old))

    # --- the service hooks --------------------------------------------------------------

    async def _create_session(self, user_id: str, session_id: str) -> Session:
        meta = await self._read_meta(user_id, session_id)
        if meta is None:
            meta, created = await self._create_meta(user_id, session_id)
            if created:
                return Session(id=session_id, user_id=user_id, messages=[])
        return await self._session_with_messages(user_id, session_id, meta)

    async def _open_session(self, user_id: str, session_id: str, recent: int) -> Session:
        meta = await self._read_meta(user_id, session_id)
        if meta is None:
            meta, created = await self._create_meta(user_id, session_id)
            if created:
                return Session(id=session_id, user_id=user_id, messages=[])
        if recent == 0:
            return Session(id=session_id, user_id=user_id, messages=[])
        # The last `recent` messages: one Query read newest first, stopping there. (Not the
        # last `recent` sequence numbers: an append repeating messages leaves its numbers
        # unused, and the window would hold fewer messages, or none.)
        return await self._newest(user_id, session_id, meta, recent)

    async def _newest(self, user_id: str, session_id: str, meta: Item, count: int) -> Session:
        """The session with its newest ``count`` messages (at most the N it keeps)."""
        if self._max_messages is not None:
            count = min(count, self._max_messages)
        newest = await take(self._newest_first(user_id, session_id, meta, count), count)
        messages: list[Message | dict[str, Any]] = [*reversed(newest)]
        return Session(id=session_id, user_id=user_id, messages=messages)

    async def _get_session(self, user_id: str, session_id: str) -> Session | None:
        meta = await self._read_meta(user_id, session_id)
        if meta is None:
            return None
        return await self._session_with_messages(user_id, session_id, meta)

    async def _session_with_messages(self, user_id: str, session_id: str, meta: Item) -> Session:
        if self._max_messages is not None:
            return await self._newest(user_id, session_id, meta, self._max_messages)
        messages: list[Message | dict[str, Any]] = [
            message async for _, message in self._messages(user_id, session_id, meta, after=0)
        ]
        return Session(id=session_id, user_id=user_id, messages=messages)

    async def _delete_session(self, user_id: str, session_id: str) -> None:
        key = self._session_key(user_id, session_id)
        while True:
            response = await self._store.run(
                "get_item", idempotent=True, Key=key, ConsistentRead=True
            )
            meta = response.get("Item")
            if meta is None or not await self._store.write_together([self._retirement(meta)]):
                break
            # Deleted, or made again, since it was read: the session as it is now goes.
        records = [
            item
            async for item in self._store.query(
                KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
                ExpressionAttributeValues={
                    ":pk": key["pk"],
                    ":prefix": s(f"{_PURGE}{id_hash(session_id)}#"),
                },
                ProjectionExpression="pk, sk",
                ConsistentRead=True,
            )
        ]
        await self._purge_all(user_id, records)

    async def _delete_user_sessions(self, user_id: str) -> None:
        # The user's session items (and creation counter) go first, together: up to 49
        # sessions in one transaction, so they vanish at once; then their messages, several
        # sessions at once.
        pk = s(f"USER#{id_hash(user_id)}")
        items = [
            item
            async for item in self._store.query(
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": pk},
                ConsistentRead=True,
            )
        ]
        units = [self._retirement(item) for item in items if item["sk"]["S"].startswith("SESSION#")]
        units.append(
            [
                {
                    "Delete": {
                        "TableName": self._store.table_name,
                        "Key": {"pk": pk, "sk": s("COUNTER")},
                    }
                }
            ]
        )
        # A session left out was deleted meanwhile (its delete left a purge record, read
        # below), or made again after this delete had read it (it stays, as if made after).
        await self._store.write_together(units)
        records = [
            item
            async for item in self._store.query(
                KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
                ExpressionAttributeValues={":pk": pk, ":prefix": s(_PURGE)},
                ProjectionExpression="pk, sk",
                ConsistentRead=True,
            )
        ]
        await self._purge_all(user_id, records)

    def _retirement(self, meta: Item) -> list[Item]:
        """The transaction actions deleting the session item ``meta`` (only while it is of
        ``meta``'s generation) and recording, in the user's partition, that the messages of
        that generation are still to be deleted (:meth:`_purge_all`)."""
        session_hash = meta["sk"]["S"].removeprefix("SESSION#")
        record = {"pk": meta["pk"], "sk": s(f"{_PURGE}{session_hash}#{meta['generation']['S']}")}
        return [
            {
                "Delete": {
                    "TableName": self._store.table_name,
                    "Key": {"pk": meta["pk"], "sk": meta["sk"]},
                    "ConditionExpression": "#g = :generation",
                    "ExpressionAttributeNames": names("#g"),
                    "ExpressionAttributeValues": {":generation": meta["generation"]},
                }
            },
            {"Put": {"TableName": self._store.table_name, "Item": record}},
        ]

    async def _purge_all(self, user_id: str, records: list[Item]) -> None:
        """Delete the messages the purge ``records`` name (each its session's, of one
        generation), then the records: a delete cut short by a store failure leaves the
        records, and the messages not deleted yet, for the next delete of the session or
        the user. The messages of many sessions are listed :data:`_CONCURRENCY` at once,
        and deleted 25 a request (those of several sessions together), as many at once.

        A purge record is written with the deletion of its session item, in one
        transaction, so both are done before the messages are listed. An append (or a
        summary write) checks, after writing, that the session item is still of the
        generation it wrote for (:meth:`DynamoDBStore.holds`): if it checked before the
        session item went, it had written before the messages are listed here, and they
        are deleted here; if after, it finds the session item gone and deletes what it
        wrote itself. Either way nothing of it stays. Appends after the session item went
        make the session again, of a new generation, which no purge record names.
        """
        for start in range(0, len(records), _PURGE_CHUNK):
            chunk = [{"pk": r["pk"], "sk": r["sk"]} for r in records[start : start + _PURGE_CHUNK]]
            listed = await gather_bounded(
                (self._purged_keys(user_id, record) for record in chunk), _CONCURRENCY
            )
            keys = [key for keys in listed for key in keys]
            await gather_bounded(
                (self._store.delete(keys[i : i + _BATCH]) for i in range(0, len(keys), _BATCH)),
                _CONCURRENCY,
            )
            await self._store.delete(chunk)

    async def _purged_keys(self, user_id: str, record: Item) -> list[Item]:
        """The keys of the message items a purge record names."""
        session_hash, _, generation = record["sk"]["S"].removeprefix(_PURGE).partition("#")
        return [
            {"pk": item["pk"], "sk": item["sk"]}
            async for item in self._store.query(
                KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
                ExpressionAttributeValues={
                    ":pk": s(f"SESSION#{id_hash(user_id)}#{session_hash}"),
                    ":prefix": s(f"M#{generation}#"),
                },
                ProjectionExpression="pk, sk",
                ConsistentRead=True,
            )
        ]

    async def _list_sessions_page(
        self, user_id: str, limit: int, cursor: str | None
    ) -> Page[Session]:
        position, tag = listing_cursor_position(cursor)
        after = min(position, _MAX_CURSOR)
        counter = await self._store.run(
            "get_item",
            idempotent=True,
            Key=self._counter_key(user_id),
            ProjectionExpression="#g",
            ExpressionAttributeNames=names("#g"),
            ConsistentRead=True,
        )
        # No generation: a counter made by a version that kept none (or no counter).
        generation = counter.get("Item", {}).get("generation")
        listing = None if generation is None else listing_tag(user_id, generation["S"])
        check_cursor_listing(tag, listing)
        at = now()
        items = self._store.query(
            IndexName=SESSIONS_BY_CREATION_INDEX,
            KeyConditionExpression="pk = :pk AND #o > :after",
            ExpressionAttributeNames=names("#o"),
            ExpressionAttributeValues={
                ":pk": s(f"USER#{id_hash(user_id)}"),
                ":after": n(after),
            },
            ConsistentRead=True,
            Limit=limit + 1,
        )
        live = (
            (number(item, "creation_order"), item["session_id"]["S"])
            async for item in items
            if is_live(item, at)
        )
        rows = await take(live, limit + 1)
        page = rows[:limit]
        if self._ttl is not None:
            # Listed, the sessions are read: their expiry slides, as a read of each does.
            await gather_bounded((self._read_meta(user_id, sid) for _, sid in page), _CONCURRENCY)
        return Page[Session](
            items=[Session(id=sid, user_id=user_id, messages=[]) for _, sid in page],
            next_cursor=listing_cursor(page[-1][0], listing) if len(rows) > limit else None,
        )

    async def _list_messages(
        self, user_id: str, session_id: str, limit: int, cursor: str | None
    ) -> Page[Message] | None:
        position, tag = session_cursor_position(cursor, "after")
        after = min(position, _MAX_CURSOR)
        meta = await self._read_meta(user_id, session_id)
        if meta is None:
            return None
        # The generation tells the session from an earlier session of the same id.
        session = session_tag(user_id, session_id, meta["generation"]["S"])
        check_cursor_session(tag, session)
        if self._max_messages is not None:
            # From the oldest message kept on: older ones may be stored still (deleted by
            # the next append).
            oldest = await self._oldest_kept(user_id, session_id, meta, self._max_messages)
            after = max(after, oldest - 1)
        rows = await take(
            self._messages(user_id, session_id, meta, after, limit=limit + 1), limit + 1
        )
        page = rows[:limit]
        return Page[Message](
            items=[message for _, message in page],
            next_cursor=(
                session_cursor("after", page[-1][0], session) if len(rows) > limit else None
            ),
        )

    async def _append_messages(
        self, user_id: str, session_id: str, messages: list[Message]
    ) -> list[Message]:
        return await self._append_messages_unless(user_id, session_id, messages, None)

    async def _append_messages_unless(
        self,
        user_id: str,
        session_id: str,
        messages: list[Message],
        refuse: Callable[[list[Message]], None] | None,
    ) -> list[Message]:
        meta = await self._allocate(user_id, session_id, len(messages))
        first = number(meta, "next_seq") - len(messages) + 1
        fresh: list[tuple[int, Message]] = []
        result: list[Message] = []
        # An id given twice in one call is claimed once, by its first message.
        first_seq: dict[str, int] = {}
        for seq, message in enumerate(messages, start=first):
            first_seq.setdefault(message.id, seq)
        claimed_at = dict(
            zip(
                first_seq,
                await asyncio.gather(
                    *(
                        self._claim_id(user_id, session_id, meta, message_id, seq)
                        for message_id, seq in first_seq.items()
                    )
                ),
                strict=True,
            )
        )
        appended: dict[int, Message] = {}
        for seq, message in enumerate(messages, start=first):
            claimed = claimed_at[message.id]
            if claimed == seq:
                fresh.append((seq, message))
                appended[seq] = message
                result.append(message)
                continue
            if claimed in appended:
                result.append(appended[claimed])
                continue
            # The id is in the session already (its sequence number stays unused).
            stored = await self._message_at(user_id, session_id, meta, claimed)
            if stored is None:
                # An earlier append claimed the id but failed before writing the message (or
                # has not written it yet). Deleted since it was read, it is not written: the
                # item of its id went with it (see below).
                fresh.append((claimed, message))
                appended[claimed] = stored = message
            result.append(stored)
        if self._max_messages is not None:
            # Sequence numbers this append leaves unused (its messages were in the session
            # already) must not count among the newest N: else a retried append would hide
            # the messages it repeats, and the next trim delete them.
            used = {seq for seq, _ in fresh}
            gaps = [seq for seq in range(first, first + len(messages)) if seq not in used]
            if gaps:
                meta = await self._record_gaps(user_id, session_id, meta, gaps, add=True)
        # The ids this append claimed, given back when it is refused.
        claims = [(seq, m) for seq, m in fresh if first <= seq < first + len(messages)]
        if refuse is not None:
            await self._refuse_or_withdraw(user_id, session_id, meta, refuse, result, claims, [])
        # Where each message is written from: its own sequence number (the first of its id).
        own: dict[int, int] = {}
        for seq, message in enumerate(messages, start=first):
            own.setdefault(id(message), seq)
        tails, heads = self._message_items(user_id, session_id, meta, fresh, messages)
        await self._store.put(tails)
        # A message is written once at its number: where two appends write it at once (a
        # retry racing the append it repeats), the first head stays and the other's tail
        # items go, else left over, part of no message.
        units = self._store.put_actions(
            heads, self._claim_checks(user_id, session_id, meta, fresh), first_only=True
        )
        deleted: list[Item] = []
        # All or none: a turn stored in part (a tool call without its result) would be sent
        # to the model, which refuses it, with every later turn. In one transaction, so that
        # a refused append writes none of them: where another append wrote one first (of an
        # id found claimed, not yet written), none is written, and what it wrote is looked
        # at before the others are. Larger appends (over 50 messages or 3.5 MB) take several
        # transactions: one refused for an id another append wrote first keeps what the
        # others wrote.
        at_once = refuse is not None and self._store.fit_together(units)
        pending = list(range(len(units)))
        while pending:
            batch = [units[i] for i in pending]
            if at_once:
                failed = await self._store.write_all_or_none(batch)
            else:
                failed = await self._store.write_together(batch)
            lost = [pending[i] for i in sorted(failed)]
            pending = [i for i in pending if i not in lost] if at_once else []
            if not lost:
                break
            deleted += [heads[i] for i in lost]
            kept: dict[int, Message] = {}
            again: list[tuple[int, Message]] = []
            for seq, message in (fresh[i] for i in lost):
                stored, at = await self._left_out(
                    user_id, session_id, meta, message, seq, own[id(message)]
                )
                if stored is not None:
                    kept[id(message)] = stored
                elif at is not None:
                    again.append((at, message))
            result = [kept.get(id(message), message) for message in result]
            mine = [seq for seq, message in again if seq == own[id(message)]]
            claims += [(seq, message) for seq, message in again if seq in mine]
            if mine and self._max_messages is not None:
                # Its own numbers, recorded unused, now hold its messages.
                meta = await self._record_gaps(user_id, session_id, meta, mine, add=False)
            if refuse is not None and at_once:
                await self._refuse_or_withdraw(
                    user_id, session_id, meta, refuse, result, claims, tails
                )
            if again:
                more_tails, more_heads = self._message_items(
                    user_id, session_id, meta, again, messages
                )
                await self._store.put(more_tails)
                pending += range(len(units), len(units) + len(again))
                fresh += again
                tails += more_tails
                heads += more_heads
                units += self._store.put_actions(
                    more_heads,
                    self._claim_checks(user_id, session_id, meta, again),
                    first_only=True,
                )
        if deleted:
            await self._store.delete([key for head in deleted for key in tail_keys(head)])
        if not await self._store.holds(self._session_key(user_id, session_id), meta):
            # Deleted meanwhile, after its delete had listed the messages: what this
            # append wrote would stay stored, reachable by no one.
            written = {
                item["sk"]["S"]: {"pk": item["pk"], "sk": item["sk"]}
                for item in [
                    *tails,
                    *heads,
                    *(self._claim_key(user_id, session_id, meta, m.id) for m in messages),
                ]
            }
            await self._store.delete(list(written.values()))
            return result
        await self._trim(user_id, session_id, meta)
        await self._restamp_if_due(user_id, session_id, meta)
        if refuse is not None and not at_once:
            refuse(result)
        return result

    async def _refuse_or_withdraw(
        self,
        user_id: str,
        session_id: str,
        meta: Item,
        refuse: Callable[[list[Message]], None],
        result: list[Message],
        claims: list[tuple[int, Message]],
        tails: list[Item],
    ) -> None:
        """``refuse(result)``, for an append that has written none of its messages yet;
        when it raises, the append's ``tails`` and ``claims`` (those of its ids not taken
        over since: no message was written at their numbers) go first, so that it leaves
        nothing behind."""
        try:
            refuse(result)
        except Exception:
            if tails:
                await self._store.delete([{"pk": item["pk"], "sk": item["sk"]} for item in tails])
            kept = await self._store.write_together(
                [self._release(user_id, session_id, meta, seq, m.id) for seq, m in claims]
            )
            gaps = [seq for i, (seq, _) in enumerate(claims) if i not in kept]
            if gaps and self._max_messages is not None:
                await self._record_gaps(user_id, session_id, meta, gaps, add=True)
            raise

    def _release(
        self, user_id: str, session_id: str, meta: Item, seq: int, message_id: str
    ) -> list[Item]:
        """The transaction actions deleting the item of ``message_id`` while it holds
        ``seq`` and no message was written there (another append may have, having found the
        id claimed)."""
        head = position_key(self._prefix(meta), seq)
        return [
            {
                "Delete": {
                    "TableName": self._store.table_name,
                    "Key": self._claim_key(user_id, session_id, meta, message_id),
                    "ConditionExpression": "seq = :seq",
                    "ExpressionAttributeValues": {":seq": n(seq)},
                }
            },
            {
                "ConditionCheck": {
                    "TableName": self._store.table_name,
                    "Key": {"pk": s(self._messages_pk(user_id, session_id)), "sk": s(head)},
                    "ConditionExpression": "attribute_not_exists(#pk)",
                    "ExpressionAttributeNames": names("#pk"),
                }
            },
        ]

    def _claim_checks(
        self, user_id: str, session_id: str, meta: Item, numbered: list[tuple[int, Message]]
    ) -> list[Item]:
        """The conditions writing each message of ``numbered`` only while the item of its id
        holds its sequence number: one deleted meanwhile (the item of its id goes with it)
        would be stored again without it, out of reach of its id."""
        return [
            {
                "Key": self._claim_key(user_id, session_id, meta, message.id),
                "ConditionExpression": "seq = :seq",
                "ExpressionAttributeValues": {":seq": n(seq)},
            }
            for seq, message in numbered
        ]

    async def _left_out(
        self, user_id: str, session_id: str, meta: Item, message: Message, seq: int, own: int
    ) -> tuple[Message | None, int | None]:
        """Where ``message``, not written at ``seq``, is: the message the session keeps
        there (another append of its id wrote it first), else the number to write it at
        again; (None, None) when neither (its own number, ``own``: the session was deleted
        meanwhile)."""
        stored = await self._message_at(user_id, session_id, meta, seq)
        if stored is not None or seq == own:
            return stored, None
        # Its id was found claimed by another append, its message not written yet: that
        # append, refused, gave the claim back (or its message was deleted meanwhile).
        # Claimed again, from its own number (in its place among the append's messages).
        claimed = await self._claim_id(user_id, session_id, meta, message.id, own)
        if claimed == own:
            return None, own
        stored = await self._message_at(user_id, session_id, meta, claimed)
        return stored, claimed if stored is None else None

    async def _stored_messages(
        self, user_id: str, session_id: str, message_ids: list[str]
    ) -> dict[str, Message]:
        meta = await self._read_meta(user_id, session_id)
        if meta is None:
            return {}
        found = await asyncio.gather(
            *(self._message_with_id(user_id, session_id, meta, i) for i in message_ids)
        )
        return {i: m for i, m in zip(message_ids, found, strict=True) if m is not None}

    async def _message_with_id(
        self, user_id: str, session_id: str, meta: Item, message_id: str
    ) -> Message | None:
        """The stored message with ``message_id`` (its id's item, then its own), or None."""
        response = await self._store.run(
            "get_item",
            idempotent=True,
            Key=self._claim_key(user_id, session_id, meta, message_id),
            ConsistentRead=True,
        )
        claim = response.get("Item")
        if claim is None:
            return None
        return await self._message_at(user_id, session_id, meta, number(claim, "seq"))

    async def _delete_messages(self, user_id: str, session_id: str, message_ids: list[str]) -> int:
        meta = await self._read_meta(user_id, session_id)
        if meta is None:
            return 0
        deleted = [
            seq
            for seq in await asyncio.gather(
                *(self._delete_message(user_id, session_id, meta, i) for i in message_ids)
            )
            if seq is not None
        ]
        if deleted and self._max_messages is not None:
            # A deleted message's number no longer counts among the newest N.
            await self._record_gaps(user_id, session_id, meta, deleted, add=True)
        return len(deleted)

    async def _delete_message(
        self, user_id: str, session_id: str, meta: Item, message_id: str
    ) -> int | None:
        """Delete the message with ``message_id``; its sequence number, None when the
        session did not hold it."""
        claim_key = self._claim_key(user_id, session_id, meta, message_id)
        response = await self._store.run(
            "get_item", idempotent=True, Key=claim_key, ConsistentRead=True
        )
        claim = response.get("Item")
        if claim is None:
            return None
        seq = number(claim, "seq")
        head = position_key(self._prefix(meta), seq)
        pk = s(self._messages_pk(user_id, session_id))
        # The message and the item of its id go together, while both are there: a message
        # is written only while the item of its id holds its sequence number, so none is
        # left, or written again, without it. One not written yet (an append in flight, or
        # failed midway and written by its retry) keeps the item of its id.
        if await self._store.write_together(
            [self._removal({"pk": pk, "sk": s(head)}, claim_key, seq)]
        ):
            return None
        # No message can be written at its sequence number any more: every tail item there
        # is left over (those of an append that wrote the same message again included).
        tails = [
            {"pk": item["pk"], "sk": item["sk"]}
            async for item in self._store.query(
                **self._between(user_id, session_id, f"{head}#", f"{head}#~"),
                ProjectionExpression="pk, sk",
                ConsistentRead=True,
            )
        ]
        if tails:
            await self._store.delete(tails)
        return seq

    async def _message_marks(self, user_id: str, session_id: str) -> dict[str, list[str]]:
        meta = await self._read_meta(user_id, session_id)
        if meta is None:
            return {}
        claims = f"{self._prefix(meta)}~I#"
        return {
            item["message_id"]["S"]: [mark["S"] for mark in item["marks"]["L"]]
            async for item in self._store.query(
                **self._between(user_id, session_id, claims, f"{claims}~"),
                ConsistentRead=True,
            )
            if item.get("marks", {}).get("L")
        }

    async def _session_summary(self, user_id: str, session_id: str) -> str:
        meta = await self._read_meta(user_id, session_id)
        return "" if meta is None else await self._read_summary(user_id, session_id, meta)

    async def _set_session_summary(self, user_id: str, session_id: str, summary: str) -> None:
        while True:
            meta = await self._read_meta(user_id, session_id)
            if meta is None:
                meta, _ = await self._create_meta(user_id, session_id)
            if not summary:
                await self._remove_summary(user_id, session_id, meta)
                return
            if await self._write_summary(user_id, session_id, meta, summary):
                return
            # Deleted (or created again) meanwhile: kept by the session as it is now.

    async def _update_message_marks(
        self,
        user_id: str,
        session_id: str,
        new_mark: str | None,
        old_mark: str | None,
        message_ids: list[str] | None,
    ) -> int:
        meta = await self._read_meta(user_id, session_id)
        if meta is None:
            return 0
        if message_ids is None:
            session = await self._session_with_messages(user_id, session_id, meta)
            message_ids = [m.id for m in session.messages if isinstance(m, Message)]
        updated = await asyncio.gather(
            *(self._remark(user_id, session_id, meta, i, new_mark, old_mark) for i in message_ids)
        )
        return sum(updated)

    async def _remark(
        self,
        user_id: str,
        session_id: str,
        meta: Item,
        message_id: str,
        new_mark: str | None,
        old_mark: str | None,
    ) -> bool:
        """Update the marks of one message; whether it was."""
        key = self._claim_key(user_id, session_id, meta, message_id)
        while True:
            response = await self._store.run(
                "get_item", idempotent=True, Key=key, ConsistentRead=True
            )
            claim = response.get("Item")
            if claim is None:
                return False
            marks = remark(
                [mark["S"] for mark in claim.get("marks", {}).get("L", [])], new_mark, old_mark
            )
            if marks is None:
                return False
            version = number(claim, "marks_version")
            try:
                await self._store.run(
                    "update_item",
                    idempotent=False,
                    Key=key,
                    UpdateExpression="SET marks = :marks, message_id = :id, marks_version = :next",
                    ConditionExpression=(
                        "attribute_exists(#pk) AND "
                        "(attribute_not_exists(marks_version) OR marks_version = :version)"
                    ),
                    ExpressionAttributeNames=names("#pk"),
                    ExpressionAttributeValues={
                        ":marks": {"L": [s(mark) for mark in marks]},
                        ":id": s(message_id),
                        ":next": n(version + 1),
                        ":version": n(version),
                    },
                )
                return True
            except ConditionFailed:
                continue

    def _claim_key(self, user_id: str, session_id: str, meta: Item, message_id: str) -> Item:
        return {
            "pk": s(self._messages_pk(user_id, session_id)),
            "sk": s(f"{self._prefix(meta)}~I#{id_hash(message_id)}"),
        }

    def _removal(self, head: Item, claim: Item | None, seq: int) -> list[Item]:
        """The transaction actions deleting the message at ``seq`` (the key of its head
        item) and the item of its id (when known), each only while it is there: the id's
        only while it holds ``seq``."""
        actions: list[Item] = [
            {
                "Delete": {
                    "TableName": self._store.table_name,
                    "Key": head,
                    "ConditionExpression": f"attribute_exists(#pk) AND {LIVE}",
                    "ExpressionAttributeNames": names("#pk", "#e"),
                    "ExpressionAttributeValues": {":now": n(now())},
                }
            }
        ]
        if claim is not None:
            actions.append(
                {
                    "Delete": {
                        "TableName": self._store.table_name,
                        "Key": claim,
                        "ConditionExpression": "seq = :seq",
                        "ExpressionAttributeValues": {":seq": n(seq)},
                    }
                }
            )
        return actions

    async def _claim_id(
        self, user_id: str, session_id: str, meta: Item, message_id: str, seq: int
    ) -> int:
        """Record that ``message_id`` is at ``seq``; the sequence number it already had if any."""
        key = self._claim_key(user_id, session_id, meta, message_id)
        item: Item = {**key, "seq": n(seq)}
        if self._ttl is not None:
            item["expires_at"] = n(now() + 2 * self._ttl)
        while True:
            try:
                await self._store.run(
                    "put_item",
                    idempotent=False,
                    Item=item,
                    ConditionExpression="attribute_not_exists(#pk)",
                    ExpressionAttributeNames=names("#pk"),
                )
                return seq
            except ConditionFailed:
                response = await self._store.run(
                    "get_item", idempotent=True, Key=key, ConsistentRead=True
                )
                existing = response.get("Item")
                if existing is not None:
                    return number(existing, "seq")

    async def _message_at(
        self, user_id: str, session_id: str, meta: Item, seq: int
    ) -> Message | None:
        """The message stored at ``seq``, even one the append's own sequence numbers hide
        (until its gaps are recorded, they count among the newest N: a message it repeats
        would be taken for gone, and overwritten)."""
        head = position_key(self._prefix(meta), seq)
        items = self._store.query(
            **self._between(user_id, session_id, head, f"{head}#~"), ConsistentRead=True
        )
        bodies = [body async for _, body in assemble(items, now())]
        return decode_message(bodies[0]) if bodies else None


__all__ = ["DynamoDBSessionHistoryService"]

"""Runs on DynamoDB: one partition per run, holding its record and its events.

Table (see :mod:`agentscope_serverless.infra.dynamodb_tables`), with ``U``/``R``/``S`` the
SHA-256 of the user, run and session ids:

=================  ==========================  ===========================================
pk                 sk                          attributes
=================  ==========================  ===========================================
``RUN#U#R``        ``META``                    ``record`` (JSON; a large one: its head,
                                               with ``parts`` and ``version``), ``cancel``,
                                               ``submission`` (a task's), ``expires_at``,
                                               ``stamped_until``
``RUN#U#R``        ``META#<version>#<part>``   the rest of a large record (``body``)
``RUN#U#R``        ``E#<sequence:012d>``       ``body`` (event JSON; large ones: head plus
                                               tail items), ``expires_at``
``RUNS#U#S``       ``<created ms:015d>#R``     ``run_id``, ``expires_at``
``USERRUNS#U``     ``<created ms:015d>#R``     ``run_id``, ``session_pk`` (its ``RUNS#U#S``
                                               entry's), ``expires_at``: every run of the
                                               user, for erasing them
=================  ==========================  ===========================================

The events of a run are read with one consistent ``Query`` of its partition from a sort key
on. With ``ttl_seconds``, a run expires that long after the last write of its record (its
creation, its heartbeat, its end): the META item's ``expires_at`` slides with each. Its
events and its index entries are stamped twice as far ahead, and re-stamped with a write
of the record that finds them (``stamped_until``) due to expire before the record would:
once per TTL while the run is written, whatever its length, so none expires while the run
lives (see :mod:`agentscope_serverless.services._dynamodb`). DynamoDB's TTL deletes
expired items; they are also filtered out on read.

A run deleted while it executes (its session deleted, its user erased) keeps nothing it
writes afterwards: its writer puts its events (or its record's tail items), then makes sure
the META item is still there (a consistent read, or the condition of the record's update),
and deletes what it put when it is gone. Deleting a run queries its partition and deletes
what it finds until a query finds nothing: what a writer put before that last query is
found, and a writer that put after it finds the META gone. A task's record is saved only
while its META holds the task's ``submission`` (the update's condition): a record of the
same id stored since by a later submission keeps nothing the earlier task writes.
"""

from __future__ import annotations

import asyncio

from agentscope_serverless.services._dynamodb import (
    ConditionFailed,
    DynamoDBBackedService,
    DynamoDBClient,
    DynamoDBStore,
    Item,
    assemble,
    id_hash,
    is_live,
    n,
    now,
    number,
    s,
    tail_keys,
)
from agentscope_serverless.services._dynamodb import (
    body_items as _body_items,
)
from agentscope_serverless.services._validation import optional_ttl_seconds
from agentscope_serverless.services.runs.base import RunRecord, RunsService, StoredEvent

_EVENT_PREFIX = "E#"
# Runs read or deleted at once (one after another, a user's day of runs outlasted the
# request erasing them: 30 ms a run).
_CONCURRENCY = 16
_META = "META"


def _event_key(sequence: int) -> str:
    return f"{_EVENT_PREFIX}{sequence:012d}"


def _keys(items: list[Item]) -> list[Item]:
    return [{"pk": item["pk"], "sk": item["sk"]} for item in items]


class DynamoDBRunsService(DynamoDBBackedService, RunsService):
    """Runs on a DynamoDB table.

    >>> runs = DynamoDBRunsService("agentscope-runs", region_name="eu-west-1", ttl_seconds=86400)
    """

    def __init__(
        self,
        table_name: str = "agentscope-runs",
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
            setting="DYNAMODB_RUNS_TABLE",
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
    def _pk(user_id: str, run_id: str) -> str:
        return f"RUN#{id_hash(user_id)}#{id_hash(run_id)}"

    def _expiry(self, at: int, ttls: int = 1) -> Item:
        """The expiry of an item written at ``at``: ``ttls`` TTLs ahead (2: an event's or
        an index entry's, which outlive the record)."""
        return {"expires_at": n(at + ttls * self._ttl)} if self._ttl else {}

    def _meta_key(self, user_id: str, run_id: str) -> Item:
        return {"pk": s(self._pk(user_id, run_id)), "sk": s(_META)}

    def _meta_items(self, record: RunRecord, at: int) -> tuple[list[Item], Item]:
        """The items holding the rest of a large record (none for most), and its META item
        (without the cancellation mark), written at ``at``."""
        stored = record.model_copy(update={"cancel_requested": False}).model_dump_json()
        tails, meta = _body_items(
            self._pk(record.user_id, record.id), _META, stored, self._expiry(at)
        )
        meta["record"] = meta.pop("body")
        if record.submission is not None:
            meta["submission"] = s(record.submission)  # what a save checks (see ``_save``)
        return tails, meta

    def _record_items(self, record: RunRecord, at: int) -> tuple[list[Item], list[Item]]:
        """The items holding the rest of a large record, then the run's META item, its
        entry in the user's index and, with a session, in the session's (written once the
        first are), at ``at``: the META item says how far the run's other items are stamped
        (those written since are stamped further)."""
        tails, meta = self._meta_items(record, at)
        if self._ttl:
            meta["stamped_until"] = n(at + 2 * self._ttl)
        return tails, [meta, *self._index_entries(record, at)]

    def _index_entries(self, record: RunRecord, at: int) -> list[Item]:
        """The run's entry in the user's index and, with a session, in the session's, as
        written at ``at``."""
        user = id_hash(record.user_id)
        entry = {
            "pk": s(f"USERRUNS#{user}"),
            "sk": s(f"{int(record.created_at * 1000):015d}#{id_hash(record.id)}"),
            "run_id": s(record.id),
            **self._expiry(at, 2),
        }
        entries = [entry]
        if record.session_id is not None:
            index = {**entry, "pk": s(f"RUNS#{user}#{id_hash(record.session_id)}")}
            entry["session_pk"] = index["pk"]
            entries.append(index)
        return entries

    def _index_keys(self, record: RunRecord) -> list[Item]:
        """The keys of the run's entries in the indexes."""
        return _keys(self._index_entries(record, 0))

    def _event_items(
        self, user_id: str, run_id: str, events: list[StoredEvent], at: int
    ) -> list[Item]:
        pk = self._pk(user_id, run_id)
        expiry = self._expiry(at, 2)
        items: list[Item] = []
        for sequence, data in events:
            tails, head = _body_items(pk, _event_key(sequence), data, expiry)
            items += [*tails, head]
        return items

    async def _create(self, record: RunRecord) -> None:
        tails, items = self._record_items(record, now())
        await self._store.put(tails)
        await self._store.put(items)

    async def _record(
        self, record: RunRecord, events: list[StoredEvent], create: bool, finish: bool
    ) -> bool | None:
        at = now()
        items = self._event_items(record.user_id, record.id, events, at)
        if not create:
            if finish:
                # The events land before the finished record; its update's condition
                # tells whether the run is still there.
                await self._save_after(record, items)
            elif items:
                await self._put_while_run(record.user_id, record.id, items)
            return None
        tails, record_items = self._record_items(record, at)
        if finish:
            # The events land before the finished record: a reader who sees the run
            # finished finds all of its events.
            await self._store.put([*tails, *items])
            await self._store.put(record_items)
        else:
            await self._store.put(tails)
            await self._store.put([*record_items, *items])
        return None

    async def _save(self, record: RunRecord) -> None:
        await self._save_after(record, [])

    async def _save_after(self, record: RunRecord, items: list[Item]) -> None:
        """Put ``items`` of the run (its events), then save its record; a run deleted
        meanwhile (its META gone), or a task's replaced by a later submission's, keeps
        neither, nor the rest of a large record. The run's events and index entries are
        re-stamped when they would expire before the record saved."""
        at = now()
        tails, meta = self._meta_items(record, at)
        values: Item = {":record": meta["record"]}
        update = "SET #r = :record"
        names = {"#r": "record", "#pk": "pk", "#p": "parts", "#v": "version"}
        if tails:
            update += ", #p = :parts, #v = :version"
            values |= {":parts": meta["parts"], ":version": meta["version"]}
        if self._ttl:
            # A run stored by an earlier release has no ``stamped_until``: 0, restamped.
            update += ", #e = :expires, #s = if_not_exists(#s, :zero)"
            values |= {":expires": n(at + self._ttl), ":zero": n(0)}
            names |= {"#e": "expires_at", "#s": "stamped_until"}
        if not tails:
            update += " REMOVE #p, #v"
        condition = "attribute_exists(#pk)"
        if record.submission is not None:
            condition += " AND #s = :submission"
            names["#s"] = "submission"
            values[":submission"] = s(record.submission)
        written = [*items, *tails]
        await self._store.put(written)
        try:
            response = await self._store.run(
                "update_item",
                idempotent=True,
                Key=self._meta_key(record.user_id, record.id),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                # All of it: ``stamped_until`` too, which the update may leave as it was.
                ReturnValues="ALL_OLD",
            )
        except ConditionFailed:
            await self._store.delete(_keys(written))
            return
        meta_key = self._meta_key(record.user_id, record.id)
        old = response.get("Attributes", {})
        if old.get("version") not in (None, meta.get("version")):
            stale = tail_keys({**meta_key, **old})
            await self._store.delete(stale)
        await self._store.restamp_if_due(
            meta_key, old, meta_key["pk"]["S"], _EVENT_PREFIX, self._ttl, *self._index_keys(record)
        )

    async def _append(self, user_id: str, run_id: str, events: list[StoredEvent]) -> None:
        items = self._event_items(user_id, run_id, events, now())
        await self._put_while_run(user_id, run_id, items)

    async def _put_while_run(self, user_id: str, run_id: str, items: list[Item]) -> None:
        """Put ``items`` in the run's partition, then delete them if the run is gone (deleted
        meanwhile: its deletion may have queried the partition before they landed)."""
        await self._store.put(items)
        response = await self._store.run(
            "get_item",
            idempotent=True,
            Key=self._meta_key(user_id, run_id),
            ProjectionExpression="#pk",
            ExpressionAttributeNames={"#pk": "pk"},
            ConsistentRead=True,
        )
        if "Item" not in response:
            await self._store.delete(_keys(items))

    async def _mark_cancel(self, user_id: str, run_id: str) -> None:
        try:
            await self._store.run(
                "update_item",
                idempotent=True,
                Key=self._meta_key(user_id, run_id),
                UpdateExpression="SET #c = :yes",
                ConditionExpression="attribute_exists(#pk)",
                ExpressionAttributeNames={"#c": "cancel", "#pk": "pk"},
                ExpressionAttributeValues={":yes": {"BOOL": True}},
            )
        except ConditionFailed:
            return

    async def _load(self, user_id: str, run_id: str) -> RunRecord | None:
        response = await self._store.run(
            "get_item", idempotent=True, Key=self._meta_key(user_id, run_id), ConsistentRead=True
        )
        item = response.get("Item")
        if item is None or not is_live(item, now()):
            return None
        stored = item["record"]["S"]
        if "parts" in item:
            rest = await self._record_rest(item)
            if rest is None:  # rewritten meanwhile: read the new one
                return await self._load(user_id, run_id)
            stored += rest
        record = RunRecord.model_validate_json(stored)
        record.cancel_requested = bool(item.get("cancel", {}).get("BOOL"))
        return record

    async def _record_rest(self, meta: Item) -> str | None:
        """The rest of a large record, or None when its parts are gone (replaced)."""
        first = f"{_META}#{meta['version']['S']}#"
        parts = [
            item["body"]["S"]
            async for item in self._store.query(
                KeyConditionExpression="pk = :pk AND sk BETWEEN :low AND :high",
                ExpressionAttributeValues={
                    ":pk": meta["pk"],
                    ":low": s(first),
                    ":high": s(f"{first}~"),
                },
                ConsistentRead=True,
            )
        ]
        return "".join(parts) if len(parts) == number(meta, "parts", 1) - 1 else None

    async def _list(self, user_id: str, session_id: str) -> list[RunRecord]:
        index = f"RUNS#{id_hash(user_id)}#{id_hash(session_id)}"
        return await self._indexed(user_id, "pk = :pk", {":pk": s(index)})

    async def _list_user(self, user_id: str, since: float) -> list[RunRecord]:
        return await self._indexed(
            user_id,
            "pk = :pk AND sk >= :since",
            {":pk": s(f"USERRUNS#{id_hash(user_id)}"), ":since": s(f"{int(since * 1000):015d}")},
        )

    async def _indexed(self, user_id: str, condition: str, values: Item) -> list[RunRecord]:
        """The records of the runs an index lists (its entries matching ``condition``)."""
        at = now()
        run_ids = [
            item["run_id"]["S"]
            async for item in self._store.query(
                KeyConditionExpression=condition,
                ExpressionAttributeValues=values,
                ConsistentRead=True,
            )
            if is_live(item, at)
        ]
        return await self._records(user_id, run_ids)

    async def _records(self, user_id: str, run_ids: list[str]) -> list[RunRecord]:
        """The records of the runs still there, in the order of ``run_ids``, read a few at a
        time."""
        records: list[RunRecord | None] = []
        for start in range(0, len(run_ids), _CONCURRENCY):
            chunk = run_ids[start : start + _CONCURRENCY]
            records += await asyncio.gather(*(self._load(user_id, r) for r in chunk))
        return [record for record in records if record is not None]

    async def _delete_user(self, user_id: str) -> None:
        await self._delete_indexed(user_id, f"USERRUNS#{id_hash(user_id)}")

    async def _delete_session(self, user_id: str, session_id: str) -> None:
        await self._delete_indexed(user_id, f"RUNS#{id_hash(user_id)}#{id_hash(session_id)}")

    async def _delete_indexed(self, user_id: str, index: str) -> None:
        """Delete the runs listed in the partition ``index`` (the user's or a session's),
        until none is left (runs created meanwhile included). A run's entries in the two
        indexes share their sort key; they go once the run has, so a retry after a failure
        finds the run again."""
        user_index = s(f"USERRUNS#{id_hash(user_id)}")
        while True:
            entries = [
                item
                async for item in self._store.query(
                    KeyConditionExpression="pk = :pk",
                    ExpressionAttributeValues={":pk": s(index)},
                    ConsistentRead=True,
                )
            ]
            if not entries:
                return
            for start in range(0, len(entries), _CONCURRENCY):
                chunk = entries[start : start + _CONCURRENCY]
                await asyncio.gather(*(self._delete_run(user_id, e, user_index) for e in chunk))

    async def _delete_run(self, user_id: str, entry: Item, user_index: Item) -> None:
        """Delete the run an index ``entry`` lists, then its entries in both indexes."""
        other_index = [
            {"pk": other, "sk": entry["sk"]}
            for other in (entry.get("session_pk"), user_index)
            if other is not None and other != entry["pk"]
        ]
        await self._store.delete_partition(
            self._pk(user_id, entry["run_id"]["S"]),
            *other_index,
            {"pk": entry["pk"], "sk": entry["sk"]},
        )

    async def _delete_run_of(self, record: RunRecord) -> None:
        await self._store.delete_partition(
            self._pk(record.user_id, record.id), *self._index_keys(record)
        )

    async def _read(
        self, user_id: str, run_id: str, after: int, limit: int | None
    ) -> list[StoredEvent]:
        items = self._store.query(
            KeyConditionExpression="pk = :pk AND sk BETWEEN :low AND :high",
            ExpressionAttributeValues={
                ":pk": s(self._pk(user_id, run_id)),
                ":low": s(_event_key(after + 1)),
                ":high": s(f"{_EVENT_PREFIX}~"),
            },
            ConsistentRead=True,
        )
        events: list[StoredEvent] = []
        async for head, body in assemble(items, now()):
            events.append((int(head["sk"]["S"][len(_EVENT_PREFIX) :]), body))
            if limit is not None and len(events) == limit:
                break
        return events


__all__ = ["DynamoDBRunsService"]

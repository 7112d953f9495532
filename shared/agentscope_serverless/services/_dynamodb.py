"""What both DynamoDB backends share: the client, the error policy, keys, TTL and large bodies.

**Keys.** Ids go into keys as SHA-256 digests (:func:`id_hash`): fixed length (ids may be
512 characters of any script, more than a key may hold), no separator can be forged, and
the readable ids are kept as attributes.

**Containers.** Both backends store a *container* (a session, a session's state): a meta
item that says the container exists, with its ``generation`` (random, new each time the
container is created) and its expiry, and *children* (messages, rounds) in one partition,
with sort keys ``<letter>#<generation>#<position:020d>``. Deleting or re-creating a
container makes its old children unreachable at once, whatever is left of them.

**Bodies.** A child holds a JSON body. One larger than an item may hold (400 KB) is split
into a head item and tail items (``<head sort key>#<version>#<part:05d>``); the tails are
written first and the head last, so a reader never sees a partial body.

**TTL.** With ``ttl_seconds``, the meta item's ``expires_at`` slides on every read and
write; children get ``expires_at`` twice as far ahead, and are re-stamped (at most once
per TTL period) when the meta's ``stamped_until`` falls behind, so they always outlive
the meta. Expired items are filtered out on read (DynamoDB deletes them only eventually).
Expiries are whole epoch seconds rounded up (:func:`now`): never before the TTL has passed.

**Errors.** Failures become :class:`StoreUnavailableError`; only idempotent requests are
retried (reads, deletes, puts of a fixed key), never counter updates, and none that timed
out: a call takes at most about one ``connect_timeout`` plus one ``read_timeout``.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterable
from contextlib import AsyncExitStack, aclosing, suppress
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeVar

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    NoCredentialsError,
    NoRegionError,
    ReadTimeoutError,
)

from agentscope_serverless.errors import ConfigurationError, StoreUnavailableError
from agentscope_serverless.infra.dynamodb_tables import TTL_ATTRIBUTE
from agentscope_serverless.log import logger
from agentscope_serverless.services.base import StartedGuard

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient
else:
    DynamoDBClient = Any

Item = dict[str, Any]
T = TypeVar("T")

# A body chunk, in bytes of UTF-8: an item (chunk plus keys and attributes) stays < 400 KB.
BODY_CHUNK_BYTES = 350_000
_BATCH_SIZE = 25
# Items whose expiry a re-stamp pushes ahead at once.
_RESTAMP_CONCURRENCY = 16
_THROTTLING = {
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
}
# A transaction canceled (throttled, or in conflict with another) wrote nothing.
_TRANSIENT = _THROTTLING | {
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionCanceledException",
}
# The most items one TransactWriteItems request may hold, and (with room for the request's
# own overhead) the most bytes of items: DynamoDB takes 4 MB.
_TRANSACTION_ITEMS = 100
_TRANSACTION_BYTES = 3_500_000
_RETRY_DELAYS = (0.05, 0.2)
# A throttled request is tried longer, backing off (with jitter, so that the functions
# throttled together do not come back together): DynamoDB throttles for as long as a
# partition's capacity is used up, a second or so, and a request failed by it was never
# executed. Given up after 1.5 s at most of waiting: 5 tries more, as AWS's SDKs do.
_THROTTLED_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8)
_CODE = re.compile(r"[^A-Za-z0-9.]")
# What DynamoDB's ValidationException says of a key the table's key schema does not have
# (a table made for something else), as opposed to the other invalid requests it refuses.
_KEY_SCHEMA_MISMATCH = re.compile(
    r"Missing the key|does not match the schema|missed key schema element"
)

# Expression attribute names used by the backends (several are DynamoDB reserved words).
NAMES = {
    "#e": TTL_ATTRIBUTE,
    "#g": "generation",
    "#m": "max_round",
    "#o": "creation_order",
    "#p": "part",
    "#s": "stamped_until",
    "#i": "indexed",
    "#pk": "pk",
}


# The condition of an item that has not expired (it may still exist in DynamoDB), with
# ``:now`` from :func:`now`; its opposite, an expired item's, is ``#e < :now``.
LIVE = "(attribute_not_exists(#e) OR #e >= :now)"


def names(*aliases: str) -> dict[str, str]:
    """``ExpressionAttributeNames`` for these aliases of :data:`NAMES`."""
    return {alias: NAMES[alias] for alias in aliases}


class ConditionFailed(Exception):
    """A conditional write did not apply. Internal: caught inside the backends.

    ``failed``: for a transaction, the positions of its actions whose condition failed.
    """

    def __init__(self, code: str, failed: tuple[int, ...] = ()) -> None:
        super().__init__(code)
        self.failed = failed


def id_hash(value: str) -> str:
    """The key form of an id: its SHA-256, in hex.

    >>> id_hash("u1")[:12]
    'bb82030dbc2b'
    """
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def now() -> int:
    """The current time in whole epoch seconds (DynamoDB's TTL counts those), rounded up.

    An expiry of ``now() + ttl`` falls ``ttl`` seconds from now or up to a second later,
    never earlier; an item lives while its expiry is at least ``now()``, so until that
    second has passed (:data:`LIVE`, :func:`is_live`)."""
    return math.ceil(time.time())


def s(value: str) -> dict[str, str]:
    """A string attribute value."""
    return {"S": value}


def n(value: int) -> dict[str, str]:
    """A number attribute value."""
    return {"N": str(value)}


def number(item: Item, name: str, default: int = 0) -> int:
    """The number attribute ``name`` of ``item`` (``default`` when absent)."""
    value = item.get(name)
    return int(value["N"]) if value else default


def is_live(item: Item, at: int) -> bool:
    """False when the item has expired at ``at`` (from :func:`now`): its expiry is before
    it. DynamoDB may not have deleted it yet."""
    return number(item, TTL_ATTRIBUTE, at) >= at


def new_generation() -> str:
    """A fresh container generation."""
    return uuid.uuid4().hex[:16]


def position_key(prefix: str, position: int) -> str:
    """The head sort key of the child at ``position``: ``<prefix><position:020d>``."""
    return f"{prefix}{position:020d}"


def position_of(prefix: str, sort_key: str) -> int:
    """The position encoded in a head or tail sort key made by :func:`position_key`."""
    return int(sort_key[len(prefix) :].partition("#")[0])


def _split_utf8(body: str, limit: int) -> list[str]:
    data = body.encode("utf-8", "surrogatepass")
    chunks: list[str] = []
    start = 0
    while start < len(data) or not chunks:
        end = min(start + limit, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:  # never cut a character
            end -= 1
        chunks.append(data[start:end].decode("utf-8", "surrogatepass"))
        start = end
    return chunks


def body_items(pk: str, sk: str, body: str, extra: Item) -> tuple[list[Item], Item]:
    """The tail items and the head item storing ``body`` at ``sk``, with ``extra`` attributes."""
    chunks = _split_utf8(body, BODY_CHUNK_BYTES)
    head: Item = {"pk": s(pk), "sk": s(sk), "body": s(chunks[0]), **extra}
    if len(chunks) == 1:
        return [], head
    version = uuid.uuid4().hex[:12]
    head |= {"parts": n(len(chunks)), "version": s(version)}
    tails = [
        {
            "pk": s(pk),
            "sk": s(f"{sk}#{version}#{i:05d}"),
            "part": n(i),
            "version": s(version),
            "body": s(chunk),
            **extra,
        }
        for i, chunk in enumerate(chunks[1:], start=1)
    ]
    return tails, head


def _item_size(item: Item) -> int:
    """About the bytes DynamoDB counts for ``item`` (names and values; a little more)."""
    return sum(len(name) + len(str(value).encode()) for name, value in item.items())


def _action_key(action: Item) -> str:
    """The item a ``TransactWriteItems`` action writes, deletes or checks, as a string."""
    [operation] = action.values()
    key = operation.get("Key") or {"pk": operation["Item"]["pk"], "sk": operation["Item"]["sk"]}
    return f"{key['pk']['S']}\n{key['sk']['S']}"


def _transactions(units: list[list[Item]]) -> list[list[int]]:
    """``units`` (lists of ``TransactWriteItems`` actions) in groups that each fit in one
    transaction (100 actions, 4 MB, each item once), in order: their indexes."""
    groups: list[list[int]] = [[]]
    size = 0
    keys: set[str] = set()
    for index, unit in enumerate(units):
        unit_size = sum(_item_size(action) for action in unit)
        unit_keys = {_action_key(action) for action in unit}
        if groups[-1] and (
            sum(len(units[i]) for i in groups[-1]) + len(unit) > _TRANSACTION_ITEMS
            or size + unit_size > _TRANSACTION_BYTES
            or keys & unit_keys
        ):
            groups.append([])
            size = 0
            keys = set()
        groups[-1].append(index)
        size += unit_size
        keys |= unit_keys
    return groups


def tail_keys(head: Item) -> list[Item]:
    """The keys of the tail items of a head item."""
    pk, sk, version = head["pk"], head["sk"]["S"], head.get("version", {}).get("S")
    return [
        {"pk": pk, "sk": s(f"{sk}#{version}#{i:05d}")} for i in range(1, number(head, "parts", 1))
    ]


async def assemble(items: AsyncIterator[Item], at: int) -> AsyncIterator[tuple[Item, str]]:
    """``(head, body)`` of every complete, live body in ``items`` (in ascending key order)."""
    head: Item | None = None
    parts: list[str] = []
    async for item in items:
        if "part" not in item:
            if head is not None and len(parts) == number(head, "parts", 1) - 1:
                yield head, head["body"]["S"] + "".join(parts)
            head, parts = (item, []) if is_live(item, at) else (None, [])
        elif head is not None and item.get("version") == head.get("version") and is_live(item, at):
            parts.append(item["body"]["S"])
    if head is not None and len(parts) == number(head, "parts", 1) - 1:
        yield head, head["body"]["S"] + "".join(parts)


async def iterate(items: Iterable[Item]) -> AsyncIterator[Item]:
    """``items`` as an async iterator (for :func:`assemble`)."""
    for item in items:
        yield item


async def take(items: AsyncGenerator[T, None], count: int) -> list[T]:
    """The first ``count`` items (fewer when there are fewer); reads no further."""
    taken: list[T] = []
    async with aclosing(items):
        async for item in items:
            taken.append(item)
            if len(taken) == count:
                break
    return taken


async def gather_bounded(calls: Iterable[Awaitable[T]], limit: int) -> list[T]:
    """Await ``calls``, ``limit`` at most at once; their results, in order."""
    slots = asyncio.Semaphore(limit)

    async def one(call: Awaitable[T]) -> T:
        async with slots:
            return await call

    return await asyncio.gather(*(one(call) for call in calls))


@lru_cache(maxsize=8)
def _session(
    region_name: str | None,
    aws_access_key_id: str | None,
    aws_secret_access_key: str | None,
    aws_session_token: str | None,
) -> aioboto3.Session:
    # Shared by the services of a process: a session loads the DynamoDB model once.
    return aioboto3.Session(
        region_name=region_name,
        aws_access_key_id=aws_access_key_id,
        aws_secret_access_key=aws_secret_access_key,
        aws_session_token=aws_session_token,
    )


def _tables_of(operation: str, kwargs: dict[str, Any]) -> set[str]:
    """The tables a request of ``operation`` with ``kwargs`` writes or reads (a batch or a
    transaction may span several)."""
    if operation == "batch_write_item":
        return set(kwargs.get("RequestItems", {}))
    if operation == "transact_write_items":
        items: list[dict[str, dict[str, Any]]] = kwargs.get("TransactItems", [])
        return {action.get("TableName", "") for item in items for action in item.values()}
    return {kwargs.get("TableName", "")}


async def _release(exit_stack: AsyncExitStack, loop: asyncio.AbstractEventLoop | None) -> None:
    """Close a client made in ``loop``. From another event loop nothing is awaited there:
    when ``loop`` is closed its connections went with it (closing them waits for nothing),
    else the client is closed in ``loop`` when it next runs."""
    if loop is None or loop is asyncio.get_running_loop():
        await exit_stack.aclose()
    elif loop.is_closed():
        with suppress(Exception):
            await exit_stack.aclose()
    else:
        with suppress(RuntimeError):  # closed meanwhile
            loop.call_soon_threadsafe(_close_in_loop, exit_stack)


# The closes scheduled in other event loops, kept until done (a loop keeps only weak
# references to its tasks).
_closing: set[asyncio.Task[None]] = set()


def _close_in_loop(exit_stack: AsyncExitStack) -> None:
    task = asyncio.get_running_loop().create_task(exit_stack.aclose())
    _closing.add(task)
    task.add_done_callback(_closing.discard)


class DynamoDBStore:
    """A DynamoDB client bound to one table, with the backends' error and retry policy.

    With ``client`` given it is used as-is and never closed here; otherwise ``open()``
    creates an aioboto3 client (credentials from the usual AWS chain unless given), and
    creates it again when called from another event loop than the one it was made in.

    ``setting`` names the setting that names the table (``DYNAMODB_SESSIONS_TABLE``...): an
    error of a table missing, or not made for this store, names both.

    >>> store = DynamoDBStore(table_name="agentscope-sessions", region_name="eu-west-1")
    """

    def __init__(
        self,
        *,
        table_name: str,
        setting: str | None = None,
        client: DynamoDBClient | None = None,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 10.0,
    ) -> None:
        self.table_name = table_name
        self.setting = setting
        self._injected = client
        self._client: DynamoDBClient | None = None
        self._endpoint_url = endpoint_url
        self._session = _session(
            region_name, aws_access_key_id, aws_secret_access_key, aws_session_token
        )
        # No retries inside botocore: `run` decides what may be replayed.
        self._config = AioConfig(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"total_max_attempts": 1, "mode": "standard"},
        )
        self._exit_stack: AsyncExitStack | None = None
        # The event loop of the client this store made (None for one given).
        self._loop: asyncio.AbstractEventLoop | None = None

    async def open(self) -> None:
        """Create the client (no request is made until the first call); an open store
        stays as it is."""
        if self._client is not None:
            return
        if self._injected is not None:
            self._client = self._injected
            return
        self._client, self._exit_stack = await self._new_client()
        self._loop = asyncio.get_running_loop()

    async def close(self) -> None:
        """Close the client if this store created it."""
        self._client = None
        exit_stack, self._exit_stack = self._exit_stack, None
        loop, self._loop = self._loop, None
        if exit_stack is not None:
            await _release(exit_stack, loop)

    async def _new_client(self) -> tuple[DynamoDBClient, AsyncExitStack]:
        exit_stack = AsyncExitStack()
        try:
            client = await exit_stack.enter_async_context(
                self._session.client(
                    "dynamodb", endpoint_url=self._endpoint_url, config=self._config
                )
            )
        except NoRegionError:
            await exit_stack.aclose()
            raise ConfigurationError(
                f"DynamoDB table {self.table_name!r} needs an AWS region: set AWS_REGION "
                "(or AWS_DEFAULT_REGION), or pass region_name"
            ) from None
        return client, exit_stack

    async def _reopen(self) -> None:
        """Make the client again for the running event loop: its HTTP connections belong to
        the loop that made them, which may be closed by now (a script's or a test's
        ``asyncio.run``), and fail in any other. The old client is dropped."""
        loop = asyncio.get_running_loop()
        client, exit_stack = await self._new_client()
        if self._client is None or self._loop is loop:
            # Closed meanwhile, or another call of this loop made a client first.
            await exit_stack.aclose()
            if self._client is None:
                raise StoreUnavailableError("dynamodb", "the client is closed")
            return
        old_stack, old_loop = self._exit_stack, self._loop
        self._client, self._exit_stack, self._loop = client, exit_stack, loop
        if old_stack is not None:
            await _release(old_stack, old_loop)

    async def ping(self) -> bool:
        """True when the table can be described (the endpoint answers, the table exists).
        A connection that failed (one DynamoDB closed meanwhile) is tried again, as a read's."""
        if self._client is None:
            return False
        try:
            await self.run("describe_table", idempotent=True)
        except StoreUnavailableError:
            return False
        return True

    async def run(self, operation: str, *, idempotent: bool, **kwargs: Any) -> dict[str, Any]:
        """Send ``operation`` (a client method name) on the table; return its response.

        Failures become :class:`StoreUnavailableError`, a failed condition
        :class:`ConditionFailed`. Throttled requests (never executed) are retried, backing
        off, for 1.5 s at most; other transient failures only when ``idempotent``, and a
        request that timed out never.
        """
        if self._client is None:
            raise StoreUnavailableError("dynamodb", "the client is closed")
        if self._loop is not asyncio.get_running_loop() and self._injected is None:
            await self._reopen()
        if operation not in ("batch_write_item", "transact_write_items"):
            kwargs["TableName"] = self.table_name
        method = getattr(self._client, operation)
        attempt = 0
        while True:
            delays: tuple[float, ...] = _RETRY_DELAYS
            try:
                response: dict[str, Any] = await method(**kwargs)
                return response
            except ClientError as exc:
                error = exc.response.get("Error", {})
                code = error.get("Code", "")
                if code == "ConditionalCheckFailedException":
                    raise ConditionFailed(code) from None
                reasons = [r.get("Code") for r in exc.response.get("CancellationReasons", [])]
                if "ConditionalCheckFailed" in reasons:
                    # Not transient: the transaction would fail again.
                    failed = (i for i, r in enumerate(reasons) if r == "ConditionalCheckFailed")
                    raise ConditionFailed(code, tuple(failed)) from None
                retry = code in (_TRANSIENT if idempotent else _THROTTLING)
                if code in _THROTTLING:
                    delays = _THROTTLED_DELAYS
                # The code only: a message may carry the endpoint or an emulator's HTML page.
                failure = _CODE.sub("", str(code))[:64] or "the request failed"
                detail = f"{code}: {error.get('Message', '')}"
                if _tables_of(operation, kwargs) == {self.table_name}:
                    failure = self._table_failure(code, str(error.get("Message", ""))) or failure
            except NoCredentialsError as exc:
                retry = False
                failure = (
                    "no AWS credentials were found (set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY)"
                )
                detail = f"{type(exc).__name__}: {exc}"
            except (TimeoutError, BotoCoreError, OSError) as exc:
                timed_out = isinstance(exc, TimeoutError | ReadTimeoutError | ConnectTimeoutError)
                # A request that got no answer in time is not sent again: it has taken its
                # timeout already, and a store that stopped answering would make the call
                # take it as many times as it is tried (a Lambda function's whole time).
                retry = idempotent and not timed_out
                failure = "the request timed out" if timed_out else "the connection failed"
                detail = f"{type(exc).__name__}: {exc}"
            if self._client is None:
                # Closed under the request (by stop()): DynamoDB did not fail.
                raise StoreUnavailableError("dynamodb", "the client is closed") from None
            if not retry or attempt >= len(delays):
                logger.warning(
                    "dynamodb request failed",
                    extra={"error": detail[:500], "table": self.table_name, "failure": failure},
                )
                raise StoreUnavailableError("dynamodb", failure) from None
            await asyncio.sleep(delays[attempt] * random.uniform(0.5, 1.0))
            attempt += 1

    def _table_failure(self, code: str, message: str) -> str | None:
        """What is wrong with the table, when ``code`` (and ``message``) says the table is
        missing or lacks the key schema of this store: a misspelt or wrong table name,
        named with its setting."""
        named = f"the table {self.table_name}"
        if self.setting is not None:
            named += f" ({self.setting})"
        if code == "ResourceNotFoundException":
            region = self._session.region_name
            return f"{named} does not exist" + (f" in {region}" if region else "")
        if code == "ValidationException" and _KEY_SCHEMA_MISMATCH.search(message):
            return f"{named} does not have the key schema this store needs"
        return None

    async def query(self, **kwargs: Any) -> AsyncIterator[Item]:
        """The items of a Query on the table, page after page."""
        while True:
            page = await self.run("query", idempotent=True, **kwargs)
            for item in page.get("Items", []):
                yield item
            if not page.get("LastEvaluatedKey"):
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    async def put(self, items: list[Item]) -> None:
        """Write ``items`` (full items with fixed keys, so safe to replay)."""
        if len(items) == 1:
            await self.run("put_item", idempotent=True, Item=items[0])
        elif items:
            await self._batch([{"PutRequest": {"Item": item}} for item in items])

    async def put_together(
        self, items: list[Item], checks: list[Item] | None = None, *, first_only: bool = False
    ) -> list[Item]:
        """Write ``items`` (full items with fixed keys, so safe to replay) all or none: in
        one transaction when they fit in one (100 actions, 4 MB), else in a transaction per
        such group, in order.

        ``checks``, one ``ConditionCheck`` (``Key``, ``ConditionExpression``, values) per
        item, writes an item only while its check holds, in the same transaction (two
        actions an item); ``first_only`` writes an item only where none is stored, or one
        of its own ``version`` (this write, replayed). The items refused are left out, the
        others written together all the same. Returns the items left out.
        """
        if checks is None and not first_only and len(items) <= 1:
            await self.put(items)
            return []
        left_out = await self.write_together(self.put_actions(items, checks, first_only=first_only))
        return [items[i] for i in sorted(left_out)]

    def put_actions(
        self, items: list[Item], checks: list[Item] | None = None, *, first_only: bool = False
    ) -> list[list[Item]]:
        """The ``TransactWriteItems`` actions :meth:`put_together` sends: a unit per item,
        its ``Put`` then (with ``checks``) its ``ConditionCheck``."""
        units: list[list[Item]] = []
        for item in items:
            put: Item = {"TableName": self.table_name, "Item": item}
            if first_only:
                put["ExpressionAttributeNames"] = names("#pk")
                put["ConditionExpression"] = "attribute_not_exists(#pk)"
                if "version" in item:
                    put["ConditionExpression"] += " OR version = :version"
                    put["ExpressionAttributeValues"] = {":version": item["version"]}
            units.append([{"Put": put}])
        if checks is not None:
            for unit, check in zip(units, checks, strict=True):
                unit.append({"ConditionCheck": {"TableName": self.table_name, **check}})
        return units

    async def write_together(self, units: list[list[Item]]) -> dict[int, set[int]]:
        """Send ``units``, each a list of ``TransactWriteItems`` actions that go together:
        in one transaction when they fit in one (100 actions, 4 MB, each item once), else
        in a transaction per such group, in order. A unit one of whose conditions fails is
        left out, the others written together all the same. Returns the units left out, by
        index, each with the positions in it of the actions whose condition failed."""
        left_out: dict[int, set[int]] = {}
        for group in _transactions(units):
            while group:
                failed = await self.write_all_or_none([units[i] for i in group])
                if not failed:
                    break
                for index, positions in failed.items():
                    left_out[group[index]] = positions
                group = [i for i in group if i not in left_out]
        return left_out

    def fit_together(self, units: list[list[Item]]) -> bool:
        """Whether ``units`` fit in one ``TransactWriteItems`` (see :meth:`write_together`)."""
        return len(_transactions(units)) == 1

    async def write_all_or_none(self, units: list[list[Item]]) -> dict[int, set[int]]:
        """Send ``units`` (which :meth:`fit_together`) in one transaction: all are written,
        or, when one of their conditions fails, none. Returns the units whose condition
        failed (``{}``: all were written), as :meth:`write_together` does."""
        try:
            await self.run(
                "transact_write_items",
                idempotent=True,
                TransactItems=[action for unit in units for action in unit],
            )
        except ConditionFailed as failure:
            if not failure.failed:
                raise
            owners = [
                (i, position) for i, unit in enumerate(units) for position in range(len(unit))
            ]
            failed: dict[int, set[int]] = {}
            for position in failure.failed:
                index, action = owners[position]
                failed.setdefault(index, set()).add(action)
            return failed
        return {}

    async def delete(self, keys: list[Item]) -> None:
        """Delete the items with these keys (missing ones are fine)."""
        await self._batch([{"DeleteRequest": {"Key": key}} for key in keys])

    async def delete_partition(self, pk: str, *also: Item) -> None:
        """Delete every item of the partition ``pk``, querying it again until it is empty
        (items written meanwhile go too: a writer that puts items after the last query
        finds its container gone, and deletes them), and the items with the keys ``also``
        after them (an index entry: a retry after a failure still finds the partition)."""
        while True:
            keys = [
                {"pk": item["pk"], "sk": item["sk"]}
                async for item in self.query(
                    KeyConditionExpression="pk = :pk",
                    ExpressionAttributeValues={":pk": s(pk)},
                    ProjectionExpression="pk, sk",
                    ConsistentRead=True,
                )
            ]
            if not keys:
                break
            await self.delete(keys)
        if also:
            await self.delete(list(also))

    async def delete_together(self, keys: list[Item]) -> None:
        """Delete the items with these keys in transactions of up to 100 items (one
        transaction, all or nothing, when there are at most 100)."""
        for start in range(0, len(keys), _TRANSACTION_ITEMS):
            chunk = keys[start : start + _TRANSACTION_ITEMS]
            await self.run(
                "transact_write_items",
                idempotent=True,
                TransactItems=[
                    {"Delete": {"TableName": self.table_name, "Key": key}} for key in chunk
                ],
            )

    async def read_container(self, key: Item, ttl: int | None) -> Item | None:
        """The live meta item at ``key``; with a TTL, reading it also slides its expiry."""
        at = now()
        if ttl is None:
            response = await self.run("get_item", idempotent=True, Key=key, ConsistentRead=True)
            item: Item | None = response.get("Item")
            return item if item is not None and is_live(item, at) else None
        try:
            response = await self.run(
                "update_item",
                idempotent=True,
                Key=key,
                UpdateExpression="SET #e = :expires",
                ConditionExpression=f"attribute_exists(#pk) AND {LIVE}",
                ExpressionAttributeNames=names("#e", "#pk"),
                ExpressionAttributeValues={":expires": n(at + ttl), ":now": n(at)},
                ReturnValues="ALL_NEW",
            )
        except ConditionFailed:
            return None
        meta: Item = response["Attributes"]
        return meta

    async def holds(self, key: Item, meta: Item) -> bool:
        """True while the container item at ``key`` is still ``meta``'s generation.

        A writer asks after writing children: a delete takes the meta item first and then
        the children it finds, so children written after that Query are the writer's to
        delete (it sees the meta gone), and those written before it the delete's.
        """
        response = await self.run(
            "get_item",
            idempotent=True,
            Key=key,
            ProjectionExpression="#g",
            ExpressionAttributeNames=names("#g"),
            ConsistentRead=True,
        )
        item = response.get("Item")
        return item is not None and item.get("generation") == meta["generation"]

    async def set_if(self, key: Item, name: str, value: int, condition: str) -> None:
        """Set the number attribute ``name`` (an alias of :data:`NAMES`) where ``condition``
        (which may use ``:value``) holds; nothing happens where it does not."""
        try:
            await self.run(
                "update_item",
                idempotent=True,
                Key=key,
                UpdateExpression=f"SET {name} = :value",
                ConditionExpression=condition,
                ExpressionAttributeNames=names(name, *re.findall(r"#\w+", condition)),
                ExpressionAttributeValues={":value": n(value)},
            )
        except ConditionFailed:
            return

    async def restamp_if_due(
        self,
        meta_key: Item,
        meta: Item,
        children_pk: str,
        prefix: str,
        ttl: int | None,
        *also: Item,
    ) -> None:
        """Push the children's expiry ahead of the meta item's, at most once per TTL, and
        that of the items with the keys ``also`` (an index item elsewhere) with them."""
        at = now()
        if ttl is None or number(meta, "stamped_until") >= at + ttl:
            return
        target = at + 2 * ttl
        children = [
            {"pk": item["pk"], "sk": item["sk"]}
            async for item in self.query(
                KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
                ExpressionAttributeValues={":pk": s(children_pk), ":prefix": s(prefix)},
                ProjectionExpression="pk, sk, #e",
                ExpressionAttributeNames=names("#e"),
                ConsistentRead=True,
            )
            if number(item, TTL_ATTRIBUTE) < target
        ]
        indexed = "attribute_exists(#pk) AND (attribute_not_exists(#e) OR #e < :value)"
        # A few at once: a run streams thousands of events.
        await gather_bounded(
            [
                *(self.set_if(key, "#e", target, "attribute_exists(#pk)") for key in children),
                *(self.set_if(key, "#e", target, indexed) for key in also),
            ],
            _RESTAMP_CONCURRENCY,
        )
        await self.set_if(meta_key, "#s", target, "attribute_exists(#pk) AND #s < :value")

    async def _batch(self, requests: list[Item]) -> None:
        for start in range(0, len(requests), _BATCH_SIZE):
            pending = requests[start : start + _BATCH_SIZE]
            for delay in (*_RETRY_DELAYS, 0.5, 1.0, None):
                result = await self.run(
                    "batch_write_item", idempotent=True, RequestItems={self.table_name: pending}
                )
                pending = result.get("UnprocessedItems", {}).get(self.table_name, [])
                if not pending:
                    break
                if delay is None:
                    raise StoreUnavailableError("dynamodb", "writes stayed unprocessed")
                await asyncio.sleep(delay)


class DynamoDBBackedService(StartedGuard):
    """The lifecycle of a service on a :class:`DynamoDBStore`: ``health`` describes the table."""

    _store: DynamoDBStore

    async def start(self) -> None:
        await self._store.open()
        self._set_started(True)

    async def stop(self) -> None:
        await self._finish_calls()
        await self._store.close()

    async def health(self) -> bool:
        return self._started and await self._store.ping()


__all__ = [
    "BODY_CHUNK_BYTES",
    "LIVE",
    "NAMES",
    "ConditionFailed",
    "DynamoDBBackedService",
    "DynamoDBClient",
    "DynamoDBStore",
    "Item",
    "assemble",
    "body_items",
    "gather_bounded",
    "id_hash",
    "is_live",
    "iterate",
    "n",
    "names",
    "new_generation",
    "now",
    "number",
    "position_key",
    "position_of",
    "s",
    "tail_keys",
    "take",
]

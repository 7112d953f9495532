"""The DynamoDB backends against moto's server: large items, TTL, cost, cursors, failures."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError
from types_aiobotocore_dynamodb import DynamoDBClient

from agentscope_serverless.auth.dynamodb import DynamoDBKeyStore
from agentscope_serverless.errors import (
    ConfigurationError,
    InvalidInputError,
    MessageIdConflictError,
    StoreUnavailableError,
)
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer
from agentscope_serverless.log import logger
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services._dynamodb import DynamoDBStore, id_hash, now
from agentscope_serverless.services.agent_state.dynamodb import DynamoDBStateService
from agentscope_serverless.services.idempotency.dynamodb import DynamoDBIdempotencyStore
from agentscope_serverless.services.runs.base import RunRecord
from agentscope_serverless.services.runs.dynamodb import DynamoDBRunsService
from agentscope_serverless.services.session_history.dynamodb import (
    DynamoDBSessionHistoryService,
)
from agentscope_serverless.tasks import TaskDefinition, run_task

# Multi-byte characters make sure bodies are split between characters, never inside one.
ONE_MEGABYTE_TEXT = ("héllo wörld ✓ 𝄞 " * 60_000)[:1_000_000]


def msg(text: str) -> Message:
    return Message(role="user", content=[TextContent(text=text)])


def texts(session: Session | None) -> list[str | None]:
    assert session is not None
    return [m.get_text_content() for m in session.messages if isinstance(m, Message)]


def history_on(server: DynamoDBServer, **options: Any) -> DynamoDBSessionHistoryService:
    return DynamoDBSessionHistoryService(
        server.sessions_table,
        endpoint_url=server.endpoint_url,
        region_name=server.region,
        **LOCAL_AWS_CREDENTIALS,
        **options,
    )


def state_on(server: DynamoDBServer, **options: Any) -> DynamoDBStateService:
    return DynamoDBStateService(
        server.state_table,
        endpoint_url=server.endpoint_url,
        region_name=server.region,
        **LOCAL_AWS_CREDENTIALS,
        **options,
    )


def session_key(user_id: str, session_id: str) -> dict[str, Any]:
    return {"pk": {"S": f"USER#{id_hash(user_id)}"}, "sk": {"S": f"SESSION#{id_hash(session_id)}"}}


def messages_pk(user_id: str, session_id: str) -> str:
    return f"SESSION#{id_hash(user_id)}#{id_hash(session_id)}"


def state_pk(user_id: str, session_id: str) -> str:
    return f"STATE#{id_hash(user_id)}#{id_hash(session_id)}"


async def partition(client: DynamoDBClient, table: str, pk: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    paginator = client.get_paginator("query")
    async for page in paginator.paginate(
        TableName=table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": pk}},
        ConsistentRead=True,
    ):
        items += page["Items"]
    return items


async def message_items(client: DynamoDBClient, table: str, pk: str) -> list[dict[str, Any]]:
    """The items of a message partition without the markers of message ids."""
    return [item for item in await partition(client, table, pk) if "#~I#" not in item["sk"]["S"]]


async def set_number(
    client: DynamoDBClient, table: str, key: dict[str, Any], name: str, value: int
) -> None:
    await client.update_item(
        TableName=table,
        Key=key,
        UpdateExpression="SET #a = :v",
        ExpressionAttributeNames={"#a": name},
        ExpressionAttributeValues={":v": {"N": str(value)}},
    )


# --- large items ----------------------------------------------------------------------


async def test_a_one_megabyte_message_round_trips_unchanged(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    big = msg(ONE_MEGABYTE_TEXT)
    async with history_on(dynamodb_server) as history:
        session = await history.create_session(user_id, "s1")
        await history.append_message(session, [msg("before"), big, msg("after")])
        stored = await history.get_session(user_id, "s1")
        assert stored is not None
        assert stored.messages[1] == big
        assert texts(stored) == ["before", ONE_MEGABYTE_TEXT, "after"]
        page = await history.list_messages(user_id, "s1", limit=2)
        assert page.items[1] == big
        # Read newest first, its tail items before its head.
        opened = await history.open_session(user_id, "s1", recent=2)
        assert opened.messages[0] == big
        assert texts(opened) == [ONE_MEGABYTE_TEXT, "after"]
    items = await partition(
        dynamodb_client, dynamodb_server.sessions_table, messages_pk(user_id, "s1")
    )
    assert len(items) >= 5  # the big message takes several items, each under 400 KB
    bodies = [item["body"]["S"] for item in items if "body" in item]  # not the id markers
    assert len(bodies) >= 5 and all(len(body.encode()) < 400_000 for body in bodies)


async def test_a_deleted_message_leaves_none_of_its_items_behind(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    big, after = msg(ONE_MEGABYTE_TEXT), msg("after")
    async with history_on(dynamodb_server) as history:
        session = await history.create_session(user_id, "s1")
        await history.append_message(session, [msg("before"), big, after])
        await history.update_message_marks(user_id, "s1", "compressed", None, [big.id])
        assert await history.delete_messages(user_id, "s1", [big.id, after.id]) == 2
        assert texts(await history.get_session(user_id, "s1")) == ["before"]
    items = await partition(
        dynamodb_client, dynamodb_server.sessions_table, messages_pk(user_id, "s1")
    )
    # The message left, and the item of its id: the head and id item of "before" stay.
    assert len(items) == 2, [item["sk"]["S"] for item in items]


async def test_a_one_megabyte_state_round_trips_and_can_be_overwritten(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    big = {"text": ONE_MEGABYTE_TEXT, "numbers": list(range(1000)), "nested": {"ok": True}}
    async with state_on(dynamodb_server) as state:
        assert await state.save_state(user_id, big) == 1
        assert await state.save_state(user_id, {"small": 1}) == 2
        assert await state.export_state(user_id, round_id=1) == big
        assert await state.export_state(user_id) == {"small": 1}

        await state.save_state(user_id, {"replaced": True}, round_id=1)
        assert await state.export_state(user_id, round_id=1) == {"replaced": True}
        items = await partition(
            dynamodb_client, dynamodb_server.state_table, state_pk(user_id, "default")
        )
        assert len(items) == 3  # meta and two one-item rounds: the old parts are gone

        await state.save_state(user_id, big, round_id=2)
        assert await state.export_state(user_id) == big
        assert await state.list_rounds(user_id) == [1, 2]


async def test_a_turn_reads_none_of_its_sessions_summary(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    """A turn reads the session item (strongly consistent reads are paid per 4 KB read),
    and listing reads it through the index: the summary, in items of its own, is in neither."""
    table = dynamodb_server.sessions_table
    summary = "they talked of tea and of coffee " * 3_000  # 99 KB: it fits in an item
    returned: list[int] = []
    session = aioboto3_session()
    async with session.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url) as client:
        client.meta.events.register(
            "after-call.dynamodb",
            lambda parsed, **_: returned.append(len(json.dumps(parsed, default=str))),
        )
        async with DynamoDBSessionHistoryService(table, client=client) as history:
            await history.append_message(Session(id="s1", user_id=user_id), msg("hello"))
            await history.set_session_summary(user_id, "s1", summary)
            returned.clear()
            assert texts(await history.open_session(user_id, "s1", recent=10)) == ["hello"]
            assert [s.id for s in await history.list_sessions(user_id)] == ["s1"]
            assert texts(await history.get_session(user_id, "s1")) == ["hello"]
            # Six answers of a few hundred bytes each (listing reads the user's counter
            # too): far from the summary's 99 KB.
            assert sum(returned) < 6_000, returned
            assert await history.session_summary(user_id, "s1") == summary
    item = await dynamodb_client.get_item(TableName=table, Key=session_key(user_id, "s1"))
    assert "summary" not in item["Item"]


async def test_a_deleted_sessions_summary_leaves_none_of_its_items_behind(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    table = dynamodb_server.sessions_table
    async with history_on(dynamodb_server, ttl_seconds=1000) as history:
        await history.set_session_summary(user_id, "s1", ONE_MEGABYTE_TEXT)
        await history.set_session_summary(user_id, "s2", ONE_MEGABYTE_TEXT)
        items = await partition(dynamodb_client, table, messages_pk(user_id, "s1"))
        # Split as a message is, each item stamped to expire after its session.
        assert len(items) >= 3 and all(len(item["body"]["S"].encode()) < 400_000 for item in items)
        assert all(int(item["expires_at"]["N"]) >= now() + 1990 for item in items)
        # Replaced by a short one, it leaves one item.
        await history.set_session_summary(user_id, "s1", "short")
        assert len(await partition(dynamodb_client, table, messages_pk(user_id, "s1"))) == 1
        await history.set_session_summary(user_id, "s1", ONE_MEGABYTE_TEXT)
        await history.delete_session(user_id, "s1")
        assert await partition(dynamodb_client, table, messages_pk(user_id, "s1")) == []
        await history.delete_user_sessions(user_id)
        assert await partition(dynamodb_client, table, messages_pk(user_id, "s2")) == []


# --- expiry ---------------------------------------------------------------------------


async def test_expired_items_are_invisible_even_before_dynamodb_deletes_them(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    table = dynamodb_server.sessions_table
    past = now() - 10
    async with history_on(dynamodb_server) as history:
        await history.append_message(Session(id="gone", user_id=user_id), msg("old"))
        session = await history.create_session(user_id, "kept")
        await history.append_message(session, [msg("visible"), msg("expired")])

        await set_number(dynamodb_client, table, session_key(user_id, "gone"), "expires_at", past)
        assert await history.get_session(user_id, "gone") is None
        assert [s.id for s in await history.list_sessions(user_id)] == ["kept"]
        assert (await history.create_session(user_id, "gone")).messages == []

        messages = await message_items(dynamodb_client, table, messages_pk(user_id, "kept"))
        expired = {"pk": messages[1]["pk"], "sk": messages[1]["sk"]}
        await set_number(dynamodb_client, table, expired, "expires_at", past)
        assert texts(await history.get_session(user_id, "kept")) == ["visible"]

    async with state_on(dynamodb_server) as state:
        await state.save_state(user_id, {"v": 1})
        await state.save_state(user_id, {"v": 2})
        rounds = await partition(
            dynamodb_client, dynamodb_server.state_table, state_pk(user_id, "default")
        )
        meta, _, newest = ({"pk": item["pk"], "sk": item["sk"]} for item in rounds)
        assert meta["sk"] == {"S": "META"}
        await set_number(dynamodb_client, dynamodb_server.state_table, newest, "expires_at", past)
        assert await state.export_state(user_id) == {"v": 1}
        assert await state.list_rounds(user_id) == [1]

        await set_number(dynamodb_client, dynamodb_server.state_table, meta, "expires_at", past)
        assert await state.export_state(user_id) is None
        assert await state.save_state(user_id, {"v": "fresh"}) == 1


async def test_a_ttl_stamps_items_and_slides_on_every_read(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    table = dynamodb_server.sessions_table
    async with history_on(dynamodb_server, ttl_seconds=1000) as history:
        session = await history.create_session(user_id, "s1")
        await history.append_message(session, msg("hello"))
        start = now()
        key = session_key(user_id, "s1")
        meta = (await dynamodb_client.get_item(TableName=table, Key=key))["Item"]
        assert start - 5 <= int(meta["expires_at"]["N"]) - 1000 <= start
        (message,) = await message_items(dynamodb_client, table, messages_pk(user_id, "s1"))
        assert start - 5 <= int(message["expires_at"]["N"]) - 2000 <= start

        await set_number(dynamodb_client, table, key, "expires_at", start + 10)
        assert texts(await history.get_session(user_id, "s1")) == ["hello"]
        meta = (await dynamodb_client.get_item(TableName=table, Key=key))["Item"]
        assert int(meta["expires_at"]["N"]) >= start + 995


async def test_listing_sessions_slides_the_expiry_of_those_listed(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    table = dynamodb_server.sessions_table
    async with history_on(dynamodb_server, ttl_seconds=1000) as history:
        for session_id in ("s1", "s2"):
            await history.append_message(Session(id=session_id, user_id=user_id), msg("hi"))
        start = now()
        keys = [session_key(user_id, session_id) for session_id in ("s1", "s2")]

        async def expiries() -> list[int]:
            items = [(await dynamodb_client.get_item(TableName=table, Key=k))["Item"] for k in keys]
            return [int(item["expires_at"]["N"]) for item in items]

        for key in keys:
            await set_number(dynamodb_client, table, key, "expires_at", start + 10)
        await history.list_sessions(user_id)
        assert all(expiry >= start + 995 for expiry in await expiries())

        for key in keys:
            await set_number(dynamodb_client, table, key, "expires_at", start + 10)
        await history.list_sessions_page(user_id, limit=1)  # s1 alone
        first, second = await expiries()
        assert first >= start + 995
        assert second == start + 10


async def test_items_are_restamped_before_they_could_outlive_their_session(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    table = dynamodb_server.sessions_table
    async with history_on(dynamodb_server, ttl_seconds=1000) as history:
        await history.append_message(Session(id="s1", user_id=user_id), msg("hello"))
        start = now()
        key = session_key(user_id, "s1")
        (message,) = await message_items(dynamodb_client, table, messages_pk(user_id, "s1"))
        message_key = {"pk": message["pk"], "sk": message["sk"]}
        await set_number(dynamodb_client, table, key, "stamped_until", start + 100)
        await set_number(dynamodb_client, table, message_key, "expires_at", start + 100)

        assert texts(await history.get_session(user_id, "s1")) == ["hello"]
        meta = (await dynamodb_client.get_item(TableName=table, Key=key))["Item"]
        message = (await dynamodb_client.get_item(TableName=table, Key=message_key))["Item"]
        assert int(meta["stamped_until"]["N"]) >= start + 1995
        assert int(message["expires_at"]["N"]) >= start + 1995


def state_index_key(user_id: str, session_id: str) -> dict[str, Any]:
    return {"pk": {"S": f"STATE_USER#{id_hash(user_id)}"}, "sk": {"S": f"S#{id_hash(session_id)}"}}


async def test_a_states_index_item_expires_and_is_restamped_with_its_rounds(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # It had no expiry: the user's index kept a session whose state had expired, for ever.
    table = dynamodb_server.state_table
    async with state_on(dynamodb_server, ttl_seconds=1000) as state:
        await state.save_state(user_id, {"v": 1}, session_id="s1")
        start = now()
        index_key = state_index_key(user_id, "s1")
        index = (await dynamodb_client.get_item(TableName=table, Key=index_key))["Item"]
        (round_item,) = [
            item
            for item in await partition(dynamodb_client, table, state_pk(user_id, "s1"))
            if item["sk"]["S"].startswith("R#")
        ]
        assert start - 5 <= int(index["expires_at"]["N"]) - 2000 <= start
        assert abs(int(index["expires_at"]["N"]) - int(round_item["expires_at"]["N"])) <= 1

        meta_key = {"pk": {"S": state_pk(user_id, "s1")}, "sk": {"S": "META"}}
        await set_number(dynamodb_client, table, meta_key, "stamped_until", start + 100)
        await set_number(dynamodb_client, table, index_key, "expires_at", start + 100)
        assert await state.export_state(user_id, session_id="s1") == {"v": 1}
        index = (await dynamodb_client.get_item(TableName=table, Key=index_key))["Item"]
        assert int(index["expires_at"]["N"]) >= start + 1995

        # One written without an expiry (by an earlier release) gets one with the rounds.
        await dynamodb_client.update_item(
            TableName=table, Key=index_key, UpdateExpression="REMOVE expires_at"
        )
        await set_number(dynamodb_client, table, meta_key, "stamped_until", start + 100)
        assert await state.list_rounds(user_id, session_id="s1") == [1]
        index = (await dynamodb_client.get_item(TableName=table, Key=index_key))["Item"]
        assert int(index["expires_at"]["N"]) >= start + 1995


@pytest.mark.parametrize("ttl_seconds", [None, 1000])
async def test_deleting_a_state_deletes_its_index_item(
    dynamodb_server: DynamoDBServer,
    dynamodb_client: DynamoDBClient,
    user_id: str,
    ttl_seconds: int | None,
) -> None:
    table = dynamodb_server.state_table
    async with state_on(dynamodb_server, ttl_seconds=ttl_seconds) as state:
        for session_id in ("gone", "kept"):
            await state.save_state(user_id, {"v": 1}, session_id=session_id)
        await state.delete_state(user_id, "gone")
        index = f"STATE_USER#{id_hash(user_id)}"
        left = await partition(dynamodb_client, table, index)
        assert [item["sk"] for item in left] == [state_index_key(user_id, "kept")["sk"]]
        # Saved again, the state is indexed again, and a user's delete finds it.
        await state.save_state(user_id, {"v": 2}, session_id="gone")
        assert len(await partition(dynamodb_client, table, index)) == 2
        await state.delete_user_state(user_id)
        assert await state.export_state(user_id, session_id="gone") is None
        assert await partition(dynamodb_client, table, index) == []


async def late_in_a_second() -> None:
    """Wait until the current second is 0.85 s old."""
    await asyncio.sleep((0.85 - time.time() % 1) % 1)


async def test_a_ttl_never_ends_before_its_seconds_have_passed(
    dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    # DynamoDB's TTL counts whole seconds: an expiry rounded down would come up to a second
    # early, a second after a write made late in a second.
    async with history_on(dynamodb_server, ttl_seconds=1) as history:
        await late_in_a_second()
        await history.create_session(user_id, "s1")
        await asyncio.sleep(0.3)
        assert await history.get_session(user_id, "s1") is not None
        await asyncio.sleep(2.1)  # a second past the expiry that read slid, rounded up
        assert await history.get_session(user_id, "s1") is None

    async with state_on(dynamodb_server, ttl_seconds=1) as state:
        await late_in_a_second()
        await state.save_state(user_id, {"v": 1})
        await asyncio.sleep(0.3)
        assert await state.export_state(user_id) == {"v": 1}
        await asyncio.sleep(2.1)
        assert await state.export_state(user_id) is None


# --- cost -----------------------------------------------------------------------------


async def test_appending_costs_the_same_requests_whatever_the_session_size(
    dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    sent: list[str] = []
    session = aioboto3_session()
    async with session.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url) as client:
        client.meta.events.register(
            "before-send.dynamodb", lambda request, **_: sent.append(request.url) and None
        )
        async with DynamoDBSessionHistoryService(
            dynamodb_server.sessions_table, client=client
        ) as history:
            small = await history.create_session(user_id, "small")
            large = await history.create_session(user_id, "large")
            await history.append_message(small, msg("one"))
            await history.append_message(large, [msg(f"m{i}") for i in range(120)])
            costs = []
            for target in (small, large):
                sent.clear()
                await history.append_message(target, msg("next"))
                costs.append(len(sent))
            # Allocate the sequence number, claim the message id, write the message, see
            # that the session was not deleted meanwhile.
            assert costs == [4, 4]
            sent.clear()
            stored = await history.get_session(user_id, "large")
            assert len(stored.messages) == 121  # type: ignore[union-attr]
            assert len(sent) == 2  # the session item, one page of messages
        assert await client.describe_table(TableName=dynamodb_server.sessions_table)


async def test_reading_the_latest_state_costs_the_same_whatever_the_number_of_rounds(
    dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    """``GET /state/{session_id}`` reads the latest round this way: listing the rounds to
    pick the last read every round's item, and paid for each byte of them."""
    sent: list[str] = []
    session = aioboto3_session()
    async with session.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url) as client:
        client.meta.events.register(
            "before-send.dynamodb", lambda request, **_: sent.append(request.url) and None
        )
        async with DynamoDBStateService(dynamodb_server.state_table, client=client) as state:
            costs = []
            for rounds in (1, 60):
                for i in range(rounds):
                    await state.save_state(user_id, {"i": i, "pad": "x" * 20_000}, f"r{rounds}")
                sent.clear()
                latest = await state.export_latest_state(user_id, f"r{rounds}")
                assert latest is not None and latest[0] == rounds
                costs.append(len(sent))
            assert costs == [2, 2]  # the meta item, one page of the newest round's items


async def test_a_runs_heartbeat_restamps_its_events_and_index_entries_once_a_ttl(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # They expired a TTL after their own write while the run went on beating: a run
    # longer than RUNS_TTL_SECONDS lost its first events and dropped out of its indexes.
    # Keeping them costs a request per event once a TTL, not with every heartbeat.
    table = dynamodb_server.runs_table
    sent: list[str] = []
    session = aioboto3_session()
    async with session.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url) as client:
        client.meta.events.register(
            "before-send.dynamodb", lambda request, **_: sent.append(request.url) and None
        )
        async with DynamoDBRunsService(table, client=client, ttl_seconds=1000) as runs:
            record = RunRecord(id="long", user_id=user_id, session_id="s1")
            await runs.record(record, [(i, f'{{"i": {i}}}') for i in range(30)], create=True)
            start = now()
            pk = f"RUN#{id_hash(user_id)}#{id_hash('long')}"
            meta_key = {"pk": {"S": pk}, "sk": {"S": "META"}}
            events = [
                i for i in await partition(dynamodb_client, table, pk) if i["sk"]["S"] != "META"
            ]
            index = [
                item
                for index_pk in (
                    f"USERRUNS#{id_hash(user_id)}",
                    f"RUNS#{id_hash(user_id)}#{id_hash('s1')}",
                )
                for item in await partition(dynamodb_client, table, index_pk)
            ]
            assert len(events) == 30 and len(index) == 2
            for item in events + index:
                assert start - 5 <= int(item["expires_at"]["N"]) - 2000 <= start

            sent.clear()
            await runs.beat(record)
            assert len(sent) == 1  # the record alone

            # Nearly a TTL later: the record saved now would outlive them.
            for item in events + index:
                await set_number(
                    dynamodb_client,
                    table,
                    {"pk": item["pk"], "sk": item["sk"]},
                    "expires_at",
                    start + 500,
                )
            await set_number(dynamodb_client, table, meta_key, "stamped_until", start + 500)
            sent.clear()
            await runs.beat(record)
            # The record, a query of the events, each event, both index entries, the mark.
            assert len(sent) == 1 + 1 + 30 + 2 + 1
            for item in events + index:
                key = {"pk": item["pk"], "sk": item["sk"]}
                stored = (await dynamodb_client.get_item(TableName=table, Key=key))["Item"]
                assert int(stored["expires_at"]["N"]) >= start + 1995
            sent.clear()
            await runs.beat(record)
            assert len(sent) == 1
            assert len(await runs.read_events(user_id, "long")) == 30


def aioboto3_session() -> Any:
    import aioboto3

    return aioboto3.Session(region_name="us-east-1", **LOCAL_AWS_CREDENTIALS)


# --- cursors, limits, concurrency -----------------------------------------------------


async def test_a_cursor_only_ever_reads_its_own_users_data(
    dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    other = f"{user_id}-other"
    async with history_on(dynamodb_server) as history:
        for owner in (user_id, other):
            for i in range(3):
                session = await history.create_session(owner, f"{owner}-s{i}")
                await history.append_message(session, [msg(f"{owner}-m{j}") for j in range(3)])
        sessions_page = await history.list_sessions_page(user_id, limit=1)
        messages_page = await history.list_messages(user_id, f"{user_id}-s0", limit=1)
        assert sessions_page.next_cursor and messages_page.next_cursor

        with pytest.raises(InvalidInputError, match="another user's sessions"):
            await history.list_sessions_page(other, cursor=sessions_page.next_cursor)
        with pytest.raises(Exception, match="not found"):
            await history.list_messages(other, f"{user_id}-s0", cursor=messages_page.next_cursor)


async def test_a_sessions_cursor_of_a_counter_stored_without_a_generation_works(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # A counter made before counters kept a generation lists as before, its cursors (which
    # name none) too; the next session made gives it one, and a cursor read before that
    # is refused (list again from the start), passing over no session.
    async with history_on(dynamodb_server) as history:
        for i in range(3):
            await history.create_session(user_id, f"s{i}")
        await dynamodb_client.update_item(
            TableName=dynamodb_server.sessions_table,
            Key={"pk": {"S": f"USER#{id_hash(user_id)}"}, "sk": {"S": "COUNTER"}},
            UpdateExpression="REMOVE generation",
        )
        cursor = (await history.list_sessions_page(user_id, limit=2)).next_cursor
        page = await history.list_sessions_page(user_id, cursor=cursor)
        assert [s.id for s in page.items] == ["s2"]
        await history.create_session(user_id, "s3")
        with pytest.raises(InvalidInputError, match="erased or expired"):
            await history.list_sessions_page(user_id, cursor=cursor)
        page = await history.list_sessions_page(user_id, limit=2)
        assert page.next_cursor is not None
        rest = await history.list_sessions_page(user_id, cursor=page.next_cursor)
        assert [s.id for s in rest.items] == ["s2", "s3"]


async def test_max_messages_keeps_the_newest_and_deletes_the_rest(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    async with history_on(dynamodb_server, max_messages_per_session=3) as history:
        session = await history.create_session(user_id, "s1")
        await history.append_message(session, [msg(f"m{i}") for i in range(4)])
        await history.append_message(session, msg("m4"))
        assert texts(await history.get_session(user_id, "s1")) == ["m2", "m3", "m4"]
        page = await history.list_messages(user_id, "s1", limit=2)
        assert [m.get_text_content() for m in page.items] == ["m2", "m3"]
    items = await message_items(
        dynamodb_client, dynamodb_server.sessions_table, messages_pk(user_id, "s1")
    )
    assert len(items) == 3


def numbered(first: int, count: int) -> list[Message]:
    """Messages ``m<first>``... with those ids and texts."""
    return [Message(id=f"m{i}", role="user", content=f"m{i}") for i in range(first, first + count)]


async def test_a_retried_append_keeps_the_newest_messages_of_a_session_kept_to_n(
    dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    async with history_on(dynamodb_server, max_messages_per_session=3) as history:
        session = await history.create_session(user_id, "s1")
        await history.append_message(session, numbered(0, 5))
        # Sent again (a retry): its messages are in the session, so nothing is appended,
        # and the sequence numbers it took hide nothing.
        await history.append_message(session, numbered(2, 3))
        await history.append_message(session, numbered(3, 2))
        assert texts(await history.get_session(user_id, "s1")) == ["m2", "m3", "m4"]
        await history.append_message(session, numbered(5, 1))
        assert texts(await history.get_session(user_id, "s1")) == ["m3", "m4", "m5"]
        page = await history.list_messages(user_id, "s1", limit=2)
        assert [m.get_text_content() for m in page.items] == ["m3", "m4"]


async def test_a_session_kept_to_n_messages_keeps_n_message_ids(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    async with history_on(dynamodb_server, max_messages_per_session=3) as history:
        session = await history.create_session(user_id, "s1")
        for first in range(0, 50, 5):
            await history.append_message(session, numbered(first, 5))
        assert texts(await history.get_session(user_id, "s1")) == ["m47", "m48", "m49"]
    items = await partition(
        dynamodb_client, dynamodb_server.sessions_table, messages_pk(user_id, "s1")
    )
    assert len(items) == 6  # three messages, and the items of their ids


async def test_concurrent_creates_of_one_session_agree(
    dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    async with history_on(dynamodb_server) as history:
        created = await asyncio.gather(*(history.create_session(user_id, "s1") for _ in range(10)))
        assert {s.id for s in created} == {"s1"}
        assert [s.id for s in await history.list_sessions(user_id)] == ["s1"]


def with_id(text: str, message_id: str) -> Message:
    """A message whose id its sender gave."""
    return Message.model_validate({"id": message_id, "role": "user", "content": text})


@contextlib.asynccontextmanager
async def written_first_by(
    server: DynamoDBServer, other: DynamoDBSessionHistoryService, session: Session, message: Message
) -> AsyncIterator[DynamoDBSessionHistoryService]:
    """A history whose first append is beaten to it by ``other``: ``other`` appends
    ``message`` to ``session`` once that append has claimed its ids, just before it writes
    its messages. An id the two share is found claimed by ``other``, its message not
    written yet: both write their own at its number, and the first append's write comes
    second."""
    raced: list[bool] = []

    async def other_writes_first(**_: Any) -> None:
        if not raced:
            raced.append(True)
            await other.append_message(session, message)

    hooks = {"before-call.dynamodb.TransactWriteItems": other_writes_first}
    async with history_hooked(server, hooks) as history:
        yield history
    assert raced


@contextlib.asynccontextmanager
async def history_hooked(
    server: DynamoDBServer, hooks: dict[str, Callable[..., Awaitable[None]]], **options: Any
) -> AsyncIterator[DynamoDBSessionHistoryService]:
    """A history whose client calls ``hooks`` (botocore event name: handler)."""
    async with aioboto3_session().client("dynamodb", endpoint_url=server.endpoint_url) as client:
        for event, hook in hooks.items():
            client.meta.events.register(event, hook)
        async with DynamoDBSessionHistoryService(
            server.sessions_table, client=client, **options
        ) as history:
            yield history


async def test_an_append_whose_message_another_wrote_first_answers_the_one_kept(
    dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    async with history_on(dynamodb_server) as other:
        racing = Session(id="s1", user_id=user_id)
        async with written_first_by(dynamodb_server, other, racing, with_id("two", "x")) as history:
            session = Session(id="s1", user_id=user_id)
            await history.append_message(session, [with_id("one", "x"), with_id("y", "y")])
            assert texts(session) == ["two", "y"]
            assert texts(racing) == ["two"]
            assert texts(await history.get_session(user_id, "s1")) == ["two", "y"]


async def test_an_append_refused_for_a_message_another_wrote_first_writes_nothing(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # Refused (409), it had stored its other message all the same, here a large one.
    table = dynamodb_server.sessions_table
    async with history_on(dynamodb_server) as other:
        racing = Session(id="s1", user_id=user_id)
        async with written_first_by(dynamodb_server, other, racing, with_id("two", "x")) as history:
            session = Session(id="s1", user_id=user_id)
            refused = [with_id("one", "x"), with_id(ONE_MEGABYTE_TEXT, "z")]
            with pytest.raises(MessageIdConflictError, match=r"^message\[0\]\.id"):
                await history.append_new_messages(session, refused, field="message")
            assert session.messages == []
            assert texts(await history.get_session(user_id, "s1")) == ["two"]
            assert await history.stored_messages(user_id, "s1", ["z"]) == {}
        items = await partition(dynamodb_client, table, messages_pk(user_id, "s1"))
        assert len(items) == 2  # the message kept and the item of its id: no part of z
        # Its retry with an id of its own stores its messages after the one kept.
        retried = [with_id("one", "x2"), with_id(ONE_MEGABYTE_TEXT, "z")]
        await other.append_new_messages(session, retried, field="message")
        stored = await other.get_session(user_id, "s1")
        assert [m.id for m in stored.messages] == ["x", "x2", "z"]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("checked", "kept"),
    [(True, None), (False, None), (True, 10)],
    ids=["refusing", "plain", "kept"],
)
async def test_an_append_stores_a_message_whose_id_a_refused_append_gave_back(
    dynamodb_server: DynamoDBServer,
    dynamodb_client: DynamoDBClient,
    user_id: str,
    checked: bool,
    kept: int | None,
) -> None:
    # The refused append claimed z first; the other found the claim, its message not written,
    # and wrote z at its number: once the claim was given back, z was left out, answered
    # stored all the same.
    b_writes, r_gave_back = asyncio.Event(), asyncio.Event()
    b_session = Session(id="s1", user_id=user_id)
    given = [with_id("zed", "z"), with_id("y", "y")]

    async def b_appends() -> None:
        if checked:
            await b.append_new_messages(b_session, given, field="message")
        else:
            await b.append_message(b_session, given)

    tasks: list[asyncio.Task[None]] = []

    async def r_gives_back(**_: Any) -> None:  # before the refused append's release
        if not tasks:
            tasks.append(asyncio.create_task(b_appends()))
            await b_writes.wait()

    async def gave_back(**_: Any) -> None:
        r_gave_back.set()

    async def b_waits(**_: Any) -> None:  # before the other's write
        b_writes.set()
        await r_gave_back.wait()

    b_hooks = {"before-call.dynamodb.TransactWriteItems": b_waits}
    r_hooks = {
        "before-call.dynamodb.TransactWriteItems": r_gives_back,
        "after-call.dynamodb.TransactWriteItems": gave_back,
    }
    async with (
        history_on(dynamodb_server, max_messages_per_session=kept) as history,
        history_hooked(dynamodb_server, r_hooks, max_messages_per_session=kept) as r,
        history_hooked(dynamodb_server, b_hooks, max_messages_per_session=kept) as b,
    ):
        await history.append_message(Session(id="s1", user_id=user_id), with_id("two", "x"))
        refused = [with_id("one", "x"), with_id("zed", "z")]
        with pytest.raises(MessageIdConflictError, match=r"^message\[0\]\.id"):
            # Checked before another stored x: the append finds it.
            await r.append_new_messages(
                Session(id="s1", user_id=user_id), refused, field="message", checked=True
            )
        await tasks[0]
        stored = await history.get_session(user_id, "s1")
        assert stored is not None
        assert [m.id for m in stored.messages] == ["x", "z", "y"]  # type: ignore[union-attr]
        assert texts(stored) == ["two", "zed", "y"]
        assert b_session.messages == stored.messages[1:]  # its answer: what the session holds
        if kept is not None:
            # Unused: the refused append's numbers (x found, z given back), not the other's
            # own number for z, where z is now.
            item = await dynamodb_client.get_item(
                TableName=dynamodb_server.sessions_table, Key=session_key(user_id, "s1")
            )
            assert sorted(map(int, item["Item"]["gaps"]["NS"])) == [2, 3]


# --- deletes racing with writes -------------------------------------------------------


def delete_before_first_put(service: Any, delete: Any) -> None:
    """Make ``delete()`` run (on another service object) just before ``service`` first puts
    items: after its write has read the container, before the write lands."""
    put = service._store.put
    pending = [delete]

    async def put_after_delete(items: list[dict[str, Any]]) -> None:
        if pending:
            await pending.pop()()
        await put(items)

    service._store.put = put_after_delete


async def test_an_append_landing_after_its_sessions_delete_leaves_no_items(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    async with history_on(dynamodb_server) as writer, history_on(dynamodb_server) as deleter:
        session = await writer.create_session(user_id, "s1")
        await writer.append_message(session, msg("before"))
        delete_before_first_put(writer, lambda: deleter.delete_user_sessions(user_id))
        await writer.append_message(session, [msg("late"), msg(ONE_MEGABYTE_TEXT)])
        assert await writer.get_session(user_id, "s1") is None
        assert await writer.list_sessions(user_id) == []
    # Nothing of the user is left stored (nothing anyone could read or delete).
    pk = messages_pk(user_id, "s1")
    assert await partition(dynamodb_client, dynamodb_server.sessions_table, pk) == []


async def test_an_append_landing_after_its_session_is_deleted_leaves_no_items(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    async with history_on(dynamodb_server) as writer, history_on(dynamodb_server) as deleter:
        session = await writer.create_session(user_id, "s1")
        await writer.append_message(session, msg("before"))
        delete_before_first_put(writer, lambda: deleter.delete_session(user_id, "s1"))
        await writer.append_message(session, [msg("late"), msg(ONE_MEGABYTE_TEXT)])
        assert await writer.get_session(user_id, "s1") is None
    table = dynamodb_server.sessions_table
    assert await partition(dynamodb_client, table, messages_pk(user_id, "s1")) == []
    # No purge record is left: only the user's creation counter.
    user = await partition(dynamodb_client, table, f"USER#{id_hash(user_id)}")
    assert [item["sk"]["S"] for item in user] == ["COUNTER"]


async def test_a_summary_landing_after_its_sessions_delete_is_kept_by_the_session_made_again(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    table = dynamodb_server.sessions_table
    async with history_on(dynamodb_server) as writer, history_on(dynamodb_server) as deleter:
        await writer.set_session_summary(user_id, "s1", "before")
        delete_before_first_put(writer, lambda: deleter.delete_session(user_id, "s1"))
        await writer.set_session_summary(user_id, "s1", ONE_MEGABYTE_TEXT)
        assert await writer.session_summary(user_id, "s1") == ONE_MEGABYTE_TEXT
        assert texts(await writer.get_session(user_id, "s1")) == []
    # What was written for the deleted session is gone: only the new session's items stay.
    meta = await dynamodb_client.get_item(TableName=table, Key=session_key(user_id, "s1"))
    generation = meta["Item"]["generation"]["S"]
    items = await partition(dynamodb_client, table, messages_pk(user_id, "s1"))
    assert items and all(item["sk"]["S"].startswith(f"M#{generation}#") for item in items)


async def test_a_state_save_landing_after_its_delete_leaves_no_items(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    async with state_on(dynamodb_server) as writer, state_on(dynamodb_server) as deleter:
        await writer.save_state(user_id, {"v": 1}, session_id="s1")
        delete_before_first_put(writer, lambda: deleter.delete_state(user_id, "s1"))
        await writer.save_state(user_id, {"v": ONE_MEGABYTE_TEXT}, session_id="s1")
        assert await writer.export_state(user_id, session_id="s1") is None
    items = await partition(dynamodb_client, dynamodb_server.state_table, state_pk(user_id, "s1"))
    assert items == []


async def test_a_state_save_with_a_round_landing_after_its_delete_leaves_the_state_usable(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # The save raised the next round above its own on a meta item the delete had removed:
    # that made a meta item of no generation, and every later read of the state failed.
    async with state_on(dynamodb_server) as writer, state_on(dynamodb_server) as deleter:
        await writer.save_state(user_id, {"v": 1}, session_id="s1")
        set_if = writer._store.set_if
        pending = [lambda: deleter.delete_state(user_id, "s1")]

        async def set_after_delete(*args: Any) -> None:
            if pending:
                await pending.pop()()
            await set_if(*args)

        writer._store.set_if = set_after_delete  # type: ignore[method-assign]
        await writer.save_state(user_id, {"v": 5}, session_id="s1", round_id=5)
        assert await writer.export_state(user_id, session_id="s1") is None
        assert await writer.list_rounds(user_id, session_id="s1") == []
        assert await writer.save_state(user_id, {"v": 2}, session_id="s1") == 1
        assert await writer.export_state(user_id, session_id="s1") == {"v": 2}
    items = await partition(dynamodb_client, dynamodb_server.state_table, state_pk(user_id, "s1"))
    assert sorted(item["sk"]["S"].split("#")[0] for item in items) == ["META", "R"]


async def test_a_state_made_again_during_a_users_delete_is_found_by_the_next(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    async with state_on(dynamodb_server) as writer, state_on(dynamodb_server) as deleter:
        await writer.save_state(user_id, {"v": 1}, session_id="s1")
        # The session's state is saved again once its meta item is gone, before the delete
        # has removed the rounds and the user's index.
        delete = deleter._store.delete
        pending = [lambda: writer.save_state(user_id, {"v": 2}, session_id="s1")]

        async def save_then_delete(keys: list[dict[str, Any]]) -> None:
            if pending:
                await pending.pop()()
            await delete(keys)

        deleter._store.delete = save_then_delete  # type: ignore[method-assign]
        await deleter.delete_user_state(user_id)
        await writer.delete_user_state(user_id)
        assert await writer.export_state(user_id, session_id="s1") is None
        assert await writer.list_rounds(user_id, session_id="s1") == []
    items = await partition(dynamodb_client, dynamodb_server.state_table, state_pk(user_id, "s1"))
    assert [item for item in items if not item["sk"]["S"].startswith("APPLIED#")] == []
    index = f"STATE_USER#{id_hash(user_id)}"
    assert await partition(dynamodb_client, dynamodb_server.state_table, index) == []


async def test_a_state_saved_again_while_its_delete_lists_the_rounds_keeps_its_round(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    async with state_on(dynamodb_server) as writer, state_on(dynamodb_server) as deleter:
        await writer.save_state(user_id, {"v": 1}, session_id="s1")
        # Saved again once the meta item is gone, before the delete lists the rounds.
        query = deleter._store.query
        pending = [lambda: writer.save_state(user_id, {"v": 2}, session_id="s1")]

        async def save_then_query(**kwargs: Any) -> Any:
            if pending:
                await pending.pop()()
            async for item in query(**kwargs):
                yield item

        deleter._store.query = save_then_query  # type: ignore[method-assign]
        await deleter.delete_state(user_id, "s1")
        assert await writer.export_state(user_id, session_id="s1") == {"v": 2}
    items = await partition(dynamodb_client, dynamodb_server.state_table, state_pk(user_id, "s1"))
    assert sorted(item["sk"]["S"].split("#")[0] for item in items) == ["META", "R"]


def delete_before_first_read(service: Any, delete: Any) -> None:
    """Make ``delete()`` run (on another service object) just before ``service`` first
    queries messages: an append repeating a message, after it found the message's id in the
    session, before it reads the message."""
    query = service._store.query
    pending = [delete]

    async def query_after_delete(**kwargs: Any) -> Any:
        if pending:
            await pending.pop()()
        async for item in query(**kwargs):
            yield item

    service._store.query = query_after_delete


def big_message(message_id: str) -> Message:
    return Message(id=message_id, role="user", content=ONE_MEGABYTE_TEXT)


async def ids_stored(history: DynamoDBSessionHistoryService, user_id: str) -> list[str]:
    session = await history.get_session(user_id, "s1")
    assert session is not None
    return [m.id for m in session.messages if isinstance(m, Message)]


async def stored_again_once(
    history: DynamoDBSessionHistoryService,
    client: DynamoDBClient,
    server: DynamoDBServer,
    user_id: str,
) -> None:
    """Message x, deleted while an append of it wrote it, is stored again (as if appended
    after the delete): once, with the item of its id, so that a delete leaves none of it."""
    assert await ids_stored(history, user_id) == ["x"]
    assert list(await history.stored_messages(user_id, "s1", ["x"])) == ["x"]
    assert await history.delete_messages(user_id, "s1", ["x"]) == 1
    pk = messages_pk(user_id, "s1")
    assert await partition(client, server.sessions_table, pk) == []


async def test_a_retried_append_racing_its_messages_delete_stores_it_once(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # The retry found the message's id, then no message (deleted meanwhile), and wrote it
    # again: it stayed without the item of its id, which no delete could remove, and the
    # next retry stored it a second time.
    async with history_on(dynamodb_server) as writer, history_on(dynamodb_server) as deleter:
        await writer.append_message(Session(id="s1", user_id=user_id), big_message("x"))
        deleted: list[int] = []

        async def delete() -> None:
            deleted.append(await deleter.delete_messages(user_id, "s1", ["x"]))

        delete_before_first_read(writer, delete)
        await writer.append_message(Session(id="s1", user_id=user_id), big_message("x"))
        assert deleted == [1]
        await stored_again_once(writer, dynamodb_client, dynamodb_server, user_id)
        await writer.append_message(Session(id="s1", user_id=user_id), big_message("x"))
        assert await ids_stored(writer, user_id) == ["x"]


async def test_an_append_racing_its_messages_delete_keeps_it_deletable(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # The delete found the id just claimed and no message yet: it removed the id's item,
    # and the message written next stayed out of reach of its id.
    async with history_on(dynamodb_server) as writer, history_on(dynamodb_server) as deleter:
        await writer.create_session(user_id, "s1")
        deleted: list[int] = []

        async def delete() -> None:
            deleted.append(await deleter.delete_messages(user_id, "s1", ["x"]))

        delete_before_first_put(writer, delete)
        await writer.append_message(Session(id="s1", user_id=user_id), big_message("x"))
        assert deleted == [0]  # before the message was there
        assert await ids_stored(writer, user_id) == ["x"]
        assert list(await writer.stored_messages(user_id, "s1", ["x"])) == ["x"]
        assert await deleter.delete_messages(user_id, "s1", ["x"]) == 1
        assert await ids_stored(writer, user_id) == []
    pk = messages_pk(user_id, "s1")
    assert await partition(dynamodb_client, dynamodb_server.sessions_table, pk) == []


async def test_two_appends_of_a_message_racing_its_delete_store_it_once(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # The first append claims the id and stops before writing; its retry finds the id and
    # no message. Before the retry writes it, the first writes it and it is deleted.
    async with (
        history_on(dynamodb_server) as first,
        history_on(dynamodb_server) as retry,
        history_on(dynamodb_server) as deleter,
    ):
        await first.create_session(user_id, "s1")
        paused, resumed = asyncio.Event(), asyncio.Event()
        deleted: list[int] = []

        async def pause() -> None:
            paused.set()
            await resumed.wait()

        delete_before_first_put(first, pause)
        appending = asyncio.create_task(
            first.append_message(Session(id="s1", user_id=user_id), big_message("x"))
        )
        await paused.wait()

        async def finish_first_then_delete() -> None:
            resumed.set()
            await appending
            deleted.append(await deleter.delete_messages(user_id, "s1", ["x"]))

        delete_before_first_put(retry, finish_first_then_delete)
        await retry.append_message(Session(id="s1", user_id=user_id), big_message("x"))
        assert deleted == [1]
        await stored_again_once(retry, dynamodb_client, dynamodb_server, user_id)


async def test_two_appends_of_a_large_message_at_one_position_leave_no_stray_parts(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # The first append claims the id and stops before writing; its retry finds the id and
    # no message, and both write it, each its own parts: the head written last won, and the
    # other's parts stayed stored for good, part of no message.
    async with history_on(dynamodb_server) as first, history_on(dynamodb_server) as retry:
        await first.create_session(user_id, "s1")
        paused, resumed = asyncio.Event(), asyncio.Event()

        async def pause() -> None:
            paused.set()
            await resumed.wait()

        delete_before_first_put(first, pause)
        appending = asyncio.create_task(
            first.append_message(Session(id="s1", user_id=user_id), big_message("x"))
        )
        await paused.wait()

        async def finish_first() -> None:
            resumed.set()
            await appending

        delete_before_first_put(retry, finish_first)
        await retry.append_message(Session(id="s1", user_id=user_id), big_message("x"))
        assert appending.done()
        assert await ids_stored(retry, user_id) == ["x"]
        assert texts(await retry.get_session(user_id, "s1")) == [ONE_MEGABYTE_TEXT]
    items: list[dict[str, Any]] = []
    async for page in dynamodb_client.get_paginator("scan").paginate(
        TableName=dynamodb_server.sessions_table,
        FilterExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": messages_pk(user_id, "s1")}},
        ConsistentRead=True,
    ):
        items += page["Items"]
    [head] = [item for item in items if "parts" in item]
    parts = [item for item in items if "part" in item]
    assert len(parts) == int(head["parts"]["N"]) - 1
    assert {part["version"]["S"] for part in parts} == {head["version"]["S"]}
    assert len(items) == len(parts) + 2  # the head, its parts, the item of its id


def pause_after_listing_trimmed(service: Any, action: Any) -> None:
    """Make ``action()`` run just after ``service``'s trim has listed the messages it
    removes, before it removes them."""
    query = service._store.query
    pending = [action]

    async def query_then_act(**kwargs: Any) -> Any:
        async for item in query(**kwargs):
            yield item
        if pending and "claim" in kwargs.get("ProjectionExpression", ""):
            await pending.pop()()

    service._store.query = query_then_act


async def test_a_trim_racing_another_and_a_retried_append_keeps_the_retried_message_whole(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # A trim listed m0 to remove; meanwhile another append trimmed it, and a retry of m0
    # appended it again, with a new item of its id. The first trim then deleted that item
    # unconditionally: m0 stayed in the session out of reach of its id (not found by id,
    # not deletable), and the next retry stored it a second time.
    target = Session(id="s1", user_id=user_id)
    async with (
        history_on(dynamodb_server, max_messages_per_session=2) as first,
        history_on(dynamodb_server, max_messages_per_session=2) as other,
    ):
        await other.append_message(target, numbered(0, 2))

        async def trim_then_retry() -> None:
            await other.append_message(target, numbered(3, 1))
            await other.append_message(target, numbered(0, 1))

        pause_after_listing_trimmed(first, trim_then_retry)
        await first.append_message(target, numbered(2, 1))
        assert await ids_stored(first, user_id) == ["m3", "m0"]
        assert list(await first.stored_messages(user_id, "s1", ["m0"])) == ["m0"]
        await first.append_message(target, numbered(0, 1))
        assert await ids_stored(first, user_id) == ["m3", "m0"]
        page = await first.list_messages(user_id, "s1")
        assert [m.id for m in page.items] == ["m3", "m0"]
        assert await first.delete_messages(user_id, "s1", ["m0"]) == 1
        assert await ids_stored(first, user_id) == ["m3"]
    items = await partition(
        dynamodb_client, dynamodb_server.sessions_table, messages_pk(user_id, "s1")
    )
    assert len(items) == 2  # m3 and the item of its id


# --- connections ----------------------------------------------------------------------


async def test_a_stopped_dynamodb_makes_calls_fail_and_a_restarted_one_works_again(
    own_dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    options = {"connect_timeout": 1.0, "read_timeout": 2.0}
    history, state = (
        history_on(own_dynamodb_server, **options),
        state_on(own_dynamodb_server, **options),
    )
    async with history, state:
        assert await history.health() is True and await state.health() is True
        own_dynamodb_server.stop()
        assert await history.health() is False and await state.health() is False
        calls = [
            history.create_session(user_id, "s1"),
            history.append_message(Session(id="s1", user_id=user_id), msg("x")),
            history.list_sessions(user_id),
            state.save_state(user_id, {"v": 1}),
            state.export_state(user_id),
        ]
        for call in calls:
            with pytest.raises(StoreUnavailableError) as raised:
                await call
            assert raised.value.store == "dynamodb"
            assert "testing" not in str(raised.value)  # the (local) credentials

        own_dynamodb_server.start()
        assert await history.health() is True and await state.health() is True
        await history.append_message(Session(id="s1", user_id=user_id), msg("back"))
        assert texts(await history.get_session(user_id, "s1")) == ["back"]
        assert await state.save_state(user_id, {"v": 1}) == 1


def test_a_service_started_once_works_from_each_later_event_loop(
    dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    # As a script or a CLI does: every asyncio.run is a new loop, the previous one closed.
    history, state = history_on(dynamodb_server), state_on(dynamodb_server)
    asyncio.run(history.start())
    asyncio.run(state.start())
    for i in range(3):
        asyncio.run(history.create_session(user_id, f"s{i}"))
        assert asyncio.run(state.save_state(user_id, {"v": i})) == i + 1

    async def together() -> None:  # the first calls of a loop, side by side
        await asyncio.gather(*(history.create_session(user_id, f"t{i}") for i in range(3)))

    asyncio.run(together())
    assert asyncio.run(history.health()) is True
    assert asyncio.run(state.health()) is True
    sessions = asyncio.run(history.list_sessions(user_id))
    assert sorted(s.id for s in sessions) == ["s0", "s1", "s2", "t0", "t1", "t2"]
    assert asyncio.run(state.export_state(user_id)) == {"v": 2}
    asyncio.run(history.stop())
    asyncio.run(state.stop())


async def test_starting_a_started_service_keeps_its_client(
    dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    async with history_on(dynamodb_server) as history:
        await history.create_session(user_id, "s1")
        client = history._store._client
        async with history:  # a nested `async with`: started again, then stopped
            assert history._store._client is client
            assert await history.get_session(user_id, "s1") is not None
        assert await history.health() is False


async def test_a_service_works_from_another_event_loop_and_back(
    dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    async with history_on(dynamodb_server) as history:
        await history.create_session(user_id, "here")

        def elsewhere() -> list[str]:
            async def call() -> list[str]:
                await history.create_session(user_id, "there")
                return sorted(s.id for s in await history.list_sessions(user_id))

            return asyncio.run(call())

        assert await asyncio.to_thread(elsewhere) == ["here", "there"]
        assert await history.get_session(user_id, "there") is not None
        assert await history.health() is True


async def test_a_dynamodb_that_stops_answering_fails_a_call_within_one_timeout(
    own_dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    # A frozen process still accepts connections: each attempt waits out its read timeout,
    # so a read tried three times took three (a Lambda function's 30 s, at 10 s each).
    history = history_on(own_dynamodb_server, connect_timeout=1.0, read_timeout=1.0)
    async with history:
        await history.create_session(user_id, "s1")
        own_dynamodb_server.pause()
        try:
            for call in (history.get_session(user_id, "s1"), history.list_sessions(user_id)):
                began = time.monotonic()
                with pytest.raises(StoreUnavailableError) as raised:
                    await call
                assert time.monotonic() - began < 2.5
                assert str(raised.value) == "dynamodb is unavailable: the request timed out"
            began = time.monotonic()
            assert await history.health() is False
            assert time.monotonic() - began < 2.5
        finally:
            own_dynamodb_server.resume()
        assert await history.health() is True
        assert await history.get_session(user_id, "s1") is not None


class FailingClaimClient:
    """A DynamoDB client passing every request to ``client`` but the first claims of message
    ids, ``failures`` of them, which fail as DynamoDB's own errors do (never executed)."""

    def __init__(self, client: DynamoDBClient, failures: int) -> None:
        self.client = client
        self.failures = failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    async def put_item(self, **kwargs: Any) -> Any:
        if "~I#" in kwargs["Item"]["sk"]["S"] and self.failures > 0:
            self.failures -= 1
            error = {"Code": "InternalServerError", "Message": "Internal server error"}
            raise ClientError({"Error": error}, "PutItem")
        return await self.client.put_item(**kwargs)


async def test_an_append_failing_midway_hides_none_of_the_newest_messages(
    dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    # Its sequence numbers were allocated, never used: they counted among the newest N for
    # good, so the session read one message short (and the next trims kept it so), where in
    # memory and on Redis an append that fails stores nothing and hides nothing.
    session = aioboto3_session()
    async with session.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url) as client:
        failing = FailingClaimClient(client, failures=0)
        async with DynamoDBSessionHistoryService(
            dynamodb_server.sessions_table,
            client=failing,  # type: ignore[arg-type]
            max_messages_per_session=3,
        ) as history:
            target = Session(id="s1", user_id=user_id)
            await history.append_message(target, [msg("a"), msg("b"), msg("c")])
            failing.failures = 1
            with pytest.raises(StoreUnavailableError):
                await history.append_message(target, msg("lost"))
            assert texts(await history.get_session(user_id, "s1")) == ["a", "b", "c"]
            assert texts(await history.open_session(user_id, "s1", recent=3)) == ["a", "b", "c"]
            await history.append_message(target, msg("d"))
            assert texts(await history.get_session(user_id, "s1")) == ["b", "c", "d"]
            assert texts(await history.open_session(user_id, "s1", recent=5)) == ["b", "c", "d"]
            page = await history.list_messages(user_id, "s1", limit=2)
            assert [m.get_text_content() for m in page.items] == ["b", "c"]
            assert page.next_cursor is not None
            rest = await history.list_messages(user_id, "s1", cursor=page.next_cursor)
            assert [m.get_text_content() for m in rest.items] == ["d"]


class FailingWriteClient:
    """A DynamoDB client passing every request to ``client`` but the writes of items holding
    ``marker`` (batches and transactions, or the ``operations`` named), which fail as
    DynamoDB's own errors do (never executed)."""

    def __init__(
        self,
        client: DynamoDBClient,
        marker: str,
        operations: tuple[str, ...] = ("BatchWriteItem", "TransactWriteItems"),
    ) -> None:
        self.client = client
        self.marker = marker
        self.operations = operations
        self.failing = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def _refuse(self, operation: str, request: Any) -> None:
        if self.failing and operation in self.operations and self.marker in str(request):
            error = {"Code": "InternalServerError", "Message": "Internal server error"}
            raise ClientError({"Error": error}, operation)

    async def batch_write_item(self, **kwargs: Any) -> Any:
        self._refuse("BatchWriteItem", kwargs)
        return await self.client.batch_write_item(**kwargs)

    async def transact_write_items(self, **kwargs: Any) -> Any:
        self._refuse("TransactWriteItems", kwargs)
        return await self.client.transact_write_items(**kwargs)


async def test_a_turn_whose_write_fails_midway_stores_none_of_its_messages(
    dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    # Its messages were written 25 at a time: those written before the failure stayed, a
    # tool call say without its result, which models refuse in every later turn.
    turn = [msg(f"step {i}") for i in range(40)]
    session = aioboto3_session()
    async with session.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url) as client:
        failing = FailingWriteClient(client, marker="step 39")
        async with DynamoDBSessionHistoryService(
            dynamodb_server.sessions_table,
            client=failing,  # type: ignore[arg-type]
        ) as history:
            target = Session(id="s1", user_id=user_id)
            await history.append_message(target, msg("before"))
            with pytest.raises(StoreUnavailableError):
                await history.append_message(target, turn)
            assert texts(await history.get_session(user_id, "s1")) == ["before"]
            failing.failing = False
            await history.append_message(target, turn)  # the retry stores it whole, once
            expected = ["before", *(f"step {i}" for i in range(40))]
            assert texts(await history.get_session(user_id, "s1")) == expected


async def test_an_append_resent_after_failing_between_its_transactions_adds_each_message_once(
    dynamodb_server: DynamoDBServer, user_id: str
) -> None:
    # Its first 100 messages were stored: the session object read after the failure held
    # them, and the append sent again added them to it a second time (250 for 150 stored).
    turn = [msg(f"step {i}") for i in range(150)]
    expected = [f"step {i}" for i in range(150)]
    session = aioboto3_session()
    async with session.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url) as client:
        failing = FailingWriteClient(client, marker="step 149")
        async with DynamoDBSessionHistoryService(
            dynamodb_server.sessions_table,
            client=failing,  # type: ignore[arg-type]
        ) as history:
            target = Session(id="s1", user_id=user_id)
            with pytest.raises(StoreUnavailableError):
                await history.append_message(target, turn)
            assert target.messages == []
            read = await history.get_session(user_id, "s1")
            assert texts(read) == expected[:100]
            failing.failing = False
            await history.append_message(read, turn)
            assert texts(read) == expected
            await history.append_message(target, turn)
            assert texts(target) == expected
            assert texts(await history.get_session(user_id, "s1")) == expected


async def items_of_user(client: DynamoDBClient, table: str, user_id: str) -> list[Any]:
    """Every item of the table whose key holds the user's hash (a Scan, as an audit would)."""
    user = id_hash(user_id)
    found: list[Any] = []
    paginator = client.get_paginator("scan")
    async for page in paginator.paginate(TableName=table, ConsistentRead=True):
        found += [item for item in page["Items"] if user in item["pk"]["S"]]
    return found


async def test_a_session_delete_cut_short_by_a_failure_deletes_everything_when_retried(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # The session item went first, then the messages: when deleting them failed, the retry
    # found no session and did nothing, and the messages stayed stored for good, reachable
    # by no read and no later delete (of the session or of the user).
    table = dynamodb_server.sessions_table
    session = aioboto3_session()
    async with session.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url) as client:
        failing = FailingWriteClient(client, marker=messages_pk(user_id, "s1"))
        failing.failing = False
        async with DynamoDBSessionHistoryService(
            table,
            client=failing,  # type: ignore[arg-type]
        ) as history:
            target = Session(id="s1", user_id=user_id)
            await history.append_message(target, [msg(f"secret {i}") for i in range(30)])
            await history.append_message(target, msg(ONE_MEGABYTE_TEXT))
            failing.failing = True
            with pytest.raises(StoreUnavailableError):
                await history.delete_session(user_id, "s1")
            assert await history.get_session(user_id, "s1") is None
            failing.failing = False
            await history.delete_session(user_id, "s1")
            assert await history.get_session(user_id, "s1") is None
    # Only the user's creation counter stays (a number, kept across the user's sessions).
    left = await items_of_user(dynamodb_client, table, user_id)
    assert [item["sk"]["S"] for item in left] == ["COUNTER"]


async def test_a_users_delete_cut_short_by_a_failure_deletes_everything_when_retried(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # Every session item went first, then each session's messages: when deleting one
    # session's failed, the retry found no session, and its messages (and those of the
    # sessions after it) stayed stored for good.
    table = dynamodb_server.sessions_table
    session = aioboto3_session()
    async with session.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url) as client:
        failing = FailingWriteClient(client, marker=messages_pk(user_id, "s2"))
        failing.failing = False
        async with DynamoDBSessionHistoryService(
            table,
            client=failing,  # type: ignore[arg-type]
        ) as history:
            for i in range(5):
                target = Session(id=f"s{i}", user_id=user_id)
                await history.append_message(target, [msg(f"secret {i}.{j}") for j in range(30)])
            failing.failing = True
            with pytest.raises(StoreUnavailableError):
                await history.delete_user_sessions(user_id)
            assert await history.list_sessions(user_id) == []
            failing.failing = False
            await history.delete_user_sessions(user_id)
            assert await history.list_sessions(user_id) == []
    assert await items_of_user(dynamodb_client, table, user_id) == []


async def test_a_session_delete_retried_after_the_session_was_made_again_deletes_both(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    table = dynamodb_server.sessions_table
    session = aioboto3_session()
    async with session.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url) as client:
        failing = FailingWriteClient(client, marker=messages_pk(user_id, "s1"))
        failing.failing = False
        async with DynamoDBSessionHistoryService(
            table,
            client=failing,  # type: ignore[arg-type]
        ) as history:
            target = Session(id="s1", user_id=user_id)
            await history.append_message(target, [msg(f"old {i}") for i in range(30)])
            failing.failing = True
            with pytest.raises(StoreUnavailableError):
                await history.delete_session(user_id, "s1")
            failing.failing = False
            # Made again meanwhile: its messages are its own, the old ones stay unread.
            await history.append_message(Session(id="s1", user_id=user_id), msg("new"))
            assert texts(await history.get_session(user_id, "s1")) == ["new"]
            await history.delete_session(user_id, "s1")
            assert await history.get_session(user_id, "s1") is None
    # Only the user's creation counter stays (a number, kept across the user's sessions).
    left = await items_of_user(dynamodb_client, table, user_id)
    assert [item["sk"]["S"] for item in left] == ["COUNTER"]


async def test_a_state_delete_cut_short_by_a_failure_deletes_every_round_when_retried(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # The meta item went first, then the rounds: when deleting them failed, the retry
    # found no meta item and did nothing, and the rounds stayed stored.
    table = dynamodb_server.state_table
    session = aioboto3_session()
    async with session.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url) as client:
        marker = state_pk(user_id, "s1")
        failing = FailingWriteClient(client, marker, operations=("BatchWriteItem",))
        failing.failing = False
        async with DynamoDBStateService(table, client=failing) as state:  # type: ignore[arg-type]
            for i in range(30):
                await state.save_state(user_id, {"secret": i}, session_id="s1")
            await state.save_state(user_id, {"v": ONE_MEGABYTE_TEXT}, session_id="s1")
            failing.failing = True
            with pytest.raises(StoreUnavailableError):
                await state.delete_state(user_id, "s1")
            assert await state.export_state(user_id, session_id="s1") is None
            failing.failing = False
            await state.delete_state(user_id, "s1")
            # A state saved again after it is kept, then deleted as any other.
            await state.save_state(user_id, {"v": 2}, session_id="s1")
            await state.delete_state(user_id, "s2")
            assert await state.export_state(user_id, session_id="s1") == {"v": 2}
            await state.delete_state(user_id, "s1")
            assert await state.export_state(user_id, session_id="s1") is None
    assert await partition(dynamodb_client, table, state_pk(user_id, "s1")) == []


class ThrottlingClient:
    """A DynamoDB client whose first ``throttled`` requests are throttled (never executed)."""

    def __init__(self, throttled: int, code: str = "ProvisionedThroughputExceededException"):
        self.throttled = throttled
        self.code = code
        self.calls = 0

    async def update_item(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.throttled:
            error = {
                "Code": self.code,
                "Message": "Rate of requests exceeds the allowed throughput",
            }
            raise ClientError({"Error": error}, "UpdateItem")
        return {"Attributes": {"n": {"N": "1"}}}


async def test_a_throttled_request_is_sent_again_backing_off_then_given_up() -> None:
    # DynamoDB throttles for as long as a partition's capacity is used up: three tries in a
    # quarter of a second failed many a request that a little patience would have got
    # through. A throttled request was never executed: even a counter update is sent again.
    for throttled, code in (
        (5, "ProvisionedThroughputExceededException"),
        (3, "ThrottlingException"),
    ):
        client = ThrottlingClient(throttled, code)
        store = DynamoDBStore(table_name="t", client=client)  # type: ignore[arg-type]
        await store.open()
        answer = await store.run("update_item", idempotent=False, Key={})
        assert answer == {"Attributes": {"n": {"N": "1"}}} and client.calls == throttled + 1
    client = ThrottlingClient(100)
    store = DynamoDBStore(table_name="t", client=client)  # type: ignore[arg-type]
    await store.open()
    began = time.monotonic()
    with pytest.raises(StoreUnavailableError) as raised:
        await store.run("update_item", idempotent=False, Key={})
    assert time.monotonic() - began < 2.0 and client.calls == 6
    assert str(raised.value) == "dynamodb is unavailable: ProvisionedThroughputExceededException"


async def test_a_task_result_larger_than_an_item_is_stored_whole(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    async def report(payload: Any) -> str:
        return ONE_MEGABYTE_TEXT

    runs = DynamoDBRunsService(
        dynamodb_server.runs_table,
        endpoint_url=dynamodb_server.endpoint_url,
        region_name=dynamodb_server.region,
        **LOCAL_AWS_CREDENTIALS,
    )
    async with runs:
        task = TaskDefinition(path="/jobs/report", function=report)
        await runs.create_run(RunRecord(id="t1", user_id=user_id, kind="task", name=task.path))
        await run_task(runs, task, user_id, "t1", {})
        stored = await runs.get_run(user_id, "t1")
        assert stored is not None and stored.status == "completed"
        assert stored.result == ONE_MEGABYTE_TEXT
        pk = f"RUN#{id_hash(user_id)}#{id_hash('t1')}"
        items = await partition(dynamodb_client, dynamodb_server.runs_table, pk)
        assert len(items) >= 3 and all(len(str(item).encode()) < 400_000 for item in items)
        await runs.save_run(stored.model_copy(update={"result": "short"}))
        items = await partition(dynamodb_client, dynamodb_server.runs_table, pk)
        assert [item["sk"]["S"] for item in items] == ["META"]  # the old parts are gone


async def test_a_table_missing_or_not_made_for_the_store_is_named_with_its_setting(
    dynamodb_server: DynamoDBServer, capfd: pytest.CaptureFixture[str]
) -> None:
    # A misspelt DYNAMODB_SESSIONS_TABLE said "ResourceNotFoundException", a table of other
    # keys "ValidationException", naming neither the table nor the setting to correct.
    level = logger.level
    logger.setLevel("WARNING")  # the tests log nothing below CRITICAL
    try:
        where: dict[str, Any] = {
            "endpoint_url": dynamodb_server.endpoint_url,
            "region_name": dynamodb_server.region,
        }
        where |= LOCAL_AWS_CREDENTIALS
        async with DynamoDBSessionHistoryService("agentscope-sesions", **where) as history:
            with pytest.raises(StoreUnavailableError) as missing:
                await history.create_session("alice", "s1")
        # The key table's key is key_id, not the pk and sk of the state's items.
        async with DynamoDBStateService(dynamodb_server.api_keys_table, **where) as state:
            with pytest.raises(StoreUnavailableError) as mismatched:
                await state.save_state("alice", {"step": 1}, session_id="s1")
    finally:
        logger.setLevel(level)
    assert str(missing.value) == (
        "dynamodb is unavailable: the table agentscope-sesions (DYNAMODB_SESSIONS_TABLE) "
        f"does not exist in {dynamodb_server.region}"
    )
    assert str(mismatched.value) == (
        f"dynamodb is unavailable: the table {dynamodb_server.api_keys_table} "
        "(DYNAMODB_STATE_TABLE) does not have the key schema this store needs"
    )
    out, err = capfd.readouterr()
    assert "agentscope-sesions (DYNAMODB_SESSIONS_TABLE) does not exist" in out
    assert "(DYNAMODB_STATE_TABLE) does not have the key schema" in out
    secret = LOCAL_AWS_CREDENTIALS["aws_secret_access_key"]
    assert secret not in str(missing.value) + str(mismatched.value) + out + err


async def test_events_put_between_a_runs_deletion_query_and_its_delete_are_deleted_too(
    dynamodb_server: DynamoDBServer, dynamodb_client: DynamoDBClient, user_id: str
) -> None:
    # The deletion has queried the run's partition and is about to delete what it found
    # (its META included) when the run appends: the append sees the META still there, and
    # its event is the deletion's to remove.
    writer = DynamoDBRunsService(
        dynamodb_server.runs_table,
        endpoint_url=dynamodb_server.endpoint_url,
        region_name=dynamodb_server.region,
        **LOCAL_AWS_CREDENTIALS,
    )
    deleter = DynamoDBRunsService(
        dynamodb_server.runs_table, client=dynamodb_client, region_name=dynamodb_server.region
    )
    pk = f"RUN#{id_hash(user_id)}#{id_hash('r1')}"
    appended: list[bool] = []

    async def append_before_meta_goes(params: dict[str, Any], **_: Any) -> None:
        requests = params.get("RequestItems", {}).get(dynamodb_server.runs_table, [])
        deletes_meta = any(
            r.get("DeleteRequest", {}).get("Key") == {"pk": {"S": pk}, "sk": {"S": "META"}}
            for r in requests
        )
        if deletes_meta and not appended:
            appended.append(True)
            await writer.append_events(user_id, "r1", [(1, '{"text": "secret"}')])

    events = dynamodb_client.meta.events
    events.register("before-parameter-build.dynamodb.BatchWriteItem", append_before_meta_goes)
    try:
        async with writer, deleter:
            record = RunRecord(id="r1", user_id=user_id, session_id="s")
            await writer.record(record, [(0, '{"text": "secret"}')], create=True)
            await deleter.delete_session_runs(user_id, "s")
            assert appended
            assert await partition(dynamodb_client, dynamodb_server.runs_table, pk) == []
    finally:
        events.unregister("before-parameter-build.dynamodb.BatchWriteItem", append_before_meta_goes)


async def test_a_round_stored_corrupt_reads_as_none_and_is_logged_without_its_data(
    dynamodb_server: DynamoDBServer,
    dynamodb_client: DynamoDBClient,
    user_id: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with state_on(dynamodb_server) as state:
        await state.save_state(user_id, {"v": 1}, session_id="c")
        items = await partition(
            dynamodb_client, dynamodb_server.state_table, state_pk(user_id, "c")
        )
        for item in items:
            if "body" in item:
                await dynamodb_client.update_item(
                    TableName=dynamodb_server.state_table,
                    Key={"pk": item["pk"], "sk": item["sk"]},
                    UpdateExpression="SET body = :body",
                    ExpressionAttributeValues={":body": {"S": '{"secret-data": '}},
                )
        level = logger.level
        logger.setLevel("WARNING")  # the tests log nothing below CRITICAL
        try:
            capsys.readouterr()
            assert await state.export_state(user_id, session_id="c") is None
            assert await state.export_state(user_id, session_id="c", round_id=1) is None
            assert await state.export_latest_state(user_id, session_id="c") is None
        finally:
            logger.setLevel(level)
    logged = capsys.readouterr().out
    assert "not a JSON object" in logged and "secret-data" not in logged


# --- configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda server, **o: DynamoDBSessionHistoryService(server.sessions_table, **o),
        lambda server, **o: DynamoDBStateService(server.state_table, **o),
        lambda server, **o: DynamoDBRunsService(server.runs_table, **o),
        lambda server, **o: DynamoDBIdempotencyStore(server.sessions_table, **o),
        lambda server, **o: DynamoDBKeyStore(server.api_keys_table, **o),
    ],
    ids=["sessions", "state", "runs", "idempotency", "keys"],
)
async def test_a_store_without_a_region_says_what_to_set(
    dynamodb_server: DynamoDBServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    make: Callable[..., Any],
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    service = make(
        dynamodb_server, endpoint_url=dynamodb_server.endpoint_url, **LOCAL_AWS_CREDENTIALS
    )
    with pytest.raises(ConfigurationError, match=r"AWS_REGION.*region_name") as raised:
        await service.start()
    assert raised.value.__cause__ is None

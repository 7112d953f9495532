"""Key stores, on every backend: hashed storage, constant-time checks, revocation."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import botocore.session
import pytest

from agentscope_serverless.auth import (
    FileKeyStore,
    InMemoryKeyStore,
    IssuedKey,
    KeyStore,
    create_key_store,
)
from agentscope_serverless.auth.dynamodb import DynamoDBKeyStore
from agentscope_serverless.auth.file import MAX_FILE_BYTES
from agentscope_serverless.auth.keys import parse_key
from agentscope_serverless.errors import (
    AuthenticationError,
    InvalidInputError,
    NotFoundError,
    ServiceNotStartedError,
    StoreUnavailableError,
)
from agentscope_serverless.infra.dynamodb_tables import api_keys_table
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer
from agentscope_serverless.log import logger
from agentscope_serverless.settings import load_settings


def new_api_keys_table(server: DynamoDBServer) -> str:
    """A fresh, empty API key table on the moto server; its name."""
    name = f"api-keys-{uuid.uuid4().hex[:8]}"
    client: Any = botocore.session.get_session().create_client(
        "dynamodb", endpoint_url=server.endpoint_url, region_name=server.region,
        **LOCAL_AWS_CREDENTIALS,
    )  # fmt: skip
    client.create_table(**api_keys_table(name))
    return name


def dynamodb_key_store(server: DynamoDBServer, table: str, **options: Any) -> DynamoDBKeyStore:
    return DynamoDBKeyStore(
        table,
        endpoint_url=server.endpoint_url,
        region_name=server.region,
        **LOCAL_AWS_CREDENTIALS,
        **options,
    )


@pytest.fixture(params=["in_memory", "file", "dynamodb"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], KeyStore]:
    if request.param == "file":
        return lambda: FileKeyStore(tmp_path / "keys" / "keys.json")
    if request.param == "dynamodb":
        server: DynamoDBServer = request.getfixturevalue("dynamodb_server")
        table = new_api_keys_table(server)
        return lambda: dynamodb_key_store(server, table)
    shared = InMemoryKeyStore()
    return lambda: shared


@pytest.fixture
async def store(make_store: Callable[[], KeyStore]) -> AsyncIterator[KeyStore]:
    async with make_store() as started:
        yield started


async def test_a_user_key_authenticates_as_its_user(store: KeyStore) -> None:
    issued = await store.create_key(kind="user", user_id="alice")
    assert issued.key.startswith(f"ask_{issued.record.key_id}_")
    principal = await store.authenticate(issued.key)
    assert (principal.kind, principal.user_id, principal.key_id) == (
        "user",
        "alice",
        issued.record.key_id,
    )


async def test_a_service_key_has_no_user(store: KeyStore) -> None:
    issued = await store.create_key(kind="service")
    assert (await store.authenticate(issued.key)).user_id is None
    with pytest.raises(InvalidInputError):
        await store.create_key(kind="service", user_id="alice")
    with pytest.raises(InvalidInputError):
        await store.create_key(kind="user")


@pytest.mark.parametrize("user_id", [" alice", "alice ", "\talice", "alice\n"])
async def test_a_user_key_is_refused_for_a_user_id_with_whitespace_around_it(
    store: KeyStore, user_id: str
) -> None:
    # A service key could never name that user in the X-User-Id header (servers strip it).
    with pytest.raises(
        InvalidInputError,
        match=r"begins or ends with whitespace: send the id without the surrounding whitespace$",
    ):
        await store.create_key(kind="user", user_id=user_id)
    assert await store.list_keys() == []
    inner = await store.create_key(kind="user", user_id="alice smith")
    assert (await store.authenticate(inner.key)).user_id == "alice smith"


@pytest.mark.parametrize("user_id", ["\u202eecila", "ali\u2066ce", "alice\u200e"])
async def test_a_user_key_is_refused_for_a_user_id_with_bidirectional_controls(
    store: KeyStore, user_id: str
) -> None:
    # "\u202eecila" shows as "alice": keys list showed it as another user's key.
    with pytest.raises(InvalidInputError, match="must not contain bidirectional controls"):
        await store.create_key(kind="user", user_id=user_id)
    assert await store.list_keys() == []
    shown = await store.create_key(kind="user", user_id="\u05d0\u05dc\u05d9\u200d\U0001f600")
    assert (await store.authenticate(shown.key)).user_id == "\u05d0\u05dc\u05d9\u200d\U0001f600"


@pytest.mark.parametrize(
    "tamper",
    [
        lambda key: key[:-1] + ("A" if key[-1] != "A" else "B"),
        lambda key: "ask_ffffffffffffffff_" + key.split("_", 2)[2],
        lambda key: key + "x",
        lambda key: "",
        lambda key: "Bearer " + key,
    ],
)
async def test_a_wrong_or_malformed_key_is_refused(
    store: KeyStore, tamper: Callable[[str], str]
) -> None:
    issued = await store.create_key(kind="user", user_id="alice")
    with pytest.raises(AuthenticationError, match="invalid API key"):
        await store.authenticate(tamper(issued.key))


async def test_a_revoked_key_is_refused_and_listed_as_revoked(store: KeyStore) -> None:
    kept = await store.create_key(kind="user", user_id="alice")
    dropped = await store.create_key(kind="user", user_id="bob")
    revoked = await store.revoke_key(dropped.record.key_id)
    assert revoked.revoked
    await store.revoke_key(dropped.record.key_id)
    with pytest.raises(AuthenticationError):
        await store.authenticate(dropped.key)
    await store.authenticate(kept.key)
    listed = {r.key_id: r.revoked for r in await store.list_keys()}
    assert listed == {kept.record.key_id: False, dropped.record.key_id: True}
    with pytest.raises(NotFoundError):
        await store.revoke_key("0000000000000000")


async def test_a_key_is_revoked_given_whole_and_a_malformed_id_is_never_quoted(
    store: KeyStore,
) -> None:
    # Revoking a key that leaked, one pastes the key: it is revoked, by its id.
    leaked = await store.create_key(kind="user", user_id="alice")
    assert (await store.revoke_key(leaked.key)).key_id == leaked.record.key_id
    with pytest.raises(AuthenticationError):
        await store.authenticate(leaked.key)
    # Anything else that is no key id may still hold a key's secret: never said back.
    other = await store.create_key(kind="user", user_id="bob")
    secret = other.key.split("_", 2)[2]
    for given in (f'"{other.key}"', other.key + ".", secret, f"{other.record.key_id}x"):
        with pytest.raises(InvalidInputError) as refused:
            await store.revoke_key(given)
        assert secret not in refused.value.message and given not in refused.value.message
        assert "key id" in refused.value.message
    await store.authenticate(other.key)


async def test_keys_are_long_and_random(store: KeyStore) -> None:
    keys = [(await store.create_key(kind="service")).key for _ in range(5)]
    assert len(set(keys)) == 5
    for key in keys:
        parsed = parse_key(key)
        assert parsed is not None and len(parsed[1]) == 43


async def test_a_store_must_be_started(make_store: Callable[[], KeyStore]) -> None:
    with pytest.raises(ServiceNotStartedError):
        await make_store().create_key(kind="service")


def test_the_key_file_holds_hashes_only_with_private_permissions(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"

    async def create() -> IssuedKey:
        async with FileKeyStore(path) as store:
            return await store.create_key(kind="user", user_id="alice")

    issued = asyncio.run(create())
    content = path.read_text()
    secret = issued.key.split("_", 2)[2]
    assert secret not in content and issued.key not in content
    assert json.loads(content)["keys"][0]["key_hash"] == issued.record.key_hash
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


async def test_a_running_file_store_sees_changes_made_by_another(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    async with FileKeyStore(path, check_seconds=0.2) as server, FileKeyStore(path) as cli:
        issued = await cli.create_key(kind="user", user_id="alice")
        await asyncio.sleep(0.25)
        assert (await server.authenticate(issued.key)).user_id == "alice"
        revoked_at = time.monotonic()
        await cli.revoke_key(issued.record.key_id)
        while True:
            try:
                await server.authenticate(issued.key)
            except AuthenticationError:
                break
            await asyncio.sleep(0.02)
        assert time.monotonic() - revoked_at < 1.0


async def test_a_key_created_elsewhere_works_at_once_on_a_running_file_store(
    tmp_path: Path,
) -> None:
    # The CLI issues a key and the user tries it straight away: the server's once-a-minute
    # check must not answer "invalid API key" meanwhile.
    path = tmp_path / "keys.json"
    async with FileKeyStore(path, check_seconds=60) as server, FileKeyStore(path) as cli:
        first = await cli.create_key(kind="user", user_id="alice")
        assert (await server.authenticate(first.key)).user_id == "alice"
        second = await cli.create_key(kind="user", user_id="bob")
        assert (await server.authenticate(second.key)).user_id == "bob"
        with pytest.raises(AuthenticationError):
            await server.authenticate("ask_0123456789abcdef_" + "A" * 43)


async def test_authenticating_makes_no_filesystem_call_per_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "keys.json"
    async with FileKeyStore(path, check_seconds=60) as store:
        issued = await store.create_key(kind="user", user_id="alice")
        await store.authenticate(issued.key)
        calls: list[object] = []
        real_stat = os.stat

        def counting_stat(*args: Any, **kwargs: Any) -> os.stat_result:
            calls.append(args)
            return real_stat(*args, **kwargs)

        monkeypatch.setattr(os, "stat", counting_stat)
        for _ in range(200):
            assert (await store.authenticate(issued.key)).user_id == "alice"
    assert calls == []


async def test_a_key_file_reached_through_a_symlink_is_changed_where_it_lives(
    tmp_path: Path,
) -> None:
    # The symlink was replaced by a file of its own: a key revoked through it ("Revoked
    # key ...") went on working on a server reading the file it pointed to.
    real = tmp_path / "shared" / "keys.json"
    link = tmp_path / "keys.json"
    link.symlink_to(real)
    async with FileKeyStore(real, check_seconds=0) as server, FileKeyStore(link) as cli:
        issued = await cli.create_key(kind="user", user_id="alice")
        assert (await server.authenticate(issued.key)).user_id == "alice"
        await cli.revoke_key(issued.record.key_id)
        with pytest.raises(AuthenticationError):
            await server.authenticate(issued.key)
    assert link.is_symlink() and link.resolve() == real
    assert stat.S_IMODE(real.stat().st_mode) == 0o600


async def test_concurrent_creations_are_all_kept(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    stores = [FileKeyStore(path) for _ in range(10)]
    for store in stores:
        await store.start()
    await asyncio.gather(
        *(s.create_key(kind="user", user_id=f"u{i}") for i, s in enumerate(stores))
    )
    assert len(await stores[0].list_keys()) == 10


async def test_a_corrupt_key_file_is_a_store_failure(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text("[1, 2")
    async with FileKeyStore(path) as store:
        assert not await store.health()
        with pytest.raises(StoreUnavailableError):
            await store.authenticate("ask_0123456789abcdef_" + "A" * 43)


async def test_a_key_file_path_naming_a_pipe_is_refused_without_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The read of a named pipe waited for a writer that never came, on the event loop.
    pipe = tmp_path / "keys.fifo"
    os.mkfifo(pipe)
    link = tmp_path / "keys.json"
    link.symlink_to(pipe)
    warnings: list[dict[str, Any]] = []
    monkeypatch.setattr(logger, "warning", lambda message, **kwargs: warnings.append(kwargs))

    async def refusals() -> list[str]:
        refused = []
        for path in (pipe, link):
            async with FileKeyStore(path) as store:
                assert not await store.health()
                with pytest.raises(StoreUnavailableError) as raised:
                    await store.authenticate("ask_0123456789abcdef_" + "A" * 43)
                refused.append(str(raised.value))
        return refused

    reading = asyncio.create_task(asyncio.to_thread(asyncio.run, refusals()))
    try:
        done, _ = await asyncio.wait([reading], timeout=30)
    finally:
        while not reading.done():  # release a blocked read, so that the test can end
            with contextlib.suppress(OSError):
                os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
            await asyncio.sleep(0.05)
    assert done, "the read of a named pipe blocked"
    assert reading.result() == ["key file is unavailable: it is not a regular file"] * 2
    assert [w["extra"]["path"] for w in warnings][-2:] == [str(pipe), str(link)]


async def test_a_key_file_too_large_for_any_number_of_keys_is_refused_with_its_size(
    tmp_path: Path,
) -> None:
    # A path set by mistake to a file of hundreds of megabytes had it read whole each time.
    path = tmp_path / "keys.json"
    async with FileKeyStore(path) as store:
        issued = await store.create_key(kind="user", user_id="alice")
    content = path.read_text()
    with path.open("a") as handle:
        handle.write(" " * (MAX_FILE_BYTES - len(content) + 1))
    async with FileKeyStore(path) as store:
        with pytest.raises(StoreUnavailableError, match="larger than 16 MiB") as raised:
            await store.authenticate(issued.key)
        with pytest.raises(StoreUnavailableError, match="larger than 16 MiB"):
            await store.create_key(kind="user", user_id="bob")
    assert str(path) not in str(raised.value)
    path.write_text(content + " " * (MAX_FILE_BYTES - len(content)))
    async with FileKeyStore(path) as store:
        assert (await store.authenticate(issued.key)).user_id == "alice"


async def test_a_key_file_that_cannot_be_written_is_a_store_failure_naming_no_path(
    tmp_path: Path,
) -> None:
    # Its folder could not be made (a file of that name): a FileExistsError went up raw.
    (tmp_path / "afile").write_text("")
    async with FileKeyStore(tmp_path / "afile" / "keys.json") as store:
        with pytest.raises(StoreUnavailableError) as raised:
            await store.create_key(kind="user", user_id="alice")
        with pytest.raises(StoreUnavailableError):
            await store.revoke_key("0123456789abcdef")
    assert str(raised.value) == "key file is unavailable: it cannot be written"


async def test_a_corrupt_key_file_is_read_and_logged_at_most_once_per_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Anyone can send requests, with made-up keys too: a broken file must not be re-read,
    # nor a warning logged, for each.
    path = tmp_path / "keys.json"
    async with FileKeyStore(path, check_seconds=0.5) as store:
        issued = await store.create_key(kind="user", user_id="alice")
        content = path.read_text()
        path.write_text(content + "\n,,oops")
        await asyncio.sleep(0.55)
        warnings: list[str] = []
        monkeypatch.setattr(logger, "warning", lambda message, **_: warnings.append(message))
        made_up = "ask_0123456789abcdef_" + "A" * 43
        for key in [issued.key, made_up] * 50:
            with pytest.raises(StoreUnavailableError, match="not a readable key file"):
                await store.authenticate(key)
        assert not await store.health()
        assert warnings == ["key file unreadable"]
        path.write_text(content)
        await asyncio.sleep(0.55)
        assert (await store.authenticate(issued.key)).user_id == "alice"
        assert await store.health()


async def test_a_key_file_record_that_is_refused_is_logged_without_its_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The warning quoted the refused value: most of a hash in upper case, whole a secret
    # pasted where the hash goes.
    path = tmp_path / "keys.json"
    async with FileKeyStore(path) as store:
        issued = await store.create_key(kind="user", user_id="alice")
    secret = issued.key.split("_", 2)[2]
    errors: list[str] = []
    monkeypatch.setattr(
        logger, "warning", lambda message, **kwargs: errors.append(kwargs["extra"]["error"])
    )
    for key_hash in (issued.record.key_hash.upper(), secret):
        content = json.loads(path.read_text())
        content["keys"][0]["key_hash"] = key_hash
        path.write_text(json.dumps(content))
        errors.clear()
        async with FileKeyStore(path) as store:
            with pytest.raises(StoreUnavailableError):
                await store.authenticate(issued.key)
        (error,) = errors
        assert "key_hash" in error
        assert key_hash[:8] not in error and key_hash[-8:] not in error


def test_the_factory_follows_the_settings(tmp_path: Path) -> None:
    file_store = create_key_store(
        load_settings(auth_keys_backend="file", auth_keys_file=str(tmp_path / "k.json"))
    )
    assert isinstance(file_store, FileKeyStore) and file_store.path == tmp_path / "k.json"
    assert isinstance(create_key_store(load_settings()), InMemoryKeyStore)
    dynamodb_store = create_key_store(
        load_settings(auth_keys_backend="dynamodb", auth_keys_table="team-keys")
    )
    assert isinstance(dynamodb_store, DynamoDBKeyStore)
    assert (dynamodb_store.table_name, dynamodb_store.cache_seconds) == ("team-keys", 30.0)


async def test_the_key_table_holds_hashes_only(dynamodb_server: DynamoDBServer) -> None:
    table = new_api_keys_table(dynamodb_server)
    async with dynamodb_key_store(dynamodb_server, table) as store:
        issued = await store.create_key(kind="user", user_id="alice")
    client: Any = botocore.session.get_session().create_client(
        "dynamodb", endpoint_url=dynamodb_server.endpoint_url, region_name=dynamodb_server.region,
        **LOCAL_AWS_CREDENTIALS,
    )  # fmt: skip
    [item] = client.scan(TableName=table)["Items"]
    assert item["key_id"] == {"S": issued.record.key_id}
    assert item["key_hash"] == {"S": issued.record.key_hash}
    assert issued.key.split("_", 2)[2] not in json.dumps(item)


async def test_a_revoke_made_elsewhere_takes_effect_within_the_cache_time(
    dynamodb_server: DynamoDBServer,
) -> None:
    table = new_api_keys_table(dynamodb_server)
    server = dynamodb_key_store(dynamodb_server, table, cache_seconds=0.5)
    cli = dynamodb_key_store(dynamodb_server, table)
    async with server, cli:
        issued = await cli.create_key(kind="user", user_id="alice")
        await server.authenticate(issued.key)
        revoked_at = time.monotonic()
        await cli.revoke_key(issued.record.key_id)
        while True:
            try:
                await server.authenticate(issued.key)
            except AuthenticationError:
                break
            await asyncio.sleep(0.05)
        assert time.monotonic() - revoked_at < 1.0


async def test_a_revoke_through_the_same_store_takes_effect_at_once(
    dynamodb_server: DynamoDBServer,
) -> None:
    table = new_api_keys_table(dynamodb_server)
    async with dynamodb_key_store(dynamodb_server, table, cache_seconds=300) as store:
        issued = await store.create_key(kind="user", user_id="alice")
        await store.authenticate(issued.key)
        await store.revoke_key(issued.record.key_id)
        with pytest.raises(AuthenticationError):
            await store.authenticate(issued.key)


async def test_a_revoke_takes_effect_at_once_even_while_the_key_is_being_read(
    dynamodb_server: DynamoDBServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A key under abuse is being checked when it is revoked: the read that began before
    # the revoke must not put the unrevoked record back in the cache.
    table = new_api_keys_table(dynamodb_server)
    async with dynamodb_key_store(dynamodb_server, table, cache_seconds=300) as store:
        issued = await store.create_key(kind="user", user_id="alice")
        read, release = asyncio.Event(), asyncio.Event()
        real_run = store._store.run

        async def held_read(operation: str, **kwargs: Any) -> dict[str, Any]:
            response = await real_run(operation, **kwargs)
            if operation == "get_item" and not release.is_set():
                read.set()
                await release.wait()
            return response

        monkeypatch.setattr(store._store, "run", held_read)
        in_flight = asyncio.create_task(store.authenticate(issued.key))
        await read.wait()
        await store.revoke_key(issued.record.key_id)
        release.set()
        assert (await in_flight).user_id == "alice"  # it began before the revoke
        with pytest.raises(AuthenticationError):
            await store.authenticate(issued.key)


@pytest.mark.parametrize(
    ("revoked", "outcome"),
    [
        ({"BOOL": True}, "revoked"),
        ({"S": "true"}, "revoked"),
        ({"N": "1"}, "revoked"),
        ({"S": "false"}, "active"),
        ({"N": "0"}, "active"),
        ({"S": "revoked"}, "malformed"),
        ({"N": "2"}, "malformed"),
        ({"NULL": True}, "malformed"),
    ],
)
async def test_a_revoked_flag_set_by_hand_is_read_as_a_key_file_reads_it(
    dynamodb_server: DynamoDBServer, revoked: dict[str, Any], outcome: str
) -> None:
    # An operator revoking a key in the console may type the flag as a string or a number:
    # the key is then revoked, or its item malformed, never active by mistake.
    table = new_api_keys_table(dynamodb_server)
    async with dynamodb_key_store(dynamodb_server, table, cache_seconds=0) as store:
        issued = await store.create_key(kind="user", user_id="alice")
        client: Any = botocore.session.get_session().create_client(
            "dynamodb", endpoint_url=dynamodb_server.endpoint_url,
            region_name=dynamodb_server.region, **LOCAL_AWS_CREDENTIALS,
        )  # fmt: skip
        client.update_item(
            TableName=table,
            Key={"key_id": {"S": issued.record.key_id}},
            UpdateExpression="SET revoked = :revoked",
            ExpressionAttributeValues={":revoked": revoked},
        )
        if outcome == "malformed":
            with pytest.raises(StoreUnavailableError, match="malformed"):
                await store.authenticate(issued.key)
            with pytest.raises(StoreUnavailableError, match="malformed"):
                await store.list_keys()
        elif outcome == "revoked":
            with pytest.raises(AuthenticationError):
                await store.authenticate(issued.key)
            assert [r.revoked for r in await store.list_keys()] == [True]
        else:
            assert (await store.authenticate(issued.key)).user_id == "alice"
            assert [r.revoked for r in await store.list_keys()] == [False]


@pytest.mark.parametrize("named", [True, False])
async def test_a_malformed_key_item_is_named_by_its_key_id_and_other_keys_still_work(
    dynamodb_server: DynamoDBServer, named: bool
) -> None:
    # The refusal said "dynamodb is unavailable: the key table holds a malformed item",
    # which item not said: one of a table of thousands, found by hand.
    table = new_api_keys_table(dynamodb_server)
    async with dynamodb_key_store(dynamodb_server, table, cache_seconds=0) as store:
        good = await store.create_key(kind="user", user_id="alice")
        bad = await store.create_key(kind="user", user_id="bob")
        client: Any = botocore.session.get_session().create_client(
            "dynamodb", endpoint_url=dynamodb_server.endpoint_url,
            region_name=dynamodb_server.region, **LOCAL_AWS_CREDENTIALS,
        )  # fmt: skip
        item = client.get_item(TableName=table, Key={"key_id": {"S": bad.record.key_id}})["Item"]
        item["kind"] = {"S": "admin"}
        if not named:  # the whole key pasted where its id goes
            client.delete_item(TableName=table, Key={"key_id": item["key_id"]})
            item["key_id"] = {"S": bad.key}
        client.put_item(TableName=table, Item=item)
        with pytest.raises(StoreUnavailableError) as listing:
            await store.list_keys()
        assert (await store.authenticate(good.key)).user_id == "alice"
        if named:
            with pytest.raises(StoreUnavailableError) as reading:
                await store.authenticate(bad.key)
            assert str(reading.value) == str(listing.value)
    fault = "kind: Input should be 'user' or 'service'"
    if named:
        which = f"key_id {bad.record.key_id} ({fault})"
    else:
        pattern = "key_id: String should match pattern '^[0-9a-f]{16}$'"
        which = f"one whose key_id is not a key id ({pattern}; {fault})"
    assert str(listing.value) == f"key table is unavailable: it holds a malformed item, {which}"
    assert bad.record.key_hash not in str(listing.value)
    assert bad.key.split("_", 2)[2] not in str(listing.value)


async def test_an_unreachable_key_table_is_a_store_failure(
    dynamodb_server: DynamoDBServer,
) -> None:
    async with dynamodb_key_store(dynamodb_server, "no-such-table") as store:
        assert not await store.health()
        with pytest.raises(StoreUnavailableError):
            await store.authenticate("ask_0123456789abcdef_" + "A" * 43)
